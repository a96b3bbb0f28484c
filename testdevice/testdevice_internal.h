/* What the test device's files share: testdevice.c (devices, memory, streams, events,
 * modules, launches), capture.c (stream capture, graphs, executable graphs) and
 * tensor_map.c (cuTensorMapEncodeTiled). Not installed and not an API: every name here has
 * hidden visibility (the library is built with C_VISIBILITY_PRESET hidden; only EXPORT'ed
 * names leave it).
 *
 * Locking: one mutex guards all state. Functions marked "lock held" expect the caller to
 * hold it (td_lock / td_unlock); the td_cu* entry points of capture.c and tensor_map.c take it
 * themselves. */
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
} fake_stream;
#define STREAM_MAGIC 0x57e4

typedef struct fake_event {
    int magic;
    unsigned flags;
    int recorded;        /* recorded outside a capture at least once (for timing) */
    int captured;        /* its last record was captured (in capture_id) */
    uint64_t capture_id; /* the capture of its last record, when captured */
    idx_set deps;        /* the capturing stream's dependencies at that record */
    uint64_t serial;     /* unique per event ever created (graph nodes name events by it) */
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

/* The direction of a captured copy. */
enum { COPY_HTOD = 1, COPY_DTOH, COPY_DTOD };

/* ---- testdevice.c's state and checks ------------------------------------------------------ */

extern ptr_set streams, events, funcs;
extern int accept_launches;
extern long refused_launches;

void td_lock(void);
void td_unlock(void);

/* Record a misuse (lock held) and return err. */
__attribute__((format(printf, 3, 4))) CUresult bad(CUresult err, const char *fn,
                                                   const char *fmt, ...);
CUresult need_init(const char *fn);
CUresult need_ctx(const char *fn);
CUresult need_stream(CUstream s, const char *fn);
CUresult event_ok(CUevent e, const char *fn);
/* The live allocation containing address p (device or host), or NULL. */
fake_alloc *find_alloc(uintptr_t p);
/* [p, p + n) lies inside one live device allocation (else misuse, described with what). */
CUresult device_range(CUdeviceptr p, uint64_t n, const char *fn, const char *what);
/* Fill h rows of w elements of esize bytes, pitch bytes apart, with v. */
void fill_rows(uintptr_t d, size_t pitch, uint32_t v, size_t esize, size_t w, size_t h);

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
