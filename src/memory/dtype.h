/* The element type table (internal): what the rest of the library reads besides the
 * public sc_dtype_size and sc_dtype_name. */
#ifndef SAFECUDA_MEMORY_DTYPE_H
#define SAFECUDA_MEMORY_DTYPE_H

#include <stdbool.h>
#include <stdint.h>

#include "safecuda.h"

/* The DLPack type code (DLDataTypeCode) and bit width of dtype, one lane; false for an
 * invalid dtype. */
bool sci_dtype_dlpack(sc_dtype dtype, uint8_t *code, uint8_t *bits);
/* The sc_dtype of DLPack code and bits (one lane), or SC_DTYPE_INVALID. */
sc_dtype sci_dtype_from_dlpack(uint8_t code, uint8_t bits);

/* NCCL's ncclDataType_t for dtype's elements, -1 where NCCL has none (u16, i16). */
int sci_dtype_nccl(sc_dtype dtype);
/* A floating-point type (f16, bf16, f32, f64, the fp8 types). */
bool sci_dtype_is_float(sc_dtype dtype);

#endif
