/* What the NCCL test double's files share (ncclfault.c: the entry points and their state;
 * reduce.c: the element arithmetic). Internal to the double. */
#ifndef SAFECUDA_NCCLFAULT_H
#define SAFECUDA_NCCLFAULT_H

#include <stddef.h>
#include <stdint.h>

#include "driver/nccl_api.h"

/* Bytes per element of an NCCL type (0 for an unknown one). */
size_t nf_type_size(ncclDataType_t type);

/* out[i] = op over the n inputs of element i, for count elements of type: accumulated in
 * double precision in rank order and rounded once to the type (round to nearest even;
 * fp8 saturates); avg divides the sum by n (integers truncate, as NCCL does). out may be one
 * of the inputs. */
void nf_reduce(void *out, const void *const *in, int n, size_t count, ncclDataType_t type,
               ncclRedOp_t op);

#endif
