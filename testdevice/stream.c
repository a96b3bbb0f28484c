/* The test device's streams and events (the model: testdevice.c's header comment): streams are
 * synchronous; what capture changes is in capture.c, reached through its hooks. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>

#include "testdevice_internal.h"

/* ---- streams and events -------------------------------------------------------------------- */

CUresult f_cuStreamCreateWithPriority(CUstream *s, unsigned flags, int prio)
{
    static const char fn[] = "cuStreamCreateWithPriority";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), not_null(s, fn, "out-pointer"),
           refuse_if(flags > CU_STREAM_NON_BLOCKING, CUDA_ERROR_INVALID_VALUE, fn, "flags 0x%x",
                     flags));
    if (r == CUDA_SUCCESS) {
        fake_stream *st = calloc(1, sizeof *st);
        if (!st || !set_add(&streams, st)) {
            free(st);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            st->magic = STREAM_MAGIC;
            st->ctx = current;
            st->flags = flags;
            st->priority = prio < -5 ? -5 : prio > 0 ? 0 : prio;
            *s = (CUstream)(void *)st;
        }
    }
    td_unlock();
    return r;
}

CUresult f_cuStreamDestroy(CUstream s)
{
    static const char fn[] = "cuStreamDestroy";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn),
           refuse_if(!set_has(&streams, s), CUDA_ERROR_INVALID_HANDLE, fn,
                     "unknown or destroyed stream %p", (void *)s),
           td_stream_destroy_check((fake_stream *)(void *)s, fn));
    if (r == CUDA_SUCCESS) {
        td_hold_forget_stream((fake_stream *)(void *)s);
        set_remove(&streams, s);
        td_stream_forget((fake_stream *)(void *)s);
        free(s);
    }
    td_unlock();
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

CUresult f_cuStreamSynchronize(CUstream s)
{
    static const char fn[] = "cuStreamSynchronize";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), not_capturing(s, fn));
    while (r == CUDA_SUCCESS && td_stream_busy(s))
        td_wait(); /* a held stream (hold.c) */
    if (r == CUDA_SUCCESS)
        release_to_threshold();
    td_unlock();
    return r;
}

CUresult f_cuStreamQuery(CUstream s)
{
    static const char fn[] = "cuStreamQuery";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), not_capturing(s, fn));
    if (r == CUDA_SUCCESS && td_stream_busy(s))
        r = CUDA_ERROR_NOT_READY;
    td_unlock();
    return r;
}

CUresult f_cuStreamGetCtx(CUstream s, CUcontext *c)
{
    static const char fn[] = "cuStreamGetCtx";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), not_null(c, fn, "context"), need_stream(s, fn));
    if (r == CUDA_SUCCESS) {
        /* A stream a test moved to another context answers a context that is not a
         * primary one. */
        static int other;
        const fake_ctx *sc = td_stream_ctx(s);
        *c = sc ? (CUcontext)(void *)sc : (CUcontext)(void *)&other;
    }
    td_unlock();
    return r;
}

CUresult f_cuStreamGetPriority(CUstream s, int *prio)
{
    static const char fn[] = "cuStreamGetPriority";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), not_null(prio, fn, "priority"), need_stream(s, fn));
    if (r == CUDA_SUCCESS)
        *prio = (uintptr_t)s > 2 ? ((fake_stream *)(void *)s)->priority : 0;
    td_unlock();
    return r;
}

/* For tests: make a live stream answer cuStreamGetCtx with a context other than the
 * primary one (a stream of a context another library created). 0 when s is not a live
 * stream of the test device. */
EXPORT int safecuda_testdevice_move_stream_to_other_context(CUstream s)
{
    td_lock();
    int ok = (uintptr_t)s > 2 && set_has(&streams, s);
    if (ok)
        ((fake_stream *)(void *)s)->other_context = 1;
    td_unlock();
    return ok;
}

CUresult f_cuStreamWaitEvent(CUstream s, CUevent e, unsigned flags)
{
    static const char fn[] = "cuStreamWaitEvent";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), event_ok(e, fn),
           refuse_if(flags > 1 /* CU_EVENT_WAIT_EXTERNAL */, CUDA_ERROR_INVALID_VALUE, fn,
                     "flags 0x%x", flags));
    if (r == CUDA_SUCCESS)
        r = td_stream_wait(s, (fake_event *)(void *)e, flags, fn);
    td_unlock();
    return r;
}

CUresult f_cuLaunchHostFunc(CUstream s, CUhostFn host, void *user)
{
    static const char fn[] = "cuLaunchHostFunc";
    struct fake_capture *cap = NULL;
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), td_capture_of(s, fn, &cap),
           refuse_if(!host, CUDA_ERROR_INVALID_VALUE, fn, "NULL function"));
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_host(cap, s, host, user, fn);
    r = copy_done(r, cap, fn);
    td_unlock();
    if (r == CUDA_SUCCESS && !cap)
        host(user); /* streams are synchronous: the function runs now, outside the lock */
    return r;
}

static uint64_t event_serial;

CUresult f_cuEventCreate(CUevent *e, unsigned flags)
{
    static const char fn[] = "cuEventCreate";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), not_null(e, fn, "out-pointer"),
           refuse_if(flags & ~0x7u, CUDA_ERROR_INVALID_VALUE, fn, "flags 0x%x", flags));
    if (r == CUDA_SUCCESS) {
        fake_event *ev = calloc(1, sizeof *ev);
        if (!ev || !set_add(&events, ev)) {
            free(ev);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            ev->magic = EVENT_MAGIC;
            ev->ctx = current;
            ev->flags = flags;
            ev->serial = ++event_serial;
            *e = (CUevent)(void *)ev;
        }
    }
    td_unlock();
    return r;
}

CUresult f_cuEventDestroy(CUevent e)
{
    static const char fn[] = "cuEventDestroy";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn),
           refuse_if(!set_remove(&events, e), CUDA_ERROR_INVALID_HANDLE, fn,
                     "unknown or destroyed event %p", (void *)e));
    if (r == CUDA_SUCCESS) {
        td_event_forget((fake_event *)(void *)e);
        free(e);
    }
    td_unlock();
    return r;
}

const fake_ctx *td_stream_ctx(CUstream s)
{
    const fake_stream *st = (uintptr_t)s > 2 ? (const fake_stream *)(void *)s : NULL;
    return !st ? current : st->other_context ? NULL : st->ctx;
}

/* An event is recorded on a stream of its own context; CUDA answers
 * CUDA_ERROR_INVALID_HANDLE otherwise. */
static CUresult same_context(CUevent e, CUstream s, const char *fn)
{
    const fake_event *ev = (const fake_event *)(void *)e;
    const fake_ctx *sc = td_stream_ctx(s);
    if (!sc)
        return CUDA_SUCCESS;
    return refuse_if(ev->ctx != sc, CUDA_ERROR_INVALID_HANDLE, fn,
                     "an event of device %d's context recorded on a stream of device %d's",
                     ev->ctx ? ev->ctx->device : -1, sc ? sc->device : -1);
}

CUresult f_cuEventRecord(CUevent e, CUstream s)
{
    static const char fn[] = "cuEventRecord";
    struct fake_capture *cap = NULL;
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), event_ok(e, fn), need_stream(s, fn), same_context(e, s, fn),
           td_capture_of(s, fn, &cap));
    if (r == CUDA_SUCCESS)
        r = td_event_record((fake_event *)(void *)e, cap, s);
    if (r == CUDA_SUCCESS && !cap)
        td_event_note_record((fake_event *)(void *)e, s);
    r = copy_done(r, cap, fn);
    td_unlock();
    return r;
}

CUresult f_cuEventSynchronize(CUevent e)
{
    static const char fn[] = "cuEventSynchronize";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), event_ok(e, fn), td_event_check((fake_event *)(void *)e, fn));
    while (r == CUDA_SUCCESS && td_event_pending((fake_event *)(void *)e))
        td_wait(); /* recorded on a held stream (hold.c) */
    if (r == CUDA_SUCCESS)
        release_to_threshold();
    td_unlock();
    return r;
}

CUresult f_cuEventQuery(CUevent e)
{
    static const char fn[] = "cuEventQuery";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), event_ok(e, fn), td_event_check((fake_event *)(void *)e, fn));
    if (r == CUDA_SUCCESS && td_event_pending((fake_event *)(void *)e))
        r = CUDA_ERROR_NOT_READY; /* recorded on a held stream (hold.c) */
    td_unlock();
    return r;
}

CUresult f_cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    static const char fn[] = "cuEventElapsedTime";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), not_null(ms, fn, "ms"), event_ok(a, fn), event_ok(b, fn),
           td_event_check((fake_event *)(void *)a, fn),
           td_event_check((fake_event *)(void *)b, fn));
    if (r == CUDA_SUCCESS) {
        fake_event *ea = (fake_event *)(void *)a, *eb = (fake_event *)(void *)b;
        if ((ea->flags | eb->flags) & CU_EVENT_DISABLE_TIMING)
            r = bad(CUDA_ERROR_INVALID_HANDLE, fn,
                    "an event was created with CU_EVENT_DISABLE_TIMING");
        else if (!ea->recorded || !eb->recorded)
            r = bad(CUDA_ERROR_INVALID_HANDLE, fn, "an event was never recorded");
        else
            *ms = 0.001f;
    }
    td_unlock();
    return r;
}
