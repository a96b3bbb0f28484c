/* The MoE layer's forward as launches (internal): the profile's timed steps, and the
 * launches of a plan (src/moe/plan.c) in order on a locked, large enough workspace. moe.c
 * checks and locks; issue.c only issues what the plan decides. */
#ifndef SAFECUDA_MOE_ISSUE_H
#define SAFECUDA_MOE_ISSUE_H

#include "moe/layer.h"

/* The steps of a forward, timed when a profile is asked for: an event before each step and
 * one after the last. */
typedef struct sci_moe_steps {
    sc_moe_profile *prof;
    sc_stream stream;
    sc_context ctx;
    sc_event ev[SC_MOE_MAX_STEPS + 1];
    int n;
} sci_moe_steps;

/* The next step of a profiled forward begins: an event recorded on its stream (nothing
 * without a profile; steps past SC_MOE_MAX_STEPS are not timed). */
sc_status sci_moe_step(sci_moe_steps *st, const char *name);
/* Close the last step, wait, and fill the profile. Destroys the events either way. */
sc_status sci_moe_steps_finish(sci_moe_steps *st, sc_status s);

/* A forward being issued: the layer (its workspace locked), the plan, the stream, the
 * checked views of x and out, the routing's ids and weights (the workspace's, or the
 * caller's), and the profile's steps. */
typedef struct sci_moe_fwd {
    const sci_moe *m;
    const sci_moe_plan *p;
    sc_stream stream;
    sc_view x, out, ids, weights;
    sc_view tp_out; /* reduce-scattered tensor parallel: the caller's out (out: the partial) */
    uint64_t shared_rows; /* the tokens with the shared expert: all (T) but in an expert-
                           * parallel layer's experts, where the first T rows are its own */
    sc_view xq, xs;       /* fp8 experts: x's rows already quantized (e4m3 [T, H] and f32
                           * [T, H/128], an expert-parallel layer's dispatch), or none */
    bool accumulate;
    sci_moe_steps *st;
} sci_moe_fwd;

/* The plan's launches in order, on the workspace (locked, large enough). */
sc_status sci_moe_issue(sci_moe_fwd *f, const sc_moe_forward_desc *opts);

/* The routing alone (sc_moe_route): the forward's own one-launch routing and a copy of its
 * ids and weights into f->ids and f->weights, or the steps' top-k writing them. */
sc_status sci_moe_issue_routing(sci_moe_fwd *f);

/* Whether views a and b are the same elements of the same buffer. */
bool sci_moe_same_view(sc_view a, sc_view b);

#endif
