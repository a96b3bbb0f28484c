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
