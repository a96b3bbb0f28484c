/* bench_comm: the collectives' ceilings on N GPUs of one host, safecuda's checked collectives
 * (sc_comm_all_reduce, sc_comm_all_to_all) against raw NCCL on the same buffers and streams.
 *
 * One thread per GPU. A sample: the threads meet at a barrier, each records a start event on
 * its stream, issues `reps` collectives back to back and records an end event; the sample's
 * time per collective is the slowest rank's (end - start) / reps. Warm-up samples first, then
 * the median of the timed ones. Bus bandwidth as nccl-tests defines it (S bytes per rank):
 * all-reduce S / t x 2 (N - 1) / N, all-to-all S / t x (N - 1) / N, which NVLink caps (H100
 * NV18: about 360 GB/s of bus bandwidth each way).
 *
 * The peer: raw NCCL (the library safecuda loaded, sc_comm_library_path, opened again here with
 * dlopen; communicators of its own from ncclCommInitAll), its ncclAllReduce and its
 * all-to-all as one group of ncclSend / ncclRecv (nccl-tests' way) on the same device memory
 * (sc_buffer_device_ptr) and the same streams (sc_stream_cu_handle). The difference is
 * safecuda's checks and ordering per call. On safecuda's test device (host memory, no
 * kernels: a smoke test of this program) the peer is left out.
 *
 * A second raw peer, "NCCL nb": the same calls on NCCL communicators made non-blocking
 * (ncclCommInitRankConfig, config.blocking = 0: the mode safecuda's communicators use, so that
 * a collective whose peer never comes can be abandoned by its timeout), each call's group
 * waited for as safecuda waits (ncclCommGetAsyncError until it is no longer in progress, a
 * yield between looks) before the next. NCCL finishes a non-blocking group in a thread of its
 * own; the column shows what that mode costs by itself, apart from safecuda's checks.
 *
 *   bench_comm [--gpus N] [--out DIR] [--quick]      (N: 2 .. the GPUs there; default all)
 *
 * Needs 2 GPUs: with fewer it exits 77 (skipped), saying so. NCCL_NVLS_ENABLE=0 is set
 * (NVLink multicast off) unless the environment sets it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>

#include "bench_common.h"
#include "raw_driver.h"
#include "safecuda/comm.h"
#include "safecuda/interop.h"

#define MAX_GPUS 8

/* ---- raw NCCL: the few declarations its calls need (no toolkit headers) ---------------- */

typedef struct ncclComm *ncclComm_t;
typedef int ncclResult_t;
enum { ncclBfloat16 = 9 };
enum { ncclSum = 0 };
enum { ncclInProgress = 7 };
typedef struct { char internal[128]; } ncclUniqueId;
/* ncclConfig_t's first fields (ncclConfig_v21700), as NCCL_CONFIG_INITIALIZER fills them */
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
    int splitShare;
} nccl_config;
#define NCCL_UNDEF_INT (-2147483647 - 1)

static struct {
    ncclResult_t (*CommInitAll)(ncclComm_t *comms, int n, const int *devs);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *comm, int n, ncclUniqueId id, int rank,
                                       nccl_config *config);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *state);
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*AllReduce)(const void *src, void *dst, size_t count, int dtype, int op,
                              ncclComm_t comm, CUstream stream);
    ncclResult_t (*Send)(const void *src, size_t count, int dtype, int peer, ncclComm_t comm,
                         CUstream stream);
    ncclResult_t (*Recv)(void *dst, size_t count, int dtype, int peer, ncclComm_t comm,
                         CUstream stream);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    const char *(*GetErrorString)(ncclResult_t r);
} nccl;

static void nccl_try(ncclResult_t r, const char *expr, int line)
{
    if (r != 0) {
        printf("FAILED: bench_comm.c:%d: %s returned %d: %s\n", line, expr, r,
               nccl.GetErrorString ? nccl.GetErrorString(r) : "?");
        exit(1);
    }
}
#define NCCL_TRY(expr) nccl_try((expr), #expr, __LINE__)

static void nccl_load(void)
{
    char path[4096];
    SC_TRY(sc_comm_library_path(path, sizeof path));
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("FAILED: dlopen %s: %s\n", path, dlerror());
        exit(1);
    }
#define NCCL_SYM(field, name)                                                   \
    do {                                                                        \
        *(void **)&nccl.field = dlsym(h, name);                                 \
        if (!nccl.field) {                                                      \
            printf("FAILED: %s has no %s\n", path, name);                       \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
    NCCL_SYM(CommInitAll, "ncclCommInitAll");
    NCCL_SYM(GetUniqueId, "ncclGetUniqueId");
    NCCL_SYM(CommInitRankConfig, "ncclCommInitRankConfig");
    NCCL_SYM(CommGetAsyncError, "ncclCommGetAsyncError");
    NCCL_SYM(CommDestroy, "ncclCommDestroy");
    NCCL_SYM(AllReduce, "ncclAllReduce");
    NCCL_SYM(Send, "ncclSend");
    NCCL_SYM(Recv, "ncclRecv");
    NCCL_SYM(GroupStart, "ncclGroupStart");
    NCCL_SYM(GroupEnd, "ncclGroupEnd");
    NCCL_SYM(GetErrorString, "ncclGetErrorString");
#undef NCCL_SYM
}

/* ---- the run ------------------------------------------------------------------------- */

typedef enum { OP_ALL_REDUCE, OP_ALL_TO_ALL, N_OPS } op_kind;
static const char *const op_name[N_OPS] = {"all-reduce (bf16 sum)", "all-to-all"};

typedef struct rank_state {
    int r;
    sc_context ctx;
    sc_stream stream;
    CUstream cu;
    sc_buffer src, dst;
    uint64_t src_ptr, dst_ptr;
    sc_event start, end;
} rank_state;

static int nranks;
static bool no_peer; /* the test device: safecuda's side only */
static rank_state ranks[MAX_GPUS];
static sc_comm comms[MAX_GPUS];
static ncclComm_t raw[MAX_GPUS], raw_nb[MAX_GPUS];
typedef enum { USE_SAFECUDA, USE_RAW, USE_RAW_NB } use_kind;

/* Wait for a non-blocking communicator's calls to be issued (as safecuda does). */
static void nb_wait(ncclComm_t comm)
{
    ncclResult_t state = ncclInProgress;
    for (;;) {
        NCCL_TRY(nccl.CommGetAsyncError(comm, &state));
        if (state != ncclInProgress)
            break;
        sched_yield();
    }
    NCCL_TRY(state);
}

/* Non-blocking communicators over the first n GPUs, one thread making them all (a group). */
static void init_nonblocking(int n)
{
    ncclUniqueId id;
    NCCL_TRY(nccl.GetUniqueId(&id));
    NCCL_TRY(nccl.GroupStart());
    for (int r = 0; r < n; r++) {
        nccl_config cfg = {sizeof cfg, 0xcafebeefu, 21904, 0, NCCL_UNDEF_INT, NCCL_UNDEF_INT,
                           NCCL_UNDEF_INT, NULL, NCCL_UNDEF_INT};
        CU_TRY(rd.cuCtxSetCurrent(raw_driver_primary_context(r)));
        ncclResult_t res = nccl.CommInitRankConfig(&raw_nb[r], n, id, r, &cfg);
        if (res != ncclInProgress)
            NCCL_TRY(res);
    }
    ncclResult_t end = nccl.GroupEnd();
    if (end != ncclInProgress)
        NCCL_TRY(end);
    for (int r = 0; r < n; r++)
        nb_wait(raw_nb[r]);
}
static pthread_barrier_t barrier, rank_barrier; /* main + ranks; the ranks alone */

/* What every thread runs next (set by the main thread between barriers). */
static struct {
    op_kind op;
    use_kind use;
    uint64_t bytes;
    int reps, samples, warmup;
    bool quit;
} job;
static double sample_ms[MAX_GPUS][64];

static void issue(rank_state *s)
{
    const int n = nranks;
    const bool use_raw = job.use != USE_SAFECUDA;
    ncclComm_t rc = job.use == USE_RAW_NB ? raw_nb[s->r] : raw[s->r];
    if (job.op == OP_ALL_REDUCE) {
        const uint64_t count = job.bytes / 2;
        if (use_raw) {
            ncclResult_t res = nccl.AllReduce((const void *)(uintptr_t)s->src_ptr,
                                              (void *)(uintptr_t)s->dst_ptr, count, ncclBfloat16,
                                              ncclSum, rc, s->cu);
            if (job.use == USE_RAW_NB && res == ncclInProgress)
                nb_wait(rc);
            else
                NCCL_TRY(res);
        } else {
            sc_view src, dst;
            SC_TRY(sc_buffer_view(s->src, 0, count, &src));
            SC_TRY(sc_buffer_view(s->dst, 0, count, &dst));
            SC_TRY(sc_comm_all_reduce(comms[s->r], s->stream, dst, src, SC_REDUCE_SUM));
        }
        return;
    }
    const uint64_t per = job.bytes / 2 / (uint64_t)n; /* bf16 elements to each peer */
    if (use_raw) {
        NCCL_TRY(nccl.GroupStart());
        for (int p = 0; p < n; p++) {
            NCCL_TRY(nccl.Send((const void *)(uintptr_t)(s->src_ptr + 2 * p * per), per,
                               ncclBfloat16, p, rc, s->cu));
            NCCL_TRY(nccl.Recv((void *)(uintptr_t)(s->dst_ptr + 2 * p * per), per, ncclBfloat16,
                               p, rc, s->cu));
        }
        ncclResult_t end = nccl.GroupEnd();
        if (job.use == USE_RAW_NB && end == ncclInProgress)
            nb_wait(rc);
        else
            NCCL_TRY(end);
    } else {
        sc_view src, dst;
        SC_TRY(sc_buffer_view(s->src, 0, per * n, &src));
        SC_TRY(sc_buffer_view(s->dst, 0, per * n, &dst));
        SC_TRY(sc_comm_all_to_all(comms[s->r], s->stream, dst, src));
    }
}

static void *rank_main(void *arg)
{
    rank_state *s = arg;
    CU_TRY(rd.cuCtxSetCurrent(raw_driver_primary_context(s->r)));
    for (;;) {
        pthread_barrier_wait(&barrier); /* the job is set */
        if (job.quit)
            break;
        for (int i = 0; i < job.warmup + job.samples; i++) {
            pthread_barrier_wait(&rank_barrier);
            SC_TRY(sc_event_record(s->start, s->stream));
            for (int k = 0; k < job.reps; k++)
                issue(s);
            SC_TRY(sc_event_record(s->end, s->stream));
            SC_TRY(sc_event_synchronize(s->end));
            float ms = 0.f;
            SC_TRY(sc_event_elapsed(s->start, s->end, &ms));
            if (i >= job.warmup)
                sample_ms[s->r][i - job.warmup] = ms / job.reps;
        }
        pthread_barrier_wait(&barrier); /* the samples are written */
    }
    raw_driver_release_context(s->r);
    return NULL;
}

/* The median over samples of the slowest rank's time per collective (ms). */
static double run_job(op_kind op, use_kind use, uint64_t bytes, bool quick)
{
    job.op = op;
    job.use = use;
    job.bytes = bytes;
    job.reps = bytes <= (1u << 20) ? 20 : bytes <= (64u << 20) ? 5 : 1;
    job.samples = quick ? 5 : 25;
    job.warmup = quick ? 2 : 5;
    pthread_barrier_wait(&barrier);
    pthread_barrier_wait(&barrier);
    return bench_median_of_slowest((const double (*)[64])sample_ms, nranks, job.samples);
}

static double bus_gbs(op_kind op, uint64_t bytes, double ms)
{
    const double n = nranks, f = op == OP_ALL_REDUCE ? 2.0 * (n - 1) / n : (n - 1) / n;
    return (double)bytes / (ms * 1e-3) * f / 1e9;
}

int main(int argc, char **argv)
{
    int want = bench_take_gpus(&argc, argv, MAX_GPUS);
    bench_opts o = bench_parse_args(argc, argv,
                                    "NCCL collectives on N GPUs: safecuda's checked all-reduce and "
                                    "all-to-all against raw NCCL on the same buffers, bus "
                                    "bandwidth per size. --gpus N: 2 .. the GPUs there "
                                    "(default all).");
    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    bench_require_gpu("bench_comm");
    int count = 0;
    SC_TRY(sc_device_count(&count));
    nranks = want ? want : (count < MAX_GPUS ? count : MAX_GPUS);
    if (count < 2 || nranks > count) {
        printf("bench_comm: skipped: needs %d GPUs, this machine has %d\n", nranks < 2 ? 2 : nranks,
               count);
        return 77;
    }
    sc_device_props props;
    char desc[512];
    bench_describe_device(0, &props, desc, sizeof desc);
    int version = 0;
    char lib[4096];
    SC_TRY(sc_comm_library_version(&version));
    SC_TRY(sc_comm_library_path(lib, sizeof lib));
    printf("bench_comm%s: %d x %s; NCCL %d.%d.%d (%s), NCCL_NVLS_ENABLE=%s\n",
           o.quick ? " (--quick: smoke test, not a result)" : "", nranks, desc, version / 10000,
           version / 100 % 100, version % 100, lib, getenv("NCCL_NVLS_ENABLE"));

    static const uint64_t sizes_full[] = {64u << 10, 1u << 20, 14u << 20, 112u << 20, 1u << 30};
    static const uint64_t sizes_quick[] = {64u << 10, 1u << 20};
    const uint64_t *sizes = o.quick ? sizes_quick : sizes_full;
    const int nsizes = o.quick ? 2 : 5;
    const uint64_t max_bytes = sizes[nsizes - 1];

    no_peer = strstr(props.name, "test device") != NULL;
    raw_driver_load();
    if (!no_peer)
        nccl_load();
    sc_context ctxs[MAX_GPUS];
    for (int r = 0; r < nranks; r++) {
        rank_state *s = &ranks[r];
        s->r = r;
        SC_TRY(sc_context_create(&(sc_context_desc){.device = r}, &s->ctx));
        ctxs[r] = s->ctx;
        SC_TRY(sc_stream_create(s->ctx, &(sc_stream_desc){.label = "bench_comm"}, &s->stream));
        s->cu = raw_driver_stream(s->stream);
        SC_TRY(sc_buffer_create(s->ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = max_bytes / 2,
                                                          .label = "src"},
                                &s->src));
        SC_TRY(sc_buffer_create(s->ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = max_bytes / 2,
                                                          .label = "dst"},
                                &s->dst));
        SC_TRY(sc_buffer_device_ptr(s->src, &s->src_ptr));
        SC_TRY(sc_buffer_device_ptr(s->dst, &s->dst_ptr));
        const uint16_t one = 0x3f80; /* bf16 1.0: sums stay finite */
        SC_TRY(sc_fill(s->stream, sc_view_of(s->src), &one));
        SC_TRY(sc_event_create(s->ctx, &(sc_event_desc){.timing = true}, &s->start));
        SC_TRY(sc_event_create(s->ctx, &(sc_event_desc){.timing = true}, &s->end));
        SC_TRY(sc_stream_synchronize(s->stream));
    }
    SC_TRY(sc_comm_create_all(ctxs, nranks, &(sc_comm_all_desc){.label = "bench"}, comms));
    int devs[MAX_GPUS];
    for (int r = 0; r < nranks; r++)
        devs[r] = r;
    if (!no_peer) {
        NCCL_TRY(nccl.CommInitAll(raw, nranks, devs));
        init_nonblocking(nranks);
    }

    pthread_barrier_init(&barrier, NULL, (unsigned)nranks + 1);
    pthread_barrier_init(&rank_barrier, NULL, (unsigned)nranks);
    pthread_t th[MAX_GPUS];
    for (int r = 0; r < nranks; r++)
        if (pthread_create(&th[r], NULL, rank_main, &ranks[r]) != 0) {
            printf("FAILED: pthread_create\n");
            return 1;
        }

    char path[4096];
    FILE *csv = bench_open_out(&o, "bench_comm.csv", path, sizeof path);
    if (csv)
        fprintf(csv, "op,gpus,bytes_per_rank,safecuda_ms,nccl_ms,nccl_nonblocking_ms,"
                     "safecuda_busbw_gbs,nccl_busbw_gbs\n");
    double best_bw[N_OPS] = {0, 0}, worst_ratio = 0, worst_nb = 0;
    for (int op = 0; op < N_OPS; op++) {
        printf("\n%s on %d GPUs (bytes per rank; bus bandwidth as nccl-tests defines it)\n",
               op_name[op], nranks);
        printf("%12s %12s %12s %12s %14s %14s %10s %10s\n", "bytes", "safecuda ms", "NCCL ms",
               "NCCL nb ms", "safecuda GB/s", "NCCL GB/s", "sc / NCCL", "sc / nb");
        for (int i = 0; i < nsizes; i++) {
            uint64_t bytes = sizes[i] / (2u * (uint64_t)nranks) * (2u * (uint64_t)nranks);
            const double raw_ms = no_peer ? NAN : run_job((op_kind)op, USE_RAW, bytes, o.quick);
            const double nb_ms = no_peer ? NAN : run_job((op_kind)op, USE_RAW_NB, bytes, o.quick);
            const double sc_ms = run_job((op_kind)op, USE_SAFECUDA, bytes, o.quick);
            const double sc_bw = bus_gbs((op_kind)op, bytes, sc_ms);
            const double raw_bw = bus_gbs((op_kind)op, bytes, raw_ms);
            char name[32];
            printf("%12s %12.4f %12.4f %12.4f %14.1f %14.1f %10.3f %10.3f\n",
                   bench_size_name(bytes, name, sizeof name), sc_ms, raw_ms, nb_ms, sc_bw, raw_bw,
                   sc_ms / raw_ms, sc_ms / nb_ms);
            if (csv)
                fprintf(csv, "%s,%d,%" PRIu64 ",%.6f,%.6f,%.6f,%.2f,%.2f\n",
                        op == OP_ALL_REDUCE ? "all_reduce" : "all_to_all", nranks, bytes, sc_ms,
                        raw_ms, nb_ms, sc_bw, raw_bw);
            if (!no_peer) {
                best_bw[op] = fmax(best_bw[op], raw_bw);
                worst_ratio = fmax(worst_ratio, sc_ms / raw_ms);
                worst_nb = fmax(worst_nb, sc_ms / nb_ms);
            }
        }
    }
    job.quit = true;
    pthread_barrier_wait(&barrier);
    for (int r = 0; r < nranks; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&barrier);
    pthread_barrier_destroy(&rank_barrier);
    for (int r = 0; r < nranks && !no_peer; r++)
        NCCL_TRY(nccl.CommDestroy(raw[r]));
    for (int r = 0; r < nranks && !no_peer; r++) /* (a destroy is blocking whatever the mode) */
        NCCL_TRY(nccl.CommDestroy(raw_nb[r]));
    for (int r = 0; r < nranks; r++)
        SC_TRY(sc_comm_destroy(comms[r]));
    for (int r = 0; r < nranks; r++) {
        rank_state *s = &ranks[r];
        SC_TRY(sc_event_destroy(s->start));
        SC_TRY(sc_event_destroy(s->end));
        SC_TRY(sc_buffer_destroy(s->src));
        SC_TRY(sc_buffer_destroy(s->dst));
        SC_TRY(sc_stream_destroy(s->stream));
        SC_TRY(sc_context_destroy(s->ctx));
    }
    if (csv) {
        fclose(csv);
        printf("\nwrote %s\n", path);
    }
    printf("\nsummary: %d GPUs: NCCL's best bus bandwidth all-reduce %.1f GB/s, all-to-all "
           "%.1f GB/s; safecuda's checked collectives at most %.3fx NCCL's time (%.3fx that of "
           "NCCL's non-blocking mode)\n",
           nranks, best_bw[OP_ALL_REDUCE], best_bw[OP_ALL_TO_ALL], worst_ratio, worst_nb);
    return 0;
}
