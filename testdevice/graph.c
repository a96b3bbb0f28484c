/* The test device's graphs (the model is described in testdevice.c's header comment): the
 * node lists that captures record (capture.c), graphs, executable graphs, their update, and
 * their replay on the synchronous streams. One mutex (testdevice.c's) guards all of it;
 * host functions run outside. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testdevice_internal.h"

ptr_set graphs, execs;

/* ---- node lists ----------------------------------------------------------------------- */

void node_free(fake_node *n)
{
    if (!n)
        return;
    free(n->deps);
    if (n->kind == NODE_KERNEL)
        free(n->u.kernel.params);
    free(n);
}

static fake_node *node_clone(const fake_node *n)
{
    fake_node *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    *c = *n;
    c->deps = NULL;
    if (n->kind == NODE_KERNEL)
        c->u.kernel.params = NULL;
    if (n->n_deps) {
        c->deps = malloc(n->n_deps * sizeof *c->deps);
        if (!c->deps) {
            node_free(c);
            return NULL;
        }
        memcpy(c->deps, n->deps, n->n_deps * sizeof *c->deps);
    }
    if (n->kind == NODE_KERNEL) {
        c->u.kernel.params = malloc(n->u.kernel.params_size ? n->u.kernel.params_size : 1);
        if (!c->u.kernel.params) {
            node_free(c);
            return NULL;
        }
        memcpy(c->u.kernel.params, n->u.kernel.params, n->u.kernel.params_size);
    }
    return c;
}

static void list_free(node_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        node_free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = l->cap = 0;
}

int list_push(node_list *l, fake_node *n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        fake_node **grown = realloc(l->items, cap * sizeof *grown);
        if (!grown)
            return 0;
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->n++] = n;
    return 1;
}

static int list_clone(node_list *into, const node_list *from)
{
    memset(into, 0, sizeof *into);
    for (size_t i = 0; i < from->n; i++) {
        fake_node *c = node_clone(from->items[i]);
        if (!c || !list_push(into, c)) {
            node_free(c);
            list_free(into);
            return 0;
        }
    }
    return 1;
}

void graph_free(fake_graph *g)
{
    if (g) {
        list_free(&g->nodes);
        free(g);
    }
}

static void exec_free(fake_exec *e)
{
    list_free(&e->nodes);
    free(e);
}

/* ---- graphs and executable graphs -------------------------------------------------------- */

static CUresult graph_ok(CUgraph g, const char *fn)
{
    if (!set_has(&graphs, g))
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "unknown or destroyed graph %p", (void *)g);
    return CUDA_SUCCESS;
}

static CUresult exec_ok(CUgraphExec e, const char *fn)
{
    if (!set_has(&execs, e))
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "unknown or destroyed executable graph %p",
                   (void *)e);
    return CUDA_SUCCESS;
}

CUresult td_cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n)
{
    static const char fn[] = "cuGraphGetNodes";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), graph_ok(g, fn), not_null(n, fn, "count"));
    if (r == CUDA_SUCCESS) {
        const node_list *l = &((fake_graph *)(void *)g)->nodes;
        if (!nodes) {
            *n = l->n;
        } else {
            for (size_t i = 0; i < *n; i++)
                nodes[i] = i < l->n ? (CUgraphNode)(void *)l->items[i] : NULL;
            if (*n > l->n)
                *n = l->n;
        }
    }
    td_unlock();
    return r;
}

CUresult td_cuGraphDestroy(CUgraph g)
{
    static const char fn[] = "cuGraphDestroy";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), graph_ok(g, fn));
    if (r == CUDA_SUCCESS) {
        set_remove(&graphs, g);
        graph_free((fake_graph *)(void *)g);
    }
    td_unlock();
    return r;
}

CUresult td_cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags)
{
    static const char fn[] = "cuGraphInstantiateWithFlags";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), not_null(e, fn, "out-pointer"), graph_ok(g, fn));
    /* AUTO_FREE_ON_LAUNCH 1, UPLOAD 2, DEVICE_LAUNCH 4, USE_NODE_PRIORITY 8 */
    if (r == CUDA_SUCCESS && (flags & ~0xfull))
        r = bad(CUDA_ERROR_INVALID_VALUE, fn, "unknown flags 0x%llx", flags);
    if (r == CUDA_SUCCESS) {
        fake_exec *x = calloc(1, sizeof *x);
        if (!x || !list_clone(&x->nodes, &((fake_graph *)(void *)g)->nodes)) {
            free(x);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (!set_add(&execs, x)) {
            exec_free(x);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            x->magic = EXEC_MAGIC;
            *e = (CUgraphExec)(void *)x;
        }
    }
    td_unlock();
    return r;
}

CUresult td_cuGraphExecDestroy(CUgraphExec e)
{
    static const char fn[] = "cuGraphExecDestroy";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), exec_ok(e, fn));
    if (r == CUDA_SUCCESS) {
        set_remove(&execs, e);
        exec_free((fake_exec *)(void *)e); /* a launch in progress works on its own copy */
    }
    td_unlock();
    return r;
}

static int same_deps(const fake_node *a, const fake_node *b)
{
    if (a->n_deps != b->n_deps)
        return 0;
    for (size_t i = 0; i < a->n_deps; i++) {
        size_t k = 0;
        while (k < b->n_deps && b->deps[k] != a->deps[i])
            k++;
        if (k == b->n_deps)
            return 0;
    }
    return 1;
}

/* Why node b (of the new graph) can't replace node a (of the executable graph), or
 * CU_GRAPH_EXEC_UPDATE_SUCCESS. What CUDA 12 allows: a kernel node's function, grid and
 * parameters may change (same context), not whether it is cooperative; a copy's addresses
 * and size, not its direction (memory types); a 1D memset's address, value and size, a 2D
 * memset's address and value only; host functions and waited events. */
static CUgraphExecUpdateResult update_verdict(const fake_node *a, const fake_node *b)
{
    if (a->kind != b->kind)
        return CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
    switch (a->kind) {
    case NODE_KERNEL:
        if (a->u.kernel.attrs.cooperative != b->u.kernel.attrs.cooperative)
            return CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED;
        break;
    case NODE_MEMCPY:
        if (a->u.copy.dir != b->u.copy.dir)
            return CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED;
        break;
    case NODE_MEMSET:
        if (a->u.memset.esize != b->u.memset.esize)
            return CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED;
        if ((a->u.memset.height > 1 || b->u.memset.height > 1) &&
            (a->u.memset.width != b->u.memset.width ||
             a->u.memset.height != b->u.memset.height || a->u.memset.pitch != b->u.memset.pitch))
            return CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED;
        break;
    default: break;
    }
    return CU_GRAPH_EXEC_UPDATE_SUCCESS;
}

CUresult td_cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
    static const char fn[] = "cuGraphExecUpdate";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), not_null(info, fn, "result info"));
    if (r == CUDA_SUCCESS) {
        info->result = CU_GRAPH_EXEC_UPDATE_ERROR;
        info->errorNode = info->errorFromNode = NULL;
        CHECKS(r, exec_ok(e, fn), graph_ok(g, fn));
    }
    if (r == CUDA_SUCCESS) {
        node_list *old = &((fake_exec *)(void *)e)->nodes;
        const node_list *now = &((fake_graph *)(void *)g)->nodes;
        CUgraphExecUpdateResult verdict = CU_GRAPH_EXEC_UPDATE_SUCCESS;
        const fake_node *where = NULL;
        if (old->n != now->n)
            verdict = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED; /* errorNode stays NULL */
        for (size_t i = 0; verdict == CU_GRAPH_EXEC_UPDATE_SUCCESS && i < now->n; i++)
            if (!same_deps(old->items[i], now->items[i])) {
                verdict = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
                where = now->items[i];
            }
        for (size_t i = 0; verdict == CU_GRAPH_EXEC_UPDATE_SUCCESS && i < now->n; i++) {
            verdict = update_verdict(old->items[i], now->items[i]);
            if (verdict != CU_GRAPH_EXEC_UPDATE_SUCCESS)
                where = now->items[i];
        }
        node_list fresh;
        if (verdict == CU_GRAPH_EXEC_UPDATE_SUCCESS && !list_clone(&fresh, now)) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (verdict == CU_GRAPH_EXEC_UPDATE_SUCCESS) {
            list_free(old); /* the whole list: same topology, new parameters */
            *old = fresh;
            info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
        } else {
            info->result = verdict;
            info->errorNode = (CUgraphNode)(void *)where;
            r = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE; /* not misuse: callers may try */
        }
    }
    td_unlock();
    return r;
}

/* ---- replay ------------------------------------------------------------------------------ */

/* Node i can run now (lock held): its memory is still in live allocations, its function
 * still loaded, its event still alive. Anything else is misuse: safecuda's replay checks
 * must keep a graph's resources alive (on a GPU it would be an illegal address, sticky). */
static CUresult node_check(const fake_node *n, size_t i, const char *fn)
{
    char what[64];
    switch (n->kind) {
    case NODE_MEMCPY: {
        const int dir = n->u.copy.dir;
        const size_t bytes = n->u.copy.bytes;
        CUresult r = CUDA_SUCCESS;
        snprintf(what, sizeof what, "node %zu (memcpy): its source", i);
        if (dir != COPY_HTOD)
            r = device_range(n->u.copy.src, bytes, fn, what);
        snprintf(what, sizeof what, "node %zu (memcpy): its destination", i);
        if (r == CUDA_SUCCESS && dir != COPY_DTOH)
            r = device_range(n->u.copy.dst, bytes, fn, what);
        if (r == CUDA_SUCCESS && dir != COPY_DTOD) {
            uintptr_t h = dir == COPY_HTOD ? n->u.copy.src : n->u.copy.dst;
            fake_alloc *a = find_alloc(h);
            if (!a || !a->is_host || bytes > a->size - (h - a->base))
                r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                        "node %zu (memcpy): host range [%p, +%zu) is no longer inside a live "
                        "pinned allocation (freed since the capture)",
                        i, (void *)h, bytes);
        }
        return r;
    }
    case NODE_MEMSET:
        snprintf(what, sizeof what, "node %zu (memset): its destination", i);
        return device_range(n->u.memset.dst, n->u.memset.span, fn, what);
    case NODE_KERNEL:
        if (!set_has(&funcs, n->u.kernel.func) || n->u.kernel.func->serial != n->u.kernel.serial)
            return bad(CUDA_ERROR_INVALID_VALUE, fn,
                       "node %zu (kernel): its function was unloaded since the capture", i);
        return CUDA_SUCCESS;
    case NODE_EVENT_WAIT:
        if (!set_has(&events, n->u.wait.event) || n->u.wait.event->serial != n->u.wait.serial)
            return bad(CUDA_ERROR_INVALID_VALUE, fn,
                       "node %zu (event wait): its event was destroyed since the capture", i);
        return CUDA_SUCCESS;
    default: return CUDA_SUCCESS;
    }
}

CUresult td_cuGraphLaunch(CUgraphExec e, CUstream s)
{
    static const char fn[] = "cuGraphLaunch";
    struct fake_capture *cap = NULL;
    node_list run = {0};
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), exec_ok(e, fn), need_stream(s, fn), td_capture_of(s, fn, &cap));
    if (r == CUDA_SUCCESS && cap) {
        char d[160];
        invalidate(cap, "a graph was launched into it");
        r = bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn,
                "graph launch into stream %p of %s: child graph nodes are not modelled by the "
                "test device; the capture is invalidated",
                (void *)s, describe(cap, d, sizeof d));
    }
    /* The launch works on its own copy: the executable graph may be updated or destroyed
     * while a host function of this launch runs. */
    if (r == CUDA_SUCCESS && !list_clone(&run, &((fake_exec *)(void *)e)->nodes))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    int kernels = 0;
    for (size_t i = 0; r == CUDA_SUCCESS && i < run.n; i++) {
        r = node_check(run.items[i], i, fn);
        kernels += run.items[i]->kind == NODE_KERNEL;
    }
    if (r == CUDA_SUCCESS && kernels && !accept_launches) {
        refused_launches++; /* nothing runs: a graph with kernels never pretends */
        r = CUDA_ERROR_NOT_SUPPORTED;
    }
    for (size_t i = 0; r == CUDA_SUCCESS && i < run.n; i++) {
        const fake_node *n = run.items[i];
        r = node_check(n, i, fn); /* again: a host function may have freed memory */
        if (r != CUDA_SUCCESS)
            break;
        switch (n->kind) {
        case NODE_MEMCPY:
            memmove((void *)n->u.copy.dst, (const void *)n->u.copy.src, n->u.copy.bytes);
            break;
        case NODE_MEMSET:
            fill_rows(n->u.memset.dst, n->u.memset.pitch, n->u.memset.value, n->u.memset.esize,
                      n->u.memset.width, n->u.memset.height);
            break;
        case NODE_HOST:
            td_unlock();
            n->u.host.fn(n->u.host.user);
            td_lock();
            break;
        default: break; /* kernels (accepted) are skipped; waits are satisfied at once */
        }
    }
    list_free(&run);
    td_unlock();
    return r;
}
