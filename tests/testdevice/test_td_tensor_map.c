/* Tensor maps of rank 1 .. 5 on the test device, which writes every argument of
 * cuTensorMapEncodeTiled into the map (testdevice/tensor_map.c, decoded by
 * fake_tensor_map_decode):
 *   - for each rank and several element types, the data type, rank, address, dims, byte
 *     strides (given and packed), box, element strides, interleave, swizzle, L2 promotion
 *     (the default is 256 bytes) and OOB fill the driver got;
 *   - the 2-D form (rows, cols, row_stride) as rank 2, unchanged; every dtype's data type
 *     (fp8 and the 1-byte integers as UINT8);
 *   - every refusal (tests/tensor_map_checks.h, which the GPU test runs too), none of which
 *     reaches the driver (the test device counts no misuse);
 *   - random descs (values at and past every limit, huge ones, random views and dtypes):
 *     each is encoded or refused with a message, and whatever the library accepts the test
 *     device's driver checks accept too, describing bytes inside the view;
 *   - launches: an N-D map is checked and tracked like its view (alive, at the address it
 *     was encoded for, stale after its buffer's destroy);
 *   - the GPU test's kernel (tests/gpu/tensor_map_nd_kernels.h) compiles with NVRTC for
 *     sm_80, sm_90 and sm_90a (compile-only; skipped without NVRTC).
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU
 * (tests/gpu/test_gpu_tensor_map_nd.c runs the copies). */
#include "../gpu/tensor_map_nd_kernels.h"
#include "../tensor_map_checks.h"
#include "../test.h"
#include "td_control.h"

static sc_context ctx;

static sc_buffer make(sc_dtype dtype, uint64_t count, const char *label)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                    .label = label},
                             &b) == SC_OK);
    return b;
}

/* What the driver must have been given for a map. */
typedef struct want_map {
    unsigned dtype, rank, swizzle, l2, oob;
    uint64_t dims[5], strides[4]; /* strides in bytes */
    unsigned box[5], estrides[5];
} want_map;

static void check_encoded(int line, const sc_tensor_map *m, const want_map *w)
{
    fake_tensor_map t;
    if (!fake_tensor_map_decode(m->encoded, &t)) {
        fprintf(stderr, "%s:%d: the map is not the test device's encoding\n", __FILE__, line);
        test_failures++;
        return;
    }
    int bad = t.address != m->address || t.rank != w->rank || t.dtype != w->dtype ||
              t.interleave != 0 || t.swizzle != w->swizzle || t.l2_promotion != w->l2 ||
              t.oob_fill != w->oob;
    for (int i = 0; i < 5; i++) {
        bad |= t.dims[i] != (i < (int)w->rank ? w->dims[i] : 0);
        bad |= t.box[i] != (i < (int)w->rank ? w->box[i] : 0);
        bad |= t.element_strides[i] != (i < (int)w->rank ? w->estrides[i] : 0);
        if (i < 4)
            bad |= t.strides[i] != (i + 1 < (int)w->rank ? w->strides[i] : 0);
    }
    if (bad) {
        fprintf(stderr,
                "%s:%d: the driver got dtype %u rank %u swizzle %u l2 %u oob %u interleave %u "
                "address 0x%llx (map 0x%llx), dims {%llu %llu %llu %llu %llu}, strides {%llu "
                "%llu %llu %llu}, box {%u %u %u %u %u}, element strides {%u %u %u %u %u}\n",
                __FILE__, line, t.dtype, t.rank, t.swizzle, t.l2_promotion, t.oob_fill,
                t.interleave, (unsigned long long)t.address, (unsigned long long)m->address,
                (unsigned long long)t.dims[0], (unsigned long long)t.dims[1],
                (unsigned long long)t.dims[2], (unsigned long long)t.dims[3],
                (unsigned long long)t.dims[4], (unsigned long long)t.strides[0],
                (unsigned long long)t.strides[1], (unsigned long long)t.strides[2],
                (unsigned long long)t.strides[3], t.box[0], t.box[1], t.box[2], t.box[3],
                t.box[4], t.element_strides[0], t.element_strides[1], t.element_strides[2],
                t.element_strides[3], t.element_strides[4]);
        test_failures++;
    }
}

/* Encode view with desc, then compare what the driver got with want. */
static void encode_check_at(int line, sc_view v, const sc_tensor_map_desc *d, const want_map *w)
{
    sc_tensor_map m;
    sc_status s = sc_tensor_map_encode(v, d, &m);
    if (s != SC_OK) {
        fprintf(stderr, "%s:%d: sc_tensor_map_encode: %s: %s\n", __FILE__, line,
                sc_status_name(s), sc_last_error());
        test_failures++;
        return;
    }
    check_encoded(line, &m, w);
    CHECK(memcmp(&m.desc, d, sizeof *d) == 0);
    CHECK(m.view.buffer.id == v.buffer.id && m.view.offset == v.offset);
}
#define ENCODE_CHECK(v, d, ...) encode_check_at(__LINE__, (v), (d), &(want_map){__VA_ARGS__})

static void test_ranks(void)
{
    sc_buffer u8 = make(SC_U8, 1 << 16, "u8");
    sc_buffer f8 = make(SC_F8E5M2, 1 << 16, "f8e5m2");
    sc_buffer bf = make(SC_BF16, 1 << 16, "bf16");
    sc_buffer f32 = make(SC_F32, 1 << 16, "f32");
    sc_buffer f64 = make(SC_F64, 1 << 14, "f64");

    /* Rank 1: defaults (L2 256 B = 3, zero fill, no swizzle, element stride 1). */
    ENCODE_CHECK(sc_view_of(u8), (&(sc_tensor_map_desc){.rank = 1, .dims = {1000},
                                                        .box = {64}}),
                 .dtype = 0, .rank = 1, .l2 = 3, .dims = {1000}, .box = {64}, .estrides = {1});
    /* strides[0] = 1 given is the same. */
    ENCODE_CHECK(sc_view_of(f32), (&(sc_tensor_map_desc){.rank = 1, .dims = {300},
                                                         .strides = {1}, .box = {32},
                                                         .oob_fill = SC_OOB_FILL_NAN}),
                 .dtype = 7, .rank = 1, .l2 = 3, .oob = 1, .dims = {300}, .box = {32},
                 .estrides = {1});
    /* Rank 2: a padded stride, swizzle 128B, L2 none; fp8 goes as UINT8. */
    ENCODE_CHECK(sc_view_of(bf), (&(sc_tensor_map_desc){.rank = 2, .dims = {200, 37},
                                                        .strides = {0, 208}, .box = {64, 8},
                                                        .swizzle = SC_SWIZZLE_128B,
                                                        .l2_promotion = SC_L2_PROMOTION_NONE}),
                 .dtype = 9, .rank = 2, .swizzle = 3, .l2 = 0, .dims = {200, 37},
                 .strides = {416}, .box = {64, 8}, .estrides = {1, 1});
    ENCODE_CHECK(sc_view_of(f8), (&(sc_tensor_map_desc){.rank = 2, .dims = {100, 50},
                                                        .strides = {1, 112}, .box = {32, 16},
                                                        .swizzle = SC_SWIZZLE_32B,
                                                        .l2_promotion = SC_L2_PROMOTION_64B,
                                                        .element_strides = {0, 3}}),
                 .dtype = 0, .rank = 2, .swizzle = 1, .l2 = 1, .dims = {100, 50},
                 .strides = {112}, .box = {32, 16}, .estrides = {1, 3});
    /* Rank 3: element strides, NaN fill, L2 128B, a view at an offset. */
    sc_view off;
    CHECK_OK(sc_buffer_view(f32, 64, 24 * 9 * 5, &off));
    ENCODE_CHECK(off, (&(sc_tensor_map_desc){.rank = 3, .dims = {20, 7, 5},
                                             .strides = {1, 24, 24 * 9}, .box = {8, 4, 3},
                                             .element_strides = {1, 2, 1},
                                             .oob_fill = SC_OOB_FILL_NAN,
                                             .l2_promotion = SC_L2_PROMOTION_128B}),
                 .dtype = 7, .rank = 3, .l2 = 2, .oob = 1, .dims = {20, 7, 5},
                 .strides = {96, 96 * 9}, .box = {8, 4, 3}, .estrides = {1, 2, 1});
    /* Rank 4: packed strides (0), swizzle 64B, L2 256B given. */
    ENCODE_CHECK(sc_view_of(bf), (&(sc_tensor_map_desc){.rank = 4, .dims = {40, 9, 6, 3},
                                                        .box = {32, 4, 2, 1},
                                                        .swizzle = SC_SWIZZLE_64B,
                                                        .l2_promotion = SC_L2_PROMOTION_256B}),
                 .dtype = 9, .rank = 4, .swizzle = 2, .l2 = 3, .dims = {40, 9, 6, 3},
                 .strides = {80, 80 * 9, 80 * 9 * 6}, .box = {32, 4, 2, 1},
                 .estrides = {1, 1, 1, 1});
    /* Rank 5: mixed given and packed strides, f64, element strides up to 8. */
    ENCODE_CHECK(sc_view_of(f64),
                 (&(sc_tensor_map_desc){.rank = 5, .dims = {12, 3, 4, 2, 3},
                                        .strides = {1, 16, 0, 256, 0}, .box = {4, 2, 2, 2, 2},
                                        .element_strides = {1, 1, 8, 2, 1},
                                        .oob_fill = SC_OOB_FILL_NAN}),
                 .dtype = 8, .rank = 5, .l2 = 3, .oob = 1, .dims = {12, 3, 4, 2, 3},
                 .strides = {128, 384, 2048, 4096}, .box = {4, 2, 2, 2, 2},
                 .estrides = {1, 1, 8, 2, 1});
    /* A view longer than the array: allowed in the general form. */
    ENCODE_CHECK(sc_view_of(u8), (&(sc_tensor_map_desc){.rank = 4, .dims = {48, 5, 4, 3},
                                                        .strides = {1, 64, 64 * 6, 64 * 6 * 5},
                                                        .box = {32, 2, 3, 2}}),
                 .dtype = 0, .rank = 4, .l2 = 3, .dims = {48, 5, 4, 3},
                 .strides = {64, 384, 1920}, .box = {32, 2, 3, 2}, .estrides = {1, 1, 1, 1});

    /* The 2-D form: dims {cols, rows}, the stride in bytes, the new shared fields too. */
    sc_view rows16;
    CHECK_OK(sc_buffer_view(bf, 0, 15 * 256 + 128, &rows16));
    ENCODE_CHECK(rows16, (&(sc_tensor_map_desc){.rows = 16, .cols = 128, .row_stride = 256,
                                                .box_rows = 8, .box_cols = 64,
                                                .swizzle = SC_SWIZZLE_128B}),
                 .dtype = 9, .rank = 2, .swizzle = 3, .l2 = 3, .dims = {128, 16},
                 .strides = {512}, .box = {64, 8}, .estrides = {1, 1});
    sc_view whole;
    CHECK_OK(sc_buffer_view(f32, 0, 64 * 32, &whole));
    ENCODE_CHECK(whole, (&(sc_tensor_map_desc){.rows = 64, .cols = 32, .box_rows = 16,
                                               .box_cols = 8, .element_strides = {1, 4},
                                               .oob_fill = SC_OOB_FILL_NAN,
                                               .l2_promotion = SC_L2_PROMOTION_64B}),
                 .dtype = 7, .rank = 2, .l2 = 1, .oob = 1, .dims = {32, 64}, .strides = {128},
                 .box = {8, 16}, .estrides = {1, 4});
    /* The 2-D form still wants rows x cols to be exactly the view. */
    sc_tensor_map m;
    CHECK_FAIL(sc_tensor_map_encode(sc_view_of(f32),
                                    &(sc_tensor_map_desc){.rows = 64, .cols = 32, .box_rows = 16,
                                                          .box_cols = 8},
                                    &m),
               SC_ERR_INVALID_ARGUMENT, "sc_tensor_map_encode");
    CHECK_MSG("rows 64 x cols 32 must equal the view's 65536 elements");

    CHECK_OK(sc_buffer_destroy(u8));
    CHECK_OK(sc_buffer_destroy(f8));
    CHECK_OK(sc_buffer_destroy(bf));
    CHECK_OK(sc_buffer_destroy(f32));
    CHECK_OK(sc_buffer_destroy(f64));
}

/* Every dtype's data type: the copy engine moves bits. */
static void test_dtypes(void)
{
    static const unsigned want[SC_DTYPE_COUNT] = {
        [SC_U8] = 0,  [SC_I8] = 0,  [SC_U16] = 1,  [SC_I16] = 1,     [SC_U32] = 2,
        [SC_I32] = 3, [SC_U64] = 4, [SC_I64] = 5,  [SC_F16] = 6,     [SC_BF16] = 9,
        [SC_F32] = 7, [SC_F64] = 8, [SC_F8E4M3] = 0, [SC_F8E5M2] = 0,
    };
    for (int d = SC_DTYPE_INVALID + 1; d < SC_DTYPE_COUNT; d++) {
        const uint64_t es = sc_dtype_size((sc_dtype)d);
        sc_buffer b = make((sc_dtype)d, 4096, "any");
        ENCODE_CHECK(sc_view_of(b), (&(sc_tensor_map_desc){.rank = 3, .dims = {64, 8, 8},
                                                           .box = {(uint32_t)(32 / es), 8, 2}}),
                     .dtype = want[d], .rank = 3, .l2 = 3, .dims = {64, 8, 8},
                     .strides = {64 * es, 512 * es}, .box = {(unsigned)(32 / es), 8, 2},
                     .estrides = {1, 1, 1});
        CHECK_OK(sc_buffer_destroy(b));
    }
}

/* A kernel taking a map (128 bytes, 64-aligned) and a pointer. */
static const char tmap_ptx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry boxes(\n"
    "    .param .align 64 .b8 boxes_param_0[128],\n"
    "    .param .u64 boxes_param_1\n"
    ")\n"
    "{\n    ret;\n}\n";

static void test_launch(void)
{
    sc_buffer a = make(SC_BF16, 8192, "nd");
    sc_buffer out = make(SC_U8, 256, "out");
    sc_tensor_map map;
    const sc_tensor_map_desc d = {.rank = 3, .dims = {64, 16, 4}, .strides = {1, 80, 0},
                                  .box = {64, 8, 2}, .swizzle = SC_SWIZZLE_128B};
    sc_view v;
    CHECK_OK(sc_buffer_view(a, 8, 80 * 16 * 4, &v));
    CHECK_OK(sc_tensor_map_encode(v, &d, &map));
    CHECK(map.view.offset == 8 && map.view.count == 80 * 16 * 4 && map.address != 0);
    sc_module mod;
    CHECK_OK(sc_module_load_image(ctx, tmap_ptx, sizeof tmap_ptx - 1, &mod));
    sc_kernel k;
    CHECK_OK(sc_kernel_get(mod, "boxes", &k));
    const sc_launch_desc cfg = {.grid = {1, 1, 1}, .block = {128, 1, 1}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_tensor_map_in(&map),
                       sc_arg_out(sc_view_of(out))));
    /* A store map of the same view: the write is tracked (a read-only use elsewhere would
     * wait), the launch accepted. */
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_tensor_map_out(&map),
                       sc_arg_out(sc_view_of(out))));
    sc_tensor_map moved = map;
    moved.address += 16;
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_tensor_map_in(&moved),
                         sc_arg_out(sc_view_of(out))),
               SC_ERR_INVALID_ARGUMENT, "sc_kernel_launch");
    CHECK_MSG("encoded for device address");
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_tensor_map_in(&map),
                         sc_arg_out(sc_view_of(out))),
               SC_ERR_STALE_HANDLE, "sc_kernel_launch");
    CHECK_FAIL(sc_tensor_map_encode(v, &d, &map), SC_ERR_STALE_HANDLE, "sc_tensor_map_encode");
    CHECK_OK(sc_module_destroy(mod));
    CHECK_OK(sc_buffer_destroy(out));
}

/* A value from a list of interesting ones. */
#define PICK(rng, list) ((list)[test_rand(rng) % (sizeof(list) / sizeof((list)[0]))])

/* A random valid general-form desc for a dtype of es bytes, and the elements its array spans
 * (the last element's index + 1). */
static uint64_t random_valid(uint64_t *rng, uint64_t es, bool is_float, sc_tensor_map_desc *d)
{
    static const uint32_t span[] = {0, 32, 64, 128};
    memset(d, 0, sizeof *d);
    d->rank = 1 + (uint32_t)(test_rand(rng) % 5);
    d->swizzle = (sc_tensor_swizzle)(test_rand(rng) % 4);
    d->oob_fill = is_float ? (sc_tensor_oob_fill)(test_rand(rng) % 2) : SC_OOB_FILL_ZERO;
    d->l2_promotion = (sc_tensor_l2_promotion)(test_rand(rng) % 5);
    const uint64_t q = 16 / es; /* elements per 16 bytes */
    uint64_t s = 1, last = 0;
    for (uint32_t i = 0; i < d->rank; i++) {
        d->dims[i] = 1 + test_rand(rng) % (i == 0 ? 64 : 4);
        if (i > 0) {
            const uint64_t prev = d->dims[i - 1] * s;
            const uint64_t padded = (prev + q - 1) / q * q + q * (test_rand(rng) % 3);
            const bool packed_ok = (prev * es) % 16 == 0;
            s = packed_ok && test_rand(rng) % 2 ? prev : padded;
            d->strides[i] = s == prev && packed_ok && test_rand(rng) % 2 ? 0 : s;
        } else {
            d->strides[0] = test_rand(rng) % 2;
        }
        last += (d->dims[i] - 1) * s;
        const uint64_t max_rows = d->swizzle ? span[d->swizzle] / 16 : 8;
        d->box[i] = i == 0 ? (uint32_t)(q * (1 + test_rand(rng) % max_rows))
                           : 1 + (uint32_t)(test_rand(rng) % 8);
        d->element_strides[i] = i == 0 ? (uint32_t)(test_rand(rng) % 2)
                                       : (uint32_t)(test_rand(rng) % 9);
    }
    return last + 1;
}

/* Random descs, valid and then one field changed to a value at or past a limit (or a huge
 * one), on random views: a valid desc is encoded; a changed one is encoded or refused with a
 * message; whatever is encoded, the test device's driver checks accept (no misuse) and it
 * describes bytes inside the view. */
static void test_random_descs(void)
{
    static const uint64_t dims[] = {0, 1, 2, 17, 255, 256, 4096, 0xffffffffull, 1ull << 32,
                                    (1ull << 32) + 1, 1ull << 40, UINT64_MAX};
    static const uint64_t strides[] = {0, 1, 2, 8, 16, 17, 24, 64, 300, 304, 1ull << 36,
                                       (1ull << 39) + 8, (1ull << 40) - 16, 1ull << 40,
                                       UINT64_MAX / 2, UINT64_MAX};
    static const uint64_t boxes[] = {0, 1, 2, 8, 16, 64, 128, 255, 256, 257, UINT32_MAX};
    static const uint64_t small[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 255, UINT32_MAX};
    static const sc_dtype dtypes[] = {SC_U8, SC_F8E4M3, SC_BF16, SC_F16, SC_F32, SC_I32,
                                      SC_F64, SC_U64};
    enum { N = 1 << 16 };
    sc_buffer bufs[8];
    for (int i = 0; i < 8; i++)
        bufs[i] = make(dtypes[i], N, "random");
    uint64_t rng = 0x5eed7e57ull, accepted = 0, refused = 0;
    const int misuse0 = fake.misuse_count();
    for (int it = 0; it < 20000; it++) {
        const int bi = (int)(test_rand(&rng) % 8);
        const sc_dtype dt = dtypes[bi];
        const uint64_t es = sc_dtype_size(dt);
        sc_tensor_map_desc d;
        const uint64_t need = random_valid(&rng, es, dt == SC_BF16 || dt == SC_F16 ||
                                                         dt == SC_F32 || dt == SC_F64, &d);
        uint64_t off = (16 / es) * (test_rand(&rng) % 8), count = need + test_rand(&rng) % 8;
        REQUIRE(off + count <= N);
        const bool change = it % 2;
        if (change) {
            const uint32_t k = (uint32_t)(test_rand(&rng) % 5);
            switch (test_rand(&rng) % 12) {
            case 0: d.rank = (uint32_t)PICK(&rng, small); break;
            case 1: d.dims[k] = PICK(&rng, dims); break;
            case 2: case 3: d.strides[k] = PICK(&rng, strides); break;
            case 4: case 5: d.box[k] = (uint32_t)PICK(&rng, boxes); break;
            case 6: d.element_strides[k] = (uint32_t)PICK(&rng, small); break;
            case 7: d.swizzle = (sc_tensor_swizzle)(test_rand(&rng) % 6); break;
            case 8: d.oob_fill = (sc_tensor_oob_fill)(test_rand(&rng) % 3); break;
            case 9: d.l2_promotion = (sc_tensor_l2_promotion)(test_rand(&rng) % 7); break;
            case 10: off += test_rand(&rng) % 3; count = N - off; break;
            default: count -= test_rand(&rng) % 3; break;
            }
        }
        sc_view v;
        CHECK_OK(sc_buffer_view(bufs[bi], off, count, &v));
        sc_tensor_map m;
        sc_clear_error();
        const sc_status s = sc_tensor_map_encode(v, &d, &m);
        if (s != SC_OK) {
            refused++;
            if (!change)
                fprintf(stderr, "a valid desc refused: %s\n", sc_last_error());
            CHECK(change);
            CHECK(s == SC_ERR_INVALID_ARGUMENT || s == SC_ERR_OVERFLOW);
            CHECK(strncmp(sc_last_error(), "sc_tensor_map_encode: ", 22) == 0);
            continue;
        }
        accepted++;
        fake_tensor_map t;
        CHECK(fake_tensor_map_decode(m.encoded, &t));
        uint64_t extent = t.dims[0] * es;
        for (unsigned i = 1; i < t.rank; i++)
            extent += (t.dims[i] - 1) * t.strides[i - 1];
        CHECK(t.address % 16 == 0 && extent <= count * es);
        CHECK(t.rank == d.rank && t.swizzle == (unsigned)d.swizzle &&
              t.oob_fill == (unsigned)d.oob_fill);
        CHECK(t.l2_promotion == (d.l2_promotion == SC_L2_PROMOTION_DEFAULT
                                     ? 3u
                                     : (unsigned)d.l2_promotion - 1));
    }
    printf("random descs: %llu encoded, %llu refused\n", (unsigned long long)accepted,
           (unsigned long long)refused);
    CHECK(accepted > 10000 && refused > 5000);
    CHECK(fake.misuse_count() == misuse0); /* every accepted desc was valid for the driver */
    for (int i = 0; i < 8; i++)
        CHECK_OK(sc_buffer_destroy(bufs[i]));
}

/* The GPU test's kernel compiles (compile-only programs need NVRTC, no device): the PTX for
 * sm_90 holds the five copies, cubins for sm_90 and sm_90a, and sm_80 (where it traps). */
static void test_gpu_kernel_compiles(void)
{
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("NVRTC not found: the GPU test's kernel is not compiled here (%s)\n",
               sc_last_error());
        return;
    }
    static const struct {
        int arch;
        bool specific, ptx;
    } targets[] = {{90, false, true}, {90, false, false}, {90, true, false}, {80, false, false}};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        sc_program p = {0};
        sc_status s = sc_program_create((sc_context){0},
                                        &(sc_program_desc){.source = tmap_nd_src,
                                                           .name = "tensor_map_nd.cu",
                                                           .arch = targets[i].arch,
                                                           .arch_specific = targets[i].specific,
                                                           .ptx = targets[i].ptx},
                                        &p);
        if (s != SC_OK) {
            fprintf(stderr, "tensor_map_nd.cu for sm_%d%s: %s: %s\n", targets[i].arch,
                    targets[i].specific ? "a" : "", sc_status_name(s), sc_last_error());
            test_failures++;
            continue;
        }
        const void *image = NULL;
        uint64_t bytes = 0;
        CHECK_OK(sc_program_image(p, &image, &bytes));
        CHECK(image != NULL && bytes > 0);
        if (targets[i].ptx && image) {
            static const char *const copies[] = {
                "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes",
                "cp.async.bulk.tensor.2d.", "cp.async.bulk.tensor.3d.",
                "cp.async.bulk.tensor.4d.", "cp.async.bulk.tensor.5d."};
            for (int k = 0; k < 5; k++)
                CHECK(strstr(image, copies[k]) != NULL);
            CHECK(strstr(image, ".entry tmap_boxes(") != NULL);
        }
        CHECK_OK(sc_program_destroy(p));
    }
}

int main(void)
{
    fake_attach();
    fake_counts start = fake_counts_now();
    const int misuse0 = fake.misuse_count();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    test_ranks();
    test_dtypes();
    tensor_map_desc_checks(ctx);
    test_launch();
    test_random_descs();
    test_gpu_kernel_compiles();
    if (fake.misuse_count() != misuse0) {
        fprintf(stderr, "the test device saw %d misuses (a refusal reached the driver); the "
                        "last: %s\n", fake.misuse_count() - misuse0, fake.last_misuse());
        test_failures++;
    }
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    char diff[512];
    if (fake_counts_diff(start, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "the test device holds objects after the context's destroy: %s\n", diff);
        test_failures++;
    }
    return test_result("test_td_tensor_map");
}
