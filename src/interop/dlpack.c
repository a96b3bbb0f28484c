/* DLPack 1.x: import a DLManagedTensorVersioned as a borrowed buffer, export a view as one.
 *
 * An export is one host block (the tensor, its shape and strides, and a record) that holds
 * the buffer's memory (sci_buffer_export_hold) until the consumer calls the deleter. The
 * record is a registry object of its own kind ("dlpack export", owned by the context), so
 * the leak report lists the exports still held when the context is destroyed, and the
 * context's destroy lets go of them (the memory is freed; the tensor dangles).
 *
 * Who frees the block: the deleter (the consumer's call) and the context's destroy may run
 * at any time on any threads. Whichever of them takes the record off the registry lets go
 * of the buffer's memory; the block is freed by the deleter when it comes last, or by the
 * context's destroy when the deleter ran before it had let go (export_lock decides). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "interop/interop.h"
#include "memory/dtype.h"
#include "stream/capture.h"

/* ---- types ---------------------------------------------------------------------------- */

static const char *dl_code_name(uint8_t code)
{
    switch (code) {
    case kDLInt: return "int";
    case kDLUInt: return "uint";
    case kDLFloat: return "float";
    case kDLOpaqueHandle: return "opaque handle";
    case kDLBfloat: return "bfloat";
    case kDLComplex: return "complex";
    case kDLBool: return "bool";
    case kDLFloat8_e3m4: return "float8_e3m4";
    case kDLFloat8_e4m3: return "float8_e4m3";
    case kDLFloat8_e4m3b11fnuz: return "float8_e4m3b11fnuz";
    case kDLFloat8_e4m3fn: return "float8_e4m3fn";
    case kDLFloat8_e4m3fnuz: return "float8_e4m3fnuz";
    case kDLFloat8_e5m2: return "float8_e5m2";
    case kDLFloat8_e5m2fnuz: return "float8_e5m2fnuz";
    case kDLFloat8_e8m0fnu: return "float8_e8m0fnu";
    case kDLFloat6_e2m3fn: return "float6_e2m3fn";
    case kDLFloat6_e3m2fn: return "float6_e3m2fn";
    case kDLFloat4_e2m1fn: return "float4_e2m1fn";
    default: return "unknown";
    }
}

static sc_status from_dl(DLDataType type, const char *fn, const char *what, sc_dtype *out)
{
    *out = SC_DTYPE_INVALID;
    if (type.lanes != 1)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                        "%sDLPack type %s (code %u) of %u bits with %u lanes: vector types have "
                        "no sc_dtype (1 lane expected)",
                        what, dl_code_name(type.code), type.code, type.bits, type.lanes);
    sc_dtype d = sci_dtype_from_dlpack(type.code, type.bits);
    if (d == SC_DTYPE_INVALID)
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn,
                        "%sDLPack type %s (code %u) of %u bits has no sc_dtype (safecuda has "
                        "int and uint of 8 to 64 bits, float of 16, 32 and 64 bits and bfloat "
                        "of 16 bits)",
                        what, dl_code_name(type.code), type.code, type.bits);
    *out = d;
    return SC_OK;
}

sc_status sc_dtype_to_dlpack(sc_dtype dtype, DLDataType *out)
{
    static const char fn[] = "sc_dtype_to_dlpack";
    SCI_CHECK_PTR(fn, out);
    uint8_t code, bits;
    if (!sci_dtype_dlpack(dtype, &code, &bits))
        return sci_fail(SC_ERR_TYPE_MISMATCH, fn, "dtype %d (%s) has no DLPack type",
                        (int)dtype, sc_dtype_name(dtype));
    *out = (DLDataType){code, bits, 1};
    return SC_OK;
}

sc_status sc_dtype_from_dlpack(DLDataType type, sc_dtype *out)
{
    static const char fn[] = "sc_dtype_from_dlpack";
    SCI_CHECK_PTR(fn, out);
    return from_dl(type, fn, "", out);
}

/* "[2, 3, 4]" into buf. */
static const char *format_dims(char *buf, size_t size, int n, const int64_t *v)
{
    size_t len = 0;
    buf[0] = '\0';
    len += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < n && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%" PRId64, i ? ", " : "", v[i]);
    if (len < size)
        snprintf(buf + len, size - len, "]");
    return buf;
}

static const char *device_type_text(int32_t t)
{
    switch (t) {
    case kDLCPU: return "a CPU tensor (device type kDLCPU)";
    case kDLCUDAHost: return "a CUDA host-pinned tensor (device type kDLCUDAHost)";
    case kDLCUDAManaged: return "a CUDA managed-memory tensor (device type kDLCUDAManaged)";
    case kDLOpenCL: return "an OpenCL tensor (device type kDLOpenCL)";
    case kDLVulkan: return "a Vulkan tensor (device type kDLVulkan)";
    case kDLMetal: return "a Metal tensor (device type kDLMetal)";
    case kDLVPI: return "a VPI tensor (device type kDLVPI)";
    case kDLROCM: return "a ROCm tensor (device type kDLROCM)";
    case kDLROCMHost: return "a ROCm host tensor (device type kDLROCMHost)";
    case kDLExtDev: return "an extension-device tensor (device type kDLExtDev)";
    case kDLOneAPI: return "a oneAPI tensor (device type kDLOneAPI)";
    case kDLWebGPU: return "a WebGPU tensor (device type kDLWebGPU)";
    case kDLHexagon: return "a Hexagon tensor (device type kDLHexagon)";
    case kDLMAIA: return "a MAIA tensor (device type kDLMAIA)";
    default: return "a tensor of an unknown device type";
    }
}

/* ---- import ------------------------------------------------------------------------------ */

static void release_tensor(void *user)
{
    DLManagedTensorVersioned *t = user;
    if (t->deleter)
        t->deleter(t);
}

sc_status sc_buffer_from_dlpack_at(sc_context ctx, DLManagedTensorVersioned *tensor,
                                   const sc_dlpack_import_desc *desc, sc_buffer *buffer,
                                   const char *file, int line)
{
    static const char fn[] = "sc_buffer_from_dlpack";
    SCI_CHECK_PTR(fn, buffer);
    buffer->id = 0;
    SCI_CHECK_PTR(fn, tensor);
    const sc_dlpack_import_desc d = desc ? *desc : (sc_dlpack_import_desc){0};
    const char *label = d.label ? d.label : "";
    const DLTensor *t = &tensor->dl_tensor;
    if (tensor->version.major != DLPACK_MAJOR_VERSION)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "'%s': DLPack %u.%u is not supported (1.x expected)", label,
                        tensor->version.major, tensor->version.minor);
    if (t->device.device_type != kDLCUDA)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "'%s': %s (device type %d): only CUDA device memory (kDLCUDA) can be "
                        "imported",
                        label, device_type_text(t->device.device_type),
                        (int)t->device.device_type);
    int device = -1;
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c); /* names this function in its messages */
    if (s != SC_OK)
        return s;
    device = c->device;
    sci_context_release(c);
    if (t->device.device_id != device)
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                        "'%s': a tensor of CUDA device %d; the context is on device %d", label,
                        (int)t->device.device_id, device);
    char what[96];
    snprintf(what, sizeof what, "'%s': ", label);
    sc_dtype dtype;
    if ((s = from_dl(t->dtype, fn, what, &dtype)) != SC_OK)
        return s;
    if (t->ndim < 0 || (t->ndim > 0 && !t->shape))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "'%s': ndim is %d and shape is %s", label,
                        (int)t->ndim, t->shape ? "set" : "NULL");
    uint64_t count = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "'%s': shape[%d] = %" PRId64, label, i,
                            t->shape[i]);
        if (!sci_mul_ok(count, (uint64_t)t->shape[i], &count))
            return sci_fail(SC_ERR_OVERFLOW, fn,
                            "'%s': the element count of the shape overflows 64 bits", label);
    }
    char dims[200], str[200];
    if (count == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "'%s': the tensor has no elements (shape %s): zero-element buffers are "
                        "not allowed",
                        label, format_dims(dims, sizeof dims, t->ndim, t->shape));
    if (t->strides) {
        /* C-contiguous: each stride the product of the extents after it (extent-1
         * dimensions may have any stride: no step is ever taken along them). */
        int64_t want = 1;
        for (int i = t->ndim - 1; i >= 0; i--) {
            if (t->shape[i] != 1 && t->strides[i] != want)
                return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                                "'%s': strides[%d] = %" PRId64 " where a compact row-major "
                                "(C-contiguous) layout has %" PRId64
                                " (shape %s, strides %s): only compact tensors can be imported "
                                "(make the tensor contiguous first)",
                                label, i, t->strides[i], want,
                                format_dims(dims, sizeof dims, t->ndim, t->shape),
                                format_dims(str, sizeof str, t->ndim, t->strides));
            want *= t->shape[i]; /* the product is at most count: no overflow */
        }
    }
    if (!t->data)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "'%s': the tensor's data is NULL", label);
    uint64_t ptr;
    if (!sci_add_ok((uint64_t)(uintptr_t)t->data, t->byte_offset, &ptr))
        return sci_fail(SC_ERR_OVERFLOW, fn, "'%s': data %p + byte_offset %llu overflows",
                        label, t->data, (unsigned long long)t->byte_offset);
    const size_t esize = sc_dtype_size(dtype);
    if (ptr % esize)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "'%s': data %p + byte_offset %llu = 0x%llx is not aligned to the "
                        "%zu-byte elements of %s",
                        label, t->data, (unsigned long long)t->byte_offset,
                        (unsigned long long)ptr, esize, sc_dtype_name(dtype));
    const bool read_only = d.read_only || (tensor->flags & DLPACK_FLAG_BITMASK_READ_ONLY);
    const sc_borrow_desc bd = {.dtype = dtype,
                               .count = count,
                               .label = label,
                               .stream = d.stream,
                               .read_only = read_only,
                               .release = release_tensor,
                               .release_user = tensor};
    return sci_buffer_borrow(ctx, ptr, &bd, buffer, file, line, fn);
}

/* ---- export ------------------------------------------------------------------------------ */

typedef struct sci_export {
    DLManagedTensorVersioned tensor; /* first: the consumer's pointer is the block's */
    int64_t shape[SC_DLPACK_MAX_DIMS];
    int64_t strides[SC_DLPACK_MAX_DIMS];
    sci_object obj;     /* kind SCI_KIND_DLPACK_EXPORT, owned by the buffer's context */
    sci_buffer *buf;    /* held; NULL once let go (under export_lock) */
    bool deleted;       /* the deleter ran (under export_lock) */
    bool writable;
    uint64_t consumer_stream_id; /* desc->stream's, 0 if none */
    /* For reports (the buffer may be gone by then). */
    uint64_t offset, count;
    sc_dtype dtype;
    const char *buf_file;
    int buf_line;
} sci_export;

static pthread_mutex_t export_lock = PTHREAD_MUTEX_INITIALIZER;

static sci_export *export_of(sci_object *obj)
{
    return (sci_export *)(void *)((char *)obj - offsetof(sci_export, obj));
}

static void describe_export(const sci_object *obj, sc_object_info *info)
{
    const sci_export *e =
        (const sci_export *)(const void *)((const char *)obj - offsetof(sci_export, obj));
    snprintf(info->detail, sizeof info->detail, "%llu x %s at element %llu of buffer from %s:%d",
             (unsigned long long)e->count, sc_dtype_name(e->dtype),
             (unsigned long long)e->offset, sci_basename(e->buf_file), e->buf_line);
    info->bytes = e->count * sc_dtype_size(e->dtype);
}

/* Let go of the buffer's memory (the record is off the registry: only this caller can be
 * here). The block is freed here if the deleter already ran. */
static sc_status let_go(sci_export *e, const char *fn)
{
    pthread_mutex_lock(&export_lock);
    sci_buffer *b = e->buf;
    e->buf = NULL;
    const bool free_block = e->deleted;
    pthread_mutex_unlock(&export_lock);
    if (free_block)
        free(e);
    return b ? sci_buffer_export_drop(b, fn) : SC_OK;
}

/* The context is destroyed while the export is held (sci_kind_ops.destroy: the only
 * destroy of an export through the registry; the consumer's deleter, export_deleter, takes
 * its own path, as it returns no status and may find the record gone). */
static sc_status destroy_leaked_export(sci_object *obj, const char *fn)
{
    sci_export *e = export_of(obj);
    sci_log(SC_LOG_WARN,
            "%s: the DLPack export of elements [%llu, %llu) of buffer '%s' (created at %s:%d), "
            "exported at %s:%d, is still held by its consumer: the memory is freed now and the "
            "tensor dangles (its deleter stays safe to call)",
            fn, (unsigned long long)e->offset, (unsigned long long)(e->offset + e->count),
            e->obj.label, sci_basename(e->buf_file), e->buf_line, sci_basename(e->obj.file),
            e->obj.line);
    return let_go(e, fn);
}

static const sci_kind_ops export_ops = {"dlpack export", describe_export,
                                        destroy_leaked_export};

__attribute__((constructor)) static void register_export_kind(void)
{
    sci_registry_set_ops(SCI_KIND_DLPACK_EXPORT, &export_ops);
}

/* The consumer used the memory on its stream (the export's) until the deleter: count that
 * use, so the free and safecuda's later work wait for what it queued there. Skipped when
 * the stream is gone (a destroyed stream finished its work) or capturing now. */
static void note_consumer(const sci_export *e, sci_buffer *b, const char *fn)
{
    sci_object *obj = NULL;
    if (!e->consumer_stream_id ||
        sci_registry_acquire(SCI_KIND_STREAM, e->consumer_stream_id, fn, &obj) != SC_OK)
        return;
    sci_stream *st = (sci_stream *)obj;
    if (st->ctx == b->ctx && !sci_stream_is_capturing_now(st) &&
        sci_context_enter(b->ctx, fn) == SC_OK) {
        sci_access acc = {&b->tracker, e->writable ? SCI_READ_WRITE : SCI_READ};
        struct sci_capture *cap = NULL;
        sc_status s = sci_access_begin(&acc, 1, st, false, fn, &cap); /* record only */
        if (s == SC_OK)
            s = sci_access_end(&acc, 1, st, cap, cap == NULL, fn);
        if (s != SC_OK)
            sci_log(SC_LOG_WARN, "%s", sc_last_error());
    }
    sci_stream_release(st);
}

static void export_deleter(DLManagedTensorVersioned *self)
{
    static const char fn[] = "the deleter of a DLPack export (sc_view_to_dlpack)";
    if (!self)
        return;
    sci_export *e = (sci_export *)(void *)self;
    char *saved = sci_error_save(); /* the consumer's thread keeps its last error */
    /* and its current CUDA context (the free makes the buffer's current). */
    CUcontext prev = NULL;
    const bool had_prev = sci_cuCtxGetCurrent(&prev) == CUDA_SUCCESS;
    const uint64_t id = e->obj.id;
    sci_context *pin = NULL;
    sci_object *obj = NULL;
    /* The context outlives what follows (pinned), unless it is being destroyed: then that
     * destroy takes the record off the registry and lets go. */
    const bool mine = sci_context_pin(SCI_KIND_DLPACK_EXPORT, id, fn, &pin) == SC_OK &&
                      sci_registry_remove(SCI_KIND_DLPACK_EXPORT, id, fn, &obj) == SC_OK;
    if (mine) {
        sci_buffer *b = e->buf;
        note_consumer(e, b, fn);
        free(e);
        if (sci_buffer_export_drop(b, fn) != SC_OK) /* the free's driver failure */
            sci_log(SC_LOG_WARN, "%s", sc_last_error());
    } else {
        pthread_mutex_lock(&export_lock);
        e->deleted = true;
        const bool free_block = e->buf == NULL;
        pthread_mutex_unlock(&export_lock);
        if (free_block)
            free(e);
    }
    sci_context_unpin(pin);
    CUcontext now = NULL;
    if (had_prev && sci_cuCtxGetCurrent(&now) == CUDA_SUCCESS && now != prev)
        sci_cuCtxSetCurrent(prev);
    if (saved)
        sci_error_restore(saved);
    else
        sc_clear_error();
}

sc_status sc_view_to_dlpack_at(sc_view view, const sc_dlpack_export_desc *desc,
                               DLManagedTensorVersioned **tensor, const char *file, int line)
{
    static const char fn[] = "sc_view_to_dlpack";
    SCI_CHECK_PTR(fn, tensor);
    *tensor = NULL;
    const sc_dlpack_export_desc d = desc ? *desc : (sc_dlpack_export_desc){0};
    if (d.ndim < 0 || d.ndim > SC_DLPACK_MAX_DIMS)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->ndim = %d: 0 .. %d dimensions",
                        d.ndim, SC_DLPACK_MAX_DIMS);
    sci_resolved_view rv = {0};
    sc_status s = sci_view_resolve(view, fn, "view", &rv);
    if (s != SC_OK)
        return s;
    sci_buffer *b = rv.buf;
    sci_context *c = NULL;
    sci_stream *st = NULL;
    sci_export *e = NULL;
    char desc_buf[200], dims[200];
    /* A reference on the context: its destroy can't list the exports before this one is
     * published. Checks its health and makes it current. */
    if ((s = sci_context_acquire((sc_context){b->ctx->obj.id}, fn, &c)) != SC_OK)
        goto out;
    const int n = d.ndim ? d.ndim : 1;
    int64_t shape[SC_DLPACK_MAX_DIMS];
    if (rv.count > (uint64_t)INT64_MAX) {
        s = sci_fail(SC_ERR_OVERFLOW, fn, "the view's %llu elements do not fit DLPack's int64",
                     (unsigned long long)rv.count);
        goto out;
    }
    if (d.ndim == 0) {
        shape[0] = (int64_t)rv.count;
    } else {
        memcpy(shape, d.shape, sizeof shape);
    }
    uint64_t product = 1;
    bool overflow = false;
    for (int i = 0; i < n; i++) {
        if (shape[i] < 1) {
            s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                         "%s[%d] = %" PRId64 ": extents are at least 1 (a view of %s)",
                         d.ndim ? "desc->shape" : "the view's element count, shape", i,
                         shape[i], sci_buffer_describe(b, desc_buf, sizeof desc_buf));
            goto out;
        }
        overflow |= !sci_mul_ok(product, (uint64_t)shape[i], &product);
    }
    if (overflow || product != rv.count) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "desc->shape %s holds %s%llu elements; the view has %llu (elements [%llu, "
                     "%llu) of %s)",
                     format_dims(dims, sizeof dims, n, shape), overflow ? "more than " : "",
                     (unsigned long long)product, (unsigned long long)rv.count,
                     (unsigned long long)rv.offset, (unsigned long long)(rv.offset + rv.count),
                     sci_buffer_describe(b, desc_buf, sizeof desc_buf));
        goto out;
    }
    if (b->tracker.read_only && !d.read_only) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "%s is read-only: it can only be exported read-only (desc->read_only)",
                     sci_buffer_describe(b, desc_buf, sizeof desc_buf));
        goto out;
    }
    uint8_t code = 0, bits = 0;
    if (!sci_dtype_dlpack(b->dtype, &code, &bits)) {
        s = sci_fail(SC_ERR_INTERNAL, fn, "%s has no DLPack type",
                     sci_buffer_describe(b, desc_buf, sizeof desc_buf));
        goto out;
    }
    if (d.stream.id && (s = sci_stream_resolve(d.stream, c, fn, &st)) != SC_OK)
        goto out;
    /* The consumer may use the memory once the export is made: safecuda's pending writes
     * (and, for a writable export, reads) come first, on the consumer's stream or on the
     * host. */
    if (!d.no_sync && st) {
        sci_access acc = {&b->tracker, d.read_only ? SCI_READ : SCI_READ_WRITE};
        struct sci_capture *cap = NULL;
        if ((s = sci_access_begin(&acc, 1, st, true, fn, &cap)) != SC_OK ||
            (s = sci_access_end(&acc, 1, st, cap, false, fn)) != SC_OK)
            goto out;
    } else if (!d.no_sync) {
        if ((s = sci_tracker_host_wait(&b->tracker, c, false, fn)) != SC_OK)
            goto out;
    }
    e = calloc(1, sizeof *e);
    if (!e) {
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a DLPack tensor");
        goto out;
    }
    e->tensor.version = (DLPackVersion){DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    e->tensor.manager_ctx = e;
    e->tensor.deleter = export_deleter;
    e->tensor.flags = d.read_only ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    DLTensor *t = &e->tensor.dl_tensor;
    t->data = (void *)(uintptr_t)rv.ptr;
    t->device = (DLDevice){kDLCUDA, c->device};
    t->ndim = n;
    t->dtype = (DLDataType){code, bits, 1};
    t->shape = e->shape;
    t->strides = e->strides; /* compact, spelled out for consumers that want them */
    t->byte_offset = 0;
    int64_t stride = 1;
    for (int i = n - 1; i >= 0; i--) {
        e->shape[i] = shape[i];
        e->strides[i] = stride;
        stride *= shape[i];
    }
    e->writable = !d.read_only;
    e->consumer_stream_id = st ? st->obj.id : 0;
    e->offset = rv.offset;
    e->count = rv.count;
    e->dtype = b->dtype;
    e->buf_file = b->obj.file;
    e->buf_line = b->obj.line;
    e->buf = b;
    sci_buffer_export_hold(b); /* while the view's reference keeps b from its destroy */
    s = sci_registry_insert(&e->obj, SCI_KIND_DLPACK_EXPORT, c->obj.id, b->obj.label, file,
                            line, fn);
    if (s != SC_OK) {
        sci_buffer_export_drop(b, fn); /* not the last: b is not destroyed */
        free(e);
        goto out;
    }
    *tensor = &e->tensor;
out:
    if (st)
        sci_stream_release(st);
    if (c)
        sci_context_release(c);
    sci_view_release(&rv);
    return s;
}
