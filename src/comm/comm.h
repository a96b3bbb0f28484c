/* Communicators (internal): the object, its NCCL communicator, its collectives in flight,
 * and what the files of src/comm/ share.
 *
 *   comm.c        the object (create, create_all, destroy, abort, info), the per-GPU issue
 *                 locks, waiting for NCCL (ncclInProgress) with the timeout, aborts;
 *   inflight.c    the collectives in flight: tracking, polling, sc_comm_synchronize/_query;
 *   collective.c  the public collectives: their checks, and issuing a list of them;
 *   group.c       sc_comm_group_begin / _end: the calling thread's pending list;
 *   watchdog.c    the thread that finds collectives past their deadline and NCCL's
 *                 asynchronous errors, and aborts their communicators.
 *
 * Locks, in the order they are taken: the watchdog's list lock (watchdog.c), the per-GPU
 * issue locks (several: by device ordinal; the watchdog only try-locks them), the buffers'
 * trackers, a communicator's lock (leaf: held briefly, never across an NCCL call). Every
 * NCCL call on a communicator is made with its GPU's issue lock held: NCCL forbids two
 * threads issuing on one communicator, or on two of one GPU, at once, and ncclCommAbort
 * while another call runs. */
#ifndef SAFECUDA_COMM_COMM_H
#define SAFECUDA_COMM_COMM_H

#include "driver/nccl_api.h"
#include "safecuda/comm.h"
#include "stream/stream.h"

/* A collective issued outside a capture, until its event completes. */
typedef struct sci_comm_inflight {
    CUevent event;        /* recorded after it on its stream */
    uint64_t issued_ns;   /* CLOCK_MONOTONIC */
    uint64_t deadline_ns;
    char what[112];       /* "all-reduce of 1024 x f32 (sum)" */
} sci_comm_inflight;

typedef struct sci_comm {
    sci_object obj;
    sci_context *ctx;
    int rank, nranks;
    uint32_t timeout_ms;

    /* Read and written with the GPU's issue lock held; NULL once aborted. */
    ncclComm_t nccl;

    pthread_mutex_t lock; /* the fields below */
    bool aborted;
    sc_status abort_status;   /* SC_ERR_TIMEOUT or SC_ERR_COMM */
    char abort_reason[1280];  /* what happened, for every later call's message */
    sci_comm_inflight *ops;   /* in issue order */
    size_t n_ops, cap_ops;
    CUevent *spare;           /* completed ops' events, for reuse */
    size_t n_spare, cap_spare;

    /* The watchdog's list (watchdog.c's lock). */
    struct sci_comm *wd_next;
    bool watched;
} sci_comm;

/* ---- comm.c --------------------------------------------------------------------------------- */

/* Monotonic nanoseconds. */
uint64_t sci_comm_now_ns(void);
/* A wait's pause, the wait begun at since_ns: yields for the first 2 ms (NCCL's own threads
 * progress), then 50 us sleeps, after 50 ms 1 ms ones. */
void sci_comm_backoff(uint64_t since_ns);

/* The issue lock of a GPU (by ordinal). lock_devices locks each of a list's devices once,
 * in ascending order (the list is sorted and made unique in place; returns the count). */
void sci_comm_lock_device(int device);
bool sci_comm_trylock_device(int device);
void sci_comm_unlock_device(int device);
size_t sci_comm_lock_devices(int *devices, size_t n);
void sci_comm_unlock_devices(const int *devices, size_t n);

/* Acquire a communicator (a registry reference) and make its context current. */
sc_status sci_comm_acquire(sc_comm h, const char *fn, sci_comm **out);
void sci_comm_release(sci_comm *c);

/* "communicator 'world' (rank 0 of 2 on device 0, created at demo.c:14)". */
const char *sci_comm_describe(const sci_comm *c, char *buf, size_t size);

/* SC_OK, or the status and message of an aborted communicator (fn: the caller). */
sc_status sci_comm_check_alive(sci_comm *c, const char *fn);

/* For the graph layer: an object a graph remembers is a communicator that was aborted
 * (SC_ERR_COMM or SC_ERR_TIMEOUT, message set); SC_OK for other objects. */
sc_status sci_comm_check_usable(sci_object *obj, const char *fn);

/* Abort c (its GPU's issue lock held by the caller): mark it aborted with status and the
 * reason (formatted), log the reason (when log, at SC_LOG_ERROR: nobody may be waiting to
 * hear it), then ncclCommAbort. Nothing if already aborted. */
void sci_comm_abort_locked(sci_comm *c, sc_status status, bool log, const char *fmt, ...)
    SCI_PRINTF(4, 5);

/* The message part for an NCCL error: "ncclInvalidUsage (invalid usage; NCCL: <last>)". */
const char *sci_comm_nccl_error(ncclResult_t r, ncclComm_t comm, char *buf, size_t size);

/* After calls that may answer ncclInProgress on each of comms (issue locks held): wait until
 * none is in progress, each within its timeout from now. On an error or a timeout, every
 * communicator of the list is aborted (NCCL's rule for a group), with a reason naming what
 * (e.g. "issuing the all-reduce of ...") and fn; the status and message are returned. */
sc_status sci_comm_wait_issued(sci_comm **comms, size_t n, const char *what, const char *fn);

/* ---- inflight.c ------------------------------------------------------------------------------ */

/* Remember a collective issued on stream (outside a capture) as in flight on c: an event
 * recorded after it, its deadline. A failure to record leaves it untracked (a sticky error
 * is reported: the context is lost). */
sc_status sci_comm_track(sci_comm *c, sci_stream *stream, uint64_t issued_ns, const char *what,
                         const char *fn);

/* Look at c's collectives in flight: drop the finished ones; with the GPU's issue lock held
 * (locked), also abort c when the oldest is past its deadline or NCCL reports an
 * asynchronous error. Returns SC_OK when none is in flight, SC_ERR_NOT_READY (no message)
 * while some are, or the abort's status and message. The context must be current. */
sc_status sci_comm_poll(sci_comm *c, bool locked, const char *fn);

/* ---- watchdog.c ----------------------------------------------------------------------------- */

/* Watch c from now (starts the thread with the first communicator); SC_ERR_LIMIT when the
 * thread can't be started. Stop watching (the last one stops the thread and joins it). */
sc_status sci_comm_watch(sci_comm *c, const char *fn);
void sci_comm_unwatch(sci_comm *c);

/* ---- collective.c / group.c ------------------------------------------------------------------ */

typedef enum sci_comm_kind {
    SCI_COMM_ALL_REDUCE,
    SCI_COMM_REDUCE_SCATTER,
    SCI_COMM_ALL_GATHER,
    SCI_COMM_ALL_TO_ALL,
    SCI_COMM_ALL_TO_ALL_V,
    SCI_COMM_SEND,
    SCI_COMM_RECV
} sci_comm_kind;

/* One call's arguments, kept by value (a group keeps no references: it re-resolves them at
 * its end). After sci_comm_call_check: the resolved ranges and stream, for a group's rules. */
typedef struct sci_comm_call {
    sci_comm_kind kind;
    const char *fn; /* the public function */
    sc_comm comm;
    sc_stream stream;
    sc_view dst, src;
    sc_reduce_op op;
    int peer;
    uint64_t *counts; /* all-to-all-v: send counts, send offsets, recv counts, recv offsets
                         (nranks each; malloc'd, owned by the call) */
    /* Filled by the check. */
    uint64_t ctx_id, stream_id;
    uint64_t dst_buf, dst_begin, dst_end; /* dst_buf 0: none */
    uint64_t src_buf, src_begin, src_end;
    bool in_place;
} sci_comm_call;

/* Check a call as its function would (resolving and releasing everything). */
sc_status sci_comm_call_check(sci_comm_call *call);
/* Check and issue calls together (one NCCL group), ordered by the stream layer. fn names
 * the caller in messages: the call's own function for a single call, sc_comm_group_end for
 * a group (whose messages then name the call that failed). */
sc_status sci_comm_issue(sci_comm_call *calls, size_t n, const char *fn);
/* The rules between the calls of one group (one stream per context, no output overlapping
 * another call's view), for call `latest` against calls[0 .. latest). */
sc_status sci_comm_group_rules(const sci_comm_call *calls, size_t latest, const char *fn);
void sci_comm_call_free(sci_comm_call *call);

/* group.c: when the calling thread is in a group, take the call (checked; ownership of its
 * counts passes to the group) and answer true with *status; else false. */
bool sci_comm_group_take(sci_comm_call *call, sc_status *status);
/* Whether the calling thread is between sc_comm_group_begin and its end. */
bool sci_comm_group_open(void);

#endif
