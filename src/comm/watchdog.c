/* The watchdog: one thread of the library, running while any communicator lives, that looks
 * at every communicator about every WATCH_MS: its collectives that finished are dropped,
 * and one past its deadline, or an asynchronous error NCCL reports, aborts the
 * communicator (sci_comm_poll with the GPU's issue lock, which it only try-locks: a thread
 * that holds it is waiting on NCCL with its own deadline). So a collective that never ends
 * is stopped whether or not anyone waits for it, and every wait on its stream returns. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"

#define WATCH_MS 10

static pthread_mutex_t wd_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_wake;    /* CLOCK_MONOTONIC: stop, or the next round */
static pthread_cond_t wd_stopped; /* the thread was joined: a new one may start */
static pthread_once_t wd_once = PTHREAD_ONCE_INIT;
static sci_comm *watched;         /* the list */
static pthread_t thread;
static bool running, stopping;

static void init_conds(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&wd_wake, &attr);
    pthread_condattr_destroy(&attr);
    pthread_cond_init(&wd_stopped, NULL);
}

static void look_at(sci_comm *c)
{
    const int device = c->ctx->device;
    if (atomic_load(&c->ctx->lost) || !sci_comm_trylock_device(device))
        return;
    const char *call;
    if (sci_context_make_current_cu(c->ctx, &call) == CUDA_SUCCESS) {
        char *saved = sci_error_save(); /* (this thread's message is nobody's) */
        sci_comm_poll(c, true, "the communicator watchdog");
        sci_error_restore(saved);
    }
    sci_comm_unlock_device(device);
}

static void *watch(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&wd_lock);
    while (!stopping) {
        for (sci_comm *c = watched; c; c = c->wd_next)
            look_at(c);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += WATCH_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while (!stopping && pthread_cond_timedwait(&wd_wake, &wd_lock, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&wd_lock);
    return NULL;
}

sc_status sci_comm_watch(sci_comm *c, const char *fn)
{
    pthread_once(&wd_once, init_conds);
    pthread_mutex_lock(&wd_lock);
    while (stopping) /* the last one's unwatch is joining the old thread */
        pthread_cond_wait(&wd_stopped, &wd_lock);
    if (!running) {
        int e = pthread_create(&thread, NULL, watch, NULL);
        if (e != 0) {
            pthread_mutex_unlock(&wd_lock);
            return sci_fail(SC_ERR_LIMIT, fn, "cannot start the communicator watchdog thread: %s",
                            strerror(e));
        }
        running = true;
    }
    c->wd_next = watched;
    watched = c;
    c->watched = true;
    pthread_mutex_unlock(&wd_lock);
    return SC_OK;
}

void sci_comm_unwatch(sci_comm *c)
{
    pthread_once(&wd_once, init_conds);
    pthread_mutex_lock(&wd_lock);
    if (!c->watched) {
        pthread_mutex_unlock(&wd_lock);
        return;
    }
    for (sci_comm **p = &watched; *p; p = &(*p)->wd_next)
        if (*p == c) {
            *p = c->wd_next;
            break;
        }
    c->watched = false;
    c->wd_next = NULL;
    if (watched || !running) {
        pthread_mutex_unlock(&wd_lock);
        return;
    }
    /* The last one: stop the thread and join it (without the lock, which it needs to end). */
    stopping = true;
    pthread_cond_signal(&wd_wake);
    pthread_t t = thread;
    pthread_mutex_unlock(&wd_lock);
    pthread_join(t, NULL);
    pthread_mutex_lock(&wd_lock);
    running = false;
    stopping = false;
    pthread_cond_broadcast(&wd_stopped);
    pthread_mutex_unlock(&wd_lock);
}
