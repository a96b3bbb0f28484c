/* Stream capture: the state of captures in progress, their shadow ordering, what they
 * remember, and the refusals that keep them valid (see capture.h). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/guard.h"
#include "core/log.h"
#include "driver/driver.h"
#include "stream/capture.h"

typedef struct member {
    sci_stream *stream; /* valid while the capture is active: a member's destroy abandons it */
} member;

/* The capture's view of one object's uses inside it (order.h's tracker, for captured work). */
typedef struct shadow {
    uint64_t id;         /* the object's handle id */
    uint64_t write;      /* member stream id of the last captured write (0: none) */
    uint64_t *reads;     /* member stream ids of the captured reads since */
    size_t n_reads, cap_reads;
} shadow;

struct sci_capture {
    pthread_mutex_t lock; /* members, shadow, list, events, broken */
    int refs;             /* under capture_lock: 1 while active, 1 per sci_stream_capture */
    bool active;          /* under capture_lock */
    uint64_t id;
    sci_context *ctx;
    int mode;
    pthread_t thread;     /* the thread that began it */
    sci_stream *origin;   /* the stream it began on */
    member *members;      /* members[0] is the origin */
    size_t n_members, cap_members;
    shadow *shadows;
    size_t n_shadows, cap_shadows;
    CUevent *events;      /* ordering events recorded inside the capture */
    size_t n_events, cap_events;
    sci_capture_list list;
    sci_guard guard;      /* registered with core/guard.h while active */
    bool broken;          /* a host allocation failed: the graph would miss an object */
    bool adopted;         /* begun by another library on a wrapped stream: never ended here */
    uint64_t driver_id;   /* the driver's id of an adopted capture */
    CUstream origin_cu;   /* its origin's CUstream (the origin record may go first) */
    sci_capture *next;    /* the active list */
};

static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
/* Adopted captures on the active list (changed under capture_lock): while there are none,
 * resolving one of safecuda's own streams takes no lock to look for one. */
static atomic_int adopted_active;
static sci_capture *active_list;
static uint64_t next_id = 1;

static const char *const mode_names[] = {"global", "thread-local", "relaxed"};

/* ---- lists ------------------------------------------------------------------------------- */

bool sci_capture_list_add(sci_capture_list *l, uint64_t id, sci_access_mode mode)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->entries[i].id == id) {
            l->entries[i].mode |= mode;
            return true;
        }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        sci_capture_entry *grown = realloc(l->entries, cap * sizeof *grown);
        if (!grown)
            return false;
        l->entries = grown;
        l->cap = cap;
    }
    l->entries[l->n++] = (sci_capture_entry){id, mode};
    return true;
}

void sci_capture_list_free(sci_capture_list *l)
{
    free(l->entries);
    memset(l, 0, sizeof *l);
}

/* ---- references and lookups ----------------------------------------------------------------- */

static void capture_free(sci_capture *cap)
{
    for (size_t i = 0; i < cap->n_shadows; i++)
        free(cap->shadows[i].reads);
    free(cap->shadows);
    free(cap->members);
    free(cap->events);
    sci_capture_list_free(&cap->list);
    pthread_mutex_destroy(&cap->lock);
    free(cap);
}

sci_capture *sci_stream_capture(sci_stream *stream)
{
    pthread_mutex_lock(&capture_lock);
    sci_capture *cap = stream->capture;
    if (cap)
        cap->refs++;
    pthread_mutex_unlock(&capture_lock);
    return cap;
}

void sci_capture_put(sci_capture *cap)
{
    if (!cap)
        return;
    pthread_mutex_lock(&capture_lock);
    bool last = --cap->refs == 0;
    pthread_mutex_unlock(&capture_lock);
    if (last)
        capture_free(cap);
}

bool sci_stream_is_capturing_now(sci_stream *stream)
{
    sci_capture_sync(stream, "");
    pthread_mutex_lock(&capture_lock);
    bool capturing = stream->capture != NULL;
    pthread_mutex_unlock(&capture_lock);
    return capturing;
}

uint64_t sci_stream_capture_id(sci_stream *stream)
{
    pthread_mutex_lock(&capture_lock);
    uint64_t id = stream->capture ? stream->capture->id : 0;
    pthread_mutex_unlock(&capture_lock);
    return id;
}

bool sci_capture_active(uint64_t id)
{
    pthread_mutex_lock(&capture_lock);
    bool found = false;
    for (sci_capture *c = active_list; c && !found; c = c->next)
        found = c->id == id;
    pthread_mutex_unlock(&capture_lock);
    return found;
}

/* "stream 'decode' (created at app.c:12) takes part in capture 3 (global, begun on stream
 * 'decode')" */
static void describe_capture(const sci_stream *stream, const sci_capture *cap, char *buf,
                             size_t size)
{
    const sci_stream *origin = cap->origin;
    if (cap->adopted)
        snprintf(buf, size,
                 "stream '%s' (created at %s:%d) takes part in capture %llu (begun by another "
                 "library on wrapped stream '%s')",
                 stream->obj.label, sci_basename(stream->obj.file), stream->obj.line,
                 (unsigned long long)cap->id, origin->obj.label);
    else
        snprintf(buf, size,
                 "stream '%s' (created at %s:%d) takes part in capture %llu (%s mode, begun on "
                 "stream '%s')",
                 stream->obj.label, sci_basename(stream->obj.file), stream->obj.line,
                 (unsigned long long)cap->id, mode_names[cap->mode], origin->obj.label);
}

sc_status sci_capture_refuse_stream(sci_stream *stream, const char *fn, const char *what)
{
    pthread_mutex_lock(&capture_lock);
    sci_capture *cap = stream->capture;
    char desc[400];
    if (cap)
        describe_capture(stream, cap, desc, sizeof desc);
    pthread_mutex_unlock(&capture_lock);
    if (!cap)
        return SC_OK;
    return sci_fail(SC_ERR_CAPTURE, fn,
                    "%s can't be part of a graph, and %s: nothing was done and the capture is "
                    "still usable",
                    what, desc);
}

/* ---- begin, end, abandon ---------------------------------------------------------------------- */

static bool add_member(sci_capture *cap, sci_stream *stream)
{
    if (cap->n_members == cap->cap_members) {
        size_t n = cap->cap_members ? cap->cap_members * 2 : 4;
        member *grown = realloc(cap->members, n * sizeof *grown);
        if (!grown)
            return false;
        cap->members = grown;
        cap->cap_members = n;
    }
    cap->members[cap->n_members++] = (member){stream};
    return true;
}

/* Record the event that stands for stream's work before it takes part in a capture. */
static sc_status record_pre_capture(sci_stream *stream, const char *fn)
{
    CUresult r = CUDA_SUCCESS;
    if (!stream->pre_capture)
        r = sci_cuEventCreate(&stream->pre_capture, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS)
        r = sci_cuEventRecord(stream->pre_capture, stream->cu);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(stream->ctx, r, fn,
                                   "recording the stream's point before the capture failed");
    atomic_store(&stream->pre_capture_valid, true);
    return SC_OK;
}

/* Record a wrapped stream's point unless it takes part in a capture (safecuda's own record
 * of that is enough: the caller resolved the stream, or wrapped it, moments ago); while it
 * does, invalidate makes its older point unusable. */
static sc_status mark_wrapped(sci_stream *stream, bool invalidate, const char *fn)
{
    if (!stream->wrapped)
        return SC_OK;
    pthread_mutex_lock(&capture_lock);
    bool capturing = stream->capture != NULL;
    pthread_mutex_unlock(&capture_lock);
    if (!capturing)
        return record_pre_capture(stream, fn);
    if (invalidate)
        atomic_store(&stream->pre_capture_valid, false);
    return SC_OK;
}

sc_status sci_stream_note_owner_writes(sci_stream *stream, const char *fn)
{
    return mark_wrapped(stream, true, fn);
}

sc_status sci_stream_mark_wrapped(sci_stream *stream, const char *fn)
{
    return mark_wrapped(stream, false, fn);
}

sc_status sci_capture_begin(sci_stream *stream, int mode, const char *fn)
{
    if (sci_stream_is_capturing_now(stream))
        return sci_capture_refuse_stream(stream, fn, "beginning another capture");
    sci_capture *cap = calloc(1, sizeof *cap);
    if (!cap || !add_member(cap, stream)) {
        free(cap);
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a capture");
    }
    pthread_mutex_init(&cap->lock, NULL);
    cap->ctx = stream->ctx;
    cap->origin = stream;
    cap->mode = mode;
    cap->thread = pthread_self();
    sc_status s = record_pre_capture(stream, fn);
    if (s == SC_OK) {
        CUresult r = sci_cuStreamBeginCapture(stream->cu, (CUstreamCaptureMode)mode);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(stream->ctx, r, fn, "cuStreamBeginCapture(%s mode) failed",
                                    mode_names[mode]);
    }
    if (s != SC_OK) {
        capture_free(cap);
        return s;
    }
    /* Registered (list and guard) under capture_lock: no other thread can retire it before
     * its guard is in place. The guard's lock is taken inside capture_lock, never around. */
    pthread_mutex_lock(&capture_lock);
    cap->id = next_id++;
    cap->refs = 1;
    cap->active = true;
    cap->next = active_list;
    active_list = cap;
    stream->capture = cap;
    cap->guard.mode = mode;
    cap->guard.ctx = stream->ctx;
    cap->guard.thread = cap->thread;
    snprintf(cap->guard.what, sizeof cap->guard.what,
             "capture %llu (%s mode, begun on stream '%s', created at %s:%d)",
             (unsigned long long)cap->id, mode_names[mode], stream->obj.label,
             sci_basename(stream->obj.file), stream->obj.line);
    sci_guard_add(&cap->guard);
    pthread_mutex_unlock(&capture_lock);
    return SC_OK;
}

/* Take cap off the active list and its streams out of it (capture_lock held). */
static void retire_locked(sci_capture *cap)
{
    for (sci_capture **p = &active_list; *p; p = &(*p)->next)
        if (*p == cap) {
            *p = cap->next;
            break;
        }
    cap->active = false;
    if (cap->adopted)
        atomic_fetch_sub(&adopted_active, 1);
    pthread_mutex_lock(&cap->lock);
    for (size_t i = 0; i < cap->n_members; i++)
        if (cap->members[i].stream->capture == cap)
            cap->members[i].stream->capture = NULL;
    pthread_mutex_unlock(&cap->lock);
}

/* After the driver ended the capture: destroy its ordering events, hand over its list,
 * drop the active reference, run what was deferred. */
static void finish(sci_capture *cap, sci_capture_list *list)
{
    pthread_mutex_lock(&cap->lock);
    for (size_t i = 0; i < cap->n_events; i++)
        sci_cuEventDestroy(cap->events[i]); /* they became graph edges; nothing waits on them */
    cap->n_events = 0;
    if (list) {
        *list = cap->list;
        memset(&cap->list, 0, sizeof cap->list);
    }
    pthread_mutex_unlock(&cap->lock);
    sci_guard_remove(&cap->guard); /* runs the releases it deferred */
    sci_capture_put(cap);
}

sc_status sci_capture_end(sci_stream *stream, CUgraph *graph, sci_capture_list *list,
                          const char *fn)
{
    *graph = NULL;
    memset(list, 0, sizeof *list);
    pthread_mutex_lock(&capture_lock);
    sci_capture *cap = stream->capture;
    if (!cap) {
        pthread_mutex_unlock(&capture_lock);
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "stream '%s' (created at %s:%d) is not capturing",
                        stream->obj.label, sci_basename(stream->obj.file), stream->obj.line);
    }
    if (cap->adopted) {
        pthread_mutex_unlock(&capture_lock);
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "wrapped stream '%s' (created at %s:%d) is being captured by the "
                        "library that made it (capture %llu, adopted by safecuda): end it "
                        "there (torch.cuda.graph ends it when its block ends)",
                        stream->obj.label, sci_basename(stream->obj.file), stream->obj.line,
                        (unsigned long long)cap->id);
    }
    const sci_stream *origin = cap->origin;
    if (origin != stream) {
        pthread_mutex_unlock(&capture_lock);
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "stream '%s' (created at %s:%d) joined capture %llu, which began on "
                        "stream '%s' (created at %s:%d): end it there",
                        stream->obj.label, sci_basename(stream->obj.file), stream->obj.line,
                        (unsigned long long)cap->id, origin->obj.label,
                        sci_basename(origin->obj.file), origin->obj.line);
    }
    if (cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(cap->thread, pthread_self())) {
        pthread_mutex_unlock(&capture_lock);
        return sci_fail(SC_ERR_CAPTURE, fn,
                        "capture %llu on stream '%s' was begun in %s mode on another thread: "
                        "CUDA lets only that thread end it (the capture goes on)",
                        (unsigned long long)cap->id, stream->obj.label, mode_names[cap->mode]);
    }
    retire_locked(cap);
    pthread_mutex_unlock(&capture_lock);

    CUresult r = sci_cuStreamEndCapture(stream->cu, graph);
    sc_status s = SC_OK;
    if (r != CUDA_SUCCESS) {
        *graph = NULL;
        if (r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
            s = sci_fail(SC_ERR_CAPTURE_INVALIDATED, fn,
                         "capture %llu on stream '%s': a stream forked into it has work the "
                         "origin never waited for (join it: record an event on that stream "
                         "after its work and make '%s' wait on it before ending); no graph",
                         (unsigned long long)cap->id, stream->obj.label, stream->obj.label);
        else
            s = sci_context_fail_cu(stream->ctx, r, fn,
                                    "cuStreamEndCapture of capture %llu on stream '%s' failed: "
                                    "no graph",
                                    (unsigned long long)cap->id, stream->obj.label);
    } else if (cap->broken) {
        sci_cuGraphDestroy(*graph);
        *graph = NULL;
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn,
                     "capture %llu: out of host memory while remembering the objects its work "
                     "uses; no graph", (unsigned long long)cap->id);
    }
    finish(cap, s == SC_OK ? list : NULL);
    return s;
}

void sci_capture_abandon(sci_stream *stream, const char *fn)
{
    pthread_mutex_lock(&capture_lock);
    sci_capture *cap = stream->capture;
    if (!cap) {
        pthread_mutex_unlock(&capture_lock);
        return;
    }
    sci_stream *origin = cap->origin;
    if (cap->adopted && origin != stream) {
        /* A stream that joined another library's capture leaves it alone; the capture goes
         * on (the caller defers the stream's destroy until it ends). */
        pthread_mutex_lock(&cap->lock);
        for (size_t i = 0; i < cap->n_members; i++)
            if (cap->members[i].stream == stream) {
                cap->members[i] = cap->members[--cap->n_members];
                break;
            }
        pthread_mutex_unlock(&cap->lock);
        stream->capture = NULL;
        pthread_mutex_unlock(&capture_lock);
        return;
    }
    retire_locked(cap);
    pthread_mutex_unlock(&capture_lock);
    if (cap->adopted) { /* another library's capture: it goes on, safecuda stops following */
        finish(cap, NULL);
        return;
    }
    CUgraph g = NULL;
    CUresult r = sci_cuStreamEndCapture(origin->cu, &g);
    if (g)
        sci_cuGraphDestroy(g);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED &&
        r != CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
        sci_log(SC_LOG_WARN, "%s: abandoning capture %llu of stream '%s': cuStreamEndCapture "
                "answered %s", fn, (unsigned long long)cap->id, origin->obj.label,
                sci_cu_error_name(r));
    else
        sci_log(SC_LOG_WARN, "%s: capture %llu (begun on stream '%s', created at %s:%d) was "
                "abandoned: a stream taking part in it is being destroyed",
                fn, (unsigned long long)cap->id, origin->obj.label,
                sci_basename(origin->obj.file), origin->obj.line);
    finish(cap, NULL);
}

/* ---- captures other libraries begin on wrapped streams ------------------------------------- */

bool sci_capture_is_adopted(sci_stream *stream)
{
    pthread_mutex_lock(&capture_lock);
    bool adopted = stream->capture && stream->capture->adopted;
    pthread_mutex_unlock(&capture_lock);
    return adopted;
}

/* Retire adopted capture cap (referenced by the caller) if its owner ended it: the driver
 * reports its origin stream capturing nothing, or another capture. */
static void retire_if_ended(sci_capture *cap)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t driver_id = 0;
    CUresult r = sci_cuStreamGetCaptureInfo(cap->origin_cu, &status, &driver_id);
    /* An answer that is not CUDA_SUCCESS: the owner destroyed its stream, which ends its
     * capture too. */
    bool ended = r != CUDA_SUCCESS || status == CU_STREAM_CAPTURE_STATUS_NONE ||
                 driver_id != cap->driver_id;
    if (!ended)
        return;
    pthread_mutex_lock(&capture_lock);
    bool retire = cap->active;
    if (retire)
        retire_locked(cap);
    pthread_mutex_unlock(&capture_lock);
    if (retire)
        finish(cap, NULL);
}

/* core/guard.h's refresh: every adopted capture whose owner ended it is retired. */
static void refresh_adopted(void)
{
    enum { MAX = 16 };
    sci_capture *caps[MAX];
    size_t n = 0;
    pthread_mutex_lock(&capture_lock);
    for (sci_capture *c = active_list; c && n < MAX; c = c->next)
        if (c->adopted) {
            c->refs++;
            caps[n++] = c;
        }
    pthread_mutex_unlock(&capture_lock);
    for (size_t i = 0; i < n; i++) {
        retire_if_ended(caps[i]);
        sci_capture_put(caps[i]);
    }
}

__attribute__((constructor)) static void register_refresh(void)
{
    sci_guard_set_refresh(refresh_adopted);
}

void sci_capture_sync(sci_stream *stream, const char *fn)
{
    if (stream->wrapped) {
        sci_capture_sync_wrapped(stream, fn);
        return;
    }
    /* One of safecuda's own streams that joined an adopted capture (a fork). */
    if (atomic_load(&adopted_active) == 0)
        return;
    pthread_mutex_lock(&capture_lock);
    sci_capture *cap = stream->capture;
    if (cap && cap->adopted)
        cap->refs++;
    else
        cap = NULL;
    pthread_mutex_unlock(&capture_lock);
    if (!cap)
        return;
    retire_if_ended(cap);
    sci_capture_put(cap);
}

void sci_capture_sync_wrapped(sci_stream *stream, const char *fn)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t driver_id = 0;
    if (sci_cuStreamGetCaptureInfo(stream->cu, &status, &driver_id) != CUDA_SUCCESS)
        return; /* the operation's own driver call reports what is wrong with the stream */
    bool capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;

    /* An adopted capture that its owner ended (or replaced): stop following it. */
    pthread_mutex_lock(&capture_lock);
    sci_capture *old = stream->capture;
    if (old && old->adopted && old->active && (!capturing || old->driver_id != driver_id))
        retire_locked(old);
    else
        old = NULL;
    bool adopt = capturing && !stream->capture;
    pthread_mutex_unlock(&capture_lock);
    if (old)
        finish(old, NULL);
    if (!adopt)
        return;

    /* Adopt it: prepared outside the lock, installed under it unless another thread did. */
    sci_capture *cap = calloc(1, sizeof *cap);
    if (!cap || !add_member(cap, stream)) {
        free(cap);
        sci_log(SC_LOG_WARN, "%s: out of host memory while adopting the capture of wrapped "
                "stream '%s': its work is ordered as outside a capture",
                fn[0] ? fn : "safecuda", stream->obj.label);
        return;
    }
    pthread_mutex_init(&cap->lock, NULL);
    cap->ctx = stream->ctx;
    cap->origin = stream;
    cap->origin_cu = stream->cu;
    cap->mode = CU_STREAM_CAPTURE_MODE_GLOBAL; /* the driver doesn't say: the strictest */
    cap->thread = pthread_self();
    cap->adopted = true;
    cap->driver_id = driver_id;
    cap->guard.mode = cap->mode;
    cap->guard.ctx = stream->ctx;
    cap->guard.thread = cap->thread;
    cap->guard.adopted = true;
    pthread_mutex_lock(&capture_lock);
    bool installed = false;
    if (!stream->capture) {
        /* The same driver capture adopted through another wrapped stream: join it. */
        sci_capture *joined = NULL;
        for (sci_capture *c = active_list; c && !joined; c = c->next)
            if (c->adopted && c->driver_id == driver_id && c->ctx == stream->ctx)
                joined = c;
        if (joined) {
            pthread_mutex_lock(&joined->lock);
            bool ok = add_member(joined, stream);
            pthread_mutex_unlock(&joined->lock);
            if (ok)
                stream->capture = joined;
        } else {
            cap->id = next_id++;
            cap->refs = 1;
            cap->active = true;
            cap->next = active_list;
            active_list = cap;
            atomic_fetch_add(&adopted_active, 1);
            stream->capture = cap;
            snprintf(cap->guard.what, sizeof cap->guard.what,
                     "capture %llu (begun by another library on wrapped stream '%s', created "
                     "at %s:%d)",
                     (unsigned long long)cap->id, stream->obj.label,
                     sci_basename(stream->obj.file), stream->obj.line);
            sci_guard_add(&cap->guard); /* under capture_lock, as in sci_capture_begin */
            installed = true;
        }
    }
    pthread_mutex_unlock(&capture_lock);
    if (!installed)
        capture_free(cap);
}

/* ---- waits on events: forks, and the waits a capture can't contain ------------------------ */

sc_status sci_capture_before_wait(sci_stream *stream, uint64_t event_capture, const char *fn)
{
    pthread_mutex_lock(&capture_lock);
    sci_capture *mine = stream->capture, *theirs = NULL;
    for (sci_capture *c = active_list; c && event_capture; c = c->next)
        if (c->id == event_capture)
            theirs = c;
    char desc[400] = "";
    if (mine)
        describe_capture(stream, mine, desc, sizeof desc);
    sc_status s = SC_OK;
    if (event_capture == 0 && mine) {
        s = sci_fail(SC_ERR_CAPTURE, fn,
                     "the event was recorded outside any capture and %s: a graph can't wait "
                     "for work outside it (a replay is ordered after conflicting work on its "
                     "buffers by itself; or wait before beginning the capture): nothing was "
                     "done and the capture is still usable",
                     desc);
    } else if (event_capture && !theirs) {
        s = sci_fail(SC_ERR_CAPTURE, fn,
                     "the event was last recorded inside capture %llu, which has ended: record "
                     "it again outside a capture before waiting on it",
                     (unsigned long long)event_capture);
    } else if (theirs && mine && theirs != mine) {
        s = sci_fail(SC_ERR_CAPTURE, fn,
                     "the event was recorded inside capture %llu and %s: two captures can't be "
                     "joined; nothing was done",
                     (unsigned long long)event_capture, desc);
    } else if (theirs && theirs->ctx != stream->ctx) {
        s = sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                     "the event was recorded inside a capture of another context");
    } else if (theirs && !mine) {
        /* A fork: the stream joins the capture with its wait. */
        s = record_pre_capture(stream, fn);
        if (s == SC_OK) {
            pthread_mutex_lock(&theirs->lock);
            bool ok = add_member(theirs, stream);
            pthread_mutex_unlock(&theirs->lock);
            if (ok)
                stream->capture = theirs;
            else
                s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot add a stream to a capture");
        }
    }
    pthread_mutex_unlock(&capture_lock);
    return s;
}

/* ---- captured work: ordering among the capture's streams, what it remembers --------------- */

static shadow *find_shadow(sci_capture *cap, uint64_t id)
{
    for (size_t i = 0; i < cap->n_shadows; i++)
        if (cap->shadows[i].id == id)
            return &cap->shadows[i];
    if (cap->n_shadows == cap->cap_shadows) {
        size_t n = cap->cap_shadows ? cap->cap_shadows * 2 : 8;
        shadow *grown = realloc(cap->shadows, n * sizeof *grown);
        if (!grown)
            return NULL;
        cap->shadows = grown;
        cap->cap_shadows = n;
    }
    shadow *sh = &cap->shadows[cap->n_shadows++];
    memset(sh, 0, sizeof *sh);
    sh->id = id;
    return sh;
}

static sci_stream *member_stream(sci_capture *cap, uint64_t id)
{
    for (size_t i = 0; i < cap->n_members; i++)
        if (cap->members[i].stream->obj.id == id)
            return cap->members[i].stream;
    return NULL;
}

/* Make stream wait (inside the capture) for what member stream `on` has captured so far. */
static sc_status wait_member(sci_capture *cap, uint64_t on, sci_stream *stream,
                             uint64_t *waited, size_t *n_waited, const char *fn)
{
    if (on == 0 || on == stream->obj.id)
        return SC_OK;
    for (size_t i = 0; i < *n_waited; i++)
        if (waited[i] == on)
            return SC_OK;
    sci_stream *other = member_stream(cap, on);
    if (!other)
        return SC_OK; /* not a member any more: nothing of its work is in the graph */
    if (cap->n_events == cap->cap_events) {
        size_t n = cap->cap_events ? cap->cap_events * 2 : 8;
        CUevent *grown = realloc(cap->events, n * sizeof *grown);
        if (!grown)
            return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot grow a capture's events");
        cap->events = grown;
        cap->cap_events = n;
    }
    CUevent ev = NULL;
    CUresult r = sci_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS) {
        cap->events[cap->n_events++] = ev;
        r = sci_cuEventRecord(ev, other->cu);
    }
    if (r == CUDA_SUCCESS)
        r = sci_cuStreamWaitEvent(stream->cu, ev, 0);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(stream->ctx, r, fn,
                                   "ordering captured work after stream '%s' inside capture "
                                   "%llu failed",
                                   other->obj.label, (unsigned long long)cap->id);
    if (*n_waited < 64)
        waited[(*n_waited)++] = on;
    return SC_OK;
}

sc_status sci_capture_access_begin(sci_capture *cap, sci_access *acc, size_t n,
                                   sci_stream *stream, bool order, const char *fn)
{
    pthread_mutex_lock(&cap->lock);
    if (!order) /* tracking off: the caller orders its streams, inside captures too */
        return SC_OK;
    uint64_t waited[64];
    size_t n_waited = 0;
    sc_status s = SC_OK;
    for (size_t i = 0; i < n && s == SC_OK; i++) {
        shadow *sh = find_shadow(cap, acc[i].tracker->owner_id);
        if (!sh) {
            s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot grow a capture's records");
            break;
        }
        s = wait_member(cap, sh->write, stream, waited, &n_waited, fn);
        for (size_t j = 0; j < sh->n_reads && s == SC_OK && (acc[i].mode & SCI_WRITE); j++)
            s = wait_member(cap, sh->reads[j], stream, waited, &n_waited, fn);
    }
    if (s != SC_OK)
        pthread_mutex_unlock(&cap->lock);
    return s;
}

sc_status sci_capture_order_object(sci_stream *stream, uint64_t id, const char *fn)
{
    sci_capture *cap = sci_stream_capture(stream);
    if (!cap)
        return SC_OK;
    pthread_mutex_lock(&cap->lock);
    sc_status s = SC_OK;
    shadow *sh = NULL;
    for (size_t i = 0; i < cap->n_shadows && !sh; i++)
        if (cap->shadows[i].id == id)
            sh = &cap->shadows[i];
    if (sh) {
        uint64_t waited[64];
        size_t n_waited = 0;
        s = wait_member(cap, sh->write, stream, waited, &n_waited, fn);
        for (size_t j = 0; j < sh->n_reads && s == SC_OK; j++)
            s = wait_member(cap, sh->reads[j], stream, waited, &n_waited, fn);
    }
    pthread_mutex_unlock(&cap->lock);
    sci_capture_put(cap);
    return s;
}

void sci_capture_remember_locked(sci_capture *cap, uint64_t id, sci_access_mode mode)
{
    if (!sci_capture_list_add(&cap->list, id, mode))
        cap->broken = true;
}

void sci_capture_access_end(sci_capture *cap, sci_access *acc, size_t n, sci_stream *stream,
                            bool enqueued)
{
    for (size_t i = 0; i < n && enqueued; i++) {
        sci_capture_remember_locked(cap, acc[i].tracker->owner_id, acc[i].mode);
        shadow *sh = find_shadow(cap, acc[i].tracker->owner_id);
        if (!sh) {
            cap->broken = true;
            continue;
        }
        const uint64_t me = stream->obj.id;
        if (acc[i].mode & SCI_WRITE) {
            sh->write = me;
            sh->n_reads = 0;
            continue;
        }
        bool seen = false;
        for (size_t j = 0; j < sh->n_reads; j++)
            seen |= sh->reads[j] == me;
        if (seen)
            continue;
        if (sh->n_reads == sh->cap_reads) {
            size_t c = sh->cap_reads ? sh->cap_reads * 2 : 2;
            uint64_t *grown = realloc(sh->reads, c * sizeof *grown);
            if (!grown) { /* keep it ordered: count the read as the write */
                sh->write = me;
                sh->n_reads = 0;
                continue;
            }
            sh->reads = grown;
            sh->cap_reads = c;
        }
        sh->reads[sh->n_reads++] = me;
    }
    pthread_mutex_unlock(&cap->lock);
}
