/* Events: record, wait, query, timing. */
#include <stdio.h>
#include <stdlib.h>

#include "stream/capture.h"
#include "stream/stream.h"

static sc_status event_destroy(sci_object *obj, const char *fn);

static void describe_event(const sci_object *obj, sc_object_info *info)
{
    const sci_event *e = (const sci_event *)obj;
    snprintf(info->detail, sizeof info->detail, "%s", e->timing ? "timing" : "no timing");
}

static const sci_kind_ops event_ops = {"event", describe_event, event_destroy};

__attribute__((constructor)) static void register_event_kind(void)
{
    sci_registry_set_ops(SCI_KIND_EVENT, &event_ops);
}

static sc_status acquire(sc_event h, const char *fn, sci_event **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_EVENT, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_event *e = (sci_event *)obj;
    s = sci_context_enter(e->ctx, fn);
    if (s != SC_OK) {
        sci_registry_release(obj);
        return s;
    }
    *out = e;
    return SC_OK;
}

sc_status sc_event_create_at(sc_context ctx, const sc_event_desc *desc, sc_event *event,
                             const char *file, int line)
{
    static const char fn[] = "sc_event_create";
    SCI_CHECK_PTR(fn, event);
    event->id = 0;
    sc_event_desc d = desc ? *desc : (sc_event_desc){0};
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    sci_event *e = calloc(1, sizeof *e);
    if (!e) {
        sci_context_release(c);
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate an event");
    }
    e->ctx = c;
    e->timing = d.timing;
    unsigned flags = (d.timing ? 0 : CU_EVENT_DISABLE_TIMING) |
                     (d.blocking_sync ? CU_EVENT_BLOCKING_SYNC : 0);
    CUresult r = sci_cuEventCreate(&e->cu, flags);
    if (r != CUDA_SUCCESS) {
        s = sci_context_fail_cu(c, r, fn, "cuEventCreate failed");
        free(e);
    } else {
        s = sci_registry_insert(&e->obj, SCI_KIND_EVENT, c->obj.id, d.label, file, line, fn);
        if (s != SC_OK) {
            s = sci_context_cleanup_cu(c, s, sci_cuEventDestroy(e->cu), "cuEventDestroy");
            free(e);
        } else {
            event->id = e->obj.id;
        }
    }
    sci_context_release(c);
    return s;
}

/* The event's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status event_destroy(sci_object *obj, const char *fn)
{
    sci_event *e = (sci_event *)obj;
    sci_release rl;
    sci_release_begin(&rl, e->ctx, fn);
    sci_release_make_current(&rl);
    /* The driver keeps the event until the waits enqueued on it are done. */
    sci_release_check(&rl, sci_cuEventDestroy(e->cu), "cuEventDestroy failed");
    free(e);
    return sci_release_end(&rl);
}

sc_status sc_event_destroy(sc_event event)
{
    return sci_object_destroy(SCI_KIND_EVENT, event.id, NULL, "sc_event_destroy");
}

sc_status sc_event_record(sc_event event, sc_stream stream)
{
    static const char fn[] = "sc_event_record";
    sci_event *e = NULL;
    sc_status s = acquire(event, fn, &e);
    if (s != SC_OK)
        return s;
    sci_stream *st = NULL;
    s = sci_stream_resolve(stream, e->ctx, fn, &st);
    if (s == SC_OK) {
        /* On a capturing stream the record becomes part of the graph (a fork point). */
        uint64_t capture = sci_stream_capture_id(st);
        CUresult r = sci_cuEventRecord(e->cu, st->cu);
        if (r != CUDA_SUCCESS) {
            s = sci_context_fail_cu(e->ctx, r, fn, "cuEventRecord failed");
        } else {
            e->recorded = true;
            atomic_store(&e->capture, capture);
        }
        sci_stream_release(st);
    }
    sci_registry_release(&e->obj);
    return s;
}

/* An event last recorded inside a capture holds no work that runs now: the host can't
 * wait on it or time it (CUDA refuses, and may invalidate the capture). */
static sc_status refuse_captured(const sci_event *e, const char *fn)
{
    uint64_t capture = atomic_load(&e->capture);
    if (capture == 0)
        return SC_OK;
    return sci_fail(SC_ERR_CAPTURE, fn,
                    "event '%s' (created at %s:%d) was last recorded inside capture %llu%s: its "
                    "work runs only when the graph is launched; record it again outside a "
                    "capture to wait on it from the host",
                    e->obj.label, sci_basename(e->obj.file), e->obj.line,
                    (unsigned long long)capture,
                    sci_capture_active(capture) ? " (still in progress)" : "");
}

sc_status sc_event_synchronize(sc_event event)
{
    static const char fn[] = "sc_event_synchronize";
    sci_event *e = NULL;
    sc_status s = acquire(event, fn, &e);
    if (s != SC_OK)
        return s;
    if ((s = refuse_captured(e, fn)) != SC_OK) {
        sci_registry_release(&e->obj);
        return s;
    }
    CUresult r = sci_cuEventSynchronize(e->cu);
    if (r != CUDA_SUCCESS)
        s = sci_context_fail_cu(e->ctx, r, fn, "cuEventSynchronize failed");
    sci_registry_release(&e->obj);
    return s;
}

sc_status sc_event_query(sc_event event)
{
    static const char fn[] = "sc_event_query";
    sci_event *e = NULL;
    sc_status s = acquire(event, fn, &e);
    if (s != SC_OK)
        return s;
    if ((s = refuse_captured(e, fn)) != SC_OK) {
        sci_registry_release(&e->obj);
        return s;
    }
    CUresult r = sci_cuEventQuery(e->cu);
    if (r == CUDA_ERROR_NOT_READY)
        s = SC_ERR_NOT_READY;
    else if (r != CUDA_SUCCESS)
        s = sci_context_fail_cu(e->ctx, r, fn, "cuEventQuery failed");
    sci_registry_release(&e->obj);
    return s;
}

sc_status sc_event_elapsed(sc_event start, sc_event end, float *ms)
{
    static const char fn[] = "sc_event_elapsed";
    SCI_CHECK_PTR(fn, ms);
    sci_event *a = NULL, *b = NULL;
    sc_status s = acquire(start, fn, &a);
    if (s != SC_OK)
        return s;
    s = acquire(end, fn, &b);
    if (s != SC_OK) {
        sci_registry_release(&a->obj);
        return s;
    }
    if (a->ctx != b->ctx)
        s = sci_fail(SC_ERR_WRONG_CONTEXT, fn, "the two events belong to different contexts");
    else if (!a->timing || !b->timing)
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "the %s event (created at %s:%d) was created without .timing = true",
                     a->timing ? "end" : "start",
                     sci_basename(a->timing ? b->obj.file : a->obj.file),
                     a->timing ? b->obj.line : a->obj.line);
    else if (!a->recorded || !b->recorded)
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "the %s event was never recorded",
                     a->recorded ? "end" : "start");
    else if ((s = refuse_captured(a, fn)) != SC_OK || (s = refuse_captured(b, fn)) != SC_OK)
        ;
    else {
        CUresult r = sci_cuEventElapsedTime(ms, a->cu, b->cu);
        if (r == CUDA_ERROR_NOT_READY)
            s = sci_fail(SC_ERR_NOT_READY, fn, "the events have not completed yet");
        else if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(a->ctx, r, fn, "cuEventElapsedTime failed");
    }
    sci_registry_release(&b->obj);
    sci_registry_release(&a->obj);
    return s;
}

sc_status sc_stream_wait(sc_stream stream, sc_event event)
{
    static const char fn[] = "sc_stream_wait";
    sci_event *e = NULL;
    sc_status s = acquire(event, fn, &e);
    if (s != SC_OK)
        return s;
    sci_stream *st = NULL;
    s = sci_stream_resolve(stream, e->ctx, fn, &st);
    if (s == SC_OK) {
        /* Waits and captures: a fork (the stream joins the event's capture), a wait inside
         * one capture, or a refusal (capture.h). */
        s = sci_capture_before_wait(st, atomic_load(&e->capture), fn);
        if (s == SC_OK) {
            CUresult r = sci_cuStreamWaitEvent(st->cu, e->cu, 0);
            if (r != CUDA_SUCCESS)
                s = sci_context_fail_cu(e->ctx, r, fn, "cuStreamWaitEvent failed");
        }
        sci_stream_release(st);
    }
    sci_registry_release(&e->obj);
    return s;
}
