/* bench_stream: the host cost of stream ordering.
 *
 * Issue cost (ns per operation, host clock) of small device operations on streams:
 *   - a 4 KiB fill (sc_fill) and a 4 KiB device-to-device copy (sc_copy) on one stream,
 *     with event tracking (the default), without it (disable_event_tracking), and as the
 *     raw driver call (cuMemsetD32Async, cuMemcpyDtoDAsync);
 *   - the same operations alternating between two streams on the same buffers: tracked
 *     (safecuda inserts the cross-stream wait), untracked with the wait done by hand
 *     (sc_event_record + sc_stream_wait), untracked with no wait (unordered: a floor, not
 *     a correct program) and raw (cuEventRecord + cuStreamWaitEvent + the call);
 *   - the peer: bench/peers/torch_ops.py, the same operations through PyTorch.
 *
 * Method: a batch is OPS operations, issued in chunks of CHUNK; only the issuing is timed
 * (clock_gettime around each chunk), the streams are synchronized between chunks, untimed,
 * so the driver's queue never fills and blocks the host (that would time the GPU instead).
 * The variants take turns batch by batch; the result is the median batch. */
#include "bench_common.h"
#include "raw_driver.h"
#include "safecuda/interop.h"

#define ELEMS 1024 /* 4 KiB of u32 */
#define CHUNK 128  /* operations between untimed synchronizations */

typedef struct side {
    sc_context ctx;
    sc_stream s[2];
    sc_event ev[2];     /* for the hand-made cross-stream waits */
    sc_buffer src1, dst1; /* one-stream variants */
    sc_buffer src2, dst2; /* two-stream variants (kept apart: their trackers differ) */
} side;

typedef struct env {
    side t; /* tracked context */
    side u; /* untracked context */
    /* raw: the untracked context's streams, its own buffers, two driver events */
    CUcontext cu_ctx;
    CUstream cs[2];
    CUdeviceptr r_src, r_dst;
    CUevent cev[2];
    uint32_t value;
} env;

typedef void (*op_fn)(env *e, uint64_t i);

static sc_view v(sc_buffer b) { return sc_view_of(b); }

/* ---- one stream ---- */
static void fill_tracked(env *e, uint64_t i)
{
    (void)i;
    SC_TRY(sc_fill(e->t.s[0], v(e->t.dst1), &e->value));
}
static void fill_untracked(env *e, uint64_t i)
{
    (void)i;
    SC_TRY(sc_fill(e->u.s[0], v(e->u.dst1), &e->value));
}
static void fill_raw(env *e, uint64_t i)
{
    (void)i;
    CU_TRY(rd.cuMemsetD32Async(e->r_dst, e->value, ELEMS, e->cs[0]));
}
static void copy_tracked(env *e, uint64_t i)
{
    (void)i;
    SC_TRY(sc_copy(e->t.s[0], v(e->t.dst1), v(e->t.src1)));
}
static void copy_untracked(env *e, uint64_t i)
{
    (void)i;
    SC_TRY(sc_copy(e->u.s[0], v(e->u.dst1), v(e->u.src1)));
}
static void copy_raw(env *e, uint64_t i)
{
    (void)i;
    CU_TRY(rd.cuMemcpyDtoDAsync(e->r_dst, e->r_src, ELEMS * 4, e->cs[0]));
}

/* ---- two streams, alternating: operation i runs on stream i % 2 ---- */
static void fill_tracked_alt(env *e, uint64_t i)
{
    SC_TRY(sc_fill(e->t.s[i & 1], v(e->t.dst2), &e->value));
}
static void fill_manual_alt(env *e, uint64_t i)
{
    int cur = (int)(i & 1), prev = cur ^ 1;
    SC_TRY(sc_event_record(e->u.ev[prev], e->u.s[prev]));
    SC_TRY(sc_stream_wait(e->u.s[cur], e->u.ev[prev]));
    SC_TRY(sc_fill(e->u.s[cur], v(e->u.dst2), &e->value));
}
static void fill_unordered_alt(env *e, uint64_t i)
{
    SC_TRY(sc_fill(e->u.s[i & 1], v(e->u.dst2), &e->value));
}
static void fill_raw_alt(env *e, uint64_t i)
{
    int cur = (int)(i & 1), prev = cur ^ 1;
    CU_TRY(rd.cuEventRecord(e->cev[prev], e->cs[prev]));
    CU_TRY(rd.cuStreamWaitEvent(e->cs[cur], e->cev[prev], 0));
    CU_TRY(rd.cuMemsetD32Async(e->r_dst, e->value, ELEMS, e->cs[cur]));
}
static void copy_tracked_alt(env *e, uint64_t i)
{
    SC_TRY(sc_copy(e->t.s[i & 1], v(e->t.dst2), v(e->t.src2)));
}
static void copy_manual_alt(env *e, uint64_t i)
{
    int cur = (int)(i & 1), prev = cur ^ 1;
    SC_TRY(sc_event_record(e->u.ev[prev], e->u.s[prev]));
    SC_TRY(sc_stream_wait(e->u.s[cur], e->u.ev[prev]));
    SC_TRY(sc_copy(e->u.s[cur], v(e->u.dst2), v(e->u.src2)));
}
static void copy_unordered_alt(env *e, uint64_t i)
{
    SC_TRY(sc_copy(e->u.s[i & 1], v(e->u.dst2), v(e->u.src2)));
}
static void copy_raw_alt(env *e, uint64_t i)
{
    int cur = (int)(i & 1), prev = cur ^ 1;
    CU_TRY(rd.cuEventRecord(e->cev[prev], e->cs[prev]));
    CU_TRY(rd.cuStreamWaitEvent(e->cs[cur], e->cev[prev], 0));
    CU_TRY(rd.cuMemcpyDtoDAsync(e->r_dst, e->r_src, ELEMS * 4, e->cs[cur]));
}

enum {
    V_FILL_T, V_FILL_U, V_FILL_RAW, V_COPY_T, V_COPY_U, V_COPY_RAW,
    V_FILL_T_ALT, V_FILL_MANUAL_ALT, V_FILL_UNORD_ALT, V_FILL_RAW_ALT,
    V_COPY_T_ALT, V_COPY_MANUAL_ALT, V_COPY_UNORD_ALT, V_COPY_RAW_ALT,
    V_COUNT
};

static const struct variant {
    const char *name;
    const char *peer_kind; /* the torch row to print beside it, or NULL */
    bool raw;
    op_fn fn;
} variants[V_COUNT] = {
    [V_FILL_T] = {"fill, 1 stream, tracked", "fill", false, fill_tracked},
    [V_FILL_U] = {"fill, 1 stream, untracked", "fill", false, fill_untracked},
    [V_FILL_RAW] = {"fill, 1 stream, raw cuMemsetD32Async", "fill", true, fill_raw},
    [V_COPY_T] = {"copy, 1 stream, tracked", "copy", false, copy_tracked},
    [V_COPY_U] = {"copy, 1 stream, untracked", "copy", false, copy_untracked},
    [V_COPY_RAW] = {"copy, 1 stream, raw cuMemcpyDtoDAsync", "copy", true, copy_raw},
    [V_FILL_T_ALT] = {"fill, 2 streams, tracked (auto wait)", "fill_alt", false,
                      fill_tracked_alt},
    [V_FILL_MANUAL_ALT] = {"fill, 2 streams, untracked + sc wait", "fill_alt", false,
                           fill_manual_alt},
    [V_FILL_UNORD_ALT] = {"fill, 2 streams, untracked, no wait", NULL, false,
                          fill_unordered_alt},
    [V_FILL_RAW_ALT] = {"fill, 2 streams, raw record+wait+memset", "fill_alt", true,
                        fill_raw_alt},
    [V_COPY_T_ALT] = {"copy, 2 streams, tracked (auto wait)", "copy_alt", false,
                      copy_tracked_alt},
    [V_COPY_MANUAL_ALT] = {"copy, 2 streams, untracked + sc wait", "copy_alt", false,
                           copy_manual_alt},
    [V_COPY_UNORD_ALT] = {"copy, 2 streams, untracked, no wait", NULL, false,
                          copy_unordered_alt},
    [V_COPY_RAW_ALT] = {"copy, 2 streams, raw record+wait+copy", "copy_alt", true,
                        copy_raw_alt},
};

static void sync_all(env *e)
{
    for (int k = 0; k < 2; k++) {
        SC_TRY(sc_stream_synchronize(e->t.s[k]));
        SC_TRY(sc_stream_synchronize(e->u.s[k]));
    }
}

/* ns per operation of one batch of `ops` operations. */
static double batch(env *e, const struct variant *var, uint64_t ops)
{
    sync_all(e);
    if (var->raw)
        CU_TRY(rd.cuCtxSetCurrent(e->cu_ctx));
    uint64_t total = 0, i = 0;
    while (i < ops) {
        uint64_t n = ops - i < CHUNK ? ops - i : CHUNK;
        uint64_t t0 = bench_now_ns();
        for (uint64_t j = 0; j < n; j++)
            var->fn(e, i + j);
        total += bench_now_ns() - t0;
        i += n;
        sync_all(e);
    }
    return (double)total / (double)ops;
}

static sc_buffer make_buffer(sc_context ctx, const char *label, uint64_t seed)
{
    sc_buffer b;
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = ELEMS,
                                                   .label = label},
                            &b));
    uint32_t data[ELEMS];
    bench_fill_random(data, sizeof data, seed);
    SC_TRY(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), data, sizeof data));
    return b;
}

static void side_create(side *s, bool tracked)
{
    SC_TRY(sc_context_create(&(sc_context_desc){.device = 0,
                                                .disable_event_tracking = !tracked},
                             &s->ctx));
    for (int k = 0; k < 2; k++) {
        SC_TRY(sc_stream_create(s->ctx, &(sc_stream_desc){.label = k ? "B" : "A"}, &s->s[k]));
        SC_TRY(sc_event_create(s->ctx, &(sc_event_desc){.label = k ? "after B" : "after A"},
                               &s->ev[k]));
    }
    s->src1 = make_buffer(s->ctx, "src1", 11);
    s->dst1 = make_buffer(s->ctx, "dst1", 12);
    s->src2 = make_buffer(s->ctx, "src2", 13);
    s->dst2 = make_buffer(s->ctx, "dst2", 14);
    SC_TRY(sc_context_synchronize(s->ctx));
}

static void side_destroy(side *s)
{
    SC_TRY(sc_buffer_destroy(s->src1));
    SC_TRY(sc_buffer_destroy(s->dst1));
    SC_TRY(sc_buffer_destroy(s->src2));
    SC_TRY(sc_buffer_destroy(s->dst2));
    for (int k = 0; k < 2; k++) {
        SC_TRY(sc_event_destroy(s->ev[k]));
        SC_TRY(sc_stream_destroy(s->s[k]));
    }
    SC_TRY(sc_context_destroy(s->ctx));
}

int main(int argc, char **argv)
{
    bench_opts opt = bench_parse_args(argc, argv,
                                      "Host cost of tracked, untracked and raw 4 KiB fills and "
                                      "copies, on one stream and across two.");
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_require_gpu("bench_stream");

    sc_device_props props;
    char devdesc[512];
    bench_describe_device(0, &props, devdesc, sizeof devdesc);
    uint64_t ops = opt.quick ? 10000 : 100000;
    int batches = opt.quick ? 3 : 5;
    printf("bench_stream%s: %s\n", opt.quick ? " (--quick: smoke test, not a result)" : "",
           devdesc);

    /* The peer first, alone on the GPU. Python's own cost dominates its numbers, so it
     * runs fewer operations per batch (the per-operation cost is what is compared). */
    uint64_t peer_ops = ops < 20000 ? ops : 20000;
    char args[256];
    snprintf(args, sizeof args, "--bytes %d --ops %" PRIu64 " --batches %d --chunk %d",
             ELEMS * 4, peer_ops, batches, CHUNK);
    printf("running the torch peer (bench/peers/torch_ops.py) ...\n");
    bench_peer peer;
    bench_peer_run("torch_ops.py", args, 240, &peer);
    bench_peer_print(&peer, "torch ops");

    env e;
    memset(&e, 0, sizeof e);
    uint64_t vs = 0xF111u;
    e.value = (uint32_t)bench_rand(&vs) | 1u;
    side_create(&e.t, true);
    side_create(&e.u, false);
    /* The raw side: the primary context (sc_context's) and the untracked context's
     * CUstreams (sc_stream_cu_handle). */
    raw_driver_load();
    e.cu_ctx = raw_driver_primary_context(0);
    e.cs[0] = raw_driver_stream(e.u.s[0]);
    e.cs[1] = raw_driver_stream(e.u.s[1]);
    sc_buffer r_src = make_buffer(e.u.ctx, "raw src", 15);
    sc_buffer r_dst = make_buffer(e.u.ctx, "raw dst", 16);
    {
        uint64_t a = 0, b = 0;
        SC_TRY(sc_buffer_device_ptr(r_src, &a));
        SC_TRY(sc_buffer_device_ptr(r_dst, &b));
        e.r_src = (CUdeviceptr)a;
        e.r_dst = (CUdeviceptr)b;
    }
    SC_TRY(sc_context_synchronize(e.u.ctx));
    CU_TRY(rd.cuCtxSetCurrent(e.cu_ctx));
    for (int k = 0; k < 2; k++)
        CU_TRY(rd.cuEventCreate(&e.cev[k], CU_EVENT_DISABLE_TIMING));

    /* Warm-up: every variant once, a tenth of a batch. */
    for (int k = 0; k < V_COUNT; k++)
        (void)batch(&e, &variants[k], ops / 10);
    double ns[V_COUNT][16];
    uint64_t t_start = bench_now_ns();
    for (int b = 0; b < batches; b++)
        for (int k = 0; k < V_COUNT; k++)
            ns[k][b] = batch(&e, &variants[k], ops);
    double med[V_COUNT];
    for (int k = 0; k < V_COUNT; k++)
        med[k] = bench_median(ns[k], (size_t)batches);
    printf("measured %d batches x %" PRIu64 " ops x %d variants in %.1f s\n", batches, ops,
           V_COUNT, (double)(bench_now_ns() - t_start) * 1e-9);

    printf("\nIssue cost, ns per operation (host clock, median of %d batches of %" PRIu64
           " ops;\n4 KiB buffers; floor = the raw driver call(s) doing the same; peer = torch, "
           "same run)\n",
           batches, ops);
    printf("%-42s %9s %9s %9s\n", "operation", "ns/op", "floor", "torch");
    char csv_path[1024];
    FILE *csv = bench_open_out(&opt, "bench_stream.csv", csv_path, sizeof csv_path);
    if (csv)
        fprintf(csv, "operation,ns_per_op,floor_ns_per_op,torch_ns_per_op,ops,batches\n");
    for (int k = 0; k < V_COUNT; k++) {
        int fl = k < V_COPY_T ? V_FILL_RAW
                 : k < V_FILL_T_ALT ? V_COPY_RAW
                 : k < V_COPY_T_ALT ? V_FILL_RAW_ALT
                                    : V_COPY_RAW_ALT;
        if (k == V_FILL_UNORD_ALT)
            fl = V_FILL_RAW; /* no wait: the floor is the bare call */
        if (k == V_COPY_UNORD_ALT)
            fl = V_COPY_RAW;
        double tv = 0;
        char ts[16] = "n/a";
        bool has_peer = variants[k].peer_kind &&
                        bench_peer_find(&peer, variants[k].peer_kind, ELEMS * 4, &tv);
        if (has_peer)
            snprintf(ts, sizeof ts, "%.0f", tv);
        printf("%-42s %9.0f %9.0f %9s\n", variants[k].name, med[k], med[fl], ts);
        if (csv) {
            fprintf(csv, "\"%s\",%.1f,%.1f,", variants[k].name, med[k], med[fl]);
            if (has_peer)
                fprintf(csv, "%.1f", tv);
            fprintf(csv, ",%" PRIu64 ",%d\n", ops, batches);
        }
    }
    if (csv) {
        fclose(csv);
        printf("wrote %s\n", csv_path);
    }

    CU_TRY(rd.cuCtxSetCurrent(e.cu_ctx));
    for (int k = 0; k < 2; k++)
        CU_TRY(rd.cuEventDestroy(e.cev[k]));
    SC_TRY(sc_buffer_destroy(r_src));
    SC_TRY(sc_buffer_destroy(r_dst));
    side_destroy(&e.t);
    side_destroy(&e.u);
    raw_driver_release_context(0);

    /* The summary: the last lines of the output. */
    double fill_cost = med[V_FILL_T] - med[V_FILL_U];         /* 1 buffer argument */
    double copy_cost = (med[V_COPY_T] - med[V_COPY_U]) / 2.0; /* 2 buffer arguments */
    double worst = fill_cost > copy_cost ? fill_cost : copy_cost;
    char tf[16] = "n/a", tc[16] = "n/a", tfa[16] = "n/a", tca[16] = "n/a";
    double tv;
    if (bench_peer_find(&peer, "fill", ELEMS * 4, &tv))
        snprintf(tf, sizeof tf, "%.0f", tv);
    if (bench_peer_find(&peer, "copy", ELEMS * 4, &tv))
        snprintf(tc, sizeof tc, "%.0f", tv);
    if (bench_peer_find(&peer, "fill_alt", ELEMS * 4, &tv))
        snprintf(tfa, sizeof tfa, "%.0f", tv);
    if (bench_peer_find(&peer, "copy_alt", ELEMS * 4, &tv))
        snprintf(tca, sizeof tca, "%.0f", tv);
    printf("\n==== bench_stream summary: %s, ns/op (4 KiB, median of %d x %" PRIu64 " ops)\n",
           props.name, batches, ops);
    printf("%-26s %9s %9s %9s %9s\n", "", "tracked", "untracked", "raw drv", "torch");
    printf("%-26s %9.0f %9.0f %9.0f %9s\n", "fill, one stream", med[V_FILL_T], med[V_FILL_U],
           med[V_FILL_RAW], tf);
    printf("%-26s %9.0f %9.0f %9.0f %9s\n", "copy, one stream", med[V_COPY_T], med[V_COPY_U],
           med[V_COPY_RAW], tc);
    printf("%-26s %9.0f %9.0f %9.0f %9s   (untracked = + sc wait by hand)\n",
           "fill, alternating streams", med[V_FILL_T_ALT], med[V_FILL_MANUAL_ALT],
           med[V_FILL_RAW_ALT], tfa);
    printf("%-26s %9.0f %9.0f %9.0f %9s   (raw = record + wait + op)\n",
           "copy, alternating streams", med[V_COPY_T_ALT], med[V_COPY_MANUAL_ALT],
           med[V_COPY_RAW_ALT], tca);
    printf("library cost over raw, one stream: fill %+.0f ns (untracked %+.0f), copy %+.0f ns "
           "(untracked %+.0f)\n",
           med[V_FILL_T] - med[V_FILL_RAW], med[V_FILL_U] - med[V_FILL_RAW],
           med[V_COPY_T] - med[V_COPY_RAW], med[V_COPY_U] - med[V_COPY_RAW]);
    printf("a real cross-stream dependency: tracked fill %+.0f ns over one stream "
           "(raw record+wait %+.0f ns over the bare call)\n",
           med[V_FILL_T_ALT] - med[V_FILL_T], med[V_FILL_RAW_ALT] - med[V_FILL_RAW]);
    printf("goal: tracking <= 1000 ns per buffer argument on one stream: fill %.0f ns (1 arg), "
           "copy %.0f ns/arg (2 args) -> %s\n",
           fill_cost, copy_cost, worst <= 1000.0 ? "met" : "NOT MET");
    if (!peer.ok)
        printf("peer: unavailable (%s)\n", peer.reason);
    return 0;
}
