/* safecuda: safe and fast NVIDIA GPU programming from C.
 *
 * Every object is an opaque handle (a 64-bit id holding a slot index and a generation
 * counter): using a handle after its object was destroyed is SC_ERR_STALE_HANDLE, never
 * undefined behaviour. Every fallible function returns an sc_status; sc_last_error()
 * gives the calling thread's message for its most recent failure, naming the function,
 * the values involved and, for handles, the object's kind and creation site.
 *
 * Options come in *_desc structs whose zero value means "the sensible default":
 *
 *     sc_context ctx;
 *     if (sc_context_create(&(sc_context_desc){ .device = 0 }, &ctx) != SC_OK)
 *         fprintf(stderr, "%s\n", sc_last_error());
 *
 * The CUDA driver and NVRTC are loaded at run time; nothing here needs the CUDA toolkit.
 * Thread safety: every function may be called from any thread. Objects may be used from
 * several threads at once; destroying an object while another thread still uses it
 * waits for that use to finish (the other thread's later uses are stale-handle errors). */
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
    SC_ERR_NOT_SUPPORTED,      /* the driver or device lacks a needed feature */
    SC_ERR_IO,                 /* a file could not be read or written */
    SC_ERR_LIMIT,              /* an internal limit was reached (e.g. too many objects) */
    SC_ERR_INTERNAL,           /* a bug in safecuda: please report it */
    SC_STATUS_COUNT
} sc_status;

/* The enum value's name, e.g. "SC_ERR_STALE_HANDLE"; "SC_STATUS_UNKNOWN" if out of range. */
SC_API const char *sc_status_name(sc_status status);

/* The calling thread's message for its most recent failed call ("" if none yet). The
 * pointer stays valid until the thread's next safecuda call. Successful calls keep it. */
SC_API const char *sc_last_error(void);

/* Forget the calling thread's last error message. */
SC_API void sc_clear_error(void);

/* ======================================================================================
 * Logging (leak reports and warnings). The default writes to stderr.
 * ==================================================================================== */

typedef enum sc_log_level { SC_LOG_DEBUG, SC_LOG_INFO, SC_LOG_WARN, SC_LOG_ERROR } sc_log_level;
typedef void (*sc_log_fn)(sc_log_level level, const char *message, void *user);

/* Route library messages to fn (NULL restores the stderr default). Thread-safe. */
SC_API void sc_set_log_callback(sc_log_fn fn, void *user);

/* ======================================================================================
 * Library, driver and compiler
 * ==================================================================================== */

/* "0.1.0" */
SC_API const char *sc_version_string(void);

/* Load the CUDA driver now (it is otherwise loaded on first use). SC_ERR_NO_DRIVER says
 * what was tried and what to install. Safe to call many times and from many threads. */
SC_API sc_status sc_init(void);

/* The CUDA version the driver supports, as 1000 * major + 10 * minor (e.g. 13000). */
SC_API sc_status sc_driver_version(int *version);

/* The path of the loaded libcuda (into buf, truncated to size). */
SC_API sc_status sc_driver_path(char *buf, size_t size);

/* Load NVRTC and report its version. SC_ERR_NO_COMPILER says what was tried. */
SC_API sc_status sc_compiler_version(int *major, int *minor);

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

/* Number of CUDA devices (0 with SC_OK when the driver is present but sees no GPU). */
SC_API sc_status sc_device_count(int *count);

/* Properties of device `device` (0 .. count-1). */
SC_API sc_status sc_device_info(int device, sc_device_props *props);

/* Free and total device memory now, in bytes. Activates the device's primary context
 * for the duration of the call if no safecuda context holds it. */
SC_API sc_status sc_device_memory(int device, uint64_t *free_bytes, uint64_t *total_bytes);

/* ======================================================================================
 * Contexts
 * ==================================================================================== */

typedef struct sc_context { uint64_t id; } sc_context;

typedef struct sc_context_desc {
    int device;            /* device ordinal */
    uint64_t vram_budget;  /* bytes this context may hold in buffers; 0 = no budget */
    bool disable_event_tracking; /* order buffers across streams by hand (see streams) */
} sc_context_desc;

/* Create a context over the device's primary context (retained; released on destroy).
 * A context may be used from any thread: the library makes it current where needed.
 * desc may be NULL (device 0, defaults). Use the macro: it records the call site. */
SC_API sc_status sc_context_create_at(const sc_context_desc *desc, sc_context *ctx,
                                      const char *file, int line);
#define sc_context_create(desc, ctx) sc_context_create_at((desc), (ctx), __FILE__, __LINE__)

/* Destroy a context. Every object still alive in it is reported through the log callback
 * (kind, label, size, creation site), freed, and the call returns SC_ERR_LEAKED; the
 * context is destroyed either way. Waits for the context's work to finish. A context
 * lost to a sticky device error can still be destroyed. */
SC_API sc_status sc_context_destroy(sc_context ctx);

/* The device ordinal of the context. */
SC_API sc_status sc_context_device(sc_context ctx, int *device);

/* Wait for all work queued in the context. */
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
 * capacity is 0. */
SC_API sc_status sc_context_live_objects(sc_context ctx, sc_object_info *out, size_t capacity,
                                         size_t *count);

/* Write the list of live objects through the log callback; *count (may be NULL) gets the
 * number. */
SC_API sc_status sc_context_live_report(sc_context ctx, size_t *count);

#ifdef __cplusplus
}
#endif
#endif
