/* Tensor maps of rank 1 .. 5 on a GPU (sm_90+): the bulk tensor copy engine against a CPU
 * gather.
 *
 * For each case (ranks 1 .. 5; u8, f8e4m3, f8e5m2, bf16, f32; padded, given and packed
 * strides; element strides; the 2-D form too; swizzle none, 32B, 64B, 128B; OOB fill zeros
 * and NaN; every L2 promotion) a view of fresh random values, at a 256-byte offset into its
 * buffer and shorter than it, is encoded; tmap_boxes (tests/gpu/tensor_map_nd_kernels.h)
 * copies boxes at several coordinates (inside, straddling the high end, negative,
 * entirely outside; the innermost coordinate always a multiple of 16 bytes, as the copy
 * engine needs) into shared memory with cp.async.bulk.tensor.<rank>d and writes the shared
 * bytes out, over a poisoned output. The CPU walks each box in shared-memory order
 * (innermost first, ceil(box / element stride) elements per dimension), unswizzles the
 * byte offset (CUTLASS's Swizzle<1|2|3, 4, 3> on a 1024-byte-aligned base), and compares:
 * elements inside the array bit for bit with the source, elements outside as zeros or as a
 * NaN of the element type. Then every refusal of tests/tensor_map_checks.h (the same as on
 * the test device; the valid descs around them must encode with the real driver), and a map
 * whose buffer was destroyed refused at launch. Before sm_90: encoding is
 * SC_ERR_NOT_SUPPORTED, and that is all. */
#include "../bf16.h"
#include "../fp8.h"
#include "../tensor_map_checks.h"
#include "../test.h"
#include "tensor_map_nd_kernels.h"

#define MAX_BOXES 8
#define POISON_BYTE 0xA5

static sc_context ctx;
static sc_kernel kern;

typedef struct tcase {
    const char *name;
    sc_dtype dtype;
    bool form_2d;                 /* the 2-D fields (rows = dims[1], cols = dims[0]) */
    uint32_t rank;
    uint64_t dims[5], strides[5]; /* elements; strides[i >= 1] 0: packed */
    uint32_t box[5], estrides[5];
    sc_tensor_swizzle swizzle;
    sc_tensor_oob_fill fill;
    sc_tensor_l2_promotion l2;
    int n_boxes;
    int32_t coords[MAX_BOXES][5];
} tcase;

static const tcase cases[] = {
    {"r1-u8", SC_U8, false, 1, {1000}, {0}, {64}, {0}, SC_SWIZZLE_NONE, SC_OOB_FILL_ZERO,
     SC_L2_PROMOTION_DEFAULT, 8, {{0}, {16}, {944}, {960}, {-32}, {992}, {1008}, {-64}}},
    {"r1-f32-nan", SC_F32, false, 1, {300}, {1}, {32}, {0}, SC_SWIZZLE_NONE, SC_OOB_FILL_NAN,
     SC_L2_PROMOTION_NONE, 6, {{0}, {4}, {288}, {-8}, {296}, {300}}},
    {"r1-bf16-256", SC_BF16, false, 1, {5000}, {0}, {256}, {0}, SC_SWIZZLE_NONE,
     SC_OOB_FILL_ZERO, SC_L2_PROMOTION_64B, 3, {{0}, {4864}, {-128}}},
    {"r2-bf16-sw128", SC_BF16, false, 2, {200, 37}, {1, 208}, {64, 8}, {0},
     SC_SWIZZLE_128B, SC_OOB_FILL_ZERO, SC_L2_PROMOTION_DEFAULT, 6,
     {{0, 0}, {64, 5}, {136, 32}, {-8, -3}, {192, 36}, {8, 1}}},
    {"r2-f8e4m3-sw32", SC_F8E4M3, false, 2, {100, 50}, {1, 112}, {32, 16}, {0, 3},
     SC_SWIZZLE_32B, SC_OOB_FILL_ZERO, SC_L2_PROMOTION_128B, 5,
     {{0, 0}, {16, 10}, {80, 40}, {-16, -4}, {96, 49}}},
    {"r2-f32-sw128-nan", SC_F32, false, 2, {70, 33}, {1, 72}, {32, 16}, {0},
     SC_SWIZZLE_128B, SC_OOB_FILL_NAN, SC_L2_PROMOTION_256B, 4,
     {{0, 0}, {64, 24}, {-4, -8}, {36, 17}}},
    {"r2-form2d-bf16-sw64", SC_BF16, true, 2, {96, 48}, {1, 104}, {32, 16}, {0},
     SC_SWIZZLE_64B, SC_OOB_FILL_ZERO, SC_L2_PROMOTION_DEFAULT, 4,
     {{0, 0}, {32, 16}, {88, 40}, {-8, -8}}},
    {"r3-f32-nan-estride", SC_F32, false, 3, {20, 7, 5}, {1, 24, 216}, {8, 4, 3}, {1, 2, 1},
     SC_SWIZZLE_NONE, SC_OOB_FILL_NAN, SC_L2_PROMOTION_DEFAULT, 5,
     {{0, 0, 0}, {4, 1, 1}, {16, 5, 3}, {-4, -2, -1}, {12, 6, 4}}},
    {"r3-bf16-sw64", SC_BF16, false, 3, {40, 9, 6}, {0}, {32, 4, 2}, {0}, SC_SWIZZLE_64B,
     SC_OOB_FILL_NAN, SC_L2_PROMOTION_DEFAULT, 4,
     {{0, 0, 0}, {8, 5, 4}, {32, 8, 5}, {-8, -1, -1}}},
    {"r3-u8-sw128", SC_U8, false, 3, {300, 10, 3}, {1, 304}, {128, 8, 2}, {0}, SC_SWIZZLE_128B,
     SC_OOB_FILL_ZERO, SC_L2_PROMOTION_NONE, 4,
     {{0, 0, 0}, {256, 4, 2}, {-16, -2, -1}, {176, 9, 0}}},
    {"r4-u8-estride", SC_U8, false, 4, {48, 5, 4, 3}, {1, 64, 384, 1920}, {32, 2, 3, 2},
     {1, 1, 2, 1}, SC_SWIZZLE_NONE, SC_OOB_FILL_ZERO, SC_L2_PROMOTION_DEFAULT, 4,
     {{0, 0, 0, 0}, {16, 3, 1, 1}, {32, 4, 3, 2}, {-16, -1, -2, -1}}},
    {"r4-f8e5m2", SC_F8E5M2, false, 4, {64, 3, 3, 3}, {0}, {64, 2, 2, 2}, {0},
     SC_SWIZZLE_NONE, SC_OOB_FILL_ZERO, SC_L2_PROMOTION_128B, 4,
     {{0, 0, 0, 0}, {16, 2, 2, 2}, {-48, -1, 0, 1}, {48, 1, 2, 0}}},
    {"r5-f32-nan", SC_F32, false, 5, {12, 3, 4, 2, 3}, {1, 16, 0, 256, 0}, {4, 2, 2, 2, 2},
     {1, 1, 1, 2, 1}, SC_SWIZZLE_NONE, SC_OOB_FILL_NAN, SC_L2_PROMOTION_DEFAULT, 4,
     {{0, 0, 0, 0, 0}, {8, 2, 3, 1, 2}, {-4, -1, -1, -1, -1}, {4, 1, 2, 0, 1}}},
    {"r5-bf16-sw128", SC_BF16, false, 5, {64, 2, 2, 2, 3}, {0}, {64, 2, 1, 2, 2}, {0},
     SC_SWIZZLE_128B, SC_OOB_FILL_ZERO, SC_L2_PROMOTION_DEFAULT, 4,
     {{0, 0, 0, 0, 0}, {0, 1, 1, 1, 2}, {-8, 0, 1, -1, 1}, {8, 1, 0, 1, 2}}},
};

/* ---- host side ---------------------------------------------------------------------------- */

static double uniform(uint64_t *rng, double lo, double hi)
{
    return lo + (hi - lo) * (double)(test_rand(rng) >> 11) / 9007199254740992.0;
}

/* n random values of dtype (finite, never all zero). */
static void fill_values(sc_dtype d, uint8_t *p, uint64_t n, uint64_t seed)
{
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    for (uint64_t i = 0; i < n; i++) {
        switch (d) {
        case SC_F8E4M3: p[i] = f_to_e4m3((float)uniform(&rng, -400, 400)); break;
        case SC_F8E5M2: p[i] = f_to_e5m2((float)uniform(&rng, -5e4, 5e4)); break;
        case SC_BF16: {
            const uint16_t b = f2bf((float)uniform(&rng, -4, 4));
            memcpy(p + 2 * i, &b, 2);
            break;
        }
        case SC_F32: {
            const float f = (float)uniform(&rng, -4, 4);
            memcpy(p + 4 * i, &f, 4);
            break;
        }
        default: p[i] = (uint8_t)(test_rand(&rng) >> 56); break;
        }
    }
}

static bool is_nan(sc_dtype d, const uint8_t *p)
{
    if (d == SC_BF16) {
        uint16_t b;
        memcpy(&b, p, 2);
        return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    }
    uint32_t u;
    memcpy(&u, p, 4);
    return (u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu) != 0;
}

/* Where byte o of the box (its dense, innermost-first layout) lies in shared memory. */
static uint64_t swizzled(sc_tensor_swizzle s, uint64_t o)
{
    static const uint64_t bits[] = {0, 1, 3, 7};
    return o ^ (((o >> 7) & bits[s]) << 4);
}

static sc_buffer make(sc_dtype dtype, uint64_t count, const char *label)
{
    sc_buffer b;
    sc_status s = sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                          .label = label},
                                   &b);
    if (s != SC_OK)
        fprintf(stderr, "%s: %s\n", label, sc_last_error());
    REQUIRE(s == SC_OK);
    return b;
}

/* Compare the boxes the GPU wrote (got: n_boxes x the box's bytes, done: each block's
 * status) with the CPU gather from the view's values (view), box by box in shared-memory
 * order: the number of mismatches (the first few printed); *oob counts the elements outside
 * the array. s: the strides in elements, n: elements per dimension of a box. */
static uint64_t check_boxes(const tcase *t, const uint64_t s[5], const uint64_t n[5],
                            const uint8_t *view, const uint8_t *got, const int32_t *done,
                            uint64_t *oob)
{
    const uint64_t es = sc_dtype_size(t->dtype);
    uint64_t box_elems = 1;
    for (uint32_t i = 0; i < t->rank; i++)
        box_elems *= n[i];
    const uint64_t box_bytes = box_elems * es;
    uint64_t bad = 0;
    *oob = 0;
    for (int b = 0; b < t->n_boxes; b++) {
        if (done[b] != 1) {
            fprintf(stderr, "%s: box %d: status %d (1: copied, 2: the barrier timed out)\n",
                    t->name, b, done[b]);
            bad++;
            continue;
        }
        for (uint64_t l = 0; l < box_elems; l++) {
            uint64_t rem = l, elem = 0;
            bool outside = false;
            int64_t g[5] = {0};
            for (uint32_t i = 0; i < t->rank; i++) {
                const uint64_t j = rem % n[i];
                rem /= n[i];
                const uint32_t e = t->estrides[i] ? t->estrides[i] : 1;
                g[i] = (int64_t)t->coords[b][i] + (int64_t)(j * e);
                if (g[i] < 0 || g[i] >= (int64_t)t->dims[i])
                    outside = true;
                else
                    elem += (uint64_t)g[i] * s[i];
            }
            const uint8_t *p = got + (uint64_t)b * box_bytes + swizzled(t->swizzle, l * es);
            bool ok;
            if (outside) {
                (*oob)++;
                static const uint8_t zeros[8] = {0};
                ok = t->fill == SC_OOB_FILL_NAN ? is_nan(t->dtype, p)
                                                : memcmp(p, zeros, es) == 0;
            } else {
                ok = memcmp(p, view + elem * es, es) == 0;
            }
            if (!ok && bad++ < 5) {
                fprintf(stderr, "%s: box %d at {%d, %d, %d, %d, %d}, element %llu (coordinate "
                                "{%lld, %lld, %lld, %lld, %lld}, %s): got 0x",
                        t->name, b, t->coords[b][0], t->coords[b][1], t->coords[b][2],
                        t->coords[b][3], t->coords[b][4], (unsigned long long)l,
                        (long long)g[0], (long long)g[1], (long long)g[2], (long long)g[3],
                        (long long)g[4], outside ? "outside" : "inside");
                for (uint64_t k = es; k-- > 0;)
                    fprintf(stderr, "%02x", p[k]);
                fprintf(stderr, "\n");
            }
        }
    }
    return bad;
}

/* ---- one case ----------------------------------------------------------------------------- */

static void run_case(const tcase *t, uint64_t seed)
{
    const uint64_t es = sc_dtype_size(t->dtype);
    uint64_t s[5] = {1}, last = 0, n[5], box_elems = 1;
    for (uint32_t i = 1; i < t->rank; i++)
        s[i] = t->strides[i] ? t->strides[i] : t->dims[i - 1] * s[i - 1];
    for (uint32_t i = 0; i < t->rank; i++) {
        last += (t->dims[i] - 1) * s[i];
        const uint32_t e = t->estrides[i] ? t->estrides[i] : 1;
        n[i] = (t->box[i] + e - 1) / e;
        box_elems *= n[i];
    }
    const uint64_t box_bytes = box_elems * es;
    REQUIRE(box_bytes + 1024 <= 48 * 1024);
    for (int b = 0; b < t->n_boxes; b++)
        REQUIRE(((int64_t)t->coords[b][0] * (int64_t)es) % 16 == 0); /* the case's own rule */

    /* The view: 256 bytes into its buffer, the array and (general form) 40 more elements. */
    const uint64_t offset = 256 / es, count = last + 1 + (t->form_2d ? 0 : 40);
    const uint64_t total = offset + count + 64;
    uint8_t *host = test_xmalloc(total * es);
    fill_values(t->dtype, host, total, seed);
    sc_buffer src = make(t->dtype, total, t->name);
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(src), host, total * es));
    sc_view v;
    CHECK_OK(sc_buffer_view(src, offset, count, &v));

    sc_tensor_map_desc d = {.swizzle = t->swizzle, .oob_fill = t->fill, .l2_promotion = t->l2};
    memcpy(d.element_strides, t->estrides, sizeof d.element_strides);
    if (t->form_2d) {
        d.rows = t->dims[1];
        d.cols = t->dims[0];
        d.row_stride = t->strides[1];
        d.box_rows = t->box[1];
        d.box_cols = t->box[0];
    } else {
        d.rank = t->rank;
        memcpy(d.dims, t->dims, sizeof d.dims);
        memcpy(d.strides, t->strides, sizeof d.strides);
        memcpy(d.box, t->box, sizeof d.box);
    }
    sc_tensor_map map;
    sc_status st = sc_tensor_map_encode(v, &d, &map);
    if (st != SC_OK) {
        fprintf(stderr, "%s: sc_tensor_map_encode: %s: %s\n", t->name, sc_status_name(st),
                sc_last_error());
        test_failures++;
        CHECK_OK(sc_buffer_destroy(src));
        free(host);
        return;
    }

    int32_t coords[MAX_BOXES * 5] = {0};
    memcpy(coords, t->coords, sizeof t->coords[0] * (size_t)t->n_boxes);
    sc_buffer cb = make(SC_I32, (uint64_t)t->n_boxes * 5, "coords");
    sc_buffer out = make(SC_U8, (uint64_t)t->n_boxes * box_bytes, "boxes");
    sc_buffer status = make(SC_I32, (uint64_t)t->n_boxes, "status");
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(cb), coords,
                               sizeof coords[0] * 5 * (size_t)t->n_boxes));
    const uint8_t poison = POISON_BYTE;
    const int32_t zero = 0;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(out), &poison));
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(status), &zero));
    const sc_launch_desc cfg = {.grid = {(uint32_t)t->n_boxes, 1, 1}, .block = {128, 1, 1},
                                .shared_bytes = (uint32_t)(box_bytes + 1024)};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, kern, &cfg, sc_arg_tensor_map_in(&map),
                       sc_arg_i32((int32_t)t->rank), sc_arg_in(sc_view_of(cb)),
                       sc_arg_u32((uint32_t)box_bytes), sc_arg_out(sc_view_of(out)),
                       sc_arg_out(sc_view_of(status))));
    uint8_t *got = test_xmalloc(t->n_boxes * box_bytes);
    int32_t done[MAX_BOXES] = {0};
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, t->n_boxes * box_bytes, sc_view_of(out)));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, done, sizeof done[0] * (size_t)t->n_boxes,
                             sc_view_of(status)));

    uint64_t oob = 0;
    const uint64_t bad = check_boxes(t, s, n, host + offset * es, got, done, &oob);
    const uint64_t all = (uint64_t)t->n_boxes * box_elems;
    printf("  %-22s rank %u %-7s %d boxes of %llu bytes: %llu elements, %llu outside, %s\n",
           t->name, t->rank, sc_dtype_name(t->dtype), t->n_boxes,
           (unsigned long long)box_bytes, (unsigned long long)all, (unsigned long long)oob,
           bad ? "MISMATCH" : "ok");
    CHECK(bad == 0);
    CHECK(oob > 0 && oob < all); /* each case reads both inside and outside the array */

    /* The map's buffer destroyed: the launch is refused (stale), nothing runs. */
    CHECK_OK(sc_buffer_destroy(src));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, kern, &cfg, sc_arg_tensor_map_in(&map),
                         sc_arg_i32((int32_t)t->rank), sc_arg_in(sc_view_of(cb)),
                         sc_arg_u32((uint32_t)box_bytes), sc_arg_out(sc_view_of(out)),
                         sc_arg_out(sc_view_of(status))),
               SC_ERR_STALE_HANDLE, "sc_kernel_launch");
    CHECK_OK(sc_buffer_destroy(cb));
    CHECK_OK(sc_buffer_destroy(out));
    CHECK_OK(sc_buffer_destroy(status));
    free(got);
    free(host);
}

static void test_copies(void)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i], (uint64_t)time(NULL) * 1000 + i);
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK_OK(sc_context_check(ctx));
}

static void test_refusals(void)
{
    tensor_map_desc_checks(ctx);
    CHECK_OK(sc_context_check(ctx));
}

int main(void)
{
    gpu_require();
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("skipped: %s\n", sc_last_error());
        return TEST_SKIP;
    }
    char cache[] = "/tmp/safecuda-test-tmap-cache-XXXXXX";
    REQUIRE(mkdtemp(cache) != NULL);
    REQUIRE(setenv("SAFECUDA_CACHE_DIR", cache, 1) == 0);
    sc_device_props dev;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    REQUIRE(sc_device_info(0, &dev) == SC_OK);
    printf("%s (sm_%d%d), NVRTC %d.%d\n", dev.name, dev.cc_major, dev.cc_minor, major, minor);
    if (dev.cc_major < 9) {
        sc_buffer b = make(SC_F32, 256, "pre-sm90");
        sc_tensor_map m;
        CHECK_FAIL(sc_tensor_map_encode(sc_view_of(b),
                                        &(sc_tensor_map_desc){.rank = 1, .dims = {256},
                                                              .box = {16}},
                                        &m),
                   SC_ERR_NOT_SUPPORTED, "sc_tensor_map_encode");
        CHECK_MSG("sm_90");
        CHECK_OK(sc_buffer_destroy(b));
    } else {
        sc_program prog = {0};
        sc_status s = sc_program_create(ctx, &(sc_program_desc){.source = tmap_nd_src,
                                                                .name = "tensor_map_nd.cu"},
                                        &prog);
        if (s != SC_OK)
            fprintf(stderr, "%s\n", sc_last_error());
        REQUIRE(s == SC_OK);
        sc_module mod;
        REQUIRE(sc_module_load(ctx, prog, &mod) == SC_OK);
        CHECK_OK(sc_program_destroy(prog));
        REQUIRE(sc_kernel_get(mod, "tmap_boxes", &kern) == SC_OK);
        TEST_RUN(test_copies);
        TEST_RUN(test_refusals);
        CHECK_OK(sc_module_destroy(mod));
    }
    CHECK_OK(sc_context_synchronize(ctx));
    CHECK_OK(sc_context_check(ctx));
    CHECK_OK(sc_context_destroy(ctx));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", cache);
    return test_result("test_gpu_tensor_map_nd");
}
