/* The test device's stream capture (the model is described in testdevice.c's header
 * comment): capture sequences with their member streams and dependency sets, the nodes they
 * record (into graph.c's node lists), and the graphs they end with. One mutex
 * (testdevice.c's) guards all of it. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testdevice_internal.h"

/* ---- node index sets --------------------------------------------------------------------- */

static int idx_add(idx_set *s, size_t v)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->items[i] == v)
            return 1;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4;
        size_t *grown = realloc(s->items, cap * sizeof *grown);
        if (!grown)
            return 0;
        s->items = grown;
        s->cap = cap;
    }
    s->items[s->n++] = v;
    return 1;
}

static int idx_union(idx_set *into, const idx_set *from)
{
    for (size_t i = 0; i < from->n; i++)
        if (!idx_add(into, from->items[i]))
            return 0;
    return 1;
}

static int idx_copy(idx_set *into, const idx_set *from)
{
    into->n = 0;
    return idx_union(into, from);
}

static void idx_free(idx_set *s)
{
    free(s->items);
    s->items = NULL;
    s->n = s->cap = 0;
}

/* ---- captures ---------------------------------------------------------------------------- */

typedef struct fake_capture {
    uint64_t id; /* unique over the process, as cuStreamGetCaptureInfo reports it */
    CUstreamCaptureMode mode;
    fake_stream *origin;
    pthread_t thread; /* the thread that began it */
    int invalidated;
    char why[160]; /* what invalidated it */
    fake_graph *graph;
    ptr_set members; /* its streams, the origin included */
} fake_capture;

static ptr_set captures; /* captures not ended yet (active or invalidated) */
static uint64_t capture_seq;

static const char *mode_name(CUstreamCaptureMode m)
{
    static const char *const names[] = {"GLOBAL", "THREAD_LOCAL", "RELAXED"};
    return (unsigned)m <= 2 ? names[m] : "?";
}

/* "capture 3 (GLOBAL mode, begun on stream 0x... by this thread)" */
const char *describe(const fake_capture *c, char *buf, size_t size)
{
    snprintf(buf, size, "capture %llu (%s mode, begun on stream %p by %s thread)",
             (unsigned long long)c->id, mode_name(c->mode), (const void *)c->origin,
             pthread_equal(c->thread, pthread_self()) ? "this" : "another");
    return buf;
}

void invalidate(fake_capture *c, const char *why)
{
    if (c->invalidated)
        return;
    c->invalidated = 1;
    snprintf(c->why, sizeof c->why, "%s", why);
}

void td_capture_failed(fake_capture *c, const char *fn)
{
    char why[96];
    snprintf(why, sizeof why, "%s failed on one of its streams", fn);
    invalidate(c, why);
}

static fake_capture *find_capture(uint64_t id)
{
    for (size_t i = 0; i < captures.n; i++)
        if (((fake_capture *)captures.items[i])->id == id)
            return captures.items[i];
    return NULL;
}

static int has_blocking_member(const fake_capture *c)
{
    for (size_t i = 0; i < c->members.n; i++)
        if (!(((const fake_stream *)c->members.items[i])->flags & CU_STREAM_NON_BLOCKING))
            return 1;
    return 0;
}

static int is_legacy(CUstream s) { return (uintptr_t)s <= 1; } /* NULL or CU_STREAM_LEGACY */

/* The legacy stream while a blocking stream captures: an implicit dependency on the capture. */
static fake_capture *implicit_conflict(void)
{
    for (size_t i = 0; i < captures.n; i++) {
        fake_capture *c = captures.items[i];
        if (!c->invalidated && has_blocking_member(c))
            return c;
    }
    return NULL;
}

CUresult td_capture_of(CUstream s, const char *fn, fake_capture **cap)
{
    *cap = NULL;
    if (is_legacy(s)) {
        fake_capture *hit = implicit_conflict();
        if (!hit)
            return CUDA_SUCCESS;
        char d[160];
        describe(hit, d, sizeof d);
        for (size_t i = 0; i < captures.n; i++) {
            fake_capture *c = captures.items[i];
            if (!c->invalidated && has_blocking_member(c))
                invalidate(c, "the legacy stream was used while a blocking stream captured");
        }
        return bad(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, fn,
                   "the legacy stream was used while %s has a blocking stream (one created "
                   "without CU_STREAM_NON_BLOCKING): an implicit dependency on the capture, "
                   "which is invalidated",
                   d);
    }
    if ((uintptr_t)s == 2) /* CU_STREAM_PER_THREAD: never captures here */
        return CUDA_SUCCESS;
    fake_stream *st = (fake_stream *)(void *)s;
    if (!st->capture)
        return CUDA_SUCCESS;
    if (st->capture->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED; /* the invalidation was counted */
    *cap = st->capture;
    return CUDA_SUCCESS;
}

/* Whether an active capture forbids a potentially unsafe call of this thread. */
static int forbids(const fake_capture *c, int any_capture)
{
    if (c->invalidated)
        return 0;
    if (any_capture || c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
        return 1;
    return c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
           pthread_equal(c->thread, pthread_self());
}

CUresult td_capture_unsafe(const char *fn, int any_capture)
{
    fake_capture *hit = NULL;
    size_t n_hit = 0;
    for (size_t i = 0; i < captures.n; i++)
        if (forbids(captures.items[i], any_capture) && n_hit++ == 0)
            hit = captures.items[i];
    if (!hit)
        return CUDA_SUCCESS;
    char d[160], why[96];
    describe(hit, d, sizeof d);
    snprintf(why, sizeof why, "%s was called during the capture", fn);
    for (size_t i = 0; i < captures.n; i++)
        if (forbids(captures.items[i], any_capture))
            invalidate(captures.items[i], why);
    return bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn,
               "not permitted while %s%s is active: CUDA refuses the call and invalidates the "
               "capture",
               d, n_hit > 1 ? " (and other captures)" : "");
}

/* Append node n to c's graph on stream s: it depends on what s depends on, and s then
 * depends on it alone. Frees n on failure. */
static CUresult add_node(fake_capture *c, CUstream s, fake_node *n)
{
    fake_stream *st = (fake_stream *)(void *)s;
    n->stream = st;
    n->n_deps = st->deps.n;
    if (n->n_deps) {
        n->deps = malloc(n->n_deps * sizeof *n->deps);
        if (!n->deps) {
            node_free(n);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(n->deps, st->deps.items, n->n_deps * sizeof *n->deps);
    }
    if (!list_push(&c->graph->nodes, n)) {
        node_free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    st->deps.n = 0;
    if (!idx_add(&st->deps, c->graph->nodes.n - 1))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}

static fake_node *new_node(int kind)
{
    fake_node *n = calloc(1, sizeof *n);
    if (n)
        n->kind = kind;
    return n;
}

CUresult td_capture_copy(fake_capture *c, CUstream s, int dir, uintptr_t dst, uintptr_t src,
                         size_t n, const char *fn)
{
    if (n == 0)
        return CUDA_SUCCESS; /* nothing to record */
    if (dir != COPY_DTOD) {
        uintptr_t h = dir == COPY_HTOD ? src : dst;
        fake_alloc *a = find_alloc(h);
        if (!a || !a->is_host) {
            char d[160];
            describe(c, d, sizeof d);
            invalidate(c, "a copy of pageable host memory was captured");
            return bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn,
                       "a copy %s pageable host memory %p on a stream of %s: only pinned memory "
                       "(cuMemHostAlloc) can be captured; the capture is invalidated",
                       dir == COPY_HTOD ? "from" : "to", (void *)h, d);
        }
    }
    fake_node *node = new_node(NODE_MEMCPY);
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    node->u.copy.dir = dir;
    node->u.copy.dst = dst;
    node->u.copy.src = src;
    node->u.copy.bytes = n;
    return add_node(c, s, node);
}

CUresult td_capture_memset(fake_capture *c, CUstream s, uintptr_t d, size_t pitch, uint32_t v,
                           size_t esize, size_t w, size_t h, const char *fn)
{
    (void)fn;
    if (w == 0 || h == 0)
        return CUDA_SUCCESS;
    fake_node *node = new_node(NODE_MEMSET);
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    node->u.memset.dst = d;
    node->u.memset.pitch = pitch;
    node->u.memset.value = v;
    node->u.memset.esize = esize;
    node->u.memset.width = w;
    node->u.memset.height = h;
    node->u.memset.span = (h - 1) * pitch + w * esize; /* checked by the caller */
    return add_node(c, s, node);
}

CUresult td_capture_kernel(fake_capture *c, CUstream s, const fake_func *f,
                           const unsigned grid[3], const unsigned block[3], unsigned shared,
                           void **params, const launch_attrs *a, const char *fn)
{
    (void)fn;
    fake_node *node = new_node(NODE_KERNEL);
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t size = 0;
    for (int i = 0; i < f->n_params; i++)
        if (f->offset[i] + f->size[i] > size)
            size = f->offset[i] + f->size[i];
    node->u.kernel.params = calloc(1, size ? size : 1);
    if (!node->u.kernel.params) {
        node_free(node);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int i = 0; i < f->n_params; i++) /* copied now: the caller may reuse its values */
        memcpy(node->u.kernel.params + f->offset[i], params[i], f->size[i]);
    node->u.kernel.params_size = size;
    node->u.kernel.func = f;
    node->u.kernel.serial = f->serial;
    memcpy(node->u.kernel.grid, grid, sizeof node->u.kernel.grid);
    memcpy(node->u.kernel.block, block, sizeof node->u.kernel.block);
    node->u.kernel.shared = shared;
    node->u.kernel.attrs = *a;
    return add_node(c, s, node);
}

CUresult td_capture_host(fake_capture *c, CUstream s, CUhostFn host, void *user, const char *fn)
{
    (void)fn;
    fake_node *node = new_node(NODE_HOST);
    if (!node)
        return CUDA_ERROR_OUT_OF_MEMORY;
    node->u.host.fn = host;
    node->u.host.user = user;
    return add_node(c, s, node);
}

/* ---- events in captures ------------------------------------------------------------------ */

CUresult td_event_record(fake_event *e, fake_capture *c, CUstream s)
{
    if (!c) {
        e->captured = 0;
        e->capture_id = 0;
        idx_free(&e->deps);
        e->recorded = 1;
        return CUDA_SUCCESS;
    }
    /* No node: the event stands for the stream's position in the capture. */
    e->captured = 1;
    e->capture_id = c->id;
    if (!idx_copy(&e->deps, &((fake_stream *)(void *)s)->deps))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}

CUresult td_event_check(fake_event *e, const char *fn)
{
    if (!e->captured)
        return CUDA_SUCCESS;
    fake_capture *c = find_capture(e->capture_id);
    if (c)
        invalidate(c, "a captured event was synchronized or queried");
    return bad(CUDA_ERROR_CAPTURED_EVENT, fn,
               "event %p was last recorded in capture %llu (%s): it stands for work in a graph, "
               "not on a stream; record it again outside a capture",
               (void *)e, (unsigned long long)e->capture_id,
               c ? (c->invalidated ? "invalidated now" : "active") : "ended");
}

CUresult td_stream_wait(CUstream s, fake_event *e, unsigned flags, const char *fn)
{
    fake_capture *cap = NULL;
    CUresult r = td_capture_of(s, fn, &cap);
    if (r != CUDA_SUCCESS)
        return r;
    char d[160];
    if (flags & 1) { /* CU_EVENT_WAIT_EXTERNAL: an event wait node, in a capture only */
        if (!cap)
            return bad(CUDA_ERROR_INVALID_VALUE, fn,
                       "CU_EVENT_WAIT_EXTERNAL on stream %p, which is not capturing", (void *)s);
        fake_node *node = new_node(NODE_EVENT_WAIT);
        if (!node)
            return CUDA_ERROR_OUT_OF_MEMORY;
        node->u.wait.event = e;
        node->u.wait.serial = e->serial;
        r = add_node(cap, s, node);
        if (r != CUDA_SUCCESS)
            td_capture_failed(cap, fn);
        return r;
    }
    if (!e->captured) {
        if (!cap || !e->recorded)
            return CUDA_SUCCESS; /* synchronous streams; a never-recorded event is no work */
        invalidate(cap, "a capturing stream waited on an event recorded outside the capture");
        return bad(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, fn,
                   "stream %p of %s waits on event %p, recorded outside any capture (only "
                   "CU_EVENT_WAIT_EXTERNAL may cross the capture's boundary); the capture is "
                   "invalidated",
                   (void *)s, describe(cap, d, sizeof d), (void *)e);
    }
    fake_capture *src = find_capture(e->capture_id);
    if (!src) {
        if (cap) {
            invalidate(cap, "a capturing stream waited on an event of an ended capture");
            return bad(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, fn,
                       "stream %p of %s waits on event %p, last recorded in capture %llu, which "
                       "has ended; the capture is invalidated",
                       (void *)s, describe(cap, d, sizeof d), (void *)e,
                       (unsigned long long)e->capture_id);
        }
        return bad(CUDA_ERROR_CAPTURED_EVENT, fn,
                   "stream %p waits on event %p, last recorded in capture %llu, which has ended: "
                   "the event stands for work in a graph; record it again outside a capture",
                   (void *)s, (void *)e, (unsigned long long)e->capture_id);
    }
    if (src == cap) /* a join inside the capture */
        return idx_union(&((fake_stream *)(void *)s)->deps, &e->deps) ? CUDA_SUCCESS
                                                                       : CUDA_ERROR_OUT_OF_MEMORY;
    if (cap) {
        char d2[160];
        describe(cap, d, sizeof d);
        describe(src, d2, sizeof d2);
        invalidate(cap, "a wait would merge it with another capture");
        invalidate(src, "a wait would merge it with another capture");
        return bad(CUDA_ERROR_STREAM_CAPTURE_MERGE, fn,
                   "stream %p of %s waits on event %p of %s: that would merge two captures; "
                   "both are invalidated",
                   (void *)s, d, (void *)e, d2);
    }
    if (src->invalidated)
        return CUDA_ERROR_INVALID_VALUE; /* as CUDA; the invalidation was counted */
    if ((uintptr_t)s <= 2) {
        invalidate(src, "the legacy or per-thread stream waited on one of its events");
        return bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn,
                   "the %s stream waits on event %p of %s: the legacy stream can't join a "
                   "capture (and the per-thread stream's capture is not modelled); the capture "
                   "is invalidated",
                   (uintptr_t)s == 2 ? "per-thread" : "legacy", (void *)e,
                   describe(src, d, sizeof d));
    }
    /* A fork: s joins the capture, depending on what the event stands for. */
    fake_stream *st = (fake_stream *)(void *)s;
    if (!set_add(&src->members, st) || !idx_copy(&st->deps, &e->deps)) {
        set_remove(&src->members, st);
        idx_free(&st->deps);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    st->capture = src;
    return CUDA_SUCCESS;
}

CUresult td_stream_destroy_check(fake_stream *s, const char *fn)
{
    fake_capture *c = s->capture;
    if (!c)
        return CUDA_SUCCESS;
    char d[160];
    describe(c, d, sizeof d);
    invalidate(c, "one of its streams was destroyed");
    return bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn,
               "stream %p belongs to %s: end the capture first (the stream stays alive; the "
               "capture is invalidated)",
               (void *)s, d);
}

void td_stream_forget(fake_stream *s) { idx_free(&s->deps); }
void td_event_forget(fake_event *e) { idx_free(&e->deps); }
long td_live_graphs(void) { return (long)graphs.n; }
long td_live_graph_execs(void) { return (long)execs.n; }
long td_active_captures(void) { return (long)captures.n; }

/* ---- begin and end ----------------------------------------------------------------------- */

CUresult td_cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    static const char fn[] = "cuStreamBeginCapture";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn));
    fake_stream *st = (uintptr_t)s > 2 ? (fake_stream *)(void *)s : NULL;
    char d[160];
    if (r != CUDA_SUCCESS) {
    } else if (is_legacy(s)) {
        r = bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn, "the legacy stream can't be captured");
    } else if (!st) {
        r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                "capturing CU_STREAM_PER_THREAD is not modelled by the test device");
    } else if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "unknown capture mode %d", (int)mode);
    } else if (st->capture) {
        r = bad(CUDA_ERROR_ILLEGAL_STATE, fn, "stream %p is already capturing: it belongs to %s%s",
                (void *)s, describe(st->capture, d, sizeof d),
                st->capture->invalidated ? ", invalidated (end it first)" : "");
    } else {
        fake_capture *c = calloc(1, sizeof *c);
        fake_graph *g = calloc(1, sizeof *g);
        if (!c || !g || !set_add(&captures, c)) {
            free(c);
            free(g);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (!set_add(&c->members, st)) {
            set_remove(&captures, c);
            free(c);
            free(g);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            g->magic = GRAPH_MAGIC;
            c->graph = g;
            c->id = ++capture_seq;
            c->mode = mode;
            c->origin = st;
            c->thread = pthread_self();
            st->capture = c;
            st->deps.n = 0;
        }
    }
    td_unlock();
    return r;
}

/* The capture ends: its streams are no longer capturing; its graph (if not handed out) is
 * freed. Events recorded in it stay "captured" (in a capture that has ended). */
static void end_capture(fake_capture *c)
{
    for (size_t i = 0; i < c->members.n; i++) {
        fake_stream *st = c->members.items[i];
        st->capture = NULL;
        idx_free(&st->deps);
    }
    free(c->members.items);
    set_remove(&captures, c);
    graph_free(c->graph);
    free(c);
}

/* The first node that the origin stream's dependencies do not reach (n if none): work on a
 * forked stream that was never joined back. */
static size_t unjoined_node(const fake_capture *c)
{
    const node_list *l = &c->graph->nodes;
    if (l->n == 0)
        return 0;
    unsigned char *reached = calloc(l->n, 1);
    if (!reached)
        return l->n; /* out of memory: no verdict */
    for (size_t i = 0; i < c->origin->deps.n; i++)
        reached[c->origin->deps.items[i]] = 1;
    for (size_t i = l->n; i-- > 0;) /* dependencies always point backwards */
        if (reached[i])
            for (size_t k = 0; k < l->items[i]->n_deps; k++)
                reached[l->items[i]->deps[k]] = 1;
    size_t first = l->n;
    for (size_t i = 0; i < l->n && first == l->n; i++)
        if (!reached[i])
            first = i;
    free(reached);
    return first;
}

CUresult td_cuStreamEndCapture(CUstream s, CUgraph *g)
{
    static const char fn[] = "cuStreamEndCapture";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), not_null(g, fn, "graph out-pointer"));
    fake_stream *st = (uintptr_t)s > 2 ? (fake_stream *)(void *)s : NULL;
    fake_capture *c = st ? st->capture : NULL;
    char d[160];
    if (r != CUDA_SUCCESS) {
    } else if (!c) {
        r = bad(CUDA_ERROR_ILLEGAL_STATE, fn, "stream %p is not capturing", (void *)s);
    } else if (c->origin != st) {
        describe(c, d, sizeof d);
        invalidate(c, "cuStreamEndCapture was called on a stream that joined it");
        r = bad(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, fn,
                "stream %p joined %s but did not begin it: the capture ends on its origin "
                "stream; it is invalidated",
                (void *)s, d);
    } else if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
               !pthread_equal(c->thread, pthread_self())) {
        describe(c, d, sizeof d);
        invalidate(c, "cuStreamEndCapture was called from another thread");
        r = bad(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, fn,
                "%s must be ended by the thread that began it; it is invalidated", d);
    } else {
        *g = NULL;
        size_t loose = c->invalidated ? 0 : unjoined_node(c);
        if (c->invalidated) {
            r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED; /* counted when it was invalidated */
        } else if (loose < c->graph->nodes.n) {
            /* A mistake of the caller's program that the driver reports (and safecuda
             * passes on as an invalidated capture): not misuse. */
            r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
        } else if (!set_add(&graphs, c->graph)) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *g = (CUgraph)(void *)c->graph;
            c->graph = NULL;
        }
        end_capture(c);
    }
    td_unlock();
    return r;
}

static CUresult capture_status(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id,
                               const char *fn)
{
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), not_null(status, fn, "status"));
    if (r == CUDA_SUCCESS && is_legacy(s) && implicit_conflict()) {
        char d[160];
        r = bad(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, fn,
                "the legacy stream was queried while %s has a blocking stream (the capture is "
                "not invalidated)",
                describe(implicit_conflict(), d, sizeof d));
    }
    if (r == CUDA_SUCCESS) {
        const fake_capture *c = (uintptr_t)s > 2 ? ((fake_stream *)(void *)s)->capture : NULL;
        *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
                     : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
        if (id)
            *id = c ? c->id : 0;
    }
    td_unlock();
    return r;
}

CUresult td_cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status)
{
    return capture_status(s, status, NULL, "cuStreamIsCapturing");
}

CUresult td_cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id)
{
    return capture_status(s, status, id, "cuStreamGetCaptureInfo");
}
