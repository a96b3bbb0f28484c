/* Automatic ordering of objects used on several streams.
 *
 * Each tracked object (a device buffer, a pinned host buffer) has a sci_tracker that
 * remembers the stream of its last write and the streams that read it since. An
 * operation declares its accesses; before it is enqueued, its stream is made to wait for
 * the conflicting uses on other streams (read-after-write, write-after-read,
 * write-after-write); after, its own use is recorded. A use on a stream that has no
 * event yet gets one recorded lazily, when a conflict first needs it: while an object is
 * only ever used on one stream, tracking costs no driver call at all.
 *
 * The tracker's lock is held from sci_access_begin to sci_access_end, so concurrent
 * operations on one object from several threads are ordered consistently. Objects are
 * locked in id order, so operations on several objects can't deadlock. */
#ifndef SAFECUDA_STREAM_ORDER_H
#define SAFECUDA_STREAM_ORDER_H

#include "stream/stream.h"

typedef struct sci_use {
    uint64_t stream_id; /* 0: unused slot */
    CUstream cu;
    CUevent event;      /* recorded after the use, or NULL until a conflict needs one */
    bool recorded;      /* event holds this use (or later work on the same stream) */
} sci_use;

typedef struct sci_tracker {
    pthread_mutex_t lock;
    uint64_t owner_id;  /* the tracked object's handle id: the lock order */
    sci_use write;      /* last write */
    sci_use *reads;     /* reads since the last write, one per stream */
    size_t n_reads, cap_reads;
    bool eager;         /* used on more than one stream: record events at each use */
    /* Set once, before the object is published, on objects that refuse every write (a
     * read-only borrowed buffer): sci_access_begin refuses a write access to it
     * (SC_ERR_INVALID_ARGUMENT, before anything is ordered or enqueued), the message
     * naming the object through describe. */
    bool read_only;
    const char *(*describe)(const struct sci_tracker *t, char *buf, size_t size);
} sci_tracker;

void sci_tracker_init(sci_tracker *t, uint64_t owner_id);
/* Destroy the events (the caller made sure the uses are complete or ordered); the first
 * failure of cuEventDestroy (the tracker is gone either way). */
CUresult sci_tracker_destroy(sci_tracker *t);

typedef enum sci_access_mode { SCI_READ = 1, SCI_WRITE = 2, SCI_READ_WRITE = 3 } sci_access_mode;

typedef struct sci_access {
    sci_tracker *tracker;
    sci_access_mode mode;
} sci_access;

struct sci_capture;

/* Refuse a write to a read-only tracked object (SC_ERR_INVALID_ARGUMENT, message set);
 * then lock the trackers (in id order; duplicates merged) and, when ordering is on, make
 * stream wait for the conflicting uses on other streams. On failure nothing stays
 * locked. When stream takes part in a capture (stream/capture.h) the work does not run
 * now: the trackers are left alone, the accesses are ordered among the capture's own
 * streams instead, and *cap gets the capture (referenced, locked) to hand to
 * sci_access_end; else *cap is NULL. */
sc_status sci_access_begin(sci_access *acc, size_t n, sci_stream *stream, bool order,
                           const char *fn, struct sci_capture **cap);
/* Record the uses on stream (when enqueued is true) and unlock. A use shared between
 * streams records its event at once; if that fails the event is recorded later, when
 * needed, except after a sticky error: then the context is lost and this returns
 * SC_ERR_CONTEXT_LOST (message set), else SC_OK. With a capture, the capture remembers
 * the accesses (for its graph) instead, and is released. */
sc_status sci_access_end(sci_access *acc, size_t n, sci_stream *stream,
                         struct sci_capture *cap, bool enqueued, const char *fn);

/* The accesses of work enqueued together on several streams by one call (a group of
 * collectives over several devices, which the communication library enqueues at its end):
 * one set per stream, each tracker in one set only (the caller's rule: the streams' work
 * runs concurrently, so one object in two sets would race). sci_access_begin_sets locks the
 * trackers of all sets in one order (owner ids), orders each set on its stream as
 * sci_access_begin does, and for a set whose stream captures, orders it inside its capture
 * (sets[i].cap; two streams of one capture are refused with SC_ERR_CAPTURE). The sets may be
 * reordered. On failure nothing stays locked. sci_access_end_sets records the uses (when
 * enqueued) and unlocks, as sci_access_end does. */
typedef struct sci_access_set {
    sci_access *acc;
    size_t n;
    sci_stream *stream;
    struct sci_capture *cap; /* set by sci_access_begin_sets */
} sci_access_set;
sc_status sci_access_begin_sets(sci_access_set *sets, size_t n_sets, const char *fn);
sc_status sci_access_end_sets(sci_access_set *sets, size_t n_sets, bool enqueued,
                              const char *fn);

/* While on, the calling thread's operations on wrapped streams do not record the stream's
 * point after each one (sci_access_end): a composite operation (an MoE forward, a dozen
 * launches) records it once at its end with sci_stream_mark_wrapped instead. */
void sci_wrapped_marks_defer(bool on);

/* Make stream wait for every use of t on other streams (for frees). t must be locked or
 * otherwise unreachable. */
sc_status sci_tracker_order_all(sci_tracker *t, sci_stream *stream, const char *fn);

/* Host-side wait for every use of t (record events where missing). With try_only, answer
 * SC_ERR_BUSY instead of waiting. Locks t itself. */
sc_status sci_tracker_host_wait(sci_tracker *t, sci_context *ctx, bool try_only,
                                const char *fn);
/* The same with t's lock already held by the caller. */
sc_status sci_tracker_host_wait_locked(sci_tracker *t, sci_context *ctx, bool try_only,
                                       const char *fn);

/* Host-side wait for the uses of t on streams other than skip_stream_id (a stream that
 * captures now: its uses before the capture are ordered before the graph's work by its
 * owner). Locks t itself. */
sc_status sci_tracker_host_wait_except(sci_tracker *t, sci_context *ctx, uint64_t skip_stream_id,
                                      const char *fn);

/* The stream of the last use of t, for frees (0 if none). t must be locked. */
uint64_t sci_tracker_last_stream(const sci_tracker *t);

#endif
