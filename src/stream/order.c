#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream/capture.h"
#include "stream/order.h"

void sci_tracker_init(sci_tracker *t, uint64_t owner_id)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->lock, NULL);
    t->owner_id = owner_id;
}

CUresult sci_tracker_destroy(sci_tracker *t)
{
    CUresult first = CUDA_SUCCESS, r;
    if (t->write.event && (r = sci_cuEventDestroy(t->write.event)) != CUDA_SUCCESS)
        first = r;
    for (size_t i = 0; i < t->cap_reads; i++)
        if (t->reads[i].event && (r = sci_cuEventDestroy(t->reads[i].event)) != CUDA_SUCCESS &&
            first == CUDA_SUCCESS)
            first = r;
    free(t->reads);
    pthread_mutex_destroy(&t->lock);
    memset(t, 0, sizeof *t);
    return first;
}

/* The event that holds the use, in *ev: use->event, recorded now on the use's stream if
 * it was not recorded when the use was enqueued (a later record covers the use too). A
 * stream that was destroyed finished its work first, so its use needs no event: *gone is
 * set. A stream that takes part in a capture now can't record (that would go into the
 * graph): its use came before the capture, and the event it recorded when it joined the
 * capture holds it. */
static sc_status ensure_event(sci_use *use, sci_context *ctx, const char *fn, bool *gone,
                              CUevent *ev)
{
    *gone = false;
    *ev = use->event;
    if (use->recorded)
        return SC_OK;
    sci_object *obj = NULL;
    if (sci_registry_acquire(SCI_KIND_STREAM, use->stream_id, fn, &obj) != SC_OK) {
        *gone = true;
        return SC_OK;
    }
    sci_stream *s = (sci_stream *)obj;
    if (sci_stream_is_capturing_now(s)) {
        /* A capture another library began on a wrapped stream left no event behind. */
        bool valid = atomic_load(&s->pre_capture_valid);
        char label[64];
        snprintf(label, sizeof label, "%s", s->obj.label);
        *ev = s->pre_capture;
        sci_registry_release(obj);
        if (!valid)
            return sci_fail(SC_ERR_CAPTURE, fn,
                            "the object was used on wrapped stream '%s' before the library "
                            "that made that stream began capturing it, and no event holds "
                            "that use: wait for the stream before the capture begins, or use "
                            "the object on the capturing stream", label);
        return SC_OK;
    }
    CUresult r = CUDA_SUCCESS;
    if (!use->event)
        r = sci_cuEventCreate(&use->event, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS)
        r = sci_cuEventRecord(use->event, s->cu);
    sci_registry_release(obj);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(ctx, r, fn, "recording an ordering event failed");
    use->recorded = true;
    *ev = use->event;
    return SC_OK;
}

/* Make stream wait for use (if it is on another stream). */
static sc_status wait_for(sci_tracker *t, sci_use *use, sci_stream *stream, const char *fn)
{
    if (use->stream_id == 0 || use->stream_id == stream->obj.id)
        return SC_OK;
    t->eager = true; /* the object is now shared between streams */
    bool gone;
    CUevent ev;
    sc_status s = ensure_event(use, stream->ctx, fn, &gone, &ev);
    if (s != SC_OK)
        return s;
    if (gone) {
        use->stream_id = 0;
        return SC_OK;
    }
    CUresult r = sci_cuStreamWaitEvent(stream->cu, ev, 0);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(stream->ctx, r, fn, "cuStreamWaitEvent failed");
    return SC_OK;
}

static sc_status order_access(sci_tracker *t, sci_access_mode mode, sci_stream *stream,
                              const char *fn)
{
    /* Any access waits for the last write; a write also waits for the reads since. */
    sc_status s = wait_for(t, &t->write, stream, fn);
    if (s != SC_OK || !(mode & SCI_WRITE))
        return s;
    for (size_t i = 0; i < t->n_reads && s == SC_OK; i++)
        s = wait_for(t, &t->reads[i], stream, fn);
    return s;
}

sc_status sci_tracker_order_all(sci_tracker *t, sci_stream *stream, const char *fn)
{
    return order_access(t, SCI_READ_WRITE, stream, fn);
}

static void sort_and_merge(sci_access *acc, size_t *n)
{
    for (size_t i = 1; i < *n; i++) {
        sci_access a = acc[i];
        size_t j = i;
        while (j > 0 && acc[j - 1].tracker->owner_id > a.tracker->owner_id) {
            acc[j] = acc[j - 1];
            j--;
        }
        acc[j] = a;
    }
    size_t k = 0;
    for (size_t i = 0; i < *n; i++) {
        if (k > 0 && acc[k - 1].tracker == acc[i].tracker)
            acc[k - 1].mode |= acc[i].mode;
        else
            acc[k++] = acc[i];
    }
    *n = k;
}

sc_status sci_access_begin(sci_access *acc, size_t n, sci_stream *stream, bool order,
                           const char *fn, struct sci_capture **cap)
{
    sort_and_merge(acc, &n);
    *cap = NULL;
    /* read_only never changes once the object is published: no lock needed. Checked
     * before a capture is looked at, so a captured write is refused too. */
    for (size_t i = 0; i < n; i++)
        if ((acc[i].mode & SCI_WRITE) && acc[i].tracker->read_only) {
            char desc[240] = "an object";
            if (acc[i].tracker->describe)
                acc[i].tracker->describe(acc[i].tracker, desc, sizeof desc);
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "%s is read-only (borrowed or imported read-only): it can't be "
                            "written",
                            desc);
        }
    *cap = sci_stream_capture(stream);
    if (*cap) {
        sc_status s = sci_capture_access_begin(*cap, acc, n, stream, order, fn);
        if (s != SC_OK) {
            sci_capture_put(*cap);
            *cap = NULL;
        }
        return s;
    }
    for (size_t i = 0; i < n; i++)
        pthread_mutex_lock(&acc[i].tracker->lock);
    if (!order)
        return SC_OK;
    for (size_t i = 0; i < n; i++) {
        sc_status s = order_access(acc[i].tracker, acc[i].mode, stream, fn);
        if (s != SC_OK) {
            for (size_t j = n; j-- > 0;)
                pthread_mutex_unlock(&acc[j].tracker->lock);
            return s;
        }
    }
    return SC_OK;
}

/* Record a use on stream into use: at once when the object is shared between streams,
 * otherwise lazily (when a conflict needs the event). */
static sc_status note_use(sci_tracker *t, sci_use *use, sci_stream *stream, const char *fn)
{
    use->stream_id = stream->obj.id;
    use->cu = stream->cu;
    use->recorded = false;
    if (!t->eager)
        return SC_OK;
    CUresult r = CUDA_SUCCESS;
    const char *what = "cuEventCreate of an ordering event failed";
    if (!use->event)
        r = sci_cuEventCreate(&use->event, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS) {
        r = sci_cuEventRecord(use->event, stream->cu);
        what = "cuEventRecord of an ordering event failed";
    }
    /* On failure the event stays unrecorded: it is recorded lazily when needed. Only a
     * sticky error can't wait: it is reported (the context is lost). */
    use->recorded = (r == CUDA_SUCCESS);
    return sci_context_tolerate_cu(stream->ctx, r, fn, "%s", what);
}

static sc_status record(sci_tracker *t, sci_access_mode mode, sci_stream *stream,
                        const char *fn)
{
    if (mode & SCI_WRITE) {
        t->n_reads = 0; /* the events stay in their slots for reuse */
        return note_use(t, &t->write, stream, fn);
    }
    for (size_t i = 0; i < t->n_reads; i++)
        if (t->reads[i].stream_id == stream->obj.id)
            return note_use(t, &t->reads[i], stream, fn);
    if (t->n_reads == t->cap_reads) {
        size_t cap = t->cap_reads ? t->cap_reads * 2 : 2;
        sci_use *grown = realloc(t->reads, cap * sizeof *grown);
        if (!grown) /* out of host memory: make this read the write so it is still ordered */
            return note_use(t, &t->write, stream, fn);
        memset(grown + t->cap_reads, 0, (cap - t->cap_reads) * sizeof *grown);
        t->reads = grown;
        t->cap_reads = cap;
    }
    return note_use(t, &t->reads[t->n_reads++], stream, fn);
}

static _Thread_local bool defer_marks;

void sci_wrapped_marks_defer(bool on) { defer_marks = on; }

sc_status sci_access_end(sci_access *acc, size_t n, sci_stream *stream,
                         struct sci_capture *cap, bool enqueued, const char *fn)
{
    sort_and_merge(acc, &n); /* idempotent: same order and merge as begin */
    if (cap) {
        sci_capture_access_end(cap, acc, n, stream, enqueued);
        sci_capture_put(cap);
        return SC_OK;
    }
    sc_status s = SC_OK;
    for (size_t i = 0; i < n && enqueued; i++) {
        sc_status r = record(acc[i].tracker, acc[i].mode, stream, fn);
        if (s == SC_OK)
            s = r;
    }
    /* A wrapped stream's owner may begin a capture at any time, after which nothing can be
     * recorded there: its point after this work is recorded now, for later waits. */
    if (enqueued && stream->wrapped && n && !defer_marks) {
        sc_status r = sci_stream_mark_wrapped(stream, fn);
        if (s == SC_OK)
            s = r;
    }
    for (size_t j = n; j-- > 0;)
        pthread_mutex_unlock(&acc[j].tracker->lock);
    return s;
}

/* ---- accesses of work enqueued together on several streams ------------------------------ */

static int by_owner(const void *a, const void *b)
{
    uint64_t x = (*(sci_tracker *const *)a)->owner_id, y = (*(sci_tracker *const *)b)->owner_id;
    return x < y ? -1 : x > y;
}

static int by_capture(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const sci_access_set *)a)->cap;
    uintptr_t y = (uintptr_t)((const sci_access_set *)b)->cap;
    return x < y ? -1 : x > y;
}

/* The trackers of the sets that do not capture, sorted by owner (malloc'd; NULL with *n 0
 * when there are none). */
static sc_status gather(sci_access_set *sets, size_t n_sets, const char *fn, sci_tracker ***out,
                        size_t *n)
{
    size_t total = 0;
    for (size_t i = 0; i < n_sets; i++)
        if (!sets[i].cap)
            total += sets[i].n;
    *out = NULL;
    *n = 0;
    if (total == 0)
        return SC_OK;
    sci_tracker **all = malloc(total * sizeof *all);
    if (!all)
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    size_t k = 0;
    for (size_t i = 0; i < n_sets; i++)
        for (size_t j = 0; j < sets[i].n && !sets[i].cap; j++)
            all[k++] = sets[i].acc[j].tracker;
    qsort(all, k, sizeof *all, by_owner);
    size_t m = 0; /* (a tracker in two sets is the caller's bug: locked once anyway) */
    for (size_t i = 0; i < k; i++)
        if (m == 0 || all[m - 1] != all[i])
            all[m++] = all[i];
    *out = all;
    *n = m;
    return SC_OK;
}

static void unlock_all(sci_tracker **all, size_t n)
{
    for (size_t i = n; i-- > 0;)
        pthread_mutex_unlock(&all[i]->lock);
}

sc_status sci_access_begin_sets(sci_access_set *sets, size_t n_sets, const char *fn)
{
    for (size_t i = 0; i < n_sets; i++) {
        sets[i].cap = NULL;
        sort_and_merge(sets[i].acc, &sets[i].n);
        for (size_t j = 0; j < sets[i].n; j++)
            if ((sets[i].acc[j].mode & SCI_WRITE) && sets[i].acc[j].tracker->read_only) {
                char desc[240] = "an object";
                sci_tracker *t = sets[i].acc[j].tracker;
                if (t->describe)
                    t->describe(t, desc, sizeof desc);
                return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                                "%s is read-only (borrowed or imported read-only): it can't be "
                                "written",
                                desc);
            }
    }
    for (size_t i = 0; i < n_sets; i++)
        sets[i].cap = sci_stream_capture(sets[i].stream);
    /* Captures in one order (each lock once: two streams of one capture are refused). */
    qsort(sets, n_sets, sizeof *sets, by_capture);
    sc_status s = SC_OK;
    for (size_t i = 1; i < n_sets && s == SC_OK; i++)
        if (sets[i].cap && sets[i].cap == sets[i - 1].cap)
            s = sci_fail(SC_ERR_CAPTURE, fn,
                         "streams '%s' and '%s' take part in one capture: work enqueued "
                         "together must use one stream of a capture",
                         sets[i - 1].stream->obj.label, sets[i].stream->obj.label);
    sci_tracker **all = NULL;
    size_t n_all = 0;
    if (s == SC_OK)
        s = gather(sets, n_sets, fn, &all, &n_all);
    if (s != SC_OK) {
        for (size_t i = 0; i < n_sets; i++) {
            sci_capture_put(sets[i].cap);
            sets[i].cap = NULL;
        }
        return s;
    }
    for (size_t i = 0; i < n_all; i++)
        pthread_mutex_lock(&all[i]->lock);
    /* The sets may be on streams of several devices (a group of collectives over the GPUs
     * of one process): each set's events are made and recorded in its stream's context. */
    for (size_t i = 0; i < n_sets && s == SC_OK; i++) {
        if (!sets[i].cap && sets[i].stream->ctx->tracking && sets[i].n)
            s = sci_context_enter(sets[i].stream->ctx, fn);
        for (size_t j = 0; j < sets[i].n && s == SC_OK && !sets[i].cap &&
                           sets[i].stream->ctx->tracking;
             j++)
            s = order_access(sets[i].acc[j].tracker, sets[i].acc[j].mode, sets[i].stream, fn);
    }
    size_t begun = 0;
    for (; begun < n_sets && s == SC_OK; begun++)
        if (sets[begun].cap && (s = sci_context_enter(sets[begun].stream->ctx, fn)) == SC_OK)
            s = sci_capture_access_begin(sets[begun].cap, sets[begun].acc, sets[begun].n,
                                         sets[begun].stream, sets[begun].stream->ctx->tracking,
                                         fn);
    if (s != SC_OK) {
        /* The failed capture's begin unlocked it; the ones before it are ended unused. */
        for (size_t i = 0; i + 1 < begun; i++)
            if (sets[i].cap)
                sci_capture_access_end(sets[i].cap, sets[i].acc, sets[i].n, sets[i].stream,
                                       false);
        for (size_t i = 0; i < n_sets; i++) {
            sci_capture_put(sets[i].cap);
            sets[i].cap = NULL;
        }
        unlock_all(all, n_all);
    }
    free(all);
    return s;
}

sc_status sci_access_end_sets(sci_access_set *sets, size_t n_sets, bool enqueued,
                              const char *fn)
{
    sc_status s = SC_OK;
    for (size_t i = 0; i < n_sets; i++) {
        if (sets[i].cap)
            continue;
        if (enqueued && sets[i].n && n_sets > 1) {
            const char *call;
            CUresult r = sci_context_make_current_cu(sets[i].stream->ctx, &call);
            sc_status e = sci_context_tolerate_cu(sets[i].stream->ctx, r, fn, "%s failed", call);
            if (s == SC_OK)
                s = e;
        }
        for (size_t j = 0; j < sets[i].n && enqueued; j++) {
            sc_status r = record(sets[i].acc[j].tracker, sets[i].acc[j].mode, sets[i].stream,
                                 fn);
            if (s == SC_OK)
                s = r;
        }
        if (enqueued && sets[i].stream->wrapped && sets[i].n && !defer_marks) {
            sc_status r = sci_stream_mark_wrapped(sets[i].stream, fn);
            if (s == SC_OK)
                s = r;
        }
    }
    sci_tracker **all = NULL;
    size_t n_all = 0;
    if (gather(sets, n_sets, fn, &all, &n_all) != SC_OK) {
        /* No memory for the list: unlock set by set (each tracker is in one set). */
        for (size_t i = 0; i < n_sets; i++)
            for (size_t j = 0; j < sets[i].n && !sets[i].cap; j++)
                pthread_mutex_unlock(&sets[i].acc[j].tracker->lock);
    }
    unlock_all(all, n_all);
    free(all);
    for (size_t i = 0; i < n_sets; i++) {
        if (!sets[i].cap)
            continue;
        if (n_sets > 1) {
            const char *call;
            (void)sci_context_make_current_cu(sets[i].stream->ctx, &call);
        }
        sci_capture_access_end(sets[i].cap, sets[i].acc, sets[i].n, sets[i].stream, enqueued);
        sci_capture_put(sets[i].cap);
        sets[i].cap = NULL;
    }
    return s;
}

uint64_t sci_tracker_last_stream(const sci_tracker *t)
{
    if (t->write.stream_id)
        return t->write.stream_id;
    for (size_t i = t->n_reads; i-- > 0;)
        if (t->reads[i].stream_id)
            return t->reads[i].stream_id;
    return 0;
}

static sc_status host_wait_use(sci_use *use, sci_context *ctx, bool try_only, const char *fn)
{
    if (use->stream_id == 0)
        return SC_OK;
    bool gone;
    CUevent ev;
    sc_status s = ensure_event(use, ctx, fn, &gone, &ev);
    if (s != SC_OK || gone)
        return s;
    CUresult r = try_only ? sci_cuEventQuery(ev) : sci_cuEventSynchronize(ev);
    if (r == CUDA_ERROR_NOT_READY)
        return sci_fail(SC_ERR_BUSY, fn, "a copy that uses it is still in flight");
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(ctx, r, fn, "waiting for the work in flight failed");
    return SC_OK;
}

sc_status sci_tracker_host_wait_locked(sci_tracker *t, sci_context *ctx, bool try_only,
                                       const char *fn)
{
    sc_status s = host_wait_use(&t->write, ctx, try_only, fn);
    for (size_t i = 0; i < t->n_reads && s == SC_OK; i++)
        s = host_wait_use(&t->reads[i], ctx, try_only, fn);
    if (s == SC_OK) { /* everything is done: nothing left to order against */
        t->write.stream_id = 0;
        t->n_reads = 0;
    }
    return s;
}

sc_status sci_tracker_host_wait_except(sci_tracker *t, sci_context *ctx, uint64_t skip_stream_id,
                                      const char *fn)
{
    pthread_mutex_lock(&t->lock);
    sc_status s = SC_OK;
    if (t->write.stream_id != skip_stream_id)
        s = host_wait_use(&t->write, ctx, false, fn);
    for (size_t i = 0; i < t->n_reads && s == SC_OK; i++)
        if (t->reads[i].stream_id != skip_stream_id)
            s = host_wait_use(&t->reads[i], ctx, false, fn);
    pthread_mutex_unlock(&t->lock);
    return s;
}

sc_status sci_tracker_host_wait(sci_tracker *t, sci_context *ctx, bool try_only, const char *fn)
{
    pthread_mutex_lock(&t->lock);
    sc_status s = sci_tracker_host_wait_locked(t, ctx, try_only, fn);
    pthread_mutex_unlock(&t->lock);
    return s;
}
