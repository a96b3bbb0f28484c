/* The real library against the test device (testdevice/testdevice.c): buffers, views,
 * host buffers, copies (the fake's "device" memory is host memory, so data round trips
 * are checked byte for byte), fills, streams, events, cross-stream ordering, accounting,
 * leak reports, stale handles, launch argument checks against a hand-written PTX
 * module and loading modules from files. At the end every object the fake holds is back to where it started and the
 * fake saw no misuse (no out-of-range pointer, no unknown handle).
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "../test.h"
#include "core/registry.h"
#include "driver/driver.h"
#include "td_control.h"
#include "td_ptx.h"

static sc_context ctx;

static sc_buffer make_buffer(sc_context c, sc_dtype dtype, uint64_t count, const char *label)
{
    sc_buffer b = {0};
    CHECK_OK(sc_buffer_create(c, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                   .label = label},
                              &b));
    return b;
}

static sc_memory_stats memory(sc_context c)
{
    sc_memory_stats m;
    memset(&m, 0xab, sizeof m);
    CHECK_OK(sc_context_memory(c, &m));
    return m;
}

/* ---- the device -------------------------------------------------------------------------- */

static void test_device(void)
{
    int version = 0, n = -1;
    CHECK_OK(sc_driver_version(&version));
    CHECK(version == 13000);
    CHECK_OK(sc_device_count(&n));
    CHECK(n == 1);
    char path[1024];
    CHECK_OK(sc_driver_path(path, sizeof path));
    CHECK(strstr(path, "libsafecuda_testdevice.so") != NULL);

    sc_device_props p;
    CHECK_OK(sc_device_info(0, &p));
    CHECK(strcmp(p.name, "safecuda test device (host memory, runs no kernels)") == 0);
    CHECK(p.cc_major == 9 && p.cc_minor == 0);
    CHECK(p.sm_count == 132);
    CHECK(p.total_memory == 4096ull << 20);
    CHECK(p.shared_per_block == 48 * 1024);
    CHECK(p.shared_per_block_optin == 227 * 1024);
    CHECK(p.shared_per_sm == 228 * 1024);
    CHECK(p.max_threads_per_block == 1024 && p.max_threads_per_sm == 2048);
    CHECK(p.warp_size == 32 && p.registers_per_block == 65536 && p.registers_per_sm == 65536);
    CHECK(p.max_grid[0] == 2147483647 && p.max_grid[1] == 65535 && p.max_grid[2] == 65535);
    CHECK(p.max_block[0] == 1024 && p.max_block[1] == 1024 && p.max_block[2] == 64);
    CHECK(p.l2_cache_bytes == 50 * 1024 * 1024);
    CHECK(p.memory_clock_khz == 2619000 && p.memory_bus_width_bits == 5120);
    CHECK(fabs(p.memory_bandwidth_gbs - 3352.32) < 0.01);
    CHECK(p.async_engines == 2);
    CHECK(p.memory_pools_supported);
    CHECK(strcmp(p.pci_bus_id, "0000:fa:00.0") == 0); /* the library lowercases it */
    CHECK(strcmp(p.uuid, "GPU-fa4e0d3e-5afe-c0da-0000-000000000001") == 0);

    CHECK_FAIL(sc_device_info(1, &p), SC_ERR_NO_DEVICE, "sc_device_info");
    CHECK_FAIL(sc_device_info(-1, &p), SC_ERR_NO_DEVICE, "sc_device_info");

    uint64_t free_b = 0, total_b = 0;
    CHECK_OK(sc_device_memory(0, &free_b, &total_b));
    CHECK(total_b == 4096ull << 20);
    CHECK(free_b <= total_b);
}

/* ---- buffers, views, accounting ---------------------------------------------------------- */

static void test_buffers(void)
{
    fake_counts before = fake_counts_now();
    sc_memory_stats m0 = memory(ctx);

    sc_buffer b = make_buffer(ctx, SC_F32, 1000, "b");
    sc_buffer_props props;
    CHECK_OK(sc_buffer_info(b, &props));
    CHECK(props.dtype == SC_F32 && props.count == 1000 && props.bytes == 4000);
    CHECK(strcmp(props.label, "b") == 0);
    CHECK(strcmp(props.file, "test_td_bookkeeping.c") == 0);
    CHECK(props.context.id == ctx.id);

    sc_memory_stats m = memory(ctx);
    CHECK(m.bytes_in_use == m0.bytes_in_use + 4000);
    CHECK(m.live_buffers == m0.live_buffers + 1);
    CHECK(m.peak_bytes >= m.bytes_in_use);
    CHECK(m.pool_reserved >= 4000);
    CHECK(m.device_total == 4096ull << 20);
    CHECK(m.device_free == m.device_total - fake.device_used_bytes() - fake.pool_cached_bytes());
    CHECK(fake.live_device_allocations() == before.device + 1);

    uint64_t dptr = 0;
    CHECK_OK(sc_buffer_device_ptr(b, &dptr));
    CHECK(dptr != 0 && dptr % 256 == 0);

    /* Creation errors leave the accounting alone. */
    sc_buffer tmp = {12345};
    CHECK_FAIL(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 0}, &tmp),
               SC_ERR_INVALID_ARGUMENT, "sc_buffer_create");
    CHECK(tmp.id == 0); /* the out-handle is cleared on failure */
    CHECK_FAIL(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_DTYPE_COUNT, .count = 4},
                                &tmp),
               SC_ERR_INVALID_ARGUMENT, "sc_buffer_create");
    CHECK_FAIL(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F64, .count = UINT64_MAX / 4},
                                &tmp),
               SC_ERR_OVERFLOW, "sc_buffer_create");
    /* 5 GiB on a 4 GiB device: the driver's OOM, after the allocator's trim-and-retry. */
    CHECK_FAIL(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 5ull << 30,
                                                       .label = "huge"},
                                &tmp),
               SC_ERR_OUT_OF_MEMORY, "sc_buffer_create");
    CHECK_MSG("huge");
    CHECK(tmp.id == 0);
    m = memory(ctx);
    CHECK(m.bytes_in_use == m0.bytes_in_use + 4000);
    CHECK(m.live_buffers == m0.live_buffers + 1);
    CHECK(m.peak_bytes < (5ull << 30)); /* the failed request's peak was taken back */
    CHECK_OK(sc_context_check(ctx));   /* OOM is not sticky */

    /* Views. */
    sc_buffer b2 = make_buffer(ctx, SC_F32, 1000, "b2");
    sc_view v;
    CHECK_OK(sc_buffer_view(b2, 10, 20, &v));
    CHECK(v.buffer.id == b2.id && v.offset == 10 && v.count == 20);
    CHECK_OK(sc_buffer_view(b2, 990, SC_WHOLE, &v));
    CHECK(v.offset == 990 && v.count == 10);
    CHECK_OK(sc_buffer_view(b2, 1000, SC_WHOLE, &v)); /* empty, at the end */
    CHECK(v.count == 0);
    CHECK_FAIL(sc_buffer_view(b2, 1001, SC_WHOLE, &v), SC_ERR_OUT_OF_BOUNDS, "sc_buffer_view");
    CHECK_FAIL(sc_buffer_view(b2, 990, 11, &v), SC_ERR_OUT_OF_BOUNDS, "sc_buffer_view");
    CHECK_MSG("b2");
    CHECK_FAIL(sc_buffer_view(b2, UINT64_MAX - 1, 5, &v), SC_ERR_OVERFLOW, "sc_buffer_view");
    CHECK_FAIL(sc_buffer_view(b2, 5, UINT64_MAX - 1, &v), SC_ERR_OVERFLOW, "sc_buffer_view");
    sc_view sub;
    CHECK_OK(sc_buffer_view(b2, 100, 50, &v));
    CHECK_OK(sc_view_sub(v, 10, 5, &sub));
    CHECK(sub.offset == 110 && sub.count == 5);
    CHECK_OK(sc_view_sub(v, 10, SC_WHOLE, &sub));
    CHECK(sub.offset == 110 && sub.count == 40);
    CHECK_FAIL(sc_view_sub(v, 45, 6, &sub), SC_ERR_OUT_OF_BOUNDS, "sc_view_sub");
    CHECK_FAIL(sc_view_sub(v, 51, SC_WHOLE, &sub), SC_ERR_OUT_OF_BOUNDS, "sc_view_sub");
    CHECK_FAIL(sc_view_sub(v, UINT64_MAX, 2, &sub), SC_ERR_OVERFLOW, "sc_view_sub");
    CHECK_FAIL(sc_view_sub((sc_view){b2, 900, 200}, 0, 1, &sub), SC_ERR_OUT_OF_BOUNDS,
               "sc_view_sub");

    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_buffer_destroy(b2));
    m = memory(ctx);
    CHECK(m.bytes_in_use == m0.bytes_in_use);
    CHECK(m.live_buffers == m0.live_buffers);
    CHECK(m.pool_reserved >= 8000); /* freed memory stays cached in the pool ... */
    CHECK_OK(sc_context_trim(ctx));
    m = memory(ctx);
    CHECK(m.pool_reserved == m0.bytes_in_use); /* ... until trimmed */
    CHECK(fake.live_device_allocations() == before.device);

    /* The budget. */
    sc_context small;
    REQUIRE(sc_context_create(&(sc_context_desc){.vram_budget = 1 << 20}, &small) == SC_OK);
    sc_buffer a1 = make_buffer(small, SC_U8, 512 << 10, "half");
    CHECK_FAIL(sc_buffer_create(small, &(sc_buffer_desc){.dtype = SC_U8, .count = 600 << 10,
                                                         .label = "over"},
                                &tmp),
               SC_ERR_BUDGET_EXCEEDED, "sc_buffer_create");
    CHECK_MSG("over");
    m = memory(small);
    CHECK(m.bytes_in_use == 512 << 10 && m.live_buffers == 1 && m.vram_budget == 1 << 20);
    CHECK(m.peak_bytes == 512 << 10);
    sc_buffer a2 = make_buffer(small, SC_U8, 512 << 10, "exactly the rest");
    m = memory(small);
    CHECK(m.bytes_in_use == 1 << 20 && m.peak_bytes == 1 << 20);
    CHECK_FAIL(sc_buffer_create(small, &(sc_buffer_desc){.dtype = SC_U8, .count = 1}, &tmp),
               SC_ERR_BUDGET_EXCEEDED, "sc_buffer_create");
    CHECK_OK(sc_buffer_destroy(a1));
    CHECK_OK(sc_buffer_destroy(a2));
    m = memory(small);
    CHECK(m.bytes_in_use == 0 && m.live_buffers == 0 && m.peak_bytes == 1 << 20);
    CHECK_OK(sc_context_destroy(small));

    char diff[256];
    if (fake_counts_diff(before, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "after the buffer tests the fake holds: %s\n", diff);
        test_failures++;
    }
}

/* ---- copies and fills --------------------------------------------------------------------- */

static void test_copies(void)
{
    enum { N = 1000 };
    float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)i * 0.5f;
    sc_buffer a = make_buffer(ctx, SC_F32, N, "a");
    sc_buffer b = make_buffer(ctx, SC_F32, N, "b");

    /* Pageable round trip. */
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(a), in, sizeof in));
    memset(out, 0, sizeof out);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(a)));
    CHECK(memcmp(in, out, sizeof in) == 0);

    /* Into and out of a sub-range. */
    float part[20];
    for (int i = 0; i < 20; i++)
        part[i] = -1.0f - (float)i;
    sc_view v;
    CHECK_OK(sc_buffer_view(a, 10, 20, &v));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, v, part, sizeof part));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(a)));
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= out[i] == (i >= 10 && i < 30 ? -1.0f - (float)(i - 10) : in[i]);
    CHECK(ok);

    /* Size and bounds checks. */
    CHECK_FAIL(sc_copy_from_host(SC_DEFAULT_STREAM, v, part, sizeof part - 4),
               SC_ERR_OUT_OF_BOUNDS, "sc_copy_from_host");
    CHECK_FAIL(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, v), SC_ERR_OUT_OF_BOUNDS,
               "sc_copy_to_host");
    CHECK_FAIL(sc_copy_from_host(SC_DEFAULT_STREAM, (sc_view){a, 990, 20}, part, sizeof part),
               SC_ERR_OUT_OF_BOUNDS, "sc_copy_from_host");
    CHECK_FAIL(sc_copy_to_host(SC_DEFAULT_STREAM, out, 8, (sc_view){a, UINT64_MAX, 2}),
               SC_ERR_OVERFLOW, "sc_copy_to_host");
    /* Zero-element views: no-ops. */
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, (sc_view){a, 5, 0}, NULL, 0));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, NULL, 0, (sc_view){a, N, SC_WHOLE}));

    /* Device to device, whole and partial, and within one buffer. */
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, sc_view_of(b), sc_view_of(a)));
    float out2[N];
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out2, sizeof out2, sc_view_of(b)));
    CHECK(memcmp(out, out2, sizeof out) == 0);
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, (sc_view){b, 0, 100}, (sc_view){b, 500, 100}));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out2, sizeof out2, sc_view_of(b)));
    CHECK(memcmp(out2, out + 500, 100 * sizeof(float)) == 0);
    CHECK(memcmp(out2 + 100, out + 100, 900 * sizeof(float)) == 0);
    CHECK_FAIL(sc_copy(SC_DEFAULT_STREAM, (sc_view){b, 0, 100}, (sc_view){b, 50, 100}),
               SC_ERR_INVALID_ARGUMENT, "sc_copy"); /* overlap */
    CHECK_FAIL(sc_copy(SC_DEFAULT_STREAM, (sc_view){b, 0, 100}, (sc_view){a, 0, 99}),
               SC_ERR_OUT_OF_BOUNDS, "sc_copy");
    sc_buffer c = make_buffer(ctx, SC_I32, N, "c");
    CHECK_FAIL(sc_copy(SC_DEFAULT_STREAM, sc_view_of(c), sc_view_of(a)), SC_ERR_TYPE_MISMATCH,
               "sc_copy");
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, (sc_view){b, 3, 0}, (sc_view){a, 7, 0}));

    /* Fills of every element size; 8-byte values with equal and unequal halves. */
    float f = 2.5f;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){a, 100, 50}, &f));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(a)));
    ok = 1;
    for (int i = 100; i < 150; i++)
        ok &= out[i] == 2.5f;
    CHECK(ok && out[99] != 2.5f && out[150] != 2.5f);

    sc_buffer u8 = make_buffer(ctx, SC_U8, 33, "u8");
    uint8_t b8 = 0x5a, got8[33];
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(u8), &b8));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got8, sizeof got8, sc_view_of(u8)));
    ok = 1;
    for (int i = 0; i < 33; i++)
        ok &= got8[i] == 0x5a;
    CHECK(ok);

    sc_buffer h16 = make_buffer(ctx, SC_BF16, 17, "bf16");
    uint16_t b16 = 0x3f80, got16[17]; /* bf16 1.0 */
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){h16, 1, 15}, &b16));
    uint16_t zero16 = 0;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){h16, 0, 1}, &zero16));
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){h16, 16, 1}, &zero16));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got16, sizeof got16, sc_view_of(h16)));
    ok = got16[0] == 0 && got16[16] == 0;
    for (int i = 1; i < 16; i++)
        ok &= got16[i] == 0x3f80;
    CHECK(ok);

    sc_buffer d64 = make_buffer(ctx, SC_F64, 64, "f64");
    double dv = 1.5, got64[64]; /* unequal halves: two strided 32-bit fills */
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){d64, 1, 62}, &dv));
    double dz = 0.0; /* equal halves: one 32-bit fill */
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){d64, 0, 1}, &dz));
    int64_t minus1 = -1;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){d64, 63, 1}, &minus1));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got64, sizeof got64, sc_view_of(d64)));
    ok = got64[0] == 0.0;
    for (int i = 1; i < 63; i++)
        ok &= got64[i] == 1.5;
    int64_t last;
    memcpy(&last, &got64[63], 8);
    CHECK(ok && last == -1);
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, (sc_view){d64, 64, 0}, &dv)); /* empty: no-op */
    CHECK_FAIL(sc_fill(SC_DEFAULT_STREAM, (sc_view){d64, 60, 5}, &dv), SC_ERR_OUT_OF_BOUNDS,
               "sc_fill");

    /* A zeroed buffer is zero. */
    sc_buffer z = {0};
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N, .zero = true},
                              &z));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(z)));
    ok = 1;
    for (int i = 0; i < N; i++)
        ok &= out[i] == 0.0f;
    CHECK(ok);

    sc_buffer all[] = {a, b, c, u8, h16, d64, z};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
}

/* ---- pinned host buffers ------------------------------------------------------------------ */

static void test_host_buffers(void)
{
    long host0 = fake.live_host_allocations();
    sc_host_buffer h;
    CHECK_OK(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 4096, .zero = true,
                                                               .label = "pinned"},
                                   &h));
    CHECK(fake.live_host_allocations() == host0 + 1);
    CHECK(memory(ctx).pinned_bytes == 4096);
    void *p = NULL;
    uint64_t bytes = 0;
    CHECK_OK(sc_host_buffer_ptr(h, &p, &bytes));
    CHECK(p != NULL && bytes == 4096);
    unsigned char zeros[4096] = {0};
    CHECK(memcmp(p, zeros, 4096) == 0);

    uint32_t words[256];
    for (int i = 0; i < 256; i++)
        words[i] = 0xc0de0000u + (uint32_t)i;
    CHECK_OK(sc_host_buffer_write(h, 1024, words, sizeof words));
    sc_buffer d = make_buffer(ctx, SC_U32, 256, "d");
    CHECK_OK(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, sc_view_of(d), h, 1024));
    CHECK_OK(sc_copy_to_host_buffer(SC_DEFAULT_STREAM, h, 2048, sc_view_of(d)));
    uint32_t back[256];
    CHECK_OK(sc_host_buffer_read(h, 2048, back, sizeof back));
    CHECK(memcmp(words, back, sizeof back) == 0);
    /* A part of d into the start of h. */
    CHECK_OK(sc_copy_to_host_buffer(SC_DEFAULT_STREAM, h, 0, (sc_view){d, 250, 6}));
    CHECK_OK(sc_host_buffer_ptr(h, &p, NULL));
    CHECK(memcmp(p, words + 250, 6 * sizeof(uint32_t)) == 0);

    CHECK_FAIL(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, sc_view_of(d), h, 3073),
               SC_ERR_OUT_OF_BOUNDS, "sc_copy_from_host_buffer");
    CHECK_FAIL(sc_copy_to_host_buffer(SC_DEFAULT_STREAM, h, UINT64_MAX - 8, sc_view_of(d)),
               SC_ERR_OVERFLOW, "sc_copy_to_host_buffer");
    CHECK_FAIL(sc_host_buffer_write(h, 4000, words, 97), SC_ERR_OUT_OF_BOUNDS,
               "sc_host_buffer_write");
    CHECK_FAIL(sc_host_buffer_read(h, UINT64_MAX, back, 2), SC_ERR_OVERFLOW,
               "sc_host_buffer_read");
    sc_host_buffer none = {777};
    CHECK_FAIL(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 0}, &none),
               SC_ERR_INVALID_ARGUMENT, "sc_host_buffer_create");
    CHECK(none.id == 0);
    CHECK_FAIL(sc_host_buffer_ptr(none, &p, NULL), SC_ERR_STALE_HANDLE, "sc_host_buffer_ptr");

    /* Pinned memory past the fake's host limit is a host OOM. */
    sc_host_buffer big;
    CHECK_FAIL(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 2ull << 30}, &big),
               SC_ERR_HOST_OUT_OF_MEMORY, "sc_host_buffer_create");

    /* try_destroy of an idle buffer destroys it. */
    sc_host_buffer h2;
    CHECK_OK(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = 64}, &h2));
    CHECK_OK(sc_host_buffer_try_destroy(h2));
    CHECK_FAIL(sc_host_buffer_destroy(h2), SC_ERR_STALE_HANDLE, "sc_host_buffer_destroy");

    CHECK_OK(sc_host_buffer_ptr(h, &p, NULL)); /* h's handle is unchanged by the failures */
    CHECK_OK(sc_host_buffer_destroy(h));
    CHECK_OK(sc_buffer_destroy(d));
    CHECK(memory(ctx).pinned_bytes == 0);
    CHECK(fake.live_host_allocations() == host0);
}

/* ---- streams, events, ordering ------------------------------------------------------------- */

static void test_streams_events(void)
{
    long streams0 = fake.live_streams(), events0 = fake.live_events();
    sc_stream s1, s2, s3, dflt;
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.priority = -10, .label = "high"}, &s1));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.priority = 3}, &s2));
    CHECK_OK(sc_stream_create(ctx, NULL, &s3));
    int prio = 99;
    CHECK_OK(sc_stream_priority(s1, &prio));
    CHECK(prio == -5); /* clamped to the device's range [0, -5] */
    CHECK_OK(sc_stream_priority(s2, &prio));
    CHECK(prio == 0);
    CHECK(fake.live_streams() == streams0 + 3);
    CHECK_OK(sc_context_default_stream(ctx, &dflt));
    CHECK(dflt.id != 0);
    CHECK_FAIL(sc_stream_destroy(dflt), SC_ERR_INVALID_ARGUMENT, "sc_stream_destroy");
    CHECK_FAIL(sc_stream_synchronize(SC_DEFAULT_STREAM), SC_ERR_STALE_HANDLE,
               "sc_stream_synchronize");
    CHECK_OK(sc_stream_synchronize(s1));
    CHECK_OK(sc_stream_query(s2));
    CHECK_OK(sc_stream_synchronize(dflt));

    sc_event e1, e2, plain;
    CHECK_OK(sc_event_create(ctx, &(sc_event_desc){.timing = true, .label = "start"}, &e1));
    CHECK_OK(sc_event_create(ctx, &(sc_event_desc){.timing = true, .blocking_sync = true}, &e2));
    CHECK_OK(sc_event_create(ctx, NULL, &plain));
    CHECK(fake.live_events() == events0 + 3);
    float ms = -1;
    CHECK_FAIL(sc_event_elapsed(e1, e2, &ms), SC_ERR_INVALID_ARGUMENT, "sc_event_elapsed");
    CHECK_MSG("never recorded");
    CHECK_OK(sc_event_record(e1, s1));
    CHECK_OK(sc_event_record(e2, SC_DEFAULT_STREAM));
    CHECK_OK(sc_event_elapsed(e1, e2, &ms));
    CHECK(ms > 0.0f && ms < 0.01f);
    CHECK_OK(sc_event_record(plain, s2));
    CHECK_FAIL(sc_event_elapsed(e1, plain, &ms), SC_ERR_INVALID_ARGUMENT, "sc_event_elapsed");
    CHECK_MSG(".timing");
    CHECK_OK(sc_event_query(plain));
    CHECK_OK(sc_event_synchronize(e1));
    CHECK_OK(sc_stream_wait(s2, e1));
    CHECK_OK(sc_stream_wait(SC_DEFAULT_STREAM, plain));

    /* Cross-stream ordering: count the waits the library enqueues. */
    sc_buffer b = make_buffer(ctx, SC_F32, 256, "shared");
    float data[256] = {0};
    CHECK_OK(sc_copy_from_host(s1, sc_view_of(b), data, sizeof data));
    long ev_before = fake.live_events();
    REQUIRE(sci_fault_arm("cuStreamWaitEvent", 0, 0)); /* nth 0: count only */
    CHECK_OK(sc_copy_to_host(s1, data, sizeof data, sc_view_of(b))); /* same stream */
    CHECK(sci_fault_calls() == 0);
    CHECK_OK(sc_copy_to_host(s2, data, sizeof data, sc_view_of(b))); /* read after write */
    CHECK(sci_fault_calls() == 1);
    /* s2 already waits for that write; the library currently waits once more (a redundant
     * cuStreamWaitEvent, harmless for ordering): allow it, but no more. */
    uint64_t w = sci_fault_calls();
    CHECK_OK(sc_copy_to_host(s2, data, sizeof data, sc_view_of(b)));
    uint64_t redundant = sci_fault_calls() - w;
    CHECK(redundant <= 1);
    w = sci_fault_calls();
    CHECK_OK(sc_copy_to_host(s3, data, sizeof data, sc_view_of(b))); /* another reader */
    CHECK(sci_fault_calls() == w + 1);
    float one = 1.0f;
    w = sci_fault_calls();
    CHECK_OK(sc_fill(s1, sc_view_of(b), &one)); /* write after the reads on s2 and s3 */
    CHECK(sci_fault_calls() == w + 2);
    sci_fault_disarm();
    CHECK(fake.live_events() > ev_before); /* the ordering events */
    CHECK_OK(sc_copy_to_host(s3, data, sizeof data, sc_view_of(b)));
    CHECK(data[0] == 1.0f && data[255] == 1.0f);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(fake.live_events() == events0 + 3); /* the buffer's ordering events went with it */

    /* Without tracking nothing is ordered for the caller. */
    sc_context untracked;
    REQUIRE(sc_context_create(&(sc_context_desc){.disable_event_tracking = true}, &untracked) ==
            SC_OK);
    sc_stream u1, u2;
    CHECK_OK(sc_stream_create(untracked, NULL, &u1));
    CHECK_OK(sc_stream_create(untracked, NULL, &u2));
    sc_buffer ub = make_buffer(untracked, SC_F32, 256, "untracked");
    long ev = fake.live_events();
    REQUIRE(sci_fault_arm("cuStreamWaitEvent", 0, 0));
    CHECK_OK(sc_copy_from_host(u1, sc_view_of(ub), data, sizeof data));
    CHECK_OK(sc_copy_to_host(u2, data, sizeof data, sc_view_of(ub)));
    CHECK_OK(sc_fill(u1, sc_view_of(ub), &one));
    CHECK(sci_fault_calls() == 0);
    sci_fault_disarm();
    CHECK(fake.live_events() == ev);
    /* A stream of one context is refused by the other. */
    CHECK_FAIL(sc_copy_to_host(s1, data, sizeof data, sc_view_of(ub)), SC_ERR_WRONG_CONTEXT,
               "sc_copy_to_host");
    CHECK_FAIL(sc_event_record(e1, u1), SC_ERR_WRONG_CONTEXT, "sc_event_record");
    sc_buffer tb = make_buffer(ctx, SC_F32, 256, "tracked");
    CHECK_FAIL(sc_copy(SC_DEFAULT_STREAM, sc_view_of(tb), sc_view_of(ub)), SC_ERR_WRONG_CONTEXT,
               "sc_copy");
    CHECK_OK(sc_buffer_destroy(tb));
    CHECK_OK(sc_buffer_destroy(ub));
    CHECK_OK(sc_stream_destroy(u1));
    CHECK_OK(sc_stream_destroy(u2));
    CHECK_OK(sc_context_destroy(untracked));

    /* Destroying a stream with a buffer last used on it: the free goes elsewhere. */
    sc_buffer last = make_buffer(ctx, SC_F32, 64, "last used on s3");
    CHECK_OK(sc_fill(s3, sc_view_of(last), &one));
    CHECK_OK(sc_stream_destroy(s3));
    CHECK_OK(sc_buffer_destroy(last));

    CHECK_OK(sc_event_destroy(e1));
    CHECK_OK(sc_event_destroy(e2));
    CHECK_OK(sc_event_destroy(plain));
    CHECK_OK(sc_stream_destroy(s1));
    CHECK_OK(sc_stream_destroy(s2));
    CHECK(fake.live_events() == events0);
    CHECK(fake.live_streams() == streams0); /* the default stream stays with ctx */
}

/* ---- stale, foreign and forged handles ----------------------------------------------------- */

static void test_stale_handles(void)
{
    sc_buffer b = make_buffer(ctx, SC_F32, 16, "doomed");
    sc_view v = sc_view_of(b);
    sc_stream s;
    CHECK_OK(sc_stream_create(ctx, NULL, &s));
    sc_event e;
    CHECK_OK(sc_event_create(ctx, NULL, &e));
    float f[16] = {0};
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_FAIL(sc_buffer_destroy(b), SC_ERR_STALE_HANDLE, "sc_buffer_destroy");
    CHECK_MSG("was destroyed"); /* with the destroyed object's creation site */
    CHECK_FAIL(sc_copy_from_host(s, v, f, sizeof f), SC_ERR_STALE_HANDLE, "sc_copy_from_host");
    CHECK_FAIL(sc_fill(s, v, f), SC_ERR_STALE_HANDLE, "sc_fill");
    sc_view sub;
    CHECK_FAIL(sc_view_sub(v, 0, 1, &sub), SC_ERR_STALE_HANDLE, "sc_view_sub");
    /* Wrong kinds: a stream as a buffer, a buffer as an event. */
    sc_buffer as_buffer = {s.id};
    CHECK_FAIL(sc_buffer_destroy(as_buffer), SC_ERR_WRONG_KIND, "sc_buffer_destroy");
    CHECK_FAIL(sc_event_query((sc_event){b.id}), SC_ERR_WRONG_KIND, "sc_event_query");
    /* A forged id: the stream's slot with a later generation. */
    uint64_t forged = (s.id & ~(((1ull << 32) - 1) << 24)) |
                      ((uint64_t)(sci_id_generation(s.id) + 7) << 24);
    CHECK_FAIL(sc_stream_synchronize((sc_stream){forged}), SC_ERR_STALE_HANDLE,
               "sc_stream_synchronize");
    uint64_t never = ((uint64_t)SCI_KIND_STREAM << 56) | (1ull << 24) | 0xfffff0u;
    CHECK_FAIL(sc_stream_query((sc_stream){never}), SC_ERR_STALE_HANDLE, "sc_stream_query");
    CHECK_MSG("never issued");
    CHECK_OK(sc_stream_destroy(s));
    CHECK_FAIL(sc_stream_destroy(s), SC_ERR_STALE_HANDLE, "sc_stream_destroy");
    CHECK_FAIL(sc_event_record(e, s), SC_ERR_STALE_HANDLE, "sc_event_record");
    CHECK_OK(sc_event_destroy(e));
    CHECK_FAIL(sc_event_query(e), SC_ERR_STALE_HANDLE, "sc_event_query");
    sc_context gone;
    REQUIRE(sc_context_create(NULL, &gone) == SC_OK);
    CHECK_OK(sc_context_destroy(gone));
    sc_buffer x;
    CHECK_FAIL(sc_buffer_create(gone, &(sc_buffer_desc){.dtype = SC_F32, .count = 1}, &x),
               SC_ERR_STALE_HANDLE, "sc_buffer_create");
    CHECK_FAIL(sc_context_destroy(gone), SC_ERR_STALE_HANDLE, "sc_context_destroy");
}

/* ---- leak reports ---------------------------------------------------------------------------- */

static char log_text[8192];
static void capture(sc_log_level level, const char *message, void *user)
{
    (void)level, (void)user;
    size_t len = strlen(log_text);
    snprintf(log_text + len, sizeof log_text - len, "%s\n", message);
}

static void test_leak_report(void)
{
    fake_counts before = fake_counts_now();
    sc_context leaky;
    REQUIRE(sc_context_create(NULL, &leaky) == SC_OK);
    sc_buffer b = make_buffer(leaky, SC_F16, 300, "forgotten weights");
    sc_host_buffer h;
    CHECK_OK(sc_host_buffer_create(leaky, &(sc_host_buffer_desc){.bytes = 100, .label = "pin"},
                                   &h));
    sc_stream s;
    CHECK_OK(sc_stream_create(leaky, &(sc_stream_desc){.label = "side"}, &s));
    sc_event e;
    CHECK_OK(sc_event_create(leaky, &(sc_event_desc){.label = "tick"}, &e));
    sc_module m;
    CHECK_OK(sc_module_load_image(leaky, fake_test_ptx, sizeof fake_test_ptx - 1, &m));
    sc_kernel k;
    CHECK_OK(sc_kernel_get(m, "add", &k));
    float half = 0;
    CHECK_OK(sc_fill(s, sc_view_of(b), &half)); /* the buffer was used on s */

    size_t count = 0;
    sc_object_info info[8];
    CHECK_OK(sc_context_live_objects(leaky, info, 8, &count));
    CHECK(count == 6); /* buffer, host buffer, stream, event, module, kernel */
    int seen_buffer = 0;
    for (size_t i = 0; i < count && i < 8; i++)
        if (strcmp(info[i].kind, "buffer") == 0) {
            seen_buffer = 1;
            CHECK(strcmp(info[i].label, "forgotten weights") == 0);
            CHECK(info[i].bytes == 600);
            CHECK(strcmp(info[i].file, "test_td_bookkeeping.c") == 0 && info[i].line > 0);
        }
    CHECK(seen_buffer);
    CHECK_OK(sc_context_live_objects(leaky, NULL, 0, &count));
    CHECK(count == 6);

    log_text[0] = '\0';
    sc_set_log_callback(capture, NULL);
    CHECK_FAIL(sc_context_destroy(leaky), SC_ERR_LEAKED, "sc_context_destroy");
    sc_set_log_callback(NULL, NULL);
    CHECK_MSG("6 objects");
    CHECK(strstr(log_text, "forgotten weights") != NULL);
    CHECK(strstr(log_text, "600 bytes") != NULL);
    CHECK(strstr(log_text, "test_td_bookkeeping.c:") != NULL);
    CHECK(strstr(log_text, "side") != NULL && strstr(log_text, "tick") != NULL);
    CHECK(strstr(log_text, "pin") != NULL);
    /* Everything was freed, in the driver too, and the handles are stale. */
    char diff[256];
    if (fake_counts_diff(before, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "after the leak report the fake still holds: %s\n", diff);
        test_failures++;
    }
    CHECK_FAIL(sc_buffer_destroy(b), SC_ERR_STALE_HANDLE, "sc_buffer_destroy");
    CHECK_FAIL(sc_kernel_info(k, &(sc_kernel_props){0}), SC_ERR_STALE_HANDLE, "sc_kernel_info");
    CHECK_FAIL(sc_host_buffer_destroy(h), SC_ERR_STALE_HANDLE, "sc_host_buffer_destroy");

    /* A clean context reports nothing. */
    sc_context clean;
    REQUIRE(sc_context_create(NULL, &clean) == SC_OK);
    size_t n = 99;
    CHECK_OK(sc_context_live_report(clean, &n));
    CHECK(n == 0);
    CHECK_OK(sc_context_destroy(clean));
}

/* ---- modules and checked launches ----------------------------------------------------------- */

static void test_launch(void)
{
    long modules0 = fake.live_modules();
    sc_module m;
    CHECK_OK(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m));
    CHECK(fake.live_modules() == modules0 + 1);
    const char *names[4] = {0};
    size_t n = 0;
    CHECK_OK(sc_module_kernel_names(m, names, 4, &n));
    CHECK(n == 3 && names[0] && strcmp(names[0], "add") == 0);
    CHECK(names[1] && strcmp(names[1], "pack") == 0 && names[2] &&
          strcmp(names[2], "tiled") == 0);

    sc_kernel add, pack, tiled, nope;
    CHECK_OK(sc_kernel_get(m, "add", &add));
    CHECK_OK(sc_kernel_get(m, "pack", &pack));
    CHECK_OK(sc_kernel_get(m, "tiled", &tiled));
    CHECK_FAIL(sc_kernel_get(m, "sub", &nope), SC_ERR_INVALID_ARGUMENT, "sc_kernel_get");
    CHECK_MSG("'sub'");
    sc_kernel_props kp;
    CHECK_OK(sc_kernel_info(add, &kp));
    CHECK(strcmp(kp.name, "add") == 0 && kp.n_params == 3 && kp.registers == 16);
    CHECK(kp.max_threads_per_block == 1024 && kp.max_dynamic_shared_bytes == 48 * 1024);
    CHECK(kp.ptx_version == 80 && kp.binary_version == 90 && !kp.typed);
    CHECK_OK(sc_kernel_info(tiled, &kp));
    CHECK(kp.n_params == 0 && kp.max_threads_per_block == 256 &&
          kp.static_shared_bytes == 1024 && kp.max_dynamic_shared_bytes == 47 * 1024);

    enum { N = 1000 };
    sc_buffer a = make_buffer(ctx, SC_F32, N, "a");
    sc_buffer b = make_buffer(ctx, SC_F32, N, "b");
    sc_launch_desc cfg;
    CHECK_OK(sc_launch_config_for(N, add, &cfg));
    CHECK(cfg.block.x >= 32 && cfg.block.x <= 1024 && cfg.block.x % 32 == 0);
    CHECK((uint64_t)cfg.grid.x * cfg.block.x >= N);
    int blocks = 0;
    CHECK_OK(sc_kernel_occupancy(add, 256, 0, &blocks));
    CHECK(blocks == 8);
    CHECK_FAIL(sc_kernel_occupancy(add, 2048, 0, &blocks), SC_ERR_INVALID_ARGUMENT,
               "sc_kernel_occupancy");

    /* A good launch, then every kind of refusal: nothing reaches the driver. */
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                       sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)));
    REQUIRE(sci_fault_arm("cuLaunchKernel", 0, 0));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b))),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    CHECK_MSG("takes 3 arguments but 2 were given");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N), sc_arg_u32(0)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u64(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    CHECK_MSG("argument 2");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_u32(1),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    CHECK_MSG("argument 0");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_inout(sc_view_of(b))),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    sc_launch_desc bad = {.grid = {4, 1, 1}, .block = {2048, 1, 1}};
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    CHECK_MSG("block.x = 2048");
    bad = (sc_launch_desc){.grid = {0, 1, 1}, .block = {128, 1, 1}};
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    bad = (sc_launch_desc){.grid = {1, 65536, 1}, .block = {128, 1, 1}};
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    bad = (sc_launch_desc){.grid = {1, 1, 1}, .block = {16, 1, 65}};
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    bad = (sc_launch_desc){.grid = {1, 1, 1}, .block = {64, 32, 1}}; /* 2048 threads */
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    bad = (sc_launch_desc){.grid = {1, 1, 1}, .block = {128, 1, 1}, .shared_bytes = 64 << 10};
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    CHECK_MSG("sc_kernel_set_max_dynamic_shared");
    bad.shared_bytes = 300 << 10;
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    sc_launch_desc big_block = {.grid = {1, 1, 1}, .block = {512, 1, 1}};
    CHECK_FAIL(sc_kernel_launch(SC_DEFAULT_STREAM, tiled, &big_block, NULL, 0), SC_ERR_LAUNCH,
               "sc_kernel_launch"); /* .maxntid 256 */
    /* Views: out of bounds, stale, of another context. */
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in((sc_view){a, 900, 200}),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_OUT_OF_BOUNDS, "sc_kernel_launch");
    sc_buffer gone = make_buffer(ctx, SC_F32, 4, "gone");
    CHECK_OK(sc_buffer_destroy(gone));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(gone)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_STALE_HANDLE, "sc_kernel_launch");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), (sc_arg){.kind = SC_ARG_SCALAR}),
               SC_ERR_INVALID_ARGUMENT, "sc_kernel_launch");
    CHECK_FAIL(sc_kernel_launch(SC_DEFAULT_STREAM, add, &cfg, NULL, 3), SC_ERR_INVALID_ARGUMENT,
               "sc_kernel_launch");
    CHECK(sci_fault_calls() == 0); /* none of the refusals reached cuLaunchKernel */
    sci_fault_disarm();

    /* Raising the dynamic shared memory limit makes the big launch legal. */
    CHECK_OK(sc_kernel_set_max_dynamic_shared(add, 100 << 10));
    bad.shared_bytes = 64 << 10;
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, add, &bad, sc_arg_in(sc_view_of(a)),
                       sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)));
    CHECK_FAIL(sc_kernel_set_max_dynamic_shared(add, 228 << 10), SC_ERR_INVALID_ARGUMENT,
               "sc_kernel_set_max_dynamic_shared");
    CHECK_FAIL(sc_kernel_set_max_dynamic_shared(tiled, 227 << 10), SC_ERR_INVALID_ARGUMENT,
               "sc_kernel_set_max_dynamic_shared"); /* its 1 KiB of static shared counts */

    /* A by-value struct parameter, and a kernel without parameters. */
    double xy[2] = {1.0, 2.0};
    sc_launch_desc one = {.grid = {1, 0, 0}, .block = {1, 0, 0}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, pack, &one, sc_arg_bytes(xy, sizeof xy),
                       sc_arg_out((sc_view){a, 0, 1})));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, pack, &one, sc_arg_bytes(xy, 12),
                         sc_arg_out((sc_view){a, 0, 1})),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    sc_launch_desc cube = {.grid = {2, 2, 2}, .block = {256, 1, 1}, .programmatic = true}; /* cuLaunchKernelEx */
    CHECK_OK(sc_kernel_launch(SC_DEFAULT_STREAM, tiled, &cube, NULL, 0));

    /* Images that are not PTX: the driver's error, no module. */
    unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    sc_module bad_module;
    CHECK_FAIL(sc_module_load_image(ctx, elf, sizeof elf, &bad_module), SC_ERR_DRIVER,
               "sc_module_load_image");
    CHECK_MSG("CUDA_ERROR_INVALID_IMAGE");
    static const char not_ptx[] = "this is not PTX at all";
    CHECK_FAIL(sc_module_load_image(ctx, not_ptx, sizeof not_ptx - 1, &bad_module),
               SC_ERR_DRIVER, "sc_module_load_image");
    CHECK(fake.live_modules() == modules0 + 1);
    CHECK_OK(sc_context_check(ctx)); /* a bad image is not sticky */

    /* Unloading the module makes its kernels stale. */
    CHECK_OK(sc_module_destroy(m));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_inout(sc_view_of(b)), sc_arg_u32(N)),
               SC_ERR_STALE_HANDLE, "sc_kernel_launch");
    CHECK_FAIL(sc_module_destroy(m), SC_ERR_STALE_HANDLE, "sc_module_destroy");
    CHECK(fake.live_modules() == modules0);
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
}

/* ---- modules from files --------------------------------------------------------------------- */

static void test_module_files(void)
{
    long modules0 = fake.live_modules();
    sc_module m = {0};

    /* A regular file: its bytes are the image. */
    char path[] = "/tmp/safecuda-test-module-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, fake_test_ptx, sizeof fake_test_ptx - 1) ==
            (ssize_t)(sizeof fake_test_ptx - 1));
    REQUIRE(close(fd) == 0);
    CHECK_OK(sc_module_load_file(ctx, path, &m));
    CHECK(fake.live_modules() == modules0 + 1);
    sc_kernel add;
    CHECK_OK(sc_kernel_get(m, "add", &add));
    CHECK_OK(sc_module_destroy(m));

    /* An empty file: no image, said so; the driver is not asked. */
    REQUIRE(truncate(path, 0) == 0);
    m.id = 12345;
    CHECK_FAIL(sc_module_load_file(ctx, path, &m), SC_ERR_IO, "sc_module_load_file");
    CHECK_MSG(path);
    CHECK_MSG("empty");
    CHECK(m.id == 0);
    unlink(path);

    /* A folder opens like a file, and ftell at its end answers LONG_MAX on ext4: it is
     * refused for what it is, with no allocation of that size (an abort under ASan). */
    char dir[] = "/tmp/safecuda-test-module-dir-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    m.id = 12345;
    CHECK_FAIL(sc_module_load_file(ctx, dir, &m), SC_ERR_IO, "sc_module_load_file");
    CHECK_MSG(dir);
    CHECK_MSG("not a regular file");
    CHECK(m.id == 0);
    rmdir(dir);

    /* A path that does not exist. */
    CHECK_FAIL(sc_module_load_file(ctx, path, &m), SC_ERR_IO, "sc_module_load_file");
    CHECK_MSG(path);
    CHECK(m.id == 0);
    CHECK(fake.live_modules() == modules0);
    CHECK_OK(sc_context_check(ctx));
}

/* ---- several threads on one context -------------------------------------------------------- */

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    int failures = 0;
    sc_stream s;
    if (sc_stream_create(ctx, NULL, &s) != SC_OK)
        return (void *)(intptr_t)1;
    uint32_t data[512], back[512];
    for (int round = 0; round < 50; round++) {
        sc_buffer b;
        if (sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = 512, .stream = s},
                             &b) != SC_OK) {
            failures++;
            continue;
        }
        for (int i = 0; i < 512; i++)
            data[i] = (uint32_t)(id * 100000 + round * 1000 + i);
        failures += sc_copy_from_host(s, sc_view_of(b), data, sizeof data) != SC_OK;
        failures += sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, sc_view_of(b)) != SC_OK;
        failures += memcmp(data, back, sizeof data) != 0;
        failures += sc_buffer_destroy(b) != SC_OK;
    }
    failures += sc_stream_destroy(s) != SC_OK;
    return (void *)(intptr_t)failures;
}

static void test_threads(void)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        REQUIRE(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(t[i], &r);
        CHECK(r == NULL);
    }
    sc_memory_stats m = memory(ctx);
    CHECK(m.bytes_in_use == 0 && m.live_buffers == 0);
}

/* Tensor maps: encoding checks, a launch that passes one (checked like a view), and a map
 * whose buffer was destroyed. */
static const char tmap_ptx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry copy_tile(\n"
    "    .param .align 64 .b8 copy_tile_param_0[128],\n"
    "    .param .u64 copy_tile_param_1\n"
    ")\n"
    "{\n    ret;\n}\n";

static void test_tensor_maps(void)
{
    sc_buffer a = make_buffer(ctx, SC_BF16, 64 * 128, "a");
    sc_buffer f = make_buffer(ctx, SC_F32, 100, "f");
    sc_tensor_map map;
    const sc_tensor_map_desc good = {.rows = 64, .cols = 128, .box_rows = 32, .box_cols = 64,
                                      .swizzle = SC_SWIZZLE_128B};
    CHECK_OK(sc_tensor_map_encode(sc_view_of(a), &good, &map));
    CHECK(map.view.buffer.id == a.id && map.view.count == 64 * 128 && map.address != 0);
    CHECK(((uintptr_t)map.encoded % 64) == 0);
    sc_tensor_map_desc d = good;
    d.rows = 63;
    CHECK_FAIL(sc_tensor_map_encode(sc_view_of(a), &d, &map), SC_ERR_INVALID_ARGUMENT,
               "sc_tensor_map_encode");
    CHECK_MSG("rows 63 x cols 128");
    d = good;
    d.box_cols = 128; /* 256 bytes: past the 128-byte swizzle span */
    CHECK_FAIL(sc_tensor_map_encode(sc_view_of(a), &d, &map), SC_ERR_INVALID_ARGUMENT,
               "sc_tensor_map_encode");
    CHECK_MSG("swizzle span");
    d = good;
    d.box_rows = 257;
    CHECK_FAIL(sc_tensor_map_encode(sc_view_of(a), &d, &map), SC_ERR_INVALID_ARGUMENT,
               "sc_tensor_map_encode");
    d = good;
    d.swizzle = (sc_tensor_swizzle)7;
    CHECK_FAIL(sc_tensor_map_encode(sc_view_of(a), &d, &map), SC_ERR_INVALID_ARGUMENT,
               "sc_tensor_map_encode");
    /* A row of 25 f32 is 100 bytes: not a multiple of 16. */
    CHECK_FAIL(sc_tensor_map_encode(sc_view_of(f),
                                    &(sc_tensor_map_desc){.rows = 4, .cols = 25, .box_rows = 4,
                                                          .box_cols = 4},
                                    &map),
               SC_ERR_INVALID_ARGUMENT, "sc_tensor_map_encode");
    CHECK_MSG("multiple of 16");
    /* A view that starts 2 bytes in: not 16-byte aligned. */
    sc_view off;
    CHECK_OK(sc_buffer_view(a, 1, 64 * 64, &off));
    CHECK_FAIL(sc_tensor_map_encode(off, &(sc_tensor_map_desc){.rows = 64, .cols = 64,
                                                              .box_rows = 8, .box_cols = 8},
                                    &map),
               SC_ERR_INVALID_ARGUMENT, "sc_tensor_map_encode");
    CHECK_MSG("16-byte alignment");
    CHECK_FAIL(sc_tensor_map_encode(sc_view_of(a), NULL, &map), SC_ERR_INVALID_ARGUMENT,
               "sc_tensor_map_encode");

    /* Launches: a map is a 128-byte parameter, its view checked and tracked. */
    sc_module m;
    CHECK_OK(sc_module_load_image(ctx, tmap_ptx, sizeof tmap_ptx - 1, &m));
    sc_kernel k;
    CHECK_OK(sc_kernel_get(m, "copy_tile", &k));
    sc_launch_desc cfg = {.grid = {1, 1, 1}, .block = {128, 1, 1}, .programmatic = true};
    CHECK_OK(sc_tensor_map_encode(sc_view_of(a), &good, &map));
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_tensor_map_in(&map),
                       sc_arg_out(sc_view_of(f))));
    /* A map where a pointer goes, and a view where the map goes: sizes differ. */
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_in(sc_view_of(a)),
                         sc_arg_out(sc_view_of(f))),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    CHECK_MSG("argument 0");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_tensor_map_in(&map),
                         sc_arg_tensor_map_out(&map)),
               SC_ERR_LAUNCH, "sc_kernel_launch");
    CHECK_MSG("argument 1");
    /* A tensor-map argument without its map. */
    sc_arg no_map = sc_arg_tensor_map_in(&map);
    no_map.bytes = NULL;
    CHECK_FAIL(sc_kernel_launch(SC_DEFAULT_STREAM, k, &cfg,
                                (const sc_arg[]){no_map, sc_arg_out(sc_view_of(f))}, 2),
               SC_ERR_INVALID_ARGUMENT, "sc_kernel_launch");
    CHECK_MSG("argument 0: tensor map is NULL");
    /* An edited map (its address no longer that of its view) is refused. */
    sc_tensor_map edited = map;
    edited.address += 16;
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_tensor_map_in(&edited),
                         sc_arg_out(sc_view_of(f))),
               SC_ERR_INVALID_ARGUMENT, "sc_kernel_launch");
    CHECK_MSG("encoded for device address");
    /* The buffer destroyed: the map is stale, like a view. */
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_tensor_map_in(&map),
                         sc_arg_out(sc_view_of(f))),
               SC_ERR_STALE_HANDLE, "sc_kernel_launch");
    CHECK_FAIL(sc_tensor_map_encode(sc_view_of(a), &good, &map), SC_ERR_STALE_HANDLE,
               "sc_tensor_map_encode");
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_buffer_destroy(f));
}

int main(void)
{
    fake_attach();
    fake_counts start = fake_counts_now();
    test_device();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    /* The context's pool and default stream are created on first use: make them now. */
    sc_buffer warm = make_buffer(ctx, SC_U8, 1, "warm-up");
    CHECK_OK(sc_buffer_destroy(warm));
    test_buffers();
    test_copies();
    test_host_buffers();
    test_streams_events();
    test_stale_handles();
    test_leak_report();
    test_launch();
    test_tensor_maps();
    test_module_files();
    test_threads();
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));

    char diff[512];
    if (fake_counts_diff(start, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "the test device still holds objects at the end: %s\n", diff);
        test_failures++;
    }
    for (int k = SCI_KIND_CONTEXT; k < SCI_KIND_TEST_A; k++)
        if (sci_registry_live_count((sci_kind)k)) {
            fprintf(stderr, "%zu live %s handles at the end\n",
                    sci_registry_live_count((sci_kind)k), sci_kind_name((sci_kind)k));
            test_failures++;
        }
    if (fake.misuse_count() != 0) {
        fprintf(stderr, "the test device saw %d misuses; the last: %s\n", fake.misuse_count(),
                fake.last_misuse());
        test_failures++;
    }
    return test_result("test_td_bookkeeping");
}
