/* Communicators when things go wrong, on the test device with the NCCL test double
 * (comm_td.h): ranks that never join (creation and collectives), hangs and NCCL errors the
 * double injects (SAFECUDA_NCCLFAULT_*, set here per case), the watchdog's aborts with nobody
 * waiting, sc_comm_abort, captured collectives whose communicator is gone, and the leak
 * report. Timeouts here are short (200 .. 300 ms); every wait is bounded. */
#define _GNU_SOURCE

#include "comm_td.h"
#include "driver/driver.h"

static char C[300];

/* Seconds since t0. */
static double since(double t0) { return test_now_s() - t0; }

/* The message is prefix ... suffix (a duration in between varies). */
static void check_around(const char *prefix, const char *suffix)
{
    const char *m = sc_last_error();
    size_t lp = strlen(prefix), ls = strlen(suffix), lm = strlen(m);
    if (lm < lp + ls || strncmp(m, prefix, lp) != 0 || strcmp(m + lm - ls, suffix) != 0) {
        fprintf(stderr, "message\n  got:  %s\n  want: %s...%s\n", m, prefix, suffix);
        test_failures++;
    }
}

static void test_create_timeout(void)
{
    open_contexts(2);
    sc_comm_id id;
    CHECK_OK(sc_comm_unique_id(&id));
    sc_comm comm = {5};
    sc_comm_desc d = {.unique_id = id, .nranks = 2, .rank = 0, .timeout_ms = 300,
                      .label = "lonely"};
    double t0 = test_now_s();
    const int line = __LINE__ + 1;
    CHECK_REFUSED(sc_comm_create(ctxs[0], &d, &comm), SC_ERR_TIMEOUT,
                  "sc_comm_create: communicator 'lonely' (rank 0 of 2 on device 0, created at "
                  "test_td_comm_faults.c:%d) was aborted: creating the communicator (every rank "
                  "must join) did not complete within the timeout of 300 ms (NCCL still in "
                  "progress: a rank has not joined, or a peer hangs)",
                  line);
    double t = since(t0);
    CHECK(t >= 0.29 && t < 10);
    CHECK(comm.id == 0);
    CHECK(ncclfault.live_comms() == 0);

    /* An init the double never completes, through sc_comm_create_all. */
    setenv("SAFECUDA_NCCLFAULT_HANG", "init", 1);
    t0 = test_now_s();
    sc_comm_all_desc ad = {.timeout_ms = 200, .label = "w"};
    const int all_line = __LINE__ + 1;
    CHECK_REFUSED(sc_comm_create_all(ctxs, 2, &ad, comms), SC_ERR_TIMEOUT,
                  "sc_comm_create_all: communicator 'w' (rank 0 of 2 on device 0, created at "
                  "test_td_comm_faults.c:%d) was aborted: creating the communicators did not "
                  "complete within the timeout of 200 ms (NCCL still in progress: a rank has "
                  "not joined, or a peer hangs)",
                  all_line);
    t = since(t0);
    CHECK(t >= 0.19 && t < 10);
    CHECK(comms[0].id == 0 && comms[1].id == 0);
    unsetenv("SAFECUDA_NCCLFAULT_HANG");
    CHECK(ncclfault.live_comms() == 0);

    /* An init that NCCL refuses on the second rank: nothing is created. */
    setenv("SAFECUDA_NCCLFAULT_FAIL", "ncclCommInitRankConfig:2:ncclInvalidUsage", 1);
    CHECK_REFUSED(sc_comm_create_all(ctxs, 2, NULL, comms), SC_ERR_COMM,
                  "sc_comm_create_all: ncclCommInitRankConfig of 2 ranks failed: "
                  "ncclInvalidUsage (invalid usage (run with NCCL_DEBUG=WARN for details)); "
                  "NCCL's last error: ncclfault: injected ncclInvalidUsage into "
                  "ncclCommInitRankConfig (call 2)");
    unsetenv("SAFECUDA_NCCLFAULT_FAIL");
    CHECK(ncclfault.live_comms() == 0);
    close_contexts(2);
}

/* Both ranks' all-reduce of x0 / x1 in one group. */
static sc_status pair(sc_buffer x0, sc_buffer x1)
{
    CHECK_OK(sc_comm_group_begin());
    CHECK_OK(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, sc_view_of(x0), sc_view_of(x0),
                                SC_REDUCE_SUM));
    CHECK_OK(sc_comm_all_reduce(comms[1], SC_DEFAULT_STREAM, sc_view_of(x1), sc_view_of(x1),
                                SC_REDUCE_SUM));
    return sc_comm_group_end();
}

static void test_nccl_errors(void)
{
    open_contexts(2);
    sc_set_log_callback(test_log_capture, NULL);

    /* NCCL refuses a collective: the group's communicators are aborted. */
    world(2, 0);
    sc_buffer x0 = buf(ctxs[0], SC_F32, 16, "x0"), x1 = buf(ctxs[1], SC_F32, 16, "x1");
    setenv("SAFECUDA_NCCLFAULT_FAIL", "ncclAllReduce:1:ncclSystemError", 1);
    test_log_text[0] = '\0';
    const char *why = "NCCL refused the all-reduce of 16 x f32 (sum): ncclSystemError (unhandled "
                      "system error (run with NCCL_DEBUG=INFO for details)); NCCL's last error: "
                      "ncclfault: injected ncclSystemError into ncclAllReduce (call 1); the "
                      "state of its ranks is unknown";
    CHECK_REFUSED(pair(x0, x1), SC_ERR_COMM, "sc_comm_group_end: %s was aborted: %s",
                  cdesc(0, 2, C, sizeof C), why);
    unsetenv("SAFECUDA_NCCLFAULT_FAIL");
    char line[2000];
    snprintf(line, sizeof line, "%s was aborted: %s\n", cdesc(1, 2, C, sizeof C), why);
    CHECK(strstr(test_log_text, line) != NULL); /* each abort is logged */
    sc_comm_props p;
    CHECK_OK(sc_comm_info(comms[1], &p));
    CHECK(p.aborted);
    CHECK_REFUSED(sc_comm_all_gather(comms[1], SC_DEFAULT_STREAM, sc_view_of(x1),
                                     (sc_view){x1, 8, 8}),
                  SC_ERR_COMM, "sc_comm_all_gather: %s was aborted: %s",
                  cdesc(1, 2, C, sizeof C), why);
    CHECK_REFUSED(sc_comm_synchronize(comms[0]), SC_ERR_COMM,
                  "sc_comm_synchronize: %s was aborted: %s", cdesc(0, 2, C, sizeof C), why);
    end_world(2); /* an aborted communicator is destroyed with SC_OK */

    /* An asynchronous error NCCL reports after the collective was issued. */
    world(2, 0);
    CHECK_OK(pair(x0, x1));
    setenv("SAFECUDA_NCCLFAULT_ASYNC", "ncclRemoteError", 1);
    CHECK_REFUSED(sc_comm_synchronize(comms[0]), SC_ERR_COMM,
                  "sc_comm_synchronize: %s was aborted: NCCL reported an asynchronous error: "
                  "ncclRemoteError (remote process exited or there was a network error); "
                  "NCCL's last error: ncclfault: injected asynchronous error ncclRemoteError "
                  "after 1 operations; the outputs of its collectives in flight are undefined",
                  cdesc(0, 2, C, sizeof C));
    unsetenv("SAFECUDA_NCCLFAULT_ASYNC");
    end_world(2);

    /* sc_comm_abort. */
    world(2, 0);
    CHECK_OK(sc_comm_abort(comms[0]));
    CHECK_OK(sc_comm_abort(comms[0])); /* again: nothing */
    CHECK_OK(sc_comm_info(comms[0], &p));
    CHECK(p.aborted);
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, sc_view_of(x0),
                                     sc_view_of(x0), SC_REDUCE_SUM),
                  SC_ERR_COMM, "sc_comm_all_reduce: %s was aborted: sc_comm_abort was called",
                  cdesc(0, 2, C, sizeof C));
    CHECK_OK(sc_comm_query(comms[1]));
    end_world(2);

    CHECK_OK(sc_buffer_destroy(x0));
    CHECK_OK(sc_buffer_destroy(x1));
    sc_set_log_callback(NULL, NULL);
    close_contexts(2);
}

/* A rank that never joins, and collectives the double never completes: every rank that can
 * still speak gets the timeout, within it, and nothing hangs. */
static void test_collective_timeouts(void)
{
    open_contexts(2);
    sc_set_log_callback(test_log_capture, NULL);
    world(2, 300);
    sc_buffer x0 = buf(ctxs[0], SC_F32, 16, "x0"), x1 = buf(ctxs[1], SC_F32, 16, "x1");
    char prefix[600];

    /* Rank 1 never joins rank 0's all-reduce. */
    double t0 = test_now_s();
    CHECK_OK(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, sc_view_of(x0), sc_view_of(x0),
                                SC_REDUCE_SUM));
    CHECK_STATUS(sc_comm_query(comms[0]), SC_ERR_NOT_READY);
    CHECK_STATUS(sc_comm_synchronize(comms[0]), SC_ERR_TIMEOUT);
    double t = since(t0);
    CHECK(t >= 0.29 && t < 10);
    snprintf(prefix, sizeof prefix, "sc_comm_synchronize: %s was aborted: the all-reduce of 16 "
             "x f32 (sum) issued ", cdesc(0, 2, C, sizeof C));
    check_around(prefix, " s ago did not finish within the timeout of 300 ms (a rank that "
                         "never joined it, or a peer that hangs); its outputs are undefined");
    sc_stream s0;
    CHECK_OK(sc_context_default_stream(ctxs[0], &s0));
    CHECK_OK(sc_stream_synchronize(s0)); /* the abort ended its part: the stream goes on */
    CHECK_STATUS(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, sc_view_of(x0), sc_view_of(x0),
                                    SC_REDUCE_SUM),
                 SC_ERR_TIMEOUT);
    CHECK_OK(sc_comm_query(comms[1])); /* rank 1 issued nothing: it is fine */
    end_world(2);

    /* Both ranks join, the double never completes it, and nobody waits: the watchdog aborts
     * both ranks on their own, and the streams' waits return. */
    world(2, 300);
    setenv("SAFECUDA_NCCLFAULT_HANG", "allreduce", 1);
    t0 = test_now_s();
    CHECK_OK(pair(x0, x1));
    unsetenv("SAFECUDA_NCCLFAULT_HANG");
    sc_comm_props p0 = {0}, p1 = {0};
    while (since(t0) < 10 && !(p0.aborted && p1.aborted)) {
        CHECK_OK(sc_comm_info(comms[0], &p0));
        CHECK_OK(sc_comm_info(comms[1], &p1));
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    t = since(t0);
    CHECK(p0.aborted && p1.aborted && t >= 0.29 && t < 10);
    CHECK_OK(sc_context_synchronize(ctxs[0]));
    CHECK_OK(sc_context_synchronize(ctxs[1]));
    snprintf(prefix, sizeof prefix, "sc_comm_all_reduce: %s was aborted: the all-reduce of 16 "
             "x f32 (sum) issued ", cdesc(1, 2, C, sizeof C));
    sc_clear_error();
    CHECK_STATUS(sc_comm_all_reduce(comms[1], SC_DEFAULT_STREAM, sc_view_of(x1), sc_view_of(x1),
                                    SC_REDUCE_SUM),
                 SC_ERR_TIMEOUT);
    check_around(prefix, " s ago did not finish within the timeout of 300 ms (a rank that "
                         "never joined it, or a peer that hangs); its outputs are undefined");
    CHECK(strstr(test_log_text, "did not finish within the timeout of 300 ms") != NULL);
    end_world(2);

    /* A destroy whose wait for the work (ncclCommFinalize) never ends: aborted, destroyed. */
    world(2, 200);
    setenv("SAFECUDA_NCCLFAULT_HANG", "finalize", 1);
    t0 = test_now_s();
    CHECK_REFUSED(sc_comm_destroy(comms[0]), SC_ERR_TIMEOUT,
                  "sc_comm_destroy: %s was aborted: finishing its work (ncclCommFinalize) did "
                  "not complete within the timeout of 200 ms (NCCL still in progress: a rank "
                  "has not joined, or a peer hangs)", cdesc(0, 2, C, sizeof C));
    t = since(t0);
    CHECK(t >= 0.19 && t < 10);
    unsetenv("SAFECUDA_NCCLFAULT_HANG");
    CHECK_STATUS(sc_comm_destroy(comms[0]), SC_ERR_STALE_HANDLE);
    CHECK_OK(sc_comm_destroy(comms[1]));
    CHECK(ncclfault.live_comms() == 0);

    CHECK_OK(sc_buffer_destroy(x0));
    CHECK_OK(sc_buffer_destroy(x1));
    sc_set_log_callback(NULL, NULL);
    close_contexts(2);
}

/* A captured collective: its graph remembers the communicator. */
static void test_graph(void)
{
    open_contexts(1);
    sc_stream s;
    REQUIRE(sc_stream_create(ctxs[0], NULL, &s) == SC_OK);
    sc_buffer a = buf(ctxs[0], SC_F32, 8, "a"), b = buf(ctxs[0], SC_F32, 8, "b");
    for (int round = 0; round < 2; round++) {
        world(1, 0);
        sc_graph g;
        sc_graph_exec e;
        CHECK_OK(sc_stream_begin_capture(s, NULL));
        CHECK_OK(sc_comm_all_reduce(comms[0], s, sc_view_of(b), sc_view_of(a), SC_REDUCE_SUM));
        CHECK_OK(sc_stream_end_capture(s, &g));
        const int exec_line = __LINE__ + 1;
        CHECK_OK(sc_graph_instantiate(g, &e));
        CHECK_OK(sc_graph_launch(s, e));
        CHECK_OK(sc_stream_synchronize(s));
        CHECK_OK(sc_comm_query(comms[0])); /* a captured collective is not in flight */
        sc_clear_error();
        if (round == 0) {
            CHECK_OK(sc_comm_abort(comms[0]));
            CHECK_REFUSED(sc_graph_launch(s, e), SC_ERR_COMM,
                          "sc_graph_launch: %s was aborted: sc_comm_abort was called: it is "
                          "used by the executable graph instantiated at "
                          "test_td_comm_faults.c:%d from the graph captured at "
                          "test_td_comm_faults.c:%d; nothing was launched",
                          cdesc(0, 1, C, sizeof C), exec_line, exec_line - 2);
            CHECK_OK(sc_comm_destroy(comms[0]));
        } else {
            CHECK_OK(sc_comm_destroy(comms[0]));
            CHECK_STATUS(sc_graph_launch(s, e), SC_ERR_STALE_HANDLE);
            CHECK_MSG("nothing was launched");
        }
        CHECK_OK(sc_graph_exec_destroy(e));
        CHECK_OK(sc_graph_destroy(g));
    }
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_stream_destroy(s));
    close_contexts(1);
}

/* A communicator left alive is reported and freed with its context. */
/* A group over the GPUs of one process switches contexts (each set's ordering events, each
 * collective's completion event, in its stream's context): each cuCtxSetCurrent of it fails
 * once in turn (a fault injected in the library's driver wrapper). The group's call says so or
 * goes on (a switch needed only to record an ordering mark); nothing hangs, nothing leaks,
 * and both communicators stay usable or were aborted with a message. */
static void test_context_switch_faults(void)
{
    open_contexts(2);
    world(2, 300);
    sc_buffer x0 = buf(ctxs[0], SC_F32, 16, "x0"), x1 = buf(ctxs[1], SC_F32, 16, "x1");
    CHECK_OK(pair(x0, x1)); /* (the first group's own setup) */
    CHECK_OK(sc_comm_synchronize(comms[0]));
    CHECK_OK(sc_comm_synchronize(comms[1]));
    int failed = 0, fired = 0;
    for (uint64_t nth = 1; nth < 64; nth++) {
        REQUIRE(sci_fault_arm("cuCtxSetCurrent", nth, CUDA_ERROR_INVALID_CONTEXT));
        sc_clear_error();
        /* both ranks' all-reduce in one group: the first failure's status and message (a
         * call refused inside the group leaves its rank out: the other one's all-reduce then
         * ends by its timeout, as a rank that never joins) */
        sc_status st = sc_comm_group_begin();
        const char *step = "sc_comm_group_begin: ";
        for (int r = 0; r < 2 && st == SC_OK; r++) {
            sc_buffer x = r ? x1 : x0;
            st = sc_comm_all_reduce(comms[r], SC_DEFAULT_STREAM, sc_view_of(x), sc_view_of(x),
                                    SC_REDUCE_SUM);
            step = "sc_comm_all_reduce: ";
        }
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", sc_last_error());
        sc_status end = sc_comm_group_end();
        if (st == SC_OK) {
            st = end;
            step = "sc_comm_group_end: ";
            snprintf(msg, sizeof msg, "%s", sc_last_error());
        }
        const bool hit = sci_fault_fired();
        sci_fault_disarm();
        if (!hit) {
            CHECK_OK(st);
            break;
        }
        fired++;
        if (st != SC_OK) {
            failed++;
            /* the failing call is named, with the driver's call and error */
            if (strncmp(msg, step, strlen(step)) != 0 ||
                !strstr(msg, "cuCtxSetCurrent failed: CUDA_ERROR_INVALID_CONTEXT (invalid "
                             "device context)")) {
                fprintf(stderr, "fault %d: status %d, message: %s\n", (int)nth, (int)st, msg);
                test_failures++;
            }
        }
        /* whatever happened, the waits end and the communicators answer */
        for (int r = 0; r < 2; r++) {
            sc_status w = sc_comm_synchronize(comms[r]);
            CHECK(w == SC_OK || w == SC_ERR_COMM || w == SC_ERR_TIMEOUT || w == SC_ERR_DRIVER);
            CHECK_OK(sc_context_synchronize(ctxs[r]));
        }
        sc_comm_props p0 = {0}, p1 = {0};
        CHECK_OK(sc_comm_info(comms[0], &p0));
        CHECK_OK(sc_comm_info(comms[1], &p1));
        if (p0.aborted || p1.aborted) { /* a fresh pair for the next fault */
            end_world(2);
            world(2, 300);
        }
    }
    printf("cuCtxSetCurrent failing in a 2-GPU group: %d faults fired, %d refused the group\n",
           fired, failed);
    CHECK(fired >= 2); /* the group switches to the other GPU and back at least */
    CHECK(failed >= 1);
    CHECK_OK(pair(x0, x1));
    CHECK_OK(sc_comm_synchronize(comms[0]));
    CHECK_OK(sc_comm_synchronize(comms[1]));
    end_world(2);
    CHECK_OK(sc_buffer_destroy(x0));
    CHECK_OK(sc_buffer_destroy(x1));
    close_contexts(2);
    CHECK(ncclfault.live_comms() == 0);
}

static void test_leak(void)
{
    open_contexts(2);
    world(2, 0);
    sc_set_log_callback(test_log_capture, NULL);
    test_log_text[0] = '\0';
    CHECK_STATUS(sc_context_destroy(ctxs[0]), SC_ERR_LEAKED);
    char line[300];
    snprintf(line, sizeof line, "  communicator 'world' rank 0 of 2, device 0, 0 bytes, created "
             "at comm_td.h:%d\n", comms_line);
    CHECK(strstr(test_log_text, line) != NULL);
    CHECK_STATUS(sc_comm_query(comms[0]), SC_ERR_STALE_HANDLE);
    CHECK_OK(sc_comm_destroy(comms[1]));
    CHECK(ncclfault.live_comms() == 0);
    CHECK_OK(sc_context_destroy(ctxs[1]));
    sc_set_log_callback(NULL, NULL);
}

int main(void)
{
    comm_td_attach();
    TEST_RUN(test_create_timeout);
    TEST_RUN(test_nccl_errors);
    TEST_RUN(test_collective_timeouts);
    TEST_RUN(test_graph);
    TEST_RUN(test_context_switch_faults);
    TEST_RUN(test_leak);
    CHECK(fake.misuse_count() == 0);
    CHECK(ncclfault.pending() == 0);
    return test_result("test_td_comm_faults");
}
