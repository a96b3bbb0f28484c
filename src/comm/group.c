/* Groups of collectives: the calling thread's list between sc_comm_group_begin and
 * sc_comm_group_end. The list keeps each call's arguments by value (no reference on any
 * object: a group that never ends holds nothing up) and issues them together at the
 * outermost end (sci_comm_issue, which checks them again). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

typedef struct group {
    int depth;
    sci_comm_call *calls;
    size_t n, cap;
} group;

static pthread_key_t key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void clear(group *g)
{
    for (size_t i = 0; i < g->n; i++)
        sci_comm_call_free(&g->calls[i]);
    g->n = 0;
}

/* A thread that ends inside a group drops its list. */
static void free_group(void *p)
{
    group *g = p;
    clear(g);
    free(g->calls);
    free(g);
}

static void make_key(void) { pthread_key_create(&key, free_group); }

static group *get(bool create)
{
    pthread_once(&key_once, make_key);
    group *g = pthread_getspecific(key);
    if (!g && create) {
        g = calloc(1, sizeof *g);
        if (g && pthread_setspecific(key, g) != 0) {
            free(g);
            g = NULL;
        }
    }
    return g;
}

bool sci_comm_group_open(void)
{
    const group *g = get(false);
    return g && g->depth > 0;
}

sc_status sc_comm_group_begin(void)
{
    group *g = get(true);
    if (!g)
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, "sc_comm_group_begin", "out of host memory");
    g->depth++;
    return SC_OK;
}

sc_status sc_comm_group_end(void)
{
    static const char fn[] = "sc_comm_group_end";
    group *g = get(false);
    if (!g || g->depth == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "no group was begun on this thread "
                        "(sc_comm_group_begin)");
    if (--g->depth > 0 || g->n == 0)
        return SC_OK;
    sc_status s = sci_comm_issue(g->calls, g->n, fn);
    clear(g);
    return s;
}

bool sci_comm_group_take(sci_comm_call *call, sc_status *status)
{
    group *g = get(false);
    if (!g || g->depth == 0)
        return false;
    sc_status s = sci_comm_call_check(call);
    if (s == SC_OK && g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 8;
        sci_comm_call *grown = realloc(g->calls, cap * sizeof *grown);
        if (grown) {
            g->calls = grown;
            g->cap = cap;
        } else {
            s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, call->fn, "out of host memory");
        }
    }
    if (s == SC_OK) {
        g->calls[g->n] = *call;
        s = sci_comm_group_rules(g->calls, g->n, call->fn);
        if (s == SC_OK) {
            g->n++;
            call->counts = NULL; /* the group's now */
        }
    }
    if (s != SC_OK)
        sci_comm_call_free(call);
    *status = s;
    return true;
}
