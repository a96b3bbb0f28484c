#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static sc_log_fn log_fn;
static void *log_user;

void sc_set_log_callback(sc_log_fn fn, void *user)
{
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user;
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
    pthread_mutex_lock(&log_lock);
    sc_log_fn fn = log_fn;
    void *user = log_user;
    pthread_mutex_unlock(&log_lock);
    if (fn)
        fn(level, text, user);
    else
        fprintf(stderr, "safecuda %s: %s\n", names[level <= SC_LOG_ERROR ? level : 0], text);
    if (text != line)
        free(text);
}
