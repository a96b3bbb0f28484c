/* A communicator's collectives in flight: each one issued outside a capture is remembered
 * with an event recorded after it and its deadline; polling drops the finished ones and,
 * with the GPU's issue lock, aborts the communicator when the oldest is past its deadline
 * or NCCL reports an asynchronous error (the watchdog, sc_comm_synchronize, sc_comm_query). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/log.h"

/* ---- collectives in flight --------------------------------------------------------------- */

sc_status sci_comm_track(sci_comm *c, sci_stream *stream, uint64_t issued_ns, const char *what,
                         const char *fn)
{
    CUevent ev = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->n_spare)
        ev = c->spare[--c->n_spare];
    pthread_mutex_unlock(&c->lock);
    /* in the stream's context (a group may span the GPUs of one process) */
    const char *call;
    CUresult r = sci_context_make_current_cu(stream->ctx, &call);
    if (r == CUDA_SUCCESS && !ev)
        r = sci_cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS)
        r = sci_cuEventRecord(ev, stream->cu);
    if (r != CUDA_SUCCESS) {
        if (ev)
            sci_cuEventDestroy(ev);
        return sci_context_tolerate_cu(c->ctx, r, fn,
                                       "recording the completion event of a collective failed");
    }
    pthread_mutex_lock(&c->lock);
    bool kept = true;
    if (c->n_ops == c->cap_ops) {
        size_t cap = c->cap_ops ? 2 * c->cap_ops : 8;
        sci_comm_inflight *grown = realloc(c->ops, cap * sizeof *grown);
        if (grown) {
            c->ops = grown;
            c->cap_ops = cap;
        } else {
            kept = false;
        }
    }
    if (kept) {
        sci_comm_inflight *op = &c->ops[c->n_ops++];
        op->event = ev;
        op->issued_ns = issued_ns;
        op->deadline_ns = issued_ns + (uint64_t)c->timeout_ms * 1000000u;
        snprintf(op->what, sizeof op->what, "%s", what);
    }
    pthread_mutex_unlock(&c->lock);
    if (!kept) { /* out of host memory: the collective runs unwatched */
        sci_cuEventDestroy(ev);
        sci_log(SC_LOG_WARN, "%s: out of host memory: the %s is not watched for its timeout",
                fn, what);
    }
    return SC_OK;
}

/* Keep a finished op's event for reuse (c->lock held). */
static void retire_first(sci_comm *c)
{
    CUevent ev = c->ops[0].event;
    memmove(c->ops, c->ops + 1, (c->n_ops - 1) * sizeof *c->ops);
    c->n_ops--;
    if (c->n_spare == c->cap_spare) {
        size_t cap = c->cap_spare ? 2 * c->cap_spare : 8;
        CUevent *grown = realloc(c->spare, cap * sizeof *grown);
        if (!grown) {
            sci_cuEventDestroy(ev);
            return;
        }
        c->spare = grown;
        c->cap_spare = cap;
    }
    c->spare[c->n_spare++] = ev;
}

sc_status sci_comm_poll(sci_comm *c, bool locked, const char *fn)
{
    pthread_mutex_lock(&c->lock);
    if (c->aborted) {
        sc_status s = sci_fail(c->abort_status, fn, "%s", c->abort_reason);
        pthread_mutex_unlock(&c->lock);
        return s;
    }
    while (c->n_ops) {
        CUresult r = sci_cuEventQuery(c->ops[0].event);
        if (r == CUDA_ERROR_NOT_READY)
            break;
        if (r != CUDA_SUCCESS) /* a sticky error loses the context: reported by its next use */
            sci_context_mark_lost(c->ctx, r, fn, "cuEventQuery of a collective's event");
        retire_first(c);
    }
    const uint64_t now = sci_comm_now_ns();
    const bool expired = c->n_ops && now >= c->ops[0].deadline_ns;
    const size_t in_flight = c->n_ops;
    char what[sizeof c->ops[0].what] = "";
    double age = 0;
    if (expired) {
        memcpy(what, c->ops[0].what, sizeof what);
        age = (double)(now - c->ops[0].issued_ns) * 1e-9;
    }
    pthread_mutex_unlock(&c->lock);
    if (locked && c->nccl && !expired) {
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = sci_ncclCommGetAsyncError(c->nccl, &state);
        if (r != ncclSuccess)
            state = r;
        if (state != ncclSuccess && state != ncclInProgress) {
            char err[600];
            sci_comm_abort_locked(c, SC_ERR_COMM, true, "NCCL reported an asynchronous error: %s; "
                                  "the outputs of its collectives in flight are undefined",
                                  sci_comm_nccl_error(state, c->nccl, err, sizeof err));
        }
    }
    if (locked && expired)
        sci_comm_abort_locked(c, SC_ERR_TIMEOUT, true,
                              "the %s issued %.3f s ago did not finish within the timeout of "
                              "%u ms (a rank that never joined it, or a peer that hangs); its "
                              "outputs are undefined",
                              what, age, c->timeout_ms);
    sc_status s = sci_comm_check_alive(c, fn);
    if (s == SC_OK && in_flight)
        s = SC_ERR_NOT_READY;
    return s;
}

/* sc_comm_synchronize's and sc_comm_query's step: the deadlines and NCCL's errors are
 * looked at when the GPU's issue lock is free (else its holder enforces its own). */
static sc_status poll_step(sci_comm *c, const char *fn)
{
    const int device = c->ctx->device;
    const bool locked = sci_comm_trylock_device(device);
    sc_status s = sci_comm_poll(c, locked, fn);
    if (locked)
        sci_comm_unlock_device(device);
    return s;
}

sc_status sc_comm_synchronize(sc_comm comm)
{
    static const char fn[] = "sc_comm_synchronize";
    sci_comm *c = NULL;
    sc_status s = sci_comm_acquire(comm, fn, &c);
    if (s != SC_OK)
        return s;
    const uint64_t since = sci_comm_now_ns();
    while ((s = poll_step(c, fn)) == SC_ERR_NOT_READY)
        sci_comm_backoff(since);
    sci_comm_release(c);
    return s;
}

sc_status sc_comm_query(sc_comm comm)
{
    static const char fn[] = "sc_comm_query";
    sci_comm *c = NULL;
    sc_status s = sci_comm_acquire(comm, fn, &c);
    if (s != SC_OK)
        return s;
    s = poll_step(c, fn);
    sci_comm_release(c);
    return s;
}

