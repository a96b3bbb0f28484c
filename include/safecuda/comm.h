/* safecuda communicators: collectives between GPUs over NCCL.
 *
 * A communicator (sc_comm) is one rank of a group of nranks GPUs that exchange data:
 * all-reduce, reduce-scatter, all-gather, all-to-all (equal and per-peer counts) and
 * point-to-point send/receive, on safecuda streams and views. It is an object like the
 * others: a handle with a generation (a destroyed one is SC_ERR_STALE_HANDLE), its creation
 * site recorded by the create macros, owned by one context (one GPU), reported and freed
 * by sc_context_destroy when still alive.
 *
 * NCCL (libnccl.so.2, 2.19.4 or newer) is loaded at run time like the driver; building
 * needs no NCCL. It is looked for, first match wins:
 *   - SAFECUDA_LIBNCCL, when set: that file only;
 *   - a libnccl.so.2 the process has already loaded (torch's, for instance);
 *   - the nvidia-nccl-cu13 / nvidia-nccl-cu12 wheels (nvidia/nccl/lib/libnccl.so.2) in the
 *     site-packages of the Python packages the process has loaded, and under $VIRTUAL_ENV,
 *     $CONDA_PREFIX, $PYTHONHOME and the running program's prefix (as started and as
 *     resolved: a virtual environment's bin/python3, activated or not);
 *   - the dynamic linker's search (LD_LIBRARY_PATH, the system's libnccl2 package);
 *   - $CUDA_HOME, $CUDA_PATH, /usr/local/cuda (lib64, lib).
 * A library that is too old, not NCCL, or lacks an entry point is passed over (the message
 * of SC_ERR_NO_NCCL lists what was tried and why). `safecuda info` shows which one loads.
 *
 * Two ways to make communicators (one rank per GPU, each GPU in one rank):
 *   - one process (or thread) per GPU, any launcher: rank 0 makes an id with
 *     sc_comm_unique_id, the caller sends its bytes to the other ranks (MPI, a socket, a
 *     file, a fork), and every rank calls sc_comm_create with the id, nranks and its rank;
 *     each call returns once all nranks have joined (or fails after the timeout);
 *   - every GPU from one process: sc_comm_create_all takes one context per GPU (safecuda's
 *     model: a context is one device) and gives one communicator per context, rank i on
 *     contexts[i]. One thread may then drive all of them, with their collectives between
 *     sc_comm_group_begin and sc_comm_group_end (NCCL needs the ranks' calls of one
 *     collective issued together when one thread issues them), or one thread per GPU may
 *     each drive its own without groups.
 *
 * Collectives. Each call names its communicator, a stream of the communicator's context
 * (SC_DEFAULT_STREAM: the context's default stream) and views of buffers of that context.
 * Every rank of the communicator must make the same collectives in the same order with the
 * same counts, element types and operations (NCCL's rule; it can't be checked locally: a
 * mismatch is undefined in NCCL and ends, at worst, in the timeout below). What is checked
 * before anything is enqueued:
 *   SC_ERR_INVALID_ARGUMENT  an operation outside sc_reduce_op; SC_REDUCE_AVG of integers
 *                            (NCCL divides with truncation) or fp8 (NCCL multiplies by
 *                            1/nranks rounded to fp8); a peer outside [0, nranks); NULL
 *                            count arrays; views that overlap where the operation's rules
 *                            forbid it (each call says); an output view of a read-only
 *                            buffer;
 *   SC_ERR_OUT_OF_BOUNDS     element counts that do not fit the operation (the message
 *                            gives both); a per-peer segment outside its view;
 *   SC_ERR_OVERFLOW          count arithmetic past 64 bits;
 *   SC_ERR_TYPE_MISMATCH     input and output views of different element types;
 *   SC_ERR_WRONG_CONTEXT     a view or stream of another context than the communicator's;
 *   SC_ERR_NOT_SUPPORTED     a reduction of an element type NCCL can't reduce: u16 and i16
 *                            (no such NCCL type), fp8 with an NCCL older than 2.24.3 or on a
 *                            device older than sm_90 (NCCL reduces fp8 from sm_90 on);
 *                            moving data (all-gather, all-to-all, send/recv) works for every
 *                            element type, as bytes;
 *   SC_ERR_COMM              the communicator was aborted (the message says why; so is
 *                            SC_ERR_TIMEOUT when a timeout aborted it) or NCCL refused the
 *                            call (its error name, text and last message are quoted; the
 *                            communicator is then aborted, as NCCL's state is unknown);
 *   SC_ERR_STALE_HANDLE, SC_ERR_WRONG_KIND, SC_ERR_CONTEXT_LOST as everywhere.
 * A collective is enqueued on the stream and the call returns: it does not wait for the
 * device (sc_comm_synchronize does). The views are ordered by the stream layer like any
 * other use of a buffer: a collective waits for conflicting work on the buffers on other
 * streams (inputs read, outputs written), and later conflicting work waits for it. A view of
 * zero elements makes a collective that does nothing (every rank must give zero then).
 *
 * Stream capture: a collective on a capturing stream is recorded into the graph
 * (sc_stream_begin_capture), and every replay runs it again, collectively: every rank must
 * capture the same collectives and replay its graph the same number of times. The graph
 * remembers the communicator: a launch after it was destroyed is SC_ERR_STALE_HANDLE, after
 * it was aborted SC_ERR_COMM (nothing runs). With a thread per rank, capture in
 * SC_CAPTURE_THREAD_LOCAL mode (a global-mode capture refuses every thread's synchronous
 * copies and allocations while it lasts). With one thread driving several GPUs, launch
 * each GPU's graph from its own thread: NCCL warns that one thread launching graphs of
 * several GPUs may deadlock.
 *
 * Timeouts: every communicator has one (sc_comm_desc.timeout_ms, default
 * SC_COMM_DEFAULT_TIMEOUT_MS, 10 minutes, torch.distributed's default for NCCL). It bounds:
 *   - creation: all ranks must join within it;
 *   - each collective (or group) issued outside a capture, from its call until it has
 *     finished on the device: a watchdog thread of the library checks the communicators'
 *     collectives in flight (and NCCL's asynchronous errors) about every 10 ms, so a
 *     collective that a peer never joins, or one that NCCL reports failed, aborts the
 *     communicator (ncclCommAbort: NCCL's kernels stop, the stream goes on) whether or not
 *     anyone waits for it. Any wait then returns, and the next call on the communicator, or
 *     sc_comm_synchronize, returns SC_ERR_TIMEOUT (or SC_ERR_COMM for an NCCL error) with a
 *     message naming the communicator, the collective and what happened. The outputs of an
 *     aborted collective are undefined;
 *   - sc_comm_destroy's wait for the communicator's work (ncclCommFinalize).
 * It does not bound replays of captured collectives (a graph's work is not tracked one
 * collective at a time). Every rank whose thread still runs reports its own timeout: a peer
 * that never joins is reported by every rank waiting for it.
 *
 * Thread safety: any function may be called from any thread. NCCL forbids issuing on one
 * communicator (or on two of one GPU) from two threads at once: the library serializes
 * them per GPU. A group is the calling thread's. */
#ifndef SAFECUDA_COMM_H
#define SAFECUDA_COMM_H

#include "../safecuda.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sc_comm { uint64_t id; } sc_comm;

/* The bytes that name a communicator being created: made once (sc_comm_unique_id) and
 * given to every rank. */
#define SC_COMM_ID_BYTES 128
typedef struct sc_comm_id {
    unsigned char bytes[SC_COMM_ID_BYTES];
} sc_comm_id;

/* 10 minutes. */
#define SC_COMM_DEFAULT_TIMEOUT_MS 600000u

typedef enum sc_reduce_op {
    SC_REDUCE_SUM = 0,
    SC_REDUCE_PROD,
    SC_REDUCE_MIN,
    SC_REDUCE_MAX,
    SC_REDUCE_AVG, /* the sum divided by nranks: floating-point types (not fp8) only */
    SC_REDUCE_OP_COUNT
} sc_reduce_op;

/* ======================================================================================
 * The NCCL library
 * ==================================================================================== */

/* Load NCCL (once per process; see the top of this file) and give its version as NCCL
 * codes it: 10000 * major + 100 * minor + patch (22809 for 2.28.9). SC_ERR_NO_NCCL when no
 * usable NCCL is found: the message says where it looked, what each library found lacked
 * (too old: the version and the one needed), and what to install. Needs no driver. */
SC_API sc_status sc_comm_library_version(int *version);

/* The path of the loaded libnccl, NUL-terminated into buf (cut to size - 1 bytes).
 * SC_ERR_INVALID_ARGUMENT for a NULL buf or size 0; SC_ERR_NO_NCCL as above. */
SC_API sc_status sc_comm_library_path(char *buf, size_t size);

/* ======================================================================================
 * Communicators
 * ==================================================================================== */

/* Make a new unique id (on one rank; the caller sends the bytes to the others). Loads NCCL
 * (SC_ERR_NO_NCCL); SC_ERR_COMM when NCCL can't make one (its error quoted: no network
 * interface it can use, for instance). */
SC_API sc_status sc_comm_unique_id(sc_comm_id *id);

typedef struct sc_comm_desc {
    sc_comm_id unique_id; /* from sc_comm_unique_id on one rank; the same on every rank */
    int nranks;           /* at least 1 */
    int rank;             /* this one: 0 .. nranks - 1, each rank once */
    uint32_t timeout_ms;  /* 0: SC_COMM_DEFAULT_TIMEOUT_MS (see the top of this file) */
    const char *label;    /* shown in messages and leak reports */
} sc_comm_desc;

/* Create this rank's communicator on ctx's device; returns once every rank has joined.
 * SC_ERR_INVALID_ARGUMENT for a NULL desc or comm, nranks < 1, a rank outside
 * [0, nranks); SC_ERR_NO_NCCL; SC_ERR_TIMEOUT when the ranks did not all join within the
 * timeout (the half-made communicator is aborted; nothing is created); SC_ERR_COMM when
 * NCCL refuses (a GPU given to two ranks, a bad id: NCCL's text quoted); SC_ERR_NOT_SUPPORTED
 * on safecuda's test device with a real NCCL, or a real GPU with the test double (see
 * docs/MULTI_GPU.md). One thread making several ranks of one communicator one after the
 * other waits for the ones it has not made yet until the timeout: use a thread per rank, or
 * sc_comm_create_all. Use the macro: it records the call site. */
SC_API sc_status sc_comm_create_at(sc_context ctx, const sc_comm_desc *desc, sc_comm *comm,
                                   const char *file, int line);
#define sc_comm_create(...) sc_comm_create_at(__VA_ARGS__, __FILE__, __LINE__)

typedef struct sc_comm_all_desc {
    uint32_t timeout_ms; /* 0: SC_COMM_DEFAULT_TIMEOUT_MS */
    const char *label;   /* each communicator's label (default "comm") */
} sc_comm_all_desc;

/* Create one communicator per context, all of one group of n ranks: comms[i] is rank i, on
 * contexts[i]'s device (NCCL's ncclCommInitAll, made with the timeout and non-blocking
 * mode of sc_comm_create). desc may be NULL. All or nothing: on failure no communicator is
 * created and comms[] holds zero handles. SC_ERR_INVALID_ARGUMENT for NULL arrays, n < 1,
 * or two contexts of one device (NCCL takes one rank per GPU); the context statuses for
 * each context; the statuses of sc_comm_create otherwise. Use the macro. */
SC_API sc_status sc_comm_create_all_at(const sc_context *contexts, int n,
                                       const sc_comm_all_desc *desc, sc_comm *comms,
                                       const char *file, int line);
#define sc_comm_create_all(...) sc_comm_create_all_at(__VA_ARGS__, __FILE__, __LINE__)

/* Wait for the communicator's work (ncclCommFinalize, within its timeout), then free it.
 * Destroys always (see safecuda.h): when the wait times out or NCCL fails, the
 * communicator is aborted instead and the call returns SC_ERR_TIMEOUT or SC_ERR_COMM saying
 * so. An aborted communicator is destroyed with SC_OK (its abort was reported when it
 * happened). In one process, destroy every rank's communicator: NCCL frees the resources
 * they share with the last one. */
SC_API sc_status sc_comm_destroy(sc_comm comm);

/* Abort the communicator now (ncclCommAbort): its collectives in flight stop (their
 * outputs are undefined), later calls on it return SC_ERR_COMM, and only sc_comm_destroy
 * remains to do. For a program's own failure handling (a peer reported lost by other
 * means). Aborting an aborted communicator does nothing (SC_OK). */
SC_API sc_status sc_comm_abort(sc_comm comm);

typedef struct sc_comm_props {
    int rank;
    int nranks;
    int device;          /* the device ordinal of its context */
    uint32_t timeout_ms; /* the timeout in force */
    sc_context context;
    char label[64];
    const char *file;    /* creation site (basename); valid while the communicator lives */
    int line;
    bool aborted;        /* by a timeout, an NCCL error or sc_comm_abort */
} sc_comm_props;

/* Its rank, size, device, timeout, context, label, creation site and whether it was
 * aborted. SC_ERR_INVALID_ARGUMENT for a NULL props. */
SC_API sc_status sc_comm_info(sc_comm comm, sc_comm_props *props);

/* Wait until every collective issued on the communicator (outside captures) has finished
 * on the device. SC_OK; SC_ERR_TIMEOUT or SC_ERR_COMM when the communicator was aborted,
 * now or before (the message names the collective and the reason); SC_ERR_CONTEXT_LOST. */
SC_API sc_status sc_comm_synchronize(sc_comm comm);

/* SC_OK when every collective issued on the communicator has finished, SC_ERR_NOT_READY
 * (an answer, not a failure: no message) while some run; the statuses of
 * sc_comm_synchronize otherwise. Never waits. */
SC_API sc_status sc_comm_query(sc_comm comm);

/* ======================================================================================
 * Collectives (the checks and statuses: the top of this file)
 * ==================================================================================== */

/* dst[i] = op over the ranks of src[i], on every rank. dst and src have the same count
 * and element type; dst may be src (the same elements: in place), else they must not
 * overlap. */
SC_API sc_status sc_comm_all_reduce(sc_comm comm, sc_stream stream, sc_view dst, sc_view src,
                                    sc_reduce_op op);

/* The reduction of src (nranks x n elements) over the ranks, scattered: rank r's dst (n
 * elements) gets elements [r * n, (r + 1) * n) of the result. In place when dst is exactly
 * src's elements [rank * n, (rank + 1) * n); no other overlap. */
SC_API sc_status sc_comm_reduce_scatter(sc_comm comm, sc_stream stream, sc_view dst,
                                        sc_view src, sc_reduce_op op);

/* Every rank's src (n elements) gathered into every rank's dst (nranks x n elements), rank r's
 * at [r * n, (r + 1) * n). In place when src is exactly dst's elements
 * [rank * n, (rank + 1) * n); no other overlap. */
SC_API sc_status sc_comm_all_gather(sc_comm comm, sc_stream stream, sc_view dst, sc_view src);

/* All-to-all with equal counts: src and dst hold nranks x n elements (the same count, a
 * multiple of nranks); src's elements [p * n, (p + 1) * n) go to rank p, and dst's
 * [p * n, (p + 1) * n) come from rank p. src and dst must not overlap. */
SC_API sc_status sc_comm_all_to_all(sc_comm comm, sc_stream stream, sc_view dst, sc_view src);

/* All-to-all with per-peer counts (nranks entries each, elements, any of them 0):
 * send_counts[p] elements from src at send_offsets[p] go to rank p, and recv_counts[p]
 * elements from rank p land in dst at recv_offsets[p]. Offsets are relative to the views;
 * NULL offsets pack the segments in rank order (offset p = the sum of the counts before
 * it). Each segment must lie inside its view (SC_ERR_OUT_OF_BOUNDS), the received segments
 * must not overlap each other, and src and dst must not overlap (SC_ERR_INVALID_ARGUMENT).
 * Rank p's send_counts[q] must equal rank q's recv_counts[p] (NCCL's rule for send/recv;
 * not checkable locally). NCCL has no all-to-all-v: this is one group of ncclSend/ncclRecv,
 * the zero-count ones left out. */
SC_API sc_status sc_comm_all_to_all_v(sc_comm comm, sc_stream stream, sc_view dst,
                                      const uint64_t *recv_counts, const uint64_t *recv_offsets,
                                      sc_view src, const uint64_t *send_counts,
                                      const uint64_t *send_offsets);

/* Send src to rank peer, which receives it with sc_comm_recv of the same count and element
 * type. Sends and receives that must progress together (an exchange) go in one group. A
 * rank may send to itself, in a group with the matching receive. */
SC_API sc_status sc_comm_send(sc_comm comm, sc_stream stream, sc_view src, int peer);
/* Receive from rank peer into dst (see sc_comm_send). */
SC_API sc_status sc_comm_recv(sc_comm comm, sc_stream stream, sc_view dst, int peer);

/* Groups: the collectives, sends and receives called on this thread between
 * sc_comm_group_begin and sc_comm_group_end are issued together at the end (ncclGroupStart
 * / ncclGroupEnd): one thread's calls for several GPUs, or sends and receives that must
 * progress together. Groups nest; the outermost end issues. Each call in a group is checked
 * when made (a refused one is not added: nothing else changes) and again at the end, which
 * issues all of them or, when one fails its checks then (a buffer destroyed in between),
 * none (the message names the call). In a group, each context's operations use one stream,
 * and an operation's output must not overlap another's input or output (they run
 * concurrently): both refused when the call is made (SC_ERR_INVALID_ARGUMENT). The group
 * holds no references: an end that never comes leaks only the list. sc_comm_group_end
 * without a begin on this thread is SC_ERR_INVALID_ARGUMENT. */
SC_API sc_status sc_comm_group_begin(void);
/* End the group begun on this thread (see sc_comm_group_begin); the outermost end issues
 * its operations with the statuses of the collectives. */
SC_API sc_status sc_comm_group_end(void);

#ifdef __cplusplus
}
#endif
#endif
