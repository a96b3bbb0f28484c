// fp8 (e4m3) on the device, shared by the quantization kernels (kernels/quant/) and the MoE
// layer's (kernels/moe/): IEEE single-precision multiply and divide that no compile flag can
// turn into approximations or flush to zero, the conversions, and the block rule of
// include/safecuda/quant.h: a block whose largest magnitude is amax has the scale amax / 448
// (1 when amax is 0), and each value v becomes e4m3((v x pre) x inv), inv = 448 / (amax x
// pre), pre = 2^64 for a tiny block (amax < 2^-64: 448 / amax would overflow), else 1
// (round to nearest even, saturating to +-448). fp8 conversions exist from sm_89 on; files
// that are also compiled for older targets trap there (never called).
#ifndef SC_UTIL_FP8_CUH
#define SC_UTIL_FP8_CUH

__device__ __forceinline__ float mul_rn(float a, float b)
{
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

__device__ __forceinline__ float div_rn(float a, float b)
{
    float r;
    asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Two floats to two e4m3 bytes (lo in the low byte), round to nearest even, saturating.
__device__ __forceinline__ unsigned short f32x2_to_e4m3x2(float lo, float hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    __trap();
    return 0;
#endif
}

// Two e4m3 bytes (lo in the low byte) to floats (exact).
__device__ __forceinline__ float2 e4m3x2_to_f32x2(unsigned short v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    float lo, hi;
    asm("{\n\t.reg .b32 h2;\n\t.reg .f16 l, h;\n\t"
        "cvt.rn.f16x2.e4m3x2 h2, %2;\n\t"
        "mov.b32 {l, h}, h2;\n\t"
        "cvt.f32.f16 %0, l;\n\t"
        "cvt.f32.f16 %1, h;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "h"(v));
    return make_float2(lo, hi);
#else
    __trap();
    return make_float2(0.f, 0.f);
#endif
}

// The factors of a block whose largest magnitude is amax (>= 0, finite): its scale, and
// the two factors each value is multiplied by before the conversion.
struct block_factors {
    float scale, pre, inv;
};

__device__ __forceinline__ block_factors fp8_block_factors(float amax)
{
    block_factors f = {1.f, 1.f, 1.f};
    if (!(amax > 0.f))
        return f;
    f.scale = div_rn(amax, 448.f);
    if (amax < 0x1p-64f)
        f.pre = 0x1p64f;
    f.inv = div_rn(448.f, mul_rn(amax, f.pre));
    return f;
}

// Two values of a block to e4m3 (lo in the low byte).
__device__ __forceinline__ unsigned short fp8_quantize2(float lo, float hi, block_factors f)
{
    return f32x2_to_e4m3x2(mul_rn(mul_rn(lo, f.pre), f.inv), mul_rn(mul_rn(hi, f.pre), f.inv));
}

#endif
