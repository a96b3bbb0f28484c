// FP8 (e4m3) quantization with one f32 scale per block (include/safecuda/quant.h): weights
// in 128 x 128 blocks, activations in 1 x 128 groups (per token, per 128 channels), and the
// way back to bf16 or f32.
//
// The rule, per block: amax = the largest |v| of its values, NaNs left out (found on the
// bf16 bit patterns: |v| orders as its 15 low bits); scale = amax / 448 (1 when amax is 0);
// q = e4m3(v * (448 / amax)), rounded to nearest even and saturating (cvt.rn.satfinite).
// Each step is one correctly rounded single-precision operation written as PTX (mul.rn,
// div.rn: no contraction, no flush to zero), so the bits depend on neither the device nor
// the compile flags. A block whose amax is below 2^-64 (448 / amax overflows below 2^-119)
// scales its values and amax by 2^64 first, which is exact for bf16 values: the result is
// the rule's in a single precision without overflow. Dequantized: v' = q * scale, rounded
// once to the output type.
//
// Layout of the work: a thread holds 8 consecutive values of a row (one 16-byte load where
// the row allows it, else one load per element), 16 threads cover a block's 128 columns.
// Weights: a block of 256 threads per 128 x 128 block (16 rows at a time, 8 times).
// Tokens: a block of 256 threads covers 16 groups of one token. Grid-stride loops in every
// grid dimension, so any grid covers any size.
//
// The e4m3 conversions need sm_89 or newer; the host refuses older devices before any
// launch (the code below compiles everywhere, and traps there).

#include "util/fp8.cuh"

#define SC_QUANT_BLOCK 128
#define SC_QUANT_THREADS 256

typedef unsigned long long u64;

// Two floats to packed bf16 (round to nearest even): lo in the low half.
__device__ __forceinline__ unsigned f32x2_to_bf16x2(float lo, float hi)
{
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// 8 bf16 values from p (n of them valid, 0 .. 8; the rest read as zeros), as 4 packed
// words. vec: p is 16-byte aligned and n is 0 or 8.
__device__ __forceinline__ void load8(const unsigned short *p, int n, bool vec, unsigned w[4])
{
    if (vec && n == 8) {
        const uint4 v = __ldcs(reinterpret_cast<const uint4 *>(p));
        w[0] = v.x;
        w[1] = v.y;
        w[2] = v.z;
        w[3] = v.w;
        return;
    }
    unsigned short h[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
        h[j] = j < n ? p[j] : (unsigned short)0;
#pragma unroll
    for (int j = 0; j < 4; j++)
        w[j] = h[2 * j] | ((unsigned)h[2 * j + 1] << 16);
}

// The largest |v| bit pattern so far (two 16-bit lanes) with the packed pair w: the sign
// cleared, NaNs (above 0x7f80) counted as 0.
__device__ __forceinline__ unsigned absmax2(unsigned m, unsigned w)
{
    const unsigned a = w & 0x7fff7fffu;
    return __vmaxu2(m, a & ~__vcmpgtu2(a, 0x7f807f80u));
}

// The factors of a block whose largest |v| has the bf16 pattern amax_bits (util/fp8.cuh).
__device__ __forceinline__ block_factors factors(unsigned amax_bits)
{
    return fp8_block_factors(__uint_as_float(amax_bits << 16));
}

// 8 values (4 packed bf16 words) to 8 e4m3 bytes (2 words, element 0 in the lowest byte).
__device__ __forceinline__ uint2 quantize8(const unsigned w[4], block_factors f)
{
    unsigned out[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const unsigned a = w[2 * j], b = w[2 * j + 1];
        const unsigned short lo = f32x2_to_e4m3x2(mul_rn(mul_rn(bf16_lo(a), f.pre), f.inv),
                                                  mul_rn(mul_rn(bf16_hi(a), f.pre), f.inv));
        const unsigned short hi = f32x2_to_e4m3x2(mul_rn(mul_rn(bf16_lo(b), f.pre), f.inv),
                                                  mul_rn(mul_rn(bf16_hi(b), f.pre), f.inv));
        out[j] = lo | ((unsigned)hi << 16);
    }
    return make_uint2(out[0], out[1]);
}

// 8 bytes to p (n of them, 0 .. 8). vec: p is 8-byte aligned and n is 0 or 8.
__device__ __forceinline__ void store8(unsigned char *p, int n, bool vec, uint2 v)
{
    if (vec && n == 8) {
        __stcs(reinterpret_cast<uint2 *>(p), v);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < n)
            p[j] = (unsigned char)((j < 4 ? v.x : v.y) >> (8 * (j & 3)));
}

// 8 bytes from p (n valid, the rest zeros). vec: p is 8-byte aligned and n is 0 or 8.
__device__ __forceinline__ uint2 load8_bytes(const unsigned char *p, int n, bool vec)
{
    if (vec && n == 8)
        return __ldcs(reinterpret_cast<const uint2 *>(p));
    unsigned w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < n)
            w[j >> 2] |= (unsigned)p[j] << (8 * (j & 3));
    return make_uint2(w[0], w[1]);
}

// 8 e4m3 bytes times scale, as floats.
__device__ __forceinline__ void dequantize8(uint2 v, float scale, float out[8])
{
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned word = j < 2 ? v.x : v.y;
        const float2 f = e4m3x2_to_f32x2((unsigned short)(word >> (16 * (j & 1))));
        out[2 * j] = mul_rn(f.x, scale);
        out[2 * j + 1] = mul_rn(f.y, scale);
    }
}

// 8 floats to p as bf16 (n of them). vec: p is 16-byte aligned and n is 0 or 8.
__device__ __forceinline__ void store8(unsigned short *p, int n, bool vec, const float v[8])
{
    unsigned w[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        w[j] = f32x2_to_bf16x2(v[2 * j], v[2 * j + 1]);
    if (vec && n == 8) {
        __stcs(reinterpret_cast<uint4 *>(p), make_uint4(w[0], w[1], w[2], w[3]));
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < n)
            p[j] = (unsigned short)(w[j >> 1] >> (16 * (j & 1)));
}

// 8 floats to p as f32 (n of them). vec: p is 16-byte aligned and n is 0 or 8.
__device__ __forceinline__ void store8(float *p, int n, bool vec, const float v[8])
{
    if (vec && n == 8) {
        __stcs(reinterpret_cast<float4 *>(p), make_float4(v[0], v[1], v[2], v[3]));
        __stcs(reinterpret_cast<float4 *>(p) + 1, make_float4(v[4], v[5], v[6], v[7]));
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < n)
            p[j] = v[j];
}

// The valid values (0 .. 8) of the 8 columns from c in a row of cols.
__device__ __forceinline__ int valid8(u64 c, u64 cols)
{
    return c < cols ? (cols - c < 8 ? (int)(cols - c) : 8) : 0;
}

__device__ __forceinline__ bool aligned(const void *p, unsigned bytes)
{
    return ((unsigned long long)p & (bytes - 1)) == 0;
}

// ---- weights: 128 x 128 blocks ---------------------------------------------------------

// w [batch, rows, cols] bf16 -> q [batch, rows, cols] e4m3, scale [batch, ceil(rows / 128),
// ceil(cols / 128)] f32. Grid: x over column blocks, y over row blocks, z over the batch.
extern "C" __global__ void __launch_bounds__(SC_QUANT_THREADS)
sc_fp8_quantize_blocks(const unsigned short *__restrict__ w, unsigned char *__restrict__ q,
                       float *__restrict__ scale, u64 batch, u64 rows, u64 cols)
{
    __shared__ unsigned warp_max[SC_QUANT_THREADS / 32];
    const u64 rb = (rows + SC_QUANT_BLOCK - 1) / SC_QUANT_BLOCK;
    const u64 cb = (cols + SC_QUANT_BLOCK - 1) / SC_QUANT_BLOCK;
    const int lane16 = threadIdx.x & 15, r0 = threadIdx.x >> 4;
    const bool vec = aligned(w, 16) && aligned(q, 8) && cols % 8 == 0;
    for (u64 b = blockIdx.z; b < batch; b += gridDim.z)
        for (u64 tr = blockIdx.y; tr < rb; tr += gridDim.y)
            for (u64 tc = blockIdx.x; tc < cb; tc += gridDim.x) {
                const u64 c = tc * SC_QUANT_BLOCK + lane16 * 8;
                const int n = valid8(c, cols);
                unsigned v[8][4];
                unsigned m = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const u64 r = tr * SC_QUANT_BLOCK + r0 + 16 * i;
                    load8(w + ((b * rows + r) * cols + c), r < rows ? n : 0, vec, v[i]);
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        m = absmax2(m, v[i][j]);
                }
                m = max(m & 0xffffu, m >> 16);
                m = __reduce_max_sync(0xffffffffu, m);
                if ((threadIdx.x & 31) == 0)
                    warp_max[threadIdx.x >> 5] = m;
                __syncthreads();
#pragma unroll
                for (int k = 0; k < SC_QUANT_THREADS / 32; k++)
                    m = max(m, warp_max[k]);
                __syncthreads(); // warp_max is written again by the next block
                const block_factors f = factors(m);
                if (threadIdx.x == 0)
                    scale[(b * rb + tr) * cb + tc] = f.scale;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const u64 r = tr * SC_QUANT_BLOCK + r0 + 16 * i;
                    if (r < rows && n)
                        store8(q + ((b * rows + r) * cols + c), n, vec, quantize8(v[i], f));
                }
            }
}

// q [batch, rows, cols] e4m3 and its block scales -> out [batch, rows, cols] (OutT: bf16
// as unsigned short, or float).
template <typename OutT>
__device__ __forceinline__ void dequantize_blocks(const unsigned char *__restrict__ q,
                                                  const float *__restrict__ scale,
                                                  OutT *__restrict__ out, u64 batch, u64 rows,
                                                  u64 cols)
{
    const u64 rb = (rows + SC_QUANT_BLOCK - 1) / SC_QUANT_BLOCK;
    const u64 cb = (cols + SC_QUANT_BLOCK - 1) / SC_QUANT_BLOCK;
    const int lane16 = threadIdx.x & 15, r0 = threadIdx.x >> 4;
    const bool vec = aligned(q, 8) && aligned(out, 16) && cols % 8 == 0;
    for (u64 b = blockIdx.z; b < batch; b += gridDim.z)
        for (u64 tr = blockIdx.y; tr < rb; tr += gridDim.y)
            for (u64 tc = blockIdx.x; tc < cb; tc += gridDim.x) {
                const u64 c = tc * SC_QUANT_BLOCK + lane16 * 8;
                const int n = valid8(c, cols);
                const float s = scale[(b * rb + tr) * cb + tc];
                uint2 v[8];
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const u64 r = tr * SC_QUANT_BLOCK + r0 + 16 * i;
                    v[i] = load8_bytes(q + ((b * rows + r) * cols + c), r < rows ? n : 0, vec);
                }
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const u64 r = tr * SC_QUANT_BLOCK + r0 + 16 * i;
                    if (r < rows && n) {
                        float f[8];
                        dequantize8(v[i], s, f);
                        store8(out + ((b * rows + r) * cols + c), n, vec, f);
                    }
                }
            }
}

extern "C" __global__ void __launch_bounds__(SC_QUANT_THREADS)
sc_fp8_dequantize_blocks_bf16(const unsigned char *__restrict__ q,
                              const float *__restrict__ scale, unsigned short *__restrict__ out,
                              u64 batch, u64 rows, u64 cols)
{
    dequantize_blocks(q, scale, out, batch, rows, cols);
}

extern "C" __global__ void __launch_bounds__(SC_QUANT_THREADS)
sc_fp8_dequantize_blocks_f32(const unsigned char *__restrict__ q,
                             const float *__restrict__ scale, float *__restrict__ out,
                             u64 batch, u64 rows, u64 cols)
{
    dequantize_blocks(q, scale, out, batch, rows, cols);
}

// ---- activations: 1 x 128 groups ------------------------------------------------------

// x [tokens, hidden] bf16 -> q [tokens, hidden] e4m3, scale [tokens, ceil(hidden / 128)]
// f32. Grid: x over runs of 16 groups of a token, y over the tokens.
extern "C" __global__ void __launch_bounds__(SC_QUANT_THREADS)
sc_fp8_quantize_tokens(const unsigned short *__restrict__ x, unsigned char *__restrict__ q,
                       float *__restrict__ scale, u64 tokens, u64 hidden)
{
    const u64 groups = (hidden + SC_QUANT_BLOCK - 1) / SC_QUANT_BLOCK;
    const int lane16 = threadIdx.x & 15, sub = threadIdx.x >> 4;
    const bool vec = aligned(x, 16) && aligned(q, 8) && hidden % 8 == 0;
    for (u64 t = blockIdx.y; t < tokens; t += gridDim.y)
        for (u64 g0 = (u64)blockIdx.x * 16; g0 < groups; g0 += (u64)gridDim.x * 16) {
            // Every thread of the block goes through the same iterations (the shuffles
            // below take whole warps); a half-warp past the last group reads nothing.
            const u64 g = g0 + sub;
            const u64 c = g * SC_QUANT_BLOCK + lane16 * 8;
            const int n = g < groups ? valid8(c, hidden) : 0;
            unsigned v[4];
            load8(x + (t * hidden + c), n, vec, v);
            unsigned m = 0;
#pragma unroll
            for (int j = 0; j < 4; j++)
                m = absmax2(m, v[j]);
            m = max(m & 0xffffu, m >> 16);
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) // within the 16 threads of the group
                m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
            if (g >= groups)
                continue;
            const block_factors f = factors(m);
            if (lane16 == 0)
                scale[t * groups + g] = f.scale;
            if (n)
                store8(q + (t * hidden + c), n, vec, quantize8(v, f));
        }
}

template <typename OutT>
__device__ __forceinline__ void dequantize_tokens(const unsigned char *__restrict__ q,
                                                  const float *__restrict__ scale,
                                                  OutT *__restrict__ out, u64 tokens, u64 hidden)
{
    const u64 groups = (hidden + SC_QUANT_BLOCK - 1) / SC_QUANT_BLOCK;
    const int lane16 = threadIdx.x & 15, sub = threadIdx.x >> 4;
    const bool vec = aligned(q, 8) && aligned(out, 16) && hidden % 8 == 0;
    for (u64 t = blockIdx.y; t < tokens; t += gridDim.y)
        for (u64 g = (u64)blockIdx.x * 16 + sub; g < groups; g += (u64)gridDim.x * 16) {
            const u64 c = g * SC_QUANT_BLOCK + lane16 * 8;
            const int n = valid8(c, hidden);
            if (!n)
                continue;
            const uint2 v = load8_bytes(q + (t * hidden + c), n, vec);
            float f[8];
            dequantize8(v, scale[t * groups + g], f);
            store8(out + (t * hidden + c), n, vec, f);
        }
}

extern "C" __global__ void __launch_bounds__(SC_QUANT_THREADS)
sc_fp8_dequantize_tokens_bf16(const unsigned char *__restrict__ q,
                              const float *__restrict__ scale, unsigned short *__restrict__ out,
                              u64 tokens, u64 hidden)
{
    dequantize_tokens(q, scale, out, tokens, hidden);
}

extern "C" __global__ void __launch_bounds__(SC_QUANT_THREADS)
sc_fp8_dequantize_tokens_f32(const unsigned char *__restrict__ q,
                             const float *__restrict__ scale, float *__restrict__ out,
                             u64 tokens, u64 hidden)
{
    dequantize_tokens(q, scale, out, tokens, hidden);
}
