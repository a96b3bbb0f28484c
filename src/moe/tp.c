/* The MoE layer's tensor parallelism (sc_moe_desc.tp_comm): the communicator's checks when the
 * layer is made and before each forward enqueues anything, and the all-reduce (or
 * reduce-scatter) of the rank's partial output at the end of a forward. The layer keeps the communicator's handle (not a
 * registry reference, which would make sc_comm_destroy wait for the layer): a forward after
 * the communicator's destroy finds the handle stale. */
#include <stdio.h>

#include "comm/comm.h"
#include "moe/tp.h"

sc_status sci_moe_comm_acquire(sc_comm h, const char *field, const char *fn, sci_comm **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_COMM, h.id, fn, &obj);
    if (s != SC_OK) {
        sci_error_append(" (the layer's desc->%s)", field);
        return s;
    }
    sci_comm *c = (sci_comm *)obj;
    if ((s = sci_comm_check_alive(c, fn)) != SC_OK) {
        sci_error_append(" (the layer's desc->%s)", field);
        sci_registry_release(obj);
        return s;
    }
    *out = c;
    return SC_OK;
}

sc_status sci_moe_comm_check(sc_comm h, const char *field, const char *layer, int max_ranks,
                             const sci_context *ctx, const char *fn, int *rank, int *nranks)
{
    sci_comm *c = NULL;
    sc_status s = sci_moe_comm_acquire(h, field, fn, &c);
    if (s != SC_OK)
        return s;
    char what[256], takes[32];
    sci_comm_describe(c, what, sizeof what);
    if (max_ranks)
        snprintf(takes, sizeof takes, "2 .. %d", max_ranks);
    else
        snprintf(takes, sizeof takes, "2 or more");
    if (c->ctx != ctx)
        s = sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                     "desc->%s (%s) belongs to another context than the layer (device %d): "
                     "a rank's layer is made on its communicator's context",
                     field, what, ctx->device);
    else if (c->nranks < 2 || (max_ranks && c->nranks > max_ranks))
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "desc->%s (%s) has %d rank%s: %s layer takes %s (leave %s zero for a "
                     "layer on one GPU)",
                     field, what, c->nranks, c->nranks == 1 ? "" : "s", layer, takes, field);
    *rank = c->rank;
    *nranks = c->nranks;
    sci_registry_release(&c->obj);
    return s;
}

sc_status sci_moe_tp_check(const sc_moe_desc *d, const sci_context *ctx, const char *fn,
                           int *rank, int *nranks)
{
    *rank = 0;
    *nranks = 1;
    if (!d->tp_comm.id)
        return SC_OK;
    sc_status s = sci_moe_comm_check(d->tp_comm, "tp_comm", "a tensor-parallel", 0, ctx, fn,
                                     rank, nranks);
    if (s != SC_OK) {
        *rank = 0;
        *nranks = 1;
    }
    return s;
}

sc_status sci_moe_tp_ready(const sc_moe_desc *d, const char *fn)
{
    if (!d->tp_comm.id)
        return SC_OK;
    sci_comm *c = NULL;
    sc_status s = sci_moe_comm_acquire(d->tp_comm, "tp_comm", fn, &c);
    if (s == SC_OK)
        sci_registry_release(&c->obj);
    return s;
}

sc_status sci_moe_tp_reduce(const sc_moe_desc *d, sc_stream stream, sc_view out, sc_view partial)
{
    if (!d->tp_comm.id)
        return SC_OK;
    if (d->tp_output == SC_MOE_TP_REDUCE_SCATTER) {
        sc_status s = sc_comm_reduce_scatter(d->tp_comm, stream, out, partial, SC_REDUCE_SUM);
        if (s != SC_OK)
            sci_error_append(" (the reduce-scatter of the rank's partial output over "
                             "desc->tp_comm)");
        return s;
    }
    sc_status s = sc_comm_all_reduce(d->tp_comm, stream, out, partial, SC_REDUCE_SUM);
    if (s != SC_OK)
        sci_error_append(" (the all-reduce of the rank's partial output over desc->tp_comm)");
    return s;
}
