/* DLPack 1.1 declarations (https://dmlc.github.io/dlpack/latest/c_api.html), written from
 * the specification so that safecuda needs no third-party header. The layout and names are
 * the specification's: the guard is dlpack.h's own, so whichever of this file and the
 * official dlpack.h is included first provides the types and the other one is skipped. */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_

#include <stdint.h>

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

#ifdef __cplusplus
typedef enum : int32_t {
#else
typedef enum {
#endif
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17,
} DLDeviceType;

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0U,
    kDLUInt = 1U,
    kDLFloat = 2U,
    kDLOpaqueHandle = 3U,
    kDLBfloat = 4U,
    kDLComplex = 5U,
    kDLBool = 6U,
    kDLFloat8_e3m4 = 7U,
    kDLFloat8_e4m3 = 8U,
    kDLFloat8_e4m3b11fnuz = 9U,
    kDLFloat8_e4m3fn = 10U,
    kDLFloat8_e4m3fnuz = 11U,
    kDLFloat8_e5m2 = 12U,
    kDLFloat8_e5m2fnuz = 13U,
    kDLFloat8_e8m0fnu = 14U,
    kDLFloat6_e2m3fn = 15U,
    kDLFloat6_e3m2fn = 16U,
    kDLFloat4_e2m1fn = 17U,
} DLDataTypeCode;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)
#define DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED (1UL << 2UL)

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#ifdef __cplusplus
}
#endif
#endif
