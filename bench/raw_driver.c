/* The raw CUDA driver for the benchmarks' baselines: see raw_driver.h. */
#include "raw_driver.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safecuda/interop.h"

raw_driver rd;

typedef CUresult (*raw_get_proc_fn)(const char *symbol, void **pfn, int cuda_version,
                                    uint64_t flags, int *status);

static void raw_fail(const char *what, const char *detail)
{
    fflush(stdout);
    fprintf(stderr, "bench: raw driver: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    printf("FAILED: raw driver: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

void raw_driver_load(void)
{
    char path[4096];
    sc_status s = sc_driver_path(path, sizeof path);
    if (s != SC_OK)
        raw_fail("sc_driver_path failed", sc_last_error());
    /* The library is loaded already: this only takes another reference to it. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        raw_fail("dlopen failed", dlerror());
    raw_get_proc_fn get_proc = (raw_get_proc_fn)(uintptr_t)dlsym(h, "cuGetProcAddress_v2");
    if (!get_proc)
        raw_fail("the driver lacks cuGetProcAddress_v2", path);
    int query = 0;
    void *fn = NULL;
#define RAW_DRIVER_RESOLVE(name, version, params)                                           \
    fn = NULL;                                                                              \
    query = 0;                                                                              \
    if (get_proc(#name, &fn, version, 1 /* CU_GET_PROC_ADDRESS_LEGACY_STREAM */, &query) != \
            CUDA_SUCCESS ||                                                                 \
        query != 0 || !fn)                                                                  \
        raw_fail("the driver lacks the entry point " #name, path);                          \
    memcpy(&rd.name, &fn, sizeof fn);
    RAW_DRIVER_ENTRIES(RAW_DRIVER_RESOLVE)
#undef RAW_DRIVER_RESOLVE
}

static void raw_check(const char *what, CUresult r)
{
    if (r != CUDA_SUCCESS) {
        char detail[256];
        snprintf(detail, sizeof detail, "%s (%s)", raw_driver_error_name(r),
                 raw_driver_error_string(r));
        raw_fail(what, detail);
    }
}

CUcontext raw_driver_primary_context(int device)
{
    CUdevice dev = 0;
    CUcontext c = NULL;
    raw_check("cuDeviceGet", rd.cuDeviceGet(&dev, device));
    raw_check("cuDevicePrimaryCtxRetain", rd.cuDevicePrimaryCtxRetain(&c, dev));
    return c;
}

void raw_driver_release_context(int device)
{
    CUdevice dev = 0;
    raw_check("cuDeviceGet", rd.cuDeviceGet(&dev, device));
    raw_check("cuDevicePrimaryCtxRelease", rd.cuDevicePrimaryCtxRelease(dev));
}

CUstream raw_driver_stream(sc_stream stream)
{
    uint64_t cu = 0;
    sc_status s = sc_stream_cu_handle(stream, &cu);
    if (s != SC_OK)
        raw_fail("sc_stream_cu_handle failed", sc_last_error());
    return (CUstream)(uintptr_t)cu;
}

void raw_driver_fail(const char *expr, CUresult r, const char *file, int line)
{
    fflush(stdout);
    fprintf(stderr, "bench: %s:%d: %s failed: %s (%s)\n", file, line, expr,
            raw_driver_error_name(r), raw_driver_error_string(r));
    printf("FAILED: %s returned %s\n", expr, raw_driver_error_name(r));
    exit(1);
}

const char *raw_driver_error_name(CUresult r)
{
    const char *s = NULL;
    if (rd.cuGetErrorName && rd.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    static _Thread_local char buf[32];
    snprintf(buf, sizeof buf, "CUresult %d", r);
    return buf;
}

const char *raw_driver_error_string(CUresult r)
{
    const char *s = NULL;
    if (rd.cuGetErrorString && rd.cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "no description";
}
