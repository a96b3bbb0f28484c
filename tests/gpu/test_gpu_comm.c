/* Communicators on real GPUs over NCCL, one process driving all of them: on 2 GPUs, and on 4
 * when there are 4 or more (--gpus N: only N). Collectives on fresh random data against a
 * CPU reference in double precision (f32 and bf16 sums within NCCL's rounding, exact
 * max/gather/moves), outputs poisoned first, inputs written on another stream than the
 * collective's (the stream layer orders them); all-to-all and all-to-all-v with different
 * counts per peer, zeros included, and gaps that must keep their poison; a send/receive ring;
 * a rank that never joins a collective (every rank that issued it gets SC_ERR_TIMEOUT within
 * the timeout, the device stays usable); an all-reduce captured in a graph per GPU (a thread
 * each, as NCCL advises) replayed bit for bit equal to the eager one; a communicator left
 * alive reported by its context's destroy.
 *
 * Skips (77): no GPU; fewer than 2 GPUs; no NCCL (the reason printed). Modes:
 *   double   SAFECUDA_LIBNCCL is safecuda's NCCL test double: refused on a GPU
 *            (SC_ERR_NOT_SUPPORTED); needs one GPU;
 *   fork     the launcher-free multi-process form: the parent makes the unique id (it never
 *            touches CUDA), forks one process per rank (--gpus N, default 2), each creates its
 *            rank with sc_comm_create and all-reduces. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../bf16.h"
#include "../test.h"
#include "safecuda/comm.h"

#define MAX 8
static int n;                 /* ranks of this round */
static sc_context ctxs[MAX];
static sc_comm comms[MAX];

static void poison(sc_buffer b)
{
    uint32_t nan = 0x7fc0dead;
    sc_buffer_props p;
    REQUIRE(sc_buffer_info(b, &p) == SC_OK);
    if (p.dtype == SC_F32)
        REQUIRE(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), &nan) == SC_OK);
    else {
        uint16_t h = 0x7fc1;
        REQUIRE(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), &h) == SC_OK);
    }
}

static sc_buffer make(int r, sc_dtype t, uint64_t count, const char *label)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctxs[r], &(sc_buffer_desc){.dtype = t, .count = count,
                                                        .label = label}, &b) == SC_OK);
    return b;
}

static double value(const void *p, size_t i, sc_dtype t)
{
    if (t == SC_F32)
        return ((const float *)p)[i];
    return bf2f(((const uint16_t *)p)[i]);
}

/* ---- reductions against the CPU ----------------------------------------------------------- */

/* All-reduce (sum or max) or reduce-scatter (sum) of random t over the ranks: the inputs are
 * copied into src on stream A, the collective runs on stream B (one group, one thread). */
static void reduce_case(sc_dtype t, sc_reduce_op op, bool scatter, size_t c)
{
    const size_t es = sc_dtype_size(t), total = scatter ? c * (size_t)n : c;
    const size_t out = scatter ? c : total;
    void *in[MAX];
    sc_buffer src[MAX], dst[MAX], stage[MAX];
    sc_stream a[MAX], b[MAX];
    for (int r = 0; r < n; r++) {
        in[r] = test_xmalloc(total * es);
        if (t == SC_F32) {
            uint64_t st = 77 + (uint64_t)r * 1000 + (uint64_t)op * 10 + scatter;
            for (size_t i = 0; i < total; i++)
                ((float *)in[r])[i] = (float)((double)(test_rand(&st) >> 11) / 0x1p53 * 2 - 1);
        } else {
            uint64_t st = 99 + (uint64_t)r * 1000 + (uint64_t)op * 10 + scatter;
            for (size_t i = 0; i < total; i++)
                ((uint16_t *)in[r])[i] =
                    f2bf((float)((double)(test_rand(&st) >> 11) / 0x1p53 * 2 - 1));
        }
        src[r] = make(r, t, total, "src");
        stage[r] = make(r, t, total, "stage");
        dst[r] = make(r, t, out, "dst");
        poison(dst[r]);
        poison(src[r]);
        REQUIRE(sc_stream_create(ctxs[r], NULL, &a[r]) == SC_OK);
        REQUIRE(sc_stream_create(ctxs[r], NULL, &b[r]) == SC_OK);
        CHECK_OK(sc_copy_from_host(a[r], sc_view_of(stage[r]), in[r], total * es));
        CHECK_OK(sc_copy(a[r], sc_view_of(src[r]), sc_view_of(stage[r]))); /* async on A */
    }
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++) {
        if (scatter)
            CHECK_OK(sc_comm_reduce_scatter(comms[r], b[r], sc_view_of(dst[r]),
                                            sc_view_of(src[r]), op));
        else
            CHECK_OK(sc_comm_all_reduce(comms[r], b[r], sc_view_of(dst[r]), sc_view_of(src[r]),
                                        op));
    }
    CHECK_OK(sc_comm_group_end());
    void *got = test_xmalloc(out * es);
    const double eps = t == SC_F32 ? 0x1p-23 : 0x1p-8;
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_synchronize(comms[r]));
        CHECK_OK(sc_copy_to_host(b[r], got, out * es, sc_view_of(dst[r])));
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < out; i++) {
            const size_t at = scatter ? (size_t)r * c + i : i;
            double want = op == SC_REDUCE_MAX ? -INFINITY : 0, mag = 0;
            for (int q = 0; q < n; q++) {
                const double v = value(in[q], at, t);
                want = op == SC_REDUCE_MAX ? fmax(want, v) : want + v;
                mag += fabs(v);
            }
            const double g = value(got, i, t);
            const double tol = op == SC_REDUCE_MAX ? 0 : n * eps * mag + 1e-30;
            if (!(fabs(g - want) <= tol) && !bad++)
                first = i;
        }
        if (bad) {
            fprintf(stderr, "%s %s %s, %d ranks, rank %d: %zu of %zu wrong, first at %zu\n",
                    scatter ? "reduce-scatter" : "all-reduce", sc_dtype_name(t),
                    op == SC_REDUCE_MAX ? "max" : "sum", n, r, bad, out, first);
            test_failures++;
        }
    }
    for (int r = 0; r < n; r++) {
        sc_buffer list[] = {src[r], dst[r], stage[r]};
        for (int k = 0; k < 3; k++)
            CHECK_OK(sc_buffer_destroy(list[k]));
        CHECK_OK(sc_stream_destroy(a[r]));
        CHECK_OK(sc_stream_destroy(b[r]));
        free(in[r]);
    }
    free(got);
}

/* ---- data movement, exact ------------------------------------------------------------------ */

static void gather_case(size_t c)
{
    uint16_t *in[MAX], *want = test_xmalloc((size_t)n * c * 2), *got = test_xmalloc((size_t)n * c * 2);
    sc_buffer src[MAX], dst[MAX];
    for (int r = 0; r < n; r++) {
        in[r] = test_xmalloc(c * 2);
        test_fill_random(in[r], c * 2, 5000u + (unsigned)r);
        memcpy(want + (size_t)r * c, in[r], c * 2);
        src[r] = make(r, SC_BF16, c, "src");
        dst[r] = make(r, SC_BF16, (uint64_t)n * c, "dst");
        poison(dst[r]);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(src[r]), in[r], c * 2));
    }
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++)
        CHECK_OK(sc_comm_all_gather(comms[r], SC_DEFAULT_STREAM, sc_view_of(dst[r]),
                                    sc_view_of(src[r])));
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_synchronize(comms[r]));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, (size_t)n * c * 2, sc_view_of(dst[r])));
        CHECK_BYTES(got, want, (size_t)n * c * 2, "all-gather bf16");
        CHECK_OK(sc_buffer_destroy(src[r]));
        CHECK_OK(sc_buffer_destroy(dst[r]));
        free(in[r]);
    }
    free(want);
    free(got);
}

/* m[p][q] elements from p to q: (p + 2q + 1) % 3 x unit (rank 0 sends rank 1 nothing, and
 * more zeros with 4 ranks), or unit each (equal);
 * odd ranks use explicit offsets with gaps of 5 elements that keep their poison. */
static void exchange_case(bool equal, uint64_t unit)
{
    enum { GAP = 5 };
    uint64_t m[MAX][MAX], so[MAX][MAX], ro[MAX][MAX], slen[MAX], rlen[MAX];
    for (int p = 0; p < n; p++)
        for (int q = 0; q < n; q++)
            m[p][q] = equal ? unit : (uint64_t)((p + 2 * q + 1) % 3) * unit; /* 0 for some */
    for (int r = 0; r < n; r++) {
        const uint64_t gap = equal || r % 2 == 0 ? 0 : GAP;
        slen[r] = rlen[r] = gap;
        for (int q = 0; q < n; q++) {
            so[r][q] = slen[r];
            slen[r] += m[r][q] + gap;
            ro[r][q] = rlen[r];
            rlen[r] += m[q][r] + gap;
        }
    }
    float *in[MAX];
    sc_buffer src[MAX], dst[MAX];
    for (int r = 0; r < n; r++) {
        in[r] = test_xmalloc(slen[r] * 4);
        test_fill_random(in[r], slen[r] * 4, 9000u + (unsigned)r + 100u * equal);
        src[r] = make(r, SC_F32, slen[r], "src");
        dst[r] = make(r, SC_F32, rlen[r], "dst");
        poison(dst[r]);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(src[r]), in[r], slen[r] * 4));
    }
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++) {
        uint64_t sc[MAX], rc[MAX];
        for (int q = 0; q < n; q++) {
            sc[q] = m[r][q];
            rc[q] = m[q][r];
        }
        if (equal)
            CHECK_OK(sc_comm_all_to_all(comms[r], SC_DEFAULT_STREAM, sc_view_of(dst[r]),
                                        sc_view_of(src[r])));
        else
            CHECK_OK(sc_comm_all_to_all_v(comms[r], SC_DEFAULT_STREAM, sc_view_of(dst[r]), rc,
                                          r % 2 ? ro[r] : NULL, sc_view_of(src[r]), sc,
                                          r % 2 ? so[r] : NULL));
    }
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_synchronize(comms[r]));
        uint32_t *want = test_xmalloc(rlen[r] * 4), *got = test_xmalloc(rlen[r] * 4);
        for (uint64_t i = 0; i < rlen[r]; i++)
            want[i] = 0x7fc0dead;
        for (int p = 0; p < n; p++)
            memcpy(want + ro[r][p], in[p] + so[p][r], m[p][r] * 4);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, rlen[r] * 4, sc_view_of(dst[r])));
        CHECK_BYTES(got, want, rlen[r] * 4, equal ? "all-to-all" : "all-to-all-v");
        free(want);
        free(got);
    }
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_buffer_destroy(src[r]));
        CHECK_OK(sc_buffer_destroy(dst[r]));
        free(in[r]);
    }
}

static void ring_case(size_t c)
{
    float *in[MAX], *got = test_xmalloc(c * 4);
    sc_buffer src[MAX], dst[MAX];
    for (int r = 0; r < n; r++) {
        in[r] = test_xmalloc(c * 4);
        test_fill_random(in[r], c * 4, 12000u + (unsigned)r);
        src[r] = make(r, SC_F32, c, "src");
        dst[r] = make(r, SC_F32, c, "dst");
        poison(dst[r]);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(src[r]), in[r], c * 4));
    }
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_send(comms[r], SC_DEFAULT_STREAM, sc_view_of(src[r]), (r + 1) % n));
        CHECK_OK(sc_comm_recv(comms[r], SC_DEFAULT_STREAM, sc_view_of(dst[r]), (r + n - 1) % n));
    }
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_synchronize(comms[r]));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, c * 4, sc_view_of(dst[r])));
        CHECK_BYTES(got, in[(r + n - 1) % n], c * 4, "send/receive ring");
    }
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_buffer_destroy(src[r]));
        CHECK_OK(sc_buffer_destroy(dst[r]));
        free(in[r]);
    }
    free(got);
}

/* ---- graphs: each GPU's thread captures and replays its own --------------------------------- */

typedef struct graph_job {
    int rank;
    size_t c;
    pthread_barrier_t *barrier;
    bool ok;
} graph_job;

static void *graph_thread(void *arg)
{
    graph_job *j = arg;
    const int r = j->rank;
    const size_t bytes = j->c * 4;
    float *in = test_xmalloc(bytes), *eager = test_xmalloc(bytes), *replay = test_xmalloc(bytes);
    test_fill_random(in, bytes, 33000u + (unsigned)r);
    for (size_t i = 0; i < j->c; i++) /* finite values in [-1, 1) */
        in[i] = (float)((int32_t)((uint32_t *)in)[i] >> 8) * 0x1p-23f;
    sc_stream s;
    sc_buffer x = make(r, SC_F32, j->c, "x"), y = make(r, SC_F32, j->c, "y");
    REQUIRE(sc_stream_create(ctxs[r], NULL, &s) == SC_OK);
    CHECK_OK(sc_copy_from_host(s, sc_view_of(x), in, bytes));
    /* Eager first (it also connects NCCL's peers, which a capture must not do). */
    CHECK_OK(sc_comm_all_reduce(comms[r], s, sc_view_of(y), sc_view_of(x), SC_REDUCE_SUM));
    CHECK_OK(sc_comm_synchronize(comms[r]));
    CHECK_OK(sc_copy_to_host(s, eager, bytes, sc_view_of(y)));
    poison(y);
    pthread_barrier_wait(j->barrier);
    sc_graph g;
    sc_graph_exec e;
    CHECK_OK(sc_stream_begin_capture(s, &(sc_capture_desc){.mode = SC_CAPTURE_THREAD_LOCAL}));
    CHECK_OK(sc_comm_all_reduce(comms[r], s, sc_view_of(y), sc_view_of(x), SC_REDUCE_SUM));
    CHECK_OK(sc_stream_end_capture(s, &g));
    CHECK_OK(sc_graph_instantiate(g, &e));
    pthread_barrier_wait(j->barrier);
    for (int rep = 0; rep < 3; rep++) {
        CHECK_OK(sc_graph_launch(s, e));
        CHECK_OK(sc_stream_synchronize(s));
        CHECK_OK(sc_copy_to_host(s, replay, bytes, sc_view_of(y)));
        j->ok = test_same_bytes(replay, eager, bytes, "graph replay vs eager all-reduce");
        CHECK(j->ok);
        poison(y);
        pthread_barrier_wait(j->barrier);
    }
    /* NCCL waits for the graphs that use a communicator before it finishes it. */
    CHECK_OK(sc_graph_exec_destroy(e));
    CHECK_OK(sc_graph_destroy(g));
    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_buffer_destroy(y));
    CHECK_OK(sc_stream_destroy(s));
    free(in), free(eager), free(replay);
    return NULL;
}

static void graph_case(size_t c)
{
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n);
    graph_job jobs[MAX];
    pthread_t t[MAX];
    for (int r = 0; r < n; r++) {
        jobs[r] = (graph_job){.rank = r, .c = c, .barrier = &barrier};
        REQUIRE(pthread_create(&t[r], NULL, graph_thread, &jobs[r]) == 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(t[r], NULL);
    pthread_barrier_destroy(&barrier);
}

/* ---- a rank that never joins ----------------------------------------------------------------- */

static void timeout_case(void)
{
    const uint32_t timeout_ms = 3000;
    sc_comm late[MAX];
    REQUIRE(sc_comm_create_all(ctxs, n, &(sc_comm_all_desc){.timeout_ms = timeout_ms,
                                                            .label = "late"}, late) == SC_OK);
    sc_buffer x[MAX];
    for (int r = 0; r < n; r++) {
        x[r] = make(r, SC_F32, 1 << 16, "x");
        poison(x[r]);
    }
    /* A first collective of every rank connects the peers. */
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++)
        CHECK_OK(sc_comm_all_reduce(late[r], SC_DEFAULT_STREAM, sc_view_of(x[r]),
                                    sc_view_of(x[r]), SC_REDUCE_MAX));
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n; r++)
        CHECK_OK(sc_comm_synchronize(late[r]));
    /* Rank n - 1 never joins the next one. */
    const double t0 = test_now_s();
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n - 1; r++)
        CHECK_OK(sc_comm_all_reduce(late[r], SC_DEFAULT_STREAM, sc_view_of(x[r]),
                                    sc_view_of(x[r]), SC_REDUCE_MAX));
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n - 1; r++) {
        sc_clear_error();
        CHECK_STATUS(sc_comm_synchronize(late[r]), SC_ERR_TIMEOUT);
        CHECK_MSG("sc_comm_synchronize: communicator 'late' (rank ");
        CHECK_MSG("the all-reduce of 65536 x f32 (max) issued ");
        CHECK_MSG("did not finish within the timeout of 3000 ms");
    }
    const double t = test_now_s() - t0;
    printf("  a rank that never joins: the other %d got SC_ERR_TIMEOUT after %.2f s (timeout "
           "%.1f s)\n", n - 1, t, timeout_ms / 1000.0);
    CHECK(t >= timeout_ms / 1000.0 - 0.05 && t < timeout_ms / 1000.0 + 10);
    /* The aborted collectives ended: the devices are usable. */
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_context_synchronize(ctxs[r]));
        CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(x[r]), &(float){1.0f}));
        CHECK_OK(sc_buffer_destroy(x[r]));
    }
    CHECK_OK(sc_comm_query(late[n - 1])); /* it issued nothing */
    for (int r = 0; r < n; r++) {
        sc_status s = sc_comm_destroy(late[r]);
        if (s != SC_OK) /* the rank that never joined: its peers are gone */
            printf("  destroying rank %d of the aborted group: %s: %s\n", r, sc_status_name(s),
                   sc_last_error());
        CHECK(s == SC_OK || (r == n - 1 && s == SC_ERR_TIMEOUT));
    }
}

/* ---- a communicator left alive ------------------------------------------------------------- */

static void leak_case(void)
{
    sc_context mine[MAX];
    sc_comm leak[MAX];
    for (int r = 0; r < n; r++)
        REQUIRE(sc_context_create(&(sc_context_desc){.device = r}, &mine[r]) == SC_OK);
    const int line = __LINE__ + 1;
    REQUIRE(sc_comm_create_all(mine, n, &(sc_comm_all_desc){.label = "leak"}, leak) == SC_OK);
    sc_set_log_callback(test_log_capture, NULL);
    test_log_text[0] = '\0';
    CHECK_STATUS(sc_context_destroy(mine[0]), SC_ERR_LEAKED);
    sc_set_log_callback(NULL, NULL);
    char want[200];
    snprintf(want, sizeof want, "  communicator 'leak' rank 0 of %d, device 0, 0 bytes, created "
             "at test_gpu_comm.c:%d\n", n, line);
    CHECK(strstr(test_log_text, want) != NULL);
    CHECK_STATUS(sc_comm_query(leak[0]), SC_ERR_STALE_HANDLE);
    for (int r = 1; r < n; r++) {
        CHECK_OK(sc_comm_destroy(leak[r]));
        CHECK_OK(sc_context_destroy(mine[r]));
    }
}

/* ---- the modes ------------------------------------------------------------------------------- */

static void run_round(void)
{
    printf("== %d GPUs\n", n);
    for (int r = 0; r < n; r++)
        REQUIRE(sc_context_create(&(sc_context_desc){.device = r}, &ctxs[r]) == SC_OK);
    REQUIRE(sc_comm_create_all(ctxs, n, &(sc_comm_all_desc){.timeout_ms = 60000,
                                                            .label = "world"}, comms) == SC_OK);
    gather_case(7);
    for (size_t k = 0; k < 2; k++) {
        const size_t c = k ? (1u << 22) + 3 : 1000;
        reduce_case(SC_F32, SC_REDUCE_SUM, false, c);
        reduce_case(SC_BF16, SC_REDUCE_SUM, false, c);
        reduce_case(SC_F32, SC_REDUCE_MAX, false, c);
        reduce_case(SC_F32, SC_REDUCE_SUM, true, c);
        reduce_case(SC_BF16, SC_REDUCE_SUM, true, c);
    }
    gather_case(1 << 20);
    exchange_case(false, 1000);
    exchange_case(false, 1 << 18);
    exchange_case(true, 4097);
    ring_case((1u << 20) + 1);
    graph_case((1u << 20) + 7);
    for (int r = 0; r < n; r++)
        CHECK_OK(sc_comm_destroy(comms[r]));
    timeout_case();
    leak_case();
    for (int r = 0; r < n; r++)
        CHECK_OK(sc_context_destroy(ctxs[r]));
}

static void run_double(void)
{
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_comm_id id;
    REQUIRE(sc_comm_unique_id(&id) == SC_OK);
    sc_comm c;
    CHECK_STATUS(sc_comm_create(ctx, &(sc_comm_desc){.unique_id = id, .nranks = 1}, &c),
                 SC_ERR_NOT_SUPPORTED);
    CHECK_MSG("is safecuda's NCCL test double, which works on the test device");
    CHECK_OK(sc_context_destroy(ctx));
}

/* One process per rank, forked after the parent made the id (the parent keeps NCCL's
 * bootstrap root alive and never touches CUDA). */
static int run_fork(int ranks)
{
    sc_comm_id id;
    if (sc_comm_unique_id(&id) != SC_OK) {
        printf("test_gpu_comm: skipped: %s\n", sc_last_error());
        return 77;
    }
    pid_t pids[MAX];
    for (int r = 0; r < ranks; r++) {
        pids[r] = fork();
        REQUIRE(pids[r] >= 0);
        if (pids[r] > 0)
            continue;
        int count = 0;
        if (sc_device_count(&count) != SC_OK || count < ranks) {
            if (r == 0)
                printf("test_gpu_comm fork: skipped: %d GPU(s) here, %d needed%s%s\n", count,
                       ranks, count ? "" : ": ", count ? "" : sc_last_error());
            fflush(stdout);
            _exit(77);
        }
        sc_context ctx;
        sc_comm c;
        if (sc_context_create(&(sc_context_desc){.device = r}, &ctx) != SC_OK ||
            sc_comm_create(ctx, &(sc_comm_desc){.unique_id = id, .nranks = ranks, .rank = r,
                                                .timeout_ms = 60000}, &c) != SC_OK) {
            fprintf(stderr, "rank %d: %s\n", r, sc_last_error());
            fflush(stderr);
            _exit(1);
        }
        enum { C = 1 << 16 };
        static float v[C];
        for (int i = 0; i < C; i++)
            v[i] = (float)(r + 1) * (float)(i % 97);
        sc_buffer b;
        REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = C}, &b) ==
                SC_OK);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), v, sizeof v));
        CHECK_OK(sc_comm_all_reduce(c, SC_DEFAULT_STREAM, sc_view_of(b), sc_view_of(b),
                                    SC_REDUCE_SUM));
        CHECK_OK(sc_comm_synchronize(c));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, v, sizeof v, sc_view_of(b)));
        const float ranks_sum = (float)(ranks * (ranks + 1) / 2);
        for (int i = 0; i < C; i++)
            if (v[i] != ranks_sum * (float)(i % 97)) {
                fprintf(stderr, "rank %d: element %d is %g, want %g\n", r, i, v[i],
                        ranks_sum * (float)(i % 97));
                test_failures++;
                break;
            }
        CHECK_OK(sc_buffer_destroy(b));
        CHECK_OK(sc_comm_destroy(c));
        CHECK_OK(sc_context_destroy(ctx));
        fflush(stdout);
        fflush(stderr);
        _exit(test_failures ? 1 : 0);
    }
    int rc = 0, skipped = 0;
    for (int r = 0; r < ranks; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 1;
        skipped += code == 77;
        if (code != 0 && code != 77)
            rc = 1;
    }
    if (rc == 0 && skipped) {
        printf("test_gpu_comm: skipped: fewer than %d GPUs (or no GPU)\n", ranks);
        return 77;
    }
    printf("test_gpu_comm fork: %d processes %s\n", ranks, rc ? "FAILED" : "passed");
    return rc;
}

int main(int argc, char **argv)
{
    const char *mode = "";
    int want = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--gpus") == 0 && i + 1 < argc)
            want = atoi(argv[++i]);
        else
            mode = argv[i];
    }
    if (want < 0 || want > MAX) {
        fprintf(stderr, "test_gpu_comm: --gpus %d: 2 .. %d\n", want, MAX);
        return 2;
    }
    if (strcmp(mode, "fork") == 0)
        return run_fork(want ? want : 2);
    gpu_require();
    if (strcmp(mode, "double") == 0) {
        run_double();
        return test_result("test_gpu_comm double");
    }
    int count = 0;
    REQUIRE(sc_device_count(&count) == SC_OK);
    if (count < 2 || (want && count < want)) {
        printf("test_gpu_comm: skipped: %d GPU%s here; the communicator tests need %d\n", count,
               count == 1 ? "" : "s", want ? want : 2);
        return 77;
    }
    int v = 0;
    char path[1024] = "";
    if (sc_comm_library_version(&v) != SC_OK) {
        printf("test_gpu_comm: skipped: no NCCL: %s\n", sc_last_error());
        return 77;
    }
    CHECK_OK(sc_comm_library_path(path, sizeof path));
    printf("NCCL %d.%d.%d (%s), %d GPUs\n", v / 10000, (v / 100) % 100, v % 100, path, count);
    const int rounds[] = {2, 4};
    for (int k = 0; k < 2; k++) {
        n = want ? want : rounds[k];
        if (n > count || (want && k > 0))
            break;
        run_round();
    }
    return test_result("test_gpu_comm");
}
