/* The MoE layer's expert parallelism (internal; src/moe/ep.c): include/safecuda/moe.h's
 * sc_moe_desc.ep_comm says what it computes. An expert-parallel layer is a sci_moe that
 * routes over all E experts (made with SCI_MOE_MAKE_ROUTE_ONLY) and holds, in m->ep, the
 * communicator, the expert map, a layer over the rank's experts (SCI_MOE_MAKE_EP_EXPERTS)
 * and the buffers of the exchange. */
#ifndef SAFECUDA_MOE_EP_H
#define SAFECUDA_MOE_EP_H

#include "moe/layer.h"

/* Make the expert-parallel layer of desc (desc->ep_comm set; desc checked by
 * sci_moe_check_desc), not published. */
sc_status sci_moe_ep_make(sci_context *c, const sc_moe_desc *desc, const char *fn,
                          sci_moe **out);
/* Free m->ep (the rank's experts' layer, the buffers: stream-ordered); m itself stays. */
sc_status sci_moe_ep_free(sci_moe *m, const char *fn);
/* sc_moe_forward on an expert-parallel layer. */
sc_status sci_moe_ep_forward(sci_moe *m, sc_stream stream, sc_view x, sc_view out,
                             const sc_moe_forward_desc *opts, const char *fn);
/* sc_moe_reserve's part for m->ep: room for forwards of up to max_tokens tokens. */
sc_status sci_moe_ep_reserve(sci_moe *m, sc_stream stream, uint64_t max_tokens, const char *fn);
/* A leak report's detail of an expert-parallel layer. */
void sci_moe_ep_describe(const sci_moe *m, char *buf, size_t size);
/* The bytes of m->ep's buffers and of its experts' layer's workspace. */
uint64_t sci_moe_ep_workspace_bytes(sci_moe *m);

#endif
