/* The fp8 test kernels (CUDA C++ for NVRTC, with -I<the toolkit's include folder>: see
 * tests/cuda_include.h), instantiated for __nv_fp8_e4m3 and __nv_fp8_e5m2 through the name
 * expressions below. Each element is converted to float, changed, and converted back with
 * the class's constructor (cvt.rn.satfinite: round to nearest even, saturating):
 *   k      out[i] = 2 * in[i]
 *   scale  out[i] = s * in[i] (one single-precision multiply, then the rounding)
 * tests/gpu/test_gpu_fp8.c runs them; tests/testdevice/test_td_fp8.c checks NVRTC builds them
 * with the lowered names it expects. */
#ifndef SAFECUDA_TESTS_FP8_KERNEL_H
#define SAFECUDA_TESTS_FP8_KERNEL_H

static const char fp8_kernel_src[] =
    "#include <cuda_fp8.h>\n"
    "template <class T> __global__ void k(const T *in, T *out, unsigned n)\n"
    "{\n"
    "    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        out[i] = T(2.0f * float(in[i]));\n"
    "}\n"
    "template <class T> __global__ void scale(const T *in, T *out, float s, unsigned n)\n"
    "{\n"
    "    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        out[i] = T(s * float(in[i]));\n"
    "}\n";

/* Name expressions: [0] k<e4m3>, [1] k<e5m2>, [2] scale<e4m3>, [3] scale<e5m2>. */
static const char *const fp8_kernel_names[] = {"k<__nv_fp8_e4m3>", "k<__nv_fp8_e5m2>",
                                               "scale<__nv_fp8_e4m3>",
                                               "scale<__nv_fp8_e5m2>", NULL};

#endif
