/* CUDA graphs: capture into a graph, instantiate, checked replay, update.
 *
 * A graph and an executable graph are registry objects like any other (handle, creation
 * site, leak report). Each keeps the list of objects its work uses (stream/capture.h:
 * handle ids with the union of their accesses); a launch acquires every one of them
 * (a destroyed one refuses the launch, nothing runs), orders itself with their trackers
 * as one operation (stream/order.h), launches, and records its uses, exactly as a checked
 * kernel launch does with its views. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "graph/graph.h"
#include "memory/buffer.h"
#include "stream/capture.h"

typedef struct sci_graph {
    sci_object obj;
    sci_context *ctx;
    CUgraph cu;
    size_t nodes;
    sci_capture_list list;
} sci_graph;

typedef struct sci_graph_exec {
    sci_object obj;
    sci_context *ctx;
    pthread_mutex_t lock; /* cu and list: an update replaces them under a launch's feet */
    CUgraphExec cu;
    size_t nodes;
    sci_capture_list list;
    char from[96];        /* "the graph captured at app.c:40" */
} sci_graph_exec;

static sc_status graph_destroy(sci_object *obj, const char *fn);
static sc_status exec_destroy(sci_object *obj, const char *fn);

/* ---- what a graph remembers ---------------------------------------------------------------- */

static void count_kinds(const sci_capture_list *l, sc_graph_props *p)
{
    for (size_t i = 0; i < l->n; i++) {
        switch (sci_id_kind(l->entries[i].id)) {
        case SCI_KIND_BUFFER: p->buffers++; break;
        case SCI_KIND_HOST_BUFFER: p->host_buffers++; break;
        case SCI_KIND_KERNEL: p->kernels++; break;
        default: break;
        }
    }
}

static bool list_copy(sci_capture_list *dst, const sci_capture_list *src)
{
    sci_capture_list l = {0};
    for (size_t i = 0; i < src->n; i++)
        if (!sci_capture_list_add(&l, src->entries[i].id, src->entries[i].mode)) {
            sci_capture_list_free(&l);
            return false;
        }
    *dst = l;
    return true;
}

/* The objects of a list, acquired (all or none). A destroyed one: SC_ERR_STALE_HANDLE
 * naming it (the registry's message) and whose graph it is (owner). */
static sc_status acquire_all(const sci_capture_list *l, sci_object **objs, const char *owner,
                             const char *fn)
{
    for (size_t i = 0; i < l->n; i++) {
        sc_status s = sci_registry_acquire(sci_id_kind(l->entries[i].id), l->entries[i].id, fn,
                                           &objs[i]);
        if (s != SC_OK) {
            sci_error_append(": it is used by %s; nothing was launched", owner);
            while (i-- > 0)
                sci_registry_release(objs[i]);
            return s;
        }
    }
    return SC_OK;
}

static void release_all(sci_object **objs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sci_registry_release(objs[i]);
}

/* The tracker of a remembered object (NULL for kernels). */
static sci_tracker *tracker_of(sci_object *obj)
{
    if (obj->kind == SCI_KIND_BUFFER)
        return &((sci_buffer *)obj)->tracker;
    if (obj->kind == SCI_KIND_HOST_BUFFER)
        return &((sci_host_buffer *)obj)->tracker;
    return NULL;
}

/* ---- kinds ----------------------------------------------------------------------------------- */

static void describe_graph(const sci_object *obj, sc_object_info *info)
{
    const sci_graph *g = (const sci_graph *)obj;
    snprintf(info->detail, sizeof info->detail, "%zu nodes, %zu objects used", g->nodes,
             g->list.n);
}

static void describe_exec(const sci_object *obj, sc_object_info *info)
{
    const sci_graph_exec *e = (const sci_graph_exec *)obj;
    snprintf(info->detail, sizeof info->detail, "%zu nodes, %zu objects used", e->nodes,
             e->list.n);
}

static const sci_kind_ops graph_ops = {"graph", describe_graph, graph_destroy};
static const sci_kind_ops exec_ops = {"executable graph", describe_exec, exec_destroy};

__attribute__((constructor)) static void register_graph_kinds(void)
{
    sci_registry_set_ops(SCI_KIND_GRAPH, &graph_ops);
    sci_registry_set_ops(SCI_KIND_GRAPH_EXEC, &exec_ops);
}

/* ---- capture ------------------------------------------------------------------------------------ */

sc_status sc_stream_begin_capture(sc_stream stream, const sc_capture_desc *desc)
{
    static const char fn[] = "sc_stream_begin_capture";
    sc_capture_desc d = desc ? *desc : (sc_capture_desc){0};
    if ((unsigned)d.mode > SC_CAPTURE_RELAXED)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->mode = %d", (int)d.mode);
    sci_stream *st = NULL;
    sc_status s = sci_stream_acquire(stream, fn, &st);
    if (s != SC_OK)
        return s;
    /* SC_CAPTURE_* are CUDA's capture modes, in CUDA's order. */
    s = sci_capture_begin(st, (int)d.mode, fn);
    sci_stream_release(st);
    return s;
}

sc_status sc_stream_is_capturing(sc_stream stream, bool *capturing)
{
    static const char fn[] = "sc_stream_is_capturing";
    SCI_CHECK_PTR(fn, capturing);
    sci_stream *st = NULL;
    sc_status s = sci_stream_acquire(stream, fn, &st);
    if (s != SC_OK)
        return s;
    *capturing = sci_stream_is_capturing_now(st);
    sci_stream_release(st);
    return SC_OK;
}

sc_status sc_stream_end_capture_at(sc_stream stream, sc_graph *graph, const char *file,
                                   int line)
{
    static const char fn[] = "sc_stream_end_capture";
    SCI_CHECK_PTR(fn, graph);
    graph->id = 0;
    sci_stream *st = NULL;
    sc_status s = sci_stream_acquire(stream, fn, &st);
    if (s != SC_OK)
        return s;
    CUgraph cu = NULL;
    sci_capture_list list = {0};
    s = sci_capture_end(st, &cu, &list, fn);
    sci_graph *g = NULL;
    if (s == SC_OK && !(g = calloc(1, sizeof *g)))
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a graph record");
    if (s == SC_OK) {
        g->ctx = st->ctx;
        g->cu = cu;
        g->list = list;
        CUresult r = sci_cuGraphGetNodes(cu, NULL, &g->nodes);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(st->ctx, r, fn, "cuGraphGetNodes failed");
        char label[64];
        snprintf(label, sizeof label, "capture of '%.48s'", st->obj.label);
        if (s == SC_OK)
            s = sci_registry_insert(&g->obj, SCI_KIND_GRAPH, st->ctx->obj.id, label, file, line,
                                    fn);
        if (s == SC_OK)
            graph->id = g->obj.id;
    }
    if (s != SC_OK) {
        if (cu)
            sci_cuGraphDestroy(cu);
        sci_capture_list_free(&list);
        free(g);
    }
    sci_stream_release(st);
    return s;
}

/* ---- graphs ------------------------------------------------------------------------------------ */

static sc_status graph_acquire(sc_graph h, const char *fn, sci_graph **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_GRAPH, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_graph *g = (sci_graph *)obj;
    if ((s = sci_context_enter(g->ctx, fn)) != SC_OK) {
        sci_registry_release(obj);
        return s;
    }
    *out = g;
    return SC_OK;
}

/* The graph's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status graph_destroy(sci_object *obj, const char *fn)
{
    sci_graph *g = (sci_graph *)obj;
    sci_release rl;
    sci_release_begin(&rl, g->ctx, fn);
    sci_release_make_current(&rl);
    sci_release_check(&rl, sci_cuGraphDestroy(g->cu), "cuGraphDestroy failed");
    sci_capture_list_free(&g->list);
    free(g);
    return sci_release_end(&rl);
}

sc_status sc_graph_destroy(sc_graph graph)
{
    return sci_object_destroy(SCI_KIND_GRAPH, graph.id, NULL, "sc_graph_destroy");
}

sc_status sc_graph_info(sc_graph graph, sc_graph_props *props)
{
    static const char fn[] = "sc_graph_info";
    SCI_CHECK_PTR(fn, props);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_GRAPH, graph.id, fn, &obj);
    if (s != SC_OK)
        return s;
    const sci_graph *g = (const sci_graph *)obj;
    memset(props, 0, sizeof *props);
    props->nodes = g->nodes;
    count_kinds(&g->list, props);
    sci_registry_release(obj);
    return SC_OK;
}

/* ---- executable graphs ------------------------------------------------------------------------ */

static void describe_from(const sci_graph *g, char *buf, size_t size)
{
    snprintf(buf, size, "the graph captured at %s:%d", sci_basename(g->obj.file), g->obj.line);
}

/* Check that every object g uses is alive (for instantiate and update). */
static sc_status check_alive(const sci_graph *g, const char *owner, const char *fn)
{
    for (size_t i = 0; i < g->list.n; i++) {
        sci_object *obj = NULL;
        sc_status s = sci_registry_acquire(sci_id_kind(g->list.entries[i].id),
                                           g->list.entries[i].id, fn, &obj);
        if (s != SC_OK) {
            sci_error_append(": it is used by %s", owner);
            return s;
        }
        sci_registry_release(obj);
    }
    return SC_OK;
}

sc_status sc_graph_instantiate_at(sc_graph graph, sc_graph_exec *exec, const char *file,
                                  int line)
{
    static const char fn[] = "sc_graph_instantiate";
    SCI_CHECK_PTR(fn, exec);
    exec->id = 0;
    sci_graph *g = NULL;
    sc_status s = graph_acquire(graph, fn, &g);
    if (s != SC_OK)
        return s;
    sci_graph_exec *e = calloc(1, sizeof *e);
    char from[96];
    describe_from(g, from, sizeof from);
    if (!e)
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate an executable graph");
    else if ((s = check_alive(g, from, fn)) == SC_OK && !list_copy(&e->list, &g->list))
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot copy the graph's objects");
    if (s == SC_OK) {
        CUresult r = sci_cuGraphInstantiateWithFlags(&e->cu, g->cu, 0);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(g->ctx, r, fn, "cuGraphInstantiateWithFlags(%s) failed",
                                    from);
    }
    if (s == SC_OK) {
        e->ctx = g->ctx;
        e->nodes = g->nodes;
        snprintf(e->from, sizeof e->from, "%s", from);
        pthread_mutex_init(&e->lock, NULL);
        s = sci_registry_insert(&e->obj, SCI_KIND_GRAPH_EXEC, g->ctx->obj.id, g->obj.label,
                                file, line, fn);
        if (s != SC_OK) {
            s = sci_context_cleanup_cu(g->ctx, s, sci_cuGraphExecDestroy(e->cu),
                                       "cuGraphExecDestroy");
            pthread_mutex_destroy(&e->lock);
        }
    }
    if (s == SC_OK) {
        exec->id = e->obj.id;
    } else if (e) {
        sci_capture_list_free(&e->list);
        free(e);
    }
    sci_registry_release(&g->obj);
    return s;
}

static sc_status exec_acquire(sc_graph_exec h, const char *fn, sci_graph_exec **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_GRAPH_EXEC, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_graph_exec *e = (sci_graph_exec *)obj;
    if ((s = sci_context_enter(e->ctx, fn)) != SC_OK) {
        sci_registry_release(obj);
        return s;
    }
    *out = e;
    return SC_OK;
}

/* The executable graph's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status exec_destroy(sci_object *obj, const char *fn)
{
    sci_graph_exec *e = (sci_graph_exec *)obj;
    sci_release rl;
    sci_release_begin(&rl, e->ctx, fn);
    sci_release_make_current(&rl);
    /* A launch in flight is not cut short: the driver frees the exec when it completes. */
    sci_release_check(&rl, sci_cuGraphExecDestroy(e->cu), "cuGraphExecDestroy failed");
    sci_capture_list_free(&e->list);
    pthread_mutex_destroy(&e->lock);
    free(e);
    return sci_release_end(&rl);
}

sc_status sc_graph_exec_destroy(sc_graph_exec exec)
{
    return sci_object_destroy(SCI_KIND_GRAPH_EXEC, exec.id, NULL, "sc_graph_exec_destroy");
}

sc_status sc_graph_exec_info(sc_graph_exec exec, sc_graph_props *props)
{
    static const char fn[] = "sc_graph_exec_info";
    SCI_CHECK_PTR(fn, props);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_GRAPH_EXEC, exec.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_graph_exec *e = (sci_graph_exec *)obj;
    memset(props, 0, sizeof *props);
    pthread_mutex_lock(&e->lock);
    props->nodes = e->nodes;
    count_kinds(&e->list, props);
    pthread_mutex_unlock(&e->lock);
    sci_registry_release(obj);
    return SC_OK;
}

CUgraphExec sci_graph_exec_cu(sc_graph_exec exec)
{
    sci_object *obj = NULL;
    if (sci_registry_acquire(SCI_KIND_GRAPH_EXEC, exec.id, "sci_graph_exec_cu", &obj) != SC_OK)
        return NULL;
    sci_graph_exec *e = (sci_graph_exec *)obj;
    pthread_mutex_lock(&e->lock);
    CUgraphExec cu = e->cu;
    pthread_mutex_unlock(&e->lock);
    sci_registry_release(obj);
    return cu;
}

/* The launch, with every remembered object acquired in objs and exec->lock held. */
static sc_status launch_checked(sci_graph_exec *e, sci_stream *st, sci_object **objs,
                                sci_access *acc, const char *fn)
{
    size_t n = 0;
    for (size_t i = 0; i < e->list.n; i++) {
        sci_tracker *t = tracker_of(objs[i]);
        if (t)
            acc[n++] = (sci_access){t, e->list.entries[i].mode ? e->list.entries[i].mode
                                                               : SCI_READ_WRITE};
    }
    struct sci_capture *cap = NULL;
    sc_status s = sci_access_begin(acc, n, st, e->ctx->tracking, fn, &cap);
    if (s != SC_OK)
        return s;
    CUresult r = cap ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : sci_cuGraphLaunch(e->cu, st->cu);
    s = sci_access_end(acc, n, st, cap, r == CUDA_SUCCESS, fn);
    if (r != CUDA_SUCCESS)
        s = sci_context_fail_cu(e->ctx, r, fn, "cuGraphLaunch of the executable graph "
                                "instantiated at %s:%d from %s failed",
                                sci_basename(e->obj.file), e->obj.line, e->from);
    return s;
}

sc_status sc_graph_launch(sc_stream stream, sc_graph_exec exec)
{
    static const char fn[] = "sc_graph_launch";
    sci_graph_exec *e = NULL;
    sc_status s = exec_acquire(exec, fn, &e);
    if (s != SC_OK)
        return s;
    sci_stream *st = NULL;
    if ((s = sci_stream_resolve(stream, e->ctx, fn, &st)) != SC_OK) {
        sci_registry_release(&e->obj);
        return s;
    }
    if ((s = sci_capture_refuse_stream(st, fn, "launching an executable graph")) != SC_OK)
        goto out;
    pthread_mutex_lock(&e->lock);
    enum { ON_STACK = 32 };
    sci_object *stack_objs[ON_STACK];
    sci_access stack_acc[ON_STACK];
    sci_object **objs = stack_objs;
    sci_access *acc = stack_acc;
    if (e->list.n > ON_STACK) {
        objs = malloc(e->list.n * sizeof *objs);
        acc = malloc(e->list.n * sizeof *acc);
    }
    if (!objs || !acc) {
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    } else {
        char owner[200];
        snprintf(owner, sizeof owner, "the executable graph instantiated at %s:%d from %s",
                 sci_basename(e->obj.file), e->obj.line, e->from);
        if ((s = acquire_all(&e->list, objs, owner, fn)) == SC_OK) {
            /* A captured collective's communicator must not have been aborted. */
            for (size_t i = 0; i < e->list.n && s == SC_OK; i++)
                if ((s = sci_comm_check_usable(objs[i], fn)) != SC_OK)
                    sci_error_append(": it is used by %s; nothing was launched", owner);
            if (s == SC_OK)
                s = launch_checked(e, st, objs, acc, fn);
            release_all(objs, e->list.n);
        }
    }
    if (objs != stack_objs)
        free(objs);
    if (acc != stack_acc)
        free(acc);
    pthread_mutex_unlock(&e->lock);
out:
    sci_stream_release(st);
    sci_registry_release(&e->obj);
    return s;
}

/* Replace e's executable with one instantiated from g (the update could not be made in
 * place). */
static sc_status reinstantiate(sci_graph_exec *e, const sci_graph *g, const char *fn)
{
    CUgraphExec fresh = NULL;
    CUresult r = sci_cuGraphInstantiateWithFlags(&fresh, g->cu, 0);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(e->ctx, r, fn, "cuGraphInstantiateWithFlags failed");
    /* Launches in flight of the old one finish first: the driver frees it then. */
    r = sci_cuGraphExecDestroy(e->cu);
    e->cu = fresh;
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(e->ctx, r, fn, "cuGraphExecDestroy of the replaced graph "
                                   "failed");
    return SC_OK;
}

sc_status sc_graph_exec_update(sc_graph_exec exec, sc_graph graph,
                               sc_graph_update_result *result)
{
    static const char fn[] = "sc_graph_exec_update";
    sci_graph_exec *e = NULL;
    sc_status s = exec_acquire(exec, fn, &e);
    if (s != SC_OK)
        return s;
    sci_graph *g = NULL;
    if ((s = graph_acquire(graph, fn, &g)) != SC_OK) {
        sci_registry_release(&e->obj);
        return s;
    }
    sci_capture_list list = {0};
    char from[96];
    describe_from(g, from, sizeof from);
    if (g->ctx != e->ctx)
        s = sci_fail(SC_ERR_WRONG_CONTEXT, fn, "%s belongs to another context than the "
                     "executable graph instantiated at %s:%d", from,
                     sci_basename(e->obj.file), e->obj.line);
    else if ((s = check_alive(g, from, fn)) == SC_OK && !list_copy(&list, &g->list))
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot copy the graph's objects");
    if (s == SC_OK) {
        pthread_mutex_lock(&e->lock);
        CUgraphExecUpdateResultInfo info;
        memset(&info, 0, sizeof info);
        CUresult r = sci_cuGraphExecUpdate(e->cu, g->cu, &info);
        sc_graph_update_result how = SC_GRAPH_UPDATED;
        if (r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) {
            how = SC_GRAPH_REINSTANTIATED;
            s = reinstantiate(e, g, fn);
        } else if (r != CUDA_SUCCESS) {
            s = sci_context_fail_cu(e->ctx, r, fn, "cuGraphExecUpdate failed");
        }
        if (s == SC_OK) {
            sci_capture_list_free(&e->list);
            e->list = list;
            memset(&list, 0, sizeof list);
            e->nodes = g->nodes;
            snprintf(e->from, sizeof e->from, "%s", from);
            if (result)
                *result = how;
        }
        pthread_mutex_unlock(&e->lock);
    }
    sci_capture_list_free(&list);
    sci_registry_release(&g->obj);
    sci_registry_release(&e->obj);
    return s;
}
