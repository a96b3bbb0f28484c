/* The NCCL test double's reductions: every NCCL type, every built-in operation, on host
 * memory (the test device's "device" memory is host memory). */
#include <math.h>
#include <string.h>

#include "bf16.h"
#include "fp8.h"
#include "ncclfault.h"

size_t nf_type_size(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static float half_to_f(uint16_t h)
{
    const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float f;
    if (e == 31)
        f = m ? NAN : INFINITY;
    else if (e == 0)
        f = ldexpf((float)m, -24);
    else
        f = ldexpf((float)(m + 1024), e - 25);
    return sign ? -f : f;
}

static uint16_t f_to_half(float f)
{
    if (isnan(f))
        return 0x7e00;
    const uint16_t sign = signbit(f) ? 0x8000 : 0;
    float a = fabsf(f);
    if (a >= 65520.0f) /* rounds to infinity */
        return sign | 0x7c00;
    int ex;
    frexpf(a, &ex);
    int e = ex - 1;
    if (e < -14)
        e = -14;
    const float ulp = ldexpf(1.0f, e - 10);
    const float v = nearbyintf(a / ulp) * ulp;
    if (v == 0)
        return sign;
    frexpf(v, &ex);
    e = ex - 1;
    if (e < -14)
        return sign | (uint16_t)(v / ldexpf(1.0f, -24));
    const int m = (int)(v / ldexpf(1.0f, e - 10)) - 1024;
    return sign | (uint16_t)(((e + 15) << 10) | m);
}

/* Element i of p as a double (integers exactly up to 2^53: enough for tests). */
static double load(const void *p, size_t i, ncclDataType_t type)
{
    const unsigned char *b = p;
    switch (type) {
    case ncclInt8: return ((const int8_t *)b)[i];
    case ncclUint8: return b[i];
    case ncclInt32: { int32_t v; memcpy(&v, b + 4 * i, 4); return v; }
    case ncclUint32: { uint32_t v; memcpy(&v, b + 4 * i, 4); return v; }
    case ncclInt64: { int64_t v; memcpy(&v, b + 8 * i, 8); return (double)v; }
    case ncclUint64: { uint64_t v; memcpy(&v, b + 8 * i, 8); return (double)v; }
    case ncclFloat16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return half_to_f(v); }
    case ncclBfloat16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return bf2f(v); }
    case ncclFloat32: { float v; memcpy(&v, b + 4 * i, 4); return v; }
    case ncclFloat64: { double v; memcpy(&v, b + 8 * i, 8); return v; }
    case ncclFloat8e4m3: return e4m3_to_f(b[i]);
    case ncclFloat8e5m2: return e5m2_to_f(b[i]);
    default: return 0;
    }
}

static void store(void *p, size_t i, ncclDataType_t type, double v)
{
    unsigned char *b = p;
    switch (type) {
    case ncclInt8: ((int8_t *)b)[i] = (int8_t)v; break;
    case ncclUint8: b[i] = (uint8_t)v; break;
    case ncclInt32: { int32_t x = (int32_t)v; memcpy(b + 4 * i, &x, 4); break; }
    case ncclUint32: { uint32_t x = (uint32_t)v; memcpy(b + 4 * i, &x, 4); break; }
    case ncclInt64: { int64_t x = (int64_t)v; memcpy(b + 8 * i, &x, 8); break; }
    case ncclUint64: { uint64_t x = (uint64_t)v; memcpy(b + 8 * i, &x, 8); break; }
    case ncclFloat16: { uint16_t x = f_to_half((float)v); memcpy(b + 2 * i, &x, 2); break; }
    case ncclBfloat16: { uint16_t x = f2bf((float)v); memcpy(b + 2 * i, &x, 2); break; }
    case ncclFloat32: { float x = (float)v; memcpy(b + 4 * i, &x, 4); break; }
    case ncclFloat64: memcpy(b + 8 * i, &v, 8); break;
    case ncclFloat8e4m3: b[i] = f_to_e4m3((float)v); break;
    case ncclFloat8e5m2: b[i] = f_to_e5m2((float)v); break;
    default: break;
    }
}

static int is_integer(ncclDataType_t type)
{
    return type <= ncclUint64;
}

void nf_reduce(void *out, const void *const *in, int n, size_t count, ncclDataType_t type,
               ncclRedOp_t op)
{
    for (size_t i = 0; i < count; i++) {
        double acc = load(in[0], i, type);
        for (int r = 1; r < n; r++) {
            const double v = load(in[r], i, type);
            switch (op) {
            case ncclProd: acc *= v; break;
            case ncclMin: acc = v < acc ? v : acc; break;
            case ncclMax: acc = v > acc ? v : acc; break;
            default: acc += v; break; /* sum, avg */
            }
        }
        if (op == ncclAvg)
            acc = is_integer(type) ? trunc(acc / n) : acc / n;
        store(out, i, type, acc);
    }
}
