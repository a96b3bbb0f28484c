/* safecuda interop: memory and streams that safecuda did not create, and safecuda memory
 * handed to other libraries without a copy.
 *
 * - A borrowed buffer wraps device memory another library owns (a PyTorch tensor, a
 *   cudaMalloc'd array) as an sc_buffer: views, copies, fills, launches, graphs, the
 *   cross-stream ordering and the leak report treat it like any buffer. Its destroy calls
 *   the owner's release callback (for DLPack: the tensor's deleter) exactly once instead of
 *   freeing; its bytes are not the context's (sc_memory_stats.borrowed_bytes, not
 *   bytes_in_use, and no budget).
 * - A DLPack export hands a view to a consumer as a DLManagedTensorVersioned; the buffer's
 *   memory stays allocated until the consumer calls the deleter, even when the buffer is
 *   destroyed first (its handle goes stale at once; the free waits for the last deleter).
 * - A wrapped stream is an existing CUstream (PyTorch's current stream, say) used as an
 *   sc_stream: safecuda orders and tracks the work it enqueues there like on its own
 *   streams, and never destroys the CUstream. A capture that another library begins on a
 *   wrapped stream (torch.cuda.graph) is seen by safecuda when it next uses the stream and
 *   is then handled like sc_stream_begin_capture's: the same refusals, the same ordering.
 *
 * Memory written by another library is ordered by the stream given at import: safecuda's
 * work on other streams waits for that stream, and the release waits for safecuda's work.
 * What a consumer does with exported memory on its own streams after the export is the
 * consumer's to order (DLPack's contract). */
#ifndef SAFECUDA_INTEROP_H
#define SAFECUDA_INTEROP_H

#include "../safecuda.h"
#include "dlpack.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
 * Wrapped (foreign) streams
 * ==================================================================================== */

/* Wrap an existing CUstream of ctx's device (cu_stream is the CUstream's value; 0 or 1
 * mean the legacy default stream, CU_STREAM_LEGACY) as an sc_stream labelled label (may be
 * NULL). The per-thread default stream (2, CU_STREAM_PER_THREAD) is refused
 * (SC_ERR_INVALID_ARGUMENT): it is another stream on every thread, and safecuda's handles
 * may be used from any thread. The stream must
 * belong to the device's primary context (the one sc_context and the CUDA runtime use):
 * SC_ERR_WRONG_CONTEXT otherwise. sc_stream_destroy of a wrapped stream waits for the work
 * queued on it (as for any stream) and forgets it, without destroying the CUstream; the
 * caller keeps the CUstream alive while the handle lives (passing a value that is not a live
 * CUstream is undefined in the driver: safecuda reports what it answers). Wrapping one
 * CUstream twice gives two handles that safecuda orders as two streams (correct, with
 * waits that were not needed). Use the macro. */
SC_API sc_status sc_stream_wrap_at(sc_context ctx, uint64_t cu_stream, const char *label,
                                   sc_stream *stream, const char *file, int line);
#define sc_stream_wrap(...) sc_stream_wrap_at(__VA_ARGS__, __FILE__, __LINE__)

/* Escape hatch: the CUstream behind any sc_stream (its own or a wrapped one), for handing
 * safecuda's stream to another library (torch.cuda.ExternalStream). Work that library
 * enqueues there is not tracked by safecuda. SC_DEFAULT_STREAM is refused
 * (SC_ERR_INVALID_ARGUMENT: it names no context; use sc_context_default_stream). */
SC_API sc_status sc_stream_cu_handle(sc_stream stream, uint64_t *cu_stream);

/* Whether the stream is a wrapped one (sc_stream_wrap). */
SC_API sc_status sc_stream_is_wrapped(sc_stream stream, bool *wrapped);

/* ======================================================================================
 * Borrowed buffers
 * ==================================================================================== */

/* Called once when a borrowed buffer goes (sc_buffer_destroy, or sc_context_destroy of a
 * leaked one), after safecuda's work on the memory is complete or ordered before the
 * owner's stream (see sc_borrow_desc.stream, also for a destroy during a capture). Any
 * thread may run it; it must not call safecuda on the buffer's context. */
typedef void (*sc_release_fn)(void *user);

typedef struct sc_borrow_desc {
    sc_dtype dtype;      /* the element type (required) */
    uint64_t count;      /* elements (at least 1) */
    const char *label;   /* shown in messages and leak reports */
    /* The stream the owner orders its own use of the memory on (for a PyTorch tensor the
     * current stream where it was written, wrapped with sc_stream_wrap). The memory counts
     * as last written on it, so safecuda's work on other streams waits for the owner's
     * writes; and at destroy that stream is made to wait for safecuda's uses before
     * release runs, so the owner may reuse the memory in its own stream order at once.
     * Zero: the context's default stream for the first, and at destroy the host waits for
     * safecuda's uses before release runs (so does a destroy that finds the stream
     * destroyed). A destroy while that stream captures (torch.cuda.graph) runs release at
     * once, before the captured work has run: the owner's next use of the memory is later
     * in the same graph (captured uses on the capture's other streams are joined into the
     * owner stream first), so the owner may reuse it only inside that graph or after
     * launching it, as PyTorch's graph-private memory pool does; only uses outside the
     * capture on other streams are waited for on the host. */
    sc_stream stream;
    bool read_only;      /* refuse every write (out / inout and tensor-map-out arguments,
                            copy or fill destinations, MoE outputs, captured writes, a
                            writable DLPack export): SC_ERR_INVALID_ARGUMENT, before
                            anything is enqueued */
    sc_release_fn release;  /* may be NULL: nothing is called */
    void *release_user;
} sc_borrow_desc;

/* Wrap count elements of dtype at device_ptr as a buffer of ctx. Checked: device_ptr is
 * not 0 and is aligned to the element size; the memory is device memory (not host or
 * managed memory) of ctx's device, mapped in the primary context; [device_ptr,
 * device_ptr + count x size) lies within one allocation (the driver's range of the
 * pointer). Statuses: SC_ERR_INVALID_ARGUMENT (a NULL or misaligned pointer, a zero
 * count, an invalid dtype, host or managed memory, a read_only buffer written),
 * SC_ERR_OUT_OF_BOUNDS (past the allocation's end), SC_ERR_WRONG_CONTEXT (memory of
 * another device or context), SC_ERR_OVERFLOW. On failure release is not called: the
 * caller still owns the memory. A borrowed buffer counts in sc_memory_stats.live_buffers
 * and borrowed_bytes, is listed and leak-reported as a buffer ("borrowed" in its detail),
 * and is named "borrowed buffer 'label'" in messages. Use the macro. */
SC_API sc_status sc_buffer_borrow_at(sc_context ctx, uint64_t device_ptr,
                                     const sc_borrow_desc *desc, sc_buffer *buffer,
                                     const char *file, int line);
#define sc_buffer_borrow(...) sc_buffer_borrow_at(__VA_ARGS__, __FILE__, __LINE__)

/* How a buffer came to be, and whether it can be written. */
typedef struct sc_buffer_origin {
    bool borrowed;      /* sc_buffer_borrow or sc_buffer_from_dlpack */
    bool read_only;
    uint32_t exports;   /* DLPack exports of it whose deleter has not run yet */
} sc_buffer_origin;

/* How the buffer came to be (made by safecuda or borrowed), whether it is read-only, and
 * how many of its DLPack exports are still held by their consumers. SC_ERR_STALE_HANDLE for
 * a destroyed buffer; SC_ERR_INVALID_ARGUMENT for a NULL origin. */
SC_API sc_status sc_buffer_get_origin(sc_buffer buffer, sc_buffer_origin *origin);

/* ======================================================================================
 * DLPack (1.x, DLManagedTensorVersioned)
 * ==================================================================================== */

typedef struct sc_dlpack_import_desc {
    const char *label;
    sc_stream stream;   /* as sc_borrow_desc.stream */
    bool read_only;     /* import read-only even when the tensor's flag does not say so */
} sc_dlpack_import_desc;

/* Import a DLPack tensor as a borrowed buffer (desc may be NULL). Checked: version major
 * 1; device type kDLCUDA with device_id = ctx's device (a CPU, host-pinned or managed
 * tensor is refused, naming its device type); a dtype with an sc_dtype (lanes 1; bool,
 * complex and the other codes are SC_ERR_TYPE_MISMATCH, named); a compact row-major
 * layout (strides NULL, or those of a C-contiguous tensor; dimensions of extent 1 may
 * have any stride); at least one element; data + byte_offset aligned to the element size;
 * then everything sc_buffer_borrow checks. The tensor's READ_ONLY flag makes the buffer
 * read-only. On SC_OK the buffer owns the tensor: its deleter runs exactly once, when the
 * buffer goes (as sc_borrow_desc.release: after safecuda's uses, see its stream). On
 * failure the caller still owns it (its deleter is not called). The buffer's label is
 * desc->label. Statuses: SC_ERR_INVALID_ARGUMENT (another major version, another device
 * type, a non-compact layout, NULL data, no elements, a negative extent, a misaligned
 * data + byte_offset), SC_ERR_WRONG_CONTEXT (device_id is not ctx's device),
 * SC_ERR_TYPE_MISMATCH, SC_ERR_OVERFLOW, and those of sc_buffer_borrow. */
SC_API sc_status sc_buffer_from_dlpack_at(sc_context ctx, DLManagedTensorVersioned *tensor,
                                          const sc_dlpack_import_desc *desc, sc_buffer *buffer,
                                          const char *file, int line);
#define sc_buffer_from_dlpack(...) sc_buffer_from_dlpack_at(__VA_ARGS__, __FILE__, __LINE__)

#define SC_DLPACK_MAX_DIMS 8

typedef struct sc_dlpack_export_desc {
    int ndim;                          /* 0: one dimension, the view's element count */
    int64_t shape[SC_DLPACK_MAX_DIMS]; /* extents >= 1 whose product is the view's count */
    bool read_only;                    /* set DLPack's READ_ONLY flag */
    /* The consumer's stream (a wrapped one, typically): it is made to wait for safecuda's
     * pending writes to the buffer (and, for a writable export, its reads) before the
     * consumer uses the tensor there. Zero: the host waits for them instead. */
    sc_stream stream;
    bool no_sync;                      /* neither: the consumer orders itself (DLPack's
                                          stream -1) */
} sc_dlpack_export_desc;

/* Export view as a new DLManagedTensorVersioned (version 1.1, kDLCUDA, the view's device
 * address with byte_offset 0, dtype and shape, explicit compact strides). desc may be NULL
 * (one dimension, writable, the host waits). The buffer's memory stays allocated until
 * the consumer calls tensor->deleter(tensor), which it must do exactly once, from any
 * thread, at any time (also after the buffer or the context is destroyed); the deleter
 * leaves the calling thread's last error and current CUDA context as they were. When
 * desc->stream was given and still exists at that call (and is not capturing then), the
 * deleter counts the consumer's use of the memory on it, without adding waits to that
 * stream: safecuda's later conflicting work on the buffer, and its free, wait for what the
 * consumer queued there before calling the deleter. Until its deleter
 * runs, an export is an object of the buffer's context ("dlpack export" in
 * sc_context_live_objects and the leak report, labelled as the buffer, created where the
 * export was made). A context destroyed while exports are held reports each one (the
 * buffer, and where it was exported), frees the memory and returns SC_ERR_LEAKED: the
 * tensors then dangle (their deleter stays safe to call, and only frees the tensor).
 * Statuses: SC_ERR_INVALID_ARGUMENT (ndim outside 0 .. 8, an extent < 1, a shape whose
 * product is not the view's count, a read-only buffer exported writable), the view
 * statuses, SC_ERR_WRONG_CONTEXT (desc->stream of another context),
 * SC_ERR_HOST_OUT_OF_MEMORY. Use the macro: it records where the export was made. */
SC_API sc_status sc_view_to_dlpack_at(sc_view view, const sc_dlpack_export_desc *desc,
                                      DLManagedTensorVersioned **tensor, const char *file,
                                      int line);
#define sc_view_to_dlpack(...) sc_view_to_dlpack_at(__VA_ARGS__, __FILE__, __LINE__)

/* The DLPack data type of an sc_dtype and back (SC_ERR_TYPE_MISMATCH where none exists;
 * the message names the type). */
SC_API sc_status sc_dtype_to_dlpack(sc_dtype dtype, DLDataType *out);
SC_API sc_status sc_dtype_from_dlpack(DLDataType type, sc_dtype *out);

#ifdef __cplusplus
}
#endif
#endif
