/* sc_tensor_map_encode's checks (include/safecuda.h, "Tensor maps"): every bad desc refused
 * with its status and a message naming sc_tensor_map_encode, the field, its dimension
 * index and the limit, the map left zeroed; and the descs at the limits (box 256, element
 * stride 8, a stride of 2^40 - 16 bytes, a view exactly as long as the array) encoded.
 * Shared by tests/testdevice/test_td_tensor_map.c and tests/gpu/test_gpu_tensor_map_nd.c: the
 * checks come before the driver, so the test device and a GPU must answer alike (on the
 * GPU, the valid descs are also accepted by the real driver). Needs an sm_90+ device. */
#ifndef SAFECUDA_TEST_TENSOR_MAP_CHECKS_H
#define SAFECUDA_TEST_TENSOR_MAP_CHECKS_H

#include "test.h"

/* view + desc refused with want, the message holding "sc_tensor_map_encode: " and needle;
 * the map zeroed. line: the caller's, for the failure report. */
static void tmap_refused_at(int line, sc_view view, const sc_tensor_map_desc *desc,
                            sc_status want, const char *needle)
{
    sc_tensor_map m;
    memset(&m, 0xab, sizeof m);
    sc_clear_error();
    sc_status got = sc_tensor_map_encode(view, desc, &m);
    const char *msg = sc_last_error();
    if (got != want || !strstr(msg, "sc_tensor_map_encode: ") || !strstr(msg, needle)) {
        fprintf(stderr, "%s:%d: sc_tensor_map_encode returned %s (want %s), message \"%s\" "
                        "(want \"%s\")\n",
                __FILE__, line, sc_status_name(got), sc_status_name(want), msg, needle);
        test_failures++;
    }
    static const unsigned char zero[sizeof m] = {0};
    if (memcmp(&m, zero, sizeof m) != 0) {
        fprintf(stderr, "%s:%d: the refused map is not zeroed\n", __FILE__, line);
        test_failures++;
    }
}
#define TMAP_REFUSED(view, want, needle, ...)                                        \
    tmap_refused_at(__LINE__, (view), &(sc_tensor_map_desc){__VA_ARGS__}, (want), (needle))

static void tmap_encodes_at(int line, sc_view view, const sc_tensor_map_desc *desc)
{
    sc_tensor_map m;
    sc_status got = sc_tensor_map_encode(view, desc, &m);
    if (got != SC_OK) {
        fprintf(stderr, "%s:%d: sc_tensor_map_encode returned %s: %s\n", __FILE__, line,
                sc_status_name(got), sc_last_error());
        test_failures++;
    }
}
#define TMAP_ENCODES(view, ...)                                                      \
    tmap_encodes_at(__LINE__, (view), &(sc_tensor_map_desc){__VA_ARGS__})

static sc_buffer tmap_checks_buffer_(sc_context ctx, sc_dtype dtype, uint64_t count,
                                     const char *label)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                    .label = label, .zero = true},
                             &b) == SC_OK);
    return b;
}

static sc_view tmap_checks_view_(sc_buffer b, uint64_t offset, uint64_t count)
{
    sc_view v;
    REQUIRE(sc_buffer_view(b, offset, count, &v) == SC_OK);
    return v;
}

static void tensor_map_desc_checks(sc_context ctx)
{
    const sc_status BAD = SC_ERR_INVALID_ARGUMENT;
    sc_buffer u8b = tmap_checks_buffer_(ctx, SC_U8, 4096, "tmap-u8");
    sc_buffer f8b = tmap_checks_buffer_(ctx, SC_F8E4M3, 4096, "tmap-f8");
    sc_buffer bf = tmap_checks_buffer_(ctx, SC_BF16, 4096, "tmap-bf16");
    sc_buffer f32 = tmap_checks_buffer_(ctx, SC_F32, 4096, "tmap-f32");
    const sc_view u8 = sc_view_of(u8b), f8 = sc_view_of(f8b), b16 = sc_view_of(bf),
                  f = sc_view_of(f32);

    /* NULL arguments. */
    sc_tensor_map m;
    sc_clear_error();
    CHECK_STATUS(sc_tensor_map_encode(f, NULL, &m), BAD);
    CHECK_MSG("sc_tensor_map_encode: argument 'desc' is NULL");
    sc_clear_error();
    CHECK_STATUS(sc_tensor_map_encode(f, &(sc_tensor_map_desc){.rank = 1, .dims = {64},
                                                               .box = {16}},
                                      NULL),
                 BAD);
    CHECK_MSG("sc_tensor_map_encode: argument 'map' is NULL");

    /* Which form. */
    TMAP_REFUSED(f, BAD, "the desc describes no array", .swizzle = SC_SWIZZLE_NONE);
    TMAP_REFUSED(f, BAD, "both forms given", .rank = 2, .dims = {64, 8}, .box = {16, 8},
                 .rows = 8);
    TMAP_REFUSED(f, BAD, "both forms given", .rank = 1, .dims = {64}, .box = {16},
                 .row_stride = 64);
    TMAP_REFUSED(f, BAD, "dims, strides or box set with rank 0", .dims = {64, 8},
                 .box = {16, 8});

    /* Rank, dims, box. */
    TMAP_REFUSED(f, BAD, "rank 6: the copy engine takes 1 .. 5", .rank = 6, .dims = {4},
                 .box = {4});
    TMAP_REFUSED(f, BAD, "dims[0] = 0: the copy engine takes 1 .. 2^32", .rank = 1,
                 .box = {16}, .strides = {1});
    TMAP_REFUSED(u8, BAD, "dims[2] = 4294967297: the copy engine takes 1 .. 2^32", .rank = 3,
                 .dims = {16, 2, 4294967297ull}, .box = {16, 1, 1});
    TMAP_REFUSED(f, BAD, "dims[3] = 4, strides[3] = 0, box[3] = 0: past rank 2", .rank = 2,
                 .dims = {64, 8, 0, 4}, .box = {16, 8});
    TMAP_REFUSED(f, BAD, "dims[2] = 0, strides[2] = 0, box[2] = 1: past rank 2", .rank = 2,
                 .dims = {64, 8}, .box = {16, 8, 1});
    TMAP_REFUSED(f, BAD, "box[1] = 0: the copy engine takes 1 .. 256", .rank = 2,
                 .dims = {64, 8}, .box = {16});
    TMAP_REFUSED(u8, BAD, "box[2] = 257: the copy engine takes 1 .. 256", .rank = 3,
                 .dims = {16, 4, 4}, .box = {16, 4, 257});

    /* Strides (elements): contiguous innermost, no overlap, 16-byte multiples, < 2^40. */
    TMAP_REFUSED(f, BAD, "strides[0] = 2: the innermost dimension is contiguous", .rank = 2,
                 .dims = {32, 8}, .strides = {2, 64}, .box = {16, 8});
    TMAP_REFUSED(f, BAD,
                 "strides[1] = 32 elements overlaps dimension 0: at least dims[0] x strides[0] "
                 "= 64 elements",
                 .rank = 2, .dims = {64, 8}, .strides = {1, 32}, .box = {16, 8});
    TMAP_REFUSED(f, BAD,
                 "strides[2] = 100 elements overlaps dimension 1: at least dims[1] x strides[1] "
                 "= 128 elements",
                 .rank = 3, .dims = {16, 4, 2}, .strides = {1, 32, 100}, .box = {16, 4, 2});
    TMAP_REFUSED(f, BAD,
                 "strides[1] = 18 elements of f32 is 72 bytes: the copy engine needs a multiple "
                 "of 16 bytes",
                 .rank = 2, .dims = {16, 4}, .strides = {1, 18}, .box = {16, 4});
    TMAP_REFUSED(f, BAD,
                 "strides[1] = 0 (packed: dims[0] x strides[0] = 18 elements) of f32 is 72 "
                 "bytes: the copy engine needs a multiple of 16 bytes",
                 .rank = 2, .dims = {18, 4}, .box = {16, 4});
    TMAP_REFUSED(u8, BAD,
                 "strides[1] = 1099511627776 elements of u8: the copy engine needs a stride "
                 "below 2^40 bytes",
                 .rank = 2, .dims = {16, 1}, .strides = {1, 1ull << 40}, .box = {16, 1});
    TMAP_REFUSED(f, BAD,
                 "strides[1] = 274877906944 elements of f32: the copy engine needs a stride "
                 "below 2^40 bytes",
                 .rank = 2, .dims = {16, 1}, .strides = {1, 1ull << 38}, .box = {16, 1});
    TMAP_REFUSED(u8, BAD,
                 "strides[2] = 0 (packed: dims[1] 4294967296 x strides[1] 4294967296 "
                 "elements, past 2^64): the copy engine needs a stride below 2^40 bytes",
                 .rank = 3, .dims = {1ull << 32, 1ull << 32, 2}, .box = {16, 1, 1});
    TMAP_REFUSED(u8, BAD,
                 "strides[2] = 16 elements overlaps dimension 1: at least dims[1] 4294967296 x "
                 "strides[1] 4294967296 elements (past 2^64)",
                 .rank = 3, .dims = {1ull << 32, 1ull << 32, 2}, .strides = {1, 0, 16},
                 .box = {16, 1, 1});

    /* The box's innermost side: 16-byte multiples, within the swizzle span. */
    TMAP_REFUSED(b16, BAD,
                 "box[0] = 4 bf16 is 8 bytes: the copy engine needs a multiple of 16 bytes",
                 .rank = 2, .dims = {64, 8}, .box = {4, 8});
    TMAP_REFUSED(f, BAD, "box[0] = 16 f32 is 64 bytes: at most the swizzle span of 32 bytes",
                 .rank = 2, .dims = {64, 8}, .box = {16, 8}, .swizzle = SC_SWIZZLE_32B);
    TMAP_REFUSED(u8, BAD, "box[0] = 256 u8 is 256 bytes: at most the swizzle span of 128 bytes",
                 .rank = 1, .dims = {4096}, .box = {256}, .swizzle = SC_SWIZZLE_128B);

    /* Element strides. */
    TMAP_REFUSED(f, BAD, "element_strides[0] = 2: the copy engine has no innermost element "
                 "stride", .rank = 2, .dims = {64, 8}, .box = {16, 8},
                 .element_strides = {2, 1});
    TMAP_REFUSED(f, BAD, "element_strides[1] = 9: the copy engine takes 1 .. 8", .rank = 2,
                 .dims = {64, 8}, .box = {16, 8}, .element_strides = {1, 9});
    TMAP_REFUSED(f, BAD, "element_strides[2] = 1: past rank 2, it must be 0", .rank = 2,
                 .dims = {64, 8}, .box = {16, 8}, .element_strides = {1, 1, 1});
    TMAP_REFUSED(f, BAD, "element_strides[2] = 3: past rank 2, it must be 0", .rows = 8,
                 .cols = 512, .box_rows = 8, .box_cols = 16, .element_strides = {0, 2, 3});

    /* Enums, and the NaN fill for floats only. */
    TMAP_REFUSED(f, BAD, "swizzle = 7: SC_SWIZZLE_NONE, _32B, _64B or _128B (0 .. 3)",
                 .rank = 1, .dims = {64}, .box = {16}, .swizzle = (sc_tensor_swizzle)7);
    TMAP_REFUSED(f, BAD, "oob_fill = 2: SC_OOB_FILL_ZERO or SC_OOB_FILL_NAN (0 .. 1)",
                 .rank = 1, .dims = {64}, .box = {16}, .oob_fill = (sc_tensor_oob_fill)2);
    TMAP_REFUSED(f, BAD, "l2_promotion = 5: SC_L2_PROMOTION_DEFAULT, _NONE, _64B, _128B or "
                 "_256B (0 .. 4)", .rank = 1, .dims = {64}, .box = {16},
                 .l2_promotion = (sc_tensor_l2_promotion)5);
    TMAP_REFUSED(u8, BAD, "oob_fill SC_OOB_FILL_NAN needs a floating-point element type the "
                 "copy engine knows (f16, bf16, f32, f64); u8 is copied as integer bits",
                 .rank = 1, .dims = {64}, .box = {16}, .oob_fill = SC_OOB_FILL_NAN);
    TMAP_REFUSED(f8, BAD, "f8e4m3 is copied as integer bits", .rank = 1, .dims = {64},
                 .box = {16}, .oob_fill = SC_OOB_FILL_NAN);

    /* The view must hold the array: exactly (last element inside), overflow-checked. */
    TMAP_REFUSED(tmap_checks_view_(f32, 0, 639), BAD,
                 "the array's last element is element 639 of the view, which holds 639 "
                 "elements",
                 .rank = 2, .dims = {64, 10}, .box = {16, 2});
    TMAP_ENCODES(tmap_checks_view_(f32, 0, 640), .rank = 2, .dims = {64, 10}, .box = {16, 2});
    /* Strided: the last element at 7 + 3 x 16 + 2 x 480 = 1015. */
    TMAP_REFUSED(tmap_checks_view_(f32, 0, 1015), BAD,
                 "the array's last element is element 1015 of the view, which holds 1015 "
                 "elements",
                 .rank = 3, .dims = {8, 4, 3}, .strides = {1, 16, 480}, .box = {8, 4, 3});
    TMAP_ENCODES(tmap_checks_view_(f32, 0, 1016), .rank = 3, .dims = {8, 4, 3},
                 .strides = {1, 16, 480}, .box = {8, 4, 3}, .element_strides = {1, 2, 1});
    TMAP_REFUSED(u8, SC_ERR_OVERFLOW,
                 "the array's last element index overflows 64 bits at dimension 1 ((dims[1] "
                 "4294967296 - 1) x strides[1] 549755813888 elements)",
                 .rank = 2, .dims = {16, 1ull << 32}, .strides = {1, 1ull << 39},
                 .box = {16, 1});

    /* 16-byte alignment of the view. */
    TMAP_REFUSED(tmap_checks_view_(bf, 4, 1024), BAD, "needs 16-byte alignment", .rank = 1,
                 .dims = {1024}, .box = {64});
    TMAP_ENCODES(tmap_checks_view_(bf, 8, 1024), .rank = 1, .dims = {1024}, .box = {64});

    /* At the limits: box 256, element stride 8, a stride of 2^40 - 16 bytes, 128 bytes at
     * the 128-byte swizzle, L2 promotion and the fills, every rank, every dtype. */
    TMAP_ENCODES(u8, .rank = 2, .dims = {256, 16}, .box = {256, 16},
                 .element_strides = {1, 8}, .l2_promotion = SC_L2_PROMOTION_NONE);
    TMAP_ENCODES(u8, .rank = 2, .dims = {16, 1}, .strides = {1, (1ull << 40) - 16},
                 .box = {16, 1}, .l2_promotion = SC_L2_PROMOTION_64B);
    TMAP_ENCODES(f, .rank = 1, .dims = {4096}, .box = {8}, .swizzle = SC_SWIZZLE_32B,
                 .oob_fill = SC_OOB_FILL_NAN, .l2_promotion = SC_L2_PROMOTION_128B);
    TMAP_ENCODES(b16, .rank = 2, .dims = {64, 64}, .box = {32, 64}, .swizzle = SC_SWIZZLE_64B,
                 .oob_fill = SC_OOB_FILL_NAN, .l2_promotion = SC_L2_PROMOTION_256B);
    TMAP_ENCODES(f8, .rank = 5, .dims = {128, 2, 2, 2, 4}, .box = {128, 2, 2, 2, 4},
                 .swizzle = SC_SWIZZLE_128B, .element_strides = {1, 2, 1, 2, 4});
    TMAP_ENCODES(f, .rank = 4, .dims = {4, 4, 4, 4}, .strides = {0, 8, 64, 256},
                 .box = {4, 4, 4, 4});
    for (int d = SC_DTYPE_INVALID + 1; d < SC_DTYPE_COUNT; d++) {
        sc_buffer any = tmap_checks_buffer_(ctx, (sc_dtype)d, 1024, "tmap-any");
        const uint32_t inner = (uint32_t)(16 / sc_dtype_size((sc_dtype)d));
        TMAP_ENCODES(sc_view_of(any), .rank = 2, .dims = {64, 1024 / 64}, .box = {inner, 4});
        CHECK_OK(sc_buffer_destroy(any));
    }

    /* A stale view. */
    sc_buffer gone = tmap_checks_buffer_(ctx, SC_F32, 64, "tmap-gone");
    CHECK_OK(sc_buffer_destroy(gone));
    TMAP_REFUSED(sc_view_of(gone), SC_ERR_STALE_HANDLE, "stale", .rank = 1, .dims = {64},
                 .box = {16});

    CHECK_OK(sc_buffer_destroy(u8b));
    CHECK_OK(sc_buffer_destroy(f8b));
    CHECK_OK(sc_buffer_destroy(bf));
    CHECK_OK(sc_buffer_destroy(f32));
}

#endif
