/* FP8 quantization (include/safecuda/quant.h): the checks of a call, then one launch of a
 * kernel of kernels/quant/fp8_quant.cu through the checked launch path (argument sizes,
 * stream ordering, capture), like any user kernel. */
#include <stdio.h>
#include <string.h>

#include "launch/builtin.h"
#include "memory/buffer.h"
#include "quant/quant.h"
#include "safecuda/quant.h"
#include "stream/stream.h"

const char *const sci_quant_kernels[SCI_QUANT_K_COUNT] = {
    [SCI_QUANT_K_BLOCKS] = "sc_fp8_quantize_blocks",
    [SCI_QUANT_K_TOKENS] = "sc_fp8_quantize_tokens",
    [SCI_QUANT_K_DEQ_BLOCKS_BF16] = "sc_fp8_dequantize_blocks_bf16",
    [SCI_QUANT_K_DEQ_BLOCKS_F32] = "sc_fp8_dequantize_blocks_f32",
    [SCI_QUANT_K_DEQ_TOKENS_BF16] = "sc_fp8_dequantize_tokens_bf16",
    [SCI_QUANT_K_DEQ_TOKENS_F32] = "sc_fp8_dequantize_tokens_f32",
};
#define QUANT_THREADS 256 /* SC_QUANT_THREADS of the kernels */
#define MAX_GRID_YZ 65535u

typedef enum granularity { BLOCKS, TOKENS } granularity;

/* One view argument: its name in messages, the element types it may have (alt: a second
 * one, or SC_DTYPE_INVALID), the count the shape gives it and what that count is, whether
 * the call writes it; resolved against its buffer by check_args. */
typedef struct arg {
    const char *name;
    sc_view view;
    sc_dtype dtype, alt;
    uint64_t count;
    char shape[160];
    bool written;
    sci_resolved_view rv;
} arg;

/* The checked shape of a call. */
typedef struct dims {
    uint64_t batch, rows, cols;
    uint64_t rb, cb;      /* blocks down and across (rb = rows for TOKENS) */
    uint64_t n, n_scale;  /* elements of the tensors, of the scales */
} dims;

static uint64_t blocks_of(uint64_t n) { return n / SC_QUANT_BLOCK + (n % SC_QUANT_BLOCK != 0); }

static sc_status check_shape(const sc_quant_desc *shape, granularity g, const char *fn,
                             dims *d)
{
    if (shape->rows == 0 || shape->cols == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "shape->%s is 0: a quantized tensor has at least one element (rows "
                        "%llu, cols %llu)",
                        shape->rows == 0 ? "rows" : "cols", (unsigned long long)shape->rows,
                        (unsigned long long)shape->cols);
    d->batch = shape->batch ? shape->batch : 1;
    d->rows = shape->rows;
    d->cols = shape->cols;
    uint64_t per;
    if (!sci_mul_ok(d->rows, d->cols, &per) || !sci_mul_ok(per, d->batch, &d->n))
        return sci_fail(SC_ERR_OVERFLOW, fn,
                        "batch %llu x rows %llu x cols %llu elements overflow 64 bits",
                        (unsigned long long)d->batch, (unsigned long long)d->rows,
                        (unsigned long long)d->cols);
    d->rb = g == BLOCKS ? blocks_of(d->rows) : d->rows;
    d->cb = blocks_of(d->cols);
    d->n_scale = d->batch * d->rb * d->cb; /* at most n */
    return SC_OK;
}

/* What a tensor's (or the scales') count is, for messages. */
static void describe_shape(const dims *d, granularity g, bool scales, char *out, size_t size)
{
    const unsigned long long b = d->batch, r = d->rows, c = d->cols;
    if (g == BLOCKS && !scales)
        snprintf(out, size, "batch %llu x rows %llu x cols %llu = %llu", b, r, c,
                 (unsigned long long)d->n);
    else if (g == BLOCKS)
        snprintf(out, size,
                 "batch %llu x ceil(rows / 128) %llu x ceil(cols / 128) %llu = %llu (one "
                 "scale per 128 x 128 block)",
                 b, (unsigned long long)d->rb, (unsigned long long)d->cb,
                 (unsigned long long)d->n_scale);
    else if (!scales)
        snprintf(out, size, "tokens %llu x hidden %llu = %llu", b * r, c,
                 (unsigned long long)d->n);
    else
        snprintf(out, size,
                 "tokens %llu x ceil(hidden / 128) %llu = %llu (one scale per token per 128 "
                 "channels)",
                 b * r, (unsigned long long)d->cb, (unsigned long long)d->n_scale);
}

static bool overlap(const sci_resolved_view *a, const sci_resolved_view *b)
{
    return a->bytes && b->bytes && a->ptr < b->ptr + b->bytes && b->ptr < a->ptr + a->bytes;
}

static void release_args(arg *a, int n)
{
    for (int i = 0; i < n; i++)
        if (a[i].rv.buf)
            sci_view_release(&a[i].rv);
}

/* Resolve and check the views: element types, counts, one context, writable outputs, no
 * output overlapping another view in device memory. On SC_OK every view is resolved
 * (release_args); on failure none is. */
static sc_status check_args(arg *a, int n, const char *fn)
{
    char desc[200];
    sc_status s = SC_OK;
    for (int i = 0; i < n && s == SC_OK; i++) {
        arg *x = &a[i];
        if ((s = sci_view_resolve(x->view, fn, x->name, &x->rv)) != SC_OK)
            break;
        const sci_buffer *b = x->rv.buf;
        if (b->ctx != a[0].rv.buf->ctx) {
            char first[200];
            s = sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                         "%s (%s) belongs to the context on device %d created at %s:%d; %s (%s) "
                         "to the context on device %d created at %s:%d",
                         x->name, sci_buffer_describe(b, desc, sizeof desc), b->ctx->device,
                         sci_basename(b->ctx->obj.file), b->ctx->obj.line, a[0].name,
                         sci_buffer_describe(a[0].rv.buf, first, sizeof first),
                         a[0].rv.buf->ctx->device, sci_basename(a[0].rv.buf->ctx->obj.file),
                         a[0].rv.buf->ctx->obj.line);
        } else if (b->dtype != x->dtype && (x->alt == SC_DTYPE_INVALID || b->dtype != x->alt)) {
            char want[40];
            if (x->alt != SC_DTYPE_INVALID)
                snprintf(want, sizeof want, "%s or %s", sc_dtype_name(x->dtype),
                         sc_dtype_name(x->alt));
            else
                snprintf(want, sizeof want, "%s", sc_dtype_name(x->dtype));
            s = sci_fail(SC_ERR_TYPE_MISMATCH, fn, "%s is %s; it must be %s (%s)", x->name,
                         sc_dtype_name(b->dtype), want, sci_buffer_describe(b, desc, sizeof desc));
        } else if (x->rv.count != x->count) {
            s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                         "%s has %llu elements; the shape gives it %s (%s)", x->name,
                         (unsigned long long)x->rv.count, x->shape,
                         sci_buffer_describe(b, desc, sizeof desc));
        } else if (x->written) {
            s = sci_buffer_check_writable(x->view.buffer, fn, x->name);
        }
    }
    for (int i = 0; i < n && s == SC_OK; i++)
        for (int j = i + 1; j < n && s == SC_OK; j++) {
            if ((!a[i].written && !a[j].written) || !overlap(&a[i].rv, &a[j].rv))
                continue;
            char other[200];
            s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                         "%s overlaps %s in device memory (%s, elements [%llu, %llu); %s, "
                         "elements [%llu, %llu)): the call reads one while it writes the "
                         "other",
                         a[j].name, a[i].name, sci_buffer_describe(a[j].rv.buf, desc, sizeof desc),
                         (unsigned long long)a[j].rv.offset,
                         (unsigned long long)(a[j].rv.offset + a[j].rv.count),
                         sci_buffer_describe(a[i].rv.buf, other, sizeof other),
                         (unsigned long long)a[i].rv.offset,
                         (unsigned long long)(a[i].rv.offset + a[i].rv.count));
        }
    if (s != SC_OK)
        release_args(a, n);
    return s;
}

/* The device can convert to and from e4m3 (sm_89+), and the stream is of its context. */
static sc_status check_device(sci_context *c, sc_stream stream, const char *fn)
{
    const int cc = c->props.cc_major * 10 + c->props.cc_minor;
    if (cc < 89)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "FP8 (e4m3) conversions need compute capability 8.9 or newer (Ada, "
                        "Hopper, Blackwell); device %d (%s) is %d.%d",
                        c->device, c->props.name, c->props.cc_major, c->props.cc_minor);
    sci_stream *st = NULL;
    sc_status s = sci_stream_resolve(stream, c, fn, &st);
    if (s == SC_OK)
        sci_stream_release(st);
    return s;
}

/* The whole of a call: the shape and views checked, the kernel fetched (compiled on first
 * use), one launch. a[0] is the input that gives the context; quantize: (w or x, q, scale),
 * dequantize: (q, scale, out). */
static sc_status run(const char *fn, sc_stream stream, const sc_quant_desc *shape,
                     granularity g, bool quantize, arg *a)
{
    SCI_CHECK_PTR(fn, shape);
    dims d = {0};
    sc_status s = check_shape(shape, g, fn, &d);
    if (s != SC_OK)
        return s;
    for (int i = 0; i < 3; i++) {
        const bool scales = strcmp(a[i].name, "scale") == 0;
        a[i].count = scales ? d.n_scale : d.n;
        describe_shape(&d, g, scales, a[i].shape, sizeof a[i].shape);
    }
    if ((s = check_args(a, 3, fn)) != SC_OK)
        return s;
    sci_context *c = NULL;
    s = sci_context_acquire((sc_context){a[0].rv.buf->ctx->obj.id}, fn, &c);
    const sc_dtype out_dtype = a[2].rv.buf->dtype;
    release_args(a, 3);
    if (s != SC_OK)
        return s;
    sci_quant_kernel which;
    if (quantize)
        which = g == BLOCKS ? SCI_QUANT_K_BLOCKS : SCI_QUANT_K_TOKENS;
    else if (g == BLOCKS)
        which = out_dtype == SC_F32 ? SCI_QUANT_K_DEQ_BLOCKS_F32 : SCI_QUANT_K_DEQ_BLOCKS_BF16;
    else
        which = out_dtype == SC_F32 ? SCI_QUANT_K_DEQ_TOKENS_F32 : SCI_QUANT_K_DEQ_TOKENS_BF16;
    sc_kernel k = {0};
    if ((s = check_device(c, stream, fn)) == SC_OK)
        s = sci_builtin_kernel(c, SCI_QUANT_FILE, sci_quant_kernels[which], fn, &k);
    sci_context_release(c);
    if (s != SC_OK)
        return s;

    sc_launch_desc cfg = {.block = {QUANT_THREADS, 1, 1}};
    if (g == BLOCKS) {
        cfg.grid.x = d.cb < INT32_MAX ? (uint32_t)d.cb : INT32_MAX;
        cfg.grid.y = d.rb < MAX_GRID_YZ ? (uint32_t)d.rb : MAX_GRID_YZ;
        cfg.grid.z = d.batch < MAX_GRID_YZ ? (uint32_t)d.batch : MAX_GRID_YZ;
        s = SC_LAUNCH(stream, k, &cfg, sc_arg_in(a[0].view),
                      quantize ? sc_arg_out(a[1].view) : sc_arg_in(a[1].view),
                      sc_arg_out(a[2].view), sc_arg_u64(d.batch), sc_arg_u64(d.rows),
                      sc_arg_u64(d.cols));
    } else {
        const uint64_t tokens = d.batch * d.rows, runs = (d.cb + 15) / 16;
        cfg.grid.x = runs < INT32_MAX ? (uint32_t)runs : INT32_MAX;
        cfg.grid.y = tokens < MAX_GRID_YZ ? (uint32_t)tokens : MAX_GRID_YZ;
        cfg.grid.z = 1;
        s = SC_LAUNCH(stream, k, &cfg, sc_arg_in(a[0].view),
                      quantize ? sc_arg_out(a[1].view) : sc_arg_in(a[1].view),
                      sc_arg_out(a[2].view), sc_arg_u64(tokens), sc_arg_u64(d.cols));
    }
    if (s != SC_OK && strncmp(sc_last_error(), fn, strlen(fn)) != 0)
        sci_error_append(" (in %s)", fn);
    return s;
}

static sc_status quantize(const char *fn, sc_stream stream, const sc_quant_desc *shape,
                          granularity g, const char *in_name, sc_view in, sc_view q,
                          sc_view scale)
{
    arg a[3] = {{.name = in_name, .view = in, .dtype = SC_BF16},
                {.name = "q", .view = q, .dtype = SC_F8E4M3, .written = true},
                {.name = "scale", .view = scale, .dtype = SC_F32, .written = true}};
    return run(fn, stream, shape, g, true, a);
}

static sc_status dequantize(const char *fn, sc_stream stream, const sc_quant_desc *shape,
                            granularity g, sc_view q, sc_view scale, sc_view out)
{
    arg a[3] = {{.name = "q", .view = q, .dtype = SC_F8E4M3},
                {.name = "scale", .view = scale, .dtype = SC_F32},
                {.name = "out", .view = out, .dtype = SC_BF16, .alt = SC_F32, .written = true}};
    return run(fn, stream, shape, g, false, a);
}

sc_status sc_quantize_fp8_blocks(sc_stream stream, const sc_quant_desc *shape, sc_view w,
                                 sc_view q, sc_view scale)
{
    return quantize("sc_quantize_fp8_blocks", stream, shape, BLOCKS, "w", w, q, scale);
}

sc_status sc_dequantize_fp8_blocks(sc_stream stream, const sc_quant_desc *shape, sc_view q,
                                   sc_view scale, sc_view out)
{
    return dequantize("sc_dequantize_fp8_blocks", stream, shape, BLOCKS, q, scale, out);
}

sc_status sc_quantize_fp8_tokens(sc_stream stream, const sc_quant_desc *shape, sc_view x,
                                 sc_view q, sc_view scale)
{
    return quantize("sc_quantize_fp8_tokens", stream, shape, TOKENS, "x", x, q, scale);
}

sc_status sc_dequantize_fp8_tokens(sc_stream stream, const sc_quant_desc *shape, sc_view q,
                                   sc_view scale, sc_view out)
{
    return dequantize("sc_dequantize_fp8_tokens", stream, shape, TOKENS, q, scale, out);
}
