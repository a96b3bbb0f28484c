/* Contexts: a device's primary context, the objects that live in it, and its health. */
#ifndef SAFECUDA_CORE_CONTEXT_H
#define SAFECUDA_CORE_CONTEXT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "core/registry.h"

typedef struct sci_context {
    sci_object obj;
    int device;
    CUdevice cu_device;
    CUcontext cu;
    sc_device_props props;
    bool tracking; /* automatic cross-stream ordering of buffers */

    /* Memory accounting (src/memory/ keeps it, under lock). The default stream and the
     * pool are created under it too. */
    pthread_mutex_t lock;
    uint64_t vram_budget;
    uint64_t bytes_in_use;
    uint64_t peak_bytes;
    uint64_t live_buffers;
    uint64_t pinned_bytes;
    uint64_t borrowed_bytes;     /* borrowed buffers' (src/interop/): not in bytes_in_use */
    CUmemoryPool pool;           /* created by src/memory/ on first use */
    uint64_t default_stream_id;  /* created by src/stream/ on first use */
    uint64_t service_stream_id;  /* likewise (see sci_context_service_stream) */

    /* Health. lost_lock guards only the marking (never held across another call), so a
     * context can be marked lost from code that holds any other lock, lock included. */
    pthread_mutex_t lost_lock;
    atomic_bool lost;
    char lost_message[1024]; /* written once, before lost is set; read after */
} sci_context;

/* Look a context up, take a reference, check that it is not lost and make it current on
 * the calling thread. Release with sci_context_release. */
sc_status sci_context_acquire(sc_context h, const char *fn, sci_context **out);
void sci_context_release(sci_context *c);

/* For objects that already hold their context: check it is not lost, make it current. */
sc_status sci_context_enter(sci_context *c, const char *fn);

/* Make c current on the calling thread if it is not (cuCtxGetCurrent, then
 * cuCtxSetCurrent); the driver's answer, *call naming the call that gave it. */
CUresult sci_context_make_current_cu(sci_context *c, const char **call);

/* A driver call on c failed. A sticky error marks c lost (the message keeps the original
 * error); the status and message are set as sci_fail_cu does. Safe to call with c->lock
 * (or any other library lock) held. */
sc_status sci_context_fail_cu(sci_context *c, CUresult r, const char *fn, const char *fmt, ...)
    SCI_PRINTF(4, 5);

/* If r is a sticky error, mark c lost (the first such error is kept as the reason) and
 * return true. Sets no message. Safe to call with any library lock held. */
bool sci_context_mark_lost(sci_context *c, CUresult r, const char *fn, const char *what);

/* A call whose failure the library tolerates (an optional query, an eager event record,
 * a fallback synchronization) returned r: a sticky error still marks c lost and is
 * reported (SC_ERR_CONTEXT_LOST, message set); any other error is ignored (SC_OK, the
 * message untouched). */
sc_status sci_context_tolerate_cu(sci_context *c, CUresult r, const char *fn, const char *fmt,
                                  ...) SCI_PRINTF(4, 5);

/* Error paths: a release made while cleaning up after a failure (status s, message set)
 * returned r. A failure is appended to the message ("call" names the release); a sticky
 * one marks c lost and turns the status into SC_ERR_CONTEXT_LOST. Returns the status. */
sc_status sci_context_cleanup_cu(sci_context *c, sc_status s, CUresult r, const char *call);

/* ---- destroy paths ------------------------------------------------------------------------
 * A destroy always destroys: the handle is stale from its first step and the library's
 * record is freed, whatever the driver answers. What it returns is the first failure among
 * the driver calls it made (a release such as cuStreamDestroy, or a call the release
 * needs), with the message of that failure; a sticky one marks the context lost. When the
 * context was already lost as the destroy began, failures are expected (the device state
 * goes with the context) and are not reported: the destroy returns SC_OK. */
typedef struct sci_release {
    sci_context *c;
    const char *fn;
    bool was_lost;    /* lost before the destroy began */
    sc_status status; /* the first failure */
    char *message;    /* its message, kept across later calls that set their own */
} sci_release;

void sci_release_begin(sci_release *rl, sci_context *c, const char *fn);
/* A release call, or a call the release needs: any failure is reported. */
void sci_release_check(sci_release *rl, CUresult r, const char *fmt, ...) SCI_PRINTF(3, 4);
/* A call the destroy can do without (making the context current, a fallback
 * synchronization): only a sticky error is reported. */
void sci_release_tolerate(sci_release *rl, CUresult r, const char *fmt, ...) SCI_PRINTF(3, 4);
/* Make the context current (sci_context_make_current_cu); only a sticky error is
 * reported: the release calls that follow report the rest. */
void sci_release_make_current(sci_release *rl);
/* A failure reported by another function (status s, message set). */
void sci_release_status(sci_release *rl, sc_status s);
/* Whether the destroy may still use the device (the context is not lost). */
bool sci_release_live(const sci_release *rl);
/* The destroy's status; restores the first failure's message. */
sc_status sci_release_end(sci_release *rl);

/* ---- destroys on other threads ------------------------------------------------------------
 * sc_context_destroy frees the context once no reference to it is left; a destroy of one of
 * its objects that uses the context after unpublishing the object (the release calls, the
 * accounting, the default stream) holds a reference from before that until its end, so the
 * context is never freed under it. sci_context_pin takes that reference for the object id
 * of kind names (*pinned stays NULL when none is needed: a destroy that sc_context_destroy
 * runs itself, on its thread); if the context is being destroyed by another thread, that
 * destroy frees the object: SC_ERR_STALE_HANDLE, message set. sci_context_unpin(NULL) does
 * nothing. */
sc_status sci_context_pin(sci_kind kind, uint64_t id, const char *fn, sci_context **pinned);
void sci_context_unpin(sci_context *pinned);

/* The destroy of an object of every kind but the context (one path): pins its context
 * (sci_context_pin), runs check(id, fn) when given (a condition of the destroy: a status
 * other than SC_OK is returned and nothing is destroyed), unpublishes the object and frees
 * it through its kind's ops->destroy (sci_registry_destroy), then unpins. Returns the first
 * failure's status (message set), else ops->destroy's. */
typedef sc_status (*sci_destroy_check_fn)(uint64_t id, const char *fn);
sc_status sci_object_destroy(sci_kind kind, uint64_t id, sci_destroy_check_fn check,
                             const char *fn);

/* Functions run by sc_context_destroy after every object is freed and before the primary
 * context is released (e.g. destroying the memory pool); they report their driver calls
 * through rl. Register at load time. */
typedef void (*sci_context_teardown_fn)(sci_context *c, sci_release *rl);
void sci_context_add_teardown(sci_context_teardown_fn fn, int order);

#endif
