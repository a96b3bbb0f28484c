/* Own declarations of the parts of the CUDA driver API and NVRTC that safecuda uses.
 *
 * No toolkit header is needed to build safecuda: the types, constants and function
 * signatures below follow the CUDA 12.4 ABI, and every driver entry point is resolved at
 * run time through cuGetProcAddress with the version named in its table row, so the driver
 * hands back the variant (_v2, _v3, ...) whose ABI matches these declarations.
 *
 * Only src/driver/ includes this file's function tables; the rest of the library calls
 * the sci_cu_* / sci_nvrtc_* wrappers declared at the end (one per entry point), which
 * count calls and carry the fault-injection hook used by the reliability tests. */
#ifndef SAFECUDA_DRIVER_CUDA_API_H
#define SAFECUDA_DRIVER_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "driver/cu_errors.h"

/* ---- driver types ------------------------------------------------------------------ */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
typedef void (*CUhostFn)(void *user);
typedef size_t (*CUoccupancyB2DSize)(int block_size);

/* Every code of cu_errors.h (one list: the names and texts are made from it too). */
#define SCI_CU_ERROR_ENUM(name, value, text) name = value,
typedef enum { SCI_CU_ERRORS(SCI_CU_ERROR_ENUM) } CUresult;
#undef SCI_CU_ERROR_ENUM

typedef enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
    CU_DEVICE_ATTRIBUTE_ECC_ENABLED = 32,
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81,
    CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82,
    CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR = 106,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
    CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH = 120
} CUdevice_attribute;

typedef enum {
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
    CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES = 2,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_PTX_VERSION = 5,
    CU_FUNC_ATTRIBUTE_BINARY_VERSION = 6,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET = 10,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH = 11,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT = 12,
    CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH = 13,
    CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
} CUfunction_attribute;

typedef enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8
} CUmemPool_attribute;

typedef enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 } CUmemAllocationType;
typedef enum { CU_MEM_HANDLE_TYPE_NONE = 0 } CUmemAllocationHandleType;
typedef enum { CU_MEM_LOCATION_TYPE_DEVICE = 1 } CUmemLocationType;
typedef struct { CUmemLocationType type; int id; } CUmemLocation;
typedef struct {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef int CUjit_option;

/* Stream capture and graphs. */
typedef enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;
typedef enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
} CUstreamCaptureStatus;
typedef enum {
    CU_GRAPH_EXEC_UPDATE_SUCCESS = 0,
    CU_GRAPH_EXEC_UPDATE_ERROR = 1,
    CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2,
    CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED = 3,
    CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED = 4,
    CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED = 5,
    CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED = 6,
    CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE = 7,
    CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED = 8
} CUgraphExecUpdateResult;
typedef struct CUgraphExecUpdateResultInfo_st {
    CUgraphExecUpdateResult result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

/* Extensible launches (cuLaunchKernelEx, CUDA 12.0): the attributes safecuda sets, a
 * cooperative launch, thread-block cluster dimensions and programmatic stream
 * serialization (dependent launch, sm_90+). */
enum {
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
};
typedef struct CUlaunchAttribute_st {
    int id;
    char pad[4];
    union {
        char pad[64];
        int cooperative;
        struct { unsigned x, y, z; } clusterDim;
        int programmatic_stream_serialization_allowed;
        unsigned long long align;
    } value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned gridDimX, gridDimY, gridDimZ;
    unsigned blockDimX, blockDimY, blockDimZ;
    unsigned sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

/* Tensor maps (the bulk tensor copy engine of sm_90+): 128 opaque bytes, 64-byte aligned. */
typedef uint32_t cuuint32_t;
typedef struct CUtensorMap_st { _Alignas(64) cuuint64_t opaque[16]; } CUtensorMap;
enum {
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0,
    CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1,
    CU_TENSOR_MAP_DATA_TYPE_UINT32 = 2,
    CU_TENSOR_MAP_DATA_TYPE_INT32 = 3,
    CU_TENSOR_MAP_DATA_TYPE_UINT64 = 4,
    CU_TENSOR_MAP_DATA_TYPE_INT64 = 5,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT64 = 8,
    CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9,
    CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
    CU_TENSOR_MAP_SWIZZLE_NONE = 0,
    CU_TENSOR_MAP_SWIZZLE_32B = 1,
    CU_TENSOR_MAP_SWIZZLE_64B = 2,
    CU_TENSOR_MAP_SWIZZLE_128B = 3,
    CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
    CU_TENSOR_MAP_L2_PROMOTION_L2_64B = 1,
    CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3,
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0,
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA = 1
};

enum {
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_STREAM_NON_BLOCKING = 1,
    CU_EVENT_DEFAULT = 0,
    CU_EVENT_BLOCKING_SYNC = 1,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_MEMHOSTALLOC_PORTABLE = 1
};

/* cuPointerGetAttribute: the attributes safecuda asks for (and the size of each answer). */
typedef enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,          /* CUcontext */
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,      /* unsigned (CUmemorytype) */
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,   /* CUdeviceptr */
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,       /* a boolean (read into a zeroed unsigned) */
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,   /* int */
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11, /* CUdeviceptr */
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12       /* size_t */
} CUpointer_attribute;
typedef enum {
    CU_MEMORYTYPE_HOST = 1,
    CU_MEMORYTYPE_DEVICE = 2,
    CU_MEMORYTYPE_ARRAY = 3,
    CU_MEMORYTYPE_UNIFIED = 4
} CUmemorytype;

/* ---- driver entry points --------------------------------------------------------------
 * X(name, cuda version to resolve with, required?, parameter list, argument list) */
#define SCI_CU_FUNCS(X)                                                                        \
    X(cuDriverGetVersion, 2020, 1, (int *v), (v))                                              \
    X(cuGetErrorName, 6000, 1, (CUresult e, const char **s), (e, s))                           \
    X(cuGetErrorString, 6000, 1, (CUresult e, const char **s), (e, s))                         \
    X(cuDeviceGetCount, 2000, 1, (int *n), (n))                                                \
    X(cuDeviceGet, 2000, 1, (CUdevice * d, int ordinal), (d, ordinal))                         \
    X(cuDeviceGetName, 2000, 1, (char *name, int len, CUdevice d), (name, len, d))             \
    X(cuDeviceGetUuid, 11040, 1, (CUuuid * u, CUdevice d), (u, d))                             \
    X(cuDeviceGetPCIBusId, 4010, 1, (char *id, int len, CUdevice d), (id, len, d))             \
    X(cuDeviceTotalMem, 3020, 1, (size_t * bytes, CUdevice d), (bytes, d))                     \
    X(cuDeviceGetAttribute, 2000, 1, (int *v, CUdevice_attribute a, CUdevice d), (v, a, d))    \
    X(cuDevicePrimaryCtxRetain, 7000, 1, (CUcontext * c, CUdevice d), (c, d))                  \
    X(cuDevicePrimaryCtxRelease, 11000, 1, (CUdevice d), (d))                                  \
    X(cuDevicePrimaryCtxGetState, 7000, 1, (CUdevice d, unsigned *flags, int *active),         \
      (d, flags, active))                                                                      \
    X(cuCtxSetCurrent, 4000, 1, (CUcontext c), (c))                                            \
    X(cuCtxGetCurrent, 4000, 1, (CUcontext * c), (c))                                          \
    X(cuCtxSynchronize, 2000, 1, (void), ())                                                   \
    X(cuCtxGetStreamPriorityRange, 5050, 1, (int *least, int *greatest), (least, greatest))   \
    X(cuMemGetInfo, 3020, 1, (size_t * free_bytes, size_t * total), (free_bytes, total))       \
    X(cuMemAlloc, 3020, 1, (CUdeviceptr * p, size_t n), (p, n))                                \
    X(cuMemFree, 3020, 1, (CUdeviceptr p), (p))                                                \
    X(cuMemPoolCreate, 11020, 1, (CUmemoryPool * p, const CUmemPoolProps *props), (p, props))  \
    X(cuMemPoolDestroy, 11020, 1, (CUmemoryPool p), (p))                                       \
    X(cuMemPoolSetAttribute, 11020, 1, (CUmemoryPool p, CUmemPool_attribute a, void *v),       \
      (p, a, v))                                                                               \
    X(cuMemPoolGetAttribute, 11020, 1, (CUmemoryPool p, CUmemPool_attribute a, void *v),       \
      (p, a, v))                                                                               \
    X(cuMemPoolTrimTo, 11020, 1, (CUmemoryPool p, size_t keep), (p, keep))                     \
    X(cuMemAllocFromPoolAsync, 11020, 1,                                                       \
      (CUdeviceptr * p, size_t n, CUmemoryPool pool, CUstream s), (p, n, pool, s))             \
    X(cuMemFreeAsync, 11020, 1, (CUdeviceptr p, CUstream s), (p, s))                           \
    X(cuMemHostAlloc, 3020, 1, (void **p, size_t n, unsigned flags), (p, n, flags))            \
    X(cuMemFreeHost, 2000, 1, (void *p), (p))                                                  \
    X(cuPointerGetAttribute, 4000, 1, (void *data, int attr, CUdeviceptr p), (data, attr, p))  \
    X(cuMemcpyHtoDAsync, 3020, 1, (CUdeviceptr d, const void *h, size_t n, CUstream s),        \
      (d, h, n, s))                                                                            \
    X(cuMemcpyDtoHAsync, 3020, 1, (void *h, CUdeviceptr d, size_t n, CUstream s),              \
      (h, d, n, s))                                                                            \
    X(cuMemcpyDtoDAsync, 3020, 1, (CUdeviceptr d, CUdeviceptr s_, size_t n, CUstream s),       \
      (d, s_, n, s))                                                                           \
    X(cuMemsetD8Async, 3020, 1, (CUdeviceptr d, unsigned char v, size_t n, CUstream s),        \
      (d, v, n, s))                                                                            \
    X(cuMemsetD16Async, 3020, 1, (CUdeviceptr d, unsigned short v, size_t n, CUstream s),      \
      (d, v, n, s))                                                                            \
    X(cuMemsetD32Async, 3020, 1, (CUdeviceptr d, unsigned v, size_t n, CUstream s),            \
      (d, v, n, s))                                                                            \
    X(cuMemsetD2D32Async, 3020, 1,                                                             \
      (CUdeviceptr d, size_t pitch, unsigned v, size_t w, size_t h, CUstream s),               \
      (d, pitch, v, w, h, s))                                                                  \
    X(cuStreamCreateWithPriority, 5050, 1, (CUstream * s, unsigned flags, int prio),           \
      (s, flags, prio))                                                                        \
    X(cuStreamDestroy, 4000, 1, (CUstream s), (s))                                             \
    X(cuStreamSynchronize, 2000, 1, (CUstream s), (s))                                         \
    X(cuStreamQuery, 2000, 1, (CUstream s), (s))                                               \
    X(cuStreamWaitEvent, 3020, 1, (CUstream s, CUevent e, unsigned flags), (s, e, flags))      \
    X(cuStreamGetCtx, 9020, 1, (CUstream s, CUcontext * c), (s, c))                           \
    X(cuStreamGetPriority, 5050, 1, (CUstream s, int *prio), (s, prio))                        \
    X(cuLaunchHostFunc, 10000, 1, (CUstream s, CUhostFn fn, void *user), (s, fn, user))        \
    X(cuEventCreate, 2000, 1, (CUevent * e, unsigned flags), (e, flags))                       \
    X(cuEventDestroy, 4000, 1, (CUevent e), (e))                                               \
    X(cuEventRecord, 2000, 1, (CUevent e, CUstream s), (e, s))                                 \
    X(cuEventSynchronize, 2000, 1, (CUevent e), (e))                                           \
    X(cuEventQuery, 2000, 1, (CUevent e), (e))                                                 \
    X(cuEventElapsedTime, 2000, 1, (float *ms, CUevent a, CUevent b), (ms, a, b))              \
    X(cuModuleLoadDataEx, 2010, 1,                                                             \
      (CUmodule * m, const void *image, unsigned n, CUjit_option *opts, void **vals),          \
      (m, image, n, opts, vals))                                                               \
    X(cuModuleUnload, 2000, 1, (CUmodule m), (m))                                              \
    X(cuModuleGetFunction, 2000, 1, (CUfunction * f, CUmodule m, const char *name),            \
      (f, m, name))                                                                            \
    X(cuModuleGetFunctionCount, 12040, 0, (unsigned *n, CUmodule m), (n, m))                   \
    X(cuModuleEnumerateFunctions, 12040, 0, (CUfunction * fns, unsigned n, CUmodule m),        \
      (fns, n, m))                                                                             \
    X(cuFuncGetName, 12030, 0, (const char **name, CUfunction f), (name, f))                   \
    X(cuFuncGetAttribute, 2020, 1, (int *v, CUfunction_attribute a, CUfunction f), (v, a, f))  \
    X(cuFuncSetAttribute, 9000, 1, (CUfunction f, CUfunction_attribute a, int v), (f, a, v))   \
    X(cuFuncGetParamInfo, 12040, 0, (CUfunction f, size_t i, size_t *off, size_t *size),       \
      (f, i, off, size))                                                                       \
    X(cuOccupancyMaxActiveBlocksPerMultiprocessor, 6050, 1,                                    \
      (int *n, CUfunction f, int block, size_t dyn), (n, f, block, dyn))                       \
    X(cuOccupancyMaxPotentialBlockSize, 6050, 1,                                               \
      (int *grid, int *block, CUfunction f, CUoccupancyB2DSize fn, size_t dyn, int limit),     \
      (grid, block, f, fn, dyn, limit))                                                        \
    X(cuTensorMapEncodeTiled, 12000, 0,                                                        \
      (CUtensorMap * map, int dtype, cuuint32_t rank, void *address, const cuuint64_t *dims,   \
       const cuuint64_t *strides, const cuuint32_t *box, const cuuint32_t *element_strides,    \
       int interleave, int swizzle, int l2_promotion, int oob_fill),                           \
      (map, dtype, rank, address, dims, strides, box, element_strides, interleave, swizzle,    \
       l2_promotion, oob_fill))                                                                \
    X(cuOccupancyMaxActiveClusters, 11080, 0,                                                  \
      (int *n, CUfunction f, const CUlaunchConfig *config), (n, f, config))                    \
    X(cuOccupancyMaxPotentialClusterSize, 11080, 0,                                            \
      (int *size, CUfunction f, const CUlaunchConfig *config), (size, f, config))              \
    X(cuStreamBeginCapture, 10010, 1, (CUstream s, CUstreamCaptureMode mode), (s, mode))       \
    X(cuStreamEndCapture, 10000, 1, (CUstream s, CUgraph * g), (s, g))                         \
    X(cuStreamIsCapturing, 10000, 1, (CUstream s, CUstreamCaptureStatus * status), (s, status)) \
    X(cuStreamGetCaptureInfo, 10010, 1,                                                        \
      (CUstream s, CUstreamCaptureStatus * status, cuuint64_t * id), (s, status, id))          \
    X(cuGraphGetNodes, 10000, 1, (CUgraph g, CUgraphNode * nodes, size_t *n), (g, nodes, n))   \
    X(cuGraphDestroy, 10000, 1, (CUgraph g), (g))                                              \
    X(cuGraphInstantiateWithFlags, 11040, 1, (CUgraphExec * e, CUgraph g, unsigned long long flags), \
      (e, g, flags))                                                                           \
    X(cuGraphExecUpdate, 12000, 1,                                                             \
      (CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo * info), (e, g, info))            \
    X(cuGraphLaunch, 10000, 1, (CUgraphExec e, CUstream s), (e, s))                            \
    X(cuGraphExecDestroy, 10000, 1, (CUgraphExec e), (e))                                      \
    X(cuLaunchKernelEx, 12000, 0,                                                              \
      (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),               \
      (config, f, params, extra))                                                              \
    X(cuLaunchKernel, 4000, 1,                                                                 \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,          \
       unsigned bz, unsigned shared, CUstream s, void **params, void **extra),                 \
      (f, gx, gy, gz, bx, by, bz, shared, s, params, extra))

/* ---- NVRTC ------------------------------------------------------------------------------ */
typedef int nvrtcResult; /* NVRTC_SUCCESS == 0 */
typedef struct _nvrtcProgram *nvrtcProgram;
enum { NVRTC_SUCCESS = 0, NVRTC_ERROR_COMPILATION = 6 };
/* nvrtcGetErrorString returns a string and is resolved apart from the table below. */

/* X(name, required?, parameter list, argument list) */
#define SCI_NVRTC_FUNCS(X)                                                                     \
    X(nvrtcVersion, 1, (int *major, int *minor), (major, minor))                               \
    X(nvrtcGetNumSupportedArchs, 0, (int *n), (n))                                             \
    X(nvrtcGetSupportedArchs, 0, (int *archs), (archs))                                        \
    X(nvrtcCreateProgram, 1,                                                                   \
      (nvrtcProgram * p, const char *src, const char *name, int nh, const char *const *hs,     \
       const char *const *hn),                                                                 \
      (p, src, name, nh, hs, hn))                                                              \
    X(nvrtcDestroyProgram, 1, (nvrtcProgram * p), (p))                                         \
    X(nvrtcCompileProgram, 1, (nvrtcProgram p, int n, const char *const *opts), (p, n, opts))  \
    X(nvrtcGetProgramLogSize, 1, (nvrtcProgram p, size_t *n), (p, n))                          \
    X(nvrtcGetProgramLog, 1, (nvrtcProgram p, char *log), (p, log))                            \
    X(nvrtcGetPTXSize, 1, (nvrtcProgram p, size_t *n), (p, n))                                 \
    X(nvrtcGetPTX, 1, (nvrtcProgram p, char *ptx), (p, ptx))                                   \
    X(nvrtcGetCUBINSize, 0, (nvrtcProgram p, size_t *n), (p, n))                               \
    X(nvrtcGetCUBIN, 0, (nvrtcProgram p, char *cubin), (p, cubin))                             \
    X(nvrtcAddNameExpression, 1, (nvrtcProgram p, const char *expr), (p, expr))                \
    X(nvrtcGetLoweredName, 1, (nvrtcProgram p, const char *expr, const char **lowered),        \
      (p, expr, lowered))

/* ---- the wrappers the rest of the library calls ------------------------------------------ */
#define SCI_DECLARE_CU(name, ver, req, params, args) CUresult sci_##name params;
SCI_CU_FUNCS(SCI_DECLARE_CU)
#undef SCI_DECLARE_CU

#define SCI_DECLARE_NVRTC(name, req, params, args) nvrtcResult sci_##name params;
SCI_NVRTC_FUNCS(SCI_DECLARE_NVRTC)
#undef SCI_DECLARE_NVRTC

#endif
