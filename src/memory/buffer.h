/* Device buffers, views and pinned host buffers (internal). */
#ifndef SAFECUDA_MEMORY_BUFFER_H
#define SAFECUDA_MEMORY_BUFFER_H

#include "stream/order.h"

/* What a borrowed buffer's destroy calls instead of freeing (src/interop/): release(user),
 * exactly once. */
typedef void (*sci_release_fn)(void *user);

typedef struct sci_buffer {
    sci_object obj;
    sci_context *ctx;
    sc_dtype dtype;
    uint64_t count;
    uint64_t bytes;
    CUdeviceptr ptr;
    sci_tracker tracker; /* tracker.read_only: a read-only (borrowed) buffer */

    /* Borrowed memory (src/interop/borrow.c): not the context's to free. Its bytes count
     * in borrowed_bytes, not bytes_in_use. At destroy, after the uses: the owner stream
     * (if it still exists) is made to wait for them, else the host waits; then release. */
    bool borrowed;
    uint64_t owner_stream_id; /* 0: none given */
    sci_release_fn release;   /* may be NULL */
    void *release_user;

    /* DLPack exports (src/interop/dlpack.c) that hold the memory, and whether the buffer
     * was destroyed while some were held: its handle is stale, its memory is freed (or
     * released) by the last export's drop. Under the buffers' hold lock (buffer.c). */
    uint32_t exports;
    bool destroyed;
} sci_buffer;

typedef struct sci_host_buffer {
    sci_object obj;
    sci_context *ctx;
    uint64_t bytes;
    void *ptr;
    sci_tracker tracker;
} sci_host_buffer;

/* A view resolved against its buffer: the buffer (referenced), the element range and the
 * device address of its first element. */
typedef struct sci_resolved_view {
    sci_buffer *buf;
    uint64_t offset, count, bytes;
    CUdeviceptr ptr;
} sci_resolved_view;

/* Acquire the view's buffer and check the range (SC_WHOLE resolved). what names the
 * argument in messages ("dst", "src", "argument 2"). Release with sci_view_release. */
sc_status sci_view_resolve(sc_view v, const char *fn, const char *what,
                           sci_resolved_view *out);
void sci_view_release(sci_resolved_view *rv);

/* Publish a record whose ctx, dtype, count, bytes, ptr (and borrowed fields) are set: its
 * tracker (first use: a write on first_writer; read_only as given) and its registry entry
 * (owned by b->ctx). On failure nothing is published and the caller still owns b. */
sc_status sci_buffer_publish(sci_buffer *b, bool read_only, sci_stream *first_writer,
                             const char *label, const char *file, int line, const char *fn);

/* sc_buffer_destroy with fn naming the public function in messages. */
sc_status sci_buffer_destroy(uint64_t id, const char *fn);

/* A DLPack export holds b's memory: b must be referenced (acquired) by the caller. */
void sci_buffer_export_hold(sci_buffer *b);
/* Drop a hold. The last hold of a destroyed buffer frees its memory now (stream-ordered
 * after its uses, as sc_buffer_destroy does; a borrowed buffer's release runs instead) and
 * frees the record: the caller must keep b's context alive (sci_context_pin) across the
 * call. The status of that free (SC_OK otherwise). */
sc_status sci_buffer_export_drop(sci_buffer *b, const char *fn);
/* The number of holds now. */
uint32_t sci_buffer_exports(sci_buffer *b);

/* SC_ERR_INVALID_ARGUMENT (message: fn, what, the buffer) when the buffer is read-only,
 * for the calls that must refuse a write before they enqueue anything (sc_moe_forward's
 * outputs; every write is refused in sci_access_begin anyway); the handle's statuses. */
sc_status sci_buffer_check_writable(sc_buffer buffer, const char *fn, const char *what);

/* Mark a buffer as the library's own (a workspace): never reported as a leak. */
void sci_buffer_set_internal(sc_buffer b);

/* "buffer 'x' of 256 f32 (created at demo.c:14)" for messages. */
const char *sci_buffer_describe(const sci_buffer *b, char *buf, size_t size);

#endif
