/* A test for CI machines without a GPU: run it with SAFECUDA_DEVICE=test. */
#include <safecuda.h>
#include <stdio.h>
#include <string.h>

static int failures;
#define EXPECT(cond)                                                                  \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "%s:%d: %s failed (%s)\n", __FILE__, __LINE__, #cond,     \
                    sc_last_error());                                                 \
            failures++;                                                               \
        }                                                                             \
    } while (0)
#define MESSAGE_HAS(text) EXPECT(strstr(sc_last_error(), text) != NULL)

/* A kernel's PTX (`safecuda compile scale.cu --ptx` writes it; here the body does not
 * matter: it never runs). Loading PTX needs no compiler. */
static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                          ".visible .entry scale(.param .u64 x, .param .u32 n)\n{\n  ret;\n}\n";

int main(void)
{
    sc_context ctx;                                  /* a 1 MiB budget for this test */
    if (sc_context_create(&(sc_context_desc){ .vram_budget = 1 << 20 }, &ctx) != SC_OK) {
        fprintf(stderr, "%s\n", sc_last_error());
        return 1;
    }
    float in[256], out[256];
    for (int i = 0; i < 256; i++) in[i] = (float)i;

    /* Allocation and copies: device memory is host memory, so data round trips. */
    sc_buffer x, big, kept;
    EXPECT(sc_buffer_create(ctx, &(sc_buffer_desc){ .dtype = SC_F32, .count = 256,
                                                    .label = "x" }, &x) == SC_OK);
    EXPECT(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(x), in, sizeof in) == SC_OK);
    EXPECT(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(x)) == SC_OK);
    EXPECT(memcmp(in, out, sizeof in) == 0);

    /* Every check works as on a GPU: bounds, the budget, ... */
    EXPECT(sc_copy_to_host(SC_DEFAULT_STREAM, out, 100 * sizeof(float),
                           (sc_view){ x, 200, 100 }) == SC_ERR_OUT_OF_BOUNDS);
    EXPECT(sc_buffer_create(ctx, &(sc_buffer_desc){ .dtype = SC_F32, .count = 1 << 20,
                                                    .label = "big" }, &big)
           == SC_ERR_BUDGET_EXCEEDED);
    MESSAGE_HAS("budget");

    /* ... module loads and launch checks; then the launch fails: no kernel runs here. */
    sc_module mod;
    sc_kernel scale;
    EXPECT(sc_module_load_image(ctx, ptx, sizeof ptx - 1, &mod) == SC_OK);
    EXPECT(sc_kernel_get(mod, "scale", &scale) == SC_OK);
    sc_launch_desc cfg = { .grid = { 1, 1, 1 }, .block = { 256, 1, 1 } };
    EXPECT(SC_LAUNCH(SC_DEFAULT_STREAM, scale, &cfg, sc_arg_inout(sc_view_of(x)))
           == SC_ERR_LAUNCH);                        /* 1 argument given, 2 declared */
    EXPECT(SC_LAUNCH(SC_DEFAULT_STREAM, scale, &cfg, sc_arg_inout(sc_view_of(x)),
                     sc_arg_u32(256)) == SC_ERR_NOT_SUPPORTED);
    MESSAGE_HAS("kernels do not run on the safecuda test device");
    EXPECT(sc_context_check(ctx) == SC_OK);          /* the context is not lost */
    EXPECT(sc_module_destroy(mod) == SC_OK);

    /* A stale handle is an error with a message, never a crash. */
    EXPECT(sc_buffer_destroy(x) == SC_OK);
    EXPECT(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(x))
           == SC_ERR_STALE_HANDLE);
    MESSAGE_HAS("testdevice_test.c");                /* where x was created */

    /* The leak report names what is still alive, and where it was created. */
    EXPECT(sc_buffer_create(ctx, &(sc_buffer_desc){ .dtype = SC_U8, .count = 64,
                                                    .label = "kept" }, &kept) == SC_OK);
    sc_object_info live[4];
    size_t n = 0;
    EXPECT(sc_context_live_objects(ctx, live, 4, &n) == SC_OK && n == 1);
    EXPECT(n == 1 && strcmp(live[0].label, "kept") == 0 && live[0].bytes == 64);
    EXPECT(sc_context_destroy(ctx) == SC_ERR_LEAKED); /* and the report on stderr */

    printf("%s\n", failures ? "testdevice_test: FAILED" : "testdevice_test: all checks passed");
    return failures ? 1 : 0;
}
