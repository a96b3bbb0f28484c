// The Mixture-of-Experts forward pass: router GEMM, scoring + top-k, per-expert counts and
// offsets, the token permutation, a grouped GEMM for W13 with SwiGLU in its epilogue, a
// grouped GEMM for W2 with the routing weight in its epilogue, and the combine back to
// token order. bf16 data, fp32 accumulation; no host synchronization anywhere: the expert
// counts stay on the device and the grouped GEMMs find their tiles from them.
//
// Deterministic: the permutation's order within an expert comes from atomics, but every
// output row of a GEMM is computed by the same instruction sequence wherever it sits in its
// tile, and the combine sums each token's k rows in slot order: the same input always gives
// bit-identical output.
//
// Tuning parameters: moe/moe_config.cuh.

#include "moe/moe_config.cuh"
#include "moe/moe_device.cuh"

typedef unsigned short bf16_t;

#define NEG_INF __int_as_float(0xff800000)

#define BM SC_MOE_BM
#define BN SC_MOE_BN
#define BK SC_MOE_BK
#define STAGES SC_MOE_STAGES
#define THREADS SC_MOE_THREADS

// ---- small device helpers ----------------------------------------------------------------

__device__ __forceinline__ float bf2f(bf16_t v) { return __uint_as_float(((unsigned)v) << 16); }


__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared; zero-filled when !valid (nothing is read then).
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
                 "l"(gmem), "r"(n));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned &r0, unsigned &r1, unsigned &r2,
                                            unsigned &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void mma_bf16(float *c, const unsigned *a, const unsigned *b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// A tile row is BK bf16 = 64 bytes = 4 chunks of 16 bytes. The chunk index is XOR-swizzled
// with (row / 2) % 4 so that the 8 rows one ldmatrix phase reads hit 8 different bank
// groups (conflict-free), and cp.async stores spread as well.
__device__ __forceinline__ int swz(int row, int chunk) { return row * BK + ((chunk ^ ((row >> 1) & 3)) << 3); }

// ---- the GEMM main loop ------------------------------------------------------------------
//
// Computes a BM x BN tile of A * B^T where A rows come from a_row(i) (a pointer to K
// contiguous bf16, or nullptr for a row past the end: zeros) and B rows from b_row(j)
// (likewise). acc[mi][ni][4] is the warp's 64 x 32 sub-tile in mma C-fragment layout.

struct Frag {
    float acc[4][4][4];
};

// `safe` is any valid global address: the source operand of zero-filling copies.
template <typename ARow, typename BRow>
__device__ __forceinline__ void gemm_tile(Frag &f, bf16_t *smem, int K, const bf16_t *safe,
                                          ARow a_row, BRow b_row)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3; // 2 x 4 warps
    bf16_t *sa = smem;                       // [STAGES][BM * BK]
    bf16_t *sb = smem + STAGES * BM * BK;    // [STAGES][BN * BK]

#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int q = 0; q < 4; q++)
                f.acc[mi][ni][q] = 0.f;

    // Each thread copies 2 chunks of A and 2 of B per stage; their rows are fixed.
    const bf16_t *a_src[2], *b_src[2];
    int a_dst[2], b_dst[2], chunk[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int idx = tid + i * THREADS, row = idx >> 2;
        chunk[i] = idx & 3;
        a_src[i] = a_row(row);
        b_src[i] = b_row(row);
        a_dst[i] = swz(row, chunk[i]);
        b_dst[i] = swz(row, chunk[i]);
    }
    const int k_tiles = (K + BK - 1) / BK;
    auto load_stage = [&](int stage, int kt) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int k = kt * BK + chunk[i] * 8;
            bool ka = a_src[i] && k < K, kb = b_src[i] && k < K;
            cp_async16(sa + stage * BM * BK + a_dst[i], ka ? a_src[i] + k : safe, ka);
            cp_async16(sb + stage * BN * BK + b_dst[i], kb ? b_src[i] + k : safe, kb);
        }
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < k_tiles)
            load_stage(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        int next = kt + STAGES - 1;
        if (next < k_tiles)
            load_stage(next % STAGES, next);
        cp_async_commit();
        const bf16_t *ta = sa + (kt % STAGES) * BM * BK;
        const bf16_t *tb = sb + (kt % STAGES) * BN * BK;
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            unsigned a[4][4], b[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; mi++) {
                int row = wm * 64 + mi * 16 + (lane & 15);
                ldmatrix_x4(a[mi][0], a[mi][1], a[mi][2], a[mi][3],
                            ta + swz(row, kk * 2 + (lane >> 4)));
            }
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                int row = wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldmatrix_x4(b[2 * nj][0], b[2 * nj][1], b[2 * nj + 1][0], b[2 * nj + 1][1],
                            tb + swz(row, kk * 2 + ((lane >> 3) & 1)));
            }
#pragma unroll
            for (int mi = 0; mi < 4; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++)
                    mma_bf16(f.acc[mi][ni], a[mi], b[ni]);
        }
    }
    cp_async_wait<0>();
}

// The tile of a grouped GEMM: blockIdx.x indexes the M tiles of all groups in turn
// (tile_offsets[e] is the first tile of group e, row_offsets[e] its first row). Returns
// false for blocks past the last tile (the grid is sized for the worst case).
__device__ __forceinline__ bool find_tile(const int *tile_offsets, const int *row_offsets,
                                          int groups, int *group, int *row0, int *row_end)
{
    int t = blockIdx.x;
    if (t >= tile_offsets[groups])
        return false;
    const int lo = group_of_tile(tile_offsets, groups, t);
    *group = lo;
    *row0 = row_offsets[lo] + (t - tile_offsets[lo]) * BM;
    *row_end = row_offsets[lo + 1];
    return true;
}

// ---- router: logits[T, E] = x[T, H] * Wg[E, H]^T (fp32 out) ------------------------------

extern "C" __global__ void __launch_bounds__(THREADS)
sc_moe_router_gemm(const bf16_t *x, const bf16_t *wg, float *logits, int T, int E, int H,
                   int k_chunk)
{
    griddep_enter();
    // Split K: block z sums H columns [z k_chunk, (z + 1) k_chunk) into its own slice of
    // logits ([gridDim.z][T][E]); the top-k kernel adds the slices in order (deterministic).
    extern __shared__ __align__(128) bf16_t smem[];
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int k0 = blockIdx.z * k_chunk, kn = min(k_chunk, H - k0);
    float *out = logits + (long long)blockIdx.z * T * E;
    Frag f;
    gemm_tile(f, smem, kn, x,
              [&](int r) -> const bf16_t * { return m0 + r < T ? x + (long long)(m0 + r) * H + k0 : nullptr; },
              [&](int r) -> const bf16_t * { return n0 + r < E ? wg + (long long)(n0 + r) * H + k0 : nullptr; });
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = m0 + wm * 64 + mi * 16 + (lane >> 2) + h * 8;
                int col = n0 + wn * 32 + ni * 8 + (lane & 3) * 2;
                if (row < T) {
                    if (col < E)
                        out[(long long)row * E + col] = f.acc[mi][ni][2 * h];
                    if (col + 1 < E)
                        out[(long long)row * E + col + 1] = f.acc[mi][ni][2 * h + 1];
                }
            }
}

// ---- scoring and top-k: one warp per token ------------------------------------------------

#define PER_LANE (SC_MOE_MAX_EXPERTS / 32)

// One token's scores and choice, by one warp: ids and weights of its k slots written, each
// chosen expert counted (counts may be global or shared memory). The logits are read
// through L2 (__ldcg): in sc_moe_route_small another block of the same launch wrote them.
__device__ __forceinline__ void topk_token(const float *row, long long split_stride, int splits,
                                           const float *bias, int *ids, float *weights,
                                           int *counts, int E, int k, int sigmoid,
                                           int renormalize, int has_bias)
{
    const int lane = threadIdx.x & 31;
    float score[PER_LANE], sel[PER_LANE];
    float mx = NEG_INF;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int e = i * 32 + lane;
        float v = 0.f;
        if (e < E)
            for (int z = 0; z < splits; z++) // the router's K slices, always in this order
                v += __ldcg(row + z * split_stride + e);
        score[i] = e < E ? v : NEG_INF;
        mx = fmaxf(mx, score[i]);
    }
    if (!sigmoid) {
        for (int o = 16; o; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            int e = i * 32 + lane;
            score[i] = e < E ? expf(score[i] - mx) : 0.f;
            sum += score[i];
        }
        for (int o = 16; o; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            score[i] /= sum;
    } else {
#pragma unroll
        for (int i = 0; i < PER_LANE; i++)
            score[i] = 1.f / (1.f + expf(-score[i]));
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        int e = i * 32 + lane;
        sel[i] = e < E ? score[i] + (has_bias ? bias[e] : 0.f) : NEG_INF;
    }
    float chosen_w[SC_MOE_MAX_TOPK];
    int chosen_e[SC_MOE_MAX_TOPK];
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        // This lane's best (highest score, then lowest index), then the warp's.
        float best = NEG_INF, best_w = 0.f;
        int best_e = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) {
            int e = i * 32 + lane;
            if (e < E && (sel[i] > best || (sel[i] == best && e < best_e))) {
                best = sel[i];
                best_e = e;
                best_w = score[i];
            }
        }
        for (int o = 16; o; o >>= 1) {
            float ob = __shfl_xor_sync(0xffffffffu, best, o);
            int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
            float ow = __shfl_xor_sync(0xffffffffu, best_w, o);
            if (ob > best || (ob == best && oe < best_e)) {
                best = ob;
                best_e = oe;
                best_w = ow;
            }
        }
        chosen_e[j] = best_e;
        chosen_w[j] = best_w;
        total += best_w;
#pragma unroll
        for (int i = 0; i < PER_LANE; i++) // take it out of the race
            if (i * 32 + lane == best_e)
                sel[i] = NEG_INF;
    }
    if (lane == 0) {
        for (int j = 0; j < k; j++) {
            ids[j] = chosen_e[j];
            weights[j] = renormalize ? chosen_w[j] / total : chosen_w[j];
            atomicAdd(&counts[chosen_e[j]], 1);
        }
    }
}

extern "C" __global__ void sc_moe_topk(const float *logits, const float *bias, int *ids,
                                       float *weights, int *counts, int T, int E, int k,
                                       int sigmoid, int renormalize, int has_bias, int splits)
{
    griddep_enter();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= T)
        return;
    topk_token(logits + (long long)t * E, (long long)T * E, splits, bias,
               ids + (long long)t * k, weights + (long long)t * k, counts, E, k, sigmoid,
               renormalize, has_bias);
}

// ---- routing for few tokens (decode): one launch -----------------------------------------
//
// For T <= SC_MOE_ROUTE_SMALL_MAX_T. Every block computes logits for SC_MOE_ROUTE_EXPERTS
// experts (a warp each) and up to SC_MOE_ROUTE_TOKENS tokens; the last block to finish (a
// ticket counter, reset by that block for the next launch) then does what the separate
// kernels do for many tokens: scores and top-k, the counts, the row and tile offsets, the
// permutation, and (gather != 0) x in expert order. Nothing needs zeroing beforehand.

__device__ __forceinline__ float dot8(uint4 a, uint4 b)
{
    const unsigned ua[4] = {a.x, a.y, a.z, a.w}, ub[4] = {b.x, b.y, b.z, b.w};
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        s = fmaf(__uint_as_float(ua[q] << 16), __uint_as_float(ub[q] << 16), s);
        s = fmaf(__uint_as_float(ua[q] & 0xffff0000u), __uint_as_float(ub[q] & 0xffff0000u), s);
    }
    return s;
}

extern "C" __global__ void __launch_bounds__(SC_MOE_ROUTE_THREADS)
sc_moe_route_small(const bf16_t *x, const bf16_t *wg, const float *bias, float *logits,
                   int *ids, float *weights, int *row_offsets, int *tile_offsets,
                   int *perm_token, float *perm_weight, int *pos, bf16_t *x_perm,
                   unsigned *ticket, int T, int E, int k, int H, int sigmoid, int renormalize,
                   int has_bias, int gather)
{
    griddep_enter();
    // Logits of SC_MOE_ROUTE_EXPERTS experts for all T (<= SC_MOE_ROUTE_TOKENS) tokens: the
    // warps split H, each lane keeps EXPERTS x TOKENS partial sums; x and Wg are read with
    // unconditional 16-byte loads (rows past T repeat row T - 1, ignored) so that every
    // load of a step is in flight at once. Then lanes, then warps are summed.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int NW = SC_MOE_ROUTE_THREADS / 32, EX = SC_MOE_ROUTE_EXPERTS,
                  TK = SC_MOE_ROUTE_TOKENS;
    const int e0 = blockIdx.x * EX;
    __shared__ float partial[NW][EX * TK];
    {
        float acc[EX][TK];
#pragma unroll
        for (int a = 0; a < EX; a++)
#pragma unroll
            for (int j = 0; j < TK; j++)
                acc[a][j] = 0.f;
        const int chunks = H / 8;
        const uint4 *xr[TK];
#pragma unroll
        for (int j = 0; j < TK; j++)
            xr[j] = reinterpret_cast<const uint4 *>(x + (long long)min(j, T - 1) * H);
        const uint4 *wr[EX];
#pragma unroll
        for (int a = 0; a < EX; a++)
            wr[a] = reinterpret_cast<const uint4 *>(wg + (long long)min(e0 + a, E - 1) * H);
        for (int c = warp * 32 + lane; c < chunks; c += SC_MOE_ROUTE_THREADS) {
            uint4 wv[EX], xv[TK];
#pragma unroll
            for (int a = 0; a < EX; a++)
                wv[a] = __ldg(wr[a] + c);
#pragma unroll
            for (int j = 0; j < TK; j++)
                xv[j] = __ldg(xr[j] + c);
#pragma unroll
            for (int a = 0; a < EX; a++)
#pragma unroll
                for (int j = 0; j < TK; j++)
                    acc[a][j] += dot8(wv[a], xv[j]);
        }
#pragma unroll
        for (int a = 0; a < EX; a++)
#pragma unroll
            for (int j = 0; j < TK; j++) {
                float v = acc[a][j];
                for (int o = 16; o; o >>= 1)
                    v += __shfl_xor_sync(0xffffffffu, v, o);
                if (lane == 0)
                    partial[warp][a * TK + j] = v;
            }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < EX * TK; i += blockDim.x) {
        const int a = i / TK, j = i % TK;
        float v = 0.f;
        for (int w = 0; w < NW; w++) // in warp order: deterministic
            v += partial[w][i];
        if (e0 + a < E && j < T)
            logits[(long long)j * E + e0 + a] = v;
    }

    // The last block does the rest.
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd(ticket, 1u) == gridDim.x * gridDim.y - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();

    __shared__ int counts[SC_MOE_MAX_EXPERTS], offs[SC_MOE_MAX_EXPERTS], cursor[SC_MOE_MAX_EXPERTS];
    __shared__ int perm[SC_MOE_ROUTE_SMALL_MAX_T * SC_MOE_MAX_TOPK];
    __shared__ int warp_rows[SC_MOE_ROUTE_THREADS / 32], warp_tiles[SC_MOE_ROUTE_THREADS / 32];
    for (int i = threadIdx.x; i < SC_MOE_MAX_EXPERTS; i += blockDim.x) {
        counts[i] = 0;
        cursor[i] = 0;
    }
    __syncthreads();
    for (int t = warp; t < T; t += SC_MOE_ROUTE_THREADS / 32)
        topk_token(logits + (long long)t * E, 0, 1, bias, ids + (long long)t * k,
                   weights + (long long)t * k, counts, E, k, sigmoid, renormalize, has_bias);
    __syncthreads();
    // Exclusive scans of rows and BM-row tiles per expert (one thread per expert: the block
    // has SC_MOE_ROUTE_THREADS >= SC_MOE_MAX_EXPERTS threads).
    {
        const int ee = threadIdx.x;
        const int rows = ee < E ? counts[ee] : 0, tiles = (rows + BM - 1) / BM;
        int r = rows, tt = tiles;
        for (int o = 1; o < 32; o <<= 1) {
            int ur = __shfl_up_sync(0xffffffffu, r, o), ut = __shfl_up_sync(0xffffffffu, tt, o);
            if (lane >= o) {
                r += ur;
                tt += ut;
            }
        }
        if (lane == 31) {
            warp_rows[warp] = r;
            warp_tiles[warp] = tt;
        }
        __syncthreads();
        int br = 0, bt = 0;
        for (int i = 0; i < warp; i++) {
            br += warp_rows[i];
            bt += warp_tiles[i];
        }
        if (ee < E) {
            offs[ee] = br + r - rows;
            row_offsets[ee] = br + r - rows;
            tile_offsets[ee] = bt + tt - tiles;
        }
        if (ee == E - 1) {
            row_offsets[E] = br + r;
            tile_offsets[E] = bt + tt;
        }
    }
    __syncthreads();
    const int n = T * k;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int ex = ids[i];
        const int p = offs[ex] + atomicAdd(&cursor[ex], 1);
        perm[p] = i / k;
        perm_token[p] = i / k;
        perm_weight[p] = weights[i];
        pos[i] = p;
    }
    __syncthreads();
    if (gather)
        for (int p = warp; p < n; p += SC_MOE_ROUTE_THREADS / 32) {
            const uint4 *src = reinterpret_cast<const uint4 *>(x + (long long)perm[p] * H);
            uint4 *dst = reinterpret_cast<uint4 *>(x_perm + (long long)p * H);
            for (int c = lane; c < H / 8; c += 32)
                dst[c] = src[c];
        }
    if (threadIdx.x == 0)
        *ticket = 0u;
}

// x in expert order, one warp per row: x_perm[p] = x[perm_token[p]].
extern "C" __global__ void sc_moe_gather(const int *perm_token, const bf16_t *x, bf16_t *x_perm,
                                         int rows, int H)
{
    griddep_enter();
    const long long p = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (p >= rows)
        return;
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (long long)perm_token[p] * H);
    uint4 *dst = reinterpret_cast<uint4 *>(x_perm + p * H);
    for (int c = lane; c < H / 8; c += 32)
        dst[c] = src[c];
}

// ---- offsets: rows and tiles per expert (one block of SC_MOE_MAX_EXPERTS threads) --------
//
// An exclusive scan of the counts (rows) and of the BM-row tiles per expert, by warps and
// then over the warp totals; the cursors of the scatter are reset.

extern "C" __global__ void sc_moe_offsets(const int *counts, int *row_offsets, int *tile_offsets,
                                          int *cursor, int E)
{
    griddep_enter();
    __shared__ int warp_rows[SC_MOE_MAX_EXPERTS / 32], warp_tiles[SC_MOE_MAX_EXPERTS / 32];
    const int e = threadIdx.x, lane = e & 31, w = e >> 5;
    const int rows = e < E ? counts[e] : 0, tiles = (rows + BM - 1) / BM;
    int r = rows, t = tiles;
    for (int o = 1; o < 32; o <<= 1) {
        int ur = __shfl_up_sync(0xffffffffu, r, o), ut = __shfl_up_sync(0xffffffffu, t, o);
        if (lane >= o) {
            r += ur;
            t += ut;
        }
    }
    if (lane == 31) {
        warp_rows[w] = r;
        warp_tiles[w] = t;
    }
    __syncthreads();
    int base_r = 0, base_t = 0;
    for (int i = 0; i < w; i++) {
        base_r += warp_rows[i];
        base_t += warp_tiles[i];
    }
    if (e < E) {
        row_offsets[e] = base_r + r - rows;
        tile_offsets[e] = base_t + t - tiles;
        cursor[e] = 0;
    }
    if (e == E - 1) {
        row_offsets[E] = base_r + r;
        tile_offsets[E] = base_t + t;
    }
}

// ---- the permutation: expert-major rows --------------------------------------------------

extern "C" __global__ void sc_moe_scatter(const int *ids, const float *weights,
                                          const int *row_offsets, int *cursor, int *perm_token,
                                          float *perm_weight, int *pos, int T, int k)
{
    griddep_enter();
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)T * k)
        return;
    int e = ids[i];
    int p = row_offsets[e] + atomicAdd(&cursor[e], 1);
    perm_token[p] = (int)(i / k);
    perm_weight[p] = weights[i];
    pos[i] = p;
}

// The same, one warp per (token, slot), that also copies the token's row of x to row p of
// x_perm (for GEMMs that read A through the copy engine, which cannot gather rows).
extern "C" __global__ void sc_moe_scatter_gather(const int *ids, const float *weights,
                                                 const int *row_offsets, int *cursor,
                                                 int *perm_token, float *perm_weight, int *pos,
                                                 const bf16_t *x, bf16_t *x_perm, int T, int k,
                                                 int H)
{
    griddep_enter();
    const long long i = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (i >= (long long)T * k)
        return;
    const int e = ids[i];
    int p = 0;
    if (lane == 0) {
        p = row_offsets[e] + atomicAdd(&cursor[e], 1);
        perm_token[p] = (int)(i / k);
        perm_weight[p] = weights[i];
        pos[i] = p;
    }
    p = __shfl_sync(0xffffffffu, p, 0);
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (i / k) * (long long)H);
    uint4 *dst = reinterpret_cast<uint4 *>(x_perm + (long long)p * H);
    for (int c = lane; c < H / 8; c += 32)
        dst[c] = src[c];
}

// ---- W13: h[p, :] = silu(x[tok(p)] W1[e]^T) * (x[tok(p)] W3[e]^T) ------------------------
//
// W13[e] is [2I, H]: rows 0..I-1 are W1 (gate), I..2I-1 are W3 (up). A tile holds BN/2
// output columns; its B rows are arranged so that each warp's 32 rows are 16 gate rows
// followed by the 16 up rows of the same columns, and the SwiGLU happens in registers.

extern "C" __global__ void __launch_bounds__(THREADS)
sc_moe_gemm_w13(const bf16_t *x, const int *perm_token, const bf16_t *w13, bf16_t *h,
                const int *tile_offsets, const int *row_offsets, int E, int I, int H)
{
    griddep_enter();
    extern __shared__ __align__(128) bf16_t smem[];
    int e, row0, row_end;
    if (!find_tile(tile_offsets, row_offsets, E, &e, &row0, &row_end))
        return;
    const int c0 = blockIdx.y * (BN / 2);
    const bf16_t *w = w13 + (long long)e * 2 * I * H;
    Frag f;
    gemm_tile(f, smem, H, x,
              [&](int r) -> const bf16_t * {
                  int p = row0 + r;
                  return p < row_end ? x + (long long)perm_token[p] * H : nullptr;
              },
              [&](int r) -> const bf16_t * {
                  int warp_cols = r >> 5, within = r & 31;
                  int col = c0 + warp_cols * 16 + (within & 15);
                  int wrow = (within >> 4) ? I + col : col;
                  return col < I ? w + (long long)wrow * H : nullptr;
              });
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++) // n-frags 0,1: gate; 2,3: up of the same columns
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                int p = row0 + wm * 64 + mi * 16 + (lane >> 2) + hh * 8;
                int col = c0 + wn * 16 + ni * 8 + (lane & 3) * 2;
                if (p < row_end && col < I) {
                    float g0 = f.acc[mi][ni][2 * hh], g1 = f.acc[mi][ni][2 * hh + 1];
                    float u0 = f.acc[mi][ni + 2][2 * hh], u1 = f.acc[mi][ni + 2][2 * hh + 1];
                    float h0 = g0 / (1.f + __expf(-g0)) * u0, h1 = g1 / (1.f + __expf(-g1)) * u1;
                    *reinterpret_cast<unsigned *>(h + (long long)p * I + col) = pack_bf16x2(h0, h1);
                }
            }
}

// ---- W2: y[p, :] = weight(p) * h[p] W2[e]^T ----------------------------------------------

extern "C" __global__ void __launch_bounds__(THREADS)
sc_moe_gemm_w2(const bf16_t *h, const bf16_t *w2, const float *perm_weight, bf16_t *y,
               const int *tile_offsets, const int *row_offsets, int E, int H, int I)
{
    griddep_enter();
    extern __shared__ __align__(128) bf16_t smem[];
    int e, row0, row_end;
    if (!find_tile(tile_offsets, row_offsets, E, &e, &row0, &row_end))
        return;
    const int n0 = blockIdx.y * BN;
    const bf16_t *w = w2 + (long long)e * H * I;
    Frag f;
    gemm_tile(f, smem, I, h,
              [&](int r) -> const bf16_t * {
                  int p = row0 + r;
                  return p < row_end ? h + (long long)p * I : nullptr;
              },
              [&](int r) -> const bf16_t * {
                  return n0 + r < H ? w + (long long)(n0 + r) * I : nullptr;
              });
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
#pragma unroll
    for (int mi = 0; mi < 4; mi++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            int p = row0 + wm * 64 + mi * 16 + (lane >> 2) + hh * 8;
            if (p >= row_end)
                continue;
            float s = perm_weight[p];
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                int col = n0 + wn * 32 + ni * 8 + (lane & 3) * 2;
                if (col < H)
                    *reinterpret_cast<unsigned *>(y + (long long)p * H + col) =
                        pack_bf16x2(f.acc[mi][ni][2 * hh] * s, f.acc[mi][ni][2 * hh + 1] * s);
            }
        }
}

// ---- combine: out[t] = sum over slots j (in order) of y[pos[t, j]] -----------------------

extern "C" __global__ void sc_moe_combine(const bf16_t *y, const int *pos, bf16_t *out, int T,
                                          int k, int H)
{
    griddep_enter();
    const int t = blockIdx.x;
    if (t >= T)
        return;
    int rows[SC_MOE_MAX_TOPK];
    for (int j = 0; j < k; j++)
        rows[j] = pos[(long long)t * k + j];
    for (int c = threadIdx.x; c < H / 8; c += blockDim.x) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int j = 0; j < k; j++) {
            uint4 v = *reinterpret_cast<const uint4 *>(y + (long long)rows[j] * H + c * 8);
            unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                acc[2 * q] += __uint_as_float(u[q] << 16);
                acc[2 * q + 1] += __uint_as_float(u[q] & 0xffff0000u);
            }
        }
        uint4 o;
        o.x = pack_bf16x2(acc[0], acc[1]);
        o.y = pack_bf16x2(acc[2], acc[3]);
        o.z = pack_bf16x2(acc[4], acc[5]);
        o.w = pack_bf16x2(acc[6], acc[7]);
        *reinterpret_cast<uint4 *>(out + (long long)t * H + c * 8) = o;
    }
}
