/* TEST DOUBLE (fault injection): a library that looks like the CUDA toolkit's stub
 * libcuda.so, whose every call answers CUDA_ERROR_STUB_LIBRARY (34). It lets the loader
 * test check the "only the stub was found" path on any machine. With
 * SAFECUDA_STUB_INIT_RESULT=N its cuInit answers N instead: a driver that is installed
 * but broken (999, CUDA_ERROR_UNKNOWN, say). Never a GPU stand-in. */
#include <stdlib.h>

#define STUB 34

int cuInit(unsigned flags)
{
    (void)flags;
    const char *r = getenv("SAFECUDA_STUB_INIT_RESULT");
    return r && r[0] ? atoi(r) : STUB;
}

int cuDriverGetVersion(int *v)
{
    if (v)
        *v = 13000;
    return STUB;
}

int cuGetProcAddress_v2(const char *name, void **fn, int version, unsigned long long flags,
                        int *status)
{
    (void)name, (void)version, (void)flags;
    if (fn)
        *fn = 0;
    if (status)
        *status = 1;
    return STUB;
}

int cuGetErrorName(int error, const char **s)
{
    (void)error;
    if (s)
        *s = "CUDA_ERROR_STUB_LIBRARY";
    return 0;
}
