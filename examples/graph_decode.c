/* graph_decode: an MoE decode loop captured once as a CUDA graph and replayed.
 *
 * A decode step runs an MoE layer on the newest tokens, x [T, H] -> out [T, H]. Its work
 * is the same every step; only the tokens change. So the step is captured once into a
 * graph and replayed: each step writes its tokens into a pinned host buffer, copies them
 * into the captured x (outside the graph), launches the graph, copies out back and uses
 * it (here, a checksum). At a few steps the replay is checked bit for bit against an eager
 * sc_moe_forward of the same x; then the loop is run again eagerly with the same tokens,
 * which must give the same checksum, to compare the rates.
 *
 *   graph_decode [T] [steps]      (T = 1 .. 4 tokens a step, default 4; 1000 steps)
 *
 * Exit status: 0 correct, 1 wrong or failed, 2 no GPU or driver on this machine. */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <safecuda.h>
#include <safecuda/moe.h>

/* A small layer: 16 experts, 4 chosen a token, hidden 1024, intermediate 512 (50 MB). */
enum { E = 16, K = 4, H = 1024, I = 512, MAX_T = 4 };

/* Print the failed call and give the exit status: 2 when there is no GPU to run on. */
static int fail(const char *call, sc_status s)
{
    fprintf(stderr, "graph_decode: %s\n  (%s: %s)\n", sc_last_error(), call, sc_status_name(s));
    return s == SC_ERR_NO_DRIVER || s == SC_ERR_NO_DEVICE ? 2 : 1;
}
#define TRY(call)                       \
    do {                                \
        sc_status s_ = (call);          \
        if (s_ != SC_OK)                \
            return fail(#call, s_);     \
    } while (0)

/* xorshift64*: a small, seedable host random number generator. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* round to nearest even */
}

static float float_of(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* n bf16 values uniform in [-scale, scale). */
static void random_bf16(uint16_t *p, uint64_t n, float scale, uint64_t *rng)
{
    for (uint64_t i = 0; i < n; i++)
        p[i] = bf16_of(((float)(next_random(rng) >> 40) / 8388608.0f - 1.0f) * scale);
}

static int random_weights(sc_context ctx, uint64_t n, float scale, const char *label,
                          uint64_t *rng, sc_buffer *b)
{
    uint16_t *h = malloc(n * sizeof *h);
    if (!h) {
        fprintf(stderr, "graph_decode: out of host memory\n");
        return 1;
    }
    random_bf16(h, n, scale, rng);
    TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n, .label = label}, b));
    sc_status s = sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(*b), h, n * sizeof *h);
    free(h);
    TRY(s);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* What one run of the loop needs. */
typedef struct decoder {
    sc_stream stream;
    sc_moe layer;
    sc_graph_exec step;       /* the captured decode step */
    sc_buffer x, out, eager;  /* x and out are the ones the graph captured */
    sc_host_buffer tokens, result;
    uint64_t T;
} decoder;

/* Run `steps` decode steps (replaying the graph, or eagerly), the tokens from seed; add the
 * outputs into *checksum and the seconds taken into *seconds (the checks left out). */
static int decode(decoder *d, bool graph, int steps, uint64_t seed, double *checksum,
                  double *seconds)
{
    const uint64_t n = d->T * H, bytes = n * sizeof(uint16_t);
    uint16_t *expected = malloc(bytes);
    if (!expected) {
        fprintf(stderr, "graph_decode: out of host memory\n");
        return 1;
    }
    uint64_t rng = seed;
    double t0 = now_s(), checking = 0;
    for (int step = 0; step < steps; step++) {
        void *p = NULL;
        uint64_t size = 0;
        /* This step's tokens (their embeddings, here random), into the pinned buffer; the
         * pointer waits for the buffer's last upload to finish. */
        TRY(sc_host_buffer_ptr(d->tokens, &p, &size));
        random_bf16(p, n, 1.0f, &rng);
        TRY(sc_copy_from_host_buffer(d->stream, sc_view_of(d->x), d->tokens, 0));
        if (graph)
            TRY(sc_graph_launch(d->stream, d->step));
        else
            TRY(sc_moe_forward(d->stream, d->layer, sc_view_of(d->x), sc_view_of(d->out), NULL));
        TRY(sc_copy_to_host_buffer(d->stream, d->result, 0, sc_view_of(d->out)));
        TRY(sc_host_buffer_ptr(d->result, &p, &size)); /* waits for the step */
        const uint16_t *o = p;
        for (uint64_t i = 0; i < n; i++)
            *checksum += (double)float_of(o[i]);

        /* The replay against an eager forward of the same x, bit for bit. */
        if (graph && (step < 2 || step == steps / 2 || step == steps - 1)) {
            double c0 = now_s();
            TRY(sc_moe_forward(d->stream, d->layer, sc_view_of(d->x), sc_view_of(d->eager),
                               NULL));
            TRY(sc_copy_to_host(d->stream, expected, bytes, sc_view_of(d->eager)));
            if (memcmp(o, expected, bytes) != 0) {
                fprintf(stderr, "graph_decode: step %d: the replay differs from the eager "
                                "forward\n", step);
                free(expected);
                return 1;
            }
            checking += now_s() - c0;
        }
    }
    *seconds = now_s() - t0 - checking;
    free(expected);
    return 0;
}

int main(int argc, char **argv)
{
    const long T = argc > 1 ? strtol(argv[1], NULL, 10) : 4;
    const long steps = argc > 2 ? strtol(argv[2], NULL, 10) : 1000;
    if (T < 1 || T > MAX_T || steps < 1 || steps > 10000000) {
        fprintf(stderr, "usage: graph_decode [T = 1..%d] [steps >= 1]\n", MAX_T);
        return 1;
    }

    sc_context ctx;
    TRY(sc_context_create(&(sc_context_desc){.device = 0}, &ctx));
    sc_device_props props;
    TRY(sc_device_info(0, &props));

    /* The layer, over random weights (scaled by 1/sqrt(fan-in): 1/32 for H, 1/22.6 for I). */
    uint64_t rng = 0x5AFEC0DAull;
    sc_buffer router, w13, w2;
    int rc;
    if ((rc = random_weights(ctx, (uint64_t)E * H, 0.03125f, "router", &rng, &router)) ||
        (rc = random_weights(ctx, (uint64_t)E * 2 * I * H, 0.03125f, "w13", &rng, &w13)) ||
        (rc = random_weights(ctx, (uint64_t)E * H * I, 0.0442f, "w2", &rng, &w2)))
        return rc;
    decoder d = {.T = (uint64_t)T};
    TRY(sc_moe_create(ctx, &(sc_moe_desc){.experts = E, .top_k = K, .hidden = H,
                                          .intermediate = I, .renormalize = true,
                                          .router = router, .w13 = w13, .w2 = w2,
                                          .max_tokens = MAX_T, .label = "decode layer"},
                      &d.layer));
    TRY(sc_stream_create(ctx, &(sc_stream_desc){.label = "decode"}, &d.stream));
    /* The workspace, grown now: a forward inside a capture can't grow it. */
    TRY(sc_moe_reserve(d.stream, d.layer, d.T));

    const uint64_t n = d.T * H;
    TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n, .label = "x",
                                                .zero = true, .stream = d.stream}, &d.x));
    TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n, .label = "out",
                                                .stream = d.stream}, &d.out));
    TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = n, .label = "eager",
                                                .stream = d.stream}, &d.eager));
    TRY(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = n * 2, .label = "tokens"},
                              &d.tokens));
    TRY(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = n * 2, .label = "result"},
                              &d.result));

    /* Capture one decode step: nothing runs, the forward's kernels are recorded. */
    sc_graph g;
    TRY(sc_stream_begin_capture(d.stream, NULL));
    TRY(sc_moe_forward(d.stream, d.layer, sc_view_of(d.x), sc_view_of(d.out), NULL));
    TRY(sc_stream_end_capture(d.stream, &g));
    TRY(sc_graph_instantiate(g, &d.step));
    sc_graph_props gp;
    TRY(sc_graph_info(g, &gp));
    TRY(sc_graph_destroy(g)); /* the executable graph keeps its own copy */
    printf("graph_decode: MoE E=%d k=%d H=%d I=%d, T=%ld tokens a step, on %s\n", E, K, H, I, T,
           props.name);
    printf("  the captured step: %" PRIu64 " nodes, %" PRIu64 " buffers, %" PRIu64 " kernels\n",
           gp.nodes, gp.buffers, gp.kernels);

    /* The loop, replayed and then eager, with the same tokens. */
    const uint64_t seed = 0xDEC0DEull;
    double sum_graph = 0, sum_eager = 0, s_graph = 0, s_eager = 0;
    if ((rc = decode(&d, true, (int)steps, seed, &sum_graph, &s_graph)) ||
        (rc = decode(&d, false, (int)steps, seed, &sum_eager, &s_eager)))
        return rc;
    const bool same = sum_graph == sum_eager;
    printf("  replay: %ld steps, %.0f steps/s (%.1f us a step); checked against the eager "
           "forward at 4 steps: equal\n",
           steps, (double)steps / s_graph, 1e6 * s_graph / (double)steps);
    printf("  eager:  %ld steps, %.0f steps/s (%.1f us a step)\n", steps,
           (double)steps / s_eager, 1e6 * s_eager / (double)steps);
    printf("  checksum of the outputs: replay %.6f, eager %.6f: %s\n", sum_graph, sum_eager,
           same ? "equal" : "DIFFERENT");

    /* Everything is freed; sc_context_destroy would report anything left over. */
    TRY(sc_graph_exec_destroy(d.step));
    TRY(sc_moe_destroy(d.layer));
    TRY(sc_buffer_destroy(d.x));
    TRY(sc_buffer_destroy(d.out));
    TRY(sc_buffer_destroy(d.eager));
    TRY(sc_host_buffer_destroy(d.tokens));
    TRY(sc_host_buffer_destroy(d.result));
    TRY(sc_buffer_destroy(router));
    TRY(sc_buffer_destroy(w13));
    TRY(sc_buffer_destroy(w2));
    TRY(sc_stream_destroy(d.stream));
    TRY(sc_context_destroy(ctx));
    return same ? 0 : 1;
}
