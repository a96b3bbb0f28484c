/* Every refusal of the communicators' calls, with its status and whole message, on the test
 * device with the NCCL test double (comm_td.h). A refused call changes nothing: the ranks'
 * later collectives still pair (each group below ends with both ranks' calls, so the double
 * completes them). Modes (tests/testdevice/CMakeLists.txt): none, "old-nccl" (the double
 * reports NCCL 2.20.0: no fp8 types) and "sm80" (SAFECUDA_TESTDEVICE_CC=80). */
#define _GNU_SOURCE

#include "comm_td.h"
#include "safecuda/interop.h"

static char A[240], B[240], C[300]; /* descriptions for messages */

static void test_create_refusals(void)
{
    open_contexts(3);
    sc_comm comm = {99};
    sc_comm_desc d = {.nranks = 2, .rank = 0};
    CHECK_REFUSED(sc_comm_create(ctxs[0], NULL, &comm), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create: argument 'desc' is NULL");
    CHECK(comm.id == 0);
    CHECK_REFUSED(sc_comm_create(ctxs[0], &d, NULL), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create: argument 'comm' is NULL");
    d.nranks = 0;
    CHECK_REFUSED(sc_comm_create(ctxs[0], &d, &comm), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create: desc->nranks is 0: at least 1");
    d.nranks = 2;
    d.rank = 2;
    CHECK_REFUSED(sc_comm_create(ctxs[0], &d, &comm), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create: desc->rank 2 is outside [0, 2)");
    d.rank = -1;
    CHECK_REFUSED(sc_comm_create(ctxs[0], &d, &comm), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create: desc->rank -1 is outside [0, 2)");
    /* An id NCCL did not make (all zero): NCCL's refusal, quoted. */
    d = (sc_comm_desc){.nranks = 1};
    CHECK_REFUSED(sc_comm_create(ctxs[0], &d, &comm), SC_ERR_COMM,
                  "sc_comm_create: ncclCommInitRankConfig(rank 0 of 1, device 0) failed: "
                  "ncclInvalidArgument (invalid argument (run with NCCL_DEBUG=WARN for "
                  "details)); NCCL's last error: ncclfault: rank 0 of 1, or an id not made by "
                  "ncclGetUniqueId");
    CHECK(comm.id == 0);

    CHECK_REFUSED(sc_comm_create_all(ctxs, 2, NULL, NULL), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create_all: argument 'comms' is NULL");
    CHECK_REFUSED(sc_comm_create_all(NULL, 2, NULL, comms), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create_all: argument 'contexts' is NULL");
    CHECK_REFUSED(sc_comm_create_all(ctxs, 0, NULL, comms), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create_all: n is 0: at least 1 context");
    sc_context twice[2] = {ctxs[1], ctxs[1]};
    CHECK_REFUSED(sc_comm_create_all(twice, 2, NULL, comms), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_create_all: contexts[0] and contexts[1] are both on device 1: NCCL "
                  "takes one rank per GPU");
    CHECK(comms[0].id == 0 && comms[1].id == 0);
    sc_context gone;
    REQUIRE(sc_context_create(&(sc_context_desc){.device = 3}, &gone) == SC_OK);
    CHECK_OK(sc_context_destroy(gone));
    sc_context with_gone[2] = {ctxs[0], gone};
    sc_clear_error();
    CHECK_STATUS(sc_comm_create_all(with_gone, 2, NULL, comms), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_comm_create_all: ");
    CHECK_MSG(" (contexts[1])");
    sc_clear_error();
    CHECK_STATUS(sc_comm_create(gone, &d, &comm), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_comm_create: ");
    CHECK(ncclfault.live_comms() == 0);
    close_contexts(3);
}

/* Both ranks' all-reduce of f32 sum in one group (the double completes it). */
static void pair_all_reduce(sc_buffer x0, sc_buffer x1)
{
    CHECK_OK(sc_comm_group_begin());
    CHECK_OK(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, sc_view_of(x0), sc_view_of(x0),
                                SC_REDUCE_SUM));
    CHECK_OK(sc_comm_all_reduce(comms[1], SC_DEFAULT_STREAM, sc_view_of(x1), sc_view_of(x1),
                                SC_REDUCE_SUM));
    CHECK_OK(sc_comm_group_end());
    CHECK_OK(sc_comm_synchronize(comms[0]));
    CHECK_OK(sc_comm_synchronize(comms[1]));
}

static void test_collective_refusals(void)
{
    open_contexts(3);
    world(2, 0);
    const sc_stream S = SC_DEFAULT_STREAM;
    sc_buffer a = buf(ctxs[0], SC_F32, 16, "a"), b = buf(ctxs[0], SC_F32, 16, "b");
    sc_buffer h = buf(ctxs[0], SC_F32, 8, "h"), i = buf(ctxs[0], SC_I32, 16, "i");
    sc_buffer u = buf(ctxs[0], SC_U16, 16, "u"), e = buf(ctxs[0], SC_F8E4M3, 16, "e");
    sc_buffer big = buf(ctxs[0], SC_F32, 32, "big"), o = buf(ctxs[2], SC_F32, 16, "other");
    sc_buffer a1 = buf(ctxs[1], SC_F32, 16, "a1");
    cdesc(0, 2, C, sizeof C);

    /* Counts, types, contexts. */
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], S, sc_view_of(h), sc_view_of(a), SC_REDUCE_SUM),
                  SC_ERR_OUT_OF_BOUNDS,
                  "sc_comm_all_reduce: dst has 8 elements; an all-reduce of src needs 16");
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], S, sc_view_of(i), sc_view_of(a), SC_REDUCE_SUM),
                  SC_ERR_TYPE_MISMATCH, "sc_comm_all_reduce: dst is i32 (%s) but src is f32 (%s)",
                  bdesc("i", 16, "i32", A, sizeof A), bdesc("a", 16, "f32", B, sizeof B));
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], S, sc_view_of(a), sc_view_of(o), SC_REDUCE_SUM),
                  SC_ERR_WRONG_CONTEXT, "sc_comm_all_reduce: src %s belongs to another context "
                  "than %s", bdesc("other", 16, "f32", A, sizeof A), C);
    sc_stream s1;
    const int stream_line = __LINE__ + 1;
    REQUIRE(sc_stream_create(ctxs[1], NULL, &s1) == SC_OK);
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], s1, sc_view_of(a), sc_view_of(b), SC_REDUCE_SUM),
                  SC_ERR_WRONG_CONTEXT,
                  "sc_comm_all_reduce: the stream (created at test_td_comm_checks.c:%d) belongs "
                  "to the context on device 1 created at comm_td.h:%d, not to the context on "
                  "device 0 created at comm_td.h:%d",
                  stream_line, contexts_line, contexts_line);

    /* Operations and element types. */
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], S, sc_view_of(a), sc_view_of(b), (sc_reduce_op)9),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_reduce: op 9 is not an sc_reduce_op "
                  "(SC_REDUCE_SUM .. SC_REDUCE_AVG)");
    CHECK_REFUSED(sc_comm_reduce_scatter(comms[0], S, sc_view_of(h), sc_view_of(a),
                                         (sc_reduce_op)-1),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_reduce_scatter: op -1 is not an "
                  "sc_reduce_op (SC_REDUCE_SUM .. SC_REDUCE_AVG)");
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], S, sc_view_of(i), sc_view_of(i), SC_REDUCE_AVG),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_reduce: SC_REDUCE_AVG of i32 elements: "
                  "NCCL divides an integer sum by the rank count with truncation, which is not "
                  "the average; reduce with SC_REDUCE_SUM and divide");
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], S, sc_view_of(e), sc_view_of(e), SC_REDUCE_AVG),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_reduce: SC_REDUCE_AVG of f8e4m3 "
                  "elements: NCCL multiplies each value by 1/nranks rounded to fp8 (1/3 is "
                  "0.34375 in e4m3), which is not the average; reduce a wider type");
    CHECK_REFUSED(sc_comm_reduce_scatter(comms[0], S, (sc_view){u, 0, 8}, sc_view_of(u),
                                         SC_REDUCE_MAX),
                  SC_ERR_NOT_SUPPORTED, "sc_comm_reduce_scatter: NCCL can't reduce u16 elements "
                  "(it has no 16-bit integer type); widen them to 32 bits (moving them works: "
                  "all-gather, all-to-all, send)");

    /* Overlap rules. */
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], S, (sc_view){a, 0, 8}, (sc_view){a, 4, 8},
                                     SC_REDUCE_SUM),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_reduce: dst elements [0, 8) of %s "
                  "overlap src elements [4, 12) of %s: an all-reduce is in place only when dst "
                  "is src (the same elements)", bdesc("a", 16, "f32", A, sizeof A), A);
    sc_buffer x1 = buf(ctxs[1], SC_F32, 16, "x1");
    bdesc("x1", 16, "f32", B, sizeof B);
    CHECK_REFUSED(sc_comm_reduce_scatter(comms[1], S, (sc_view){x1, 0, 8}, sc_view_of(x1),
                                         SC_REDUCE_SUM),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_reduce_scatter: dst elements [0, 8) of %s "
                  "overlap src elements [0, 16) of %s: a reduce-scatter is in place only when "
                  "dst is src's elements [rank x n, (rank + 1) x n)", B, B);
    CHECK_REFUSED(sc_comm_all_gather(comms[1], S, sc_view_of(x1), (sc_view){x1, 0, 8}),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_gather: dst elements [0, 16) of %s "
                  "overlap src elements [0, 8) of %s: an all-gather is in place only when src "
                  "is dst's elements [rank x n, (rank + 1) x n)", B, B);
    CHECK_REFUSED(sc_comm_all_to_all(comms[0], S, (sc_view){a, 0, 8}, (sc_view){a, 4, 8}),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_to_all: dst elements [0, 8) of %s "
                  "overlap src elements [4, 12) of %s: an all-to-all can't be in place", A, A);

    /* Shapes. */
    CHECK_REFUSED(sc_comm_reduce_scatter(comms[0], S, sc_view_of(h), sc_view_of(big),
                                         SC_REDUCE_SUM),
                  SC_ERR_OUT_OF_BOUNDS, "sc_comm_reduce_scatter: src has 32 elements; a "
                  "reduce-scatter into the ranks' dst needs 16");
    CHECK_REFUSED(sc_comm_all_gather(comms[0], S, sc_view_of(a), sc_view_of(b)),
                  SC_ERR_OUT_OF_BOUNDS, "sc_comm_all_gather: dst has 16 elements; an all-gather "
                  "of the ranks' src needs 32");
    CHECK_REFUSED(sc_comm_all_to_all(comms[0], S, sc_view_of(h), sc_view_of(a)),
                  SC_ERR_OUT_OF_BOUNDS, "sc_comm_all_to_all: dst has 8 elements; an all-to-all "
                  "of src needs 16");
    CHECK_REFUSED(sc_comm_all_to_all(comms[0], S, (sc_view){a, 0, 15}, (sc_view){b, 0, 15}),
                  SC_ERR_OUT_OF_BOUNDS, "sc_comm_all_to_all: src has 15 elements, not a "
                  "multiple of the 2 ranks");
    uint64_t c44[2] = {4, 4}, c10[2] = {10, 10}, o02[2] = {0, 2}, huge[2] = {UINT64_MAX, 2};
    uint64_t omax[2] = {UINT64_MAX, 0}, c11[2] = {1, 1};
    CHECK_REFUSED(sc_comm_all_to_all_v(comms[0], S, sc_view_of(a), NULL, NULL, sc_view_of(b),
                                       c44, NULL),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_to_all_v: argument 'recv_counts' is NULL");
    CHECK_REFUSED(sc_comm_all_to_all_v(comms[0], S, sc_view_of(a), c44, NULL, sc_view_of(b),
                                       NULL, NULL),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_to_all_v: argument 'send_counts' is NULL");
    CHECK_REFUSED(sc_comm_all_to_all_v(comms[0], S, sc_view_of(a), c44, NULL, sc_view_of(b),
                                       c10, NULL),
                  SC_ERR_OUT_OF_BOUNDS, "sc_comm_all_to_all_v: the send segment of rank 1, "
                  "elements [10, 20), is outside the src view's 16 elements");
    CHECK_REFUSED(sc_comm_all_to_all_v(comms[0], S, sc_view_of(a), c44, o02, sc_view_of(b),
                                       c44, NULL),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_to_all_v: the receive segments of ranks "
                  "0, elements [0, 4), and 1, elements [2, 6), of dst overlap");
    CHECK_REFUSED(sc_comm_all_to_all_v(comms[0], S, sc_view_of(a), c11, omax, sc_view_of(b),
                                       c44, NULL),
                  SC_ERR_OVERFLOW, "sc_comm_all_to_all_v: the receive segment of rank 0: "
                  "offset 18446744073709551615 + count 1 overflows");
    CHECK_REFUSED(sc_comm_all_to_all_v(comms[0], S, sc_view_of(a), c44, NULL, sc_view_of(b),
                                       huge, NULL),
                  SC_ERR_OVERFLOW, "sc_comm_all_to_all_v: the sum of send_counts passes 64 "
                  "bits (at rank 1)");
    CHECK_REFUSED(sc_comm_all_to_all_v(comms[0], S, (sc_view){a, 0, 8}, c44, NULL,
                                       (sc_view){a, 4, 8}, c44, NULL),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_to_all_v: dst elements [0, 8) of %s "
                  "overlap src elements [4, 12) of %s: an all-to-all-v can't be in place", A, A);
    CHECK_REFUSED(sc_comm_send(comms[0], S, sc_view_of(a), 2), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_send: peer 2 is outside [0, 2)");
    CHECK_REFUSED(sc_comm_recv(comms[0], S, sc_view_of(a), -1), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_recv: peer -1 is outside [0, 2)");

    /* A read-only (borrowed) output. */
    uint64_t ptr = 0;
    CHECK_OK(sc_buffer_device_ptr(b, &ptr));
    sc_buffer ro;
    const int ro_line = __LINE__ + 2;
    sc_borrow_desc bd = {.dtype = SC_F32, .count = 16, .label = "ro", .read_only = true};
    REQUIRE(sc_buffer_borrow(ctxs[0], ptr, &bd, &ro) == SC_OK);
    CHECK_REFUSED(sc_comm_all_reduce(comms[0], S, sc_view_of(ro), sc_view_of(a), SC_REDUCE_SUM),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_reduce: dst borrowed buffer 'ro' of 16 "
                  "f32 (created at test_td_comm_checks.c:%d) is read-only (borrowed or imported "
                  "read-only): it can't be written", ro_line);
    CHECK_OK(sc_buffer_destroy(ro));

    /* Handles. */
    sc_clear_error();
    CHECK_STATUS(sc_comm_all_reduce((sc_comm){a.id}, S, sc_view_of(a), sc_view_of(a),
                                    SC_REDUCE_SUM), SC_ERR_WRONG_KIND);
    CHECK_MSG("sc_comm_all_reduce: ");
    sc_comm_props p;
    CHECK_REFUSED(sc_comm_info(comms[0], NULL), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_info: argument 'props' is NULL");
    CHECK_OK(sc_comm_info(comms[0], &p));
    CHECK(p.rank == 0 && p.nranks == 2 && p.device == 0 && !p.aborted && p.line == comms_line);

    /* Nothing above reached NCCL: the ranks still pair. */
    pair_all_reduce(a, a1);
    /* fp8 reductions and u16 movement work (NCCL 2.24.3+ and sm_90 here). */
    sc_buffer e1 = buf(ctxs[1], SC_F8E4M3, 16, "e1"), u1 = buf(ctxs[1], SC_U16, 32, "u1");
    sc_buffer ug = buf(ctxs[0], SC_U16, 32, "ug");
    CHECK_OK(sc_comm_group_begin());
    CHECK_OK(sc_comm_all_reduce(comms[0], S, sc_view_of(e), sc_view_of(e), SC_REDUCE_SUM));
    CHECK_OK(sc_comm_all_reduce(comms[1], S, sc_view_of(e1), sc_view_of(e1), SC_REDUCE_SUM));
    CHECK_OK(sc_comm_all_gather(comms[0], S, sc_view_of(ug), sc_view_of(u)));
    CHECK_OK(sc_comm_all_gather(comms[1], S, sc_view_of(u1), (sc_view){u1, 16, 16}));
    CHECK_OK(sc_comm_group_end());
    CHECK_OK(sc_comm_synchronize(comms[0]));
    CHECK_OK(sc_comm_synchronize(comms[1]));

    /* Groups. */
    CHECK_REFUSED(sc_comm_group_end(), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_group_end: no group was begun on this thread (sc_comm_group_begin)");
    sc_stream s0;
    REQUIRE(sc_stream_create(ctxs[0], NULL, &s0) == SC_OK);
    CHECK_OK(sc_comm_group_begin());
    CHECK_OK(sc_comm_all_reduce(comms[0], S, sc_view_of(a), sc_view_of(b), SC_REDUCE_SUM));
    CHECK_REFUSED(sc_comm_all_gather(comms[0], s0, (sc_view){big, 0, 16}, sc_view_of(h)),
                  SC_ERR_INVALID_ARGUMENT, "sc_comm_all_gather: call 2 of the group "
                  "(sc_comm_all_gather) uses another stream of the same context than call 1 "
                  "(sc_comm_all_reduce): a group uses one stream per context");
    CHECK_REFUSED(sc_comm_send(comms[0], S, (sc_view){a, 8, 8}, 1), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_send: the src of call 2 (sc_comm_send) overlaps the dst of call 1 "
                  "(sc_comm_all_reduce) of the group: the operations of a group run "
                  "concurrently");
    CHECK_REFUSED(sc_comm_recv(comms[0], S, sc_view_of(b), 1), SC_ERR_INVALID_ARGUMENT,
                  "sc_comm_recv: the dst of call 2 (sc_comm_recv) overlaps the src of call 1 "
                  "(sc_comm_all_reduce) of the group: the operations of a group run "
                  "concurrently");
    CHECK_OK(sc_comm_all_reduce(comms[1], S, sc_view_of(a1), sc_view_of(a1), SC_REDUCE_SUM));
    /* Checked again at the end: a buffer destroyed meanwhile refuses the whole group. */
    CHECK_OK(sc_buffer_destroy(b));
    sc_clear_error();
    CHECK_STATUS(sc_comm_group_end(), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_comm_group_end: call 1 of the 2 of the group: sc_comm_all_reduce: ");
    CHECK_MSG(" (src); nothing was issued");
    CHECK_OK(sc_comm_query(comms[0]));
    CHECK(ncclfault.pending() == 0);
    pair_all_reduce(a, a1); /* still paired */

    sc_buffer list[] = {a, h, i, u, e, big, o, a1, x1, e1, u1, ug};
    for (size_t k = 0; k < sizeof list / sizeof list[0]; k++)
        CHECK_OK(sc_buffer_destroy(list[k]));
    CHECK_OK(sc_stream_destroy(s0));
    CHECK_OK(sc_stream_destroy(s1));
    end_world(2);
    /* Stale communicators. */
    sc_clear_error();
    CHECK_STATUS(sc_comm_synchronize(comms[0]), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_comm_synchronize: ");
    CHECK_STATUS(sc_comm_query(comms[0]), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_comm_destroy(comms[0]), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_comm_abort(comms[0]), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_comm_info(comms[0], &p), SC_ERR_STALE_HANDLE);
    close_contexts(3);
}

/* fp8 reductions refused by an NCCL without fp8 types, or a device before sm_90 (moving fp8
 * data still works). */
static void test_fp8_refusal(const char *mode)
{
    open_contexts(2);
    world(2, 0);
    sc_buffer e = buf(ctxs[0], SC_F8E5M2, 16, "e"), g = buf(ctxs[0], SC_F8E5M2, 32, "g");
    sc_buffer e1 = buf(ctxs[1], SC_F8E5M2, 16, "e1"), g1 = buf(ctxs[1], SC_F8E5M2, 32, "g1");
    if (strcmp(mode, "old-nccl") == 0)
        CHECK_REFUSED(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, sc_view_of(e),
                                         sc_view_of(e), SC_REDUCE_SUM),
                      SC_ERR_NOT_SUPPORTED, "sc_comm_all_reduce: NCCL 2.20.0 (%s) has no fp8 "
                      "types: reductions of f8e5m2 need NCCL 2.24.3 or newer",
                      getenv("SAFECUDA_LIBNCCL"));
    else
        CHECK_REFUSED(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, sc_view_of(e),
                                         sc_view_of(e), SC_REDUCE_SUM),
                      SC_ERR_NOT_SUPPORTED, "sc_comm_all_reduce: NCCL reduces f8e5m2 elements on "
                      "sm_90 and newer devices only; device 0 is sm_80");
    CHECK_OK(sc_comm_group_begin());
    CHECK_OK(sc_comm_all_gather(comms[0], SC_DEFAULT_STREAM, sc_view_of(g), sc_view_of(e)));
    CHECK_OK(sc_comm_all_gather(comms[1], SC_DEFAULT_STREAM, sc_view_of(g1), sc_view_of(e1)));
    CHECK_OK(sc_comm_group_end());
    CHECK_OK(sc_comm_synchronize(comms[0]));
    CHECK_OK(sc_comm_synchronize(comms[1]));
    sc_buffer list[] = {e, g, e1, g1};
    for (size_t k = 0; k < 4; k++)
        CHECK_OK(sc_buffer_destroy(list[k]));
    end_world(2);
    close_contexts(2);
}

int main(int argc, char **argv)
{
    comm_td_attach();
    const char *mode = argc > 1 ? argv[1] : "";
    if (mode[0]) {
        test_fp8_refusal(mode);
    } else {
        TEST_RUN(test_create_refusals);
        TEST_RUN(test_collective_refusals);
    }
    CHECK(fake.misuse_count() == 0);
    return test_result("test_td_comm_checks");
}
