/* safecuda quantization: bf16 tensors to FP8 (e4m3) with one f32 scale per block, and back.
 *
 * The layouts of FP8 checkpoints and FP8 GEMMs (DeepSeek-V3, transformers' fine-grained
 * FP8, DeepGEMM):
 * - weights in 128 x 128 blocks: w [rows, cols] -> q [rows, cols] and
 *   scale [ceil(rows / 128), ceil(cols / 128)], row-major (a checkpoint's
 *   `weight_scale_inv`: w ~ q * scale); with a batch (experts) in front of both;
 * - activations in 1 x 128 groups, per token per 128 channels: x [T, H] -> q [T, H] and
 *   scale [T, ceil(H / 128)].
 * Blocks at the right and bottom edges hold what is left (300 x 200 has 3 x 2 blocks, the
 * last ones 44 rows and 72 columns); their scales come from the values they hold.
 *
 * The rule, per block, fully determined (the same bits on every device, whatever the
 * compile flags: each step is one correctly rounded single-precision operation):
 *   amax  = the largest |v| of the block's values (bf16, exact in f32);
 *   scale = amax / 448 (448: e4m3's largest finite value), 1 when amax is 0;
 *   q     = e4m3(v * (448 / amax)), rounded to nearest even, saturating at +-448
 *           (cvt.rn.satfinite); 448 / amax is computed once per block, then multiplied;
 *   dequantized: out = q * scale, rounded once to bf16 (to nearest even) or kept as f32.
 * A block whose amax is below 2^-64 multiplies its values and amax by 2^64 first (exact for
 * bf16 values), so that 448 / amax can't overflow: the result is the rule's as if single
 * precision had no overflow.
 * Not-a-number and infinities:
 *   a NaN is left out of amax and becomes a NaN q (e4m3 S.1111.111), so it stays where it
 *   was: the block's other values are quantized as if it were not there, and dequantizing
 *   gives NaN at its place only;
 *   an infinity makes its block's amax and scale infinite and 448 / amax zero: the block's
 *   finite values become q = 0 and the infinities NaN, so the whole block dequantizes to
 *   NaN (0 x inf). A non-finite scale marks such a block; no call reports it (they don't
 *   wait for the device).
 *
 * Every call is stream-ordered on `stream` (SC_DEFAULT_STREAM: the views' context's default
 * stream), makes no host synchronization, may be captured into a graph, and checks its
 * views before it enqueues anything: element types, exact element counts for the shape,
 * one context, writable outputs, and no overlap in device memory between the input and
 * the outputs (nor between the two outputs), borrowed buffers included. Any offset works;
 * rows that start 16-byte aligned with a column count that is a multiple of 8 take 16-byte
 * loads and stores (the fast path), others one element at a time.
 * The kernels are compiled on first use per context (NVRTC, cached on disk) and need a
 * device of compute capability 8.9 or newer (Ada, Hopper, Blackwell: the e4m3 conversion
 * instructions).
 *
 * Statuses, besides the view statuses of safecuda.h:
 *   SC_ERR_INVALID_ARGUMENT  a NULL shape, rows or cols of 0, a view whose element count is
 *                            not the shape's (the message gives both), an output that is
 *                            read-only, an output overlapping the input or the other output;
 *   SC_ERR_TYPE_MISMATCH     a view of another element type than its argument's;
 *   SC_ERR_OVERFLOW          batch x rows x cols does not fit 64 bits;
 *   SC_ERR_WRONG_CONTEXT     views (or the stream) of different contexts;
 *   SC_ERR_NOT_SUPPORTED     a device older than compute capability 8.9 (and any launch on
 *                            the test device, whose kernels never run);
 *   SC_ERR_NO_COMPILER, SC_ERR_COMPILE  the kernels can't be compiled. */
#ifndef SAFECUDA_QUANT_H
#define SAFECUDA_QUANT_H

#include "../safecuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The block edge: 128 x 128 for weights, 1 x 128 for activations. */
#define SC_QUANT_BLOCK 128

/* The shape of the tensors of a call: batch matrices of rows x cols, one after another
 * (weights: batch = experts; tokens: rows = T, cols = H, and a batch is just more tokens).
 * rows and cols are required; batch 0 means 1. */
typedef struct sc_quant_desc {
    uint64_t rows;
    uint64_t cols;
    uint64_t batch;
} sc_quant_desc;

/* Weights: w [batch, rows, cols] bf16 -> q [batch, rows, cols] f8e4m3 and scale
 * [batch, ceil(rows / 128), ceil(cols / 128)] f32, per 128 x 128 block. */
SC_API sc_status sc_quantize_fp8_blocks(sc_stream stream, const sc_quant_desc *shape, sc_view w,
                                        sc_view q, sc_view scale);

/* The way back: out [batch, rows, cols] = q * the scale of its block, out bf16 or f32. */
SC_API sc_status sc_dequantize_fp8_blocks(sc_stream stream, const sc_quant_desc *shape,
                                          sc_view q, sc_view scale, sc_view out);

/* Activations: x [rows = T, cols = H] bf16 (batch x T tokens with a batch) -> q [T, H]
 * f8e4m3 and scale [T, ceil(H / 128)] f32, per token per 128 channels. */
SC_API sc_status sc_quantize_fp8_tokens(sc_stream stream, const sc_quant_desc *shape, sc_view x,
                                        sc_view q, sc_view scale);

/* The way back: out [T, H] = q * the scale of its group, out bf16 or f32. */
SC_API sc_status sc_dequantize_fp8_tokens(sc_stream stream, const sc_quant_desc *shape,
                                          sc_view q, sc_view scale, sc_view out);

#ifdef __cplusplus
}
#endif
#endif
