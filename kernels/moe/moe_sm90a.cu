// The Mixture-of-Experts grouped GEMMs for Hopper (sm_90a): warp-specialized, persistent,
// fed by the bulk tensor copy engine (TMA) through a ring of shared-memory stages, computed
// by warpgroup MMAs (wgmma, bf16 in, fp32 accumulate). kernels/moe/moe.cu does the routing
// (router, top-k, offsets, the permutation that also gathers x into expert order) and the
// combine; these kernels replace its mma.sync GEMMs on sm_90.
//
// A CTA has 1 producer warpgroup (one thread issues the TMA copies) and CONS consumer
// warpgroups; each consumer owns 64 rows of the BM = 64 * CONS row tile and all BN columns.
// Stage s of the ring holds an A tile [BM x 64] and a B tile [BN x 64] of bf16, each row 128
// bytes in the 128-byte swizzle that TMA writes and wgmma reads. full[s] completes when the
// copies land (transaction bytes); empty[s] when every consumer is done with the stage.
//
// Tiles: the M tiles of every expert in turn (row_offsets / BM per expert) times the N
// tiles; CTAs take tiles t = blockIdx.x, + gridDim.x, ... in a grouped order (GROUP_M M
// tiles share each N tile) so that one expert's weight tile is read from memory once and
// served to the M tiles from L2. Rows of a tile past its expert's last row belong to the next
// expert (or lie past the end, read as zeros): they are computed and not stored.
//
// Deterministic: every output element is one thread's fixed sequence of MMAs over K.
//
// Tuning parameters: moe/moe_config.cuh (SC_MOE_SM90_*).

#include "moe/moe_config.cuh"
#include "moe/moe_device.cuh"

typedef unsigned short bf16_t;

// A CUtensorMap as the kernel receives it (128 bytes, by value, __grid_constant__).
struct __align__(64) tmap_t {
    unsigned long long v[16];
};

// ---- PTX wrappers ----------------------------------------------------------------------------

__device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

// A box of the 2-D tensor map at (column c0, row c1) into shared memory; completes on bar.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const tmap_t *map, int c0, int c1,
                                            unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const tmap_t *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((unsigned long long)map) : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Shared-memory matrix descriptor: K-major rows of 128 bytes in the 128-byte swizzle, 8-row
// groups 1024 bytes apart. The tile starts 1024-byte aligned; stepping K by 16 elements
// adds 32 bytes to the start address.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr)
{
    unsigned long long d = 0;
    d |= (unsigned long long)((addr & 0x3ffff) >> 4);
    d |= (unsigned long long)1 << 16;            // leading byte offset (unused when swizzled)
    d |= (unsigned long long)(1024 >> 4) << 32;  // stride byte offset: 8 rows x 128 bytes
    d |= (unsigned long long)1 << 62;            // 128-byte swizzle
    return d;
}

// One warpgroup MMA, D[64 x N] (+)= A[64 x 16] * B[N x 16]^T (bf16 in, fp32 accumulate),
// both operands in shared memory (K-major, 128-byte swizzle), for the tile widths N = BN of
// the kernels (64, 128, 256): wgmma_tile<N>. The operands of the instruction, numbered as
// the asm statement numbers them (outputs first):
//   %0 .. %(R - 1)   this thread's R = N / 2 fp32 accumulators d[0 .. R - 1], read and
//                    written ("+f"; their layout: the epilogue of grouped_gemm)
//   %R, %(R + 1)     the A and B shared-memory matrix descriptors (smem_desc)
//   %(R + 2)         scale_d: 0 overwrites D (a tile's first K step), else D += A B^T
// then the immediates imm-scale-a = imm-scale-b = 1 (no negation) and imm-trans-a =
// imm-trans-b = 0 (both K-major). The asm text must be a string literal, so the accumulator
// registers are spelled once, in groups of 16, and each width takes the first R of them;
// their "+f" operands are generated to match.
#define SC_WGMMA_R0 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define SC_WGMMA_R1 \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SC_WGMMA_R2 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define SC_WGMMA_R3 \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define SC_WGMMA_R4 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define SC_WGMMA_R5 \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define SC_WGMMA_R6 \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define SC_WGMMA_R7 \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define SC_WGMMA_REGS_32 SC_WGMMA_R0 "," SC_WGMMA_R1
#define SC_WGMMA_REGS_64 SC_WGMMA_REGS_32 "," SC_WGMMA_R2 "," SC_WGMMA_R3
#define SC_WGMMA_REGS_128                                                                  \
    SC_WGMMA_REGS_64 "," SC_WGMMA_R4 "," SC_WGMMA_R5 "," SC_WGMMA_R6 "," SC_WGMMA_R7
// The accumulators d[i .. i + 7] (and so on) as read-and-written asm operands.
#define SC_WGMMA_ACC_8(i)                                                                  \
    "+f"(d[(i) + 0]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), \
        "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define SC_WGMMA_ACC_32(i)                                                                 \
    SC_WGMMA_ACC_8(i), SC_WGMMA_ACC_8((i) + 8), SC_WGMMA_ACC_8((i) + 16), SC_WGMMA_ACC_8((i) + 24)
#define SC_WGMMA_ACC_64(i) SC_WGMMA_ACC_32(i), SC_WGMMA_ACC_32((i) + 32)
#define SC_WGMMA_ACC_128(i) SC_WGMMA_ACC_64(i), SC_WGMMA_ACC_64((i) + 64)

template <int N> __device__ __forceinline__ void wgmma_tile(float *d, unsigned long long da,
                                                            unsigned long long db, int scale_d);

// wgmma_tile<N> with R accumulators; DA, DB and SCALE_D are the operand numbers R, R + 1
// and R + 2, written out because the asm text is a literal (checked below).
#define SC_WGMMA_TILE(N, R, DA, DB, SCALE_D)                                                 \
    template <>                                                                              \
    __device__ __forceinline__ void wgmma_tile<N>(float *d, unsigned long long da,           \
                                                  unsigned long long db, int scale_d)        \
    {                                                                                        \
        static_assert(R == N / 2 && DA == R && DB == R + 1 && SCALE_D == R + 2,              \
                      "wgmma_tile: operand numbers");                                        \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE_D ", 0;\n"                 \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {"            \
                     SC_WGMMA_REGS_##R "}, %" #DA ", %" #DB ", p, 1, 1, 0, 0;\n}\n"          \
                     : SC_WGMMA_ACC_##R(0)                                                   \
                     : "l"(da), "l"(db), "r"(scale_d));                                      \
    }
//            N    R    A    B    scale_d
SC_WGMMA_TILE(64,  32,  32,  33,  34)
SC_WGMMA_TILE(128, 64,  64,  65,  66)
SC_WGMMA_TILE(256, 128, 128, 129, 130)

// ---- the tile schedule ---------------------------------------------------------------------

struct tile_t {
    int e;       // expert
    int row0;    // first row (in expert order) of the tile
    int row_end; // the expert's end row
    int n;       // N tile
};

// Tile t of m_total x n_tiles in the grouped order, its expert found in the tile offsets
// (shared memory). False past the last tile.
template <int BM>
__device__ __forceinline__ bool get_tile(int t, int m_total, int n_tiles, int group_m,
                                         const int *tile_off, const int *row_off, int E,
                                         tile_t &tl)
{
    if (t >= m_total * n_tiles)
        return false;
    const int per_group = group_m * n_tiles;
    const int group = t / per_group, first_m = group * group_m;
    const int gm = min(group_m, m_total - first_m);
    const int within = t - group * per_group;
    const int m = first_m + within % gm;
    tl.n = within / gm;
    const int lo = group_of_tile(tile_off, E, m);
    tl.e = lo;
    tl.row0 = row_off[lo] + (m - tile_off[lo]) * BM;
    tl.row_end = row_off[lo + 1];
    return true;
}

// ---- the kernel body -------------------------------------------------------------------------
//
// MODE_W13: A = x in expert order [R, H]; B = the gate and up rows of W13 through two maps
//           (g_map, u_map: row r of each is expert r / rows_per_expert's gate / up row), and
//           of the shared W13 through sg_map, su_map (chunk s's rows at s I); a tile's B
//           rows are BN/2 gate rows then the BN/2 up rows of the same columns; out = h [R, I]
//           with h = act(gate + bias, up + bias), BN/2 columns per tile.
// MODE_W2:  A = h [R, I]; B = W2 [E * H, I] through g_map, the shared W2 [H, S I] through
//           sg_map (chunk s at column s I); out = y [R, H] = weight(row) * (h W2^T + bias),
//           BN columns per tile.
enum { MODE_W13 = 0, MODE_W2 = 1 };

template <int CONS, int BN, int STAGES> struct cfg {
    static constexpr int BM = 64 * CONS;
    static constexpr int THREADS = 128 * (CONS + 1);
    static constexpr int A_BYTES = BM * 128;
    static constexpr int B_BYTES = BN * 128;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int SMEM = SC_MOE_SM90_SMEM(CONS, BN, STAGES);
};

template <int MODE, int CONS, int BN, int STAGES, int A_BOX>
__device__ __forceinline__ void grouped_gemm(const tmap_t *a_map, const tmap_t *g_map,
                                             const tmap_t *u_map, const tmap_t *sg_map,
                                             const tmap_t *su_map, bf16_t *out,
                                             const float *row_weight, const float *bias,
                                             const int *row_offsets,
                                             const sc_moe_expert_params &q, int N, int K,
                                             int b_rows_per_expert)
{
    typedef cfg<CONS, BN, STAGES> C;
    constexpr int BM = C::BM;
    const int E = q.E, groups = q.groups, group_m = q.group_m;
    extern __shared__ unsigned char smem_raw[];
    // The ring, 1024-byte aligned for the 128-byte swizzle.
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    unsigned char *base_ptr = smem_raw + (base - smem_u32(smem_raw));
    const unsigned ring = base;
    const unsigned full_bar = ring + STAGES * C::STAGE_BYTES;
    const unsigned empty_bar = full_bar + STAGES * 8;
    int *tile_off = reinterpret_cast<int *>(base_ptr + STAGES * C::STAGE_BYTES + 2 * STAGES * 8);
    int *row_off = tile_off + SC_MOE_MAX_GROUPS + 1;

    const int tid = threadIdx.x;
    griddep_enter(); // (a programmatic launch: see moe_device.cuh)
    // The offsets: rows per group from row_offsets, M tiles per group scanned by warp 0.
    for (int g = tid; g <= groups; g += C::THREADS)
        row_off[g] = row_offsets[g];
    __syncthreads();
    if (tid < 32) {
        const int lane = tid;
        int carry = 0;
        for (int b = 0; b < groups; b += 32) {
            const int g = b + lane;
            const int v = g < groups ? (row_off[g + 1] - row_off[g] + BM - 1) / BM : 0;
            int incl = v;
            for (int o = 1; o < 32; o <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += u;
            }
            if (g < groups)
                tile_off[g] = carry + incl - v;
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0)
            tile_off[groups] = carry;
    }
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full_bar + s * 8, 1);
            mbar_init(empty_bar + s * 8, CONS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();

    const int m_total = tile_off[groups];
    const int n_tiles = MODE == MODE_W13 ? (N + BN / 2 - 1) / (BN / 2) : (N + BN - 1) / BN;
    const int k_tiles = (K + 63) / 64;
    const int wg = tid >> 7;

    if (wg == 0) {
        // ---- producer ----
        if (CONS > 1) // free registers for the consumers (one consumer has plenty)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            tma_prefetch_map(a_map);
            tma_prefetch_map(g_map);
            if (MODE == MODE_W13)
                tma_prefetch_map(u_map);
            if (groups > E) {
                tma_prefetch_map(sg_map);
                if (MODE == MODE_W13)
                    tma_prefetch_map(su_map);
            }
            int it = 0;
            tile_t tl;
            for (int t = blockIdx.x; get_tile<BM>(t, m_total, n_tiles, group_m, tile_off, row_off, groups, tl);
                 t += gridDim.x) {
                const bool routed = tl.e < E;
                // B's row and column of this tile (the shared W2 chunk: its columns).
                const int b_row = MODE == MODE_W13
                                      ? (routed ? tl.e * b_rows_per_expert : (tl.e - E) * q.I) +
                                            tl.n * (BN / 2)
                                      : (routed ? tl.e * b_rows_per_expert : 0) + tl.n * BN;
                const int b_col = MODE == MODE_W2 && !routed ? (tl.e - E) * q.I : 0;
                const tmap_t *gm = routed ? g_map : sg_map, *um = routed ? u_map : su_map;
                for (int kt = 0; kt < k_tiles; kt++, it++) {
                    const int s = it % STAGES;
                    const unsigned ph = (unsigned)(it / STAGES) & 1u;
                    mbar_wait(empty_bar + s * 8, ph ^ 1u);
                    const unsigned fb = full_bar + s * 8;
                    const unsigned sa = ring + s * C::STAGE_BYTES, sb = sa + C::A_BYTES;
                    // A: only the boxes of A_BOX rows that hold rows of this expert (a
                    // decode tile has few); the other rows of the stage keep stale data,
                    // computed and never stored.
                    const int a_boxes = (min(BM, tl.row_end - tl.row0) + A_BOX - 1) / A_BOX;
                    mbar_expect_tx(fb, a_boxes * A_BOX * 128 + C::B_BYTES);
                    for (int i = 0; i < a_boxes; i++)
                        tma_load_2d(sa + i * A_BOX * 128, a_map, kt * 64, tl.row0 + i * A_BOX, fb);
                    if (MODE == MODE_W13) {
                        tma_load_2d(sb, gm, kt * 64, b_row, fb);
                        tma_load_2d(sb + (BN / 2) * 128, um, kt * 64, b_row, fb);
                    } else {
                        tma_load_2d(sb, gm, b_col + kt * 64, b_row, fb);
                    }
                }
            }
        }
    } else {
        // ---- consumers ----
        if (CONS > 1)
            asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
        const int c = wg - 1;               // this warpgroup's 64 rows of the tile
        const int wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++)
            acc[i] = 0.f;
        int it = 0;
        tile_t tl;
        for (int t = blockIdx.x; get_tile<BM>(t, m_total, n_tiles, group_m, tile_off, row_off, groups, tl);
             t += gridDim.x) {
            int prev = -1;
            for (int kt = 0; kt < k_tiles; kt++, it++) {
                const int s = it % STAGES;
                const unsigned ph = (unsigned)(it / STAGES) & 1u;
                mbar_wait(full_bar + s * 8, ph);
                const unsigned sa = ring + s * C::STAGE_BYTES + c * 64 * 128;
                const unsigned sb = ring + s * C::STAGE_BYTES + C::A_BYTES;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    wgmma_tile<BN>(acc, smem_desc(sa + kk * 32), smem_desc(sb + kk * 32),
                                   kt > 0 || kk > 0);
                wgmma_commit();
                wgmma_wait<1>(); // the previous stage's MMAs are done: give it back
                if (prev >= 0 && wtid == 0)
                    mbar_arrive(empty_bar + prev * 8);
                prev = s;
            }
            wgmma_wait<0>();
            if (prev >= 0 && wtid == 0)
                mbar_arrive(empty_bar + prev * 8);

            // ---- epilogue: registers to global ----
            // acc[f * 4 + q]: row r0 (+8 for q >= 2), column f * 8 + 2 * (lane % 4) (+1 for odd q).
            const int r0 = tl.row0 + c * 64 + warp * 16 + (lane >> 2);
            const int cl = 2 * (lane & 3);
            const bool has_bias = q.has_bias && tl.e < E;
            if (MODE == MODE_W13) {
                const int col0 = tl.n * (BN / 2);
#pragma unroll
                for (int f = 0; f < BN / 16; f++) {
                    const int col = col0 + f * 8 + cl;
                    float2 bb0 = make_float2(0.f, 0.f), bb1 = bb0;
                    if (has_bias && col < N) {
                        bb0 = moe_b13(bias, tl.e, col, N, q.interleaved);
                        bb1 = moe_b13(bias, tl.e, col + 1, N, q.interleaved);
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = r0 + 8 * h;
                        if (row < tl.row_end && col < N) {
                            float g0 = acc[f * 4 + 2 * h], g1 = acc[f * 4 + 2 * h + 1];
                            float u0 = acc[(f + BN / 16) * 4 + 2 * h];
                            float u1 = acc[(f + BN / 16) * 4 + 2 * h + 1];
                            if (has_bias) {
                                g0 += bb0.x, g1 += bb1.x;
                                u0 += bb0.y, u1 += bb1.y;
                            }
                            float h0 = moe_act(g0, u0, q.act, q.alpha, q.limit);
                            float h1 = moe_act(g1, u1, q.act, q.alpha, q.limit);
                            *reinterpret_cast<unsigned *>(out + (long long)row * N + col) =
                                pack_bf16x2(h0, h1);
                        }
                    }
                }
            } else {
                const int col0 = tl.n * BN;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = r0 + 8 * h;
                    if (row >= tl.row_end)
                        continue;
                    const float w = row_weight[row];
#pragma unroll
                    for (int f = 0; f < BN / 8; f++) {
                        const int col = col0 + f * 8 + cl;
                        if (col < N) {
                            float a0 = acc[f * 4 + 2 * h], a1 = acc[f * 4 + 2 * h + 1];
                            if (has_bias) {
                                a0 += bias[(long long)tl.e * N + col];
                                a1 += bias[(long long)tl.e * N + col + 1];
                            }
                            *reinterpret_cast<unsigned *>(out + (long long)row * N + col) =
                                pack_bf16x2(a0 * w, a1 * w);
                        }
                    }
                }
            }
        }
    }
}

// ---- the kernels -------------------------------------------------------------------------------
//
// The tensor maps are passed with sc_arg_tensor_map_in, which checks and orders their views
// like view arguments. Grid: at most one CTA per SM (persistent); block: 128 * (CONS + 1)
// threads; dynamic shared memory: SC_MOE_SM90_SMEM(CONS, BN, STAGES). W13: rows_per_expert
// = the gate map's rows per routed expert (2I stacked, I interleaved).

#define SC_MOE_SM90_KERNELS(NAME, CONS, BN, STAGES, A_BOX)                                   \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                          \
        sc_moe_w13_sm90_##NAME(const __grid_constant__ tmap_t a_map,                           \
                               const __grid_constant__ tmap_t g_map,                           \
                               const __grid_constant__ tmap_t u_map,                           \
                               const __grid_constant__ tmap_t sg_map,                          \
                               const __grid_constant__ tmap_t su_map, const float *b13,        \
                               bf16_t *h, const int *row_offsets, int rows_per_expert,         \
                               sc_moe_expert_params q)                                         \
    {                                                                                          \
        grouped_gemm<MODE_W13, CONS, BN, STAGES, A_BOX>(&a_map, &g_map, &u_map, &sg_map,      \
                                                        &su_map, h, nullptr, b13, row_offsets, \
                                                        q, q.I, q.H, rows_per_expert);         \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                          \
        sc_moe_w2_sm90_##NAME(const __grid_constant__ tmap_t a_map,                            \
                              const __grid_constant__ tmap_t b_map,                            \
                              const __grid_constant__ tmap_t sb_map, const float *b2,          \
                              const float *perm_weight, bf16_t *y, const int *row_offsets,     \
                              sc_moe_expert_params q)                                          \
    {                                                                                          \
        grouped_gemm<MODE_W2, CONS, BN, STAGES, A_BOX>(&a_map, &b_map, &b_map, &sb_map,       \
                                                       &sb_map, y, perm_weight, b2,            \
                                                       row_offsets, q, q.H, q.I, q.H);         \
    }

SC_MOE_SM90_KERNELS(large, SC_MOE_SM90_LARGE_CONS, SC_MOE_SM90_LARGE_BN, SC_MOE_SM90_LARGE_STAGES,
                    SC_MOE_SM90_LARGE_A_BOX)
SC_MOE_SM90_KERNELS(small, SC_MOE_SM90_SMALL_CONS, SC_MOE_SM90_SMALL_BN, SC_MOE_SM90_SMALL_STAGES,
                    SC_MOE_SM90_SMALL_A_BOX)
SC_MOE_SM90_KERNELS(medium, SC_MOE_SM90_MEDIUM_CONS, SC_MOE_SM90_MEDIUM_BN,
                    SC_MOE_SM90_MEDIUM_STAGES, SC_MOE_SM90_MEDIUM_A_BOX)
SC_MOE_SM90_KERNELS(wide, SC_MOE_SM90_WIDE_CONS, SC_MOE_SM90_WIDE_BN, SC_MOE_SM90_WIDE_STAGES,
                    SC_MOE_SM90_WIDE_A_BOX)
