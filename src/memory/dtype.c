/* Element types. */
#include "safecuda.h"

static const struct {
    size_t size;
    const char *name;
} dtypes[SC_DTYPE_COUNT] = {
    [SC_DTYPE_INVALID] = {0, "invalid"},
    [SC_U8] = {1, "u8"},     [SC_I8] = {1, "i8"},     [SC_U16] = {2, "u16"},
    [SC_I16] = {2, "i16"},   [SC_U32] = {4, "u32"},   [SC_I32] = {4, "i32"},
    [SC_U64] = {8, "u64"},   [SC_I64] = {8, "i64"},   [SC_F16] = {2, "f16"},
    [SC_BF16] = {2, "bf16"}, [SC_F32] = {4, "f32"},   [SC_F64] = {8, "f64"},
};

size_t sc_dtype_size(sc_dtype dtype)
{
    return (unsigned)dtype < SC_DTYPE_COUNT ? dtypes[dtype].size : 0;
}

const char *sc_dtype_name(sc_dtype dtype)
{
    return (unsigned)dtype < SC_DTYPE_COUNT ? dtypes[dtype].name : "invalid";
}
