// The Mixture-of-Experts grouped GEMMs for Hopper (sm_90a): warp-specialized, persistent,
// fed by the bulk tensor copy engine (TMA) through a ring of shared-memory stages, computed
// by warpgroup MMAs (wgmma, bf16 in, fp32 accumulate). kernels/moe/moe.cu does the routing
// (router, top-k, offsets, the permutation that also gathers x into expert order) and the
// combine; these kernels replace its mma.sync GEMMs on sm_90.
//
// A CTA has 1 producer warpgroup (one thread issues the TMA copies) and CONS consumer
// warpgroups; each consumer owns 64 rows of the BM = 64 * CONS row tile and all BN columns.
// Stage s of the ring holds an A tile [BM x 128 bytes] and a B tile [BN x 128 bytes] (64 bf16
// or 128 e4m3 of K), in the 128-byte swizzle that TMA writes and wgmma reads. full[s]
// completes when the copies land (transaction bytes); empty[s] when every consumer is done
// with the stage.
//
// One kernel, two precisions: the precision (prec_bf16, prec_e4m3) is a template parameter
// of the one pipeline, schedule and epilogue. bf16 accumulates every MMA into fp32. e4m3
// (fp8 experts, DeepSeek-V3's block-scaled checkpoints) computes each stage's 128 of K into
// fp32 partial sums, then adds them to the accumulators multiplied by the row's activation
// scale and the weight block's scale (the 128 x 128 block scales apply to whole stages);
// W13's epilogue quantizes h per row per 128 columns (a tile computes 128 columns of h in
// two passes over K) and writes e4m3 h with its scales, which W2 reads as its A.
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
typedef unsigned char fp8_t;

// The precisions: bytes of K per stage are 128 for both.
struct prec_bf16 {
    static constexpr bool FP8 = false;
    static constexpr int KS = 64; // elements of K per stage (4 MMAs of k16)
};
struct prec_e4m3 {
    static constexpr bool FP8 = true;
    static constexpr int KS = 128; // elements of K per stage (4 MMAs of k32), one scale block
};

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

// Clusters: this CTA's rank, a shared-memory address of the same variable in CTA `rank`,
// an arrive on a barrier there (release at cluster scope), a wait on one of ours that the
// other CTA arrives on (acquire at cluster scope), a load from there, and a barrier of the
// whole cluster (every thread of every CTA).
__device__ __forceinline__ unsigned cluster_rank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

__device__ __forceinline__ unsigned cluster_map(unsigned addr, unsigned rank)
{
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}

__device__ __forceinline__ void mbar_arrive_remote(unsigned cluster_addr)
{
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr)
                 : "memory");
}

__device__ __forceinline__ void mbar_wait_cluster(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

__device__ __forceinline__ float ld_cluster_f32(unsigned cluster_addr)
{
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(cluster_addr) : "memory");
    return v;
}

__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
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

template <class P, int N> struct wgmma_tile;

// wgmma_tile<P, N>::run with R accumulators; DA, DB and SCALE_D are the operand numbers R,
// R + 1 and R + 2, written out because the asm text is a literal (checked below). TYPES is
// the instruction's shape suffix and operand types; IMM its immediates after scale_d
// (bf16: no negation, both K-major; e4m3 takes no transpose immediates: K-major only).
#define SC_WGMMA_TILE(P, TYPES, IMM, N, R, DA, DB, SCALE_D)                                  \
    template <> struct wgmma_tile<P, N> {                                                    \
        static __device__ __forceinline__ void run(float *d, unsigned long long da,          \
                                                   unsigned long long db, int scale_d)       \
        {                                                                                    \
            static_assert(R == N / 2 && DA == R && DB == R + 1 && SCALE_D == R + 2,          \
                          "wgmma_tile: operand numbers");                                    \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE_D ", 0;\n"             \
                         "wgmma.mma_async.sync.aligned.m64n" #N TYPES " {"                   \
                         SC_WGMMA_REGS_##R "}, %" #DA ", %" #DB ", p, " IMM ";\n}\n"        \
                         : SC_WGMMA_ACC_##R(0)                                               \
                         : "l"(da), "l"(db), "r"(scale_d));                                  \
        }                                                                                    \
    };
#define SC_BF16_MMA "k16.f32.bf16.bf16"
#define SC_E4M3_MMA "k32.f32.e4m3.e4m3"
//            precision  types        immediates    N    R    A    B    scale_d
SC_WGMMA_TILE(prec_bf16, SC_BF16_MMA, "1, 1, 0, 0", 64,  32,  32,  33,  34)
SC_WGMMA_TILE(prec_bf16, SC_BF16_MMA, "1, 1, 0, 0", 128, 64,  64,  65,  66)
SC_WGMMA_TILE(prec_bf16, SC_BF16_MMA, "1, 1, 0, 0", 256, 128, 128, 129, 130)
SC_WGMMA_TILE(prec_e4m3, SC_E4M3_MMA, "1, 1",       64,  32,  32,  33,  34)
SC_WGMMA_TILE(prec_e4m3, SC_E4M3_MMA, "1, 1",       128, 64,  64,  65,  66)

// The same e4m3 MMA with A from registers: a0 .. a3 this thread's four 32-bit registers of
// A's fragment (a_fragment), B in shared memory: wgmma_rs<N>::run(d, a0, a1, a2, a3, db,
// scale_d). The operands: the R accumulators, then a0 .. a3 (R .. R + 3), B's descriptor
// (DB = R + 4) and scale_d (DB + 1). Used where one k32 step must be split into two halves of K (the
// fp8 K shift below): the other half's registers are zeros.
template <int N> struct wgmma_rs;
#define SC_WGMMA_RS(N, R, A0, A1, A2, A3, DB, SCALE_D)                                       \
    template <> struct wgmma_rs<N> {                                                         \
        static __device__ __forceinline__ void run(float *d, unsigned a0, unsigned a1,       \
                                                   unsigned a2, unsigned a3,                 \
                                                   unsigned long long db, int scale_d)       \
        {                                                                                    \
            static_assert(R == N / 2 && A0 == R && A3 == R + 3 && DB == R + 4 &&             \
                              SCALE_D == R + 5,                                              \
                          "wgmma_rs: operand numbers");                                      \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SCALE_D ", 0;\n"             \
                         "wgmma.mma_async.sync.aligned.m64n" #N SC_E4M3_MMA " {"             \
                         SC_WGMMA_REGS_##R "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB \
                         ", p, 1, 1;\n}\n"                                                   \
                         : SC_WGMMA_ACC_##R(0)                                               \
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(scale_d));       \
        }                                                                                    \
    };
//          N    R   a0  a1  a2  a3  B   scale_d
SC_WGMMA_RS(64,  32, 32, 33, 34, 35, 36, 37)
SC_WGMMA_RS(128, 64, 64, 65, 66, 67, 68, 69)

// This thread's registers of the e4m3 A fragment of one k32 step (m64 x k32, the step's 32
// bytes from byte column k0 of a warpgroup's 64 rows of 128 bytes in the 128-byte swizzle at
// a_s, 1024-byte aligned): register i holds 4 bytes of row 16 warp + lane / 4 (+ 8 for odd
// i), columns k0 + 4 (lane % 4) (+ 16 for i >= 2) (the layout of wgmma's register A for
// 8-bit types). The swizzle stores 16-byte chunk j of row r at chunk j ^ (r % 8).
__device__ __forceinline__ void a_fragment(unsigned a_s, int k0, int warp, int lane, unsigned *a)
{
    const int g = lane >> 2;
    const unsigned row = a_s + (unsigned)(16 * warp + g) * 128u + 4u * (unsigned)(lane & 3);
    const unsigned c0 = (unsigned)(((k0 >> 4) ^ g) << 4), c1 = (unsigned)((((k0 >> 4) + 1) ^ g) << 4);
    asm volatile("ld.shared.b32 %0, [%4];\nld.shared.b32 %1, [%5];\n"
                 "ld.shared.b32 %2, [%6];\nld.shared.b32 %3, [%7];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(row + c0), "r"(row + 1024u + c0), "r"(row + c1), "r"(row + 1024u + c1)
                 : "memory");
}

// e4m3: one 128-of-K block's partial sums into the accumulators, scaled by the rows'
// activation scales (sa0: row r0, sa1: row r0 + 8) times the weight block's (W13: sg for the
// gate columns, su for the up columns; W2: sg).
template <int MODE, int BN>
__device__ __forceinline__ void promote(float *acc, const float *part, float sa0, float sa1,
                                        float sg, float su)
{
#pragma unroll
    for (int f = 0; f < BN / 8; f++) {
        const float sb = MODE == 0 /* MODE_W13 */ && f >= BN / 16 ? su : sg;
        const float s0 = sa0 * sb, s1 = sa1 * sb;
        acc[f * 4 + 0] = fmaf(part[f * 4 + 0], s0, acc[f * 4 + 0]);
        acc[f * 4 + 1] = fmaf(part[f * 4 + 1], s0, acc[f * 4 + 1]);
        acc[f * 4 + 2] = fmaf(part[f * 4 + 2], s1, acc[f * 4 + 2]);
        acc[f * 4 + 3] = fmaf(part[f * 4 + 3], s1, acc[f * 4 + 3]);
    }
}

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
//           of the shared W13 through sg_map, su_map (chunk s's rows at s I); a stage's B
//           rows are BN/2 gate rows then the BN/2 up rows of the same columns; out = h [R, I]
//           with h = act(gate + bias, up + bias), SUBS x BN/2 columns per tile.
// MODE_W2:  A = h [R, I]; B = W2 [E * H, I] through g_map, the shared W2 [H, S I] through
//           sg_map (chunk s at column s I); out = y [R, H] = weight(row) * (h W2^T + bias),
//           BN columns per tile.
// e4m3: a_scale [K / 128][rows_cap] (the rows' activation scales), b_scale the routed
// weight's block scales in the checkpoint layout ([E, 2I/128, H/128] for W13, [E, H/128,
// I/128] for W2), sb_scale the shared expert's ([2 I_s/128, H/128], [H/128, I_s/128]);
// W13 writes h as e4m3 into out with its scales in out_scale [I / 128][rows_cap].
enum { MODE_W13 = 0, MODE_W2 = 1 };

template <int CONS, int BN, int STAGES, int SPLIT> struct cfg {
    static constexpr int BM = 64 * CONS;
    static constexpr int THREADS = 128 * (CONS + 1);
    static constexpr int A_BYTES = BM * 128;
    static constexpr int B_BYTES = BN * 128;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    static constexpr int SMEM = SC_MOE_SM90_SMEM(CONS, BN, STAGES, SPLIT);
};

struct gemm_args {
    const tmap_t *a_map, *g_map, *u_map, *sg_map, *su_map;
    void *out;               // h (bf16 or e4m3) or y (bf16)
    float *out_scale;        // e4m3 W13: h's scales
    const float *row_weight; // W2: the rows' routing weights
    const float *bias;
    const float *a_scale, *b_scale, *sb_scale; // e4m3
    const int *row_offsets;
    int N, K, b_rows_per_expert;
};

// The K range of a tile: routed weights start kshift elements early (boxes 128-byte aligned
// in the weight; the columns before 0 read as zeros in B). bf16 just runs K from -kshift;
// e4m3, whose stages must each lie in one 128-of-K scale block, splits every stage at the
// block boundary (fp8_shifted_k), in every tile of a shifted kernel (ALL: the shared
// expert's too, whose boxes then start where the routed weights' are aligned; the columns
// that stray into a neighbouring chunk of the shared W2 belong to the first stage's head and
// the last one's tail, which are never computed). A kernel without the shift (SHIFT false)
// reads the same A rows from column q.kshift on, in boxes not 128-byte aligned.
template <bool SHIFT, bool ALL>
__device__ __forceinline__ int tile_kshift(const sc_moe_expert_params &q, bool routed)
{
    return SHIFT && (ALL || routed) ? q.kshift : 0;
}

// ---- e4m3 with a K shift: the consumer's loop over K ----------------------------------------
//
// Stage kt holds K [128 kt - ksh, 128 kt - ksh + 128): the end of scale block kt - 1 (its first
// ksh columns: the head) and the start of block kt (the tail; none past K in the last stage,
// none before 0 in the first). The head's MMAs finish the partial sums the previous stage's
// tail began, which are then promoted with block kt - 1's scales; the tail's MMAs begin block
// kt's. A k32 step that straddles the boundary (ksh % 32 == 16) runs twice from registers,
// each time with the other half of A zero. The head's length is a template parameter (HEAD
// whole k32 steps, STR the straddling one) and the first and last stages are peeled, so that
// every path is straight-line: ptxas then keeps the MMAs asynchronous (a split point chosen
// at run time inside the loop made it serialize them, in every fp8 kernel).

template <int HEAD, bool STR> struct kshift_steps {
    // The head: block kt - 1's columns of the stage, accumulated onto part.
    template <class P, int BN>
    static __device__ __forceinline__ void head(float *part, unsigned a_s, unsigned b_s,
                                                const unsigned *af)
    {
#pragma unroll
        for (int kk = 0; kk < HEAD; kk++)
            wgmma_tile<P, BN>::run(part, smem_desc(a_s + kk * 32), smem_desc(b_s + kk * 32), 1);
        if constexpr (STR)
            wgmma_rs<BN>::run(part, af[0], af[1], af[4], af[4], smem_desc(b_s + HEAD * 32), 1);
    }
    // The tail: block kt's columns, part overwritten by the first. The straddling step (from
    // registers) comes last, so that the wait after the tail's commit follows it at once:
    // registers an MMA reads may not be written (nor given to other values by ptxas) before
    // a wgmma.wait_group covers it, and the next stage's scales and fragment reuse them.
    template <class P, int BN>
    static __device__ __forceinline__ void tail(float *part, unsigned a_s, unsigned b_s,
                                                const unsigned *af)
    {
        constexpr int K0 = HEAD + (STR ? 1 : 0);
#pragma unroll
        for (int kk = K0; kk < 4; kk++)
            wgmma_tile<P, BN>::run(part, smem_desc(a_s + kk * 32), smem_desc(b_s + kk * 32),
                                   kk > K0);
        if constexpr (STR)
            wgmma_rs<BN>::run(part, af[4], af[4], af[2], af[3], smem_desc(b_s + HEAD * 32),
                              K0 < 4);
    }
};

// The shifted loop over the k_tiles stages (k_tiles >= 2) from ring position it; returns the
// position after them. Every stage is given back once per warp, as in the aligned loop.
template <class P, int MODE, int BN, int STAGES, class C, int HEAD, bool STR>
__device__ __forceinline__ int fp8_shifted_run(int k_tiles, int it, unsigned ring,
                                               unsigned full_bar, unsigned empty_bar, int c,
                                               int warp, int lane, float *part, float *acc,
                                               const float *sa, const float *sbg,
                                               const float *sbu, int rows_cap, int r0,
                                               int row_end)
{
    typedef kshift_steps<HEAD, STR> K;
    // af[0..3]: the straddling step's A fragment; af[4]: a zero register (the other half)
    unsigned af[5] = {0u, 0u, 0u, 0u, 0u};
    for (int kt = 0; kt < k_tiles; kt++, it++) {
        const int s = it % STAGES;
        const unsigned ph = (unsigned)(it / STAGES) & 1u;
        float sa0 = 0.f, sa1 = 0.f, sg = 0.f, su = 0.f;
        if (kt > 0) { // block kt - 1's scales, loaded while the stage's copies land
            const int kb = kt - 1;
            if (r0 < row_end)
                sa0 = sa[(long long)kb * rows_cap + r0];
            if (r0 + 8 < row_end)
                sa1 = sa[(long long)kb * rows_cap + r0 + 8];
            sg = sbg[kb];
            su = sbu[kb];
        }
        mbar_wait(full_bar + s * 8, ph);
        const unsigned a_s = ring + s * C::STAGE_BYTES + c * 64 * 128;
        const unsigned b_s = ring + s * C::STAGE_BYTES + C::A_BYTES;
        if constexpr (STR)
            a_fragment(a_s, HEAD * 32, warp, lane, af);
        asm volatile("" : "+r"(af[0]), "+r"(af[1]), "+r"(af[2]), "+r"(af[3]), "+r"(af[4]));
        wgmma_fence();
        if (kt == 0) { // the first stage: its tail only
            K::template tail<P, BN>(part, a_s, b_s, af);
            wgmma_commit();
            if constexpr (STR) // (its registers: see kshift_steps::tail)
                wgmma_wait<0>();
            continue;
        }
        K::template head<P, BN>(part, a_s, b_s, af);
        wgmma_commit();
        wgmma_wait<0>(); // the previous stage's MMAs are done too
        if (lane == 0)
            mbar_arrive(empty_bar + ((it - 1) % STAGES) * 8);
        promote<MODE, BN>(acc, part, sa0, sa1, sg, su);
        if (kt + 1 == k_tiles) { // the last stage: nothing of it remains in flight
            if (lane == 0)
                mbar_arrive(empty_bar + s * 8);
            continue;
        }
        asm volatile("" : "+r"(af[0]), "+r"(af[1]), "+r"(af[2]), "+r"(af[3]), "+r"(af[4]));
        wgmma_fence(); // (part was read: the tail overwrites it)
        K::template tail<P, BN>(part, a_s, b_s, af);
        wgmma_commit(); // waited for by the next stage's head
        if constexpr (STR) // unless it read A from registers: waited for now
            wgmma_wait<0>();
    }
    return it;
}

// The shift's 7 shapes (ksh = 16 .. 112 in steps of 16), chosen once per tile.
template <class P, int MODE, int BN, int STAGES, class C>
__device__ __forceinline__ int fp8_shifted_k(int ksh, int k_tiles, int it, unsigned ring,
                                          unsigned full_bar, unsigned empty_bar, int c, int warp,
                                          int lane, float *part, float *acc, const float *sa,
                                          const float *sbg, const float *sbu, int rows_cap,
                                          int r0, int row_end)
{
#define SC_KSHIFT_CASE(N, HEAD, STR)                                                            \
    case N:                                                                                     \
        return fp8_shifted_run<P, MODE, BN, STAGES, C, HEAD, STR>(                              \
            k_tiles, it, ring, full_bar, empty_bar, c, warp, lane, part, acc, sa, sbg, sbu,     \
            rows_cap, r0, row_end);
    switch (ksh >> 4) {
        SC_KSHIFT_CASE(1, 0, true)
        SC_KSHIFT_CASE(2, 1, false)
        SC_KSHIFT_CASE(3, 1, true)
        SC_KSHIFT_CASE(4, 2, false)
        SC_KSHIFT_CASE(5, 2, true)
        SC_KSHIFT_CASE(6, 3, false)
        default:
            return fp8_shifted_run<P, MODE, BN, STAGES, C, 3, true>(
                k_tiles, it, ring, full_bar, empty_bar, c, warp, lane, part, acc, sa, sbg, sbu,
                rows_cap, r0, row_end);
    }
#undef SC_KSHIFT_CASE
}

template <class P, int MODE, int CONS, int BN, int STAGES, int A_BOX, int SUBS, int SPLIT, bool KSHIFT>
__device__ __forceinline__ void grouped_gemm(const gemm_args &g, const sc_moe_expert_params &q)
{
    typedef cfg<CONS, BN, STAGES, SPLIT> C;
    constexpr int BM = C::BM, KS = P::KS;
    static_assert(MODE == MODE_W13 || SUBS == 1, "W2 tiles are one pass");
    static_assert(!P::FP8 || MODE == MODE_W2 || SPLIT * SUBS * (BN / 2) == SC_MOE_FP8_BLOCK,
                  "an fp8 W13 tile (its cluster) computes one block of h's scales");
    static_assert(SPLIT == 1 || (P::FP8 && MODE == MODE_W13 && SPLIT == 2),
                  "clusters of two share fp8 W13 tiles only");
    static_assert(!P::FP8 || SC_MOE_FP8_BLOCK % BN == 0 || MODE == MODE_W13,
                  "an fp8 W2 tile lies in one block of W2's scales");
    static_assert(P::FP8 || SUBS == 1, "bf16 W13 tiles are one pass");
    // The K shift (tile_kshift): bf16 always; e4m3 in the kernels made for it (KSHIFT: the host
    // launches them for weights at unaligned offsets), but in the W13 tiles of more than two
    // passes, whose registers hold h across the passes and have none to spare for the split
    // stages. An e4m3 kernel has either the aligned loop over K or the shifted one, never
    // both: a choice between them at run time makes ptxas serialize every MMA.
    constexpr bool SHIFT = P::FP8 ? KSHIFT && SUBS <= SC_MOE_FP8_SHIFT_MAX_PASSES : true;
    // Consumers give a stage back once per warpgroup (bf16) or once per warp (e4m3, whose
    // warps wait for their own MMAs before the promotion).
    constexpr int RELEASES = P::FP8 ? 4 * CONS : CONS;
    const int E = q.E, groups = q.groups, group_m = q.group_m, N = g.N, K = g.K;
    extern __shared__ unsigned char smem_raw[];
    // The ring, 1024-byte aligned for the 128-byte swizzle.
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    unsigned char *base_ptr = smem_raw + (base - smem_u32(smem_raw));
    const unsigned ring = base;
    const unsigned full_bar = ring + STAGES * C::STAGE_BYTES;
    const unsigned empty_bar = full_bar + STAGES * 8;
    int *tile_off = reinterpret_cast<int *>(base_ptr + STAGES * C::STAGE_BYTES + 2 * STAGES * 8);
    int *row_off = tile_off + SC_MOE_MAX_GROUPS + 1;
    // fp8 W13 over a cluster: the rows' largest magnitudes of this CTA's columns, and two
    // barriers the other CTA arrives on: ready (its values are written), read (it has read
    // ours, so they may be overwritten).
    float *amax_own = reinterpret_cast<float *>(row_off + SC_MOE_MAX_GROUPS + 1);
    const unsigned amax_addr = smem_u32(amax_own);
    const unsigned ready_bar = (amax_addr + C::BM * 4 + 7u) & ~7u, read_bar = ready_bar + 8;
    // Tiles go to clusters of SPLIT CTAs (a CTA alone without a split).
    const unsigned rank = SPLIT > 1 ? cluster_rank() : 0u;
    const int first_tile = blockIdx.x / SPLIT, tile_step = gridDim.x / SPLIT;

    const int tid = threadIdx.x;
    griddep_enter(); // (a programmatic launch: see moe_device.cuh)
    // The offsets: rows per group from row_offsets, M tiles per group scanned by warp 0.
    for (int i = tid; i <= groups; i += C::THREADS)
        row_off[i] = g.row_offsets[i];
    __syncthreads();
    if (tid < 32) {
        const int lane = tid;
        int carry = 0;
        for (int b = 0; b < groups; b += 32) {
            const int gi = b + lane;
            const int v = gi < groups ? (row_off[gi + 1] - row_off[gi] + BM - 1) / BM : 0;
            int incl = v;
            for (int o = 1; o < 32; o <<= 1) {
                int u = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += u;
            }
            if (gi < groups)
                tile_off[gi] = carry + incl - v;
            carry += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0)
            tile_off[groups] = carry;
    }
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full_bar + s * 8, 1);
            mbar_init(empty_bar + s * 8, RELEASES);
        }
        if (SPLIT > 1) {
            mbar_init(ready_bar, 32 * CONS); // the other CTA's writers: 8 per consumer warp
            mbar_init(read_bar, 128 * CONS); // every consumer thread of the other CTA
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    __syncthreads();
    if constexpr (SPLIT > 1)
        cluster_sync(); // the other CTA's barriers are initialized before anyone arrives

    const int m_total = tile_off[groups];
    constexpr int NW = MODE == MODE_W13 ? SPLIT * SUBS * (BN / 2) : BN; // output columns per tile
    constexpr int NC = SUBS * (BN / 2); // W13: this CTA's columns of the tile
    const int n_tiles = (N + NW - 1) / NW;
    const int wg = tid >> 7;

    if (wg == 0) {
        // ---- producer ----
        if (CONS > 1) // free registers for the consumers (one consumer has plenty)
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (tid == 0) {
            tma_prefetch_map(g.a_map);
            tma_prefetch_map(g.g_map);
            if (MODE == MODE_W13)
                tma_prefetch_map(g.u_map);
            if (groups > E) {
                tma_prefetch_map(g.sg_map);
                if (MODE == MODE_W13)
                    tma_prefetch_map(g.su_map);
            }
            int it = 0;
            tile_t tl;
            for (int t = first_tile; get_tile<BM>(t, m_total, n_tiles, group_m, tile_off, row_off, groups, tl);
                 t += tile_step) {
                const bool routed = tl.e < E;
                const int ksh = tile_kshift<SHIFT, P::FP8>(q, routed);
                const int k_tiles = (K + ksh + KS - 1) / KS;
                const tmap_t *gm = routed ? g.g_map : g.sg_map, *um = routed ? g.u_map : g.su_map;
                // A: only the boxes of A_BOX rows that hold rows of this expert (a decode
                // tile has few); the other rows of the stage keep stale data, computed and
                // never stored.
                const int a_boxes = (min(BM, tl.row_end - tl.row0) + A_BOX - 1) / A_BOX;
                for (int sub = 0; sub < SUBS; sub++) {
                    // B's row and column of this pass (the shared W2 chunk: its columns).
                    const int b_row =
                        MODE == MODE_W13
                            ? (routed ? tl.e * g.b_rows_per_expert : (tl.e - E) * q.I) +
                                  tl.n * NW + rank * NC + sub * (BN / 2)
                            : (routed ? tl.e * g.b_rows_per_expert : 0) + tl.n * BN;
                    const int b_col = MODE == MODE_W2 && !routed ? (tl.e - E) * q.I : 0;
                    for (int kt = 0; kt < k_tiles; kt++, it++) {
                        const int s = it % STAGES;
                        const unsigned ph = (unsigned)(it / STAGES) & 1u;
                        mbar_wait(empty_bar + s * 8, ph ^ 1u);
                        const unsigned fb = full_bar + s * 8;
                        const unsigned sa = ring + s * C::STAGE_BYTES, sb = sa + C::A_BYTES;
                        // B from column kc (before 0: zeros); A's rows hold their data
                        // from column q.kshift, so A's box starts at kc + q.kshift.
                        const int kc = kt * KS - ksh, ka = kc + q.kshift;
                        mbar_expect_tx(fb, a_boxes * A_BOX * 128 + C::B_BYTES);
                        for (int i = 0; i < a_boxes; i++)
                            tma_load_2d(sa + i * A_BOX * 128, g.a_map, ka, tl.row0 + i * A_BOX, fb);
                        if (MODE == MODE_W13) {
                            tma_load_2d(sb, gm, kc, b_row, fb);
                            tma_load_2d(sb + (BN / 2) * 128, um, kc, b_row, fb);
                        } else {
                            tma_load_2d(sb, gm, b_col + kc, b_row, fb);
                        }
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
        float part[P::FP8 ? BN / 2 : 1]; // e4m3: one stage's partial sums
        float hkeep[P::FP8 && MODE == MODE_W13 && SUBS > 1 ? (SUBS - 1) * (BN / 4) : 1]; // e4m3 W13: earlier passes' h
#pragma unroll
        for (int i = 0; i < BN / 2; i++)
            acc[i] = 0.f;
        int it = 0;
        tile_t tl;
        unsigned tiles_done = 0; // (the cluster exchange's barrier phases)
        for (int t = first_tile; get_tile<BM>(t, m_total, n_tiles, group_m, tile_off, row_off, groups, tl);
             t += tile_step, tiles_done++) {
            const bool routed = tl.e < E;
            const int ksh = tile_kshift<SHIFT, P::FP8>(q, routed);
            const int k_tiles = (K + ksh + KS - 1) / KS;
            // acc[f * 4 + q]: row r0 (+8 for q >= 2), column f * 8 + 2 * (lane % 4) (+1 for
            // odd q) of the pass's BN (W13: gate columns f < BN/16, then up).
            const int r0 = tl.row0 + c * 64 + warp * 16 + (lane >> 2);
            const int cl = 2 * (lane & 3);
            const bool has_bias = q.has_bias && routed;
#pragma unroll
            for (int sub = 0; sub < SUBS; sub++) {
                // e4m3: where this pass's weight block scales are (indexed by the K block).
                const float *sbg = nullptr, *sbu = nullptr;
                const float *sa = g.a_scale;
                if constexpr (P::FP8) {
                    const int KB = K / SC_MOE_FP8_BLOCK;
                    if (MODE == MODE_W13) {
                        // The pass's first gate / up row of the expert's W13 (or the shared
                        // W13) as the checkpoint numbers its rows, and that row's block.
                        const int Itot = routed ? q.I : (groups - E) * q.I;
                        const int j = (routed ? 0 : (tl.e - E) * q.I) + tl.n * NW + rank * NC +
                                      sub * (BN / 2);
                        const int grow = q.interleaved ? 2 * j : j;
                        const int urow = q.interleaved ? 2 * j + 1 : Itot + j;
                        const float *bs = routed ? g.b_scale + (long long)tl.e * (2 * q.I / SC_MOE_FP8_BLOCK) * KB
                                                 : g.sb_scale;
                        sbg = bs + (long long)(grow / SC_MOE_FP8_BLOCK) * KB;
                        sbu = bs + (long long)(urow / SC_MOE_FP8_BLOCK) * KB;
                    } else {
                        const int nb = tl.n * BN / SC_MOE_FP8_BLOCK;
                        if (routed) {
                            sbg = g.b_scale + ((long long)tl.e * (N / SC_MOE_FP8_BLOCK) + nb) * KB;
                        } else {
                            const int KBs = (groups - E) * KB; // the shared W2's K blocks
                            sbg = g.sb_scale + (long long)nb * KBs + (tl.e - E) * KB;
                        }
                        sbu = sbg;
                    }
                }
                int prev = -1;
                if constexpr (P::FP8 && SHIFT) // (weights at an unaligned offset: ksh > 0)
                    it = fp8_shifted_k<P, MODE, BN, STAGES, C>(
                        ksh, k_tiles, it, ring, full_bar, empty_bar, c, warp, lane, part, acc, sa,
                        sbg, sbu, q.rows_cap, r0, tl.row_end);
                for (int kt = 0; kt < (P::FP8 && SHIFT ? 0 : k_tiles); kt++, it++) {
                    const int s = it % STAGES;
                    const unsigned ph = (unsigned)(it / STAGES) & 1u;
                    float sa0 = 0.f, sa1 = 0.f, sg = 0.f, su = 0.f;
                    if constexpr (P::FP8) { // loaded while the stage's copies land
                        if (r0 < tl.row_end)
                            sa0 = sa[(long long)kt * q.rows_cap + r0];
                        if (r0 + 8 < tl.row_end)
                            sa1 = sa[(long long)kt * q.rows_cap + r0 + 8];
                        sg = sbg[kt];
                        su = sbu[kt];
                    }
                    mbar_wait(full_bar + s * 8, ph);
                    const unsigned a_s = ring + s * C::STAGE_BYTES + c * 64 * 128;
                    const unsigned b_s = ring + s * C::STAGE_BYTES + C::A_BYTES;
                    wgmma_fence();
                    if constexpr (P::FP8) {
#pragma unroll
                        for (int kk = 0; kk < 4; kk++)
                            wgmma_tile<P, BN>::run(part, smem_desc(a_s + kk * 32),
                                                   smem_desc(b_s + kk * 32), kk > 0);
                        wgmma_commit();
                        wgmma_wait<0>(); // this warp's MMAs are done: give the stage back
                        if (lane == 0)
                            mbar_arrive(empty_bar + s * 8);
                        // The promotion: the stage's 128 of K, scaled, into the accumulators.
                        promote<MODE, BN>(acc, part, sa0, sa1, sg, su);
                    } else {
#pragma unroll
                        for (int kk = 0; kk < 4; kk++)
                            wgmma_tile<P, BN>::run(acc, smem_desc(a_s + kk * 32),
                                                   smem_desc(b_s + kk * 32), kt > 0 || kk > 0);
                        wgmma_commit();
                        wgmma_wait<1>(); // the previous stage's MMAs are done: give it back
                        if (prev >= 0 && wtid == 0)
                            mbar_arrive(empty_bar + prev * 8);
                        prev = s;
                    }
                }
                if constexpr (!P::FP8) {
                    wgmma_wait<0>();
                    if (prev >= 0 && wtid == 0)
                        mbar_arrive(empty_bar + prev * 8);
                }

                // ---- epilogue: registers to global ----
                if constexpr (MODE == MODE_W13 && !P::FP8) {
                    bf16_t *out = static_cast<bf16_t *>(g.out);
                    const int col0 = tl.n * NW;
#pragma unroll
                    for (int f = 0; f < BN / 16; f++) {
                        const int col = col0 + f * 8 + cl;
                        float2 bb0 = make_float2(0.f, 0.f), bb1 = bb0;
                        if (has_bias && col < N) {
                            bb0 = moe_b13(g.bias, tl.e, col, N, q.interleaved);
                            bb1 = moe_b13(g.bias, tl.e, col + 1, N, q.interleaved);
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
                                *reinterpret_cast<unsigned *>(out + (long long)row * q.out_ld +
                                                              q.out_off + col) =
                                    pack_bf16x2(h0, h1);
                            }
                        }
                    }
                } else if constexpr (MODE == MODE_W13) {
                    // e4m3: h of this pass, hv[(f * 2 + h) * 2 + j] at row r0 + 8 h, column
                    // col0 + f * 8 + cl + j.
                    const int col0 = tl.n * NW + rank * NC + sub * (BN / 2);
                    float hv[BN / 4];
#pragma unroll
                    for (int f = 0; f < BN / 16; f++) {
                        const int col = col0 + f * 8 + cl;
                        float2 bb0 = make_float2(0.f, 0.f), bb1 = bb0;
                        if (has_bias) {
                            bb0 = moe_b13(g.bias, tl.e, col, N, q.interleaved);
                            bb1 = moe_b13(g.bias, tl.e, col + 1, N, q.interleaved);
                        }
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            float g0 = acc[f * 4 + 2 * h], g1 = acc[f * 4 + 2 * h + 1];
                            float u0 = acc[(f + BN / 16) * 4 + 2 * h];
                            float u1 = acc[(f + BN / 16) * 4 + 2 * h + 1];
                            if (has_bias) {
                                g0 += bb0.x, g1 += bb1.x;
                                u0 += bb0.y, u1 += bb1.y;
                            }
                            hv[(f * 2 + h) * 2 + 0] = moe_act(g0, u0, q.act, q.alpha, q.limit);
                            hv[(f * 2 + h) * 2 + 1] = moe_act(g1, u1, q.act, q.alpha, q.limit);
                        }
                    }
                    if (sub + 1 < SUBS) {
#pragma unroll
                        for (int i = 0; i < BN / 4; i++)
                            hkeep[sub * (BN / 4) + i] = hv[i];
                    } else {
                        // The last pass: each row's 128 columns of h are in this thread's
                        // hkeep and hv and in those of the three other lanes of its quad.
                        float amax[2] = {0.f, 0.f};
#pragma unroll
                        for (int f = 0; f < BN / 16; f++)
#pragma unroll
                            for (int h = 0; h < 2; h++)
#pragma unroll
                                for (int j = 0; j < 2; j++) {
                                    const int i = (f * 2 + h) * 2 + j;
                                    amax[h] = fmaxf(amax[h], fabsf(hv[i]));
#pragma unroll
                                    for (int ps = 0; ps + 1 < SUBS; ps++)
                                        amax[h] = fmaxf(amax[h], fabsf(hkeep[ps * (BN / 4) + i]));
                                }
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
                            amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
                        }
                        if constexpr (SPLIT > 1) {
                            // The other CTA's half of each row: exchange the rows' largest
                            // magnitudes through distributed shared memory.
                            const unsigned other = rank ^ 1u, ph = tiles_done & 1u;
                            const int lr = c * 64 + warp * 16 + (lane >> 2); // local row
                            // Each thread that writes (or reads) arrives itself, so that
                            // its release orders its own accesses (ready: 8 writers per
                            // warp; read: every thread).
                            if ((lane & 3) == 0) {
                                amax_own[lr] = amax[0];
                                amax_own[lr + 8] = amax[1];
                                mbar_arrive_remote(cluster_map(ready_bar, other));
                            }
                            mbar_wait_cluster(ready_bar, ph);
                            const unsigned there = cluster_map(amax_addr, other);
                            amax[0] = fmaxf(amax[0], ld_cluster_f32(there + lr * 4));
                            amax[1] = fmaxf(amax[1], ld_cluster_f32(there + (lr + 8) * 4));
                            mbar_arrive_remote(cluster_map(read_bar, other));
                            mbar_wait_cluster(read_bar, ph); // ours are read: reusable
                        }
                        fp8_t *out = static_cast<fp8_t *>(g.out);
                        const int blk = tl.n * NW / SC_MOE_FP8_BLOCK;
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int row = r0 + 8 * h;
                            if (row >= tl.row_end)
                                continue;
                            const block_factors fa = fp8_block_factors(amax[h]);
                            if ((lane & 3) == 0 && rank == 0)
                                g.out_scale[(long long)blk * q.rows_cap + row] = fa.scale;
#pragma unroll
                            for (int ps = 0; ps < SUBS; ps++)
#pragma unroll
                                for (int f = 0; f < BN / 16; f++) {
                                    const int i = (f * 2 + h) * 2;
                                    const float v0 = ps + 1 < SUBS ? hkeep[ps * (BN / 4) + i] : hv[i];
                                    const float v1 = ps + 1 < SUBS ? hkeep[ps * (BN / 4) + i + 1] : hv[i + 1];
                                    const int col = tl.n * NW + rank * NC + ps * (BN / 2) + f * 8 + cl;
                                    *reinterpret_cast<unsigned short *>(
                                        out + (long long)row * q.out_ld + q.out_off + col) =
                                        fp8_quantize2(v0, v1, fa);
                                }
                        }
                    }
                } else {
                    bf16_t *out = static_cast<bf16_t *>(g.out);
                    const int col0 = tl.n * BN;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int row = r0 + 8 * h;
                        if (row >= tl.row_end)
                            continue;
                        const float w = g.row_weight[row];
#pragma unroll
                        for (int f = 0; f < BN / 8; f++) {
                            const int col = col0 + f * 8 + cl;
                            if (col < N) {
                                float a0 = acc[f * 4 + 2 * h], a1 = acc[f * 4 + 2 * h + 1];
                                if (has_bias) {
                                    a0 += g.bias[(long long)tl.e * N + col];
                                    a1 += g.bias[(long long)tl.e * N + col + 1];
                                }
                                *reinterpret_cast<unsigned *>(out + (long long)row * N + col) =
                                    pack_bf16x2(a0 * w, a1 * w);
                            }
                        }
                    }
                }
                if constexpr (P::FP8) {
#pragma unroll
                    for (int i = 0; i < BN / 2; i++)
                        acc[i] = 0.f;
                }
            }
        }
    }
    if constexpr (SPLIT > 1)
        cluster_sync(); // no CTA leaves while the other may still reach its shared memory
}

// ---- the kernels -------------------------------------------------------------------------------
//
// The tensor maps are passed with sc_arg_tensor_map_in, which checks and orders their views
// like view arguments. Grid: at most CTAS_PER_SM CTAs per SM (persistent); block: 128 *
// (CONS + 1) threads; dynamic shared memory: SC_MOE_SM90_SMEM(CONS, BN, STAGES). W13:
// rows_per_expert = the gate map's rows per routed expert (2I stacked, I interleaved).

#define SC_MOE_SM90_KERNELS_BF16(NAME, CONS, BN, STAGES, A_BOX, SPLIT, CTAS)                  \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                          \
        sc_moe_w13_sm90_##NAME(const __grid_constant__ tmap_t a_map,                           \
                               const __grid_constant__ tmap_t g_map,                           \
                               const __grid_constant__ tmap_t u_map,                           \
                               const __grid_constant__ tmap_t sg_map,                          \
                               const __grid_constant__ tmap_t su_map, const float *b13,        \
                               bf16_t *h, const int *row_offsets, int rows_per_expert,         \
                               sc_moe_expert_params q)                                         \
    {                                                                                          \
        const gemm_args g = {&a_map, &g_map, &u_map, &sg_map, &su_map, h, nullptr, nullptr,  \
                             b13, nullptr, nullptr, nullptr, row_offsets, q.I, q.H,           \
                             rows_per_expert};                                                 \
        grouped_gemm<prec_bf16, MODE_W13, CONS, BN, STAGES, A_BOX, 1, 1, true>(g, q);          \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), 1)                          \
        sc_moe_w2_sm90_##NAME(const __grid_constant__ tmap_t a_map,                            \
                              const __grid_constant__ tmap_t b_map,                            \
                              const __grid_constant__ tmap_t sb_map, const float *b2,          \
                              const float *perm_weight, bf16_t *y, const int *row_offsets,     \
                              sc_moe_expert_params q)                                          \
    {                                                                                          \
        const gemm_args g = {&a_map, &b_map, &b_map, &sb_map, &sb_map, y, nullptr,            \
                             perm_weight, b2, nullptr, nullptr, nullptr, row_offsets, q.H,    \
                             q.I, q.H};                                                        \
        grouped_gemm<prec_bf16, MODE_W2, CONS, BN, STAGES, A_BOX, 1, 1, true>(g, q);           \
    }

// e4m3: x_scale / h_scale [K / 128][rows_cap], the weights' block scales (w13_scale [E,
// 2I/128, H/128], shared_w13_scale [2 I_s/128, H/128]; w2_scale [E, H/128, I/128],
// shared_w2_scale [H/128, I_s/128]); W13 writes h (e4m3) and h_scale.
#define SC_MOE_SM90_KERNELS_E4M3_KS(NAME, CONS, BN, STAGES, A_BOX, SPLIT, CTAS, SHIFTED)    \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), CTAS)                          \
        sc_moe_w13_sm90_##NAME(const __grid_constant__ tmap_t a_map,                           \
                               const __grid_constant__ tmap_t g_map,                           \
                               const __grid_constant__ tmap_t u_map,                           \
                               const __grid_constant__ tmap_t sg_map,                          \
                               const __grid_constant__ tmap_t su_map, const float *x_scale,    \
                               const float *w13_scale, const float *shared_w13_scale,          \
                               const float *b13, fp8_t *h, float *h_scale,                     \
                               const int *row_offsets, int rows_per_expert,                    \
                               sc_moe_expert_params q)                                         \
    {                                                                                          \
        const gemm_args g = {&a_map, &g_map, &u_map, &sg_map, &su_map, h, h_scale, nullptr,  \
                             b13, x_scale, w13_scale, shared_w13_scale, row_offsets, q.I,     \
                             q.H, rows_per_expert};                                            \
        grouped_gemm<prec_e4m3, MODE_W13, CONS, BN, STAGES, A_BOX,                             \
                     SC_MOE_FP8_W13_PASSES(BN, SPLIT), SPLIT, SHIFTED>(g, q);                  \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128 * (CONS + 1), CTAS)                          \
        sc_moe_w2_sm90_##NAME(const __grid_constant__ tmap_t a_map,                            \
                              const __grid_constant__ tmap_t b_map,                            \
                              const __grid_constant__ tmap_t sb_map, const float *h_scale,     \
                              const float *w2_scale, const float *shared_w2_scale,             \
                              const float *b2, const float *perm_weight, bf16_t *y,            \
                              const int *row_offsets, sc_moe_expert_params q)                  \
    {                                                                                          \
        const gemm_args g = {&a_map, &b_map, &b_map, &sb_map, &sb_map, y, nullptr,            \
                             perm_weight, b2, h_scale, w2_scale, shared_w2_scale,             \
                             row_offsets, q.H, q.I, q.H};                                      \
        grouped_gemm<prec_e4m3, MODE_W2, CONS, BN, STAGES, A_BOX, 1, 1, SHIFTED>(g, q);        \
    }
// Each e4m3 tile twice: for weights 128-byte aligned (NAME) and with the K shift for weights
// at other offsets (NAME_ks; the host picks per GEMM).
#define SC_MOE_SM90_KERNELS_E4M3(NAME, CONS, BN, STAGES, A_BOX, SPLIT, CTAS)                  \
    SC_MOE_SM90_KERNELS_E4M3_KS(NAME, CONS, BN, STAGES, A_BOX, SPLIT, CTAS, false)           \
    SC_MOE_SM90_KERNELS_E4M3_KS(NAME##_ks, CONS, BN, STAGES, A_BOX, SPLIT, CTAS, true)

#define SC_MOE_SM90_TILE_KERNELS(ID, NAME, PREC, CONS, BN, STAGES, A_BOX, CTAS, SPLIT)        \
    SC_MOE_SM90_KERNELS_##PREC(NAME, CONS, BN, STAGES, A_BOX, SPLIT, CTAS)
SC_MOE_SM90_TILES(SC_MOE_SM90_TILE_KERNELS)
