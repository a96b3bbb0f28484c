/* Held streams: work that has not finished, for safecuda's NCCL test double
 * (tests/ncclfault), whose collectives end only when every rank has joined them, or never.
 *
 * The test device's streams are synchronous (every copy runs when it is enqueued); a hold
 * models only completion: while a stream has holds, cuStreamQuery answers
 * CUDA_ERROR_NOT_READY and cuStreamSynchronize waits, an event recorded on it meanwhile is
 * not complete (cuEventQuery answers CUDA_ERROR_NOT_READY, cuEventSynchronize waits) until
 * the stream's holds are all released, and cuCtxSynchronize waits while any stream is held.
 * Work enqueued on a held stream still runs at once, and a wait of another stream on a
 * pending event (cuStreamWaitEvent) does not hold that stream: not modelled. Destroying a
 * held stream drops its holds (CUDA finishes its work first). Exported, not an API:
 * safecuda_testdevice_hold_stream, _release_hold, _held_streams. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>

#include "testdevice_internal.h"

typedef struct hold {
    int id;
    fake_stream *stream;
} hold;

static hold *holds;
static size_t n_holds, cap_holds;
static int next_hold;

static fake_stream *live_stream(CUstream s)
{
    return (uintptr_t)s > 2 && set_has(&streams, s) ? (fake_stream *)(void *)s : NULL;
}

int td_stream_busy(CUstream s)
{
    fake_stream *st = live_stream(s);
    return st && st->holds > 0;
}

int td_any_stream_busy(void)
{
    return n_holds > 0;
}

void td_event_note_record(fake_event *e, CUstream s)
{
    fake_stream *st = live_stream(s);
    e->pending_on = st && st->holds > 0 ? st : NULL;
    e->pending_epoch = st ? st->hold_epoch : 0;
}

int td_event_pending(const fake_event *e)
{
    const fake_stream *st = e->pending_on;
    return st && set_has(&streams, st) && st->holds > 0 && st->hold_epoch == e->pending_epoch;
}

static void drop(size_t i)
{
    fake_stream *st = holds[i].stream;
    holds[i] = holds[--n_holds];
    if (--st->holds == 0) {
        st->hold_epoch++; /* the events recorded while it was held are complete now */
        td_wake();
    }
}

void td_hold_forget_stream(fake_stream *s)
{
    for (size_t i = n_holds; i-- > 0;)
        if (holds[i].stream == s)
            drop(i);
    for (size_t i = 0; i < events.n; i++) {
        fake_event *e = events.items[i];
        if (e->pending_on == s)
            e->pending_on = NULL;
    }
}

EXPORT int safecuda_testdevice_hold_stream(CUstream s)
{
    td_lock();
    fake_stream *st = live_stream(s);
    int id = 0;
    if (st && n_holds == cap_holds) {
        size_t cap = cap_holds ? 2 * cap_holds : 16;
        hold *grown = realloc(holds, cap * sizeof *grown);
        if (grown) {
            holds = grown;
            cap_holds = cap;
        }
    }
    if (st && n_holds < cap_holds) {
        id = ++next_hold;
        holds[n_holds++] = (hold){id, st};
        st->holds++;
    }
    td_unlock();
    return id;
}

EXPORT void safecuda_testdevice_release_hold(int id)
{
    td_lock();
    for (size_t i = 0; i < n_holds; i++)
        if (holds[i].id == id) {
            drop(i);
            break;
        }
    if (n_holds == 0) {
        free(holds);
        holds = NULL;
        cap_holds = 0;
    }
    td_unlock();
}

EXPORT long safecuda_testdevice_held_streams(void)
{
    td_lock();
    long n = 0;
    for (size_t i = 0; i < streams.n; i++)
        n += ((fake_stream *)streams.items[i])->holds > 0;
    td_unlock();
    return n;
}
