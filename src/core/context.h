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

    /* Memory accounting (src/memory/ keeps it, under lock). */
    pthread_mutex_t lock;
    uint64_t vram_budget;
    uint64_t bytes_in_use;
    uint64_t peak_bytes;
    uint64_t live_buffers;
    uint64_t pinned_bytes;
    CUmemoryPool pool;           /* created by src/memory/ on first use */
    uint64_t default_stream_id;  /* created by src/stream/ on first use */

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

/* A driver call on c failed. A sticky error marks c lost (the message keeps the original
 * error); the status and message are set as sci_fail_cu does. Safe to call with c->lock
 * (or any other library lock) held. */
sc_status sci_context_fail_cu(sci_context *c, CUresult r, const char *fn, const char *fmt, ...)
    SCI_PRINTF(4, 5);

/* Functions run by sc_context_destroy after every object is freed and before the primary
 * context is released (e.g. destroying the memory pool). Register at load time. */
typedef void (*sci_context_teardown_fn)(sci_context *c);
void sci_context_add_teardown(sci_context_teardown_fn fn, int order);

#endif
