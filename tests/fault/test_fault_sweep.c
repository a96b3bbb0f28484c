/* Fault sweep: the realistic program of fault_program.h against the test device, with a
 * driver error injected into every driver call it makes, one call per run.
 *
 * A first run with sci_fault_arm("*", 0, 0) counts its driver calls, C. Then for every
 * N in 1..C and every error E in {CUDA_ERROR_OUT_OF_MEMORY, CUDA_ERROR_INVALID_VALUE,
 * CUDA_ERROR_ILLEGAL_ADDRESS (sticky)} the program runs with call N failing with E and
 * stops at its first failing step, which must
 *   - return the injected error's class: SC_ERR_OUT_OF_MEMORY (SC_ERR_HOST_OUT_OF_MEMORY
 *     for cuMemHostAlloc), SC_ERR_DRIVER (or the documented status of the one entry point
 *     whose INVALID_VALUE is an answer, see below), SC_ERR_CONTEXT_LOST;
 *   - leave a message that starts with "sc_", names the public function or the entry point,
 *     and quotes the CUDA error;
 * then: a non-sticky error leaves the context usable (a round trip on it succeeds) and its
 * accounting honest (sc_context_memory counts the live buffers, plus the memory of a free
 * the driver refused); a sticky one leaves it lost (sc_context_check says so); everything is
 * cleaned up through the public API, every destroy answering SC_OK (on a lost context too);
 * no handle is left in the registry and the test device holds nothing more than at the
 * start; a fresh context works.
 *
 * A run may complete with the fault absorbed only where the library documents that it
 * tolerates a failure (the absorbable table below) and only for a non-sticky error: a
 * sticky error always loses the context, and a failed release (cuMemFreeAsync,
 * cuStreamDestroy, ...) is always reported by its destroy.
 *
 * Two things a library can't do better, accounted for, not failed:
 *   - a release entry point that fails keeps its object in the driver: that one object
 *     stays allocated in the fake (the destroy reports it; the handle is gone);
 *   - after a sticky error the lost context's device memory is not freed call by call:
 *     the library leaves it to the primary context's last release, which (as in CUDA)
 *     frees it. The fake does that only in sticky runs (safecuda_testdevice_set_reclaim_on_release)
 *     and counts what it reclaimed.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <signal.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "../test.h"
#include "core/registry.h"
#include "driver/driver.h"
#include "td_control.h"
#include "fault_program.h"

static long log_messages;
static void quiet_log(sc_log_level level, const char *message, void *user)
{
    (void)level, (void)message, (void)user;
    log_messages++;
}

static const struct {
    int error;
    const char *name;
} errors[] = {
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
};

/* Release entry points: a failure keeps the object in the driver. */
static const struct {
    const char *name;
    int counter; /* into fake_counts: device, host, streams, events, modules, pools, refcount */
} releases[] = {
    {"cuMemFreeAsync", 0}, {"cuMemFree", 0},      {"cuMemFreeHost", 1},
    {"cuStreamDestroy", 2}, {"cuEventDestroy", 3}, {"cuModuleUnload", 4},
    {"cuMemPoolDestroy", 5}, {"cuDevicePrimaryCtxRelease", 6},
};

/* Entry points whose non-sticky failure the library tolerates (docs/RELIABILITY.md), so a
 * run may complete with the fault absorbed; error 0 means any non-sticky error. */
static const struct {
    const char *name;
    int error;
    const char *why;
} absorbable[] = {
    {"cuCtxGetCurrent", 0, "the context is then made current with cuCtxSetCurrent"},
    {"cuCtxSetCurrent", 0, "sc_context_destroy's last cuCtxSetCurrent(NULL)"},
    {"cuDeviceGetAttribute", 0, "the optional ECC and memory-pool flags"},
    {"cuEventCreate", 0, "an eager ordering event: recorded later, when needed"},
    {"cuEventRecord", 0, "an eager ordering event: recorded later, when needed"},
    {"cuMemPoolSetAttribute", 0, "the pool's release threshold (a cache policy)"},
    {"cuMemAllocFromPoolAsync", CUDA_ERROR_OUT_OF_MEMORY, "retried after trimming"},
    {"cuFuncGetParamInfo", CUDA_ERROR_INVALID_VALUE, "the end of the parameter list"},
    {"cuFuncGetAttribute", CUDA_ERROR_INVALID_VALUE,
     "a kernel's cluster attributes: a driver that does not report them (no compiled cluster)"},
};

static bool may_absorb(const char *entry, int error)
{
    for (size_t i = 0; entry && i < sizeof absorbable / sizeof absorbable[0]; i++)
        if (strcmp(entry, absorbable[i].name) == 0 &&
            (absorbable[i].error == 0 || absorbable[i].error == error))
            return true;
    return false;
}

/* The watchdog: a run that hangs (a deadlock) fails the test instead of stalling CI. */
static volatile sig_atomic_t watch_n, watch_e;
static void on_alarm(int sig)
{
    (void)sig;
    char buf[160];
    int len = snprintf(buf, sizeof buf,
                       "\nfault sweep: HUNG for 10 s with call %d failing with error %d "
                       "(a deadlock in the library)\n",
                       (int)watch_n, (int)watch_e);
    if (len > 0)
        (void)!write(2, buf, (size_t)len);
    _exit(2);
}

static long *counter(fake_counts *c, int i)
{
    long *f[] = {&c->device, &c->host, &c->streams, &c->events, &c->modules, &c->pools,
                 &c->refcount};
    return f[i];
}

static struct {
    uint64_t injected, first_fail, absorbed, named_entry, named_fn, refused_releases,
        swallowed_releases, reclaimed, reuse_ok, lost_ok, accounting_ok, fresh_ok,
        launch_param_info, leaks;
} st;

static int failures_before(void) { return test_failures; }

/* A small round trip on ctx. */
static sc_status round_trip(sc_context ctx)
{
    float in[16], out[16];
    for (int i = 0; i < 16; i++)
        in[i] = (float)i * 3.0f;
    sc_buffer b;
    sc_status s = sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 16}, &b);
    if (s != SC_OK)
        return s;
    s = sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), in, sizeof in);
    if (s == SC_OK)
        s = sc_copy_to_host(SC_DEFAULT_STREAM, out, sizeof out, sc_view_of(b));
    if (s == SC_OK && memcmp(in, out, sizeof in) != 0)
        s = SC_ERR_INTERNAL;
    sc_status d = sc_buffer_destroy(b);
    return s != SC_OK ? s : d;
}

static bool registry_empty(char *why, size_t size)
{
    for (int k = SCI_KIND_CONTEXT; k < SCI_KIND_TEST_A; k++)
        if (sci_registry_live_count((sci_kind)k)) {
            snprintf(why, size, "%zu live %s handle(s)", sci_registry_live_count((sci_kind)k),
                     sci_kind_name((sci_kind)k));
            return false;
        }
    return true;
}

/* Is the handle of a destroyed object stale now? */
static bool is_stale(fp_world *w, fp_object o)
{
    sc_status s;
    switch (o) {
    case FP_CTX: s = sc_context_check(w->ctx); break;
    case FP_S0: s = sc_stream_query(w->s0); break;
    case FP_S1: s = sc_stream_query(w->s1); break;
    case FP_A: s = sc_buffer_info(w->a, &(sc_buffer_props){0}); break;
    case FP_B: s = sc_buffer_info(w->b, &(sc_buffer_props){0}); break;
    case FP_C: s = sc_buffer_info(w->c, &(sc_buffer_props){0}); break;
    case FP_H: s = sc_host_buffer_write(w->h, 0, "", 0); break;
    case FP_E: s = sc_event_query(w->e); break;
    case FP_M: s = sc_module_kernel_names(w->m, NULL, 0, &(size_t){0}); break;
    default: return false;
    }
    return s == SC_ERR_STALE_HANDLE;
}

#define LEAKF(...)                                                                         \
    do {                                                                                   \
        st.leaks++;                                                                        \
        FAILF(__VA_ARGS__);                                                                \
    } while (0)

#define FAILF(...)                                                                         \
    do {                                                                                   \
        fprintf(stderr, "call %llu/%s (%s) at step %d %s: ", (unsigned long long)n,        \
                errors[ei].name, fault_name ? fault_name : "?", step, fp_step_fn[step]);   \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
        test_failures++;                                                                   \
    } while (0)

static void sweep_one(uint64_t n, int ei)
{
    const int error = errors[ei].error;
    const bool sticky = error == CUDA_ERROR_ILLEGAL_ADDRESS;
    fake_counts base = fake_counts_now();
    int fails0 = failures_before();
    fake.set_reclaim_on_release(sticky);
    long reclaimed0 = fake.reclaimed_allocations();

    static fp_world w;
    fp_init(&w);
    watch_n = (sig_atomic_t)n;
    watch_e = error;
    alarm(10);
    REQUIRE(sci_fault_arm("*", n, error));
    int step = 0;
    sc_status s = SC_OK;
    for (; step < FP_STEPS; step++) {
        sc_clear_error();
        s = fp_step(&w, step);
        if (s != SC_OK)
            break;
    }
    bool fired = sci_fault_fired();
    const char *fault_name = sci_fault_last_name();
    sci_fault_disarm();
    if (!fired) {
        step = step < FP_STEPS ? step : FP_STEPS - 1;
        FAILF("the fault never fired (the program's driver calls are not deterministic)");
        return;
    }
    st.injected++;
    bool release_fault = false;
    int release_counter = -1;
    for (size_t i = 0; i < sizeof releases / sizeof releases[0]; i++)
        if (fault_name && strcmp(fault_name, releases[i].name) == 0) {
            release_fault = true;
            release_counter = releases[i].counter;
        }

    const bool failed = step < FP_STEPS;
    if (getenv("FAULT_SWEEP_VERBOSE"))
        printf("call %llu %s %s: %s at step %d %s: %s\n", (unsigned long long)n,
               errors[ei].name, fault_name ? fault_name : "?",
               failed ? sc_status_name(s) : "absorbed", step,
               fp_step_fn[failed ? step : FP_STEPS - 1], failed ? sc_last_error() : "");
    if (!failed) {
        /* Every step succeeded: the library absorbed the error (a call whose failure it
         * tolerates, such as a release, or an allocation it retried). */
        st.absorbed++;
        step = FP_STEPS - 1;
        if (w.data_errors)
            FAILF("the program's data is wrong (%d mismatches)", w.data_errors);
        if (release_fault) {
            st.swallowed_releases++;
            FAILF("a refused release was swallowed: every destroy said SC_OK");
        } else if (sticky) {
            FAILF("a sticky error was absorbed: the context should be lost");
        } else if (!may_absorb(fault_name, error)) {
            FAILF("the error was absorbed where the library does not tolerate it");
        }
    } else {
        st.first_fail++;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", sc_last_error());
        const char *fn = fp_step_fn[step];
        /* The status names the injected error's class. */
        sc_status want = error == CUDA_ERROR_OUT_OF_MEMORY ? SC_ERR_OUT_OF_MEMORY
                         : sticky                          ? SC_ERR_CONTEXT_LOST
                                                           : SC_ERR_DRIVER;
        if (error == CUDA_ERROR_OUT_OF_MEMORY && fault_name &&
            strcmp(fault_name, "cuMemHostAlloc") == 0)
            want = SC_ERR_HOST_OUT_OF_MEMORY;
        bool param_info = fault_name && strcmp(fault_name, "cuFuncGetParamInfo") == 0;
        if (param_info && error == CUDA_ERROR_INVALID_VALUE && s == SC_ERR_LAUNCH &&
            strcmp(fn, "sc_kernel_launch") == 0) {
            /* cuFuncGetParamInfo answers CUDA_ERROR_INVALID_VALUE past the last parameter,
             * so that error ends the list: the kernel seems to take fewer parameters and
             * the launch is refused (SC_ERR_LAUNCH), the documented limit. Any other error
             * fails sc_kernel_get, checked below like every other entry point. */
            st.launch_param_info++;
        } else {
            if (s != want)
                FAILF("returned %s, expected %s (%s)", sc_status_name(s), sc_status_name(want),
                      msg);
            if (!strstr(msg, errors[ei].name))
                FAILF("the message does not quote %s: %s", errors[ei].name, msg);
        }
        if ((unsigned)s >= SC_STATUS_COUNT || s == SC_ERR_INTERNAL)
            FAILF("returned %d (%s)", (int)s, sc_status_name(s));
        if (strncmp(msg, "sc_", 3) != 0)
            FAILF("the message does not start with a public function's name: %s", msg);
        size_t fl = strlen(fn);
        bool names_fn = strncmp(msg, fn, fl) == 0 && msg[fl] == ':';
        bool names_entry = fault_name && strstr(msg, fault_name);
        st.named_fn += names_fn;
        st.named_entry += names_entry;
        if (!names_fn && !names_entry)
            FAILF("the message names neither %s nor %s: %s", fn, fault_name, msg);
        if (release_fault)
            st.refused_releases++;
    }

    /* The context after the failure. */
    if (w.exists[FP_CTX] && !sticky && failed) {
        /* The accounting: the live buffers, plus the memory of a free the driver refused
         * (it still holds it); the same for pinned memory. */
        const uint64_t bytes = FP_N * sizeof(float);
        uint64_t live = (uint64_t)w.exists[FP_A] + w.exists[FP_B] + w.exists[FP_C];
        uint64_t kept = release_counter == 0, pinned = w.exists[FP_H] + (release_counter == 1);
        sc_memory_stats m;
        sc_status ms = sc_context_memory(w.ctx, &m);
        if (ms != SC_OK)
            FAILF("sc_context_memory after the failure: %s (%s)", sc_status_name(ms),
                  sc_last_error());
        else if (m.live_buffers != live || m.bytes_in_use != (live + kept) * bytes ||
                 m.pinned_bytes != pinned * bytes)
            FAILF("accounting: %llu live buffers, %llu bytes in use, %llu pinned; want %llu, "
                  "%llu, %llu",
                  (unsigned long long)m.live_buffers, (unsigned long long)m.bytes_in_use,
                  (unsigned long long)m.pinned_bytes, (unsigned long long)live,
                  (unsigned long long)((live + kept) * bytes),
                  (unsigned long long)(pinned * bytes));
        else
            st.accounting_ok++;
    }
    if (w.exists[FP_CTX]) {
        sc_status c = sc_context_check(w.ctx);
        if (sticky && failed && s == SC_ERR_CONTEXT_LOST) {
            if (c != SC_ERR_CONTEXT_LOST)
                FAILF("a sticky error left the context %s, not lost", sc_status_name(c));
            else if (!strstr(sc_last_error(), errors[ei].name))
                FAILF("the lost context's message does not quote the original error: %s",
                      sc_last_error());
            else
                st.lost_ok++;
        } else if (!sticky || !failed) {
            sc_status r = c == SC_OK ? round_trip(w.ctx) : c;
            if (r != SC_OK)
                FAILF("after a non-sticky error the context is not usable: %s (%s)",
                      sc_status_name(r), sc_last_error());
            else
                st.reuse_ok++;
        }
    }

    /* Clean up through the public API: users before what they use. No fault is armed:
     * every destroy succeeds, on a lost context too (it frees what the host holds). */
    static const fp_object order[] = {FP_M, FP_E, FP_A, FP_B, FP_C, FP_H, FP_S0, FP_S1,
                                      FP_CTX};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        if (!w.exists[order[i]])
            continue;
        sc_status d = fp_destroy(&w, order[i]);
        if (d != SC_OK)
            FAILF("cleanup: destroying object %d returned %s (%s)", (int)order[i],
                  sc_status_name(d), sc_last_error());
    }
    for (int o = 0; o < FP_OBJECTS; o++)
        if (w.destroyed[o] && !is_stale(&w, (fp_object)o))
            LEAKF("object %d is still reachable after its destroy call", o);

    /* No leaks: the registry is empty; the fake holds what it held, plus the one object
     * of a release the fault refused. */
    char why[512];
    if (!registry_empty(why, sizeof why))
        LEAKF("leak: %s", why);
    fake_counts want = base;
    if (release_counter >= 0)
        (*counter(&want, release_counter))++;
    if (release_counter == 6) { /* give back the primary context reference we refused */
        sci_cuDevicePrimaryCtxRelease(0);
        want.refcount--;
    }
    fake_counts got = fake_counts_now();
    if (sticky) {
        /* The lost context's memory went with the primary context's last release. */
        st.reclaimed += (uint64_t)(fake.reclaimed_allocations() - reclaimed0);
        if (release_counter == 0)
            want.device--; /* a refused free was reclaimed too */
    }
    if (fake_counts_diff(want, got, why, sizeof why))
        LEAKF("the test device holds: %s", why);
    if (got.device && got.refcount == 0) {
        /* Device memory a refused free kept: let the primary context's last release
         * reclaim it (as CUDA would), so the next run starts from an empty device. */
        fake.set_reclaim_on_release(1);
        CUcontext pc;
        sci_cuDevicePrimaryCtxRetain(&pc, 0);
        sci_cuDevicePrimaryCtxRelease(0);
        if (fake.live_device_allocations() != 0)
            FAILF("could not reclaim the refused frees' device memory");
    }
    if (fake.misuse_count() != 0)
        FAILF("the test device saw a misuse: %s", fake.last_misuse());

    /* A fresh context works. */
    fake.set_reclaim_on_release(0);
    sc_context fresh;
    sc_status f = sc_context_create(NULL, &fresh);
    if (f == SC_OK) {
        f = round_trip(fresh);
        sc_status d = sc_context_destroy(fresh);
        if (f == SC_OK)
            f = d;
    }
    if (f != SC_OK)
        FAILF("a fresh context does not work: %s (%s)", sc_status_name(f), sc_last_error());
    else
        st.fresh_ok++;
    alarm(0);
    if (test_failures != fails0 && getenv("FAULT_SWEEP_STOP"))
        exit(1);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    fake_attach();
    sc_set_log_callback(quiet_log, NULL);
    signal(SIGALRM, on_alarm);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    /* The program without faults, counting its driver calls. */
    static fp_world w;
    fake_counts start = fake_counts_now();
    fp_init(&w);
    REQUIRE(sci_fault_arm("*", 0, 0));
    for (int i = 0; i < FP_STEPS; i++) {
        sc_status s = fp_step(&w, i);
        if (s != SC_OK) {
            fprintf(stderr, "step %d (%s) failed without a fault: %s\n", i, fp_step_fn[i],
                    sc_last_error());
            return 1;
        }
    }
    uint64_t calls = sci_fault_calls();
    sci_fault_disarm();
    REQUIRE(w.data_errors == 0);
    char why[512];
    REQUIRE(fake_counts_diff(start, fake_counts_now(), why, sizeof why) == 0);
    REQUIRE(calls > 0);
    REQUIRE(fake.misuse_count() == 0);
    printf("the program makes %llu driver calls in %d steps\n", (unsigned long long)calls,
           FP_STEPS);

    uint64_t only = getenv("FAULT_SWEEP_CALL") ? strtoull(getenv("FAULT_SWEEP_CALL"), NULL, 10)
                                               : 0;
    for (uint64_t n = 1; n <= calls; n++) {
        if (only && n != only)
            continue;
        for (int ei = 0; ei < 3; ei++)
            sweep_one(n, ei);
    }

    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    char diff[512];
    if (fake_counts_diff(start, fake_counts_now(), diff, sizeof diff))
        printf("(the fake still holds objects of refused releases: %s)\n", diff);
    printf("first failing step stopped the run: %llu; absorbed (the run completed): %llu\n",
           (unsigned long long)st.first_fail, (unsigned long long)st.absorbed);
    printf("messages naming the public function: %llu, the entry point: %llu\n",
           (unsigned long long)st.named_fn, (unsigned long long)st.named_entry);
    printf("non-sticky: context reused %llu times, its accounting checked %llu times; sticky: "
           "context lost cleanly %llu times\n",
           (unsigned long long)st.reuse_ok, (unsigned long long)st.accounting_ok,
           (unsigned long long)st.lost_ok);
    printf("refused releases: %llu reported, %llu swallowed (destroy said SC_OK); device "
           "allocations reclaimed with lost contexts: %llu\n",
           (unsigned long long)st.refused_releases, (unsigned long long)st.swallowed_releases,
           (unsigned long long)st.reclaimed);
    printf("launches refused after cuFuncGetParamInfo answered CUDA_ERROR_INVALID_VALUE: "
           "%llu; fresh contexts: %llu\n",
           (unsigned long long)st.launch_param_info, (unsigned long long)st.fresh_ok);
    printf("fault sweep: %llu calls x 3 errors = %llu injected faults, %llu leaks "
           "(%d failed checks, %.1f s)\n",
           (unsigned long long)calls, (unsigned long long)st.injected,
           (unsigned long long)st.leaks, test_failures, secs);
    return test_result("test_fault_sweep");
}
