/* The library from 8 threads at once, against the test device (testdevice/testdevice.c).
 * Every part checks results, not only the absence of a crash: data round trips byte for
 * byte, statuses (a use racing with a destroy answers SC_OK or SC_ERR_STALE_HANDLE and
 * nothing else; exactly one of two racing destroys succeeds), accounting and the fake's
 * counters back to where they started, every log line delivered once. It is written for
 * ThreadSanitizer (the tsan part of scripts/ci-sanitizers) as much as for the plain run:
 *
 *   init       sc_init, sc_device_count, sc_device_info, sc_compiler_version... from every
 *              thread at once, before anything else loaded the driver;
 *   first use  a fresh context's pool and default stream created by racing threads;
 *              sc_context_trim asking for the pool while the first allocation creates it;
 *   log        the log callback switched 200 times, its old data freed each time, while
 *              three threads log (a callback still running on freed data would show);
 *   hammer     buffers, views, copies, fills, host buffers, streams and events, one shared
 *              buffer written on 8 streams (the automatic ordering), launches, modules and
 *              kernels, buffers used by a neighbour while their owner destroys them, one
 *              buffer destroyed by two threads at once, live-object and memory queries while
 *              others allocate, the log callback switched while others log;
 *   internal   buffers marked internal while other threads list the live objects;
 *   programs   NVRTC programs compiled and read from the disk cache by several threads;
 *              modules loaded from them and read by another thread the moment they are
 *              published, or listed while others load; programs destroyed while their
 *              context is destroyed (skipped without NVRTC);
 *   destroy    a context destroyed while other threads use its objects and create and
 *              destroy objects of their own;
 *   loss       a sticky error injected while 8 threads work: every thread sees the context
 *              lost, every destroy still works.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../test.h"
#include "core/registry.h"
#include "driver/driver.h"
#include "td_control.h"
#include "td_ptx.h"
#include "memory/buffer.h"

#define THREADS 8
#define SLICE 1024        /* u32 elements of the shared buffer per thread */
#define ITERATIONS 24     /* hammer rounds per thread */

/* ---- checks that may run on any thread ---------------------------------------------------- */

static atomic_int thread_failures;

static void failed(int line, const char *what)
{
    fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__, line, what,
            sc_last_error());
    atomic_fetch_add(&thread_failures, 1);
}

static sc_status status_is(sc_status got, sc_status want, const char *expr, int line)
{
    if (got != want) {
        char what[512];
        snprintf(what, sizeof what, "%s returned %s, expected %s", expr, sc_status_name(got),
                 sc_status_name(want));
        failed(line, what);
    }
    return got;
}

static sc_status status_in(sc_status got, sc_status a, sc_status b, const char *expr, int line)
{
    if (got != a && got != b) {
        char what[512];
        snprintf(what, sizeof what, "%s returned %s, expected %s or %s", expr,
                 sc_status_name(got), sc_status_name(a), sc_status_name(b));
        failed(line, what);
    }
    return got;
}

#define T_CHECK(cond) ((cond) ? (void)0 : failed(__LINE__, #cond))
#define T_STATUS(expr, want) status_is((expr), (want), #expr, __LINE__)
#define T_OK(expr) T_STATUS(expr, SC_OK)
#define T_EITHER(expr, a, b) status_in((expr), (a), (b), #expr, __LINE__)
#define T_MSG(needle) T_CHECK(strstr(sc_last_error(), (needle)) != NULL)

/* Run fn on n threads (argument: the thread's index); they start together at start_line. */
static pthread_barrier_t start_line;

static void run_threads(void *(*fn)(void *), int n)
{
    pthread_t t[THREADS];
    REQUIRE(n <= THREADS);
    REQUIRE(pthread_barrier_init(&start_line, NULL, (unsigned)n) == 0);
    for (int i = 0; i < n; i++)
        REQUIRE(pthread_create(&t[i], NULL, fn, (void *)(intptr_t)i) == 0);
    for (int i = 0; i < n; i++)
        REQUIRE(pthread_join(t[i], NULL) == 0);
    pthread_barrier_destroy(&start_line);
}

static int index_of(void *arg)
{
    pthread_barrier_wait(&start_line);
    return (int)(intptr_t)arg;
}

/* The rounds of a part that repeats a race until it is likely to have happened. Under
 * valgrind (which preloads its vgpreload libraries) threads run one at a time and slowly:
 * a few rounds check what valgrind checks (memory), the races are for the other runs. */
static int rounds(int n)
{
    const char *preload = getenv("LD_PRELOAD");
    return preload && strstr(preload, "vgpreload") ? (n + 15) / 16 : n;
}

/* ---- init: the driver and NVRTC loaded by racing threads ------------------------------------ */

static sc_status compiler_status[THREADS];
static int compiler_major[THREADS];

static void *init_worker(void *arg)
{
    int t = index_of(arg);
    int n = -1, version = 0;
    sc_device_props p;
    /* Each thread's first call is a different entry point into the loader. */
    switch (t % 4) {
    case 0: T_OK(sc_init()); break;
    case 1: T_OK(sc_device_count(&n)); break;
    case 2: T_OK(sc_driver_version(&version)); break;
    default: T_OK(sc_device_info(0, &p)); break;
    }
    T_OK(sc_init());
    T_OK(sc_device_count(&n));
    T_CHECK(n == 1);
    T_OK(sc_driver_version(&version));
    T_CHECK(version == 13000);
    char path[1024];
    T_OK(sc_driver_path(path, sizeof path));
    T_CHECK(strstr(path, "libsafecuda_testdevice") != NULL);
    T_OK(sc_device_info(0, &p));
    T_CHECK(strstr(p.name, "safecuda test device") != NULL);
    T_CHECK(p.cc_major == 9 && p.cc_minor == 0 && p.sm_count == 132);
    uint64_t free_b = 0, total_b = 0;
    T_OK(sc_device_memory(0, &free_b, &total_b));
    T_CHECK(total_b == p.total_memory && free_b <= total_b);
    int major = 0, minor = 0;
    compiler_status[t] = sc_compiler_version(&major, &minor);
    compiler_major[t] = major;
    return NULL;
}

static bool have_nvrtc;

static void test_init(void)
{
    run_threads(init_worker, THREADS);
    for (int t = 1; t < THREADS; t++) {
        CHECK(compiler_status[t] == compiler_status[0]);
        CHECK(compiler_major[t] == compiler_major[0]);
    }
    have_nvrtc = compiler_status[0] == SC_OK;
    if (!have_nvrtc)
        printf("NVRTC not found (%s): the programs part is skipped\n",
               sc_status_name(compiler_status[0]));
}

/* ---- first use: a fresh context's pool and default stream --------------------------------- */

static sc_context fresh;
static uint64_t fresh_default[THREADS];

static void *first_use_worker(void *arg)
{
    int t = index_of(arg);
    sc_buffer b = {0};
    sc_stream d = {0};
    sc_memory_stats m;
    /* Half the threads allocate first (creating the pool and the default stream), the
     * others ask for the default stream, trim or query memory first. */
    if (t % 2 == 0)
        T_OK(sc_buffer_create(fresh, &(sc_buffer_desc){.dtype = SC_U8, .count = 256 + t}, &b));
    switch (t % 4) {
    case 0: case 2: T_OK(sc_context_default_stream(fresh, &d)); break;
    case 1: T_OK(sc_context_trim(fresh)); break;
    default: T_OK(sc_context_memory(fresh, &m)); break;
    }
    if (t % 2 == 1)
        T_OK(sc_buffer_create(fresh, &(sc_buffer_desc){.dtype = SC_U8, .count = 256 + t}, &b));
    if (!d.id)
        T_OK(sc_context_default_stream(fresh, &d));
    fresh_default[t] = d.id;
    uint8_t v = (uint8_t)t, back[256 + THREADS];
    T_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), &v));
    T_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, 256 + (uint64_t)t, sc_view_of(b)));
    for (int i = 0; i < 256 + t; i++)
        T_CHECK(back[i] == v);
    pthread_barrier_wait(&start_line); /* all buffers alive at once */
    T_OK(sc_context_memory(fresh, &m));
    T_CHECK(m.live_buffers == THREADS);
    pthread_barrier_wait(&start_line);
    T_OK(sc_buffer_destroy(b));
    return NULL;
}

/* sc_context_trim asks for the context's pool while another thread creates it (the first
 * allocation): the two meet only inside the library. */
static atomic_int allocated;

static void *trim_until_allocated(void *arg)
{
    (void)index_of(arg);
    int trims = 0;
    while (!atomic_load_explicit(&allocated, memory_order_relaxed) || trims == 0) {
        T_OK(sc_context_trim(fresh));
        trims++;
    }
    return NULL;
}

static void *allocate_first(void *arg)
{
    (void)index_of(arg);
    sc_buffer b;
    T_OK(sc_buffer_create(fresh, &(sc_buffer_desc){.dtype = SC_F32, .count = 64}, &b));
    atomic_store_explicit(&allocated, 1, memory_order_relaxed);
    T_OK(sc_buffer_destroy(b));
    return NULL;
}

static void *trim_or_allocate(void *arg)
{
    return (intptr_t)arg == 0 ? allocate_first(arg) : trim_until_allocated(arg);
}

static void test_first_use(void)
{
    long pools0 = fake.live_pools(), streams0 = fake.live_streams();
    for (int round = 0; round < rounds(6); round++) {
        REQUIRE(sc_context_create(NULL, &fresh) == SC_OK);
        run_threads(first_use_worker, THREADS);
        /* One pool and one default stream, whoever came first. */
        CHECK(fake.live_pools() == pools0 + 1);
        CHECK(fake.live_streams() == streams0 + 1);
        for (int t = 1; t < THREADS; t++)
            CHECK(fresh_default[t] == fresh_default[0] && fresh_default[t] != 0);
        sc_memory_stats m;
        CHECK_OK(sc_context_memory(fresh, &m));
        CHECK(m.live_buffers == 0 && m.bytes_in_use == 0);
        CHECK(m.peak_bytes >= THREADS * 256);
        CHECK_OK(sc_context_destroy(fresh));
        CHECK(fake.live_pools() == pools0 && fake.live_streams() == streams0);
    }

    for (int round = 0; round < rounds(128); round++) {
        REQUIRE(sc_context_create(NULL, &fresh) == SC_OK);
        sc_stream d; /* the default stream first: the allocation then goes straight to the pool */
        CHECK_OK(sc_context_default_stream(fresh, &d));
        atomic_store(&allocated, 0);
        run_threads(trim_or_allocate, 2);
        CHECK(fake.live_pools() == pools0 + 1);
        CHECK_OK(sc_context_destroy(fresh));
    }
}

/* ---- the log: a callback switched, and its data freed, while other threads log ------------- */

#define SINK_MAGIC 0x5151deadu

typedef struct sink {
    unsigned magic;
    atomic_long lines;
} sink;

static atomic_long lines_logged;    /* what the threads asked to be logged */
static atomic_long lines_delivered; /* what the sinks received, added up as they are retired */

static void to_sink(sc_log_level level, const char *message, void *user)
{
    sink *s = user;
    T_CHECK(s->magic == SINK_MAGIC);
    T_CHECK(level == SC_LOG_WARN && message[0] != '\0');
    atomic_fetch_add_explicit(&s->lines, 1, memory_order_relaxed);
}

static sink *sink_new(void)
{
    sink *s = malloc(sizeof *s);
    REQUIRE(s != NULL);
    s->magic = SINK_MAGIC;
    atomic_init(&s->lines, 0);
    return s;
}

/* Route the log to a new sink and retire the old one: once sc_set_log_callback has
 * returned, no thread may still be writing into it. */
static sink *sink_switch(sink *old, sc_log_fn fn)
{
    sink *s = sink_new();
    sc_set_log_callback(fn, s);
    if (old) {
        atomic_fetch_add(&lines_delivered, atomic_load_explicit(&old->lines, memory_order_relaxed));
        old->magic = 0;
        free(old);
    }
    return s;
}

/* A callback that takes its time (one that writes to a file would), so that calls of it are
 * still running when another thread switches to the next sink. */
static void to_slow_sink(sc_log_level level, const char *message, void *user)
{
    sched_yield();
    to_sink(level, message, user);
}

static sc_context log_ctx;
static atomic_int switched;
static sink *first_sink; /* set before the threads start, so no line goes to stderr */

/* Thread 0 switches the callback to a new sink 200 times, freeing the old one each time, and
 * at least until the others have written 100 live-object reports (a heading and one line per
 * object) meanwhile. */
static void *log_worker(void *arg)
{
    int t = index_of(arg);
    if (t == 0) {
        sink *s = first_sink;
        for (int i = 0; i < 200 ||
                        atomic_load_explicit(&lines_logged, memory_order_relaxed) < 300;
             i++) {
            s = sink_switch(s, to_slow_sink);
            sched_yield();
        }
        atomic_store_explicit(&switched, 1, memory_order_relaxed);
        pthread_barrier_wait(&start_line); /* the loggers have stopped */
        sc_set_log_callback(NULL, NULL);
        atomic_fetch_add(&lines_delivered, atomic_load(&s->lines));
        free(s);
        return NULL;
    }
    while (!atomic_load_explicit(&switched, memory_order_relaxed)) {
        size_t n = 0;
        T_OK(sc_context_live_report(log_ctx, &n));
        T_CHECK(n == 2);
        atomic_fetch_add(&lines_logged, (long)n + 1);
    }
    pthread_barrier_wait(&start_line);
    return NULL;
}

static void test_log_switch(void)
{
    REQUIRE(sc_context_create(NULL, &log_ctx) == SC_OK);
    sc_buffer b; /* the two objects the report lists */
    sc_stream st;
    REQUIRE(sc_buffer_create(log_ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 1}, &b) ==
            SC_OK);
    REQUIRE(sc_stream_create(log_ctx, NULL, &st) == SC_OK);
    atomic_store(&lines_logged, 0);
    atomic_store(&lines_delivered, 0);
    atomic_store(&switched, 0);
    first_sink = sink_switch(NULL, to_slow_sink);
    run_threads(log_worker, 4);
    CHECK(atomic_load(&lines_logged) > 0);
    CHECK(atomic_load(&lines_delivered) == atomic_load(&lines_logged));
    if (atomic_load(&lines_delivered) != atomic_load(&lines_logged))
        fprintf(stderr, "log lines: %ld written, %ld delivered\n", atomic_load(&lines_logged),
                atomic_load(&lines_delivered));
    CHECK_OK(sc_stream_destroy(st));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_context_destroy(log_ctx));
    atomic_store(&lines_logged, 0);
    atomic_store(&lines_delivered, 0);
}

/* ---- hammer: one context, 8 threads -------------------------------------------------------- */

static sc_context ctx;
static sc_buffer shared;       /* THREADS slices of SLICE u32, slice t written by thread t */
static sc_host_buffer pinned;  /* THREADS slices of SLICE u32 */
static sc_module shared_module;
static sc_kernel shared_add;
static _Atomic uint64_t victims[THREADS]; /* each thread's last buffer, read by another */
static _Atomic uint64_t doomed[THREADS];  /* a buffer its owner and a neighbour both destroy */
static atomic_long doomed_created, doomed_destroyed, stale_seen;
static sink *current_sink;

/* Every user object of ctx was made here, with one of these labels (the kernels' are their
 * names, the modules' empty). */
static bool known_object(const sc_object_info *o)
{
    static const char *const labels[] = {"shared", "pinned", "mine", "doomed", "worker",
                                         "mine-pinned", "add", "tiled", "", "t0", "t1"};
    if (!o->kind || !o->file || strcmp(o->file, "test_td_threads.c") != 0 || o->line <= 0)
        return false;
    for (size_t i = 0; i < sizeof labels / sizeof labels[0]; i++)
        if (strcmp(o->label, labels[i]) == 0)
            return true;
    return false;
}

static void query_live(void)
{
    sc_object_info info[16];
    size_t n = 0;
    T_OK(sc_context_live_objects(ctx, info, 16, &n));
    T_CHECK(n >= 4); /* shared, pinned, the shared module and its kernel */
    for (size_t i = 0; i < n && i < 16; i++)
        if (!known_object(&info[i])) {
            char what[256];
            snprintf(what, sizeof what, "unexpected live object: %s '%s' at %s:%d",
                     info[i].kind ? info[i].kind : "?", info[i].label,
                     info[i].file ? info[i].file : "?", info[i].line);
            failed(__LINE__, what);
        }
    sc_memory_stats m;
    T_OK(sc_context_memory(ctx, &m));
    T_CHECK(m.live_buffers >= 1 && m.bytes_in_use >= THREADS * SLICE * 4);
    T_CHECK(m.peak_bytes >= m.bytes_in_use);
    T_CHECK(m.pinned_bytes >= THREADS * SLICE * 4);
    size_t reported = 0;
    T_OK(sc_context_live_report(ctx, &reported));
    T_CHECK(reported >= 4);
    /* One heading line, then one line per object. */
    atomic_fetch_add(&lines_logged, (long)reported + 1);
}

/* Use another thread's buffer, which its owner may be destroying: each call either works or
 * finds the handle stale. Only reads: the owner's data checks stay valid. */
static void use_victim(int t, sc_stream s, sc_buffer mine)
{
    sc_buffer v = {atomic_load(&victims[(t + 1) % THREADS])};
    if (!v.id)
        return;
    uint32_t tmp[SLICE];
    long stale = 0;
    stale += T_EITHER(sc_copy_to_host(s, tmp, sizeof tmp, sc_view_of(v)), SC_OK,
                      SC_ERR_STALE_HANDLE) != SC_OK;
    sc_buffer_props p;
    if (T_EITHER(sc_buffer_info(v, &p), SC_OK, SC_ERR_STALE_HANDLE) == SC_OK)
        T_CHECK(p.count == SLICE && p.dtype == SC_U32 && strcmp(p.label, "mine") == 0 &&
                p.context.id == ctx.id);
    else
        stale++;
    sc_view view;
    stale += T_EITHER(sc_buffer_view(v, 10, 20, &view), SC_OK, SC_ERR_STALE_HANDLE) != SC_OK;
    sc_launch_desc cfg = {.grid = {SLICE / 256, 1, 1}, .block = {256, 1, 1}};
    stale += T_EITHER(SC_LAUNCH(s, shared_add, &cfg, sc_arg_in(sc_view_of(v)),
                                sc_arg_out(sc_view_of(mine)), sc_arg_u32(SLICE)),
                      SC_OK, SC_ERR_STALE_HANDLE) != SC_OK;
    stale += T_EITHER(sc_copy(s, sc_view_of(mine), sc_view_of(v)), SC_OK,
                      SC_ERR_STALE_HANDLE) != SC_OK;
    atomic_fetch_add(&stale_seen, stale);
}

/* A buffer destroyed by its owner and, maybe at the same moment, by a neighbour: exactly one
 * of the destroys succeeds. */
static void destroy_doomed(int t)
{
    sc_buffer d;
    if (T_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 16 + t,
                                                     .label = "doomed"},
                              &d)) != SC_OK)
        return;
    atomic_fetch_add(&doomed_created, 1);
    atomic_store(&doomed[t], d.id);
    sc_buffer other = {atomic_load(&doomed[(t + THREADS - 1) % THREADS])};
    if (other.id &&
        T_EITHER(sc_buffer_destroy(other), SC_OK, SC_ERR_STALE_HANDLE) == SC_OK)
        atomic_fetch_add(&doomed_destroyed, 1);
    sc_status s = T_EITHER(sc_buffer_destroy(d), SC_OK, SC_ERR_STALE_HANDLE);
    if (s == SC_OK)
        atomic_fetch_add(&doomed_destroyed, 1);
    else
        T_MSG("sc_buffer_destroy: stale buffer handle");
}

/* Modules and kernels: a module of its own, a kernel of the shared module, launches. */
static void modules_and_kernels(int t, sc_stream s, sc_buffer mine, sc_view slice)
{
    sc_module m;
    if (T_OK(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m)) != SC_OK)
        return;
    sc_kernel add, tiled;
    T_OK(sc_kernel_get(m, "add", &add));
    T_OK(sc_kernel_get(shared_module, "tiled", &tiled)); /* lives until the module goes */
    sc_kernel_props kp;
    T_OK(sc_kernel_info(tiled, &kp));
    T_CHECK(kp.max_threads_per_block == 256 && kp.static_shared_bytes == 1024 &&
            kp.n_params == 0);
    T_OK(sc_kernel_set_max_dynamic_shared(tiled, 1024 * t));
    T_OK(sc_kernel_info(tiled, &kp));
    T_CHECK(kp.max_dynamic_shared_bytes == 1024 * t);
    sc_launch_desc cfg = {.grid = {4, 1, 1}, .block = {256, 1, 1}};
    T_OK(SC_LAUNCH(s, add, &cfg, sc_arg_in(sc_view_of(mine)), sc_arg_out(slice),
                   sc_arg_u32(SLICE)));
    T_STATUS(SC_LAUNCH(s, add, &cfg, sc_arg_in(sc_view_of(mine)), sc_arg_out(slice)),
             SC_ERR_LAUNCH);
    T_OK(SC_LAUNCH(SC_DEFAULT_STREAM, tiled, &cfg));
    T_OK(sc_module_destroy(m));
    T_STATUS(SC_LAUNCH(s, add, &cfg, sc_arg_in(sc_view_of(mine)), sc_arg_out(slice),
                       sc_arg_u32(SLICE)),
             SC_ERR_STALE_HANDLE);
}

/* Timing events on the thread's stream, a wait of the default stream on one of them. */
static void events(sc_stream s, sc_buffer mine)
{
    sc_event e0, e1;
    T_OK(sc_event_create(ctx, &(sc_event_desc){.timing = true, .label = "t0"}, &e0));
    T_OK(sc_event_create(ctx, &(sc_event_desc){.timing = true, .label = "t1"}, &e1));
    T_OK(sc_event_record(e0, s));
    uint32_t v = 7;
    T_OK(sc_fill(s, sc_view_of(mine), &v));
    T_OK(sc_event_record(e1, s));
    T_OK(sc_stream_wait(SC_DEFAULT_STREAM, e1));
    T_OK(sc_event_synchronize(e1));
    T_OK(sc_event_query(e1));
    float ms = -1;
    T_OK(sc_event_elapsed(e0, e1, &ms));
    T_CHECK(ms >= 0);
    T_OK(sc_event_destroy(e0));
    T_OK(sc_event_destroy(e1));
    T_STATUS(sc_event_query(e0), SC_ERR_STALE_HANDLE);
}

static void *hammer(void *arg)
{
    int t = index_of(arg);
    uint32_t data[SLICE], back[SLICE];
    const uint64_t at = (uint64_t)t * SLICE, at_bytes = at * sizeof(uint32_t);
    sc_view slice;
    T_OK(sc_buffer_view(shared, at, SLICE, &slice));

    for (int i = 0; i < ITERATIONS; i++) {
        sc_stream s;
        if (T_OK(sc_stream_create(ctx, &(sc_stream_desc){.priority = -(t % 3), .label = "worker"},
                                  &s)) != SC_OK)
            continue;
        int priority = 1;
        T_OK(sc_stream_priority(s, &priority));
        T_CHECK(priority == -(t % 3));
        for (int j = 0; j < SLICE; j++)
            data[j] = (uint32_t)t << 24 | (uint32_t)i << 12 | (uint32_t)j;

        /* A buffer of its own, zeroed on its stream, read back on it. */
        sc_buffer b;
        if (T_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = SLICE,
                                                         .stream = s, .zero = true,
                                                         .label = "mine"},
                                  &b)) != SC_OK) {
            T_OK(sc_stream_destroy(s));
            continue;
        }
        memset(back, 0xff, sizeof back);
        T_OK(sc_copy_to_host(s, back, sizeof back, sc_view_of(b)));
        for (int j = 0; j < SLICE; j++)
            T_CHECK(back[j] == 0);
        atomic_store(&victims[t], b.id); /* a neighbour uses it, alive or not */

        /* A fill on its stream, read on the default stream. */
        uint32_t v = data[0];
        T_OK(sc_fill(s, sc_view_of(b), &v));
        T_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, sc_view_of(b)));
        for (int j = 0; j < SLICE; j++)
            T_CHECK(back[j] == v);

        /* Its data into its slice of the shared buffer (written on 8 streams), back through
         * the default stream. */
        T_OK(sc_copy_from_host(s, sc_view_of(b), data, sizeof data));
        T_OK(sc_copy(s, slice, sc_view_of(b)));
        memset(back, 0, sizeof back);
        T_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, slice));
        T_CHECK(memcmp(back, data, sizeof data) == 0);
        sc_view half;
        T_OK(sc_view_sub(slice, SLICE / 2, SC_WHOLE, &half));
        T_CHECK(half.buffer.id == shared.id && half.offset == at + SLICE / 2 &&
                half.count == SLICE / 2);
        T_STATUS(sc_view_sub(slice, SLICE / 2, SLICE, &half), SC_ERR_OUT_OF_BOUNDS);
        T_OK(sc_copy_to_host(s, back, SLICE / 2 * sizeof(uint32_t), half));
        T_CHECK(memcmp(back, data + SLICE / 2, SLICE / 2 * sizeof(uint32_t)) == 0);

        /* Through its slice of the shared pinned buffer, both ways. */
        T_OK(sc_copy_to_host_buffer(s, pinned, at_bytes, sc_view_of(b)));
        memset(back, 0, sizeof back);
        T_OK(sc_host_buffer_read(pinned, at_bytes, back, sizeof back));
        T_CHECK(memcmp(back, data, sizeof data) == 0);
        for (int j = 0; j < SLICE; j++)
            data[j] = ~data[j];
        T_OK(sc_host_buffer_write(pinned, at_bytes, data, sizeof data));
        T_OK(sc_copy_from_host_buffer(SC_DEFAULT_STREAM, sc_view_of(b), pinned, at_bytes));
        T_OK(sc_copy_to_host(s, back, sizeof back, sc_view_of(b)));
        T_CHECK(memcmp(back, data, sizeof data) == 0);

        /* A pinned buffer of its own. */
        sc_host_buffer h;
        if (T_OK(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = sizeof data,
                                                                   .label = "mine-pinned"},
                                       &h)) == SC_OK) {
            T_OK(sc_copy_to_host_buffer(s, h, 0, sc_view_of(b)));
            void *p = NULL;
            uint64_t bytes = 0;
            T_OK(sc_host_buffer_ptr(h, &p, &bytes));
            T_CHECK(p != NULL && bytes == sizeof data && memcmp(p, data, sizeof data) == 0);
            T_EITHER(sc_host_buffer_try_destroy(h), SC_OK, SC_ERR_BUSY);
            T_EITHER(sc_host_buffer_destroy(h), SC_OK, SC_ERR_STALE_HANDLE);
        }

        /* Launches: its buffer into its slice; the whole shared buffer read on its stream
         * (ordered after the other threads' writes on theirs). */
        sc_launch_desc cfg = {.grid = {SLICE / 256, 1, 1}, .block = {256, 1, 1}};
        T_OK(SC_LAUNCH(s, shared_add, &cfg, sc_arg_in(sc_view_of(b)), sc_arg_out(slice),
                       sc_arg_u32(SLICE)));
        T_OK(SC_LAUNCH(s, shared_add, &cfg, sc_arg_in(sc_view_of(shared)),
                       sc_arg_out(sc_view_of(b)), sc_arg_u32(SLICE)));
        T_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, slice));
        for (int j = 0; j < SLICE; j++) /* the fake runs no kernel: still the data */
            T_CHECK(back[j] == ~data[j]);

        events(s, b);
        if (i % 4 == t % 4)
            modules_and_kernels(t, s, b, slice);
        if (i % 3 == t % 3)
            query_live();
        if (t == 0)
            current_sink = sink_switch(current_sink, to_sink);

        /* A neighbour's buffer, maybe being destroyed. */
        use_victim(t, s, b);
        destroy_doomed(t);
        if (i % 2)
            sched_yield();
        T_OK(sc_buffer_destroy(b)); /* its handle stays in victims[t] until the next one */
        T_STATUS(sc_copy_to_host(s, back, sizeof back, sc_view_of(b)), SC_ERR_STALE_HANDLE);
        T_MSG("sc_copy_to_host: stale buffer handle");
        /* Other threads' uses of the shared buffer may be recorded on this stream: they
         * stay ordered after it is gone. */
        T_OK(sc_stream_destroy(s));
    }
    return NULL;
}

static void test_hammer(void)
{
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = THREADS * SLICE,
                                                    .zero = true, .label = "shared"},
                             &shared) == SC_OK);
    REQUIRE(sc_host_buffer_create(ctx, &(sc_host_buffer_desc){.bytes = THREADS * SLICE * 4,
                                                              .label = "pinned"},
                                  &pinned) == SC_OK);
    REQUIRE(sc_module_load_image(ctx, fake_test_ptx, sizeof fake_test_ptx - 1,
                                 &shared_module) == SC_OK);
    REQUIRE(sc_kernel_get(shared_module, "add", &shared_add) == SC_OK);
    current_sink = sink_switch(NULL, to_sink);

    run_threads(hammer, THREADS);

    sc_set_log_callback(NULL, NULL);
    atomic_fetch_add(&lines_delivered, atomic_load(&current_sink->lines));
    free(current_sink);
    current_sink = NULL;
    CHECK(atomic_load(&lines_logged) > 0);
    CHECK(atomic_load(&lines_delivered) == atomic_load(&lines_logged));
    if (atomic_load(&lines_delivered) != atomic_load(&lines_logged))
        fprintf(stderr, "log lines: %ld asked, %ld delivered\n", atomic_load(&lines_logged),
                atomic_load(&lines_delivered));
    CHECK(atomic_load(&doomed_created) == THREADS * ITERATIONS);
    CHECK(atomic_load(&doomed_destroyed) == atomic_load(&doomed_created));
    printf("hammer: %d threads x %d rounds; %ld stale uses, %ld log lines, %ld doomed buffers\n",
           THREADS, ITERATIONS, atomic_load(&stale_seen), atomic_load(&lines_logged),
           atomic_load(&doomed_destroyed));

    /* Every thread wrote its last data into its slice: all of it is there. */
    uint32_t *all = malloc(THREADS * SLICE * sizeof *all);
    REQUIRE(all != NULL);
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, all, THREADS * SLICE * sizeof *all,
                             sc_view_of(shared)));
    for (int t = 0; t < THREADS; t++)
        CHECK(all[t * SLICE + 5] == ((uint32_t)t << 24 | (uint32_t)(ITERATIONS - 1) << 12 | 5u));
    free(all);

    CHECK_OK(sc_module_destroy(shared_module));
    CHECK_OK(sc_host_buffer_destroy(pinned));
    CHECK_OK(sc_buffer_destroy(shared));
    sc_memory_stats m;
    CHECK_OK(sc_context_memory(ctx, &m));
    CHECK(m.bytes_in_use == 0 && m.live_buffers == 0 && m.pinned_bytes == 0);
    size_t live = 99;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
}

/* ---- internal buffers marked while other threads list the live objects ------------------ */

/* The library marks its own buffers (the MoE layer's workspaces) internal after creating
 * them; sc_context_live_objects reads the mark on other threads. */
static sc_context marks_ctx;
static atomic_int markers_done;

static void *marks_worker(void *arg)
{
    int t = index_of(arg);
    if (t % 2 == 0) {
        for (int i = 0; i < 1000; i++) {
            sc_buffer b;
            if (T_OK(sc_buffer_create(marks_ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 8},
                                      &b)) != SC_OK)
                continue;
            sci_buffer_set_internal(b);
            T_OK(sc_buffer_destroy(b));
        }
        atomic_fetch_add_explicit(&markers_done, 1, memory_order_relaxed);
        return NULL;
    }
    while (atomic_load_explicit(&markers_done, memory_order_relaxed) < 2) {
        size_t n = 99;
        T_OK(sc_context_live_objects(marks_ctx, NULL, 0, &n));
        T_CHECK(n <= 2); /* at most the markers' buffers not marked yet */
    }
    return NULL;
}

static void test_internal_marks(void)
{
    REQUIRE(sc_context_create(NULL, &marks_ctx) == SC_OK);
    atomic_store(&markers_done, 0);
    run_threads(marks_worker, 4);
    size_t n = 99;
    CHECK_OK(sc_context_live_objects(marks_ctx, NULL, 0, &n));
    CHECK(n == 0);
    CHECK_OK(sc_context_destroy(marks_ctx));
}

/* ---- programs: NVRTC and the disk cache from several threads -------------------------------- */

static const char program_src[] =
    "template <typename T> __global__ void scale(T *x, T k, unsigned long long n)\n"
    "{\n"
    "    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] *= k;\n"
    "}\n";
static const char *const program_names[] = {"scale<unsigned int>", NULL};
static const sc_program_desc program_desc = {.source = program_src, .name = "scale.cu",
                                             .ptx = true, .name_expressions = program_names};
static sc_context prog_ctx;
static bool from_cache[THREADS];

static void *program_worker(void *arg)
{
    int t = index_of(arg);
    sc_program p = {0};
    /* Two threads compile at once, both missing the cache and both storing the entry. */
    if (t < 2)
        T_OK(sc_program_create(prog_ctx, &program_desc, &p));
    pthread_barrier_wait(&start_line);
    if (t >= 2)
        T_OK(sc_program_create(prog_ctx, &program_desc, &p));
    sc_program_props pp;
    if (T_OK(sc_program_info(p, &pp)) == SC_OK) {
        T_CHECK(pp.is_ptx && pp.arch == 90 && pp.image_bytes > 0);
        from_cache[t] = pp.from_cache;
    }
    sc_buffer u, f;
    T_OK(sc_buffer_create(prog_ctx, &(sc_buffer_desc){.dtype = SC_U32, .count = 256}, &u));
    T_OK(sc_buffer_create(prog_ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 256}, &f));
    for (int i = 0; i < 6; i++) {
        sc_module m;
        if (T_OK(sc_module_load(prog_ctx, p, &m)) != SC_OK)
            break;
        sc_kernel k;
        if (T_OK(sc_kernel_get(m, "scale<unsigned int>", &k)) == SC_OK) {
            sc_kernel_props kp;
            T_OK(sc_kernel_info(k, &kp));
            T_CHECK(kp.typed && kp.n_params == 3);
            sc_launch_desc cfg = {.grid = {1, 1, 1}, .block = {256, 1, 1}};
            T_OK(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_inout(sc_view_of(u)),
                           sc_arg_u32(3), sc_arg_u64(256)));
            T_STATUS(SC_LAUNCH(SC_DEFAULT_STREAM, k, &cfg, sc_arg_inout(sc_view_of(f)),
                               sc_arg_u32(3), sc_arg_u64(256)),
                     SC_ERR_TYPE_MISMATCH);
        }
        T_OK(sc_module_destroy(m));
    }
    T_OK(sc_buffer_destroy(u));
    T_OK(sc_buffer_destroy(f));
    T_OK(sc_program_destroy(p));
    return NULL;
}

/* A module's label is its program's name: it must be in place when the module is published.
 * Thread 0 loads modules and hands each handle to thread 1 through a relaxed atomic (no
 * happens-before of its own: the library's locks must be enough); thread 1 asks the module
 * for a kernel it lacks, and the message quotes the label. */
static sc_program label_prog;
static _Atomic uint64_t handed;
static atomic_int loaders_done;
#define HANDED_END UINT64_MAX

static void *label_handoff(void *arg)
{
    int t = index_of(arg);
    if (t == 0) {
        for (int i = 0; i < 32; i++) {
            sc_module m;
            if (T_OK(sc_module_load(prog_ctx, label_prog, &m)) != SC_OK)
                break;
            atomic_store_explicit(&handed, m.id, memory_order_relaxed);
            while (atomic_load_explicit(&handed, memory_order_relaxed) != 0)
                sched_yield();
            T_OK(sc_module_destroy(m));
        }
        atomic_store_explicit(&handed, HANDED_END, memory_order_relaxed);
        return NULL;
    }
    for (;;) {
        uint64_t id;
        while ((id = atomic_load_explicit(&handed, memory_order_relaxed)) == 0)
            sched_yield();
        if (id == HANDED_END)
            break;
        sc_kernel k;
        T_STATUS(sc_kernel_get((sc_module){id}, "missing", &k), SC_ERR_INVALID_ARGUMENT);
        T_MSG("module 'scale.cu'");
        atomic_store_explicit(&handed, 0, memory_order_relaxed);
    }
    return NULL;
}

/* Two threads load and destroy modules while two list the live objects: a module is never
 * listed without its label. */
static void *label_listing(void *arg)
{
    int t = index_of(arg);
    if (t < 2) {
        for (int i = 0; i < 24; i++) {
            sc_module m;
            if (T_OK(sc_module_load(prog_ctx, label_prog, &m)) == SC_OK)
                T_OK(sc_module_destroy(m));
        }
        atomic_fetch_add_explicit(&loaders_done, 1, memory_order_relaxed);
        return NULL;
    }
    while (atomic_load_explicit(&loaders_done, memory_order_relaxed) < 2) {
        sc_object_info info[8];
        size_t n = 0;
        T_OK(sc_context_live_objects(prog_ctx, info, 8, &n));
        for (size_t k = 0; k < n && k < 8; k++)
            if (strcmp(info[k].kind, "module") == 0 && strcmp(info[k].label, "scale.cu") != 0)
                failed(__LINE__, "a module listed without its label");
    }
    return NULL;
}

/* Programs destroyed by their threads while their context is destroyed: whoever comes
 * first destroys each, and sc_context_destroy never finds one of those it listed gone. The
 * threads start once the context's leak report is out (the destroy then lists and destroys
 * the programs), newest first (the destroy goes oldest first). */
#define PROGRAMS_EACH 128
#define PROGRAM_THREADS 3 /* two destroy programs, one the context */
static sc_context progs_ctx;
static sink *progs_log;
static atomic_long progs_made;

static void *destroy_programs(void *arg)
{
    int t = index_of(arg);
    sc_program p[PROGRAMS_EACH];
    for (int i = 0; i < PROGRAMS_EACH && t < PROGRAM_THREADS - 1; i++) { /* from the cache */
        if (T_OK(sc_program_create(progs_ctx, &program_desc, &p[i])) == SC_OK)
            atomic_fetch_add(&progs_made, 1);
        else
            p[i].id = 0;
    }
    pthread_barrier_wait(&start_line);
    if (t == PROGRAM_THREADS - 1) {
        sc_status s = T_EITHER(sc_context_destroy(progs_ctx), SC_OK, SC_ERR_LEAKED);
        if (s == SC_ERR_LEAKED)
            T_MSG("now freed");
        return NULL;
    }
    /* The report: a heading and a line per program (sleeping, not spinning: the destroy
     * must get on to its listing). */
    for (long naps = 0; atomic_load(&progs_log->lines) < atomic_load(&progs_made) + 1; naps++)
        if (naps < 100000)
            nanosleep(&(struct timespec){0, 20 * 1000}, NULL);
        else {
            failed(__LINE__, "no leak report from sc_context_destroy");
            break;
        }
    for (int i = PROGRAMS_EACH; i-- > 0;)
        if (p[i].id)
            T_EITHER(sc_program_destroy(p[i]), SC_OK, SC_ERR_STALE_HANDLE);
    return NULL;
}

static void test_programs(void)
{
    if (!have_nvrtc)
        return;
    REQUIRE(sc_context_create(NULL, &prog_ctx) == SC_OK);
    run_threads(program_worker, THREADS);
    for (int t = 0; t < 2; t++)
        CHECK(!from_cache[t]);
    int cached = 0;
    for (int t = 2; t < THREADS; t++) {
        CHECK(from_cache[t]);
        cached += from_cache[t];
    }
    printf("programs: 2 compiled at once, %d read from the disk cache\n", cached);

    REQUIRE(sc_program_create(prog_ctx, &program_desc, &label_prog) == SC_OK);
    atomic_store(&handed, 0);
    run_threads(label_handoff, 2);
    atomic_store(&loaders_done, 0);
    run_threads(label_listing, 4);
    CHECK_OK(sc_program_destroy(label_prog));

    for (int round = 0; round < rounds(16); round++) {
        REQUIRE(sc_context_create(NULL, &progs_ctx) == SC_OK);
        progs_log = sink_switch(NULL, to_sink);
        atomic_store(&progs_made, 0);
        run_threads(destroy_programs, PROGRAM_THREADS);
        sc_set_log_callback(NULL, NULL);
        free(progs_log);
        CHECK(sci_registry_live_count(SCI_KIND_PROGRAM) == 0);
    }
    size_t n = 99;
    CHECK_OK(sc_context_live_objects(prog_ctx, NULL, 0, &n));
    CHECK(n == 0);
    CHECK_OK(sc_context_destroy(prog_ctx));
}

/* ---- a context destroyed while other threads use its objects and destroy their own ---- */

static sc_context doomed_ctx;
static sc_buffer dbuf[THREADS];
static sc_stream dstream[THREADS];
static sc_kernel dkernel;
static atomic_int destroyed_flag;
static atomic_long doomed_progress;
static long destroy_after; /* rounds of work done by the others before the destroy */

/* Objects of the thread's own, created and destroyed at once. The context's destroy may get
 * there first: a create answers SC_ERR_STALE_HANDLE from then on, a destroy SC_OK or
 * SC_ERR_STALE_HANDLE, never anything else (a destroy on another thread must not find the
 * context freed, or its primary context released, under it). */
static void make_and_destroy(int i)
{
    sc_event e;
    if (T_EITHER(sc_event_create(doomed_ctx, NULL, &e), SC_OK, SC_ERR_STALE_HANDLE) == SC_OK) {
        T_EITHER(sc_event_record(e, SC_DEFAULT_STREAM), SC_OK, SC_ERR_STALE_HANDLE);
        T_EITHER(sc_event_destroy(e), SC_OK, SC_ERR_STALE_HANDLE);
    }
    sc_buffer b;
    uint8_t v = 1;
    if (T_EITHER(sc_buffer_create(doomed_ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 64}, &b),
                 SC_OK, SC_ERR_STALE_HANDLE) == SC_OK) {
        T_EITHER(sc_fill(SC_DEFAULT_STREAM, sc_view_of(b), &v), SC_OK, SC_ERR_STALE_HANDLE);
        T_EITHER(sc_buffer_destroy(b), SC_OK, SC_ERR_STALE_HANDLE);
    }
    sc_stream s;
    if (T_EITHER(sc_stream_create(doomed_ctx, NULL, &s), SC_OK, SC_ERR_STALE_HANDLE) == SC_OK)
        T_EITHER(sc_stream_destroy(s), SC_OK, SC_ERR_STALE_HANDLE);
    sc_host_buffer h;
    if (T_EITHER(sc_host_buffer_create(doomed_ctx, &(sc_host_buffer_desc){.bytes = 64}, &h),
                 SC_OK, SC_ERR_STALE_HANDLE) == SC_OK)
        T_EITHER(sc_host_buffer_destroy(h), SC_OK, SC_ERR_STALE_HANDLE);
    sc_module m;
    if (i % 4 == 0 &&
        T_EITHER(sc_module_load_image(doomed_ctx, fake_test_ptx, sizeof fake_test_ptx - 1, &m),
                 SC_OK, SC_ERR_STALE_HANDLE) == SC_OK)
        T_EITHER(sc_module_destroy(m), SC_OK, SC_ERR_STALE_HANDLE);
}

static void *use_while_destroyed(void *arg)
{
    int t = index_of(arg);
    if (t == THREADS - 1) {
        while (atomic_load(&doomed_progress) < destroy_after)
            sched_yield();
        sc_status s = T_EITHER(sc_context_destroy(doomed_ctx), SC_OK, SC_ERR_LEAKED);
        if (s == SC_ERR_LEAKED)
            T_MSG("now freed");
        atomic_store(&destroyed_flag, 1);
        return NULL;
    }
    uint32_t data[256], back[256];
    for (int j = 0; j < 256; j++)
        data[j] = (uint32_t)(t * 1000 + j);
    sc_launch_desc cfg = {.grid = {1, 1, 1}, .block = {256, 1, 1}};
    for (int i = 0; i < 400 && !atomic_load(&destroyed_flag); i++) {
        sc_buffer b = dbuf[t];
        sc_stream s = i % 2 ? dstream[t] : SC_DEFAULT_STREAM;
        if (T_EITHER(sc_copy_from_host(s, sc_view_of(b), data, sizeof data), SC_OK,
                     SC_ERR_STALE_HANDLE) == SC_OK &&
            T_EITHER(sc_copy_to_host(s, back, sizeof back, sc_view_of(b)), SC_OK,
                     SC_ERR_STALE_HANDLE) == SC_OK)
            T_CHECK(memcmp(back, data, sizeof data) == 0);
        T_EITHER(sc_copy(s, sc_view_of(b), sc_view_of(dbuf[(t + 1) % (THREADS - 1)])), SC_OK,
                 SC_ERR_STALE_HANDLE);
        T_EITHER(SC_LAUNCH(s, dkernel, &cfg, sc_arg_in(sc_view_of(b)),
                           sc_arg_out(sc_view_of(dbuf[(t + 2) % (THREADS - 1)])),
                           sc_arg_u32(256)),
                 SC_OK, SC_ERR_STALE_HANDLE);
        T_EITHER(sc_stream_synchronize(dstream[t]), SC_OK, SC_ERR_STALE_HANDLE);
        make_and_destroy(i);
        atomic_fetch_add(&doomed_progress, 1);
    }
    /* Afterwards every handle of the context is stale. */
    while (!atomic_load(&destroyed_flag))
        sched_yield();
    T_STATUS(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, sc_view_of(dbuf[t])),
             SC_ERR_STALE_HANDLE);
    T_STATUS(sc_stream_synchronize(dstream[t]), SC_ERR_STALE_HANDLE);
    T_STATUS(sc_buffer_destroy(dbuf[t]), SC_ERR_STALE_HANDLE);
    return NULL;
}

static void test_destroy_while_used(void)
{
    fake_counts before = fake_counts_now();
    sink *log = sink_switch(NULL, to_sink); /* the leak reports go here, not to stderr */
    for (int round = 0; round < rounds(80); round++) {
        REQUIRE(sc_context_create(NULL, &doomed_ctx) == SC_OK);
        for (int t = 0; t < THREADS - 1; t++) {
            REQUIRE(sc_buffer_create(doomed_ctx,
                                     &(sc_buffer_desc){.dtype = SC_U32, .count = 256},
                                     &dbuf[t]) == SC_OK);
            REQUIRE(sc_stream_create(doomed_ctx, NULL, &dstream[t]) == SC_OK);
        }
        sc_module m;
        REQUIRE(sc_module_load_image(doomed_ctx, fake_test_ptx, sizeof fake_test_ptx - 1,
                                     &m) == SC_OK);
        REQUIRE(sc_kernel_get(m, "add", &dkernel) == SC_OK);
        atomic_store(&destroyed_flag, 0);
        atomic_store(&doomed_progress, 0);
        destroy_after = (THREADS - 1) * (1 + round % 4); /* at various points of the work */
        run_threads(use_while_destroyed, THREADS);
        /* Everything the context held is gone, whoever destroyed it, and the driver was
         * never called on a released context. */
        char diff[512];
        if (fake_counts_diff(before, fake_counts_now(), diff, sizeof diff)) {
            fprintf(stderr, "after a context destroyed while in use the fake holds: %s\n",
                    diff);
            test_failures++;
        }
        CHECK(fake.misuse_count() == 0);
    }
    sc_set_log_callback(NULL, NULL);
    CHECK(atomic_load(&log->lines) > 0);
    free(log);
}

/* ---- a sticky error while 8 threads work ---------------------------------------------------- */

static sc_context lost_ctx;
static atomic_long lost_progress;
static atomic_int lost_seen, lost_done, lost_armed;

static void *work_until_lost(void *arg)
{
    int t = index_of(arg);
    sc_buffer b;
    sc_stream s;
    sc_status made = T_OK(sc_buffer_create(lost_ctx, &(sc_buffer_desc){.dtype = SC_U32,
                                                                       .count = 256},
                                           &b));
    if (made == SC_OK)
        made = T_OK(sc_stream_create(lost_ctx, NULL, &s));
    pthread_barrier_wait(&start_line); /* every thread set up before the error comes */
    if (made != SC_OK) {
        atomic_fetch_add(&lost_done, 1);
        return NULL;
    }
    uint32_t data[256], back[256];
    for (int j = 0; j < 256; j++)
        data[j] = (uint32_t)(t << 16 | j);
    bool lost = false;
    for (long i = 0; i < 100000 && !lost; i++) {
        /* No thread runs ahead of the fault: where threads take turns (valgrind runs one
         * at a time and need not be fair) one could otherwise finish every round before
         * the fault is armed. lose_context arms it once 4 x THREADS rounds are done,
         * which one thread alone reaches. */
        if (i == 4 * THREADS)
            while (!atomic_load(&lost_armed))
                sched_yield();
        sc_stream on = i % 2 ? s : SC_DEFAULT_STREAM;
        sc_status st = T_EITHER(sc_copy_from_host(on, sc_view_of(b), data, sizeof data), SC_OK,
                                SC_ERR_CONTEXT_LOST);
        if (st == SC_OK)
            st = T_EITHER(sc_copy_to_host(on, back, sizeof back, sc_view_of(b)), SC_OK,
                          SC_ERR_CONTEXT_LOST);
        if (st == SC_OK)
            T_CHECK(memcmp(back, data, sizeof data) == 0);
        lost = st == SC_ERR_CONTEXT_LOST;
        atomic_fetch_add(&lost_progress, 1);
    }
    T_CHECK(lost);
    if (lost) {
        atomic_fetch_add(&lost_seen, 1);
        /* The reason, whichever thread met it. */
        T_MSG("CUDA_ERROR_ILLEGAL_ADDRESS");
        T_MSG("cuMemcpyHtoDAsync");
        uint32_t v = 1;
        T_STATUS(sc_fill(s, sc_view_of(b), &v), SC_ERR_CONTEXT_LOST);
        sc_buffer more;
        T_STATUS(sc_buffer_create(lost_ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 1}, &more),
                 SC_ERR_CONTEXT_LOST);
        T_STATUS(sc_stream_synchronize(s), SC_ERR_CONTEXT_LOST);
    }
    /* Destroys on a lost context work and report nothing. */
    T_OK(sc_stream_destroy(s));
    T_OK(sc_buffer_destroy(b));
    atomic_fetch_add(&lost_done, 1);
    return NULL;
}

static void *lose_context(void *arg)
{
    (void)arg;
    while (atomic_load(&lost_progress) < 4 * THREADS && atomic_load(&lost_done) < THREADS)
        sched_yield();
    REQUIRE(sci_fault_arm("cuMemcpyHtoDAsync", 1, CUDA_ERROR_ILLEGAL_ADDRESS));
    atomic_store(&lost_armed, 1);
    return NULL;
}

static void test_loss(void)
{
    /* The device memory of a lost context is not freed call by call: CUDA frees it with
     * the primary context, as the fake does when asked to. */
    fake.set_reclaim_on_release(1);
    fake_counts before = fake_counts_now();
    REQUIRE(sc_context_create(NULL, &lost_ctx) == SC_OK);
    pthread_t arm;
    REQUIRE(pthread_create(&arm, NULL, lose_context, NULL) == 0);
    run_threads(work_until_lost, THREADS);
    pthread_join(arm, NULL);
    CHECK(sci_fault_fired());
    sci_fault_disarm();
    CHECK(atomic_load(&lost_seen) == THREADS);
    CHECK_STATUS(sc_context_check(lost_ctx), SC_ERR_CONTEXT_LOST);
    CHECK_MSG("CUDA_ERROR_ILLEGAL_ADDRESS");
    CHECK_OK(sc_context_destroy(lost_ctx));
    fake.set_reclaim_on_release(0);
    char diff[512];
    if (fake_counts_diff(before, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "after the lost context the fake holds: %s\n", diff);
        test_failures++;
    }
}

/* The cache folder and its entries (no subfolders). */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    if (rmdir(dir) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

int main(void)
{
    /* The disk cache in a folder of its own, shared by the threads of the programs part. */
    char cache_dir[] = "/tmp/safecuda-test-threads-XXXXXX";
    REQUIRE(mkdtemp(cache_dir) != NULL);
    setenv("SAFECUDA_CACHE", "1", 1);
    setenv("SAFECUDA_CACHE_DIR", cache_dir, 1);

    test_init(); /* first: nothing has loaded the driver yet */
    fake_attach();
    fake_counts start = fake_counts_now();
    test_first_use();
    test_log_switch();
    test_hammer();
    test_internal_marks();
    test_programs();
    test_destroy_while_used();
    test_loss();

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
    test_failures += atomic_load(&thread_failures);

    remove_dir(cache_dir);
    return test_result("test_td_threads");
}
