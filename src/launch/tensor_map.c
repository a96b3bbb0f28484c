/* Tensor maps: views described for the bulk tensor copy engine (TMA) of sm_90+. The map
 * carries its view, so a launch that passes it checks and orders it like a view.
 *
 * Two forms of desc (include/safecuda.h): the 2-D form (rows, cols, ...; its checks and
 * messages as they always were) and the general form (rank 1 .. 5, dims, strides, box,
 * innermost first, strides in elements). Both become one shape (tm_shape) that is checked
 * for what both share and then handed to cuTensorMapEncodeTiled (strides in bytes). */
#include <stdio.h>
#include <string.h>

#include "driver/driver.h"
#include "memory/buffer.h"

#define MAX_RANK SC_TENSOR_MAP_MAX_RANK

/* The array as the driver will get it: innermost first, strides in elements (strides[0]
 * is 1), element strides resolved (0 -> 1). */
typedef struct tm_shape {
    uint32_t rank;
    uint64_t dims[MAX_RANK], strides[MAX_RANK];
    uint32_t box[MAX_RANK], estrides[MAX_RANK];
} tm_shape;

/* The copy engine moves bits: integers and fp8 go as the unsigned type of their size. */
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

/* The driver's NaN fill is for its floating-point types only (fp8 goes as UINT8). */
static bool tma_float(sc_dtype d)
{
    return d == SC_F16 || d == SC_BF16 || d == SC_F32 || d == SC_F64;
}

static int tma_l2(sc_tensor_l2_promotion p)
{
    switch (p) {
    case SC_L2_PROMOTION_NONE: return CU_TENSOR_MAP_L2_PROMOTION_NONE;
    case SC_L2_PROMOTION_64B: return CU_TENSOR_MAP_L2_PROMOTION_L2_64B;
    case SC_L2_PROMOTION_128B: return CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
    default: return CU_TENSOR_MAP_L2_PROMOTION_L2_256B; /* DEFAULT and 256B */
    }
}

static const uint32_t swizzle_span[] = {0, 32, 64, 128};

/* The 2-D form: rows x cols (row_stride apart) that is exactly the view. */
static sc_status shape_2d(const sc_tensor_map_desc *desc, const sci_resolved_view *v,
                          const char *fn, tm_shape *sh)
{
    const sci_buffer *b = v->buf;
    const uint64_t es = sc_dtype_size(b->dtype);
    const uint64_t stride = desc->row_stride ? desc->row_stride : desc->cols;
    uint64_t elems = 0;
    char d[200];
    if (desc->row_stride && (desc->row_stride < desc->cols ||
                             desc->row_stride > 0xffffffffull ||
                             (desc->row_stride * es) % 16))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "row_stride %llu: at least cols = %llu, below 2^32 and a multiple of 16 "
                        "bytes (of %s)",
                        (unsigned long long)desc->row_stride, (unsigned long long)desc->cols,
                        sc_dtype_name(b->dtype));
    if (desc->rows == 0 || desc->cols == 0 ||
        !sci_mul_ok(desc->rows - 1, stride, &elems) || elems + desc->cols != v->count) {
        if (desc->row_stride)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "(rows %llu - 1) x row_stride %llu + cols %llu must equal the "
                            "view's %llu elements (%s)",
                            (unsigned long long)desc->rows, (unsigned long long)desc->row_stride,
                            (unsigned long long)desc->cols, (unsigned long long)v->count,
                            sci_buffer_describe(b, d, sizeof d));
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "rows %llu x cols %llu must equal the view's %llu elements (%s)",
                        (unsigned long long)desc->rows, (unsigned long long)desc->cols,
                        (unsigned long long)v->count, sci_buffer_describe(b, d, sizeof d));
    }
    if (desc->rows > 0xffffffffull || desc->cols > 0xffffffffull ||
        (desc->cols * es) % 16 || desc->cols * es >= (1ull << 40))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "a row of %llu %s is %llu bytes: the copy engine needs a multiple of 16 "
                        "bytes (and rows, cols below 2^32)",
                        (unsigned long long)desc->cols, sc_dtype_name(b->dtype),
                        (unsigned long long)(desc->cols * es));
    if (desc->box_rows < 1 || desc->box_rows > 256 || desc->box_cols < 1 ||
        desc->box_cols > 256 || (desc->box_cols * es) % 16 ||
        (desc->swizzle != SC_SWIZZLE_NONE && desc->box_cols * es > swizzle_span[desc->swizzle]))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "box %u x %u of %s: each side 1 .. 256, a box row a multiple of 16 "
                        "bytes and, swizzled, at most the swizzle span of %u bytes",
                        desc->box_rows, desc->box_cols, sc_dtype_name(b->dtype),
                        swizzle_span[desc->swizzle]);
    sh->rank = 2;
    sh->dims[0] = desc->cols;
    sh->dims[1] = desc->rows;
    sh->strides[0] = 1;
    sh->strides[1] = stride;
    sh->box[0] = desc->box_cols;
    sh->box[1] = desc->box_rows;
    return SC_OK;
}

/* One dimension i >= 1 of the general form: its stride in elements (given, or packed),
 * checked against the previous dimension's extent and the driver's byte limits. */
static sc_status stride_nd(const sc_tensor_map_desc *desc, uint32_t i, uint64_t es,
                           sc_dtype dtype, const char *fn, tm_shape *sh)
{
    uint64_t prev = 0, bytes = 0;
    const bool prev_ok = sci_mul_ok(sh->dims[i - 1], sh->strides[i - 1], &prev);
    const bool packed = desc->strides[i] == 0;
    if (!packed && (!prev_ok || desc->strides[i] < prev)) {
        if (!prev_ok)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "strides[%u] = %llu elements overlaps dimension %u: at least "
                            "dims[%u] %llu x strides[%u] %llu elements (past 2^64)",
                            i, (unsigned long long)desc->strides[i], i - 1, i - 1,
                            (unsigned long long)sh->dims[i - 1], i - 1,
                            (unsigned long long)sh->strides[i - 1]);
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "strides[%u] = %llu elements overlaps dimension %u: at least "
                        "dims[%u] x strides[%u] = %llu elements (dimensions may not overlap)",
                        i, (unsigned long long)desc->strides[i], i - 1, i - 1, i - 1,
                        (unsigned long long)prev);
    }
    if (packed && !prev_ok)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "strides[%u] = 0 (packed: dims[%u] %llu x strides[%u] %llu elements, "
                        "past 2^64): the copy engine needs a stride below 2^40 bytes",
                        i, i - 1, (unsigned long long)sh->dims[i - 1], i - 1,
                        (unsigned long long)sh->strides[i - 1]);
    const uint64_t s = packed ? prev : desc->strides[i];
    char what[96];
    if (packed)
        snprintf(what, sizeof what, "strides[%u] = 0 (packed: dims[%u] x strides[%u] = %llu "
                 "elements)", i, i - 1, i - 1, (unsigned long long)prev);
    else
        snprintf(what, sizeof what, "strides[%u] = %llu elements", i, (unsigned long long)s);
    if (!sci_mul_ok(s, es, &bytes) || bytes >= (1ull << 40))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "%s of %s: the copy engine needs a stride below 2^40 bytes", what,
                        sc_dtype_name(dtype));
    if (bytes % 16)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "%s of %s is %llu bytes: the copy engine needs a multiple of 16 bytes",
                        what, sc_dtype_name(dtype), (unsigned long long)bytes);
    sh->strides[i] = s;
    return SC_OK;
}

/* The general form: rank, dims, strides, box; the view must hold the array. */
static sc_status shape_nd(const sc_tensor_map_desc *desc, const sci_resolved_view *v,
                          const char *fn, tm_shape *sh)
{
    const sci_buffer *b = v->buf;
    const uint64_t es = sc_dtype_size(b->dtype);
    const uint32_t rank = desc->rank;
    if (rank > MAX_RANK)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "rank %u: the copy engine takes 1 .. 5 dimensions (0: the 2-D form)",
                        rank);
    for (uint32_t i = rank; i < MAX_RANK; i++)
        if (desc->dims[i] || desc->strides[i] || desc->box[i])
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "dims[%u] = %llu, strides[%u] = %llu, box[%u] = %u: past rank %u, "
                            "they must be 0",
                            i, (unsigned long long)desc->dims[i], i,
                            (unsigned long long)desc->strides[i], i, desc->box[i], rank);
    sh->rank = rank;
    for (uint32_t i = 0; i < rank; i++) {
        if (desc->dims[i] == 0 || desc->dims[i] > (1ull << 32))
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "dims[%u] = %llu: the copy engine takes 1 .. 2^32 elements", i,
                            (unsigned long long)desc->dims[i]);
        if (desc->box[i] < 1 || desc->box[i] > 256)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "box[%u] = %u: the copy engine takes 1 .. 256 elements", i,
                            desc->box[i]);
        sh->dims[i] = desc->dims[i];
        sh->box[i] = desc->box[i];
        if (i == 0) {
            if (desc->strides[0] > 1)
                return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                                "strides[0] = %llu: the innermost dimension is contiguous "
                                "(0 or 1; give an outer dimension instead)",
                                (unsigned long long)desc->strides[0]);
            sh->strides[0] = 1;
        } else {
            sc_status s = stride_nd(desc, i, es, b->dtype, fn, sh);
            if (s != SC_OK)
                return s;
        }
    }
    const uint64_t row = (uint64_t)sh->box[0] * es;
    if (row % 16)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "box[0] = %u %s is %llu bytes: the copy engine needs a multiple of 16 "
                        "bytes", sh->box[0], sc_dtype_name(b->dtype), (unsigned long long)row);
    if (desc->swizzle != SC_SWIZZLE_NONE && row > swizzle_span[desc->swizzle])
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "box[0] = %u %s is %llu bytes: at most the swizzle span of %u bytes",
                        sh->box[0], sc_dtype_name(b->dtype), (unsigned long long)row,
                        swizzle_span[desc->swizzle]);
    /* The last element: sum of (dims[i] - 1) x strides[i], overflow-checked. */
    uint64_t last = 0;
    for (uint32_t i = 0; i < rank; i++) {
        uint64_t t = 0;
        if (!sci_mul_ok(sh->dims[i] - 1, sh->strides[i], &t) || !sci_add_ok(last, t, &last))
            return sci_fail(SC_ERR_OVERFLOW, fn,
                            "the array's last element index overflows 64 bits at dimension "
                            "%u ((dims[%u] %llu - 1) x strides[%u] %llu elements)",
                            i, i, (unsigned long long)sh->dims[i], i,
                            (unsigned long long)sh->strides[i]);
    }
    if (last >= v->count) {
        char d[200];
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "the array's last element is element %llu of the view, which holds "
                        "%llu elements: the view must hold the whole array (%s)",
                        (unsigned long long)last, (unsigned long long)v->count,
                        sci_buffer_describe(b, d, sizeof d));
    }
    return SC_OK;
}

/* What both forms share: the enums, which form, the element strides, the fill. */
static sc_status check_common(const sc_tensor_map_desc *desc, sc_dtype dtype, const char *fn)
{
    if ((unsigned)desc->swizzle > SC_SWIZZLE_128B)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "swizzle = %d: SC_SWIZZLE_NONE, _32B, _64B or _128B (0 .. 3)",
                        (int)desc->swizzle);
    if ((unsigned)desc->oob_fill > SC_OOB_FILL_NAN)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "oob_fill = %d: SC_OOB_FILL_ZERO or SC_OOB_FILL_NAN (0 .. 1)",
                        (int)desc->oob_fill);
    if ((unsigned)desc->l2_promotion > SC_L2_PROMOTION_256B)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "l2_promotion = %d: SC_L2_PROMOTION_DEFAULT, _NONE, _64B, _128B or "
                        "_256B (0 .. 4)", (int)desc->l2_promotion);
    if (desc->oob_fill == SC_OOB_FILL_NAN && !tma_float(dtype))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "oob_fill SC_OOB_FILL_NAN needs a floating-point element type the copy "
                        "engine knows (f16, bf16, f32, f64); %s is copied as integer bits",
                        sc_dtype_name(dtype));
    const bool form_2d = desc->rows || desc->cols || desc->box_rows || desc->box_cols ||
                         desc->row_stride;
    bool form_nd = desc->rank != 0;
    for (int i = 0; i < MAX_RANK; i++)
        form_nd = form_nd || desc->dims[i] || desc->strides[i] || desc->box[i];
    if (form_2d && form_nd)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "both forms given: the 2-D fields (rows %llu, cols %llu, box_rows %u, "
                        "box_cols %u, row_stride %llu) and the general ones (rank %u, dims, "
                        "strides, box): use one",
                        (unsigned long long)desc->rows, (unsigned long long)desc->cols,
                        desc->box_rows, desc->box_cols, (unsigned long long)desc->row_stride,
                        desc->rank);
    if (form_nd && desc->rank == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "dims, strides or box set with rank 0: set rank (1 .. 5) for the "
                        "general form");
    if (!form_2d && !form_nd)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "the desc describes no array: set rank, dims and box (or the 2-D "
                        "form's rows, cols, box_rows, box_cols)");
    return SC_OK;
}

/* Element strides: 1 .. 8 (0: 1) within the rank, [0] only 1, 0 past the rank. */
static sc_status check_estrides(const sc_tensor_map_desc *desc, const char *fn, tm_shape *sh)
{
    for (uint32_t i = 0; i < MAX_RANK; i++) {
        const uint32_t e = desc->element_strides[i];
        if (i >= sh->rank) {
            if (e)
                return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                                "element_strides[%u] = %u: past rank %u, it must be 0", i, e,
                                sh->rank);
            continue;
        }
        if (i == 0 && e > 1)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "element_strides[0] = %u: the copy engine has no innermost "
                            "element stride (0 or 1)", e);
        if (e > 8)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "element_strides[%u] = %u: the copy engine takes 1 .. 8", i, e);
        sh->estrides[i] = e ? e : 1;
    }
    return SC_OK;
}

/* "{a, b, c}" of n values. */
static void list_u64(char *out, size_t size, const uint64_t *x, uint32_t n)
{
    size_t len = (size_t)snprintf(out, size, "{");
    for (uint32_t i = 0; i < n && len < size; i++)
        len += (size_t)snprintf(out + len, size - len, "%s%llu", i ? ", " : "",
                                (unsigned long long)x[i]);
    if (len < size)
        snprintf(out + len, size - len, "}");
}

static sc_status encode(const tm_shape *sh, const sc_tensor_map_desc *desc,
                        const sci_resolved_view *v, const char *fn, CUtensorMap *tm)
{
    const sci_buffer *b = v->buf;
    const uint64_t es = sc_dtype_size(b->dtype);
    cuuint64_t dims[MAX_RANK], strides[MAX_RANK];
    cuuint32_t box[MAX_RANK], estrides[MAX_RANK];
    for (uint32_t i = 0; i < sh->rank; i++) {
        dims[i] = sh->dims[i];
        box[i] = sh->box[i];
        estrides[i] = sh->estrides[i];
        if (i > 0)
            strides[i - 1] = sh->strides[i] * es; /* checked below 2^40 */
    }
    CUresult r = sci_cuTensorMapEncodeTiled(
        tm, tma_dtype(b->dtype), sh->rank, (void *)(uintptr_t)v->ptr, dims, strides, box,
        estrides, CU_TENSOR_MAP_INTERLEAVE_NONE, (int)desc->swizzle,
        tma_l2(desc->l2_promotion),
        desc->oob_fill == SC_OOB_FILL_NAN ? CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
                                          : CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r == CUDA_SUCCESS)
        return SC_OK;
    char d[128], bx[128];
    uint64_t box64[MAX_RANK];
    for (uint32_t i = 0; i < sh->rank; i++)
        box64[i] = sh->box[i];
    list_u64(d, sizeof d, sh->dims, sh->rank);
    list_u64(bx, sizeof bx, box64, sh->rank);
    return sci_context_fail_cu(b->ctx, r, fn, "cuTensorMapEncodeTiled(rank %u, dims %s of %s, "
                               "box %s)", sh->rank, d, sc_dtype_name(b->dtype), bx);
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
    const sc_device_props *p = &b->ctx->props;
    tm_shape sh = {0};
    char d[200];
    if (p->cc_major < 9) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "tensor maps need sm_90 or newer; device %d is "
                     "sm_%d%d", b->ctx->device, p->cc_major, p->cc_minor);
    } else if (!sci_driver_has_tensor_maps()) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "the driver has no cuTensorMapEncodeTiled "
                     "(CUDA 12.0 or newer is needed)");
    } else if (tma_dtype(b->dtype) < 0) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "dtype %s", sc_dtype_name(b->dtype));
    } else if ((s = check_common(desc, b->dtype, fn)) != SC_OK) {
    } else if ((s = desc->rank ? shape_nd(desc, &v, fn, &sh) : shape_2d(desc, &v, fn, &sh)) !=
               SC_OK) {
    } else if ((s = check_estrides(desc, fn, &sh)) != SC_OK) {
    } else if (v.ptr % 16) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "the view starts at element %llu, byte address 0x%llx: the copy engine "
                     "needs 16-byte alignment (%s)",
                     (unsigned long long)v.offset, (unsigned long long)v.ptr,
                     sci_buffer_describe(b, d, sizeof d));
    } else if ((s = sci_context_enter(b->ctx, fn)) == SC_OK) {
        CUtensorMap tm;
        s = encode(&sh, desc, &v, fn, &tm);
        if (s == SC_OK) {
            memcpy(map->encoded, &tm, sizeof map->encoded);
            map->view = (sc_view){view.buffer, v.offset, v.count};
            map->address = v.ptr;
            map->desc = *desc;
        }
    }
    sci_view_release(&v);
    return s;
}
