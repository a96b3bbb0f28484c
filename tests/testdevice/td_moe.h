/* What the MoE layer's test-device tests share: zeroed buffers, and the forwards of every
 * routing path over T tokens. Include after ../test.h; `ctx` is the test's context. */
#ifndef SAFECUDA_TESTS_TD_MOE_H
#define SAFECUDA_TESTS_TD_MOE_H

#include <stdint.h>
#include <stdio.h>

#include "safecuda/moe.h"

static sc_buffer td_moe_buf(sc_context c, sc_dtype t, uint64_t n)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(c, &(sc_buffer_desc){.dtype = t, .count = n, .zero = true}, &b) ==
            SC_OK);
    return b;
}

/* Forwards over T tokens: the layer's routing (with its outputs, then accumulating), the
 * routing alone, then the caller's routing from that (checked, accumulating), and a
 * routing check. A failure names `what` and T. */
static void td_moe_exercise(sc_context c, sc_moe layer, const sc_moe_desc *d, uint64_t T,
                            const char *what)
{
    const uint64_t H = (uint64_t)d->hidden, k = (uint64_t)d->top_k;
    sc_buffer x = td_moe_buf(c, SC_BF16, T * H), out = td_moe_buf(c, SC_BF16, T * H);
    sc_buffer ids = td_moe_buf(c, SC_I32, T * k), wts = td_moe_buf(c, SC_F32, T * k);
    const int before = test_failures;
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(x), sc_view_of(out),
                            &(sc_moe_forward_desc){.expert_ids = sc_view_of(ids),
                                                   .expert_weights = sc_view_of(wts)}));
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(x), sc_view_of(out),
                            &(sc_moe_forward_desc){.accumulate = true}));
    CHECK_OK(sc_moe_route(SC_DEFAULT_STREAM, layer, sc_view_of(x), sc_view_of(ids),
                          sc_view_of(wts)));
    CHECK_OK(sc_moe_forward(SC_DEFAULT_STREAM, layer, sc_view_of(x), sc_view_of(out),
                            &(sc_moe_forward_desc){.routing_ids = sc_view_of(ids),
                                                   .routing_weights = sc_view_of(wts),
                                                   .check_routing = true, .accumulate = true}));
    CHECK_OK(sc_moe_routing_check(SC_DEFAULT_STREAM, layer));
    if (test_failures != before)
        fprintf(stderr, "  (%s, T = %llu): %s\n", what, (unsigned long long)T, sc_last_error());
    const sc_buffer all[] = {x, out, ids, wts};
    for (int i = 0; i < 4; i++)
        CHECK_OK(sc_buffer_destroy(all[i]));
}

#endif
