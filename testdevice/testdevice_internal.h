/* What the test device's files share: testdevice.c (the state, the checks, cuInit, error
 * names, cuGetProcAddress and the counters for tests), device.c (devices and the primary
 * context), memory.c (allocations, pools, pinned memory, copies, memsets), stream.c (streams
 * and events), ptx.c (the PTX reader), module.c (modules, functions, occupancy, launches),
 * capture.c (stream capture), graph.c (graphs, executable graphs, their update and replay),
 * tensor_map.c (cuTensorMapEncodeTiled) and settings.c (the SAFECUDA_TESTDEVICE_* variables).
 * Not installed and not an API: every name here has hidden visibility (the library is built
 * with C_VISIBILITY_PRESET hidden; only EXPORT'ed names leave it).
 *
 * Locking: one mutex guards all state. Functions marked "lock held" expect the caller to
 * hold it (td_lock / td_unlock); the f_cu* and td_cu* entry points take it themselves. */
#ifndef SAFECUDA_TESTDEVICE_INTERNAL_H
#define SAFECUDA_TESTDEVICE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "driver/cuda_api.h"

/* ---- settings (settings.c) ------------------------------------------------------------------- */

/* What the SAFECUDA_TESTDEVICE_* variables set; fields keep the values they had (the
 * defaults) where a variable is unset or empty. */
typedef struct td_settings {
    uint64_t total_bytes, host_limit;
    int n_devices, compute_capability, driver_version;
    int abort_on_misuse, accept_launches;
} td_settings;

/* Read the environment into s: 1, or 0 with "NAME=VALUE: what is accepted" in error. */
int td_read_settings(td_settings *s, char *error, size_t size);

/* ---- small sets ---------------------------------------------------------------------------- */

/* A set of live pointers (linear search: the tests hold few objects). */
typedef struct ptr_set {
    void **items;
    size_t n, cap;
} ptr_set;

int set_add(ptr_set *s, void *p); /* 0 when out of memory */
int set_has(const ptr_set *s, const void *p);
int set_remove(ptr_set *s, const void *p);

/* A set of node indices of a capture's graph (a stream's or an event's dependencies). */
typedef struct idx_set {
    size_t *items;
    size_t n, cap;
} idx_set;

/* ---- objects -------------------------------------------------------------------------------- */

struct fake_capture;

typedef struct fake_alloc {
    const struct fake_ctx *ctx; /* the context current at its allocation */
    uintptr_t base;
    uint64_t size;
    int is_host;
    struct fake_pool *pool; /* NULL for cuMemAlloc / host */
    /* What cuPointerGetAttribute says about it, when a test asked for something else than
     * the truth (safecuda_testdevice_set_pointer_attributes): another memory type, managed
     * memory, another device, another context. */
    int attrs_set;
    unsigned memory_type;
    int managed, ordinal, foreign_context;
} fake_alloc;

typedef struct fake_stream {
    int magic;
    unsigned flags;
    int priority;
    struct fake_capture *capture; /* the capture it belongs to, NULL when not capturing */
    idx_set deps;                 /* while capturing: what its next node depends on */
    int other_context;            /* a test said it belongs to a context of its own */
    const struct fake_ctx *ctx;   /* the context current at its creation */
    int holds;                    /* unfinished work (hold.c) */
    uint64_t hold_epoch;          /* counts the times its holds all ended */
} fake_stream;
#define STREAM_MAGIC 0x57e4

typedef struct fake_event {
    int magic;
    const struct fake_ctx *ctx; /* the context current at its creation */
    unsigned flags;
    int recorded;        /* recorded outside a capture at least once (for timing) */
    int captured;        /* its last record was captured (in capture_id) */
    uint64_t capture_id; /* the capture of its last record, when captured */
    idx_set deps;        /* the capturing stream's dependencies at that record */
    uint64_t serial;     /* unique per event ever created (graph nodes name events by it) */
    const fake_stream *pending_on; /* recorded on a held stream (hold.c), in its epoch: */
    uint64_t pending_epoch;        /* complete once that stream's holds have all ended */
} fake_event;
#define EVENT_MAGIC 0xe7e7

#define MAX_PARAMS 256
typedef struct fake_func {
    int magic;
    struct fake_module *module;
    char *name;
    int n_params;
    size_t offset[MAX_PARAMS], size[MAX_PARAMS];
    int max_threads;
    int static_shared;
    int max_dynamic_shared;
    int ptx_version;
    uint64_t serial;          /* unique per function ever loaded */
    unsigned req_cluster[3];  /* .reqnctapercluster, or set at run time; 0 0 0: none */
    int req_cluster_in_ptx;   /* the required cluster came from the PTX (can't be changed) */
    int explicit_cluster;     /* .explicitcluster: a launch must give a cluster */
    int non_portable_cluster; /* CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED */
} fake_func;
#define FUNC_MAGIC 0xf00c

/* The launch attributes of cuLaunchKernelEx the test device knows (zero: none). */
typedef struct launch_attrs {
    int cooperative;
    int has_cluster;
    unsigned cluster[3];
    int programmatic;
} launch_attrs;

typedef struct fake_ctx {
    int magic;
    long refcount;
    int device; /* whose primary context it is */
} fake_ctx;
#define TD_MAX_DEVICES 8
#define CTX_MAGIC 0x0c7c7c7c

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
    const struct fake_ctx *ctx; /* the context current when it was loaded */
    int n_funcs;
    fake_func **funcs;
} fake_module;
#define MODULE_MAGIC 0x30d

/* The direction of a captured copy. */
enum { COPY_HTOD = 1, COPY_DTOH, COPY_DTOD };

/* ---- testdevice.c's state and checks ------------------------------------------------------ */

/* A name the library (or a test) finds with dlsym. */
#define EXPORT __attribute__((visibility("default")))

/* The settings cuInit read (testdevice.c). */
extern int initialized, n_devices, compute_capability, accept_launches;
extern uint64_t total_bytes, host_limit;
extern long refused_launches;

/* The devices' primary contexts (device.c uses them; memory.c names an allocation's in its
 * pointer attributes; streams and events belong to the one current at their creation). */
extern fake_ctx primaries[TD_MAX_DEVICES];
long primary_refcount_total(void);
extern long primary_releases_to_zero, reclaimed_allocations;
extern int reclaim_on_release;
extern _Thread_local fake_ctx *current;

/* The live objects. allocs: every live device and pinned host allocation (memory.c keeps
 * it); device_used / host_used: their bytes; live_device / live_host: their counts. */
extern ptr_set pools, modules, streams, events, funcs;
extern fake_alloc *allocs;
extern size_t n_allocs, cap_allocs;
extern uint64_t device_used, host_used;
extern long live_device, live_host;

/* Every row of SCI_CU_FUNCS has an implementation f_<name> with exactly the row's signature
 * (a mismatch is a compile error): testdevice.c (errors, capture's and tensor maps'
 * forwarders), device.c, memory.c, stream.c, module.c. cuGetProcAddress_v2 hands them out. */
#define FAKE_PROTO(name, ver, req, params, args) CUresult f_##name params;
SCI_CU_FUNCS(FAKE_PROTO)
#undef FAKE_PROTO

void td_lock(void);
void td_unlock(void);
/* Wait (lock held; it is released while waiting) until td_wake is called. */
void td_wait(void);
void td_wake(void);

/* Record a misuse (lock held) and return err. */
__attribute__((format(printf, 3, 4))) CUresult bad(CUresult err, const char *fn,
                                                   const char *fmt, ...);

/* The checks an entry point starts with, stated in one line (lock held):
 *
 *     CHECKS(r, need_ctx(fn), need_stream(s, fn), not_null(p, fn, "out-pointer"));
 *
 * sets r to the first of the checks (CUresult expressions, 1 to 8 of them) that fails, or to
 * CUDA_SUCCESS when all pass. Each check is evaluated only when all before it passed, so a
 * later one may rely on the earlier ones (a handle checked before it is read, a pointer
 * before it is followed), and only the first failure is recorded as misuse. */
#define CHECKS(r, ...) ((void)(TD_EACH_(TD_CHECK_, r, __VA_ARGS__) 0))
#define TD_CHECK_(r, check) ((r) = (check)) != CUDA_SUCCESS ||
#define TD_EACH_(m, r, ...)                                                                   \
    TD_CAT_(TD_EACH_, TD_COUNT_(__VA_ARGS__, 8, 7, 6, 5, 4, 3, 2, 1, 0))(m, r, __VA_ARGS__)
#define TD_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, n, ...) n
#define TD_CAT_(a, b) TD_CAT2_(a, b)
#define TD_CAT2_(a, b) a##b
#define TD_EACH_1(m, r, x) m(r, x)
#define TD_EACH_2(m, r, x, ...) m(r, x) TD_EACH_1(m, r, __VA_ARGS__)
#define TD_EACH_3(m, r, x, ...) m(r, x) TD_EACH_2(m, r, __VA_ARGS__)
#define TD_EACH_4(m, r, x, ...) m(r, x) TD_EACH_3(m, r, __VA_ARGS__)
#define TD_EACH_5(m, r, x, ...) m(r, x) TD_EACH_4(m, r, __VA_ARGS__)
#define TD_EACH_6(m, r, x, ...) m(r, x) TD_EACH_5(m, r, __VA_ARGS__)
#define TD_EACH_7(m, r, x, ...) m(r, x) TD_EACH_6(m, r, __VA_ARGS__)
#define TD_EACH_8(m, r, x, ...) m(r, x) TD_EACH_7(m, r, __VA_ARGS__)

/* The checks (each records a misuse when it fails, except where said): */
/* cuInit has succeeded. */
CUresult need_init(const char *fn);
/* need_init, and a current context that is retained. */
CUresult need_ctx(const char *fn);
/* need_init, and device d exists. */
CUresult device_ok(CUdevice d, const char *fn);
/* A live stream, or one of the built-in ones (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
CUresult need_stream(CUstream s, const char *fn);
/* A live stream's context (stream.c): a created stream's own, the current one for the
 * built-in streams (as CUDA answers); NULL for a stream a test moved to a context of its
 * own (safecuda_testdevice_move_stream_to_other_context), which no check looks at. */
const fake_ctx *td_stream_ctx(CUstream s);
/* A live event, pool, module, function. */
CUresult event_ok(CUevent e, const char *fn);
CUresult pool_ok(CUmemoryPool p, const char *fn);
CUresult module_ok(CUmodule m, const char *fn);
CUresult func_ok(CUfunction f, const char *fn);
/* p is not NULL: else CUDA_ERROR_INVALID_VALUE, "NULL <what>". */
CUresult not_null(const void *p, const char *fn, const char *what);
/* When refused: err, with the message (as bad); else CUDA_SUCCESS. */
__attribute__((format(printf, 4, 5))) CUresult refuse_if(int refused, CUresult err,
                                                         const char *fn, const char *fmt, ...);
/* The live allocation containing address p (device or host), or NULL. */
fake_alloc *find_alloc(uintptr_t p);
/* The live allocation that starts at p, or NULL. */
fake_alloc *find_base(uintptr_t p);
/* [p, p + n) lies inside one live device allocation (else misuse, described with what). */
CUresult device_range(CUdeviceptr p, uint64_t n, const char *fn, const char *what);
/* Fill h rows of w elements of esize bytes, pitch bytes apart, with v. */
void fill_rows(uintptr_t d, size_t pitch, uint32_t v, size_t esize, size_t w, size_t h);

/* ---- memory.c, used by the other files (lock held) ----------------------------------------- */

/* Drop what each pool caches beyond its release threshold (at a synchronization). */
void release_to_threshold(void);
/* The bytes all pools cache. */
uint64_t cached_total(void);
/* The end of a stream operation: an error on a capturing stream (cap) invalidates it. */
CUresult copy_done(CUresult r, struct fake_capture *cap, const char *fn);

/* ---- hold.c: held streams (lock held) ------------------------------------------------------- */

/* The stream has holds; any stream has. */
int td_stream_busy(CUstream s);
int td_any_stream_busy(void);
/* cuEventRecord of e on s outside a capture; whether e's record is not complete yet. */
void td_event_note_record(fake_event *e, CUstream s);
int td_event_pending(const fake_event *e);
/* s is being destroyed: its holds end. */
void td_hold_forget_stream(fake_stream *s);

/* ---- ptx.c: the PTX reader -------------------------------------------------------------- */

/* The PTX text's kernels (magic, names, parameters, attributes; not yet in funcs); NULL on
 * a parse error (not PTX, a bad entry name or parameter list), said in log. */
fake_module *parse_ptx(const char *text, char *log, size_t log_size);
/* Free m and its functions, removing them from funcs (lock held). */
void free_module(fake_module *m);

/* ---- graphs (graph.c): what a capture records and a graph holds ------------------------- */

enum { NODE_KERNEL = 1, NODE_MEMCPY, NODE_MEMSET, NODE_HOST, NODE_EVENT_WAIT };

typedef struct fake_node {
    int kind;
    size_t *deps; /* indices of earlier nodes: the list is in a topological order */
    size_t n_deps;
    const void *stream; /* the stream it was captured on (for messages only) */
    union {
        struct {
            int dir;
            uintptr_t dst, src;
            size_t bytes;
        } copy;
        struct {
            uintptr_t dst;
            size_t pitch, esize, width, height, span;
            uint32_t value;
        } memset;
        struct {
            const fake_func *func; /* compared by address and serial, never read if unloaded */
            uint64_t serial;
            unsigned grid[3], block[3], shared;
            unsigned char *params; /* the parameters' bytes, laid out as the PTX declares */
            size_t params_size;
            launch_attrs attrs;
        } kernel;
        struct {
            CUhostFn fn;
            void *user;
        } host;
        struct {
            const fake_event *event;
            uint64_t serial;
        } wait;
    } u;
} fake_node;

typedef struct node_list {
    fake_node **items;
    size_t n, cap;
} node_list;

typedef struct fake_graph {
    int magic;
    node_list nodes;
} fake_graph;
#define GRAPH_MAGIC 0x6a4f

typedef struct fake_exec {
    int magic;
    node_list nodes;
} fake_exec;
#define EXEC_MAGIC 0xe8ec

/* The live graphs and executable graphs (graph.c). */
extern ptr_set graphs, execs;
/* Node lists and graphs (graph.c; lock held). list_push: 0 when out of memory. */
void node_free(fake_node *n);
int list_push(node_list *l, fake_node *n);
void graph_free(fake_graph *g);

/* capture.c, for graph.c (lock held): "capture N (mode, begun on stream S by this/another
 * thread)" into buf; mark capture c invalidated, for the reason why (the first one kept). */
const char *describe(const struct fake_capture *c, char *buf, size_t size);
void invalidate(struct fake_capture *c, const char *why);

/* ---- capture.c: hooks the stream operations call (lock held) ------------------------------ */

/* The capture stream s records into (*cap, NULL when s is not capturing). Answers
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED for a stream of an invalidated capture, and
 * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (misuse; the captures are invalidated) for the legacy
 * stream while a blocking stream is capturing. */
CUresult td_capture_of(CUstream s, const char *fn, struct fake_capture **cap);
/* An operation on a capturing stream failed: the capture is invalidated. */
void td_capture_failed(struct fake_capture *c, const char *fn);
/* A call CUDA forbids during capture: refused (misuse) and the conflicting captures
 * invalidated. any_capture: it conflicts with every capture (cuCtxSynchronize); otherwise
 * with GLOBAL captures of any thread and THREAD_LOCAL captures of this thread. */
CUresult td_capture_unsafe(const char *fn, int any_capture);
/* Record a node on capturing stream s (its arguments already validated). */
CUresult td_capture_copy(struct fake_capture *c, CUstream s, int dir, uintptr_t dst,
                         uintptr_t src, size_t n, const char *fn);
CUresult td_capture_memset(struct fake_capture *c, CUstream s, uintptr_t d, size_t pitch,
                           uint32_t v, size_t esize, size_t w, size_t h, const char *fn);
CUresult td_capture_kernel(struct fake_capture *c, CUstream s, const fake_func *f,
                           const unsigned grid[3], const unsigned block[3], unsigned shared,
                           void **params, const launch_attrs *a, const char *fn);
CUresult td_capture_host(struct fake_capture *c, CUstream s, CUhostFn host, void *user,
                         const char *fn);
/* cuEventRecord of e on s (c: the capture of s, or NULL). */
CUresult td_event_record(fake_event *e, struct fake_capture *c, CUstream s);
/* CUDA_ERROR_CAPTURED_EVENT (misuse) when e's last record was captured. */
CUresult td_event_check(fake_event *e, const char *fn);
/* cuStreamWaitEvent, after the handles and flags were checked. */
CUresult td_stream_wait(CUstream s, fake_event *e, unsigned flags, const char *fn);
/* A stream that belongs to a capture can't be destroyed (misuse). */
CUresult td_stream_destroy_check(fake_stream *s, const char *fn);
void td_stream_forget(fake_stream *s);
void td_event_forget(fake_event *e);
long td_live_graphs(void);
long td_live_graph_execs(void);
long td_active_captures(void);

/* ---- capture.c: the entry points (they take the lock) -------------------------------------- */
CUresult td_cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode);
CUresult td_cuStreamEndCapture(CUstream s, CUgraph *g);
CUresult td_cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status);
CUresult td_cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id);
CUresult td_cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n);
CUresult td_cuGraphDestroy(CUgraph g);
CUresult td_cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags);
CUresult td_cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info);
CUresult td_cuGraphLaunch(CUgraphExec e, CUstream s);
CUresult td_cuGraphExecDestroy(CUgraphExec e);

/* ---- tensor_map.c (takes the lock) --------------------------------------------------------- */
CUresult td_cuTensorMapEncodeTiled(CUtensorMap *map, int dtype, cuuint32_t rank, void *address,
                                   const cuuint64_t *dims, const cuuint64_t *strides,
                                   const cuuint32_t *box, const cuuint32_t *element_strides,
                                   int interleave, int swizzle, int l2_promotion, int oob_fill);

#endif
