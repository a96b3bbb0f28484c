/* Borrowed buffers: device memory another library owns, wrapped as an sc_buffer. The
 * record is an ordinary sci_buffer (views, copies, launches, graphs and tracking don't
 * care); only its destroy differs (memory/buffer.c: release instead of free). */
#include <stdio.h>
#include <stdlib.h>

#include "interop/interop.h"

static sc_status pointer_attribute(sci_context *c, void *data, CUpointer_attribute attr,
                                   const char *attr_name, CUdeviceptr ptr, const char *what,
                                   const char *fn)
{
    CUresult r = sci_cuPointerGetAttribute(data, (int)attr, ptr);
    if (r == CUDA_SUCCESS)
        return SC_OK;
    return sci_context_fail_cu(c, r, fn, "%s: cuPointerGetAttribute(%s of 0x%llx) failed", what,
                               attr_name, (unsigned long long)ptr);
}

/* What the driver says about [ptr, ptr + bytes): device memory (not host, not managed) of
 * c's device, not of another context than the primary one, and inside one allocation. */
static sc_status check_memory(sci_context *c, CUdeviceptr ptr, uint64_t bytes,
                              const char *what, const char *fn)
{
    const unsigned long long p = ptr;
    unsigned type = 0;
    CUresult r = sci_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
    if (r == CUDA_ERROR_INVALID_VALUE)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "%s: 0x%llx is no memory the CUDA driver knows (cuPointerGetAttribute "
                        "answers CUDA_ERROR_INVALID_VALUE): pageable host memory (malloc), "
                        "freed memory or not an address; only device memory can be borrowed",
                        what, p);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(c, r, fn,
                                   "%s: cuPointerGetAttribute(memory type of 0x%llx) failed",
                                   what, p);
    unsigned managed = 0; /* the driver writes a boolean: a zeroed unsigned reads either size */
    sc_status s = pointer_attribute(c, &managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, "is managed",
                                    ptr, what, fn);
    if (s != SC_OK)
        return s;
    if (managed)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "%s: 0x%llx is managed memory (cuMemAllocManaged): only device memory "
                        "can be borrowed",
                        what, p);
    if (type == CU_MEMORYTYPE_HOST)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "%s: 0x%llx is host memory (pinned or registered with CUDA: memory "
                        "type CU_MEMORYTYPE_HOST): only device memory can be borrowed",
                        what, p);
    if (type != CU_MEMORYTYPE_DEVICE)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "%s: 0x%llx has memory type %u, not device memory "
                        "(CU_MEMORYTYPE_DEVICE = 2)",
                        what, p, type);
    int ordinal = -1;
    if ((s = pointer_attribute(c, &ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                               "device ordinal", ptr, what, fn)) != SC_OK)
        return s;
    if (ordinal != c->device)
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                        "%s: 0x%llx is memory of device %d; the context (created at %s:%d) is "
                        "on device %d",
                        what, p, ordinal, sci_basename(c->obj.file), c->obj.line, c->device);
    /* Memory of the virtual memory API or of a pool may name no context: only a context
     * that is there and another than the primary one is refused. */
    CUcontext owner = NULL;
    r = sci_cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, ptr);
    if (r == CUDA_SUCCESS && owner && owner != c->cu)
        return sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                        "%s: 0x%llx was allocated in another CUDA context than device %d's "
                        "primary context (the one safecuda and the CUDA runtime use)",
                        what, p, c->device);
    if ((s = sci_context_tolerate_cu(c, r, fn, "%s: cuPointerGetAttribute(context of 0x%llx)",
                                     what, p)) != SC_OK)
        return s;
    uint64_t start = 0, size = 0; /* CUdeviceptr and size_t: 8 bytes each */
    if ((s = pointer_attribute(c, &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                               "range start", ptr, what, fn)) != SC_OK ||
        (s = pointer_attribute(c, &size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, "range size", ptr,
                               what, fn)) != SC_OK)
        return s;
    const uint64_t end = ptr + bytes; /* checked by the caller */
    uint64_t range_end;
    if (!sci_add_ok(start, size, &range_end))
        range_end = UINT64_MAX;
    if (ptr < start || end > range_end)
        return sci_fail(SC_ERR_OUT_OF_BOUNDS, fn,
                        "%s: [0x%llx, 0x%llx) (%llu bytes) runs %llu bytes past the end of "
                        "its allocation [0x%llx, 0x%llx) (%llu bytes)",
                        what, p, (unsigned long long)end, (unsigned long long)bytes,
                        (unsigned long long)(ptr < start ? bytes : end - range_end),
                        (unsigned long long)start, (unsigned long long)range_end,
                        (unsigned long long)size);
    return SC_OK;
}

sc_status sci_buffer_borrow(sc_context ctx, uint64_t device_ptr, const sc_borrow_desc *desc,
                            sc_buffer *buffer, const char *file, int line, const char *fn)
{
    SCI_CHECK_PTR(fn, buffer);
    buffer->id = 0;
    SCI_CHECK_PTR(fn, desc);
    const char *label = desc->label ? desc->label : "";
    const size_t esize = sc_dtype_size(desc->dtype);
    if (esize == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "'%s': invalid dtype %d", label,
                        (int)desc->dtype);
    if (desc->count == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "'%s': count is 0 (zero-element buffers are not allowed)", label);
    uint64_t bytes, end;
    if (!sci_mul_ok(desc->count, esize, &bytes))
        return sci_fail(SC_ERR_OVERFLOW, fn, "'%s': %llu x %s overflows 64-bit byte sizes",
                        label, (unsigned long long)desc->count, sc_dtype_name(desc->dtype));
    if (device_ptr == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "'%s': device_ptr is 0", label);
    if (device_ptr % esize)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "'%s': device_ptr 0x%llx is not aligned to the %zu-byte elements of %s",
                        label, (unsigned long long)device_ptr, esize,
                        sc_dtype_name(desc->dtype));
    if (!sci_add_ok(device_ptr, bytes, &end))
        return sci_fail(SC_ERR_OVERFLOW, fn,
                        "'%s': device_ptr 0x%llx + %llu bytes (%llu x %s) overflows", label,
                        (unsigned long long)device_ptr, (unsigned long long)bytes,
                        (unsigned long long)desc->count, sc_dtype_name(desc->dtype));

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
    char what[160];
    snprintf(what, sizeof what, "'%s' (%llu x %s at 0x%llx)", label,
             (unsigned long long)desc->count, sc_dtype_name(desc->dtype),
             (unsigned long long)device_ptr);
    sci_buffer *b = NULL;
    if ((s = check_memory(c, device_ptr, bytes, what, fn)) != SC_OK)
        goto out;
    b = calloc(1, sizeof *b);
    if (!b) {
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a buffer record");
        goto out;
    }
    b->ctx = c;
    b->dtype = desc->dtype;
    b->count = desc->count;
    b->bytes = bytes;
    b->ptr = device_ptr;
    b->borrowed = true;
    b->owner_stream_id = desc->stream.id ? st->obj.id : 0;
    b->release = desc->release;
    b->release_user = desc->release_user;
    /* The memory counts as last written on the owner's stream (or the default stream). */
    s = sci_buffer_publish(b, desc->read_only, st, label, file, line, fn);
    if (s != SC_OK) {
        free(b);
        goto out;
    }
    pthread_mutex_lock(&c->lock);
    c->borrowed_bytes += bytes;
    c->live_buffers++;
    pthread_mutex_unlock(&c->lock);
    buffer->id = b->obj.id;
out:
    sci_stream_release(st);
    sci_context_release(c);
    return s;
}

sc_status sc_buffer_borrow_at(sc_context ctx, uint64_t device_ptr, const sc_borrow_desc *desc,
                              sc_buffer *buffer, const char *file, int line)
{
    return sci_buffer_borrow(ctx, device_ptr, desc, buffer, file, line, "sc_buffer_borrow");
}

sc_status sc_buffer_get_origin(sc_buffer buffer, sc_buffer_origin *origin)
{
    static const char fn[] = "sc_buffer_get_origin";
    SCI_CHECK_PTR(fn, origin);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_BUFFER, buffer.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_buffer *b = (sci_buffer *)obj;
    origin->borrowed = b->borrowed;
    origin->read_only = b->tracker.read_only;
    origin->exports = sci_buffer_exports(b);
    sci_registry_release(obj);
    return SC_OK;
}
