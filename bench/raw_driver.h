/* The raw CUDA driver for the benchmarks' baselines (cuLaunchKernel, cuMemcpy*Async,
 * cuGraphLaunch, ... timed beside safecuda's checked calls as the floor).
 *
 * The benchmarks use safecuda through its public API only (include/); the baselines load
 * the driver themselves: raw_driver_load() opens the libcuda that safecuda loaded
 * (sc_driver_path, so the test device under SAFECUDA_DEVICE=test too) and resolves the
 * entry points below with cuGetProcAddress_v2, as the library does. safecuda's streams and
 * buffers reach the raw side through the documented escape hatches sc_stream_cu_handle and
 * sc_buffer_device_ptr; the context is the device's primary context (the one sc_context
 * uses), retained here with cuDevicePrimaryCtxRetain.
 *
 * Only the types and constants these calls need are declared (building needs no CUDA
 * toolkit). Every call goes through the table rd (rd.cuLaunchKernel(...)). */
#ifndef SAFECUDA_BENCH_RAW_DRIVER_H
#define SAFECUDA_BENCH_RAW_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "safecuda.h"

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;

#define CUDA_SUCCESS 0
#define CU_EVENT_DEFAULT 0u
#define CU_EVENT_DISABLE_TIMING 2u
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_MEM_LOCATION_TYPE_DEVICE 1

typedef struct {
    int type;
    int id;
} CUmemLocation;
typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* X(name, CUDA version of the entry point, parameters) */
#define RAW_DRIVER_ENTRIES(X)                                                                  \
    X(cuGetErrorName, 6000, (CUresult e, const char **s))                                      \
    X(cuGetErrorString, 6000, (CUresult e, const char **s))                                    \
    X(cuDeviceGet, 2000, (CUdevice * d, int ordinal))                                          \
    X(cuDevicePrimaryCtxRetain, 7000, (CUcontext * c, CUdevice d))                             \
    X(cuDevicePrimaryCtxRelease, 11000, (CUdevice d))                                          \
    X(cuCtxSetCurrent, 4000, (CUcontext c))                                                    \
    X(cuMemPoolCreate, 11020, (CUmemoryPool * p, const CUmemPoolProps *props))                 \
    X(cuMemPoolDestroy, 11020, (CUmemoryPool p))                                               \
    X(cuMemPoolSetAttribute, 11020, (CUmemoryPool p, int attr, void *v))                       \
    X(cuMemAllocFromPoolAsync, 11020, (CUdeviceptr * p, size_t n, CUmemoryPool pool, CUstream s)) \
    X(cuMemFreeAsync, 11020, (CUdeviceptr p, CUstream s))                                      \
    X(cuMemcpyHtoDAsync, 3020, (CUdeviceptr d, const void *h, size_t n, CUstream s))           \
    X(cuMemcpyDtoHAsync, 3020, (void *h, CUdeviceptr d, size_t n, CUstream s))                 \
    X(cuMemcpyDtoDAsync, 3020, (CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s))         \
    X(cuMemsetD32Async, 3020, (CUdeviceptr d, unsigned v, size_t n, CUstream s))               \
    X(cuStreamSynchronize, 2000, (CUstream s))                                                 \
    X(cuStreamWaitEvent, 3020, (CUstream s, CUevent e, unsigned flags))                        \
    X(cuStreamBeginCapture, 10010, (CUstream s, int mode))                                     \
    X(cuStreamEndCapture, 10000, (CUstream s, CUgraph * g))                                    \
    X(cuEventCreate, 2000, (CUevent * e, unsigned flags))                                      \
    X(cuEventDestroy, 4000, (CUevent e))                                                       \
    X(cuEventRecord, 2000, (CUevent e, CUstream s))                                            \
    X(cuEventSynchronize, 2000, (CUevent e))                                                   \
    X(cuEventElapsedTime, 2000, (float *ms, CUevent a, CUevent b))                             \
    X(cuModuleLoadDataEx, 2010,                                                                \
      (CUmodule * m, const void *image, unsigned n, int *options, void **values))              \
    X(cuModuleUnload, 2000, (CUmodule m))                                                      \
    X(cuModuleGetFunction, 2000, (CUfunction * f, CUmodule m, const char *name))               \
    X(cuGraphDestroy, 10000, (CUgraph g))                                                      \
    X(cuGraphInstantiateWithFlags, 11040, (CUgraphExec * e, CUgraph g, unsigned long long f))  \
    X(cuGraphLaunch, 10000, (CUgraphExec e, CUstream s))                                       \
    X(cuGraphExecDestroy, 10000, (CUgraphExec e))                                              \
    X(cuLaunchKernel, 4000,                                                                    \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,          \
       unsigned bz, unsigned shared, CUstream s, void **params, void **extra))

#define RAW_DRIVER_FIELD(name, version, params) CUresult (*name) params;
typedef struct raw_driver {
    RAW_DRIVER_ENTRIES(RAW_DRIVER_FIELD)
} raw_driver;
#undef RAW_DRIVER_FIELD

/* The entry points; filled by raw_driver_load. */
extern raw_driver rd;

/* Load the driver safecuda loaded and resolve every entry point (after safecuda has found
 * a device: bench_require_gpu). Any failure prints "FAILED: ..." and exits 1. */
void raw_driver_load(void);

/* The primary context of device (the CUcontext behind every sc_context of that device),
 * retained: raw_driver_release_context(device) gives it back. Exits 1 on failure. */
CUcontext raw_driver_primary_context(int device);
void raw_driver_release_context(int device);

/* The CUstream behind an sc_stream (sc_stream_cu_handle; for the context's default stream
 * pass sc_context_default_stream's). Exits 1 on failure. */
CUstream raw_driver_stream(sc_stream stream);

/* The driver's name for r (CUDA_ERROR_...), or "CUresult N" without one. */
const char *raw_driver_error_name(CUresult r);
const char *raw_driver_error_string(CUresult r);

/* Print "FAILED: expr returned NAME" and exit 1. */
void raw_driver_fail(const char *expr, CUresult r, const char *file, int line);

/* Evaluate a CUresult expression (the raw driver baselines); on failure exit 1. */
#define CU_TRY(expr)                                               \
    do {                                                           \
        CUresult cu_try_ = (expr);                                 \
        if (cu_try_ != CUDA_SUCCESS)                               \
            raw_driver_fail(#expr, cu_try_, __FILE__, __LINE__);   \
    } while (0)

#endif
