/* bench_launch: kernels compiled at run time and launched through the checked path.
 *
 * (a) Bandwidth of fp32 vector add, c = a + b with n = 2^28 (3 GiB moved per launch), with
 *     the library's built-in kernel sc_vector_add_f32 (kernels/util/elementwise.cu compiled
 *     as an ordinary program), against a large device-to-device copy (sc_copy) and against
 *     torch.add and torch's copy measured in the same run by bench/peers/torch_add.py.
 *     Each sample is one launch timed with timing events; the result is the median of 50
 *     after 5 warm-ups. GB/s counts 12 bytes per element for the add, bytes read + written
 *     for the copy. Goal: >= 97% of torch.add.
 *
 * (b) Host cost of a checked launch (sc_kernel_launch through SC_LAUNCH) of an empty kernel
 *     with 4 buffer and 2 scalar arguments, against cuLaunchKernel of the same code (the
 *     program's image loaded a second time with cuModuleLoadDataEx) on the same CUstream,
 *     with event tracking on (the default) and off (disable_event_tracking). A batch is
 *     100000 launches issued in chunks of 256; only the issuing is timed (host clock around
 *     each chunk) and the stream is synchronized between chunks, untimed, so the driver's
 *     queue never fills and blocks the host (that would time the GPU instead). The
 *     variants take turns batch by batch; the result is the median batch. Goal: at most
 *     1.5 us over the raw launch with tracking on.
 *
 * (c) Program creation: a cold compile (desc.no_cache), a miss that also stores the entry
 *     (a fresh source each time), and a cache hit; median of 10 each, wall time around
 *     sc_program_create. The cache is a fresh folder (SAFECUDA_CACHE_DIR) made for the run.
 *     Goal: a hit under 1 ms.
 *
 *   ./build/bench/bench_launch [--out DIR] [--quick]
 *
 * --out DIR writes bench_launch.csv there; --quick uses n = 2^24 and fewer repetitions (a
 * smoke test, not a result). Without a GPU (or NVRTC) it says so and exits 0. */
#include <dirent.h>

#include "bench_common.h"
#include "raw_driver.h"
#include "safecuda/interop.h"

#define CHUNK 256 /* launches between untimed synchronizations */

/* The built-in kernels/util/elementwise.cu, read from the source tree (malloc'd; the
 * program lives until exit). A file that can't be read ends the benchmark (exit 1). */
static const char *elementwise_source(void)
{
    static char *src;
    if (src)
        return src;
    const char *path = SAFECUDA_SOURCE_DIR "/kernels/util/elementwise.cu";
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("FAILED: can't read %s: %s\n", path, strerror(errno));
        exit(1);
    }
    size_t cap = 1 << 16, n = 0;
    src = bench_xmalloc(cap);
    for (;;) {
        n += fread(src + n, 1, cap - 1 - n, f);
        if (n < cap - 1)
            break;
        char *more = realloc(src, cap * 2);
        if (!more) {
            printf("FAILED: out of host memory reading %s\n", path);
            exit(1);
        }
        src = more;
        cap *= 2;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        printf("FAILED: can't read %s\n", path);
        exit(1);
    }
    src[n] = '\0';
    return src;
}

static const char empty4_src[] =
    "extern \"C\" __global__ void empty4(const float *a, const float *b, float *c, float *d,\n"
    "                                    int n, float s)\n"
    "{\n"
    "}\n";

/* ---- (a) vector add bandwidth -------------------------------------------------------------- */

typedef struct add_result {
    uint64_t n;
    double add_ms, add_gbs;         /* grid of n/4 threads (the kernel does 4 per step) */
    double add1_ms, add1_gbs;       /* sc_launch_config_for(n): one thread per element */
    double copy_ms, copy_gbs;       /* sc_copy of 4n bytes; GB/s counts 8n bytes */
    sc_launch_desc cfg, cfg1;
    bool peer_add, peer_copy;
    double torch_add_ms, torch_add_gbs, torch_copy_ms, torch_copy_gbs;
} add_result;

/* Median milliseconds of `runs` samples of one operation timed with events on stream s. */
typedef void (*gpu_op)(void *arg);

static double time_op_ms(sc_stream s, sc_event e0, sc_event e1, gpu_op op, void *arg, int warm,
                         int runs)
{
    for (int i = 0; i < warm; i++)
        op(arg);
    SC_TRY(sc_stream_synchronize(s));
    double *ms = bench_xmalloc((size_t)runs * sizeof *ms);
    for (int i = 0; i < runs; i++) {
        float t = 0;
        SC_TRY(sc_event_record(e0, s));
        op(arg);
        SC_TRY(sc_event_record(e1, s));
        SC_TRY(sc_event_synchronize(e1));
        SC_TRY(sc_event_elapsed(e0, e1, &t));
        ms[i] = t;
    }
    double m = bench_median(ms, (size_t)runs);
    free(ms);
    return m;
}

typedef struct add_env {
    sc_stream s;
    sc_kernel k;
    sc_launch_desc cfg;
    sc_buffer a, b, c;
    uint64_t n;
} add_env;

static void op_add(void *arg)
{
    add_env *e = arg;
    SC_TRY(SC_LAUNCH(e->s, e->k, &e->cfg, sc_arg_in(sc_view_of(e->a)), sc_arg_in(sc_view_of(e->b)),
                     sc_arg_out(sc_view_of(e->c)), sc_arg_u64(e->n)));
}

static void op_copy(void *arg)
{
    add_env *e = arg;
    SC_TRY(sc_copy(e->s, sc_view_of(e->c), sc_view_of(e->a)));
}

static sc_buffer random_buffer(sc_context ctx, uint64_t n, const char *label, uint64_t seed)
{
    sc_buffer b;
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = label},
                            &b));
    /* Random finite floats in [-1, 1), uploaded in slices of 64 MiB. */
    const uint64_t slice = 16u << 20;
    float *h = bench_xmalloc((size_t)(n < slice ? n : slice) * sizeof(float));
    uint64_t st = seed;
    for (uint64_t off = 0; off < n; off += slice) {
        uint64_t m = n - off < slice ? n - off : slice;
        for (uint64_t i = 0; i < m; i++)
            h[i] = (float)(int32_t)(uint32_t)(bench_rand(&st) >> 32) * (1.0f / 2147483648.0f);
        sc_view v;
        SC_TRY(sc_buffer_view(b, off, m, &v));
        SC_TRY(sc_copy_from_host(SC_DEFAULT_STREAM, v, h, m * sizeof(float)));
    }
    free(h);
    return b;
}

static void bench_vector_add(sc_context ctx, uint64_t n, int runs, const bench_peer *peer,
                             add_result *r)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    const char *src = elementwise_source();
    sc_program prog;
    SC_TRY(sc_program_create(ctx, &(sc_program_desc){.source = src,
                                                     .name = "util/elementwise.cu"},
                             &prog));
    sc_module mod;
    SC_TRY(sc_module_load(ctx, prog, &mod));
    SC_TRY(sc_program_destroy(prog));
    add_env e = {.n = n};
    SC_TRY(sc_kernel_get(mod, "sc_vector_add_f32", &e.k));
    SC_TRY(sc_stream_create(ctx, &(sc_stream_desc){.label = "vector add"}, &e.s));
    sc_event e0, e1;
    SC_TRY(sc_event_create(ctx, &(sc_event_desc){.timing = true}, &e0));
    SC_TRY(sc_event_create(ctx, &(sc_event_desc){.timing = true}, &e1));

    e.a = random_buffer(ctx, n, "a", 0xA11CEull);
    e.b = random_buffer(ctx, n, "b", 0xB0Bull);
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = "c",
                                                   .zero = true},
                            &e.c));
    SC_TRY(sc_context_synchronize(ctx));

    /* The kernel moves 4 elements per thread per step (float4): one thread per 4 elements. */
    SC_TRY(sc_launch_config_for((n + 3) / 4, e.k, &r->cfg));
    SC_TRY(sc_launch_config_for(n, e.k, &r->cfg1));

    /* Correctness once, outside the timing: a sample of c against a + b. */
    e.cfg = r->cfg;
    op_add(&e);
    {
        enum { SAMPLE = 4096 };
        float ha[SAMPLE], hb[SAMPLE], hc[SAMPLE];
        uint64_t offs[3] = {0, n / 2 > SAMPLE ? n / 2 : 0, n > SAMPLE ? n - SAMPLE : 0};
        for (int k = 0; k < 3; k++) {
            uint64_t m = n < SAMPLE ? n : SAMPLE;
            sc_view va, vb, vc;
            SC_TRY(sc_buffer_view(e.a, offs[k], m, &va));
            SC_TRY(sc_buffer_view(e.b, offs[k], m, &vb));
            SC_TRY(sc_buffer_view(e.c, offs[k], m, &vc));
            SC_TRY(sc_copy_to_host(e.s, ha, m * 4, va));
            SC_TRY(sc_copy_to_host(e.s, hb, m * 4, vb));
            SC_TRY(sc_copy_to_host(e.s, hc, m * 4, vc));
            for (uint64_t i = 0; i < m; i++)
                if (hc[i] != ha[i] + hb[i]) {
                    printf("FAILED: sc_vector_add_f32: c[%" PRIu64 "] = %g, expected %g\n",
                           offs[k] + i, (double)hc[i], (double)(ha[i] + hb[i]));
                    exit(1);
                }
        }
    }

    r->add_ms = time_op_ms(e.s, e0, e1, op_add, &e, 5, runs);
    e.cfg = r->cfg1;
    r->add1_ms = time_op_ms(e.s, e0, e1, op_add, &e, 5, runs);
    r->copy_ms = time_op_ms(e.s, e0, e1, op_copy, &e, 5, runs);
    r->add_gbs = 12.0 * (double)n / (r->add_ms * 1e-3) * 1e-9;
    r->add1_gbs = 12.0 * (double)n / (r->add1_ms * 1e-3) * 1e-9;
    r->copy_gbs = 8.0 * (double)n / (r->copy_ms * 1e-3) * 1e-9;

    double v;
    if (bench_peer_find(peer, "torch_add", n, &v) && v > 0) {
        r->peer_add = true;
        r->torch_add_ms = v;
        r->torch_add_gbs = 12.0 * (double)n / (v * 1e-3) * 1e-9;
    }
    if (bench_peer_find(peer, "torch_copy", 4 * n, &v) && v > 0) {
        r->peer_copy = true;
        r->torch_copy_ms = v;
        r->torch_copy_gbs = 8.0 * (double)n / (v * 1e-3) * 1e-9;
    }

    SC_TRY(sc_buffer_destroy(e.a));
    SC_TRY(sc_buffer_destroy(e.b));
    SC_TRY(sc_buffer_destroy(e.c));
    SC_TRY(sc_event_destroy(e0));
    SC_TRY(sc_event_destroy(e1));
    SC_TRY(sc_stream_destroy(e.s));
    SC_TRY(sc_module_destroy(mod));
    SC_TRY(sc_context_trim(ctx));
}

/* ---- (b) launch overhead ------------------------------------------------------------------ */

typedef struct launch_side {
    sc_context ctx;
    sc_stream s;
    sc_buffer buf[4];
    sc_module mod;
    sc_kernel k;
} launch_side;

typedef struct launch_env {
    launch_side t, u;         /* tracked, untracked */
    sc_launch_desc cfg;
    /* raw: the same image loaded again, launched on t's stream with t's buffers */
    CUcontext cu_ctx;
    CUstream cs;
    CUmodule cmod;
    CUfunction cf;
    CUdeviceptr ptr[4];
    int n;
    float scale;
    void *params[6];
} launch_env;

static void side_create(launch_side *s, bool tracked, launch_env *env)
{
    SC_TRY(sc_context_create(&(sc_context_desc){.device = 0,
                                                .disable_event_tracking = !tracked},
                             &s->ctx));
    SC_TRY(sc_stream_create(s->ctx, &(sc_stream_desc){.label = tracked ? "tracked" : "untracked"},
                            &s->s));
    for (int i = 0; i < 4; i++)
        SC_TRY(sc_buffer_create(s->ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 1024,
                                                          .zero = true, .stream = s->s},
                                &s->buf[i]));
    sc_program prog;
    SC_TRY(sc_program_create(s->ctx, &(sc_program_desc){.source = empty4_src, .name = "empty4.cu"},
                             &prog));
    SC_TRY(sc_module_load(s->ctx, prog, &s->mod));
    SC_TRY(sc_kernel_get(s->mod, "empty4", &s->k));
    if (tracked) {
        /* The raw baseline: the same image through the driver, on this side's stream. */
        const void *img = NULL;
        uint64_t bytes = 0;
        SC_TRY(sc_program_image(prog, &img, &bytes));
        raw_driver_load();
        env->cu_ctx = raw_driver_primary_context(0);
        env->cs = raw_driver_stream(s->s);
        CU_TRY(rd.cuCtxSetCurrent(env->cu_ctx));
        CU_TRY(rd.cuModuleLoadDataEx(&env->cmod, img, 0, NULL, NULL));
        CU_TRY(rd.cuModuleGetFunction(&env->cf, env->cmod, "empty4"));
        for (int i = 0; i < 4; i++) {
            uint64_t p = 0;
            SC_TRY(sc_buffer_device_ptr(s->buf[i], &p));
            env->ptr[i] = (CUdeviceptr)p;
            env->params[i] = &env->ptr[i];
        }
        env->params[4] = &env->n;
        env->params[5] = &env->scale;
    }
    SC_TRY(sc_program_destroy(prog));
    SC_TRY(sc_context_synchronize(s->ctx));
}

static void side_destroy(launch_side *s)
{
    for (int i = 0; i < 4; i++)
        SC_TRY(sc_buffer_destroy(s->buf[i]));
    SC_TRY(sc_module_destroy(s->mod));
    SC_TRY(sc_stream_destroy(s->s));
    SC_TRY(sc_context_destroy(s->ctx));
}

static void launch_checked(launch_env *e, launch_side *s)
{
    SC_TRY(SC_LAUNCH(s->s, s->k, &e->cfg, sc_arg_in(sc_view_of(s->buf[0])),
                     sc_arg_in(sc_view_of(s->buf[1])), sc_arg_out(sc_view_of(s->buf[2])),
                     sc_arg_out(sc_view_of(s->buf[3])), sc_arg_i32(e->n), sc_arg_f32(e->scale)));
}

enum { L_RAW, L_TRACKED, L_UNTRACKED, L_COUNT };
static const char *const launch_name[L_COUNT] = {
    "raw cuLaunchKernel", "checked, tracking on", "checked, tracking off"};

/* ns per launch of one batch of `launches`. */
static double launch_batch(launch_env *e, int variant, uint64_t launches)
{
    sc_stream s = variant == L_UNTRACKED ? e->u.s : e->t.s;
    SC_TRY(sc_stream_synchronize(s));
    if (variant == L_RAW)
        CU_TRY(rd.cuCtxSetCurrent(e->cu_ctx));
    uint64_t total = 0, i = 0;
    while (i < launches) {
        uint64_t n = launches - i < CHUNK ? launches - i : CHUNK;
        uint64_t t0 = bench_now_ns();
        switch (variant) {
        case L_RAW:
            for (uint64_t j = 0; j < n; j++)
                CU_TRY(rd.cuLaunchKernel(e->cf, e->cfg.grid.x, 1, 1, e->cfg.block.x, 1, 1, 0,
                                          e->cs, e->params, NULL));
            break;
        case L_TRACKED:
            for (uint64_t j = 0; j < n; j++)
                launch_checked(e, &e->t);
            break;
        default:
            for (uint64_t j = 0; j < n; j++)
                launch_checked(e, &e->u);
            break;
        }
        total += bench_now_ns() - t0;
        i += n;
        SC_TRY(sc_stream_synchronize(s));
    }
    return (double)total / (double)launches;
}

static void bench_launches(uint64_t launches, int batches, double med[L_COUNT])
{
    launch_env e;
    memset(&e, 0, sizeof e);
    e.cfg = (sc_launch_desc){.grid = {1, 1, 1}, .block = {32, 1, 1}};
    e.n = 1024;
    e.scale = 1.5f;
    side_create(&e.t, true, &e);
    side_create(&e.u, false, &e);

    for (int v = 0; v < L_COUNT; v++) /* warm-up: a tenth of a batch each */
        (void)launch_batch(&e, v, launches / 10 ? launches / 10 : 1);
    double ns[L_COUNT][32];
    if (batches > 32)
        batches = 32;
    for (int b = 0; b < batches; b++)
        for (int v = 0; v < L_COUNT; v++)
            ns[v][b] = launch_batch(&e, v, launches);
    for (int v = 0; v < L_COUNT; v++)
        med[v] = bench_median(ns[v], (size_t)batches);

    CU_TRY(rd.cuCtxSetCurrent(e.cu_ctx));
    CU_TRY(rd.cuModuleUnload(e.cmod));
    side_destroy(&e.t);
    side_destroy(&e.u);
    raw_driver_release_context(0);
}

/* ---- (c) program creation --------------------------------------------------------------- */

typedef struct create_result {
    double cold_ms, miss_ms, hit_ms;
    double hit_reported_ms; /* sc_program_props.compile_ms of the hits */
    bool hits_were_hits;
} create_result;

static double create_ms(sc_context ctx, const sc_program_desc *d, sc_program_props *props)
{
    sc_program p;
    uint64_t t0 = bench_now_ns();
    SC_TRY(sc_program_create(ctx, d, &p));
    uint64_t t1 = bench_now_ns();
    SC_TRY(sc_program_info(p, props));
    SC_TRY(sc_program_destroy(p));
    return (double)(t1 - t0) * 1e-6;
}

static void bench_create(sc_context ctx, int runs, create_result *r)
{
    const char *src = elementwise_source();
    double *ms = bench_xmalloc((size_t)runs * sizeof *ms);
    double *rep = bench_xmalloc((size_t)runs * sizeof *rep);
    sc_program_props props;

    /* Cold: no cache at all. */
    sc_program_desc d = {.source = src, .name = "util/elementwise.cu", .no_cache = true};
    (void)create_ms(ctx, &d, &props); /* NVRTC's own first-use cost is not a compile */
    for (int i = 0; i < runs; i++) {
        ms[i] = create_ms(ctx, &d, &props);
        if (props.from_cache) {
            printf("FAILED: a no_cache program came from the cache\n");
            exit(1);
        }
    }
    r->cold_ms = bench_median(ms, (size_t)runs);

    /* Miss + store: a new source each time (a comment differs). */
    size_t len = strlen(src) + 64;
    char *var = bench_xmalloc(len);
    for (int i = 0; i < runs; i++) {
        snprintf(var, len, "// bench_launch variant %d\n%s", i, src);
        d = (sc_program_desc){.source = var, .name = "util/elementwise.cu"};
        ms[i] = create_ms(ctx, &d, &props);
        if (props.from_cache) {
            printf("FAILED: a fresh source came from the cache\n");
            exit(1);
        }
    }
    r->miss_ms = bench_median(ms, (size_t)runs);

    /* Hits: the last variant is in the cache now. */
    r->hits_were_hits = true;
    for (int i = 0; i < runs; i++) {
        ms[i] = create_ms(ctx, &d, &props);
        rep[i] = props.compile_ms;
        r->hits_were_hits &= props.from_cache;
    }
    r->hit_ms = bench_median(ms, (size_t)runs);
    r->hit_reported_ms = bench_median(rep, (size_t)runs);
    free(var);
    free(ms);
    free(rep);
}

/* ---- main ------------------------------------------------------------------------------------ */

static void remove_cache_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *ent;
    char path[1024];
    while ((ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static const char *verdict(bool met) { return met ? "met" : "NOT MET"; }

int main(int argc, char **argv)
{
    bench_opts opt = bench_parse_args(argc, argv,
                                      "fp32 vector add bandwidth against torch.add, the host cost "
                                      "of a checked launch against cuLaunchKernel, and program "
                                      "creation (cold compile, cache hit).");
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_require_gpu("bench_launch");

    /* A fresh cache for this run, before any program is created. */
    char cache_dir[] = "/tmp/safecuda-bench-launch-XXXXXX";
    if (!mkdtemp(cache_dir)) {
        printf("FAILED: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    setenv("SAFECUDA_CACHE_DIR", cache_dir, 1);
    unsetenv("SAFECUDA_CACHE");
    int nv_major = 0, nv_minor = 0;
    if (sc_compiler_version(&nv_major, &nv_minor) != SC_OK) {
        printf("bench_launch: skipped: %s\n", sc_last_error());
        remove_cache_dir(cache_dir);
        return 0;
    }

    sc_device_props props;
    char devdesc[512];
    bench_describe_device(0, &props, devdesc, sizeof devdesc);
    const uint64_t n = opt.quick ? (1ull << 24) : (1ull << 28);
    const int runs = opt.quick ? 10 : 50;
    const uint64_t launches = opt.quick ? 10000 : 100000;
    const int batches = opt.quick ? 3 : 5;
    const int create_runs = opt.quick ? 3 : 10;
    printf("bench_launch%s: %s, NVRTC %d.%d\n", opt.quick ? " (--quick: smoke test, not a result)" : "",
           devdesc, nv_major, nv_minor);

    /* The peer first, alone on the GPU. */
    char args[128];
    snprintf(args, sizeof args, "--n %" PRIu64 " --runs %d --warmup 5", n, runs);
    printf("running the torch peer (bench/peers/torch_add.py) ...\n");
    bench_peer peer;
    bench_peer_run("torch_add.py", args, 300, &peer);
    bench_peer_print(&peer, "torch add");

    sc_context ctx;
    SC_TRY(sc_context_create(&(sc_context_desc){.device = 0}, &ctx));

    /* (a) */
    add_result ar;
    uint64_t t0 = bench_now_ns();
    bench_vector_add(ctx, n, runs, &peer, &ar);
    char gb[32];
    bench_size_name(12 * n, gb, sizeof gb);
    printf("\nfp32 vector add, n = %" PRIu64 " (%s moved per launch), median of %d launches "
           "(timing events) [%.1f s]\n",
           n, gb, runs, (double)(bench_now_ns() - t0) * 1e-9);
    printf("  %-46s %12s %12s\n", "", "ms", "GB/s");
    char what[96];
    snprintf(what, sizeof what, "sc_vector_add_f32, grid %u x %u (n/4 threads)", ar.cfg.grid.x,
             ar.cfg.block.x);
    printf("  %-46s %12.3f %12.1f\n", what, ar.add_ms, ar.add_gbs);
    snprintf(what, sizeof what, "sc_vector_add_f32, grid %u x %u (n threads)", ar.cfg1.grid.x,
             ar.cfg1.block.x);
    printf("  %-46s %12.3f %12.1f\n", what, ar.add1_ms, ar.add1_gbs);
    printf("  %-46s %12.3f %12.1f\n", "sc_copy of a (read + write)", ar.copy_ms, ar.copy_gbs);
    if (ar.peer_add)
        printf("  %-46s %12.3f %12.1f\n", "torch.add(a, b, out=c)", ar.torch_add_ms,
               ar.torch_add_gbs);
    if (ar.peer_copy)
        printf("  %-46s %12.3f %12.1f\n", "torch c.copy_(a) (read + write)", ar.torch_copy_ms,
               ar.torch_copy_gbs);
    printf("  theoretical HBM bandwidth: %.1f GB/s\n", props.memory_bandwidth_gbs);

    /* (c) before (b): (b) makes contexts of its own */
    create_result cr;
    t0 = bench_now_ns();
    bench_create(ctx, create_runs, &cr);
    printf("\nprogram creation (util/elementwise.cu for sm_%d%d), median of %d, wall time "
           "[%.1f s]\n",
           props.cc_major, props.cc_minor, create_runs, (double)(bench_now_ns() - t0) * 1e-9);
    printf("  %-46s %12.3f ms\n", "cold compile (no_cache)", cr.cold_ms);
    printf("  %-46s %12.3f ms\n", "miss + store (a new source each time)", cr.miss_ms);
    printf("  %-46s %12.3f ms (compile_ms says %.3f)%s\n", "cache hit", cr.hit_ms,
           cr.hit_reported_ms, cr.hits_were_hits ? "" : "  [NOT ALL WERE HITS]");
    SC_TRY(sc_context_destroy(ctx));

    /* (b) */
    double med[L_COUNT];
    t0 = bench_now_ns();
    bench_launches(launches, batches, med);
    printf("\nlaunch of an empty kernel with 4 buffer + 2 scalar arguments, host ns per launch\n"
           "(median of %d batches of %" PRIu64 " launches, chunks of %d, 1 block of 32) "
           "[%.1f s]\n",
           batches, launches, CHUNK, (double)(bench_now_ns() - t0) * 1e-9);
    for (int v = 0; v < L_COUNT; v++) {
        if (v == L_RAW)
            printf("  %-46s %12.0f ns\n", launch_name[v], med[v]);
        else
            printf("  %-46s %12.0f ns (%+.0f ns over raw)\n", launch_name[v], med[v],
                   med[v] - med[L_RAW]);
    }

    /* CSV */
    char csv_path[1024];
    FILE *csv = bench_open_out(&opt, "bench_launch.csv", csv_path, sizeof csv_path);
    if (csv) {
        fprintf(csv, "section,variant,size,value,unit,samples\n");
        fprintf(csv, "vector_add,sc_vector_add_f32 n/4 threads,%" PRIu64 ",%.4f,GB/s,%d\n", n,
                ar.add_gbs, runs);
        fprintf(csv, "vector_add,sc_vector_add_f32 n threads,%" PRIu64 ",%.4f,GB/s,%d\n", n,
                ar.add1_gbs, runs);
        fprintf(csv, "vector_add,sc_copy,%" PRIu64 ",%.4f,GB/s,%d\n", n, ar.copy_gbs, runs);
        if (ar.peer_add)
            fprintf(csv, "vector_add,torch.add,%" PRIu64 ",%.4f,GB/s,%d\n", n, ar.torch_add_gbs,
                    runs);
        if (ar.peer_copy)
            fprintf(csv, "vector_add,torch copy,%" PRIu64 ",%.4f,GB/s,%d\n", n,
                    ar.torch_copy_gbs, runs);
        for (int v = 0; v < L_COUNT; v++)
            fprintf(csv, "launch,%s,%" PRIu64 ",%.1f,ns/launch,%d\n", launch_name[v], launches,
                    med[v], batches);
        fprintf(csv, "create,cold (no_cache),0,%.4f,ms,%d\n", cr.cold_ms, create_runs);
        fprintf(csv, "create,miss + store,0,%.4f,ms,%d\n", cr.miss_ms, create_runs);
        fprintf(csv, "create,cache hit,0,%.4f,ms,%d\n", cr.hit_ms, create_runs);
        fclose(csv);
        printf("wrote %s\n", csv_path);
    }
    remove_cache_dir(cache_dir);

    /* The summary: the last lines of the output. */
    printf("\n==== bench_launch summary: %s%s\n", props.name, opt.quick ? " (--quick)" : "");
    printf("vector add fp32 n=%" PRIu64 ": %.1f GB/s (12 B/element); device copy %.1f GB/s",
           n, ar.add_gbs, ar.copy_gbs);
    if (ar.peer_add)
        printf("; torch.add %.1f GB/s", ar.torch_add_gbs);
    if (ar.peer_copy)
        printf("; torch copy %.1f GB/s", ar.torch_copy_gbs);
    printf("\n");
    if (ar.peer_add) {
        double pct = 100.0 * ar.add_gbs / ar.torch_add_gbs;
        printf("goal vector add >= 97%% of torch.add: %.1f%% -> %s\n", pct, verdict(pct >= 97.0));
    } else {
        printf("goal vector add >= 97%% of torch.add: peer unavailable (%.1f%% of our device "
               "copy)\n",
               100.0 * ar.add_gbs / ar.copy_gbs);
    }
    double extra = med[L_TRACKED] - med[L_RAW];
    printf("launch (4 buffers + 2 scalars): raw %.0f ns, checked %.0f ns tracked (%+.0f), "
           "%.0f ns untracked (%+.0f)\n",
           med[L_RAW], med[L_TRACKED], extra, med[L_UNTRACKED], med[L_UNTRACKED] - med[L_RAW]);
    printf("goal checked launch <= 1.5 us over raw (tracking on): %+.0f ns -> %s\n", extra,
           verdict(extra <= 1500.0));
    printf("program create: cold %.1f ms, miss + store %.1f ms, cache hit %.3f ms\n", cr.cold_ms,
           cr.miss_ms, cr.hit_ms);
    printf("goal cache hit < 1 ms: %.3f ms -> %s\n", cr.hit_ms,
           verdict(cr.hit_ms < 1.0 && cr.hits_were_hits));
    if (!peer.ok)
        printf("peer: unavailable (%s)\n", peer.reason);
    return 0;
}
