/* The fp8 element types (SC_F8E4M3, SC_F8E5M2) against the test device: their table
 * entries, buffers and views of 1-byte elements (byte counts, accounting), fills of 1-byte
 * patterns and copies checked byte for byte (the test device's "device" memory is host
 * memory), copies between fp8 and other 1-byte types refused, the DLPack round trip, and
 * the launch type checks of kernels whose parameters are cuda_fp8.h's __nv_fp8_e4m3* and
 * __nv_fp8_e5m2*: hand-written PTX with the mangled names, and (where NVRTC and the
 * toolkit's headers are found) the same template compiled by NVRTC, whose lowered names
 * must be those.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <stdint.h>
#include <time.h>

#include "../cuda_include.h"
#include "../fp8_kernel.h"
#include "../test.h"
#include "driver/driver.h"
#include "td_control.h"
#include "safecuda/interop.h"

static sc_context ctx;
static uint64_t rng_state;

static uint8_t rand8(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint8_t)(rng_state >> 32);
}

static sc_buffer make_buffer(sc_dtype dtype, uint64_t count, const char *label)
{
    sc_buffer b = {0};
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                     .label = label},
                              &b));
    return b;
}

/* ---- the dtype table ------------------------------------------------------------------------ */

static void test_table(void)
{
    CHECK(sc_dtype_size(SC_F8E4M3) == 1 && sc_dtype_size(SC_F8E5M2) == 1);
    CHECK(strcmp(sc_dtype_name(SC_F8E4M3), "f8e4m3") == 0);
    CHECK(strcmp(sc_dtype_name(SC_F8E5M2), "f8e5m2") == 0);
    DLDataType t;
    CHECK_OK(sc_dtype_to_dlpack(SC_F8E4M3, &t));
    CHECK(t.code == kDLFloat8_e4m3fn && t.bits == 8 && t.lanes == 1);
    CHECK_OK(sc_dtype_to_dlpack(SC_F8E5M2, &t));
    CHECK(t.code == kDLFloat8_e5m2 && t.bits == 8 && t.lanes == 1);
    sc_dtype d = SC_DTYPE_INVALID;
    /* The fp8 codes with other widths, and the IEEE-style e4m3 (with infinities), are not
     * safecuda's. */
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLFloat8_e4m3fn, 16, 1}, &d),
               SC_ERR_TYPE_MISMATCH, "sc_dtype_from_dlpack");
    CHECK_MSG("float8_e4m3fn");
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLFloat8_e4m3, 8, 1}, &d),
               SC_ERR_TYPE_MISMATCH, "sc_dtype_from_dlpack");
    CHECK_MSG("float8_e4m3");
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLFloat8_e5m2, 8, 4}, &d),
               SC_ERR_TYPE_MISMATCH, "sc_dtype_from_dlpack");
    CHECK_MSG("4 lanes");
}

/* ---- buffers, fills, copies ----------------------------------------------------------------- */

static void test_fills_copies(void)
{
    enum { N = 1001 }; /* odd: no element size but 1 divides it */
    sc_memory_stats m0, m1;
    CHECK_OK(sc_context_memory(ctx, &m0));
    sc_buffer a = make_buffer(SC_F8E4M3, N, "a8");
    sc_buffer b = make_buffer(SC_F8E4M3, N, "b8");
    sc_buffer e = make_buffer(SC_F8E5M2, N, "e8");
    sc_buffer u = make_buffer(SC_U8, N, "u8");
    CHECK_OK(sc_context_memory(ctx, &m1));
    CHECK(m1.bytes_in_use == m0.bytes_in_use + 4 * N);
    sc_buffer_props p;
    CHECK_OK(sc_buffer_info(e, &p));
    CHECK(p.dtype == SC_F8E5M2 && p.count == N && p.bytes == N);

    /* Random bit patterns up and back, whole and into a sub-range. */
    uint8_t in[N], out[N], part[300];
    for (int i = 0; i < N; i++)
        in[i] = rand8();
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(a), in, N));
    memset(out, 0, sizeof out);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(a)));
    CHECK(memcmp(in, out, N) == 0);
    for (int i = 0; i < 300; i++)
        part[i] = rand8();
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, (sc_view){a, 501, 300}, part, sizeof part));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(a)));
    CHECK(memcmp(out, in, 501) == 0 && memcmp(out + 501, part, 300) == 0 &&
          memcmp(out + 801, in + 801, N - 801) == 0);
    memcpy(in + 501, part, 300); /* a's contents now */
    /* The host size is the view's byte count: one byte an element. */
    CHECK_FAIL(sc_copy_from_host(SC_DEFAULT_STREAM, (sc_view){a, 501, 300}, part, 299),
               SC_ERR_OUT_OF_BOUNDS, "sc_copy_from_host");
    CHECK_FAIL(sc_copy_to_host(SC_DEFAULT_STREAM, out, N + 1, sc_view_of(a)),
               SC_ERR_OUT_OF_BOUNDS, "sc_copy_to_host");
    CHECK_FAIL(sc_copy_to_host(SC_DEFAULT_STREAM, out, 2, (sc_view){a, N - 1, 2}),
               SC_ERR_OUT_OF_BOUNDS, "sc_copy_to_host");

    /* Device to device: whole, and a sub-range at odd offsets. */
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, sc_view_of(b), sc_view_of(a)));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(b)));
    CHECK(memcmp(in, out, N) == 0);
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, (sc_view){b, 3, 77}, (sc_view){a, 900, 77}));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(b)));
    CHECK(memcmp(out, in, 3) == 0 && memcmp(out + 3, in + 900, 77) == 0 &&
          memcmp(out + 80, in + 80, N - 80) == 0);

    /* fp8 flavours and raw bytes are different types. */
    CHECK_FAIL(sc_copy(SC_DEFAULT_STREAM, sc_view_of(e), sc_view_of(a)), SC_ERR_TYPE_MISMATCH,
               "sc_copy");
    CHECK_MSG("f8e5m2");
    CHECK_MSG("f8e4m3");
    CHECK_FAIL(sc_copy(SC_DEFAULT_STREAM, sc_view_of(u), sc_view_of(a)), SC_ERR_TYPE_MISMATCH,
               "sc_copy");
    CHECK_MSG("u8");
    CHECK_MSG("f8e4m3");

    /* Fills with 1-byte patterns: e4m3 1.0 (0x38) over [10, 510), e5m2 -0.5 (0xb8) over all
     * but the ends, a NaN pattern over one element; what is around stays. */
    const uint8_t one_e4m3 = 0x38, half_e5m2 = 0xb8, nan_e4m3 = 0x7f;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){a, 10, 500}, &one_e4m3));
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){a, N - 1, 1}, &nan_e4m3));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(a)));
    int ok = memcmp(out, in, 10) == 0 && memcmp(out + 510, in + 510, N - 511) == 0 &&
             out[N - 1] == 0x7f;
    for (int i = 10; i < 510; i++)
        ok &= out[i] == 0x38;
    CHECK(ok);
    uint8_t ends[2] = {rand8(), rand8()};
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, (sc_view){e, 0, 1}, &ends[0], 1));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, (sc_view){e, N - 1, 1}, &ends[1], 1));
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){e, 1, N - 2}, &half_e5m2));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, N, sc_view_of(e)));
    ok = out[0] == ends[0] && out[N - 1] == ends[1];
    for (int i = 1; i < N - 1; i++)
        ok &= out[i] == 0xb8;
    CHECK(ok);
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){e, N, 0}, &half_e5m2)); /* empty: no-op */
    CHECK_FAIL(sc_fill(SC_DEFAULT_STREAM, (sc_view){e, N - 4, 5}, &half_e5m2),
               SC_ERR_OUT_OF_BOUNDS, "sc_fill");
    CHECK_MSG("f8e5m2");

    /* A zeroed fp8 buffer is +0 in both formats. */
    sc_buffer z = {0};
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F8E5M2, .count = 33,
                                                     .zero = true},
                              &z));
    memset(out, 0xee, 33);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, 33, sc_view_of(z)));
    ok = 1;
    for (int i = 0; i < 33; i++)
        ok &= out[i] == 0;
    CHECK(ok);

    sc_buffer all[] = {a, b, e, u, z};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
}

/* ---- DLPack ------------------------------------------------------------------------------- */

static void test_dlpack(void)
{
    enum { N = 96 };
    uint8_t in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = rand8();
    const sc_dtype types[] = {SC_F8E4M3, SC_F8E5M2};
    const uint8_t codes[] = {kDLFloat8_e4m3fn, kDLFloat8_e5m2};
    for (int k = 0; k < 2; k++) {
        sc_buffer b = make_buffer(types[k], N, "fp8 original");
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), in, N));
        uint64_t base = 0;
        CHECK_OK(sc_buffer_device_ptr(b, &base));
        /* From an odd element offset: 1-byte elements need no alignment. */
        DLManagedTensorVersioned *t = NULL;
        CHECK_OK(sc_view_to_dlpack((sc_view){b, 5, 64},
                                   &(sc_dlpack_export_desc){.ndim = 2, .shape = {4, 16}}, &t));
        REQUIRE(t != NULL);
        CHECK(t->dl_tensor.dtype.code == codes[k] && t->dl_tensor.dtype.bits == 8 &&
              t->dl_tensor.dtype.lanes == 1);
        CHECK(t->dl_tensor.ndim == 2 && t->dl_tensor.shape[0] == 4 &&
              t->dl_tensor.shape[1] == 16);
        CHECK(t->dl_tensor.strides && t->dl_tensor.strides[0] == 16 &&
              t->dl_tensor.strides[1] == 1);
        CHECK((uint64_t)(uintptr_t)t->dl_tensor.data + t->dl_tensor.byte_offset == base + 5);
        sc_buffer imp;
        CHECK_OK(sc_buffer_from_dlpack(ctx, t, &(sc_dlpack_import_desc){.label = "fp8 again"},
                                       &imp));
        sc_buffer_props p;
        CHECK_OK(sc_buffer_info(imp, &p));
        CHECK(p.dtype == types[k] && p.count == 64 && p.bytes == 64);
        memset(out, 0, sizeof out);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, 64, sc_view_of(imp)));
        CHECK(memcmp(out, in + 5, 64) == 0);
        CHECK_OK(sc_buffer_destroy(imp));
        CHECK_OK(sc_buffer_destroy(b));
    }
}

/* ---- launch type checks --------------------------------------------------------------------- */

#define K_E4M3 "_Z1kI13__nv_fp8_e4m3EvPKT_PS1_j" /* k<__nv_fp8_e4m3>(const T*, T*, unsigned) */
#define K_E5M2 "_Z1kI13__nv_fp8_e5m2EvPKT_PS1_j"
#define K_BYTES "_Z5bytesPKhPhj" /* bytes(const unsigned char*, unsigned char*, unsigned) */

#define PTX_ENTRY(name)                                                        \
    ".visible .entry " name "(\n"                                              \
    "    .param .u64 " name "_param_0,\n"                                      \
    "    .param .u64 " name "_param_1,\n"                                      \
    "    .param .u32 " name "_param_2\n"                                       \
    ")\n"                                                                      \
    "{\n"                                                                      \
    "    ret;\n"                                                               \
    "}\n\n"

/* Valid PTX (ptxas -arch=sm_90 takes it); the test device only reads the entries. */
static const char fp8_ptx[] = "//\n// safecuda host tests: fp8 kernel signatures\n//\n"
                              ".version 8.0\n.target sm_90\n.address_size 64\n\n" PTX_ENTRY(
                                  K_E4M3) PTX_ENTRY(K_E5M2) PTX_ENTRY(K_BYTES);

/* The type checks of kernels k<e4m3> (k4), k<e5m2> (k5) and bytes (kb, may be zero). */
static void check_launches(sc_kernel k4, sc_kernel k5, sc_kernel kb, const char *what)
{
    enum { N = 300 };
    sc_buffer a = make_buffer(SC_F8E4M3, N, "x4");
    sc_buffer b = make_buffer(SC_F8E4M3, N, "y4");
    sc_buffer c = make_buffer(SC_F8E5M2, N, "x5");
    sc_buffer d = make_buffer(SC_F8E5M2, N, "y5");
    sc_buffer u = make_buffer(SC_U8, N, "raw");
    sc_kernel_props kp;
    CHECK_OK(sc_kernel_info(k4, &kp));
    CHECK(kp.typed && kp.n_params == 3);
    CHECK_OK(sc_kernel_info(k5, &kp));
    CHECK(kp.typed && kp.n_params == 3);
    const sc_launch_desc cfg = {.grid = {2, 1, 1}, .block = {256, 1, 1}};

    /* The right types: accepted (the test device runs nothing). */
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k4, &cfg, sc_arg_in(sc_view_of(a)),
                       sc_arg_out(sc_view_of(b)), sc_arg_u32(N)));
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k5, &cfg, sc_arg_in(sc_view_of(c)),
                       sc_arg_out(sc_view_of(d)), sc_arg_u32(N)));
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k5, &cfg, sc_arg_in((sc_view){c, 7, 100}),
                       sc_arg_inout((sc_view){d, 1, 100}), sc_arg_u32(100)));

    /* Every refusal names the parameter's type and the view's, and none reaches the
     * driver. */
    REQUIRE(sci_fault_arm("cuLaunchKernel", 0, 0));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k5, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_out(sc_view_of(d)), sc_arg_u32(N)),
               SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
    CHECK_MSG("argument 0: the kernel wants 'const __nv_fp8_e5m2*' but an in f8e4m3 view");
    CHECK_MSG("buffer 'x4'");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k4, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_out(sc_view_of(d)), sc_arg_u32(N)),
               SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
    CHECK_MSG("argument 1: the kernel wants '__nv_fp8_e4m3*' but an out f8e5m2 view");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k4, &cfg, sc_arg_in(sc_view_of(u)),
                         sc_arg_out(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
    CHECK_MSG("the kernel wants 'const __nv_fp8_e4m3*' but an in u8 view");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k5, &cfg, sc_arg_in(sc_view_of(c)),
                         sc_arg_out(sc_view_of(u)), sc_arg_u32(N)),
               SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
    CHECK_MSG("the kernel wants '__nv_fp8_e5m2*' but an out u8 view");
    /* const __nv_fp8_e4m3* is read-only. */
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k4, &cfg, sc_arg_inout(sc_view_of(a)),
                         sc_arg_out(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
    CHECK_MSG("'const __nv_fp8_e4m3*' (read-only)");
    /* A scalar where an fp8 pointer is wanted. */
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k4, &cfg, sc_arg_u64(0),
                         sc_arg_out(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
    CHECK_MSG("'const __nv_fp8_e4m3*' (a buffer: pass a view)");
    if (kb.id) {
        /* fp8 bits are not raw bytes: a kernel of unsigned char takes u8 views only. */
        CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, kb, &cfg, sc_arg_in(sc_view_of(a)),
                             sc_arg_out(sc_view_of(u)), sc_arg_u32(N)),
                   SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
        CHECK_MSG("the kernel wants 'const unsigned char*' but an in f8e4m3 view");
    }
    if (sci_fault_calls() != 0)
        fprintf(stderr, "%s: a refused launch reached cuLaunchKernel\n", what);
    CHECK(sci_fault_calls() == 0);
    sci_fault_disarm();
    if (kb.id)
        CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, kb, &cfg, sc_arg_in(sc_view_of(u)),
                           sc_arg_out(sc_view_of(u)), sc_arg_u32(N)));
    CHECK_OK(sc_context_synchronize(ctx));

    sc_buffer all[] = {a, b, c, d, u};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
}

static void test_launch_ptx(void)
{
    sc_module m;
    CHECK_OK(sc_module_load_image(ctx, fp8_ptx, sizeof fp8_ptx - 1, &m));
    sc_kernel k4 = {0}, k5 = {0}, kb = {0};
    CHECK_OK(sc_kernel_get(m, K_E4M3, &k4));
    CHECK_OK(sc_kernel_get(m, K_E5M2, &k5));
    CHECK_OK(sc_kernel_get(m, K_BYTES, &kb));
    check_launches(k4, k5, kb, "hand-written PTX");
    CHECK_OK(sc_module_destroy(m));
}

static void test_launch_nvrtc(void)
{
    int major, minor;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("test_td_fp8: NVRTC not available, its part skipped: %s\n", sc_last_error());
        return;
    }
    char inc[PATH_MAX], opt[PATH_MAX + 8];
    if (!cuda_include_find("cuda_fp8.h", inc, sizeof inc)) {
        printf("test_td_fp8: no cuda_fp8.h found (set CUDA_HOME), the NVRTC part skipped\n");
        return;
    }
    snprintf(opt, sizeof opt, "-I%s", inc);
    const char *opts[] = {opt, NULL};
    const char *const *names = fp8_kernel_names;
    const sc_program_desc desc = {.source = fp8_kernel_src, .name = "fp8.cu", .options = opts,
                                  .name_expressions = names};

    /* Compile-only for sm_90a: the GPU test's build on an H100. */
    sc_program p;
    sc_program_desc a90 = desc;
    a90.arch = 90;
    a90.arch_specific = true;
    CHECK_OK(sc_program_create((sc_context){0}, &a90, &p));
    if (p.id)
        CHECK_OK(sc_program_destroy(p));

    /* For the test device's sm_90 (PTX it reads): the lowered names are the PTX's above. */
    p = (sc_program){0};
    CHECK_OK(sc_program_create(ctx, &desc, &p));
    if (!p.id)
        return;
    const char *lowered = NULL;
    CHECK_OK(sc_program_lowered_name(p, names[0], &lowered));
    CHECK(lowered && strcmp(lowered, K_E4M3) == 0);
    CHECK_OK(sc_program_lowered_name(p, names[1], &lowered));
    CHECK(lowered && strcmp(lowered, K_E5M2) == 0);
    CHECK_OK(sc_program_lowered_name(p, names[2], &lowered));
    CHECK(lowered && strcmp(lowered, "_Z5scaleI13__nv_fp8_e4m3EvPKT_PS1_fj") == 0);
    sc_module m;
    CHECK_OK(sc_module_load(ctx, p, &m));
    sc_kernel k4 = {0}, k5 = {0};
    CHECK_OK(sc_kernel_get(m, names[0], &k4));
    CHECK_OK(sc_kernel_get(m, names[1], &k5));
    if (k4.id && k5.id)
        check_launches(k4, k5, (sc_kernel){0}, "NVRTC");
    /* scale<e5m2>(const T*, T*, float, unsigned): the fp8 pointers and the float. */
    sc_kernel ks = {0};
    CHECK_OK(sc_kernel_get(m, names[3], &ks));
    sc_kernel_props kp;
    CHECK_OK(sc_kernel_info(ks, &kp));
    CHECK(kp.typed && kp.n_params == 4);
    sc_buffer x = make_buffer(SC_F8E5M2, 64, "x"), y = make_buffer(SC_F8E4M3, 64, "y");
    const sc_launch_desc one = {.grid = {1, 1, 1}, .block = {64, 1, 1}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, ks, &one, sc_arg_in(sc_view_of(x)),
                       sc_arg_out(sc_view_of(x)), sc_arg_f32(0.5f), sc_arg_u32(64)));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, ks, &one, sc_arg_in(sc_view_of(x)),
                         sc_arg_out(sc_view_of(y)), sc_arg_f32(0.5f), sc_arg_u32(64)),
               SC_ERR_TYPE_MISMATCH, "sc_kernel_launch");
    CHECK_MSG("argument 1: the kernel wants '__nv_fp8_e5m2*' but an out f8e4m3 view");
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_buffer_destroy(y));
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_program_destroy(p));
}

int main(void)
{
    rng_state = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull | 1;
    printf("test_td_fp8: seed %llu\n", (unsigned long long)rng_state);
    fake_attach();
    fake_counts start = fake_counts_now();
    test_table();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    test_fills_copies();
    test_dlpack();
    test_launch_ptx();
    test_launch_nvrtc();
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    char diff[512];
    if (fake_counts_diff(start, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "the test device still holds objects at the end: %s\n", diff);
        test_failures++;
    }
    if (fake.misuse_count() != 0) {
        fprintf(stderr, "the test device saw %d misuses; the last: %s\n", fake.misuse_count(),
                fake.last_misuse());
        test_failures++;
    }
    return test_result("test_td_fp8");
}
