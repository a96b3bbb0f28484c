/* Streams and events (internal). */
#ifndef SAFECUDA_STREAM_STREAM_H
#define SAFECUDA_STREAM_STREAM_H

#include "core/context.h"

struct sci_capture;

typedef struct sci_stream {
    sci_object obj;
    sci_context *ctx;
    CUstream cu;
    int priority;
    bool is_default;
    bool is_service;              /* the context's internal stream for frees (never captures) */
    bool wrapped;                 /* a CUstream another library made (sc_stream_wrap): never
                                     destroyed here; captures it begins are adopted */
    struct sci_capture *capture;  /* the capture it takes part in (stream/capture.c's lock) */
    CUevent pre_capture;          /* recorded just before it last joined a capture */
    atomic_bool pre_capture_valid; /* pre_capture holds the stream's work before its current
                                     capture (false for a capture another library began) */
} sci_stream;

typedef struct sci_event {
    sci_object obj;
    sci_context *ctx;
    CUevent cu;
    bool timing;
    atomic_bool recorded;
    _Atomic uint64_t capture; /* the capture its last record was made in (0: outside any) */
} sci_event;

/* Resolve a stream argument: SC_DEFAULT_STREAM gives ctx's default stream (created on
 * first use). Takes a reference (sci_stream_release) and checks the stream belongs to
 * ctx and that ctx is usable (and current). what names the argument in messages. */
sc_status sci_stream_resolve(sc_stream h, sci_context *ctx, const char *fn, sci_stream **out);
/* Acquire a stream by handle, without a context to compare with (SC_DEFAULT_STREAM is
 * refused: there is no context to take it from). */
sc_status sci_stream_acquire(sc_stream h, const char *fn, sci_stream **out);
void sci_stream_release(sci_stream *s);

/* The context's default stream, created on first use (no reference taken: it lives as
 * long as the context). */
sc_status sci_context_default_stream(sci_context *ctx, const char *fn, sci_stream **out);

/* The context's service stream: internal, never given out and never capturing, for the
 * library's own stream-ordered work that must not land in a capture (a buffer's free when
 * its last stream is capturing). Created on first use; referenced like a resolved stream. */
sc_status sci_context_service_stream(sci_context *ctx, const char *fn, sci_stream **out);

#endif
