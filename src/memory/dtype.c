/* Element types: the one table that names them, sizes them and maps them to DLPack and to
 * NCCL's types. */
#include "driver/nccl_api.h"
#include "memory/dtype.h"
#include "safecuda/dlpack.h"

static const struct {
    size_t size;
    const char *name;
    uint8_t dl_code; /* DLDataTypeCode */
    uint8_t dl_bits;
    int8_t nccl;     /* ncclDataType_t; -1: NCCL has no such type */
} dtypes[SC_DTYPE_COUNT] = {
    [SC_DTYPE_INVALID] = {0, "invalid", 0, 0, -1},
    [SC_U8] = {1, "u8", kDLUInt, 8, ncclUint8},
    [SC_I8] = {1, "i8", kDLInt, 8, ncclInt8},
    [SC_U16] = {2, "u16", kDLUInt, 16, -1},
    [SC_I16] = {2, "i16", kDLInt, 16, -1},
    [SC_U32] = {4, "u32", kDLUInt, 32, ncclUint32},
    [SC_I32] = {4, "i32", kDLInt, 32, ncclInt32},
    [SC_U64] = {8, "u64", kDLUInt, 64, ncclUint64},
    [SC_I64] = {8, "i64", kDLInt, 64, ncclInt64},
    [SC_F16] = {2, "f16", kDLFloat, 16, ncclFloat16},
    [SC_BF16] = {2, "bf16", kDLBfloat, 16, ncclBfloat16},
    [SC_F32] = {4, "f32", kDLFloat, 32, ncclFloat32},
    [SC_F64] = {8, "f64", kDLFloat, 64, ncclFloat64},
    [SC_F8E4M3] = {1, "f8e4m3", kDLFloat8_e4m3fn, 8, ncclFloat8e4m3},
    [SC_F8E5M2] = {1, "f8e5m2", kDLFloat8_e5m2, 8, ncclFloat8e5m2},
};

size_t sc_dtype_size(sc_dtype dtype)
{
    return (unsigned)dtype < SC_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

const char *sc_dtype_name(sc_dtype dtype)
{
    return (unsigned)dtype < SC_DTYPE_COUNT ? dtypes[dtype].name : "invalid";
}

bool sci_dtype_dlpack(sc_dtype dtype, uint8_t *code, uint8_t *bits)
{
    if ((unsigned)dtype >= SC_DTYPE_COUNT || dtype == SC_DTYPE_INVALID)
        return false;
    *code = dtypes[dtype].dl_code;
    *bits = dtypes[dtype].dl_bits;
    return true;
}

sc_dtype sci_dtype_from_dlpack(uint8_t code, uint8_t bits)
{
    for (int d = SC_DTYPE_INVALID + 1; d < SC_DTYPE_COUNT; d++)
        if (dtypes[d].dl_code == code && dtypes[d].dl_bits == bits)
            return (sc_dtype)d;
    return SC_DTYPE_INVALID;
}

int sci_dtype_nccl(sc_dtype dtype)
{
    return (unsigned)dtype < SC_DTYPE_COUNT ? dtypes[dtype].nccl : -1;
}

bool sci_dtype_is_float(sc_dtype dtype)
{
    if ((unsigned)dtype >= SC_DTYPE_COUNT || dtype == SC_DTYPE_INVALID)
        return false;
    uint8_t c = dtypes[dtype].dl_code;
    return c != kDLInt && c != kDLUInt;
}
