// The expert-parallel MoE layer's dispatch and combine (src/moe/ep.c): each rank holds some
// of the experts; a token is sent once to every other rank that holds one of its chosen
// experts, with its routing over that rank's experts, and the rows computed there come
// back and are summed with the token's own rank's part.
//
// The expert map (int [2 E]): map[e] = the rank holding expert e, map[E + e] = its index
// among that rank's experts. pos [T, N]: row of token t in the packet to rank d (-1: not
// sent there; never to itself). Packets to rank d start at row off(d) of the send buffer:
// d * slab in low-latency mode (slab > 0: every packet has room for slab rows), the sum of
// the counts of the ranks before d otherwise.
//
// Deterministic: a token's row in a packet is its order among the tokens sent there (a
// block-wide scan, no atomics), and the combine sums the ranks' rows in rank order.

#include "moe/moe_config.cuh"
#include "moe/moe_device.cuh"

typedef unsigned short bf16_t;

// Destinations and rows, in one block of SC_MOE_EP_PLAN_THREADS: for each chunk of that
// many tokens, each thread finds its token's ranks (a bit mask), and a scan over the block
// per rank gives the rows; counts [N]: the rows sent to each rank (0 to itself). An id >= E
// (the caller's routing) goes nowhere; the first is recorded in fault[0 .. 3] = {bad ids
// seen, token, slot, id}, as the one-GPU layer's count_ids does.
extern "C" __global__ void __launch_bounds__(SC_MOE_EP_PLAN_THREADS)
    sc_moe_ep_plan(const int *ids, const int *map, int *pos, int *counts, unsigned *fault,
                   int T, int k, int E, int N, int rank)
{
    griddep_enter();
    __shared__ int warp_rows[SC_MOE_EP_PLAN_THREADS / 32][SC_MOE_EP_MAX_RANKS];
    __shared__ int carry[SC_MOE_EP_MAX_RANKS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < N)
        carry[threadIdx.x] = 0;
    __syncthreads();
    for (int base = 0; base < T; base += SC_MOE_EP_PLAN_THREADS) {
        const int t = base + threadIdx.x;
        unsigned mask = 0;
        if (t < T) {
            for (int j = 0; j < k; j++) {
                const int e = ids[(long long)t * k + j];
                if (e >= E && atomicAdd(&fault[0], 1u) == 0u) {
                    fault[1] = (unsigned)t;
                    fault[2] = (unsigned)j;
                    fault[3] = (unsigned)e;
                }
                if (e >= 0 && e < E && map[e] != rank)
                    mask |= 1u << map[e];
            }
        }
        for (int d = 0; d < N; d++) {
            const unsigned b = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
            if (lane == 0)
                warp_rows[warp][d] = __popc(b);
        }
        __syncthreads();
        if (threadIdx.x < N) { // exclusive scan over the warps, from the carry
            const int d = threadIdx.x;
            int run = carry[d];
            for (int w = 0; w < SC_MOE_EP_PLAN_THREADS / 32; w++) {
                const int c = warp_rows[w][d];
                warp_rows[w][d] = run;
                run += c;
            }
            carry[d] = run;
        }
        __syncthreads();
        for (int d = 0; d < N; d++) {
            const unsigned b = __ballot_sync(0xffffffffu, (mask >> d) & 1u);
            if (t < T)
                pos[(long long)t * N + d] =
                    (mask >> d) & 1u ? warp_rows[warp][d] + __popc(b & ((1u << lane) - 1u)) : -1;
        }
        __syncthreads();
    }
    if (threadIdx.x < N)
        counts[threadIdx.x] = carry[threadIdx.x];
}

// Row off(d) of the send buffer: the packets' first rows.
__device__ __forceinline__ long long ep_packet_row(const int *counts, int d, int slab)
{
    if (slab > 0)
        return (long long)d * slab;
    long long r = 0;
    for (int q = 0; q < d; q++)
        r += counts[q];
    return r;
}

// One warp quantizes row src [H] into dst_q [H] (e4m3) and dst_s [H / 128] (f32), per 128
// channels by the rule of util/fp8.cuh, as sc_moe_gather_fp8 would (the same bits).
__device__ __forceinline__ void ep_quantize_row(const bf16_t *src, unsigned char *dst_q,
                                                float *dst_s, int H, int lane)
{
    for (int b = 0; b < H / 128; b++) {
        float scale;
        reinterpret_cast<unsigned *>(dst_q)[b * 32 + lane] =
            quantize_block_bf16x4(reinterpret_cast<const uint2 *>(src)[b * 32 + lane], &scale);
        if (lane == 0)
            dst_s[b] = scale;
    }
}

// The packets: one warp per (token, rank) pair sent: x's row (fp8 experts: quantized, into
// the _q and _s buffers, the bf16 ones not written), and the token's routing over that
// rank's experts (local indices; -1 for a slot whose expert is elsewhere) with the slots'
// weights. The pair (t, rank) puts the token into row t of the rank's own experts' input
// (own_*) the same way, its bf16 row too (for the shared gate).
extern "C" __global__ void sc_moe_ep_pack(const bf16_t *x, const int *ids, const float *weights,
                                          const int *map, const int *pos, const int *counts,
                                          bf16_t *send_x, int *send_ids, float *send_w,
                                          unsigned char *send_q, float *send_s, bf16_t *own_x,
                                          int *own_ids, float *own_w, unsigned char *own_q,
                                          float *own_s, int T, int k, int E, int N, int H,
                                          int slab, int rank, int fp8)
{
    griddep_enter();
    const long long pair = blockIdx.x * (long long)(blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (pair >= (long long)T * N)
        return;
    const int t = (int)(pair / N), d = (int)(pair % N);
    const int p = pos[pair];
    if (p < 0 && d != rank)
        return;
    const long long row = d == rank ? t : ep_packet_row(counts, d, slab) + p;
    bf16_t *xs = d == rank ? own_x : send_x;
    int *is = d == rank ? own_ids : send_ids;
    float *ws = d == rank ? own_w : send_w;
    if (lane < k) {
        const int e = ids[(long long)t * k + lane];
        is[row * k + lane] = e >= 0 && e < E && map[e] == d ? map[E + e] : -1;
        ws[row * k + lane] = weights[(long long)t * k + lane];
    }
    if (fp8)
        ep_quantize_row(x + (long long)t * H, (d == rank ? own_q : send_q) + row * H,
                        (d == rank ? own_s : send_s) + row * (H / 128), H, lane);
    if (fp8 && d != rank)
        return;
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (long long)t * H);
    uint4 *dst = reinterpret_cast<uint4 *>(xs + row * H);
    for (int c = lane; c < H / 8; c += 32)
        dst[c] = src[c];
}

// out[t] (+)= own[t] + the rows of t that the other ranks sent back, in rank order (one
// block per token; f32 sums of the bf16 rows, rounded once).
extern "C" __global__ void sc_moe_ep_combine(const bf16_t *own, const bf16_t *back,
                                             const int *pos, const int *counts, bf16_t *out,
                                             int T, int N, int H, int slab, int accumulate)
{
    griddep_enter();
    const int t = blockIdx.x;
    if (t >= T)
        return;
    __shared__ long long rows[SC_MOE_EP_MAX_RANKS];
    if (threadIdx.x < N) {
        const int d = threadIdx.x, p = pos[(long long)t * N + d];
        rows[d] = p < 0 ? -1 : ep_packet_row(counts, d, slab) + p;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < H / 8; c += blockDim.x) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        uint4 *o = reinterpret_cast<uint4 *>(out + (long long)t * H + c * 8);
        if (accumulate)
            load_bf16x8(acc, *o);
        add_bf16x8(acc, *reinterpret_cast<const uint4 *>(own + (long long)t * H + c * 8));
        for (int d = 0; d < N; d++)
            if (rows[d] >= 0)
                add_bf16x8(acc, *reinterpret_cast<const uint4 *>(back + rows[d] * H + c * 8));
        *o = pack_bf16x8(acc);
    }
}
