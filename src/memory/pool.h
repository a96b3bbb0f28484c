/* The context's device memory: its pool, the accounting and the VRAM budget. */
#ifndef SAFECUDA_MEMORY_POOL_H
#define SAFECUDA_MEMORY_POOL_H

#include "stream/stream.h"

/* The context's memory pool, created on first use. */
sc_status sci_context_pool(sci_context *c, const char *fn, CUmemoryPool *pool);

/* Allocate bytes stream-ordered on stream, within the budget, with the accounting.
 * what describes the request in messages ("'x' (256 x f32)"). */
sc_status sci_device_alloc(sci_context *c, sci_stream *stream, uint64_t bytes, const char *what,
                           const char *fn, CUdeviceptr *ptr);
/* Free stream-ordered on stream (nothing to free on a lost context: the memory goes with
 * the context) and take the buffer off the accounting. Returns cuMemFreeAsync's answer;
 * the caller reports it. A free refused with a non-sticky error leaves the memory
 * allocated: its bytes stay in bytes_in_use (against the budget) for good. */
CUresult sci_device_free(sci_context *c, CUstream stream, CUdeviceptr ptr, uint64_t bytes);

#endif
