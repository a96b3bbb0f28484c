/* Streams: creation with priorities, the context's default stream, synchronization. */
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "driver/driver.h"
#include "safecuda/interop.h" /* the public declarations (and their visibility) */
#include "stream/capture.h"
#include "stream/stream.h"

static sc_status stream_destroy(sci_object *obj, const char *fn);

static void describe_stream(const sci_object *obj, sc_object_info *info)
{
    const sci_stream *s = (const sci_stream *)obj;
    if (s->wrapped)
        snprintf(info->detail, sizeof info->detail, "wrapped CUstream %p, priority %d",
                 (void *)s->cu, s->priority);
    else
        snprintf(info->detail, sizeof info->detail, "priority %d", s->priority);
}

static const sci_kind_ops stream_ops = {"stream", describe_stream, stream_destroy};

__attribute__((constructor)) static void register_stream_kind(void)
{
    sci_registry_set_ops(SCI_KIND_STREAM, &stream_ops);
}

static sc_status create(sci_context *c, const sc_stream_desc *d, bool is_default,
                        bool is_service, const char *file, int line, const char *fn,
                        sci_stream **out)
{
    int least = 0, greatest = 0;
    CUresult r = sci_cuCtxGetStreamPriorityRange(&least, &greatest);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(c, r, fn, "cuCtxGetStreamPriorityRange failed");
    int priority = d->priority;
    if (priority < greatest)
        priority = greatest;
    if (priority > least)
        priority = least;
    sci_stream *s = calloc(1, sizeof *s);
    if (!s)
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a stream");
    s->ctx = c;
    s->priority = priority;
    s->is_default = is_default;
    s->is_service = is_service;
    s->obj.internal = is_default || is_service;
    r = sci_cuStreamCreateWithPriority(&s->cu, d->blocking ? 0 : CU_STREAM_NON_BLOCKING,
                                       priority);
    if (r != CUDA_SUCCESS) {
        free(s);
        return sci_context_fail_cu(c, r, fn, "cuStreamCreateWithPriority(priority %d) failed",
                                   priority);
    }
    sc_status st = sci_registry_insert(&s->obj, SCI_KIND_STREAM, c->obj.id,
                                       d->label ? d->label
                                       : is_default ? "default"
                                       : is_service ? "service" : "",
                                       file, line, fn);
    if (st != SC_OK) {
        st = sci_context_cleanup_cu(c, st, sci_cuStreamDestroy(s->cu), "cuStreamDestroy");
        free(s);
        return st;
    }
    *out = s;
    return SC_OK;
}

sc_status sc_stream_create_at(sc_context ctx, const sc_stream_desc *desc, sc_stream *stream,
                              const char *file, int line)
{
    static const char fn[] = "sc_stream_create";
    SCI_CHECK_PTR(fn, stream);
    stream->id = 0;
    sc_stream_desc d = desc ? *desc : (sc_stream_desc){0};
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    sci_stream *st = NULL;
    s = create(c, &d, false, false, file, line, fn, &st);
    if (s == SC_OK)
        stream->id = st->obj.id;
    sci_context_release(c);
    return s;
}

sc_status sc_stream_wrap_at(sc_context ctx, uint64_t cu_stream, const char *label,
                            sc_stream *stream, const char *file, int line)
{
    static const char fn[] = "sc_stream_wrap";
    SCI_CHECK_PTR(fn, stream);
    stream->id = 0;
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c); /* checks health, makes it current */
    if (s != SC_OK)
        return s;
    if (cu_stream == 2) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "'%s': the per-thread default stream (CU_STREAM_PER_THREAD) is another "
                     "stream on every thread, and safecuda's handles may be used from any "
                     "thread: wrap a stream of its own, or the legacy default stream (0)",
                     label ? label : "");
        goto out;
    }
    CUstream cu = (CUstream)(uintptr_t)cu_stream;
    CUcontext owner = NULL;
    CUresult r = sci_cuStreamGetCtx(cu, &owner);
    if (r != CUDA_SUCCESS) {
        /* A handle that is not a stream (or one already destroyed) is the caller's error,
         * not the context's; a sticky error still marks the context lost. */
        if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE ||
            r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT)
            s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                         "'%s': CUstream 0x%llx is not a live stream (cuStreamGetCtx answered "
                         "%s)", label ? label : "", (unsigned long long)cu_stream,
                         sci_cu_error_name(r));
        else
            s = sci_context_fail_cu(c, r, fn, "cuStreamGetCtx(0x%llx) failed",
                                    (unsigned long long)cu_stream);
        goto out;
    }
    if (owner != c->cu) {
        s = sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                     "'%s': CUstream 0x%llx belongs to another CUDA context than the primary "
                     "context of device %d that the context created at %s:%d uses (only "
                     "streams of the primary context, the one the CUDA runtime and PyTorch "
                     "use, can be wrapped)",
                     label ? label : "", (unsigned long long)cu_stream, c->device,
                     sci_basename(c->obj.file), c->obj.line);
        goto out;
    }
    int priority = 0;
    r = sci_cuStreamGetPriority(cu, &priority);
    if (r != CUDA_SUCCESS) {
        s = sci_context_fail_cu(c, r, fn, "cuStreamGetPriority(0x%llx) failed",
                                (unsigned long long)cu_stream);
        goto out;
    }
    sci_stream *st = calloc(1, sizeof *st);
    if (!st) {
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a stream");
        goto out;
    }
    st->ctx = c;
    st->cu = cu;
    st->priority = priority;
    st->wrapped = true;
    /* The point before any of safecuda's work on it (stands for the owner's work so far),
     * unless its owner captures it now (that capture is adopted at its first use). */
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    if (sci_cuStreamIsCapturing(cu, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_NONE)
        s = sci_stream_mark_wrapped(st, fn);
    if (s != SC_OK) {
        if (st->pre_capture)
            sci_cuEventDestroy(st->pre_capture);
        free(st);
        goto out;
    }
    s = sci_registry_insert(&st->obj, SCI_KIND_STREAM, c->obj.id, label ? label : "wrapped",
                            file, line, fn);
    if (s != SC_OK) {
        free(st);
        goto out;
    }
    stream->id = st->obj.id;
out:
    sci_context_release(c);
    return s;
}

sc_status sc_stream_cu_handle(sc_stream stream, uint64_t *cu_stream)
{
    static const char fn[] = "sc_stream_cu_handle";
    SCI_CHECK_PTR(fn, cu_stream);
    if (stream.id == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "SC_DEFAULT_STREAM names no context: take the default stream's handle "
                        "with sc_context_default_stream");
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_STREAM, stream.id, fn, &obj);
    if (s != SC_OK)
        return s;
    const sci_stream *st = (const sci_stream *)obj;
    if (st->is_service) {
        sci_registry_release(obj);
        return sci_fail(SC_ERR_STALE_HANDLE, fn, "not a stream handle of the caller's");
    }
    *cu_stream = (uint64_t)(uintptr_t)st->cu;
    sci_registry_release(obj);
    return SC_OK;
}

sc_status sc_stream_is_wrapped(sc_stream stream, bool *wrapped)
{
    static const char fn[] = "sc_stream_is_wrapped";
    SCI_CHECK_PTR(fn, wrapped);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_STREAM, stream.id, fn, &obj);
    if (s != SC_OK)
        return s;
    *wrapped = ((const sci_stream *)obj)->wrapped;
    sci_registry_release(obj);
    return SC_OK;
}

/* The context's internal stream whose id is kept in *slot, created on first use. Held
 * across create(), so two threads can't both create it. create() may mark the context lost
 * on its way out: that takes only c->lost_lock. */
static sc_status internal_stream(sci_context *c, uint64_t *slot, bool is_default,
                                 const char *fn, sci_stream **out)
{
    pthread_mutex_lock(&c->lock);
    uint64_t id = *slot;
    if (id == 0) {
        sci_stream *s = NULL;
        sc_status st = create(c, &(sc_stream_desc){0}, is_default, !is_default, __FILE__,
                              __LINE__, fn, &s);
        if (st != SC_OK) {
            pthread_mutex_unlock(&c->lock);
            return st;
        }
        *slot = id = s->obj.id;
    }
    pthread_mutex_unlock(&c->lock);
    sci_object *obj = NULL;
    sc_status st = sci_registry_acquire(SCI_KIND_STREAM, id, fn, &obj);
    if (st != SC_OK)
        return st;
    *out = (sci_stream *)obj;
    return SC_OK;
}

sc_status sci_context_default_stream(sci_context *c, const char *fn, sci_stream **out)
{
    return internal_stream(c, &c->default_stream_id, true, fn, out);
}

sc_status sci_context_service_stream(sci_context *c, const char *fn, sci_stream **out)
{
    return internal_stream(c, &c->service_stream_id, false, fn, out);
}

sc_status sci_stream_acquire(sc_stream h, const char *fn, sci_stream **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_STREAM, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_stream *st = (sci_stream *)obj;
    s = sci_context_enter(st->ctx, fn);
    if (s != SC_OK) {
        sci_registry_release(obj);
        return s;
    }
    sci_capture_sync(st, fn);
    *out = st;
    return SC_OK;
}

sc_status sci_stream_resolve(sc_stream h, sci_context *ctx, const char *fn, sci_stream **out)
{
    sc_status s = sci_context_enter(ctx, fn);
    if (s != SC_OK)
        return s;
    if (h.id == 0)
        return sci_context_default_stream(ctx, fn, out);
    sci_object *obj = NULL;
    s = sci_registry_acquire(SCI_KIND_STREAM, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_stream *st = (sci_stream *)obj;
    if (st->ctx != ctx) {
        sci_registry_release(obj);
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                        "the stream (created at %s:%d) belongs to the context on device %d "
                        "created at %s:%d, not to the context on device %d created at %s:%d",
                        sci_basename(st->obj.file), st->obj.line, st->ctx->device,
                        sci_basename(st->ctx->obj.file), st->ctx->obj.line, ctx->device,
                        sci_basename(ctx->obj.file), ctx->obj.line);
    }
    sci_capture_sync(st, fn);
    *out = st;
    return SC_OK;
}

void sci_stream_release(sci_stream *s) { sci_registry_release(&s->obj); }

sc_status sc_context_default_stream(sc_context ctx, sc_stream *stream)
{
    static const char fn[] = "sc_context_default_stream";
    SCI_CHECK_PTR(fn, stream);
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    sci_stream *st = NULL;
    s = sci_context_default_stream(c, fn, &st);
    if (s == SC_OK) {
        stream->id = st->obj.id;
        sci_stream_release(st);
    }
    sci_context_release(c);
    return s;
}

static void destroy_cu_stream(void *cu)
{
    CUresult r = sci_cuStreamDestroy((CUstream)cu);
    if (r != CUDA_SUCCESS)
        sci_log(SC_LOG_WARN, "cuStreamDestroy of a stream that took part in another library's "
                "capture, deferred until that capture ended, failed: %s",
                sci_cu_error_name(r));
}

/* sc_stream_destroy's condition: a stream of the caller's (sc_context_destroy destroys the
 * default and service streams). */
static sc_status check_users(uint64_t id, const char *fn)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_STREAM, id, fn, &obj);
    if (s != SC_OK)
        return s;
    bool is_default = ((sci_stream *)obj)->is_default;
    bool is_service = ((sci_stream *)obj)->is_service;
    sci_registry_release(obj);
    if (is_default)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "the default stream can't be destroyed: it goes with its context");
    if (is_service)
        return sci_fail(SC_ERR_STALE_HANDLE, fn, "not a stream handle of the caller's");
    return SC_OK;
}

/* The stream's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status stream_destroy(sci_object *obj, const char *fn)
{
    sci_stream *st = (sci_stream *)obj;
    sci_context *c = st->ctx;
    sci_release rl;
    sci_release_begin(&rl, c, fn);
    sci_release_make_current(&rl);
    /* A stream that takes part in a capture can't finish its work (none of it runs): the
     * capture is abandoned first, and the stream destroyed as usual. A capture another
     * library began on a wrapped stream is that library's: safecuda only stops following
     * it, and can't wait for the stream while it captures. */
    sci_capture_sync(st, fn); /* a capture its owner began or ended since the last use */
    bool foreign_capture = sci_capture_is_adopted(st);
    sci_capture_abandon(st, fn);
    if (sci_release_live(&rl) && !foreign_capture) /* finish the queued work first */
        sci_release_check(&rl, sci_cuStreamSynchronize(st->cu),
                          "cuStreamSynchronize before destroy failed");
    if (!st->wrapped && foreign_capture) /* part of another library's capture: destroying it
                                            now would invalidate that capture */
        sci_guard_defer(destroy_cu_stream, st->cu);
    else if (!st->wrapped) /* a wrapped CUstream stays its owner's */
        sci_release_check(&rl, sci_cuStreamDestroy(st->cu), "cuStreamDestroy failed");
    if (st->pre_capture)
        sci_release_check(&rl, sci_cuEventDestroy(st->pre_capture), "cuEventDestroy failed");
    if (st->is_default || st->is_service) {
        pthread_mutex_lock(&c->lock);
        if (st->is_default)
            c->default_stream_id = 0;
        else
            c->service_stream_id = 0;
        pthread_mutex_unlock(&c->lock);
    }
    free(st);
    return sci_release_end(&rl);
}

sc_status sc_stream_destroy(sc_stream stream)
{
    return sci_object_destroy(SCI_KIND_STREAM, stream.id, check_users, "sc_stream_destroy");
}

sc_status sc_stream_synchronize(sc_stream stream)
{
    static const char fn[] = "sc_stream_synchronize";
    sci_stream *s = NULL;
    sc_status st = sci_stream_acquire(stream, fn, &s);
    if (st != SC_OK)
        return st;
    if ((st = sci_capture_refuse_stream(s, fn, "waiting for the stream on the host")) != SC_OK) {
        sci_stream_release(s);
        return st;
    }
    CUresult r = sci_cuStreamSynchronize(s->cu);
    if (r != CUDA_SUCCESS)
        st = sci_context_fail_cu(s->ctx, r, fn, "cuStreamSynchronize failed");
    sci_stream_release(s);
    return st;
}

sc_status sc_stream_query(sc_stream stream)
{
    static const char fn[] = "sc_stream_query";
    sci_stream *s = NULL;
    sc_status st = sci_stream_acquire(stream, fn, &s);
    if (st != SC_OK)
        return st;
    if ((st = sci_capture_refuse_stream(s, fn, "querying the stream from the host")) != SC_OK) {
        sci_stream_release(s);
        return st;
    }
    CUresult r = sci_cuStreamQuery(s->cu);
    if (r == CUDA_ERROR_NOT_READY)
        st = SC_ERR_NOT_READY; /* busy is an answer, not a failure: no message */
    else if (r != CUDA_SUCCESS)
        st = sci_context_fail_cu(s->ctx, r, fn, "cuStreamQuery failed");
    sci_stream_release(s);
    return st;
}

sc_status sc_stream_priority(sc_stream stream, int *priority)
{
    static const char fn[] = "sc_stream_priority";
    SCI_CHECK_PTR(fn, priority);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_STREAM, stream.id, fn, &obj);
    if (s != SC_OK)
        return s;
    *priority = ((sci_stream *)obj)->priority;
    sci_registry_release(obj);
    return SC_OK;
}
