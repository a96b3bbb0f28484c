#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"

/* The callback and its user data, and the calls of it in progress. A call runs outside
 * log_lock (so a callback may call back into the library); sc_set_log_callback waits for
 * the calls that began before it, so that once it returns no thread is still running the
 * previous callback and its user data may be freed. */
typedef struct log_call {
    uint64_t generation; /* of the callback the call runs */
    struct log_call *prev, *next;
} log_call;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t log_call_done = PTHREAD_COND_INITIALIZER;
static sc_log_fn log_fn;
static void *log_user;
static uint64_t log_generation; /* bumped by every sc_set_log_callback */
static log_call *log_calls;     /* the calls in progress (a list of stack records) */
static size_t log_waiters;      /* sc_set_log_callback calls waiting for them */
static _Thread_local int log_depth; /* callbacks running on this thread */

/* Under log_lock: a call of a callback set before generation g is still running. */
static int older_call_running(uint64_t g)
{
    for (const log_call *c = log_calls; c; c = c->next)
        if (c->generation < g)
            return 1;
    return 0;
}

void sc_set_log_callback(sc_log_fn fn, void *user)
{
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user;
    uint64_t g = ++log_generation;
    /* From inside a callback this thread's own call can't finish first: don't wait. */
    if (log_depth == 0) {
        log_waiters++;
        while (older_call_running(g))
            pthread_cond_wait(&log_call_done, &log_lock);
        log_waiters--;
    }
    pthread_mutex_unlock(&log_lock);
}

void sci_log(sc_log_level level, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warning", "error"};
    char line[2048];
    char *text = line; /* a longer line is formatted again into the heap, never cut */
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof line) {
        char *heap = malloc((size_t)n + 1);
        if (heap) {
            va_start(ap, fmt);
            vsnprintf(heap, (size_t)n + 1, fmt, ap);
            va_end(ap);
            text = heap;
        }
    }
    log_call call = {0};
    pthread_mutex_lock(&log_lock);
    sc_log_fn fn = log_fn;
    void *user = log_user;
    if (fn) {
        call.generation = log_generation;
        call.next = log_calls;
        if (log_calls)
            log_calls->prev = &call;
        log_calls = &call;
    }
    pthread_mutex_unlock(&log_lock);
    if (!fn) {
        fprintf(stderr, "safecuda %s: %s\n", names[level <= SC_LOG_ERROR ? level : 0], text);
        if (text != line)
            free(text);
        return;
    }
    log_depth++;
    fn(level, text, user);
    log_depth--;
    if (text != line)
        free(text);
    pthread_mutex_lock(&log_lock);
    if (call.prev)
        call.prev->next = call.next;
    else
        log_calls = call.next;
    if (call.next)
        call.next->prev = call.prev;
    if (log_waiters)
        pthread_cond_broadcast(&log_call_done);
    pthread_mutex_unlock(&log_lock);
}
