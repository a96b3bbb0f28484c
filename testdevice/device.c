/* The test device's devices and their primary contexts (the model: testdevice.c's header
 * comment): device count, names, attributes, each primary context's reference count and
 * the thread-local current context. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testdevice_internal.h"

/* ---- devices ------------------------------------------------------------------------------ */

#define FAKE_DEVICE_NAME "safecuda test device (host memory, runs no kernels)"

CUresult f_cuDeviceGetCount(int *n)
{
    static const char fn[] = "cuDeviceGetCount";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), not_null(n, fn, "count"));
    if (r == CUDA_SUCCESS)
        *n = n_devices;
    td_unlock();
    return r;
}

CUresult f_cuDeviceGet(CUdevice *d, int ordinal)
{
    static const char fn[] = "cuDeviceGet";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), not_null(d, fn, "device"));
    if (r == CUDA_SUCCESS && (ordinal < 0 || ordinal >= n_devices))
        r = CUDA_ERROR_INVALID_DEVICE; /* asking is allowed: not misuse */
    else if (r == CUDA_SUCCESS)
        *d = ordinal;
    td_unlock();
    return r;
}

CUresult f_cuDeviceGetName(char *name, int len, CUdevice d)
{
    static const char fn[] = "cuDeviceGetName";
    td_lock();
    CUresult r;
    CHECKS(r, device_ok(d, fn),
           refuse_if(!name || len <= 0, CUDA_ERROR_INVALID_VALUE, fn, "NULL name or length %d",
                     len));
    if (r == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "%s", FAKE_DEVICE_NAME);
    td_unlock();
    return r;
}

CUresult f_cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    static const char fn[] = "cuDeviceGetUuid";
    td_lock();
    CUresult r;
    CHECKS(r, device_ok(d, fn), not_null(u, fn, "uuid"));
    if (r == CUDA_SUCCESS) {
        static const unsigned char id[16] = {0xfa, 0x4e, 0x0d, 0x3e, 0x5a, 0xfe, 0xc0, 0xda,
                                             0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01};
        memcpy(u->bytes, id, 16);
        u->bytes[15] = (char)(1 + d); /* one per device */
    }
    td_unlock();
    return r;
}

CUresult f_cuDeviceGetPCIBusId(char *id, int len, CUdevice d)
{
    static const char fn[] = "cuDeviceGetPCIBusId";
    td_lock();
    CUresult r;
    CHECKS(r, device_ok(d, fn),
           refuse_if(!id || len <= 0, CUDA_ERROR_INVALID_VALUE, fn, "NULL id or length %d", len));
    if (r == CUDA_SUCCESS)
        snprintf(id, (size_t)len, "0000:%02X:00.0", 0xFA - d); /* FA for device 0 */
    td_unlock();
    return r;
}

CUresult f_cuDeviceTotalMem(size_t *bytes, CUdevice d)
{
    static const char fn[] = "cuDeviceTotalMem";
    td_lock();
    CUresult r;
    CHECKS(r, device_ok(d, fn), not_null(bytes, fn, "bytes"));
    if (r == CUDA_SUCCESS)
        *bytes = (size_t)total_bytes;
    td_unlock();
    return r;
}

static int attribute(CUdevice_attribute a, int *ok)
{
    *ok = 1;
    switch ((int)a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 48 * 1024;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: return 0;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return compute_capability / 10;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return compute_capability % 10;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 228 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 227 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return compute_capability >= 60;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return compute_capability >= 90;
    default: *ok = 0; return 0;
    }
}

CUresult f_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    static const char fn[] = "cuDeviceGetAttribute";
    td_lock();
    CUresult r;
    CHECKS(r, device_ok(d, fn), not_null(v, fn, "value"));
    if (r == CUDA_SUCCESS) {
        int ok = 0, value = attribute(a, &ok);
        if (ok)
            *v = value;
        else
            r = CUDA_ERROR_INVALID_VALUE; /* an attribute the test device does not know */
    }
    td_unlock();
    return r;
}

/* ---- contexts ------------------------------------------------------------------------------ */

CUresult f_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    static const char fn[] = "cuDevicePrimaryCtxRetain";
    td_lock();
    CUresult r;
    CHECKS(r, device_ok(d, fn), not_null(c, fn, "context"));
    if (r == CUDA_SUCCESS) {
        primaries[d].refcount++;
        *c = (CUcontext)(void *)&primaries[d];
    }
    td_unlock();
    return r;
}

/* Device d's primary context went: its device allocations are freed. */
static void reclaim_device_memory(CUdevice d)
{
    size_t k = 0;
    for (size_t i = 0; i < n_allocs; i++) {
        if (!allocs[i].is_host && allocs[i].ctx == &primaries[d]) {
            if (allocs[i].pool && set_has(&pools, allocs[i].pool))
                allocs[i].pool->used -= allocs[i].size;
            device_used -= allocs[i].size;
            live_device--;
            reclaimed_allocations++;
            free((void *)allocs[i].base);
        } else {
            allocs[k++] = allocs[i];
        }
    }
    n_allocs = k;
}

CUresult f_cuDevicePrimaryCtxRelease(CUdevice d)
{
    static const char fn[] = "cuDevicePrimaryCtxRelease";
    td_lock();
    CUresult r;
    CHECKS(r, device_ok(d, fn),
           refuse_if(primaries[d].refcount <= 0, CUDA_ERROR_INVALID_CONTEXT, fn,
                     "device %d's primary context is not retained", d));
    if (r == CUDA_SUCCESS && --primaries[d].refcount == 0) {
        primary_releases_to_zero++;
        if (reclaim_on_release)
            reclaim_device_memory(d);
    }
    td_unlock();
    return r;
}

CUresult f_cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active)
{
    static const char fn[] = "cuDevicePrimaryCtxGetState";
    td_lock();
    CUresult r;
    CHECKS(r, device_ok(d, fn),
           refuse_if(!flags || !active, CUDA_ERROR_INVALID_VALUE, fn, "NULL out-pointer"));
    if (r == CUDA_SUCCESS) {
        *flags = 0;
        *active = primaries[d].refcount > 0;
    }
    td_unlock();
    return r;
}

CUresult f_cuCtxSetCurrent(CUcontext c)
{
    static const char fn[] = "cuCtxSetCurrent";
    td_lock();
    CUresult r;
    const fake_ctx *fc = (const fake_ctx *)(void *)c;
    CHECKS(r, need_init(fn),
           refuse_if(c && !(fc >= primaries && fc < primaries + n_devices),
                     CUDA_ERROR_INVALID_CONTEXT, fn, "unknown context %p", (void *)c));
    if (r == CUDA_SUCCESS)
        current = (fake_ctx *)(void *)c;
    td_unlock();
    return r;
}

CUresult f_cuCtxGetCurrent(CUcontext *c)
{
    static const char fn[] = "cuCtxGetCurrent";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), not_null(c, fn, "context"));
    if (r == CUDA_SUCCESS)
        *c = (CUcontext)(void *)current;
    td_unlock();
    return r;
}

CUresult f_cuCtxSynchronize(void)
{
    static const char fn[] = "cuCtxSynchronize";
    td_lock();
    CUresult r; /* td_capture_unsafe: the context holds a capturing stream, no capture survives */
    CHECKS(r, need_ctx(fn), td_capture_unsafe(fn, 1));
    while (r == CUDA_SUCCESS && td_any_stream_busy())
        td_wait(); /* held streams (hold.c) */
    if (r == CUDA_SUCCESS)
        release_to_threshold();
    td_unlock();
    return r;
}

CUresult f_cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    static const char fn[] = "cuCtxGetStreamPriorityRange";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn));
    if (r == CUDA_SUCCESS) {
        if (least)
            *least = 0;
        if (greatest)
            *greatest = -5;
    }
    td_unlock();
    return r;
}
