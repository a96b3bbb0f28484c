/* The test device itself (no safecuda involved): every SCI_CU_FUNCS name resolves through
 * cuGetProcAddress_v2 and nothing else does, the error tables are complete, host-memory
 * "device" copies move bytes, and every kind of misuse is both refused and counted, so
 * a zero misuse count in the other tests means something; with two devices
 * (test_td_driver_2dev), each device's own context.
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <dlfcn.h>
#include <stdint.h>

#include "../test.h"
#include "driver/cuda_api.h"
#include "td_ptx.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, int *);
static get_proc_fn get_proc;
static int (*misuse)(void);
static const char *(*last_misuse)(void);

/* The test device's message for its last refusal is want. */
#define EXPECT_MISUSE(want)                                                               \
    do {                                                                                  \
        if (strcmp(last_misuse(), (want)) != 0) {                                         \
            fprintf(stderr, "%s:%d: misuse message\n  got:  %s\n  want: %s\n", __FILE__,    \
                    __LINE__, last_misuse(), (want));                                     \
            test_failures++;                                                              \
        }                                                                                 \
    } while (0)

/* The table, resolved as safecuda resolves it. */
#define ROW_FIELD(name, ver, req, params, args) CUresult (*name) params;
static struct { SCI_CU_FUNCS(ROW_FIELD) } cu;
#undef ROW_FIELD

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "missing export %s\n", name);
        exit(1);
    }
    return p;
}

/* Expect r and exactly `count` new misuses. */
#define EXPECT(expr, want_r, new_misuse)                                                  \
    do {                                                                                  \
        int m0_ = misuse();                                                               \
        CUresult r_ = (expr);                                                             \
        if (r_ != (want_r) || misuse() - m0_ != (new_misuse)) {                           \
            fprintf(stderr, "%s:%d: %s = %d with %d new misuses; expected %d and %d\n",   \
                    __FILE__, __LINE__, #expr, (int)r_, misuse() - m0_, (int)(want_r),    \
                    (int)(new_misuse));                                                   \
            test_failures++;                                                              \
        }                                                                                 \
    } while (0)

/* Two devices (test_td_driver_2dev): each its primary context; streams, events, modules and
 * allocations belong to the context current when they were made; an event recorded on a
 * stream of another context, a kernel launched on one, or a kernel of a module of another
 * context is refused and counted (CUDA_ERROR_INVALID_HANDLE, as CUDA). */
static void test_contexts(long (*live_device)(void))
{
    CUcontext c0 = NULL, c1 = NULL, got = NULL;
    EXPECT(cu.cuDevicePrimaryCtxRetain(&c0, 0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuDevicePrimaryCtxRetain(&c1, 1), CUDA_SUCCESS, 0);
    CHECK(c0 && c1 && c0 != c1);
    CUstream s0 = NULL, s1 = NULL;
    CUevent e0 = NULL, e1 = NULL;
    CUdeviceptr p0 = 0, p1 = 0;
    EXPECT(cu.cuCtxSetCurrent(c0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamCreateWithPriority(&s0, 0, 0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventCreate(&e0, 0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemAlloc(&p0, 256), CUDA_SUCCESS, 0);
    EXPECT(cu.cuCtxSetCurrent(c1), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamCreateWithPriority(&s1, 0, 0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventCreate(&e1, 0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemAlloc(&p1, 256), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamGetCtx(s0, &got), CUDA_SUCCESS, 0);
    CHECK(got == c0);
    EXPECT(cu.cuStreamGetCtx(s1, &got), CUDA_SUCCESS, 0);
    CHECK(got == c1);
    EXPECT(cu.cuStreamGetCtx(NULL, &got), CUDA_SUCCESS, 0); /* the current one's */
    CHECK(got == c1);
    /* events: on a stream of their own context (whichever is current), nowhere else */
    EXPECT(cu.cuEventRecord(e0, s0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventRecord(e1, s1), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE, 1);
    EXPECT_MISUSE("cuEventRecord: an event of device 0's context recorded on a stream of "
                  "device 1's");
    EXPECT(cu.cuEventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE, 1);
    EXPECT(cu.cuEventRecord(e0, NULL), CUDA_ERROR_INVALID_HANDLE, 1); /* c1 current */
    EXPECT(cu.cuEventRecord(e1, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamWaitEvent(s1, e0, 0), CUDA_SUCCESS, 0); /* waits may cross */
    /* kernels: of a module loaded in the current context, on a stream of it */
    CUmodule m0 = NULL;
    CUfunction add0 = NULL;
    uint64_t a0 = 0, a1 = 0;
    uint32_t a2 = 0;
    void *params[] = {&a0, &a1, &a2};
    EXPECT(cu.cuCtxSetCurrent(c0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuModuleLoadDataEx(&m0, fake_test_ptx, 0, NULL, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuModuleGetFunction(&add0, m0, "add"), CUDA_SUCCESS, 0);
    EXPECT(cu.cuLaunchKernel(add0, 1, 1, 1, 128, 1, 1, 0, s0, params, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuLaunchKernel(add0, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuLaunchKernel(add0, 1, 1, 1, 128, 1, 1, 0, s1, params, NULL),
           CUDA_ERROR_INVALID_HANDLE, 1); /* device 1's stream */
    EXPECT_MISUSE("cuLaunchKernel: a kernel launched on a stream of device 1's context while "
                  "device 0's is current");
    EXPECT(cu.cuCtxSetCurrent(c1), CUDA_SUCCESS, 0);
    EXPECT(cu.cuLaunchKernel(add0, 1, 1, 1, 128, 1, 1, 0, s1, params, NULL),
           CUDA_ERROR_INVALID_HANDLE, 1); /* device 0's module */
    EXPECT_MISUSE("cuLaunchKernel: a kernel of a module loaded in device 0's context launched "
                  "while device 1's is current");
    EXPECT(cu.cuLaunchKernel(add0, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL),
           CUDA_ERROR_INVALID_HANDLE, 1);
    EXPECT(cu.cuModuleUnload(m0), CUDA_SUCCESS, 0);
    /* allocations: their context and device */
    int ordinal = -1;
    EXPECT(cu.cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_CONTEXT, p1), CUDA_SUCCESS, 0);
    CHECK(got == c1);
    EXPECT(cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p1),
           CUDA_SUCCESS, 0);
    CHECK(ordinal == 1);
    EXPECT(cu.cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_CONTEXT, p0), CUDA_SUCCESS, 0);
    CHECK(got == c0);
    EXPECT(cu.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p0),
           CUDA_SUCCESS, 0);
    CHECK(ordinal == 0);
    EXPECT(cu.cuMemFree(p0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemFree(p1), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventDestroy(e0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventDestroy(e1), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamDestroy(s0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamDestroy(s1), CUDA_SUCCESS, 0);
    /* each device's primary context counts its own retains */
    unsigned flags = 0;
    int active = 0;
    EXPECT(cu.cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS, 0);
    EXPECT(cu.cuDevicePrimaryCtxGetState(1, &flags, &active), CUDA_SUCCESS, 0);
    CHECK(!active);
    EXPECT(cu.cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS, 0);
    CHECK(active);
    EXPECT(cu.cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT, 1);
    EXPECT(cu.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuCtxSetCurrent(NULL), CUDA_SUCCESS, 0);
    CHECK(live_device() == 0);
}

int main(void)
{
    const char *path = getenv("SAFECUDA_LIBCUDA");
    REQUIRE(path && path[0]);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    REQUIRE(h != NULL);
    CUresult (*init)(unsigned) = NULL;
    *(void **)&init = sym(h, "cuInit");
    *(void **)&get_proc = sym(h, "cuGetProcAddress_v2");
    *(void **)&misuse = sym(h, "safecuda_testdevice_misuse_count");
    *(void **)&last_misuse = sym(h, "safecuda_testdevice_last_misuse");
    sym(h, "cuDriverGetVersion");
    sym(h, "cuGetErrorName");
    sym(h, "cuGetErrorString");
    const char *counters[] = {"safecuda_testdevice_live_device_allocations",
                              "safecuda_testdevice_live_host_allocations", "safecuda_testdevice_live_streams",
                              "safecuda_testdevice_live_events", "safecuda_testdevice_live_modules",
                              "safecuda_testdevice_live_graphs",
                              "safecuda_testdevice_live_graph_execs",
                              "safecuda_testdevice_active_captures"};
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        sym(h, counters[i]);
    long (*live_device)(void) = NULL;
    *(void **)&live_device = sym(h, "safecuda_testdevice_live_device_allocations");

    /* Every row resolves, by its exact name; anything else is "symbol not found". */
    int status = -1;
#define RESOLVE(name, ver, req, params, args)                                              \
    status = -1;                                                                           \
    if (get_proc(#name, (void **)&cu.name, ver, 0, &status) != CUDA_SUCCESS || !cu.name || \
        status != 0) {                                                                     \
        fprintf(stderr, "%s does not resolve (status %d)\n", #name, status);               \
        test_failures++;                                                                   \
    }
    SCI_CU_FUNCS(RESOLVE)
#undef RESOLVE
    const char *unknown[] = {"cuMemAlloc_v2", "cumemalloc", "cuMemAllo", "cuInitX", "",
                             "cuGetProcAddress"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        void *fn = (void *)1;
        status = -1;
        CHECK(get_proc(unknown[i], &fn, 13000, 0, &status) != CUDA_SUCCESS);
        CHECK(fn == NULL && status == 1);
    }
    void *fn = NULL;
    status = -1; /* an ABI older than the entry point: version not sufficient */
    CHECK(get_proc("cuMemAllocFromPoolAsync", &fn, 11000, 0, &status) != CUDA_SUCCESS);
    CHECK(fn == NULL && status == 2);

    /* Error names and strings for every code safecuda knows (the shared list). */
#define ERROR_ROW(code, value, text)                                                      \
    {                                                                                     \
        const char *name = NULL, *str = NULL;                                             \
        CHECK(cu.cuGetErrorName(code, &name) == CUDA_SUCCESS && name &&                   \
              strcmp(name, #code) == 0);                                                  \
        CHECK(cu.cuGetErrorString(code, &str) == CUDA_SUCCESS && str && str[0]);          \
    }
    SCI_CU_ERRORS(ERROR_ROW)
#undef ERROR_ROW
    const char *none = "x";
    CHECK(cu.cuGetErrorName((CUresult)12345, &none) == CUDA_ERROR_INVALID_VALUE && !none);

    /* Before cuInit: refused and counted. */
    int n = 0;
    EXPECT(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED, 1);
    CHECK(init(0) == CUDA_SUCCESS);
    EXPECT(cu.cuDeviceGetCount(&n), CUDA_SUCCESS, 0);
    const char *devices = getenv("SAFECUDA_TESTDEVICE_DEVICES");
    CHECK(n == (devices ? atoi(devices) : 1));
    int v = 0;
    EXPECT(cu.cuDriverGetVersion(&v), CUDA_SUCCESS, 0);
    CHECK(v == 13000);

    /* No current context: refused and counted. */
    CUdeviceptr p = 0;
    EXPECT(cu.cuMemAlloc(&p, 64), CUDA_ERROR_INVALID_CONTEXT, 1);
    CUcontext ctx = NULL;
    EXPECT(cu.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuCtxSetCurrent(ctx), CUDA_SUCCESS, 0);
    EXPECT(cu.cuCtxSetCurrent((CUcontext)(uintptr_t)0x1234), CUDA_ERROR_INVALID_CONTEXT, 1);

    /* Memory: ranges inside one live allocation only. */
    EXPECT(cu.cuMemAlloc(&p, 1000), CUDA_SUCCESS, 0);
    CHECK(p % 256 == 0);
    CHECK(live_device() == 1);
    unsigned char in[1000], out[1000];
    for (int i = 0; i < 1000; i++)
        in[i] = (unsigned char)(i * 7);
    EXPECT(cu.cuMemcpyHtoDAsync(p, in, 1000, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemcpyDtoHAsync(out, p, 1000, NULL), CUDA_SUCCESS, 0);
    CHECK(memcmp(in, out, 1000) == 0);
    EXPECT(cu.cuMemcpyHtoDAsync(p + 1, in, 1000, NULL), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemcpyDtoHAsync(out, p - 1, 2, NULL), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemcpyDtoDAsync(p, p + 500, 500, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemcpyDtoDAsync(p, p + 100, 500, NULL), CUDA_ERROR_INVALID_VALUE, 1); /* overlap */
    EXPECT(cu.cuMemsetD32Async(p + 2, 0, 4, NULL), CUDA_ERROR_INVALID_VALUE, 1); /* alignment */
    EXPECT(cu.cuMemsetD32Async(p, 0xffffffffu, 250, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemsetD32Async(p, 0, 251, NULL), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemsetD2D32Async(p, 8, 7, 1, 125, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemsetD2D32Async(p + 4, 8, 7, 1, 125, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemsetD2D32Async(p + 8, 8, 7, 1, 125, NULL), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemsetD16Async(p, 0x1234, 500, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemsetD8Async(p + 999, 1, 1, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemsetD8Async(p + 1000, 1, 1, NULL), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemFree(p + 16), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemFree(p), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemFree(p), CUDA_ERROR_INVALID_VALUE, 1); /* double free */
    EXPECT(cu.cuMemcpyHtoDAsync(p, in, 1, NULL), CUDA_ERROR_INVALID_VALUE, 1); /* freed */
    CHECK(live_device() == 0);
    size_t free_b = 0, total_b = 0;
    EXPECT(cu.cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS, 0);
    CHECK(total_b == 64ull << 20 && free_b == total_b); /* SAFECUDA_TESTDEVICE_MEMORY_MB=64 */
    EXPECT(cu.cuMemAlloc(&p, 65ull << 20), CUDA_ERROR_OUT_OF_MEMORY, 0);

    /* Pinned host memory and pointer attributes. */
    void *host = NULL;
    EXPECT(cu.cuMemHostAlloc(&host, 100, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS, 0);
    unsigned type = 0;
    const int MT = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    EXPECT(cu.cuPointerGetAttribute(&type, MT, (CUdeviceptr)(uintptr_t)host + 50), CUDA_SUCCESS,
           0);
    CHECK(type == CU_MEMORYTYPE_HOST);
    EXPECT(cu.cuPointerGetAttribute(&type, MT, (CUdeviceptr)(uintptr_t)in),
           CUDA_ERROR_INVALID_VALUE, 0);
    EXPECT(cu.cuMemAlloc(&p, 64), CUDA_SUCCESS, 0);
    EXPECT(cu.cuPointerGetAttribute(&type, MT, p), CUDA_SUCCESS, 0);
    CHECK(type == 2);
    EXPECT(cu.cuMemcpyDtoHAsync((char *)host + 90, p, 20, NULL), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemcpyDtoHAsync((void *)(uintptr_t)p, p, 20, NULL), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemFreeHost((char *)host + 1), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemFreeHost(host), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemFree(p), CUDA_SUCCESS, 0);

    /* Pools: cached memory until trimmed or released past the threshold. */
    CUmemPoolProps props = {0};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemoryPool pool = NULL;
    EXPECT(cu.cuMemPoolCreate(&pool, &props), CUDA_SUCCESS, 0);
    cuuint64_t keep = UINT64_MAX, got = 0;
    EXPECT(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep),
           CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemAllocFromPoolAsync(&p, 4096, pool, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &got), CUDA_SUCCESS, 0);
    CHECK(got == 4096);
    EXPECT(cu.cuMemFreeAsync(p, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuCtxSynchronize(), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &got),
           CUDA_SUCCESS, 0);
    CHECK(got == 4096);
    EXPECT(cu.cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &got),
           CUDA_SUCCESS, 0);
    CHECK(got == 0);
    EXPECT(cu.cuMemAllocFromPoolAsync(&p, 0, pool, NULL), CUDA_ERROR_INVALID_VALUE, 1);
    EXPECT(cu.cuMemPoolDestroy(pool), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemPoolTrimTo(pool, 0), CUDA_ERROR_INVALID_VALUE, 1);

    /* Streams and events. */
    CUstream s = NULL;
    EXPECT(cu.cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -3), CUDA_SUCCESS, 0);
    CUevent e1 = NULL, e2 = NULL;
    EXPECT(cu.cuEventCreate(&e1, CU_EVENT_DEFAULT), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS, 0);
    float ms = 0;
    EXPECT(cu.cuEventElapsedTime(&ms, e1, e1), CUDA_ERROR_INVALID_HANDLE, 1); /* not recorded */
    EXPECT(cu.cuEventRecord(e1, s), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventElapsedTime(&ms, e1, e1), CUDA_SUCCESS, 0);
    CHECK(ms == 0.001f);
    EXPECT(cu.cuEventRecord(e2, s), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventElapsedTime(&ms, e1, e2), CUDA_ERROR_INVALID_HANDLE, 1); /* no timing */
    EXPECT(cu.cuStreamWaitEvent(s, e1, 0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuEventDestroy(e1), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamWaitEvent(s, e1, 0), CUDA_ERROR_INVALID_HANDLE, 1);
    EXPECT(cu.cuEventDestroy(e1), CUDA_ERROR_INVALID_HANDLE, 1);
    EXPECT(cu.cuEventDestroy(e2), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamDestroy(s), CUDA_SUCCESS, 0);
    EXPECT(cu.cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE, 1);
    EXPECT(cu.cuStreamSynchronize(NULL), CUDA_SUCCESS, 0);

    /* Modules from PTX: parameters, attributes, launches. */
    CUmodule m = NULL;
    unsigned char elf[16] = {0x7f, 'E', 'L', 'F'};
    EXPECT(cu.cuModuleLoadDataEx(&m, elf, 0, NULL, NULL), CUDA_ERROR_INVALID_IMAGE, 0);
    EXPECT(cu.cuModuleLoadDataEx(&m, "hello", 0, NULL, NULL), CUDA_ERROR_INVALID_IMAGE, 0);
    EXPECT(cu.cuModuleLoadDataEx(&m, fake_test_ptx, 0, NULL, NULL), CUDA_SUCCESS, 0);
    unsigned count = 0;
    EXPECT(cu.cuModuleGetFunctionCount(&count, m), CUDA_SUCCESS, 0);
    CHECK(count == 3);
    CUfunction add = NULL, pack = NULL, tiled = NULL, none_fn = NULL;
    EXPECT(cu.cuModuleGetFunction(&add, m, "add"), CUDA_SUCCESS, 0);
    EXPECT(cu.cuModuleGetFunction(&pack, m, "pack"), CUDA_SUCCESS, 0);
    EXPECT(cu.cuModuleGetFunction(&tiled, m, "tiled"), CUDA_SUCCESS, 0);
    EXPECT(cu.cuModuleGetFunction(&none_fn, m, "ad"), CUDA_ERROR_NOT_FOUND, 0);
    size_t off = 99, size = 99;
    EXPECT(cu.cuFuncGetParamInfo(add, 0, &off, &size), CUDA_SUCCESS, 0);
    CHECK(off == 0 && size == 8);
    EXPECT(cu.cuFuncGetParamInfo(add, 2, &off, &size), CUDA_SUCCESS, 0);
    CHECK(off == 16 && size == 4);
    EXPECT(cu.cuFuncGetParamInfo(add, 3, &off, &size), CUDA_ERROR_INVALID_VALUE, 0);
    EXPECT(cu.cuFuncGetParamInfo(pack, 0, &off, &size), CUDA_SUCCESS, 0);
    CHECK(off == 0 && size == 16);
    EXPECT(cu.cuFuncGetParamInfo(pack, 1, &off, &size), CUDA_SUCCESS, 0);
    CHECK(off == 16 && size == 8);
    EXPECT(cu.cuFuncGetParamInfo(tiled, 0, &off, &size), CUDA_ERROR_INVALID_VALUE, 0);
    int attr = 0;
    EXPECT(cu.cuFuncGetAttribute(&attr, CU_FUNC_ATTRIBUTE_NUM_REGS, add), CUDA_SUCCESS, 0);
    CHECK(attr == 16);
    EXPECT(cu.cuFuncGetAttribute(&attr, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, tiled),
           CUDA_SUCCESS, 0);
    CHECK(attr == 256);
    EXPECT(cu.cuFuncGetAttribute(&attr, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, tiled),
           CUDA_SUCCESS, 0);
    CHECK(attr == 1024);
    const char *fname = NULL;
    EXPECT(cu.cuFuncGetName(&fname, pack), CUDA_SUCCESS, 0);
    CHECK(fname && strcmp(fname, "pack") == 0);
    uint64_t a0 = 0, a1 = 0;
    uint32_t a2 = 0;
    void *params[] = {&a0, &a1, &a2};
    EXPECT(cu.cuLaunchKernel(add, 1, 1, 1, 128, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS, 0);
    const CUresult INVAL = CUDA_ERROR_INVALID_VALUE;
    EXPECT(cu.cuLaunchKernel(add, 1, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL), INVAL, 1);
    EXPECT(cu.cuLaunchKernel(add, 0, 1, 1, 128, 1, 1, 0, NULL, params, NULL), INVAL, 1);
    EXPECT(cu.cuLaunchKernel(add, 1, 1, 1, 2048, 1, 1, 0, NULL, params, NULL), INVAL, 1);
    EXPECT(cu.cuLaunchKernel(tiled, 1, 1, 1, 512, 1, 1, 0, NULL, NULL, NULL), INVAL, 1);
    EXPECT(cu.cuLaunchKernel(tiled, 1, 1, 1, 256, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS, 0);
    EXPECT(cu.cuFuncSetAttribute(add, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 300 << 10),
           CUDA_ERROR_INVALID_VALUE, 1);
    int blocks = 0, grid = 0, block = 0;
    EXPECT(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, add, 256, 0), CUDA_SUCCESS, 0);
    CHECK(blocks == 8);
    EXPECT(cu.cuOccupancyMaxPotentialBlockSize(&grid, &block, add, NULL, 0, 0), CUDA_SUCCESS, 0);
    CHECK(block > 0 && block <= 1024 && grid > 0);
    EXPECT(cu.cuModuleUnload(m), CUDA_SUCCESS, 0);
    EXPECT(cu.cuLaunchKernel(tiled, 1, 1, 1, 256, 1, 1, 0, NULL, NULL, NULL),
           CUDA_ERROR_INVALID_HANDLE, 1);
    EXPECT(cu.cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE, 1);

    /* The primary context: releases past zero are misuse; a context released to zero
     * can't be used. */
    EXPECT(cu.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS, 0);
    EXPECT(cu.cuMemAlloc(&p, 64), CUDA_ERROR_INVALID_CONTEXT, 1);
    EXPECT(cu.cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT, 1);
    EXPECT(cu.cuCtxSetCurrent(NULL), CUDA_SUCCESS, 0);
    CHECK(live_device() == 0);
    if (n >= 2)
        test_contexts(live_device);
    return test_result("test_td_driver");
}
