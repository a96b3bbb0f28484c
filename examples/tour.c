#include <safecuda.h>
#include <stdio.h>

static const char *src =
    "extern \"C\" __global__ void add(const float *a, const float *b, float *c, unsigned long long n)"
    "{ unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;"
    "  if (i < n) c[i] = a[i] + b[i]; }";

int main(void)
{
    sc_context ctx;
    if (sc_context_create(&(sc_context_desc){ .device = 0 }, &ctx) != SC_OK) {
        fprintf(stderr, "%s\n", sc_last_error());   /* e.g. no driver: what to install */
        return 2;
    }
    enum { N = 1000 };
    float a[N], b[N], c[N];
    for (int i = 0; i < N; i++) a[i] = i, b[i] = 2 * i;

    sc_buffer da, db, dc;                            /* owned, typed device memory */
    sc_buffer_create(ctx, &(sc_buffer_desc){ .dtype = SC_F32, .count = N, .label = "a" }, &da);
    sc_buffer_create(ctx, &(sc_buffer_desc){ .dtype = SC_F32, .count = N, .label = "b" }, &db);
    sc_buffer_create(ctx, &(sc_buffer_desc){ .dtype = SC_F32, .count = N, .label = "c" }, &dc);
    sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(da), a, sizeof a);   /* sizes checked */
    sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(db), b, sizeof b);

    sc_program prog; sc_module mod; sc_kernel add; /* NVRTC for this GPU, cached on disk */
    sc_program_create(ctx, &(sc_program_desc){ .source = src, .name = "add.cu" }, &prog);
    sc_module_load(ctx, prog, &mod);
    sc_kernel_get(mod, "add", &add);

    sc_launch_desc cfg;
    sc_launch_config_for(N, add, &cfg);
    SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg,          /* count and sizes checked */
              sc_arg_in(sc_view_of(da)), sc_arg_in(sc_view_of(db)),
              sc_arg_out(sc_view_of(dc)), sc_arg_u64(N));
    sc_copy_to_host(SC_DEFAULT_STREAM, c, sizeof c, sc_view_of(dc));

    sc_buffer_destroy(da);
    sc_copy_to_host(SC_DEFAULT_STREAM, c, sizeof c, sc_view_of(da));    /* not a crash: */
    fprintf(stderr, "%s\n", sc_last_error());
    /* sc_copy_to_host: stale buffer handle: the buffer created at tour.c:21 was destroyed (src) */

    return sc_context_destroy(ctx);                  /* SC_ERR_LEAKED: db, dc, prog, mod and
                                                        add are listed with their lines */
}
