/* The safecuda test device: a stand-in for the CUDA driver (libcuda) for tests on machines
 * without a GPU. It is not a GPU and not an emulator: device memory is host memory, and
 * kernels never run. It exists so that a program's own tests (and safecuda's) can exercise
 * everything around the kernels -- allocation, copies, fills, streams, events, budgets,
 * leak reports, module loads, every argument check -- where there is no GPU.
 *
 * libsafecuda_testdevice.so implements the CUDA driver entry points safecuda resolves
 * (every row of SCI_CU_FUNCS in src/driver/cuda_api.h) on host memory. It is installed
 * beside libsafecuda; select it with
 *
 *     SAFECUDA_DEVICE=test                 (found beside libsafecuda or the program, in
 *                                           their prefix's library folders, the configured
 *                                           libdir, or through the dynamic linker:
 *                                           src/driver/libcuda.c)
 *     SAFECUDA_LIBCUDA=/path/to/libsafecuda_testdevice.so
 *
 * What it models:
 *   - one device, "safecuda test device (host memory, runs no kernels)", with sm_90
 *     (H100-like) attributes; SAFECUDA_TESTDEVICE_MEMORY_MB (default 4096) sets its memory,
 *     SAFECUDA_TESTDEVICE_PINNED_MB (default 1024) caps pinned host memory,
 *     SAFECUDA_TESTDEVICE_DEVICES=0 makes cuInit answer CUDA_ERROR_NO_DEVICE (1, one device,
 *     is the default; more are not modelled);
 *     SAFECUDA_TESTDEVICE_DRIVER_VERSION=12030 (for example, 12000 .. 13000) reports an
 *     older driver, which lacks the entry points that came after that version;
 *     SAFECUDA_TESTDEVICE_CC=80 or 8.0 (major 5 .. 12, minor 0 .. 9) reports another compute
 *     capability (the other attributes stay the H100's); a value outside these forms, for
 *     any of the variables, makes cuInit fail and safecuda_testdevice_settings_error say
 *     which and what is accepted (settings.c), which the library quotes;
 *   - the primary context with a reference count (a release to 0 frees nothing by itself,
 *     it is only counted), a thread-local current context;
 *   - memory pools with a release threshold, cached (freed, not yet released) bytes,
 *     trimming, and the RESERVED/USED attributes; device allocations are 256-byte-aligned
 *     malloc'd host memory, so a "device pointer" is a host address and every copy and
 *     memset really moves bytes (data round trips can be checked); cuMemGetInfo's free
 *     memory is the total minus the live device allocations minus the bytes the pools
 *     cache (a real pool holds those too), and an allocation that does not fit is
 *     CUDA_ERROR_OUT_OF_MEMORY;
 *   - cuPointerGetAttribute answers the memory type, managed flag, device ordinal, context,
 *     device pointer and range (start and size) of the live allocation an address falls in
 *     (CUDA_ERROR_INVALID_VALUE elsewhere: pageable or freed memory); tests can make it
 *     describe an allocation as host, managed, another device's or another context's
 *     memory (safecuda_testdevice_set_pointer_attributes);
 *   - streams are synchronous: every copy, memset and host function runs at once;
 *   - modules from PTX text only: `.entry NAME(` blocks and their `.param` lines give each
 *     kernel's parameter offsets and sizes (so the library's launch checks work);
 *   - launches (cuLaunchKernel, cuLaunchKernelEx) are validated, then REFUSED with
 *     CUDA_ERROR_NOT_SUPPORTED, whose text here says that kernels do not run on the test
 *     device: a launch never pretends to have run. safecuda's own bookkeeping tests, which
 *     count what a launch records, set SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES=1 to have
 *     validated launches answer CUDA_SUCCESS without running anything; it exists for them;
 *   - launch attributes (cuLaunchKernelEx): COOPERATIVE (the grid must fit at once:
 *     blocks <= blocks per SM x 132 SMs, else CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE),
 *     CLUSTER_DIMENSION (sm_90+, else CUDA_ERROR_NOT_SUPPORTED; every grid dimension a
 *     multiple of the cluster's, else CUDA_ERROR_INVALID_VALUE; at most 8 blocks, 16 with
 *     the function's NON_PORTABLE_CLUSTER_SIZE_ALLOWED, else CUDA_ERROR_INVALID_CLUSTER_SIZE),
 *     PROGRAMMATIC_STREAM_SERIALIZATION (changes nothing here); another attribute is
 *     CUDA_ERROR_NOT_SUPPORTED. A kernel compiled with __cluster_dims__ (PTX
 *     `.reqnctapercluster X, Y, Z`) reports its cluster through the REQUIRED_CLUSTER_*
 *     attributes and launches with it (another one is CUDA_ERROR_INVALID_VALUE); one with
 *     `.explicitcluster` reports CLUSTER_SIZE_MUST_BE_SET and must get a cluster
 *     (CUDA_ERROR_INVALID_CLUSTER_SIZE). cuOccupancyMaxActiveClusters models clusters placed
 *     inside GPCs, 8 of 16 SMs: 8 x (16 x blocks per SM / cluster size), 0 for a cluster
 *     over the limit. Each of these refusals is misuse (safecuda checks them first);
 *   - tensor maps (tensor_map.c): cuTensorMapEncodeTiled validated as the CUDA driver
 *     documents it (every refusal is misuse), the described bytes inside one live device
 *     allocation, and every argument written into the map's 128 bytes for tests to read;
 *   - stream capture (capture.c), as the CUDA driver documents it. cuStreamBeginCapture
 *     starts a capture sequence (an id unique over the process, its mode, its origin stream,
 *     the thread that began it); while a stream captures, its copies, memsets, launches
 *     (validated as above, kernel parameters copied by the sizes the PTX declares, attributes
 *     kept) and host functions are recorded as nodes of the capture's graph instead of
 *     running, each depending on what its stream last recorded or waited for. As in CUDA,
 *     cuEventRecord and cuStreamWaitEvent make no nodes (only edges): a record marks the
 *     event with its stream's position in the capture; a wait on it joins that position into
 *     the waiting stream (a stream that is not capturing joins the capture: a fork); a wait
 *     with CU_EVENT_WAIT_EXTERNAL makes an event wait node. Nodes keep their capture order, a
 *     topological order. cuStreamEndCapture, on the origin stream, from the thread that
 *     began the capture unless it is RELAXED, gives the graph, or NULL with
 *     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, or CUDA_ERROR_STREAM_CAPTURE_UNJOINED when a
 *     node is not an ancestor of the origin stream's position (work forked and never joined
 *     back, directly or through a chain of streams); in each of these cases the capture
 *     ends and all its streams stop capturing;
 *   - graphs: cuGraphGetNodes; cuGraphInstantiateWithFlags copies a graph into an executable
 *     graph; cuGraphLaunch runs its nodes in order at once (the streams are synchronous):
 *     copies and memsets move bytes, host functions run, kernel nodes are refused as
 *     launches are (the whole graph, before anything runs) unless launches are accepted
 *     (then they are skipped). cuGraphExecUpdate replaces the parameters when the topology
 *     (node count, each node's dependencies) and the node types are the same and the changes
 *     are ones CUDA 12 allows (a kernel node may change its function, not whether it is
 *     cooperative; a copy may not change direction; a 2D memset only its address and
 *     value), else CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE with TOPOLOGY_CHANGED,
 *     NODE_TYPE_CHANGED, ATTRIBUTES_CHANGED or PARAMETERS_CHANGED and the node.
 *
 * Not modelled: capture of the per-thread default stream, graphs built node by node, child
 * graph nodes (cuGraphLaunch into a capturing stream), memory nodes (stream-ordered
 * allocation on a capturing stream), cuThreadExchangeStreamCaptureMode (every thread is in
 * the default GLOBAL interaction mode).
 *
 * What CUDA refuses during capture is refused here with its error, and invalidates the
 * capture(s) concerned, which then answer CUDA_ERROR_STREAM_CAPTURE_INVALIDATED on every
 * stream-ordered call until ended. Each of these refusals is also counted as misuse: it is
 * what safecuda must prevent by refusing such calls itself (the errors a capture answers
 * after its invalidation are not counted again):
 *   - CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: cuStreamSynchronize / cuStreamQuery of a
 *     capturing stream; cuCtxSynchronize during any capture; cuMemAlloc, cuMemFree,
 *     cuMemHostAlloc, cuMemFreeHost, cuModuleLoadDataEx, cuModuleUnload during a GLOBAL
 *     capture (any thread) or a THREAD_LOCAL one of the calling thread (never for RELAXED);
 *     a copy from or to pageable memory on a capturing stream; cuMemAllocFromPoolAsync /
 *     cuMemFreeAsync on one; cuStreamDestroy of a stream in a capture (the stream stays);
 *     capturing the legacy stream;
 *   - CUDA_ERROR_STREAM_CAPTURE_ISOLATION: a capturing stream waits on an event recorded
 *     outside the capture (without CU_EVENT_WAIT_EXTERNAL);
 *   - CUDA_ERROR_STREAM_CAPTURE_MERGE: a stream of one capture waits on an event of another
 *     (both are invalidated);
 *   - CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the legacy stream used while a blocking stream
 *     captures;
 *   - CUDA_ERROR_CAPTURED_EVENT: cuEventSynchronize / cuEventQuery / cuEventElapsedTime of an
 *     event last recorded in a capture, and a wait on one whose capture has ended, from a
 *     stream that is not capturing (record it again outside the capture first);
 *   - CUDA_ERROR_ILLEGAL_STATE: beginning a capture on a capturing stream, ending one on a
 *     stream that is not capturing; CUDA_ERROR_STREAM_CAPTURE_UNMATCHED (ending on a stream
 *     that joined), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (these two invalidate the capture,
 *     which the origin stream must still end);
 *   (CUDA_ERROR_STREAM_CAPTURE_UNJOINED, work forked and never joined, is a mistake of the
 *   calling program that the driver reports, not misuse);
 *   - at cuGraphLaunch, a node whose device range is no longer in a live allocation, whose
 *     pinned host range was freed, whose function was unloaded or whose event was
 *     destroyed: CUDA_ERROR_INVALID_VALUE (a GPU would fault, stickily), nothing runs.
 *
 * Every call validates its arguments the way a careful driver would. A call that hands
 * the test device something no correct caller would (a device range outside every live
 * allocation, an unknown or destroyed handle, a free of an unknown pointer, a launch
 * without its parameters, ...) answers an error AND increments a misuse counter that
 * safecuda's tests read (safecuda_testdevice_misuse_count);
 * SAFECUDA_TESTDEVICE_ABORT_ON_MISUSE=1 aborts there instead, for a stack trace. Errors a
 * correct caller may legitimately get (a parameter index past the last one, a kernel name
 * that is not in the module, the memory type of a pageable pointer, a non-PTX image) are
 * not misuse.
 *
 * Thread-safe: one mutex guards all state; host functions run outside it.
 *
 * Counters for safecuda's tests (exported, not an API): safecuda_testdevice_misuse_count,
 * _last_misuse, _live_{device,host}_allocations, _live_{streams,events,modules,pools},
 * _live_graphs, _live_graph_execs, _active_captures (begun, not ended), _refused_launches,
 * and the primary context's. */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/cuda_api.h"
#include "testdevice_internal.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- state -------------------------------------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int initialized;
static int n_devices = 1;
static uint64_t total_bytes = 4096ull << 20;
static uint64_t host_limit = 1024ull << 20;
static int abort_on_misuse;
static int compute_capability = 90; /* SAFECUDA_TESTDEVICE_CC, e.g. 80 */
static int driver_version = 13000;  /* SAFECUDA_TESTDEVICE_DRIVER_VERSION */
int accept_launches;                /* SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES=1 */
long refused_launches;

static long misuse;
static char last_misuse[512];

typedef struct fake_ctx {
    int magic;
    long refcount;
} fake_ctx;
#define CTX_MAGIC 0x0c7c7c7c
static fake_ctx primary = {CTX_MAGIC, 0};
static long primary_releases_to_zero;
static int reclaim_on_release;   /* opt-in: a release to 0 frees device memory (as CUDA) */
static long reclaimed_allocations;
static _Thread_local fake_ctx *current;

typedef struct fake_pool {
    int magic;
    uint64_t used;      /* bytes of live allocations from the pool */
    uint64_t cached;    /* freed bytes the pool still holds */
    uint64_t threshold; /* release threshold */
    uint64_t reserved_high, used_high;
    int reuse[3];
} fake_pool;
#define POOL_MAGIC 0x9001

typedef struct fake_module {
    int magic;
    int n_funcs;
    fake_func **funcs;
} fake_module;
#define MODULE_MAGIC 0x30d

static ptr_set pools, modules;
ptr_set streams, events, funcs;
static fake_alloc *allocs;
static size_t n_allocs, cap_allocs;
static uint64_t device_used; /* bytes of live device allocations */
static uint64_t host_used;
static long live_device, live_host;

int set_add(ptr_set *s, void *p)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        void **grown = realloc(s->items, cap * sizeof *grown);
        if (!grown)
            return 0;
        s->items = grown;
        s->cap = cap;
    }
    s->items[s->n++] = p;
    return 1;
}

int set_has(const ptr_set *s, const void *p)
{
    if (!p)
        return 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->items[i] == p)
            return 1;
    return 0;
}

int set_remove(ptr_set *s, const void *p)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->items[i] == p) {
            s->items[i] = s->items[--s->n];
            return 1;
        }
    return 0;
}

void td_lock(void) { pthread_mutex_lock(&lock); }
void td_unlock(void) { pthread_mutex_unlock(&lock); }

/* Record a misuse (the caller holds the lock) and return err. */
CUresult bad(CUresult err, const char *fn, const char *fmt, ...)
{
    misuse++;
    int n = snprintf(last_misuse, sizeof last_misuse, "%s: ", fn);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof last_misuse)
        vsnprintf(last_misuse + n, sizeof last_misuse - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "safecuda test device: MISUSE #%ld: %s\n", misuse, last_misuse);
    if (abort_on_misuse)
        abort();
    return err;
}

/* The checks most entry points start with (lock held). */
CUresult need_init(const char *fn)
{
    if (!initialized)
        return bad(CUDA_ERROR_NOT_INITIALIZED, fn, "called before cuInit");
    return CUDA_SUCCESS;
}

CUresult need_ctx(const char *fn)
{
    CUresult r = need_init(fn);
    if (r != CUDA_SUCCESS)
        return r;
    if (!current)
        return bad(CUDA_ERROR_INVALID_CONTEXT, fn, "no current context");
    if (current->refcount <= 0)
        return bad(CUDA_ERROR_INVALID_CONTEXT, fn,
                   "the current context is the primary context, released (refcount 0)");
    return CUDA_SUCCESS;
}

CUresult need_stream(CUstream s, const char *fn)
{
    /* NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are valid. */
    if ((uintptr_t)s <= 2 || set_has(&streams, s))
        return CUDA_SUCCESS;
    return bad(CUDA_ERROR_INVALID_HANDLE, fn, "unknown or destroyed stream %p", (void *)s);
}

/* The live allocation containing address p (device or host), or NULL. */
fake_alloc *find_alloc(uintptr_t p)
{
    for (size_t i = 0; i < n_allocs; i++)
        if (p >= allocs[i].base && p - allocs[i].base < allocs[i].size)
            return &allocs[i];
    return NULL;
}

static fake_alloc *find_base(uintptr_t p)
{
    for (size_t i = 0; i < n_allocs; i++)
        if (allocs[i].base == p)
            return &allocs[i];
    return NULL;
}

/* [p, p + n) lies inside one live device allocation. */
CUresult device_range(CUdeviceptr p, uint64_t n, const char *fn, const char *what)
{
    if (n == 0)
        return CUDA_SUCCESS;
    fake_alloc *a = find_alloc((uintptr_t)p);
    if (!a || a->is_host)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "%s range [0x%llx, +%llu) starts outside every live device allocation", what,
                   (unsigned long long)p, (unsigned long long)n);
    uint64_t room = a->size - ((uintptr_t)p - a->base);
    if (n > room)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "%s range [0x%llx, +%llu) runs %llu bytes past the end of its allocation "
                   "[0x%llx, +%llu)",
                   what, (unsigned long long)p, (unsigned long long)n,
                   (unsigned long long)(n - room), (unsigned long long)a->base,
                   (unsigned long long)a->size);
    return CUDA_SUCCESS;
}

/* A host pointer: not inside a device allocation; inside a pinned allocation it must fit. */
static CUresult host_range(const void *h, uint64_t n, const char *fn, const char *what)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (!h)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "%s host pointer is NULL", what);
    fake_alloc *a = find_alloc((uintptr_t)h);
    if (!a)
        return CUDA_SUCCESS; /* pageable memory: nothing to check it against */
    if (!a->is_host)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "%s host pointer %p is a device address", what,
                   h);
    uint64_t room = a->size - ((uintptr_t)h - a->base);
    if (n > room)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "%s range [%p, +%llu) runs past the end of its pinned allocation of %llu "
                   "bytes",
                   what, h, (unsigned long long)n, (unsigned long long)a->size);
    return CUDA_SUCCESS;
}

static void release_to_threshold(void)
{
    for (size_t i = 0; i < pools.n; i++) {
        fake_pool *p = pools.items[i];
        uint64_t reserved = p->used + p->cached;
        if (reserved > p->threshold) {
            uint64_t drop = reserved - p->threshold;
            p->cached -= drop < p->cached ? drop : p->cached;
        }
    }
}

static uint64_t cached_total(void)
{
    uint64_t c = 0;
    for (size_t i = 0; i < pools.n; i++)
        c += ((fake_pool *)pools.items[i])->cached;
    return c;
}

/* ---- initialisation, errors, entry points --------------------------------------------- */

/* A bad SAFECUDA_TESTDEVICE_* value: cuInit fails (CUDA_ERROR_INVALID_VALUE) and the library
 * quotes this message (safecuda_testdevice_settings_error). */
static char settings_error[512];

EXPORT CUresult cuInit(unsigned flags)
{
    pthread_mutex_lock(&lock);
    CUresult r = CUDA_SUCCESS;
    if (flags != 0) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (settings_error[0]) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!initialized) {
        td_settings s = {.total_bytes = 4096ull << 20,
                         .host_limit = 1024ull << 20,
                         .n_devices = 1,
                         .compute_capability = 90,
                         .driver_version = 13000};
        if (!td_read_settings(&s, settings_error, sizeof settings_error)) {
            r = CUDA_ERROR_INVALID_VALUE;
        } else {
            total_bytes = s.total_bytes;
            host_limit = s.host_limit;
            n_devices = s.n_devices;
            compute_capability = s.compute_capability;
            abort_on_misuse = s.abort_on_misuse;
            driver_version = s.driver_version;
            accept_launches = s.accept_launches;
            initialized = 1;
        }
    }
    if (r == CUDA_SUCCESS && n_devices == 0)
        r = CUDA_ERROR_NO_DEVICE;
    pthread_mutex_unlock(&lock);
    return r;
}

/* The message of a bad setting (cuInit failed for it), else NULL. */
EXPORT const char *safecuda_testdevice_settings_error(void)
{
    pthread_mutex_lock(&lock);
    const char *e = settings_error[0] ? settings_error : NULL;
    pthread_mutex_unlock(&lock);
    return e;
}

/* Every row of SCI_CU_FUNCS has an implementation f_<name> with exactly the row's
 * signature (a mismatch is a compile error here). */
#define FAKE_PROTO(name, ver, req, params, args) static CUresult f_##name params;
SCI_CU_FUNCS(FAKE_PROTO)
#undef FAKE_PROTO

static CUresult f_cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    *v = driver_version;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* The names and texts of src/driver/cu_errors.h, the list the library's built-in table is
 * made from too. */
#define ERROR_ROW(name, value, text) {name, #name, text},
static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {SCI_CU_ERRORS(ERROR_ROW)};
#undef ERROR_ROW

/* CUDA_ERROR_NOT_SUPPORTED is mostly a refused launch (or graph launch): its text says why,
 * and the library quotes it in its message. (A launch attribute the test device does not
 * know, a cluster before sm_90 and a cooperative launch before sm_60 answer it too.) */
#define LAUNCH_REFUSED_TEXT                                                                  \
    "operation not supported: kernels do not run on the safecuda test device (device "       \
    "memory is host memory; run the kernels on a GPU)"

static CUresult error_text(CUresult e, const char **s, int which)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    if (e == CUDA_ERROR_NOT_SUPPORTED && which) {
        *s = LAUNCH_REFUSED_TEXT;
        return CUDA_SUCCESS;
    }
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == e) {
            *s = which ? errors[i].text : errors[i].name;
            return CUDA_SUCCESS;
        }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult f_cuGetErrorName(CUresult e, const char **s) { return error_text(e, s, 0); }
static CUresult f_cuGetErrorString(CUresult e, const char **s) { return error_text(e, s, 1); }

/* Exported too: the loader dlsym's cuInit and cuDriverGetVersion (and cuGetErrorName). */
EXPORT CUresult cuDriverGetVersion(int *v) { return f_cuDriverGetVersion(v); }
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) { return f_cuGetErrorName(e, s); }
EXPORT CUresult cuGetErrorString(CUresult e, const char **s) { return f_cuGetErrorString(e, s); }

/* ---- devices ------------------------------------------------------------------------------ */

#define FAKE_DEVICE_NAME "safecuda test device (host memory, runs no kernels)"

static CUresult device_ok(CUdevice d, const char *fn)
{
    CUresult r = need_init(fn);
    if (r != CUDA_SUCCESS)
        return r;
    if (d < 0 || d >= n_devices)
        return bad(CUDA_ERROR_INVALID_DEVICE, fn, "device %d does not exist", d);
    return CUDA_SUCCESS;
}

static CUresult f_cuDeviceGetCount(int *n)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuDeviceGetCount");
    if (r == CUDA_SUCCESS && !n)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount", "NULL count");
    if (r == CUDA_SUCCESS)
        *n = n_devices;
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuDeviceGet(CUdevice *d, int ordinal)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuDeviceGet");
    if (r == CUDA_SUCCESS && !d)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet", "NULL device");
    else if (r == CUDA_SUCCESS && (ordinal < 0 || ordinal >= n_devices))
        r = CUDA_ERROR_INVALID_DEVICE; /* asking is allowed: not misuse */
    else if (r == CUDA_SUCCESS)
        *d = ordinal;
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuDeviceGetName(char *name, int len, CUdevice d)
{
    pthread_mutex_lock(&lock);
    CUresult r = device_ok(d, "cuDeviceGetName");
    if (r == CUDA_SUCCESS && (!name || len <= 0))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName", "NULL name or length %d", len);
    else if (r == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "%s", FAKE_DEVICE_NAME);
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    pthread_mutex_lock(&lock);
    CUresult r = device_ok(d, "cuDeviceGetUuid");
    if (r == CUDA_SUCCESS && !u)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetUuid", "NULL uuid");
    else if (r == CUDA_SUCCESS) {
        static const unsigned char id[16] = {0xfa, 0x4e, 0x0d, 0x3e, 0x5a, 0xfe, 0xc0, 0xda,
                                             0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01};
        memcpy(u->bytes, id, 16);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuDeviceGetPCIBusId(char *id, int len, CUdevice d)
{
    pthread_mutex_lock(&lock);
    CUresult r = device_ok(d, "cuDeviceGetPCIBusId");
    if (r == CUDA_SUCCESS && (!id || len <= 0))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetPCIBusId", "NULL id or length %d", len);
    else if (r == CUDA_SUCCESS)
        snprintf(id, (size_t)len, "0000:FA:00.0");
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuDeviceTotalMem(size_t *bytes, CUdevice d)
{
    pthread_mutex_lock(&lock);
    CUresult r = device_ok(d, "cuDeviceTotalMem");
    if (r == CUDA_SUCCESS && !bytes)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem", "NULL bytes");
    else if (r == CUDA_SUCCESS)
        *bytes = (size_t)total_bytes;
    pthread_mutex_unlock(&lock);
    return r;
}

static int attribute(CUdevice_attribute a, int *ok)
{
    *ok = 1;
    switch ((int)a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 48 * 1024;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: return 0;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return compute_capability / 10;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return compute_capability % 10;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 228 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 227 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return compute_capability >= 60;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return compute_capability >= 90;
    default: *ok = 0; return 0;
    }
}

static CUresult f_cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    pthread_mutex_lock(&lock);
    CUresult r = device_ok(d, "cuDeviceGetAttribute");
    int ok = 0;
    if (r == CUDA_SUCCESS && !v)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "NULL value");
    else if (r == CUDA_SUCCESS) {
        int value = attribute(a, &ok);
        if (ok)
            *v = value;
        else
            r = CUDA_ERROR_INVALID_VALUE; /* an attribute the test device does not know */
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- contexts ------------------------------------------------------------------------------ */

static CUresult f_cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    pthread_mutex_lock(&lock);
    CUresult r = device_ok(d, "cuDevicePrimaryCtxRetain");
    if (r == CUDA_SUCCESS && !c)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain", "NULL context");
    else if (r == CUDA_SUCCESS) {
        primary.refcount++;
        *c = (CUcontext)(void *)&primary;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static void reclaim_device_memory(void)
{
    size_t k = 0;
    for (size_t i = 0; i < n_allocs; i++) {
        if (!allocs[i].is_host) {
            if (allocs[i].pool && set_has(&pools, allocs[i].pool))
                allocs[i].pool->used -= allocs[i].size;
            device_used -= allocs[i].size;
            live_device--;
            reclaimed_allocations++;
            free((void *)allocs[i].base);
        } else {
            allocs[k++] = allocs[i];
        }
    }
    n_allocs = k;
}

static CUresult f_cuDevicePrimaryCtxRelease(CUdevice d)
{
    pthread_mutex_lock(&lock);
    CUresult r = device_ok(d, "cuDevicePrimaryCtxRelease");
    if (r == CUDA_SUCCESS && primary.refcount <= 0)
        r = bad(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease",
                "the primary context is not retained");
    else if (r == CUDA_SUCCESS && --primary.refcount == 0) {
        primary_releases_to_zero++;
        if (reclaim_on_release)
            reclaim_device_memory();
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuDevicePrimaryCtxGetState(CUdevice d, unsigned *flags, int *active)
{
    pthread_mutex_lock(&lock);
    CUresult r = device_ok(d, "cuDevicePrimaryCtxGetState");
    if (r == CUDA_SUCCESS && (!flags || !active))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxGetState", "NULL out-pointer");
    else if (r == CUDA_SUCCESS) {
        *flags = 0;
        *active = primary.refcount > 0;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuCtxSetCurrent(CUcontext c)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuCtxSetCurrent");
    if (r == CUDA_SUCCESS && c && (fake_ctx *)(void *)c != &primary)
        r = bad(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", "unknown context %p", (void *)c);
    else if (r == CUDA_SUCCESS)
        current = (fake_ctx *)(void *)c;
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuCtxGetCurrent(CUcontext *c)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuCtxGetCurrent");
    if (r == CUDA_SUCCESS && !c)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuCtxGetCurrent", "NULL context");
    else if (r == CUDA_SUCCESS)
        *c = (CUcontext)(void *)current;
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuCtxSynchronize(void)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuCtxSynchronize");
    if (r == CUDA_SUCCESS) /* the context holds a capturing stream: no capture survives it */
        r = td_capture_unsafe("cuCtxSynchronize", 1);
    if (r == CUDA_SUCCESS)
        release_to_threshold();
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuCtxGetStreamPriorityRange");
    if (r == CUDA_SUCCESS) {
        if (least)
            *least = 0;
        if (greatest)
            *greatest = -5;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- memory ------------------------------------------------------------------------------- */

static CUresult f_cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuMemGetInfo");
    if (r == CUDA_SUCCESS && (!free_bytes || !total))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemGetInfo", "NULL out-pointer");
    else if (r == CUDA_SUCCESS) {
        uint64_t held = device_used + cached_total();
        *free_bytes = (size_t)(held < total_bytes ? total_bytes - held : 0);
        *total = (size_t)total_bytes;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static int push_alloc(fake_alloc a)
{
    if (n_allocs == cap_allocs) {
        size_t cap = cap_allocs ? cap_allocs * 2 : 64;
        fake_alloc *grown = realloc(allocs, cap * sizeof *grown);
        if (!grown)
            return 0;
        allocs = grown;
        cap_allocs = cap;
    }
    allocs[n_allocs++] = a;
    return 1;
}

/* Allocate n bytes of "device" memory (lock held), from pool or not. */
static CUresult device_alloc(CUdeviceptr *p, size_t n, fake_pool *pool, const char *fn)
{
    if (!p)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL out-pointer");
    if (n == 0)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "0 bytes asked");
    uint64_t from_cache = 0;
    if (pool && pool->cached >= n)
        from_cache = n; /* reuse the pool's cached memory */
    uint64_t held = device_used + cached_total() - from_cache;
    if (n > total_bytes || held > total_bytes - n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *mem = NULL;
    if (posix_memalign(&mem, 256, n) != 0 || !mem)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!push_alloc((fake_alloc){.base = (uintptr_t)mem, .size = n, .pool = pool})) {
        free(mem);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (pool) {
        pool->cached -= from_cache;
        pool->used += n;
        if (pool->used > pool->used_high)
            pool->used_high = pool->used;
        if (pool->used + pool->cached > pool->reserved_high)
            pool->reserved_high = pool->used + pool->cached;
    }
    device_used += n;
    live_device++;
    *p = (CUdeviceptr)(uintptr_t)mem;
    return CUDA_SUCCESS;
}

static CUresult device_free(CUdeviceptr p, int to_pool, const char *fn)
{
    fake_alloc *a = find_base((uintptr_t)p);
    if (!a || a->is_host) {
        fake_alloc *in = find_alloc((uintptr_t)p);
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "0x%llx is not a live device allocation%s",
                   (unsigned long long)p,
                   in ? (in->is_host ? " (it is pinned host memory)"
                                     : " (it points inside one, not at its start)")
                      : "");
    }
    if (a->pool && set_has(&pools, a->pool)) {
        a->pool->used -= a->size;
        if (to_pool)
            a->pool->cached += a->size;
    }
    device_used -= a->size;
    live_device--;
    free((void *)a->base);
    *a = allocs[--n_allocs];
    return CUDA_SUCCESS;
}

static CUresult f_cuMemAlloc(CUdeviceptr *p, size_t n)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuMemAlloc");
    if (r == CUDA_SUCCESS)
        r = td_capture_unsafe("cuMemAlloc", 0);
    if (r == CUDA_SUCCESS)
        r = device_alloc(p, n, NULL, "cuMemAlloc");
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemFree(CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuMemFree");
    if (r == CUDA_SUCCESS)
        r = td_capture_unsafe("cuMemFree", 0);
    if (r == CUDA_SUCCESS)
        r = device_free(p, 0, "cuMemFree");
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult pool_ok(CUmemoryPool p, const char *fn)
{
    if (!set_has(&pools, p))
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "unknown or destroyed pool %p", (void *)p);
    return CUDA_SUCCESS;
}

static CUresult f_cuMemPoolCreate(CUmemoryPool *p, const CUmemPoolProps *props)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuMemPoolCreate");
    if (r == CUDA_SUCCESS && (!p || !props))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemPoolCreate", "NULL argument");
    else if (r == CUDA_SUCCESS &&
             (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
              props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->location.id < 0 ||
              props->location.id >= n_devices))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemPoolCreate",
                "bad props (allocType %d, location type %d id %d)", (int)props->allocType,
                (int)props->location.type, props->location.id);
    else if (r == CUDA_SUCCESS) {
        fake_pool *pool = calloc(1, sizeof *pool);
        if (!pool || !set_add(&pools, pool)) {
            free(pool);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            pool->magic = POOL_MAGIC;
            pool->reuse[0] = pool->reuse[1] = pool->reuse[2] = 1;
            *p = (CUmemoryPool)(void *)pool;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemPoolDestroy(CUmemoryPool p)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuMemPoolDestroy");
    if (r == CUDA_SUCCESS)
        r = pool_ok(p, "cuMemPoolDestroy");
    if (r == CUDA_SUCCESS) {
        /* As CUDA: outstanding allocations stay valid and are freed on their own. */
        fake_pool *pool = (fake_pool *)(void *)p;
        for (size_t i = 0; i < n_allocs; i++)
            if (allocs[i].pool == pool)
                allocs[i].pool = NULL;
        set_remove(&pools, pool);
        free(pool);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuMemPoolSetAttribute");
    if (r == CUDA_SUCCESS)
        r = pool_ok(p, "cuMemPoolSetAttribute");
    if (r == CUDA_SUCCESS && !v)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemPoolSetAttribute", "NULL value");
    if (r == CUDA_SUCCESS) {
        fake_pool *pool = (fake_pool *)(void *)p;
        switch ((int)a) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            pool->reuse[(int)a - 1] = *(int *)v;
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            pool->threshold = *(cuuint64_t *)v;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            if (*(cuuint64_t *)v != 0)
                r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemPoolSetAttribute",
                        "a high-water mark may only be reset to 0");
            else if ((int)a == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
                pool->reserved_high = pool->used + pool->cached;
            else
                pool->used_high = pool->used;
            break;
        default:
            r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemPoolSetAttribute",
                    "attribute %d can't be set", (int)a);
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemPoolGetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuMemPoolGetAttribute");
    if (r == CUDA_SUCCESS)
        r = pool_ok(p, "cuMemPoolGetAttribute");
    if (r == CUDA_SUCCESS && !v)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemPoolGetAttribute", "NULL value");
    if (r == CUDA_SUCCESS) {
        fake_pool *pool = (fake_pool *)(void *)p;
        switch ((int)a) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            *(int *)v = pool->reuse[(int)a - 1];
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)v = pool->threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            *(cuuint64_t *)v = pool->used + pool->cached;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)v = pool->reserved_high; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)v = pool->used; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)v = pool->used_high; break;
        default:
            r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemPoolGetAttribute", "unknown attribute %d",
                    (int)a);
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemPoolTrimTo(CUmemoryPool p, size_t keep)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuMemPoolTrimTo");
    if (r == CUDA_SUCCESS)
        r = pool_ok(p, "cuMemPoolTrimTo");
    if (r == CUDA_SUCCESS) {
        fake_pool *pool = (fake_pool *)(void *)p;
        uint64_t reserved = pool->used + pool->cached;
        if (reserved > keep) {
            uint64_t drop = reserved - keep;
            pool->cached -= drop < pool->cached ? drop : pool->cached;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* Stream-ordered allocation on a capturing stream: CUDA records memory nodes, which the test
 * device does not model; safecuda never does it (its buffers outlive the graphs that use
 * them), so it is refused as misuse and invalidates the capture. */
static CUresult no_pool_capture(CUstream s, const char *fn)
{
    struct fake_capture *cap = NULL;
    CUresult r = td_capture_of(s, fn, &cap);
    if (r != CUDA_SUCCESS || !cap)
        return r;
    td_capture_failed(cap, fn);
    return bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn,
               "stream-ordered allocation or free on capturing stream %p (memory nodes are not "
               "modelled by the test device); the capture is invalidated",
               (void *)s);
}

static CUresult f_cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool,
                                          CUstream s)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuMemAllocFromPoolAsync");
    if (r == CUDA_SUCCESS)
        r = pool_ok(pool, "cuMemAllocFromPoolAsync");
    if (r == CUDA_SUCCESS)
        r = need_stream(s, "cuMemAllocFromPoolAsync");
    if (r == CUDA_SUCCESS)
        r = no_pool_capture(s, "cuMemAllocFromPoolAsync");
    if (r == CUDA_SUCCESS)
        r = device_alloc(p, n, (fake_pool *)(void *)pool, "cuMemAllocFromPoolAsync");
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuMemFreeAsync");
    if (r == CUDA_SUCCESS)
        r = need_stream(s, "cuMemFreeAsync");
    if (r == CUDA_SUCCESS)
        r = no_pool_capture(s, "cuMemFreeAsync");
    if (r == CUDA_SUCCESS)
        r = device_free(p, 1, "cuMemFreeAsync");
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemHostAlloc(void **p, size_t n, unsigned flags)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuMemHostAlloc");
    if (r == CUDA_SUCCESS)
        r = td_capture_unsafe("cuMemHostAlloc", 0);
    if (r == CUDA_SUCCESS && !p)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc", "NULL out-pointer");
    else if (r == CUDA_SUCCESS && n == 0)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc", "0 bytes asked");
    else if (r == CUDA_SUCCESS && (flags & ~0xfu))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc", "unknown flags 0x%x", flags);
    else if (r == CUDA_SUCCESS) {
        void *mem = NULL;
        if (n > host_limit || host_used > host_limit - n ||
            posix_memalign(&mem, 4096, n) != 0 || !mem) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (!push_alloc((fake_alloc){.base = (uintptr_t)mem, .size = n, .is_host = 1})) {
            free(mem);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            host_used += n;
            live_host++;
            *p = mem;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemFreeHost(void *p)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuMemFreeHost");
    if (r == CUDA_SUCCESS)
        r = td_capture_unsafe("cuMemFreeHost", 0);
    if (r == CUDA_SUCCESS) {
        fake_alloc *a = find_base((uintptr_t)p);
        if (!a || !a->is_host) {
            r = bad(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost",
                    "%p is not a live pinned host allocation", p);
        } else {
            host_used -= a->size;
            live_host--;
            free((void *)a->base);
            *a = allocs[--n_allocs];
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* A context that is not the primary one, for allocations a test marks as another
 * context's (only its address is used). */
static fake_ctx foreign_ctx = {CTX_MAGIC, 1};

/* The attributes safecuda asks about (CU_POINTER_ATTRIBUTE_*): the truth about the live
 * allocation that contains p, or what a test set. An address in no live allocation
 * (pageable memory, freed memory) is CUDA_ERROR_INVALID_VALUE, as CUDA answers; another
 * attribute is CUDA_ERROR_INVALID_VALUE too (not misuse: the test device knows only these). */
static CUresult f_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    static const char fn[] = "cuPointerGetAttribute";
    pthread_mutex_lock(&lock);
    CUresult r = need_init(fn);
    fake_alloc *a = NULL;
    if (r == CUDA_SUCCESS && !data)
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL data");
    else if (r == CUDA_SUCCESS && !(a = find_alloc((uintptr_t)p)))
        r = CUDA_ERROR_INVALID_VALUE; /* pageable or unknown memory, as CUDA */
    if (r != CUDA_SUCCESS) {
        pthread_mutex_unlock(&lock);
        return r;
    }
    const unsigned type = a->attrs_set ? a->memory_type : a->is_host ? CU_MEMORYTYPE_HOST
                                                                      : CU_MEMORYTYPE_DEVICE;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = type;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned char *)data = (unsigned char)(a->attrs_set && a->managed); /* a bool */
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a->attrs_set ? a->ordinal : 0;
        break;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = (CUcontext)(void *)(a->attrs_set && a->foreign_context ? &foreign_ctx
                                                                                   : &primary);
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = p; /* one address space (UVA): the same address */
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)a->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = (size_t)a->size;
        break;
    default:
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- copies and memsets (synchronous, or recorded while capturing) ----------------------- */

/* The end of a copy or memset (lock held): on a capturing stream the validated operation is
 * recorded as a node, else it has run; an error on a capturing stream invalidates it. */
static CUresult copy_done(CUresult r, struct fake_capture *cap, const char *fn)
{
    if (r != CUDA_SUCCESS && cap)
        td_capture_failed(cap, fn);
    return r;
}

static CUresult f_cuMemcpyHtoDAsync(CUdeviceptr d, const void *h, size_t n, CUstream s)
{
    static const char fn[] = "cuMemcpyHtoDAsync";
    struct fake_capture *cap = NULL;
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        r = td_capture_of(s, fn, &cap);
    if (r == CUDA_SUCCESS)
        r = device_range(d, n, fn, "destination");
    if (r == CUDA_SUCCESS)
        r = host_range(h, n, fn, "source");
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_copy(cap, s, COPY_HTOD, (uintptr_t)d, (uintptr_t)h, n, fn);
    else if (r == CUDA_SUCCESS && n)
        memmove((void *)(uintptr_t)d, h, n);
    r = copy_done(r, cap, fn);
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemcpyDtoHAsync(void *h, CUdeviceptr d, size_t n, CUstream s)
{
    static const char fn[] = "cuMemcpyDtoHAsync";
    struct fake_capture *cap = NULL;
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        r = td_capture_of(s, fn, &cap);
    if (r == CUDA_SUCCESS)
        r = device_range(d, n, fn, "source");
    if (r == CUDA_SUCCESS)
        r = host_range(h, n, fn, "destination");
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_copy(cap, s, COPY_DTOH, (uintptr_t)h, (uintptr_t)d, n, fn);
    else if (r == CUDA_SUCCESS && n)
        memmove(h, (const void *)(uintptr_t)d, n);
    r = copy_done(r, cap, fn);
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s)
{
    static const char fn[] = "cuMemcpyDtoDAsync";
    struct fake_capture *cap = NULL;
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        r = td_capture_of(s, fn, &cap);
    if (r == CUDA_SUCCESS)
        r = device_range(d, n, fn, "destination");
    if (r == CUDA_SUCCESS)
        r = device_range(src, n, fn, "source");
    if (r == CUDA_SUCCESS && n && d < src + n && src < d + n)
        r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                "overlapping ranges [0x%llx, +%zu) and [0x%llx, +%zu)", (unsigned long long)d, n,
                (unsigned long long)src, n);
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_copy(cap, s, COPY_DTOD, (uintptr_t)d, (uintptr_t)src, n, fn);
    else if (r == CUDA_SUCCESS && n)
        memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)src, n);
    r = copy_done(r, cap, fn);
    pthread_mutex_unlock(&lock);
    return r;
}

void fill_rows(uintptr_t d, size_t pitch, uint32_t v, size_t esize, size_t w, size_t h)
{
    for (size_t y = 0; y < h; y++) {
        unsigned char *p = (unsigned char *)(d + y * pitch);
        for (size_t x = 0; x < w; x++) {
            if (esize == 1)
                p[x] = (unsigned char)v;
            else if (esize == 2) {
                uint16_t v16 = (uint16_t)v;
                memcpy(p + 2 * x, &v16, 2);
            } else
                memcpy(p + 4 * x, &v, 4);
        }
    }
}

static CUresult memset_common(CUdeviceptr d, size_t pitch, uint32_t v, size_t esize, size_t w,
                              size_t h, CUstream s, const char *fn)
{
    struct fake_capture *cap = NULL;
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        r = td_capture_of(s, fn, &cap);
    if (r == CUDA_SUCCESS && d % esize)
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "address 0x%llx is not %zu-byte aligned",
                (unsigned long long)d, esize);
    size_t row = 0, span = 0;
    if (r == CUDA_SUCCESS && w && h) {
        if (__builtin_mul_overflow(w, esize, &row) ||
            (h > 1 && (pitch < row || pitch % esize)) ||
            __builtin_mul_overflow(h - 1, pitch, &span) ||
            __builtin_add_overflow(span, row, &span))
            r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                    "bad shape: %zu rows of %zu elements of %zu bytes, pitch %zu", h, w, esize,
                    pitch);
        else
            r = device_range(d, span, fn, "destination");
    }
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_memset(cap, s, (uintptr_t)d, pitch, v, esize, w, h, fn);
    else if (r == CUDA_SUCCESS && w && h)
        fill_rows((uintptr_t)d, pitch, v, esize, w, h);
    r = copy_done(r, cap, fn);
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    return memset_common(d, n, v, 1, n, 1, s, "cuMemsetD8Async");
}

static CUresult f_cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s)
{
    return memset_common(d, 2 * n, v, 2, n, 1, s, "cuMemsetD16Async");
}

static CUresult f_cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s)
{
    return memset_common(d, 4 * n, v, 4, n, 1, s, "cuMemsetD32Async");
}

static CUresult f_cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned v, size_t w,
                                     size_t h, CUstream s)
{
    return memset_common(d, pitch, v, 4, w, h, s, "cuMemsetD2D32Async");
}

/* ---- streams and events -------------------------------------------------------------------- */

static CUresult f_cuStreamCreateWithPriority(CUstream *s, unsigned flags, int prio)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuStreamCreateWithPriority");
    if (r == CUDA_SUCCESS && !s)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuStreamCreateWithPriority", "NULL out-pointer");
    else if (r == CUDA_SUCCESS && flags > CU_STREAM_NON_BLOCKING)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuStreamCreateWithPriority", "flags 0x%x", flags);
    else if (r == CUDA_SUCCESS) {
        fake_stream *st = calloc(1, sizeof *st);
        if (!st || !set_add(&streams, st)) {
            free(st);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            st->magic = STREAM_MAGIC;
            st->flags = flags;
            st->priority = prio < -5 ? -5 : prio > 0 ? 0 : prio;
            *s = (CUstream)(void *)st;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuStreamDestroy(CUstream s)
{
    static const char fn[] = "cuStreamDestroy";
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS && !set_has(&streams, s))
        r = bad(CUDA_ERROR_INVALID_HANDLE, fn, "unknown or destroyed stream %p", (void *)s);
    if (r == CUDA_SUCCESS)
        r = td_stream_destroy_check((fake_stream *)(void *)s, fn);
    if (r == CUDA_SUCCESS) {
        set_remove(&streams, s);
        td_stream_forget((fake_stream *)(void *)s);
        free(s);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* Synchronizing or querying a capturing stream: CUDA refuses it and invalidates the capture
 * (the stream stands for work in a graph, not for work that runs). */
static CUresult not_capturing(CUstream s, const char *fn)
{
    struct fake_capture *cap = NULL;
    CUresult r = td_capture_of(s, fn, &cap);
    if (r != CUDA_SUCCESS || !cap)
        return r;
    td_capture_failed(cap, fn);
    return bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn,
               "stream %p is capturing: it can't be synchronized or queried; the capture is "
               "invalidated",
               (void *)s);
}

static CUresult f_cuStreamSynchronize(CUstream s)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuStreamSynchronize");
    if (r == CUDA_SUCCESS)
        r = need_stream(s, "cuStreamSynchronize");
    if (r == CUDA_SUCCESS)
        r = not_capturing(s, "cuStreamSynchronize");
    if (r == CUDA_SUCCESS)
        release_to_threshold();
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuStreamQuery(CUstream s)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuStreamQuery");
    if (r == CUDA_SUCCESS)
        r = need_stream(s, "cuStreamQuery");
    if (r == CUDA_SUCCESS)
        r = not_capturing(s, "cuStreamQuery");
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuStreamGetCtx(CUstream s, CUcontext *c)
{
    static const char fn[] = "cuStreamGetCtx";
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS && !c)
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL context");
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS) {
        /* The built-in streams answer the current context, as CUDA does. A stream a test
         * moved to another context answers a context that is not the primary one. */
        static int other;
        int moved = (uintptr_t)s > 2 && ((fake_stream *)(void *)s)->other_context;
        *c = moved ? (CUcontext)(void *)&other : (CUcontext)(void *)current;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuStreamGetPriority(CUstream s, int *prio)
{
    static const char fn[] = "cuStreamGetPriority";
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS && !prio)
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL priority");
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        *prio = (uintptr_t)s > 2 ? ((fake_stream *)(void *)s)->priority : 0;
    pthread_mutex_unlock(&lock);
    return r;
}

/* For tests: make a live stream answer cuStreamGetCtx with a context other than the
 * primary one (a stream of a context another library created). 0 when s is not a live
 * stream of the test device. */
EXPORT int safecuda_testdevice_move_stream_to_other_context(CUstream s)
{
    pthread_mutex_lock(&lock);
    int ok = (uintptr_t)s > 2 && set_has(&streams, s);
    if (ok)
        ((fake_stream *)(void *)s)->other_context = 1;
    pthread_mutex_unlock(&lock);
    return ok;
}

CUresult event_ok(CUevent e, const char *fn)
{
    if (!set_has(&events, e))
        return bad(CUDA_ERROR_INVALID_HANDLE, fn, "unknown or destroyed event %p", (void *)e);
    return CUDA_SUCCESS;
}

static CUresult f_cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags)
{
    static const char fn[] = "cuStreamWaitEvent";
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        r = event_ok(e, fn);
    if (r == CUDA_SUCCESS && flags > 1 /* CU_EVENT_WAIT_EXTERNAL */)
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "flags 0x%x", flags);
    if (r == CUDA_SUCCESS)
        r = td_stream_wait(s, (fake_event *)(void *)e, flags, fn);
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuLaunchHostFunc(CUstream s, CUhostFn host, void *user)
{
    static const char fn[] = "cuLaunchHostFunc";
    struct fake_capture *cap = NULL;
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        r = td_capture_of(s, fn, &cap);
    if (r == CUDA_SUCCESS && !host)
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL function");
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_host(cap, s, host, user, fn);
    r = copy_done(r, cap, fn);
    pthread_mutex_unlock(&lock);
    if (r == CUDA_SUCCESS && !cap)
        host(user); /* streams are synchronous: the function runs now, outside the lock */
    return r;
}

static uint64_t event_serial;

static CUresult f_cuEventCreate(CUevent *e, unsigned flags)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuEventCreate");
    if (r == CUDA_SUCCESS && !e)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuEventCreate", "NULL out-pointer");
    else if (r == CUDA_SUCCESS && (flags & ~0x7u))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuEventCreate", "flags 0x%x", flags);
    else if (r == CUDA_SUCCESS) {
        fake_event *ev = calloc(1, sizeof *ev);
        if (!ev || !set_add(&events, ev)) {
            free(ev);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            ev->magic = EVENT_MAGIC;
            ev->flags = flags;
            ev->serial = ++event_serial;
            *e = (CUevent)(void *)ev;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuEventDestroy(CUevent e)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuEventDestroy");
    if (r == CUDA_SUCCESS && !set_remove(&events, e))
        r = bad(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy", "unknown or destroyed event %p",
                (void *)e);
    else if (r == CUDA_SUCCESS) {
        td_event_forget((fake_event *)(void *)e);
        free(e);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuEventRecord(CUevent e, CUstream s)
{
    static const char fn[] = "cuEventRecord";
    struct fake_capture *cap = NULL;
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = event_ok(e, fn);
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        r = td_capture_of(s, fn, &cap);
    if (r == CUDA_SUCCESS)
        r = td_event_record((fake_event *)(void *)e, cap, s);
    r = copy_done(r, cap, fn);
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuEventSynchronize(CUevent e)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuEventSynchronize");
    if (r == CUDA_SUCCESS)
        r = event_ok(e, "cuEventSynchronize");
    if (r == CUDA_SUCCESS)
        r = td_event_check((fake_event *)(void *)e, "cuEventSynchronize");
    if (r == CUDA_SUCCESS)
        release_to_threshold();
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuEventQuery(CUevent e)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuEventQuery");
    if (r == CUDA_SUCCESS)
        r = event_ok(e, "cuEventQuery");
    if (r == CUDA_SUCCESS)
        r = td_event_check((fake_event *)(void *)e, "cuEventQuery");
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuEventElapsedTime");
    if (r == CUDA_SUCCESS && !ms)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuEventElapsedTime", "NULL ms");
    if (r == CUDA_SUCCESS)
        r = event_ok(a, "cuEventElapsedTime");
    if (r == CUDA_SUCCESS)
        r = event_ok(b, "cuEventElapsedTime");
    if (r == CUDA_SUCCESS)
        r = td_event_check((fake_event *)(void *)a, "cuEventElapsedTime");
    if (r == CUDA_SUCCESS)
        r = td_event_check((fake_event *)(void *)b, "cuEventElapsedTime");
    if (r == CUDA_SUCCESS) {
        fake_event *ea = (fake_event *)(void *)a, *eb = (fake_event *)(void *)b;
        if ((ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING)
            r = bad(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime",
                    "an event was created with CU_EVENT_DISABLE_TIMING");
        else if (!ea->recorded || !eb->recorded)
            r = bad(CUDA_ERROR_INVALID_HANDLE, "cuEventElapsedTime",
                    "an event was never recorded");
        else
            *ms = 0.001f;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- modules: a small PTX reader ------------------------------------------------------------- */

static const char *skip_space(const char *p, const char *end)
{
    for (;;) {
        while (p < end && isspace((unsigned char)*p))
            p++;
        if (p + 1 < end && p[0] == '/' && p[1] == '/') {
            while (p < end && *p != '\n')
                p++;
        } else if (p + 1 < end && p[0] == '/' && p[1] == '*') {
            const char *c = p + 2;
            while (c + 1 < end && !(c[0] == '*' && c[1] == '/'))
                c++;
            p = c + 1 < end ? c + 2 : end;
        } else {
            return p;
        }
    }
}

/* The next token: a word of [A-Za-z0-9_.$%] or one punctuation character. */
static const char *token(const char *p, const char *end, const char **tok, size_t *len)
{
    p = skip_space(p, end);
    *tok = p;
    if (p >= end) {
        *len = 0;
        return p;
    }
    const char *q = p;
    while (q < end && (isalnum((unsigned char)*q) || *q == '_' || *q == '.' || *q == '$' ||
                       *q == '%'))
        q++;
    if (q == p)
        q++;
    *len = (size_t)(q - p);
    return q;
}

static int tok_is(const char *tok, size_t len, const char *word)
{
    return strlen(word) == len && memcmp(tok, word, len) == 0;
}

static size_t type_size(const char *tok, size_t len)
{
    static const struct {
        const char *name;
        size_t size;
    } types[] = {
        {".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8}, {".u32", 4}, {".s32", 4},
        {".b32", 4}, {".f32", 4}, {".u16", 2}, {".s16", 2}, {".b16", 2}, {".f16", 2},
        {".u8", 1},  {".s8", 1},  {".b8", 1},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (tok_is(tok, len, types[i].name))
            return types[i].size;
    return 0;
}

static void free_module(fake_module *m)
{
    for (int i = 0; i < m->n_funcs; i++) {
        set_remove(&funcs, m->funcs[i]);
        free(m->funcs[i]->name);
        free(m->funcs[i]);
    }
    free(m->funcs);
    free(m);
}

/* Parse the parameter list after "(" up to ")"; p points after "(". */
static const char *parse_params(const char *p, const char *end, fake_func *f, int *ok)
{
    size_t offset = 0;
    *ok = 0;
    for (;;) {
        const char *t;
        size_t n;
        p = token(p, end, &t, &n);
        if (n == 0)
            return p;
        if (tok_is(t, n, ")")) {
            *ok = 1;
            return p;
        }
        if (tok_is(t, n, ","))
            continue;
        if (!tok_is(t, n, ".param"))
            return p;
        size_t align = 0, size = 0, count = 1;
        int named = 0;
        for (;;) { /* the parameter's qualifiers, type, name and [N] */
            const char *save = p;
            p = token(p, end, &t, &n);
            if (n == 0)
                return p;
            if (tok_is(t, n, ",") || tok_is(t, n, ")")) {
                p = save;
                break;
            }
            if (tok_is(t, n, ".align")) {
                p = token(p, end, &t, &n);
                align = (size_t)strtoul(t, NULL, 10);
            } else if (type_size(t, n)) {
                size = type_size(t, n);
            } else if (tok_is(t, n, "[")) {
                p = token(p, end, &t, &n);
                count = (size_t)strtoul(t, NULL, 10);
                p = token(p, end, &t, &n); /* "]" */
            } else if (t[0] != '.') {
                named = 1;
            } /* .ptr, .global, ... : ignored */
        }
        if (!size || !named || f->n_params == MAX_PARAMS)
            return p;
        if (!align)
            align = size;
        offset = (offset + align - 1) / align * align;
        f->offset[f->n_params] = offset;
        f->size[f->n_params] = size * count;
        offset += size * count;
        f->n_params++;
    }
}

/* Up to three comma-separated numbers (the ones left out are 1). */
static const char *parse_dims(const char *p, const char *end, long dims[3])
{
    dims[0] = dims[1] = dims[2] = 1;
    for (int k = 0; k < 3; k++) {
        const char *t;
        size_t n;
        p = token(p, end, &t, &n);
        dims[k] = n ? strtol(t, NULL, 10) : 0;
        const char *save = p;
        p = token(p, end, &t, &n);
        if (!tok_is(t, n, ",")) {
            p = save;
            break;
        }
    }
    return p;
}

/* The PTX text's kernels; NULL on a parse error (no entry, bad parameter list). */
static fake_module *parse_ptx(const char *text, char *log, size_t log_size)
{
    const char *end = text + strlen(text);
    fake_module *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->magic = MODULE_MAGIC;
    int version = 0;
    const char *v = strstr(text, ".version");
    if (v) {
        unsigned major = 0, minor = 0;
        if (sscanf(v + 8, " %u.%u", &major, &minor) == 2)
            version = (int)(major * 10 + minor);
    }
    if (!v || !strstr(text, ".target")) {
        if (log)
            snprintf(log, log_size, "safecuda test device: not PTX (no .version / .target directive)");
        free(m);
        return NULL;
    }
    const char *p = text;
    for (;;) {
        const char *t;
        size_t n;
        p = token(p, end, &t, &n);
        if (n == 0)
            break;
        if (!tok_is(t, n, ".entry"))
            continue;
        const char *name;
        size_t name_len;
        p = token(p, end, &name, &name_len);
        fake_func *f = calloc(1, sizeof *f);
        fake_func **grown = realloc(m->funcs, (size_t)(m->n_funcs + 1) * sizeof *grown);
        if (!f || !grown || name_len == 0 || !(isalpha((unsigned char)name[0]) ||
                                               name[0] == '_' || name[0] == '$')) {
            free(f);
            if (grown)
                m->funcs = grown;
            if (log)
                snprintf(log, log_size, "safecuda test device: bad .entry name");
            free_module(m);
            return NULL;
        }
        m->funcs = grown;
        m->funcs[m->n_funcs++] = f;
        f->magic = FUNC_MAGIC;
        f->module = m;
        f->name = strndup(name, name_len);
        f->max_threads = 1024;
        f->ptx_version = version;
        const char *paren;
        size_t plen;
        const char *after = token(p, end, &paren, &plen);
        if (plen && tok_is(paren, plen, "(")) {
            int ok;
            p = parse_params(after, end, f, &ok);
            if (!ok) {
                if (log)
                    snprintf(log, log_size, "safecuda test device: bad parameter list of .entry %s",
                             f->name);
                free_module(m);
                return NULL;
            }
        }
        /* Performance directives up to the body: .maxntid X, Y, Z; the cluster a
         * __cluster_dims__ kernel requires (.reqnctapercluster X, Y, Z) and whether a
         * launch must give one (.explicitcluster). */
        for (;;) {
            const char *save = p;
            p = token(p, end, &t, &n);
            if (n == 0 || tok_is(t, n, "{") || tok_is(t, n, ";")) {
                p = save;
                break;
            }
            if (tok_is(t, n, ".maxntid") || tok_is(t, n, ".reqntid")) {
                long dims[3];
                p = parse_dims(p, end, dims);
                long prod = dims[0] * dims[1] * dims[2];
                if (prod > 0 && prod < f->max_threads)
                    f->max_threads = (int)prod;
            } else if (tok_is(t, n, ".reqnctapercluster")) {
                long dims[3];
                p = parse_dims(p, end, dims);
                for (int k = 0; k < 3; k++)
                    f->req_cluster[k] = dims[k] > 0 && dims[k] <= 1024 ? (unsigned)dims[k] : 0;
                f->req_cluster_in_ptx = 1;
            } else if (tok_is(t, n, ".explicitcluster")) {
                f->explicit_cluster = 1;
            }
        }
        /* Static shared memory in the body: .shared .align A .b8 NAME[N]; */
        const char *t2;
        size_t n2;
        const char *body = token(p, end, &t2, &n2);
        if (n2 && tok_is(t2, n2, "{")) {
            int depth = 1;
            const char *q = body;
            while (q < end && depth > 0) {
                q = token(q, end, &t2, &n2);
                if (n2 == 0)
                    break;
                if (tok_is(t2, n2, "{"))
                    depth++;
                else if (tok_is(t2, n2, "}"))
                    depth--;
                else if (tok_is(t2, n2, ".shared")) {
                    size_t size = 0, count = 1;
                    for (;;) {
                        q = token(q, end, &t2, &n2);
                        if (n2 == 0 || tok_is(t2, n2, ";"))
                            break;
                        if (type_size(t2, n2))
                            size = type_size(t2, n2);
                        else if (tok_is(t2, n2, "[")) {
                            q = token(q, end, &t2, &n2);
                            count = (size_t)strtoul(t2, NULL, 10);
                        }
                    }
                    f->static_shared += (int)(size * count);
                }
            }
            p = q;
        }
        f->max_dynamic_shared = 48 * 1024 - f->static_shared;
        if (f->max_dynamic_shared < 0)
            f->max_dynamic_shared = 0;
    }
    return m;
}

static void jit_log(unsigned n, CUjit_option *opts, void **vals, const char *msg)
{
    char *buf = NULL;
    size_t size = 0;
    for (unsigned i = 0; opts && vals && i < n; i++) {
        if (opts[i] == 5)
            buf = vals[i];
        else if (opts[i] == 6)
            size = (size_t)(uintptr_t)vals[i];
    }
    if (buf && size)
        snprintf(buf, size, "%s", msg);
}

static CUresult f_cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n,
                                     CUjit_option *opts, void **vals)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuModuleLoadDataEx");
    if (r == CUDA_SUCCESS)
        r = td_capture_unsafe("cuModuleLoadDataEx", 0);
    if (r == CUDA_SUCCESS && (!m || !image))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadDataEx", "NULL argument");
    else if (r == CUDA_SUCCESS && n && (!opts || !vals))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadDataEx", "%u options but NULL arrays", n);
    pthread_mutex_unlock(&lock);
    if (r != CUDA_SUCCESS)
        return r;
    const unsigned char *b = image;
    if ((b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') ||
        (b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba)) {
        jit_log(n, opts, vals, "safecuda test device: cubin and fatbin images can't be loaded (PTX only)");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    char log[256] = "";
    fake_module *mod = parse_ptx(image, log, sizeof log);
    if (!mod) {
        jit_log(n, opts, vals, log);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    pthread_mutex_lock(&lock);
    int ok = set_add(&modules, mod);
    static uint64_t func_serial;
    for (int i = 0; ok && i < mod->n_funcs; i++) {
        mod->funcs[i]->serial = ++func_serial;
        ok = set_add(&funcs, mod->funcs[i]);
    }
    if (!ok) {
        set_remove(&modules, mod);
        free_module(mod);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *m = (CUmodule)(void *)mod;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult module_ok(CUmodule m, const char *fn)
{
    if (!set_has(&modules, m))
        return bad(CUDA_ERROR_INVALID_HANDLE, fn, "unknown or unloaded module %p", (void *)m);
    return CUDA_SUCCESS;
}

static CUresult func_ok(CUfunction f, const char *fn)
{
    if (!set_has(&funcs, f))
        return bad(CUDA_ERROR_INVALID_HANDLE, fn,
                   "unknown function %p (or its module was unloaded)", (void *)f);
    return CUDA_SUCCESS;
}

static CUresult f_cuModuleUnload(CUmodule m)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuModuleUnload");
    if (r == CUDA_SUCCESS)
        r = module_ok(m, "cuModuleUnload");
    if (r == CUDA_SUCCESS)
        r = td_capture_unsafe("cuModuleUnload", 0);
    if (r == CUDA_SUCCESS) {
        set_remove(&modules, m);
        free_module((fake_module *)(void *)m);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuModuleGetFunction");
    if (r == CUDA_SUCCESS)
        r = module_ok(m, "cuModuleGetFunction");
    if (r == CUDA_SUCCESS && (!f || !name))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction", "NULL argument");
    if (r == CUDA_SUCCESS) {
        fake_module *mod = (fake_module *)(void *)m;
        r = CUDA_ERROR_NOT_FOUND;
        for (int i = 0; i < mod->n_funcs; i++)
            if (strcmp(mod->funcs[i]->name, name) == 0) {
                *f = (CUfunction)(void *)mod->funcs[i];
                r = CUDA_SUCCESS;
                break;
            }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuModuleGetFunctionCount(unsigned *n, CUmodule m)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuModuleGetFunctionCount");
    if (r == CUDA_SUCCESS)
        r = module_ok(m, "cuModuleGetFunctionCount");
    if (r == CUDA_SUCCESS && !n)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunctionCount", "NULL count");
    else if (r == CUDA_SUCCESS)
        *n = (unsigned)((fake_module *)(void *)m)->n_funcs;
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuModuleEnumerateFunctions(CUfunction *fns, unsigned n, CUmodule m)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuModuleEnumerateFunctions");
    if (r == CUDA_SUCCESS)
        r = module_ok(m, "cuModuleEnumerateFunctions");
    if (r == CUDA_SUCCESS && n && !fns)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuModuleEnumerateFunctions", "NULL array");
    else if (r == CUDA_SUCCESS) {
        fake_module *mod = (fake_module *)(void *)m;
        for (unsigned i = 0; i < n && i < (unsigned)mod->n_funcs; i++)
            fns[i] = (CUfunction)(void *)mod->funcs[i];
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuFuncGetName(const char **name, CUfunction f)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuFuncGetName");
    if (r == CUDA_SUCCESS)
        r = func_ok(f, "cuFuncGetName");
    if (r == CUDA_SUCCESS && !name)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuFuncGetName", "NULL name");
    else if (r == CUDA_SUCCESS)
        *name = ((fake_func *)(void *)f)->name;
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuFuncGetAttribute");
    if (r == CUDA_SUCCESS)
        r = func_ok(f, "cuFuncGetAttribute");
    if (r == CUDA_SUCCESS && !v)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuFuncGetAttribute", "NULL value");
    if (r == CUDA_SUCCESS) {
        const fake_func *fu = (const fake_func *)(void *)f;
        switch ((int)a) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = fu->max_threads; break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = fu->static_shared; break;
        case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 16; break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION: *v = fu->ptx_version; break;
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = 90; break;
        case 7 /* CU_FUNC_ATTRIBUTE_CACHE_MODE_CA */: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = fu->max_dynamic_shared; break;
        case 9 /* CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT */: *v = -1; break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: *v = fu->explicit_cluster; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: *v = (int)fu->req_cluster[0]; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: *v = (int)fu->req_cluster[1]; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: *v = (int)fu->req_cluster[2]; break;
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
            *v = fu->non_portable_cluster;
            break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuFuncSetAttribute");
    if (r == CUDA_SUCCESS)
        r = func_ok(f, "cuFuncSetAttribute");
    if (r == CUDA_SUCCESS) {
        fake_func *fu = (fake_func *)(void *)f;
        if ((int)a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
            if (v < 0 || v > 227 * 1024 - fu->static_shared)
                r = bad(CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute",
                        "%d bytes of dynamic shared memory (at most %d)", v,
                        227 * 1024 - fu->static_shared);
            else
                fu->max_dynamic_shared = v;
        } else if ((int)a == CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) {
            if (v != 0 && v != 1)
                r = bad(CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute",
                        "NON_PORTABLE_CLUSTER_SIZE_ALLOWED is 0 or 1, not %d", v);
            else
                fu->non_portable_cluster = v;
        } else if ((int)a >= CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH &&
                   (int)a <= CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH) {
            if (fu->req_cluster_in_ptx) /* as CUDA: a compile-time cluster is fixed */
                r = bad(CUDA_ERROR_NOT_PERMITTED, "cuFuncSetAttribute",
                        "kernel %s was compiled with its cluster (.reqnctapercluster)", fu->name);
            else if (v < 0 || v > 1024)
                r = bad(CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute",
                        "required cluster dimension %d", v);
            else
                fu->req_cluster[(int)a - CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH] = (unsigned)v;
        } else if ((int)a != 9) {
            r = bad(CUDA_ERROR_INVALID_VALUE, "cuFuncSetAttribute", "attribute %d can't be set",
                    (int)a);
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_init("cuFuncGetParamInfo");
    if (r == CUDA_SUCCESS)
        r = func_ok(f, "cuFuncGetParamInfo");
    if (r == CUDA_SUCCESS) {
        const fake_func *fu = (const fake_func *)(void *)f;
        if (i >= (size_t)fu->n_params) {
            r = CUDA_ERROR_INVALID_VALUE; /* how callers find the count: not misuse */
        } else {
            if (off)
                *off = fu->offset[i];
            if (size)
                *size = fu->size[i];
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* Tensor maps: tensor_map.c. */
static CUresult f_cuTensorMapEncodeTiled(CUtensorMap *map, int dtype, cuuint32_t rank,
                                         void *address, const cuuint64_t *dims,
                                         const cuuint64_t *strides, const cuuint32_t *box,
                                         const cuuint32_t *element_strides, int interleave,
                                         int swizzle, int l2_promotion, int oob_fill)
{
    return td_cuTensorMapEncodeTiled(map, dtype, rank, address, dims, strides, box,
                                     element_strides, interleave, swizzle, l2_promotion,
                                     oob_fill);
}

/* Resident blocks per SM of a kernel (16 registers a thread, as the attributes say). */
static int occupancy(const fake_func *f, int block, size_t dyn)
{
    if (block <= 0 || block > f->max_threads)
        return 0;
    int warps = (block + 31) / 32;
    int by_threads = 2048 / (warps * 32);
    int by_regs = 65536 / (warps * 32 * 16);
    size_t shared = dyn + (size_t)f->static_shared + 1024; /* 1 KiB reserved per block */
    int by_shared = (int)((size_t)(228 * 1024) / shared);
    int n = by_threads;
    if (by_regs < n)
        n = by_regs;
    if (by_shared < n)
        n = by_shared;
    if (n > 32)
        n = 32;
    return n;
}

static CUresult f_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block,
                                                             size_t dyn)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuOccupancyMaxActiveBlocksPerMultiprocessor");
    if (r == CUDA_SUCCESS)
        r = func_ok(f, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    if (r == CUDA_SUCCESS && !n)
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                "NULL out-pointer");
    else if (r == CUDA_SUCCESS)
        *n = occupancy((const fake_func *)(void *)f, block, dyn);
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuOccupancyMaxPotentialBlockSize(int *grid, int *block, CUfunction f,
                                                   CUoccupancyB2DSize fn, size_t dyn, int limit)
{
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx("cuOccupancyMaxPotentialBlockSize");
    if (r == CUDA_SUCCESS)
        r = func_ok(f, "cuOccupancyMaxPotentialBlockSize");
    if (r == CUDA_SUCCESS && (!grid || !block))
        r = bad(CUDA_ERROR_INVALID_VALUE, "cuOccupancyMaxPotentialBlockSize", "NULL out-pointer");
    fake_func copy;
    if (r == CUDA_SUCCESS)
        copy = *(const fake_func *)(void *)f;
    pthread_mutex_unlock(&lock);
    if (r != CUDA_SUCCESS)
        return r;
    int max = copy.max_threads;
    if (limit > 0 && limit < max)
        max = limit;
    int best = 0, best_block = 32;
    for (int b = 32; b <= max; b += 32) {
        int blocks = occupancy(&copy, b, fn ? fn(b) : dyn);
        if (blocks * b >= best && blocks > 0) {
            best = blocks * b;
            best_block = b;
        }
    }
    *block = best_block;
    *grid = best / best_block * 132;
    return CUDA_SUCCESS;
}

/* The largest cluster a launch of f may use: the kernel's compiled cluster when it has one;
 * else 8 (the portable size), or 16 (an H100's non-portable maximum) once non-portable sizes
 * are allowed on f. Both are read through cuFuncGetAttribute, so this follows whatever the
 * function attributes model (an attribute they do not answer counts as 0). */
static CUresult f_cuOccupancyMaxPotentialClusterSize(int *size, CUfunction f,
                                                     const CUlaunchConfig *c)
{
    static const char fn[] = "cuOccupancyMaxPotentialClusterSize";
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = func_ok(f, fn);
    if (r == CUDA_SUCCESS && (!size || !c))
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL %s", size ? "config" : "out-pointer");
    pthread_mutex_unlock(&lock);
    if (r != CUDA_SUCCESS)
        return r;
    int dims[3] = {0, 0, 0}, non_portable = 0;
    for (int i = 0; i < 3; i++)
        if (f_cuFuncGetAttribute(&dims[i], (CUfunction_attribute)(11 + i), f) != CUDA_SUCCESS)
            dims[i] = 0; /* CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH + i */
    if (f_cuFuncGetAttribute(&non_portable, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                             f) != CUDA_SUCCESS)
        non_portable = 0;
    if (dims[0] > 0 && dims[1] > 0 && dims[2] > 0)
        *size = dims[0] * dims[1] * dims[2];
    else
        *size = non_portable ? 16 : 8;
    return CUDA_SUCCESS;
}

/* The number of SMs, and how clusters are placed: inside GPCs, modelled as 8 of 16 SMs. */
#define SM_COUNT 132
#define GPC_COUNT 8
#define SMS_PER_GPC 16

/* The cluster a launch of fu runs with (lock held): dims, all 0 for none. Misuse: a zero
 * dimension, a cluster other than the one the kernel was compiled with, a partly set
 * required cluster, none for a kernel that needs one, any on a device before sm_90. */
static CUresult launch_cluster(const fake_func *fu, const launch_attrs *a, unsigned dims[3],
                               const char *fn)
{
    const unsigned *req = fu->req_cluster;
    int req_any = req[0] || req[1] || req[2], req_all = req[0] && req[1] && req[2];
    dims[0] = dims[1] = dims[2] = 0;
    if (req_any && !req_all)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "kernel %s: required cluster %ux%ux%u mixes zero and non-zero dimensions",
                   fu->name, req[0], req[1], req[2]);
    if (a->has_cluster) {
        const unsigned *c = a->cluster;
        if (!c[0] || !c[1] || !c[2])
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s: cluster %ux%ux%u has a zero",
                       fu->name, c[0], c[1], c[2]);
        if (req_all && (c[0] != req[0] || c[1] != req[1] || c[2] != req[2]))
            return bad(CUDA_ERROR_INVALID_VALUE, fn,
                       "kernel %s: cluster %ux%ux%u, but the kernel requires %ux%ux%u", fu->name,
                       c[0], c[1], c[2], req[0], req[1], req[2]);
        memcpy(dims, c, 3 * sizeof *dims);
    } else if (req_all) {
        memcpy(dims, req, 3 * sizeof *dims);
    } else if (fu->explicit_cluster) {
        return bad(CUDA_ERROR_INVALID_CLUSTER_SIZE, fn,
                   "kernel %s must be launched with a cluster dimension (.explicitcluster)",
                   fu->name);
    } else {
        return CUDA_SUCCESS;
    }
    if (compute_capability < 90)
        return bad(CUDA_ERROR_NOT_SUPPORTED, fn,
                   "kernel %s: thread block clusters need compute capability 9.0 (the device "
                   "reports %d.%d)",
                   fu->name, compute_capability / 10, compute_capability % 10);
    return CUDA_SUCCESS;
}

/* The most blocks a cluster may have: 8 (portable), 16 with NON_PORTABLE_CLUSTER_SIZE_ALLOWED. */
static unsigned cluster_limit(const fake_func *fu) { return fu->non_portable_cluster ? 16 : 8; }

/* A launch's checks (lock held), the same with or without capture. */
static CUresult check_launch(const fake_func *fu, const unsigned g[3], const unsigned b[3],
                             unsigned shared, void **params, void **extra,
                             const launch_attrs *a, const char *fn)
{
    uint64_t threads = (uint64_t)b[0] * b[1] * b[2];
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2])
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s: grid %ux%ux%u block %ux%ux%u",
                   fu->name, g[0], g[1], g[2], b[0], b[1], b[2]);
    if (g[0] > 2147483647u || g[1] > 65535 || g[2] > 65535 || b[0] > 1024 || b[1] > 1024 ||
        b[2] > 64 || threads > (uint64_t)fu->max_threads)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "kernel %s: grid %ux%ux%u block %ux%ux%u exceeds the limits", fu->name, g[0],
                   g[1], g[2], b[0], b[1], b[2]);
    if (shared > (unsigned)fu->max_dynamic_shared)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "kernel %s: %u bytes of dynamic shared memory (limit %d)", fu->name, shared,
                   fu->max_dynamic_shared);
    unsigned c[3];
    CUresult r = launch_cluster(fu, a, c, fn);
    if (r != CUDA_SUCCESS)
        return r;
    if (c[0] && (g[0] % c[0] || g[1] % c[1] || g[2] % c[2]))
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "kernel %s: grid %ux%ux%u is not a whole number of %ux%ux%u clusters",
                   fu->name, g[0], g[1], g[2], c[0], c[1], c[2]);
    if (c[0] && c[0] * c[1] * c[2] > cluster_limit(fu))
        return bad(CUDA_ERROR_INVALID_CLUSTER_SIZE, fn,
                   "kernel %s: a cluster of %ux%ux%u = %u blocks, more than %u%s", fu->name, c[0],
                   c[1], c[2], c[0] * c[1] * c[2], cluster_limit(fu),
                   fu->non_portable_cluster ? "" : " (the portable size; see "
                                                   "NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
    if (a->cooperative) {
        if (compute_capability < 60)
            return bad(CUDA_ERROR_NOT_SUPPORTED, fn,
                       "kernel %s: cooperative launches need compute capability 6.0", fu->name);
        uint64_t blocks = (uint64_t)g[0] * g[1] * g[2];
        uint64_t per_sm = (uint64_t)occupancy(fu, (int)threads, shared);
        if (blocks > per_sm * SM_COUNT)
            return bad(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, fn,
                       "kernel %s: a cooperative grid of %llu blocks; at most %llu can be "
                       "resident (%llu a multiprocessor x %d)",
                       fu->name, (unsigned long long)blocks,
                       (unsigned long long)(per_sm * SM_COUNT), (unsigned long long)per_sm,
                       SM_COUNT);
    }
    if (extra)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s: 'extra' is not supported", fu->name);
    if (fu->n_params > 0 && !params)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s has %d parameters but params is NULL",
                   fu->name, fu->n_params);
    for (int i = 0; i < fu->n_params; i++)
        if (!params[i])
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s: params[%d] is NULL", fu->name, i);
    return CUDA_SUCCESS;
}

/* A launch: validated, then recorded on a capturing stream; otherwise nothing runs (this is
 * not a GPU), so it is refused, unless safecuda's own bookkeeping tests asked for launches
 * to be accepted without running. */
static CUresult launch(CUfunction f, const unsigned g[3], const unsigned b[3], unsigned shared,
                       CUstream s, void **params, void **extra, const launch_attrs *a,
                       const char *fn)
{
    struct fake_capture *cap = NULL;
    pthread_mutex_lock(&lock);
    CUresult r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = func_ok(f, fn);
    if (r == CUDA_SUCCESS)
        r = need_stream(s, fn);
    if (r == CUDA_SUCCESS)
        r = td_capture_of(s, fn, &cap);
    if (r == CUDA_SUCCESS)
        r = check_launch((const fake_func *)(void *)f, g, b, shared, params, extra, a, fn);
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_kernel(cap, s, (const fake_func *)(void *)f, g, b, shared, params, a, fn);
    else if (r == CUDA_SUCCESS && !accept_launches) {
        refused_launches++;
        r = CUDA_ERROR_NOT_SUPPORTED;
    }
    r = copy_done(r, cap, fn);
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult f_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                 CUstream s, void **params, void **extra)
{
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    const launch_attrs none = {0};
    return launch(f, g, b, shared, s, params, extra, &none, "cuLaunchKernel");
}

/* The attributes of an extensible launch the test device knows: cooperative, cluster
 * dimension, programmatic stream serialization (which changes nothing here). Another
 * attribute is CUDA_ERROR_NOT_SUPPORTED (not misuse: a newer caller may try it). */
static CUresult launch_attributes(const CUlaunchConfig *c, launch_attrs *a, const char *fn)
{
    memset(a, 0, sizeof *a);
    if (!c) {
        pthread_mutex_lock(&lock);
        CUresult r = bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL config");
        pthread_mutex_unlock(&lock);
        return r;
    }
    if (c->numAttrs && !c->attrs) {
        pthread_mutex_lock(&lock);
        CUresult r = bad(CUDA_ERROR_INVALID_VALUE, fn, "%u attributes, NULL list", c->numAttrs);
        pthread_mutex_unlock(&lock);
        return r;
    }
    for (unsigned i = 0; i < c->numAttrs; i++) {
        const CUlaunchAttribute *at = &c->attrs[i];
        switch (at->id) {
        case CU_LAUNCH_ATTRIBUTE_COOPERATIVE: a->cooperative = at->value.cooperative != 0; break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            a->has_cluster = 1;
            a->cluster[0] = at->value.clusterDim.x;
            a->cluster[1] = at->value.clusterDim.y;
            a->cluster[2] = at->value.clusterDim.z;
            break;
        case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
            a->programmatic = at->value.programmatic_stream_serialization_allowed != 0;
            break;
        default: return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult f_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                                   void **extra)
{
    launch_attrs a;
    CUresult r = launch_attributes(c, &a, "cuLaunchKernelEx");
    if (r != CUDA_SUCCESS)
        return r;
    const unsigned g[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    const unsigned b[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    return launch(f, g, b, c->sharedMemBytes, c->hStream, params, extra, &a, "cuLaunchKernelEx");
}

/* Clusters that can be resident at once. The model: clusters are placed inside GPCs (8 of
 * 16 SMs here), each GPC holds (16 x the kernel's blocks per SM) / cluster size of them;
 * 0 for a cluster larger than the kernel may launch (8, or 16 when non-portable sizes are
 * allowed). The cluster comes from the configuration or the kernel's compiled one. */
static CUresult f_cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c)
{
    static const char fn[] = "cuOccupancyMaxActiveClusters";
    launch_attrs a;
    CUresult r = launch_attributes(c, &a, fn);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    r = need_ctx(fn);
    if (r == CUDA_SUCCESS)
        r = func_ok(f, fn);
    if (r == CUDA_SUCCESS && !n)
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL out-pointer");
    unsigned dims[3] = {0, 0, 0};
    const fake_func *fu = (const fake_func *)(void *)f;
    if (r == CUDA_SUCCESS)
        r = launch_cluster(fu, &a, dims, fn);
    if (r == CUDA_SUCCESS && !dims[0])
        r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                "kernel %s: no cluster dimension in the configuration, and none compiled in",
                fu->name);
    if (r == CUDA_SUCCESS) {
        unsigned size = dims[0] * dims[1] * dims[2];
        uint64_t threads = (uint64_t)c->blockDimX * c->blockDimY * c->blockDimZ;
        int per_sm = threads > 1024 ? 0 : occupancy(fu, (int)threads, c->sharedMemBytes);
        *n = size > cluster_limit(fu) ? 0 : GPC_COUNT * (SMS_PER_GPC * per_sm / (int)size);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* ---- stream capture and graphs: capture.c ---------------------------------------------------- */

static CUresult f_cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    return td_cuStreamBeginCapture(s, mode);
}
static CUresult f_cuStreamEndCapture(CUstream s, CUgraph *g) { return td_cuStreamEndCapture(s, g); }
static CUresult f_cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
    return td_cuStreamIsCapturing(s, st);
}
static CUresult f_cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    return td_cuStreamGetCaptureInfo(s, st, id);
}
static CUresult f_cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n)
{
    return td_cuGraphGetNodes(g, nodes, n);
}
static CUresult f_cuGraphDestroy(CUgraph g) { return td_cuGraphDestroy(g); }
static CUresult f_cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long fl)
{
    return td_cuGraphInstantiateWithFlags(e, g, fl);
}
static CUresult f_cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *i)
{
    return td_cuGraphExecUpdate(e, g, i);
}
static CUresult f_cuGraphLaunch(CUgraphExec e, CUstream s) { return td_cuGraphLaunch(e, s); }
static CUresult f_cuGraphExecDestroy(CUgraphExec e) { return td_cuGraphExecDestroy(e); }

/* ---- cuGetProcAddress ---------------------------------------------------------------------- */

/* Names are compared exactly. */
#define FAKE_ROW(name, ver, req, params, args) {#name, ver, (void *)f_##name},
static const struct {
    const char *name;
    int version;
    void *fn;
} table[] = {SCI_CU_FUNCS(FAKE_ROW)};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, int *symbolStatus)
{
    (void)flags;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, symbol) != 0)
            continue;
        if (cudaVersion < table[i].version) { /* the ABI asked for predates the entry */
            if (symbolStatus)
                *symbolStatus = 2; /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */
            return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = table[i].fn;
        if (symbolStatus)
            *symbolStatus = 0;
        return CUDA_SUCCESS;
    }
    if (symbolStatus)
        *symbolStatus = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return CUDA_ERROR_NOT_FOUND;
}

/* ---- for safecuda's own tests (counters, not an API) ----------------------------------------- */

#define COUNTER(type, name, expr) \
    EXPORT type name(void)        \
    {                             \
        pthread_mutex_lock(&lock); \
        type v_ = (type)(expr);   \
        pthread_mutex_unlock(&lock); \
        return v_;                \
    }

COUNTER(int, safecuda_testdevice_misuse_count, misuse)
COUNTER(long, safecuda_testdevice_live_device_allocations, live_device)
COUNTER(long, safecuda_testdevice_live_host_allocations, live_host)
COUNTER(long, safecuda_testdevice_live_streams, streams.n)
COUNTER(long, safecuda_testdevice_live_events, events.n)
COUNTER(long, safecuda_testdevice_live_modules, modules.n)
COUNTER(long, safecuda_testdevice_live_pools, pools.n)
COUNTER(long, safecuda_testdevice_primary_refcount, primary.refcount)
COUNTER(long, safecuda_testdevice_primary_releases_to_zero, primary_releases_to_zero)
COUNTER(unsigned long long, safecuda_testdevice_device_used_bytes, device_used)
COUNTER(unsigned long long, safecuda_testdevice_pool_cached_bytes, cached_total())
COUNTER(long, safecuda_testdevice_reclaimed_allocations, reclaimed_allocations)
COUNTER(long, safecuda_testdevice_refused_launches, refused_launches)
COUNTER(long, safecuda_testdevice_live_graphs, td_live_graphs())
COUNTER(long, safecuda_testdevice_live_graph_execs, td_live_graph_execs())
COUNTER(long, safecuda_testdevice_active_captures, td_active_captures())

/* The last misuse's description ("" if none). */
EXPORT const char *safecuda_testdevice_last_misuse(void) { return last_misuse; }

/* Tests: make cuPointerGetAttribute describe the live allocation that starts at base as
 * memory_type (CU_MEMORYTYPE_*), managed or not, of device ordinal, in another context than
 * the primary one (foreign_context), so that a test reaches the refusals a one-device host
 * double otherwise never shows. 0 when base starts no live allocation. */
EXPORT int safecuda_testdevice_set_pointer_attributes(unsigned long long base, int memory_type,
                                                      int managed, int ordinal,
                                                      int foreign_context)
{
    pthread_mutex_lock(&lock);
    fake_alloc *a = find_base((uintptr_t)base);
    if (a) {
        a->attrs_set = 1;
        a->memory_type = (unsigned)memory_type;
        a->managed = managed;
        a->ordinal = ordinal;
        a->foreign_context = foreign_context;
    }
    pthread_mutex_unlock(&lock);
    return a != NULL;
}

/* Opt in to CUDA's behaviour on the primary context's last release: its device memory
 * is freed (counted by safecuda_testdevice_reclaimed_allocations). Off by default, so leaks show. */
EXPORT void safecuda_testdevice_set_reclaim_on_release(int on)
{
    pthread_mutex_lock(&lock);
    reclaim_on_release = on;
    pthread_mutex_unlock(&lock);
}
