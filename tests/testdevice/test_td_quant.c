/* FP8 quantization's host side (include/safecuda/quant.h) against the test device: every
 * refusal with its status and message (a NULL or empty shape, an overflowing one, element
 * types, counts that are not the shape's, scales too few or too many, outputs overlapping
 * the input or each other in device memory through borrowed buffers, a read-only output,
 * views and streams of another context, stale and out-of-bounds views), made before
 * anything is enqueued; then every call of the four, blocks and tokens, bf16 and f32 out,
 * with batches, edges, odd offsets and a grid past 65535 rows of blocks, goes through the
 * library's launch checks of the kernels' real parameters (the test device reads them from
 * the PTX NVRTC makes) and into a captured graph. With argv[1] = 80 (the test device
 * reporting sm_80): every call is SC_ERR_NOT_SUPPORTED, naming compute capability 8.9.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: no kernel runs here, so nothing here says
 * anything about the results (tests/gpu/test_gpu_quant.c compares them with a CPU
 * reference on a GPU). */
#include "../test.h"
#include "td_control.h"
#include "safecuda/interop.h"
#include "safecuda/quant.h"

static sc_context ctx;

/* A refusal: the status, and a message from the call naming what is wrong. */
#define REFUSED(expr, want, fn, needle)                                                    \
    do {                                                                                  \
        CHECK_FAIL(expr, want, fn);                                                       \
        CHECK_MSG(needle);                                                                \
    } while (0)

static sc_buffer buf(sc_dtype t, uint64_t n, const char *label)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = t, .count = n, .label = label,
                                                     .zero = true},
                             &b) == SC_OK);
    return b;
}

static sc_view whole(sc_buffer b) { return sc_view_of(b); }

/* A borrowed buffer over count elements of dtype at byte `byte_offset` into b's memory. */
static sc_buffer alias(sc_buffer b, uint64_t byte_offset, sc_dtype t, uint64_t count,
                       bool read_only, const char *label)
{
    uint64_t p = 0;
    REQUIRE(sc_buffer_device_ptr(b, &p) == SC_OK);
    sc_buffer a;
    REQUIRE(sc_buffer_borrow(ctx, p + byte_offset,
                             &(sc_borrow_desc){.dtype = t, .count = count, .label = label,
                                               .read_only = read_only},
                             &a) == SC_OK);
    return a;
}

/* ---- refusals -------------------------------------------------------------------------- */

static void test_shape_refusals(void)
{
    sc_buffer w = buf(SC_BF16, 300 * 200, "w"), q = buf(SC_F8E4M3, 300 * 200, "q");
    sc_buffer s = buf(SC_F32, 6, "s");
    const sc_quant_desc ok = {.rows = 300, .cols = 200};
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM, NULL, whole(w), whole(q), whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks", "argument 'shape' is NULL");
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM, &(sc_quant_desc){.cols = 200}, whole(w),
                                   whole(q), whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks", "shape->rows is 0");
    REFUSED(sc_quantize_fp8_tokens(SC_DEFAULT_STREAM, &(sc_quant_desc){.rows = 300}, whole(w),
                                   whole(q), whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_tokens", "shape->cols is 0");
    REFUSED(sc_dequantize_fp8_blocks(SC_DEFAULT_STREAM, &(sc_quant_desc){0}, whole(q),
                                     whole(s), whole(w)),
            SC_ERR_INVALID_ARGUMENT, "sc_dequantize_fp8_blocks", "shape->rows is 0");
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM,
                                   &(sc_quant_desc){.rows = 1ull << 40, .cols = 1ull << 30},
                                   whole(w), whole(q), whole(s)),
            SC_ERR_OVERFLOW, "sc_quantize_fp8_blocks", "overflow 64 bits");
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM,
                                   &(sc_quant_desc){.rows = 1ull << 20, .cols = 1ull << 20,
                                                    .batch = 1ull << 30},
                                   whole(w), whole(q), whole(s)),
            SC_ERR_OVERFLOW, "sc_quantize_fp8_blocks", "batch 1073741824 x rows 1048576");

    /* Counts: the tensors', the scales' (too few, too many; the batch counts). */
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM, &(sc_quant_desc){.rows = 300, .cols = 100},
                                   whole(w), whole(q), whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks",
            "w has 60000 elements; the shape gives it batch 1 x rows 300 x cols 100 = 30000");
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM, &ok, whole(w), (sc_view){q, 1, 59999},
                                   whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks", "q has 59999 elements");
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM, &ok, whole(w), whole(q), (sc_view){s, 0, 5}),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks",
            "scale has 5 elements; the shape gives it batch 1 x ceil(rows / 128) 3 x "
            "ceil(cols / 128) 2 = 6");
    sc_buffer s_big = buf(SC_F32, 600, "tokens' scales");
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM, &ok, whole(w), whole(q), whole(s_big)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks", "scale has 600 elements");
    REFUSED(sc_quantize_fp8_tokens(SC_DEFAULT_STREAM, &ok, whole(w), whole(q), whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_tokens",
            "scale has 6 elements; the shape gives it tokens 300 x ceil(hidden / 128) 2 = 600");
    REFUSED(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM,
                                   &(sc_quant_desc){.rows = 150, .cols = 200, .batch = 2},
                                   whole(w), whole(q), whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks",
            "scale has 6 elements; the shape gives it batch 2 x ceil(rows / 128) 2 x "
            "ceil(cols / 128) 2 = 8");
    REFUSED(sc_dequantize_fp8_tokens(SC_DEFAULT_STREAM, &(sc_quant_desc){.rows = 300, .cols = 200},
                                     whole(q), whole(s_big), (sc_view){w, 0, 100}),
            SC_ERR_INVALID_ARGUMENT, "sc_dequantize_fp8_tokens",
            "out has 100 elements; the shape gives it tokens 300 x hidden 200 = 60000");
    CHECK_OK(sc_buffer_destroy(w));
    CHECK_OK(sc_buffer_destroy(q));
    CHECK_OK(sc_buffer_destroy(s));
    CHECK_OK(sc_buffer_destroy(s_big));
}

static void test_type_refusals(void)
{
    const sc_quant_desc sh = {.rows = 4, .cols = 256};
    sc_buffer bf = buf(SC_BF16, 1024, "bf"), f8 = buf(SC_F8E4M3, 1024, "f8");
    sc_buffer e5 = buf(SC_F8E5M2, 1024, "e5"), f32 = buf(SC_F32, 1024, "f32");
    sc_buffer s = buf(SC_F32, 2, "s"), st = buf(SC_F32, 8, "st"), i32 = buf(SC_I32, 1024, "i32");
    sc_buffer f16 = buf(SC_F16, 1024, "f16");
    const sc_stream D = SC_DEFAULT_STREAM;
    REFUSED(sc_quantize_fp8_blocks(D, &sh, whole(f32), whole(f8), whole(s)),
            SC_ERR_TYPE_MISMATCH, "sc_quantize_fp8_blocks", "w is f32; it must be bf16");
    REFUSED(sc_quantize_fp8_tokens(D, &sh, whole(f16), whole(f8), whole(st)),
            SC_ERR_TYPE_MISMATCH, "sc_quantize_fp8_tokens", "x is f16; it must be bf16");
    REFUSED(sc_quantize_fp8_blocks(D, &sh, whole(bf), whole(e5), whole(s)),
            SC_ERR_TYPE_MISMATCH, "sc_quantize_fp8_blocks", "q is f8e5m2; it must be f8e4m3");
    REFUSED(sc_quantize_fp8_blocks(D, &sh, whole(bf), whole(f8), (sc_view){bf, 0, 2}),
            SC_ERR_TYPE_MISMATCH, "sc_quantize_fp8_blocks", "scale is bf16; it must be f32");
    REFUSED(sc_dequantize_fp8_blocks(D, &sh, whole(bf), whole(s), whole(f32)),
            SC_ERR_TYPE_MISMATCH, "sc_dequantize_fp8_blocks", "q is bf16; it must be f8e4m3");
    REFUSED(sc_dequantize_fp8_blocks(D, &sh, whole(f8), whole(s), whole(i32)),
            SC_ERR_TYPE_MISMATCH, "sc_dequantize_fp8_blocks", "out is i32; it must be bf16 or f32");
    REFUSED(sc_dequantize_fp8_tokens(D, &sh, whole(f8), whole(st), whole(f16)),
            SC_ERR_TYPE_MISMATCH, "sc_dequantize_fp8_tokens", "out is f16; it must be bf16 or f32");
    CHECK_MSG("buffer 'f16'");
    /* The view statuses: a stale buffer, a view past the end. */
    sc_buffer gone = buf(SC_BF16, 1024, "gone");
    CHECK_OK(sc_buffer_destroy(gone));
    REFUSED(sc_quantize_fp8_blocks(D, &sh, whole(gone), whole(f8), whole(s)),
            SC_ERR_STALE_HANDLE, "sc_quantize_fp8_blocks", "(w)");
    REFUSED(sc_quantize_fp8_blocks(D, &sh, whole(bf), (sc_view){f8, 1000, 1024}, whole(s)),
            SC_ERR_OUT_OF_BOUNDS, "sc_quantize_fp8_blocks", "q: elements [1000, 2024) outside");
    sc_buffer bufs[] = {bf, f8, e5, f32, s, st, i32, f16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CHECK_OK(sc_buffer_destroy(bufs[i]));
}

/* Outputs overlapping the input or each other: the same memory borrowed under other types. */
static void test_overlaps(void)
{
    const sc_quant_desc sh = {.rows = 2, .cols = 128};
    const sc_stream D = SC_DEFAULT_STREAM;
    sc_buffer mem = buf(SC_F32, 4096, "memory"); /* 16 KiB */
    sc_buffer w = alias(mem, 0, SC_BF16, 256, false, "w");          /* bytes [0, 512) */
    sc_buffer q_on_w = alias(mem, 256, SC_F8E4M3, 256, false, "q on w"); /* [256, 512) */
    sc_buffer q = alias(mem, 1024, SC_F8E4M3, 256, false, "q");     /* [1024, 1280) */
    sc_buffer s_on_q = alias(mem, 1272, SC_F32, 2, false, "s on q"); /* [1272, 1280) */
    sc_buffer s = alias(mem, 2048, SC_F32, 1, false, "s");          /* [2048, 2052): blocks */
    sc_buffer s_tok = alias(mem, 2048, SC_F32, 2, false, "s tokens"); /* [2048, 2056) */
    sc_buffer out_on_s = alias(mem, 2048, SC_BF16, 256, false, "out on s");
    sc_buffer out = alias(mem, 4096, SC_BF16, 256, false, "out");
    sc_buffer q_ro = alias(mem, 8192, SC_F8E4M3, 256, true, "read-only q");
    sc_buffer w_next = alias(mem, 512, SC_BF16, 256, false, "w next"); /* [512, 1024) */

    REFUSED(sc_quantize_fp8_blocks(D, &sh, whole(w), whole(q_on_w), whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks",
            "q overlaps w in device memory (borrowed buffer 'q on w'");
    REFUSED(sc_quantize_fp8_tokens(D, &(sc_quant_desc){.rows = 2, .cols = 128}, whole(w),
                                   whole(q), whole(s_on_q)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_tokens", "scale overlaps q in device memory");
    REFUSED(sc_dequantize_fp8_blocks(D, &sh, whole(q), whole(s), whole(out_on_s)),
            SC_ERR_INVALID_ARGUMENT, "sc_dequantize_fp8_blocks", "out overlaps scale");
    REFUSED(sc_quantize_fp8_blocks(D, &sh, whole(w), whole(q_ro), whole(s)),
            SC_ERR_INVALID_ARGUMENT, "sc_quantize_fp8_blocks", "q: borrowed buffer 'read-only q'");
    CHECK_MSG("is read-only");
    /* Reading one memory twice is fine (q and scale of a dequantize, say); adjacent ranges
     * are not overlapping. */
    CHECK_OK(sc_quantize_fp8_blocks(D, &sh, whole(w_next), whole(q), whole(s)));
    CHECK_OK(sc_dequantize_fp8_tokens(D, &sh, whole(q), whole(s_tok), whole(w)));
    CHECK_OK(sc_context_synchronize(ctx));
    sc_buffer all[] = {w, q_on_w, q, s_on_q, s, s_tok, out_on_s, out, q_ro, w_next, mem};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
}

static void test_contexts(void)
{
    sc_context other;
    REQUIRE(sc_context_create(NULL, &other) == SC_OK);
    sc_buffer w = buf(SC_BF16, 256, "w"), q = buf(SC_F8E4M3, 256, "q"), s = buf(SC_F32, 2, "s");
    sc_buffer s2;
    REQUIRE(sc_buffer_create(other, &(sc_buffer_desc){.dtype = SC_F32, .count = 2,
                                                       .label = "other's"},
                             &s2) == SC_OK);
    sc_stream st2;
    REQUIRE(sc_stream_create(other, NULL, &st2) == SC_OK);
    const sc_quant_desc sh = {.rows = 2, .cols = 128};
    REFUSED(sc_quantize_fp8_tokens(SC_DEFAULT_STREAM, &sh, whole(w), whole(q), whole(s2)),
            SC_ERR_WRONG_CONTEXT, "sc_quantize_fp8_tokens", "scale (buffer 'other's'");
    REFUSED(sc_quantize_fp8_blocks(st2, &sh, whole(w), whole(q), (sc_view){s, 0, 1}),
            SC_ERR_WRONG_CONTEXT, "sc_quantize_fp8_blocks", "the stream");
    CHECK_OK(sc_buffer_destroy(s2));
    CHECK_OK(sc_stream_destroy(st2));
    CHECK_OK(sc_context_destroy(other));
    CHECK_OK(sc_buffer_destroy(w));
    CHECK_OK(sc_buffer_destroy(q));
    CHECK_OK(sc_buffer_destroy(s));
}

/* ---- the calls that go through ---------------------------------------------------------- */

typedef struct call {
    bool tokens;
    uint64_t batch, rows, cols, in_off, q_off, s_off, out_off;
} call;

static void test_calls(void)
{
    static const call calls[] = {
        {false, 0, 300, 200, 0, 0, 0, 0},   /* edges, batch 0 = 1 */
        {false, 3, 300, 200, 8, 16, 4, 8},  /* a batch, 16-byte offsets */
        {false, 2, 130, 100, 3, 5, 1, 7},   /* odd offsets, cols % 8 != 0 */
        {false, 1, 1, 1, 0, 0, 0, 0},
        {false, 1, 65536ull * 128 + 1, 1, 0, 0, 0, 0}, /* 65537 rows of blocks: grid.y strides */
        {true, 1, 37, 7168, 0, 0, 0, 0},
        {true, 2, 5, 300, 1, 3, 1, 5},
        {true, 1, 70000, 8, 0, 0, 0, 0},    /* 70000 tokens: grid.y strides */
    };
    sc_stream st;
    REQUIRE(sc_stream_create(ctx, NULL, &st) == SC_OK);
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        const call *c = &calls[i];
        const uint64_t b = c->batch ? c->batch : 1, n = b * c->rows * c->cols;
        const uint64_t cb = (c->cols + 127) / 128;
        const uint64_t ns = b * (c->tokens ? c->rows : (c->rows + 127) / 128) * cb;
        const sc_quant_desc sh = {.rows = c->rows, .cols = c->cols, .batch = c->batch};
        sc_buffer w = buf(SC_BF16, c->in_off + n, "w"), q = buf(SC_F8E4M3, c->q_off + n, "q");
        sc_buffer s = buf(SC_F32, c->s_off + ns, "s"), o16 = buf(SC_BF16, c->out_off + n, "o16");
        sc_buffer o32 = buf(SC_F32, c->out_off + n, "o32");
        const sc_view vw = {w, c->in_off, n}, vq = {q, c->q_off, SC_WHOLE};
        const sc_view vs = {s, c->s_off, ns};
        const sc_view v16 = {o16, c->out_off, n}, v32 = {o32, c->out_off, SC_WHOLE};
        if (c->tokens) {
            CHECK_OK(sc_quantize_fp8_tokens(st, &sh, vw, vq, vs));
            CHECK_OK(sc_dequantize_fp8_tokens(st, &sh, vq, vs, v16));
            CHECK_OK(sc_dequantize_fp8_tokens(SC_DEFAULT_STREAM, &sh, vq, vs, v32));
        } else {
            CHECK_OK(sc_quantize_fp8_blocks(st, &sh, vw, vq, vs));
            CHECK_OK(sc_dequantize_fp8_blocks(st, &sh, vq, vs, v16));
            CHECK_OK(sc_dequantize_fp8_blocks(SC_DEFAULT_STREAM, &sh, vq, vs, v32));
        }
        sc_buffer all[] = {w, q, s, o16, o32};
        for (size_t k = 0; k < 5; k++)
            CHECK_OK(sc_buffer_destroy(all[k]));
    }
    CHECK_OK(sc_stream_synchronize(st));

    /* Captured: one kernel node per call, nothing waited for. */
    sc_buffer w = buf(SC_BF16, 256 * 256, "w"), q = buf(SC_F8E4M3, 256 * 256, "q");
    sc_buffer s = buf(SC_F32, 4, "s"), o = buf(SC_BF16, 256 * 256, "out");
    const sc_quant_desc sh = {.rows = 256, .cols = 256};
    CHECK_OK(sc_stream_begin_capture(st, NULL));
    CHECK_OK(sc_quantize_fp8_blocks(st, &sh, whole(w), whole(q), whole(s)));
    CHECK_OK(sc_dequantize_fp8_blocks(st, &sh, whole(q), whole(s), whole(o)));
    sc_graph g;
    CHECK_OK(sc_stream_end_capture(st, &g));
    sc_graph_props gp;
    CHECK_OK(sc_graph_info(g, &gp));
    CHECK(gp.nodes == 2 && gp.kernels == 2 && gp.buffers == 4);
    CHECK_OK(sc_graph_destroy(g));
    sc_buffer all[] = {w, q, s, o};
    for (size_t k = 0; k < 4; k++)
        CHECK_OK(sc_buffer_destroy(all[k]));
    CHECK_OK(sc_stream_destroy(st));
}

/* sm_80: every call refused after its arguments are checked, before any compile. */
static void test_old_device(void)
{
    sc_buffer w = buf(SC_BF16, 256, "w"), q = buf(SC_F8E4M3, 256, "q"), s = buf(SC_F32, 2, "s");
    sc_buffer o = buf(SC_F32, 256, "o");
    const sc_quant_desc sh = {.rows = 2, .cols = 128};
    const sc_stream D = SC_DEFAULT_STREAM;
    REFUSED(sc_quantize_fp8_blocks(D, &(sc_quant_desc){.rows = 1, .cols = 256}, whole(w),
                                   whole(q), (sc_view){s, 0, 2}),
            SC_ERR_NOT_SUPPORTED, "sc_quantize_fp8_blocks", "compute capability 8.9 or newer");
    CHECK_MSG("is 8.0");
    REFUSED(sc_quantize_fp8_tokens(D, &sh, whole(w), whole(q), whole(s)), SC_ERR_NOT_SUPPORTED,
            "sc_quantize_fp8_tokens", "compute capability 8.9");
    REFUSED(sc_dequantize_fp8_blocks(D, &(sc_quant_desc){.rows = 1, .cols = 256}, whole(q),
                                     whole(s), whole(o)),
            SC_ERR_NOT_SUPPORTED, "sc_dequantize_fp8_blocks", "compute capability 8.9");
    REFUSED(sc_dequantize_fp8_tokens(D, &sh, whole(q), whole(s), whole(o)), SC_ERR_NOT_SUPPORTED,
            "sc_dequantize_fp8_tokens", "compute capability 8.9");
    /* An argument error is still that, on any device. */
    REFUSED(sc_quantize_fp8_tokens(D, &sh, whole(o), whole(q), whole(s)), SC_ERR_TYPE_MISMATCH,
            "sc_quantize_fp8_tokens", "x is f32");
    sc_buffer all[] = {w, q, s, o};
    for (size_t k = 0; k < 4; k++)
        CHECK_OK(sc_buffer_destroy(all[k]));
}

int main(int argc, char **argv)
{
    const int cc = argc > 1 ? atoi(argv[1]) : 90;
    fake_attach();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_device_props props;
    REQUIRE(sc_device_info(0, &props) == SC_OK);
    REQUIRE(props.cc_major * 10 + props.cc_minor == cc); /* SAFECUDA_TESTDEVICE_CC got there */
    if (cc < 89) {
        test_old_device();
    } else {
        test_shape_refusals();
        test_type_refusals();
        test_contexts();
        int major = 0, minor = 0;
        if (sc_compiler_version(&major, &minor) != SC_OK) {
            printf("test_td_quant: the calls that compile skipped: %s\n", sc_last_error());
        } else {
            test_overlaps();
            test_calls();
        }
    }
    CHECK_OK(sc_context_destroy(ctx));
    CHECK(fake.misuse_count() == 0);
    return test_result("test_td_quant");
}
