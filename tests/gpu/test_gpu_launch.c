/* Launch attributes on a real GPU: thread-block clusters and cooperative launches.
 *
 *   - clusters (sm_90+): a kernel whose blocks read their partner block's shared memory
 *     through distributed shared memory (mapa.shared::cluster + ld.shared::cluster, between
 *     two barrier.cluster arrive/wait pairs), on random input with the output poisoned
 *     first, compared with the CPU: with a runtime cluster of 2 x 1 x 1, 1 x 2 x 1 (a 2-D
 *     grid), a non-portable 16 x 1 x 1, and with a __cluster_dims__(2, 1, 1) kernel (cluster
 *     left 0 x 0 x 0, and given as the same dims); the kernel also records the cluster size
 *     it saw (%cluster_nctarank);
 *   - cooperative launches: a kernel with a hand-written grid-wide barrier (an arrival
 *     counter and a generation word; correct only because a cooperative launch makes every
 *     block resident at once) runs three dependent phases (per-block sums, a mix of all of
 *     them, a mix of neighbours) at the largest grid the device holds at once, compared with
 *     the CPU; again in 2-block clusters. The barrier gives up after a few seconds and says
 *     so, so a grid that is not resident fails the test instead of hanging it;
 *   - every bad cluster or cooperative configuration refused with its status and message
 *     (a grid the cluster does not divide, 16 blocks without non_portable_cluster, 32 with
 *     it, dims that differ from the compiled ones, a grid the compiled dims do not divide, a
 *     cluster-only kernel without a cluster, cluster.x of 0, a cooperative grid one block
 *     too large, in clusters too), the output still poisoned after each (nothing ran) and
 *     the context usable afterwards;
 *   - sc_kernel_occupancy_clusters: at least one 2-block cluster fits; the compiled dims are
 *     used when the cluster is 0 x 0 x 0; an impossible shape is refused as a launch would
 *     be (and answers 0); sc_kernel_info reports the compiled dims.
 *
 * Before sm_90 the cluster parts check that clusters are SC_ERR_NOT_SUPPORTED and the
 * cooperative part runs alone. SAFECUDA_UNDER_SANITIZER (compute-sanitizer) keeps the
 * sizes small. */
#include <inttypes.h>
#include <unistd.h>

#include "../test.h"

static bool sanitizer;
static sc_context ctx;
static sc_device_props dev;
static sc_module mod;

/* ---- kernels ---------------------------------------------------------------------------- */

static const char launch_src[] =
    "#define PAIR_BLOCK 128\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "// Distributed shared memory through inline PTX: no header beyond what NVRTC has.\n"
    "__device__ __forceinline__ unsigned cluster_rank()\n"
    "{\n"
    "    unsigned r;\n"
    "    asm volatile(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(r));\n"
    "    return r;\n"
    "}\n"
    "__device__ __forceinline__ unsigned cluster_size()\n"
    "{\n"
    "    unsigned r;\n"
    "    asm volatile(\"mov.u32 %0, %%cluster_nctarank;\" : \"=r\"(r));\n"
    "    return r;\n"
    "}\n"
    "__device__ __forceinline__ void cluster_sync()\n"
    "{\n"
    "    asm volatile(\"barrier.cluster.arrive.release.aligned;\\n\"\n"
    "                 \"barrier.cluster.wait.acquire.aligned;\" ::: \"memory\");\n"
    "}\n"
    "// The word at the same shared-memory offset as `local`, in block `rank` of the cluster.\n"
    "__device__ __forceinline__ unsigned load_peer(const unsigned *local, unsigned rank)\n"
    "{\n"
    "    unsigned long long generic = (unsigned long long)local, shared;\n"
    "    asm volatile(\"cvta.to.shared.u64 %0, %1;\" : \"=l\"(shared) : \"l\"(generic));\n"
    "    unsigned remote, v;\n"
    "    asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\"\n"
    "                 : \"=r\"(remote) : \"r\"((unsigned)shared), \"r\"(rank));\n"
    "    asm volatile(\"ld.shared::cluster.u32 %0, [%1];\" : \"=r\"(v) : \"r\"(remote) : \"memory\");\n"
    "    return v;\n"
    "}\n"
    "\n"
    "// Block b (linear id) holds in[b * 128 .. +128) in shared memory; its partner is the\n"
    "// block of cluster rank (rank ^ 1). out[b * 128 + t] = own[t] * 3 + partner[127 - t];\n"
    "// seen[b] = the partner's linear id (read from its shared memory) * 64 + cluster size.\n"
    "__device__ void pair_body(const unsigned *in, unsigned *out, unsigned *seen)\n"
    "{\n"
    "    __shared__ unsigned tile[PAIR_BLOCK];\n"
    "    __shared__ unsigned id;\n"
    "    const unsigned b = blockIdx.x + blockIdx.y * gridDim.x;\n"
    "    const unsigned t = threadIdx.x;\n"
    "    tile[t] = in[b * PAIR_BLOCK + t];\n"
    "    if (t == 0)\n"
    "        id = b;\n"
    "    cluster_sync(); // every block's tile is written\n"
    "    const unsigned partner = cluster_rank() ^ 1u;\n"
    "    const unsigned peer = load_peer(&tile[PAIR_BLOCK - 1 - t], partner);\n"
    "    out[b * PAIR_BLOCK + t] = tile[t] * 3u + peer;\n"
    "    if (t == 0)\n"
    "        seen[b] = load_peer(&id, partner) * 64u + cluster_size();\n"
    "    cluster_sync(); // no block leaves while its partner may still read its memory\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(PAIR_BLOCK)\n"
    "pair(const unsigned *in, unsigned *out, unsigned *seen)\n"
    "{\n"
    "    pair_body(in, out, seen);\n"
    "}\n"
    "extern \"C\" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(PAIR_BLOCK)\n"
    "pair_fixed(const unsigned *in, unsigned *out, unsigned *seen)\n"
    "{\n"
    "    pair_body(in, out, seen);\n"
    "}\n"
    "// Runs only in clusters, of a size given at launch.\n"
    "extern \"C\" __global__ void __cluster_dims__() cluster_only(unsigned *out)\n"
    "{\n"
    "    out[blockIdx.x] = cluster_size();\n"
    "}\n"
    "#else\n"
    "// Before sm_90: no clusters; pair exists for the refusal checks and never runs.\n"
    "extern \"C\" __global__ void pair(const unsigned *in, unsigned *out, unsigned *seen)\n"
    "{\n"
    "    __trap();\n"
    "}\n"
    "#endif\n"
    "\n"
    "// ---- a grid-wide barrier for cooperative launches --------------------------------------\n"
    "__device__ __forceinline__ unsigned load_acquire(const unsigned *p)\n"
    "{\n"
    "    unsigned v;\n"
    "    asm volatile(\"ld.acquire.gpu.global.u32 %0, [%1];\" : \"=r\"(v) : \"l\"(p) : \"memory\");\n"
    "    return v;\n"
    "}\n"
    "__device__ __forceinline__ unsigned add_acq_rel(unsigned *p, unsigned v)\n"
    "{\n"
    "    unsigned old;\n"
    "    asm volatile(\"atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;\"\n"
    "                 : \"=r\"(old) : \"l\"(p), \"r\"(v) : \"memory\");\n"
    "    return old;\n"
    "}\n"
    "__device__ __forceinline__ unsigned long long now_ns()\n"
    "{\n"
    "    unsigned long long t;\n"
    "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
    "    return t;\n"
    "}\n"
    "// sync[0]: arrivals, sync[1]: generation, sync[2]: set when a block gave up waiting.\n"
    "// Correct only when every block is resident at once (a cooperative launch).\n"
    "__device__ void grid_barrier(unsigned *sync, unsigned blocks, unsigned long long limit_ns)\n"
    "{\n"
    "    __syncthreads(); // the block's writes before the barrier are done\n"
    "    if (threadIdx.x == 0) {\n"
    "        const unsigned gen = load_acquire(&sync[1]);\n"
    "        __threadfence();\n"
    "        if (add_acq_rel(&sync[0], 1u) == blocks - 1u) {\n"
    "            sync[0] = 0u; // reset before the release: the next barrier starts at 0\n"
    "            add_acq_rel(&sync[1], 1u);\n"
    "        } else {\n"
    "            const unsigned long long start = now_ns();\n"
    "            while (load_acquire(&sync[1]) == gen) {\n"
    "                if (now_ns() - start > limit_ns) {\n"
    "                    atomicExch(&sync[2], 1u);\n"
    "                    break;\n"
    "                }\n"
    "                __nanosleep(100);\n"
    "            }\n"
    "        }\n"
    "        __threadfence();\n"
    "    }\n"
    "    __syncthreads();\n"
    "}\n"
    "#define COOP_BLOCK 128\n"
    "// Phase 1: part[b] = the sum of the block's `per` inputs. Phase 2: mix[b] = sum over j\n"
    "// of part[(b + j) % n] * (j + 1). Phase 3: out[b] = mix[b] ^ (mix[(b + 1) % n] * 7).\n"
    "// All in wrapping unsigned arithmetic.\n"
    "extern \"C\" __global__ void __launch_bounds__(COOP_BLOCK)\n"
    "phases(const unsigned *in, unsigned per, unsigned *part, unsigned *mix, unsigned *out,\n"
    "       unsigned *sync, unsigned long long limit_ns)\n"
    "{\n"
    "    __shared__ unsigned acc[COOP_BLOCK];\n"
    "    const unsigned n = gridDim.x * gridDim.y * gridDim.z;\n"
    "    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);\n"
    "    unsigned s = 0;\n"
    "    for (unsigned i = threadIdx.x; i < per; i += COOP_BLOCK)\n"
    "        s += in[(unsigned long long)b * per + i];\n"
    "    acc[threadIdx.x] = s;\n"
    "    __syncthreads();\n"
    "    for (unsigned w = COOP_BLOCK / 2; w > 0; w /= 2) {\n"
    "        if (threadIdx.x < w)\n"
    "            acc[threadIdx.x] += acc[threadIdx.x + w];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (threadIdx.x == 0)\n"
    "        part[b] = acc[0];\n"
    "    grid_barrier(sync, n, limit_ns);\n"
    "    unsigned m = 0;\n"
    "    for (unsigned j = threadIdx.x; j < n; j += COOP_BLOCK)\n"
    "        m += part[(b + j) % n] * (j + 1u);\n"
    "    acc[threadIdx.x] = m;\n"
    "    __syncthreads();\n"
    "    for (unsigned w = COOP_BLOCK / 2; w > 0; w /= 2) {\n"
    "        if (threadIdx.x < w)\n"
    "            acc[threadIdx.x] += acc[threadIdx.x + w];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (threadIdx.x == 0)\n"
    "        mix[b] = acc[0];\n"
    "    grid_barrier(sync, n, limit_ns);\n"
    "    if (threadIdx.x == 0)\n"
    "        out[b] = mix[b] ^ (mix[(b + 1) % n] * 7u);\n"
    "}\n";

#define PAIR_BLOCK 128
#define COOP_BLOCK 128
#define POISON 0xDEADBEEFu

/* ---- helpers ------------------------------------------------------------------------------ */

static sc_buffer make_u32(uint64_t count, const char *label)
{
    sc_buffer b = {0};
    sc_status s = sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = count,
                                                          .label = label, .zero = true},
                                   &b);
    if (s != SC_OK)
        fprintf(stderr, "buffer '%s' (%" PRIu64 " x u32): %s\n", label, count, sc_last_error());
    REQUIRE(s == SC_OK);
    return b;
}

static void poison(sc_buffer b)
{
    const uint32_t p = POISON;
    REQUIRE(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), &p) == SC_OK);
}

static void upload(sc_buffer b, const void *src, uint64_t bytes)
{
    sc_status s = sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), src, bytes);
    if (s != SC_OK)
        fprintf(stderr, "upload: %s\n", sc_last_error());
    REQUIRE(s == SC_OK);
}

static void download(void *dst, uint64_t bytes, sc_buffer b)
{
    sc_status s = sc_copy_to_host(SC_DEFAULT_STREAM, dst, bytes, sc_view_of(b));
    if (s != SC_OK)
        fprintf(stderr, "download: %s\n", sc_last_error());
    REQUIRE(s == SC_OK);
}

static sc_kernel kernel(const char *name)
{
    sc_kernel k = {0};
    sc_status s = sc_kernel_get(mod, name, &k);
    if (s != SC_OK)
        fprintf(stderr, "kernel '%s': %s\n", name, sc_last_error());
    REQUIRE(s == SC_OK);
    return k;
}

/* Every word of b is still the poison: the refused launch ran nothing. */
static bool still_poisoned(sc_buffer b, uint64_t count)
{
    uint32_t *h = test_xmalloc(count * 4);
    download(h, count * 4, b);
    uint64_t bad = 0;
    for (uint64_t i = 0; i < count; i++)
        bad += h[i] != POISON;
    free(h);
    if (bad)
        fprintf(stderr, "%" PRIu64 " of %" PRIu64 " words were written by a refused launch\n",
                bad, count);
    return bad == 0;
}

/* ---- clusters: distributed shared memory ---------------------------------------------------- */

static uint64_t seed = 1;

/* Launch pair (or pair_fixed) over a grid of gx x gy blocks in clusters of cx x cy (as
 * given in desc: 0 x 0 x 0 for the compiled dims) and check every word against the CPU. */
static void run_pair(sc_kernel k, uint32_t gx, uint32_t gy, sc_dim3 cluster, uint32_t cx,
                     uint32_t cy, bool non_portable, const char *what)
{
    const uint32_t blocks = gx * gy;
    const uint64_t n = (uint64_t)blocks * PAIR_BLOCK;
    uint32_t *in = test_xmalloc(n * 4), *out = test_xmalloc(n * 4), *seen = test_xmalloc(blocks * 4);
    test_fill_random(in, n * 4, seed++);
    sc_buffer din = make_u32(n, "in"), dout = make_u32(n, "out"), dseen = make_u32(blocks, "seen");
    upload(din, in, n * 4);
    poison(dout);
    poison(dseen);
    const sc_launch_desc d = {.grid = {gx, gy, 1}, .block = {PAIR_BLOCK, 1, 1},
                              .cluster = cluster, .non_portable_cluster = non_portable};
    sc_status s = SC_LAUNCH(SC_DEFAULT_STREAM, k, &d, sc_arg_in(sc_view_of(din)),
                            sc_arg_out(sc_view_of(dout)), sc_arg_out(sc_view_of(dseen)));
    if (s != SC_OK)
        fprintf(stderr, "%s: %s: %s\n", what, sc_status_name(s), sc_last_error());
    CHECK(s == SC_OK);
    CHECK_OK(sc_context_synchronize(ctx));
    download(out, n * 4, dout);
    download(seen, blocks * 4, dseen);
    uint64_t bad = 0, bad_seen = 0;
    for (uint32_t by = 0; by < gy; by++)
        for (uint32_t bx = 0; bx < gx; bx++) {
            /* The block's rank in its cluster is (bx % cx) + (by % cy) * cx; the partner has
             * rank ^ 1, in the same cluster. */
            const uint32_t rank = bx % cx + (by % cy) * cx, pr = rank ^ 1u;
            const uint32_t px = bx - bx % cx + pr % cx, py = by - by % cy + pr / cx;
            const uint32_t b = bx + by * gx, p = px + py * gx;
            for (uint32_t t = 0; t < PAIR_BLOCK; t++) {
                const uint32_t want = in[b * PAIR_BLOCK + t] * 3u +
                                      in[p * PAIR_BLOCK + PAIR_BLOCK - 1 - t];
                if (out[b * PAIR_BLOCK + t] != want && bad++ < 3)
                    fprintf(stderr, "%s: out[%u] = 0x%08x, want 0x%08x\n", what,
                            b * PAIR_BLOCK + t, out[b * PAIR_BLOCK + t], want);
            }
            const uint32_t want_seen = p * 64u + cx * cy;
            if (seen[b] != want_seen && bad_seen++ < 3)
                fprintf(stderr, "%s: block %u saw partner %u in a cluster of %u, want %u of %u\n",
                        what, b, seen[b] / 64u, seen[b] % 64u, p, cx * cy);
        }
    if (bad || bad_seen)
        fprintf(stderr, "%s: %" PRIu64 " words and %" PRIu64 " partners wrong\n", what, bad,
                bad_seen);
    CHECK(bad == 0 && bad_seen == 0);
    CHECK_OK(sc_buffer_destroy(din));
    CHECK_OK(sc_buffer_destroy(dout));
    CHECK_OK(sc_buffer_destroy(dseen));
    free(in);
    free(out);
    free(seen);
}

static void test_clusters(void)
{
    sc_kernel pair = kernel("pair"), fixed = kernel("pair_fixed");
    const uint32_t blocks = sanitizer ? 8 : 2 * (uint32_t)dev.sm_count;
    run_pair(pair, blocks, 1, (sc_dim3){2, 1, 1}, 2, 1, false, "cluster 2 x 1 x 1");
    run_pair(pair, 4, blocks / 4, (sc_dim3){1, 2, 0}, 1, 2, false, "cluster 1 x 2 x 1");
    run_pair(pair, sanitizer ? 32 : 16 * 16, 1, (sc_dim3){16, 1, 1}, 16, 1, true,
             "non-portable cluster 16 x 1 x 1");
    run_pair(fixed, blocks, 1, (sc_dim3){0, 0, 0}, 2, 1, false, "__cluster_dims__(2, 1, 1)");
    run_pair(fixed, blocks, 1, (sc_dim3){2, 1, 1}, 2, 1, false,
             "__cluster_dims__(2, 1, 1) with the same dims given");
    /* The compiled dims apply to a 2-D grid too (clusters along x). */
    run_pair(fixed, 2, blocks / 2, (sc_dim3){0, 0, 0}, 2, 1, false,
             "__cluster_dims__(2, 1, 1), 2-D grid");

    sc_kernel_props props;
    CHECK_OK(sc_kernel_info(fixed, &props));
    CHECK(props.cluster_dims.x == 2 && props.cluster_dims.y == 1 && props.cluster_dims.z == 1);
    CHECK(props.cluster_required);
    CHECK_OK(sc_kernel_info(pair, &props));
    CHECK(props.cluster_dims.x == 0 && props.cluster_dims.y == 0 && props.cluster_dims.z == 0);
    CHECK(!props.cluster_required);
    sc_kernel only = kernel("cluster_only");
    CHECK_OK(sc_kernel_info(only, &props));
    CHECK(props.cluster_dims.x == 0 && props.cluster_required);

    /* A cluster-only kernel with a cluster given: every block sees the size. */
    sc_buffer sizes = make_u32(8, "sizes");
    poison(sizes);
    const sc_launch_desc d4 = {.grid = {8, 1, 1}, .block = {32, 1, 1}, .cluster = {4, 1, 1}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, only, &d4, sc_arg_out(sc_view_of(sizes))));
    uint32_t h[8];
    download(h, sizeof h, sizes);
    for (int i = 0; i < 8; i++)
        CHECK(h[i] == 4);
    CHECK_OK(sc_buffer_destroy(sizes));
}

/* ---- cooperative launches: a grid-wide barrier ----------------------------------------------- */

static void run_phases(sc_kernel k, uint32_t grid, sc_dim3 cluster, const char *what)
{
    const uint32_t per = sanitizer ? 64 : 1024;
    const uint64_t n = (uint64_t)grid * per;
    uint32_t *in = test_xmalloc(n * 4), *out = test_xmalloc((uint64_t)grid * 4);
    uint32_t *part = test_xmalloc((uint64_t)grid * 4), *mix = test_xmalloc((uint64_t)grid * 4);
    test_fill_random(in, n * 4, seed++);
    sc_buffer din = make_u32(n, "in"), dpart = make_u32(grid, "part"), dmix = make_u32(grid, "mix"),
              dout = make_u32(grid, "out"), dsync = make_u32(3, "sync");
    upload(din, in, n * 4);
    poison(dpart);
    poison(dmix);
    poison(dout);
    const uint64_t limit_ns = (sanitizer ? 120ull : 10ull) * 1000000000ull;
    const sc_launch_desc d = {.grid = {grid, 1, 1}, .block = {COOP_BLOCK, 1, 1},
                              .cluster = cluster, .cooperative = true};
    sc_status s = SC_LAUNCH(SC_DEFAULT_STREAM, k, &d, sc_arg_in(sc_view_of(din)), sc_arg_u32(per),
                            sc_arg_inout(sc_view_of(dpart)), sc_arg_inout(sc_view_of(dmix)),
                            sc_arg_out(sc_view_of(dout)), sc_arg_inout(sc_view_of(dsync)),
                            sc_arg_u64(limit_ns));
    if (s != SC_OK)
        fprintf(stderr, "%s: %s: %s\n", what, sc_status_name(s), sc_last_error());
    CHECK(s == SC_OK);
    CHECK_OK(sc_context_synchronize(ctx));
    uint32_t sync[3];
    download(sync, sizeof sync, dsync);
    if (sync[2])
        fprintf(stderr, "%s: a block gave up at the grid barrier: not every block was resident\n",
                what);
    CHECK(sync[2] == 0);
    CHECK(sync[0] == 0 && sync[1] == 2); /* two barriers, each completed */
    download(out, (uint64_t)grid * 4, dout);
    for (uint32_t b = 0; b < grid; b++) {
        uint32_t sum = 0;
        for (uint32_t i = 0; i < per; i++)
            sum += in[(uint64_t)b * per + i];
        part[b] = sum;
    }
    for (uint32_t b = 0; b < grid; b++) {
        uint32_t m = 0;
        for (uint32_t j = 0; j < grid; j++)
            m += part[(b + j) % grid] * (j + 1u);
        mix[b] = m;
    }
    uint32_t bad = 0;
    for (uint32_t b = 0; b < grid; b++) {
        const uint32_t want = mix[b] ^ (mix[(b + 1) % grid] * 7u);
        if (out[b] != want && bad++ < 3)
            fprintf(stderr, "%s: out[%u] = 0x%08x, want 0x%08x\n", what, b, out[b], want);
    }
    if (bad)
        fprintf(stderr, "%s: %u of %u blocks wrong (grid %u)\n", what, bad, grid, grid);
    CHECK(bad == 0);
    CHECK_OK(sc_buffer_destroy(din));
    CHECK_OK(sc_buffer_destroy(dpart));
    CHECK_OK(sc_buffer_destroy(dmix));
    CHECK_OK(sc_buffer_destroy(dout));
    CHECK_OK(sc_buffer_destroy(dsync));
    free(in);
    free(out);
    free(part);
    free(mix);
}

/* The largest cooperative grid: resident blocks per SM x SMs (and in clusters, resident
 * clusters x cluster size). */
static uint32_t max_cooperative_grid(sc_kernel k, uint32_t cluster)
{
    int per_sm = 0;
    REQUIRE(sc_kernel_occupancy(k, COOP_BLOCK, 0, &per_sm) == SC_OK);
    REQUIRE(per_sm > 0);
    uint32_t grid = (uint32_t)per_sm * (uint32_t)dev.sm_count;
    if (cluster) {
        int clusters = 0;
        const sc_launch_desc q = {.block = {COOP_BLOCK, 1, 1}, .cluster = {cluster, 1, 1}};
        REQUIRE(sc_kernel_occupancy_clusters(k, &q, &clusters) == SC_OK);
        REQUIRE(clusters > 0);
        if ((uint32_t)clusters * cluster < grid)
            grid = (uint32_t)clusters * cluster;
        grid -= grid % cluster;
    }
    return grid;
}

static void test_cooperative(void)
{
    sc_kernel k = kernel("phases");
    const uint32_t max = max_cooperative_grid(k, 0);
    printf("cooperative: %u blocks of %d threads at most (%d SMs)\n", max, COOP_BLOCK,
           dev.sm_count);
    run_phases(k, sanitizer ? (uint32_t)dev.sm_count : max, (sc_dim3){0, 0, 0},
               "cooperative, largest grid");
    run_phases(k, 3, (sc_dim3){0, 0, 0}, "cooperative, 3 blocks");
    if (dev.cc_major >= 9) {
        const uint32_t in_clusters = max_cooperative_grid(k, 2);
        printf("cooperative in 2-block clusters: %u blocks at most\n", in_clusters);
        run_phases(k, sanitizer ? 2u * (uint32_t)(dev.sm_count / 2) : in_clusters,
                   (sc_dim3){2, 1, 1}, "cooperative, 2-block clusters, largest grid");
    }
}

/* ---- refusals ---------------------------------------------------------------------------- */

/* The launch is refused with want and a message holding each of the needles; the output
 * keeps its poison. */
static void refused(sc_kernel k, const sc_launch_desc *d, sc_buffer out, uint64_t count,
                    sc_status want, const char *needle1, const char *needle2)
{
    sc_clear_error();
    sc_status s = SC_LAUNCH(SC_DEFAULT_STREAM, k, d, sc_arg_in(sc_view_of(out)),
                            sc_arg_out(sc_view_of(out)), sc_arg_out(sc_view_of(out)));
    if (s != want)
        fprintf(stderr, "expected %s, got %s: %s\n", sc_status_name(want), sc_status_name(s),
                sc_last_error());
    CHECK(s == want);
    CHECK_MSG("sc_kernel_launch: ");
    CHECK_MSG(needle1);
    if (needle2)
        CHECK_MSG(needle2);
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK(still_poisoned(out, count));
}

static void test_refusals(void)
{
    sc_kernel pair = kernel("pair"), fixed = kernel("pair_fixed"), only = kernel("cluster_only");
    sc_kernel phases = kernel("phases");
    const uint64_t count = 64 * PAIR_BLOCK;
    sc_buffer out = make_u32(count, "out");
    poison(out);
    if (dev.cc_major < 9) {
        char want[96];
        snprintf(want, sizeof want, "device 0 is %d.%d", dev.cc_major, dev.cc_minor);
        refused(pair, &(sc_launch_desc){.grid = {4, 1, 1}, .block = {PAIR_BLOCK, 1, 1},
                                        .cluster = {2, 1, 1}},
                out, count, SC_ERR_NOT_SUPPORTED,
                "kernel 'pair': thread-block clusters (cluster = 2 x 1 x 1) need compute "
                "capability 9.0 or newer",
                want);
    } else {
        refused(pair, &(sc_launch_desc){.grid = {3, 1, 1}, .block = {PAIR_BLOCK, 1, 1},
                                        .cluster = {2, 1, 1}},
                out, count, SC_ERR_LAUNCH,
                "kernel 'pair': grid.x = 3 is not a multiple of cluster.x = 2 "
                "(grid 3 x 1 x 1, cluster 2 x 1 x 1)",
                NULL);
        refused(pair, &(sc_launch_desc){.grid = {4, 3, 1}, .block = {PAIR_BLOCK, 1, 1},
                                        .cluster = {2, 2, 1}},
                out, count, SC_ERR_LAUNCH, "grid.y = 3 is not a multiple of cluster.y = 2", NULL);
        refused(pair, &(sc_launch_desc){.grid = {32, 1, 1}, .block = {PAIR_BLOCK, 1, 1},
                                        .cluster = {16, 1, 1}},
                out, count, SC_ERR_LAUNCH,
                "kernel 'pair': cluster 16 x 1 x 1 = 16 blocks exceeds the portable cluster "
                "size of 8; set non_portable_cluster",
                NULL);
        refused(pair, &(sc_launch_desc){.grid = {32, 1, 1}, .block = {PAIR_BLOCK, 1, 1},
                                        .cluster = {32, 1, 1}, .non_portable_cluster = true},
                out, count, SC_ERR_LAUNCH,
                "kernel 'pair': cluster 32 x 1 x 1 = 32 blocks exceeds the kernel's "
                "non-portable maximum of ",
                "(blocks of 128 x 1 x 1 threads, 0 bytes of dynamic shared memory)");
        refused(fixed, &(sc_launch_desc){.grid = {8, 1, 1}, .block = {PAIR_BLOCK, 1, 1},
                                         .cluster = {4, 1, 1}},
                out, count, SC_ERR_LAUNCH,
                "kernel 'pair_fixed' was compiled with __cluster_dims__(2, 1, 1) but cluster = "
                "4 x 1 x 1 was asked",
                NULL);
        refused(fixed, &(sc_launch_desc){.grid = {3, 1, 1}, .block = {PAIR_BLOCK, 1, 1}}, out,
                count, SC_ERR_LAUNCH,
                "kernel 'pair_fixed': grid.x = 3 is not a multiple of cluster.x = 2 (grid 3 x 1 "
                "x 1, the kernel's compiled cluster 2 x 1 x 1)",
                NULL);
        refused(pair, &(sc_launch_desc){.grid = {4, 2, 1}, .block = {PAIR_BLOCK, 1, 1},
                                        .cluster = {0, 2, 1}},
                out, count, SC_ERR_LAUNCH, "kernel 'pair': cluster = 0 x 2 x 1: cluster.x is 0",
                NULL);
        /* cluster_only takes one argument. */
        sc_clear_error();
        const sc_launch_desc no_cluster = {.grid = {4, 1, 1}, .block = {32, 1, 1}};
        CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, only, &no_cluster, sc_arg_out(sc_view_of(out))),
                     SC_ERR_LAUNCH);
        CHECK_MSG("sc_kernel_launch: kernel 'cluster_only' runs only in clusters (compiled with "
                  "__cluster_dims__() without dims) but cluster is 0 x 0 x 0");
        CHECK(still_poisoned(out, count));
    }

    /* A cooperative grid one block past what is resident at once. */
    const uint32_t max = max_cooperative_grid(phases, 0);
    sc_buffer sync = make_u32(3, "sync");
    char want[160];
    snprintf(want, sizeof want, "kernel 'phases': a cooperative grid of %u x 1 x 1 = %u blocks "
             "exceeds the %u that can be resident at once", max + 1, max + 1, max);
    sc_clear_error();
    const sc_launch_desc too_big = {.grid = {max + 1, 1, 1}, .block = {COOP_BLOCK, 1, 1},
                                    .cooperative = true};
    CHECK_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, phases, &too_big,
                           sc_arg_in(sc_view_of(out)), sc_arg_u32(1), sc_arg_inout(sc_view_of(out)),
                           sc_arg_inout(sc_view_of(out)), sc_arg_out(sc_view_of(out)),
                           sc_arg_inout(sc_view_of(sync)), sc_arg_u64(1)),
                 SC_ERR_LAUNCH);
    CHECK_MSG(want);
    snprintf(want, sizeof want, "x %d SMs", dev.sm_count);
    CHECK_MSG(want);
    CHECK(still_poisoned(out, count));
    if (dev.cc_major >= 9) {
        /* In clusters: one cluster past what fits (which may also pass the per-SM bound,
         * checked first). */
        const uint32_t in_clusters = max_cooperative_grid(phases, 2);
        if (in_clusters + 2 > max)
            snprintf(want, sizeof want, "exceeds the %u that can be resident at once (", max);
        else
            snprintf(want, sizeof want, "exceeds the %u that can be resident at once in "
                     "clusters of 2 x 1 x 1", in_clusters);
        sc_clear_error();
        const sc_launch_desc too_many = {.grid = {in_clusters + 2, 1, 1},
                                         .block = {COOP_BLOCK, 1, 1}, .cluster = {2, 1, 1},
                                         .cooperative = true};
        sc_status s = SC_LAUNCH(SC_DEFAULT_STREAM, phases, &too_many,
                                sc_arg_in(sc_view_of(out)), sc_arg_u32(1),
                                sc_arg_inout(sc_view_of(out)), sc_arg_inout(sc_view_of(out)),
                                sc_arg_out(sc_view_of(out)), sc_arg_inout(sc_view_of(sync)),
                                sc_arg_u64(1));
        CHECK(s == SC_ERR_LAUNCH);
        CHECK_MSG(want);
        CHECK(still_poisoned(out, count));
    }

    /* The context is usable afterwards: a good launch runs. */
    CHECK_OK(sc_context_check(ctx));
    if (dev.cc_major >= 9)
        run_pair(pair, 8, 1, (sc_dim3){2, 1, 1}, 2, 1, false, "after the refusals");
    else
        run_phases(phases, 4, (sc_dim3){0, 0, 0}, "after the refusals");
    CHECK_OK(sc_buffer_destroy(sync));
    CHECK_OK(sc_buffer_destroy(out));
}

/* ---- the cluster occupancy query ------------------------------------------------------------ */

static void test_occupancy_clusters(void)
{
    sc_kernel pair = kernel("pair");
    const sc_launch_desc two = {.block = {PAIR_BLOCK, 1, 1}, .cluster = {2, 1, 1}};
    int n = -1;
    if (dev.cc_major < 9) {
        CHECK_STATUS(sc_kernel_occupancy_clusters(pair, &two, &n), SC_ERR_NOT_SUPPORTED);
        CHECK_MSG("need compute capability 9.0 or newer");
        CHECK(n == 0);
        return;
    }
    sc_kernel fixed = kernel("pair_fixed");
    CHECK_OK(sc_kernel_occupancy_clusters(pair, &two, &n));
    printf("2-block clusters of %d threads resident at once: %d\n", PAIR_BLOCK, n);
    CHECK(n >= 1);
    /* The compiled dims when the cluster is 0 x 0 x 0; the grid is not asked about. */
    const sc_launch_desc compiled = {.block = {PAIR_BLOCK, 1, 1}};
    int fixed_n = -1;
    CHECK_OK(sc_kernel_occupancy_clusters(fixed, &compiled, &fixed_n));
    CHECK(fixed_n == n);
    const sc_launch_desc sixteen = {.block = {PAIR_BLOCK, 1, 1}, .cluster = {16, 1, 1},
                                    .non_portable_cluster = true};
    int big = -1;
    CHECK_OK(sc_kernel_occupancy_clusters(pair, &sixteen, &big));
    printf("16-block clusters resident at once: %d\n", big);
    CHECK(big >= 1 && big <= n);
    /* Impossible shapes: refused as a launch would be, and 0. */
    const sc_launch_desc thirty_two = {.block = {PAIR_BLOCK, 1, 1}, .cluster = {32, 1, 1},
                                       .non_portable_cluster = true};
    n = -1;
    CHECK_STATUS(sc_kernel_occupancy_clusters(pair, &thirty_two, &n), SC_ERR_LAUNCH);
    CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'pair': cluster 32 x 1 x 1 = 32 blocks "
              "exceeds the kernel's non-portable maximum of ");
    CHECK(n == 0);
    const sc_launch_desc portable16 = {.block = {PAIR_BLOCK, 1, 1}, .cluster = {16, 1, 1}};
    n = -1;
    CHECK_STATUS(sc_kernel_occupancy_clusters(pair, &portable16, &n), SC_ERR_LAUNCH);
    CHECK_MSG("exceeds the portable cluster size of 8");
    CHECK(n == 0);
    const sc_launch_desc huge_block = {.block = {2048, 1, 1}, .cluster = {2, 1, 1}};
    n = -1;
    CHECK_STATUS(sc_kernel_occupancy_clusters(pair, &huge_block, &n), SC_ERR_LAUNCH);
    CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'pair': block.x = 2048 exceeds");
    CHECK(n == 0);
    n = -1;
    CHECK_STATUS(sc_kernel_occupancy_clusters(pair, &compiled, &n), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'pair': desc->cluster is 0 x 0 x 0 and the "
              "kernel has no compiled cluster dims");
    CHECK(n == 0);
}

/* ---- main ----------------------------------------------------------------------------------- */

int main(void)
{
    gpu_require();
    sanitizer = getenv("SAFECUDA_UNDER_SANITIZER") != NULL;
    if (sanitizer)
        printf("SAFECUDA_UNDER_SANITIZER: small grids\n");
    char cache[] = "/tmp/safecuda-test-launch-cache-XXXXXX";
    REQUIRE(mkdtemp(cache) != NULL);
    REQUIRE(setenv("SAFECUDA_CACHE_DIR", cache, 1) == 0);
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("skipped: %s\n", sc_last_error());
        return TEST_SKIP;
    }
    double t0 = test_now_s();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    REQUIRE(sc_device_info(0, &dev) == SC_OK);
    printf("%s (sm_%d%d, %d SMs), NVRTC %d.%d\n", dev.name, dev.cc_major, dev.cc_minor,
           dev.sm_count, major, minor);
    sc_program prog = {0};
    sc_status s = sc_program_create(ctx, &(sc_program_desc){.source = launch_src,
                                                            .name = "launch.cu"},
                                    &prog);
    if (s != SC_OK)
        fprintf(stderr, "%s\n", sc_last_error());
    REQUIRE(s == SC_OK);
    REQUIRE(sc_module_load(ctx, prog, &mod) == SC_OK);
    CHECK_OK(sc_program_destroy(prog));
    if (dev.cc_major >= 9)
        TEST_RUN(test_clusters);
    TEST_RUN(test_cooperative);
    TEST_RUN(test_refusals);
    TEST_RUN(test_occupancy_clusters);
    CHECK_OK(sc_module_destroy(mod));
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK_OK(sc_context_check(ctx));
    CHECK_OK(sc_context_destroy(ctx));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", cache);
    printf("total %.2f s\n", test_now_s() - t0);
    return test_result("test_gpu_launch");
}
