/* Stream capture (internal): the state of a capture in progress, what it remembers for the
 * graph it becomes, the ordering between its streams, and the refusals that keep a capture
 * (and the process's other captures) from being invalidated by the library's own calls.
 *
 * A capture begins on one stream (its origin); other streams of the context join it when
 * they wait on an event recorded inside it (a fork). Captured work does not run, so it
 * never touches its objects' trackers (order.h): it is ordered among the capture's streams
 * by the capture's own shadow of those trackers, whose events become graph dependencies,
 * and it is remembered (kind, handle id, accesses) for the graph's replay checks. Uses that
 * the trackers recorded on a stream before it began capturing are covered by the event
 * the stream recorded just before (pre_capture): waits for them use that event, since
 * nothing can be recorded on a capturing stream without becoming part of the graph.
 *
 * Lifetime: a capture is owned by its origin stream until it ends (or is abandoned) and
 * freed when the last reference (sci_stream_capture / sci_capture_put) goes. All functions
 * are thread-safe; one process-wide lock guards which streams capture what, and each
 * capture's lock guards its shadow and its remembered objects. */
#ifndef SAFECUDA_STREAM_CAPTURE_H
#define SAFECUDA_STREAM_CAPTURE_H

#include "core/guard.h"
#include "stream/order.h"

/* One object a capture's work uses: its handle id (which names its kind) and the union
 * of the accesses (0 for kernels). */
typedef struct sci_capture_entry {
    uint64_t id;
    sci_access_mode mode;
} sci_capture_entry;

/* What a graph remembers: the entries, in first-use order. */
typedef struct sci_capture_list {
    sci_capture_entry *entries;
    size_t n, cap;
} sci_capture_list;

typedef struct sci_capture sci_capture;

/* The capture stream takes part in, referenced (release with sci_capture_put), or NULL. */
sci_capture *sci_stream_capture(sci_stream *stream);
void sci_capture_put(sci_capture *cap);
bool sci_stream_is_capturing_now(sci_stream *stream);

/* SC_ERR_CAPTURE (message: fn, what, the stream and its capture) when stream takes part in
 * a capture: for the calls that can't be part of a graph. SC_OK otherwise. */
sc_status sci_capture_refuse_stream(sci_stream *stream, const char *fn, const char *what);

/* A wrapped stream (sc_stream_wrap) may be captured by the library that made it
 * (torch.cuda.graph begins a capture with the CUDA runtime): ask the driver whether it
 * captures now, and adopt that capture (it is then treated like one begun with
 * sci_capture_begin, in global mode, the strictest) or retire the one adopted before
 * when it has ended. Called where a wrapped stream is resolved for an operation. */
void sci_capture_sync_wrapped(sci_stream *stream, const char *fn);
/* For any stream: the wrapped-stream check above, and for a stream that joined an adopted
 * capture (a fork), its retirement once the owner ended it. Cheap when neither applies. */
void sci_capture_sync(sci_stream *stream, const char *fn);
/* Record the wrapped stream's point after safecuda's latest work on it (its pre_capture
 * event), unless it captures: what a wait for that work uses if its owner begins a
 * capture later (nothing can be recorded on a capturing stream). */
sc_status sci_stream_mark_wrapped(sci_stream *stream, const char *fn);
/* The owner wrote memory on wrapped stream (a borrow names it as the first writer): record
 * the point after those writes; while it captures (nothing can be recorded), mark its
 * point invalid instead, so that a wait for its uses during the capture is refused rather
 * than ordered after an older point. Nothing for other streams. */
sc_status sci_stream_note_owner_writes(sci_stream *stream, const char *fn);
/* Whether stream takes part in a capture another library began (adopted). */
bool sci_capture_is_adopted(sci_stream *stream);

/* Calls CUDA forbids during capture from any layer: core/guard.h (each active capture is
 * registered there). */

/* Begin capturing on stream in mode (CUstreamCaptureMode values). */
sc_status sci_capture_begin(sci_stream *stream, int mode, const char *fn);
/* End the capture begun on stream: *graph gets the driver's graph (NULL when it was
 * invalidated) and *list the remembered objects (the caller owns both). Every stream of
 * the capture leaves it, whatever the answer. */
sc_status sci_capture_end(sci_stream *stream, CUgraph *graph, sci_capture_list *list,
                          const char *fn);
/* End the capture stream takes part in and drop its graph (a member stream is being
 * destroyed). Nothing if it takes part in none. */
void sci_capture_abandon(sci_stream *stream, const char *fn);

/* A wait of stream on an event recorded inside capture event_capture (its id): stream
 * joins it (a fork). Called before cuStreamWaitEvent; the capture's id, or 0 for an event
 * recorded outside any capture. SC_ERR_CAPTURE for a wait that would tie two captures
 * together, or a capturing stream to work outside its capture, or on an event of a capture
 * that has ended. */
sc_status sci_capture_before_wait(sci_stream *stream, uint64_t event_capture, const char *fn);
/* The id of the capture stream takes part in (0 if none), for events recorded on it. */
uint64_t sci_stream_capture_id(sci_stream *stream);
/* Whether capture id is still in progress. */
bool sci_capture_active(uint64_t id);

/* The accesses of an operation on a capturing stream (order.c's hooks): order them after
 * the capture's own conflicting work on its other streams and hold the capture's lock;
 * then remember them and record the uses, and unlock. */
sc_status sci_capture_access_begin(sci_capture *cap, sci_access *acc, size_t n,
                                   sci_stream *stream, bool order, const char *fn);
void sci_capture_access_end(sci_capture *cap, sci_access *acc, size_t n, sci_stream *stream,
                            bool enqueued);
/* Remember an object the captured work uses without an access (a kernel), with the
 * capture's lock held (between access begin and end). */
void sci_capture_remember_locked(sci_capture *cap, uint64_t id, sci_access_mode mode);

/* Make stream (which takes part in a capture) wait, inside the capture, for the captured
 * uses of object id on the capture's other streams: what a release on stream must follow.
 * SC_OK when stream captures nothing or the object has no captured use elsewhere. */
sc_status sci_capture_order_object(sci_stream *stream, uint64_t id, const char *fn);

/* Lists. */
bool sci_capture_list_add(sci_capture_list *l, uint64_t id, sci_access_mode mode);
void sci_capture_list_free(sci_capture_list *l);

#endif
