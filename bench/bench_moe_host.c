/* bench_moe_host: the host time of one sc_moe_forward call, from C, for the Python
 * benchmark (bench/bench_torch_moe.py) to compare its own calls with.
 *
 *   bench_moe_host [--experts E] [--top-k K] [--hidden H] [--intermediate I] [--tokens T]
 *                  [--batch N] [--batches M]
 *
 * Defaults: E=8 K=2 H=256 I=512 T=1 (a small layer: the GPU time matters little), batches
 * of 100 calls, 50 batches after 3 warm-up batches. Method: the wall time of N
 * back-to-back forwards on one stream (the calls only: the GPU works through them
 * meanwhile), then a synchronize that is not timed; the result is the median over the
 * batches of (batch time / N). N is small enough that the driver's launch queue never
 * fills (a full queue would make the calls wait for the GPU). The weights are zeros (the
 * host work does not depend on the data). The last line is
 *     host_us_per_call <median microseconds>
 * Exits 77 ("skipped") without a driver or a GPU. */
#include "bench_common.h"
#include "safecuda/moe.h"

static int arg_int(int argc, char **argv, int *i, const char *name, int *out)
{
    if (strcmp(argv[*i], name) != 0 || *i + 1 >= argc)
        return 0;
    *out = atoi(argv[++*i]);
    return 1;
}

int main(int argc, char **argv)
{
    int E = 8, K = 2, H = 256, I = 512, T = 1, batch = 100, batches = 50;
    for (int i = 1; i < argc; i++) {
        if (arg_int(argc, argv, &i, "--experts", &E) || arg_int(argc, argv, &i, "--top-k", &K) ||
            arg_int(argc, argv, &i, "--hidden", &H) ||
            arg_int(argc, argv, &i, "--intermediate", &I) ||
            arg_int(argc, argv, &i, "--tokens", &T) || arg_int(argc, argv, &i, "--batch", &batch) ||
            arg_int(argc, argv, &i, "--batches", &batches))
            continue;
        fprintf(stderr, "usage: %s [--experts E] [--top-k K] [--hidden H] [--intermediate I] "
                        "[--tokens T] [--batch N] [--batches M]\n", argv[0]);
        return 2;
    }
    if (E < 1 || K < 1 || H < 8 || I < 8 || T < 1 || batch < 1 || batches < 1 || batches > 10000) {
        fprintf(stderr, "%s: every size must be positive (H and I at least 8)\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_require_gpu("bench_moe_host");
    sc_device_props props;
    char desc[512];
    bench_describe_device(0, &props, desc, sizeof desc);
    printf("bench_moe_host: %s\n", desc);

    sc_context ctx;
    sc_stream st;
    SC_TRY(sc_context_create(&(sc_context_desc){.device = 0}, &ctx));
    SC_TRY(sc_stream_create(ctx, &(sc_stream_desc){.label = "forwards"}, &st));
    sc_buffer router, w13, w2, x, out;
    const uint64_t e = (uint64_t)E, h = (uint64_t)H, n = (uint64_t)I, t = (uint64_t)T;
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = e * h,
                                                   .label = "router", .zero = true, .stream = st},
                            &router));
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = e * 2 * n * h,
                                                   .label = "w13", .zero = true, .stream = st},
                            &w13));
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = e * h * n,
                                                   .label = "w2", .zero = true, .stream = st},
                            &w2));
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = t * h,
                                                   .label = "x", .zero = true, .stream = st},
                            &x));
    SC_TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_BF16, .count = t * h,
                                                   .label = "out", .stream = st},
                            &out));
    sc_moe layer;
    SC_TRY(sc_moe_create(ctx,
                         &(sc_moe_desc){.experts = E, .top_k = K, .hidden = H, .intermediate = I,
                                        .renormalize = true, .router = router, .w13 = w13,
                                        .w2 = w2, .max_tokens = t, .label = "host overhead"},
                         &layer));
    double *per_call = bench_xmalloc((size_t)batches * sizeof(double));
    for (int b = -3; b < batches; b++) {
        uint64_t t0 = bench_now_ns();
        for (int i = 0; i < batch; i++)
            SC_TRY(sc_moe_forward(st, layer, sc_view_of(x), sc_view_of(out), NULL));
        uint64_t t1 = bench_now_ns();
        SC_TRY(sc_stream_synchronize(st));
        if (b >= 0)
            per_call[b] = (double)(t1 - t0) * 1e-3 / batch;
    }
    double med = bench_median(per_call, (size_t)batches);
    printf("E=%d k=%d H=%d I=%d T=%d: median host time per sc_moe_forward call %.2f us "
           "(batches of %d back-to-back calls, median of %d batches)\n",
           E, K, H, I, T, med, batch, batches);
    printf("host_us_per_call %.3f\n", med);
    free(per_call);
    SC_TRY(sc_moe_destroy(layer));
    sc_buffer all[] = {router, w13, w2, x, out};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        SC_TRY(sc_buffer_destroy(all[i]));
    SC_TRY(sc_stream_destroy(st));
    SC_TRY(sc_context_destroy(ctx));
    return 0;
}
