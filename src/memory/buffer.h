/* Device buffers, views and pinned host buffers (internal). */
#ifndef SAFECUDA_MEMORY_BUFFER_H
#define SAFECUDA_MEMORY_BUFFER_H

#include "stream/order.h"

typedef struct sci_buffer {
    sci_object obj;
    sci_context *ctx;
    sc_dtype dtype;
    uint64_t count;
    uint64_t bytes;
    CUdeviceptr ptr;
    sci_tracker tracker;
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

/* sc_buffer_destroy with fn naming the public function in messages. */
sc_status sci_buffer_destroy(uint64_t id, const char *fn);

/* Mark a buffer as the library's own (a workspace): never reported as a leak. */
void sci_buffer_set_internal(sc_buffer b);

/* "buffer 'x' of 256 f32 (created at demo.c:14)" for messages. */
const char *sci_buffer_describe(const sci_buffer *b, char *buf, size_t size);

#endif
