/* bench_memory: copy bandwidth and buffer allocation cost.
 *
 * (a) copies of 1 KiB .. 1 GiB through safecuda: pinned H2D / D2H (host buffers), D2D
 *     (counted as bytes read + bytes written), pageable H2D / D2H;
 * (b) the same copies through the raw driver (cuMemcpy*Async) on the same stream and the
 *     same memory, so the library's own cost is what differs;
 * (c) the peer: bench/peers/torch_copy.py measures the same copies with PyTorch in the same
 *     run (same sizes, batches, repetitions and rotation);
 * (d) sc_buffer_create + sc_buffer_destroy of 1 MiB against cuMemAllocFromPoolAsync +
 *     cuMemFreeAsync on the same stream, from a pool made as the context's is (device
 *     memory of the device, freed memory kept: release threshold UINT64_MAX).
 *
 * Method: each sample is `inner` back-to-back copies between two events (or, for pageable
 * copies, between two host clock reads around the copies and a stream synchronize); the
 * result is the median sample after warm-up. Copies rotate through a 256 MiB window of 1 GiB
 * arenas so no copy finds its data in the 50 MB L2. Inputs hold random bytes. The safecuda
 * and raw samples alternate so drift (clocks, temperature) hits both alike. */
#include "bench_common.h"
#include "raw_driver.h"
#include "safecuda/interop.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define ROTATE_BYTES (256 * MIB) /* > 5 x the H100's 50 MB L2 */

enum { K_H2D_PINNED, K_D2H_PINNED, K_D2D, K_H2D_PAGEABLE, K_D2H_PAGEABLE, K_COUNT };
static const char *const kind_name[K_COUNT] = {"h2d_pinned", "d2h_pinned", "d2d",
                                               "h2d_pageable", "d2h_pageable"};
static const char *const kind_title[K_COUNT] = {"pinned H2D", "pinned D2H", "D2D (r+w)",
                                                "pageable H2D", "pageable D2H"};

enum { IMPL_SC, IMPL_RAW, IMPL_TORCH, IMPL_COUNT };

static const uint64_t all_sizes[] = {1 * KIB,   4 * KIB,   16 * KIB, 64 * KIB,
                                     256 * KIB, 1 * MIB,   4 * MIB,  16 * MIB,
                                     64 * MIB,  256 * MIB, 1 * GIB};
#define N_SIZES (sizeof all_sizes / sizeof all_sizes[0])

typedef struct plan {
    uint64_t bytes;
    int inner;   /* copies per sample */
    int samples; /* timed samples (the median is reported) */
    int warm;    /* untimed samples first */
} plan;

static plan make_plan(uint64_t s, bool quick)
{
    plan p = {s, 1, 20, 2};
    p.inner = s <= 256 * KIB ? 64 : s <= 1 * MIB ? 16 : s <= 4 * MIB ? 4 : 1;
    if (quick)
        return p;
    p.samples = s <= 1 * MIB ? 100 : s <= 64 * MIB ? 50 : s <= 256 * MIB ? 30 : 20;
    p.warm = s >= 256 * MIB ? 2 : 5;
    return p;
}

typedef struct env {
    sc_context ctx;
    sc_stream st;
    uint64_t arena; /* bytes of each arena */
    sc_buffer d_src, d_dst;
    sc_host_buffer h_src, h_dst;
    unsigned char *p_src, *p_dst; /* pageable */
    sc_event ev0, ev1;

    /* raw driver handles of the same objects */
    CUcontext cu_ctx;
    CUstream cu_st;
    CUdeviceptr d_src_ptr, d_dst_ptr;
    CUevent cev0, cev1;

    uint64_t rot; /* rotation counter, shared by every measurement */
} env;

/* Byte offset of the next copy of size s: walk a window of ROTATE_BYTES (or the arena) so a
 * copy's data has been evicted from L2 by the time the walk comes back to it. */
static uint64_t next_offset(env *e, uint64_t s)
{
    uint64_t window = e->arena < ROTATE_BYTES ? e->arena : ROTATE_BYTES;
    uint64_t slots = window / s;
    if (slots == 0)
        slots = 1;
    if (s >= window)
        slots = e->arena / s ? e->arena / s : 1;
    return (e->rot++ % slots) * s;
}

static sc_view view_at(sc_buffer b, uint64_t off, uint64_t s)
{
    sc_view v = {b, off, s}; /* SC_U8 buffers: elements are bytes */
    return v;
}

static void issue_sc(env *e, int kind, uint64_t off, uint64_t s)
{
    switch (kind) {
    case K_H2D_PINNED:
        SC_TRY(sc_copy_from_host_buffer(e->st, view_at(e->d_dst, off, s), e->h_src, off));
        break;
    case K_D2H_PINNED:
        SC_TRY(sc_copy_to_host_buffer(e->st, e->h_dst, off, view_at(e->d_src, off, s)));
        break;
    case K_D2D:
        SC_TRY(sc_copy(e->st, view_at(e->d_dst, off, s), view_at(e->d_src, off, s)));
        break;
    case K_H2D_PAGEABLE:
        SC_TRY(sc_copy_from_host(e->st, view_at(e->d_dst, off, s), e->p_src + off, s));
        break;
    case K_D2H_PAGEABLE:
        SC_TRY(sc_copy_to_host(e->st, e->p_dst + off, s, view_at(e->d_src, off, s)));
        break;
    }
}

static void issue_raw(env *e, int kind, uint64_t off, uint64_t s, unsigned char *h_src,
                      unsigned char *h_dst)
{
    switch (kind) {
    case K_H2D_PINNED:
        CU_TRY(rd.cuMemcpyHtoDAsync(e->d_dst_ptr + off, h_src + off, s, e->cu_st));
        break;
    case K_D2H_PINNED:
        CU_TRY(rd.cuMemcpyDtoHAsync(h_dst + off, e->d_src_ptr + off, s, e->cu_st));
        break;
    case K_D2D:
        CU_TRY(rd.cuMemcpyDtoDAsync(e->d_dst_ptr + off, e->d_src_ptr + off, s, e->cu_st));
        break;
    case K_H2D_PAGEABLE:
        CU_TRY(rd.cuMemcpyHtoDAsync(e->d_dst_ptr + off, e->p_src + off, s, e->cu_st));
        break;
    case K_D2H_PAGEABLE:
        CU_TRY(rd.cuMemcpyDtoHAsync(e->p_dst + off, e->d_src_ptr + off, s, e->cu_st));
        break;
    }
}

static bool is_pageable(int kind) { return kind == K_H2D_PAGEABLE || kind == K_D2H_PAGEABLE; }

/* One sample: seconds for p->inner copies of size p->bytes. */
static double sample_sc(env *e, int kind, const plan *p)
{
    if (is_pageable(kind)) {
        uint64_t t0 = bench_now_ns();
        for (int j = 0; j < p->inner; j++)
            issue_sc(e, kind, next_offset(e, p->bytes), p->bytes);
        SC_TRY(sc_stream_synchronize(e->st));
        return (double)(bench_now_ns() - t0) * 1e-9;
    }
    SC_TRY(sc_event_record(e->ev0, e->st));
    for (int j = 0; j < p->inner; j++)
        issue_sc(e, kind, next_offset(e, p->bytes), p->bytes);
    SC_TRY(sc_event_record(e->ev1, e->st));
    SC_TRY(sc_event_synchronize(e->ev1));
    float ms = 0;
    SC_TRY(sc_event_elapsed(e->ev0, e->ev1, &ms));
    return (double)ms * 1e-3;
}

static double sample_raw(env *e, int kind, const plan *p)
{
    /* The pinned addresses, fetched the documented way (this waits for copies in flight,
     * of which there are none: every sample ends synchronized). Untimed. */
    void *hs = NULL, *hd = NULL;
    uint64_t nb = 0;
    SC_TRY(sc_host_buffer_ptr(e->h_src, &hs, &nb));
    SC_TRY(sc_host_buffer_ptr(e->h_dst, &hd, &nb));
    CU_TRY(rd.cuCtxSetCurrent(e->cu_ctx));
    if (is_pageable(kind)) {
        uint64_t t0 = bench_now_ns();
        for (int j = 0; j < p->inner; j++)
            issue_raw(e, kind, next_offset(e, p->bytes), p->bytes, hs, hd);
        CU_TRY(rd.cuStreamSynchronize(e->cu_st));
        return (double)(bench_now_ns() - t0) * 1e-9;
    }
    CU_TRY(rd.cuEventRecord(e->cev0, e->cu_st));
    for (int j = 0; j < p->inner; j++)
        issue_raw(e, kind, next_offset(e, p->bytes), p->bytes, hs, hd);
    CU_TRY(rd.cuEventRecord(e->cev1, e->cu_st));
    CU_TRY(rd.cuEventSynchronize(e->cev1));
    float ms = 0;
    CU_TRY(rd.cuEventElapsedTime(&ms, e->cev0, e->cev1));
    return (double)ms * 1e-3;
}

/* Median GB/s (1e9 bytes per second) of safecuda and of the raw driver, samples
 * alternating between the two. */
static void measure(env *e, int kind, const plan *p, double *gbs_sc, double *gbs_raw)
{
    for (int w = 0; w < p->warm; w++) {
        (void)sample_sc(e, kind, p);
        (void)sample_raw(e, kind, p);
    }
    double *ts = bench_xmalloc(sizeof(double) * (size_t)p->samples);
    double *tr = bench_xmalloc(sizeof(double) * (size_t)p->samples);
    for (int i = 0; i < p->samples; i++) {
        ts[i] = sample_sc(e, kind, p);
        tr[i] = sample_raw(e, kind, p);
    }
    double moved = (double)p->bytes * p->inner * (kind == K_D2D ? 2.0 : 1.0);
    double ms = bench_median(ts, (size_t)p->samples), mr = bench_median(tr, (size_t)p->samples);
    *gbs_sc = ms > 0 ? moved / ms * 1e-9 : 0;
    *gbs_raw = mr > 0 ? moved / mr * 1e-9 : 0;
    free(ts);
    free(tr);
}

/* ---- physical floors ------------------------------------------------------------------- */

static bool read_sysfs_line(const char *dir, const char *name, char *buf, size_t size)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)size, f) != NULL;
    fclose(f);
    if (ok)
        bench_chomp(buf);
    return ok;
}

/* Per-direction PCIe bandwidth of the GPU's link in GB/s from sysfs (max link speed and
 * width, after line coding), or 0 when it can't be read. desc gets "PCIe 32.0 GT/s x16". */
static double pcie_floor_gbs(const char *bus_id, char *desc, size_t size)
{
    snprintf(desc, size, "PCIe link unknown");
    /* CUDA writes "0000:3B:00.0" (sometimes with an 8-digit domain); sysfs is lower case. */
    char id[64];
    const char *b = bus_id;
    const char *colon = strchr(b, ':');
    if (colon && colon - b > 4)
        b = colon - 4;
    size_t n = 0;
    for (; b[n] && n + 1 < sizeof id; n++)
        id[n] = (char)((b[n] >= 'A' && b[n] <= 'F') ? b[n] - 'A' + 'a' : b[n]);
    id[n] = '\0';
    char dir[256];
    snprintf(dir, sizeof dir, "/sys/bus/pci/devices/%s", id);
    char speed[64], width[64], cur_speed[64] = "", cur_width[64] = "";
    if (!read_sysfs_line(dir, "max_link_speed", speed, sizeof speed) ||
        !read_sysfs_line(dir, "max_link_width", width, sizeof width))
        return 0;
    read_sysfs_line(dir, "current_link_speed", cur_speed, sizeof cur_speed);
    read_sysfs_line(dir, "current_link_width", cur_width, sizeof cur_width);
    double gts = strtod(speed, NULL);
    long lanes = strtol(width, NULL, 10);
    if (gts <= 0 || lanes <= 0)
        return 0;
    double coding = gts >= 8.0 ? 128.0 / 130.0 : 0.8; /* gen 3+: 128b/130b; 1-2: 8b/10b */
    snprintf(desc, size, "PCIe %.1f GT/s x%ld (now %.1f GT/s x%s)", gts, lanes,
             strtod(cur_speed, NULL), cur_width[0] ? cur_width : "?");
    return gts * (double)lanes * coding / 8.0;
}

/* ---- buffer create + destroy ------------------------------------------------------------ */

#define PAIR_CHUNK 100 /* pairs between untimed synchronizations */

static double pairs_sc(sc_context ctx, sc_stream def, int pairs)
{
    sc_buffer_desc d = {.dtype = SC_U8, .count = MIB, .label = "bench pair"};
    uint64_t total = 0;
    for (int done = 0; done < pairs;) {
        int n = pairs - done < PAIR_CHUNK ? pairs - done : PAIR_CHUNK;
        uint64_t t0 = bench_now_ns();
        for (int i = 0; i < n; i++) {
            sc_buffer b;
            SC_TRY(sc_buffer_create(ctx, &d, &b));
            SC_TRY(sc_buffer_destroy(b));
        }
        total += bench_now_ns() - t0;
        SC_TRY(sc_stream_synchronize(def));
        done += n;
    }
    return (double)total / pairs;
}

static double pairs_raw(CUcontext cu_ctx, CUmemoryPool pool, CUstream cs, int pairs)
{
    CU_TRY(rd.cuCtxSetCurrent(cu_ctx));
    uint64_t total = 0;
    for (int done = 0; done < pairs;) {
        int n = pairs - done < PAIR_CHUNK ? pairs - done : PAIR_CHUNK;
        uint64_t t0 = bench_now_ns();
        for (int i = 0; i < n; i++) {
            CUdeviceptr p = 0;
            CU_TRY(rd.cuMemAllocFromPoolAsync(&p, MIB, pool, cs));
            CU_TRY(rd.cuMemFreeAsync(p, cs));
        }
        total += bench_now_ns() - t0;
        CU_TRY(rd.cuStreamSynchronize(cs));
        done += n;
    }
    return (double)total / pairs;
}

/* ---- main ------------------------------------------------------------------------------ */

static void print_row(FILE *out, const char *kind, uint64_t bytes, const double v[IMPL_COUNT],
                      double floor_gbs)
{
    char sz[32], tv[16] = "n/a", pct[16] = "n/a", rp[16] = "n/a", fl[16] = "?";
    bench_size_name(bytes, sz, sizeof sz);
    if (v[IMPL_TORCH] > 0) {
        snprintf(tv, sizeof tv, "%.2f", v[IMPL_TORCH]);
        snprintf(pct, sizeof pct, "%.0f%%", 100.0 * v[IMPL_SC] / v[IMPL_TORCH]);
    }
    if (v[IMPL_RAW] > 0)
        snprintf(rp, sizeof rp, "%.0f%%", 100.0 * v[IMPL_SC] / v[IMPL_RAW]);
    if (floor_gbs > 0)
        snprintf(fl, sizeof fl, "%.1f", floor_gbs);
    fprintf(out, "%-13s %8s %10.2f %10.2f %10s %9s %7s %8s\n", kind, sz, v[IMPL_SC],
            v[IMPL_RAW], tv, pct, rp, fl);
}

int main(int argc, char **argv)
{
    bench_opts opt = bench_parse_args(argc, argv,
                                      "Copy bandwidth (safecuda, raw driver, torch) and "
                                      "buffer create+destroy cost.");
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_require_gpu("bench_memory");

    sc_device_props props;
    char devdesc[512];
    bench_describe_device(0, &props, devdesc, sizeof devdesc);
    char linkdesc[160];
    double pcie = pcie_floor_gbs(props.pci_bus_id, linkdesc, sizeof linkdesc);
    double hbm = props.memory_bandwidth_gbs;
    printf("bench_memory%s: %s\n", opt.quick ? " (--quick: smoke test, not a result)" : "",
           devdesc);
    printf("floors: H2D/D2H %s = %.1f GB/s per direction; D2D HBM theoretical %.0f GB/s "
           "(read + write counted)\n",
           linkdesc, pcie, hbm);

    uint64_t arena = opt.quick ? ROTATE_BYTES : GIB;
    size_t n_sizes = 0;
    plan plans[N_SIZES];
    for (size_t i = 0; i < N_SIZES; i++)
        if (all_sizes[i] <= arena && (!opt.quick || all_sizes[i] <= 64 * MIB))
            plans[n_sizes++] = make_plan(all_sizes[i], opt.quick);

    /* (c) the peer first, alone on the GPU, with the same plan. */
    char args[2048];
    int len = snprintf(args, sizeof args, "--arena %" PRIu64 " --rotate %" PRIu64 " --plan ",
                       arena, (uint64_t)ROTATE_BYTES);
    for (size_t i = 0; i < n_sizes && len < (int)sizeof args; i++)
        len += snprintf(args + len, sizeof args - (size_t)len, "%s%" PRIu64 ":%d:%d:%d",
                        i ? "," : "", plans[i].bytes, plans[i].inner, plans[i].samples,
                        plans[i].warm);
    printf("running the torch peer (bench/peers/torch_copy.py) ...\n");
    uint64_t tp = bench_now_ns();
    bench_peer peer;
    bench_peer_run("torch_copy.py", args, 240, &peer);
    bench_peer_print(&peer, "torch copies");
    printf("peer took %.1f s\n", (double)(bench_now_ns() - tp) * 1e-9);

    /* Setup: 1 GiB device arenas (source, destination), 1 GiB pinned and pageable host
     * arenas, all holding random bytes. */
    uint64_t t_setup = bench_now_ns();
    env e;
    memset(&e, 0, sizeof e);
    e.arena = arena;
    SC_TRY(sc_context_create(&(sc_context_desc){.device = 0}, &e.ctx));
    SC_TRY(sc_stream_create(e.ctx, &(sc_stream_desc){.label = "bench copies"}, &e.st));
    SC_TRY(sc_buffer_create(e.ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = arena,
                                                     .label = "src arena", .stream = e.st},
                            &e.d_src));
    SC_TRY(sc_buffer_create(e.ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = arena,
                                                     .label = "dst arena", .stream = e.st},
                            &e.d_dst));
    SC_TRY(sc_host_buffer_create(e.ctx, &(sc_host_buffer_desc){.bytes = arena,
                                                               .label = "pinned src"},
                                 &e.h_src));
    SC_TRY(sc_host_buffer_create(e.ctx, &(sc_host_buffer_desc){.bytes = arena,
                                                               .label = "pinned dst"},
                                 &e.h_dst));
    e.p_src = bench_xmalloc(arena);
    e.p_dst = bench_xmalloc(arena);
    {
        void *hp = NULL;
        uint64_t nb = 0;
        SC_TRY(sc_host_buffer_ptr(e.h_src, &hp, &nb));
        bench_fill_random(hp, arena, 0x5AFEC0DAull);
        memcpy(e.p_src, hp, arena);
        SC_TRY(sc_host_buffer_ptr(e.h_dst, &hp, &nb));
        bench_fill_random(hp, arena, 0xD57ull);
        memcpy(e.p_dst, hp, arena); /* touches every page of the pageable destination */
        SC_TRY(sc_copy_from_host_buffer(e.st, sc_view_of(e.d_src), e.h_src, 0));
        SC_TRY(sc_copy_from_host_buffer(e.st, sc_view_of(e.d_dst), e.h_dst, 0));
        SC_TRY(sc_stream_synchronize(e.st));
    }
    SC_TRY(sc_event_create(e.ctx, &(sc_event_desc){.timing = true, .label = "t0"}, &e.ev0));
    SC_TRY(sc_event_create(e.ctx, &(sc_event_desc){.timing = true, .label = "t1"}, &e.ev1));
    {
        uint64_t a = 0, b = 0;
        SC_TRY(sc_buffer_device_ptr(e.d_src, &a));
        SC_TRY(sc_buffer_device_ptr(e.d_dst, &b));
        e.d_src_ptr = (CUdeviceptr)a;
        e.d_dst_ptr = (CUdeviceptr)b;
    }

    /* The raw side: the primary context (sc_context's), the streams' CUstreams
     * (sc_stream_cu_handle) and a pool made as the context's is. */
    raw_driver_load();
    e.cu_ctx = raw_driver_primary_context(0);
    e.cu_st = raw_driver_stream(e.st);
    CUstream cu_def;
    {
        sc_stream def;
        SC_TRY(sc_context_default_stream(e.ctx, &def));
        cu_def = raw_driver_stream(def);
    }
    CU_TRY(rd.cuCtxSetCurrent(e.cu_ctx));
    CUmemoryPool pool = NULL;
    {
        CUmemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = 0;
        CU_TRY(rd.cuMemPoolCreate(&pool, &pp));
        uint64_t keep = UINT64_MAX;
        CU_TRY(rd.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
    }
    CU_TRY(rd.cuCtxSetCurrent(e.cu_ctx));
    CU_TRY(rd.cuEventCreate(&e.cev0, CU_EVENT_DEFAULT));
    CU_TRY(rd.cuEventCreate(&e.cev1, CU_EVENT_DEFAULT));
    printf("setup (4 x %" PRIu64 " MiB arenas, random data) took %.1f s\n", arena >> 20,
           (double)(bench_now_ns() - t_setup) * 1e-9);

    /* (a) + (b) */
    double res[K_COUNT][N_SIZES][IMPL_COUNT];
    uint64_t t_copies = bench_now_ns();
    for (size_t i = 0; i < n_sizes; i++)
        for (int k = 0; k < K_COUNT; k++) {
            measure(&e, k, &plans[i], &res[k][i][IMPL_SC], &res[k][i][IMPL_RAW]);
            double tv = 0;
            res[k][i][IMPL_TORCH] = bench_peer_find(&peer, kind_name[k], plans[i].bytes, &tv)
                                        ? tv
                                        : -1;
        }
    printf("copies took %.1f s\n", (double)(bench_now_ns() - t_copies) * 1e-9);

    /* (d) buffer create + destroy, 1 MiB SC_U8 on the default stream, against the raw pool
     * calls on the same stream (the pool made above); batches alternate. */
    sc_stream def;
    SC_TRY(sc_context_default_stream(e.ctx, &def));
    int pairs = opt.quick ? 10000 : 100000, batches = opt.quick ? 3 : 7;
    (void)pairs_sc(e.ctx, def, pairs / 10); /* warm-up: registry slots, pool, caches */
    (void)pairs_raw(e.cu_ctx, pool, cu_def, pairs / 10);
    double ns_sc_b[16], ns_raw_b[16];
    for (int b = 0; b < batches; b++) {
        ns_sc_b[b] = pairs_sc(e.ctx, def, pairs);
        ns_raw_b[b] = pairs_raw(e.cu_ctx, pool, cu_def, pairs);
    }
    double ns_sc = bench_median(ns_sc_b, (size_t)batches);
    double ns_raw = bench_median(ns_raw_b, (size_t)batches);

    /* The table. */
    printf("\nCopy bandwidth, GB/s (1e9 B/s; D2D counts bytes read + written); median of the "
           "samples after warm-up;\nsmall sizes are %d back-to-back copies per sample (issue "
           "rate included); peer = torch, same plan, same run\n",
           plans[0].inner);
    printf("%-13s %8s %10s %10s %10s %9s %7s %8s\n", "kind", "size", "safecuda", "raw drv",
           "torch", "sc/torch", "sc/raw", "floor");
    for (int k = 0; k < K_COUNT; k++)
        for (size_t i = 0; i < n_sizes; i++)
            print_row(stdout, kind_name[k], plans[i].bytes, res[k][i],
                      k == K_D2D ? hbm : pcie);

    char csv_path[1024];
    FILE *csv = bench_open_out(&opt, "bench_memory.csv", csv_path, sizeof csv_path);
    if (csv) {
        fprintf(csv, "kind,bytes,unit,safecuda,raw_driver,torch,floor,inner,samples\n");
        for (int k = 0; k < K_COUNT; k++)
            for (size_t i = 0; i < n_sizes; i++) {
                fprintf(csv, "%s,%" PRIu64 ",GB/s,%.4f,%.4f,", kind_name[k], plans[i].bytes,
                        res[k][i][IMPL_SC], res[k][i][IMPL_RAW]);
                if (res[k][i][IMPL_TORCH] > 0)
                    fprintf(csv, "%.4f", res[k][i][IMPL_TORCH]);
                fprintf(csv, ",%.1f,%d,%d\n", k == K_D2D ? hbm : pcie, plans[i].inner,
                        plans[i].samples);
            }
        fprintf(csv, "buffer_create_destroy,%llu,ns/pair,%.1f,%.1f,,,%d,%d\n",
                (unsigned long long)MIB, ns_sc, ns_raw, pairs, batches);
        fclose(csv);
        printf("wrote %s\n", csv_path);
    }

    /* Teardown before the summary, so a failure there is visible above it. */
    CU_TRY(rd.cuCtxSetCurrent(e.cu_ctx));
    CU_TRY(rd.cuEventDestroy(e.cev0));
    CU_TRY(rd.cuEventDestroy(e.cev1));
    CU_TRY(rd.cuStreamSynchronize(cu_def));
    CU_TRY(rd.cuMemPoolDestroy(pool));
    SC_TRY(sc_event_destroy(e.ev0));
    SC_TRY(sc_event_destroy(e.ev1));
    SC_TRY(sc_buffer_destroy(e.d_src));
    SC_TRY(sc_buffer_destroy(e.d_dst));
    SC_TRY(sc_host_buffer_destroy(e.h_src));
    SC_TRY(sc_host_buffer_destroy(e.h_dst));
    SC_TRY(sc_stream_destroy(e.st));
    SC_TRY(sc_context_destroy(e.ctx));
    raw_driver_release_context(0);
    free(e.p_src);
    free(e.p_dst);

    /* The summary: the last lines of the output. */
    size_t last = n_sizes - 1;
    char big[32];
    bench_size_name(plans[last].bytes, big, sizeof big);
    printf("\n==== bench_memory summary: %s\n", props.name);
    printf("%-13s %8s: %9s %9s %9s %8s   (GB/s)\n", "copy", "size", "safecuda", "raw drv",
           "torch", "floor");
    for (int k = 0; k < K_COUNT; k++) {
        char tv[16] = "n/a";
        if (res[k][last][IMPL_TORCH] > 0)
            snprintf(tv, sizeof tv, "%.1f", res[k][last][IMPL_TORCH]);
        printf("%-13s %8s: %9.1f %9.1f %9s %8.1f\n", kind_title[k], big, res[k][last][IMPL_SC],
               res[k][last][IMPL_RAW], tv, k == K_D2D ? hbm : pcie);
    }
    {
        /* the small-copy issue cost: safecuda / raw driver at 4 KiB, every kind */
        size_t i4 = n_sizes > 1 ? 1 : 0;
        char sz[32];
        printf("%s copies, safecuda/raw:", bench_size_name(plans[i4].bytes, sz, sizeof sz));
        for (int k = 0; k < K_COUNT; k++)
            printf(" %s %.0f%%%s", kind_name[k],
                   res[k][i4][IMPL_RAW] > 0 ? 100.0 * res[k][i4][IMPL_SC] / res[k][i4][IMPL_RAW]
                                            : 0.0,
                   k + 1 < K_COUNT ? "," : "\n");
    }
    int goal_kinds[3] = {K_H2D_PINNED, K_D2H_PINNED, K_D2D};
    for (int g = 0; g < 3; g++) {
        int k = goal_kinds[g];
        if (!peer.ok || res[k][last][IMPL_TORCH] <= 0) {
            printf("goal %s >= 95%% of torch: peer unavailable (sc/raw at %s: %.0f%%)\n",
                   kind_title[k], big, 100.0 * res[k][last][IMPL_SC] / res[k][last][IMPL_RAW]);
            continue;
        }
        if (k == K_D2D) {
            double r = res[k][last][IMPL_SC] / res[k][last][IMPL_TORCH];
            printf("goal D2D >= 95%% of torch's large copy (~2950 GB/s on H100): at %s "
                   "%.0f%% -> %s\n",
                   big, 100 * r, r >= 0.95 ? "met" : "NOT MET");
            continue;
        }
        double worst = 1e30;
        size_t wi = 0;
        for (size_t i = 0; i < n_sizes; i++)
            if (res[k][i][IMPL_TORCH] > 0 && res[k][i][IMPL_SC] / res[k][i][IMPL_TORCH] < worst) {
                worst = res[k][i][IMPL_SC] / res[k][i][IMPL_TORCH];
                wi = i;
            }
        char sz[32];
        printf("goal %s >= 95%% of torch: at %s %.0f%%, worst %.0f%% at %s -> %s\n",
               kind_title[k], big, 100 * res[k][last][IMPL_SC] / res[k][last][IMPL_TORCH],
               100 * worst, bench_size_name(plans[wi].bytes, sz, sizeof sz),
               worst >= 0.95 ? "met" : "NOT MET");
    }
    printf("buffer create+destroy 1 MiB: safecuda %.0f ns/pair, raw pool %.0f ns/pair, "
           "overhead %.0f ns -> goal <= 1000 ns %s\n",
           ns_sc, ns_raw, ns_sc - ns_raw, ns_sc - ns_raw <= 1000 ? "met" : "NOT MET");
    if (!peer.ok)
        printf("peer: unavailable (%s)\n", peer.reason);
    return 0;
}
