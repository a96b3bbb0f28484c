/* The MoE layer's plans (src/moe/plan.c) without a GPU or a driver: the decisions of a
 * forward for a few layer shapes and token counts, written out as numbers (routing path,
 * router splits, tile shape and its thresholds, grids, blocks, shared memory, GROUP_M,
 * programmatic launches, workspace bytes), so that a change which moves a threshold or a
 * grid shows up here; the tuning knobs; the tables' consistency; and invariants over a
 * range of T. The expected numbers are derived in the comments from moe_config.cuh as it
 * is now: a deliberate retune updates them. */
#include <inttypes.h>

#include "../test.h"
#include "moe/plan.h"

#define CHECK_EQ(got, want)                                                                \
    do {                                                                                   \
        unsigned long long got_ = (unsigned long long)(got);                               \
        unsigned long long want_ = (unsigned long long)(want);                             \
        if (got_ != want_) {                                                               \
            fprintf(stderr, "%s:%d: %s is %llu, expected %llu\n", __FILE__, __LINE__, #got, \
                    got_, want_);                                                          \
            test_failures++;                                                               \
        }                                                                                  \
    } while (0)

/* A launch's grid, block (x; y and z are 1 unless given in the grid), shared memory. */
#define CHECK_LAUNCH(l, gx, gy, gz, bx, smem)                                              \
    do {                                                                                   \
        CHECK_EQ((l).grid.x, gx);                                                          \
        CHECK_EQ((l).grid.y, gy);                                                          \
        CHECK_EQ((l).grid.z, gz);                                                          \
        CHECK_EQ((l).block.x, bx);                                                         \
        CHECK_EQ((l).block.y, 1);                                                          \
        CHECK_EQ((l).block.z, 1);                                                          \
        CHECK_EQ((l).shared_bytes, smem);                                                  \
    } while (0)

#define NOT_LAUNCHED(l) CHECK_EQ((l).grid.x, 0)

enum { SMS = 132 }; /* an H100 SXM */

/* Dynamic shared memory of the SM90 kernels: 1024 bytes of alignment slack, STAGES x (A
 * tile 64 CONS x 128 bytes + B tile BN x 128 bytes), 2 x STAGES barriers of 8 bytes, and
 * the row and tile offsets (2 x 529 ints). */
enum {
    SMEM_MMA = 65536,                                           /* 4 x (128 + 128) x 32 x 2 */
    SMEM_SMALL = 1024 + 4 * (8192 + 8192) + 64 + 4232,          /* 70856: CONS 1, BN 64, 4 */
    SMEM_LARGE = 1024 + 4 * (16384 + 32768) + 64 + 4232,        /* 201928: CONS 2, BN 256, 4 */
    SMEM_MEDIUM = 1024 + 6 * (16384 + 16384) + 96 + 4232,       /* 201960: CONS 2, BN 128, 6 */
    SMEM_WIDE = 1024 + 5 * (8192 + 32768) + 80 + 4232,          /* 210136: CONS 1, BN 256, 5 */
};

static sci_moe_config config(int E, int k, int H, int I, sc_moe_backend backend)
{
    return (sci_moe_config){.experts = E, .top_k = k, .hidden = H, .intermediate = I,
                            .groups = E, .slots = k, .logit_cols = E, .backend = backend, .sm_count = SMS, .tile_override = -1,
                            .group_override = 0, .pdl = true};
}

static sci_moe_plan plan(const sci_moe_config *c, uint64_t T)
{
    sci_moe_plan p;
    memset(&p, 0xa5, sizeof p); /* every field is the plan's, none left over */
    sci_moe_plan_make(c, T, false, &p);
    return p;
}

/* Every launch the plan makes is programmatic exactly when pdl says so. */
static void check_pdl(const sci_moe_plan *p, bool want)
{
    CHECK(p->pdl == want);
    const sc_launch_desc *all[] = {&p->route, &p->gather, &p->router, &p->topk, &p->offsets,
                                   &p->scatter, &p->w13, &p->w2, &p->combine};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->grid.x)
            CHECK(all[i]->programmatic == want);
}

/* SM90, a small layer: E = 8, k = 2, H = 512, I = 256. */
static void test_sm90_small_layer(void)
{
    const sci_moe_config c = config(8, 2, 512, 256, SC_MOE_BACKEND_SM90);

    /* T = 1: routing in one launch that also gathers x (2 rows x 512 x 2 bytes <= 256 KiB),
     * over ceil(8 / 2) = 4 blocks; the small tile (2 / 8 = 0 rows per expert <= 24). */
    sci_moe_plan p = plan(&c, 1);
    CHECK_EQ(p.tokens, 1);
    CHECK_EQ(p.rows, 2);
    check_pdl(&p, true);
    CHECK(p.route_small && p.route_gathers);
    CHECK_LAUNCH(p.route, 4, 1, 1, 256, 0);
    NOT_LAUNCHED(p.gather);
    NOT_LAUNCHED(p.router);
    NOT_LAUNCHED(p.topk);
    NOT_LAUNCHED(p.offsets);
    NOT_LAUNCHED(p.scatter);
    CHECK_EQ(p.tile, SCI_MOE_TILE_SMALL);
    CHECK_EQ(p.k13, SCI_MOE_K_W13_SMALL);
    CHECK_EQ(p.k2, SCI_MOE_K_W2_SMALL);
    CHECK(strcmp(p.step13, "w13 gemm (sm90 small)") == 0);
    CHECK(strcmp(p.step2, "w2 gemm (sm90 small)") == 0);
    /* M tiles: 2 / 64 + 8 experts = 8; W13: 8 x ceil(256 / 32) = 64 tiles, W2: 8 x
     * ceil(512 / 64) = 64, both under 132 SMs x 3 CTAs; 256 threads (1 consumer). */
    CHECK_LAUNCH(p.w13, 64, 1, 1, 256, SMEM_SMALL);
    CHECK_LAUNCH(p.w2, 64, 1, 1, 256, SMEM_SMALL);
    /* GROUP_M: 16 MiB / (64 rows x K x 2 bytes) = 256 (K = H) and 512 (K = I), at most 16. */
    CHECK_EQ(p.group_m13, 16);
    CHECK_EQ(p.group_m2, 16);
    CHECK_LAUNCH(p.combine, 1, 1, 1, 256, 0);
    /* Workspace for 1 token: logits 16 rows (the split router's) x 8 x 4 = 512; ids,
     * weights, permuted tokens and weights, positions 5 x 2 x 4 = 40; counts and cursors
     * 2 x 8 x 4, row and tile offsets 2 x 9 x 4: 136; h 2 x (256 + 64) x 2 = 1280; y
     * 2 x 512 x 2 = 2048, x in expert order 2 x (512 + 64) x 2 = 2304 (SM90's A rows are
     * padded by SC_MOE_SM90_A_PAD for the K shift); the zero bias and the ticket 8; the
     * shared expert's weight per token 4. */
    CHECK_EQ(p.workspace_bytes, 512 + 40 + 136 + 1280 + 2048 + 2304 + 8 + 4);

    /* The routing paths and programmatic launches around their thresholds. */
    CHECK(plan(&c, 16).route_small);
    CHECK(!plan(&c, 17).route_small);
    p = plan(&c, 64);
    check_pdl(&p, true);
    p = plan(&c, 65);
    check_pdl(&p, false);

    /* T = 17: routing in steps. Router: 1 x 1 output tiles leave SMs idle: 132 splits, at
     * most 16, at most 512 / 256 = 2 (each >= 256 columns): 2 splits of 256 columns.
     * Top-k: 8 tokens a block; offsets: one block; scatter + gather: 8 warps a block over
     * 34 rows. */
    p = plan(&c, 17);
    NOT_LAUNCHED(p.route);
    NOT_LAUNCHED(p.gather);
    CHECK_EQ(p.router_splits, 2);
    CHECK_EQ(p.router_k_chunk, 256);
    CHECK_LAUNCH(p.router, 1, 1, 2, 256, SMEM_MMA);
    CHECK_LAUNCH(p.topk, 3, 1, 1, 256, 0);
    CHECK_LAUNCH(p.offsets, 1, 1, 1, 32, 0); /* a thread per group, in whole warps */
    CHECK_LAUNCH(p.scatter, 5, 1, 1, 256, 0);
    CHECK_EQ(p.tile, SCI_MOE_TILE_SMALL);
    CHECK_LAUNCH(p.combine, 17, 1, 1, 256, 0);

    /* The small tile up to 24 rows per expert on average: 99 x 2 / 8 = 24, 100 x 2 / 8 =
     * 25. */
    CHECK_EQ(plan(&c, 99).tile, SCI_MOE_TILE_SMALL);
    p = plan(&c, 100);
    CHECK_EQ(p.tile, SCI_MOE_TILE_LARGE);
    CHECK_EQ(p.k13, SCI_MOE_K_W13_LARGE);
    CHECK_EQ(p.k2, SCI_MOE_K_W2_LARGE);
    CHECK(strcmp(p.step13, "w13 gemm (sm90 large)") == 0);
    /* M tiles: 200 / 128 + 8 = 9; W13 9 x ceil(256 / 128) = 18, W2 9 x ceil(512 / 256) =
     * 18; 384 threads (2 consumers). GROUP_M: 16 MiB / (128 x 512 x 2) = 128 -> 16. */
    CHECK_LAUNCH(p.w13, 18, 1, 1, 384, SMEM_LARGE);
    CHECK_LAUNCH(p.w2, 18, 1, 1, 384, SMEM_LARGE);
    CHECK_EQ(p.group_m13, 16);
    CHECK_EQ(p.group_m2, 16);

    /* The default workspace (256 tokens): logits 4096 rows (16 splits x 256) x 8 x 4 =
     * 131072; 5 x 512 rows x 4 = 10240; offsets and counts 136; h 512 x (256 + 64) x 2 =
     * 327680; y 512 x 512 x 2 = 524288 and x in expert order 512 x (512 + 64) x 2 = 589824;
     * 8; shared weights 256 x 4. */
    CHECK_EQ(plan(&c, 256).workspace_bytes,
             131072 + 10240 + 136 + 327680 + 524288 + 589824 + 8 + 1024);
    CHECK_EQ(sci_moe_workspace_bytes_for(&c, 256), 1584272);
}

/* SM90, a DeepSeek-V3-sized layer: E = 256, k = 8, H = 7168, I = 2048. */
static void test_sm90_large_layer(void)
{
    const sci_moe_config c = config(256, 8, 7168, 2048, SC_MOE_BACKEND_SM90);

    /* T = 16: one routing launch (128 blocks of 2 experts), but x in expert order is 128 x
     * 7168 x 2 bytes > 256 KiB: a gather launch of 8 warps a block over 128 rows. */
    sci_moe_plan p = plan(&c, 16);
    CHECK(p.route_small && !p.route_gathers);
    CHECK_LAUNCH(p.route, 128, 1, 1, 256, 0);
    CHECK_LAUNCH(p.gather, 16, 1, 1, 256, 0);
    /* Small tile: M tiles 128 / 64 + 256 = 258, W13 258 x ceil(2048 / 32) = 16512 tiles:
     * the persistent grid is 132 x 3 CTAs. GROUP_M: 16 MiB / (64 x 7168 x 2) = 18 -> 16. */
    CHECK_EQ(p.tile, SCI_MOE_TILE_SMALL);
    CHECK_LAUNCH(p.w13, 396, 1, 1, 256, SMEM_SMALL);
    CHECK_LAUNCH(p.w2, 396, 1, 1, 256, SMEM_SMALL);
    CHECK_EQ(p.group_m13, 16);
    CHECK_EQ(p.group_m2, 16);

    /* Tile threshold: 799 x 8 / 256 = 24, 800 x 8 / 256 = 25. */
    CHECK_EQ(plan(&c, 799).tile, SCI_MOE_TILE_SMALL);
    p = plan(&c, 800);
    CHECK_EQ(p.tile, SCI_MOE_TILE_LARGE);
    /* Router: 7 x 2 output tiles, 132 / 14 = 9 splits of ceil(7168 / 9) = 797 -> 800
     * columns (whole K steps of 32): 9 splits. */
    CHECK_EQ(p.router_splits, 9);
    CHECK_EQ(p.router_k_chunk, 800);
    CHECK_LAUNCH(p.router, 7, 2, 9, 256, SMEM_MMA);
    /* Large tile: one CTA per SM. GROUP_M: 16 MiB / (128 x 7168 x 2) = 9 for W13 (K = H),
     * 16 MiB / (128 x 2048 x 2) = 32 -> 16 for W2 (K = I). */
    CHECK_LAUNCH(p.w13, 132, 1, 1, 384, SMEM_LARGE);
    CHECK_LAUNCH(p.w2, 132, 1, 1, 384, SMEM_LARGE);
    CHECK_EQ(p.group_m13, 9);
    CHECK_EQ(p.group_m2, 16);
    check_pdl(&p, false);

    /* Up to 2048 tokens the router splits; above, one split of all of H. */
    p = plan(&c, 2049);
    CHECK_EQ(p.router_splits, 1);
    CHECK_EQ(p.router_k_chunk, 7168);
    CHECK_LAUNCH(p.router, 17, 2, 1, 256, SMEM_MMA);
    CHECK_LAUNCH(p.topk, 257, 1, 1, 256, 0);
    CHECK_LAUNCH(p.scatter, 2049, 1, 1, 256, 0);
}

/* Splits of whole K steps can come out fewer than asked: H = 4104 asks 16 splits of 257
 * columns, rounded up to 288, which take 15. */
static void test_router_rounding(void)
{
    const sci_moe_config c = config(8, 2, 4104, 256, SC_MOE_BACKEND_MMA);
    sci_moe_plan p = plan(&c, 100);
    CHECK_EQ(p.router_splits, 15);
    CHECK_EQ(p.router_k_chunk, 288);
    CHECK_LAUNCH(p.router, 1, 1, 15, 256, SMEM_MMA);
}

/* The MMA backend: E = 64, k = 6, H = 1024, I = 512. */
static void test_mma(void)
{
    const sci_moe_config c = config(64, 6, 1024, 512, SC_MOE_BACKEND_MMA);
    /* Few tokens: one routing launch; it never gathers x on MMA (the GEMM reads x through
     * the permutation). */
    sci_moe_plan p = plan(&c, 3);
    CHECK(p.route_small && !p.route_gathers);
    CHECK_LAUNCH(p.route, 32, 1, 1, 256, 0);
    NOT_LAUNCHED(p.gather);
    CHECK_EQ(p.tile, -1);
    CHECK_EQ(p.k13, SCI_MOE_K_W13);
    CHECK_EQ(p.k2, SCI_MOE_K_W2);
    CHECK(strcmp(p.step13, "w13 gemm (mma)") == 0);
    CHECK(strcmp(p.step2, "w2 gemm (mma)") == 0);
    /* M tiles: ceil(18 / 128) + 64 = 65; W13 N tiles ceil(512 / 64) = 8, W2 ceil(1024 /
     * 128) = 8. */
    CHECK_LAUNCH(p.w13, 65, 8, 1, 256, SMEM_MMA);
    CHECK_LAUNCH(p.w2, 65, 8, 1, 256, SMEM_MMA);
    check_pdl(&p, true);

    /* T = 2048: 12288 rows, 96 + 64 = 160 M tiles; the scatter takes 256 rows a block. */
    p = plan(&c, 2048);
    CHECK(!p.route_small);
    CHECK_LAUNCH(p.scatter, 48, 1, 1, 256, 0);
    CHECK_LAUNCH(p.w13, 160, 8, 1, 256, SMEM_MMA);
    CHECK_LAUNCH(p.w2, 160, 8, 1, 256, SMEM_MMA);
    /* Router: 16 x 1 output tiles, 132 / 16 = 8 splits, but each at least 256 columns:
     * 1024 / 256 = 4. */
    CHECK_EQ(p.router_splits, 4);
    CHECK_EQ(p.router_k_chunk, 256);
    CHECK_LAUNCH(p.combine, 2048, 1, 1, 256, 0);

    /* Without x in expert order and h's padding: the SM90 workspace less rows x (H + 64) x 2
     * bytes and rows x 64 x 2. */
    sci_moe_config sm90 = c;
    sm90.backend = SC_MOE_BACKEND_SM90;
    CHECK_EQ(sci_moe_workspace_bytes_for(&sm90, 100) - sci_moe_workspace_bytes_for(&c, 100),
             600ull * (1024 + 64) * 2 + 600ull * 64 * 2);
    uint64_t count[SCI_MOE_W_COUNT];
    sci_moe_workspace_counts(&c, 100, count);
    CHECK_EQ(count[SCI_MOE_W_XPERM], 0);
}

/* SAFECUDA_MOE_TILE, SAFECUDA_MOE_PDL and SAFECUDA_MOE_GROUP_M as the configuration holds
 * them. */
static void test_knobs(void)
{
    sci_moe_config c = config(8, 2, 512, 256, SC_MOE_BACKEND_SM90);
    CHECK_EQ(sci_moe_tile_named("large"), SCI_MOE_TILE_LARGE);
    CHECK_EQ(sci_moe_tile_named("small"), SCI_MOE_TILE_SMALL);
    CHECK_EQ(sci_moe_tile_named("medium"), SCI_MOE_TILE_MEDIUM);
    CHECK_EQ(sci_moe_tile_named("wide"), SCI_MOE_TILE_WIDE);
    CHECK(sci_moe_tile_named("huge") == -1);
    CHECK(sci_moe_tile_named("") == -1);
    CHECK(sci_moe_tile_named(NULL) == -1);

    /* A fixed tile whatever T: medium (2 consumers, BN 128, one CTA per SM) at T = 1:
     * M tiles 2 / 128 + 8 = 8, W13 8 x ceil(256 / 64) = 32, W2 8 x ceil(512 / 128) = 32. */
    c.tile_override = SCI_MOE_TILE_MEDIUM;
    sci_moe_plan p = plan(&c, 1);
    CHECK_EQ(p.tile, SCI_MOE_TILE_MEDIUM);
    CHECK(strcmp(p.step2, "w2 gemm (sm90 medium)") == 0);
    CHECK_LAUNCH(p.w13, 32, 1, 1, 384, SMEM_MEDIUM);
    CHECK_LAUNCH(p.w2, 32, 1, 1, 384, SMEM_MEDIUM);
    /* Wide (1 consumer, BN 256) at T = 5000: 10000 / 64 + 8 = 164 M tiles, W13 164 x 2. */
    c.tile_override = SCI_MOE_TILE_WIDE;
    p = plan(&c, 5000);
    CHECK_EQ(p.tile, SCI_MOE_TILE_WIDE);
    CHECK_LAUNCH(p.w13, 132, 1, 1, 256, SMEM_WIDE);
    c.tile_override = SCI_MOE_TILE_SMALL;
    CHECK_EQ(plan(&c, 100000).tile, SCI_MOE_TILE_SMALL);

    /* No programmatic launches at all. */
    c = config(8, 2, 512, 256, SC_MOE_BACKEND_SM90);
    c.pdl = false;
    p = plan(&c, 1);
    check_pdl(&p, false);
    p = plan(&c, 40);
    check_pdl(&p, false);

    /* A fixed GROUP_M. */
    c = config(256, 8, 7168, 2048, SC_MOE_BACKEND_SM90);
    c.group_override = 4;
    p = plan(&c, 1000);
    CHECK_EQ(p.group_m13, 4);
    CHECK_EQ(p.group_m2, 4);
}

static void test_workspace_growth_and_limits(void)
{
    /* At least double, so that growth is rare; nothing while T fits. */
    CHECK_EQ(sci_moe_workspace_grow(256, 100), 0);
    CHECK_EQ(sci_moe_workspace_grow(256, 256), 0);
    CHECK_EQ(sci_moe_workspace_grow(256, 257), 512);
    CHECK_EQ(sci_moe_workspace_grow(256, 5000), 5000);
    CHECK_EQ(sci_moe_workspace_grow(0, 3), 3);

    /* Rows (T k) must fit an int: 2^31 / 8 tokens with k = 8. */
    sci_moe_config c = config(256, 8, 7168, 2048, SC_MOE_BACKEND_SM90);
    CHECK(sci_moe_tokens_fit(&c, 1));
    CHECK(sci_moe_tokens_fit(&c, 268435455));
    CHECK(!sci_moe_tokens_fit(&c, 268435456));
    /* Elements of h and y (T k max(H, I)) at most 2^46: 2^30 tokens with k = 1, H = 2^16. */
    c = config(1, 1, 65536, 8, SC_MOE_BACKEND_MMA);
    CHECK(sci_moe_tokens_fit(&c, 1ull << 30));
    CHECK(!sci_moe_tokens_fit(&c, (1ull << 30) + 1));
    CHECK(!sci_moe_tokens_fit(&c, UINT64_MAX / 65536));
}

/* The tables agree with each other and with the hardware limits. */
static void test_tables(void)
{
    /* A bf16 tile's kernels for weights at an unaligned offset are its own (bf16's K shift is
     * in its one kernel): those entries repeat their names; every other name is one kernel. */
    bool alias[SCI_MOE_K_COUNT] = {false};
    for (int t = 0; t < SCI_MOE_N_TILES; t++)
        if (!sci_moe_tiles[t].fp8)
            alias[sci_moe_tiles[t].k13s] = alias[sci_moe_tiles[t].k2s] = true;
    for (int i = 0; i < SCI_MOE_K_COUNT; i++) {
        const sci_moe_kernel_info *k = &sci_moe_kernels[i];
        CHECK(k->file && k->name && strncmp(k->name, "sc_moe_", 7) == 0);
        CHECK(k->smem >= 0 && k->smem <= 227 * 1024); /* sm_90's opt-in limit */
        /* The sm_90a file holds SM90 kernels only. */
        if (strcmp(k->file, "moe/moe_sm90a.cu") == 0)
            CHECK(k->backend == SC_MOE_BACKEND_SM90);
        for (int j = 0; j < i && !alias[i]; j++)
            CHECK(alias[j] || strcmp(k->name, sci_moe_kernels[j].name) != 0);
    }
    for (int t = 0; t < SCI_MOE_N_TILES; t++) {
        const sci_moe_tile_info *ts = &sci_moe_tiles[t];
        CHECK(sci_moe_tile_named(ts->name) == t);
        CHECK(sci_moe_kernels[ts->k13].backend == SC_MOE_BACKEND_SM90);
        CHECK(sci_moe_kernels[ts->k2].backend == SC_MOE_BACKEND_SM90);
        CHECK(sci_moe_kernels[ts->k13].smem == sci_moe_kernels[ts->k2].smem);
        CHECK(strstr(sci_moe_kernels[ts->k13].name, ts->name) != NULL);
        CHECK(strstr(sci_moe_kernels[ts->k2].name, ts->name) != NULL);
        /* for weights at an unaligned offset: e4m3's _ks twins, bf16's own kernels */
        char w13[128], w2[128];
        snprintf(w13, sizeof w13, "%s%s", sci_moe_kernels[ts->k13].name, ts->fp8 ? "_ks" : "");
        snprintf(w2, sizeof w2, "%s%s", sci_moe_kernels[ts->k2].name, ts->fp8 ? "_ks" : "");
        CHECK(strcmp(sci_moe_kernels[ts->k13s].name, w13) == 0);
        CHECK(strcmp(sci_moe_kernels[ts->k2s].name, w2) == 0);
        CHECK(sci_moe_kernels[ts->k13s].smem == sci_moe_kernels[ts->k13].smem);
        CHECK(sci_moe_kernels[ts->k2s].smem == sci_moe_kernels[ts->k2].smem);
        CHECK(strstr(ts->step13, ts->name) && strstr(ts->step2, ts->name));
        CHECK(strstr(ts->step13s, ts->name) && strstr(ts->step13s, "K shift"));
        CHECK(strstr(ts->step2s, ts->name) && strstr(ts->step2s, "K shift"));
        /* the e4m3 W13 tiles of more than two passes (fp8_narrow) read unaligned boxes */
        CHECK(ts->w13_shifts == (!ts->fp8 || 128 / ts->split / (ts->bn / 2) <= 2));
        if (strcmp(ts->name, "fp8_narrow") == 0)
            CHECK(!ts->w13_shifts);
        CHECK(128 * (ts->cons + 1) <= 1024);
        CHECK(ts->bn == 64 || ts->bn == 128 || ts->bn == 256); /* wgmma_tile<BN> */
        CHECK(ts->a_box >= 8 && ts->a_box <= 64 * ts->cons && (64 * ts->cons) % ts->a_box == 0);
    }
    for (int i = 0; i < SCI_MOE_W_COUNT; i++)
        CHECK(sci_moe_workspace[i].label && sc_dtype_size(sci_moe_workspace[i].dtype) > 0);
}

/* Over a range of T, for both backends: the grids stay within the launch limits, the
 * router's splits cover H once, the persistent grids stay within the device, and the
 * workspace grows with T and is the sum of its buffers. */
static void test_invariants(void)
{
    static const int shapes[][4] = {
        {8, 2, 512, 256}, {64, 6, 1024, 512}, {256, 8, 7168, 2048}, {1, 1, 8, 8},
        {128, 1, 4104, 72},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        for (int b = SC_MOE_BACKEND_MMA; b <= SC_MOE_BACKEND_SM90; b++) {
            const sci_moe_config c = config(shapes[si][0], shapes[si][1], shapes[si][2],
                                            shapes[si][3], (sc_moe_backend)b);
            uint64_t last_bytes = 0;
            for (uint64_t T = 1; T <= 6000; T += T < 100 ? 1 : 37) {
                const sci_moe_plan p = plan(&c, T);
                const int failures = test_failures;
                CHECK(p.tokens == T && p.rows == T * (uint64_t)c.top_k);
                CHECK(p.route_small == (p.route.grid.x != 0));
                CHECK(p.route_small == (p.router.grid.x == 0));
                const sc_launch_desc *all[] = {&p.route,   &p.gather, &p.router,
                                               &p.topk,    &p.offsets, &p.scatter,
                                               &p.w13,     &p.w2,      &p.combine};
                for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                    if (all[i]->grid.x)
                        CHECK(all[i]->grid.y >= 1 && all[i]->grid.y <= 65535 &&
                              all[i]->grid.z >= 1 && all[i]->grid.z <= 65535 &&
                              all[i]->block.x >= 32 && all[i]->block.x <= 1024);
                if (!p.route_small) {
                    const uint64_t H = (uint64_t)c.hidden, n = (uint64_t)p.router_splits;
                    const uint64_t chunk = (uint64_t)p.router_k_chunk;
                    CHECK(n >= 1 && n <= 16 && chunk % 32 == 0);
                    CHECK(n * chunk >= H && (n - 1) * chunk < H);
                    CHECK(p.router.grid.z == n);
                }
                if (b == SC_MOE_BACKEND_SM90) {
                    const uint32_t max_ctas = SMS * (uint32_t)sci_moe_tiles[p.tile].ctas_per_sm;
                    CHECK(p.w13.grid.x <= max_ctas && p.w2.grid.x <= max_ctas);
                    CHECK(p.group_m13 >= 1 && p.group_m13 <= 16);
                    CHECK(p.group_m2 >= 1 && p.group_m2 <= 16);
                } else {
                    CHECK(p.tile == -1 && p.w13.grid.x == p.w2.grid.x);
                }
                uint64_t count[SCI_MOE_W_COUNT], sum = 0;
                sci_moe_workspace_counts(&c, T, count);
                for (int i = 0; i < SCI_MOE_W_COUNT; i++)
                    sum += count[i] * sc_dtype_size(sci_moe_workspace[i].dtype);
                CHECK(p.workspace_bytes == sum && sum >= last_bytes);
                last_bytes = sum;
                if (test_failures != failures) {
                    fprintf(stderr, "  (shape %zu, backend %d, T = %" PRIu64 ")\n", si, b, T);
                    return;
                }
            }
        }
    }
}

/* v2: a shared expert (S chunks of I: rows per token k + S, experts in the GEMMs E + S), a
 * shared gate (one more router column), and the caller's routing (no top-k; the router
 * GEMM only for the gate's one column). Qwen3-Next's shape: E = 512, k = 10, H = 2048,
 * I = 512, a gated shared expert of 512. */
static void test_shared_and_caller_routing(void)
{
    sci_moe_config c = config(512, 10, 2048, 512, SC_MOE_BACKEND_SM90);
    c.shared = 1;
    c.groups = 513;
    c.slots = 11;
    c.logit_cols = 513;
    /* T = 1: one routing launch over ceil(513 / 2) = 257 blocks (the gate's column too). */
    sci_moe_plan p = plan(&c, 1);
    CHECK(p.route_small);
    CHECK_EQ(p.rows, 11);
    CHECK_EQ(p.route.grid.x, 257);
    /* T = 100: router over 513 columns in 5 column tiles; offsets a thread per group in
     * whole warps (544); 1100 rows; M tiles 1100 / 128 + 513 = 521 (W13: 521 x 512 / 128). */
    p = plan(&c, 100);
    CHECK(!p.route_small);
    CHECK_EQ(p.router.grid.y, 5);
    CHECK_EQ(p.rows, 1100);
    CHECK_LAUNCH(p.offsets, 1, 1, 1, 544, 0);
    NOT_LAUNCHED(p.count_ids);
    /* The caller's routing: for T = 1 too in steps; a thread per token counts the ids; the
     * gate's column alone, as the layer's own routing computes it: for few tokens in one
     * block as the one-launch routing does, else by the router with the routing's splits
     * of H over the one column tile. */
    sci_moe_plan q;
    sci_moe_plan_make(&c, 1, true, &q);
    CHECK(!q.route_small);
    NOT_LAUNCHED(q.topk);
    NOT_LAUNCHED(q.router);
    CHECK_LAUNCH(q.gate_small, 1, 1, 1, 256, 0);
    CHECK_LAUNCH(q.count_ids, 1, 1, 1, 256, 0);
    CHECK_EQ(q.rows, 11);
    sci_moe_plan_make(&c, 1000, true, &q);
    CHECK_LAUNCH(q.count_ids, 4, 1, 1, 256, 0);
    NOT_LAUNCHED(q.gate_small);
    sci_moe_plan own = plan(&c, 1000);
    CHECK_EQ(q.router.grid.x, own.router.grid.x);
    CHECK_EQ(q.router.grid.y, 1);
    CHECK_EQ(q.router.grid.z, own.router.grid.z);
    CHECK_EQ(q.router_k_chunk, own.router_k_chunk);
    /* Without a gate the caller's routing makes no router launch. */
    c.logit_cols = 512;
    sci_moe_plan_make(&c, 1000, true, &q);
    NOT_LAUNCHED(q.router);
    /* The workspace: logits per router column, ids and weights T x k, the rows T (k + S),
     * counts and offsets per group, a shared weight per token. */
    uint64_t n[SCI_MOE_W_COUNT];
    c.logit_cols = 513;
    sci_moe_workspace_counts(&c, 100, n);
    CHECK_EQ(n[SCI_MOE_W_LOGITS], 100 * 16 * 513); /* 16 splits' slices of 100 tokens */
    CHECK_EQ(n[SCI_MOE_W_IDS], 1000);
    CHECK_EQ(n[SCI_MOE_W_POS], 1100);
    CHECK_EQ(n[SCI_MOE_W_H], 1100 * (512 + SC_MOE_SM90_A_PAD));
    CHECK_EQ(n[SCI_MOE_W_COUNTS], 513);
    CHECK_EQ(n[SCI_MOE_W_ROW_OFF], 514);
    CHECK_EQ(n[SCI_MOE_W_SHARED_W], 100);
}

/* fp8 experts (SM90): x gathered and quantized by its own launch after the routing (never
 * inside the one-launch routing), the fp8 tiles (for decode W13 in clusters of two CTAs
 * sharing each tile's 128 columns of h while the tiles would not fill the SMs), the
 * workspace's e4m3 x and h with their scales instead of bf16. */
enum {
    SMEM_FP8_SMALL = 1024 + 8 * (8192 + 16384) + 128 + 4232,            /* CONS 1, BN 128, 8 */
    SMEM_FP8_SPLIT = SMEM_FP8_SMALL + 256 + 32, /* + the rows' amax, 2 barriers */
    SMEM_FP8_NARROW = 1024 + 6 * (8192 + 8192) + 96 + 4232,             /* CONS 1, BN 64, 6 */
    SMEM_FP8_LARGE = 1024 + 6 * (16384 + 16384) + 96 + 4232,            /* CONS 2, BN 128, 6 */
};

static void test_fp8(void)
{
    sci_moe_config c = config(256, 8, 7168, 2048, SC_MOE_BACKEND_SM90);
    c.fp8 = true;
    /* T = 1: routing in one launch without the gather; gather + quantize, a warp per row
     * and 128 channels (8 rows x 56: 56 blocks of 8 warps); the fp8 small tile (8 experts x 2048 / 128 = 128 W13
     * tiles: not fewer than the 132 SMs... by 4), one CTA per SM. */
    sci_moe_plan p = plan(&c, 1);
    CHECK(p.route_small && !p.route_gathers);
    CHECK_LAUNCH(p.gather, 56, 1, 1, 256, 0);
    CHECK_EQ(p.tile, SCI_MOE_TILE_FP8_SPLIT);
    c.shared = 1; /* 9 x 16 = 144 tiles: the narrow tile, two CTAs per SM */
    CHECK_EQ(plan(&c, 1).tile, SCI_MOE_TILE_FP8_NARROW);
    p = plan(&c, 1);
    CHECK_EQ(p.k13, SCI_MOE_K_W13_FP8_NARROW);
    CHECK_EQ(p.k2, SCI_MOE_K_W2_FP8_NARROW);
    CHECK_LAUNCH(p.w13, 264, 1, 1, 256, SMEM_FP8_NARROW);
    CHECK_EQ(p.w13.cluster.x, 0);
    CHECK_LAUNCH(p.w2, 264, 1, 1, 256, SMEM_FP8_NARROW);
    /* T = 16: (128 + 1) x 16 = 2064 tiles: the small tile, one CTA per SM */
    p = plan(&c, 16);
    CHECK_EQ(p.tile, SCI_MOE_TILE_FP8_SMALL);
    CHECK_EQ(p.k13, SCI_MOE_K_W13_FP8_SMALL);
    CHECK_EQ(p.k2, SCI_MOE_K_W2_FP8_SMALL);
    CHECK_LAUNCH(p.w13, 132, 1, 1, 256, SMEM_FP8_SMALL);
    CHECK_LAUNCH(p.w2, 132, 1, 1, 256, SMEM_FP8_SMALL);
    /* A small layer (I = 768: 6 tiles per expert): 8 x 6 = 48 W13 tiles at T = 1, in
     * clusters of 2 CTAs sharing each tile's 128 columns of h; W2 without a cluster. */
    sci_moe_config c2 = config(128, 8, 2048, 768, SC_MOE_BACKEND_SM90);
    c2.fp8 = true;
    p = plan(&c2, 1);
    CHECK_EQ(p.tile, SCI_MOE_TILE_FP8_SPLIT);
    CHECK_EQ(p.k13, SCI_MOE_K_W13_FP8_SPLIT);
    CHECK_LAUNCH(p.w13, 132, 1, 1, 256, SMEM_FP8_SPLIT);
    CHECK_EQ(p.w13.cluster.x, 2);
    CHECK_EQ(p.w13.cluster.y, 1);
    CHECK_EQ(p.w2.cluster.x, 0);
    CHECK_EQ(plan(&c2, 16).tile, SCI_MOE_TILE_FP8_NARROW); /* 128 x 6 tiles */
    /* T = 4096: routing in steps, the scatter alone (no bf16 gather), then gather + quantize
     * over 32768 rows (4096 blocks); the large tile, W13 in 66 clusters of 2. */
    p = plan(&c, 4096);
    CHECK(!p.route_small);
    CHECK_LAUNCH(p.scatter, 32768 / 256, 1, 1, 256, 0);
    CHECK_LAUNCH(p.gather, 32768 * 56 / 8, 1, 1, 256, 0);
    CHECK_EQ(p.tile, SCI_MOE_TILE_FP8_LARGE);
    CHECK_LAUNCH(p.w13, 132, 1, 1, 384, SMEM_FP8_LARGE);
    CHECK_EQ(p.w13.cluster.x, 0);
    /* a bf16 tile named by SAFECUDA_MOE_TILE is ignored for fp8 experts, an fp8 one taken */
    c.tile_override = SCI_MOE_TILE_MEDIUM;
    CHECK_EQ(plan(&c, 4096).tile, SCI_MOE_TILE_FP8_LARGE);
    c.tile_override = SCI_MOE_TILE_FP8_SMALL;
    CHECK_EQ(plan(&c, 4096).tile, SCI_MOE_TILE_FP8_SMALL);
    CHECK_EQ(sci_moe_tile_named("fp8_large"), SCI_MOE_TILE_FP8_LARGE);
    /* the workspace: e4m3 x [R, H] and h [R, I], rows padded by 128 bytes for the K shift,
     * their f32 scales [R, H/128], [R, I/128]; no bf16 x in expert order or h */
    c.tile_override = -1;
    uint64_t n[SCI_MOE_W_COUNT];
    sci_moe_workspace_counts(&c, 10, n);
    CHECK_EQ(n[SCI_MOE_W_XQ], 80 * (7168 + 128));
    CHECK_EQ(SC_MOE_SM90_A_PAD_FP8, 128);
    CHECK_EQ(n[SCI_MOE_W_XS], 80 * 56);
    CHECK_EQ(n[SCI_MOE_W_HQ], 80 * (2048 + SC_MOE_SM90_A_PAD_FP8));
    CHECK_EQ(n[SCI_MOE_W_HS], 80 * 16);
    CHECK_EQ(n[SCI_MOE_W_XPERM], 0);
    CHECK_EQ(n[SCI_MOE_W_H], 0);
    c.fp8 = false;
    sci_moe_workspace_counts(&c, 10, n);
    CHECK_EQ(n[SCI_MOE_W_XQ], 0);
    CHECK_EQ(n[SCI_MOE_W_HS], 0);
    CHECK_EQ(n[SCI_MOE_W_XPERM], 80 * (7168 + SC_MOE_SM90_A_PAD));
}

int main(void)
{
    test_fp8();
    test_sm90_small_layer();
    test_sm90_large_layer();
    test_router_rounding();
    test_mma();
    test_knobs();
    test_workspace_growth_and_limits();
    test_tables();
    test_invariants();
    test_shared_and_caller_routing();
    return test_result("test_moe_plan");
}
