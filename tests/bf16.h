/* bf16 on the host, for the tests' references: a bf16 value as float, and a float rounded
 * to the nearest bf16 (ties to even; NaN stays NaN), as the GPU's cvt.rn.bf16 does. */
#ifndef SAFECUDA_TESTS_BF16_H
#define SAFECUDA_TESTS_BF16_H

#include <stdint.h>
#include <string.h>

static inline float bf2f(uint16_t v)
{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2bf(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
