#include <stdio.h>

#include "core/library.h"
#include "driver/driver.h"

#define SCI_STR2(x) #x
#define SCI_STR(x) SCI_STR2(x)

const char *sc_version_string(void)
{
    return SCI_STR(SAFECUDA_VERSION_MAJOR) "." SCI_STR(SAFECUDA_VERSION_MINOR) "." SCI_STR(
        SAFECUDA_VERSION_PATCH);
}

sc_status sci_driver_ready(const char *fn)
{
    sc_status s = sci_driver_load();
    if (s != SC_OK)
        return sci_fail(s, fn, "%s", sci_driver_load_message());
    return SC_OK;
}

sc_status sci_compiler_ready(const char *fn)
{
    sc_status s = sci_nvrtc_load();
    if (s != SC_OK)
        return sci_fail(s, fn, "%s", sci_nvrtc_load_message());
    return SC_OK;
}

sc_status sc_init(void) { return sci_driver_ready("sc_init"); }

sc_status sc_driver_version(int *version)
{
    SCI_CHECK_PTR("sc_driver_version", version);
    sc_status s = sci_driver_ready("sc_driver_version");
    if (s != SC_OK)
        return s;
    *version = sci_driver_cuda_version();
    return SC_OK;
}

sc_status sc_driver_path(char *buf, size_t size)
{
    SCI_CHECK_PTR("sc_driver_path", buf);
    if (size == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, "sc_driver_path", "size is 0");
    sc_status s = sci_driver_ready("sc_driver_path");
    if (s != SC_OK)
        return s;
    snprintf(buf, size, "%s", sci_driver_library_path());
    return SC_OK;
}

sc_status sc_compiler_version(int *major, int *minor)
{
    SCI_CHECK_PTR("sc_compiler_version", major);
    SCI_CHECK_PTR("sc_compiler_version", minor);
    sc_status s = sci_compiler_ready("sc_compiler_version");
    if (s != SC_OK)
        return s;
    nvrtcResult r = sci_nvrtcVersion(major, minor);
    if (r != NVRTC_SUCCESS)
        return sci_fail(SC_ERR_NO_COMPILER, "sc_compiler_version", "nvrtcVersion failed: %s",
                        sci_nvrtc_error_string(r));
    return SC_OK;
}

sc_status sc_compiler_archs(int *archs, size_t capacity, size_t *count)
{
    const char *fn = "sc_compiler_archs";
    SCI_CHECK_PTR(fn, count);
    *count = 0;
    if (!archs && capacity)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "archs is NULL but capacity is %zu",
                        capacity);
    sc_status s = sci_compiler_ready(fn);
    if (s != SC_OK)
        return s;
    const int *list = NULL;
    int n = sci_nvrtc_archs(&list);
    if (n == 0) {
        int major = 0, minor = 0;
        sci_nvrtcVersion(&major, &minor);
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "NVRTC %d.%d (%s) can't list its architectures "
                        "(nvrtcGetSupportedArchs came with NVRTC 11.2)",
                        major, minor, sci_nvrtc_library_path());
    }
    for (int i = 0; i < n && (size_t)i < capacity; i++)
        archs[i] = list[i];
    *count = (size_t)n;
    return SC_OK;
}

sc_status sc_compiler_path(char *buf, size_t size)
{
    SCI_CHECK_PTR("sc_compiler_path", buf);
    if (size == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, "sc_compiler_path", "size is 0");
    sc_status s = sci_compiler_ready("sc_compiler_path");
    if (s != SC_OK)
        return s;
    snprintf(buf, size, "%s", sci_nvrtc_library_path());
    return SC_OK;
}
