#include <stdio.h>
#include <string.h>

#include "core/device.h"
#include "core/library.h"
#include "driver/driver.h"

static sc_status device_count(int *count, const char *fn)
{
    *count = 0;
    sc_status s = sci_driver_ready(fn);
    if (s != SC_OK)
        return s;
    if (!sci_driver_has_devices())
        return SC_OK;
    CUresult r = sci_cuDeviceGetCount(count);
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "cuDeviceGetCount failed");
    return SC_OK;
}

sc_status sc_device_count(int *count)
{
    SCI_CHECK_PTR("sc_device_count", count);
    return device_count(count, "sc_device_count");
}

sc_status sci_device_get(int ordinal, const char *fn, CUdevice *dev)
{
    int count = 0;
    sc_status s = device_count(&count, fn);
    if (s != SC_OK)
        return s;
    if (count == 0)
        return sci_fail(SC_ERR_NO_DEVICE, fn,
                        "no CUDA device: the NVIDIA driver (CUDA %d.%d, %s) sees no GPU",
                        sci_driver_cuda_version() / 1000, (sci_driver_cuda_version() % 1000) / 10,
                        sci_driver_library_path());
    if (ordinal < 0 || ordinal >= count)
        return sci_fail(SC_ERR_NO_DEVICE, fn, "device %d does not exist (%d device%s: 0..%d)",
                        ordinal, count, count == 1 ? "" : "s", count - 1);
    CUresult r = sci_cuDeviceGet(dev, ordinal);
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "cuDeviceGet(%d) failed", ordinal);
    return SC_OK;
}

sc_status sci_device_props(int ordinal, CUdevice dev, const char *fn, sc_device_props *p)
{
    memset(p, 0, sizeof *p);
    p->ordinal = ordinal;
    CUresult r = sci_cuDeviceGetName(p->name, (int)sizeof p->name, dev);
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "cuDeviceGetName(device %d) failed", ordinal);
    CUuuid u;
    r = sci_cuDeviceGetUuid(&u, dev);
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "cuDeviceGetUuid(device %d) failed", ordinal);
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(p->uuid, sizeof p->uuid,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    r = sci_cuDeviceGetPCIBusId(p->pci_bus_id, (int)sizeof p->pci_bus_id, dev);
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "cuDeviceGetPCIBusId(device %d) failed", ordinal);
    for (char *c = p->pci_bus_id; *c; c++)
        if (*c >= 'A' && *c <= 'F')
            *c = (char)(*c - 'A' + 'a');
    size_t total = 0;
    r = sci_cuDeviceTotalMem(&total, dev);
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "cuDeviceTotalMem(device %d) failed", ordinal);
    p->total_memory = total;

    struct {
        CUdevice_attribute attr;
        int *out;
        const char *name;
    } attrs[] = {
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &p->cc_major, "compute capability"},
        {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &p->cc_minor, "compute capability"},
        {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &p->sm_count, "SM count"},
        {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, &p->l2_cache_bytes, "L2 size"},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, &p->shared_per_block, "shared/block"},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, &p->shared_per_block_optin,
         "opt-in shared/block"},
        {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, &p->shared_per_sm,
         "shared/SM"},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &p->max_threads_per_block, "threads/block"},
        {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, &p->max_threads_per_sm,
         "threads/SM"},
        {CU_DEVICE_ATTRIBUTE_WARP_SIZE, &p->warp_size, "warp size"},
        {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, &p->registers_per_block, "regs/block"},
        {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, &p->registers_per_sm,
         "regs/SM"},
        {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, &p->clock_khz, "clock rate"},
        {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, &p->memory_clock_khz, "memory clock"},
        {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, &p->memory_bus_width_bits, "bus width"},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, &p->max_grid[0], "grid x"},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, &p->max_grid[1], "grid y"},
        {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, &p->max_grid[2], "grid z"},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, &p->max_block[0], "block x"},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, &p->max_block[1], "block y"},
        {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, &p->max_block[2], "block z"},
        {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, &p->async_engines, "copy engines"},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        r = sci_cuDeviceGetAttribute(attrs[i].out, attrs[i].attr, dev);
        if (r != CUDA_SUCCESS)
            return sci_fail_cu(r, fn, "cuDeviceGetAttribute(%s, device %d) failed",
                               attrs[i].name, ordinal);
    }
    /* Optional: a driver that can't answer leaves them false, unless the device is gone. */
    int flag = 0;
    r = sci_cuDeviceGetAttribute(&flag, CU_DEVICE_ATTRIBUTE_ECC_ENABLED, dev);
    if (sci_cu_error_is_sticky(r))
        return sci_fail_cu(r, fn, "cuDeviceGetAttribute(ECC, device %d) failed", ordinal);
    p->ecc_enabled = r == CUDA_SUCCESS && flag != 0;
    flag = 0;
    r = sci_cuDeviceGetAttribute(&flag, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev);
    if (sci_cu_error_is_sticky(r))
        return sci_fail_cu(r, fn, "cuDeviceGetAttribute(memory pools, device %d) failed",
                           ordinal);
    p->memory_pools_supported = r == CUDA_SUCCESS && flag != 0;
    /* Double data rate: two transfers per memory clock over bus_width / 8 bytes. */
    p->memory_bandwidth_gbs =
        2.0 * (double)p->memory_clock_khz * 1e3 * ((double)p->memory_bus_width_bits / 8.0) / 1e9;
    return SC_OK;
}

sc_status sc_device_info(int device, sc_device_props *props)
{
    SCI_CHECK_PTR("sc_device_info", props);
    CUdevice dev;
    sc_status s = sci_device_get(device, "sc_device_info", &dev);
    if (s != SC_OK)
        return s;
    return sci_device_props(device, dev, "sc_device_info", props);
}

sc_status sc_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
    static const char fn[] = "sc_device_memory";
    SCI_CHECK_PTR(fn, free_bytes);
    SCI_CHECK_PTR(fn, total_bytes);
    CUdevice dev;
    sc_status s = sci_device_get(device, fn, &dev);
    if (s != SC_OK)
        return s;
    CUcontext previous = NULL, primary = NULL;
    CUresult r = sci_cuCtxGetCurrent(&previous); /* restored at the end */
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "cuCtxGetCurrent failed");
    r = sci_cuDevicePrimaryCtxRetain(&primary, dev);
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "cuDevicePrimaryCtxRetain(device %d) failed", device);
    size_t f = 0, t = 0;
    const char *what = "cuCtxSetCurrent";
    r = sci_cuCtxSetCurrent(primary);
    if (r == CUDA_SUCCESS) {
        what = "cuMemGetInfo";
        r = sci_cuMemGetInfo(&f, &t);
    }
    CUresult restore = sci_cuCtxSetCurrent(previous);
    CUresult release = sci_cuDevicePrimaryCtxRelease(dev);
    if (r == CUDA_SUCCESS && restore != CUDA_SUCCESS) {
        r = restore;
        what = "cuCtxSetCurrent (restoring the thread's context)";
    }
    if (r == CUDA_SUCCESS && release != CUDA_SUCCESS) {
        r = release;
        what = "cuDevicePrimaryCtxRelease";
    }
    if (r != CUDA_SUCCESS)
        return sci_fail_cu(r, fn, "%s(device %d) failed", what, device);
    *free_bytes = f;
    *total_bytes = t;
    return SC_OK;
}
