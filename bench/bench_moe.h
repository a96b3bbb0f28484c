/* bench_moe's shared types: the layers, their weights' tensors, the device environment and
 * the floor's terms, for bench_moe.c and the fp8 layers' file bench_moe_fp8.c (bench_moe.c's
 * header comment describes the benchmark). */
#ifndef SAFECUDA_BENCH_MOE_H
#define SAFECUDA_BENCH_MOE_H

#include "bench_common.h"
#include "safecuda/moe.h"

#define GIB (1ull << 30)
#define BLOCK_ELEMS (1ull << 25) /* 64 MiB of bf16: the random block weights are cut from */
#define ALIGN_ELEMS 128ull       /* offsets into the block: 256-byte aligned */
#define MAX_TOKEN_COUNTS 16
#define MAX_CONFIGS 16           /* the built-in layers and their fp8 twins */
#define MAX_X 16                 /* input files per token count (--inputs) */
#define FP8_BLOCK 128            /* fp8 weights: one f32 scale per 128 x 128 block */
#define FP8_SUFFIX "-fp8"        /* an fp8 twin's name: its layer's and this */

typedef struct moe_config {
    const char *name;
    int E, k, H, I;
    sc_moe_scoring scoring;
    bool renormalize;
    bool bias;                 /* a random f32 selection bias (DeepSeek-V3's) */
    /* ---- the v2 layer's fields (zero: the v1 layer) ---- */
    int n_group, topk_group;   /* group-limited selection; 0, 0: none */
    float routed_scaling;      /* 0 means 1 */
    bool router_bias;          /* a random f32 bias added to the logits (gpt-oss) */
    sc_moe_activation act;
    float swiglu_alpha, swiglu_limit; /* 0: the layer's defaults */
    sc_moe_w13_layout layout;
    bool w13_bias, w2_bias;    /* random f32 biases on W13 and W2 */
    int shared_I;              /* the shared expert's intermediate size I_s; 0: none */
    bool shared_gate;          /* the shared expert scaled by sigmoid(x . gate row) */
    bool one_alloc;            /* the weights as views of one allocation per dtype */
    const char *dir;           /* --inputs: the files; NULL: random */
    /* ---- --fp8 ---- */
    bool fp8;                  /* e4m3 experts with 128 x 128 block scales: the twin of ... */
    int base;                  /* ... configs[base], the same layer in bf16 */
} moe_config;

/* ---- the weights' tensors ------------------------------------------------------------------ */

enum {
    W_ROUTER, W_W13, W_W2, W_SHARED_W13, W_SHARED_W2, W_SHARED_GATE, /* bf16 (fp8: W13 .. W2 of
                                                                        the shared expert) */
    W_SEL_BIAS, W_ROUTER_BIAS, W_W13_BIAS, W_W2_BIAS,                /* f32 */
    W_W13_SCALE, W_W2_SCALE, W_SHARED_W13_SCALE, W_SHARED_W2_SCALE,  /* f32, fp8 layers only */
    W_COUNT
};

#define CKPT_HEADER_BYTES 16 /* where an allocation's first tensor starts */

typedef struct tensor {
    const char *label;
    sc_dtype dtype;  /* SC_BF16, SC_F32 or (fp8 layers' experts) SC_F8E4M3 */
    uint64_t count;  /* elements; 0: the layer has none */
    sc_buffer buf;   /* its own buffer, or the allocation of its dtype */
    uint64_t off;    /* its first element in buf */
    sc_view v;       /* the tensor, exactly count elements */
} tensor;

typedef struct layer_weights {
    tensor t[W_COUNT];
    bool one_alloc;
    uint64_t bf16_elems, f32_elems, f8_elems; /* the allocations' sizes (one_alloc), else 0 */
    sc_buffer all_bf16, all_f32, all_f8;
} layer_weights;

/* The tensors an fp8 twin takes over from its bf16 layer, so that both route alike: host
 * copies of the router, its f32 vectors, the shared gate and the expert biases (NULL: not
 * copied, or the layer has none). */
typedef struct kept_tensors {
    void *host[W_COUNT];
} kept_tensors;

/* ---- the device ------------------------------------------------------------------------------ */

typedef struct env {
    sc_context ctx;
    sc_stream st;
    sc_event ev0, ev1;
    sc_host_buffer staging; /* BLOCK_ELEMS bf16, pinned */
    sc_buffer xblk;         /* random block for inputs, N(0, 1) */
    uint64_t rng;
    uint64_t rng_fp8;       /* the fp8 twins' own numbers (bf16's stay as without --fp8) */
    uint16_t *host;         /* copy-back of out for the check */
    size_t host_elems;
    int32_t *ids;           /* copy-back of the expert ids */
    size_t ids_elems;
} env;

/* The floor's rates of this run. */
typedef struct rates {
    double mem_tbs;     /* memory, TB/s */
    double tflops;      /* bf16 matmul */
    double f8_tflops;   /* e4m3 matmul (the fp8 twins' experts) */
} rates;

typedef struct floor_terms {
    double weight_bytes; /* the weights a forward must read */
    double bytes;        /* those + x and out */
    double flops;
    double bw_ms, flop_ms, floor_ms;
} floor_terms;

/* ---- bench_moe.c ---------------------------------------------------------------------------- */

double nolibm_sqrt(double v);
sc_buffer new_buffer(env *e, sc_dtype dtype, uint64_t count, const char *label);
/* A device block of BLOCK_ELEMS bf16 values ~ N(0, stddev). */
sc_buffer make_block(env *e, double stddev, const char *label);
/* Elements [off, off + n) of dst from random offsets of blk (BLOCK_ELEMS elements of dst's
 * dtype). */
void fill_random(env *e, sc_buffer dst, uint64_t off, uint64_t n, sc_buffer blk);
/* Uniform f32 values in [-half, half) into the tensor. */
void upload_uniform(env *e, const tensor *t, float half);

/* ---- bench_moe_fp8.c ------------------------------------------------------------------------ */

/* Whether layer c can have fp8 experts (H, I and I_s multiples of 128); why not into why. */
bool fp8_eligible(const moe_config *c, char *why, size_t size);
/* The fp8 twin's random weights: e4m3 experts cut from a random block of e4m3 bytes, block
 * scales around 1 / (64 sqrt(fan-in)), the router, its vectors, the gate and the biases from
 * kept (or random like the bf16 layer's where kept has none); returns when they are there. */
void weights_fill_fp8(env *e, const moe_config *c, layer_weights *w, const kept_tensors *kept);
/* Host copies of the bf16 layer's tensors its twin takes over; kept_free releases them. */
void kept_save(env *e, const layer_weights *w, kept_tensors *kept);
void kept_free(kept_tensors *kept);
/* The floor of a forward of the fp8 twin (bench_moe.c's header: the fp8 floor). */
floor_terms floor_for_fp8(const moe_config *c, uint64_t T, int used, const rates *r);
/* An upper bound of the fp8 layer's workspace for T tokens (src/moe/plan.c's sizing). */
uint64_t workspace_bound_fp8(const moe_config *c, uint64_t T);

#endif
