/* Calls CUDA forbids while a stream capture is open: refusals and deferred releases. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/guard.h"

typedef struct deferred {
    void (*release)(void *arg);
    void *arg;
    struct deferred *next;
} deferred;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static sci_guard *guards;
static deferred *pending;
static void (*_Atomic refresher)(void);
static atomic_int adopted_guards;

void sci_guard_set_refresh(void (*refresh)(void)) { atomic_store(&refresher, refresh); }

/* Let the stream layer retire adopted captures whose owner ended them, before a guard is
 * consulted (an adopted capture ends in another library, unseen). */
static void refresh(void)
{
    void (*fn)(void) = atomic_load(&refresher);
    if (fn && atomic_load(&adopted_guards) > 0)
        fn();
}

/* The guard that forbids unsafe calls from this thread now (lock held), or NULL. */
static const sci_guard *forbidding_locked(void)
{
    pthread_t self = pthread_self();
    for (const sci_guard *g = guards; g; g = g->next)
        if (g->mode == 0 || (g->mode == 1 && pthread_equal(g->thread, self)))
            return g;
    return NULL;
}

void sci_guard_add(sci_guard *g)
{
    if (g->adopted)
        atomic_fetch_add(&adopted_guards, 1);
    pthread_mutex_lock(&lock);
    g->next = guards;
    guards = g;
    pthread_mutex_unlock(&lock);
}

void sci_guard_remove(sci_guard *g)
{
    pthread_mutex_lock(&lock);
    for (sci_guard **p = &guards; *p; p = &(*p)->next)
        if (*p == g) {
            *p = g->next;
            if (g->adopted)
                atomic_fetch_sub(&adopted_guards, 1);
            break;
        }
    /* Deferred releases wait for every forbidding capture of any thread to end. */
    bool none = true;
    for (const sci_guard *o = guards; o; o = o->next)
        none &= o->mode == 2;
    deferred *run = none ? pending : NULL;
    if (none)
        pending = NULL;
    pthread_mutex_unlock(&lock);
    while (run) {
        deferred *d = run;
        run = d->next;
        d->release(d->arg);
        free(d);
    }
}

bool sci_guard_active(void)
{
    refresh();
    pthread_mutex_lock(&lock);
    bool active = forbidding_locked() != NULL;
    pthread_mutex_unlock(&lock);
    return active;
}

/* A guard that keeps ctx's work from finishing, or one that forbids unsafe calls (lock
 * held). ctx NULL: only the latter. */
static const sci_guard *busy_locked(const void *ctx)
{
    for (const sci_guard *g = guards; g && ctx; g = g->next)
        if (g->ctx == ctx)
            return g;
    return forbidding_locked();
}

/* SC_ERR_CAPTURE naming the guard busy_locked(ctx) finds, with why it refuses. */
static sc_status refuse(const void *ctx, const char *fn, const char *what, const char *why)
{
    refresh();
    pthread_mutex_lock(&lock);
    const sci_guard *g = busy_locked(ctx);
    char who[sizeof g->what] = "";
    if (g)
        snprintf(who, sizeof who, "%s", g->what);
    pthread_mutex_unlock(&lock);
    if (!g)
        return SC_OK;
    return sci_fail(SC_ERR_CAPTURE, fn,
                    "%s is not allowed while %s is in progress (%s): nothing was done and the "
                    "capture is still usable",
                    what, who, why);
}

sc_status sci_guard_refuse(const char *fn, const char *what)
{
    return refuse(NULL, fn, what,
                  "CUDA forbids calls that synchronize, or allocate or free outside a stream, "
                  "during a capture; a relaxed capture, or a thread-local one on another "
                  "thread, allows them");
}

bool sci_guard_context_busy(const void *ctx)
{
    refresh();
    pthread_mutex_lock(&lock);
    bool busy = busy_locked(ctx) != NULL;
    pthread_mutex_unlock(&lock);
    return busy;
}

sc_status sci_guard_refuse_context(const void *ctx, const char *fn, const char *what)
{
    return refuse(ctx, fn, what,
                  "it would wait for work that does not run until the graph is launched, and "
                  "CUDA forbids it during a capture");
}

void sci_guard_defer(void (*release)(void *arg), void *arg)
{
    refresh();
    pthread_mutex_lock(&lock);
    if (forbidding_locked() || pending) {
        deferred *d = malloc(sizeof *d);
        if (d) {
            *d = (deferred){release, arg, pending};
            pending = d;
            pthread_mutex_unlock(&lock);
            return;
        }
    }
    pthread_mutex_unlock(&lock);
    release(arg); /* nothing forbids it (or no memory to remember it) */
}
