/* The realistic program the fault tests run against the test device, one public call a
 * step, so a run can stop at its first failing step and clean up what exists.
 *
 * create a context, two streams, three buffers and a pinned host buffer; copy in from
 * pageable and from pinned memory; fill; copy device to device across streams; an event
 * orders the streams; load a hand-written PTX module and launch a kernel with checked
 * arguments; copy out (pinned and pageable) and check the data; free everything; destroy
 * the context. */
#ifndef SAFECUDA_TESTS_FAULT_PROGRAM_H
#define SAFECUDA_TESTS_FAULT_PROGRAM_H

#include <stdbool.h>
#include <string.h>

#include "td_ptx.h"
#include "safecuda.h"

enum { FP_N = 1024 };

typedef enum fp_object {
    FP_CTX, FP_S0, FP_S1, FP_A, FP_B, FP_C, FP_H, FP_E, FP_M, FP_OBJECTS
} fp_object;

typedef struct fp_world {
    sc_context ctx;
    sc_stream s0, s1;
    sc_buffer a, b, c;
    sc_host_buffer h;
    sc_event e;
    sc_module m;
    sc_kernel k;
    sc_launch_desc cfg;
    bool exists[FP_OBJECTS];    /* created and not yet handed to its destroy function */
    bool destroyed[FP_OBJECTS]; /* handed to its destroy function (gone, whatever it said) */
    float in[FP_N], in2[FP_N], out[FP_N];
    int data_errors;
} fp_world;

static const char *const fp_step_fn[] = {
    "sc_context_create",      "sc_stream_create",        "sc_stream_create",
    "sc_buffer_create",       "sc_buffer_create",        "sc_buffer_create",
    "sc_host_buffer_create",  "sc_host_buffer_write",    "sc_copy_from_host",
    "sc_copy_from_host_buffer", "sc_fill",               "sc_copy",
    "sc_event_create",        "sc_event_record",         "sc_stream_wait",
    "sc_module_load_image",   "sc_kernel_get",           "sc_launch_config_for",
    "sc_kernel_launch",       "sc_copy_to_host_buffer",  "sc_host_buffer_read",
    "sc_copy_to_host",        "sc_context_memory",       "sc_context_synchronize",
    "sc_module_destroy",      "sc_event_destroy",        "sc_buffer_destroy",
    "sc_buffer_destroy",      "sc_buffer_destroy",       "sc_host_buffer_destroy",
    "sc_stream_destroy",      "sc_stream_destroy",       "sc_context_trim",
    "sc_context_destroy",
};
enum { FP_STEPS = sizeof fp_step_fn / sizeof fp_step_fn[0] };

static void fp_init(fp_world *w)
{
    memset(w, 0, sizeof *w);
    for (int i = 0; i < FP_N; i++) {
        w->in[i] = (float)i;
        w->in2[i] = 1000.0f + (float)i;
    }
}

static sc_status fp_created(fp_world *w, fp_object o, sc_status s)
{
    if (s == SC_OK)
        w->exists[o] = true;
    return s;
}

static sc_status fp_destroy(fp_world *w, fp_object o)
{
    w->exists[o] = false;
    w->destroyed[o] = true;
    switch (o) {
    case FP_CTX: return sc_context_destroy(w->ctx);
    case FP_S0: return sc_stream_destroy(w->s0);
    case FP_S1: return sc_stream_destroy(w->s1);
    case FP_A: return sc_buffer_destroy(w->a);
    case FP_B: return sc_buffer_destroy(w->b);
    case FP_C: return sc_buffer_destroy(w->c);
    case FP_H: return sc_host_buffer_destroy(w->h);
    case FP_E: return sc_event_destroy(w->e);
    case FP_M: return sc_module_destroy(w->m); /* its kernel goes with it */
    default: return SC_ERR_INTERNAL;
    }
}

/* Run step i. */
static sc_status fp_step(fp_world *w, int i)
{
    const uint64_t bytes = FP_N * sizeof(float);
    float one = 1.0f;
    sc_status s;
    switch (i) {
    case 0: return fp_created(w, FP_CTX, sc_context_create(NULL, &w->ctx));
    case 1:
        return fp_created(w, FP_S0, sc_stream_create(w->ctx, &(sc_stream_desc){.label = "s0"},
                                                     &w->s0));
    case 2:
        return fp_created(w, FP_S1,
                          sc_stream_create(w->ctx, &(sc_stream_desc){.priority = -1,
                                                                     .label = "s1"},
                                           &w->s1));
    case 3:
        return fp_created(w, FP_A,
                          sc_buffer_create(w->ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = FP_N,
                                                                     .label = "a", .stream = w->s0},
                                           &w->a));
    case 4:
        return fp_created(w, FP_B,
                          sc_buffer_create(w->ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = FP_N,
                                                                     .label = "b", .zero = true,
                                                                     .stream = w->s1},
                                           &w->b));
    case 5:
        return fp_created(w, FP_C,
                          sc_buffer_create(w->ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = FP_N,
                                                                     .label = "c"},
                                           &w->c));
    case 6:
        return fp_created(w, FP_H,
                          sc_host_buffer_create(w->ctx,
                                                &(sc_host_buffer_desc){.bytes = bytes,
                                                                       .label = "pinned"},
                                                &w->h));
    case 7: return sc_host_buffer_write(w->h, 0, w->in2, bytes);
    case 8: return sc_copy_from_host(w->s0, sc_view_of(w->a), w->in, bytes);
    case 9: return sc_copy_from_host_buffer(w->s1, sc_view_of(w->c), w->h, 0);
    case 10: return sc_fill(w->s1, sc_view_of(w->b), &one);
    case 11:
        return sc_copy(w->s0, (sc_view){w->b, 0, FP_N / 2}, (sc_view){w->a, FP_N / 2, FP_N / 2});
    case 12:
        return fp_created(w, FP_E,
                          sc_event_create(w->ctx, &(sc_event_desc){.label = "e"}, &w->e));
    case 13: return sc_event_record(w->e, w->s0);
    case 14: return sc_stream_wait(w->s1, w->e);
    case 15:
        return fp_created(w, FP_M, sc_module_load_image(w->ctx, fake_test_ptx,
                                                        sizeof fake_test_ptx - 1, &w->m));
    case 16: return sc_kernel_get(w->m, "add", &w->k);
    case 17: return sc_launch_config_for(FP_N, w->k, &w->cfg);
    case 18:
        /* The fake runs no kernel: c keeps its data. */
        return SC_LAUNCH(w->s1, w->k, &w->cfg, sc_arg_in(sc_view_of(w->a)),
                         sc_arg_inout(sc_view_of(w->c)), sc_arg_u32(FP_N));
    case 19: return sc_copy_to_host_buffer(w->s1, w->h, 0, sc_view_of(w->b));
    case 20:
        memset(w->out, 0, sizeof w->out);
        s = sc_host_buffer_read(w->h, 0, w->out, bytes);
        if (s == SC_OK)
            for (int j = 0; j < FP_N; j++)
                w->data_errors += w->out[j] != (j < FP_N / 2 ? w->in[FP_N / 2 + j] : 1.0f);
        return s;
    case 21:
        memset(w->out, 0, sizeof w->out);
        s = sc_copy_to_host(w->s0, w->out, bytes, sc_view_of(w->c));
        if (s == SC_OK)
            w->data_errors += memcmp(w->out, w->in2, bytes) != 0;
        return s;
    case 22: {
        sc_memory_stats m;
        s = sc_context_memory(w->ctx, &m);
        if (s == SC_OK)
            w->data_errors += m.bytes_in_use != 3 * bytes || m.live_buffers != 3 ||
                              m.pinned_bytes != bytes;
        return s;
    }
    case 23: return sc_context_synchronize(w->ctx);
    case 24: return fp_destroy(w, FP_M);
    case 25: return fp_destroy(w, FP_E);
    case 26: return fp_destroy(w, FP_A);
    case 27: return fp_destroy(w, FP_B);
    case 28: return fp_destroy(w, FP_C);
    case 29: return fp_destroy(w, FP_H);
    case 30: return fp_destroy(w, FP_S0);
    case 31: return fp_destroy(w, FP_S1);
    case 32: return sc_context_trim(w->ctx);
    case 33: return fp_destroy(w, FP_CTX);
    default: return SC_ERR_INTERNAL;
    }
}

#endif
