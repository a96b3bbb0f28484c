/* Checked copies and fills. Each operation resolves its views (bounds, overflow, stale
 * handles), checks sizes, element types and contexts, orders itself after conflicting
 * work on other streams, enqueues the driver call, and records its use. */
#include <stdio.h>
#include <string.h>

#include "memory/buffer.h"
#include "stream/capture.h"

/* Resolve the stream in ctx, lock and order the accesses. On success the caller enqueues
 * and then calls finish(). A copy from or to pageable memory (waits, named by pageable)
 * can't be part of a graph, and CUDA forbids it while a capture that forbids unsafe calls
 * is open: it is refused then (SC_ERR_CAPTURE), before anything is done. */
static sc_status start(sci_context *ctx, sc_stream stream, sci_access *acc, size_t n,
                       const char *fn, const char *pageable, sci_stream **st,
                       struct sci_capture **cap)
{
    *cap = NULL;
    sc_status s = sci_stream_resolve(stream, ctx, fn, st);
    if (s != SC_OK)
        return s;
    if (pageable && ((s = sci_capture_refuse_stream(*st, fn, pageable)) != SC_OK ||
                     (s = sci_guard_refuse(fn, pageable)) != SC_OK)) {
        sci_stream_release(*st);
        return s;
    }
    s = sci_access_begin(acc, n, *st, ctx->tracking, fn, cap);
    if (s != SC_OK)
        sci_stream_release(*st);
    return s;
}

static sc_status finish(sci_context *ctx, sci_access *acc, size_t n, sci_stream *st,
                        struct sci_capture *cap, CUresult r, const char *fn, const char *what)
{
    sc_status s = sci_access_end(acc, n, st, cap, r == CUDA_SUCCESS, fn);
    if (r != CUDA_SUCCESS)
        s = sci_context_fail_cu(ctx, r, fn, "%s failed", what);
    return s;
}

static sc_status host_size_check(const sci_resolved_view *v, uint64_t bytes, const char *fn,
                                 const char *arg)
{
    if (bytes == v->bytes)
        return SC_OK;
    char desc[200];
    return sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                    "host size %llu bytes != the %s view's %llu x %s = %llu bytes (elements "
                    "[%llu, %llu) of %s)",
                    (unsigned long long)bytes, arg, (unsigned long long)v->count,
                    sc_dtype_name(v->buf->dtype), (unsigned long long)v->bytes,
                    (unsigned long long)v->offset, (unsigned long long)(v->offset + v->count),
                    sci_buffer_describe(v->buf, desc, sizeof desc));
}

sc_status sc_copy_from_host(sc_stream stream, sc_view dst, const void *src, uint64_t bytes)
{
    static const char fn[] = "sc_copy_from_host";
    if (!src && bytes)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "argument 'src' is NULL");
    sci_resolved_view d = {0};
    sc_status s = sci_view_resolve(dst, fn, "dst", &d);
    if (s != SC_OK)
        return s;
    if ((s = host_size_check(&d, bytes, fn, "dst")) != SC_OK || bytes == 0)
        goto out;
    sci_access acc = {&d.buf->tracker, SCI_WRITE};
    sci_stream *st = NULL;
    struct sci_capture *cap = NULL;
    if ((s = start(d.buf->ctx, stream, &acc, 1, fn, "a copy from pageable host memory", &st,
                   &cap)) != SC_OK)
        goto out;
    CUresult r = sci_cuMemcpyHtoDAsync(d.ptr, src, bytes, st->cu);
    s = finish(d.buf->ctx, &acc, 1, st, cap, r, fn, "cuMemcpyHtoDAsync");
    /* From pageable memory the driver returns once src is staged; but src may be
     * page-locked memory allocated elsewhere, which the driver reads asynchronously. Asking
     * which it is (cuPointerGetAttribute) fails loudly for pageable pointers under
     * compute-sanitizer, so wait for the copy instead: src is free on return either way. */
    if (s == SC_OK) {
        r = sci_cuStreamSynchronize(st->cu);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(d.buf->ctx, r, fn, "cuStreamSynchronize failed");
    }
    sci_stream_release(st);
out:
    sci_view_release(&d);
    return s;
}

sc_status sc_copy_to_host(sc_stream stream, void *dst, uint64_t bytes, sc_view src)
{
    static const char fn[] = "sc_copy_to_host";
    if (!dst && bytes)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "argument 'dst' is NULL");
    sci_resolved_view v = {0};
    sc_status s = sci_view_resolve(src, fn, "src", &v);
    if (s != SC_OK)
        return s;
    if ((s = host_size_check(&v, bytes, fn, "src")) != SC_OK || bytes == 0)
        goto out;
    sci_access acc = {&v.buf->tracker, SCI_READ};
    sci_stream *st = NULL;
    struct sci_capture *cap = NULL;
    if ((s = start(v.buf->ctx, stream, &acc, 1, fn, "a copy to pageable host memory", &st,
                   &cap)) != SC_OK)
        goto out;
    CUresult r = sci_cuMemcpyDtoHAsync(dst, v.ptr, bytes, st->cu);
    s = finish(v.buf->ctx, &acc, 1, st, cap, r, fn, "cuMemcpyDtoHAsync");
    if (s == SC_OK) { /* dst must hold the data on return */
        r = sci_cuStreamSynchronize(st->cu);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(v.buf->ctx, r, fn, "cuStreamSynchronize failed");
    }
    sci_stream_release(st);
out:
    sci_view_release(&v);
    return s;
}

/* The host buffer's byte range [offset, offset + bytes) for a copy with a device view. */
static sc_status host_range(sc_host_buffer host, uint64_t offset, const sci_resolved_view *v,
                            const char *fn, const char *arg, sci_host_buffer **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_HOST_BUFFER, host.id, fn, &obj);
    if (s != SC_OK) {
        sci_error_append(" (%s)", arg);
        return s;
    }
    sci_host_buffer *h = (sci_host_buffer *)obj;
    uint64_t end;
    if (h->ctx != v->buf->ctx)
        s = sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                     "host buffer '%s' (created at %s:%d) and buffer '%s' (created at %s:%d) "
                     "belong to different contexts",
                     h->obj.label, sci_basename(h->obj.file), h->obj.line, v->buf->obj.label,
                     sci_basename(v->buf->obj.file), v->buf->obj.line);
    else if (!sci_add_ok(offset, v->bytes, &end))
        s = sci_fail(SC_ERR_OVERFLOW, fn, "%s offset %llu + %llu bytes overflows", arg,
                     (unsigned long long)offset, (unsigned long long)v->bytes);
    else if (end > h->bytes)
        s = sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                     "%s bytes [%llu, %llu) outside host buffer '%s' of %llu bytes (created at "
                     "%s:%d)",
                     arg, (unsigned long long)offset, (unsigned long long)end, h->obj.label,
                     (unsigned long long)h->bytes, sci_basename(h->obj.file), h->obj.line);
    if (s != SC_OK) {
        sci_registry_release(obj);
        return s;
    }
    *out = h;
    return SC_OK;
}

sc_status sc_copy_from_host_buffer(sc_stream stream, sc_view dst, sc_host_buffer src,
                                   uint64_t src_offset)
{
    static const char fn[] = "sc_copy_from_host_buffer";
    sci_resolved_view d = {0};
    sc_status s = sci_view_resolve(dst, fn, "dst", &d);
    if (s != SC_OK)
        return s;
    sci_host_buffer *h = NULL;
    if ((s = host_range(src, src_offset, &d, fn, "src", &h)) != SC_OK)
        goto out;
    if (d.bytes) {
        sci_access acc[2] = {{&d.buf->tracker, SCI_WRITE}, {&h->tracker, SCI_READ}};
        sci_stream *st = NULL;
        struct sci_capture *cap = NULL;
        if ((s = start(d.buf->ctx, stream, acc, 2, fn, NULL, &st, &cap)) == SC_OK) {
            CUresult r =
                sci_cuMemcpyHtoDAsync(d.ptr, (char *)h->ptr + src_offset, d.bytes, st->cu);
            s = finish(d.buf->ctx, acc, 2, st, cap, r, fn, "cuMemcpyHtoDAsync");
            sci_stream_release(st);
        }
    }
    sci_registry_release(&h->obj);
out:
    sci_view_release(&d);
    return s;
}

sc_status sc_copy_to_host_buffer(sc_stream stream, sc_host_buffer dst, uint64_t dst_offset,
                                 sc_view src)
{
    static const char fn[] = "sc_copy_to_host_buffer";
    sci_resolved_view v = {0};
    sc_status s = sci_view_resolve(src, fn, "src", &v);
    if (s != SC_OK)
        return s;
    sci_host_buffer *h = NULL;
    if ((s = host_range(dst, dst_offset, &v, fn, "dst", &h)) != SC_OK)
        goto out;
    if (v.bytes) {
        sci_access acc[2] = {{&v.buf->tracker, SCI_READ}, {&h->tracker, SCI_WRITE}};
        sci_stream *st = NULL;
        struct sci_capture *cap = NULL;
        if ((s = start(v.buf->ctx, stream, acc, 2, fn, NULL, &st, &cap)) == SC_OK) {
            CUresult r =
                sci_cuMemcpyDtoHAsync((char *)h->ptr + dst_offset, v.ptr, v.bytes, st->cu);
            s = finish(v.buf->ctx, acc, 2, st, cap, r, fn, "cuMemcpyDtoHAsync");
            sci_stream_release(st);
        }
    }
    sci_registry_release(&h->obj);
out:
    sci_view_release(&v);
    return s;
}

sc_status sc_copy(sc_stream stream, sc_view dst, sc_view src)
{
    static const char fn[] = "sc_copy";
    sci_resolved_view d = {0}, v = {0};
    sc_status s = sci_view_resolve(dst, fn, "dst", &d);
    if (s != SC_OK)
        return s;
    if ((s = sci_view_resolve(src, fn, "src", &v)) != SC_OK) {
        sci_view_release(&d);
        return s;
    }
    char dd[200], sd[200];
    if (d.buf->ctx != v.buf->ctx) {
        s = sci_fail(SC_ERR_WRONG_CONTEXT, fn, "dst %s and src %s belong to different contexts",
                     sci_buffer_describe(d.buf, dd, sizeof dd),
                     sci_buffer_describe(v.buf, sd, sizeof sd));
    } else if (d.buf->dtype != v.buf->dtype) {
        s = sci_fail(SC_ERR_TYPE_MISMATCH, fn, "dst is %s (%s) but src is %s (%s)",
                     sc_dtype_name(d.buf->dtype), sci_buffer_describe(d.buf, dd, sizeof dd),
                     sc_dtype_name(v.buf->dtype), sci_buffer_describe(v.buf, sd, sizeof sd));
    } else if (d.count != v.count) {
        s = sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                     "dst has %llu elements but src has %llu (dst: %s; src: %s)",
                     (unsigned long long)d.count, (unsigned long long)v.count,
                     sci_buffer_describe(d.buf, dd, sizeof dd),
                     sci_buffer_describe(v.buf, sd, sizeof sd));
    } else if (d.buf == v.buf && d.count && d.offset < v.offset + v.count &&
               v.offset < d.offset + d.count) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "dst elements [%llu, %llu) overlap src elements [%llu, %llu) of %s",
                     (unsigned long long)d.offset, (unsigned long long)(d.offset + d.count),
                     (unsigned long long)v.offset, (unsigned long long)(v.offset + v.count),
                     sci_buffer_describe(d.buf, dd, sizeof dd));
    } else if (d.bytes) {
        sci_access acc[2] = {{&d.buf->tracker, SCI_WRITE}, {&v.buf->tracker, SCI_READ}};
        sci_stream *st = NULL;
        struct sci_capture *cap = NULL;
        if ((s = start(d.buf->ctx, stream, acc, 2, fn, NULL, &st, &cap)) == SC_OK) {
            CUresult r = sci_cuMemcpyDtoDAsync(d.ptr, v.ptr, d.bytes, st->cu);
            s = finish(d.buf->ctx, acc, 2, st, cap, r, fn, "cuMemcpyDtoDAsync");
            sci_stream_release(st);
        }
    }
    sci_view_release(&v);
    sci_view_release(&d);
    return s;
}

sc_status sc_fill(sc_stream stream, sc_view dst, const void *value)
{
    static const char fn[] = "sc_fill";
    SCI_CHECK_PTR(fn, value);
    sci_resolved_view d = {0};
    sc_status s = sci_view_resolve(dst, fn, "dst", &d);
    if (s != SC_OK)
        return s;
    if (d.count == 0)
        goto out;
    sci_access acc = {&d.buf->tracker, SCI_WRITE};
    sci_stream *st = NULL;
    struct sci_capture *cap = NULL;
    if ((s = start(d.buf->ctx, stream, &acc, 1, fn, NULL, &st, &cap)) != SC_OK)
        goto out;
    CUresult r;
    size_t esize = sc_dtype_size(d.buf->dtype);
    if (esize == 1) {
        uint8_t v;
        memcpy(&v, value, 1);
        r = sci_cuMemsetD8Async(d.ptr, v, d.count, st->cu);
    } else if (esize == 2) {
        uint16_t v;
        memcpy(&v, value, 2);
        r = sci_cuMemsetD16Async(d.ptr, v, d.count, st->cu);
    } else if (esize == 4) {
        uint32_t v;
        memcpy(&v, value, 4);
        r = sci_cuMemsetD32Async(d.ptr, v, d.count, st->cu);
    } else {
        uint32_t half[2];
        memcpy(half, value, 8);
        if (half[0] == half[1]) {
            r = sci_cuMemsetD32Async(d.ptr, half[0], d.count * 2, st->cu);
        } else {
            /* Two strided 32-bit fills: the low words, then the high words. */
            r = sci_cuMemsetD2D32Async(d.ptr, 8, half[0], 1, d.count, st->cu);
            if (r == CUDA_SUCCESS)
                r = sci_cuMemsetD2D32Async(d.ptr + 4, 8, half[1], 1, d.count, st->cu);
        }
    }
    s = finish(d.buf->ctx, &acc, 1, st, cap, r, fn, "the memset");
    sci_stream_release(st);
out:
    sci_view_release(&d);
    return s;
}
