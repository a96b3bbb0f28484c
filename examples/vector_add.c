/* vector_add: the classic first GPU program, written with safecuda.
 *
 * Allocates three float buffers, copies random inputs in, compiles a CUDA C++ kernel at
 * run time, launches it with checked arguments, copies the result out and checks it.
 *
 *   vector_add [n]        (default n = 16777216)
 *
 * Exit status: 0 correct, 1 wrong or failed, 2 no GPU or driver on this machine. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <safecuda.h>

static const char *source =
    "extern \"C\" __global__ void vector_add(const float *a, const float *b, float *c,\n"
    "                                        unsigned long long n)\n"
    "{\n"
    "    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "    for (; i < n; i += (unsigned long long)gridDim.x * blockDim.x)\n"
    "        c[i] = a[i] + b[i];\n"
    "}\n";

#define TRY(call)                                                                   \
    do {                                                                            \
        sc_status s_ = (call);                                                      \
        if (s_ != SC_OK) {                                                          \
            fprintf(stderr, "vector_add: %s\n  (%s)\n", sc_last_error(), #call);    \
            return s_ == SC_ERR_NO_DRIVER || s_ == SC_ERR_NO_DEVICE ? 2 : 1;        \
        }                                                                           \
    } while (0)

int main(int argc, char **argv)
{
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (1ull << 24);
    if (n == 0) {
        fprintf(stderr, "usage: vector_add [n > 0]\n");
        return 1;
    }
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "vector_add: out of host memory for n = %" PRIu64 "\n", n);
        return 1;
    }
    srand(12345);
    for (uint64_t i = 0; i < n; i++) {
        a[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        b[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    }

    sc_context ctx;
    TRY(sc_context_create(&(sc_context_desc){.device = 0}, &ctx));
    sc_device_props props;
    TRY(sc_device_info(0, &props));

    sc_buffer da, db, dc;
    TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = "a"}, &da));
    TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = "b"}, &db));
    TRY(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = "c"}, &dc));
    TRY(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(da), a, n * sizeof *a));
    TRY(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(db), b, n * sizeof *b));

    sc_program prog;
    sc_module mod;
    sc_kernel kernel;
    TRY(sc_program_create(ctx, &(sc_program_desc){.source = source, .name = "vector_add.cu"},
                          &prog));
    sc_program_props pp;
    TRY(sc_program_info(prog, &pp));
    TRY(sc_module_load(ctx, prog, &mod));
    TRY(sc_kernel_get(mod, "vector_add", &kernel));

    sc_launch_desc launch;
    TRY(sc_launch_config_for(n, kernel, &launch));
    TRY(SC_LAUNCH(SC_DEFAULT_STREAM, kernel, &launch, sc_arg_in(sc_view_of(da)),
                  sc_arg_in(sc_view_of(db)), sc_arg_out(sc_view_of(dc)), sc_arg_u64(n)));
    TRY(sc_copy_to_host(SC_DEFAULT_STREAM, c, n * sizeof *c, sc_view_of(dc)));

    uint64_t wrong = 0;
    for (uint64_t i = 0; i < n; i++)
        if (c[i] != a[i] + b[i])
            wrong++;
    printf("vector_add: n = %" PRIu64 " on %s (sm_%d%d), kernel %s (%s, %.1f ms), grid %u x block "
           "%u: %s\n",
           n, props.name, props.cc_major, props.cc_minor, pp.is_ptx ? "PTX" : "cubin",
           pp.from_cache ? "from the disk cache" : "compiled", pp.compile_ms, launch.grid.x,
           launch.block.x, wrong ? "WRONG" : "correct");
    if (wrong)
        printf("vector_add: %" PRIu64 " of %" PRIu64 " elements wrong\n", wrong, n);

    /* Everything is freed here; sc_context_destroy would report anything left over. */
    sc_buffer_destroy(da);
    sc_buffer_destroy(db);
    sc_buffer_destroy(dc);
    sc_module_destroy(mod);
    sc_program_destroy(prog);
    TRY(sc_context_destroy(ctx));
    free(a);
    free(b);
    free(c);
    return wrong ? 1 : 0;
}
