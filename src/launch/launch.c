/* Checked kernel launches. */
#include <stdio.h>
#include <string.h>

#include "driver/driver.h"
#include "launch/launch_attr.h"
#include "launch/launch_config.h"
#include "launch/module.h"
#include "memory/buffer.h"
#include "stream/capture.h"

static const char *arg_kind_name(sc_arg_kind k)
{
    switch (k) {
    case SC_ARG_IN: return "in";
    case SC_ARG_OUT: return "out";
    case SC_ARG_INOUT: return "inout";
    case SC_ARG_SCALAR: return "scalar";
    case SC_ARG_BYTES: return "bytes";
    case SC_ARG_TENSOR_MAP_IN: return "tensor map in";
    case SC_ARG_TENSOR_MAP_OUT: return "tensor map out";
    }
    return "invalid";
}

/* "argument N" for view messages, made once: formatting it per launch would cost more than
 * the rest of the checks. */
static char arg_labels[SCI_MAX_PARAMS][16];
static pthread_once_t arg_labels_once = PTHREAD_ONCE_INIT;
static void make_arg_labels(void)
{
    for (int i = 0; i < SCI_MAX_PARAMS; i++)
        snprintf(arg_labels[i], sizeof arg_labels[i], "argument %d", i);
}
static const char *arg_label(size_t i)
{
    pthread_once(&arg_labels_once, make_arg_labels);
    return arg_labels[i];
}

/* What was given for an argument, for messages (formatted only when a check fails). */
static const char *describe_arg(const sc_arg *a, const sci_resolved_view *v, char *what,
                                size_t size)
{
    switch (a->kind) {
    case SC_ARG_IN: case SC_ARG_OUT: case SC_ARG_INOUT:
        snprintf(what, size, "%s %s view", arg_kind_name(a->kind), sc_dtype_name(v->buf->dtype));
        break;
    case SC_ARG_SCALAR:
        snprintf(what, size, "%s scalar", sc_dtype_name(a->dtype));
        break;
    case SC_ARG_TENSOR_MAP_IN: case SC_ARG_TENSOR_MAP_OUT:
        snprintf(what, size, "%s (%s view)", arg_kind_name(a->kind), sc_dtype_name(v->buf->dtype));
        break;
    default:
        snprintf(what, size, "%zu raw bytes", a->size);
        break;
    }
    return what;
}

/* Check one argument against the kernel's parameter i. */
static sc_status check_arg(const sci_kernel *k, int i, const sc_arg *a,
                           const sci_resolved_view *v, const char *fn)
{
    size_t given = 0;
    char what[64];
    switch (a->kind) {
    case SC_ARG_IN: case SC_ARG_OUT: case SC_ARG_INOUT:
        given = sizeof(CUdeviceptr);
        break;
    case SC_ARG_SCALAR:
        given = sc_dtype_size(a->dtype);
        if (given == 0)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "argument %d: invalid scalar dtype %d",
                            i, (int)a->dtype);
        break;
    case SC_ARG_BYTES:
        given = a->size;
        if (!a->bytes || a->size == 0)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "argument %d: sc_arg_bytes with a NULL pointer or size 0", i);
        break;
    case SC_ARG_TENSOR_MAP_IN: case SC_ARG_TENSOR_MAP_OUT: {
        const sc_tensor_map *m = a->bytes;
        given = sizeof m->encoded;
        if (v->ptr != m->address)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "argument %d: the tensor map was encoded for device address 0x%llx "
                            "but its view is now at 0x%llx (a copied or edited sc_tensor_map?)",
                            i, (unsigned long long)m->address, (unsigned long long)v->ptr);
        break;
    }
    default:
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "argument %d: invalid kind %d", i,
                        (int)a->kind);
    }
    if (k->n_params >= 0 && given != k->param_size[i])
        return sci_fail(SC_ERR_LAUNCH, fn,
                        "kernel '%s', argument %d: the kernel's parameter%s%s%s is %u bytes but "
                        "a %s of %zu bytes was given",
                        k->display, i, k->typed ? " (" : "", k->typed ? k->types[i].text : "",
                        k->typed ? ")" : "", k->param_size[i],
                        describe_arg(a, v, what, sizeof what), given);
    if (!k->typed)
        return SC_OK;
    const sci_param_type *t = &k->types[i];
    /* A tensor map is 128 bytes: the size check above already refused any pointer or scalar
     * parameter, and a by-value struct takes it unchecked. */
    if (a->kind == SC_ARG_TENSOR_MAP_IN || a->kind == SC_ARG_TENSOR_MAP_OUT)
        return SC_OK;
    bool is_view = a->kind == SC_ARG_IN || a->kind == SC_ARG_OUT || a->kind == SC_ARG_INOUT;
    if (is_view) {
        if (t->kind != SCI_PARAM_POINTER) {
            if (t->kind == SCI_PARAM_OTHER)
                return SC_OK;
            return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                            "kernel '%s', argument %d: the kernel wants '%s' but an %s was given",
                            k->display, i, t->text, describe_arg(a, v, what, sizeof what));
        }
        if (t->dtype != SC_DTYPE_INVALID && t->dtype != v->buf->dtype)
            return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                            "kernel '%s', argument %d: the kernel wants '%s' but an %s was given "
                            "(buffer '%s' created at %s:%d)",
                            k->display, i, t->text, describe_arg(a, v, what, sizeof what),
                            v->buf->obj.label,
                            sci_basename(v->buf->obj.file), v->buf->obj.line);
        if (t->is_const && a->kind != SC_ARG_IN)
            return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                            "kernel '%s', argument %d: the kernel declares '%s' (read-only) but "
                            "it was passed as %s; pass it with sc_arg_in",
                            k->display, i, t->text, arg_kind_name(a->kind));
        return SC_OK;
    }
    if (a->kind == SC_ARG_SCALAR) {
        if (t->kind == SCI_PARAM_POINTER)
            return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                            "kernel '%s', argument %d: the kernel wants '%s' (a buffer: pass a "
                            "view) but an %s was given",
                            k->display, i, t->text, describe_arg(a, v, what, sizeof what));
        if (t->kind == SCI_PARAM_SCALAR && t->dtype != SC_DTYPE_INVALID && t->dtype != a->dtype)
            return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                            "kernel '%s', argument %d: the kernel wants '%s' but an %s was given",
                            k->display, i, t->text, describe_arg(a, v, what, sizeof what));
    }
    return SC_OK;
}

sc_status sc_kernel_launch(sc_stream stream, sc_kernel kernel, const sc_launch_desc *desc,
                           const sc_arg *args, size_t nargs)
{
    static const char fn[] = "sc_kernel_launch";
    SCI_CHECK_PTR(fn, desc);
    if (nargs && !args)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "args is NULL but nargs is %zu", nargs);
    if (nargs > SCI_MAX_PARAMS)
        return sci_fail(SC_ERR_LAUNCH, fn, "%zu arguments (at most %d)", nargs, SCI_MAX_PARAMS);
    sci_kernel *k = NULL;
    sc_status s = sci_kernel_acquire(kernel, fn, &k);
    if (s != SC_OK)
        return s;
    if (k->n_params >= 0 && (size_t)k->n_params != nargs) {
        s = sci_fail(SC_ERR_LAUNCH, fn, "kernel '%s' takes %d argument%s but %zu %s given",
                     k->display, k->n_params, k->n_params == 1 ? "" : "s", nargs,
                     nargs == 1 ? "was" : "were");
        sci_kernel_release(k);
        return s;
    }
    sc_dim3 grid, block;
    sci_launch_plan plan;
    if ((s = sci_launch_check_config(k, desc, &grid, &block, fn)) != SC_OK ||
        (s = sci_launch_attrs_check(k, desc, grid, block, fn, &plan)) != SC_OK) {
        sci_kernel_release(k);
        return s;
    }

    sci_resolved_view views[SCI_MAX_PARAMS];
    sci_access acc[SCI_MAX_PARAMS];
    union {
        CUdeviceptr ptr;
        int32_t i32;
        uint32_t u32;
        int64_t i64;
        uint64_t u64;
        float f32;
        double f64;
    } values[SCI_MAX_PARAMS];
    void *params[SCI_MAX_PARAMS];
    size_t n_views = 0, n_acc = 0;
    memset(views, 0, sizeof views);
    for (size_t i = 0; i < nargs && s == SC_OK; i++) {
        const sc_arg *a = &args[i];
        sci_resolved_view *v = &views[i];
        bool tmap = a->kind == SC_ARG_TENSOR_MAP_IN || a->kind == SC_ARG_TENSOR_MAP_OUT;
        if (tmap && !a->bytes) {
            s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "argument %zu: tensor map is NULL", i);
            break;
        }
        if (a->kind == SC_ARG_IN || a->kind == SC_ARG_OUT || a->kind == SC_ARG_INOUT || tmap) {
            s = sci_view_resolve(a->view, fn, arg_label(i), v);
            if (s != SC_OK)
                break;
            n_views = i + 1;
            if (v->buf->ctx != k->ctx) {
                s = sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                             "argument %zu: buffer '%s' (created at %s:%d) belongs to another "
                             "context than kernel '%s'",
                             i, v->buf->obj.label, sci_basename(v->buf->obj.file),
                             v->buf->obj.line, k->display);
                break;
            }
        }
        s = check_arg(k, (int)i, a, v, fn);
        if (s != SC_OK)
            break;
        switch (a->kind) {
        case SC_ARG_IN: case SC_ARG_OUT: case SC_ARG_INOUT:
            values[i].ptr = v->ptr;
            params[i] = &values[i];
            acc[n_acc].tracker = &v->buf->tracker;
            acc[n_acc++].mode = a->kind == SC_ARG_IN ? SCI_READ
                                : a->kind == SC_ARG_OUT ? SCI_WRITE : SCI_READ_WRITE;
            break;
        case SC_ARG_SCALAR:
            memcpy(&values[i], &a->value, sizeof values[i]);
            params[i] = &values[i];
            break;
        case SC_ARG_BYTES:
            params[i] = (void *)a->bytes;
            break;
        case SC_ARG_TENSOR_MAP_IN: case SC_ARG_TENSOR_MAP_OUT:
            params[i] = (void *)((const sc_tensor_map *)a->bytes)->encoded;
            acc[n_acc].tracker = &v->buf->tracker;
            acc[n_acc++].mode = a->kind == SC_ARG_TENSOR_MAP_IN ? SCI_READ : SCI_WRITE;
            break;
        }
    }
    if (s == SC_OK) {
        sci_stream *st = NULL;
        s = sci_stream_resolve(stream, k->ctx, fn, &st);
        if (s == SC_OK) {
            struct sci_capture *cap = NULL;
            s = sci_access_begin(acc, n_acc, st, k->ctx->tracking, fn, &cap);
            if (s == SC_OK) {
                CUresult r;
                /* Programmatic, cluster and cooperative: one attribute list. */
                CUlaunchAttribute attrs[SCI_MAX_LAUNCH_ATTRS];
                const unsigned n_attrs = sci_launch_attrs_fill(&plan, attrs);
                if (n_attrs) {
                    const CUlaunchConfig cfg = {grid.x,  grid.y, grid.z, block.x, block.y,
                                                block.z, desc->shared_bytes, st->cu, attrs,
                                                n_attrs};
                    r = sci_cuLaunchKernelEx(&cfg, k->fn, nargs ? params : NULL, NULL);
                } else {
                    r = sci_cuLaunchKernel(k->fn, grid.x, grid.y, grid.z, block.x, block.y,
                                           block.z, desc->shared_bytes, st->cu,
                                           nargs ? params : NULL, NULL);
                }
                if (cap && r == CUDA_SUCCESS) /* the graph launches it: it must stay alive */
                    sci_capture_remember_locked(cap, k->obj.id, 0);
                s = sci_access_end(acc, n_acc, st, cap, r == CUDA_SUCCESS, fn);
                if (r != CUDA_SUCCESS)
                    s = sci_context_fail_cu(k->ctx, r, fn, "%s('%s')",
                                            n_attrs ? "cuLaunchKernelEx" : "cuLaunchKernel",
                                            k->display);
            }
            sci_stream_release(st);
        }
    }
    for (size_t i = 0; i < n_views; i++)
        sci_view_release(&views[i]);
    sci_kernel_release(k);
    return s;
}
