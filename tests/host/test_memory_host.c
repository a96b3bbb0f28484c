/* Memory and stream API without a GPU: element types, views, and the argument checks
 * that come before the driver is needed (NULL pointers, null, foreign and never-issued
 * handles). Runs with or without a driver: nothing here touches a device. */
#include "../test.h"
#include "core/registry.h"

/* A syntactically valid id of another kind (slot 0, generation 1). */
static uint64_t forged(sci_kind kind, uint32_t slot)
{
    return ((uint64_t)kind << 56) | (1ull << 24) | slot;
}

static void test_dtypes(void)
{
    static const struct {
        sc_dtype dtype;
        size_t size;
        const char *name;
    } table[] = {
        {SC_U8, 1, "u8"},   {SC_I8, 1, "i8"},     {SC_U16, 2, "u16"}, {SC_I16, 2, "i16"},
        {SC_U32, 4, "u32"}, {SC_I32, 4, "i32"},   {SC_U64, 8, "u64"}, {SC_I64, 8, "i64"},
        {SC_F16, 2, "f16"}, {SC_BF16, 2, "bf16"}, {SC_F32, 4, "f32"}, {SC_F64, 8, "f64"},
        {SC_F8E4M3, 1, "f8e4m3"}, {SC_F8E5M2, 1, "f8e5m2"},
    };
    size_t n = sizeof table / sizeof table[0];
    CHECK(n == (size_t)SC_DTYPE_COUNT - 1); /* every valid dtype is in the table */
    for (size_t i = 0; i < n; i++) {
        size_t got = sc_dtype_size(table[i].dtype);
        const char *name = sc_dtype_name(table[i].dtype);
        if (got != table[i].size || !name || strcmp(name, table[i].name) != 0) {
            fprintf(stderr, "dtype %d: size %zu name %s, expected %zu %s\n",
                    (int)table[i].dtype, got, name ? name : "(null)", table[i].size,
                    table[i].name);
            CHECK(!"dtype size/name");
        }
    }
    const sc_dtype invalid[] = {SC_DTYPE_INVALID, SC_DTYPE_COUNT, (sc_dtype)(SC_DTYPE_COUNT + 1),
                                (sc_dtype)1000, (sc_dtype)-1};
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        CHECK(sc_dtype_size(invalid[i]) == 0);
        const char *name = sc_dtype_name(invalid[i]);
        CHECK(name && strcmp(name, "invalid") == 0);
    }
}

static void test_view_of(void)
{
    sc_buffer b = {forged(SCI_KIND_BUFFER, 7)};
    sc_view v = sc_view_of(b);
    CHECK(v.buffer.id == b.id);
    CHECK(v.offset == 0);
    CHECK(v.count == SC_WHOLE);
    CHECK(SC_WHOLE == UINT64_MAX);
    sc_view z = sc_view_of((sc_buffer){0});
    CHECK(z.buffer.id == 0 && z.offset == 0 && z.count == SC_WHOLE);
    CHECK(SC_DEFAULT_STREAM.id == 0);
}

/* fn and arg appear as "<fn>: argument '<arg>' is NULL". */
static void check_null_msg(const char *fn, const char *arg, int line)
{
    char want[160];
    snprintf(want, sizeof want, "%s: argument '%s' is NULL", fn, arg);
    if (!strstr(sc_last_error(), want)) {
        fprintf(stderr, "line %d: message lacks \"%s\": %s\n", line, want, sc_last_error());
        test_failures++;
    }
}
#define CHECK_NULL_ARG(expr, fn, arg)                         \
    do {                                                      \
        sc_clear_error();                                     \
        CHECK_STATUS(expr, SC_ERR_INVALID_ARGUMENT);          \
        check_null_msg(fn, arg, __LINE__);                    \
    } while (0)

/* NULL pointers are refused before anything else, so the handles may be anything. */
static void test_null_pointers(void)
{
    sc_context ctx = {0};
    sc_buffer b = {0};
    sc_host_buffer h = {0};
    sc_stream s = {0};
    sc_event e = {0};
    sc_view v = sc_view_of(b);
    sc_buffer_desc bd = {.dtype = SC_F32, .count = 16, .label = "x"};
    sc_host_buffer_desc hd = {.bytes = 64};
    sc_stream_desc sd = {.label = "s"};
    sc_event_desc ed = {.label = "e"};
    uint64_t n = 0;

    CHECK_NULL_ARG(sc_buffer_create(ctx, &bd, NULL), "sc_buffer_create", "buffer");
    CHECK_NULL_ARG(sc_buffer_info(b, NULL), "sc_buffer_info", "props");
    CHECK_NULL_ARG(sc_buffer_device_ptr(b, NULL), "sc_buffer_device_ptr", "device_ptr");
    CHECK_NULL_ARG(sc_buffer_view(b, 0, 1, NULL), "sc_buffer_view", "view");
    CHECK_NULL_ARG(sc_view_sub(v, 0, 1, NULL), "sc_view_sub", "sub");

    CHECK_NULL_ARG(sc_host_buffer_create(ctx, &hd, NULL), "sc_host_buffer_create", "host");
    CHECK_NULL_ARG(sc_host_buffer_ptr(h, NULL, &n), "sc_host_buffer_ptr", "ptr");
    CHECK_NULL_ARG(sc_host_buffer_try_ptr(h, NULL, &n), "sc_host_buffer_try_ptr", "ptr");
    CHECK_NULL_ARG(sc_host_buffer_write(h, 0, NULL, 4), "sc_host_buffer_write", "src");
    CHECK_NULL_ARG(sc_host_buffer_read(h, 0, NULL, 4), "sc_host_buffer_read", "dst");

    CHECK_NULL_ARG(sc_copy_from_host(s, v, NULL, 4), "sc_copy_from_host", "src");
    CHECK_NULL_ARG(sc_copy_to_host(s, NULL, 4, v), "sc_copy_to_host", "dst");
    CHECK_NULL_ARG(sc_fill(s, v, NULL), "sc_fill", "value");

    CHECK_NULL_ARG(sc_stream_create(ctx, &sd, NULL), "sc_stream_create", "stream");
    CHECK_NULL_ARG(sc_context_default_stream(ctx, NULL), "sc_context_default_stream", "stream");
    CHECK_NULL_ARG(sc_stream_priority(s, NULL), "sc_stream_priority", "priority");
    CHECK_NULL_ARG(sc_event_create(ctx, &ed, NULL), "sc_event_create", "event");
    CHECK_NULL_ARG(sc_event_elapsed(e, e, NULL), "sc_event_elapsed", "ms");
    CHECK_NULL_ARG(sc_context_memory(ctx, NULL), "sc_context_memory", "stats");

    /* The existing context code names its out-pointer 'out', not 'ctx' as the header
     * does: only the function name and the shape are asserted here. */
    sc_clear_error();
    CHECK_STATUS(sc_context_create(NULL, NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_context_create: argument '");
    CHECK_MSG("' is NULL");
}

#define CHECK_STALE(expr, needle)                    \
    do {                                             \
        sc_clear_error();                            \
        CHECK_STATUS(expr, SC_ERR_STALE_HANDLE);     \
        CHECK_MSG(needle);                           \
    } while (0)

/* Zero handles: the handle lookup is the first thing that fails. */
static void test_null_handles(void)
{
    sc_buffer b = {0};
    sc_host_buffer h = {0};
    sc_event e = {0};
    sc_view v = sc_view_of(b);
    sc_buffer_props props;
    sc_view out;
    uint64_t dptr = 0;
    void *p = NULL;
    uint64_t n = 0;
    char bytes[64] = {0};
    float value = 1.0f;

    CHECK_STALE(sc_buffer_destroy(b), "null buffer handle");
    CHECK_MSG("sc_buffer_destroy");
    CHECK_STALE(sc_buffer_info(b, &props), "null buffer handle");
    CHECK_MSG("sc_buffer_info");
    CHECK_STALE(sc_buffer_device_ptr(b, &dptr), "null buffer handle");
    CHECK(dptr == 0);
    CHECK_STALE(sc_buffer_view(b, 0, 1, &out), "null buffer handle");
    CHECK_STALE(sc_view_sub(v, 0, 1, &out), "null buffer handle");
    /* Views are checked at every use: the buffer lookup decides (the stream argument
     * SC_DEFAULT_STREAM needs the buffer's context, so it can't fail first). */
    CHECK_STALE(sc_copy_from_host(SC_DEFAULT_STREAM, v, bytes, 4), "null buffer handle");
    CHECK_STALE(sc_copy_to_host(SC_DEFAULT_STREAM, bytes, 4, v), "null buffer handle");
    CHECK_STALE(sc_fill(SC_DEFAULT_STREAM, v, &value), "null buffer handle");
    CHECK_STALE(sc_copy(SC_DEFAULT_STREAM, v, v), "null buffer handle");

    CHECK_STALE(sc_host_buffer_destroy(h), "null host buffer handle");
    CHECK_MSG("sc_host_buffer_destroy");
    CHECK_STALE(sc_host_buffer_try_destroy(h), "null host buffer handle");
    CHECK_STALE(sc_host_buffer_ptr(h, &p, &n), "null host buffer handle");
    CHECK_STALE(sc_host_buffer_try_ptr(h, &p, &n), "null host buffer handle");
    CHECK_STALE(sc_host_buffer_write(h, 0, bytes, 4), "null host buffer handle");
    CHECK_STALE(sc_host_buffer_read(h, 0, bytes, 4), "null host buffer handle");

    CHECK_STALE(sc_event_destroy(e), "null event handle");
    CHECK_MSG("sc_event_destroy");
    CHECK_STALE(sc_event_record(e, SC_DEFAULT_STREAM), "null event handle");
    CHECK_STALE(sc_event_synchronize(e), "null event handle");
    CHECK_STALE(sc_event_query(e), "null event handle");

    /* SC_DEFAULT_STREAM alone names no context: these can't succeed. */
    CHECK(sc_stream_synchronize(SC_DEFAULT_STREAM) != SC_OK);
    CHECK(sc_stream_query(SC_DEFAULT_STREAM) != SC_OK);
    CHECK(sc_stream_destroy(SC_DEFAULT_STREAM) != SC_OK);

    /* A context handle that is zero. */
    sc_memory_stats st;
    CHECK_STALE(sc_context_memory((sc_context){0}, &st), "null context handle");
    CHECK_STALE(sc_context_trim((sc_context){0}), "null context handle");
    sc_stream s;
    CHECK_STALE(sc_context_default_stream((sc_context){0}, &s), "null context handle");
}

#define CHECK_KIND(expr, needle)                     \
    do {                                             \
        sc_clear_error();                            \
        CHECK_STATUS(expr, SC_ERR_WRONG_KIND);       \
        CHECK_MSG(needle);                           \
    } while (0)

static void test_wrong_kind(void)
{
    sc_buffer b_is_stream = {forged(SCI_KIND_STREAM, 0)};
    sc_buffer b_is_host = {forged(SCI_KIND_HOST_BUFFER, 3)};
    sc_host_buffer h_is_buffer = {forged(SCI_KIND_BUFFER, 0)};
    sc_event e_is_stream = {forged(SCI_KIND_STREAM, 1)};
    sc_stream s_is_event = {forged(SCI_KIND_EVENT, 2)};
    sc_context c_is_buffer = {forged(SCI_KIND_BUFFER, 5)};
    sc_buffer_props props;
    sc_view out;
    char bytes[64] = {0};
    void *p;
    uint64_t n;
    int prio;

    CHECK_KIND(sc_buffer_info(b_is_stream, &props), "is a stream handle, not a buffer");
    CHECK_MSG("sc_buffer_info");
    CHECK_KIND(sc_buffer_destroy(b_is_stream), "is a stream handle, not a buffer");
    CHECK_KIND(sc_buffer_view(b_is_host, 0, 1, &out), "is a host buffer handle, not a buffer");
    CHECK_KIND(sc_copy_to_host(SC_DEFAULT_STREAM, bytes, 4, sc_view_of(b_is_host)),
               "is a host buffer handle, not a buffer");
    CHECK_KIND(sc_host_buffer_ptr(h_is_buffer, &p, &n), "is a buffer handle, not a host buffer");
    CHECK_KIND(sc_host_buffer_destroy(h_is_buffer), "is a buffer handle, not a host buffer");
    CHECK_KIND(sc_event_query(e_is_stream), "is a stream handle");
    CHECK_KIND(sc_event_destroy(e_is_stream), "is a stream handle");
    CHECK_KIND(sc_stream_priority(s_is_event, &prio), "not a stream");
    CHECK_KIND(sc_stream_destroy(s_is_event), "is a event handle");
    CHECK_KIND(sc_stream_synchronize(s_is_event), "is a event handle");
    sc_memory_stats st;
    CHECK_KIND(sc_context_memory(c_is_buffer, &st), "is a buffer handle, not a context");
    sc_buffer nb;
    sc_buffer_desc bd = {.dtype = SC_F32, .count = 4};
    CHECK_KIND(sc_buffer_create(c_is_buffer, &bd, &nb),
               "is a buffer handle, not a context");
    sc_stream ns;
    CHECK_KIND(sc_stream_create(c_is_buffer, &(sc_stream_desc){0}, &ns), "is a buffer handle, not a context");

    /* A well-formed id of the right kind that was never issued is stale, not foreign. */
    sc_buffer never = {forged(SCI_KIND_BUFFER, 123456)};
    CHECK_STALE(sc_buffer_info(never, &props), "was never issued");
}

/* With a driver present a context could be made: only the no-driver answer is checked. */
static void test_context_without_driver(void)
{
    if (sc_init() == SC_OK) {
        printf("a CUDA driver is present: skipping the no-driver context check\n");
        return;
    }
    sc_context ctx = {12345};
    CHECK_STATUS(sc_context_create(NULL, &ctx), SC_ERR_NO_DRIVER);
    CHECK(ctx.id == 0);
}

int main(void)
{
    test_dtypes();
    test_view_of();
    test_null_pointers();
    test_null_handles();
    test_wrong_kind();
    test_context_without_driver();
    return test_result("test_memory_host");
}
