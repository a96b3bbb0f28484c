/* safecuda: safe and fast NVIDIA GPU programming from C.
 *
 * Every object is an opaque handle (a 64-bit id holding a slot index and a generation
 * counter): using a handle after its object was destroyed is SC_ERR_STALE_HANDLE, never
 * undefined behaviour. Every fallible function returns an sc_status; sc_last_error()
 * gives the calling thread's message for its most recent failure, naming the function,
 * the values involved and, for handles, the object's kind and creation site.
 *
 * Options come in *_desc structs whose zero value means "the sensible default". The
 * create functions are macros that record the caller's file:line (for leak reports and
 * messages) and call the *_at function:
 *
 *     sc_context ctx;
 *     if (sc_context_create(&(sc_context_desc){ .device = 0 }, &ctx) != SC_OK)
 *         fprintf(stderr, "%s\n", sc_last_error());
 *
 * The CUDA driver and NVRTC are loaded at run time; nothing here needs the CUDA toolkit.
 * Thread safety: every function may be called from any thread. Objects may be used from
 * several threads at once; destroying an object while another thread still uses it
 * waits for that use to finish (the other thread's later uses are stale-handle errors).
 *
 * Destroy functions always destroy: from the call on the handle is stale and the
 * library's host-side record is freed, whatever the driver answers. A destroy returns
 * SC_OK, or the first driver error it met on the way (SC_ERR_DRIVER, SC_ERR_OUT_OF_MEMORY,
 * or SC_ERR_CONTEXT_LOST for a sticky error, which marks the context lost), with a message
 * naming the driver call; when that call was the release itself, the driver keeps that one
 * object (see sc_memory_stats for how its memory is counted). Objects of a context that
 * was already lost are destroyed without reporting the driver's answers (SC_OK): what they
 * held on the device goes with the context.
 *
 * Statuses. Each function's comment names the statuses that are particular to it. Besides
 * those and SC_OK, any function may return these where they apply:
 *   SC_ERR_INVALID_ARGUMENT  a required pointer is NULL, or an enum value or desc field is
 *                            out of range (the message names the argument or field);
 *   SC_ERR_STALE_HANDLE      a handle, or a view's buffer, was destroyed or never existed;
 *   SC_ERR_WRONG_KIND        a handle of another kind (a stream passed as an event);
 *   SC_ERR_WRONG_CONTEXT     objects of two contexts meet in one call;
 *   SC_ERR_NO_DRIVER         (calls that need the driver) no libcuda could be loaded, or
 *                            only the toolkit's stub: nothing to run on;
 *   SC_ERR_DRIVER            (calls that reach the driver) the driver answered an error
 *                            that has no status of its own, named in the message; also a
 *                            libcuda that was found but can't be used (cuInit fails, too
 *                            old, entry points missing);
 *   SC_ERR_CONTEXT_LOST      (calls on a context's objects) a sticky device error (an
 *                            illegal address, a kernel fault) lost the context, now or
 *                            before; the message quotes the original error;
 *   SC_ERR_HOST_OUT_OF_MEMORY  a host allocation of the library failed;
 *   SC_ERR_LIMIT             (create functions) the handle table is full;
 *   SC_ERR_INTERNAL          a bug in safecuda.
 * A failed call leaves no trace: it creates no object, accounts no memory and enqueues no
 * work, unless its comment says otherwise. */
#ifndef SAFECUDA_H
#define SAFECUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SAFECUDA_VERSION_MAJOR 0
#define SAFECUDA_VERSION_MINOR 1
#define SAFECUDA_VERSION_PATCH 0

#if defined(SAFECUDA_STATIC) || !defined(__GNUC__)
#define SC_API
#else
#define SC_API __attribute__((visibility("default")))
#endif

/* ======================================================================================
 * Status codes and errors
 * ==================================================================================== */

typedef enum sc_status {
    SC_OK = 0,
    SC_ERR_INVALID_ARGUMENT,   /* a NULL pointer, a bad enum value, a bad desc field */
    SC_ERR_NO_DRIVER,          /* libcuda could not be loaded (or only the toolkit stub) */
    SC_ERR_NO_COMPILER,        /* NVRTC could not be loaded */
    SC_ERR_NO_DEVICE,          /* no CUDA device, or the device ordinal does not exist */
    SC_ERR_STALE_HANDLE,       /* the handle's object was destroyed (or it never existed) */
    SC_ERR_WRONG_KIND,         /* a handle of another kind (a foreign handle) */
    SC_ERR_WRONG_CONTEXT,      /* the object belongs to another context */
    SC_ERR_OUT_OF_MEMORY,      /* the device has no memory left for the request */
    SC_ERR_HOST_OUT_OF_MEMORY, /* host memory (malloc, pinned allocation) failed */
    SC_ERR_BUDGET_EXCEEDED,    /* the context's VRAM budget would be exceeded */
    SC_ERR_OUT_OF_BOUNDS,      /* an offset or a count outside a buffer or view */
    SC_ERR_OVERFLOW,           /* size arithmetic overflowed */
    SC_ERR_TYPE_MISMATCH,      /* element types do not match */
    SC_ERR_BUSY,               /* the object is in use by work in flight (try variants) */
    SC_ERR_NOT_READY,          /* queried work has not finished yet (not a failure) */
    SC_ERR_LEAKED,             /* a context was destroyed with live objects (all freed) */
    SC_ERR_CONTEXT_LOST,       /* a sticky device error poisoned the context */
    SC_ERR_DRIVER,             /* any other CUDA driver error (its name is in the message) */
    SC_ERR_COMPILE,            /* NVRTC rejected a program (its log is in the message) */
    SC_ERR_LAUNCH,             /* a launch's arguments or configuration are invalid */
    SC_ERR_NOT_SUPPORTED,      /* the driver or device lacks a needed feature (also any
                                  launch on the test device: its kernels never run) */
    SC_ERR_IO,                 /* a file could not be read or written */
    SC_ERR_LIMIT,              /* an internal limit was reached (e.g. too many objects) */
    SC_ERR_INTERNAL,           /* a bug in safecuda: please report it */
    SC_ERR_CAPTURE,            /* not allowed while a stream capture is in progress (nothing
                                  was done; the capture is still usable) */
    SC_ERR_CAPTURE_INVALIDATED, /* the capture was invalidated: it produced no graph */
    SC_ERR_NO_NCCL,            /* no usable NCCL could be loaded (safecuda/comm.h) */
    SC_ERR_COMM,               /* NCCL reported an error, or the communicator was aborted
                                  (its name and text are in the message) */
    SC_ERR_TIMEOUT,            /* a communicator's operation did not finish in its timeout:
                                  the communicator was aborted */
    SC_STATUS_COUNT
} sc_status;

/* The enum value's name, e.g. "SC_ERR_STALE_HANDLE"; "SC_STATUS_UNKNOWN" if out of range. */
SC_API const char *sc_status_name(sc_status status);

/* The calling thread's message for its most recent failed call ("" if none yet). The
 * pointer stays valid until the thread's next safecuda call. Successful calls keep it.
 * A message longer than 16 KiB keeps its start and ends with
 * "... [message cut: N of M bytes shown]" (M: the whole message's length). */
SC_API const char *sc_last_error(void);

/* Forget the calling thread's last error message. */
SC_API void sc_clear_error(void);

/* ======================================================================================
 * Logging (leak reports and warnings). The default writes to stderr.
 * ==================================================================================== */

typedef enum sc_log_level { SC_LOG_DEBUG, SC_LOG_INFO, SC_LOG_WARN, SC_LOG_ERROR } sc_log_level;
typedef void (*sc_log_fn)(sc_log_level level, const char *message, void *user);

/* Route library messages to fn (NULL restores the stderr default). Thread-safe: the
 * callback may run on several threads at once, and once this returns no other thread is
 * still running the previous callback, so its user data may be freed (it waits for the
 * calls in progress; don't call it while holding a lock the callback takes). Called from
 * inside a callback it returns at once, without waiting. */
SC_API void sc_set_log_callback(sc_log_fn fn, void *user);

/* ======================================================================================
 * Library, driver and compiler
 * ==================================================================================== */

/* "0.1.0" */
SC_API const char *sc_version_string(void);

/* Load the CUDA driver now (it is otherwise loaded on first use). SC_ERR_NO_DRIVER says
 * what was tried and what to install; SC_ERR_DRIVER that a libcuda was found but can't be
 * used, and why. The answer is decided once per process. Safe to call many times and from
 * many threads. SAFECUDA_DEVICE=test loads the test device instead
 * (libsafecuda_testdevice.so, installed beside libsafecuda: host memory, kernels do not
 * run); another SAFECUDA_DEVICE value is SC_ERR_INVALID_ARGUMENT. SAFECUDA_LIBCUDA, when
 * set, names the file to load. */
SC_API sc_status sc_init(void);

/* The CUDA version the driver supports, as 1000 * major + 10 * minor (e.g. 13000). Loads
 * the driver (the statuses of sc_init). */
SC_API sc_status sc_driver_version(int *version);

/* The path of the loaded libcuda, NUL-terminated into buf (cut to size - 1 characters).
 * SC_ERR_INVALID_ARGUMENT for a NULL buf or size 0; loads the driver (sc_init's statuses). */
SC_API sc_status sc_driver_path(char *buf, size_t size);

/* Load NVRTC and report its version. Needs no driver or GPU. SC_ERR_NO_COMPILER says what
 * was tried and what to install. */
SC_API sc_status sc_compiler_version(int *major, int *minor);

/* Load NVRTC and write the path of the loaded libnvrtc into buf (cut to size - 1 bytes,
 * NUL-terminated). SC_ERR_INVALID_ARGUMENT for a NULL buf or a size of 0;
 * SC_ERR_NO_COMPILER (buf untouched) says what was tried. Needs no driver or device. */
SC_API sc_status sc_compiler_path(char *buf, size_t size);

/* The architectures NVRTC compiles for, ascending, as XY (75 for sm_75, 121 for sm_121):
 * the first min(capacity, all) into archs, how many there are into *count (archs may be
 * NULL with capacity 0 to ask only that). A cubin is built for these only; another
 * architecture gets PTX for the newest of them below it (which the driver compiles when it
 * loads it), or nothing when none is below it. The architecture-specific form (sm_XYa,
 * sc_program_desc.arch_specific) exists for sm_90 and newer (SC_ARCH_SPECIFIC_MIN).
 * SC_ERR_INVALID_ARGUMENT for a NULL count, or a NULL archs with capacity > 0;
 * SC_ERR_NO_COMPILER when NVRTC can't be loaded; SC_ERR_NOT_SUPPORTED (*count 0) for an
 * NVRTC too old to say (before 11.2: it decides at compile time). Needs no driver or
 * device. */
SC_API sc_status sc_compiler_archs(int *archs, size_t capacity, size_t *count);

/* The oldest architecture with an architecture-specific form (sm_90a). */
#define SC_ARCH_SPECIFIC_MIN 90

/* ======================================================================================
 * Devices
 * ==================================================================================== */

typedef struct sc_device_props {
    int ordinal;
    char name[256];
    char uuid[48];       /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi */
    char pci_bus_id[32]; /* "0000:3b:00.0" */
    int cc_major, cc_minor;
    int sm_count;
    uint64_t total_memory;   /* bytes */
    int l2_cache_bytes;
    int shared_per_block;       /* bytes, default limit */
    int shared_per_block_optin; /* bytes, with the opt-in attribute raised */
    int shared_per_sm;          /* bytes */
    int max_threads_per_block;
    int max_threads_per_sm;
    int warp_size;
    int registers_per_block;
    int registers_per_sm;
    int clock_khz;              /* peak SM clock */
    int memory_clock_khz;       /* peak memory clock */
    int memory_bus_width_bits;
    double memory_bandwidth_gbs; /* theoretical: 2 (DDR) * memory clock * bus width / 8 */
    int max_grid[3];
    int max_block[3];
    int async_engines;
    bool ecc_enabled;
    bool memory_pools_supported;
} sc_device_props;

/* Number of CUDA devices (0 with SC_OK when the driver is present but sees no GPU). The
 * driver's statuses: SC_ERR_NO_DRIVER when none is installed (count 0). */
SC_API sc_status sc_device_count(int *count);

/* Properties of device `device` (0 .. count-1). SC_ERR_NO_DEVICE for another ordinal. */
SC_API sc_status sc_device_info(int device, sc_device_props *props);

/* Free and total device memory now, in bytes. Activates the device's primary context
 * for the duration of the call if no safecuda context holds it. SC_ERR_NO_DEVICE for an
 * ordinal that does not exist. */
SC_API sc_status sc_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes);

/* ======================================================================================
 * Contexts
 * ==================================================================================== */

typedef struct sc_context { uint64_t id; } sc_context;

typedef struct sc_context_desc {
    int device;            /* device ordinal */
    uint64_t vram_budget;  /* bytes this context may hold in buffers; 0 = no budget */
    /* Turn off the automatic ordering of buffers used on several streams. The caller then
     * owes the ordering: before a buffer is used on stream B after a conflicting use on
     * stream A (a write then a read, a read then a write, two writes), record an event on
     * A and make B wait on it (sc_event_record, sc_stream_wait). Destroying a buffer stays
     * safe either way: it is freed only after its work on every stream. */
    bool disable_event_tracking;
} sc_context_desc;

/* Create a context over the device's primary context (retained; released on destroy).
 * A context may be used from any thread: the library makes it current where needed.
 * desc may be NULL (device 0, defaults). Use the macro: it records the call site.
 * SC_ERR_NO_DEVICE for an ordinal that does not exist; SC_ERR_OUT_OF_MEMORY when the
 * device can't hold another context. */
SC_API sc_status sc_context_create_at(const sc_context_desc *desc, sc_context *ctx,
                                      const char *file, int line);
#define sc_context_create(...) sc_context_create_at(__VA_ARGS__, __FILE__, __LINE__)

/* Destroy a context. Every object still alive in it is reported through the log callback
 * (kind, label, size, creation site), freed, and the call returns SC_ERR_LEAKED; the
 * context is destroyed either way. Waits for the context's work to finish. A context
 * lost to a sticky device error can still be destroyed. A driver error while releasing
 * (an object, the memory pool, the primary context) is returned instead of SC_ERR_LEAKED,
 * as for any destroy (see the top of this file). */
SC_API sc_status sc_context_destroy(sc_context ctx);

/* The device ordinal of the context. Works on a lost context too. */
SC_API sc_status sc_context_device(sc_context ctx, int *device);

/* Wait for all work queued in the context. SC_ERR_CONTEXT_LOST when that work met a
 * sticky device error (a kernel's illegal address, say): the context is lost from then. */
SC_API sc_status sc_context_synchronize(sc_context ctx);

/* SC_OK while usable; SC_ERR_CONTEXT_LOST (message: the original error) once lost. */
SC_API sc_status sc_context_check(sc_context ctx);

/* One live object of a context, as the leak report lists it. */
typedef struct sc_object_info {
    const char *kind;  /* "buffer", "host buffer", "stream", ... */
    char label[64];
    char detail[96];   /* kind-specific: "1024 x f32", ... */
    uint64_t bytes;    /* memory the object holds (0 if none) */
    const char *file;  /* creation site (basename) */
    int line;
} sc_object_info;

/* List the context's live objects into out[0 .. capacity) in creation order and set
 * *count to how many there are (which may be more than capacity). out may be NULL when
 * capacity is 0 (SC_ERR_INVALID_ARGUMENT otherwise). Works on a lost context. The strings
 * stay valid while the objects live. */
SC_API sc_status sc_context_live_objects(sc_context ctx, sc_object_info *out, size_t capacity,
                                         size_t *count);

/* Write the list of live objects through the log callback; *count (may be NULL) gets the
 * number. Works on a lost context. */
SC_API sc_status sc_context_live_report(sc_context ctx, size_t *count);

/* Memory held by the context and the device (sc_context_memory). */
typedef struct sc_memory_stats {
    uint64_t bytes_in_use;   /* bytes of the context's live buffers, plus those of destroyed
                                buffers whose free the driver refused (it still holds them:
                                they count against the budget until the context goes) and
                                of destroyed buffers that DLPack exports still hold (until
                                the last deleter) */
    uint64_t peak_bytes;     /* the most bytes_in_use has been since the context began */
    uint64_t live_buffers;   /* borrowed ones and export-held ones included */
    uint64_t vram_budget;    /* 0 = none */
    uint64_t pool_reserved;  /* device memory the context's pool holds (in use + cached) */
    uint64_t pinned_bytes;   /* bytes of the context's live pinned host buffers, plus those
                                the driver refused to unpin at their destroy */
    uint64_t borrowed_bytes; /* bytes of the context's live borrowed buffers
                                (safecuda/interop.h): not in bytes_in_use nor the budget */
    uint64_t device_free;    /* the device's free memory now */
    uint64_t device_total;
} sc_memory_stats;

/* The figures above, now. */
SC_API sc_status sc_context_memory(sc_context ctx, sc_memory_stats *stats);

/* Wait for the context's work, then return the pool's cached (unused) device memory to
 * the device. Buffers are allocated from a per-context pool that keeps freed memory for
 * reuse; this gives it back. */
SC_API sc_status sc_context_trim(sc_context ctx);

/* ======================================================================================
 * Element types
 * ==================================================================================== */

typedef enum sc_dtype {
    SC_DTYPE_INVALID = 0,
    SC_U8, SC_I8, SC_U16, SC_I16, SC_U32, SC_I32, SC_U64, SC_I64,
    SC_F16, SC_BF16, SC_F32, SC_F64,
    SC_F8E4M3, /* 8-bit float, 4 exponent bits, 3 mantissa bits, no infinities, max 448
                  (OCP e4m3fn; CUDA __nv_fp8_e4m3, torch.float8_e4m3fn) */
    SC_F8E5M2, /* 8-bit float, 5 exponent bits, 2 mantissa bits, IEEE-like, max 57344
                  (CUDA __nv_fp8_e5m2, torch.float8_e5m2) */
    SC_DTYPE_COUNT
} sc_dtype;

/* Bytes per element (0 for an invalid dtype) and the short name ("f32", "bf16", ...;
 * "invalid" for an invalid dtype). */
SC_API size_t sc_dtype_size(sc_dtype dtype);
SC_API const char *sc_dtype_name(sc_dtype dtype);

/* ======================================================================================
 * Streams and events
 *
 * Every operation runs on a stream. The zero handle SC_DEFAULT_STREAM means the context's
 * default stream (a non-blocking stream the context creates on first use) wherever another
 * argument (a view, an event, a kernel) names the context: copies, fills, launches, event
 * records. Functions that take only a stream (sc_stream_synchronize, sc_stream_destroy,
 * ...) need a real handle: sc_context_default_stream gives the default stream's. Operations on
 * one stream run in order. With event tracking on (the default), an operation that
 * touches a buffer last used on another stream first waits for that use when the two
 * conflict (read-after-write, write-after-read, write-after-write); operations on one
 * stream add no waits. See sc_context_desc.disable_event_tracking.
 * ==================================================================================== */

typedef struct sc_stream { uint64_t id; } sc_stream;
typedef struct sc_event { uint64_t id; } sc_event;
#ifdef __cplusplus
#define SC_DEFAULT_STREAM (sc_stream{0})
#else
#define SC_DEFAULT_STREAM ((sc_stream){0})
#endif

typedef struct sc_stream_desc {
    int priority;       /* 0 = default; lower numbers run first (CUDA's convention), the
                           value is clamped to the device's range */
    bool blocking;      /* synchronize with the legacy default stream (rarely wanted) */
    const char *label;
} sc_stream_desc;

/* Create a stream of the context (desc may be NULL: default priority, not blocking, no
 * label). Work on it is ordered against the context's other streams through the buffers it
 * uses (above). SC_ERR_INVALID_ARGUMENT for a NULL stream; the context's statuses
 * (SC_ERR_STALE_HANDLE, SC_ERR_CONTEXT_LOST); SC_ERR_HOST_OUT_OF_MEMORY; SC_ERR_DRIVER
 * when the driver can't make it. Use the macro: it records the call site, which messages
 * and leak reports show. */
SC_API sc_status sc_stream_create_at(sc_context ctx, const sc_stream_desc *desc,
                                     sc_stream *stream, const char *file, int line);
#define sc_stream_create(...) sc_stream_create_at(__VA_ARGS__, __FILE__, __LINE__)

/* Finish the stream's queued work, then destroy it. The default stream can't be
 * destroyed (it goes with its context): SC_ERR_INVALID_ARGUMENT. The destroy statuses of
 * the top of this file. */
SC_API sc_status sc_stream_destroy(sc_stream stream);

/* The context's default stream as a handle (it is never reported as a leak). Creates it
 * on first use. */
SC_API sc_status sc_context_default_stream(sc_context ctx, sc_stream *stream);

/* Wait until the stream's queued work is done. SC_ERR_CONTEXT_LOST when it met a sticky
 * device error. */
SC_API sc_status sc_stream_synchronize(sc_stream stream);
/* SC_OK when all queued work is done, SC_ERR_NOT_READY while some is running (an answer,
 * not a failure: it sets no message). */
SC_API sc_status sc_stream_query(sc_stream stream);
/* Make later work on stream wait until event's last record has completed (an event never
 * recorded is complete: no wait). Does not block the host. */
SC_API sc_status sc_stream_wait(sc_stream stream, sc_event event);
/* The stream's clamped priority. */
SC_API sc_status sc_stream_priority(sc_stream stream, int *priority);

typedef struct sc_event_desc {
    bool timing;        /* record timestamps for sc_event_elapsed */
    bool blocking_sync; /* synchronize by sleeping rather than spinning */
    const char *label;
} sc_event_desc;

/* Create an event of the context (desc may be NULL: no timing, spin on synchronize). Use
 * the macro: it records the call site. */
SC_API sc_status sc_event_create_at(sc_context ctx, const sc_event_desc *desc,
                                    sc_event *event, const char *file, int line);
#define sc_event_create(...) sc_event_create_at(__VA_ARGS__, __FILE__, __LINE__)
/* Destroy the event (waits already enqueued on it still happen). The destroy statuses of
 * the top of this file. */
SC_API sc_status sc_event_destroy(sc_event event);
/* Record the event at the current end of stream (SC_DEFAULT_STREAM: the event's context's
 * default stream). A later record replaces the earlier one for waits and queries.
 * SC_ERR_WRONG_CONTEXT for a stream of another context. */
SC_API sc_status sc_event_record(sc_event event, sc_stream stream);
/* Wait on the host until the event's last record has completed (at once if it was never
 * recorded). SC_ERR_CONTEXT_LOST when the work before it met a sticky device error. */
SC_API sc_status sc_event_synchronize(sc_event event);
/* SC_OK when the recorded work is done (or the event was never recorded),
 * SC_ERR_NOT_READY while it runs (an answer, not a failure: it sets no message). */
SC_API sc_status sc_event_query(sc_event event);
/* Milliseconds between two recorded timing events (start, end). SC_ERR_INVALID_ARGUMENT
 * when either was created without .timing or never recorded; SC_ERR_NOT_READY (with a
 * message) while either record is still pending; SC_ERR_WRONG_CONTEXT for events of two
 * contexts. */
SC_API sc_status sc_event_elapsed(sc_event start, sc_event end, float *ms);

/* ======================================================================================
 * Device buffers and views
 * ==================================================================================== */

typedef struct sc_buffer { uint64_t id; } sc_buffer;

typedef struct sc_buffer_desc {
    sc_dtype dtype;
    uint64_t count;      /* elements; must be at least 1 (zero-count buffers are refused) */
    const char *label;   /* shown in messages and leak reports */
    bool zero;           /* fill with zero bytes after allocation (on the stream) */
    sc_stream stream;    /* the stream that allocates (default: the default stream) */
} sc_buffer_desc;

/* Allocate stream-ordered from the context's pool. Fails with SC_ERR_BUDGET_EXCEEDED past
 * the context's vram_budget and SC_ERR_OUT_OF_MEMORY when the device has no room; the
 * context stays usable after either. The memory is uninitialised unless desc->zero.
 * SC_ERR_INVALID_ARGUMENT for an invalid dtype or a zero count; SC_ERR_OVERFLOW when
 * count x element size does not fit 64 bits. */
SC_API sc_status sc_buffer_create_at(sc_context ctx, const sc_buffer_desc *desc,
                                     sc_buffer *buffer, const char *file, int line);
#define sc_buffer_create(...) sc_buffer_create_at(__VA_ARGS__, __FILE__, __LINE__)

/* Free the buffer after all work queued on it on any stream (stream-ordered: the call
 * does not wait). Later uses of the handle, or of views of it, are SC_ERR_STALE_HANDLE,
 * and so is a second destroy. The destroy statuses of the top of this file. */
SC_API sc_status sc_buffer_destroy(sc_buffer buffer);

typedef struct sc_buffer_props {
    sc_dtype dtype;
    uint64_t count;
    uint64_t bytes;
    char label[64];
    const char *file;  /* creation site (basename) */
    int line;
    sc_context context;
} sc_buffer_props;

/* The buffer's element type, size, label, creation site and context. props->file points
 * into the library's record: it stays valid while the buffer lives. */
SC_API sc_status sc_buffer_info(sc_buffer buffer, sc_buffer_props *props);

/* UNCHECKED escape hatch for interop: the buffer's device address. safecuda can't see
 * what is done through it: no bounds checks, no stream ordering, and the address dangles
 * once the buffer is destroyed. Synchronize the buffer's streams before using it
 * elsewhere. */
SC_API sc_status sc_buffer_device_ptr(sc_buffer buffer, uint64_t *device_ptr);

/* A view: a range of a buffer's elements, passed by value and checked at every use (a
 * view of a destroyed buffer is SC_ERR_STALE_HANDLE). count SC_WHOLE means "to the end of
 * the buffer", so sc_view_of(b) names the whole buffer whatever its size. */
typedef struct sc_view {
    sc_buffer buffer;
    uint64_t offset; /* elements */
    uint64_t count;  /* elements, or SC_WHOLE */
} sc_view;
#define SC_WHOLE UINT64_MAX

static inline sc_view sc_view_of(sc_buffer buffer)
{
    sc_view v = {buffer, 0, SC_WHOLE};
    return v;
}

/* A checked view of elements [offset, offset + count) of the buffer (count may be
 * SC_WHOLE). The result has an explicit count. SC_ERR_OVERFLOW when offset + count wraps
 * around 64 bits; SC_ERR_OUT_OF_BOUNDS when the range ends past the buffer (or offset is
 * past its end with SC_WHOLE). Every function that takes a view applies the same checks
 * to it, with the same statuses. */
SC_API sc_status sc_buffer_view(sc_buffer buffer, uint64_t offset, uint64_t count,
                                sc_view *view);
/* A view of elements [offset, offset + count) of a view (offsets relative to the view).
 * SC_ERR_OVERFLOW when offset + count wraps; SC_ERR_OUT_OF_BOUNDS past the view's end. */
SC_API sc_status sc_view_sub(sc_view view, uint64_t offset, uint64_t count, sc_view *sub);

/* ======================================================================================
 * Pinned host buffers
 *
 * Page-locked host memory for asynchronous copies. The memory is reached through
 * sc_host_buffer_ptr, which first waits for every copy in flight that uses the buffer;
 * the pointer may be used until the next copy that uses the buffer is enqueued, after
 * which it must be fetched again. sc_host_buffer_write / _read copy in and out with the
 * same wait. Destroying a host buffer waits for its copies too.
 * ==================================================================================== */

typedef struct sc_host_buffer { uint64_t id; } sc_host_buffer;

typedef struct sc_host_buffer_desc {
    uint64_t bytes;     /* at least 1 */
    const char *label;
    bool zero;          /* fill with zero bytes */
} sc_host_buffer_desc;

/* Allocate desc->bytes (at least 1, else SC_ERR_INVALID_ARGUMENT) of pinned host memory
 * for the context. SC_ERR_HOST_OUT_OF_MEMORY when the system can't pin that much. Use the
 * macro: it records the call site. */
SC_API sc_status sc_host_buffer_create_at(sc_context ctx, const sc_host_buffer_desc *desc,
                                          sc_host_buffer *host, const char *file, int line);
#define sc_host_buffer_create(...) sc_host_buffer_create_at(__VA_ARGS__, __FILE__, __LINE__)
/* Wait for the copies in flight that use it, then free it. The destroy statuses of the top
 * of this file. */
SC_API sc_status sc_host_buffer_destroy(sc_host_buffer host);
/* SC_ERR_BUSY (and nothing destroyed) while a copy using it is in flight. */
SC_API sc_status sc_host_buffer_try_destroy(sc_host_buffer host);

/* Wait for the copies in flight, then give the memory's address and size. */
SC_API sc_status sc_host_buffer_ptr(sc_host_buffer host, void **ptr, uint64_t *bytes);
/* SC_ERR_BUSY instead of waiting. */
SC_API sc_status sc_host_buffer_try_ptr(sc_host_buffer host, void **ptr, uint64_t *bytes);
/* Wait for the copies in flight, then copy bytes in or out at a byte offset.
 * SC_ERR_OVERFLOW when offset + bytes wraps; SC_ERR_OUT_OF_BOUNDS past the buffer's end;
 * SC_ERR_INVALID_ARGUMENT for a NULL src/dst with bytes > 0. */
SC_API sc_status sc_host_buffer_write(sc_host_buffer host, uint64_t offset, const void *src,
                                      uint64_t bytes);
SC_API sc_status sc_host_buffer_read(sc_host_buffer host, uint64_t offset, void *dst,
                                     uint64_t bytes);

/* ======================================================================================
 * Copies and fills
 *
 * Every copy checks the views against their buffers, sizes against each other (host
 * sizes are in bytes and must equal the view's bytes), element types (device-to-device
 * views must have the same dtype), contexts, and overflow. A zero-element view is a
 * no-op. The stream argument may be SC_DEFAULT_STREAM. The statuses:
 *   SC_ERR_OUT_OF_BOUNDS   a view outside its buffer; a host size that differs from the
 *                          view's bytes; two device views of different element counts; a
 *                          pinned range past the host buffer's end;
 *   SC_ERR_OVERFLOW        a view's offset + count, or a pinned offset + size, wraps
 *                          around 64 bits;
 *   SC_ERR_TYPE_MISMATCH   device views of different dtypes (sc_copy);
 *   SC_ERR_INVALID_ARGUMENT  a NULL host pointer with a non-zero size; overlapping views
 *                          of one buffer (sc_copy); a NULL fill value;
 *   SC_ERR_WRONG_CONTEXT   views, host buffers and the stream of different contexts.
 * ==================================================================================== */

/* From pageable host memory: returns once src may be reused (the call waits for the
 * copy, and so for the stream's earlier work). For asynchronous uploads use a pinned
 * sc_host_buffer and sc_copy_from_host_buffer. */
SC_API sc_status sc_copy_from_host(sc_stream stream, sc_view dst, const void *src,
                                   uint64_t bytes);
/* To pageable host memory: returns when dst holds the data. */
SC_API sc_status sc_copy_to_host(sc_stream stream, void *dst, uint64_t bytes, sc_view src);

/* Asynchronous, from/to a pinned host buffer at a byte offset; the host buffer is
 * tracked so it can't be rewritten, read or freed while the copy is in flight. */
SC_API sc_status sc_copy_from_host_buffer(sc_stream stream, sc_view dst, sc_host_buffer src,
                                          uint64_t src_offset);
SC_API sc_status sc_copy_to_host_buffer(sc_stream stream, sc_host_buffer dst,
                                        uint64_t dst_offset, sc_view src);

/* Device to device within one context; the views must not overlap. */
SC_API sc_status sc_copy(sc_stream stream, sc_view dst, sc_view src);

/* Set every element of dst to *value, which points at one element of dst's dtype
 * (e.g. a float for SC_F32, a uint16_t bit pattern for SC_BF16, a uint8_t bit pattern
 * for SC_F8E4M3 and SC_F8E5M2: 0x38 is 1.0 in e4m3, 0x3c in e5m2). */
SC_API sc_status sc_fill(sc_stream stream, sc_view dst, const void *value);

/* ======================================================================================
 * Programs: CUDA C++ compiled at run time with NVRTC
 *
 * A program is compiled for the context's device (-arch=sm_XY: cubin when NVRTC knows
 * the architecture, PTX for the newest one it knows otherwise) with -std=c++17 and
 * -default-device, plus the caller's options. Compiled images are cached on disk, keyed
 * by a hash of the source, headers, options, name expressions, NVRTC version and
 * architecture, in $SAFECUDA_CACHE_DIR, else $XDG_CACHE_HOME/safecuda, else
 * ~/.cache/safecuda. SAFECUDA_CACHE=0 (or desc.no_cache) turns the cache off. A corrupt or
 * truncated entry is detected (checksum, sizes) and recompiled, never loaded; entries are
 * written to a temporary file and renamed, so concurrent processes can't corrupt them.
 * On a compile error the status is SC_ERR_COMPILE and the message starts with the first
 * error's file(line) and quotes the NVRTC log, giving its length. A log too long for the
 * message (see sc_last_error) is cut there, and goes whole to the log callback
 * (SC_LOG_ERROR), as the message says.
 * ==================================================================================== */

typedef struct sc_program { uint64_t id; } sc_program;

typedef struct sc_program_header {
    const char *name;    /* the name #include uses */
    const char *source;
} sc_program_header;

typedef struct sc_program_desc {
    const char *source;                     /* CUDA C++ source (required) */
    const char *name;                       /* file name for logs (default "program.cu") */
    const char *const *options;             /* extra NVRTC options, NULL-terminated */
    const sc_program_header *headers;       /* in-memory headers */
    size_t n_headers;
    const char *const *name_expressions;    /* e.g. "scale<float>", NULL-terminated */
    bool fast_math;                         /* add --use_fast_math */
    bool ptx;                               /* produce PTX even where cubin is possible */
    bool no_cache;                          /* neither read nor write the disk cache */
    int arch;                               /* e.g. 90 for sm_90; 0 = the context's device.
                                               Required when ctx is the zero handle (a
                                               compile-only program, e.g. for tools) */
    bool arch_specific;                     /* sm_90a etc.: architecture-specific features
                                               (wgmma, setmaxnreg); such an image runs on
                                               that architecture only, so with a context a
                                               nonzero arch must be the device's, and an
                                               arch NVRTC does not know has no PTX fallback:
                                               both are SC_ERR_NOT_SUPPORTED; an arch
                                               older than SC_ARCH_SPECIFIC_MIN (sm_90) has
                                               no such form: SC_ERR_INVALID_ARGUMENT */
} sc_program_desc;

/* Compile desc->source (see above). ctx may be the zero handle for a compile-only program
 * (desc->arch required). Statuses: SC_ERR_NO_COMPILER when NVRTC can't be loaded (needs no
 * driver otherwise); SC_ERR_COMPILE for a source NVRTC rejects (the log in the message);
 * SC_ERR_NOT_SUPPORTED when NVRTC knows no architecture up to the one asked, or for
 * architecture-specific code it can't build (desc.arch_specific); SC_ERR_INVALID_ARGUMENT
 * for a NULL source, an arch outside 50 .. 1000, too many options, a header without name
 * or source. Use the macro: it records the call site. */
SC_API sc_status sc_program_create_at(sc_context ctx, const sc_program_desc *desc,
                                      sc_program *program, const char *file, int line);
#define sc_program_create(...) sc_program_create_at(__VA_ARGS__, __FILE__, __LINE__)
/* Free the program (its image and log). Modules loaded from it stay loaded. */
SC_API sc_status sc_program_destroy(sc_program program);

typedef struct sc_program_props {
    int arch;              /* the architecture compiled for (90 for sm_90) */
    bool is_ptx;           /* the image is PTX (else cubin) */
    bool from_cache;       /* the image came from the disk cache */
    uint64_t image_bytes;
    double compile_ms;     /* wall time of the compile (or of the cache load) */
    char cache_path[512];  /* the cache entry ("" when the cache is off) */
    bool arch_specific;    /* built for the architecture-specific target: sm_90a (or
                              compute_90a for PTX) rather than sm_90 */
} sc_program_props;

/* The disk cache of compiled programs, as sc_cache_info reports it. */
typedef struct sc_cache_props {
    bool on;           /* programs are read from and written to dir */
    char dir[768];      /* the folder, also one that can't be used; "" when none is set */
    char problem[1024]; /* why the cache is off ("" when on): "off: SAFECUDA_CACHE=0", "no
                           folder: ...", "SAFECUDA_CACHE_DIR=D can't be used: Not a
                           directory", ... */
} sc_cache_props;

/* The disk cache as this process sees it now: the folder from SAFECUDA_CACHE_DIR, else
 * $XDG_CACHE_HOME/safecuda, else ~/.cache/safecuda (made if needed, as a compile would make
 * it), and whether it is used. A folder that can't be used (a file, under a file, not
 * writable) turns the cache off: every program is compiled again on every run, and the
 * library says so once per folder through the log callback; SAFECUDA_CACHE=0 turns it off on
 * purpose, without that warning. SC_ERR_INVALID_ARGUMENT for a NULL props. Needs no driver
 * or NVRTC. */
SC_API sc_status sc_cache_info(sc_cache_props *props);

/* What was built: target, image size, cache use and compile time. */
SC_API sc_status sc_program_info(sc_program program, sc_program_props *props);
/* The NVRTC log (warnings); "" when the image came from the cache. Copies up to size
 * bytes (NUL-terminated) and sets *needed to the full length + 1. */
SC_API sc_status sc_program_log(sc_program program, char *buf, size_t size, size_t *needed);
/* The compiled image (cubin or NUL-terminated PTX), valid while the program lives. */
SC_API sc_status sc_program_image(sc_program program, const void **image, uint64_t *bytes);
/* The lowered (mangled) name of one of the program's name expressions (valid while the
 * program lives). SC_ERR_INVALID_ARGUMENT when it is not one of them. */
SC_API sc_status sc_program_lowered_name(sc_program program, const char *name_expression,
                                         const char **lowered);

/* ---- The library's own kernels, compiled ahead of time ---------------------------------
 * The library's built-in kernels (the MoE layer's and the element-wise ones: the files
 * under kernels/, embedded at build time) are compiled with NVRTC on first use, through
 * the disk cache above; the first use on a machine waits for NVRTC (tens of seconds for
 * the MoE kernels). sc_kernels_precompile compiles every built-in .cu file into the cache
 * ahead of time, on any machine with NVRTC (no driver or GPU needed), through the function
 * the library loads them with: the same source, headers, options and architecture, so each
 * entry's key is the one the library looks up on the device, and its first use there is a
 * cache hit. The key holds the NVRTC version (major.minor), the image kind and target and
 * the sources, and nothing of the machine or of the library's build (no paths): a folder
 * filled on one machine serves another with the same NVRTC version, pointed at it with
 * SAFECUDA_CACHE_DIR (the command line: safecuda precompile --arch sm_90a --cache-dir DIR).
 * A device of compute capability 9.0 builds the *_sm90a.cu files for sm_90a and the others
 * for sm_90; on other architectures the *_sm90a.cu files are never used and are skipped. */

/* One built-in file, as sc_kernels_precompile met it. */
typedef struct sc_precompile_file {
    const char *name;      /* its path under kernels/, e.g. "moe/moe.cu" (static) */
    bool skipped;          /* not used on this architecture (a *_sm90a.cu file elsewhere
                              than 9.0): nothing built; only arch below is set */
    bool from_cache;       /* already in the cache: loaded and checked, not compiled */
    bool is_ptx;           /* the image is PTX (compute_XY), else a cubin (sm_XY) */
    bool arch_specific;    /* built for sm_XYa (the *_sm90a.cu files) */
    int arch;              /* the architecture built for (90), or skipped, the one asked */
    uint64_t image_bytes;
    double ms;             /* the compile's wall time (or the cache load's) */
} sc_precompile_file;

typedef struct sc_precompile_desc {
    int arch;              /* the compute capability of the device that will use the cache,
                              as 90 for 9.0 (50 .. 1000); 0: the context's device (then ctx
                              is required). There is no "a" flag: the library itself picks
                              sm_90a for the *_sm90a.cu files on a 9.0 device */
    sc_context ctx;        /* optional: its device gives the default arch, and its driver
                              the image kind (PTX for the test device, SAFECUDA_DEVICE=test,
                              which loads PTX only; cubins otherwise). Nothing is loaded
                              into it */
    const char *cache_dir; /* the folder to fill, created if needed (at most 400
                              characters); NULL: the library's cache folder
                              ($SAFECUDA_CACHE_DIR, else $XDG_CACHE_HOME/safecuda, else
                              ~/.cache/safecuda). A folder named here is filled even where
                              SAFECUDA_CACHE=0 */
    void (*on_file)(const sc_precompile_file *file, void *user); /* optional: called after
                              each file (compiled, found or skipped), on the calling thread */
    void *user;
} sc_precompile_desc;

typedef struct sc_precompile_report {
    int arch;              /* the architecture the cache is for (90) */
    bool is_ptx;           /* the images are PTX (a context of the test device) */
    size_t files;          /* built-in .cu files met (a failed one included) */
    size_t compiled;       /* compiled by NVRTC and stored */
    size_t cache_hits;     /* already in the cache */
    size_t skipped;        /* not used on this architecture */
    uint64_t bytes;        /* the images' bytes (compiled and found) */
    double ms;             /* the whole call's wall time */
    char cache_dir[512];   /* the folder filled */
    const char *failed_file; /* the file that failed to compile or store (static), or NULL */
} sc_precompile_report;

/* Compile every built-in kernel file for desc->arch into the disk cache (see above), in
 * the order of their names; report (may be NULL) says what was done, also on failure (the
 * files done before it). A file already in the cache is not compiled again, so a second
 * call is all cache hits. Statuses: SC_ERR_INVALID_ARGUMENT for a NULL desc, an arch
 * outside 50 .. 1000, arch 0 without a context, a cache_dir that is "" or too long, or no
 * cache_dir where the cache is off (SAFECUDA_CACHE=0) or has no folder; SC_ERR_NO_COMPILER
 * when NVRTC can't be loaded (what was tried, in the message); SC_ERR_IO when the folder
 * can't be created or written, or an entry can't be stored (the folder or entry and the
 * system's reason); SC_ERR_COMPILE when NVRTC rejects a file: the message names the file
 * and the target and quotes NVRTC's log (as sc_program_create's), and
 * report->failed_file names it; SC_ERR_NOT_SUPPORTED when NVRTC knows no architecture up to
 * arch; a context's statuses (SC_ERR_STALE_HANDLE, ...). */
SC_API sc_status sc_kernels_precompile(const sc_precompile_desc *desc,
                                       sc_precompile_report *report);

/* ======================================================================================
 * Modules and kernels
 * ==================================================================================== */

typedef struct sc_module { uint64_t id; } sc_module;
typedef struct sc_kernel { uint64_t id; } sc_kernel;
typedef struct sc_dim3 { uint32_t x, y, z; } sc_dim3;

/* Load a compiled program into the context. SC_ERR_WRONG_CONTEXT for a program compiled
 * for another context; SC_ERR_NOT_SUPPORTED or SC_ERR_DRIVER (the driver's JIT log in the
 * message) when the device can't run the image. */
SC_API sc_status sc_module_load_at(sc_context ctx, sc_program program, sc_module *module,
                                   const char *file, int line);
#define sc_module_load(...) sc_module_load_at(__VA_ARGS__, __FILE__, __LINE__)
/* Load a PTX, cubin or fatbin image from memory (PTX need not be NUL-terminated) or a
 * file (a regular, non-empty one: a folder, an empty file or an unreadable path is
 * SC_ERR_IO). An image the driver rejects is SC_ERR_DRIVER, its JIT log in the message. */
SC_API sc_status sc_module_load_image_at(sc_context ctx, const void *image, uint64_t bytes,
                                         sc_module *module, const char *file, int line);
#define sc_module_load_image(...) sc_module_load_image_at(__VA_ARGS__, __FILE__, __LINE__)
/* The same, with the image read from the file at path (see above). */
SC_API sc_status sc_module_load_file_at(sc_context ctx, const char *path, sc_module *module,
                                        const char *file, int line);
#define sc_module_load_file(...) sc_module_load_file_at(__VA_ARGS__, __FILE__, __LINE__)
/* Unload the module; its kernels' handles become stale. The destroy statuses of the top of
 * this file. */
SC_API sc_status sc_module_destroy(sc_module module);

/* The names of the module's kernels (mangled for C++ kernels): up to capacity of them
 * into names (strings valid while the module lives), the number in *count.
 * SC_ERR_NOT_SUPPORTED before CUDA 12.4 drivers. */
SC_API sc_status sc_module_kernel_names(sc_module module, const char **names, size_t capacity,
                                        size_t *count);

/* A kernel of the module by name: an extern "C" name, a mangled name, or one of the
 * program's name expressions (e.g. "scale<float>"). SC_ERR_INVALID_ARGUMENT when the
 * module has no such kernel. The kernel's
 * parameters are read here (cuFuncGetParamInfo, CUDA 12.4+ drivers); with an older driver
 * they can't be, and the library logs once, for this kernel, that its launches will skip
 * the argument checks (see sc_kernel_launch). */
SC_API sc_status sc_kernel_get_at(sc_module module, const char *name, sc_kernel *kernel,
                                  const char *file, int line);
#define sc_kernel_get(...) sc_kernel_get_at(__VA_ARGS__, __FILE__, __LINE__)

typedef struct sc_kernel_props {
    char name[256];             /* as found in the module (mangled for C++ kernels) */
    int registers;              /* per thread */
    int static_shared_bytes;
    int max_dynamic_shared_bytes; /* the current limit (see sc_kernel_set_max_dynamic_shared) */
    int max_threads_per_block;
    int local_bytes;            /* per thread (spills and stack) */
    int const_bytes;
    int ptx_version, binary_version; /* e.g. 90 */
    int n_params;               /* -1 if the driver can't tell (before CUDA 12.4) */
    bool typed;                 /* parameter types known (decoded from a mangled name) */
    /* Thread-block clusters (sm_90+): the dims the kernel was compiled with
     * (__cluster_dims__(X, Y, Z)), 0 x 0 x 0 when none; and whether it runs only in
     * clusters (compiled with __cluster_dims__, with or without dims; without dims every
     * launch must give sc_launch_desc.cluster). */
    sc_dim3 cluster_dims;
    bool cluster_required;
} sc_kernel_props;

/* The kernel's resources and limits, as the driver reports them. */
SC_API sc_status sc_kernel_info(sc_kernel kernel, sc_kernel_props *props);
/* Raise (or lower) the dynamic shared memory a launch may ask for, up to the device's
 * opt-in limit minus the kernel's static shared memory (SC_ERR_INVALID_ARGUMENT past it or
 * below 0). */
SC_API sc_status sc_kernel_set_max_dynamic_shared(sc_kernel kernel, int bytes);
/* Resident blocks per SM for a block size and dynamic shared memory (0 when that block
 * can't run at all). SC_ERR_INVALID_ARGUMENT for block_threads outside 1 .. the kernel's
 * maximum threads per block. */
SC_API sc_status sc_kernel_occupancy(sc_kernel kernel, int block_threads,
                                     uint64_t shared_bytes, int *blocks_per_sm);

/* ======================================================================================
 * Checked launches
 * ==================================================================================== */

typedef struct sc_launch_desc {
    sc_dim3 grid;          /* x is required; y and z default to 1 */
    sc_dim3 block;         /* x is required; y and z default to 1 */
    uint32_t shared_bytes; /* dynamic shared memory */
    /* Programmatic dependent launch (sm_90+, CUDA 12.0+ drivers; ignored elsewhere): the
     * kernel may start while the previous kernel on the stream is still running, so that
     * its launch and prologue overlap that kernel's tail. In exchange the kernel MUST
     * execute `griddepcontrol.wait` (cudaGridDependencySynchronize) in every thread before
     * it reads or writes anything the previous kernels touch, and before it exits: that
     * is what keeps the stream's order, and safecuda can't check it. Copies, fills and
     * event waits stay fully ordered. */
    bool programmatic;
    /* Thread-block clusters (sm_90+, through cuLaunchKernelEx): the grid's blocks are
     * grouped into clusters of cluster.x x .y x .z blocks, each cluster scheduled at once on
     * one GPC, whose blocks can read and write each other's shared memory (distributed
     * shared memory) and wait for each other (barrier.cluster). 0 x 0 x 0 = no cluster (or
     * the kernel's compile-time __cluster_dims__); with x set, y and z of 0 mean 1. Each
     * grid dimension must be a multiple of the cluster's. A cluster holds at most 8 blocks
     * (the portable size), or, with non_portable_cluster, up to the kernel's non-portable
     * maximum for this block size and shared memory (16 on H100). A kernel compiled with
     * __cluster_dims__(X, Y, Z) runs with those dims: leave cluster 0 x 0 x 0 or give the
     * same dims (the grid must still be a multiple of them). */
    sc_dim3 cluster;
    /* Cooperative launch: every block of the grid is resident on the device at once, so
     * blocks may wait for each other (a grid-wide barrier) without deadlock. The grid may
     * hold at most sc_kernel_occupancy(block threads, shared_bytes) x SM count blocks, and
     * with a cluster also at most sc_kernel_occupancy_clusters x the cluster's size. Needs
     * a device with cooperative launch support (CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH) and
     * cuLaunchKernelEx (CUDA 12.0+ drivers). */
    bool cooperative;
    /* Allow a cluster past the portable 8 blocks, up to the kernel's non-portable maximum
     * (cuOccupancyMaxPotentialClusterSize for this block size and shared memory). The
     * library sets CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED on the kernel, once,
     * at its first launch (or query) that needs it. Such a size may not run on another GPU
     * model. */
    bool non_portable_cluster;
} sc_launch_desc;

/* A grid/block covering n elements with one thread each, at the block size the
 * occupancy calculator suggests for the kernel; past the device's largest grid.x the grid
 * stops there (the kernel must then stride over the rest). SC_ERR_INVALID_ARGUMENT for
 * n = 0. */
SC_API sc_status sc_launch_config_for(uint64_t n, sc_kernel kernel, sc_launch_desc *desc);

/* How many clusters of desc's shape can be resident on the device at once
 * (cuOccupancyMaxActiveClusters): desc->block, shared_bytes, cluster (0 x 0 x 0: the
 * kernel's compile-time dims) and non_portable_cluster are used, desc->grid is not (this is
 * what chooses it). The block, shared memory and cluster are checked as sc_kernel_launch
 * checks them, with its statuses and messages (SC_ERR_LAUNCH for a block, shared memory
 * size or cluster that can't be launched; SC_ERR_NOT_SUPPORTED before sm_90 or without
 * the driver's entry point), and *clusters is then 0; SC_ERR_INVALID_ARGUMENT for a
 * kernel without compile-time dims and desc->cluster 0 x 0 x 0 (there is no cluster to
 * ask about). A shape that passes the checks but does not fit on the device at all gives
 * SC_OK and 0. */
SC_API sc_status sc_kernel_occupancy_clusters(sc_kernel kernel, const sc_launch_desc *desc,
                                              int *clusters);

typedef enum sc_arg_kind {
    SC_ARG_IN = 1,    /* a view the kernel reads (may be a const T* parameter) */
    SC_ARG_OUT,       /* a view the kernel writes */
    SC_ARG_INOUT,     /* a view the kernel reads and writes */
    SC_ARG_SCALAR,    /* a value of the given dtype */
    SC_ARG_BYTES,     /* raw bytes (a struct passed by value) */
    SC_ARG_TENSOR_MAP_IN,  /* a tensor map (sc_tensor_map) whose view the kernel reads */
    SC_ARG_TENSOR_MAP_OUT  /* a tensor map whose view the kernel writes (TMA stores) */
} sc_arg_kind;

typedef struct sc_arg {
    sc_arg_kind kind;
    sc_dtype dtype;          /* scalars */
    sc_view view;            /* views */
    union {
        int32_t i32; uint32_t u32; int64_t i64; uint64_t u64; float f32; double f64;
    } value;
    const void *bytes;       /* SC_ARG_BYTES */
    size_t size;             /* SC_ARG_BYTES */
} sc_arg;

static inline sc_arg sc_arg_in(sc_view v) { sc_arg a = {SC_ARG_IN, SC_DTYPE_INVALID, v, {0}, 0, 0}; return a; }
static inline sc_arg sc_arg_out(sc_view v) { sc_arg a = {SC_ARG_OUT, SC_DTYPE_INVALID, v, {0}, 0, 0}; return a; }
static inline sc_arg sc_arg_inout(sc_view v) { sc_arg a = {SC_ARG_INOUT, SC_DTYPE_INVALID, v, {0}, 0, 0}; return a; }
static inline sc_arg sc_arg_i32(int32_t x) { sc_arg a = {SC_ARG_SCALAR, SC_I32, {{0}, 0, 0}, {0}, 0, 0}; a.value.i32 = x; return a; }
static inline sc_arg sc_arg_u32(uint32_t x) { sc_arg a = {SC_ARG_SCALAR, SC_U32, {{0}, 0, 0}, {0}, 0, 0}; a.value.u32 = x; return a; }
static inline sc_arg sc_arg_i64(int64_t x) { sc_arg a = {SC_ARG_SCALAR, SC_I64, {{0}, 0, 0}, {0}, 0, 0}; a.value.i64 = x; return a; }
static inline sc_arg sc_arg_u64(uint64_t x) { sc_arg a = {SC_ARG_SCALAR, SC_U64, {{0}, 0, 0}, {0}, 0, 0}; a.value.u64 = x; return a; }
static inline sc_arg sc_arg_f32(float x) { sc_arg a = {SC_ARG_SCALAR, SC_F32, {{0}, 0, 0}, {0}, 0, 0}; a.value.f32 = x; return a; }
static inline sc_arg sc_arg_f64(double x) { sc_arg a = {SC_ARG_SCALAR, SC_F64, {{0}, 0, 0}, {0}, 0, 0}; a.value.f64 = x; return a; }
static inline sc_arg sc_arg_bytes(const void *p, size_t size) { sc_arg a = {SC_ARG_BYTES, SC_DTYPE_INVALID, {{0}, 0, 0}, {0}, p, size}; return a; }

/* ======================================================================================
 * Tensor maps (sm_90 and newer: the bulk tensor copy engine, TMA)
 *
 * A tensor map describes a view as an array of 1 to 5 dimensions and the box (tile) that
 * one cp.async.bulk.tensor copy moves between the array and shared memory. A kernel takes
 * the map as a `const __grid_constant__ CUtensorMap` parameter (128 bytes, 64-byte
 * aligned; NVRTC has no cuda.h: declare `struct alignas(64) map_t { unsigned long long
 * v[16]; }`); pass it with sc_arg_tensor_map_in / _out. The map keeps its view: the launch
 * checks that the view's buffer is alive and still at the address the map was encoded for
 * (a stale map is SC_ERR_STALE_HANDLE, like a stale view), and the declared access orders
 * the launch after conflicting work on other streams, like a view argument (the whole
 * view, whatever part of it the array covers).
 *
 * The array is given in one of two forms:
 *   - the 2-D form (rank 0): rows, cols, row_stride, box_rows, box_cols: a row-major
 *     rows x cols matrix that is exactly the view ((rows - 1) x row_stride + cols elements);
 *   - the general form (rank 1 .. 5): dims, strides and box, INNERMOST FIRST, the order
 *     cuTensorMapEncodeTiled takes them: dims[0] is the contiguous dimension, so a C array
 *     a[D][H][W] is dims = {W, H, D}. Strides are in ELEMENTS (not bytes as the driver
 *     takes them): strides[i] elements from one index of dimension i to the next; strides[0]
 *     is 0 or 1 (the innermost dimension is contiguous); strides[i] = 0 for i >= 1 means
 *     packed (dims[i - 1] x strides[i - 1]). The view must hold the array: its last element,
 *     at element sum over i of (dims[i] - 1) x strides[i], must lie inside the view (which
 *     may be longer: the rest is not described).
 * The 2-D form is the general form with rank 2, dims {cols, rows}, strides {1, row_stride}
 * and box {box_cols, box_rows}; the two forms can't be mixed (a desc with rank set and a
 * 2-D field set, or a general field set with rank 0, is refused). Both take swizzle,
 * element_strides, oob_fill and l2_promotion; every field past rank must be 0.
 *
 * Checked before the driver sees anything (SC_ERR_INVALID_ARGUMENT, the message naming
 * sc_tensor_map_encode, the field and its dimension index, and the limit):
 *   rank 0 .. 5; dims[i] 1 .. 2^32; each stride (given or packed) at least the previous
 *   dimension's extent, dims[i - 1] x strides[i - 1] elements (dimensions never overlap;
 *   transposed or broadcast layouts are refused), a multiple of 16 bytes and below 2^40
 *   bytes; box[i] 1 .. 256 (no default); box[0] x element size a multiple of 16 bytes and,
 *   swizzled, at most the swizzle span (32, 64, 128 bytes); element_strides[i] 0 (= 1) ..
 *   8, and element_strides[0] only 0 or 1 (the copy engine has no innermost element stride:
 *   the driver would ignore it); oob_fill SC_OOB_FILL_NAN only for f16, bf16, f32, f64; the
 *   view large enough (the last element's index computed with overflow checks) and 16-byte
 *   aligned; enums in range. SC_ERR_NOT_SUPPORTED before sm_90 or without the driver's
 *   cuTensorMapEncodeTiled (CUDA 12.0+). The 2-D form keeps its own checks (rows x cols
 *   must be exactly the view, rows and cols below 2^32, a row a multiple of 16 bytes).
 *
 * Element types: every sc_dtype. The copy engine moves bits; u8/i8, SC_F8E4M3 and SC_F8E5M2
 * are copied as CU_TENSOR_MAP_DATA_TYPE_UINT8, i16/u16 as UINT16, the rest as their own.
 *
 * What a kernel's copy does, and what the library can't check for it:
 *   - coordinates are signed 32-bit element indices, innermost first. Along dimension i a
 *     box at coordinate c covers c, c + e, c + 2e, ... (e = element_strides[i]):
 *     ceil(box[i] / e) elements. In shared memory the box is dense, innermost first:
 *     box[0] x ceil(box[1] / e1) x ... elements, which is the transaction byte count an
 *     mbarrier (complete_tx) must expect;
 *   - elements at coordinates outside [0, dims[i]) in any dimension (negative ones too)
 *     are not read: a load fills them with zeros, or with a NaN under SC_OOB_FILL_NAN, and
 *     a store skips them;
 *   - THE INNERMOST COORDINATE MUST BE 16-BYTE ALIGNED IN BYTES: c[0] x element size a
 *     multiple of 16 (negative or not), or the copy engine faults with
 *     CUDA_ERROR_ILLEGAL_INSTRUCTION (the context is lost). Encoding can't check this: the
 *     coordinates are the kernel's;
 *   - the shared-memory side must be 128-byte aligned, and swizzled boxes aligned to the
 *     pattern's repeat (256, 512, 1024 bytes for 32B, 64B, 128B); the swizzle XORs the
 *     16-byte chunk index (address bits 4..) with address bits 7.. (1, 2 or 3 bits for 32B,
 *     64B, 128B), as CUTLASS's Swizzle<1|2|3, 4, 3>;
 *   - the device address inside the map is otherwise unchecked: a copy is bounded by the
 *     array's shape, so the shape is what keeps it inside the view.
 *
 * Example: boxes of 64 x 8 x 2 from bf16 x[4][16][64] whose rows are padded to 80 elements
 * (so the view holds 3 x 1280 + 15 x 80 + 64 elements or more):
 *     sc_tensor_map m;
 *     sc_tensor_map_encode(view, &(sc_tensor_map_desc){.rank = 3, .dims = {64, 16, 4},
 *                          .strides = {1, 80, 0}, .box = {64, 8, 2},
 *                          .swizzle = SC_SWIZZLE_128B}, &m);
 * then, in the kernel, `cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::
 * complete_tx::bytes [smem], [map, {x, y, z}], [bar]` with x a multiple of 8 (16 bytes of
 * bf16), smem 1024-byte aligned, and the barrier expecting 64 x 8 x 2 x 2 = 2048 bytes.
 * ==================================================================================== */

#define SC_TENSOR_MAP_MAX_RANK 5

typedef enum sc_tensor_swizzle {
    SC_SWIZZLE_NONE = 0, SC_SWIZZLE_32B, SC_SWIZZLE_64B, SC_SWIZZLE_128B
} sc_tensor_swizzle;

/* What a load reads for elements outside the array. */
typedef enum sc_tensor_oob_fill {
    SC_OOB_FILL_ZERO = 0, /* zeros (bits 0) */
    SC_OOB_FILL_NAN       /* a NaN (CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA):
                             f16, bf16, f32, f64 only */
} sc_tensor_oob_fill;

/* The granularity at which L2 fills requests of the map's copies from memory. */
typedef enum sc_tensor_l2_promotion {
    SC_L2_PROMOTION_DEFAULT = 0, /* 256 bytes */
    SC_L2_PROMOTION_NONE, SC_L2_PROMOTION_64B, SC_L2_PROMOTION_128B, SC_L2_PROMOTION_256B
} sc_tensor_l2_promotion;

typedef struct sc_tensor_map_desc {
    /* The 2-D form (rank 0). */
    uint64_t rows, cols;         /* rows x cols = the view's elements; a row is a multiple of
                                    16 bytes and starts 16-byte aligned */
    uint32_t box_rows, box_cols; /* 1 .. 256 each; box_cols x element size a multiple of 16
                                    bytes and at most the swizzle span (32, 64, 128 bytes) */
    sc_tensor_swizzle swizzle;   /* both forms: how the box is laid out in shared memory */
    uint64_t row_stride;         /* elements from one row's start to the next (0: cols), at
                                    least cols, a multiple of 16 bytes; with it, the view
                                    holds (rows - 1) x row_stride + cols elements (a matrix
                                    whose rows are every other row of a larger one, say) */
    /* The general form (rank 1 .. 5), innermost dimension first; see above. */
    uint32_t rank;
    uint64_t dims[SC_TENSOR_MAP_MAX_RANK];    /* elements along each dimension, 1 .. 2^32 */
    uint64_t strides[SC_TENSOR_MAP_MAX_RANK]; /* ELEMENTS between consecutive indices;
                                                 [0]: 0 or 1; [i >= 1]: 0 = packed */
    uint32_t box[SC_TENSOR_MAP_MAX_RANK];     /* the box's extent in elements, 1 .. 256 */
    /* Both forms. */
    uint32_t element_strides[SC_TENSOR_MAP_MAX_RANK]; /* the box's step per dimension (0:
                                                 1), 1 .. 8; [0] only 0 or 1. In the 2-D
                                                 form [0] is cols', [1] rows' */
    sc_tensor_oob_fill oob_fill;               /* 0: zeros */
    sc_tensor_l2_promotion l2_promotion;       /* 0: 256 bytes */
} sc_tensor_map_desc;

#if defined(__cplusplus)
#define SC_ALIGN64 alignas(64)
#else
#define SC_ALIGN64 _Alignas(64)
#endif
typedef struct sc_tensor_map {
    SC_ALIGN64 unsigned char encoded[128]; /* the CUtensorMap the kernel receives */
    sc_view view;                          /* what it describes */
    uint64_t address;                      /* the device address it was encoded for */
    sc_tensor_map_desc desc;               /* as given */
} sc_tensor_map;

/* Describe view as desc says (see above for the two forms and every check). *map is
 * zeroed first and written only on success. SC_ERR_NOT_SUPPORTED before sm_90 or without
 * driver support (CUDA 12.0+); SC_ERR_INVALID_ARGUMENT for a NULL desc or map and every
 * shape, box, stride, alignment or enum check above (the message names the field, the
 * dimension index and the limit); SC_ERR_OVERFLOW when the array's extent overflows 64
 * bits; the view's statuses (SC_ERR_STALE_HANDLE, SC_ERR_OUT_OF_BOUNDS, ...); a driver
 * refusal as SC_ERR_DRIVER with its name. */
SC_API sc_status sc_tensor_map_encode(sc_view view, const sc_tensor_map_desc *desc,
                                      sc_tensor_map *map);

static inline sc_arg sc_arg_tensor_map_in(const sc_tensor_map *m) { sc_arg a = {SC_ARG_TENSOR_MAP_IN, SC_DTYPE_INVALID, m->view, {0}, m, sizeof m->encoded}; return a; }
static inline sc_arg sc_arg_tensor_map_out(const sc_tensor_map *m) { sc_arg a = {SC_ARG_TENSOR_MAP_OUT, SC_DTYPE_INVALID, m->view, {0}, m, sizeof m->encoded}; return a; }

/* Launch kernel on stream after checking: the argument count and each argument's size
 * against the kernel's parameters (cuFuncGetParamInfo); for kernels with C++ (mangled)
 * names, each parameter's type (a view's dtype against the pointer's element type, a
 * const T* parameter passed as out/inout, a scalar's dtype; the element types known are
 * the builtin integer and float types, __half, __nv_bfloat16, and cuda_fp8.h's
 * __nv_fp8_e4m3 and __nv_fp8_e5m2 for SC_F8E4M3 / SC_F8E5M2: an fp8 buffer is refused
 * where the kernel takes the other fp8 type or unsigned char, and a u8 buffer where it
 * takes an fp8 type; pointers to other structs are not checked); the grid, block and shared
 * memory against the device's and the kernel's limits; the cluster and cooperative
 * fields (see sc_launch_desc). A mismatch names the argument index or the dimension, what
 * the kernel wants and what was given; nothing is launched:
 *   SC_ERR_LAUNCH          the shape of the call is wrong: the argument count, an
 *                          argument's size in bytes, more than 64 arguments, a grid or
 *                          block dimension of 0 or past the device's limit, too many
 *                          threads a block for the kernel, too much dynamic shared memory;
 *                          a cluster with x = 0 and y or z set, a grid dimension that is
 *                          not a multiple of the cluster's (given or compiled), a cluster
 *                          past 8 blocks without non_portable_cluster or past the kernel's
 *                          non-portable maximum with it, a cluster other than the dims the
 *                          kernel was compiled with, no cluster for a kernel compiled with
 *                          __cluster_dims__() (no dims), a cooperative grid larger than
 *                          what can be resident at once (blocks per SM x SMs; in clusters,
 *                          also resident clusters x the cluster's size);
 *   SC_ERR_NOT_SUPPORTED   a cluster before sm_90, a cluster or cooperative launch without
 *                          the driver's cuLaunchKernelEx, a cooperative launch on a device
 *                          without CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, a non-portable
 *                          cluster without cuOccupancyMaxPotentialClusterSize;
 *   SC_ERR_TYPE_MISMATCH   the sizes fit but the types don't (C++ kernels only): a view of
 *                          another dtype than the pointer's element type, a view where the
 *                          kernel takes a scalar or a scalar where it takes a pointer, a
 *                          scalar of another dtype, a const T* parameter passed as
 *                          sc_arg_out/sc_arg_inout;
 *   SC_ERR_INVALID_ARGUMENT  an invalid argument kind or scalar dtype, sc_arg_bytes with NULL
 *                          or size 0, a tensor map moved from the address it was encoded for;
 *   the view statuses (SC_ERR_STALE_HANDLE, SC_ERR_OUT_OF_BOUNDS, SC_ERR_OVERFLOW) for a
 *   view argument, SC_ERR_WRONG_CONTEXT for a view or stream of another context than the
 *   kernel's.
 * With a driver older than CUDA 12.4 (sc_kernel_props.n_params == -1) the driver can't
 * report a kernel's parameters: the count, size and type checks are skipped (the launch
 * configuration and the views are still checked), and sc_kernel_get logs that once per
 * kernel. The views' accesses order the launch after conflicting work on other streams
 * (see streams). The cluster, cooperative and non-portable checks ask the driver (the
 * cooperative launch attribute, occupancy, the largest cluster) only when those fields are
 * set; its errors are then SC_ERR_DRIVER (or SC_ERR_CONTEXT_LOST) naming the call. A
 * programmatic, cluster or cooperative launch goes through cuLaunchKernelEx with one
 * attribute list (a kernel's compiled cluster dims are never passed again), the others
 * through cuLaunchKernel; under stream capture the attributes go into the kernel node
 * (CUDA documents them as valid for graph nodes), so such launches capture. On the test
 * device (SAFECUDA_DEVICE=test) a launch that passes the checks fails with
 * SC_ERR_NOT_SUPPORTED: kernels do not run there. */
SC_API sc_status sc_kernel_launch(sc_stream stream, sc_kernel kernel, const sc_launch_desc *desc,
                                  const sc_arg *args, size_t nargs);

/* SC_LAUNCH(stream, kernel, &desc, sc_arg_in(a), sc_arg_out(b), sc_arg_i32(n)): launch with
 * the argument list written inline (at least one argument; a kernel without parameters is
 * launched with sc_kernel_launch(stream, kernel, &desc, NULL, 0)). Each argument is
 * evaluated once. In C it builds a compound-literal array; in C++ (which has no compound
 * literals) a function template does the same. */
#ifndef __cplusplus
#define SC_LAUNCH(stream, kernel, desc, ...)                                        \
    sc_kernel_launch((stream), (kernel), (desc), (const sc_arg[]){__VA_ARGS__},     \
                     sizeof((const sc_arg[]){__VA_ARGS__}) / sizeof(sc_arg))
#endif

/* ======================================================================================
 * CUDA graphs: capture, checked replay, update
 *
 * A stream's work can be captured into a graph instead of running: between
 * sc_stream_begin_capture and sc_stream_end_capture every copy, fill, checked launch,
 * event record and wait, and sc_moe_forward enqueued on the stream is recorded. The graph
 * is instantiated into an executable graph and launched (replayed) with one call on any
 * stream of the context; replays run the recorded work again with the same arguments, so
 * new inputs are copied into the captured buffers between replays.
 *
 * The rules, in the order a capture meets them:
 *   - A capture begins on one stream (its origin) in one of CUDA's three modes. Work is
 *     forked onto other streams of the context as in CUDA: record an event on a capturing
 *     stream, make another stream wait on it (that stream joins the capture); before the
 *     capture ends, the origin must wait on an event recorded after the forked work (the
 *     join), else the capture ends invalidated (SC_ERR_CAPTURE_INVALIDATED, no graph). A
 *     global or thread-local capture ends on the thread that began it.
 *   - Captured work does not run, so it does not count as a use of its buffers: it is
 *     ordered only against the capture's own work (automatic ordering between the
 *     capture's streams becomes graph dependencies) and never waits for work outside the
 *     capture. Buffers used before the capture began are ordered against the replay
 *     instead, when it is launched.
 *   - Calls that can't be part of a graph fail with SC_ERR_CAPTURE and do nothing, leaving
 *     the capture usable (the message names the capturing stream): on a capturing stream,
 *     a pageable host copy (it waits for the stream), a stream synchronize or query, a
 *     buffer create, an MoE forward that would grow its workspace (reserve it before with
 *     sc_moe_reserve) or asks for a profile, a launch of an executable graph; a wait on an
 *     event recorded outside the capture; a host wait, query or timing on an event last
 *     recorded inside a capture; and, while a GLOBAL capture is open anywhere in the process
 *     (or a THREAD_LOCAL one on the calling thread), the calls CUDA forbids during capture
 *     because they would synchronize or allocate outside a stream: pageable copies on any
 *     stream, sc_context_synchronize, sc_context_trim, creating pinned host buffers,
 *     creating programs' modules (sc_module_load*), sc_moe_create. RELAXED captures forbid
 *     only the stream-bound calls.
 *   - Destroys always destroy: a buffer destroyed during a capture is freed after its uses
 *     outside it (a graph that captured it is then refused at launch); a pinned host buffer
 *     or module destroyed while a capture forbids the release has its release deferred
 *     until that capture ends; destroying a stream that takes part in a capture abandons the
 *     capture (no graph).
 *   - An executable graph remembers every buffer, pinned host buffer and kernel its work
 *     uses (tensor maps as their buffers), with the union of each one's accesses. A launch
 *     first checks that all are alive (a destroyed one is SC_ERR_STALE_HANDLE naming it and
 *     the graph's creation site; nothing runs), then orders itself as one operation with
 *     those accesses after conflicting work on other streams, and later conflicting work
 *     waits for it; an object destroyed while a replay is in flight is freed after it.
 * ==================================================================================== */

typedef struct sc_graph { uint64_t id; } sc_graph;
typedef struct sc_graph_exec { uint64_t id; } sc_graph_exec;

typedef enum sc_capture_mode {
    SC_CAPTURE_GLOBAL = 0,   /* CUDA's default: unsafe calls refused process-wide */
    SC_CAPTURE_THREAD_LOCAL, /* unsafe calls refused on the capturing thread only */
    SC_CAPTURE_RELAXED       /* no calls refused beyond the capturing streams' own */
} sc_capture_mode;

typedef struct sc_capture_desc {
    sc_capture_mode mode;
} sc_capture_desc;

/* Begin capturing stream's work (desc may be NULL: global mode). SC_ERR_CAPTURE when the
 * stream already takes part in a capture; SC_ERR_INVALID_ARGUMENT for the default stream
 * given as a handle of another context or an invalid mode. */
SC_API sc_status sc_stream_begin_capture(sc_stream stream, const sc_capture_desc *desc);

/* End the capture begun on stream and give its graph. Every stream of the capture leaves
 * it, whatever the answer. SC_ERR_INVALID_ARGUMENT when stream is not capturing or is not
 * the capture's origin; SC_ERR_CAPTURE when a global or thread-local capture is ended on
 * another thread than the one that began it (the capture goes on); SC_ERR_CAPTURE_INVALIDATED
 * when the driver invalidated the capture or forked work was never joined (the message
 * says why; *graph is the zero handle). Use the macro: it records the call site. */
SC_API sc_status sc_stream_end_capture_at(sc_stream stream, sc_graph *graph, const char *file,
                                          int line);
#define sc_stream_end_capture(...) sc_stream_end_capture_at(__VA_ARGS__, __FILE__, __LINE__)

/* Whether stream takes part in a capture now. */
SC_API sc_status sc_stream_is_capturing(sc_stream stream, bool *capturing);

typedef struct sc_graph_props {
    uint64_t nodes;        /* the graph's nodes */
    uint64_t buffers;      /* buffers its work uses */
    uint64_t host_buffers; /* pinned host buffers its work uses */
    uint64_t kernels;      /* kernels it launches */
} sc_graph_props;

/* What the graph holds: its nodes, and the buffers, pinned host buffers and kernels its
 * work uses (each counted once). SC_ERR_STALE_HANDLE for a destroyed graph;
 * SC_ERR_INVALID_ARGUMENT for a NULL props. */
SC_API sc_status sc_graph_info(sc_graph graph, sc_graph_props *props);

/* Destroy the graph. Executable graphs instantiated from it keep their own copy and stay
 * usable. The destroy statuses of the top of this file. */
SC_API sc_status sc_graph_destroy(sc_graph graph);

/* Instantiate the graph into an executable graph (which keeps its own copy: the graph may
 * be destroyed afterwards). SC_ERR_STALE_HANDLE when an object the graph uses was
 * destroyed. Use the macro: it records the call site. */
SC_API sc_status sc_graph_instantiate_at(sc_graph graph, sc_graph_exec *exec, const char *file,
                                         int line);
#define sc_graph_instantiate(...) sc_graph_instantiate_at(__VA_ARGS__, __FILE__, __LINE__)

/* Destroy the executable graph. A replay in flight is not cut short: the driver frees it
 * when the replay completes. The destroy statuses of the top of this file. */
SC_API sc_status sc_graph_exec_destroy(sc_graph_exec exec);

/* What the executable graph holds, as sc_graph_info says it of a graph (after
 * sc_graph_exec_update: of the graph it was updated from). SC_ERR_STALE_HANDLE for a
 * destroyed one; SC_ERR_INVALID_ARGUMENT for a NULL props. */
SC_API sc_status sc_graph_exec_info(sc_graph_exec exec, sc_graph_props *props);

/* Launch (replay) the executable graph on stream (SC_DEFAULT_STREAM: the exec's context's
 * default stream), checked and ordered as described above. SC_ERR_STALE_HANDLE when an
 * object it uses was destroyed (nothing runs); SC_ERR_CAPTURE on a capturing stream. */
SC_API sc_status sc_graph_launch(sc_stream stream, sc_graph_exec exec);

typedef enum sc_graph_update_result {
    SC_GRAPH_UPDATED = 0,   /* the executable graph was updated in place */
    SC_GRAPH_REINSTANTIATED /* the change could not be made in place (another topology,
                               node types or functions): the exec was instantiated anew from
                               graph, same handle; the message says why */
} sc_graph_update_result;

/* Make exec run graph's work from its next launch on: in place (cuGraphExecUpdate) when
 * the graphs have the same shape, else by instantiating graph anew. The remembered objects
 * become graph's. Launches already in flight are not affected. *result (may be NULL) says
 * which happened. SC_ERR_WRONG_CONTEXT for a graph of another context. */
SC_API sc_status sc_graph_exec_update(sc_graph_exec exec, sc_graph graph,
                                      sc_graph_update_result *result);

#ifdef __cplusplus
} /* extern "C" */

extern "C++" {
/* The C++ form of SC_LAUNCH: every argument must be an sc_arg (the array's initialization
 * checks it at compile time). */
template <typename... Args>
inline sc_status sc_launch_args_(sc_stream stream, sc_kernel kernel, const sc_launch_desc *desc,
                                 const Args &...args)
{
    static_assert(sizeof...(Args) > 0, "SC_LAUNCH needs at least one argument");
    const sc_arg list[] = {args...};
    return sc_kernel_launch(stream, kernel, desc, list, sizeof...(Args));
}
}
#define SC_LAUNCH(stream, kernel, desc, ...) sc_launch_args_((stream), (kernel), (desc), __VA_ARGS__)
#endif
#endif
