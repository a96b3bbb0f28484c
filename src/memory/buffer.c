/* Device buffers and views. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "memory/buffer.h"
#include "memory/pool.h"
#include "stream/capture.h"

static void describe_buffer(const sci_object *obj, sc_object_info *info)
{
    const sci_buffer *b = (const sci_buffer *)obj;
    snprintf(info->detail, sizeof info->detail, "%llu x %s%s%s", (unsigned long long)b->count,
             sc_dtype_name(b->dtype), b->borrowed ? ", borrowed" : "",
             b->tracker.read_only ? ", read-only" : "");
    info->bytes = b->bytes;
}

static sc_status buffer_destroy(sci_object *obj, const char *fn);

static const sci_kind_ops buffer_ops = {"buffer", describe_buffer, buffer_destroy};

__attribute__((constructor)) static void register_buffer_kind(void)
{
    sci_registry_set_ops(SCI_KIND_BUFFER, &buffer_ops);
}

const char *sci_buffer_describe(const sci_buffer *b, char *buf, size_t size)
{
    snprintf(buf, size, "%sbuffer '%s' of %llu %s (created at %s:%d)",
             b->borrowed ? "borrowed " : "", b->obj.label, (unsigned long long)b->count,
             sc_dtype_name(b->dtype), sci_basename(b->obj.file), b->obj.line);
    return buf;
}

/* The tracker's description of its buffer (order.h: for the read-only refusal). */
static const char *describe_tracked(const sci_tracker *t, char *buf, size_t size)
{
    const sci_buffer *b =
        (const sci_buffer *)(const void *)((const char *)t - offsetof(sci_buffer, tracker));
    return sci_buffer_describe(b, buf, size);
}

sc_status sci_buffer_publish(sci_buffer *b, bool read_only, sci_stream *first_writer,
                             const char *label, const char *file, int line, const char *fn)
{
    /* The tracker is ready before the record is published. The first use is a write on
     * first_writer (the allocation and its zeroing, or the owner's writes); on a wrapped
     * stream the point after it is recorded (stream/capture.h). */
    sc_status s = sci_stream_note_owner_writes(first_writer, fn);
    if (s != SC_OK)
        return s;
    sci_tracker_init(&b->tracker, 0);
    b->tracker.describe = describe_tracked;
    b->tracker.read_only = read_only;
    b->tracker.write.stream_id = first_writer->obj.id;
    b->tracker.write.cu = first_writer->cu;
    s = sci_registry_insert(&b->obj, SCI_KIND_BUFFER, b->ctx->obj.id, label, file, line, fn);
    if (s != SC_OK) {
        sci_tracker_destroy(&b->tracker); /* no event yet: nothing for the driver */
        return s;
    }
    b->tracker.owner_id = b->obj.id; /* the lock order; before the caller hands out the id */
    return SC_OK;
}

sc_status sc_buffer_create_at(sc_context ctx, const sc_buffer_desc *desc, sc_buffer *buffer,
                              const char *file, int line)
{
    static const char fn[] = "sc_buffer_create";
    SCI_CHECK_PTR(fn, buffer);
    buffer->id = 0;
    SCI_CHECK_PTR(fn, desc);
    const char *label = desc->label ? desc->label : "";
    size_t esize = sc_dtype_size(desc->dtype);
    if (esize == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "'%s': invalid dtype %d", label,
                        (int)desc->dtype);
    if (desc->count == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "'%s': count is 0 (zero-element buffers are not allowed)", label);
    uint64_t bytes;
    if (!sci_mul_ok(desc->count, esize, &bytes))
        return sci_fail(SC_ERR_OVERFLOW, fn, "'%s': %llu x %s overflows 64-bit byte sizes",
                        label, (unsigned long long)desc->count, sc_dtype_name(desc->dtype));

    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c); /* checks health, makes it current */
    if (s != SC_OK)
        return s;
    sci_stream *st = NULL;
    s = sci_stream_resolve(desc->stream, c, fn, &st);
    if (s != SC_OK) {
        sci_context_release(c);
        return s;
    }
    /* An allocation on a capturing stream would become part of the graph. */
    if ((s = sci_capture_refuse_stream(st, fn, "creating a buffer on it")) != SC_OK)
        goto out;
    sci_buffer *b = calloc(1, sizeof *b);
    if (!b) {
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a buffer record");
        goto out;
    }
    char what[160];
    snprintf(what, sizeof what, "'%s' (%llu x %s)", label, (unsigned long long)desc->count,
             sc_dtype_name(desc->dtype));
    s = sci_device_alloc(c, st, bytes, what, fn, &b->ptr);
    if (s != SC_OK) {
        free(b);
        goto out;
    }
    if (desc->zero) {
        CUresult r = sci_cuMemsetD8Async(b->ptr, 0, bytes, st->cu);
        if (r != CUDA_SUCCESS) {
            s = sci_context_fail_cu(c, r, fn, "zeroing %s failed", what);
            s = sci_context_cleanup_cu(c, s, sci_device_free(c, st->cu, b->ptr, bytes),
                                       "cuMemFreeAsync");
            free(b);
            goto out;
        }
    }
    b->ctx = c;
    b->dtype = desc->dtype;
    b->count = desc->count;
    b->bytes = bytes;
    s = sci_buffer_publish(b, false, st, label, file, line, fn);
    if (s != SC_OK) {
        s = sci_context_cleanup_cu(c, s, sci_device_free(c, st->cu, b->ptr, bytes),
                                   "cuMemFreeAsync");
        free(b);
        goto out;
    }
    buffer->id = b->obj.id;
out:
    sci_stream_release(st);
    sci_context_release(c);
    return s;
}

/* The stream to free on: the last stream that used the buffer if it still exists, else
 * the default stream; the context's service stream instead of one that is capturing (the
 * free would become part of the graph). Returns a referenced stream. */
static sc_status free_stream(sci_buffer *b, const char *fn, sci_stream **out)
{
    uint64_t id = sci_tracker_last_stream(&b->tracker);
    sci_object *obj = NULL;
    sc_status s;
    if (id && sci_registry_acquire(SCI_KIND_STREAM, id, fn, &obj) == SC_OK)
        *out = (sci_stream *)obj;
    else if ((s = sci_context_default_stream(b->ctx, fn, out)) != SC_OK)
        return s;
    if (!sci_stream_is_capturing_now(*out))
        return SC_OK;
    sci_stream_release(*out);
    return sci_context_service_stream(b->ctx, fn, out);
}

/* A borrowed buffer's memory goes back to its owner: the owner stream (if it still exists)
 * is made to wait for every use, else the host waits for them; then release runs, once,
 * whatever the driver answered (on a lost context the work is gone). While the owner
 * stream captures (torch.cuda.graph), the owner's next use of the memory is in the graph:
 * it follows the captured uses on the owner stream by stream order, the captured uses on
 * the capture's other streams are joined into it, and only uses outside the capture on
 * other streams are waited for on the host (none when everything ran on the owner's
 * stream, as the PyTorch operator does). */
static void release_borrowed(sci_buffer *b, sci_release *rl, const char *fn)
{
    sci_context *c = b->ctx;
    if (sci_release_live(rl)) {
        bool ordered = false;
        sci_object *obj = NULL;
        if (b->owner_stream_id &&
            sci_registry_acquire(SCI_KIND_STREAM, b->owner_stream_id, fn, &obj) == SC_OK) {
            sci_stream *owner = (sci_stream *)obj;
            if (!sci_stream_is_capturing_now(owner)) {
                pthread_mutex_lock(&b->tracker.lock);
                sc_status f = sci_tracker_order_all(&b->tracker, owner, fn);
                pthread_mutex_unlock(&b->tracker.lock);
                sci_release_status(rl, f);
                ordered = f == SC_OK;
            } else {
                sc_status f = sci_capture_order_object(owner, b->obj.id, fn);
                if (f == SC_OK)
                    f = sci_tracker_host_wait_except(&b->tracker, c, owner->obj.id, fn);
                sci_release_status(rl, f);
                ordered = true; /* never a host-wide wait inside a capture */
            }
            sci_stream_release(owner);
        }
        if (!ordered && sci_release_live(rl)) {
            sc_status f = sci_tracker_host_wait(&b->tracker, c, false, fn);
            sci_release_status(rl, f);
            if (f != SC_OK && sci_release_live(rl) && !sci_guard_context_busy(c))
                sci_release_tolerate(rl, sci_cuCtxSynchronize(), "cuCtxSynchronize failed");
        }
    }
    pthread_mutex_lock(&c->lock);
    c->borrowed_bytes -= b->bytes;
    c->live_buffers--;
    pthread_mutex_unlock(&c->lock);
    if (b->release)
        b->release(b->release_user); /* no lock held: it may call anything but b's context */
}

/* Free the memory of a buffer that is off the registry (stream-ordered after every use on
 * every stream), or give borrowed memory back; then free the record. */
static sc_status buffer_free(sci_buffer *b, const char *fn)
{
    sci_context *c = b->ctx;
    sci_release rl;
    sci_release_begin(&rl, c, fn);
    sci_release_make_current(&rl);
    if (b->borrowed) {
        release_borrowed(b, &rl, fn);
    } else {
        CUstream on = NULL;
        sci_stream *st = NULL;
        if (sci_release_live(&rl)) {
            /* Free stream-ordered after every use on every stream. */
            sc_status f = free_stream(b, fn, &st);
            sci_release_status(&rl, f);
            if (f == SC_OK) {
                pthread_mutex_lock(&b->tracker.lock);
                f = sci_tracker_order_all(&b->tracker, st, fn);
                pthread_mutex_unlock(&b->tracker.lock);
                sci_release_status(&rl, f);
                on = st->cu;
            }
            if (f != SC_OK && sci_release_live(&rl) && !sci_guard_context_busy(c)) {
                /* can't order the free: wait for all */
                sci_release_tolerate(&rl, sci_cuCtxSynchronize(), "cuCtxSynchronize failed");
                on = NULL;
            }
        }
        /* On a lost context this only takes the buffer off the accounting. */
        CUresult r = sci_device_free(c, on, b->ptr, b->bytes);
        sci_release_check(&rl, r, "cuMemFreeAsync(%llu bytes) failed: the driver keeps them",
                          (unsigned long long)b->bytes);
        if (st)
            sci_stream_release(st);
    }
    sci_release_check(&rl, sci_tracker_destroy(&b->tracker),
                      "cuEventDestroy of an ordering event failed");
    free(b);
    return sci_release_end(&rl);
}

/* Guards sci_buffer.exports and .destroyed (rarely taken: exports, their drops, and the
 * destroys of buffers). */
static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;

/* The buffer's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status buffer_destroy(sci_object *obj, const char *fn)
{
    sci_buffer *b = (sci_buffer *)obj;
    /* No export can be added from now on (it needs a reference to the buffer). */
    pthread_mutex_lock(&hold_lock);
    const bool held = b->exports > 0;
    b->destroyed = held;
    pthread_mutex_unlock(&hold_lock);
    if (held) /* the last export's drop frees the memory */
        return SC_OK;
    return buffer_free(b, fn);
}

void sci_buffer_export_hold(sci_buffer *b)
{
    pthread_mutex_lock(&hold_lock);
    b->exports++;
    pthread_mutex_unlock(&hold_lock);
}

sc_status sci_buffer_export_drop(sci_buffer *b, const char *fn)
{
    pthread_mutex_lock(&hold_lock);
    const bool last = --b->exports == 0 && b->destroyed;
    pthread_mutex_unlock(&hold_lock);
    return last ? buffer_free(b, fn) : SC_OK;
}

uint32_t sci_buffer_exports(sci_buffer *b)
{
    pthread_mutex_lock(&hold_lock);
    uint32_t n = b->exports;
    pthread_mutex_unlock(&hold_lock);
    return n;
}

sc_status sci_buffer_check_writable(sc_buffer buffer, const char *fn, const char *what)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_BUFFER, buffer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    const sci_buffer *b = (const sci_buffer *)obj;
    char desc[200];
    if (b->tracker.read_only)
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "%s: %s is read-only (borrowed or imported read-only): it can't be "
                     "written",
                     what, sci_buffer_describe(b, desc, sizeof desc));
    sci_registry_release(obj);
    return s;
}

sc_status sci_buffer_destroy(uint64_t id, const char *fn)
{
    return sci_object_destroy(SCI_KIND_BUFFER, id, NULL, fn);
}

sc_status sc_buffer_destroy(sc_buffer buffer)
{
    return sci_buffer_destroy(buffer.id, "sc_buffer_destroy");
}

void sci_buffer_set_internal(sc_buffer buffer)
{
    /* Under the registry's lock: sc_context_live_objects reads the flag on other threads. */
    sci_registry_mark_internal(SCI_KIND_BUFFER, buffer.id);
}

sc_status sc_buffer_info(sc_buffer buffer, sc_buffer_props *props)
{
    static const char fn[] = "sc_buffer_info";
    SCI_CHECK_PTR(fn, props);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_BUFFER, buffer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    const sci_buffer *b = (const sci_buffer *)obj;
    props->dtype = b->dtype;
    props->count = b->count;
    props->bytes = b->bytes;
    snprintf(props->label, sizeof props->label, "%s", b->obj.label);
    props->file = sci_basename(b->obj.file);
    props->line = b->obj.line;
    props->context.id = b->ctx->obj.id;
    sci_registry_release(obj);
    return SC_OK;
}

sc_status sc_buffer_device_ptr(sc_buffer buffer, uint64_t *device_ptr)
{
    static const char fn[] = "sc_buffer_device_ptr";
    SCI_CHECK_PTR(fn, device_ptr);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_BUFFER, buffer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    *device_ptr = ((sci_buffer *)obj)->ptr;
    sci_registry_release(obj);
    return SC_OK;
}

/* ---- views ---------------------------------------------------------------------------- */

sc_status sci_view_resolve(sc_view v, const char *fn, const char *what, sci_resolved_view *out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_BUFFER, v.buffer.id, fn, &obj);
    if (s != SC_OK) {
        if (what && what[0])
            sci_error_append(" (%s)", what);
        return s;
    }
    sci_buffer *b = (sci_buffer *)obj;
    uint64_t count = v.count, end;
    char desc[200];
    if (count == SC_WHOLE) {
        if (v.offset > b->count) {
            sci_registry_release(obj);
            return sci_fail(SC_ERR_OUT_OF_BOUNDS, fn, "%s%sview offset %llu is past the end of %s",
                            what, what[0] ? ": " : "", (unsigned long long)v.offset,
                            sci_buffer_describe(b, desc, sizeof desc));
        }
        count = b->count - v.offset;
    }
    if (!sci_add_ok(v.offset, count, &end)) {
        sci_registry_release(obj);
        return sci_fail(SC_ERR_OVERFLOW, fn,
                        "%s%sview offset %llu + count %llu overflows (%s)", what,
                        what[0] ? ": " : "", (unsigned long long)v.offset,
                        (unsigned long long)count, sci_buffer_describe(b, desc, sizeof desc));
    }
    if (end > b->count) {
        sci_registry_release(obj);
        return sci_fail(SC_ERR_OUT_OF_BOUNDS, fn, "%s%selements [%llu, %llu) outside %s", what,
                        what[0] ? ": " : "", (unsigned long long)v.offset,
                        (unsigned long long)end, sci_buffer_describe(b, desc, sizeof desc));
    }
    out->buf = b;
    out->offset = v.offset;
    out->count = count;
    out->bytes = count * sc_dtype_size(b->dtype);
    out->ptr = b->ptr + v.offset * sc_dtype_size(b->dtype);
    return SC_OK;
}

void sci_view_release(sci_resolved_view *rv)
{
    if (rv->buf)
        sci_registry_release(&rv->buf->obj);
    rv->buf = NULL;
}

sc_status sc_buffer_view(sc_buffer buffer, uint64_t offset, uint64_t count, sc_view *view)
{
    static const char fn[] = "sc_buffer_view";
    SCI_CHECK_PTR(fn, view);
    sci_resolved_view rv = {0};
    sc_status s = sci_view_resolve((sc_view){buffer, offset, count}, fn, "", &rv);
    if (s != SC_OK)
        return s;
    *view = (sc_view){buffer, rv.offset, rv.count};
    sci_view_release(&rv);
    return SC_OK;
}

sc_status sc_view_sub(sc_view view, uint64_t offset, uint64_t count, sc_view *sub)
{
    static const char fn[] = "sc_view_sub";
    SCI_CHECK_PTR(fn, sub);
    sci_resolved_view rv = {0};
    sc_status s = sci_view_resolve(view, fn, "view", &rv);
    if (s != SC_OK)
        return s;
    uint64_t end;
    char desc[200];
    if (count == SC_WHOLE) {
        if (offset > rv.count) {
            s = sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                         "sub-view offset %llu is past the end of a %llu-element view of %s",
                         (unsigned long long)offset, (unsigned long long)rv.count,
                         sci_buffer_describe(rv.buf, desc, sizeof desc));
            goto out;
        }
        count = rv.count - offset;
    }
    if (!sci_add_ok(offset, count, &end)) {
        s = sci_fail(SC_ERR_OVERFLOW, fn, "sub-view offset %llu + count %llu overflows",
                     (unsigned long long)offset, (unsigned long long)count);
        goto out;
    }
    if (end > rv.count) {
        s = sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                     "elements [%llu, %llu) outside a %llu-element view (at offset %llu) of %s",
                     (unsigned long long)offset, (unsigned long long)end,
                     (unsigned long long)rv.count, (unsigned long long)rv.offset,
                     sci_buffer_describe(rv.buf, desc, sizeof desc));
        goto out;
    }
    *sub = (sc_view){view.buffer, rv.offset + offset, count};
out:
    sci_view_release(&rv);
    return s;
}
