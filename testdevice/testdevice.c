/* The safecuda test device: a stand-in for the CUDA driver (libcuda) for tests on machines
 * without a GPU. It is not a GPU and not an emulator: device memory is host memory, and
 * kernels never run. It exists so that a program's own tests (and safecuda's) can exercise
 * everything around the kernels -- allocation, copies, fills, streams, events, budgets,
 * leak reports, module loads, every argument check -- where there is no GPU.
 *
 * libsafecuda_testdevice.so implements the CUDA driver entry points safecuda resolves
 * (every row of SCI_CU_FUNCS in src/driver/cuda_api.h) on host memory: this file keeps the
 * state and the checks every entry point shares; device.c, memory.c, stream.c, module.c (with
 * ptx.c), capture.c, graph.c and tensor_map.c the entry points (testdevice_internal.h says
 * which file holds what). It is installed beside libsafecuda; select it with
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
 *     is the default; up to 8 devices, each with its primary context, sharing one memory:
 *     enough for the bookkeeping of multi-GPU code, safecuda's communicators);
 *     SAFECUDA_TESTDEVICE_DRIVER_VERSION=12030 (for example, 12000 .. 13000) reports an
 *     older driver, which lacks the entry points that came after that version;
 *     SAFECUDA_TESTDEVICE_CC=80 or 8.0 (major 5 .. 12, minor 0 .. 9) reports another compute
 *     capability (the other attributes stay the H100's); a value outside these forms, for
 *     any of the variables, makes cuInit fail and safecuda_testdevice_settings_error say
 *     which and what is accepted (settings.c), which the library quotes;
 *   - each device's primary context with a reference count (a release to 0 frees nothing
 *     by itself, it is only counted), a thread-local current context; streams, events,
 *     modules and allocations belong to the context current when they were made (pointer
 *     attributes say which); an event recorded on a stream of another context, a kernel
 *     launched on one, and a kernel of a module of a context that is not current are
 *     refused (CUDA_ERROR_INVALID_HANDLE, as CUDA); copies are not checked (CUDA copies
 *     between contexts' memory through unified addressing);
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
 *   - streams are synchronous: every copy, memset and host function runs at once; a stream
 *     can be held (hold.c: work that has not finished, for safecuda's NCCL test double):
 *     queries answer CUDA_ERROR_NOT_READY and synchronizations wait until it is released;
 *   - modules from PTX text only (module.c; read by ptx.c): `.entry NAME(` blocks and their
 *     `.param` lines give each kernel's parameter offsets and sizes (so the library's launch
 *     checks work);
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
 *   - graphs (graph.c): cuGraphGetNodes; cuGraphInstantiateWithFlags copies a graph into an
 *     executable graph; cuGraphLaunch runs its nodes in order at once (the streams are
 *     synchronous): copies and memsets move bytes, host functions run, kernel nodes are
 *     refused as launches are (the whole graph, before anything runs) unless launches are
 *     accepted (then they are skipped). cuGraphExecUpdate replaces the parameters when the
 *     topology (node count, each node's dependencies) and the node types are the same and
 *     the changes are ones CUDA 12 allows (a kernel node may change its function, not
 *     whether it is cooperative; a copy may not change direction; a 2D memset only its
 *     address and value), else CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE with TOPOLOGY_CHANGED,
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
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/cuda_api.h"
#include "testdevice_internal.h"

/* ---- state -------------------------------------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

int initialized;
int n_devices = 1;
uint64_t total_bytes = 4096ull << 20;
uint64_t host_limit = 1024ull << 20;
static int abort_on_misuse;
int compute_capability = 90;       /* SAFECUDA_TESTDEVICE_CC, e.g. 80 */
static int driver_version = 13000; /* SAFECUDA_TESTDEVICE_DRIVER_VERSION */
int accept_launches;               /* SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES=1 */
long refused_launches;

static long misuse;
static char last_misuse[512];

fake_ctx primaries[TD_MAX_DEVICES] = {
    {CTX_MAGIC, 0, 0}, {CTX_MAGIC, 0, 1}, {CTX_MAGIC, 0, 2}, {CTX_MAGIC, 0, 3},
    {CTX_MAGIC, 0, 4}, {CTX_MAGIC, 0, 5}, {CTX_MAGIC, 0, 6}, {CTX_MAGIC, 0, 7}};

long primary_refcount_total(void)
{
    long n = 0;
    for (int d = 0; d < TD_MAX_DEVICES; d++)
        n += primaries[d].refcount;
    return n;
}
long primary_releases_to_zero;
int reclaim_on_release; /* opt-in: a release to 0 frees device memory (as CUDA) */
long reclaimed_allocations;
_Thread_local fake_ctx *current;

ptr_set pools, modules;
ptr_set streams, events, funcs;
fake_alloc *allocs;
size_t n_allocs, cap_allocs;
uint64_t device_used; /* bytes of live device allocations */
uint64_t host_used;
long live_device, live_host;

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

static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
void td_wait(void) { pthread_cond_wait(&wake, &lock); }
void td_wake(void) { pthread_cond_broadcast(&wake); }

/* Record a misuse (the caller holds the lock) and return err. */
static CUresult vbad(CUresult err, const char *fn, const char *fmt, va_list ap)
{
    misuse++;
    int n = snprintf(last_misuse, sizeof last_misuse, "%s: ", fn);
    if (n > 0 && (size_t)n < sizeof last_misuse)
        vsnprintf(last_misuse + n, sizeof last_misuse - (size_t)n, fmt, ap);
    fprintf(stderr, "safecuda test device: MISUSE #%ld: %s\n", misuse, last_misuse);
    if (abort_on_misuse)
        abort();
    return err;
}

CUresult bad(CUresult err, const char *fn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    CUresult r = vbad(err, fn, fmt, ap);
    va_end(ap);
    return r;
}

CUresult refuse_if(int refused, CUresult err, const char *fn, const char *fmt, ...)
{
    if (!refused)
        return CUDA_SUCCESS;
    va_list ap;
    va_start(ap, fmt);
    CUresult r = vbad(err, fn, fmt, ap);
    va_end(ap);
    return r;
}

CUresult not_null(const void *p, const char *fn, const char *what)
{
    return p ? CUDA_SUCCESS : bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL %s", what);
}

/* The checks of CHECKS (testdevice_internal.h; lock held). */
CUresult need_init(const char *fn)
{
    if (!initialized)
        return bad(CUDA_ERROR_NOT_INITIALIZED, fn, "called before cuInit");
    return CUDA_SUCCESS;
}

CUresult need_ctx(const char *fn)
{
    CUresult r;
    CHECKS(r, need_init(fn),
           refuse_if(!current, CUDA_ERROR_INVALID_CONTEXT, fn, "no current context"),
           refuse_if(current->refcount <= 0, CUDA_ERROR_INVALID_CONTEXT, fn,
                     "the current context is device %d's primary context, released "
                     "(refcount 0)",
                     current->device));
    return r;
}

CUresult need_stream(CUstream s, const char *fn)
{
    /* NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are valid. */
    if ((uintptr_t)s <= 2 || set_has(&streams, s))
        return CUDA_SUCCESS;
    return bad(CUDA_ERROR_INVALID_HANDLE, fn, "unknown or destroyed stream %p", (void *)s);
}

CUresult device_ok(CUdevice d, const char *fn)
{
    CUresult r;
    CHECKS(r, need_init(fn),
           refuse_if(d < 0 || d >= n_devices, CUDA_ERROR_INVALID_DEVICE, fn,
                     "device %d does not exist", d));
    return r;
}

CUresult event_ok(CUevent e, const char *fn)
{
    if (!set_has(&events, e))
        return bad(CUDA_ERROR_INVALID_HANDLE, fn, "unknown or destroyed event %p", (void *)e);
    return CUDA_SUCCESS;
}

CUresult pool_ok(CUmemoryPool p, const char *fn)
{
    if (!set_has(&pools, p))
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "unknown or destroyed pool %p", (void *)p);
    return CUDA_SUCCESS;
}

CUresult module_ok(CUmodule m, const char *fn)
{
    if (!set_has(&modules, m))
        return bad(CUDA_ERROR_INVALID_HANDLE, fn, "unknown or unloaded module %p", (void *)m);
    return CUDA_SUCCESS;
}

CUresult func_ok(CUfunction f, const char *fn)
{
    if (!set_has(&funcs, f))
        return bad(CUDA_ERROR_INVALID_HANDLE, fn,
                   "unknown function %p (or its module was unloaded)", (void *)f);
    return CUDA_SUCCESS;
}

/* The live allocation containing address p (device or host), or NULL. */
fake_alloc *find_alloc(uintptr_t p)
{
    for (size_t i = 0; i < n_allocs; i++)
        if (p >= allocs[i].base && p - allocs[i].base < allocs[i].size)
            return &allocs[i];
    return NULL;
}

fake_alloc *find_base(uintptr_t p)
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

/* ---- initialisation, errors, entry points --------------------------------------------- */

/* A bad SAFECUDA_TESTDEVICE_* value: cuInit fails (CUDA_ERROR_INVALID_VALUE) and the library
 * quotes this message (safecuda_testdevice_settings_error). */
static char settings_error[512];

EXPORT CUresult cuInit(unsigned flags)
{
    td_lock();
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
    td_unlock();
    return r;
}

/* The message of a bad setting (cuInit failed for it), else NULL. */
EXPORT const char *safecuda_testdevice_settings_error(void)
{
    td_lock();
    const char *e = settings_error[0] ? settings_error : NULL;
    td_unlock();
    return e;
}

CUresult f_cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    td_lock();
    *v = driver_version;
    td_unlock();
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

CUresult f_cuGetErrorName(CUresult e, const char **s) { return error_text(e, s, 0); }
CUresult f_cuGetErrorString(CUresult e, const char **s) { return error_text(e, s, 1); }

/* Exported too: the loader dlsym's cuInit and cuDriverGetVersion (and cuGetErrorName). */
EXPORT CUresult cuDriverGetVersion(int *v) { return f_cuDriverGetVersion(v); }
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) { return f_cuGetErrorName(e, s); }
EXPORT CUresult cuGetErrorString(CUresult e, const char **s) { return f_cuGetErrorString(e, s); }

/* ---- stream capture and graphs: capture.c and graph.c ---------------------------------------- */

CUresult f_cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    return td_cuStreamBeginCapture(s, mode);
}
CUresult f_cuStreamEndCapture(CUstream s, CUgraph *g) { return td_cuStreamEndCapture(s, g); }
CUresult f_cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
    return td_cuStreamIsCapturing(s, st);
}
CUresult f_cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
{
    return td_cuStreamGetCaptureInfo(s, st, id);
}
CUresult f_cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n)
{
    return td_cuGraphGetNodes(g, nodes, n);
}
CUresult f_cuGraphDestroy(CUgraph g) { return td_cuGraphDestroy(g); }
CUresult f_cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long fl)
{
    return td_cuGraphInstantiateWithFlags(e, g, fl);
}
CUresult f_cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *i)
{
    return td_cuGraphExecUpdate(e, g, i);
}
CUresult f_cuGraphLaunch(CUgraphExec e, CUstream s) { return td_cuGraphLaunch(e, s); }
CUresult f_cuGraphExecDestroy(CUgraphExec e) { return td_cuGraphExecDestroy(e); }

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
        td_lock(); \
        type v_ = (type)(expr);   \
        td_unlock(); \
        return v_;                \
    }

COUNTER(int, safecuda_testdevice_misuse_count, misuse)
COUNTER(long, safecuda_testdevice_live_device_allocations, live_device)
COUNTER(long, safecuda_testdevice_live_host_allocations, live_host)
COUNTER(long, safecuda_testdevice_live_streams, streams.n)
COUNTER(long, safecuda_testdevice_live_events, events.n)
COUNTER(long, safecuda_testdevice_live_modules, modules.n)
COUNTER(long, safecuda_testdevice_live_pools, pools.n)
COUNTER(long, safecuda_testdevice_primary_refcount, primary_refcount_total())
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
    td_lock();
    fake_alloc *a = find_base((uintptr_t)base);
    if (a) {
        a->attrs_set = 1;
        a->memory_type = (unsigned)memory_type;
        a->managed = managed;
        a->ordinal = ordinal;
        a->foreign_context = foreign_context;
    }
    td_unlock();
    return a != NULL;
}

/* Opt in to CUDA's behaviour on the primary context's last release: its device memory
 * is freed (counted by safecuda_testdevice_reclaimed_allocations). Off by default, so leaks show. */
EXPORT void safecuda_testdevice_set_reclaim_on_release(int on)
{
    td_lock();
    reclaim_on_release = on;
    td_unlock();
}
