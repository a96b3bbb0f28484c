// Device helpers shared by the MoE kernels (CUDA C++ only; moe_config.cuh is the part the
// host code shares).
#ifndef SC_MOE_DEVICE_CUH
#define SC_MOE_DEVICE_CUH

#include "util/fp8.cuh"

// Programmatic dependent launch (sm_90+). For few tokens the host launches every kernel of
// a forward with sc_launch_desc.programmatic, so a kernel may start while the one before it
// still runs:
// each kernel calls griddep_wait() in every thread before its first access to global
// memory, which waits for the previous grids to complete and their writes to be visible.
// griddep_launch_dependents() lets the next kernel be scheduled (it still waits the same
// way). Both are no-ops in a normal launch and before sm_90.
__device__ __forceinline__ void griddep_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void griddep_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Both, at the top of a kernel: schedule the next kernel, then wait for the previous ones.
__device__ __forceinline__ void griddep_enter()
{
    griddep_launch_dependents();
    griddep_wait();
}

// Two floats to packed bf16 (round to nearest even): lo in the low half.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi)
{
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// acc[0 .. 7] = the 8 bf16 values of v (in memory order).
__device__ __forceinline__ void load_bf16x8(float *acc, uint4 v)
{
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        acc[2 * q] = __uint_as_float(u[q] << 16);
        acc[2 * q + 1] = __uint_as_float(u[q] & 0xffff0000u);
    }
}

// acc[0 .. 7] += the 8 bf16 values of v (in memory order).
__device__ __forceinline__ void add_bf16x8(float *acc, uint4 v)
{
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        acc[2 * q] += __uint_as_float(u[q] << 16);
        acc[2 * q + 1] += __uint_as_float(u[q] & 0xffff0000u);
    }
}

// acc[0 .. 7] as 8 bf16 values (round to nearest even).
__device__ __forceinline__ uint4 pack_bf16x8(const float *acc)
{
    uint4 r;
    r.x = pack_bf16x2(acc[0], acc[1]);
    r.y = pack_bf16x2(acc[2], acc[3]);
    r.z = pack_bf16x2(acc[4], acc[5]);
    r.w = pack_bf16x2(acc[6], acc[7]);
    return r;
}

// One warp's 128-channel block of bf16 (each lane's 4 channels in v) quantized to e4m3 by
// the rule of util/fp8.cuh (the block's largest magnitude amax, the scale amax / 448, 1 when
// amax is 0; as sc_quantize_fp8_tokens does): the lane's 4 bytes, and the scale in *scale.
__device__ __forceinline__ unsigned quantize_block_bf16x4(uint2 v, float *scale)
{
    float f[4];
    f[0] = __uint_as_float(v.x << 16);
    f[1] = __uint_as_float(v.x & 0xffff0000u);
    f[2] = __uint_as_float(v.y << 16);
    f[3] = __uint_as_float(v.y & 0xffff0000u);
    float amax = fmaxf(fmaxf(fabsf(f[0]), fabsf(f[1])), fmaxf(fabsf(f[2]), fabsf(f[3])));
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const block_factors fa = fp8_block_factors(amax);
    const unsigned short lo = fp8_quantize2(f[0], f[1], fa);
    const unsigned short hi = fp8_quantize2(f[2], f[3], fa);
    *scale = fa.scale;
    return (unsigned)lo | ((unsigned)hi << 16);
}

// The group (expert) of M tile m: the last of the groups whose first tile, in the
// ascending tile_off[0 .. groups - 1], is <= m.
__device__ __forceinline__ int group_of_tile(const int *tile_off, int groups, int m)
{
    int lo = 0, hi = groups - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (tile_off[mid] <= m)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// The expert activation of gate g and up u (sc_moe_activation: 0 SiLU-GLU, 1 GeLU(tanh)-GLU,
// 2 gpt-oss's clamped SwiGLU with alpha and limit).
__device__ __forceinline__ float moe_act(float g, float u, int act, float alpha, float limit)
{
    if (act == 0)
        return g / (1.f + __expf(-g)) * u;
    if (act == 1) {
        const float c = 0.7978845608028654f; // sqrt(2 / pi)
        return 0.5f * g * (1.f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
    }
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
    return g / (1.f + __expf(-alpha * g)) * (u + 1.f);
}

// W13 bias of expert e, feature col: (gate, up) in the stacked or interleaved row layout.
__device__ __forceinline__ float2 moe_b13(const float *b13, int e, int col, int I, int interleaved)
{
    const float *b = b13 + (long long)e * 2 * I;
    return interleaved ? make_float2(b[2 * col], b[2 * col + 1]) : make_float2(b[col], b[I + col]);
}

#endif
