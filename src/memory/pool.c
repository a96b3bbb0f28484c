#include <stdio.h>

#include "driver/driver.h"
#include "memory/pool.h"
#include "stream/capture.h"

static void destroy_pool(sci_context *c, sci_release *rl)
{
    if (c->pool) {
        sci_release_check(rl, sci_cuMemPoolDestroy(c->pool), "cuMemPoolDestroy failed");
        c->pool = NULL;
    }
}

__attribute__((constructor)) static void register_pool_teardown(void)
{
    sci_context_add_teardown(destroy_pool, 10);
}

sc_status sci_context_pool(sci_context *c, const char *fn, CUmemoryPool *pool)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&c->lock);
    if (!c->pool) {
        CUmemPoolProps props = {0};
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = c->device;
        CUmemoryPool p;
        r = sci_cuMemPoolCreate(&p, &props);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&c->lock);
            return sci_context_fail_cu(c, r, fn, "cuMemPoolCreate(device %d) failed", c->device);
        }
        /* Keep freed memory cached for reuse (sc_context_trim gives it back). */
        cuuint64_t keep = UINT64_MAX;
        r = sci_cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
        c->pool = p;
    }
    *pool = c->pool;
    pthread_mutex_unlock(&c->lock);
    /* Without the threshold the pool still works, it only gives memory back sooner. */
    return sci_context_tolerate_cu(c, r, fn, "cuMemPoolSetAttribute(release threshold) failed");
}

sc_status sci_device_alloc(sci_context *c, sci_stream *stream, uint64_t bytes, const char *what,
                           const char *fn, CUdeviceptr *ptr)
{
    CUmemoryPool pool = NULL;
    sc_status s = sci_context_pool(c, fn, &pool);
    if (s != SC_OK)
        return s;

    /* Reserve the bytes against the budget first, so concurrent allocations can't both
     * pass the check. */
    pthread_mutex_lock(&c->lock);
    uint64_t in_use = c->bytes_in_use, after;
    if (!sci_add_ok(in_use, bytes, &after) || (c->vram_budget && after > c->vram_budget)) {
        pthread_mutex_unlock(&c->lock);
        return sci_fail(SC_ERR_BUDGET_EXCEEDED, fn,
                        "%s needs %llu bytes; the context uses %llu of its VRAM budget of %llu "
                        "bytes (%llu bytes left)",
                        what, (unsigned long long)bytes, (unsigned long long)in_use,
                        (unsigned long long)c->vram_budget,
                        (unsigned long long)(c->vram_budget > in_use ? c->vram_budget - in_use
                                                                     : 0));
    }
    c->bytes_in_use = after;
    c->live_buffers++;
    const uint64_t prior_peak = c->peak_bytes;
    if (after > c->peak_bytes)
        c->peak_bytes = after; /* counted optimistically; undone if the allocation fails */
    pthread_mutex_unlock(&c->lock);

    CUresult r = sci_cuMemAllocFromPoolAsync(ptr, bytes, pool, stream->cu);
    const char *call = "cuMemAllocFromPoolAsync";
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        /* Give the pool's cached memory back to the device and try once more. A failure of
         * these two only makes the retry less likely to succeed, unless it is sticky. */
        CUresult q = CUDA_SUCCESS;
        if (sci_guard_context_busy(c)) /* it would invalidate a capture: fail as asked */
            q = CUDA_ERROR_OUT_OF_MEMORY;
        else
            q = sci_cuCtxSynchronize();
        if (q == CUDA_ERROR_OUT_OF_MEMORY) {
            /* no retry */
        } else if (sci_cu_error_is_sticky(q)) {
            r = q;
            call = "cuCtxSynchronize before retrying";
        } else if (sci_cu_error_is_sticky(q = sci_cuMemPoolTrimTo(pool, 0))) {
            r = q;
            call = "cuMemPoolTrimTo before retrying";
        } else {
            r = sci_cuMemAllocFromPoolAsync(ptr, bytes, pool, stream->cu);
        }
    }
    if (r != CUDA_SUCCESS) {
        pthread_mutex_lock(&c->lock);
        c->bytes_in_use -= bytes;
        c->live_buffers--;
        if (c->peak_bytes == after) /* the peak was this request's: take it back */
            c->peak_bytes = prior_peak > c->bytes_in_use ? prior_peak : c->bytes_in_use;
        uint64_t used = c->bytes_in_use;
        pthread_mutex_unlock(&c->lock);
        if (r == CUDA_ERROR_OUT_OF_MEMORY) {
            size_t free_b = 0, total_b = 0;
            CUresult q = sci_cuMemGetInfo(&free_b, &total_b); /* for the message only */
            if (sci_cu_error_is_sticky(q))
                return sci_context_fail_cu(c, q, fn, "cuMemGetInfo failed");
            return sci_fail(SC_ERR_OUT_OF_MEMORY, fn,
                            "%s needs %llu bytes; the device has %llu of %llu bytes free and "
                            "the context uses %llu bytes: CUDA_ERROR_OUT_OF_MEMORY",
                            what, (unsigned long long)bytes, (unsigned long long)free_b,
                            (unsigned long long)total_b, (unsigned long long)used);
        }
        return sci_context_fail_cu(c, r, fn, "%s failed (%llu bytes for %s)", call,
                                   (unsigned long long)bytes, what);
    }
    return SC_OK;
}

CUresult sci_device_free(sci_context *c, CUstream stream, CUdeviceptr ptr, uint64_t bytes)
{
    CUresult r = CUDA_SUCCESS;
    if (!atomic_load(&c->lost))
        r = sci_cuMemFreeAsync(ptr, stream);
    /* A free the driver refused (on a usable context) leaves the memory allocated: its
     * bytes stay in bytes_in_use, against the budget, until the context is destroyed. */
    bool refused = r != CUDA_SUCCESS && !sci_cu_error_is_sticky(r);
    pthread_mutex_lock(&c->lock);
    if (!refused)
        c->bytes_in_use -= bytes;
    c->live_buffers--;
    pthread_mutex_unlock(&c->lock);
    return r;
}

sc_status sc_context_memory(sc_context ctx, sc_memory_stats *stats)
{
    static const char fn[] = "sc_context_memory";
    SCI_CHECK_PTR(fn, stats);
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    pthread_mutex_lock(&c->lock);
    stats->bytes_in_use = c->bytes_in_use;
    stats->peak_bytes = c->peak_bytes;
    stats->live_buffers = c->live_buffers;
    stats->vram_budget = c->vram_budget;
    stats->pinned_bytes = c->pinned_bytes;
    stats->borrowed_bytes = c->borrowed_bytes;
    CUmemoryPool pool = c->pool;
    pthread_mutex_unlock(&c->lock);
    cuuint64_t reserved = 0;
    CUresult r = CUDA_SUCCESS;
    if (pool)
        r = sci_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    if (r != CUDA_SUCCESS)
        s = sci_context_fail_cu(c, r, fn, "cuMemPoolGetAttribute(reserved memory) failed");
    stats->pool_reserved = reserved;
    size_t free_b = 0, total_b = 0;
    r = sci_cuMemGetInfo(&free_b, &total_b);
    if (r != CUDA_SUCCESS && s == SC_OK)
        s = sci_context_fail_cu(c, r, fn, "cuMemGetInfo failed");
    stats->device_free = free_b;
    stats->device_total = total_b;
    sci_context_release(c);
    return s;
}

sc_status sc_context_trim(sc_context ctx)
{
    static const char fn[] = "sc_context_trim";
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    if ((s = sci_guard_refuse_context(c, fn, "trimming the pool (it waits for the context)")) !=
        SC_OK) {
        sci_context_release(c);
        return s;
    }
    CUresult r = sci_cuCtxSynchronize();
    /* The pool is created under c->lock by the first allocation, maybe on another thread. */
    pthread_mutex_lock(&c->lock);
    CUmemoryPool pool = c->pool;
    pthread_mutex_unlock(&c->lock);
    if (r != CUDA_SUCCESS)
        s = sci_context_fail_cu(c, r, fn, "cuCtxSynchronize failed");
    else if (pool && (r = sci_cuMemPoolTrimTo(pool, 0)) != CUDA_SUCCESS)
        s = sci_context_fail_cu(c, r, fn, "cuMemPoolTrimTo failed");
    sci_context_release(c);
    return s;
}
