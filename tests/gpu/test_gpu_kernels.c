/* Kernels on a real GPU: programs compiled for the context's device, modules and kernels,
 * checked launches.
 *
 *   - vector add (the library's reason to exist) for n = 1, 1000, 2^20 + 1 and 2^28 on
 *     random inputs with the output poisoned with NaN first, compared bit for bit with
 *     the CPU; on sub-views too (the view's offset reaches the kernel);
 *   - every launch check: argument count, scalar sizes, dtypes of views against pointer
 *     parameters, const parameters passed as out/inout, scalar dtypes, structs by value,
 *     and that a refused launch ran nothing;
 *   - limits: block size, grid size, __launch_bounds__, dynamic shared memory before and
 *     after sc_kernel_set_max_dynamic_shared;
 *   - kernel attributes, occupancy, template kernels through name expressions, modules from
 *     a PTX image, a cubin image and a file, kernel listing, missing kernels, stale kernels
 *     after sc_module_destroy, views of destroyed buffers, other contexts' streams and
 *     buffers, leaked modules reported at context destroy;
 *   - cross-stream ordering through launches: a slow kernel writes (or reads) a buffer on
 *     stream A and stream B uses the buffer at once: B must see the kernel's result (or
 *     the kernel must see the old data);
 *   - 8 threads launching on their own streams at once.
 *
 * The planted device fault (a sticky error) is in test_gpu_fault.c: the process can't
 * use the GPU after it. SAFECUDA_UNDER_SANITIZER (compute-sanitizer, ~50x slower) skips
 * n = 2^28, shrinks the slow kernels and leaves out the checks that make driver calls fail
 * on purpose (junk images, missing kernel names): the sanitizer reports those. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "../test.h"

static bool sanitizer;
static sc_context ctx;
static sc_device_props dev;

/* ---- kernels ---------------------------------------------------------------------------- */

static const char kernels_src[] =
    "extern \"C\" __global__ void vector_add(const float *a, const float *b, float *c, int n)\n"
    "{\n"
    "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        c[i] = a[i] + b[i];\n"
    "}\n"
    "\n"
    "// C++ linkage: the mangled name carries the parameter types.\n"
    "__global__ void k(const float *a, float *b, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        b[i] = a[i] * 2.0f + 1.0f;\n"
    "}\n"
    "\n"
    "struct params { float scale; int offset; double bias; };\n"
    "__global__ void with_struct(params p, float *out, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        out[i] = (float)((double)((i + p.offset) * p.scale) + p.bias);\n"
    "}\n"
    "\n"
    "extern \"C\" __global__ void __launch_bounds__(128) bounded(float *x)\n"
    "{\n"
    "    x[threadIdx.x] = 1.0f;\n"
    "}\n"
    "\n"
    "extern \"C\" __global__ void static_shared(float *out)\n"
    "{\n"
    "    __shared__ float tile[1024];\n"
    "    tile[threadIdx.x] = (float)threadIdx.x;\n"
    "    __syncthreads();\n"
    "    out[threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];\n"
    "}\n"
    "\n"
    "// Fills all of its dynamic shared memory, then writes it out reversed.\n"
    "extern \"C\" __global__ void dyn_shared(float *out, int words)\n"
    "{\n"
    "    extern __shared__ float buf[];\n"
    "    for (int j = threadIdx.x; j < words; j += blockDim.x)\n"
    "        buf[j] = (float)(j * 3);\n"
    "    __syncthreads();\n"
    "    for (int j = threadIdx.x; j < words; j += blockDim.x)\n"
    "        out[j] = buf[words - 1 - j];\n"
    "}\n"
    "\n"
    "// A dependent FMA chain of `iters` steps before the access; the index depends on the\n"
    "// chain (acc * 0 is 0 for finite acc, but the compiler may not assume it), so the\n"
    "// access can't be moved before the loop.\n"
    "__device__ int after_chain(int i, int iters)\n"
    "{\n"
    "    float acc = (float)i;\n"
    "    for (int j = 0; j < iters; j++)\n"
    "        acc = fmaf(acc, 0.999f, 1.0f);\n"
    "    return i + (int)(acc * 0.0f);\n"
    "}\n"
    "extern \"C\" __global__ void slow_write(float *out, int n, int iters)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        out[after_chain(i, iters)] = (float)i;\n"
    "}\n"
    "extern \"C\" __global__ void slow_copy(const float *in, float *out, int n, int iters)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        out[i] = in[after_chain(i, iters)];\n"
    "}\n"
    "\n"
    "extern \"C\" __global__ void add_one(float *x, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        x[i] += 1.0f;\n"
    "}\n"
    "\n"
    "extern \"C\" __global__ void empty(void) {}\n";

static const char template_src[] =
    "template <typename T>\n"
    "__global__ void scale(T *x, T s, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        x[i] *= s;\n"
    "}\n";

static const char iota_src[] =
    "extern \"C\" __global__ void iota(float *x, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        x[i] = (float)i * 0.5f;\n"
    "}\n";

static sc_module mod; /* kernels_src, loaded once */

/* ---- helpers ------------------------------------------------------------------------------ */

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Random floats in about [-2048, 2048) with 12 fraction bits: sums round sometimes. */
static void random_floats(float *p, uint64_t n, uint64_t seed)
{
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
    uint64_t i = 0;
    for (; i + 2 <= n; i += 2) {
        uint64_t r = test_rand(&st);
        p[i] = (float)((int32_t)(uint32_t)r >> 8) * (1.0f / 4096.0f);
        p[i + 1] = (float)((int32_t)(uint32_t)(r >> 32) >> 8) * (1.0f / 4096.0f);
    }
    if (i < n)
        p[i] = (float)((int32_t)(uint32_t)test_rand(&st) >> 8) * (1.0f / 4096.0f);
}

static sc_buffer make_buffer_in(sc_context c, sc_dtype dt, uint64_t count, const char *label)
{
    sc_buffer b = {0};
    /* Zeroed, so no kernel here reads uninitialised memory (compute-sanitizer initcheck). */
    sc_status s = sc_buffer_create(c, &(sc_buffer_desc){.dtype = dt, .count = count,
                                                        .label = label, .zero = true},
                                   &b);
    if (s != SC_OK)
        fprintf(stderr, "buffer '%s' (%" PRIu64 " x %s): %s\n", label, count,
                sc_dtype_name(dt), sc_last_error());
    REQUIRE(s == SC_OK);
    return b;
}
static sc_buffer make_buffer(sc_dtype dt, uint64_t count, const char *label)
{
    return make_buffer_in(ctx, dt, count, label);
}

static sc_stream make_stream_in(sc_context c, const char *label)
{
    sc_stream s = {0};
    REQUIRE(sc_stream_create(c, &(sc_stream_desc){.label = label}, &s) == SC_OK);
    return s;
}

static sc_view view(sc_buffer b, uint64_t offset, uint64_t count)
{
    sc_view v = {{0}, 0, 0};
    REQUIRE(sc_buffer_view(b, offset, count, &v) == SC_OK);
    return v;
}

static void fill_f32(sc_stream s, sc_view v, float value)
{
    REQUIRE(sc_fill(s, v, &value) == SC_OK);
}

static void upload(sc_view v, const void *src, uint64_t bytes)
{
    sc_status s = sc_copy_from_host(SC_DEFAULT_STREAM, v, src, bytes);
    if (s != SC_OK)
        fprintf(stderr, "upload: %s\n", sc_last_error());
    REQUIRE(s == SC_OK);
}

static void download(void *dst, uint64_t bytes, sc_view v)
{
    sc_status s = sc_copy_to_host(SC_DEFAULT_STREAM, dst, bytes, v);
    if (s != SC_OK)
        fprintf(stderr, "download: %s\n", sc_last_error());
    REQUIRE(s == SC_OK);
}

/* Compile src for the context's device and load it; the program is destroyed again. */
static sc_module load_source_in(sc_context c, const char *src, const char *name,
                                const char *const *exprs)
{
    sc_program p = {0};
    sc_status s = sc_program_create(c, &(sc_program_desc){.source = src, .name = name,
                                                          .name_expressions = exprs},
                                    &p);
    if (s != SC_OK)
        fprintf(stderr, "compiling %s: %s\n", name, sc_last_error());
    REQUIRE(s == SC_OK);
    sc_program_props props;
    CHECK_OK(sc_program_info(p, &props));
    CHECK(props.arch == dev.cc_major * 10 + dev.cc_minor);
    sc_module m = {0};
    s = sc_module_load(c, p, &m);
    if (s != SC_OK)
        fprintf(stderr, "loading %s: %s\n", name, sc_last_error());
    REQUIRE(s == SC_OK);
    CHECK_OK(sc_program_destroy(p));
    return m;
}

static sc_kernel kernel(sc_module m, const char *name)
{
    sc_kernel k = {0};
    sc_status s = sc_kernel_get(m, name, &k);
    if (s != SC_OK)
        fprintf(stderr, "kernel '%s': %s\n", name, sc_last_error());
    REQUIRE(s == SC_OK);
    REQUIRE(k.id != 0);
    return k;
}

static sc_launch_desc config_for(uint64_t n, sc_kernel k)
{
    sc_launch_desc d;
    memset(&d, 0xff, sizeof d);
    REQUIRE(sc_launch_config_for(n, k, &d) == SC_OK);
    CHECK(d.block.x > 0 && d.grid.x > 0);
    CHECK((uint64_t)d.grid.x * d.block.x >= n);
    CHECK(d.shared_bytes == 0);
    return d;
}

static sc_stream default_stream(void)
{
    sc_stream s = {0};
    REQUIRE(sc_context_default_stream(ctx, &s) == SC_OK);
    return s;
}

/* ---- vector add ------------------------------------------------------------------------------ */

static void check_vector_add(uint64_t n)
{
    double t0 = test_now_s();
    sc_kernel va = kernel(mod, "vector_add");
    size_t bytes = (size_t)n * sizeof(float);
    float *a = test_xmalloc(bytes), *b = test_xmalloc(bytes), *c = test_xmalloc(bytes);
    random_floats(a, n, n * 2 + 1);
    random_floats(b, n, n * 2 + 2);

    sc_buffer da = make_buffer(SC_F32, n, "a"), db = make_buffer(SC_F32, n, "b"),
              dc = make_buffer(SC_F32, n, "c");
    upload(sc_view_of(da), a, bytes);
    upload(sc_view_of(db), b, bytes);
    fill_f32(SC_DEFAULT_STREAM, sc_view_of(dc), NAN); /* poison: every element must be written */

    sc_launch_desc cfg = config_for(n, va);
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(sc_view_of(da)),
                       sc_arg_in(sc_view_of(db)), sc_arg_out(sc_view_of(dc)),
                       sc_arg_i32((int32_t)n)));
    memset(c, 0, bytes);
    download(c, bytes, sc_view_of(dc));

    uint64_t bad = 0, first = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++) {
        float want = a[i] + b[i];
        if (bits_of(c[i]) != bits_of(want)) {
            if (first == UINT64_MAX)
                first = i;
            bad++;
        }
    }
    if (bad) {
        fprintf(stderr,
                "vector_add n=%" PRIu64 ": %" PRIu64 " wrong, first at %" PRIu64
                ": %a + %a = %a, got %a\n",
                n, bad, first, (double)a[first], (double)b[first], (double)(a[first] + b[first]),
                (double)c[first]);
        test_failures++;
    }
    printf("  vector_add n=%-10" PRIu64 " grid %u x block %u: %s (%.2f s)\n", n, cfg.grid.x,
           cfg.block.x, bad ? "WRONG" : "exact", test_now_s() - t0);

    CHECK_OK(sc_buffer_destroy(da));
    CHECK_OK(sc_buffer_destroy(db));
    CHECK_OK(sc_buffer_destroy(dc));
    CHECK_OK(sc_kernel_info(va, &(sc_kernel_props){0}));
    free(a);
    free(b);
    free(c);
}

/* Views with offsets: the kernel sees the view's first element, the rest is untouched. */
static void check_vector_add_views(void)
{
    enum { N = 1000, OFF_A = 3, OFF_B = 17, OFF_C = 250, LEN = 500 };
    sc_kernel va = kernel(mod, "vector_add");
    float a[N], b[N], c[N];
    random_floats(a, N, 77);
    random_floats(b, N, 78);
    sc_buffer da = make_buffer(SC_F32, N, "a"), db = make_buffer(SC_F32, N, "b"),
              dc = make_buffer(SC_F32, N, "c");
    upload(sc_view_of(da), a, sizeof a);
    upload(sc_view_of(db), b, sizeof b);
    fill_f32(SC_DEFAULT_STREAM, sc_view_of(dc), NAN);
    sc_launch_desc cfg = config_for(LEN, va);
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(view(da, OFF_A, LEN)),
                       sc_arg_in(view(db, OFF_B, LEN)), sc_arg_out(view(dc, OFF_C, LEN)),
                       sc_arg_i32(LEN)));
    download(c, sizeof c, sc_view_of(dc));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        bool inside = i >= OFF_C && i < OFF_C + LEN;
        if (inside) {
            float want = a[i - OFF_C + OFF_A] + b[i - OFF_C + OFF_B];
            bad += bits_of(c[i]) != bits_of(want);
        } else {
            bad += !isnan(c[i]);
        }
    }
    if (bad) {
        fprintf(stderr, "vector_add on sub-views: %d elements wrong\n", bad);
        test_failures++;
    }
    /* A view struct that reaches past its buffer is refused at the launch. */
    sc_view past = {dc, N - 10, 20};
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(view(da, 0, 20)),
                           sc_arg_in(view(db, 0, 20)), sc_arg_out(past), sc_arg_i32(20)),
                 SC_ERR_OUT_OF_BOUNDS);
    CHECK_OK(sc_buffer_destroy(da));
    CHECK_OK(sc_buffer_destroy(db));
    CHECK_OK(sc_buffer_destroy(dc));
}

static void test_vector_add(void)
{
    check_vector_add(1);
    check_vector_add(1000);
    check_vector_add((1u << 20) + 1);
    if (sanitizer)
        printf("  vector_add n=2^28 skipped under the sanitizer\n");
    else
        check_vector_add(1u << 28);
    check_vector_add_views();
}

/* ---- launch checks -------------------------------------------------------------------------- */

static void test_launch_mismatches(void)
{
    enum { N = 256 };
    sc_kernel km = kernel(mod, "k");            /* void k(const float*, float*, int) */
    sc_kernel va = kernel(mod, "vector_add");   /* extern "C": sizes only */
    sc_buffer fa = make_buffer(SC_F32, N, "fa"), fb = make_buffer(SC_F32, N, "fb"),
              ia = make_buffer(SC_I32, N, "ia"), da = make_buffer(SC_F64, N, "da");
    float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)i;
    upload(sc_view_of(fa), in, sizeof in);
    fill_f32(SC_DEFAULT_STREAM, sc_view_of(fb), -7.0f); /* sentinel: refused launches write nothing */
    sc_launch_desc cfg = {.grid = {1, 1, 1}, .block = {N, 1, 1}};
    sc_view A = sc_view_of(fa), B = sc_view_of(fb), I = sc_view_of(ia), D = sc_view_of(da);

    /* Argument count. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(A), sc_arg_out(B)),
                 SC_ERR_LAUNCH);
    CHECK_MSG("argument");
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(A), sc_arg_out(B),
                           sc_arg_i32(N), sc_arg_i32(N)),
                 SC_ERR_LAUNCH);
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, km, &cfg, NULL, 0), SC_ERR_LAUNCH);
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(A), sc_arg_in(A),
                           sc_arg_out(B)),
                 SC_ERR_LAUNCH);

    /* A scalar of the wrong size: typed and untyped kernels. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(A), sc_arg_out(B),
                           sc_arg_i64(N)),
                 SC_ERR_LAUNCH);
    CHECK_MSG("argument 2");
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(A), sc_arg_in(A),
                           sc_arg_out(B), sc_arg_u64(N)),
                 SC_ERR_LAUNCH);
    CHECK_MSG("argument 3");
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(A), sc_arg_in(A),
                           sc_arg_out(B), sc_arg_f64(N)),
                 SC_ERR_LAUNCH);
    /* Raw bytes of the wrong size. */
    int64_t eight = N;
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(A), sc_arg_in(A),
                           sc_arg_out(B), sc_arg_bytes(&eight, sizeof eight)),
                 SC_ERR_LAUNCH);
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(A), sc_arg_in(A),
                           sc_arg_out(B), sc_arg_bytes(NULL, 0)),
                 SC_ERR_INVALID_ARGUMENT);
    /* A view where the kernel wants an int (8 bytes against 4). */
    sc_status s = SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(A), sc_arg_out(B),
                            sc_arg_in(A));
    CHECK(s == SC_ERR_LAUNCH || s == SC_ERR_TYPE_MISMATCH);

    /* An i32 view for float*. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(A), sc_arg_out(I),
                           sc_arg_i32(N)),
                 SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("argument 1");
    CHECK_MSG("float*");
    CHECK_MSG("i32 view");
    /* An f64 view for const float*. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(D), sc_arg_out(B),
                           sc_arg_i32(N)),
                 SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("argument 0");
    CHECK_MSG("const float*");
    CHECK_MSG("f64");
    /* A const float* parameter passed as out and as inout. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_out(A), sc_arg_out(B),
                           sc_arg_i32(N)),
                 SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("argument 0");
    CHECK_MSG("const float*");
    CHECK_MSG("out");
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_inout(A), sc_arg_out(B),
                           sc_arg_i32(N)),
                 SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("argument 0");
    CHECK_MSG("inout");
    /* An f32 scalar for int. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(A), sc_arg_out(B),
                           sc_arg_f32((float)N)),
                 SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("argument 2");
    CHECK_MSG("int");
    CHECK_MSG("f32");
    /* A scalar (a raw address) where the kernel wants a pointer. */
    uint64_t raw = 0;
    CHECK_OK(sc_buffer_device_ptr(fb, &raw));
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(A), sc_arg_u64(raw),
                           sc_arg_i32(N)),
                 SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("argument 1");

    /* Bad descs and handles. */
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, km, NULL,
                                  (const sc_arg[]){sc_arg_in(A), sc_arg_out(B), sc_arg_i32(N)},
                                  3),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, km, &cfg, NULL, 3), SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, (sc_kernel){0}, &cfg, sc_arg_in(A), sc_arg_out(B),
                           sc_arg_i32(N)),
                 SC_ERR_STALE_HANDLE);
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, (sc_kernel){fa.id}, &cfg, sc_arg_in(A),
                           sc_arg_out(B), sc_arg_i32(N)),
                 SC_ERR_WRONG_KIND);
    sc_arg bad_kind = sc_arg_in(A);
    bad_kind.kind = (sc_arg_kind)99;
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, bad_kind, sc_arg_out(B), sc_arg_i32(N)),
                 SC_ERR_INVALID_ARGUMENT);

    /* None of the refused launches ran. */
    download(out, sizeof out, B);
    int touched = 0;
    for (int i = 0; i < N; i++)
        touched += out[i] != -7.0f;
    if (touched) {
        fprintf(stderr, "refused launches: %d elements of the output were written\n", touched);
        test_failures++;
    }
    CHECK_OK(sc_context_check(ctx));

    /* The correct launch, and the extern "C" kernel takes an i32 view (sizes only). */
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, km, &cfg, sc_arg_in(A), sc_arg_out(B), sc_arg_i32(N)));
    download(out, sizeof out, B);
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += out[i] != (float)i * 2.0f + 1.0f;
    CHECK(bad == 0);
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, va, &cfg, sc_arg_in(I), sc_arg_in(I), sc_arg_out(I),
                       sc_arg_i32(N)));

    /* A struct by value (size checked, type opaque). */
    struct params {
        float scale;
        int offset;
        double bias;
    } prm = {0.5f, 10, 0.25};
    sc_kernel ws = kernel(mod, "with_struct");
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, ws, &cfg, sc_arg_bytes(&prm, sizeof prm),
                       sc_arg_out(B), sc_arg_i32(N)));
    download(out, sizeof out, B);
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += out[i] != (float)((double)((float)(i + 10) * 0.5f) + 0.25);
    CHECK(bad == 0);
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, ws, &cfg, sc_arg_bytes(&prm, 12), sc_arg_out(B),
                           sc_arg_i32(N)),
                 SC_ERR_LAUNCH);
    /* A view for the struct: sizes differ. */
    s = SC_LAUNCH(SC_DEFAULT_STREAM, ws, &cfg, sc_arg_in(A), sc_arg_out(B), sc_arg_i32(N));
    CHECK(s == SC_ERR_LAUNCH || s == SC_ERR_TYPE_MISMATCH);

    CHECK_OK(sc_buffer_destroy(fa));
    CHECK_OK(sc_buffer_destroy(fb));
    CHECK_OK(sc_buffer_destroy(ia));
    CHECK_OK(sc_buffer_destroy(da));
}

static void test_launch_limits(void)
{
    sc_kernel e = kernel(mod, "empty");
    sc_kernel bd = kernel(mod, "bounded");
    sc_buffer x = make_buffer(SC_F32, 1024, "x");
    sc_status s;

    sc_launch_desc d = {.grid = {.x = 1}, .block = {.x = 1}};
    CHECK_OK(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0));
    d = (sc_launch_desc){.grid = {1, 1, 1}, .block = {2048, 1, 1}};
    sc_clear_error();
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0), SC_ERR_LAUNCH);
    CHECK_MSG("2048");
    d = (sc_launch_desc){.grid = {1, 1, 1}, .block = {1024, 2, 1}};
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0), SC_ERR_LAUNCH);
    d = (sc_launch_desc){.grid = {1, 1, 1}, .block = {1, 1, (uint32_t)dev.max_block[2] + 1}};
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0), SC_ERR_LAUNCH);
    d = (sc_launch_desc){.grid = {1, (uint32_t)dev.max_grid[1] + 1, 1}, .block = {32, 1, 1}};
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0), SC_ERR_LAUNCH);
    d = (sc_launch_desc){.grid = {(uint32_t)dev.max_grid[0] + 1u, 1, 1}, .block = {32, 1, 1}};
    if ((uint64_t)dev.max_grid[0] + 1 <= UINT32_MAX)
        CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0), SC_ERR_LAUNCH);
    d = (sc_launch_desc){.grid = {0, 1, 1}, .block = {32, 1, 1}};
    s = sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0);
    CHECK(s == SC_ERR_LAUNCH || s == SC_ERR_INVALID_ARGUMENT);
    d = (sc_launch_desc){.grid = {1, 1, 1}, .block = {0, 1, 1}};
    s = sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0);
    CHECK(s == SC_ERR_LAUNCH || s == SC_ERR_INVALID_ARGUMENT);
    /* y and z default to 1: a zero there is not an error. */
    d = (sc_launch_desc){.grid = {2, 0, 0}, .block = {64, 0, 0}};
    CHECK_OK(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0));
    /* Shared memory past the default limit without raising it. */
    d = (sc_launch_desc){.grid = {.x = 1}, .block = {.x = 32}, .shared_bytes = 200000};
    sc_clear_error();
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0), SC_ERR_LAUNCH);
    CHECK_MSG("shared");
    /* __launch_bounds__(128): a block of 256 is too big for this kernel. */
    sc_kernel_props kp;
    CHECK_OK(sc_kernel_info(bd, &kp));
    CHECK(kp.max_threads_per_block == 128);
    d = (sc_launch_desc){.grid = {.x = 1}, .block = {.x = 256}};
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, bd, &d, sc_arg_out(sc_view_of(x))), SC_ERR_LAUNCH);
    CHECK_MSG("128");
    d = (sc_launch_desc){.grid = {.x = 1}, .block = {.x = 128}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, bd, &d, sc_arg_out(sc_view_of(x))));
    /* The largest legal block. */
    d = (sc_launch_desc){.grid = {.x = 1}, .block = {32, 32, 1}};
    CHECK_OK(sc_kernel_launch(SC_DEFAULT_STREAM, e, &d, NULL, 0));
    CHECK_OK(sc_stream_synchronize(default_stream()));
    CHECK_OK(sc_context_check(ctx));
    CHECK_OK(sc_buffer_destroy(x));
}

/* ---- attributes and shared memory -------------------------------------------------------- */

static void test_kernel_info(void)
{
    int driver = 0;
    CHECK_OK(sc_driver_version(&driver));
    bool param_info = driver >= 12040;
    int cc = dev.cc_major * 10 + dev.cc_minor;

    sc_kernel_props p;
    sc_kernel va = kernel(mod, "vector_add");
    CHECK_OK(sc_kernel_info(va, &p));
    CHECK(strcmp(p.name, "vector_add") == 0);
    CHECK(p.registers > 0);
    CHECK(p.max_threads_per_block > 0 && p.max_threads_per_block <= dev.max_threads_per_block);
    CHECK(p.static_shared_bytes == 0);
    CHECK(p.local_bytes >= 0);
    CHECK(p.binary_version == cc);
    CHECK(p.n_params == (param_info ? 4 : -1));
    CHECK(!p.typed);
    printf("  vector_add: %d registers, %d threads max, binary %d, ptx %d, %d params\n",
           p.registers, p.max_threads_per_block, p.binary_version, p.ptx_version, p.n_params);

    sc_kernel km = kernel(mod, "k");
    CHECK_OK(sc_kernel_info(km, &p));
    CHECK(strncmp(p.name, "_Z", 2) == 0);
    CHECK(p.registers > 0);
    CHECK(p.n_params == (param_info ? 3 : -1));
    CHECK(p.typed == param_info);
    /* The mangled name finds the same kernel. */
    char mangled[256];
    snprintf(mangled, sizeof mangled, "%s", p.name);
    sc_kernel km2 = kernel(mod, mangled);
    CHECK(km2.id != km.id); /* a second handle */
    sc_kernel_props p2;
    CHECK_OK(sc_kernel_info(km2, &p2));
    CHECK(strcmp(p2.name, p.name) == 0 && p2.typed == p.typed);

    sc_kernel ss = kernel(mod, "static_shared");
    CHECK_OK(sc_kernel_info(ss, &p));
    CHECK(p.static_shared_bytes == 4096);
    sc_buffer out = make_buffer(SC_F32, 1024, "static shared out");
    sc_launch_desc one_block = {.grid = {.x = 1}, .block = {.x = 1024}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, ss, &one_block, sc_arg_out(sc_view_of(out))));
    float h[1024];
    download(h, sizeof h, sc_view_of(out));
    int bad = 0;
    for (int i = 0; i < 1024; i++)
        bad += h[i] != (float)(1023 - i);
    CHECK(bad == 0);
    CHECK_OK(sc_buffer_destroy(out));

    /* Occupancy. */
    int blocks = 0;
    CHECK_OK(sc_kernel_occupancy(va, 256, 0, &blocks));
    CHECK(blocks > 0);
    CHECK(blocks * 256 <= dev.max_threads_per_sm);
    printf("  vector_add occupancy: %d blocks of 256 per SM\n", blocks);
    CHECK_OK(sc_kernel_occupancy(ss, 1024, 0, &blocks));
    CHECK(blocks > 0);
    CHECK(sc_kernel_occupancy(va, 0, 0, &blocks) != SC_OK);
    CHECK(sc_kernel_occupancy(va, 4096, 0, &blocks) != SC_OK);
    CHECK_STATUS(sc_kernel_occupancy(va, 256, 0, NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_kernel_info(va, NULL), SC_ERR_INVALID_ARGUMENT);
    sc_launch_desc d;
    CHECK_STATUS(sc_launch_config_for(0, va, &d), SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_launch_config_for(10, va, NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_launch_config_for(10, (sc_kernel){0}, &d), SC_ERR_STALE_HANDLE);
    /* A config for more elements than one grid row of blocks can hold stays legal. */
    d = config_for(1ull << 40, va);
    CHECK(d.grid.x <= (uint32_t)dev.max_grid[0]);

    /* The module lists its kernels (mangled names for C++ kernels). */
    size_t count = 0;
    sc_status s = sc_module_kernel_names(mod, NULL, 0, &count);
    if (s == SC_ERR_NOT_SUPPORTED) {
        CHECK(driver < 12040);
    } else {
        CHECK_OK(s);
        CHECK(count >= 10);
        const char *names[64];
        CHECK_OK(sc_module_kernel_names(mod, names, 64, &count));
        bool found_va = false, found_k = false;
        for (size_t i = 0; i < count && i < 64; i++) {
            found_va |= strcmp(names[i], "vector_add") == 0;
            found_k |= strcmp(names[i], mangled) == 0;
        }
        CHECK(found_va && found_k);
        /* A short array gets what fits; count is the total. */
        size_t total = count;
        CHECK_OK(sc_module_kernel_names(mod, names, 2, &count));
        CHECK(count == total);
    }
}

static void test_dynamic_shared(void)
{
    sc_kernel k = kernel(mod, "dyn_shared");
    sc_kernel_props p;
    CHECK_OK(sc_kernel_info(k, &p));
    printf("  dyn_shared: default dynamic limit %d bytes, device opt-in %d bytes\n",
           p.max_dynamic_shared_bytes, dev.shared_per_block_optin);
    CHECK(p.max_dynamic_shared_bytes < 100 * 1024);

    const int words = 100 * 1024 / 4;
    sc_buffer out = make_buffer(SC_F32, (uint64_t)words, "dyn out");
    fill_f32(SC_DEFAULT_STREAM, sc_view_of(out), NAN);
    sc_launch_desc d = {.grid = {.x = 1}, .block = {.x = 256}, .shared_bytes = 100 * 1024};

    /* Before raising the limit: refused, with the way out in the message. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, k, &d, sc_arg_out(sc_view_of(out)),
                           sc_arg_i32(words)),
                 SC_ERR_LAUNCH);
    CHECK_MSG("sc_kernel_set_max_dynamic_shared");
    d.shared_bytes = 200000;
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, k, &d, sc_arg_out(sc_view_of(out)),
                           sc_arg_i32(words)),
                 SC_ERR_LAUNCH);

    /* Raised to 100 KiB: 100 KiB launches and every byte of it works. */
    CHECK_OK(sc_kernel_set_max_dynamic_shared(k, 100 * 1024));
    CHECK_OK(sc_kernel_info(k, &p));
    CHECK(p.max_dynamic_shared_bytes == 100 * 1024);
    d.shared_bytes = 100 * 1024;
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k, &d, sc_arg_out(sc_view_of(out)),
                       sc_arg_i32(words)));
    float *h = test_xmalloc((size_t)words * 4);
    download(h, (uint64_t)words * 4, sc_view_of(out));
    int bad = 0;
    for (int j = 0; j < words; j++)
        bad += h[j] != (float)((words - 1 - j) * 3);
    if (bad) {
        fprintf(stderr, "dyn_shared with 100 KiB: %d of %d words wrong\n", bad, words);
        test_failures++;
    }
    free(h);
    /* Past the raised limit, and past what the device allows at all. */
    d.shared_bytes = 200000;
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, k, &d, sc_arg_out(sc_view_of(out)),
                           sc_arg_i32(words)),
                 SC_ERR_LAUNCH);
    d.shared_bytes = 300 * 1024;
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, k, &d, sc_arg_out(sc_view_of(out)),
                           sc_arg_i32(words)),
                 SC_ERR_LAUNCH);
    CHECK(sc_kernel_set_max_dynamic_shared(k, 300 * 1024) != SC_OK);
    CHECK(sc_kernel_set_max_dynamic_shared(k, -1) != SC_OK);
    CHECK_OK(sc_kernel_info(k, &p));
    CHECK(p.max_dynamic_shared_bytes == 100 * 1024); /* unchanged by the refused calls */
    /* The opt-in maximum is allowed. */
    int most = dev.shared_per_block_optin - p.static_shared_bytes;
    CHECK_OK(sc_kernel_set_max_dynamic_shared(k, most));
    CHECK_OK(sc_kernel_occupancy(k, 256, (uint64_t)most, &bad));
    CHECK(bad >= 1);
    CHECK_OK(sc_stream_synchronize(default_stream()));
    CHECK_OK(sc_buffer_destroy(out));
}

/* ---- templates ---------------------------------------------------------------------------- */

static void test_templates(void)
{
    enum { N = 1000 };
    const char *const exprs[] = {"scale<float>", "scale<double>", NULL};
    sc_program p = {0};
    REQUIRE(sc_program_create(ctx, &(sc_program_desc){.source = template_src, .name = "scale.cu",
                                                      .name_expressions = exprs},
                              &p) == SC_OK);
    const char *lf = NULL, *ld = NULL;
    CHECK_OK(sc_program_lowered_name(p, "scale<float>", &lf));
    CHECK_OK(sc_program_lowered_name(p, "scale<double>", &ld));
    CHECK(lf && strncmp(lf, "_Z", 2) == 0);
    CHECK(ld && strncmp(ld, "_Z", 2) == 0);
    sc_module m = {0};
    REQUIRE(sc_module_load(ctx, p, &m) == SC_OK);
    sc_kernel kf = kernel(m, "scale<float>"), kd = kernel(m, "scale<double>");
    sc_kernel_props props;
    CHECK_OK(sc_kernel_info(kf, &props));
    CHECK(lf && strcmp(props.name, lf) == 0);
    CHECK_OK(sc_kernel_info(kd, &props));
    CHECK(ld && strcmp(props.name, ld) == 0);
    /* The lowered name works too. */
    if (lf) {
        sc_kernel k2 = kernel(m, lf);
        CHECK_OK(sc_kernel_info(k2, &props));
    }
    CHECK_OK(sc_program_destroy(p)); /* the module keeps the name expressions */

    float hf[N], rf[N];
    double hd[N], rd[N];
    random_floats(hf, N, 5);
    for (int i = 0; i < N; i++)
        hd[i] = (double)hf[i] * 1.000001;
    sc_buffer bf = make_buffer(SC_F32, N, "xf"), bdd = make_buffer(SC_F64, N, "xd");
    upload(sc_view_of(bf), hf, sizeof hf);
    upload(sc_view_of(bdd), hd, sizeof hd);
    sc_launch_desc cfg = config_for(N, kf);
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, kf, &cfg, sc_arg_inout(sc_view_of(bf)), sc_arg_f32(2.0f),
                       sc_arg_i32(N)));
    cfg = config_for(N, kd);
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, kd, &cfg, sc_arg_inout(sc_view_of(bdd)),
                       sc_arg_f64(2.0), sc_arg_i32(N)));
    download(rf, sizeof rf, sc_view_of(bf));
    download(rd, sizeof rd, sc_view_of(bdd));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += rf[i] != hf[i] * 2.0f || rd[i] != hd[i] * 2.0;
    CHECK(bad == 0);

    /* The template's types are checked. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, kf, &cfg, sc_arg_inout(sc_view_of(bdd)),
                           sc_arg_f32(2.0f), sc_arg_i32(N)),
                 SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("argument 0");
    CHECK_MSG("f64");
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, kf, &cfg, sc_arg_inout(sc_view_of(bf)),
                           sc_arg_f64(2.0), sc_arg_i32(N)),
                 SC_ERR_LAUNCH); /* 8 bytes for a 4-byte float */
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, kd, &cfg, sc_arg_inout(sc_view_of(bdd)),
                           sc_arg_i64(2), sc_arg_i32(N)),
                 SC_ERR_TYPE_MISMATCH); /* same size, wrong type */
    /* A name expression that was not given (a deliberate driver error: not under the
     * sanitizer, which reports every failed driver call). */
    if (!sanitizer) {
        sc_kernel ki = {0};
        sc_clear_error();
        CHECK(sc_kernel_get(m, "scale<int>", &ki) != SC_OK);
        CHECK(ki.id == 0);
        CHECK_MSG("scale<int>");
    }

    CHECK_OK(sc_buffer_destroy(bf));
    CHECK_OK(sc_buffer_destroy(bdd));
    CHECK_OK(sc_module_destroy(m));
    CHECK_STATUS(sc_kernel_info(kf, &props), SC_ERR_STALE_HANDLE);
}

/* ---- modules: images, files, stale handles ------------------------------------------------ */

static bool iota_works(sc_module m, const char *how)
{
    enum { N = 777 };
    sc_kernel k = {0};
    if (sc_kernel_get(m, "iota", &k) != SC_OK) {
        fprintf(stderr, "%s: %s\n", how, sc_last_error());
        test_failures++;
        return false;
    }
    sc_buffer b = make_buffer(SC_F32, N, "iota");
    fill_f32(SC_DEFAULT_STREAM, sc_view_of(b), NAN);
    sc_launch_desc cfg = config_for(N, k);
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_out(sc_view_of(b)), sc_arg_i32(N)));
    float h[N];
    download(h, sizeof h, sc_view_of(b));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += h[i] != (float)i * 0.5f;
    if (bad) {
        fprintf(stderr, "%s: %d of %d wrong\n", how, bad, N);
        test_failures++;
    }
    CHECK_OK(sc_buffer_destroy(b));
    return bad == 0;
}

static void test_modules(void)
{
    /* PTX, from memory. */
    sc_program pp = {0};
    REQUIRE(sc_program_create(ctx, &(sc_program_desc){.source = iota_src, .name = "iota.cu",
                                                      .ptx = true},
                              &pp) == SC_OK);
    sc_program_props props;
    CHECK_OK(sc_program_info(pp, &props));
    CHECK(props.is_ptx);
    const void *img = NULL;
    uint64_t bytes = 0;
    CHECK_OK(sc_program_image(pp, &img, &bytes));
    REQUIRE(img != NULL && bytes > 0);
    sc_module m = {0};
    CHECK_OK(sc_module_load_image(ctx, img, bytes, &m));
    if (m.id) {
        iota_works(m, "PTX image");
        CHECK_OK(sc_module_destroy(m));
        CHECK_STATUS(sc_module_destroy(m), SC_ERR_STALE_HANDLE);
    }
    /* Without its terminating NUL. */
    size_t len = strnlen(img, (size_t)bytes);
    CHECK_OK(sc_module_load_image(ctx, img, len, &m));
    if (m.id) {
        iota_works(m, "PTX image without NUL");
        CHECK_OK(sc_module_destroy(m));
    }

    /* PTX, from a file. */
    char path[] = "/tmp/safecuda-test-kernels-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, img, len) == (ssize_t)len);
    REQUIRE(close(fd) == 0);
    CHECK_OK(sc_module_load_file(ctx, path, &m));
    if (m.id) {
        iota_works(m, "PTX file");
        CHECK_OK(sc_module_destroy(m));
    }
    unlink(path);
    sc_clear_error();
    CHECK_STATUS(sc_module_load_file(ctx, path, &m), SC_ERR_IO);
    CHECK_MSG(path);
    CHECK(m.id == 0);
    CHECK_OK(sc_program_destroy(pp));

    /* cubin, from memory. */
    sc_program pc = {0};
    REQUIRE(sc_program_create(ctx, &(sc_program_desc){.source = iota_src, .name = "iota.cu"},
                              &pc) == SC_OK);
    CHECK_OK(sc_program_info(pc, &props));
    CHECK_OK(sc_program_image(pc, &img, &bytes));
    CHECK_OK(sc_module_load_image(ctx, img, bytes, &m));
    if (m.id) {
        iota_works(m, props.is_ptx ? "second PTX image" : "cubin image");
        CHECK_OK(sc_module_destroy(m));
    }
    CHECK_OK(sc_program_destroy(pc));

    /* A compile-only program for the device's architecture loads in the context. */
    sc_program po = {0};
    REQUIRE(sc_program_create((sc_context){0},
                              &(sc_program_desc){.source = iota_src, .name = "iota.cu",
                                                 .arch = dev.cc_major * 10 + dev.cc_minor},
                              &po) == SC_OK);
    CHECK_OK(sc_module_load(ctx, po, &m));
    if (m.id) {
        iota_works(m, "compile-only program");
        CHECK_OK(sc_module_destroy(m));
    }
    CHECK_OK(sc_program_destroy(po));
    CHECK_STATUS(sc_module_load(ctx, po, &m), SC_ERR_STALE_HANDLE);

    /* Images that are not modules: refused, the context stays usable. The failed driver
     * calls are deliberate: not under the sanitizer, which would report them. */
    static const char junk[] = "this is not PTX, not a cubin and not a fatbin at all";
    if (!sanitizer) {
        CHECK(sc_module_load_image(ctx, junk, sizeof junk, &m) != SC_OK);
        CHECK(m.id == 0);
    }
    CHECK_STATUS(sc_module_load_image(ctx, junk, 2, &m), SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_module_load_image(ctx, NULL, 100, &m), SC_ERR_INVALID_ARGUMENT);
    CHECK_OK(sc_context_check(ctx));

    /* A missing kernel is named (deliberate driver errors again). */
    sc_kernel k = {0};
    sc_module mm = load_source_in(ctx, kernels_src, "kernels_no_exprs.cu", NULL);
    if (!sanitizer) {
        sc_clear_error();
        CHECK(sc_kernel_get(mod, "no_such_kernel_here", &k) != SC_OK);
        CHECK(k.id == 0);
        CHECK_MSG("no_such_kernel_here");
        /* A C++ kernel is not found by its plain name without a name expression. */
        sc_clear_error();
        CHECK(sc_kernel_get(mm, "k", &k) != SC_OK);
        CHECK_MSG("'k'");
    }
    CHECK_STATUS(sc_kernel_get(mm, NULL, &k), SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_kernel_get(mm, "vector_add", NULL), SC_ERR_INVALID_ARGUMENT);

    /* Kernels go stale with their module. */
    sc_kernel va = kernel(mm, "vector_add"), e = kernel(mm, "empty");
    CHECK_OK(sc_kernel_launch(SC_DEFAULT_STREAM, e, &(sc_launch_desc){.grid = {.x = 1}, .block = {.x = 1}},
                              NULL, 0));
    CHECK_OK(sc_module_destroy(mm));
    sc_kernel_props kp;
    sc_clear_error();
    CHECK_STATUS(sc_kernel_info(va, &kp), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_kernel_info");
    CHECK_STATUS(sc_kernel_launch(SC_DEFAULT_STREAM, e, &(sc_launch_desc){.grid = {.x = 1},
                                                                           .block = {.x = 1}},
                                  NULL, 0),
                 SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_kernel_set_max_dynamic_shared(va, 1024), SC_ERR_STALE_HANDLE);
    int blocks;
    CHECK_STATUS(sc_kernel_occupancy(va, 128, 0, &blocks), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_kernel_get(mm, "vector_add", &k), SC_ERR_STALE_HANDLE);
    size_t count;
    CHECK_STATUS(sc_module_kernel_names(mm, NULL, 0, &count), SC_ERR_STALE_HANDLE);

    /* A view of a destroyed buffer. */
    sc_kernel ao = kernel(mod, "add_one");
    sc_buffer gone = make_buffer(SC_F32, 64, "gone");
    sc_view gv = sc_view_of(gone);
    CHECK_OK(sc_buffer_destroy(gone));
    sc_clear_error();
    sc_launch_desc d64 = {.grid = {.x = 1}, .block = {.x = 64}};
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, ao, &d64, sc_arg_inout(gv), sc_arg_i32(64)),
                 SC_ERR_STALE_HANDLE);
    CHECK_MSG("argument 0");
    CHECK_OK(sc_context_check(ctx));
}

/* ---- other contexts ------------------------------------------------------------------------- */

static void test_other_context(void)
{
    sc_context c2 = {0};
    REQUIRE(sc_context_create(NULL, &c2) == SC_OK);
    sc_stream s2 = make_stream_in(c2, "other context's stream");
    sc_buffer b2 = make_buffer_in(c2, SC_F32, 64, "other context's buffer");
    sc_buffer b1 = make_buffer(SC_F32, 64, "b1");
    sc_kernel ao = kernel(mod, "add_one");
    sc_launch_desc d = {.grid = {.x = 1}, .block = {.x = 64}};

    /* A stream of another context. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(s2, ao, &d, sc_arg_inout(sc_view_of(b1)), sc_arg_i32(64)),
                 SC_ERR_WRONG_CONTEXT);
    /* A buffer of another context. */
    sc_clear_error();
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, ao, &d, sc_arg_inout(sc_view_of(b2)),
                           sc_arg_i32(64)),
                 SC_ERR_WRONG_CONTEXT);
    CHECK_MSG("argument 0");
    /* A program of one context loaded into another. */
    sc_program p1 = {0};
    REQUIRE(sc_program_create(ctx, &(sc_program_desc){.source = iota_src}, &p1) == SC_OK);
    sc_module m = {0};
    CHECK_STATUS(sc_module_load(c2, p1, &m), SC_ERR_WRONG_CONTEXT);
    CHECK_OK(sc_program_destroy(p1));

    /* Objects left in c2 are reported and freed at its destroy. */
    sc_program p2 = {0};
    REQUIRE(sc_program_create(c2, &(sc_program_desc){.source = iota_src, .name = "leaky.cu"},
                              &p2) == SC_OK);
    sc_module m2 = {0};
    REQUIRE(sc_module_load(c2, p2, &m2) == SC_OK);
    sc_kernel k2 = kernel(m2, "iota");
    CHECK_OK(SC_LAUNCH(s2, k2, &d, sc_arg_out(sc_view_of(b2)), sc_arg_i32(64)));
    test_log_text[0] = '\0';
    sc_set_log_callback(test_log_capture, NULL);
    CHECK_STATUS(sc_context_destroy(c2), SC_ERR_LEAKED);
    sc_set_log_callback(NULL, NULL);
    CHECK(strstr(test_log_text, "module") != NULL);
    CHECK(strstr(test_log_text, "program") != NULL);
    CHECK(strstr(test_log_text, "leaky.cu") != NULL);
    CHECK_STATUS(sc_kernel_info(k2, &(sc_kernel_props){0}), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_module_destroy(m2), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_program_destroy(p2), SC_ERR_STALE_HANDLE);

    CHECK_OK(sc_buffer_destroy(b1));
    CHECK_OK(sc_context_check(ctx));
}

/* ---- cross-stream ordering through launches ----------------------------------------------- */

static void test_cross_stream(void)
{
    const int n = sanitizer ? 1 << 12 : 1 << 18; /* about one wave on an H100 */
    const int iters = sanitizer ? 1 << 6 : 1 << 21; /* ~20 ms on an H100 */
    sc_kernel sw = kernel(mod, "slow_write"), sk = kernel(mod, "slow_copy");
    sc_stream A = make_stream_in(ctx, "A"), B = make_stream_in(ctx, "B");
    sc_event t0 = {0}, t1 = {0};
    REQUIRE(sc_event_create(ctx, &(sc_event_desc){.timing = true}, &t0) == SC_OK);
    REQUIRE(sc_event_create(ctx, &(sc_event_desc){.timing = true}, &t1) == SC_OK);
    sc_buffer out = make_buffer(SC_F32, (uint64_t)n, "out");
    sc_buffer in = make_buffer(SC_F32, (uint64_t)n, "in");
    sc_buffer other = make_buffer(SC_F32, (uint64_t)n, "other");
    float *h = test_xmalloc((size_t)n * 4);
    sc_launch_desc cfg = config_for((uint64_t)n, sw);

    /* Read after write: the kernel writes `out` on A, B copies it to the host at once. */
    fill_f32(A, sc_view_of(out), NAN);
    CHECK_OK(sc_stream_synchronize(A));
    CHECK_OK(sc_event_record(t0, A));
    CHECK_OK(SC_LAUNCH(A, sw, &cfg, sc_arg_out(sc_view_of(out)), sc_arg_i32(n),
                       sc_arg_i32(iters)));
    CHECK_OK(sc_event_record(t1, A));
    sc_status q = sc_stream_query(A);
    CHECK(q == SC_OK || q == SC_ERR_NOT_READY);
    CHECK_OK(sc_copy_to_host(B, h, (uint64_t)n * 4, sc_view_of(out)));
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != (float)i;
    float ms = 0;
    CHECK_OK(sc_event_synchronize(t1));
    CHECK_OK(sc_event_elapsed(t0, t1, &ms));
    printf("  slow kernel %.1f ms (%s when B's copy was enqueued); read after write: %s\n", ms,
           q == SC_ERR_NOT_READY ? "running" : "already done", bad ? "WRONG" : "ordered");
    if (bad) {
        fprintf(stderr, "read after a kernel's write on another stream: %d of %d wrong\n", bad,
                n);
        test_failures++;
    }

    /* Read after write through a device copy on B. */
    fill_f32(A, sc_view_of(out), NAN);
    CHECK_OK(SC_LAUNCH(A, sw, &cfg, sc_arg_out(sc_view_of(out)), sc_arg_i32(n),
                       sc_arg_i32(iters)));
    CHECK_OK(sc_copy(B, sc_view_of(other), sc_view_of(out)));
    CHECK_OK(sc_copy_to_host(B, h, (uint64_t)n * 4, sc_view_of(other)));
    bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != (float)i;
    CHECK(bad == 0);

    /* Write after read: the kernel reads `in` on A, B overwrites it at once. */
    for (int i = 0; i < n; i++)
        h[i] = (float)(i + 1);
    CHECK_OK(sc_copy_from_host(A, sc_view_of(in), h, (uint64_t)n * 4));
    fill_f32(A, sc_view_of(out), NAN);
    CHECK_OK(SC_LAUNCH(A, sk, &cfg, sc_arg_in(sc_view_of(in)), sc_arg_out(sc_view_of(out)),
                       sc_arg_i32(n), sc_arg_i32(iters)));
    fill_f32(B, sc_view_of(in), -1.0f);
    CHECK_OK(sc_copy_to_host(B, h, (uint64_t)n * 4, sc_view_of(out)));
    bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != (float)(i + 1);
    if (bad) {
        fprintf(stderr, "write after a kernel's read on another stream: %d of %d wrong\n", bad,
                n);
        test_failures++;
    }
    CHECK_OK(sc_copy_to_host(A, h, (uint64_t)n * 4, sc_view_of(in)));
    bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != -1.0f;
    CHECK(bad == 0);

    /* Write after write: B's fill lands after the kernel's writes. */
    CHECK_OK(SC_LAUNCH(A, sw, &cfg, sc_arg_out(sc_view_of(out)), sc_arg_i32(n),
                       sc_arg_i32(iters)));
    fill_f32(B, sc_view_of(out), 7.0f);
    CHECK_OK(sc_copy_to_host(B, h, (uint64_t)n * 4, sc_view_of(out)));
    bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != 7.0f;
    CHECK(bad == 0);

    /* A kernel on B reading what a kernel on A wrote (launch after launch). */
    sc_kernel ao = kernel(mod, "add_one");
    CHECK_OK(SC_LAUNCH(A, sw, &cfg, sc_arg_out(sc_view_of(out)), sc_arg_i32(n),
                       sc_arg_i32(iters)));
    sc_launch_desc c2 = config_for((uint64_t)n, ao);
    CHECK_OK(SC_LAUNCH(B, ao, &c2, sc_arg_inout(sc_view_of(out)), sc_arg_i32(n)));
    CHECK_OK(sc_copy_to_host(B, h, (uint64_t)n * 4, sc_view_of(out)));
    bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != (float)i + 1.0f;
    CHECK(bad == 0);

    free(h);
    CHECK_OK(sc_buffer_destroy(out));
    CHECK_OK(sc_buffer_destroy(in));
    CHECK_OK(sc_buffer_destroy(other));
    CHECK_OK(sc_event_destroy(t0));
    CHECK_OK(sc_event_destroy(t1));
    CHECK_OK(sc_stream_destroy(A));
    CHECK_OK(sc_stream_destroy(B));
}

/* ---- threads ------------------------------------------------------------------------------ */

enum { THREADS = 8, THREAD_N = 4096 };

typedef struct worker {
    int id;
    int launches;
    sc_kernel k;
    int bad;
    sc_status status;
    char message[512];
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    sc_stream s = {0};
    sc_buffer b = {0};
    w->status = sc_stream_create(ctx, &(sc_stream_desc){.label = "worker"}, &s);
    if (w->status == SC_OK)
        w->status = sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = THREAD_N,
                                                            .zero = true, .stream = s},
                                     &b);
    sc_launch_desc d = {.grid = {.x = THREAD_N / 256}, .block = {.x = 256}};
    for (int i = 0; i < w->launches && w->status == SC_OK; i++)
        w->status = SC_LAUNCH(s, w->k, &d, sc_arg_inout(sc_view_of(b)), sc_arg_i32(THREAD_N));
    float *h = malloc(THREAD_N * sizeof(float));
    if (w->status == SC_OK && h)
        w->status = sc_copy_to_host(s, h, THREAD_N * sizeof(float), sc_view_of(b));
    if (w->status == SC_OK && h)
        for (int i = 0; i < THREAD_N; i++)
            w->bad += h[i] != (float)w->launches;
    if (w->status != SC_OK)
        snprintf(w->message, sizeof w->message, "%s", sc_last_error());
    free(h);
    if (b.id)
        sc_buffer_destroy(b);
    if (s.id)
        sc_stream_destroy(s);
    return NULL;
}

static void test_threads(void)
{
    pthread_t t[THREADS];
    worker w[THREADS];
    sc_kernel k = kernel(mod, "add_one");
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.id = i, .launches = sanitizer ? 20 : 500, .k = k};
        REQUIRE(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        if (w[i].status != SC_OK) {
            fprintf(stderr, "thread %d: %s: %s\n", i, sc_status_name(w[i].status), w[i].message);
            test_failures++;
        }
        if (w[i].bad) {
            fprintf(stderr, "thread %d: %d of %d elements wrong\n", i, w[i].bad, THREAD_N);
            test_failures++;
        }
    }
}

/* ---- main ----------------------------------------------------------------------------------- */

int main(void)
{
    gpu_require();
    sanitizer = getenv("SAFECUDA_UNDER_SANITIZER") != NULL;
    if (sanitizer)
        printf("SAFECUDA_UNDER_SANITIZER: n = 2^28 skipped, slow kernels shortened\n");
    /* A fresh cache so this run compiles (and the second load of a source hits). */
    char cache[] = "/tmp/safecuda-test-kernels-cache-XXXXXX";
    REQUIRE(mkdtemp(cache) != NULL);
    REQUIRE(setenv("SAFECUDA_CACHE_DIR", cache, 1) == 0);
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("skipped: %s\n", sc_last_error());
        return TEST_SKIP;
    }
    double t0 = test_now_s();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    REQUIRE(sc_device_info(0, &dev) == SC_OK);
    printf("%s (sm_%d%d), NVRTC %d.%d\n", dev.name, dev.cc_major, dev.cc_minor, major, minor);
    mod = load_source_in(ctx, kernels_src, "kernels.cu", (const char *const[]){"k", "with_struct",
                                                                               NULL});
    TEST_RUN(test_vector_add);
    TEST_RUN(test_launch_mismatches);
    TEST_RUN(test_launch_limits);
    TEST_RUN(test_kernel_info);
    TEST_RUN(test_dynamic_shared);
    TEST_RUN(test_templates);
    TEST_RUN(test_modules);
    TEST_RUN(test_other_context);
    TEST_RUN(test_cross_stream);
    TEST_RUN(test_threads);
    CHECK_OK(sc_module_destroy(mod));
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK_OK(sc_context_check(ctx));
    CHECK_OK(sc_context_destroy(ctx)); /* SC_OK: every object was destroyed */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", cache);
    printf("total %.2f s\n", test_now_s() - t0);
    return test_result("test_gpu_kernels");
}
