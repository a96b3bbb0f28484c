/* Borrowed buffers and DLPack on a real GPU. The test stands in for another library: it
 * loads the same libcuda safecuda loaded and allocates, writes and reads "foreign" device
 * memory with the driver itself (cuMemAlloc, cuMemcpyHtoD/DtoH, cuMemFree).
 *
 *   - borrow foreign memory, write and read it through safecuda (copies, and an NVRTC
 *     kernel y = a * x + b whose inputs the driver wrote), compared with a CPU reference on
 *     random data, the outputs poisoned first; a sub-range borrow leaves the rest of the
 *     allocation untouched;
 *   - the refusals on the real driver: past the allocation's end, pinned host memory
 *     (cuMemHostAlloc), pageable memory (malloc), managed memory, a misaligned pointer; a
 *     read-only borrow refused as a kernel output (nothing ran: still poisoned);
 *   - release ordering: a buffer borrowed with an owner stream, written by a slow kernel
 *     on another safecuda stream, destroyed at once: the release runs without a host wait
 *     (the kernel is still running), and the owner stream's later copy sees the kernel's
 *     data (the owner stream was made to wait for it);
 *   - DLPack: export then import (the same device address, the data); an export that
 *     outlives its buffer: the memory is read through the tensor's pointer with the driver
 *     (cuMemcpyDtoH) after sc_buffer_destroy and before the deleter, and freed by it. */
#include <dlfcn.h>
#include <inttypes.h>

#include <math.h>

#include "../test.h"
#include "safecuda/interop.h"

/* Within two float roundings of the double-precision reference, on the scale of the
 * terms (the device computes a * x + b with one fused rounding or two). */
static bool close_to(float got, float want, double scale)
{
    double d = (double)got - (double)want;
    if (d < 0)
        d = -d;
    return d <= 2.5e-7 * scale + 1e-30;
}

static sc_context ctx;
static sc_device_props dev;

/* ---- the foreign library: the driver, called directly -------------------------------------- */

typedef unsigned long long devptr;
static struct {
    int (*mem_alloc)(devptr *p, size_t n);
    int (*mem_free)(devptr p);
    int (*htod)(devptr d, const void *h, size_t n);
    int (*dtoh)(void *h, devptr d, size_t n);
    int (*host_alloc)(void **p, size_t n, unsigned flags);
    int (*free_host)(void *p);
    int (*alloc_managed)(devptr *p, size_t n, unsigned flags);
    int (*ctx_sync)(void);
} drv;

static void *drv_sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p)
        fprintf(stderr, "libcuda has no %s\n", name);
    REQUIRE(p != NULL);
    return p;
}

static void drv_load(void)
{
    char path[1024];
    REQUIRE(sc_driver_path(path, sizeof path) == SC_OK);
    void *h = dlopen(path, RTLD_NOW); /* the library safecuda loaded: the same instance */
    REQUIRE(h != NULL);
#define DRV(field, name) memcpy(&drv.field, &(void *){drv_sym(h, name)}, sizeof(void *))
    DRV(mem_alloc, "cuMemAlloc_v2");
    DRV(mem_free, "cuMemFree_v2");
    DRV(htod, "cuMemcpyHtoD_v2");
    DRV(dtoh, "cuMemcpyDtoH_v2");
    DRV(host_alloc, "cuMemHostAlloc");
    DRV(free_host, "cuMemFreeHost");
    DRV(alloc_managed, "cuMemAllocManaged");
    DRV(ctx_sync, "cuCtxSynchronize");
#undef DRV
}

/* safecuda's calls make the device's primary context current on this thread; the driver
 * calls below run in it (the runtime's context, as another library's would). */
static devptr foreign_alloc(size_t bytes)
{
    CHECK_OK(sc_context_check(ctx)); /* primary context current */
    devptr p = 0;
    REQUIRE(drv.mem_alloc(&p, bytes) == 0 && p != 0);
    return p;
}

static void foreign_free(devptr p)
{
    CHECK_OK(sc_context_check(ctx));
    CHECK(drv.ctx_sync() == 0);
    CHECK(drv.mem_free(p) == 0);
}

static void to_device(devptr d, const void *h, size_t n)
{
    CHECK_OK(sc_context_check(ctx));
    REQUIRE(drv.htod(d, h, n) == 0);
}

static void from_device(void *h, devptr d, size_t n)
{
    CHECK_OK(sc_context_check(ctx));
    REQUIRE(drv.dtoh(h, d, n) == 0);
}

static sc_stream default_stream(void)
{
    sc_stream s = {0};
    REQUIRE(sc_context_default_stream(ctx, &s) == SC_OK);
    return s;
}

/* ---- kernels ------------------------------------------------------------------------------ */

static const char src[] =
    "extern \"C\" __global__ void axpb(const float *x, float *y, float a, float b, unsigned n)\n"
    "{\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        y[i] = a * x[i] + b;\n"
    "}\n"
    "// Spin for `cycles` clock cycles, then y[i] = v + i.\n"
    "extern \"C\" __global__ void slow_fill(float *y, float v, unsigned n, long long cycles)\n"
    "{\n"
    "    long long t0 = clock64();\n"
    "    while (clock64() - t0 < cycles) {\n"
    "    }\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        y[i] = v + (float)i;\n"
    "}\n";

static sc_kernel k_axpb, k_slow;
static sc_module mod;

static void load_kernels(void)
{
    sc_program p = {0};
    sc_status s = sc_program_create(ctx, &(sc_program_desc){.source = src, .name = "interop.cu"},
                                    &p);
    if (s != SC_OK)
        fprintf(stderr, "compiling: %s\n", sc_last_error());
    REQUIRE(s == SC_OK);
    REQUIRE(sc_module_load(ctx, p, &mod) == SC_OK);
    CHECK_OK(sc_program_destroy(p));
    REQUIRE(sc_kernel_get(mod, "axpb", &k_axpb) == SC_OK);
    REQUIRE(sc_kernel_get(mod, "slow_fill", &k_slow) == SC_OK);
}

static void fill_random_floats(float *v, size_t n, uint64_t seed)
{
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++)
        v[i] = (float)((test_rand(&st) >> 40) % 20001) / 1000.0f - 10.0f;
}

/* ---- tests -------------------------------------------------------------------------------- */

static int release_calls;
static void count_release(void *user)
{
    (void)user;
    __atomic_add_fetch(&release_calls, 1, __ATOMIC_SEQ_CST);
}

static void test_borrow_data(void)
{
    enum { N = 1 << 20 };
    float *x = test_xmalloc(N * sizeof(float));
    float *y = test_xmalloc(N * sizeof(float));
    float *ref = test_xmalloc(N * sizeof(float));
    fill_random_floats(x, N, 11);
    const devptr dx = foreign_alloc(N * sizeof(float));
    const devptr dy = foreign_alloc(N * sizeof(float));
    to_device(dx, x, N * sizeof(float));
    memset(y, 0xff, N * sizeof(float)); /* poison: NaNs */
    to_device(dy, y, N * sizeof(float));

    release_calls = 0;
    sc_buffer bx, by;
    CHECK_OK(sc_buffer_borrow(ctx, dx,
                              &(sc_borrow_desc){.dtype = SC_F32, .count = N, .label = "x",
                                                .read_only = true, .release = count_release},
                              &bx));
    CHECK_OK(sc_buffer_borrow(ctx, dy,
                              &(sc_borrow_desc){.dtype = SC_F32, .count = N, .label = "y",
                                                .release = count_release},
                              &by));
    sc_launch_desc cfg;
    CHECK_OK(sc_launch_config_for(N, k_axpb, &cfg));
    const float a = 1.5f, b = -0.25f;
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k_axpb, &cfg, sc_arg_in(sc_view_of(bx)),
                       sc_arg_out(sc_view_of(by)), sc_arg_f32(a), sc_arg_f32(b),
                       sc_arg_u32(N)));
    for (int i = 0; i < N; i++)
        ref[i] = (float)((double)a * x[i] + b); /* the device may fuse it (one rounding) */
    /* Read back through safecuda, then with the driver after the destroy (which waits on
     * the host: no owner stream was given). */
    memset(y, 0, N * sizeof(float));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, y, N * sizeof(float), sc_view_of(by)));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += !close_to(y[i], ref[i], fabs((double)a * x[i]) + fabs((double)b));
    CHECK(bad == 0);
    /* A copy from the read-only input into an owned buffer, and back out. */
    sc_buffer own;
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N}, &own));
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, sc_view_of(own), sc_view_of(bx)));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, y, N * sizeof(float), sc_view_of(own)));
    CHECK(memcmp(y, x, N * sizeof(float)) == 0);
    /* The read-only input refused as an output: nothing runs. */
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, k_axpb, &cfg, sc_arg_in(sc_view_of(by)),
                           sc_arg_out(sc_view_of(bx)), sc_arg_f32(a), sc_arg_f32(b),
                           sc_arg_u32(N)),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("read-only");
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, sc_view_of(bx), sc_view_of(own)),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_OK(sc_buffer_destroy(own));
    CHECK_OK(sc_buffer_destroy(by));
    CHECK_OK(sc_buffer_destroy(bx));
    CHECK(release_calls == 2);
    from_device(y, dy, N * sizeof(float));
    bad = 0;
    for (int i = 0; i < N; i++)
        bad += !close_to(y[i], ref[i], fabs((double)a * x[i]) + fabs((double)b));
    CHECK(bad == 0);
    from_device(y, dx, N * sizeof(float));
    CHECK(memcmp(y, x, N * sizeof(float)) == 0); /* the read-only input was never written */

    /* A sub-range: elements [1000, 3000) written through safecuda, the rest untouched. */
    memset(y, 0xff, N * sizeof(float));
    to_device(dy, y, N * sizeof(float));
    sc_buffer sub;
    CHECK_OK(sc_buffer_borrow(ctx, dy + 1000 * sizeof(float),
                              &(sc_borrow_desc){.dtype = SC_F32, .count = 2000, .label = "sub"},
                              &sub));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(sub), x, 2000 * sizeof(float)));
    CHECK_OK(sc_buffer_destroy(sub));
    from_device(y, dy, N * sizeof(float));
    CHECK(memcmp(y + 1000, x, 2000 * sizeof(float)) == 0);
    uint32_t w0, w1;
    memcpy(&w0, &y[999], 4);
    memcpy(&w1, &y[3000], 4);
    CHECK(w0 == 0xffffffffu && w1 == 0xffffffffu);

    foreign_free(dx);
    foreign_free(dy);
    free(x);
    free(y);
    free(ref);
}

static void test_refusals(void)
{
    release_calls = 0;
    sc_buffer b = {0};
    const devptr d = foreign_alloc(4096);
    sc_borrow_desc desc = {.dtype = SC_F32, .count = 1025, .label = "r",
                           .release = count_release};
    CHECK_STATUS(sc_buffer_borrow(ctx, d, &desc, &b), SC_ERR_OUT_OF_BOUNDS);
    CHECK_MSG("past the end of its allocation");
    desc.count = 1024;
    CHECK_OK(sc_buffer_borrow(ctx, d, &desc, &b)); /* exactly the allocation */
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(release_calls == 1);
    release_calls = 0;
    desc.count = 16;
    CHECK_STATUS(sc_buffer_borrow(ctx, d + 4096 - 32, &(sc_borrow_desc){.dtype = SC_F64,
                                                                       .count = 5}, &b),
                 SC_ERR_OUT_OF_BOUNDS);
    CHECK_STATUS(sc_buffer_borrow(ctx, d + 2, &desc, &b), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("not aligned");
    void *pinned = NULL;
    REQUIRE(drv.host_alloc(&pinned, 4096, 0) == 0);
    CHECK_STATUS(sc_buffer_borrow(ctx, (uint64_t)(uintptr_t)pinned, &desc, &b),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("host memory");
    CHECK(drv.free_host(pinned) == 0);
    float *pageable = test_xmalloc(4096);
    CHECK_STATUS(sc_buffer_borrow(ctx, (uint64_t)(uintptr_t)pageable, &desc, &b),
                 SC_ERR_INVALID_ARGUMENT);
    printf("  a malloc'd pointer: %s\n", sc_last_error());
    free(pageable);
    devptr managed = 0;
    if (drv.alloc_managed(&managed, 4096, 1 /* CU_MEM_ATTACH_GLOBAL */) == 0) {
        CHECK_STATUS(sc_buffer_borrow(ctx, managed, &desc, &b), SC_ERR_INVALID_ARGUMENT);
        CHECK_MSG("managed");
        foreign_free(managed);
    } else {
        printf("  (no managed memory here: that refusal not checked)\n");
    }
    CHECK(release_calls == 0);
    CHECK(b.id == 0);
    foreign_free(d);
}

/* The release is ordered before the owner's stream, not waited for on the host. */
static void test_release_order(void)
{
    enum { N = 4096 };
    float *h = test_xmalloc(N * sizeof(float));
    memset(h, 0xff, N * sizeof(float));
    const devptr d = foreign_alloc(N * sizeof(float));
    to_device(d, h, N * sizeof(float));
    sc_stream owner, worker;
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "owner"}, &owner));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "worker"}, &worker));
    release_calls = 0;
    sc_buffer b;
    CHECK_OK(sc_buffer_borrow(ctx, d,
                              &(sc_borrow_desc){.dtype = SC_F32, .count = N, .label = "owned",
                                                .stream = owner, .release = count_release},
                              &b));
    /* ~300 ms of spinning at the SM clock. */
    const long long cycles = (long long)dev.clock_khz * 300;
    sc_launch_desc cfg = {.grid = {N / 256, 1, 1}, .block = {256, 1, 1}};
    CHECK_OK(SC_LAUNCH(worker, k_slow, &cfg, sc_arg_out(sc_view_of(b)), sc_arg_f32(5.0f),
                       sc_arg_u32(N), sc_arg_i64(cycles)));
    const double t0 = test_now_s();
    CHECK_OK(sc_buffer_destroy(b));
    const double waited = test_now_s() - t0;
    CHECK(release_calls == 1);
    /* No host wait: the kernel is still running. */
    CHECK_STATUS(sc_stream_query(worker), SC_ERR_NOT_READY);
    printf("  destroy returned after %.1f ms, the kernel still running\n", waited * 1e3);
    /* The owner's next use of the memory on its stream sees the kernel's writes. */
    CHECK_OK(sc_buffer_borrow(ctx, d,
                              &(sc_borrow_desc){.dtype = SC_F32, .count = N, .label = "again",
                                                .stream = owner},
                              &b));
    CHECK_OK(sc_copy_to_host(owner, h, N * sizeof(float), sc_view_of(b)));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += h[i] != 5.0f + (float)i;
    CHECK(bad == 0);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_stream_destroy(owner));
    CHECK_OK(sc_stream_destroy(worker));
    foreign_free(d);
    free(h);
}

static void test_dlpack(void)
{
    enum { N = 1 << 16 };
    float *data = test_xmalloc(N * sizeof(float));
    float *back = test_xmalloc(N * sizeof(float));
    fill_random_floats(data, N, 99);
    sc_buffer b;
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N,
                                                     .label = "exported"},
                              &b));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), data, N * sizeof(float)));
    uint64_t base = 0;
    CHECK_OK(sc_buffer_device_ptr(b, &base));

    /* Round trip: export a view, import it, the same address and data. */
    sc_view v;
    CHECK_OK(sc_buffer_view(b, 256, N - 512, &v));
    DLManagedTensorVersioned *t = NULL;
    CHECK_OK(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.ndim = 2,
                                                          .shape = {(N - 512) / 64, 64}},
                               &t));
    REQUIRE(t != NULL);
    CHECK((uint64_t)(uintptr_t)t->dl_tensor.data == base + 256 * sizeof(float));
    CHECK(t->dl_tensor.device.device_type == kDLCUDA && t->dl_tensor.device.device_id == 0);
    sc_buffer imp;
    CHECK_OK(sc_buffer_from_dlpack(ctx, t, &(sc_dlpack_import_desc){.label = "imported"}, &imp));
    uint64_t ip = 0;
    CHECK_OK(sc_buffer_device_ptr(imp, &ip));
    CHECK(ip == base + 256 * sizeof(float));
    memset(back, 0, N * sizeof(float));
    CHECK_OK(sc_copy_to_host(default_stream(), back, (N - 512) * sizeof(float),
                             sc_view_of(imp)));
    CHECK(memcmp(back, data + 256, (N - 512) * sizeof(float)) == 0);
    /* A kernel through the import writes the original's memory. */
    sc_launch_desc cfg;
    CHECK_OK(sc_launch_config_for(N - 512, k_axpb, &cfg));
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k_axpb, &cfg, sc_arg_in(sc_view_of(imp)),
                       sc_arg_out(sc_view_of(imp)), sc_arg_f32(2.0f), sc_arg_f32(1.0f),
                       sc_arg_u32(N - 512)));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, N * sizeof(float), sc_view_of(b)));
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const float want = i < 256 || i >= N - 256 ? data[i] : 2.0f * data[i] + 1.0f;
        bad += back[i] != want;
    }
    CHECK(bad == 0);
    CHECK_OK(sc_buffer_destroy(imp)); /* its release runs the export's deleter */
    sc_buffer_origin o;
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.exports == 0);

    /* An export that outlives its buffer: read through the tensor with the driver. */
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), data, N * sizeof(float)));
    sc_memory_stats m0;
    CHECK_OK(sc_context_memory(ctx, &m0));
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), NULL, &t)); /* the host waits for the copy */
    CHECK_OK(sc_buffer_destroy(b));
    sc_memory_stats m1;
    CHECK_OK(sc_context_memory(ctx, &m1));
    CHECK(m1.bytes_in_use == m0.bytes_in_use); /* still allocated */
    memset(back, 0, N * sizeof(float));
    from_device(back, (devptr)(uintptr_t)t->dl_tensor.data, N * sizeof(float));
    CHECK(memcmp(back, data, N * sizeof(float)) == 0);
    t->deleter(t);
    CHECK_OK(sc_context_memory(ctx, &m1));
    CHECK(m1.bytes_in_use == m0.bytes_in_use - N * sizeof(float));
    free(data);
    free(back);
}

int main(void)
{
    gpu_require();
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("test_gpu_interop: skipped: %s\n", sc_last_error());
        return TEST_SKIP;
    }
    REQUIRE(sc_device_info(0, &dev) == SC_OK);
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    drv_load();
    load_kernels();
    test_borrow_data();
    test_refusals();
    test_release_order();
    test_dlpack();
    CHECK_OK(sc_module_destroy(mod));
    CHECK_OK(sc_context_destroy(ctx));
    return test_result("test_gpu_interop");
}
