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

// ---- router: logits[T, cols] = x[T, H] * [Wg; gate]^T (fp32 out) ---------------------------
//
// Columns 0 .. E - 1 are the routed experts' rows of Wg, column E (when cols = E + 1) the
// shared expert's gate row. With E = 0 and cols = 1 it computes the gate's logits alone.

extern "C" __global__ void __launch_bounds__(THREADS)
sc_moe_router_gemm(const bf16_t *x, const bf16_t *wg, const bf16_t *gate, float *logits, int T,
                   int E, int cols, int H, int k_chunk)
{
    griddep_enter();
    // Split K: block z sums H columns [z k_chunk, (z + 1) k_chunk) into its own slice of
    // logits ([gridDim.z][T][cols]); the top-k kernel adds the slices in order
    // (deterministic).
    extern __shared__ __align__(128) bf16_t smem[];
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int k0 = blockIdx.z * k_chunk, kn = min(k_chunk, H - k0);
    float *out = logits + (long long)blockIdx.z * T * cols;
    Frag f;
    gemm_tile(f, smem, kn, x,
              [&](int r) -> const bf16_t * { return m0 + r < T ? x + (long long)(m0 + r) * H + k0 : nullptr; },
              [&](int r) -> const bf16_t * {
                  const int e = n0 + r;
                  return e < E ? wg + (long long)e * H + k0 : e < cols ? gate + k0 : nullptr;
              });
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
                    if (col < cols)
                        out[(long long)row * cols + col] = f.acc[mi][ni][2 * h];
                    if (col + 1 < cols)
                        out[(long long)row * cols + col + 1] = f.acc[mi][ni][2 * h + 1];
                }
            }
}

// ---- scoring and top-k: one warp per token ------------------------------------------------

__device__ __forceinline__ float sigmoidf_(float v) { return 1.f / (1.f + expf(-v)); }

// The logit of column c of a token's row: its K slices added in order (read through L2,
// __ldcg: in sc_moe_route_small another block of the same launch wrote them).
__device__ __forceinline__ float logit_at(const float *row, long long split_stride, int splits,
                                          int c)
{
    float v = 0.f;
    for (int z = 0; z < splits; z++)
        v += __ldcg(row + z * split_stride + c);
    return v;
}

// One token's scores and choice, by one warp (PL = experts per lane, E <= 32 PL): ids and
// weights of its k routed slots written, each chosen expert counted (counts may be global or
// shared memory, or null), and the shared expert's weight (sigmoid of the gate logit, or 1)
// to *shared_w when it is not null.
template <int PL>
__device__ __forceinline__ void topk_token(const float *row, long long split_stride,
                                           const float *sel_bias, const float *router_bias,
                                           int *ids, float *weights, int *counts,
                                           float *shared_w, const sc_moe_route_params &p)
{
    const int lane = threadIdx.x & 31, E = p.E, k = p.k;
    float score[PL], sel[PL];
    float mx = NEG_INF;
#pragma unroll
    for (int i = 0; i < PL; i++) {
        int e = i * 32 + lane;
        float v = NEG_INF;
        if (e < E) {
            v = logit_at(row, split_stride, p.splits, e);
            if (p.has_router_bias)
                v += router_bias[e];
        }
        score[i] = v;
        mx = fmaxf(mx, v);
    }
    if (!p.sigmoid) {
        for (int o = 16; o; o >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < PL; i++) {
            int e = i * 32 + lane;
            score[i] = e < E ? expf(score[i] - mx) : 0.f;
            sum += score[i];
        }
        for (int o = 16; o; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
#pragma unroll
        for (int i = 0; i < PL; i++)
            score[i] /= sum;
    } else {
#pragma unroll
        for (int i = 0; i < PL; i++)
            score[i] = sigmoidf_(score[i]);
    }
#pragma unroll
    for (int i = 0; i < PL; i++) {
        int e = i * 32 + lane;
        sel[i] = e < E ? score[i] + (p.has_sel_bias ? sel_bias[e] : 0.f) : NEG_INF;
        if (sel[i] != sel[i]) // NaN (from a NaN or Inf in x): never chosen over a number
            sel[i] = NEG_INF;
    }
    if (p.topk_group < p.n_group) {
        // Group-limited: a group's score is the sum of its two best selection scores; the
        // experts outside the topk_group best groups (ties: lower group) are out of the race.
        const int G = E / p.n_group;
        float mine = NEG_INF; // lane g: group g's score
        for (int g = 0; g < p.n_group; g++) {
            float b1 = NEG_INF, b2 = NEG_INF;
#pragma unroll
            for (int i = 0; i < PL; i++) {
                int e = i * 32 + lane;
                if (e < E && e / G == g) {
                    if (sel[i] > b1) {
                        b2 = b1;
                        b1 = sel[i];
                    } else if (sel[i] > b2) {
                        b2 = sel[i];
                    }
                }
            }
            for (int o = 16; o; o >>= 1) {
                float o1 = __shfl_xor_sync(0xffffffffu, b1, o);
                float o2 = __shfl_xor_sync(0xffffffffu, b2, o);
                float n2 = b1 >= o1 ? fmaxf(b2, o1) : fmaxf(b1, o2);
                b1 = fmaxf(b1, o1);
                b2 = n2;
            }
            if (lane == g)
                mine = b1 + b2 == b1 + b2 ? b1 + b2 : NEG_INF;
        }
        unsigned keep = 0;
        for (int j = 0; j < p.topk_group; j++) {
            float best = lane < p.n_group && !((keep >> lane) & 1u) ? mine : NEG_INF;
            int best_g = lane < p.n_group && !((keep >> lane) & 1u) ? lane : 0x7fffffff;
            for (int o = 16; o; o >>= 1) {
                float ob = __shfl_xor_sync(0xffffffffu, best, o);
                int og = __shfl_xor_sync(0xffffffffu, best_g, o);
                if (ob > best || (ob == best && og < best_g)) {
                    best = ob;
                    best_g = og;
                }
            }
            keep |= 1u << (best_g & 31);
        }
#pragma unroll
        for (int i = 0; i < PL; i++) {
            int e = i * 32 + lane;
            if (e < E && !((keep >> (e / G)) & 1u))
                sel[i] = NEG_INF;
        }
    }
    float chosen_w[SC_MOE_MAX_TOPK];
    int chosen_e[SC_MOE_MAX_TOPK];
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        // This lane's best (highest score, then lowest index), then the warp's.
        float best = NEG_INF, best_w = 0.f;
        int best_e = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < PL; i++) {
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
        for (int i = 0; i < PL; i++) // take it out of the race
            if (i * 32 + lane == best_e)
                sel[i] = NEG_INF;
    }
    if (lane == 0) {
        // Every choice is an expert (all -inf: the lowest index, chosen again); weights that
        // all underflow to 0 stay 0 when renormalized.
        for (int j = 0; j < k; j++) {
            const int e = chosen_e[j] < E ? chosen_e[j] : 0;
            ids[j] = e;
            weights[j] = (p.renormalize ? (total > 0.f ? chosen_w[j] / total : 0.f)
                                        : chosen_w[j]) *
                         p.scale;
            if (counts)
                atomicAdd(&counts[e], 1);
        }
        if (shared_w)
            *shared_w = p.has_gate ? sigmoidf_(logit_at(row, split_stride, p.splits, E)) : 1.f;
    }
}

// topk_token with the fewest experts per lane that hold E.
__device__ __forceinline__ void topk_any(const float *row, long long split_stride,
                                         const float *sel_bias, const float *router_bias,
                                         int *ids, float *weights, int *counts,
                                         float *shared_w, const sc_moe_route_params &p)
{
    if (p.E <= 128)
        topk_token<4>(row, split_stride, sel_bias, router_bias, ids, weights, counts, shared_w, p);
    else if (p.E <= 256)
        topk_token<8>(row, split_stride, sel_bias, router_bias, ids, weights, counts, shared_w, p);
    else
        topk_token<SC_MOE_MAX_EXPERTS / 32>(row, split_stride, sel_bias, router_bias, ids,
                                            weights, counts, shared_w, p);
}

// ids, weights [T, k]; counts [E] (null: not counted); shared_w [T] (null: not written).
extern "C" __global__ void sc_moe_topk(const float *logits, const float *sel_bias,
                                       const float *router_bias, int *ids, float *weights,
                                       int *counts, float *shared_w, sc_moe_route_params p)
{
    griddep_enter();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= p.T)
        return;
    topk_any(logits + (long long)t * p.logit_cols, (long long)p.T * p.logit_cols, sel_bias,
             router_bias, ids + (long long)t * p.k, weights + (long long)t * p.k, counts,
             shared_w ? shared_w + t : nullptr, p);
}

// ---- the caller's routing: expert counts, bad ids recorded, the shared expert's weight ---
//
// One thread per token. ids < 0 are padded slots; ids >= E are skipped and the first is
// recorded in fault[0 .. 3] = {bad ids seen, token, slot, id}. With a gate, its logits
// (router GEMM with E = 0, cols = 1) give the shared weight.

extern "C" __global__ void sc_moe_count_ids(const int *ids, const float *gate_logits, int *counts,
                                            float *shared_w, unsigned *fault,
                                            sc_moe_route_params p)
{
    griddep_enter();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= p.T)
        return;
    for (int j = 0; j < p.k; j++) {
        const int e = ids[(long long)t * p.k + j];
        if (e >= p.E) {
            if (atomicAdd(&fault[0], 1u) == 0u) {
                fault[1] = (unsigned)t;
                fault[2] = (unsigned)j;
                fault[3] = (unsigned)e;
            }
        } else if (e >= 0) {
            atomicAdd(&counts[e], 1);
        }
    }
    if (p.shared)
        shared_w[t] = p.has_gate ? sigmoidf_(logit_at(gate_logits + t, p.T, p.splits, 0)) : 1.f;
}

// ---- rows and tiles per group: one warp's exclusive scans ----------------------------------
//
// Group g < E has counts[g] rows, the shared chunks (g >= E) T each. Writes row_offsets and
// tile_offsets [groups + 1] (and off[g], when not null, a copy of the row offsets).

__device__ __forceinline__ void scan_groups(const int *counts, int E, int groups, int T,
                                            int *row_offsets, int *tile_offsets, int *off)
{
    const int lane = threadIdx.x & 31;
    int carry_r = 0, carry_t = 0;
    for (int base = 0; base < groups; base += 32) {
        const int g = base + lane;
        const int rows = g < E ? counts[g] : g < groups ? T : 0, tiles = (rows + BM - 1) / BM;
        int r = rows, t = tiles;
        for (int o = 1; o < 32; o <<= 1) {
            int ur = __shfl_up_sync(0xffffffffu, r, o), ut = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) {
                r += ur;
                t += ut;
            }
        }
        if (g < groups) {
            row_offsets[g] = carry_r + r - rows;
            tile_offsets[g] = carry_t + t - tiles;
            if (off)
                off[g] = carry_r + r - rows;
        }
        carry_r += __shfl_sync(0xffffffffu, r, 31);
        carry_t += __shfl_sync(0xffffffffu, t, 31);
    }
    if (lane == 0) {
        row_offsets[groups] = carry_r;
        tile_offsets[groups] = carry_t;
    }
}

// The expert and weight of slot j of token t: routed slots from ids / weights (a bad or
// padded id gives -1), shared slots k .. k + S - 1 the shared chunks with the shared weight
// (for the first shared_rows tokens: an expert-parallel layer's own tokens; -1 after them).
__device__ __forceinline__ int slot_expert(const int *ids, const float *weights,
                                           const float *shared_w, int t, int j, int E, int k,
                                           int shared_rows, float *w)
{
    if (j < k) {
        const int e = ids[(long long)t * k + j];
        *w = weights[(long long)t * k + j];
        return e >= 0 && e < E ? e : -1;
    }
    *w = shared_w[t];
    return t < shared_rows ? E + j - k : -1;
}

// ---- routing for few tokens (decode): one launch -----------------------------------------
//
// For T <= SC_MOE_ROUTE_SMALL_MAX_T. Every block computes logits for SC_MOE_ROUTE_EXPERTS
// columns (routed experts, then the shared gate) and up to SC_MOE_ROUTE_TOKENS tokens; the
// last block to finish (a ticket counter, reset by that block for the next launch) then does
// what the separate kernels do for many tokens: scores and top-k, the counts, the row and
// tile offsets, the permutation, and (gather != 0) x in expert order (rows ldx apart, the
// data from column xoff). Nothing needs zeroing beforehand.

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

#define ROUTE_SLOTS (SC_MOE_MAX_TOPK + SC_MOE_MAX_SHARED)

// Logits of EX columns from column e0 of [Wg; gate] (E rows of Wg, then the gate row) for
// all T (<= SC_MOE_ROUTE_TOKENS) tokens, by one block of SC_MOE_ROUTE_THREADS: the warps
// split H, each lane keeps EX x TOKENS partial sums; x and the weight rows are read with
// unconditional 16-byte loads (rows past T repeat row T - 1, columns past the last repeat
// it: ignored) so that every load of a step is in flight at once. Then lanes, then warps
// are summed (in warp order). A column's value does not depend on EX or e0: the routing
// (EX = SC_MOE_ROUTE_EXPERTS) and the caller routing's gate (EX = 1) get the same bits.
template <int EX>
__device__ __forceinline__ void small_logits(const bf16_t *x, const bf16_t *wg, const bf16_t *gate,
                                             float *logits, int T, int E, int cols, int H, int e0)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int NW = SC_MOE_ROUTE_THREADS / 32, TK = SC_MOE_ROUTE_TOKENS;
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
        for (int a = 0; a < EX; a++) {
            const int c = min(e0 + a, cols - 1);
            wr[a] = reinterpret_cast<const uint4 *>(c < E ? wg + (long long)c * H : gate);
        }
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
        if (e0 + a < cols && j < T)
            logits[(long long)j * cols + e0 + a] = v;
    }
}

extern "C" __global__ void __launch_bounds__(SC_MOE_ROUTE_THREADS)
sc_moe_route_small(const bf16_t *x, const bf16_t *wg, const bf16_t *gate, const float *sel_bias,
                   const float *router_bias, float *logits, int *ids, float *weights,
                   float *shared_w, int *row_offsets, int *tile_offsets, int *perm_token,
                   float *perm_weight, int *pos, bf16_t *x_perm, unsigned *ticket, int H,
                   int ldx, int xoff, int gather, sc_moe_route_params p)
{
    griddep_enter();
    const int T = p.T, E = p.E, k = p.k, cols = p.logit_cols;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int NW = SC_MOE_ROUTE_THREADS / 32;
    small_logits<SC_MOE_ROUTE_EXPERTS>(x, wg, gate, logits, T, E, cols, H,
                                       blockIdx.x * SC_MOE_ROUTE_EXPERTS);

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

    __shared__ int counts[SC_MOE_MAX_GROUPS], offs[SC_MOE_MAX_GROUPS], cursor[SC_MOE_MAX_GROUPS];
    __shared__ int perm[SC_MOE_ROUTE_SMALL_MAX_T * ROUTE_SLOTS];
    const int groups = E + p.shared;
    for (int i = threadIdx.x; i < groups; i += blockDim.x) {
        counts[i] = 0;
        cursor[i] = 0;
    }
    __syncthreads();
    for (int t = warp; t < T; t += NW)
        topk_any(logits + (long long)t * cols, 0, sel_bias, router_bias, ids + (long long)t * k,
                 weights + (long long)t * k, counts, shared_w + t, p);
    __syncthreads();
    if (warp == 0)
        scan_groups(counts, E, groups, T, row_offsets, tile_offsets, offs);
    __syncthreads();
    const int slots = k + p.shared, n = T * slots;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float w;
        const int t = i / slots, ex = slot_expert(ids, weights, shared_w, t, i % slots, E, k, T, &w);
        if (ex < 0) { // (top-k writes experts only: a backstop)
            pos[i] = -1;
            continue;
        }
        const int q = offs[ex] + atomicAdd(&cursor[ex], 1);
        perm[q] = t;
        perm_token[q] = t;
        perm_weight[q] = w;
        pos[i] = q;
    }
    __syncthreads();
    if (gather)
        for (int q = warp; q < row_offsets[groups]; q += NW) {
            const uint4 *src = reinterpret_cast<const uint4 *>(x + (long long)perm[q] * H);
            uint4 *dst = reinterpret_cast<uint4 *>(x_perm + (long long)q * ldx + xoff);
            for (int c = lane; c < H / 8; c += 32)
                dst[c] = src[c];
        }
    if (threadIdx.x == 0)
        *ticket = 0u;
}

// The shared gate's logits for the caller's routing of few tokens (T <= SC_MOE_ROUTE_SMALL_MAX_T,
// one block): logits[t] = x[t] . gate, the same bits as sc_moe_route_small's gate column.
extern "C" __global__ void __launch_bounds__(SC_MOE_ROUTE_THREADS)
sc_moe_gate_small(const bf16_t *x, const bf16_t *gate, float *logits, int T, int H)
{
    griddep_enter();
    small_logits<1>(x, gate, gate, logits, T, 0, 1, H, 0);
}

// x in expert order, one warp per row: x_perm[p] = x[perm_token[p]] (rows: a bound; the
// rows past row_offsets[groups] are not real and are skipped); x_perm's rows are ldx apart,
// the data from column xoff (a multiple of 8).
extern "C" __global__ void sc_moe_gather(const int *perm_token, const int *row_offsets,
                                         const bf16_t *x, bf16_t *x_perm, int rows, int groups,
                                         int H, int ldx, int xoff)
{
    griddep_enter();
    const long long q = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (q >= rows || q >= row_offsets[groups])
        return;
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (long long)perm_token[q] * H);
    uint4 *dst = reinterpret_cast<uint4 *>(x_perm + q * ldx + xoff);
    for (int c = lane; c < H / 8; c += 32)
        dst[c] = src[c];
}

// The fp8 gathers' warp: row q = warp / (H / 128) and its block b = warp % (H / 128); false
// past the rows (the launch's bound, or the rows the routing made: used).
__device__ __forceinline__ bool fp8_row_block(int rows, int used, int H, long long *q, int *b)
{
    const int nb = H / 128;
    const long long w = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    *q = w / nb;
    *b = (int)(w - *q * nb);
    return *q < rows && *q < used;
}

// fp8 experts: x gathered into expert order and quantized on the way, one warp per row and
// 128 channels (row q = warp / (H / 128), block b = warp % (H / 128)): the block's largest
// magnitude amax, the scale amax / 448 (1 when amax is 0) into x_scale [H / 128][rows_cap],
// and e4m3(x * (448 / amax)) into x_q's rows (ldx apart, the data from column xoff, a
// multiple of 16; each lane 4 channels; the rule of util/fp8.cuh, as sc_quantize_fp8_tokens
// quantizes).
extern "C" __global__ void sc_moe_gather_fp8(const int *perm_token, const int *row_offsets,
                                             const bf16_t *x, unsigned char *x_q,
                                             float *x_scale, int rows, int groups, int H,
                                             int ldx, int xoff, int rows_cap)
{
    griddep_enter();
    long long q;
    int b;
    const int lane = threadIdx.x & 31;
    if (!fp8_row_block(rows, row_offsets[groups], H, &q, &b))
        return;
    const uint2 v = reinterpret_cast<const uint2 *>(x + (long long)perm_token[q] * H)[b * 32 + lane];
    float scale;
    reinterpret_cast<unsigned *>(x_q + q * ldx + xoff)[b * 32 + lane] =
        quantize_block_bf16x4(v, &scale);
    if (lane == 0)
        x_scale[(long long)b * rows_cap + q] = scale;
}

// The same for rows that come quantized (an expert-parallel layer's dispatch sends e4m3 rows
// with their per-128-channel scales, made by the same rule): one warp per row and block
// copies the block's 128 bytes from xq [., H] and its scale from xs [., H / 128] (rows in
// token order) into x_q and x_scale as sc_moe_gather_fp8 lays them out.
extern "C" __global__ void sc_moe_gather_q(const int *perm_token, const int *row_offsets,
                                           const unsigned char *xq, const float *xs,
                                           unsigned char *x_q, float *x_scale, int rows,
                                           int groups, int H, int ldx, int xoff, int rows_cap)
{
    griddep_enter();
    const int nb = H / 128, lane = threadIdx.x & 31;
    long long q;
    int b;
    if (!fp8_row_block(rows, row_offsets[groups], H, &q, &b))
        return;
    const long long t = perm_token[q];
    reinterpret_cast<unsigned *>(x_q + q * ldx + xoff)[b * 32 + lane] =
        reinterpret_cast<const unsigned *>(xq + t * H)[b * 32 + lane];
    if (lane == 0)
        x_scale[(long long)b * rows_cap + q] = xs[t * nb + b];
}

// ---- offsets: rows and tiles per group (one block) ---------------------------------------
//
// Exclusive scans of the rows (counts; the shared chunks T each: the tokens with a shared
// expert, the first T of an expert-parallel layer's rows) and of the BM-row tiles
// per group: the counts loaded into shared memory by the whole block at once, then scanned
// by warp 0; the cursors of the scatter are reset.

extern "C" __global__ void sc_moe_offsets(const int *counts, int *row_offsets, int *tile_offsets,
                                          int *cursor, int E, int groups, int T)
{
    griddep_enter();
    __shared__ int c[SC_MOE_MAX_GROUPS];
    for (int g = threadIdx.x; g < E; g += blockDim.x)
        c[g] = counts[g];
    __syncthreads();
    if (threadIdx.x < 32)
        scan_groups(c, E, groups, T, row_offsets, tile_offsets, nullptr);
    for (int g = threadIdx.x; g < groups; g += blockDim.x)
        cursor[g] = 0;
}

// ---- the permutation: expert-major rows --------------------------------------------------
//
// Slot i = t (k + S) + j: pos[i] = its row, or -1 for a padded (or bad) routed slot, and
// for a shared slot of a token from shared_rows on (T but in an expert-parallel layer).

extern "C" __global__ void sc_moe_scatter(const int *ids, const float *weights,
                                          const float *shared_w, const int *row_offsets,
                                          int *cursor, int *perm_token, float *perm_weight,
                                          int *pos, int T, int E, int k, int shared,
                                          int shared_rows)
{
    griddep_enter();
    const int slots = k + shared;
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= (long long)T * slots)
        return;
    const int t = (int)(i / slots);
    float w;
    const int e =
        slot_expert(ids, weights, shared_w, t, (int)(i % slots), E, k, shared_rows, &w);
    if (e < 0) {
        pos[i] = -1;
        return;
    }
    int q = row_offsets[e] + atomicAdd(&cursor[e], 1);
    perm_token[q] = t;
    perm_weight[q] = w;
    pos[i] = q;
}

// The same, one warp per slot, that also copies the token's row of x to row q of x_perm
// (for GEMMs that read A through the copy engine, which cannot gather rows; rows ldx apart,
// the data from column xoff).
extern "C" __global__ void sc_moe_scatter_gather(const int *ids, const float *weights,
                                                 const float *shared_w, const int *row_offsets,
                                                 int *cursor, int *perm_token, float *perm_weight,
                                                 int *pos, const bf16_t *x, bf16_t *x_perm, int T,
                                                 int E, int k, int shared, int shared_rows,
                                                 int H, int ldx, int xoff)
{
    griddep_enter();
    const int slots = k + shared;
    const long long i = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (i >= (long long)T * slots)
        return;
    const int t = (int)(i / slots);
    float w;
    const int e =
        slot_expert(ids, weights, shared_w, t, (int)(i % slots), E, k, shared_rows, &w);
    if (e < 0) {
        if (lane == 0)
            pos[i] = -1;
        return;
    }
    int q = 0;
    if (lane == 0) {
        q = row_offsets[e] + atomicAdd(&cursor[e], 1);
        perm_token[q] = t;
        perm_weight[q] = w;
        pos[i] = q;
    }
    q = __shfl_sync(0xffffffffu, q, 0);
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (long long)t * H);
    uint4 *dst = reinterpret_cast<uint4 *>(x_perm + (long long)q * ldx + xoff);
    for (int c = lane; c < H / 8; c += 32)
        dst[c] = src[c];
}

// ---- W13: h[p, :] = act(x[tok(p)] W_gate[e]^T + b, x[tok(p)] W_up[e]^T + b) --------------
//
// A tile holds BN/2 output columns; its B rows are arranged so that each warp's 32 rows are
// 16 gate rows followed by the 16 up rows of the same columns, and the activation happens in
// registers. Routed expert e's rows come from W13[e] [2I, H] (stacked or interleaved),
// shared chunk s = e - E's from the shared W13 [2 S I, H] (the same layout over S I rows).

__device__ __forceinline__ const bf16_t *w13_row(const bf16_t *w13, const bf16_t *sw13,
                                                 const sc_moe_expert_params &q, int e, int col,
                                                 int up)
{
    const int I = q.I, H = q.H;
    if (e < q.E) {
        const long long r = q.interleaved ? 2 * col + up : up * I + col;
        return w13 + ((long long)e * 2 * I + r) * H;
    }
    const long long Is = (long long)(q.groups - q.E) * I, c = (long long)(e - q.E) * I + col;
    return sw13 + (q.interleaved ? 2 * c + up : up * Is + c) * H;
}

extern "C" __global__ void __launch_bounds__(THREADS)
sc_moe_gemm_w13(const bf16_t *x, const int *perm_token, const bf16_t *w13, const bf16_t *sw13,
                const float *b13, bf16_t *h, const int *tile_offsets, const int *row_offsets,
                sc_moe_expert_params q)
{
    griddep_enter();
    extern __shared__ __align__(128) bf16_t smem[];
    int e, row0, row_end;
    if (!find_tile(tile_offsets, row_offsets, q.groups, &e, &row0, &row_end))
        return;
    const int I = q.I, H = q.H;
    const int c0 = blockIdx.y * (BN / 2);
    Frag f;
    gemm_tile(f, smem, H, x,
              [&](int r) -> const bf16_t * {
                  int p = row0 + r;
                  return p < row_end ? x + (long long)perm_token[p] * H : nullptr;
              },
              [&](int r) -> const bf16_t * {
                  int warp_cols = r >> 5, within = r & 31;
                  int col = c0 + warp_cols * 16 + (within & 15);
                  return col < I ? w13_row(w13, sw13, q, e, col, within >> 4) : nullptr;
              });
    const bool bias = q.has_bias && e < q.E;
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
                    if (bias) {
                        float2 b0 = moe_b13(b13, e, col, I, q.interleaved);
                        float2 b1 = moe_b13(b13, e, col + 1, I, q.interleaved);
                        g0 += b0.x, u0 += b0.y, g1 += b1.x, u1 += b1.y;
                    }
                    float h0 = moe_act(g0, u0, q.act, q.alpha, q.limit);
                    float h1 = moe_act(g1, u1, q.act, q.alpha, q.limit);
                    *reinterpret_cast<unsigned *>(h + (long long)p * I + col) = pack_bf16x2(h0, h1);
                }
            }
}

// ---- W2: y[p, :] = weight(p) * (h[p] W2[e]^T + b2[e]) ------------------------------------
//
// Shared chunk s = e - E reads columns s I .. s I + I - 1 of the shared W2 [H, S I].

extern "C" __global__ void __launch_bounds__(THREADS)
sc_moe_gemm_w2(const bf16_t *h, const bf16_t *w2, const bf16_t *sw2, const float *b2,
               const float *perm_weight, bf16_t *y, const int *tile_offsets,
               const int *row_offsets, sc_moe_expert_params q)
{
    griddep_enter();
    extern __shared__ __align__(128) bf16_t smem[];
    int e, row0, row_end;
    if (!find_tile(tile_offsets, row_offsets, q.groups, &e, &row0, &row_end))
        return;
    const int I = q.I, H = q.H;
    const int n0 = blockIdx.y * BN;
    const long long Is = (long long)(q.groups - q.E) * I;
    Frag f;
    gemm_tile(f, smem, I, h,
              [&](int r) -> const bf16_t * {
                  int p = row0 + r;
                  return p < row_end ? h + (long long)p * I : nullptr;
              },
              [&](int r) -> const bf16_t * {
                  if (n0 + r >= H)
                      return nullptr;
                  return e < q.E ? w2 + ((long long)e * H + n0 + r) * I
                                 : sw2 + (long long)(n0 + r) * Is + (long long)(e - q.E) * I;
              });
    const bool bias = q.has_bias && e < q.E;
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
                if (col < H) {
                    float a0 = f.acc[mi][ni][2 * hh], a1 = f.acc[mi][ni][2 * hh + 1];
                    if (bias) {
                        a0 += b2[(long long)e * H + col];
                        a1 += b2[(long long)e * H + col + 1];
                    }
                    *reinterpret_cast<unsigned *>(y + (long long)p * H + col) =
                        pack_bf16x2(a0 * s, a1 * s);
                }
            }
        }
}

// ---- combine: out[t] (+)= sum over slots j (in order) of y[pos[t, j]] --------------------

extern "C" __global__ void sc_moe_combine(const bf16_t *y, const int *pos, bf16_t *out, int T,
                                          int slots, int H, int accumulate)
{
    griddep_enter();
    const int t = blockIdx.x;
    if (t >= T)
        return;
    int rows[ROUTE_SLOTS];
    for (int j = 0; j < slots; j++)
        rows[j] = pos[(long long)t * slots + j];
    for (int c = threadIdx.x; c < H / 8; c += blockDim.x) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        uint4 *o = reinterpret_cast<uint4 *>(out + (long long)t * H + c * 8);
        if (accumulate)
            load_bf16x8(acc, *o);
        for (int j = 0; j < slots; j++)
            if (rows[j] >= 0)
                add_bf16x8(acc, *reinterpret_cast<const uint4 *>(y + (long long)rows[j] * H +
                                                                 c * 8));
        *o = pack_bf16x8(acc);
    }
}
