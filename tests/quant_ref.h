/* The FP8 block quantization of include/safecuda/quant.h on the host, for the tests'
 * references: the rule written out in single precision, one step at a time, with
 * tests/fp8.h's e4m3 encoder and decoder (round to nearest even, saturating) and
 * tests/bf16.h's bf16 conversions.
 *
 *   amax  = the largest |v| of the block, NaNs left out;
 *   scale = amax / 448 (1 when amax is 0);
 *   q     = e4m3(v * (448 / amax)); a block whose amax is below 2^-64 uses v * 2^64 and
 *           amax * 2^64 instead (exact), so that 448 / amax can't overflow;
 *   out   = q * scale (f32), or that rounded to bf16. */
#ifndef SAFECUDA_TESTS_QUANT_REF_H
#define SAFECUDA_TESTS_QUANT_REF_H

#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "fp8.h"

#define QREF_BLOCK 128

/* A block's factors from its amax: the scale, the pre-multiplier (1 or 2^64) and
 * 448 / (amax x pre). */
typedef struct qref_factors {
    float scale, pre, inv;
} qref_factors;

static inline qref_factors qref_factors_of(float amax)
{
    qref_factors f;
    f.pre = amax > 0 && amax < 0x1p-64f ? 0x1p64f : 1.0f;
    f.scale = fp8_block_scale(amax);
    f.inv = fp8_block_inv(amax * f.pre);
    return f;
}

/* One value of a block with factors f. */
static inline uint8_t qref_value(uint16_t v, qref_factors f)
{
    const float scaled = bf2f(v) * f.pre;
    return f_to_e4m3(scaled * f.inv);
}

static inline uint64_t qref_blocks_of(uint64_t n) { return (n + QREF_BLOCK - 1) / QREF_BLOCK; }

/* Quantize batch matrices rows x cols (row-major, one after another) in blocks of
 * block_rows x 128 (128: weights; 1: tokens): q [batch, rows, cols], scale [batch,
 * ceil(rows / block_rows), ceil(cols / 128)]. */
static inline void qref_quantize(const uint16_t *w, uint64_t batch, uint64_t rows, uint64_t cols,
                                 uint64_t block_rows, uint8_t *q, float *scale)
{
    const uint64_t rb = (rows + block_rows - 1) / block_rows, cb = qref_blocks_of(cols);
    for (uint64_t b = 0; b < batch; b++)
        for (uint64_t br = 0; br < rb; br++)
            for (uint64_t bc = 0; bc < cb; bc++) {
                const uint64_t r0 = br * block_rows, c0 = bc * QREF_BLOCK;
                const uint64_t r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
                const uint64_t c1 = c0 + QREF_BLOCK < cols ? c0 + QREF_BLOCK : cols;
                float amax = 0;
                for (uint64_t r = r0; r < r1; r++)
                    for (uint64_t c = c0; c < c1; c++) {
                        const float a = fabsf(bf2f(w[(b * rows + r) * cols + c]));
                        if (!isnan(a) && a > amax)
                            amax = a;
                    }
                const qref_factors f = qref_factors_of(amax);
                scale[(b * rb + br) * cb + bc] = f.scale;
                for (uint64_t r = r0; r < r1; r++)
                    for (uint64_t c = c0; c < c1; c++) {
                        const uint64_t i = (b * rows + r) * cols + c;
                        q[i] = qref_value(w[i], f);
                    }
            }
}

/* The way back, in f32 (out32) and bf16 (out16); either may be NULL. */
static inline void qref_dequantize(const uint8_t *q, const float *scale, uint64_t batch,
                                   uint64_t rows, uint64_t cols, uint64_t block_rows,
                                   float *out32, uint16_t *out16)
{
    const uint64_t rb = (rows + block_rows - 1) / block_rows, cb = qref_blocks_of(cols);
    for (uint64_t b = 0; b < batch; b++)
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < cols; c++) {
                const uint64_t i = (b * rows + r) * cols + c;
                const float s = scale[(b * rb + r / block_rows) * cb + c / QREF_BLOCK];
                const float v = e4m3_to_f(q[i]) * s;
                if (out32)
                    out32[i] = v;
                if (out16)
                    out16[i] = f2bf(v);
            }
}

#endif
