/* Borrowed buffers and DLPack (safecuda/interop.h) against the test device: every borrow
 * and import refusal, read-only buffers refused as copy and fill destinations and launch
 * outputs, release callbacks and DLPack deleters run exactly once (on destroy, on the
 * context's destroy of a leaked buffer, never after a refusal), exports whose memory
 * outlives their buffer and their context, and round trips. The test device's "device"
 * memory is host memory, so data is checked byte for byte; its streams are synchronous, so
 * ordering is checked by counting the driver calls that express it.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <pthread.h>
#include <stdint.h>

#include "../test.h"
#include "driver/driver.h"
#include "td_control.h"
#include "td_ptx.h"
#include "safecuda/interop.h"

static sc_context ctx;

/* ---- helpers ------------------------------------------------------------------------------ */

static int released[16]; /* release callback calls, by slot */
static void on_release(void *user) { released[(int)(intptr_t)user]++; }

/* Foreign device memory: cuMemAlloc of the test device, outside safecuda's accounting. */
static CUdeviceptr foreign_alloc(size_t bytes)
{
    CUdeviceptr p = 0;
    REQUIRE(sci_cuMemAlloc(&p, bytes) == CUDA_SUCCESS);
    return p;
}

static void foreign_free(CUdeviceptr p) { CHECK(sci_cuMemFree(p) == CUDA_SUCCESS); }

static sc_memory_stats memory(sc_context c)
{
    sc_memory_stats m;
    memset(&m, 0xab, sizeof m);
    CHECK_OK(sc_context_memory(c, &m));
    return m;
}

static char log_text[16384];
static void capture_log(sc_log_level level, const char *message, void *user)
{
    (void)level;
    (void)user;
    size_t len = strlen(log_text);
    snprintf(log_text + len, sizeof log_text - len, "%s\n", message);
}

/* A hand-built DLPack tensor over device memory, with a counting deleter. */
typedef struct test_tensor {
    DLManagedTensorVersioned m;
    int64_t shape[4], strides[4];
    int deleted;
} test_tensor;

static void test_tensor_deleter(DLManagedTensorVersioned *self)
{
    test_tensor *t = self->manager_ctx;
    t->deleted++;
}

static void make_tensor(test_tensor *t, CUdeviceptr data, DLDataType dtype, int ndim,
                        const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->m.version = (DLPackVersion){1, 1};
    t->m.manager_ctx = t;
    t->m.deleter = test_tensor_deleter;
    t->m.dl_tensor.data = (void *)(uintptr_t)data;
    t->m.dl_tensor.device = (DLDevice){kDLCUDA, 0};
    t->m.dl_tensor.ndim = ndim;
    t->m.dl_tensor.dtype = dtype;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->m.dl_tensor.shape = t->shape;
}

static const DLDataType DL_F32 = {kDLFloat, 32, 1};

/* ---- borrowed buffers ------------------------------------------------------------------------ */

static void test_borrow(void)
{
    enum { N = 1024 };
    const CUdeviceptr p = foreign_alloc(N * sizeof(float));
    const long device0 = fake.live_device_allocations();
    const sc_memory_stats m0 = memory(ctx);
    memset(released, 0, sizeof released);

    sc_buffer b = {0};
    CHECK_OK(sc_buffer_borrow(ctx, p,
                              &(sc_borrow_desc){.dtype = SC_F32, .count = N, .label = "foreign",
                                                .release = on_release,
                                                .release_user = (void *)(intptr_t)1},
                              &b));
    sc_buffer_props props;
    CHECK_OK(sc_buffer_info(b, &props));
    CHECK(props.dtype == SC_F32 && props.count == N && props.bytes == N * 4);
    CHECK(strcmp(props.label, "foreign") == 0 && strcmp(props.file, "test_td_interop.c") == 0);
    uint64_t dp = 0;
    CHECK_OK(sc_buffer_device_ptr(b, &dp));
    CHECK(dp == p);
    sc_buffer_origin o;
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.borrowed && !o.read_only && o.exports == 0);
    sc_memory_stats m1 = memory(ctx);
    CHECK(m1.bytes_in_use == m0.bytes_in_use);       /* not the context's memory */
    CHECK(m1.borrowed_bytes == m0.borrowed_bytes + N * 4);
    CHECK(m1.live_buffers == m0.live_buffers + 1);
    CHECK(fake.live_device_allocations() == device0); /* nothing allocated */

    /* Copies and fills reach the foreign memory. */
    float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)i * 0.5f - 7.0f;
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), in, sizeof in));
    CHECK(memcmp((const void *)(uintptr_t)p, in, sizeof in) == 0);
    sc_buffer own = {0};
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N, .label = "own"},
                              &own));
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, sc_view_of(own), sc_view_of(b)));
    memset(out, 0, sizeof out);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(own)));
    CHECK(memcmp(out, in, sizeof in) == 0);
    const float seven = 7.0f;
    sc_view part;
    CHECK_OK(sc_buffer_view(b, 100, 10, &part));
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, part, &seven));
    CHECK(((const float *)(uintptr_t)p)[105] == 7.0f && ((const float *)(uintptr_t)p)[99] == in[99]);

    /* Listed like any buffer, marked borrowed. */
    sc_object_info info[8];
    size_t n = 0;
    CHECK_OK(sc_context_live_objects(ctx, info, 8, &n));
    int seen = 0;
    for (size_t i = 0; i < n && i < 8; i++)
        if (strcmp(info[i].label, "foreign") == 0)
            seen = strstr(info[i].detail, "borrowed") != NULL;
    CHECK(seen);

    /* Destroy: release once, the memory stays the owner's. */
    CHECK(released[1] == 0);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(released[1] == 1);
    CHECK(fake.live_device_allocations() == device0 + 1); /* p and own */
    sc_memory_stats m2 = memory(ctx);
    CHECK(m2.borrowed_bytes == m0.borrowed_bytes && m2.live_buffers == m0.live_buffers + 1);
    CHECK_FAIL(sc_buffer_destroy(b), SC_ERR_STALE_HANDLE, "sc_buffer_destroy");
    CHECK_FAIL(sc_buffer_get_origin(b, &o), SC_ERR_STALE_HANDLE, "sc_buffer_get_origin");
    CHECK(released[1] == 1);

    /* A sub-range of the allocation; release may be NULL. */
    CHECK_OK(sc_buffer_borrow(ctx, p + 256,
                              &(sc_borrow_desc){.dtype = SC_F32, .count = 64, .label = "sub"},
                              &b));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, out, 64 * 4, sc_view_of(b)));
    CHECK(memcmp(out, (const char *)(uintptr_t)p + 256, 64 * 4) == 0);
    CHECK_OK(sc_buffer_destroy(b));
    /* The last element of the allocation exactly. */
    CHECK_OK(sc_buffer_borrow(ctx, p + (N - 1) * 4,
                              &(sc_borrow_desc){.dtype = SC_F32, .count = 1, .label = "last"},
                              &b));
    CHECK_OK(sc_buffer_destroy(b));

    CHECK_OK(sc_buffer_destroy(own));
    foreign_free(p);
}

static void test_borrow_refusals(void)
{
    enum { N = 1024 };
    const CUdeviceptr p = foreign_alloc(N * sizeof(float));
    memset(released, 0, sizeof released);
    const sc_memory_stats m0 = memory(ctx);
    sc_borrow_desc d = {.dtype = SC_F32, .count = N, .label = "refused", .release = on_release,
                        .release_user = (void *)(intptr_t)2};
    sc_buffer b = {12345};

    CHECK_FAIL(sc_buffer_borrow(ctx, p, &d, NULL), SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK_FAIL(sc_buffer_borrow(ctx, p, NULL, &b), SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK(b.id == 0);
    CHECK_FAIL(sc_buffer_borrow(ctx, 0, &d, &b), SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK_MSG("'refused': device_ptr is 0");
    CHECK_FAIL(sc_buffer_borrow(ctx, p + 2, &d, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_borrow");
    CHECK_MSG("not aligned to the 4-byte elements of f32");
    d.count = 0;
    CHECK_FAIL(sc_buffer_borrow(ctx, p, &d, &b), SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK_MSG("count is 0");
    d.count = N;
    d.dtype = SC_DTYPE_COUNT;
    CHECK_FAIL(sc_buffer_borrow(ctx, p, &d, &b), SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK_MSG("invalid dtype");
    d.dtype = SC_F32;
    d.count = UINT64_MAX / 2;
    CHECK_FAIL(sc_buffer_borrow(ctx, p, &d, &b), SC_ERR_OVERFLOW, "sc_buffer_borrow");
    d.count = 2;
    CHECK_FAIL(sc_buffer_borrow(ctx, UINT64_MAX - 3, &d, &b), SC_ERR_OVERFLOW,
               "sc_buffer_borrow");
    /* Past the allocation's end, by one element and from inside. */
    d.count = N + 1;
    CHECK_FAIL(sc_buffer_borrow(ctx, p, &d, &b), SC_ERR_OUT_OF_BOUNDS, "sc_buffer_borrow");
    CHECK_MSG("runs 4 bytes past the end of its allocation");
    CHECK_MSG("'refused'");
    d.count = 2;
    CHECK_FAIL(sc_buffer_borrow(ctx, p + (N - 1) * 4, &d, &b), SC_ERR_OUT_OF_BOUNDS,
               "sc_buffer_borrow");
    d.count = N;
    /* Memory the driver does not know: pageable host memory. */
    float *pageable = test_xmalloc(N * sizeof(float));
    CHECK_FAIL(sc_buffer_borrow(ctx, (uint64_t)(uintptr_t)pageable, &d, &b),
               SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK_MSG("no memory the CUDA driver knows");
    free(pageable);
    /* Pinned host memory. */
    void *pinned = NULL;
    REQUIRE(sci_cuMemHostAlloc(&pinned, N * sizeof(float), CU_MEMHOSTALLOC_PORTABLE) ==
            CUDA_SUCCESS);
    CHECK_FAIL(sc_buffer_borrow(ctx, (uint64_t)(uintptr_t)pinned, &d, &b),
               SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK_MSG("is host memory");
    CHECK(sci_cuMemFreeHost(pinned) == CUDA_SUCCESS);
    /* Managed memory, another device's, another context's (as the test device is told to
     * describe a foreign allocation). */
    const CUdeviceptr q = foreign_alloc(4096);
    REQUIRE(fake.set_pointer_attributes(q, CU_MEMORYTYPE_DEVICE, 1, 0, 0));
    d.count = 16;
    CHECK_FAIL(sc_buffer_borrow(ctx, q, &d, &b), SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK_MSG("managed memory");
    REQUIRE(fake.set_pointer_attributes(q, CU_MEMORYTYPE_DEVICE, 0, 1, 0));
    CHECK_FAIL(sc_buffer_borrow(ctx, q, &d, &b), SC_ERR_WRONG_CONTEXT, "sc_buffer_borrow");
    CHECK_MSG("is memory of device 1; the context");
    CHECK_MSG("is on device 0");
    REQUIRE(fake.set_pointer_attributes(q, CU_MEMORYTYPE_DEVICE, 0, 0, 1));
    CHECK_FAIL(sc_buffer_borrow(ctx, q, &d, &b), SC_ERR_WRONG_CONTEXT, "sc_buffer_borrow");
    CHECK_MSG("another CUDA context than device 0's primary context");
    REQUIRE(fake.set_pointer_attributes(q, CU_MEMORYTYPE_UNIFIED, 0, 0, 0));
    CHECK_FAIL(sc_buffer_borrow(ctx, q, &d, &b), SC_ERR_INVALID_ARGUMENT, "sc_buffer_borrow");
    CHECK_MSG("memory type 4");
    REQUIRE(fake.set_pointer_attributes(q, CU_MEMORYTYPE_DEVICE, 0, 0, 0)); /* the truth */
    CHECK_OK(sc_buffer_borrow(ctx, q, &d, &b));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(released[2] == 1);
    released[2] = 0;
    foreign_free(q);
    /* A freed allocation. */
    const CUdeviceptr gone = foreign_alloc(256);
    foreign_free(gone);
    CHECK_FAIL(sc_buffer_borrow(ctx, gone, &d, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_borrow");
    /* A stale context, a stream of another context. */
    CHECK_FAIL(sc_buffer_borrow((sc_context){0}, p, &d, &b), SC_ERR_STALE_HANDLE,
               "sc_buffer_borrow");
    sc_context other;
    REQUIRE(sc_context_create(NULL, &other) == SC_OK);
    sc_stream os;
    CHECK_OK(sc_stream_create(other, NULL, &os));
    d.stream = os;
    CHECK_FAIL(sc_buffer_borrow(ctx, p, &d, &b), SC_ERR_WRONG_CONTEXT, "sc_buffer_borrow");
    d.stream = (sc_stream){0};
    CHECK_OK(sc_stream_destroy(os));
    CHECK_OK(sc_context_destroy(other));

    /* No refusal called release, accounted memory or left an object. */
    CHECK(b.id == 0);
    for (int i = 0; i < 16; i++)
        CHECK(released[i] == 0);
    const sc_memory_stats m1 = memory(ctx);
    CHECK(m1.borrowed_bytes == m0.borrowed_bytes && m1.live_buffers == m0.live_buffers);
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    foreign_free(p);
}

/* Every write to a read-only buffer is refused before anything is enqueued. */
static void test_read_only(void)
{
    enum { N = 256 };
    const CUdeviceptr p = foreign_alloc(N * sizeof(float));
    float orig[N];
    for (int i = 0; i < N; i++)
        orig[i] = (float)(i * 3);
    memcpy((void *)(uintptr_t)p, orig, sizeof orig);
    memset(released, 0, sizeof released);
    sc_buffer ro = {0}, w = {0};
    CHECK_OK(sc_buffer_borrow(ctx, p,
                              &(sc_borrow_desc){.dtype = SC_F32, .count = N, .label = "weights",
                                                .read_only = true, .release = on_release,
                                                .release_user = (void *)(intptr_t)3},
                              &ro));
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = N, .label = "w"},
                              &w));
    sc_buffer_origin o;
    CHECK_OK(sc_buffer_get_origin(ro, &o));
    CHECK(o.borrowed && o.read_only && o.exports == 0);

    float junk[N] = {0};
    CHECK_FAIL(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(ro), junk, sizeof junk),
               SC_ERR_INVALID_ARGUMENT, "sc_copy_from_host");
    CHECK_MSG("borrowed buffer 'weights' of 256 f32 (created at test_td_interop.c:");
    CHECK_MSG("is read-only");
    CHECK_FAIL(sc_copy(SC_DEFAULT_STREAM, sc_view_of(ro), sc_view_of(w)),
               SC_ERR_INVALID_ARGUMENT, "sc_copy");
    CHECK_MSG("read-only");
    const float one = 1.0f;
    CHECK_FAIL(sc_fill(SC_DEFAULT_STREAM, sc_view_of(ro), &one), SC_ERR_INVALID_ARGUMENT,
               "sc_fill");
    CHECK_MSG("'weights'");
    sc_host_buffer h;
    CHECK_OK(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = sizeof junk}, &h));
    CHECK_FAIL(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, sc_view_of(ro), h, 0),
               SC_ERR_INVALID_ARGUMENT, "sc_copy_from_host_buffer");

    /* Launches: an out or inout argument is refused, an in argument is fine. */
    sc_module m;
    CHECK_OK(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m));
    sc_kernel add;
    CHECK_OK(sc_kernel_get(m, "add", &add));
    sc_launch_desc cfg = {.grid = {1, 1, 1}, .block = {256, 1, 1}};
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(w)),
                         sc_arg_inout(sc_view_of(ro)), sc_arg_u32(N)),
               SC_ERR_INVALID_ARGUMENT, "sc_kernel_launch");
    CHECK_MSG("borrowed buffer 'weights'");
    CHECK_MSG("read-only");
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(w)),
                         sc_arg_out(sc_view_of(ro)), sc_arg_u32(N)),
               SC_ERR_INVALID_ARGUMENT, "sc_kernel_launch");
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, add, &cfg, sc_arg_in(sc_view_of(ro)),
                       sc_arg_inout(sc_view_of(w)), sc_arg_u32(N)));

    /* A tensor map of a read-only buffer: readable through it, not writable. */
    static const char tmap_ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                                   ".visible .entry copy_tile(\n"
                                   "    .param .align 64 .b8 copy_tile_param_0[128],\n"
                                   "    .param .u64 copy_tile_param_1\n"
                                   ")\n"
                                   "{\n    ret;\n}\n";
    sc_module tm;
    CHECK_OK(sc_module_load_image(ctx, tmap_ptx, sizeof tmap_ptx - 1, &tm));
    sc_kernel copy_tile;
    CHECK_OK(sc_kernel_get(tm, "copy_tile", &copy_tile));
    sc_tensor_map map;
    CHECK_OK(sc_tensor_map_encode(sc_view_of(ro),
                                  &(sc_tensor_map_desc){.rows = 16, .cols = 16, .box_rows = 8,
                                                        .box_cols = 8},
                                  &map));
    sc_launch_desc tile_cfg = {.grid = {1, 1, 1}, .block = {128, 1, 1}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, copy_tile, &tile_cfg, sc_arg_tensor_map_in(&map),
                       sc_arg_out(sc_view_of(w))));
    CHECK_FAIL(SC_LAUNCH(SC_DEFAULT_STREAM, copy_tile, &tile_cfg, sc_arg_tensor_map_out(&map),
                         sc_arg_out(sc_view_of(w))),
               SC_ERR_INVALID_ARGUMENT, "sc_kernel_launch");
    CHECK_MSG("read-only");
    CHECK_OK(sc_module_destroy(tm));

    /* A capture refuses the write too, and stays usable. */
    sc_stream cs;
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "capturing"}, &cs));
    CHECK_OK(sc_stream_begin_capture(cs, &(sc_capture_desc){SC_CAPTURE_RELAXED}));
    CHECK_FAIL(sc_copy(cs, sc_view_of(ro), sc_view_of(w)), SC_ERR_INVALID_ARGUMENT, "sc_copy");
    CHECK_OK(sc_copy(cs, sc_view_of(w), sc_view_of(ro)));
    sc_graph g;
    CHECK_OK(sc_stream_end_capture(cs, &g));
    CHECK_OK(sc_graph_destroy(g));
    CHECK_OK(sc_stream_destroy(cs));

    /* Reads are fine. */
    float back[N];
    CHECK_OK(sc_copy(SC_DEFAULT_STREAM, sc_view_of(w), sc_view_of(ro)));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, sc_view_of(ro)));
    CHECK(memcmp(back, orig, sizeof orig) == 0);
    /* Nothing wrote it. */
    CHECK(memcmp((const void *)(uintptr_t)p, orig, sizeof orig) == 0);

    /* A writable export is refused; a read-only one carries DLPack's flag. */
    DLManagedTensorVersioned *t = NULL;
    CHECK_FAIL(sc_view_to_dlpack(sc_view_of(ro), NULL, &t), SC_ERR_INVALID_ARGUMENT,
               "sc_view_to_dlpack");
    CHECK_MSG("read-only");
    CHECK(t == NULL);
    CHECK_OK(sc_view_to_dlpack(sc_view_of(ro), &(sc_dlpack_export_desc){.read_only = true}, &t));
    REQUIRE(t != NULL);
    CHECK(t->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
    t->deleter(t);

    CHECK_OK(sc_host_buffer_destroy(h));
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_buffer_destroy(w));
    CHECK_OK(sc_buffer_destroy(ro));
    CHECK(released[3] == 1);
    foreign_free(p);
}

/* The release waits for safecuda's uses: ordered before the owner's stream when it was
 * given (the owner stream waits for a use on another stream), else on the host. */
static void test_release_order(void)
{
    const CUdeviceptr p = foreign_alloc(4096);
    memset(released, 0, sizeof released);
    sc_stream owner, side;
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "owner"}, &owner));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "side"}, &side));
    sc_buffer b;
    CHECK_OK(sc_buffer_borrow(ctx, p,
                              &(sc_borrow_desc){.dtype = SC_U8, .count = 4096, .label = "owned",
                                                .stream = owner, .release = on_release,
                                                .release_user = (void *)(intptr_t)4},
                              &b));
    const uint8_t v = 9;
    /* The first use on side waits for the owner's writes (the borrow's first write). */
    REQUIRE(sci_fault_arm("cuStreamWaitEvent", 0, 0));
    CHECK_OK(sc_fill(side, sc_view_of(b), &v));
    CHECK(sci_fault_calls() == 1);
    sci_fault_disarm();
    /* Destroy: the owner stream waits for the fill on side; no host wait. */
    REQUIRE(sci_fault_arm("cuStreamWaitEvent", 0, 0));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(sci_fault_calls() == 1);
    sci_fault_disarm();
    CHECK(released[4] == 1);
    CHECK(((const uint8_t *)(uintptr_t)p)[4095] == 9);

    /* Without an owner stream the host waits for the uses. */
    CHECK_OK(sc_buffer_borrow(ctx, p,
                              &(sc_borrow_desc){.dtype = SC_U8, .count = 4096, .label = "host",
                                                .release = on_release,
                                                .release_user = (void *)(intptr_t)5},
                              &b));
    CHECK_OK(sc_fill(side, sc_view_of(b), &v));
    REQUIRE(sci_fault_arm("cuEventSynchronize", 0, 0));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(sci_fault_calls() >= 1);
    sci_fault_disarm();
    CHECK(released[5] == 1);

    /* An owner stream destroyed first: the host waits instead. */
    CHECK_OK(sc_buffer_borrow(ctx, p,
                              &(sc_borrow_desc){.dtype = SC_U8, .count = 4096, .label = "orphan",
                                                .stream = owner, .release = on_release,
                                                .release_user = (void *)(intptr_t)6},
                              &b));
    CHECK_OK(sc_fill(side, sc_view_of(b), &v));
    CHECK_OK(sc_stream_destroy(owner));
    REQUIRE(sci_fault_arm("cuEventSynchronize", 0, 0));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(sci_fault_calls() >= 1);
    sci_fault_disarm();
    CHECK(released[6] == 1);
    CHECK_OK(sc_stream_destroy(side));
    foreign_free(p);
}

/* A borrowed buffer leaked into sc_context_destroy: reported, released once. */
static void test_borrow_leak(void)
{
    const long device0 = fake.live_device_allocations();
    memset(released, 0, sizeof released);
    sc_context leaky;
    REQUIRE(sc_context_create(NULL, &leaky) == SC_OK);
    const CUdeviceptr p = foreign_alloc(1000);
    sc_buffer b;
    const int borrow_line = __LINE__ + 1; /* where the call begins */
    CHECK_OK(sc_buffer_borrow(leaky, p,
                              &(sc_borrow_desc){.dtype = SC_I32, .count = 250,
                                                .label = "forgotten borrow",
                                                .release = on_release,
                                                .release_user = (void *)(intptr_t)7},
                              &b));
    CHECK(memory(leaky).borrowed_bytes == 1000);
    log_text[0] = '\0';
    sc_set_log_callback(capture_log, NULL);
    CHECK_FAIL(sc_context_destroy(leaky), SC_ERR_LEAKED, "sc_context_destroy");
    sc_set_log_callback(NULL, NULL);
    CHECK(released[7] == 1);
    CHECK(strstr(log_text, "forgotten borrow") != NULL);
    char site[64];
    snprintf(site, sizeof site, "test_td_interop.c:%d", borrow_line);
    CHECK(strstr(log_text, site) != NULL);
    CHECK(strstr(log_text, "borrowed") != NULL);
    CHECK_FAIL(sc_buffer_destroy(b), SC_ERR_STALE_HANDLE, "sc_buffer_destroy");
    CHECK(released[7] == 1);
    CHECK(fake.live_device_allocations() == device0 + 1); /* the owner's, still there */
    CHECK_OK(sc_context_check(ctx)); /* ctx current again, to free it */
    foreign_free(p);
}

/* ---- DLPack types ----------------------------------------------------------------------------- */

static void test_dtypes(void)
{
    for (int d = SC_U8; d < SC_DTYPE_COUNT; d++) {
        DLDataType t = {0, 0, 0};
        CHECK_OK(sc_dtype_to_dlpack((sc_dtype)d, &t));
        CHECK(t.lanes == 1 && t.bits == 8 * sc_dtype_size((sc_dtype)d));
        sc_dtype back = SC_DTYPE_INVALID;
        CHECK_OK(sc_dtype_from_dlpack(t, &back));
        CHECK((int)back == d);
    }
    DLDataType t;
    CHECK_OK(sc_dtype_to_dlpack(SC_BF16, &t));
    CHECK(t.code == kDLBfloat && t.bits == 16);
    CHECK_OK(sc_dtype_to_dlpack(SC_I8, &t));
    CHECK(t.code == kDLInt && t.bits == 8);
    CHECK_OK(sc_dtype_to_dlpack(SC_U64, &t));
    CHECK(t.code == kDLUInt && t.bits == 64);
    CHECK_FAIL(sc_dtype_to_dlpack(SC_DTYPE_INVALID, &t), SC_ERR_TYPE_MISMATCH,
               "sc_dtype_to_dlpack");
    CHECK_FAIL(sc_dtype_to_dlpack(SC_F32, NULL), SC_ERR_INVALID_ARGUMENT, "sc_dtype_to_dlpack");
    sc_dtype d;
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLBool, 8, 1}, &d), SC_ERR_TYPE_MISMATCH,
               "sc_dtype_from_dlpack");
    CHECK_MSG("bool");
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLComplex, 64, 1}, &d), SC_ERR_TYPE_MISMATCH,
               "sc_dtype_from_dlpack");
    CHECK_MSG("complex");
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLFloat, 32, 2}, &d), SC_ERR_TYPE_MISMATCH,
               "sc_dtype_from_dlpack");
    CHECK_MSG("2 lanes");
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLFloat, 8, 1}, &d), SC_ERR_TYPE_MISMATCH,
               "sc_dtype_from_dlpack");
    /* fp8: e4m3fn and e5m2 are safecuda's; the other 8-bit float flavours are not */
    CHECK_OK(sc_dtype_from_dlpack((DLDataType){kDLFloat8_e4m3fn, 8, 1}, &d));
    CHECK(d == SC_F8E4M3);
    CHECK_OK(sc_dtype_from_dlpack((DLDataType){kDLFloat8_e5m2, 8, 1}, &d));
    CHECK(d == SC_F8E5M2);
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLFloat8_e4m3fnuz, 8, 1}, &d),
               SC_ERR_TYPE_MISMATCH, "sc_dtype_from_dlpack");
    CHECK_FAIL(sc_dtype_from_dlpack((DLDataType){kDLFloat8_e5m2fnuz, 8, 1}, &d),
               SC_ERR_TYPE_MISMATCH, "sc_dtype_from_dlpack");
}

/* ---- DLPack import ---------------------------------------------------------------------------- */

static void test_import(void)
{
    enum { N = 512 };
    const CUdeviceptr p = foreign_alloc(N * sizeof(float));
    float data[N];
    for (int i = 0; i < N; i++)
        data[i] = (float)i - 100.0f;
    memcpy((void *)(uintptr_t)p, data, sizeof data);
    const sc_memory_stats m0 = memory(ctx);
    test_tensor tt;
    sc_buffer b = {0};
    const int64_t shape2[2] = {16, 32};

    /* Refusals: the deleter is never called. */
    make_tensor(&tt, p, DL_F32, 2, shape2);
    tt.m.dl_tensor.device.device_type = kDLCPU;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, &(sc_dlpack_import_desc){.label = "t"}, &b),
               SC_ERR_INVALID_ARGUMENT, "sc_buffer_from_dlpack");
    CHECK_MSG("a CPU tensor (device type kDLCPU)");
    tt.m.dl_tensor.device.device_type = kDLCUDAHost;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK_MSG("kDLCUDAHost");
    tt.m.dl_tensor.device.device_type = kDLCUDAManaged;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK_MSG("managed");
    tt.m.dl_tensor.device = (DLDevice){kDLCUDA, 1};
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_WRONG_CONTEXT,
               "sc_buffer_from_dlpack");
    CHECK_MSG("a tensor of CUDA device 1; the context is on device 0");
    tt.m.dl_tensor.device = (DLDevice){kDLCUDA, 0};
    tt.m.version = (DLPackVersion){2, 0};
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK_MSG("DLPack 2.0 is not supported (1.x expected)");
    tt.m.version = (DLPackVersion){0, 8};
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    tt.m.version = (DLPackVersion){1, 3}; /* a later minor version is fine */
    tt.m.dl_tensor.dtype = (DLDataType){kDLBool, 8, 1};
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_TYPE_MISMATCH,
               "sc_buffer_from_dlpack");
    CHECK_MSG("bool");
    tt.m.dl_tensor.dtype = (DLDataType){kDLComplex, 64, 1};
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_TYPE_MISMATCH,
               "sc_buffer_from_dlpack");
    CHECK_MSG("complex");
    tt.m.dl_tensor.dtype = (DLDataType){kDLFloat, 32, 2};
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_TYPE_MISMATCH,
               "sc_buffer_from_dlpack");
    CHECK_MSG("lanes");
    tt.m.dl_tensor.dtype = DL_F32;
    /* Strides of a transposed (column-major) tensor. */
    tt.strides[0] = 1;
    tt.strides[1] = 16;
    tt.m.dl_tensor.strides = tt.strides;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK_MSG("strides[1] = 16 where a compact row-major (C-contiguous) layout has 1");
    CHECK_MSG("shape [16, 32], strides [1, 16]");
    tt.strides[0] = 64; /* a slice with a gap between rows */
    tt.strides[1] = 1;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK_MSG("strides[0] = 64 where a compact row-major (C-contiguous) layout has 32");
    tt.m.dl_tensor.strides = NULL;
    tt.shape[0] = 0;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK_MSG("no elements");
    tt.shape[0] = -1;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    tt.shape[0] = 17; /* one row past the allocation */
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_OUT_OF_BOUNDS,
               "sc_buffer_from_dlpack");
    CHECK_MSG("past the end of its allocation");
    tt.shape[0] = 16;
    tt.m.dl_tensor.byte_offset = 2;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK_MSG("not aligned");
    tt.m.dl_tensor.byte_offset = 0;
    tt.m.dl_tensor.data = NULL;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    tt.m.dl_tensor.data = (void *)(uintptr_t)p;
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, NULL, NULL, &b), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK_FAIL(sc_buffer_from_dlpack(ctx, &tt.m, NULL, NULL), SC_ERR_INVALID_ARGUMENT,
               "sc_buffer_from_dlpack");
    CHECK(tt.deleted == 0);
    CHECK(b.id == 0);
    CHECK(memory(ctx).live_buffers == m0.live_buffers);

    /* A good import: the deleter runs once, at destroy. */
    CHECK_OK(sc_buffer_from_dlpack(ctx, &tt.m, &(sc_dlpack_import_desc){.label = "imported"},
                                   &b));
    sc_buffer_props props;
    CHECK_OK(sc_buffer_info(b, &props));
    CHECK(props.dtype == SC_F32 && props.count == N && strcmp(props.label, "imported") == 0);
    sc_buffer_origin o;
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.borrowed && !o.read_only);
    CHECK(memory(ctx).borrowed_bytes == m0.borrowed_bytes + N * 4);
    float back[N];
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, sc_view_of(b)));
    CHECK(memcmp(back, data, sizeof data) == 0);
    CHECK(tt.deleted == 0);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(tt.deleted == 1);
    CHECK(memory(ctx).borrowed_bytes == m0.borrowed_bytes);

    /* byte_offset is honoured; extent-1 dimensions may have any stride; a NULL deleter. */
    const int64_t shape3[3] = {4, 1, 8};
    make_tensor(&tt, p, DL_F32, 3, shape3);
    tt.m.dl_tensor.byte_offset = 256;
    tt.strides[0] = 8;
    tt.strides[1] = 12345;
    tt.strides[2] = 1;
    tt.m.dl_tensor.strides = tt.strides;
    CHECK_OK(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b));
    uint64_t dp = 0;
    CHECK_OK(sc_buffer_device_ptr(b, &dp));
    CHECK(dp == p + 256);
    CHECK_OK(sc_buffer_info(b, &props));
    CHECK(props.count == 32);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, 32 * 4, sc_view_of(b)));
    CHECK(memcmp(back, data + 64, 32 * 4) == 0);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(tt.deleted == 1);
    tt.m.deleter = NULL;
    CHECK_OK(sc_buffer_from_dlpack(ctx, &tt.m, NULL, &b));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(tt.deleted == 1);

    /* A scalar (ndim 0); the READ_ONLY flag, and desc->read_only. */
    make_tensor(&tt, p, DL_F32, 0, NULL);
    tt.m.dl_tensor.shape = NULL;
    tt.m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    CHECK_OK(sc_buffer_from_dlpack(ctx, &tt.m, &(sc_dlpack_import_desc){.label = "scalar"}, &b));
    CHECK_OK(sc_buffer_info(b, &props));
    CHECK(props.count == 1);
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.read_only);
    const float f = 1.0f;
    CHECK_FAIL(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), &f), SC_ERR_INVALID_ARGUMENT, "sc_fill");
    CHECK_MSG("'scalar'");
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(tt.deleted == 1);
    make_tensor(&tt, p, (DLDataType){kDLInt, 32, 1}, 1, (const int64_t[]){N});
    CHECK_OK(sc_buffer_from_dlpack(ctx, &tt.m, &(sc_dlpack_import_desc){.read_only = true}, &b));
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.read_only);
    CHECK_OK(sc_buffer_info(b, &props));
    CHECK(props.dtype == SC_I32);
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(tt.deleted == 1);

    /* Imported into a context that leaks it: the deleter runs at its destroy. */
    sc_context leaky;
    REQUIRE(sc_context_create(NULL, &leaky) == SC_OK);
    make_tensor(&tt, p, DL_F32, 1, (const int64_t[]){N});
    CHECK_OK(sc_buffer_from_dlpack(leaky, &tt.m, &(sc_dlpack_import_desc){.label = "leaked t"},
                                   &b));
    log_text[0] = '\0';
    sc_set_log_callback(capture_log, NULL);
    CHECK_FAIL(sc_context_destroy(leaky), SC_ERR_LEAKED, "sc_context_destroy");
    sc_set_log_callback(NULL, NULL);
    CHECK(strstr(log_text, "leaked t") != NULL);
    CHECK(tt.deleted == 1);
    CHECK_OK(sc_context_check(ctx)); /* makes ctx current again for the free below */
    foreign_free(p);
}

/* ---- DLPack export ---------------------------------------------------------------------------- */

static sc_buffer filled_buffer(sc_context c, uint64_t n, const char *label, float *data)
{
    sc_buffer b = {0};
    CHECK_OK(sc_buffer_create(c, &(sc_buffer_desc){.dtype = SC_F32, .count = n, .label = label},
                              &b));
    for (uint64_t i = 0; i < n; i++)
        data[i] = (float)i * 1.25f + 3.0f;
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), data, n * sizeof(float)));
    return b;
}

static void test_export(void)
{
    float data[24];
    sc_buffer b = filled_buffer(ctx, 24, "exported", data);
    uint64_t base = 0;
    CHECK_OK(sc_buffer_device_ptr(b, &base));
    sc_view v;
    CHECK_OK(sc_buffer_view(b, 4, 12, &v));

    DLManagedTensorVersioned *t = NULL;
    CHECK_OK(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.ndim = 2, .shape = {3, 4}}, &t));
    REQUIRE(t != NULL);
    CHECK(t->version.major == 1 && t->version.minor == 1);
    CHECK(t->manager_ctx != NULL && t->deleter != NULL);
    CHECK(t->flags == 0);
    const DLTensor *d = &t->dl_tensor;
    CHECK(d->device.device_type == kDLCUDA && d->device.device_id == 0);
    CHECK(d->dtype.code == kDLFloat && d->dtype.bits == 32 && d->dtype.lanes == 1);
    CHECK(d->ndim == 2 && d->shape[0] == 3 && d->shape[1] == 4);
    CHECK(d->strides && d->strides[0] == 4 && d->strides[1] == 1);
    CHECK((uint64_t)(uintptr_t)d->data == base + 16 && d->byte_offset == 0);
    CHECK(memcmp(d->data, data + 4, 12 * sizeof(float)) == 0); /* host memory here */
    sc_buffer_origin o;
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(!o.borrowed && !o.read_only && o.exports == 1);
    /* Listed as an object of the context. */
    sc_object_info info[8];
    size_t n = 0;
    CHECK_OK(sc_context_live_objects(ctx, info, 8, &n));
    int seen = 0;
    for (size_t i = 0; i < n && i < 8; i++)
        if (strcmp(info[i].kind, "dlpack export") == 0) {
            seen++;
            CHECK(strcmp(info[i].label, "exported") == 0);
            CHECK(info[i].bytes == 48);
            CHECK(strstr(info[i].detail, "12 x f32 at element 4") != NULL);
        }
    CHECK(seen == 1);
    t->deleter(t);
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.exports == 0);
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &n));
    CHECK(n == 1);

    /* ndim 0: one dimension; a read-only export of a writable buffer. */
    CHECK_OK(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.read_only = true}, &t));
    CHECK(t->dl_tensor.ndim == 1 && t->dl_tensor.shape[0] == 12 && t->dl_tensor.strides[0] == 1);
    CHECK(t->flags == DLPACK_FLAG_BITMASK_READ_ONLY);
    t->deleter(t);
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), &(sc_dlpack_export_desc){.ndim = 8,
                                                .shape = {1, 2, 1, 3, 1, 4, 1, 1}}, &t));
    CHECK(t->dl_tensor.ndim == 8 && t->dl_tensor.strides[0] == 24 &&
          t->dl_tensor.strides[3] == 4 && t->dl_tensor.strides[7] == 1);
    t->deleter(t);

    /* Refusals. */
    t = (DLManagedTensorVersioned *)(uintptr_t)1;
    CHECK_FAIL(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.ndim = 9}, &t),
               SC_ERR_INVALID_ARGUMENT, "sc_view_to_dlpack");
    CHECK(t == NULL);
    CHECK_FAIL(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.ndim = -1}, &t),
               SC_ERR_INVALID_ARGUMENT, "sc_view_to_dlpack");
    CHECK_FAIL(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.ndim = 2, .shape = {0, 4}}, &t),
               SC_ERR_INVALID_ARGUMENT, "sc_view_to_dlpack");
    CHECK_MSG("extents are at least 1");
    CHECK_FAIL(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.ndim = 2, .shape = {3, 5}}, &t),
               SC_ERR_INVALID_ARGUMENT, "sc_view_to_dlpack");
    CHECK_MSG("desc->shape [3, 5] holds 15 elements; the view has 12");
    CHECK_FAIL(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.ndim = 3,
                                 .shape = {INT64_MAX, INT64_MAX, 2}}, &t),
               SC_ERR_INVALID_ARGUMENT, "sc_view_to_dlpack");
    CHECK_FAIL(sc_view_to_dlpack(v, NULL, NULL), SC_ERR_INVALID_ARGUMENT, "sc_view_to_dlpack");
    sc_view bad = v;
    bad.count = 100;
    CHECK_FAIL(sc_view_to_dlpack(bad, NULL, &t), SC_ERR_OUT_OF_BOUNDS, "sc_view_to_dlpack");
    CHECK_FAIL(sc_view_to_dlpack((sc_view){{0}, 0, 1}, NULL, &t), SC_ERR_STALE_HANDLE,
               "sc_view_to_dlpack");
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.exports == 0);
    CHECK_OK(sc_buffer_destroy(b));
}

/* The synchronization an export asks for: the consumer's stream waits, or the host does, or
 * nothing happens; a consumer stream's use is counted when the deleter runs. */
static void test_export_sync(void)
{
    float data[64];
    sc_buffer b = filled_buffer(ctx, 64, "synced", data);
    sc_stream producer, consumer, later;
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "producer"}, &producer));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "consumer"}, &consumer));
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "later"}, &later));
    const float one = 1.0f;
    DLManagedTensorVersioned *t = NULL;

    /* The consumer stream waits for the producer's write. */
    CHECK_OK(sc_fill(producer, sc_view_of(b), &one));
    REQUIRE(sci_fault_arm("cuStreamWaitEvent", 0, 0));
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), &(sc_dlpack_export_desc){.stream = consumer}, &t));
    CHECK(sci_fault_calls() == 1);
    sci_fault_disarm();
    /* The deleter counts the consumer's use: the next write on another stream waits for
     * the consumer stream. */
    t->deleter(t);
    REQUIRE(sci_fault_arm("cuStreamWaitEvent", 0, 0));
    CHECK_OK(sc_fill(later, sc_view_of(b), &one));
    CHECK(sci_fault_calls() >= 1);
    sci_fault_disarm();

    /* no_sync: no wait anywhere. */
    CHECK_OK(sc_fill(producer, sc_view_of(b), &one));
    REQUIRE(sci_fault_arm("cuEventSynchronize", 0, 0));
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), &(sc_dlpack_export_desc){.no_sync = true}, &t));
    CHECK(sci_fault_calls() == 0);
    sci_fault_disarm();
    t->deleter(t);
    REQUIRE(sci_fault_arm("cuStreamWaitEvent", 0, 0));
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), &(sc_dlpack_export_desc){.no_sync = true}, &t));
    CHECK(sci_fault_calls() == 0);
    sci_fault_disarm();
    t->deleter(t);

    /* No stream: the host waits for the producer's write. */
    CHECK_OK(sc_fill(producer, sc_view_of(b), &one));
    REQUIRE(sci_fault_arm("cuEventSynchronize", 0, 0));
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), NULL, &t));
    CHECK(sci_fault_calls() == 1);
    sci_fault_disarm();
    t->deleter(t);

    /* A consumer stream of another context is refused. */
    sc_context other;
    REQUIRE(sc_context_create(NULL, &other) == SC_OK);
    sc_stream os;
    CHECK_OK(sc_stream_create(other, NULL, &os));
    CHECK_FAIL(sc_view_to_dlpack(sc_view_of(b), &(sc_dlpack_export_desc){.stream = os}, &t),
               SC_ERR_WRONG_CONTEXT, "sc_view_to_dlpack");
    CHECK_OK(sc_stream_destroy(os));
    CHECK_OK(sc_context_destroy(other));
    CHECK_OK(sc_context_check(ctx));

    /* A consumer stream destroyed before the deleter: nothing to count. */
    sc_stream brief;
    CHECK_OK(sc_stream_create(ctx, &(sc_stream_desc){.label = "brief"}, &brief));
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), &(sc_dlpack_export_desc){.stream = brief}, &t));
    CHECK_OK(sc_stream_destroy(brief));
    t->deleter(t);

    CHECK_OK(sc_stream_destroy(producer));
    CHECK_OK(sc_stream_destroy(consumer));
    CHECK_OK(sc_stream_destroy(later));
    CHECK_OK(sc_buffer_destroy(b));
}

/* The buffer goes before the deleter: its handle is stale at once, its memory stays until
 * the last deleter. */
static void test_export_outlives_buffer(void)
{
    const long device0 = fake.live_device_allocations();
    const sc_memory_stats m0 = memory(ctx);
    float data[100];
    sc_buffer b = filled_buffer(ctx, 100, "short-lived", data);
    CHECK(fake.live_device_allocations() == device0 + 1);
    DLManagedTensorVersioned *t1 = NULL, *t2 = NULL;
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), NULL, &t1));
    sc_view half;
    CHECK_OK(sc_buffer_view(b, 50, 50, &half));
    CHECK_OK(sc_view_to_dlpack(half, &(sc_dlpack_export_desc){.read_only = true}, &t2));
    sc_buffer_origin o;
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.exports == 2);

    CHECK_OK(sc_buffer_destroy(b));
    CHECK_FAIL(sc_buffer_info(b, &(sc_buffer_props){0}), SC_ERR_STALE_HANDLE, "sc_buffer_info");
    CHECK_FAIL(sc_buffer_destroy(b), SC_ERR_STALE_HANDLE, "sc_buffer_destroy");
    DLManagedTensorVersioned *t3 = NULL;
    CHECK_FAIL(sc_view_to_dlpack(sc_view_of(b), NULL, &t3), SC_ERR_STALE_HANDLE,
               "sc_view_to_dlpack");
    /* The memory is still allocated, accounted and readable. */
    CHECK(fake.live_device_allocations() == device0 + 1);
    CHECK(memory(ctx).bytes_in_use == m0.bytes_in_use + 400);
    CHECK(memcmp(t1->dl_tensor.data, data, sizeof data) == 0);
    CHECK(memcmp(t2->dl_tensor.data, data + 50, 50 * sizeof(float)) == 0);
    /* The first deleter keeps it, the last frees it. */
    t1->deleter(t1);
    CHECK(fake.live_device_allocations() == device0 + 1);
    CHECK(memcmp(t2->dl_tensor.data, data + 50, 50 * sizeof(float)) == 0);
    t2->deleter(t2);
    CHECK(fake.live_device_allocations() == device0);
    const sc_memory_stats m1 = memory(ctx);
    CHECK(m1.bytes_in_use == m0.bytes_in_use && m1.live_buffers == m0.live_buffers);
    size_t n = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &n));
    CHECK(n == 0);
}

static void *call_deleter(void *arg)
{
    DLManagedTensorVersioned *t = arg;
    t->deleter(t);
    return NULL;
}

/* The context goes while exports are held: each is reported, the memory freed, and the
 * deleters stay safe to call (from any thread). */
static void test_export_outlives_context(void)
{
    fake_counts before = fake_counts_now();
    sc_context leaky;
    REQUIRE(sc_context_create(NULL, &leaky) == SC_OK);
    float data[32];
    sc_buffer kept = filled_buffer(leaky, 32, "kept buffer", data);
    sc_buffer gone = filled_buffer(leaky, 32, "destroyed buffer", data);
    DLManagedTensorVersioned *t1 = NULL, *t2 = NULL, *t3 = NULL;
    CHECK_OK(sc_view_to_dlpack(sc_view_of(kept), NULL, &t1));
    const int export_line = __LINE__ - 1;
    CHECK_OK(sc_view_to_dlpack(sc_view_of(gone), NULL, &t2));
    CHECK_OK(sc_view_to_dlpack(sc_view_of(gone), NULL, &t3));
    CHECK_OK(sc_buffer_destroy(gone));
    t3->deleter(t3); /* one of the two let go before the context goes */

    log_text[0] = '\0';
    sc_set_log_callback(capture_log, NULL);
    CHECK_FAIL(sc_context_destroy(leaky), SC_ERR_LEAKED, "sc_context_destroy");
    sc_set_log_callback(NULL, NULL);
    CHECK_MSG("3 objects"); /* kept buffer and the two exports still held */
    char site[64];
    snprintf(site, sizeof site, "test_td_interop.c:%d", export_line);
    CHECK(strstr(log_text, site) != NULL);
    CHECK(strstr(log_text, "dlpack export 'kept buffer'") != NULL);
    CHECK(strstr(log_text, "dlpack export 'destroyed buffer'") != NULL);
    CHECK(strstr(log_text, "still held by its consumer") != NULL);
    char diff[256];
    if (fake_counts_diff(before, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "after the context's destroy the fake still holds: %s\n", diff);
        test_failures++;
    }
    /* The deleters only free their tensors now: one here, one on another thread. */
    t1->deleter(t1);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, call_deleter, t2) == 0);
    pthread_join(th, NULL);
    CHECK(fake_counts_diff(before, fake_counts_now(), diff, sizeof diff) == 0);
    CHECK_OK(sc_context_check(ctx));
}

/* Export then import: the same memory, and the import's destroy runs the export's deleter. */
static void test_round_trip(void)
{
    const long device0 = fake.live_device_allocations();
    float data[256];
    sc_buffer b = filled_buffer(ctx, 256, "original", data);
    uint64_t base = 0;
    CHECK_OK(sc_buffer_device_ptr(b, &base));
    sc_view v;
    CHECK_OK(sc_buffer_view(b, 64, 128, &v));
    DLManagedTensorVersioned *t = NULL;
    CHECK_OK(sc_view_to_dlpack(v, &(sc_dlpack_export_desc){.ndim = 2, .shape = {8, 16},
                                                          .read_only = true},
                               &t));
    sc_buffer imp;
    CHECK_OK(sc_buffer_from_dlpack(ctx, t, &(sc_dlpack_import_desc){.label = "again"}, &imp));
    uint64_t ip = 0;
    CHECK_OK(sc_buffer_device_ptr(imp, &ip));
    CHECK(ip == base + 64 * 4);
    sc_buffer_origin o;
    CHECK_OK(sc_buffer_get_origin(imp, &o));
    CHECK(o.borrowed && o.read_only); /* the export's READ_ONLY flag */
    float back[128];
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, sc_view_of(imp)));
    CHECK(memcmp(back, data + 64, sizeof back) == 0);
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.exports == 1);
    CHECK_OK(sc_buffer_destroy(imp)); /* runs the export's deleter */
    CHECK_OK(sc_buffer_get_origin(b, &o));
    CHECK(o.exports == 0);

    /* The original destroyed first: the import keeps its memory. */
    CHECK_OK(sc_view_to_dlpack(v, NULL, &t));
    CHECK_OK(sc_buffer_from_dlpack(ctx, t, NULL, &imp));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(fake.live_device_allocations() == device0 + 1);
    const float nine = 9.0f;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(imp), &nine));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, sc_view_of(imp)));
    CHECK(back[0] == 9.0f && back[127] == 9.0f);
    CHECK_OK(sc_buffer_destroy(imp));
    CHECK(fake.live_device_allocations() == device0);

    /* Both leaked into a context's destroy. */
    fake_counts before = fake_counts_now();
    sc_context leaky;
    REQUIRE(sc_context_create(NULL, &leaky) == SC_OK);
    b = filled_buffer(leaky, 256, "leaked original", data);
    CHECK_OK(sc_view_to_dlpack(sc_view_of(b), NULL, &t));
    CHECK_OK(sc_buffer_from_dlpack(leaky, t, &(sc_dlpack_import_desc){.label = "leaked import"},
                                   &imp));
    log_text[0] = '\0';
    sc_set_log_callback(capture_log, NULL);
    CHECK_FAIL(sc_context_destroy(leaky), SC_ERR_LEAKED, "sc_context_destroy");
    sc_set_log_callback(NULL, NULL);
    CHECK(strstr(log_text, "leaked import") != NULL);
    char diff[256];
    if (fake_counts_diff(before, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "after the round trip's leak the fake still holds: %s\n", diff);
        test_failures++;
    }
    CHECK_OK(sc_context_check(ctx));
}

/* Deleters on many threads at once, racing each other and the buffer's destroy. */
enum { THREADS = 8 };
static void test_deleter_threads(void)
{
    const long device0 = fake.live_device_allocations();
    float data[64];
    sc_buffer b = filled_buffer(ctx, 64, "shared", data);
    DLManagedTensorVersioned *t[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK_OK(sc_view_to_dlpack(sc_view_of(b), &(sc_dlpack_export_desc){.read_only = true},
                                   &t[i]));
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        REQUIRE(pthread_create(&th[i], NULL, call_deleter, t[i]) == 0);
    CHECK_OK(sc_buffer_destroy(b));
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    CHECK(fake.live_device_allocations() == device0);
}

/* Deleters on several threads while the context is destroyed: every export is let go of
 * once, by its deleter or by the destroy, and all the memory goes back. */
static void test_deleters_vs_context_destroy(void)
{
    fake_counts before = fake_counts_now();
    for (int round = 0; round < 20; round++) {
        sc_context c;
        REQUIRE(sc_context_create(NULL, &c) == SC_OK);
        float data[64];
        sc_buffer a = filled_buffer(c, 64, "a", data);
        sc_buffer b = filled_buffer(c, 64, "b", data);
        DLManagedTensorVersioned *t[THREADS];
        for (int i = 0; i < THREADS; i++)
            CHECK_OK(sc_view_to_dlpack(sc_view_of(i % 2 ? a : b),
                                       &(sc_dlpack_export_desc){.read_only = true}, &t[i]));
        if (round % 2)
            CHECK_OK(sc_buffer_destroy(a));
        pthread_t th[THREADS];
        for (int i = 0; i < THREADS; i++)
            REQUIRE(pthread_create(&th[i], NULL, call_deleter, t[i]) == 0);
        log_text[0] = '\0';
        sc_set_log_callback(capture_log, NULL);
        sc_status s = sc_context_destroy(c);
        sc_set_log_callback(NULL, NULL);
        CHECK(s == SC_OK || s == SC_ERR_LEAKED);
        for (int i = 0; i < THREADS; i++)
            pthread_join(th[i], NULL);
    }
    char diff[256];
    if (fake_counts_diff(before, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "after the races the fake still holds: %s\n", diff);
        test_failures++;
    }
    CHECK_OK(sc_context_check(ctx));
}

int main(void)
{
    fake_attach();
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    const int misuse0 = fake.misuse_count();
    test_borrow();
    test_borrow_refusals();
    test_read_only();
    test_release_order();
    test_borrow_leak();
    CHECK_OK(sc_context_check(ctx));
    test_dtypes();
    test_import();
    test_export();
    test_export_sync();
    test_export_outlives_buffer();
    test_export_outlives_context();
    test_round_trip();
    test_deleter_threads();
    test_deleters_vs_context_destroy();
    CHECK_OK(sc_context_destroy(ctx));
    CHECK(fake.misuse_count() == misuse0);
    if (fake.misuse_count() != misuse0)
        fprintf(stderr, "last misuse: %s\n", fake.last_misuse());
    CHECK(fake.live_device_allocations() == 0);
    return test_result("test_td_interop");
}
