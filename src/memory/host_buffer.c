/* Pinned host buffers: page-locked memory whose asynchronous copies are tracked, so the
 * memory is never rewritten, read or freed while a copy is in flight. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "memory/buffer.h"
#include "stream/capture.h"

static sc_status host_destroy(sci_object *obj, const char *fn);

static void describe_host(const sci_object *obj, sc_object_info *info)
{
    const sci_host_buffer *h = (const sci_host_buffer *)obj;
    snprintf(info->detail, sizeof info->detail, "%llu bytes pinned",
             (unsigned long long)h->bytes);
    info->bytes = h->bytes;
}

static const sci_kind_ops host_ops = {"host buffer", describe_host, host_destroy};

__attribute__((constructor)) static void register_host_kind(void)
{
    sci_registry_set_ops(SCI_KIND_HOST_BUFFER, &host_ops);
}

sc_status sc_host_buffer_create_at(sc_context ctx, const sc_host_buffer_desc *desc,
                                   sc_host_buffer *host, const char *file, int line)
{
    static const char fn[] = "sc_host_buffer_create";
    SCI_CHECK_PTR(fn, host);
    host->id = 0;
    SCI_CHECK_PTR(fn, desc);
    const char *label = desc->label ? desc->label : "";
    if (desc->bytes == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "'%s': bytes is 0 (empty host buffers are not allowed)", label);
    sc_status s = sci_guard_refuse(fn, "pinning host memory");
    if (s != SC_OK)
        return s;
    sci_context *c = NULL;
    s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    sci_host_buffer *h = calloc(1, sizeof *h);
    if (!h) {
        sci_context_release(c);
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a host buffer record");
    }
    CUresult r = sci_cuMemHostAlloc(&h->ptr, desc->bytes, CU_MEMHOSTALLOC_PORTABLE);
    if (r != CUDA_SUCCESS) {
        free(h);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn,
                         "'%s': cannot pin %llu bytes of host memory: CUDA_ERROR_OUT_OF_MEMORY",
                         label, (unsigned long long)desc->bytes);
        else
            s = sci_context_fail_cu(c, r, fn, "'%s': cuMemHostAlloc(%llu bytes) failed", label,
                                    (unsigned long long)desc->bytes);
        sci_context_release(c);
        return s;
    }
    if (desc->zero)
        memset(h->ptr, 0, desc->bytes);
    h->ctx = c;
    h->bytes = desc->bytes;
    s = sci_registry_insert(&h->obj, SCI_KIND_HOST_BUFFER, c->obj.id, label, file, line, fn);
    if (s != SC_OK) {
        s = sci_context_cleanup_cu(c, s, sci_cuMemFreeHost(h->ptr), "cuMemFreeHost");
        free(h);
        sci_context_release(c);
        return s;
    }
    sci_tracker_init(&h->tracker, h->obj.id);
    /* Tracked lazily, like a device buffer: a copy records no event; a host wait (ptr,
     * read, write, destroy) records one on the stream of each use that has none yet and
     * waits for it. That event also covers work enqueued on that stream after the copy, so
     * a wait can last longer than the copy itself, never shorter; it saves an event record
     * (about a microsecond of host time) on every asynchronous copy. */
    pthread_mutex_lock(&c->lock);
    c->pinned_bytes += h->bytes;
    pthread_mutex_unlock(&c->lock);
    host->id = h->obj.id;
    sci_context_release(c);
    return SC_OK;
}

static sc_status acquire(sc_host_buffer host, const char *fn, sci_host_buffer **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_HOST_BUFFER, host.id, fn, &obj);
    if (s != SC_OK)
        return s;
    *out = (sci_host_buffer *)obj;
    return SC_OK;
}

static sc_status wait_idle(sci_host_buffer *h, bool try_only, const char *fn)
{
    sc_status s = sci_context_enter(h->ctx, fn);
    if (s != SC_OK)
        return s;
    s = sci_tracker_host_wait(&h->tracker, h->ctx, try_only, fn);
    if (s == SC_ERR_BUSY)
        sci_fail(SC_ERR_BUSY, fn, "host buffer '%s' (created at %s:%d): a copy that uses it is "
                 "still in flight", h->obj.label, sci_basename(h->obj.file), h->obj.line);
    return s;
}

static void free_pinned(void *ptr) { sci_cuMemFreeHost(ptr); }

/* sc_host_buffer_try_destroy's condition: no copy that uses the buffer in flight. */
static sc_status check_idle(uint64_t id, const char *fn)
{
    sci_host_buffer *h = NULL;
    sc_status s = acquire((sc_host_buffer){id}, fn, &h);
    if (s != SC_OK)
        return s;
    s = wait_idle(h, true, fn);
    sci_registry_release(&h->obj);
    return s == SC_ERR_BUSY ? s : SC_OK;
}

/* The host buffer's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status host_destroy(sci_object *obj, const char *fn)
{
    sci_host_buffer *h = (sci_host_buffer *)obj;
    sci_context *c = h->ctx;
    sci_release rl;
    sci_release_begin(&rl, c, fn);
    if (sci_release_live(&rl)) {
        sc_status s = wait_idle(h, false, fn);
        sci_release_status(&rl, s);
        /* can't wait for its copies: wait for all (not during a capture that forbids it) */
        if (s != SC_OK && sci_release_live(&rl) && !sci_guard_context_busy(c))
            sci_release_tolerate(&rl, sci_cuCtxSynchronize(), "cuCtxSynchronize failed");
    }
    sci_release_make_current(&rl);
    sci_release_check(&rl, sci_tracker_destroy(&h->tracker),
                      "cuEventDestroy of an ordering event failed");
    /* cuMemFreeHost would invalidate a capture that forbids it: it waits for that capture's
     * end then (the memory is no longer the buffer's either way). */
    CUresult r = CUDA_SUCCESS;
    if (sci_guard_active())
        sci_guard_defer(free_pinned, h->ptr);
    else
        r = sci_cuMemFreeHost(h->ptr);
    sci_release_check(&rl, r, "cuMemFreeHost(%llu bytes) failed: they stay pinned",
                      (unsigned long long)h->bytes);
    /* Memory the driver refused to free stays pinned: it stays in pinned_bytes. */
    if (r == CUDA_SUCCESS || sci_cu_error_is_sticky(r)) {
        pthread_mutex_lock(&c->lock);
        c->pinned_bytes -= h->bytes;
        pthread_mutex_unlock(&c->lock);
    }
    free(h);
    return sci_release_end(&rl);
}

sc_status sc_host_buffer_destroy(sc_host_buffer host)
{
    return sci_object_destroy(SCI_KIND_HOST_BUFFER, host.id, NULL, "sc_host_buffer_destroy");
}

sc_status sc_host_buffer_try_destroy(sc_host_buffer host)
{
    return sci_object_destroy(SCI_KIND_HOST_BUFFER, host.id, check_idle,
                              "sc_host_buffer_try_destroy");
}

static sc_status get_ptr(sc_host_buffer host, void **ptr, uint64_t *bytes, bool try_only,
                         const char *fn)
{
    SCI_CHECK_PTR(fn, ptr);
    sci_host_buffer *h = NULL;
    sc_status s = acquire(host, fn, &h);
    if (s != SC_OK)
        return s;
    s = wait_idle(h, try_only, fn);
    if (s == SC_OK) {
        *ptr = h->ptr;
        if (bytes)
            *bytes = h->bytes;
    }
    sci_registry_release(&h->obj);
    return s;
}

sc_status sc_host_buffer_ptr(sc_host_buffer host, void **ptr, uint64_t *bytes)
{
    return get_ptr(host, ptr, bytes, false, "sc_host_buffer_ptr");
}

sc_status sc_host_buffer_try_ptr(sc_host_buffer host, void **ptr, uint64_t *bytes)
{
    return get_ptr(host, ptr, bytes, true, "sc_host_buffer_try_ptr");
}

static sc_status host_io(sc_host_buffer host, uint64_t offset, void *user, uint64_t bytes,
                         bool write, const char *fn)
{
    if (bytes && !user)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "argument '%s' is NULL",
                        write ? "src" : "dst");
    sci_host_buffer *h = NULL;
    sc_status s = acquire(host, fn, &h);
    if (s != SC_OK)
        return s;
    uint64_t end;
    if (!sci_add_ok(offset, bytes, &end))
        s = sci_fail(SC_ERR_OVERFLOW, fn, "offset %llu + %llu bytes overflows",
                     (unsigned long long)offset, (unsigned long long)bytes);
    else if (end > h->bytes)
        s = sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                     "bytes [%llu, %llu) outside host buffer '%s' of %llu bytes (created at "
                     "%s:%d)",
                     (unsigned long long)offset, (unsigned long long)end, h->obj.label,
                     (unsigned long long)h->bytes, sci_basename(h->obj.file), h->obj.line);
    else if (bytes && (s = sci_context_enter(h->ctx, fn)) == SC_OK) {
        /* Hold the tracker across the wait and the memcpy, so no copy can be enqueued on
         * the buffer in between. */
        pthread_mutex_lock(&h->tracker.lock);
        s = sci_tracker_host_wait_locked(&h->tracker, h->ctx, false, fn);
        if (s == SC_OK) {
            if (write)
                memcpy((char *)h->ptr + offset, user, bytes);
            else
                memcpy(user, (char *)h->ptr + offset, bytes);
        }
        pthread_mutex_unlock(&h->tracker.lock);
    }
    sci_registry_release(&h->obj);
    return s;
}

sc_status sc_host_buffer_write(sc_host_buffer host, uint64_t offset, const void *src,
                               uint64_t bytes)
{
    return host_io(host, offset, (void *)src, bytes, true, "sc_host_buffer_write");
}

sc_status sc_host_buffer_read(sc_host_buffer host, uint64_t offset, void *dst, uint64_t bytes)
{
    return host_io(host, offset, dst, bytes, false, "sc_host_buffer_read");
}
