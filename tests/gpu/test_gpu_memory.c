/* Owned GPU memory on a real GPU: round trips of random data for every dtype and size
 * (pageable, pinned, device to device), views and sub-views at unaligned offsets, bounds
 * and overflow checks with their messages, type and overlap checks, fills, zeroed
 * buffers, stale handles, buffer info, budgets, out-of-memory, accounting, 10^5 create/
 * destroy cycles without leaking VRAM, leak reports, and destroying or rewriting memory
 * while copies that use it are still in flight.
 *
 * SAFECUDA_UNDER_SANITIZER (set when run under compute-sanitizer, ~50x slower) shrinks
 * the heavy parts: no 2^28-element round trips, 10^3 instead of 10^5 cycles and 64 MiB
 * instead of 1 GiB / 256 MiB for the in-flight copies. */
#include <ctype.h>
#include <inttypes.h>
#include <time.h>

#include "../test.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

static bool sanitizer;
static sc_context ctx; /* the context most tests share */

static const sc_dtype all_dtypes[] = {SC_U8,  SC_I8,  SC_U16, SC_I16,  SC_U32, SC_I32,
                                      SC_U64, SC_I64, SC_F16, SC_BF16, SC_F32, SC_F64};
#define N_DTYPES (sizeof all_dtypes / sizeof all_dtypes[0])

/* ---- helpers ------------------------------------------------------------------------------ */


static bool all_bytes(const void *p, uint8_t value, size_t n, const char *what)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != value) {
            fprintf(stderr, "%s: byte %zu is 0x%02x, expected 0x%02x\n", what, i, b[i], value);
            return false;
        }
    return true;
}

/* n appears in msg as a whole decimal integer. */
static bool has_number(const char *msg, uint64_t n)
{
    char num[32];
    snprintf(num, sizeof num, "%" PRIu64, n);
    size_t len = strlen(num);
    for (const char *p = strstr(msg, num); p; p = strstr(p + 1, num)) {
        bool left = p == msg || !isdigit((unsigned char)p[-1]);
        bool right = !isdigit((unsigned char)p[len]);
        if (left && right)
            return true;
    }
    return false;
}
#define CHECK_MSG_NUMBER(n)                                                                 \
    do {                                                                                    \
        if (!has_number(sc_last_error(), (n))) {                                            \
            fprintf(stderr, "%s:%d: message lacks the number %" PRIu64 ": %s\n", __FILE__,  \
                    __LINE__, (uint64_t)(n), sc_last_error());                              \
            test_failures++;                                                                \
        }                                                                                   \
    } while (0)

static sc_buffer make_buffer_in(sc_context c, sc_dtype dt, uint64_t count, const char *label)
{
    sc_buffer b = {0};
    sc_buffer_desc d = {.dtype = dt, .count = count, .label = label};
    REQUIRE(sc_buffer_create(c, &d, &b) == SC_OK);
    REQUIRE(b.id != 0);
    return b;
}
static sc_buffer make_buffer(sc_dtype dt, uint64_t count, const char *label)
{
    return make_buffer_in(ctx, dt, count, label);
}

static sc_host_buffer make_host(sc_context c, uint64_t bytes, const char *label)
{
    sc_host_buffer h = {0};
    sc_host_buffer_desc d = {.bytes = bytes, .label = label};
    REQUIRE(sc_host_buffer_create(c, &d, &h) == SC_OK);
    REQUIRE(h.id != 0);
    return h;
}

static sc_stream make_stream(sc_context c, const char *label)
{
    sc_stream s = {0};
    sc_stream_desc d = {.label = label};
    REQUIRE(sc_stream_create(c, &d, &s) == SC_OK);
    return s;
}

static sc_view view(sc_buffer b, uint64_t offset, uint64_t count)
{
    sc_view v = {{0}, 0, 0};
    sc_status s = sc_buffer_view(b, offset, count, &v);
    if (s != SC_OK)
        fprintf(stderr, "view [%" PRIu64 ", +%" PRIu64 "): %s\n", offset, count, sc_last_error());
    REQUIRE(s == SC_OK);
    return v;
}

/* Upload random bytes to a whole buffer and return them (malloc'd). */
static uint8_t *upload_random(sc_stream s, sc_buffer b, uint64_t bytes, uint64_t seed)
{
    uint8_t *p = test_xmalloc(bytes);
    test_fill_random(p, bytes, seed);
    CHECK_OK(sc_copy_from_host(s, sc_view_of(b), p, bytes));
    return p;
}

/* Download a whole buffer into a fresh, poisoned array. */
static uint8_t *download(sc_stream s, sc_buffer b, uint64_t bytes)
{
    uint8_t *p = test_xmalloc(bytes);
    memset(p, 0xA5, bytes);
    CHECK_OK(sc_copy_to_host(s, p, bytes, sc_view_of(b)));
    return p;
}

/* ---- round trips ---------------------------------------------------------------------------- */

/* One dtype and size: pageable up and down, a pinned host buffer up and down (at an
 * unaligned byte offset inside a shared one, and for small sizes through one of exactly
 * the right size), then device to device. Each leg uses fresh random data and a poisoned
 * destination. */
static void roundtrip_case(sc_stream s, sc_dtype dt, uint64_t count, sc_host_buffer big,
                           uint8_t *src, uint8_t *dst)
{
    size_t es = sc_dtype_size(dt);
    uint64_t bytes = count * es;
    uint64_t seed = ((uint64_t)dt << 48) ^ (count * 1000003ull) ^ 0x5EED;
    char what[96], label[64];
    snprintf(label, sizeof label, "rt %s x %" PRIu64, sc_dtype_name(dt), count);
    sc_buffer b = make_buffer(dt, count, label);

    /* Pageable. */
    test_fill_random(src, bytes, seed);
    CHECK_OK(sc_copy_from_host(s, sc_view_of(b), src, bytes));
    memset(dst, 0xA5, bytes);
    CHECK_OK(sc_copy_to_host(s, dst, bytes, sc_view_of(b)));
    snprintf(what, sizeof what, "%s pageable", label);
    CHECK_BYTES(dst, src, bytes, what);

    /* Pinned, inside the shared host buffer at an odd byte offset. */
    uint64_t hoff = 1 + seed % 61;
    test_fill_random(src, bytes, seed + 1);
    CHECK_OK(sc_host_buffer_write(big, hoff, src, bytes));
    CHECK_OK(sc_copy_from_host_buffer(s, sc_view_of(b), big, hoff));
    void *hp = NULL;
    uint64_t hbytes = 0;
    CHECK_OK(sc_host_buffer_ptr(big, &hp, &hbytes)); /* waits for the upload */
    REQUIRE(hp != NULL && hbytes >= hoff + bytes + 1);
    uint8_t *h = hp;
    memset(h + hoff, 0xA5, bytes);
    h[hoff - 1] = 0x3C;
    h[hoff + bytes] = 0xC3;
    CHECK_OK(sc_copy_to_host_buffer(s, big, hoff, sc_view_of(b)));
    memset(dst, 0xA5, bytes);
    CHECK_OK(sc_host_buffer_read(big, hoff, dst, bytes)); /* waits for the download */
    snprintf(what, sizeof what, "%s pinned (read)", label);
    CHECK_BYTES(dst, src, bytes, what);
    CHECK_OK(sc_host_buffer_ptr(big, &hp, &hbytes)); /* fetched again after the copy */
    h = hp;
    snprintf(what, sizeof what, "%s pinned (ptr)", label);
    CHECK_BYTES(h + hoff, src, bytes, what);
    CHECK(h[hoff - 1] == 0x3C && h[hoff + bytes] == 0xC3); /* neighbours kept */

    /* Pinned, a host buffer of exactly the size (small sizes: a pinned allocation each). */
    if (bytes <= 16 * MiB) {
        sc_host_buffer hx = make_host(ctx, bytes, "rt exact");
        test_fill_random(src, bytes, seed + 2);
        CHECK_OK(sc_host_buffer_write(hx, 0, src, bytes));
        CHECK_OK(sc_copy_from_host_buffer(s, sc_view_of(b), hx, 0));
        CHECK_OK(sc_host_buffer_ptr(hx, &hp, &hbytes));
        CHECK(hbytes == bytes);
        memset(hp, 0xA5, bytes);
        CHECK_OK(sc_copy_to_host_buffer(s, hx, 0, sc_view_of(b)));
        memset(dst, 0xA5, bytes);
        CHECK_OK(sc_host_buffer_read(hx, 0, dst, bytes));
        snprintf(what, sizeof what, "%s pinned exact", label);
        CHECK_BYTES(dst, src, bytes, what);
        CHECK_OK(sc_host_buffer_destroy(hx));
    }

    /* Device to device (b holds the latest src). */
    sc_buffer c = make_buffer(dt, count, "rt d2d");
    CHECK_OK(sc_copy(s, sc_view_of(c), sc_view_of(b)));
    memset(dst, 0xA5, bytes);
    CHECK_OK(sc_copy_to_host(s, dst, bytes, sc_view_of(c)));
    snprintf(what, sizeof what, "%s device to device", label);
    CHECK_BYTES(dst, src, bytes, what);

    CHECK_OK(sc_buffer_destroy(c));
    CHECK_OK(sc_buffer_destroy(b));
}

static void test_roundtrips(void)
{
    /* 2^28 elements only for dtypes of at most 4 bytes (1 GiB at most per array), and not
     * under the sanitizer: this keeps the run short and host memory under ~4 GiB. */
    const uint64_t sizes[] = {1, 7, 4096, (1ull << 20) + 3, 1ull << 28};
    size_t n_sizes = sizeof sizes / sizeof sizes[0];
    uint64_t max_bytes = sanitizer ? ((1ull << 20) + 3) * 8 : (1ull << 28) * 4;
    uint8_t *src = test_xmalloc(max_bytes), *dst = test_xmalloc(max_bytes);
    sc_host_buffer big = make_host(ctx, max_bytes + 64, "rt shared pinned");
    sc_stream own = make_stream(ctx, "rt stream");

    for (size_t si = 0; si < n_sizes; si++) {
        double t0 = test_now_s();
        int cases = 0;
        for (size_t di = 0; di < N_DTYPES; di++) {
            sc_dtype dt = all_dtypes[di];
            if (sizes[si] == 1ull << 28 && (sanitizer || sc_dtype_size(dt) > 4))
                continue;
            /* Alternate between the default stream and a stream of our own. */
            roundtrip_case(di % 2 ? own : SC_DEFAULT_STREAM, dt, sizes[si], big, src, dst);
            cases++;
        }
        printf("round trips of %" PRIu64 " elements: %d dtypes in %.2f s\n", sizes[si], cases,
               test_now_s() - t0);
    }
    CHECK_OK(sc_stream_destroy(own));
    CHECK_OK(sc_host_buffer_destroy(big));
    free(src);
    free(dst);
}

/* ---- views -------------------------------------------------------------------------------- */

static void test_views(void)
{
    const uint64_t N = 4096;
    for (size_t di = 0; di < N_DTYPES; di++) {
        sc_dtype dt = all_dtypes[di];
        size_t es = sc_dtype_size(dt);
        char what[64];
        snprintf(what, sizeof what, "views %s", sc_dtype_name(dt));
        sc_buffer b = make_buffer(dt, N, "views b");
        sc_buffer c = make_buffer(dt, N, "views c");
        uint8_t *expect_b = upload_random(SC_DEFAULT_STREAM, b, N * es, 100 + di);
        uint8_t *expect_c = upload_random(SC_DEFAULT_STREAM, c, N * es, 200 + di);

        sc_view v, w;
        CHECK_OK(sc_buffer_view(b, 3, 1000, &v));
        CHECK(v.buffer.id == b.id && v.offset == 3 && v.count == 1000);
        CHECK_OK(sc_view_sub(v, 5, 17, &w));
        CHECK(w.buffer.id == b.id && w.offset == 8 && w.count == 17);

        /* Upload 17 elements into [8, 25): exactly those change. */
        uint8_t patch[17 * 8], got[17 * 8];
        test_fill_random(patch, 17 * es, 300 + di);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, w, patch, 17 * es));
        memcpy(expect_b + 8 * es, patch, 17 * es);
        uint8_t *all = download(SC_DEFAULT_STREAM, b, N * es);
        CHECK_BYTES(all, expect_b, N * es, what);
        free(all);
        memset(got, 0xA5, sizeof got);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, 17 * es, w));
        CHECK_BYTES(got, patch, 17 * es, what);

        /* Device to device into the last 17 elements of c. */
        sc_view tail = view(c, N - 17, 17);
        CHECK_OK(sc_copy(SC_DEFAULT_STREAM, tail, w));
        memcpy(expect_c + (N - 17) * es, patch, 17 * es);
        /* And an unaligned 1000-element range of b to c's [1, 1001). */
        CHECK_OK(sc_copy(SC_DEFAULT_STREAM, view(c, 1, 1000), v));
        memcpy(expect_c + 1 * es, expect_b + 3 * es, 1000 * es);
        all = download(SC_DEFAULT_STREAM, c, N * es);
        CHECK_BYTES(all, expect_c, N * es, what);
        free(all);

        /* SC_WHOLE forms give explicit counts. */
        sc_view x;
        CHECK_OK(sc_buffer_view(b, 3, SC_WHOLE, &x));
        CHECK(x.offset == 3 && x.count == N - 3);
        CHECK_OK(sc_view_sub(v, 5, SC_WHOLE, &x));
        CHECK(x.offset == 8 && x.count == 995);
        CHECK_OK(sc_view_sub(sc_view_of(b), 10, 20, &x));
        CHECK(x.offset == 10 && x.count == 20);
        CHECK_OK(sc_view_sub(sc_view_of(b), 0, SC_WHOLE, &x));
        CHECK(x.offset == 0 && x.count == N);
        sc_view hand = {b, N - 6, SC_WHOLE}; /* made by hand: resolved at use */
        memset(got, 0xA5, sizeof got);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, 6 * es, hand));
        CHECK_BYTES(got, expect_b + (N - 6) * es, 6 * es, what);

        /* Zero-element views are no-ops (also the empty range at the very end). */
        sc_view z1, z2;
        CHECK_OK(sc_buffer_view(b, 10, 0, &z1));
        CHECK_OK(sc_buffer_view(b, N, 0, &z2));
        CHECK(z1.count == 0 && z2.count == 0);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, z1, patch, 0));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, 0, z2));
        CHECK_OK(sc_fill(SC_DEFAULT_STREAM, z1, patch));
        CHECK_OK(sc_copy(SC_DEFAULT_STREAM, view(c, 5, 0), z2));
        all = download(SC_DEFAULT_STREAM, b, N * es);
        CHECK_BYTES(all, expect_b, N * es, what);
        free(all);

        CHECK_OK(sc_buffer_destroy(b));
        CHECK_OK(sc_buffer_destroy(c));
        free(expect_b);
        free(expect_c);
    }
}

/* ---- bounds and overflow -------------------------------------------------------------------- */

/* The message names the function, the buffer (label and creation site) and, when the
 * range overlaps the buffer, the element range ("[a, b)"); an offset past the end may be
 * reported as just that offset. */
static void check_range_msg(const char *fn, bool range, int line)
{
    const char *m = sc_last_error();
    const char *need[] = {fn, "oob-buf", "created at test_gpu_memory.c", "["};
    for (int i = 0; i < (range ? 4 : 3); i++)
        if (!strstr(m, need[i])) {
            fprintf(stderr, "line %d: message lacks \"%s\": %s\n", line, need[i], m);
            test_failures++;
        }
}
#define CHECK_OOB(expr, fn)                                   \
    do {                                                      \
        CHECK_STATUS(expr, SC_ERR_OUT_OF_BOUNDS);             \
        check_range_msg(fn, true, __LINE__);                  \
    } while (0)
#define CHECK_OOB_OFFSET(expr, fn)                            \
    do {                                                      \
        CHECK_STATUS(expr, SC_ERR_OUT_OF_BOUNDS);             \
        check_range_msg(fn, false, __LINE__);                 \
    } while (0)

#define CHECK_OVERFLOW_OR_OOB(expr)                                                      \
    do {                                                                                 \
        sc_status got_ = (expr);                                                         \
        if (got_ != SC_ERR_OVERFLOW && got_ != SC_ERR_OUT_OF_BOUNDS) {                   \
            fprintf(stderr, "%s:%d: %s returned %s, expected overflow or out of bounds\n", \
                    __FILE__, __LINE__, #expr, sc_status_name(got_));                    \
            test_failures++;                                                             \
        }                                                                                \
    } while (0)

static void test_bounds(void)
{
    const uint64_t N = 1000;
    sc_buffer b = make_buffer(SC_F32, N, "oob-buf");
    sc_buffer c = make_buffer(SC_F32, N, "oob-other");
    sc_host_buffer h = make_host(ctx, N * 4, "oob-host");
    uint8_t *expect = upload_random(SC_DEFAULT_STREAM, b, N * 4, 400);
    uint8_t *src = test_xmalloc((N + 1) * 4), *dst = test_xmalloc((N + 1) * 4);
    test_fill_random(src, (N + 1) * 4, 401);
    sc_view v = {{0}, 0, 0}, w;
    float f = 2.5f;

    /* Checked view creation: one element past either end. */
    CHECK_OOB(sc_buffer_view(b, 0, N + 1, &v), "sc_buffer_view");
    CHECK_OOB(sc_buffer_view(b, 1, N, &v), "sc_buffer_view");
    CHECK_OOB(sc_buffer_view(b, N, 1, &v), "sc_buffer_view");
    CHECK_OOB_OFFSET(sc_buffer_view(b, N + 1, 0, &v), "sc_buffer_view");
    CHECK_OOB_OFFSET(sc_buffer_view(b, N + 1, SC_WHOLE, &v), "sc_buffer_view");
    CHECK_OK(sc_buffer_view(b, 0, N, &v));
    CHECK_OK(sc_buffer_view(b, N - 1, 1, &v));
    sc_view mid = view(b, 3, 100);
    CHECK_OOB(sc_view_sub(mid, 0, 101, &w), "sc_view_sub");
    CHECK_OOB(sc_view_sub(mid, 1, 100, &w), "sc_view_sub");
    CHECK_OOB(sc_view_sub(mid, 100, 1, &w), "sc_view_sub");
    CHECK_OK(sc_view_sub(mid, 99, 1, &w));
    CHECK(w.offset == 102 && w.count == 1);

    /* Views made by hand are checked where they are used. */
    sc_view past_start = {b, 1, N}, past_end = {b, 0, N + 1}, beyond = {b, N + 1, SC_WHOLE};
    CHECK_OOB(sc_copy_from_host(SC_DEFAULT_STREAM, past_start, src, N * 4), "sc_copy_from_host");
    memset(dst, 0xA5, (N + 1) * 4);
    CHECK_OOB(sc_copy_to_host(SC_DEFAULT_STREAM, dst, (N + 1) * 4, past_end), "sc_copy_to_host");
    CHECK(all_bytes(dst, 0xA5, (N + 1) * 4, "dst after a refused copy"));
    CHECK_OOB_OFFSET(sc_copy_to_host(SC_DEFAULT_STREAM, dst, 4, beyond), "sc_copy_to_host");
    CHECK_OOB(sc_fill(SC_DEFAULT_STREAM, past_start, &f), "sc_fill");
    CHECK_OOB(sc_copy(SC_DEFAULT_STREAM, past_start, sc_view_of(c)), "sc_copy");
    CHECK_OOB(sc_copy(SC_DEFAULT_STREAM, view(c, 0, N), (sc_view){b, 0, N + 1}), "sc_copy");
    CHECK_OOB(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, past_start, h, 0),
              "sc_copy_from_host_buffer");
    CHECK_OOB(sc_copy_to_host_buffer(SC_DEFAULT_STREAM, h, 0, past_end), "sc_copy_to_host_buffer");

    /* Host byte counts one element too many or too few. */
    CHECK_OOB(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), src, (N + 1) * 4),
              "sc_copy_from_host");
    CHECK_OOB(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), src, (N - 1) * 4),
              "sc_copy_from_host");
    memset(dst, 0xA5, (N + 1) * 4);
    CHECK_OOB(sc_copy_to_host(SC_DEFAULT_STREAM, dst, (N + 1) * 4, sc_view_of(b)),
              "sc_copy_to_host");
    CHECK_OOB(sc_copy_to_host(SC_DEFAULT_STREAM, dst, (N - 1) * 4, sc_view_of(b)),
              "sc_copy_to_host");
    CHECK(all_bytes(dst, 0xA5, (N + 1) * 4, "dst after a refused copy"));
    CHECK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), src, N * 4 - 1) != SC_OK);
    CHECK(sc_copy_to_host(SC_DEFAULT_STREAM, dst, N * 4 + 1, sc_view_of(b)) != SC_OK);

    /* Ranges of the pinned buffer (N * 4 bytes). */
    CHECK_STATUS(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, sc_view_of(b), h, 4),
                 SC_ERR_OUT_OF_BOUNDS);
    CHECK_MSG("sc_copy_from_host_buffer");
    CHECK_STATUS(sc_copy_to_host_buffer(SC_DEFAULT_STREAM, h, 1, sc_view_of(b)),
                 SC_ERR_OUT_OF_BOUNDS);
    CHECK_MSG("sc_copy_to_host_buffer");
    CHECK_OVERFLOW_OR_OOB(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, sc_view_of(b), h,
                                                   UINT64_MAX - 2));
    CHECK_STATUS(sc_host_buffer_write(h, 1, src, N * 4), SC_ERR_OUT_OF_BOUNDS);
    CHECK_MSG("sc_host_buffer_write");
    CHECK_STATUS(sc_host_buffer_write(h, N * 4, src, 1), SC_ERR_OUT_OF_BOUNDS);
    CHECK_STATUS(sc_host_buffer_read(h, 0, dst, N * 4 + 1), SC_ERR_OUT_OF_BOUNDS);
    CHECK_MSG("sc_host_buffer_read");
    CHECK_OVERFLOW_OR_OOB(sc_host_buffer_write(h, UINT64_MAX, src, 2));
    CHECK_OVERFLOW_OR_OOB(sc_host_buffer_read(h, 2, dst, UINT64_MAX));

    /* Offset overflow: offset + count wraps around. */
    CHECK_OVERFLOW_OR_OOB(sc_buffer_view(b, UINT64_MAX - 1, 5, &v));
    CHECK_OVERFLOW_OR_OOB(sc_view_sub(sc_view_of(b), UINT64_MAX - 1, 5, &v));
    CHECK_OVERFLOW_OR_OOB(sc_view_sub(mid, UINT64_MAX - 1, 5, &v));
    CHECK_OVERFLOW_OR_OOB(sc_view_sub(mid, 2, UINT64_MAX - 1, &v));
    sc_view wrap = {b, UINT64_MAX - 1, 5};
    CHECK_OVERFLOW_OR_OOB(sc_copy_to_host(SC_DEFAULT_STREAM, dst, 20, wrap));
    CHECK_OVERFLOW_OR_OOB(sc_fill(SC_DEFAULT_STREAM, wrap, &f));
    CHECK_OVERFLOW_OR_OOB(sc_copy(SC_DEFAULT_STREAM, view(c, 0, 5), wrap));
    CHECK_OVERFLOW_OR_OOB(sc_copy_from_host(SC_DEFAULT_STREAM, wrap, src, 20));

    /* Nothing refused above touched the buffer. */
    uint8_t *all = download(SC_DEFAULT_STREAM, b, N * 4);
    CHECK_BYTES(all, expect, N * 4, "buffer after refused copies");
    free(all);

    /* In bounds up to the last byte of the pinned buffer. */
    test_fill_random(src, N * 4, 402);
    CHECK_OK(sc_host_buffer_write(h, 0, src, N * 4));
    CHECK_OK(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, view(b, 0, N - 1), h, 4));
    memcpy(expect, src + 4, (N - 1) * 4);
    all = download(SC_DEFAULT_STREAM, b, N * 4);
    CHECK_BYTES(all, expect, N * 4, "copy from the end of a pinned buffer");
    free(all);

    CHECK_OK(sc_host_buffer_destroy(h));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_buffer_destroy(c));
    free(expect);
    free(src);
    free(dst);
}

/* ---- copy checks: types, sizes, overlap, contexts ------------------------------------------- */

static void test_copy_checks(void)
{
    sc_buffer f = make_buffer(SC_F32, 64, "tm-f32");
    sc_buffer i = make_buffer(SC_I32, 64, "tm-i32");
    sc_buffer u = make_buffer(SC_U32, 64, "tm-u32");
    sc_buffer h16 = make_buffer(SC_F16, 64, "tm-f16");
    sc_buffer b16 = make_buffer(SC_BF16, 64, "tm-bf16");
    uint8_t *fi = upload_random(SC_DEFAULT_STREAM, f, 256, 500);
    uint8_t *ii = upload_random(SC_DEFAULT_STREAM, i, 256, 501);

    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, sc_view_of(i), sc_view_of(f)), SC_ERR_TYPE_MISMATCH);
    CHECK_MSG("sc_copy");
    CHECK_MSG("f32");
    CHECK_MSG("i32");
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, sc_view_of(u), sc_view_of(f)), SC_ERR_TYPE_MISMATCH);
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, sc_view_of(b16), sc_view_of(h16)),
                 SC_ERR_TYPE_MISMATCH);
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, view(i, 0, 8), view(f, 8, 8)), SC_ERR_TYPE_MISMATCH);
    uint8_t *got = download(SC_DEFAULT_STREAM, i, 256);
    CHECK_BYTES(got, ii, 256, "i32 buffer after a refused copy");
    free(got);

    /* Element counts that differ. */
    sc_status s = sc_copy(SC_DEFAULT_STREAM, sc_view_of(f), view(f, 0, 63));
    CHECK(s == SC_ERR_OUT_OF_BOUNDS || s == SC_ERR_INVALID_ARGUMENT);
    sc_buffer f2 = make_buffer(SC_F32, 64, "tm-f32-b");
    s = sc_copy(SC_DEFAULT_STREAM, view(f2, 0, 10), view(f, 0, 11));
    printf("sc_copy with 10 vs 11 elements: %s\n", sc_status_name(s));
    CHECK(s == SC_ERR_OUT_OF_BOUNDS || s == SC_ERR_INVALID_ARGUMENT);

    /* Overlapping views of one buffer are refused; adjacent ones are fine. */
    const uint64_t N = 256;
    sc_buffer o = make_buffer(SC_U8, N, "overlap");
    uint8_t *oo = upload_random(SC_DEFAULT_STREAM, o, N, 502);
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, view(o, 0, 100), view(o, 50, 100)),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_copy");
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, view(o, 50, 100), view(o, 0, 100)),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, sc_view_of(o), sc_view_of(o)), SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, view(o, 0, 51), view(o, 50, 51)),
                 SC_ERR_INVALID_ARGUMENT); /* one shared element */
    sc_view sub;
    CHECK_OK(sc_view_sub(view(o, 10, 100), 5, 20, &sub)); /* [15, 35) */
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, view(o, 30, 20), sub), SC_ERR_INVALID_ARGUMENT);
    got = download(SC_DEFAULT_STREAM, o, N);
    CHECK_BYTES(got, oo, N, "buffer after refused overlapping copies");
    free(got);
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, view(o, 0, 50), view(o, 50, 50)));
    memmove(oo, oo + 50, 50);
    got = download(SC_DEFAULT_STREAM, o, N);
    CHECK_BYTES(got, oo, N, "adjacent views copy");
    free(got);

    /* Buffers of another context. */
    sc_context other;
    REQUIRE(sc_context_create(NULL, &other) == SC_OK);
    sc_buffer x = make_buffer_in(other, SC_F32, 64, "other-ctx");
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, sc_view_of(x), sc_view_of(f)), SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_copy(SC_DEFAULT_STREAM, sc_view_of(f), sc_view_of(x)), SC_ERR_WRONG_CONTEXT);
    got = download(SC_DEFAULT_STREAM, f, 256);
    CHECK_BYTES(got, fi, 256, "buffer after a refused cross-context copy");
    free(got);
    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_context_destroy(other));

    sc_buffer all[] = {f, i, u, h16, b16, f2, o};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        CHECK_OK(sc_buffer_destroy(all[k]));
    free(fi);
    free(ii);
    free(oo);
}

/* ---- fills ---------------------------------------------------------------------------------- */

/* One element of dtype dt as bytes: a distinctive value, and a second one (its bitwise
 * complement) for a fill over a fill. */
static void fill_value(sc_dtype dt, uint8_t out[8])
{
    memset(out, 0, 8);
    switch (dt) {
    case SC_U8: { uint8_t x = 0x7f; memcpy(out, &x, 1); break; }
    case SC_I8: { int8_t x = -5; memcpy(out, &x, 1); break; }
    case SC_U16: { uint16_t x = 0xbeef; memcpy(out, &x, 2); break; }
    case SC_I16: { int16_t x = -12345; memcpy(out, &x, 2); break; }
    case SC_U32: { uint32_t x = 0xdeadbeefu; memcpy(out, &x, 4); break; }
    case SC_I32: { int32_t x = -123456789; memcpy(out, &x, 4); break; }
    case SC_U64: { uint64_t x = 0xfedcba9876543210ull; memcpy(out, &x, 8); break; }
    case SC_I64: { int64_t x = 0x0123456789abcdefll; memcpy(out, &x, 8); break; }
    case SC_F16: { uint16_t x = 0x3e00; /* 1.5 */ memcpy(out, &x, 2); break; }
    case SC_BF16: { uint16_t x = 0x3fc0; /* 1.5 */ memcpy(out, &x, 2); break; }
    case SC_F32: { float x = 1.5f; memcpy(out, &x, 4); break; }
    case SC_F64: { double x = -2.25; memcpy(out, &x, 8); break; }
    default: break;
    }
}

/* Elements [lo, hi) of got hold value; the others equal base. */
static bool check_filled(const uint8_t *got, const uint8_t *base, size_t es, uint64_t n,
                         uint64_t lo, uint64_t hi, const uint8_t *value, const char *what)
{
    for (uint64_t k = 0; k < n; k++) {
        const uint8_t *want = (k >= lo && k < hi) ? value : base + k * es;
        if (memcmp(got + k * es, want, es) != 0) {
            fprintf(stderr, "%s: element %" PRIu64 " is wrong (%s the filled range [%" PRIu64
                            ", %" PRIu64 "))\n",
                    what, k, (k >= lo && k < hi) ? "inside" : "outside", lo, hi);
            return false;
        }
    }
    return true;
}

static void test_fills(void)
{
    sc_stream s = make_stream(ctx, "fill stream");
    for (size_t di = 0; di < N_DTYPES; di++) {
        sc_dtype dt = all_dtypes[di];
        size_t es = sc_dtype_size(dt);
        uint8_t value[8], value2[8];
        fill_value(dt, value);
        for (int k = 0; k < 8; k++)
            value2[k] = (uint8_t)~value[k];
        char what[64];
        snprintf(what, sizeof what, "fill %s", sc_dtype_name(dt));

        /* A sub-view at an odd offset: the rest stays as it was. */
        const uint64_t N = 1000;
        sc_buffer b = make_buffer(dt, N, "fill small");
        uint8_t *base = upload_random(s, b, N * es, 600 + di);
        CHECK_OK(sc_fill(s, view(b, 7, 301), value));
        uint8_t *got = download(s, b, N * es);
        CHECK(check_filled(got, base, es, N, 7, 308, value, what));
        free(got);
        /* A single element, the last one. */
        CHECK_OK(sc_fill(SC_DEFAULT_STREAM, view(b, N - 1, 1), value2));
        uint8_t last[8];
        memset(last, 0xA5, sizeof last);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, last, es, view(b, N - 2, 1)));
        CHECK(memcmp(last, base + (N - 2) * es, es) == 0);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, last, es, view(b, N - 1, 1)));
        CHECK(memcmp(last, value2, es) == 0);
        CHECK_OK(sc_buffer_destroy(b));
        free(base);

        /* A large buffer: the whole of it, then all but the first and last element. */
        const uint64_t M = (1ull << 20) + 3;
        b = make_buffer(dt, M, "fill large");
        base = upload_random(s, b, M * es, 700 + di);
        CHECK_OK(sc_fill(s, sc_view_of(b), value));
        CHECK_OK(sc_fill(s, view(b, 1, M - 2), value2));
        for (uint64_t k = 0; k < M; k++) /* expected: value at both ends */
            memcpy(base + k * es, value, es);
        got = download(s, b, M * es);
        CHECK(check_filled(got, base, es, M, 1, M - 1, value2, what));
        free(got);
        CHECK_OK(sc_buffer_destroy(b));
        free(base);
    }
    /* f32 by value, to be sure of the encoding. */
    sc_buffer b = make_buffer(SC_F32, 33, "fill f32");
    float one_half = 1.5f, out[33];
    CHECK_OK(sc_fill(s, sc_view_of(b), &one_half));
    CHECK_OK(sc_copy_to_host(s, out, sizeof out, sc_view_of(b)));
    for (int k = 0; k < 33; k++)
        CHECK(out[k] == 1.5f);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_stream_destroy(s));
}

/* ---- zeroed memory -------------------------------------------------------------------------- */

static void test_zero(void)
{
    const uint64_t N = (1ull << 20) + 3;
    /* Dirty the pool first, so zeros can't come from fresh memory by chance. */
    sc_buffer d = make_buffer(SC_F32, N, "dirty");
    free(upload_random(SC_DEFAULT_STREAM, d, N * 4, 800));
    CHECK_OK(sc_buffer_destroy(d));

    sc_buffer z = {0};
    sc_buffer_desc zd = {.dtype = SC_F32, .count = N, .label = "zeroed", .zero = true};
    CHECK_OK(sc_buffer_create(ctx, &zd, &z));
    uint8_t *got = download(SC_DEFAULT_STREAM, z, N * 4);
    CHECK(all_bytes(got, 0, N * 4, "zeroed buffer"));
    free(got);
    CHECK_OK(sc_buffer_destroy(z));

    /* Zeroed on a stream of our own, and odd small sizes. */
    sc_stream s = make_stream(ctx, "zero stream");
    const uint64_t counts[] = {1, 7, 4099};
    for (int k = 0; k < 3; k++) {
        d = make_buffer(SC_U8, counts[k], "dirty small");
        free(upload_random(s, d, counts[k], 801 + (uint64_t)k));
        CHECK_OK(sc_buffer_destroy(d));
        sc_buffer_desc sd = {.dtype = SC_U8, .count = counts[k], .zero = true, .stream = s};
        CHECK_OK(sc_buffer_create(ctx, &sd, &z));
        got = download(s, z, counts[k]);
        CHECK(all_bytes(got, 0, counts[k], "zeroed small buffer"));
        free(got);
        CHECK_OK(sc_buffer_destroy(z));
    }
    CHECK_OK(sc_stream_destroy(s));

    /* Pinned host memory. */
    sc_host_buffer h = make_host(ctx, MiB + 3, "dirty host");
    uint8_t *r = test_xmalloc(MiB + 3);
    test_fill_random(r, MiB + 3, 810);
    CHECK_OK(sc_host_buffer_write(h, 0, r, MiB + 3));
    CHECK_OK(sc_host_buffer_destroy(h));
    sc_host_buffer_desc hd = {.bytes = MiB + 3, .label = "zeroed host", .zero = true};
    CHECK_OK(sc_host_buffer_create(ctx, &hd, &h));
    memset(r, 0xA5, MiB + 3);
    CHECK_OK(sc_host_buffer_read(h, 0, r, MiB + 3));
    CHECK(all_bytes(r, 0, MiB + 3, "zeroed host buffer"));
    CHECK_OK(sc_host_buffer_destroy(h));
    free(r);
}

/* ---- stale handles -------------------------------------------------------------------------- */

static void test_stale(void)
{
    sc_buffer other = make_buffer(SC_F32, 16, "stale-other");
    sc_stream s = make_stream(ctx, "stale stream");
    sc_buffer b = {0};
    sc_buffer_desc bd = {.dtype = SC_F32, .count = 16, .label = "stale-buf"};
    int line = __LINE__; CHECK_OK(sc_buffer_create(ctx, &bd, &b));
    char site[64];
    snprintf(site, sizeof site, "test_gpu_memory.c:%d", line);
    sc_view v = view(b, 1, 5), w;
    float dst[16], f = 3.0f;
    sc_buffer_props props;
    uint64_t dptr;

    CHECK_OK(sc_buffer_destroy(b));
    CHECK_STATUS(sc_buffer_info(b, &props), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_buffer_info");
    CHECK_MSG("was destroyed");
    CHECK_MSG(site);
    CHECK_STATUS(sc_copy_to_host(SC_DEFAULT_STREAM, dst, 20, v), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_copy_to_host");
    CHECK_MSG("was destroyed");
    CHECK_MSG("test_gpu_memory.c");
    CHECK_STATUS(sc_copy_from_host(s, v, dst, 20), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_fill(s, v, &f), SC_ERR_STALE_HANDLE);
    CHECK_MSG("was destroyed");
    CHECK_STATUS(sc_copy(s, view(other, 0, 5), v), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_copy(s, v, view(other, 0, 5)), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_view_sub(v, 0, 1, &w), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_buffer_view(b, 0, 1, &w), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_buffer_device_ptr(b, &dptr), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_buffer_destroy(b), SC_ERR_STALE_HANDLE); /* double destroy */
    CHECK_MSG("sc_buffer_destroy");
    CHECK_MSG("was destroyed");
    CHECK_MSG(site);

    sc_host_buffer h = {0};
    sc_host_buffer_desc hd = {.bytes = 64, .label = "stale-host"};
    line = __LINE__; CHECK_OK(sc_host_buffer_create(ctx, &hd, &h));
    snprintf(site, sizeof site, "test_gpu_memory.c:%d", line);
    CHECK_OK(sc_host_buffer_destroy(h));
    void *p;
    uint64_t n;
    CHECK_STATUS(sc_host_buffer_ptr(h, &p, &n), SC_ERR_STALE_HANDLE);
    CHECK_MSG("was destroyed");
    CHECK_MSG(site);
    CHECK_STATUS(sc_host_buffer_try_ptr(h, &p, &n), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_host_buffer_write(h, 0, dst, 4), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_host_buffer_read(h, 0, dst, 4), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_copy_from_host_buffer(s, view(other, 0, 4), h, 0), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_copy_to_host_buffer(s, h, 0, view(other, 0, 4)), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_host_buffer_destroy(h), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_host_buffer_destroy");
    CHECK_STATUS(sc_host_buffer_try_destroy(h), SC_ERR_STALE_HANDLE);

    /* The other objects are unaffected. */
    float in[16];
    test_fill_random(in, sizeof in, 900);
    CHECK_OK(sc_copy_from_host(s, sc_view_of(other), in, sizeof in));
    memset(dst, 0xA5, sizeof dst);
    CHECK_OK(sc_copy_to_host(s, dst, sizeof dst, sc_view_of(other)));
    CHECK_BYTES(dst, in, sizeof in, "buffer next to a stale one");
    CHECK_OK(sc_buffer_destroy(other));
    CHECK_OK(sc_stream_destroy(s));
}

/* ---- info, creation errors, device pointers ------------------------------------------------- */

static sc_object_info *find_object(sc_object_info *list, size_t n, const char *label)
{
    for (size_t k = 0; k < n; k++)
        if (strcmp(list[k].label, label) == 0)
            return &list[k];
    return NULL;
}

static void test_info(void)
{
    sc_buffer b = {0};
    sc_buffer_desc bd = {.dtype = SC_BF16, .count = 12345, .label = "info-buf"};
    int line = __LINE__; CHECK_OK(sc_buffer_create(ctx, &bd, &b));
    sc_buffer_props p;
    memset(&p, 0, sizeof p);
    CHECK_OK(sc_buffer_info(b, &p));
    CHECK(p.dtype == SC_BF16);
    CHECK(p.count == 12345);
    CHECK(p.bytes == 24690);
    CHECK(strcmp(p.label, "info-buf") == 0);
    CHECK(p.file && strcmp(p.file, "test_gpu_memory.c") == 0);
    CHECK(p.line == line);
    CHECK(p.context.id == ctx.id);

    sc_host_buffer h = {0};
    sc_host_buffer_desc hd = {.bytes = 5000, .label = "info-host"};
    int hline = __LINE__; CHECK_OK(sc_host_buffer_create(ctx, &hd, &h));

    /* The context lists both. */
    sc_object_info list[16];
    size_t n = 0;
    CHECK_OK(sc_context_live_objects(ctx, list, 16, &n));
    CHECK(n == 2);
    sc_object_info *ob = find_object(list, n < 16 ? n : 16, "info-buf");
    sc_object_info *oh = find_object(list, n < 16 ? n : 16, "info-host");
    CHECK(ob && oh);
    if (ob) {
        CHECK(strcmp(ob->kind, "buffer") == 0);
        CHECK(ob->bytes == 24690);
        CHECK(strstr(ob->detail, "bf16") != NULL);
        CHECK(strstr(ob->detail, "12345") != NULL);
        CHECK(strcmp(ob->file, "test_gpu_memory.c") == 0 && ob->line == line);
    }
    if (oh) {
        CHECK(strcmp(oh->kind, "host buffer") == 0);
        CHECK(oh->bytes == 5000);
        CHECK(strcmp(oh->file, "test_gpu_memory.c") == 0 && oh->line == hline);
    }
    CHECK_OK(sc_host_buffer_destroy(h));
    CHECK_OK(sc_buffer_destroy(b));

    /* Labels: truncated to 63 characters; none gives "". */
    char longl[101];
    memset(longl, 'q', 100);
    longl[100] = '\0';
    bd = (sc_buffer_desc){.dtype = SC_U8, .count = 3, .label = longl};
    CHECK_OK(sc_buffer_create(ctx, &bd, &b));
    CHECK_OK(sc_buffer_info(b, &p));
    CHECK(strlen(p.label) == 63 && strncmp(p.label, longl, 63) == 0);
    CHECK(p.bytes == 3 && p.dtype == SC_U8);
    CHECK_OK(sc_buffer_destroy(b));
    bd.label = NULL;
    CHECK_OK(sc_buffer_create(ctx, &bd, &b));
    CHECK_OK(sc_buffer_info(b, &p));
    CHECK(p.label[0] == '\0');
    CHECK_OK(sc_buffer_destroy(b));
}

static void test_create_errors(void)
{
    size_t live0 = 0, live1 = 0;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live0));
    sc_buffer b = {0};
    sc_buffer_desc d = {.dtype = SC_F32, .count = 0, .label = "zero-count"};
    CHECK_STATUS(sc_buffer_create(ctx, &d, &b), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_buffer_create");
    /* A failed create leaves the null handle (the stale-handle message says so). */
    CHECK(b.id == 0);
    d = (sc_buffer_desc){.dtype = SC_DTYPE_INVALID, .count = 4};
    CHECK_STATUS(sc_buffer_create(ctx, &d, &b), SC_ERR_INVALID_ARGUMENT);
    d = (sc_buffer_desc){.dtype = (sc_dtype)99, .count = 4};
    CHECK_STATUS(sc_buffer_create(ctx, &d, &b), SC_ERR_INVALID_ARGUMENT);
    d = (sc_buffer_desc){.dtype = SC_DTYPE_COUNT, .count = 4};
    CHECK_STATUS(sc_buffer_create(ctx, &d, &b), SC_ERR_INVALID_ARGUMENT);

    /* count * element size overflows 64 bits. */
    d = (sc_buffer_desc){.dtype = SC_F32, .count = UINT64_MAX / 2, .label = "huge"};
    CHECK_STATUS(sc_buffer_create(ctx, &d, &b), SC_ERR_OVERFLOW);
    CHECK_MSG("sc_buffer_create");
    CHECK(b.id == 0);
    d.count = UINT64_MAX / 4 + 1; /* exactly 2^64 bytes */
    CHECK_STATUS(sc_buffer_create(ctx, &d, &b), SC_ERR_OVERFLOW);
    d = (sc_buffer_desc){.dtype = SC_F64, .count = (UINT64_MAX >> 3) + 1};
    CHECK_STATUS(sc_buffer_create(ctx, &d, &b), SC_ERR_OVERFLOW);
    CHECK(sc_buffer_create(ctx, NULL, &b) != SC_OK);

    sc_host_buffer h = {0};
    sc_host_buffer_desc hd = {.bytes = 0, .label = "empty host"};
    CHECK_STATUS(sc_host_buffer_create(ctx, &hd, &h), SC_ERR_INVALID_ARGUMENT);
    CHECK(h.id == 0);

    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live1));
    CHECK(live1 == live0);
}

static void test_device_ptr(void)
{
    sc_buffer a = make_buffer(SC_U8, MiB, "ptr a"), b = make_buffer(SC_U8, MiB, "ptr b");
    uint64_t pa = 0, pb = 0;
    CHECK_OK(sc_buffer_device_ptr(a, &pa));
    CHECK_OK(sc_buffer_device_ptr(b, &pb));
    CHECK(pa != 0 && pb != 0);
    CHECK(pa + MiB <= pb || pb + MiB <= pa); /* distinct, non-overlapping */
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
}

/* ---- accounting, budget, out of memory ------------------------------------------------------ */

static void test_accounting(void)
{
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_memory_stats st;
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == 0 && st.peak_bytes == 0 && st.live_buffers == 0);
    CHECK(st.vram_budget == 0 && st.pinned_bytes == 0);
    CHECK(st.device_total > 0 && st.device_free > 0 && st.device_free <= st.device_total);

    sc_buffer a = make_buffer_in(c, SC_F32, MiB / 4, "acct a"); /* 1 MiB */
    sc_buffer b = make_buffer_in(c, SC_U8, 3 * MiB, "acct b");
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == 4 * MiB && st.live_buffers == 2 && st.peak_bytes == 4 * MiB);
    CHECK(st.pool_reserved >= 4 * MiB);
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == 3 * MiB && st.live_buffers == 1 && st.peak_bytes == 4 * MiB);
    sc_buffer d = make_buffer_in(c, SC_F64, MiB / 4, "acct d"); /* 2 MiB */
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == 5 * MiB && st.live_buffers == 2 && st.peak_bytes == 5 * MiB);

    sc_host_buffer h = make_host(c, MiB + 5, "acct host");
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.pinned_bytes == MiB + 5);
    CHECK(st.bytes_in_use == 5 * MiB && st.live_buffers == 2);
    CHECK_OK(sc_host_buffer_destroy(h));

    /* A refused create changes nothing. */
    sc_buffer_desc zero = {.dtype = SC_U8, .count = 0};
    sc_buffer bad;
    CHECK(sc_buffer_create(c, &zero, &bad) != SC_OK);
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == 5 * MiB && st.live_buffers == 2 && st.pinned_bytes == 0);

    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_buffer_destroy(d));
    CHECK_OK(sc_context_trim(c));
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == 0 && st.live_buffers == 0 && st.peak_bytes == 5 * MiB);
    printf("after trim: pool holds %" PRIu64 " bytes\n", st.pool_reserved);
    CHECK(st.pool_reserved == 0);
    CHECK_OK(sc_context_destroy(c));
}

static void test_budget(void)
{
    const uint64_t budget = 64 * MiB;
    sc_context c;
    REQUIRE(sc_context_create(&(sc_context_desc){.vram_budget = budget}, &c) == SC_OK);
    sc_memory_stats st;
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.vram_budget == budget);

    sc_buffer a[3];
    for (int k = 0; k < 3; k++)
        a[k] = make_buffer_in(c, SC_U8, 16 * MiB, "budget 16M");
    sc_buffer b8 = make_buffer_in(c, SC_U8, 8 * MiB, "budget 8M");
    const uint64_t in_use = 56 * MiB; /* 58720256 */

    sc_buffer x = {0};
    sc_buffer_desc over = {.dtype = SC_U8, .count = 8 * MiB + 1, .label = "over budget"};
    CHECK_STATUS(sc_buffer_create(c, &over, &x), SC_ERR_BUDGET_EXCEEDED);
    CHECK(x.id == 0);
    CHECK_MSG("sc_buffer_create");
    CHECK_MSG_NUMBER(8 * MiB + 1); /* requested */
    CHECK_MSG_NUMBER(in_use);      /* in use */
    CHECK_MSG_NUMBER(budget);      /* the budget */
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == in_use && st.live_buffers == 4);

    /* Up to the budget exactly is fine; one byte more is not. */
    sc_buffer_desc fit = {.dtype = SC_U8, .count = 8 * MiB, .label = "fits"};
    sc_buffer last = {0};
    CHECK_OK(sc_buffer_create(c, &fit, &last));
    sc_buffer_desc one = {.dtype = SC_U8, .count = 1, .label = "one byte"};
    CHECK_STATUS(sc_buffer_create(c, &one, &x), SC_ERR_BUDGET_EXCEEDED);
    CHECK_MSG_NUMBER(budget);
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == budget && st.live_buffers == 5);

    /* The context still works at its budget. */
    CHECK_OK(sc_context_check(c));
    uint8_t *r = upload_random(SC_DEFAULT_STREAM, b8, 8 * MiB, 1000);
    uint8_t *got = download(SC_DEFAULT_STREAM, b8, 8 * MiB);
    CHECK_BYTES(got, r, 8 * MiB, "round trip at the budget");
    free(r);
    free(got);

    /* Freeing makes room again. */
    CHECK_OK(sc_buffer_destroy(a[0]));
    CHECK_OK(sc_buffer_create(c, &over, &x));
    CHECK(x.id != 0);
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == budget - 16 * MiB + 8 * MiB + 1 && st.live_buffers == 5);

    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_buffer_destroy(last));
    CHECK_OK(sc_buffer_destroy(b8));
    CHECK_OK(sc_buffer_destroy(a[1]));
    CHECK_OK(sc_buffer_destroy(a[2]));
    CHECK_OK(sc_context_destroy(c));
}

static void test_oom(void)
{
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_device_props props;
    CHECK_OK(sc_device_info(0, &props));
    sc_buffer x = {0};
    sc_buffer_desc d = {.dtype = SC_U8, .count = props.total_memory + GiB, .label = "too big"};
    CHECK_STATUS(sc_buffer_create(c, &d, &x), SC_ERR_OUT_OF_MEMORY);
    printf("out of memory: %s\n", sc_last_error());
    CHECK_MSG("sc_buffer_create");
    CHECK(x.id == 0);

    /* The context is fine afterwards. */
    CHECK_OK(sc_context_check(c));
    sc_memory_stats st;
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == 0 && st.live_buffers == 0);
    sc_buffer b = make_buffer_in(c, SC_F32, 1000, "after oom");
    uint8_t *r = upload_random(SC_DEFAULT_STREAM, b, 4000, 1100);
    uint8_t *got = download(SC_DEFAULT_STREAM, b, 4000);
    CHECK_BYTES(got, r, 4000, "round trip after out of memory");
    free(r);
    free(got);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_context_synchronize(c));
    CHECK_OK(sc_context_destroy(c));
}

/* ---- cycles --------------------------------------------------------------------------------- */

static void test_cycles(void)
{
    const int cycles = sanitizer ? 1000 : 100000;
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_buffer_desc d = {.dtype = SC_U8, .count = MiB, .label = "cycle"};
    sc_buffer b;
    REQUIRE(sc_buffer_create(c, &d, &b) == SC_OK);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_context_trim(c));
    uint64_t free0, free1, total;
    CHECK_OK(sc_device_memory(0, &free0, &total));

    double t0 = test_now_s();
    int done = 0;
    for (int i = 0; i < cycles; i++) {
        if (sc_buffer_create(c, &d, &b) != SC_OK) {
            fprintf(stderr, "cycle %d: create: %s\n", i, sc_last_error());
            CHECK(!"create failed");
            break;
        }
        if (i % 10000 == 0) { /* now and then, use it */
            uint64_t in[2] = {0x1122334455667788ull ^ (uint64_t)i, ~(uint64_t)i}, out[2] = {0};
            CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, view(b, MiB - 16, 16), in, 16));
            CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, 16, view(b, MiB - 16, 16)));
            CHECK(out[0] == in[0] && out[1] == in[1]);
        }
        if (sc_buffer_destroy(b) != SC_OK) {
            fprintf(stderr, "cycle %d: destroy: %s\n", i, sc_last_error());
            CHECK(!"destroy failed");
            break;
        }
        done++;
    }
    double dt = test_now_s() - t0;
    CHECK(done == cycles);
    sc_memory_stats st;
    CHECK_OK(sc_context_memory(c, &st));
    CHECK(st.bytes_in_use == 0 && st.live_buffers == 0 && st.peak_bytes == MiB);
    CHECK_OK(sc_context_trim(c));
    CHECK_OK(sc_device_memory(0, &free1, &total));
    double drift = ((double)free0 - (double)free1) / (double)MiB;
    printf("%d buffer cycles of 1 MiB in %.2f s (%.1f us each): free VRAM %.1f -> %.1f MiB "
           "(drift %.3f MiB)\n",
           done, dt, dt * 1e6 / (done ? done : 1), (double)free0 / (double)MiB,
           (double)free1 / (double)MiB, drift);
    /* Under compute-sanitizer the tool's own device allocations (initcheck's shadow memory
     * grows in 128 MiB steps) move free VRAM; the sanitizer's leak check covers this run,
     * the plain run asserts the drift. */
    if (!sanitizer)
        CHECK(drift <= 1.0 && drift >= -1.0);
    CHECK_OK(sc_context_destroy(c));
}

/* ---- leak report ---------------------------------------------------------------------------- */

/* The log has a line that contains key and each of the others. */
static bool log_line_has(const char *key, const char *a, const char *b)
{
    for (const char *p = strstr(test_log_text, key); p; p = strstr(p + 1, key)) {
        const char *start = p, *end = strchr(p, '\n');
        while (start > test_log_text && start[-1] != '\n')
            start--;
        size_t len = end ? (size_t)(end - start) : strlen(start);
        char line[1024];
        if (len >= sizeof line)
            len = sizeof line - 1;
        memcpy(line, start, len);
        line[len] = '\0';
        if ((!a || strstr(line, a)) && (!b || strstr(line, b)))
            return true;
    }
    fprintf(stderr, "log has no line with \"%s\", \"%s\", \"%s\":\n%s", key, a ? a : "",
            b ? b : "", test_log_text);
    return false;
}

static void test_leak_report(void)
{
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_buffer a, b;
    sc_host_buffer h;
    sc_buffer_desc da = {.dtype = SC_F32, .count = 1000, .label = "leak-a"};
    sc_buffer_desc db = {.dtype = SC_F32, .count = 77, .label = "leak-b"};
    sc_host_buffer_desc dh = {.bytes = 4096, .label = "leak-h"};
    int la = __LINE__; REQUIRE(sc_buffer_create(c, &da, &a) == SC_OK);
    int lb = __LINE__; REQUIRE(sc_buffer_create(c, &db, &b) == SC_OK);
    int lh = __LINE__; REQUIRE(sc_host_buffer_create(c, &dh, &h) == SC_OK);
    char sa[64], sb[64], sh[64];
    snprintf(sa, sizeof sa, "test_gpu_memory.c:%d", la);
    snprintf(sb, sizeof sb, "test_gpu_memory.c:%d", lb);
    snprintf(sh, sizeof sh, "test_gpu_memory.c:%d", lh);
    /* Use the default stream (it must not show up as a leak). */
    free(upload_random(SC_DEFAULT_STREAM, a, 4000, 1200));
    CHECK_OK(sc_copy_to_host_buffer(SC_DEFAULT_STREAM, h, 0, sc_view_of(a)));

    size_t n = 0;
    CHECK_OK(sc_context_live_objects(c, NULL, 0, &n));
    CHECK(n == 3);

    sc_set_log_callback(test_log_capture, NULL);
    test_log_text[0] = '\0';
    n = 0;
    CHECK_OK(sc_context_live_report(c, &n));
    CHECK(n == 3);
    CHECK(log_line_has("'leak-a'", "f32", sa));
    CHECK(log_line_has("'leak-a'", "buffer", "4000 bytes"));
    CHECK(log_line_has("'leak-b'", "f32", sb));
    CHECK(log_line_has("'leak-h'", "host buffer", sh));
    CHECK(log_line_has("'leak-h'", "4096 bytes", NULL));

    test_log_text[0] = '\0';
    CHECK_STATUS(sc_context_destroy(c), SC_ERR_LEAKED);
    CHECK_MSG("3 objects");
    CHECK(log_line_has("'leak-a'", "f32", sa));
    CHECK(log_line_has("'leak-b'", "f32", sb));
    CHECK(log_line_has("'leak-h'", "host buffer", sh));
    CHECK(strstr(test_log_text, "  stream '") == NULL); /* the default stream is no leak */
    sc_set_log_callback(NULL, NULL);

    /* Freed with the context: the handles are stale. */
    sc_buffer_props p;
    CHECK_STATUS(sc_buffer_info(a, &p), SC_ERR_STALE_HANDLE);
    void *ptr;
    uint64_t bytes;
    CHECK_STATUS(sc_host_buffer_ptr(h, &ptr, &bytes), SC_ERR_STALE_HANDLE);
}

/* ---- destroying memory under copies in flight ----------------------------------------------- */

static void test_destroy_in_flight(void)
{
    const uint64_t size = sanitizer ? 64 * MiB : GiB;
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_stream s = make_stream(c, "in-flight");
    uint8_t *src = test_xmalloc(size), *dst = test_xmalloc(size);
    test_fill_random(src, size, 1300);
    sc_buffer A = make_buffer_in(c, SC_U8, size, "inflight A");
    sc_buffer B = make_buffer_in(c, SC_U8, size, "inflight B");
    CHECK_OK(sc_copy_from_host(s, sc_view_of(A), src, size));
    CHECK_OK(sc_stream_synchronize(s));

    /* Several big reads of A queued, then A destroyed at once: it must outlive them. */
    for (int k = 0; k < 8; k++)
        CHECK_OK(sc_copy(s, sc_view_of(B), sc_view_of(A)));
    CHECK_OK(sc_buffer_destroy(A));
    sc_status q = sc_stream_query(s);
    printf("source destroyed while its copies were %s\n",
           q == SC_ERR_NOT_READY ? "in flight" : "already done");
    CHECK(q == SC_OK || q == SC_ERR_NOT_READY);
    /* A new buffer of the same size, written on another stream at once: if A's memory
     * had been handed out early, this would corrupt B. */
    sc_buffer C = make_buffer_in(c, SC_U8, size, "reuser");
    uint8_t v5a = 0x5A;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(C), &v5a));
    memset(dst, 0xA5, size);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, dst, size, sc_view_of(B)));
    CHECK_BYTES(dst, src, size, "destination of copies whose source was destroyed");
    uint8_t tail[4096];
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, tail, sizeof tail,
                             view(C, size - sizeof tail, sizeof tail)));
    CHECK(all_bytes(tail, 0x5A, sizeof tail, "reuser"));

    /* Used on two streams: written on s2, then long reads on s and a short read on s2.
     * Wherever the free is ordered, it must wait for the reads on s too; a buffer then
     * allocated and filled on s2 would otherwise land in A2's memory under those reads. */
    sc_stream s2 = make_stream(c, "in-flight 2");
    sc_buffer A2 = make_buffer_in(c, SC_U8, size, "inflight A2");
    sc_buffer part = make_buffer_in(c, SC_U8, MiB, "inflight part");
    test_fill_random(src, size, 1303);
    CHECK_OK(sc_copy_from_host(s2, sc_view_of(A2), src, size));
    CHECK_OK(sc_stream_synchronize(s2));
    for (int k = 0; k < 8; k++)
        CHECK_OK(sc_copy(s, sc_view_of(B), sc_view_of(A2)));
    CHECK_OK(sc_copy(s2, sc_view_of(part), view(A2, 0, MiB)));
    CHECK_OK(sc_buffer_destroy(A2));
    sc_buffer C2 = {0};
    sc_buffer_desc c2d = {.dtype = SC_U8, .count = size, .label = "reuser 2", .stream = s2};
    CHECK_OK(sc_buffer_create(c, &c2d, &C2));
    CHECK_OK(sc_fill(s2, sc_view_of(C2), &v5a));
    memset(dst, 0xA5, size);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, dst, size, sc_view_of(B)));
    CHECK_BYTES(dst, src, size, "copies from a source last used on another stream");
    memset(dst, 0xA5, MiB);
    CHECK_OK(sc_copy_to_host(s2, dst, MiB, sc_view_of(part)));
    CHECK_BYTES(dst, src, MiB, "short read on the second stream");
    CHECK_OK(sc_buffer_destroy(C2));
    CHECK_OK(sc_buffer_destroy(part));
    CHECK_OK(sc_stream_destroy(s2));

    /* The destination destroyed while copies into it are in flight. */
    sc_buffer D = make_buffer_in(c, SC_U8, size, "inflight D");
    for (int k = 0; k < 4; k++)
        CHECK_OK(sc_copy(s, sc_view_of(D), sc_view_of(B)));
    CHECK_OK(sc_buffer_destroy(D));
    sc_buffer E = make_buffer_in(c, SC_U8, size, "after D");
    test_fill_random(src, size, 1301);
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(E), src, size));
    CHECK_OK(sc_stream_synchronize(s));
    CHECK_OK(sc_context_synchronize(c));
    CHECK_OK(sc_context_check(c));
    memset(dst, 0xA5, size);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, dst, size, sc_view_of(E)));
    CHECK_BYTES(dst, src, size, "buffer made after destroying a copy's destination");

    /* And a small round trip to show all is well. */
    sc_buffer small = make_buffer_in(c, SC_I64, 100, "small");
    uint8_t *r = upload_random(s, small, 800, 1302);
    uint8_t *got = download(s, small, 800);
    CHECK_BYTES(got, r, 800, "small round trip after in-flight destroys");
    free(r);
    free(got);

    CHECK_OK(sc_buffer_destroy(small));
    CHECK_OK(sc_buffer_destroy(B));
    CHECK_OK(sc_buffer_destroy(C));
    CHECK_OK(sc_buffer_destroy(E));
    CHECK_OK(sc_stream_destroy(s));
    CHECK_OK(sc_context_destroy(c));
    free(src);
    free(dst);
}

static void test_pinned_in_flight(void)
{
    const uint64_t size = sanitizer ? 64 * MiB : 256 * MiB;
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_stream s = make_stream(c, "pinned in-flight");
    uint8_t *p1 = test_xmalloc(size), *p2 = test_xmalloc(size), *dst = test_xmalloc(size);
    test_fill_random(p1, size, 1400);
    test_fill_random(p2, size, 1401);
    sc_host_buffer H = make_host(c, size, "pinned H");
    sc_buffer D = make_buffer_in(c, SC_U8, size, "pinned D");

    /* Rewriting H must wait for the upload that reads it. */
    CHECK_OK(sc_host_buffer_write(H, 0, p1, size));
    CHECK_OK(sc_copy_from_host_buffer(s, sc_view_of(D), H, 0));
    CHECK_OK(sc_host_buffer_write(H, 0, p2, size));
    memset(dst, 0xA5, size);
    CHECK_OK(sc_copy_to_host(s, dst, size, sc_view_of(D)));
    CHECK_BYTES(dst, p1, size, "device copy of a pinned buffer rewritten during the copy");
    memset(dst, 0xA5, size);
    CHECK_OK(sc_host_buffer_read(H, 0, dst, size));
    CHECK_BYTES(dst, p2, size, "the rewritten pinned buffer");

    /* Reading H through its pointer must wait for a download into it. */
    CHECK_OK(sc_copy_to_host_buffer(s, H, 0, sc_view_of(D))); /* H = p1 again */
    void *ptr = NULL;
    uint64_t n = 0;
    CHECK_OK(sc_host_buffer_ptr(H, &ptr, &n));
    CHECK(ptr != NULL && n == size);
    if (ptr)
        CHECK_BYTES(ptr, p1, size, "pinned buffer read through its pointer after a download");
    CHECK_OK(sc_host_buffer_write(H, 0, p2, size)); /* H = p2 */

    /* try_ptr / try_destroy right after big copies that read H. */
    for (int k = 0; k < 4; k++)
        CHECK_OK(sc_copy_from_host_buffer(s, sc_view_of(D), H, 0));
    ptr = NULL;
    sc_status t = sc_host_buffer_try_ptr(H, &ptr, &n);
    printf("sc_host_buffer_try_ptr during copies: %s\n", sc_status_name(t));
    CHECK(t == SC_OK || t == SC_ERR_BUSY);
    if (t == SC_OK)
        CHECK(ptr != NULL && n == size);
    t = sc_host_buffer_try_destroy(H);
    printf("sc_host_buffer_try_destroy during copies: %s\n", sc_status_name(t));
    CHECK(t == SC_OK || t == SC_ERR_BUSY);
    if (t == SC_ERR_BUSY) {
        /* Still alive and intact. */
        CHECK_OK(sc_host_buffer_ptr(H, &ptr, &n));
        CHECK(n == size);
        if (ptr)
            CHECK_BYTES(ptr, p2, size, "pinned buffer after a refused try_destroy");
        CHECK_OK(sc_stream_synchronize(s));
        CHECK_OK(sc_host_buffer_try_ptr(H, &ptr, &n));
        CHECK_OK(sc_host_buffer_try_destroy(H));
    }
    CHECK_STATUS(sc_host_buffer_ptr(H, &ptr, &n), SC_ERR_STALE_HANDLE);
    memset(dst, 0xA5, size);
    CHECK_OK(sc_copy_to_host(s, dst, size, sc_view_of(D)));
    CHECK_BYTES(dst, p2, size, "device buffer after the last uploads");

    /* Plain destroy right after a copy that uses it waits for the copy. */
    sc_host_buffer H2 = make_host(c, size, "pinned H2");
    CHECK_OK(sc_host_buffer_write(H2, 0, p1, size));
    CHECK_OK(sc_copy_from_host_buffer(s, sc_view_of(D), H2, 0));
    CHECK_OK(sc_host_buffer_destroy(H2));
    memset(dst, 0xA5, size);
    CHECK_OK(sc_copy_to_host(s, dst, size, sc_view_of(D)));
    CHECK_BYTES(dst, p1, size, "upload from a pinned buffer destroyed right after");

    CHECK_OK(sc_buffer_destroy(D));
    CHECK_OK(sc_stream_destroy(s));
    CHECK_OK(sc_context_destroy(c));
    free(p1);
    free(p2);
    free(dst);
}

int main(void)
{
    gpu_require();
    sanitizer = getenv("SAFECUDA_UNDER_SANITIZER") != NULL;
    if (sanitizer)
        printf("SAFECUDA_UNDER_SANITIZER: heavy parts shrunk\n");
    double t0 = test_now_s();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    TEST_RUN(test_roundtrips);
    TEST_RUN(test_views);
    TEST_RUN(test_bounds);
    TEST_RUN(test_copy_checks);
    TEST_RUN(test_fills);
    TEST_RUN(test_zero);
    TEST_RUN(test_stale);
    TEST_RUN(test_info);
    TEST_RUN(test_create_errors);
    TEST_RUN(test_device_ptr);
    CHECK_OK(sc_context_destroy(ctx)); /* SC_OK: nothing above leaked */
    TEST_RUN(test_accounting);
    TEST_RUN(test_budget);
    TEST_RUN(test_oom);
    TEST_RUN(test_cycles);
    TEST_RUN(test_leak_report);
    TEST_RUN(test_destroy_in_flight);
    TEST_RUN(test_pinned_in_flight);
    printf("total %.2f s\n", test_now_s() - t0);
    return test_result("test_gpu_memory");
}
