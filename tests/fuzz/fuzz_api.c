/* libFuzzer target: random sequences of safecuda calls against the test device
 * (testdevice/testdevice.c, "the fake" below).
 *
 * Each input is a little program: up to FUZZ_MAX_OPS operations read from the bytes (an
 * opcode, then its operands), over handles that may be live, destroyed (stale), of another
 * kind, forged or zero, with sizes, offsets and counts that include 0, SC_WHOLE and values
 * near UINT64_MAX. After every operation:
 *   - the status is a valid sc_status, never SC_ERR_INTERNAL, and never a driver error or
 *     a lost context (the test device fails only on real misuse or out of memory);
 *   - a failure left a message that starts with "sc_" (SC_ERR_NOT_READY excepted: it is an
 *     answer, with no message);
 *   - the test device saw no misuse: the library never handed it an out-of-range pointer
 *     or a dead handle (SAFECUDA_TESTDEVICE_ABORT_ON_MISUSE=1 aborts at the driver call);
 *   - the accounting is exact: bytes_in_use, live_buffers and pinned_bytes equal what the
 *     fuzzer knows is alive, and the fake holds exactly one allocation per live buffer.
 * At the end of each input everything is destroyed and the fake's counters are back to
 * their baseline. One context (and one module) lives for the whole run.
 *
 * The test device runs no kernels: nothing here says anything about a GPU. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/registry.h"
#include "driver/driver.h"
#include "td_control.h"
#include "td_ptx.h"
#include "safecuda.h"

#ifndef TESTDEVICE_PATH
#error "build with -DTESTDEVICE_PATH=\"/path/to/libsafecuda_testdevice.so\""
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { FUZZ_MAX_OPS = 64, MAX_BUFFERS = 12, MAX_HOSTS = 6, MAX_STREAMS = 4, MAX_EVENTS = 4,
       MAX_VIEWS = 8, SCRATCH = 1 << 20 };

#define FUZZ_ASSERT(cond, ...)                                                           \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz_api: invariant failed: %s: ", #cond);                  \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n  (op %d, opcode %d; last error: %s)\n", op_index,        \
                    op_code, sc_last_error());                                           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* ---- what the fuzzer believes ------------------------------------------------------------- */

typedef struct {
    uint64_t id;
    uint64_t bytes; /* buffers: bytes; host buffers: bytes */
    uint64_t count;
    sc_dtype dtype;
    bool alive;
} tracked;

static sc_context ctx;
static sc_module module;
static sc_kernel kernels[3], stale_kernel;
static uint64_t default_stream_id;
static fake_counts baseline;
static bool ready;

static tracked buffers[MAX_BUFFERS], hosts[MAX_HOSTS], streams[MAX_STREAMS], events[MAX_EVENTS];
static sc_view views[MAX_VIEWS];
static size_t n_views;
static unsigned char scratch[SCRATCH], scratch2[SCRATCH];
static int op_index, op_code;
static bool trace; /* FUZZ_API_TRACE=1: print every operation and its status */

/* ---- reading the input ---------------------------------------------------------------------- */

static const uint8_t *in_data;
static size_t in_size, in_pos;

static uint8_t byte(void) { return in_pos < in_size ? in_data[in_pos++] : 0; }

static uint64_t bytes_le(int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)byte() << (8 * i);
    return v;
}

/* Sizes, offsets and counts: mostly small, sometimes at the edges. */
static uint64_t pick_u64(void)
{
    switch (byte() % 12) {
    case 0: return 0;
    case 1: return 1;
    case 2: case 3: return byte();
    case 4: return bytes_le(2);
    case 5: return bytes_le(3) & 0xfffff;
    case 6: return SC_WHOLE;
    case 7: return UINT64_MAX - byte();
    case 8: return (UINT64_MAX >> 1) + byte();
    case 9: return bytes_le(8);
    case 10: return (uint64_t)byte() << 20; /* up to 255 MiB: past the fake's 64 MiB */
    default: return UINT64_MAX / (1 + byte() % 16);
    }
}

/* ---- handles --------------------------------------------------------------------------------- */

static bool is_tracked_id(uint64_t id)
{
    const tracked *sets[] = {buffers, hosts, streams, events};
    const size_t sizes[] = {MAX_BUFFERS, MAX_HOSTS, MAX_STREAMS, MAX_EVENTS};
    for (int s = 0; s < 4; s++)
        for (size_t i = 0; i < sizes[s]; i++)
            if (sets[s][i].alive && sets[s][i].id == id)
                return true;
    if (id == ctx.id || id == module.id || id == default_stream_id)
        return true;
    for (int k = 0; k < 3; k++)
        if (id == kernels[k].id)
            return true;
    return false;
}

/* A syntactically plausible id of `kind` that names no live object. */
static uint64_t forge(sci_kind kind)
{
    uint64_t slot = byte() % 8, gen = 1 + byte() % 4;
    uint64_t id = ((uint64_t)kind << 56) | (gen << 24) | slot;
    if (is_tracked_id(id))
        id |= (uint64_t)0xffff << 24; /* a generation never reached */
    return id;
}

/* An id for a handle argument of `kind`, drawn from the tracked objects of that kind. */
static uint64_t pick_handle(const tracked *set, size_t n, sci_kind kind, int *index)
{
    *index = -1;
    uint8_t how = byte() % 16;
    if (how < 10) { /* a tracked one: live or destroyed */
        int i = (int)(byte() % n);
        if (set[i].id) {
            *index = set[i].alive ? i : -1;
            return set[i].id;
        }
    }
    switch (how % 6) {
    case 0: return 0;
    case 1: return forge(kind);
    case 2: return forge((sci_kind)(1 + byte() % (SCI_KIND_COUNT + 2))); /* any kind */
    case 3: return bytes_le(8) & ~((uint64_t)0xff << 56); /* kind 0 */
    case 4: return ctx.id; /* a context where something else is wanted */
    default: /* a live object of another kind */
        if (kind != SCI_KIND_BUFFER)
            return buffers[byte() % MAX_BUFFERS].id;
        return hosts[byte() % MAX_HOSTS].id;
    }
}

static sc_buffer pick_buffer(int *index)
{
    return (sc_buffer){pick_handle(buffers, MAX_BUFFERS, SCI_KIND_BUFFER, index)};
}

static sc_host_buffer pick_host(int *index)
{
    return (sc_host_buffer){pick_handle(hosts, MAX_HOSTS, SCI_KIND_HOST_BUFFER, index)};
}

static sc_stream pick_stream(int *index)
{
    *index = -1;
    if (byte() % 3 == 0)
        return SC_DEFAULT_STREAM;
    if (byte() % 8 == 0)
        return (sc_stream){default_stream_id};
    return (sc_stream){pick_handle(streams, MAX_STREAMS, SCI_KIND_STREAM, index)};
}

static sc_event pick_event(int *index)
{
    return (sc_event){pick_handle(events, MAX_EVENTS, SCI_KIND_EVENT, index)};
}

static sc_view pick_view(void)
{
    uint8_t how = byte() % 4;
    if (how == 0 && n_views)
        return views[byte() % n_views];
    int i;
    sc_buffer b = pick_buffer(&i);
    if (how == 1)
        return sc_view_of(b);
    return (sc_view){b, pick_u64(), pick_u64()};
}

static void remember_view(sc_view v)
{
    if (n_views < MAX_VIEWS)
        views[n_views++] = v;
    else
        views[byte() % MAX_VIEWS] = v;
}

static int free_slot(tracked *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!set[i].alive)
            return (int)i;
    return -1;
}

/* A destroy call "took" the object unless the handle itself was refused. */
/* The launch attributes the test device models (probed at setup): cooperative launches
 * (CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH answered) and non-portable cluster sizes
 * (CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH answered, with the function attributes). */
static bool fuzz_cooperative, fuzz_non_portable;

static bool taken(sc_status s) { return s != SC_ERR_STALE_HANDLE && s != SC_ERR_WRONG_KIND; }

/* ---- invariants ------------------------------------------------------------------------------ */

static void check_status(sc_status s)
{
    FUZZ_ASSERT((unsigned)s < SC_STATUS_COUNT, "status %d", (int)s);
    FUZZ_ASSERT(s != SC_ERR_INTERNAL, "%s", sc_status_name(s));
    FUZZ_ASSERT(s != SC_ERR_DRIVER && s != SC_ERR_CONTEXT_LOST && s != SC_ERR_NO_DRIVER &&
                    s != SC_ERR_NO_DEVICE,
                "the test device refused a call: %s", sc_status_name(s));
    if (s != SC_OK && s != SC_ERR_NOT_READY) {
        const char *m = sc_last_error();
        FUZZ_ASSERT(m[0] != '\0', "%s without a message", sc_status_name(s));
        FUZZ_ASSERT(strncmp(m, "sc_", 3) == 0, "%s with message '%s'", sc_status_name(s), m);
    }
    FUZZ_ASSERT(fake.misuse_count() == 0, "driver misuse: %s", fake.last_misuse());
}

static void check_accounting(void)
{
    uint64_t bytes = 0, live = 0, pinned = 0, hosts_alive = 0;
    for (int i = 0; i < MAX_BUFFERS; i++)
        if (buffers[i].alive) {
            bytes += buffers[i].bytes;
            live++;
        }
    for (int i = 0; i < MAX_HOSTS; i++)
        if (hosts[i].alive) {
            pinned += hosts[i].bytes;
            hosts_alive++;
        }
    sc_memory_stats m;
    sc_status s = sc_context_memory(ctx, &m);
    FUZZ_ASSERT(s == SC_OK, "sc_context_memory: %s", sc_status_name(s));
    FUZZ_ASSERT(m.bytes_in_use == bytes, "bytes_in_use %llu, expected %llu",
                (unsigned long long)m.bytes_in_use, (unsigned long long)bytes);
    FUZZ_ASSERT(m.live_buffers == live, "live_buffers %llu, expected %llu",
                (unsigned long long)m.live_buffers, (unsigned long long)live);
    FUZZ_ASSERT(m.pinned_bytes == pinned, "pinned_bytes %llu, expected %llu",
                (unsigned long long)m.pinned_bytes, (unsigned long long)pinned);
    FUZZ_ASSERT(m.peak_bytes >= m.bytes_in_use, "peak below use");
    FUZZ_ASSERT(fake.live_device_allocations() == baseline.device + (long)live,
                "the fake holds %ld device allocations for %llu live buffers",
                fake.live_device_allocations() - baseline.device, (unsigned long long)live);
    FUZZ_ASSERT(fake.live_host_allocations() == baseline.host + (long)hosts_alive,
                "the fake holds %ld pinned allocations for %llu live host buffers",
                fake.live_host_allocations() - baseline.host, (unsigned long long)hosts_alive);
}

/* ---- setup ----------------------------------------------------------------------------------- */

static void setup(void)
{
    setenv("SAFECUDA_LIBCUDA", TESTDEVICE_PATH, 1);
    setenv("SAFECUDA_TESTDEVICE_MEMORY_MB", "64", 0);
    setenv("SAFECUDA_TESTDEVICE_PINNED_MB", "64", 0);
    setenv("SAFECUDA_TESTDEVICE_ABORT_ON_MISUSE", "1", 0);
    setenv("SAFECUDA_CACHE", "0", 0);
    setenv("SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES", "1", 1); /* for bookkeeping tests only */
    fake_attach();
    sc_set_log_callback(NULL, NULL);
    if (sc_context_create(NULL, &ctx) != SC_OK ||
        sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &module) != SC_OK ||
        sc_kernel_get(module, "add", &kernels[0]) != SC_OK ||
        sc_kernel_get(module, "pack", &kernels[1]) != SC_OK ||
        sc_kernel_get(module, "tiled", &kernels[2]) != SC_OK) {
        fprintf(stderr, "fuzz_api: setup failed: %s\n", sc_last_error());
        abort();
    }
    int attr = 0;
    fuzz_cooperative = sci_cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
                                                0) == CUDA_SUCCESS && attr;
    fuzz_non_portable = sci_cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH,
                                                 0) == CUDA_SUCCESS && attr;
    /* A kernel handle that is stale from the start. */
    sc_module gone;
    if (sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &gone) != SC_OK ||
        sc_kernel_get(gone, "add", &stale_kernel) != SC_OK || sc_module_destroy(gone) != SC_OK)
        abort();
    /* The default stream and the pool exist from the start (they live with the context). */
    sc_stream d;
    sc_buffer warm;
    if (sc_context_default_stream(ctx, &d) != SC_OK ||
        sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 1}, &warm) != SC_OK ||
        sc_buffer_destroy(warm) != SC_OK)
        abort();
    default_stream_id = d.id;
    for (size_t i = 0; i < SCRATCH; i++)
        scratch[i] = (unsigned char)(i * 131 + 7);
    baseline = fake_counts_now();
    trace = getenv("FUZZ_API_TRACE") != NULL;
    ready = true;
}

/* ---- operations ------------------------------------------------------------------------------ */

static sc_dtype pick_dtype(void) { return (sc_dtype)(byte() % (SC_DTYPE_COUNT + 2)); }

/* A host pointer for `bytes` bytes: the scratch area when it is big enough, else NULL
 * (which the library must refuse before touching it). */
static void *host_ptr(unsigned char *area, uint64_t bytes)
{
    return bytes <= SCRATCH ? area : NULL;
}

static sc_status op_buffer_create(void)
{
    int slot = free_slot(buffers, MAX_BUFFERS);
    sc_dtype dtype = pick_dtype();
    uint64_t count = pick_u64();
    int si;
    sc_stream st = pick_stream(&si);
    bool zero = byte() & 1;
    if (zero && count > (1 << 22))
        zero = false; /* keep each input fast: zeroing is a memset of the whole buffer */
    sc_buffer b = {0};
    sc_status s = sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                          .label = "fuzz", .zero = zero,
                                                          .stream = st},
                                   &b);
    if (s == SC_OK) {
        FUZZ_ASSERT(b.id != 0, "SC_OK with a zero handle");
        uint64_t bytes = count * sc_dtype_size(dtype);
        if (slot < 0) { /* no room to track it: give it back at once */
            check_status(sc_buffer_destroy(b));
            return SC_OK;
        }
        buffers[slot] = (tracked){b.id, bytes, count, dtype, true};
        if (zero) {
            unsigned char probe[64];
            uint64_t n = bytes < sizeof probe ? bytes : sizeof probe;
            sc_view head;
            if (sc_buffer_view(b, 0, n / sc_dtype_size(dtype), &head) == SC_OK && head.count) {
                uint64_t hb = head.count * sc_dtype_size(dtype);
                FUZZ_ASSERT(sc_copy_to_host(SC_DEFAULT_STREAM, probe, hb, head) == SC_OK,
                            "reading a zeroed buffer");
                for (uint64_t i = 0; i < hb; i++)
                    FUZZ_ASSERT(probe[i] == 0, "a zeroed buffer holds %d at byte %llu",
                                probe[i], (unsigned long long)i);
            }
        }
    } else {
        FUZZ_ASSERT(b.id == 0, "a failed create left a handle");
    }
    return s;
}

static sc_status op_buffer_destroy(void)
{
    int i;
    sc_buffer b = pick_buffer(&i);
    sc_status s = sc_buffer_destroy(b);
    if (i >= 0 && taken(s))
        buffers[i].alive = false;
    FUZZ_ASSERT(!(i >= 0 && s != SC_OK), "destroying a live buffer: %s", sc_status_name(s));
    return s;
}

static sc_status op_host_create(void)
{
    int slot = free_slot(hosts, MAX_HOSTS);
    uint64_t bytes = pick_u64();
    bool zero = byte() & 1;
    sc_host_buffer h = {0};
    sc_status s = sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = bytes,
                                                                    .zero = zero,
                                                                    .label = "fuzz pinned"},
                                        &h);
    if (s == SC_OK) {
        if (slot < 0) {
            check_status(sc_host_buffer_destroy(h));
            return SC_OK;
        }
        hosts[slot] = (tracked){h.id, bytes, bytes, SC_U8, true};
    } else {
        FUZZ_ASSERT(h.id == 0, "a failed create left a handle");
    }
    return s;
}

static sc_status op_host_destroy(void)
{
    int i;
    sc_host_buffer h = pick_host(&i);
    sc_status s = (byte() & 1) ? sc_host_buffer_destroy(h) : sc_host_buffer_try_destroy(h);
    if (i >= 0 && taken(s) && s != SC_ERR_BUSY)
        hosts[i].alive = false;
    return s;
}

static sc_status op_view(void)
{
    int i;
    sc_buffer b = pick_buffer(&i);
    uint64_t offset = pick_u64(), count = pick_u64();
    sc_view v = {{0}, 0, 0};
    sc_status s = sc_buffer_view(b, offset, count, &v);
    if (s == SC_OK) {
        FUZZ_ASSERT(i >= 0, "a view of a dead or foreign buffer");
        FUZZ_ASSERT(v.count != SC_WHOLE && v.offset == offset &&
                        v.offset + v.count >= v.offset && v.offset + v.count <= buffers[i].count,
                    "view [%llu, +%llu) of a %llu-element buffer", (unsigned long long)v.offset,
                    (unsigned long long)v.count, (unsigned long long)buffers[i].count);
        remember_view(v);
    }
    return s;
}

static sc_status op_view_sub(void)
{
    sc_view v = pick_view();
    uint64_t offset = pick_u64(), count = pick_u64();
    sc_view sub = {{0}, 0, 0};
    sc_status s = sc_view_sub(v, offset, count, &sub);
    if (s == SC_OK) {
        FUZZ_ASSERT(sub.buffer.id == v.buffer.id && sub.count != SC_WHOLE, "sub-view");
        for (int i = 0; i < MAX_BUFFERS; i++)
            if (buffers[i].alive && buffers[i].id == v.buffer.id)
                FUZZ_ASSERT(sub.offset + sub.count >= sub.offset &&
                                sub.offset + sub.count <= buffers[i].count,
                            "sub-view [%llu, +%llu) of a %llu-element buffer",
                            (unsigned long long)sub.offset, (unsigned long long)sub.count,
                            (unsigned long long)buffers[i].count);
        remember_view(sub);
    }
    return s;
}

/* The element count of a view of a tracked live buffer (SC_WHOLE resolved), for sizes that
 * sometimes match. */
static uint64_t view_bytes_guess(sc_view v)
{
    for (int i = 0; i < MAX_BUFFERS; i++)
        if (buffers[i].alive && buffers[i].id == v.buffer.id) {
            uint64_t count = v.count == SC_WHOLE
                                 ? (v.offset <= buffers[i].count ? buffers[i].count - v.offset : 0)
                                 : v.count;
            return count * sc_dtype_size(buffers[i].dtype);
        }
    return 0;
}

static uint64_t pick_copy_bytes(sc_view v)
{
    uint8_t how = byte() % 4;
    if (how < 3)
        return view_bytes_guess(v) + (how == 2 ? (uint64_t)(int8_t)byte() : 0);
    return pick_u64();
}

static sc_status op_copy_from_host(void)
{
    int si;
    sc_stream st = pick_stream(&si);
    sc_view v = pick_view();
    uint64_t bytes = pick_copy_bytes(v);
    return sc_copy_from_host(st, v, host_ptr(scratch, bytes), bytes);
}

static sc_status op_copy_to_host(void)
{
    int si;
    sc_stream st = pick_stream(&si);
    sc_view v = pick_view();
    uint64_t bytes = pick_copy_bytes(v);
    return sc_copy_to_host(st, host_ptr(scratch2, bytes), bytes, v);
}

static sc_status op_copy_host_buffer(bool to_device)
{
    int si, hi;
    sc_stream st = pick_stream(&si);
    sc_view v = pick_view();
    sc_host_buffer h = pick_host(&hi);
    uint64_t offset = (byte() & 1) ? byte() : pick_u64();
    return to_device ? sc_copy_from_host_buffer(st, v, h, offset)
                     : sc_copy_to_host_buffer(st, h, offset, v);
}

static sc_status op_copy(void)
{
    int si;
    sc_stream st = pick_stream(&si);
    sc_view d = pick_view(), src = pick_view();
    return sc_copy(st, d, src);
}

static sc_status op_fill(void)
{
    int si;
    sc_stream st = pick_stream(&si);
    sc_view v = pick_view();
    uint64_t value = bytes_le(8);
    return sc_fill(st, v, (byte() % 16) ? (const void *)&value : NULL);
}

/* A round trip through a live buffer: the data must come back. */
static sc_status op_round_trip(void)
{
    int i = (int)(byte() % MAX_BUFFERS);
    if (!buffers[i].alive || buffers[i].bytes > SCRATCH || buffers[i].bytes == 0)
        return SC_OK;
    uint64_t bytes = buffers[i].bytes;
    int si;
    sc_stream st = pick_stream(&si);
    unsigned char seed = byte();
    for (uint64_t k = 0; k < bytes; k++)
        scratch[k] = (unsigned char)(k * 31 + seed);
    sc_buffer b = {buffers[i].id};
    sc_status s = sc_copy_from_host(st, sc_view_of(b), scratch, bytes);
    if (s != SC_OK)
        return s; /* e.g. a stream of the wrong kind */
    sc_status r = sc_copy_to_host(SC_DEFAULT_STREAM, scratch2, bytes, sc_view_of(b));
    FUZZ_ASSERT(r == SC_OK, "reading back: %s", sc_status_name(r));
    FUZZ_ASSERT(memcmp(scratch, scratch2, bytes) == 0, "a round trip changed the data");
    return SC_OK;
}

static sc_status op_stream_create(void)
{
    int slot = free_slot(streams, MAX_STREAMS);
    sc_stream_desc d = {.priority = (int)(int8_t)byte(), .blocking = byte() & 1,
                        .label = "fuzz stream"};
    sc_stream s = {0};
    sc_status r = sc_stream_create(ctx, (byte() % 8) ? &d : NULL, &s);
    if (r == SC_OK) {
        if (slot < 0) {
            check_status(sc_stream_destroy(s));
            return SC_OK;
        }
        streams[slot] = (tracked){s.id, 0, 0, SC_DTYPE_INVALID, true};
    }
    return r;
}

static sc_status op_stream_misc(void)
{
    int i;
    sc_stream s = pick_stream(&i);
    switch (byte() % 5) {
    case 0: {
        sc_status r = sc_stream_destroy(s);
        if (i >= 0 && taken(r))
            streams[i].alive = false;
        FUZZ_ASSERT(!(i >= 0 && r != SC_OK), "destroying a live stream: %s",
                    sc_status_name(r));
        return r;
    }
    case 1: return sc_stream_synchronize(s);
    case 2: return sc_stream_query(s);
    case 3: {
        int p = 0;
        return sc_stream_priority(s, &p);
    }
    default: {
        int ei;
        return sc_stream_wait(s, pick_event(&ei));
    }
    }
}

static sc_status op_event(void)
{
    int i, si;
    switch (byte() % 6) {
    case 0: {
        int slot = free_slot(events, MAX_EVENTS);
        sc_event e = {0};
        sc_status r = sc_event_create(ctx, &(sc_event_desc){.timing = byte() & 1,
                                                            .blocking_sync = byte() & 1},
                                      &e);
        if (r == SC_OK) {
            if (slot < 0) {
                check_status(sc_event_destroy(e));
                return SC_OK;
            }
            events[slot] = (tracked){e.id, 0, 0, SC_DTYPE_INVALID, true};
        }
        return r;
    }
    case 1: {
        sc_event e = pick_event(&i);
        sc_status r = sc_event_destroy(e);
        if (i >= 0 && taken(r))
            events[i].alive = false;
        return r;
    }
    case 2: {
        sc_event e = pick_event(&i);
        return sc_event_record(e, pick_stream(&si));
    }
    case 3: return sc_event_query(pick_event(&i));
    case 4: return sc_event_synchronize(pick_event(&i));
    default: {
        float ms = 0;
        sc_event a = pick_event(&i), b = pick_event(&si);
        return sc_event_elapsed(a, b, &ms);
    }
    }
}

static sc_status op_launch(void)
{
    sc_kernel k;
    uint8_t which = byte() % 8;
    if (which < 5)
        k = kernels[which % 3];
    else if (which == 5)
        k = stale_kernel;
    else if (which == 6)
        k = (sc_kernel){forge(SCI_KIND_KERNEL)};
    else
        k = (sc_kernel){buffers[byte() % MAX_BUFFERS].id};
    sc_launch_desc d;
    if (byte() % 4 == 0) {
        d = (sc_launch_desc){
            .grid = {(uint32_t)bytes_le(4), (uint32_t)bytes_le(4), (uint32_t)bytes_le(4)},
            .block = {(uint32_t)bytes_le(2), (uint32_t)bytes_le(2), (uint32_t)bytes_le(1)},
            .shared_bytes = (uint32_t)bytes_le(4)};
    } else {
        d = (sc_launch_desc){.grid = {1u + byte(), 0, 0}, .block = {32u * (1 + byte() % 40), 0, 0},
                             .shared_bytes = (byte() % 8 == 0) ? (uint32_t)bytes_le(3) : 0};
    }
    const uint8_t flags = byte();
    d.programmatic = (flags & 0x40) != 0;
    /* Launch attributes, from the same byte: a cluster (0 .. 17 blocks wide, sometimes with
     * x = 0 and y set), non-portable sizes and cooperative launches where the test device
     * models them. */
    if (flags & 0x20) {
        d.cluster = (sc_dim3){(flags & 0x80) ? 0u : 1u + (flags & 0x0fu) + (flags & 0x10u),
                              (flags & 0x01u) + 1u, 0};
        d.non_portable_cluster = fuzz_non_portable && (flags & 0x02);
    }
    d.cooperative = fuzz_cooperative && (flags & 0x08) && (flags & 0x04);
    sc_arg args[6];
    size_t nargs = byte() % 7;
    for (size_t a = 0; a < nargs; a++) {
        uint8_t kind = byte() % 9;
        switch (kind) {
        case 0: args[a] = sc_arg_in(pick_view()); break;
        case 1: args[a] = sc_arg_out(pick_view()); break;
        case 2: args[a] = sc_arg_inout(pick_view()); break;
        case 3: args[a] = sc_arg_u32((uint32_t)bytes_le(4)); break;
        case 4: args[a] = sc_arg_u64(bytes_le(8)); break;
        case 5:
            args[a] = (sc_arg){.kind = SC_ARG_SCALAR, .dtype = pick_dtype()};
            args[a].value.u64 = bytes_le(8);
            break;
        case 6: args[a] = sc_arg_bytes((byte() & 7) ? scratch : NULL, byte() % 33); break;
        case 7: args[a] = sc_arg_f64(1.5); break;
        default:
            args[a] = (sc_arg){.kind = (sc_arg_kind)(byte() % 8), .view = pick_view()};
        }
    }
    /* The common good case, often enough for the fuzzer to find it. */
    if (byte() % 4 == 0 && which % 3 == 0) {
        nargs = 3;
        args[0] = sc_arg_in(pick_view());
        args[1] = sc_arg_inout(pick_view());
        args[2] = sc_arg_u32(byte());
    }
    int si;
    sc_stream st = pick_stream(&si);
    if (byte() % 16 == 0) {
        sc_launch_desc cfg;
        sc_status s = sc_launch_config_for(pick_u64(), k, &cfg);
        if (s != SC_OK)
            return s;
    }
    return sc_kernel_launch(st, k, (byte() % 32) ? &d : NULL, (nargs || byte() % 2) ? args : NULL,
                            nargs);
}

static sc_status op_host_io(void)
{
    int i;
    sc_host_buffer h = pick_host(&i);
    uint64_t offset = (byte() & 1) ? byte() : pick_u64();
    uint64_t bytes = (byte() & 1) ? byte() : pick_u64();
    switch (byte() % 4) {
    case 0: return sc_host_buffer_write(h, offset, host_ptr(scratch, bytes), bytes);
    case 1: return sc_host_buffer_read(h, offset, host_ptr(scratch2, bytes), bytes);
    case 2: {
        void *p = NULL;
        uint64_t n = 0;
        sc_status s = sc_host_buffer_ptr(h, &p, &n);
        if (s == SC_OK) {
            FUZZ_ASSERT(i >= 0 && p && n == hosts[i].bytes, "host buffer pointer");
            ((volatile unsigned char *)p)[n - 1] = 1; /* the whole range is ours (ASan) */
        }
        return s;
    }
    default: {
        void *p = NULL;
        return sc_host_buffer_try_ptr(h, &p, NULL);
    }
    }
}

static sc_status op_info(void)
{
    int i;
    sc_buffer b = pick_buffer(&i);
    if (byte() & 1) {
        sc_buffer_props p;
        sc_status s = sc_buffer_info(b, &p);
        if (s == SC_OK)
            FUZZ_ASSERT(i >= 0 && p.bytes == buffers[i].bytes && p.count == buffers[i].count &&
                            p.dtype == buffers[i].dtype && p.context.id == ctx.id,
                        "buffer info");
        return s;
    }
    uint64_t ptr = 0;
    return sc_buffer_device_ptr(b, &ptr);
}

static sc_status op_context(void)
{
    switch (byte() % 4) {
    case 0: return sc_context_trim(ctx);
    case 1: return sc_context_synchronize(ctx);
    case 2: {
        size_t n = 0;
        sc_object_info info[4];
        sc_status s = sc_context_live_objects(ctx, info, byte() % 5, &n);
        return s;
    }
    default: {
        sc_memory_stats m;
        return sc_context_memory(ctx, &m);
    }
    }
}

static void destroy_everything(void)
{
    for (int i = 0; i < MAX_BUFFERS; i++)
        if (buffers[i].alive) {
            sc_status s = sc_buffer_destroy((sc_buffer){buffers[i].id});
            FUZZ_ASSERT(s == SC_OK, "final buffer destroy: %s", sc_status_name(s));
        }
    for (int i = 0; i < MAX_HOSTS; i++)
        if (hosts[i].alive) {
            sc_status s = sc_host_buffer_destroy((sc_host_buffer){hosts[i].id});
            FUZZ_ASSERT(s == SC_OK, "final host buffer destroy: %s", sc_status_name(s));
        }
    for (int i = 0; i < MAX_EVENTS; i++)
        if (events[i].alive) {
            sc_status s = sc_event_destroy((sc_event){events[i].id});
            FUZZ_ASSERT(s == SC_OK, "final event destroy: %s", sc_status_name(s));
        }
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i].alive) {
            sc_status s = sc_stream_destroy((sc_stream){streams[i].id});
            FUZZ_ASSERT(s == SC_OK, "final stream destroy: %s", sc_status_name(s));
        }
    memset(buffers, 0, sizeof buffers);
    memset(hosts, 0, sizeof hosts);
    memset(events, 0, sizeof events);
    memset(streams, 0, sizeof streams);
    n_views = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ready)
        setup();
    in_data = data;
    in_size = size;
    in_pos = 0;
    op_index = 0;
    op_code = -1;
    for (; op_index < FUZZ_MAX_OPS && in_pos < in_size; op_index++) {
        op_code = byte() % 20;
        sc_clear_error();
        sc_status s;
        switch (op_code) {
        case 0: case 1: s = op_buffer_create(); break;
        case 2: s = op_buffer_destroy(); break;
        case 3: s = op_host_create(); break;
        case 4: s = op_host_destroy(); break;
        case 5: s = op_view(); break;
        case 6: s = op_view_sub(); break;
        case 7: s = op_copy_from_host(); break;
        case 8: s = op_copy_to_host(); break;
        case 9: s = op_copy_host_buffer(true); break;
        case 10: s = op_copy_host_buffer(false); break;
        case 11: s = op_copy(); break;
        case 12: s = op_fill(); break;
        case 13: s = op_stream_create(); break;
        case 14: s = op_stream_misc(); break;
        case 15: s = op_event(); break;
        case 16: s = op_launch(); break;
        case 17: s = op_host_io(); break;
        case 18: s = (byte() & 1) ? op_info() : op_round_trip(); break;
        default: s = op_context(); break;
        }
        if (trace)
            fprintf(stderr, "fuzz_api: op %d: opcode %d -> %s %s\n", op_index, op_code,
                    sc_status_name(s), s == SC_OK ? "" : sc_last_error());
        check_status(s);
        check_accounting();
    }
    op_code = -2; /* the final cleanup */
    destroy_everything();
    check_accounting();
    FUZZ_ASSERT(sc_context_check(ctx) == SC_OK, "the context is not usable after the input");
    fake_counts now = fake_counts_now();
    char diff[256];
    FUZZ_ASSERT(fake_counts_diff(baseline, now, diff, sizeof diff) == 0,
                "after the input the test device holds: %s", diff);
    size_t live = 99;
    FUZZ_ASSERT(sc_context_live_objects(ctx, NULL, 0, &live) == SC_OK && live == 4,
                "%zu live objects (the module and its 3 kernels expected)", live);
    return 0;
}
