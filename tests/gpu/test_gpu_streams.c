/* Streams, events and automatic cross-stream ordering on a real GPU: priorities, queries,
 * timing events, read-after-write / write-after-read / write-after-write across streams
 * with tracking on, off (the race is counted and printed, not asserted) and off with
 * manual events, destroying a stream with work queued, 8 threads hammering copies on
 * their own streams, the default stream, cross-context use and stale handles.
 *
 * There is no kernel launch yet: producers are large copies and fills.
 * SAFECUDA_UNDER_SANITIZER (compute-sanitizer, ~50x slower) shrinks the heavy parts. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "../test.h"

#define MiB ((uint64_t)1 << 20)

static bool sanitizer;
static sc_context ctx;

/* ---- helpers ------------------------------------------------------------------------------ */


/* Every 32-bit word of p[0 .. n) equals v. */
static bool all_u32(const void *p, uint32_t v, size_t n, const char *what)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, b + i * 4, 4);
        if (x != v) {
            fprintf(stderr, "%s: element %zu is 0x%08x, expected 0x%08x\n", what, i, x, v);
            return false;
        }
    }
    return true;
}

static sc_buffer make_buffer_in(sc_context c, sc_dtype dt, uint64_t count, const char *label)
{
    sc_buffer b = {0};
    sc_buffer_desc d = {.dtype = dt, .count = count, .label = label};
    REQUIRE(sc_buffer_create(c, &d, &b) == SC_OK);
    return b;
}

static sc_stream make_stream_in(sc_context c, const char *label)
{
    sc_stream s = {0};
    sc_stream_desc d = {.label = label};
    REQUIRE(sc_stream_create(c, &d, &s) == SC_OK);
    REQUIRE(s.id != 0);
    return s;
}

static sc_event make_event_in(sc_context c, bool timing, const char *label)
{
    sc_event e = {0};
    sc_event_desc d = {.timing = timing, .label = label};
    REQUIRE(sc_event_create(c, &d, &e) == SC_OK);
    REQUIRE(e.id != 0);
    return e;
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

/* A short round trip of random bytes on stream s through the first 256 bytes of b. */
static bool small_roundtrip(sc_stream s, sc_buffer b, uint64_t seed)
{
    uint8_t in[256], out[256];
    sc_buffer_props props;
    REQUIRE(sc_buffer_info(b, &props) == SC_OK && props.bytes >= sizeof in);
    uint64_t n = sizeof in / sc_dtype_size(props.dtype);
    test_fill_random(in, sizeof in, seed);
    memset(out, 0xA5, sizeof out);
    if (sc_copy_from_host(s, view(b, 0, n), in, sizeof in) != SC_OK ||
        sc_copy_to_host(s, out, sizeof out, view(b, 0, n)) != SC_OK) {
        fprintf(stderr, "small round trip: %s\n", sc_last_error());
        return false;
    }
    return test_same_bytes(out, in, sizeof in, "small round trip");
}

/* ---- priorities ----------------------------------------------------------------------------- */

static int priority_of(int requested, const char *label)
{
    sc_stream s = {0};
    sc_stream_desc d = {.priority = requested, .label = label};
    REQUIRE(sc_stream_create(ctx, &d, &s) == SC_OK);
    int p = 12345;
    CHECK_OK(sc_stream_priority(s, &p));
    CHECK_OK(sc_stream_destroy(s));
    return p;
}

static void test_priorities(void)
{
    sc_buffer b = make_buffer_in(ctx, SC_U8, 256, "prio buffer");

    /* Defaults: NULL desc and the zero desc give priority 0, non-blocking. */
    sc_stream s0 = {0}, s1 = {0};
    CHECK_OK(sc_stream_create(ctx, NULL, &s0));
    sc_stream_desc zero = {0};
    CHECK_OK(sc_stream_create(ctx, &zero, &s1));
    int p = 12345;
    CHECK_OK(sc_stream_priority(s0, &p));
    CHECK(p == 0);
    CHECK_OK(sc_stream_priority(s1, &p));
    CHECK(p == 0);
    CHECK(small_roundtrip(s0, b, 1));
    CHECK(small_roundtrip(s1, b, 2));
    CHECK_OK(sc_stream_destroy(s0));
    CHECK_OK(sc_stream_destroy(s1));

    /* Clamping: CUDA's range is [greatest, 0] with greatest < 0 (-5 on an H100); lower
     * numbers run first. */
    int greatest = priority_of(-100, "prio -100");
    printf("stream priority -100 clamps to %d\n", greatest);
    CHECK(greatest < 0 && greatest > -100);
    CHECK(priority_of(greatest, "prio greatest") == greatest);
    CHECK(priority_of(greatest - 1, "prio greatest-1") == greatest);
    CHECK(priority_of(INT32_MIN, "prio INT_MIN") == greatest);
    CHECK(priority_of(-1, "prio -1") == -1);
    CHECK(priority_of(0, "prio 0") == 0);
    CHECK(priority_of(100, "prio 100") == 0); /* the least priority is 0 */
    CHECK(priority_of(INT32_MAX, "prio INT_MAX") == 0);

    /* Every kind of stream works. */
    sc_stream hi = {0}, blocking = {0};
    sc_stream_desc dh = {.priority = -100, .label = "high"};
    sc_stream_desc db = {.blocking = true, .label = "blocking"};
    CHECK_OK(sc_stream_create(ctx, &dh, &hi));
    CHECK_OK(sc_stream_create(ctx, &db, &blocking));
    CHECK(small_roundtrip(hi, b, 3));
    CHECK(small_roundtrip(blocking, b, 4));
    CHECK_OK(sc_stream_destroy(hi));
    CHECK_OK(sc_stream_destroy(blocking));
    CHECK_OK(sc_buffer_destroy(b));
}

/* ---- queries and events --------------------------------------------------------------------- */

static void test_events(void)
{
    const uint64_t size = sanitizer ? 64 * MiB : 256 * MiB;
    sc_stream s = make_stream_in(ctx, "events");
    sc_buffer x = make_buffer_in(ctx, SC_U8, size, "events x");
    sc_buffer y = make_buffer_in(ctx, SC_U8, size, "events y");
    uint8_t *data = test_xmalloc(size), *back = test_xmalloc(size);
    test_fill_random(data, size, 10);
    CHECK_OK(sc_copy_from_host(s, sc_view_of(x), data, size));
    CHECK_OK(sc_stream_synchronize(s));
    CHECK_OK(sc_stream_query(s));

    sc_event e0 = make_event_in(ctx, true, "t0"), e1 = make_event_in(ctx, true, "t1");
    sc_event ea = make_event_in(ctx, false, "plain a"), eb = make_event_in(ctx, false, "plain b");
    sc_event never = make_event_in(ctx, true, "never recorded");
    sc_event en = {0};
    CHECK_OK(sc_event_create(ctx, NULL, &en)); /* NULL desc: defaults */

    CHECK_OK(sc_event_record(e0, s));
    CHECK_OK(sc_copy(s, sc_view_of(y), sc_view_of(x)));
    CHECK_OK(sc_event_record(e1, s));
    sc_status q = sc_stream_query(s);
    printf("sc_stream_query right after a %" PRIu64 " MiB copy: %s\n", size / MiB,
           sc_status_name(q));
    CHECK(q == SC_OK || q == SC_ERR_NOT_READY);
    q = sc_event_query(e1);
    CHECK(q == SC_OK || q == SC_ERR_NOT_READY);
    CHECK_OK(sc_event_synchronize(e1));
    CHECK_OK(sc_event_query(e1));
    CHECK_OK(sc_event_query(e0));
    CHECK_OK(sc_stream_query(s));

    float ms = -1.0f;
    CHECK_OK(sc_event_elapsed(e0, e1, &ms));
    double rate = ms > 0 ? (double)size * 2.0 / ((double)ms / 1000.0) : 0;
    printf("%" PRIu64 " MiB device copy: %.3f ms (%.0f GB/s read+write)\n", size / MiB, ms,
           rate / 1e9);
    CHECK(ms > 0.0f);
    CHECK(rate < 5e12);         /* not faster than any HBM */
    CHECK(ms < 10000.0f);       /* nor absurdly slow */
    memset(back, 0xA5, size);
    CHECK_OK(sc_copy_to_host(s, back, size, sc_view_of(y)));
    CHECK_BYTES(back, data, size, "copy between timing events");

    /* Re-recording moves the event to the new point. */
    CHECK_OK(sc_event_record(e0, s));
    CHECK_OK(sc_copy(s, sc_view_of(x), sc_view_of(y)));
    CHECK_OK(sc_event_record(e1, s));
    CHECK_OK(sc_event_synchronize(e1));
    CHECK_OK(sc_event_elapsed(e0, e1, &ms));
    CHECK(ms > 0.0f);

    /* Elapsed needs two recorded timing events. */
    CHECK_OK(sc_event_record(ea, s));
    CHECK_OK(sc_copy(s, sc_view_of(y), sc_view_of(x)));
    CHECK_OK(sc_event_record(eb, s));
    CHECK_OK(sc_event_synchronize(eb));
    q = sc_event_elapsed(ea, eb, &ms);
    printf("elapsed between non-timing events: %s (%s)\n", sc_status_name(q), sc_last_error());
    CHECK(q != SC_OK);
    CHECK(sc_event_elapsed(e0, eb, &ms) != SC_OK);
    q = sc_event_elapsed(never, e1, &ms);
    printf("elapsed from an unrecorded event: %s (%s)\n", sc_status_name(q), sc_last_error());
    CHECK(q != SC_OK);
    CHECK(sc_event_elapsed(e0, never, &ms) != SC_OK);

    /* Events on the default stream, and waits. */
    CHECK_OK(sc_event_record(en, SC_DEFAULT_STREAM));
    CHECK_OK(sc_event_synchronize(en));
    CHECK_OK(sc_event_query(en));
    CHECK_OK(sc_stream_wait(s, en));
    CHECK_OK(sc_stream_wait(SC_DEFAULT_STREAM, e1)); /* the context comes from the event */
    CHECK_OK(sc_stream_synchronize(s));

    /* Stale events. */
    sc_event all[] = {e0, e1, ea, eb, never, en};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        CHECK_OK(sc_event_destroy(all[k]));
    CHECK_STATUS(sc_event_query(e0), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_event_query");
    CHECK_MSG("was destroyed");
    CHECK_MSG("test_gpu_streams.c");
    CHECK_STATUS(sc_event_record(e0, s), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_event_synchronize(e1), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_event_elapsed(e0, e1, &ms), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_stream_wait(s, ea), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_event_destroy(e0), SC_ERR_STALE_HANDLE); /* double destroy */
    CHECK_MSG("sc_event_destroy");

    CHECK_OK(sc_buffer_destroy(x));
    CHECK_OK(sc_buffer_destroy(y));
    CHECK_OK(sc_stream_destroy(s));
    free(data);
    free(back);
}

/* ---- automatic ordering: a producer on A, a consumer on B ------------------------------------ */

typedef enum { TRACKED, UNTRACKED, MANUAL } order_mode;
static const char *const mode_names[] = {"tracking on", "tracking off, no event",
                                         "tracking off, manual event"};

/* Each iteration: A runs a slow copy between scratch buffers (so A's later work is still
 * queued when B starts), then fills X[0, n) with a fresh value; B at once copies X[0, n)
 * to Y and reads sampled elements of Y (the first, the last and 6 random ones). With the
 * ordering owed (tracking, or an event by hand) every sample holds the new value. */
static void run_ordering(order_mode mode)
{
    const int iters = sanitizer ? 100 : 1000;
    const uint64_t max_bytes = 64 * MiB, delay_bytes = sanitizer ? 16 * MiB : 128 * MiB;
    sc_context c;
    sc_context_desc cd = {.disable_event_tracking = mode != TRACKED};
    REQUIRE(sc_context_create(&cd, &c) == SC_OK);
    sc_stream a = make_stream_in(c, "producer"), b = make_stream_in(c, "consumer");
    sc_buffer x = make_buffer_in(c, SC_U32, max_bytes / 4, "x");
    sc_buffer y = make_buffer_in(c, SC_U32, max_bytes / 4, "y");
    sc_buffer p = make_buffer_in(c, SC_U8, delay_bytes, "delay src");
    sc_buffer q = make_buffer_in(c, SC_U8, delay_bytes, "delay dst");
    sc_event ev = make_event_in(c, false, "manual");
    uint32_t v = 0;
    CHECK_OK(sc_fill(a, sc_view_of(x), &v));
    CHECK_OK(sc_fill(a, sc_view_of(p), &(uint8_t){1}));
    /* The allocations and first fills are done before either stream uses them: without
     * tracking the caller owes that ordering too. */
    CHECK_OK(sc_context_synchronize(c));

    uint64_t seed = 0xC0FFEE + (uint64_t)mode;
    int stale = 0, errors = 0, printed = 0;
    double t0 = test_now_s();
    for (int it = 0; it < iters; it++) {
        uint64_t bytes = MiB + (test_rand(&seed) % (max_bytes - MiB + 1));
        uint64_t n = bytes / 4;
        uint32_t prev = v;
        do
            v = (uint32_t)test_rand(&seed) | 1u;
        while (v == prev);

        sc_status s = sc_copy(a, sc_view_of(q), sc_view_of(p));
        if (s == SC_OK)
            s = sc_fill(a, view(x, 0, n), &v);
        if (s == SC_OK && mode == MANUAL) {
            s = sc_event_record(ev, a);
            if (s == SC_OK)
                s = sc_stream_wait(b, ev);
        }
        if (s == SC_OK)
            s = sc_copy(b, view(y, 0, n), view(x, 0, n));
        bool bad = false;
        for (int k = 0; k < 8 && s == SC_OK; k++) {
            uint64_t idx = k == 0 ? 0 : k == 1 ? n - 1 : test_rand(&seed) % n;
            uint32_t got = 0;
            s = sc_copy_to_host(b, &got, 4, view(y, idx, 1));
            if (s == SC_OK && got != v) {
                bad = true;
                if (mode != UNTRACKED && printed++ < 5)
                    fprintf(stderr, "%s: iteration %d: y[%" PRIu64 "] = 0x%08x, expected 0x%08x\n",
                            mode_names[mode], it, idx, got, v);
            }
        }
        if (s != SC_OK) {
            if (errors++ < 5)
                fprintf(stderr, "%s: iteration %d: %s\n", mode_names[mode], it, sc_last_error());
        }
        stale += bad;
    }
    double dt = test_now_s() - t0;
    printf("%s: race observed in %d of %d iterations (%.2f s)\n", mode_names[mode], stale, iters,
           dt);
    CHECK(errors == 0);
    if (mode != UNTRACKED)
        CHECK(stale == 0);

    CHECK_OK(sc_context_synchronize(c));
    sc_buffer bufs[] = {x, y, p, q};
    for (int k = 0; k < 4; k++)
        CHECK_OK(sc_buffer_destroy(bufs[k]));
    CHECK_OK(sc_event_destroy(ev));
    CHECK_OK(sc_stream_destroy(a));
    CHECK_OK(sc_stream_destroy(b));
    CHECK_OK(sc_context_destroy(c));
}

static void test_ordering(void)
{
    run_ordering(TRACKED);
    run_ordering(UNTRACKED);
    run_ordering(MANUAL);
}

/* Write-after-read and write-after-write across streams, with tracking on. */
static void test_war_waw(void)
{
    const uint64_t size = sanitizer ? 16 * MiB : 64 * MiB, n = size / 4;
    const uint64_t delay_bytes = sanitizer ? 16 * MiB : 128 * MiB;
    sc_stream a = make_stream_in(ctx, "war a"), b = make_stream_in(ctx, "war b");
    sc_buffer x = make_buffer_in(ctx, SC_U32, n, "war x");
    sc_buffer y = make_buffer_in(ctx, SC_U32, n, "war y");
    sc_buffer src = make_buffer_in(ctx, SC_U32, n, "war src");
    sc_buffer p = make_buffer_in(ctx, SC_U8, delay_bytes, "delay src");
    sc_buffer q = make_buffer_in(ctx, SC_U8, delay_bytes, "delay dst");
    uint8_t *r = test_xmalloc(size), *back = test_xmalloc(size);
    CHECK_OK(sc_fill(a, sc_view_of(p), &(uint8_t){2}));

    for (int round = 0; round < 5; round++) {
        /* WAR: A reads X (late, behind the delay); B overwrites X. Y must get the old X. */
        test_fill_random(r, size, 20 + (uint64_t)round);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(x), r, size));
        CHECK_OK(sc_copy(a, sc_view_of(q), sc_view_of(p)));
        CHECK_OK(sc_copy(a, sc_view_of(y), sc_view_of(x)));
        uint32_t v = 0x11111111u * (uint32_t)(round + 1) + 0x01020304u;
        CHECK_OK(sc_fill(b, sc_view_of(x), &v));
        memset(back, 0xA5, size);
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, size, sc_view_of(y)));
        CHECK_BYTES(back, r, size, "write-after-read: the reader's copy");
        memset(back, 0xA5, size);
        CHECK_OK(sc_copy_to_host(b, back, size, sc_view_of(x)));
        CHECK(all_u32(back, v, n, "write-after-read: the writer's fill"));

        /* WAW: A writes X (late); B then fills X. X must end as B's fill everywhere. */
        test_fill_random(r, size, 40 + (uint64_t)round);
        CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(src), r, size));
        CHECK_OK(sc_copy(a, sc_view_of(q), sc_view_of(p)));
        CHECK_OK(sc_copy(a, sc_view_of(x), sc_view_of(src)));
        uint32_t w = ~v;
        CHECK_OK(sc_fill(b, sc_view_of(x), &w));
        memset(back, 0xA5, size);
        CHECK_OK(sc_copy_to_host(a, back, size, sc_view_of(x)));
        CHECK(all_u32(back, w, n, "write-after-write"));
    }

    CHECK_OK(sc_context_synchronize(ctx));
    sc_buffer bufs[] = {x, y, src, p, q};
    for (int k = 0; k < 5; k++)
        CHECK_OK(sc_buffer_destroy(bufs[k]));
    CHECK_OK(sc_stream_destroy(a));
    CHECK_OK(sc_stream_destroy(b));
    free(r);
    free(back);
}

/* ---- destroying a stream with work queued ---------------------------------------------------- */

static void test_destroy_busy_stream(void)
{
    const uint64_t size = sanitizer ? 64 * MiB : 256 * MiB;
    sc_buffer src = make_buffer_in(ctx, SC_U8, size, "busy src");
    sc_buffer dst = make_buffer_in(ctx, SC_U8, size, "busy dst");
    uint8_t *r = test_xmalloc(size), *back = test_xmalloc(size);
    test_fill_random(r, size, 50);
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(src), r, size));
    CHECK_OK(sc_context_synchronize(ctx));

    sc_stream s = {0};
    sc_stream_desc sd = {.label = "busy"};
    int line = __LINE__; REQUIRE(sc_stream_create(ctx, &sd, &s) == SC_OK);
    for (int k = 0; k < 4; k++)
        CHECK_OK(sc_copy(s, sc_view_of(dst), sc_view_of(src)));
    sc_status q = sc_stream_query(s);
    CHECK_OK(sc_stream_destroy(s));
    printf("stream destroyed with work %s\n", q == SC_ERR_NOT_READY ? "queued" : "already done");
    memset(back, 0xA5, size);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, size, sc_view_of(dst)));
    CHECK_BYTES(back, r, size, "copy queued on a destroyed stream");

    /* The stream's handle is stale everywhere. */
    char site[64];
    snprintf(site, sizeof site, "test_gpu_streams.c:%d", line);
    sc_event ev = make_event_in(ctx, false, "stale test");
    int prio;
    CHECK_STATUS(sc_stream_synchronize(s), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_stream_synchronize");
    CHECK_MSG("was destroyed");
    CHECK_MSG(site);
    CHECK_STATUS(sc_stream_query(s), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_stream_priority(s, &prio), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_stream_wait(s, ev), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_event_record(ev, s), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_copy_from_host(s, view(dst, 0, 16), r, 16), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_copy(s, view(dst, 0, 16), view(src, 0, 16)), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_fill(s, view(dst, 0, 16), r), SC_ERR_STALE_HANDLE);
    sc_buffer nb = {0};
    sc_buffer_desc bd = {.dtype = SC_U8, .count = 16, .stream = s};
    CHECK_STATUS(sc_buffer_create(ctx, &bd, &nb), SC_ERR_STALE_HANDLE);
    CHECK(nb.id == 0);
    CHECK_STATUS(sc_stream_destroy(s), SC_ERR_STALE_HANDLE); /* double destroy */
    CHECK_MSG("sc_stream_destroy");
    CHECK_OK(sc_event_destroy(ev));

    /* A buffer allocated on a stream outlives that stream. */
    sc_stream s2 = make_stream_in(ctx, "allocating");
    bd = (sc_buffer_desc){.dtype = SC_U8, .count = 4096, .label = "outlives", .stream = s2};
    CHECK_OK(sc_buffer_create(ctx, &bd, &nb));
    CHECK(small_roundtrip(s2, nb, 51));
    CHECK_OK(sc_stream_destroy(s2));
    CHECK(small_roundtrip(SC_DEFAULT_STREAM, nb, 52));
    CHECK_OK(sc_buffer_destroy(nb));

    CHECK_OK(sc_buffer_destroy(src));
    CHECK_OK(sc_buffer_destroy(dst));
    free(r);
    free(back);
}

/* ---- 8 threads, each with its own stream ------------------------------------------------------ */

#define THREADS 8
#define HAMMER_MAX (4 * MiB)
static atomic_int hammer_errors;
static atomic_llong hammer_iters, hammer_bytes;
static double hammer_deadline;

static void *hammer(void *arg)
{
    int id = (int)(intptr_t)arg;
    uint64_t seed = 0xABCD0000ull + (uint64_t)id;
    sc_stream s = {0};
    sc_buffer d1 = {0}, d2 = {0};
    sc_host_buffer h = {0};
    sc_stream_desc sd = {.label = "hammer"};
    sc_buffer_desc bd = {.dtype = SC_U8, .count = HAMMER_MAX + 64, .label = "hammer"};
    sc_host_buffer_desc hd = {.bytes = HAMMER_MAX + 64, .label = "hammer pinned"};
    uint8_t *src = malloc(HAMMER_MAX), *dst = malloc(HAMMER_MAX);
    if (!src || !dst || sc_stream_create(ctx, &sd, &s) != SC_OK ||
        sc_buffer_create(ctx, &bd, &d1) != SC_OK || sc_buffer_create(ctx, &bd, &d2) != SC_OK ||
        sc_host_buffer_create(ctx, &hd, &h) != SC_OK) {
        fprintf(stderr, "thread %d setup: %s\n", id, sc_last_error());
        atomic_fetch_add(&hammer_errors, 1);
        free(src);
        free(dst);
        return NULL;
    }
    int errors = 0;
    long long iters = 0, bytes_moved = 0;
    while (test_now_s() < hammer_deadline && errors == 0) {
        uint64_t r = test_rand(&seed);
        uint64_t n = 1 + r % HAMMER_MAX;
        uint64_t off1 = (r >> 32) % 64, off2 = (r >> 40) % 64, hoff = (r >> 48) % 64;
        bool pinned = iters & 1;
        test_fill_random(src, n, seed ^ (uint64_t)iters);
        sc_view v1, v2;
        sc_status st = sc_buffer_view(d1, off1, n, &v1);
        if (st == SC_OK)
            st = sc_buffer_view(d2, off2, n, &v2);
        if (st == SC_OK) {
            if (pinned) {
                st = sc_host_buffer_write(h, hoff, src, n);
                if (st == SC_OK)
                    st = sc_copy_from_host_buffer(s, v1, h, hoff);
            } else {
                st = sc_copy_from_host(s, v1, src, n);
            }
        }
        if (st == SC_OK)
            st = sc_copy(s, v2, v1);
        memset(dst, 0xA5, n);
        if (st == SC_OK) {
            if (pinned) {
                st = sc_copy_to_host_buffer(s, h, 63 - hoff, v2);
                if (st == SC_OK)
                    st = sc_host_buffer_read(h, 63 - hoff, dst, n);
            } else {
                st = sc_copy_to_host(s, dst, n, v2);
            }
        }
        if (st != SC_OK) {
            fprintf(stderr, "thread %d iteration %lld: %s\n", id, iters, sc_last_error());
            errors++;
        } else if (memcmp(dst, src, n) != 0) {
            fprintf(stderr, "thread %d iteration %lld: %" PRIu64 " bytes (%s) came back wrong\n",
                    id, iters, n, pinned ? "pinned" : "pageable");
            errors++;
        }
        iters++;
        bytes_moved += (long long)n * 3;
    }
    if (sc_buffer_destroy(d1) != SC_OK || sc_buffer_destroy(d2) != SC_OK ||
        sc_host_buffer_destroy(h) != SC_OK || sc_stream_destroy(s) != SC_OK) {
        fprintf(stderr, "thread %d teardown: %s\n", id, sc_last_error());
        errors++;
    }
    atomic_fetch_add(&hammer_errors, errors);
    atomic_fetch_add(&hammer_iters, iters);
    atomic_fetch_add(&hammer_bytes, bytes_moved);
    free(src);
    free(dst);
    return NULL;
}

static void test_threads(void)
{
    double seconds = sanitizer ? 1.0 : 10.0;
    hammer_deadline = test_now_s() + seconds;
    pthread_t t[THREADS];
    for (intptr_t i = 0; i < THREADS; i++)
        REQUIRE(pthread_create(&t[i], NULL, hammer, (void *)i) == 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    long long iters = atomic_load(&hammer_iters);
    printf("%d threads for %.0f s: %lld round trips, %.1f GB moved, %d errors\n", THREADS,
           seconds, iters, (double)atomic_load(&hammer_bytes) / 1e9,
           atomic_load(&hammer_errors));
    CHECK(atomic_load(&hammer_errors) == 0);
    CHECK(iters >= THREADS);
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
}

/* ---- the default stream --------------------------------------------------------------------- */

static void test_default_stream(void)
{
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_stream ds = {0}, ds2 = {0};
    CHECK_OK(sc_context_default_stream(c, &ds));
    CHECK(ds.id != 0);
    CHECK_OK(sc_context_default_stream(c, &ds2));
    CHECK(ds2.id == ds.id);
    int p = 12345;
    CHECK_OK(sc_stream_priority(ds, &p));
    CHECK(p == 0);

    /* SC_DEFAULT_STREAM and the handle name the same stream. */
    sc_buffer b = make_buffer_in(c, SC_U8, 1 << 20, "default b");
    uint8_t *r = test_xmalloc(1 << 20), *back = test_xmalloc(1 << 20);
    test_fill_random(r, 1 << 20, 60);
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), r, 1 << 20));
    memset(back, 0xA5, 1 << 20);
    CHECK_OK(sc_copy_to_host(ds, back, 1 << 20, sc_view_of(b)));
    CHECK_BYTES(back, r, 1 << 20, "default stream by macro, then by handle");
    test_fill_random(r, 1 << 20, 61);
    CHECK_OK(sc_copy_from_host(ds, sc_view_of(b), r, 1 << 20));
    memset(back, 0xA5, 1 << 20);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, 1 << 20, sc_view_of(b)));
    CHECK_BYTES(back, r, 1 << 20, "default stream by handle, then by macro");
    uint8_t v = 0x42;
    CHECK_OK(sc_fill(ds, view(b, 5, 10), &v));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, 10, view(b, 5, 10)));
    for (int k = 0; k < 10; k++)
        CHECK(back[k] == 0x42);

    sc_event e = make_event_in(c, false, "default ev");
    CHECK_OK(sc_event_record(e, SC_DEFAULT_STREAM));
    CHECK_OK(sc_stream_wait(ds, e));
    CHECK_OK(sc_event_record(e, ds));
    CHECK_OK(sc_event_synchronize(e));
    CHECK_OK(sc_event_destroy(e));
    CHECK_OK(sc_stream_synchronize(ds));
    sc_status q = sc_stream_query(ds);
    CHECK(q == SC_OK || q == SC_ERR_NOT_READY);

    /* It can't be destroyed, and stays usable. */
    CHECK_STATUS(sc_stream_destroy(ds), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_stream_destroy");
    printf("destroying the default stream: %s\n", sc_last_error());
    q = sc_stream_destroy(SC_DEFAULT_STREAM);
    printf("sc_stream_destroy(SC_DEFAULT_STREAM): %s\n", sc_status_name(q));
    CHECK(q != SC_OK);
    CHECK_OK(sc_stream_synchronize(ds));
    CHECK(small_roundtrip(ds, b, 62));

    CHECK_OK(sc_buffer_destroy(b));
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(c, NULL, 0, &live));
    CHECK(live == 0); /* the default stream is not listed */
    CHECK_OK(sc_context_destroy(c)); /* and is no leak */
    CHECK_STATUS(sc_stream_synchronize(ds), SC_ERR_STALE_HANDLE);
    free(r);
    free(back);
}

/* ---- two contexts on one device ------------------------------------------------------------- */

static void test_cross_context(void)
{
    sc_context c1, c2;
    REQUIRE(sc_context_create(NULL, &c1) == SC_OK);
    REQUIRE(sc_context_create(NULL, &c2) == SC_OK);
    sc_stream s1 = make_stream_in(c1, "ctx1 stream"), s2 = make_stream_in(c2, "ctx2 stream");
    sc_buffer b1 = make_buffer_in(c1, SC_F32, 1024, "ctx1 buffer");
    sc_buffer b1b = make_buffer_in(c1, SC_F32, 1024, "ctx1 buffer b");
    sc_buffer b2 = make_buffer_in(c2, SC_F32, 1024, "ctx2 buffer");
    sc_host_buffer h1 = {0};
    sc_host_buffer_desc hd = {.bytes = 4096, .label = "ctx1 pinned"};
    REQUIRE(sc_host_buffer_create(c1, &hd, &h1) == SC_OK);
    sc_event e1 = make_event_in(c1, false, "ctx1 event");

    uint8_t r[4096], back[4096];
    test_fill_random(r, sizeof r, 70);
    CHECK_OK(sc_copy_from_host(s2, sc_view_of(b2), r, sizeof r));
    CHECK_OK(sc_stream_synchronize(s2));

    float f = 9.0f;
    CHECK_STATUS(sc_copy_from_host(s1, sc_view_of(b2), back, sizeof back), SC_ERR_WRONG_CONTEXT);
    CHECK_MSG("sc_copy_from_host");
    memset(back, 0xA5, sizeof back);
    CHECK_STATUS(sc_copy_to_host(s1, back, sizeof back, sc_view_of(b2)), SC_ERR_WRONG_CONTEXT);
    for (size_t k = 0; k < sizeof back; k++)
        if (back[k] != 0xA5) {
            CHECK(!"refused copy wrote the destination");
            break;
        }
    CHECK_STATUS(sc_fill(s1, sc_view_of(b2), &f), SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_copy(s1, sc_view_of(b1), sc_view_of(b2)), SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_copy(s1, sc_view_of(b2), sc_view_of(b1)), SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_copy(s2, sc_view_of(b1), sc_view_of(b1b)), SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_copy_from_host_buffer(s2, sc_view_of(b2), h1, 0), SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, sc_view_of(b2), h1, 0),
                 SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_copy_to_host_buffer(s1, h1, 0, sc_view_of(b2)), SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_event_record(e1, s2), SC_ERR_WRONG_CONTEXT);
    CHECK_STATUS(sc_stream_wait(s2, e1), SC_ERR_WRONG_CONTEXT);
    sc_buffer nb = {0};
    sc_buffer_desc bd = {.dtype = SC_U8, .count = 64, .stream = s2};
    CHECK_STATUS(sc_buffer_create(c1, &bd, &nb), SC_ERR_WRONG_CONTEXT);
    CHECK(nb.id == 0);

    /* Nothing was touched, and both contexts work. */
    memset(back, 0xA5, sizeof back);
    CHECK_OK(sc_copy_to_host(s2, back, sizeof back, sc_view_of(b2)));
    CHECK_BYTES(back, r, sizeof r, "buffer of context 2 after refused uses");
    CHECK(small_roundtrip(s1, b1, 71));
    CHECK(small_roundtrip(SC_DEFAULT_STREAM, b1b, 72));
    CHECK(small_roundtrip(s2, b2, 73));
    CHECK_OK(sc_event_record(e1, s1));
    CHECK_OK(sc_event_synchronize(e1));

    CHECK_OK(sc_event_destroy(e1));
    CHECK_OK(sc_host_buffer_destroy(h1));
    CHECK_OK(sc_buffer_destroy(b1));
    CHECK_OK(sc_buffer_destroy(b1b));
    CHECK_OK(sc_buffer_destroy(b2));
    CHECK_OK(sc_stream_destroy(s1));
    CHECK_OK(sc_stream_destroy(s2));
    CHECK_OK(sc_context_destroy(c1));
    CHECK_OK(sc_context_destroy(c2));
}

/* ---- leaked streams and events -------------------------------------------------------------- */

static void test_leaked_stream(void)
{
    sc_context c;
    REQUIRE(sc_context_create(NULL, &c) == SC_OK);
    sc_stream s = make_stream_in(c, "leaky-stream");
    sc_event e = make_event_in(c, true, "leaky-event");
    CHECK_OK(sc_event_record(e, s));
    sc_set_log_callback(test_log_capture, NULL);
    test_log_text[0] = '\0';
    CHECK_STATUS(sc_context_destroy(c), SC_ERR_LEAKED);
    CHECK_MSG("2 objects");
    sc_set_log_callback(NULL, NULL);
    CHECK(strstr(test_log_text, "stream 'leaky-stream'") != NULL);
    CHECK(strstr(test_log_text, "event 'leaky-event'") != NULL);
    CHECK(strstr(test_log_text, "test_gpu_streams.c:") != NULL);
    CHECK_STATUS(sc_stream_synchronize(s), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_event_query(e), SC_ERR_STALE_HANDLE);
}

int main(void)
{
    gpu_require();
    sanitizer = getenv("SAFECUDA_UNDER_SANITIZER") != NULL;
    if (sanitizer)
        printf("SAFECUDA_UNDER_SANITIZER: heavy parts shrunk\n");
    double t0 = test_now_s();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    TEST_RUN(test_priorities);
    TEST_RUN(test_events);
    TEST_RUN(test_ordering);
    TEST_RUN(test_war_waw);
    TEST_RUN(test_destroy_busy_stream);
    TEST_RUN(test_threads);
    TEST_RUN(test_default_stream);
    TEST_RUN(test_cross_context);
    TEST_RUN(test_leaked_stream);
    CHECK_OK(sc_context_destroy(ctx)); /* SC_OK: nothing leaked, default stream included */
    printf("total %.2f s\n", test_now_s() - t0);
    return test_result("test_gpu_streams");
}
