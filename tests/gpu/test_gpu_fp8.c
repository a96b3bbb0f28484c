/* The fp8 element types (SC_F8E4M3, SC_F8E5M2) on a real GPU.
 *
 *   - copies: fresh random bit patterns up (pageable and pinned), device to device (whole
 *     and at odd element offsets) and back, byte for byte, into outputs poisoned first;
 *   - fills: 1-byte patterns over sub-ranges, the neighbours kept;
 *   - DLPack: a view exported (float8_e4m3fn / float8_e5m2) and imported again: the same
 *     memory, dtype and bytes; a fill through the import seen by the original;
 *   - kernels: tests/fp8_kernel.h compiled by NVRTC with <cuda_fp8.h> (found by
 *     tests/cuda_include.h) for __nv_fp8_e4m3 and __nv_fp8_e5m2: out = 2 * in and
 *     out = s * in, converted through float and back with satfinite rounding, on every
 *     non-NaN bit pattern and on 2^20 + 7 fresh random ones, whole and on views at odd
 *     offsets, compared bit for bit with tests/fp8.h on the CPU; outputs poisoned first;
 *   - the type check on the GPU: a buffer of the other fp8 type (or u8) is
 *     SC_ERR_TYPE_MISMATCH naming both types, and nothing ran (the output still holds its
 *     poison).
 *
 * Exits 77 without a GPU or without NVRTC; FAILS when cuda_fp8.h can't be found (set
 * CUDA_HOME to the toolkit). */
#include <math.h>
#include <time.h>

#include "../cuda_include.h"
#include "../fp8.h"
#include "../fp8_kernel.h"
#include "../test.h"
#include "safecuda/interop.h"

static sc_context ctx;
static sc_module module;
static uint64_t seed;

enum { N = (1 << 20) + 7 };
static const uint8_t POISON = 0x7f; /* NaN in both formats: never a kernel's result here */

typedef struct fmt {
    sc_dtype dtype;
    const char *name;
    float (*decode)(uint8_t);
    uint8_t (*encode)(float);
    sc_kernel twice, scale;
} fmt;

static fmt fmts[2] = {
    {SC_F8E4M3, "e4m3", e4m3_to_f, f_to_e4m3, {0}, {0}},
    {SC_F8E5M2, "e5m2", e5m2_to_f, f_to_e5m2, {0}, {0}},
};

static sc_buffer make_buffer(sc_dtype dtype, uint64_t count, const char *label)
{
    sc_buffer b = {0};
    sc_status s = sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                          .label = label},
                                   &b);
    if (s != SC_OK)
        fprintf(stderr, "buffer %s: %s\n", label, sc_last_error());
    REQUIRE(s == SC_OK);
    return b;
}

static void poison(sc_buffer b)
{
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), &POISON));
}

/* Random bit patterns without NaNs (what the kernels' references can't compare). */
static void random_patterns(uint8_t *p, size_t n, const fmt *f, uint64_t case_seed)
{
    test_fill_random(p, n, case_seed);
    uint64_t state = case_seed | 1;
    for (size_t i = 0; i < n; i++)
        while (isnan(f->decode(p[i])))
            p[i] = (uint8_t)test_rand(&state);
}

/* ---- copies and fills ------------------------------------------------------------------- */

static void test_copies_fills(void)
{
    uint8_t *in = test_xmalloc(N), *out = test_xmalloc(N), *want = test_xmalloc(N);
    for (int k = 0; k < 2; k++) {
        const fmt *f = &fmts[k];
        test_fill_random(in, N, seed + 10 + k);
        sc_buffer a = make_buffer(f->dtype, N, "a"), b = make_buffer(f->dtype, N, "b");
        poison(a);
        poison(b);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(a), in, N));
        memset(out, 0, N);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(a)));
        CHECK_BYTES(out, in, N, f->name);

        /* Device to device, whole, then at odd offsets (1-byte elements: byte offsets). */
        CHECK_OK(sc_copy(SC_DEFAULT_STREAM, sc_view_of(b), sc_view_of(a)));
        memset(out, 0, N);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(b)));
        CHECK_BYTES(out, in, N, "device to device");
        poison(b);
        CHECK_OK(sc_copy(SC_DEFAULT_STREAM, (sc_view){b, 1, N - 4}, (sc_view){a, 3, N - 4}));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(b)));
        memset(want, POISON, N);
        memcpy(want + 1, in + 3, N - 4);
        CHECK_BYTES(out, want, N, "odd offsets");

        /* Pinned: asynchronous up and down. */
        sc_host_buffer h;
        REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = N}, &h) == SC_OK);
        CHECK_OK(sc_host_buffer_write(h, 0, in, N));
        poison(b);
        CHECK_OK(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, sc_view_of(b), h, 0));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(b)));
        CHECK_BYTES(out, in, N, "from pinned");
        CHECK_OK(sc_host_buffer_write(h, 0, want, N)); /* other bytes, overwritten next */
        CHECK_OK(sc_copy_to_host_buffer(SC_DEFAULT_STREAM, h, 0, sc_view_of(a)));
        memset(out, 0, N);
        CHECK_OK(sc_host_buffer_read(h, 0, out, N)); /* waits for the copy */
        CHECK_BYTES(out, in, N, "to pinned");
        CHECK_OK(sc_host_buffer_destroy(h));

        /* Fills: a random non-NaN pattern over [5, N - 9), another over one element. */
        uint8_t pat[2];
        random_patterns(pat, 2, f, seed + 20 + k);
        CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){a, 5, N - 14}, &pat[0]));
        CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){a, N - 1, 1}, &pat[1]));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(a)));
        memcpy(want, in, N);
        memset(want + 5, pat[0], N - 14);
        want[N - 1] = pat[1];
        CHECK_BYTES(out, want, N, "fills");
        CHECK_OK(sc_buffer_destroy(a));
        CHECK_OK(sc_buffer_destroy(b));
    }
    free(in);
    free(out);
    free(want);
}

/* ---- DLPack ----------------------------------------------------------------------------- */

static void test_dlpack(void)
{
    enum { M = 4096 };
    uint8_t in[M], out[M];
    const uint8_t codes[] = {kDLFloat8_e4m3fn, kDLFloat8_e5m2};
    for (int k = 0; k < 2; k++) {
        const fmt *f = &fmts[k];
        test_fill_random(in, M, seed + 30 + k);
        sc_buffer b = make_buffer(f->dtype, M, "original");
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), in, M));
        uint64_t base = 0;
        CHECK_OK(sc_buffer_device_ptr(b, &base));
        DLManagedTensorVersioned *t = NULL;
        CHECK_OK(sc_view_to_dlpack((sc_view){b, 3, 64 * 32},
                                   &(sc_dlpack_export_desc){.ndim = 2, .shape = {64, 32}}, &t));
        REQUIRE(t != NULL);
        CHECK(t->dl_tensor.dtype.code == codes[k] && t->dl_tensor.dtype.bits == 8 &&
              t->dl_tensor.dtype.lanes == 1);
        CHECK(t->dl_tensor.device.device_type == kDLCUDA);
        CHECK((uint64_t)(uintptr_t)t->dl_tensor.data + t->dl_tensor.byte_offset == base + 3);
        sc_buffer imp;
        CHECK_OK(sc_buffer_from_dlpack(ctx, t, &(sc_dlpack_import_desc){.label = "import"},
                                       &imp));
        sc_buffer_props p;
        CHECK_OK(sc_buffer_info(imp, &p));
        CHECK(p.dtype == f->dtype && p.count == 64 * 32 && p.bytes == 64 * 32);
        memset(out, 0, sizeof out);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, 64 * 32, sc_view_of(imp)));
        CHECK_BYTES(out, in + 3, 64 * 32, "DLPack import");
        /* Written through the import, read through the original. */
        uint8_t pat;
        random_patterns(&pat, 1, f, seed + 40 + k);
        CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){imp, 100, 50}, &pat));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, M, sc_view_of(b)));
        memset(in + 103, pat, 50);
        CHECK_BYTES(out, in, M, "after a fill through the import");
        CHECK_OK(sc_buffer_destroy(imp));
        CHECK_OK(sc_buffer_destroy(b));
    }
}

/* ---- kernels ---------------------------------------------------------------------------- */

static void load_kernels(void)
{
    char inc[PATH_MAX], opt[PATH_MAX + 8];
    if (!cuda_include_find("cuda_fp8.h", inc, sizeof inc)) {
        fprintf(stderr, "test_gpu_fp8: FAILED: cuda_fp8.h not found (looked in $CUDA_HOME, "
                        "$CUDA_PATH, beside NVRTC, /usr/local/cuda): set CUDA_HOME to the "
                        "CUDA toolkit\n");
        exit(1);
    }
    printf("cuda_fp8.h from %s\n", inc);
    snprintf(opt, sizeof opt, "-I%s", inc);
    sc_program p = {0};
    sc_status s = sc_program_create(ctx, &(sc_program_desc){.source = fp8_kernel_src,
                                                            .name = "fp8.cu",
                                                            .options = (const char *const[]){
                                                                opt, NULL},
                                                            .name_expressions =
                                                                fp8_kernel_names},
                                    &p);
    if (s != SC_OK)
        fprintf(stderr, "compiling fp8.cu: %s\n", sc_last_error());
    REQUIRE(s == SC_OK);
    sc_module m = {0};
    s = sc_module_load(ctx, p, &m);
    module = m;
    if (s != SC_OK)
        fprintf(stderr, "loading fp8.cu: %s\n", sc_last_error());
    REQUIRE(s == SC_OK);
    for (int k = 0; k < 2; k++) {
        REQUIRE(sc_kernel_get(m, fp8_kernel_names[k], &fmts[k].twice) == SC_OK);
        REQUIRE(sc_kernel_get(m, fp8_kernel_names[2 + k], &fmts[k].scale) == SC_OK);
        sc_kernel_props kp;
        CHECK_OK(sc_kernel_info(fmts[k].twice, &kp));
        CHECK(kp.typed || kp.n_params < 0); /* typed where the driver reports parameters */
    }
    CHECK_OK(sc_program_destroy(p));
}

static sc_launch_desc config(uint32_t n)
{
    return (sc_launch_desc){.grid = {(n + 255) / 256, 1, 1}, .block = {256, 1, 1}};
}

/* Run twice (scale == 0) or scale on in[0, n) at the views' offsets, compare with the
 * CPU. */
static void run_case(const fmt *f, const uint8_t *in, uint32_t n, uint32_t in_off,
                     uint32_t out_off, float scale, const char *what)
{
    sc_buffer a = make_buffer(f->dtype, n + in_off, "in"), b = make_buffer(f->dtype, n + out_off,
                                                                        "out");
    poison(a);
    poison(b);
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, (sc_view){a, in_off, n}, in, n));
    const sc_launch_desc cfg = config(n);
    const sc_view vin = {a, in_off, n}, vout = {b, out_off, n};
    if (scale == 0.0f)
        CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, f->twice, &cfg, sc_arg_in(vin), sc_arg_out(vout),
                           sc_arg_u32(n)));
    else
        CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, f->scale, &cfg, sc_arg_in(vin), sc_arg_out(vout),
                           sc_arg_f32(scale), sc_arg_u32(n)));
    uint8_t *got = test_xmalloc(n + out_off), *want = test_xmalloc(n + out_off);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, n + out_off, sc_view_of(b)));
    memset(want, POISON, out_off);
    for (uint32_t i = 0; i < n; i++) {
        const float x = f->decode(in[i]);
        want[out_off + i] = f->encode(scale == 0.0f ? 2.0f * x : scale * x);
    }
    char label[128];
    snprintf(label, sizeof label, "%s %s (n %u, offsets %u/%u, scale %g)", f->name, what, n,
             in_off, out_off, (double)scale);
    if (!test_same_bytes(got, want, n + out_off, label)) {
        for (uint32_t i = 0, shown = 0; i < n && shown < 5; i++)
            if (got[out_off + i] != want[out_off + i]) {
                fprintf(stderr, "  in 0x%02x (%g): got 0x%02x (%g), want 0x%02x (%g)\n", in[i],
                        (double)f->decode(in[i]), got[out_off + i],
                        (double)f->decode(got[out_off + i]), want[out_off + i],
                        (double)f->decode(want[out_off + i]));
                shown++;
            }
        test_failures++;
    }
    free(got);
    free(want);
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
}

static void test_kernels(void)
{
    uint8_t *in = test_xmalloc(N);
    for (int k = 0; k < 2; k++) {
        const fmt *f = &fmts[k];
        /* Every non-NaN pattern once (saturation, subnormals, signed zeros, e5m2's
         * infinities), in a shuffled order. */
        uint32_t n = 0;
        uint8_t all[256];
        for (int v = 0; v < 256; v++)
            if (!isnan(f->decode((uint8_t)v)))
                all[n++] = (uint8_t)v;
        uint64_t st = seed + 50 + k;
        for (uint32_t i = n - 1; i > 0; i--) {
            uint32_t j = (uint32_t)(test_rand(&st) % (i + 1));
            uint8_t t = all[i];
            all[i] = all[j];
            all[j] = t;
        }
        run_case(f, all, n, 0, 0, 0.0f, "every pattern, x2");
        /* A scale in (0.05, 3): rounding of inexact products, ties to even. */
        const float s = 0.05f + (float)(test_rand(&st) % 2950) / 1000.0f;
        run_case(f, all, n, 0, 0, s, "every pattern, scaled");
        random_patterns(in, N, f, seed + 60 + k);
        run_case(f, in, N, 0, 0, 0.0f, "random, x2");
        run_case(f, in, N - 5, 3, 1, 0.0f, "random on views, x2");
        run_case(f, in, N, 1, 0, s, "random on a view, scaled");
    }
    free(in);
}

/* The type checks on the GPU: refused before anything runs, the output keeps its poison. */
static void test_type_refusals(void)
{
    enum { M = 1000 };
    sc_buffer x4 = make_buffer(SC_F8E4M3, M, "x4"), y4 = make_buffer(SC_F8E4M3, M, "y4");
    sc_buffer x5 = make_buffer(SC_F8E5M2, M, "x5"), y5 = make_buffer(SC_F8E5M2, M, "y5");
    sc_buffer u = make_buffer(SC_U8, M, "raw");
    sc_buffer all[] = {x4, y4, x5, y5, u};
    const uint8_t one[2] = {0x38, 0x3c}; /* 1.0 */
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(x4), &one[0]));
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(x5), &one[1]));
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(u), &one[0]));
    poison(y4);
    poison(y5);
    const sc_launch_desc cfg = config(M);
    sc_kernel_props kp;
    CHECK_OK(sc_kernel_info(fmts[0].twice, &kp));
    if (kp.n_params < 0) {
        printf("the driver reports no kernel parameters (before CUDA 12.4): type checks "
               "skipped\n");
    } else {
        CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, fmts[1].twice, &cfg, sc_arg_in(sc_view_of(x4)),
                             sc_arg_out(sc_view_of(y5)), sc_arg_u32(M)),
                   SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
        CHECK_MSG("the kernel wants 'const __nv_fp8_e5m2*' but an in f8e4m3 view");
        CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, fmts[0].twice, &cfg, sc_arg_in(sc_view_of(x4)),
                             sc_arg_out(sc_view_of(y5)), sc_arg_u32(M)),
                   SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
        CHECK_MSG("the kernel wants '__nv_fp8_e4m3*' but an out f8e5m2 view");
        CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, fmts[0].twice, &cfg, sc_arg_in(sc_view_of(u)),
                             sc_arg_out(sc_view_of(y4)), sc_arg_u32(M)),
                   SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
        CHECK_MSG("the kernel wants 'const __nv_fp8_e4m3*' but an in u8 view");
        CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, fmts[1].scale, &cfg, sc_arg_in(sc_view_of(x5)),
                             sc_arg_out(sc_view_of(y4)), sc_arg_f32(1.0f), sc_arg_u32(M)),
                   SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
        CHECK_MSG("'__nv_fp8_e5m2*' but an out f8e4m3 view");
        CHECK_OK(sc_context_synchronize(ctx));
        uint8_t got[M];
        for (int i = 1; i < 4; i += 2) { /* y4, y5: nothing wrote them */
            CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, M, sc_view_of(all[i])));
            int ok = 1;
            for (int j = 0; j < M; j++)
                ok &= got[j] == POISON;
            CHECK(ok);
        }
    }
    /* The right types run: 2 * 1.0 = 2.0 (e4m3 0x40, e5m2 0x40). */
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, fmts[0].twice, &cfg, sc_arg_in(sc_view_of(x4)),
                       sc_arg_out(sc_view_of(y4)), sc_arg_u32(M)));
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, fmts[1].twice, &cfg, sc_arg_in(sc_view_of(x5)),
                       sc_arg_out(sc_view_of(y5)), sc_arg_u32(M)));
    uint8_t got4[M], got5[M];
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got4, M, sc_view_of(y4)));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got5, M, sc_view_of(y5)));
    int ok = 1;
    for (int j = 0; j < M; j++)
        ok &= got4[j] == 0x40 && got5[j] == 0x40;
    CHECK(ok);
    for (int i = 0; i < 5; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
}

int main(void)
{
    gpu_require();
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("test_gpu_fp8: skipped: %s\n", sc_last_error());
        return TEST_SKIP;
    }
    const char *env = getenv("SAFECUDA_TEST_SEED");
    seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    printf("seed %llu (SAFECUDA_TEST_SEED repeats a run)\n", (unsigned long long)seed);
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_device_props dev;
    REQUIRE(sc_device_info(0, &dev) == SC_OK);
    printf("%s (sm_%d%d), NVRTC %d.%d\n", dev.name, dev.cc_major, dev.cc_minor, major, minor);
    TEST_RUN(test_copies_fills);
    TEST_RUN(test_dlpack);
    TEST_RUN(load_kernels);
    TEST_RUN(test_kernels);
    TEST_RUN(test_type_refusals);
    CHECK_OK(sc_module_destroy(module));
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    return test_result("test_gpu_fp8");
}
