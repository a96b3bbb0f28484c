/* fp8 on the host, for the tests' references: e4m3 (OCP e4m3fn: no infinities, max 448,
 * one NaN pattern per sign) and e5m2 bit patterns as float, and a float rounded to the
 * nearest one (ties to even), saturating to the largest finite value as the GPU's
 * cvt.rn.satfinite does (NaN stays NaN). Also the block quantization the library defines:
 * a block's scale is amax / 448 (1 when amax is 0) and each value is rounded from
 * v * (448 / amax) (the same single-precision operations as the kernels). */
#ifndef SAFECUDA_TESTS_FP8_H
#define SAFECUDA_TESTS_FP8_H

#include <math.h>
#include <stdint.h>

/* A float with `mbits` mantissa bits and exponent bias `bias` stored in 8 bits. */
static inline float fp8_decode(uint8_t v, int mbits, int bias, int e4m3)
{
    const int sign = v >> 7, ebits = 7 - mbits;
    const int e = (v >> mbits) & ((1 << ebits) - 1), m = v & ((1 << mbits) - 1);
    float f;
    if (e4m3 && e == 15 && m == 7)
        f = NAN;
    else if (!e4m3 && e == 31)
        f = m ? NAN : INFINITY;
    else if (e == 0)
        f = ldexpf((float)m, 1 - bias - mbits);
    else
        f = ldexpf((float)(m + (1 << mbits)), e - bias - mbits);
    return sign ? -f : f;
}

static inline float e4m3_to_f(uint8_t v) { return fp8_decode(v, 3, 7, 1); }
static inline float e5m2_to_f(uint8_t v) { return fp8_decode(v, 2, 15, 0); }

/* Round f to the nearest of the 8-bit format's finite values (ties to even), saturating. */
static inline uint8_t fp8_encode(float f, int mbits, int bias, float maxv, int e4m3)
{
    (void)e4m3; /* NaN is 0x7f in both formats */
    if (isnan(f))
        return 0x7f; /* e4m3: S.1111.111, e5m2: S.11111.11 */
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= maxv)
        a = maxv;
    /* The spacing of representable values around a: 2^(exp - mbits), subnormals below. */
    int ex;
    frexpf(a, &ex); /* a = frac * 2^ex, frac in [0.5, 1) */
    int e = ex - 1;
    if (e < 1 - bias)
        e = 1 - bias;
    const float ulp = ldexpf(1.0f, e - mbits);
    const float q = a / ulp; /* exact: a power-of-two division */
    float r = nearbyintf(q); /* the current rounding mode: to nearest, ties to even */
    float v = r * ulp;
    if (v > maxv)
        v = maxv;
    /* Encode v exactly. */
    if (v == 0)
        return sign;
    frexpf(v, &ex);
    e = ex - 1;
    uint8_t bits;
    if (e < 1 - bias) {
        bits = (uint8_t)(v / ldexpf(1.0f, 1 - bias - mbits)); /* subnormal */
    } else {
        const int m = (int)(v / ldexpf(1.0f, e - mbits)) - (1 << mbits);
        bits = (uint8_t)(((e + bias) << mbits) | m);
    }
    return sign | bits;
}

static inline uint8_t f_to_e4m3(float f) { return fp8_encode(f, 3, 7, 448.0f, 1); }
static inline uint8_t f_to_e5m2(float f) { return fp8_encode(f, 2, 15, 57344.0f, 0); }

/* The block scale of values whose largest magnitude is amax, and the factor they are
 * multiplied by before rounding, as the library's quantization kernels compute them. */
static inline float fp8_block_scale(float amax) { return amax > 0 ? amax / 448.0f : 1.0f; }
static inline float fp8_block_inv(float amax) { return amax > 0 ? 448.0f / amax : 1.0f; }

#endif
