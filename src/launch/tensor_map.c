/* Tensor maps: views described for the bulk tensor copy engine (TMA) of sm_90+. The map
 * carries its view, so a launch that passes it checks and orders it like a view. */
#include <stdio.h>
#include <string.h>

#include "driver/driver.h"
#include "memory/buffer.h"

static int tma_dtype(sc_dtype d)
{
    switch (d) {
    case SC_U8: case SC_I8: case SC_F8E4M3: case SC_F8E5M2:
        return CU_TENSOR_MAP_DATA_TYPE_UINT8; /* bits are copied as is */
    case SC_U16: case SC_I16: return CU_TENSOR_MAP_DATA_TYPE_UINT16;
    case SC_U32: return CU_TENSOR_MAP_DATA_TYPE_UINT32;
    case SC_I32: return CU_TENSOR_MAP_DATA_TYPE_INT32;
    case SC_U64: return CU_TENSOR_MAP_DATA_TYPE_UINT64;
    case SC_I64: return CU_TENSOR_MAP_DATA_TYPE_INT64;
    case SC_F16: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    case SC_BF16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case SC_F32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case SC_F64: return CU_TENSOR_MAP_DATA_TYPE_FLOAT64;
    default: return -1;
    }
}

sc_status sc_tensor_map_encode(sc_view view, const sc_tensor_map_desc *desc, sc_tensor_map *map)
{
    static const char fn[] = "sc_tensor_map_encode";
    SCI_CHECK_PTR(fn, map);
    memset(map, 0, sizeof *map);
    SCI_CHECK_PTR(fn, desc);
    sci_resolved_view v = {0};
    sc_status s = sci_view_resolve(view, fn, "view", &v);
    if (s != SC_OK)
        return s;
    const sci_buffer *b = v.buf;
    const uint64_t es = sc_dtype_size(b->dtype);
    const sc_device_props *p = &b->ctx->props;
    const uint64_t span[] = {0, 32, 64, 128};
    uint64_t elems = 0;
    const uint64_t stride = desc->row_stride ? desc->row_stride : desc->cols;
    char d[200];
    if (p->cc_major < 9) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "tensor maps need sm_90 or newer; device %d is "
                     "sm_%d%d", b->ctx->device, p->cc_major, p->cc_minor);
    } else if (!sci_driver_has_tensor_maps()) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "the driver has no cuTensorMapEncodeTiled "
                     "(CUDA 12.0 or newer is needed)");
    } else if ((unsigned)desc->swizzle > SC_SWIZZLE_128B) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "swizzle = %d", (int)desc->swizzle);
    } else if (desc->row_stride && (desc->row_stride < desc->cols ||
                                    desc->row_stride > 0xffffffffull ||
                                    (desc->row_stride * es) % 16)) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "row_stride %llu: at least cols = %llu, below 2^32 and a multiple of 16 "
                     "bytes (of %s)",
                     (unsigned long long)desc->row_stride, (unsigned long long)desc->cols,
                     sc_dtype_name(b->dtype));
    } else if (desc->rows == 0 || desc->cols == 0 ||
               !sci_mul_ok(desc->rows - 1, stride, &elems) || elems + desc->cols != v.count) {
        if (desc->row_stride)
            s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                         "(rows %llu - 1) x row_stride %llu + cols %llu must equal the view's "
                         "%llu elements (%s)",
                         (unsigned long long)desc->rows, (unsigned long long)desc->row_stride,
                         (unsigned long long)desc->cols, (unsigned long long)v.count,
                         sci_buffer_describe(b, d, sizeof d));
        else
            s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                         "rows %llu x cols %llu must equal the view's %llu elements (%s)",
                         (unsigned long long)desc->rows, (unsigned long long)desc->cols,
                         (unsigned long long)v.count, sci_buffer_describe(b, d, sizeof d));
    } else if (desc->rows > 0xffffffffull || desc->cols > 0xffffffffull ||
               (desc->cols * es) % 16 || desc->cols * es >= (1ull << 40)) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "a row of %llu %s is %llu bytes: the copy engine needs a multiple of 16 "
                     "bytes (and rows, cols below 2^32)",
                     (unsigned long long)desc->cols, sc_dtype_name(b->dtype),
                     (unsigned long long)(desc->cols * es));
    } else if (v.ptr % 16) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "the view starts at element %llu, byte address 0x%llx: the copy engine "
                     "needs 16-byte alignment (%s)",
                     (unsigned long long)v.offset, (unsigned long long)v.ptr,
                     sci_buffer_describe(b, d, sizeof d));
    } else if (desc->box_rows < 1 || desc->box_rows > 256 || desc->box_cols < 1 ||
               desc->box_cols > 256 || (desc->box_cols * es) % 16 ||
               (desc->swizzle != SC_SWIZZLE_NONE && desc->box_cols * es > span[desc->swizzle])) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "box %u x %u of %s: each side 1 .. 256, a box row a multiple of 16 bytes "
                     "and, swizzled, at most the swizzle span of %llu bytes",
                     desc->box_rows, desc->box_cols, sc_dtype_name(b->dtype),
                     (unsigned long long)span[desc->swizzle]);
    } else if (tma_dtype(b->dtype) < 0) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "dtype %s", sc_dtype_name(b->dtype));
    } else if ((s = sci_context_enter(b->ctx, fn)) == SC_OK) {
        const cuuint64_t dims[2] = {desc->cols, desc->rows};
        const cuuint64_t strides[1] = {stride * es};
        const cuuint32_t box[2] = {desc->box_cols, desc->box_rows};
        const cuuint32_t estrides[2] = {1, 1};
        CUtensorMap tm;
        CUresult r = sci_cuTensorMapEncodeTiled(
            &tm, tma_dtype(b->dtype), 2, (void *)(uintptr_t)v.ptr, dims, strides, box,
            estrides, CU_TENSOR_MAP_INTERLEAVE_NONE, (int)desc->swizzle,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) {
            s = sci_context_fail_cu(b->ctx, r, fn,
                                    "cuTensorMapEncodeTiled(%llu x %llu %s, box %u x %u)",
                                    (unsigned long long)desc->rows,
                                    (unsigned long long)desc->cols, sc_dtype_name(b->dtype),
                                    desc->box_rows, desc->box_cols);
        } else {
            memcpy(map->encoded, &tm, sizeof map->encoded);
            map->view = (sc_view){view.buffer, v.offset, v.count};
            map->address = v.ptr;
            map->desc = *desc;
        }
    }
    sci_view_release(&v);
    return s;
}
