/* The test device's cuTensorMapEncodeTiled: validated as the CUDA driver documents it, and
 * every argument written into the 128 bytes so that tests can read back what the library
 * passed (nothing else reads them: the test device runs no kernels).
 *
 * Checks (each refusal is CUDA_ERROR_INVALID_VALUE and counted as misuse: safecuda checks
 * all of them first): the map 64-byte aligned; rank 1 .. 5; a known data type (0 .. 9);
 * interleave NONE (the only one safecuda uses); swizzle 0 .. 3; L2 promotion 0 .. 3; OOB
 * fill 0 .. 1, and the NaN fill (1) only for the float types (6 .. 9); the address 16-byte
 * aligned; dims 1 .. 2^32; strides (bytes, rank - 1 of them) multiples of 16 below 2^40;
 * box sides 1 .. 256, box[0] x element size a multiple of 16 bytes and within the swizzle
 * span; element strides 1 .. 8; and the described bytes (dims[0] x element size + the sum of
 * (dims[i] - 1) x strides[i - 1]) inside one live device allocation.
 *
 * The encoding (CUtensorMap.opaque, 16 x u64), TD_TMAP_MAGIC in the top byte of word 1:
 *   [0]      the global address
 *   [1]      bits 0-7 rank, 8-15 data type, 16-23 interleave, 24-31 swizzle,
 *            32-39 L2 promotion, 40-47 OOB fill, 56-63 TD_TMAP_MAGIC
 *   [2..6]   dims[0 .. 4] (0 past the rank)
 *   [7..10]  the byte strides globalStrides[0 .. 3] (0 past rank - 1)
 *   [11]     box[0 .. 3], 16 bits each (box[0] in bits 0-15)
 *   [12]     bits 0-15 box[4]; element strides [0 .. 4], 8 bits each, from bit 16
 *   [13..15] 0
 * tests/testdevice/td_control.h decodes it (fake_tensor_map_decode). */
#include <stdint.h>
#include <string.h>

#include "testdevice_internal.h"

#define TD_TMAP_MAGIC 0x7dull

static CUresult check(int dtype, cuuint32_t rank, const void *address, const cuuint64_t *dims,
                      const cuuint64_t *strides, const cuuint32_t *box,
                      const cuuint32_t *element_strides, int interleave, int swizzle,
                      int l2_promotion, int oob_fill, const char *fn)
{
    static const unsigned esize[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2};
    static const unsigned span[] = {0, 32, 64, 128};
    if (!dims || !box || !element_strides || (rank > 1 && !strides))
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL array argument");
    if (rank < 1 || rank > 5)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "rank %u (1 .. 5)", rank);
    if (dtype < 0 || dtype > 9)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "data type %d", dtype);
    if (interleave != 0 || swizzle < 0 || swizzle > 3 || l2_promotion < 0 ||
        l2_promotion > 3 || oob_fill < 0 || oob_fill > 1)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "interleave %d, swizzle %d, l2 promotion %d, oob fill %d", interleave,
                   swizzle, l2_promotion, oob_fill);
    if (oob_fill == 1 && dtype < 6)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "NaN fill for integer data type %d", dtype);
    if ((uintptr_t)address % 16)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "address %p not 16-byte aligned", address);
    const uint64_t es = esize[dtype];
    for (cuuint32_t i = 0; i < rank; i++) {
        if (dims[i] == 0 || dims[i] > (1ull << 32))
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "dims[%u] = %llu", i,
                       (unsigned long long)dims[i]);
        if (box[i] == 0 || box[i] > 256)
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "box[%u] = %u", i, box[i]);
        if (element_strides[i] == 0 || element_strides[i] > 8)
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "element stride [%u] = %u", i,
                       element_strides[i]);
        if (i > 0 && (strides[i - 1] % 16 || strides[i - 1] >= (1ull << 40)))
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "stride [%u] = %llu bytes", i - 1,
                       (unsigned long long)strides[i - 1]);
    }
    if ((box[0] * es) % 16 || (swizzle && box[0] * es > span[swizzle]))
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "box[0] %u x %llu bytes with swizzle %d",
                   box[0], (unsigned long long)es, swizzle);
    uint64_t extent = dims[0] * es, t = 0;
    for (cuuint32_t i = 1; i < rank; i++)
        if (__builtin_mul_overflow(dims[i] - 1, strides[i - 1], &t) ||
            __builtin_add_overflow(extent, t, &extent))
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "the tensor's extent overflows");
    return device_range((CUdeviceptr)(uintptr_t)address, extent, fn, "tensor");
}

CUresult td_cuTensorMapEncodeTiled(CUtensorMap *map, int dtype, cuuint32_t rank, void *address,
                                   const cuuint64_t *dims, const cuuint64_t *strides,
                                   const cuuint32_t *box, const cuuint32_t *element_strides,
                                   int interleave, int swizzle, int l2_promotion, int oob_fill)
{
    static const char fn[] = "cuTensorMapEncodeTiled";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn),
           refuse_if(!map || (uintptr_t)map % 64, CUDA_ERROR_INVALID_VALUE, fn,
                     "map %p not 64-byte aligned", (void *)map));
    if (r == CUDA_SUCCESS)
        r = check(dtype, rank, address, dims, strides, box, element_strides, interleave,
                  swizzle, l2_promotion, oob_fill, fn);
    if (r == CUDA_SUCCESS) {
        memset(map, 0, sizeof *map);
        uint64_t *o = map->opaque;
        o[0] = (uintptr_t)address;
        o[1] = (uint64_t)rank | (uint64_t)dtype << 8 | (uint64_t)interleave << 16 |
               (uint64_t)swizzle << 24 | (uint64_t)l2_promotion << 32 |
               (uint64_t)oob_fill << 40 | TD_TMAP_MAGIC << 56;
        for (cuuint32_t i = 0; i < rank; i++) {
            o[2 + i] = dims[i];
            if (i > 0)
                o[7 + i - 1] = strides[i - 1];
            if (i < 4)
                o[11] |= (uint64_t)box[i] << (16 * i);
            else
                o[12] |= box[i];
            o[12] |= (uint64_t)element_strides[i] << (16 + 8 * i);
        }
    }
    td_unlock();
    return r;
}
