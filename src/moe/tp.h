/* The MoE layer's tensor parallelism (internal; src/moe/tp.c): include/safecuda/moe.h's
 * sc_moe_desc.tp_comm says what it computes. Each function does nothing without a tp_comm. */
#ifndef SAFECUDA_MOE_TP_H
#define SAFECUDA_MOE_TP_H

#include "comm/comm.h"
#include "core/context.h"
#include "safecuda/moe.h"

/* The communicator of the layer's desc->`field`, acquired (a registry reference) and alive,
 * or a status whose message names the field. */
sc_status sci_moe_comm_acquire(sc_comm h, const char *field, const char *fn, sci_comm **out);
/* At create: the communicator h of the layer's desc->`field` alive, of ctx, of 2 or more
 * ranks (up to max_ranks when not 0; `layer` names the kind in the message: "a
 * tensor-parallel"); its rank and size come back. */
sc_status sci_moe_comm_check(sc_comm h, const char *field, const char *layer, int max_ranks,
                             const sci_context *ctx, const char *fn, int *rank, int *nranks);
/* At create: tp_comm alive, of ctx, of 2 or more ranks; its rank and size come back (0 and 1
 * without one). */
sc_status sci_moe_tp_check(const sc_moe_desc *d, const sci_context *ctx, const char *fn,
                           int *rank, int *nranks);
/* Before a forward enqueues anything: tp_comm not destroyed, not aborted. */
sc_status sci_moe_tp_ready(const sc_moe_desc *d, const char *fn);
/* The sum over the ranks of each rank's partial [T, H] into out on stream: all-reduced (out
 * is partial: in place), or reduce-scattered (out: the rank's T / N rows). */
sc_status sci_moe_tp_reduce(const sc_moe_desc *d, sc_stream stream, sc_view out, sc_view partial);

#endif
