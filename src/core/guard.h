/* Calls CUDA forbids while a stream capture is open (internal).
 *
 * During a capture in GLOBAL mode, a call anywhere in the process that synchronizes or
 * allocates outside a stream (cuCtxSynchronize, cuMemHostAlloc, cuMemFreeHost, a module
 * load or unload, a pageable copy) fails and invalidates the capture; in THREAD_LOCAL mode
 * only such calls on the capturing thread do; RELAXED captures forbid none. The stream
 * layer registers each open capture here (a guard), so that every layer can refuse such a
 * call first (SC_ERR_CAPTURE, nothing done, the capture intact) or, for releases that a
 * destroy can't refuse, defer it until no guard forbids it. Thread-safe. */
#ifndef SAFECUDA_CORE_GUARD_H
#define SAFECUDA_CORE_GUARD_H

#include <pthread.h>
#include <stdbool.h>

#include "core/error.h"

typedef struct sci_guard {
    int mode;             /* CUstreamCaptureMode: 0 global, 1 thread-local, 2 relaxed */
    const void *ctx;      /* the context of the capturing stream */
    pthread_t thread;     /* the thread that began the capture */
    char what[240];       /* "capture 3 (global mode, begun on stream 'x', created at a.c:4)" */
    bool adopted;         /* a capture another library began: it may end without telling */
    struct sci_guard *next;
} sci_guard;

/* The stream layer's check of adopted captures (it retires those their owner ended):
 * called before any guard is consulted while an adopted one is registered, with no lock of
 * this file held. */
void sci_guard_set_refresh(void (*refresh)(void));

/* Register an open capture / take it off (then run the deferred releases if nothing
 * forbids them any more). */
void sci_guard_add(sci_guard *g);
void sci_guard_remove(sci_guard *g);

/* Whether a call CUDA forbids during capture would invalidate a capture now, from the
 * calling thread. */
bool sci_guard_active(void);
/* SC_ERR_CAPTURE naming fn, what and the capture that forbids it; SC_OK when none does. */
sc_status sci_guard_refuse(const char *fn, const char *what);
/* The same for a call that waits for all of ctx's work (cuCtxSynchronize): refused also
 * while any capture, of any mode, is open on a stream of ctx (its work can't finish). */
sc_status sci_guard_refuse_context(const void *ctx, const char *fn, const char *what);
/* Whether sci_guard_refuse_context would refuse now. */
bool sci_guard_context_busy(const void *ctx);
/* Run release(arg) now if nothing forbids it, else once no capture does. */
void sci_guard_defer(void (*release)(void *arg), void *arg);

#endif
