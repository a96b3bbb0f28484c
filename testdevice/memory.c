/* The test device's memory (the model: testdevice.c's header comment): device allocations,
 * memory pools, pinned host memory, pointer attributes, and the copies and memsets between
 * them (synchronous, or recorded while a stream captures). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testdevice_internal.h"

/* ---- ranges and pools' cache ------------------------------------------------------------- */

/* A host pointer: not inside a device allocation; inside a pinned allocation it must fit. */
static CUresult host_range(const void *h, uint64_t n, const char *fn, const char *what)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (!h)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "%s host pointer is NULL", what);
    fake_alloc *a = find_alloc((uintptr_t)h);
    if (!a)
        return CUDA_SUCCESS; /* pageable memory: nothing to check it against */
    if (!a->is_host)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "%s host pointer %p is a device address", what,
                   h);
    uint64_t room = a->size - ((uintptr_t)h - a->base);
    if (n > room)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "%s range [%p, +%llu) runs past the end of its pinned allocation of %llu "
                   "bytes",
                   what, h, (unsigned long long)n, (unsigned long long)a->size);
    return CUDA_SUCCESS;
}

void release_to_threshold(void)
{
    for (size_t i = 0; i < pools.n; i++) {
        fake_pool *p = pools.items[i];
        uint64_t reserved = p->used + p->cached;
        if (reserved > p->threshold) {
            uint64_t drop = reserved - p->threshold;
            p->cached -= drop < p->cached ? drop : p->cached;
        }
    }
}

uint64_t cached_total(void)
{
    uint64_t c = 0;
    for (size_t i = 0; i < pools.n; i++)
        c += ((fake_pool *)pools.items[i])->cached;
    return c;
}

/* ---- memory ------------------------------------------------------------------------------- */

CUresult f_cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    static const char fn[] = "cuMemGetInfo";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn),
           refuse_if(!free_bytes || !total, CUDA_ERROR_INVALID_VALUE, fn, "NULL out-pointer"));
    if (r == CUDA_SUCCESS) {
        uint64_t held = device_used + cached_total();
        *free_bytes = (size_t)(held < total_bytes ? total_bytes - held : 0);
        *total = (size_t)total_bytes;
    }
    td_unlock();
    return r;
}

static int push_alloc(fake_alloc a)
{
    if (n_allocs == cap_allocs) {
        size_t cap = cap_allocs ? cap_allocs * 2 : 64;
        fake_alloc *grown = realloc(allocs, cap * sizeof *grown);
        if (!grown)
            return 0;
        allocs = grown;
        cap_allocs = cap;
    }
    allocs[n_allocs++] = a;
    return 1;
}

/* Allocate n bytes of "device" memory (lock held), from pool or not. */
static CUresult device_alloc(CUdeviceptr *p, size_t n, fake_pool *pool, const char *fn)
{
    if (!p)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL out-pointer");
    if (n == 0)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "0 bytes asked");
    uint64_t from_cache = 0;
    if (pool && pool->cached >= n)
        from_cache = n; /* reuse the pool's cached memory */
    uint64_t held = device_used + cached_total() - from_cache;
    if (n > total_bytes || held > total_bytes - n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *mem = NULL;
    if (posix_memalign(&mem, 256, n) != 0 || !mem)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!push_alloc((fake_alloc){.ctx = current, .base = (uintptr_t)mem, .size = n,
                                 .pool = pool})) {
        free(mem);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (pool) {
        pool->cached -= from_cache;
        pool->used += n;
        if (pool->used > pool->used_high)
            pool->used_high = pool->used;
        if (pool->used + pool->cached > pool->reserved_high)
            pool->reserved_high = pool->used + pool->cached;
    }
    device_used += n;
    live_device++;
    *p = (CUdeviceptr)(uintptr_t)mem;
    return CUDA_SUCCESS;
}

static CUresult device_free(CUdeviceptr p, int to_pool, const char *fn)
{
    fake_alloc *a = find_base((uintptr_t)p);
    if (!a || a->is_host) {
        fake_alloc *in = find_alloc((uintptr_t)p);
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "0x%llx is not a live device allocation%s",
                   (unsigned long long)p,
                   in ? (in->is_host ? " (it is pinned host memory)"
                                     : " (it points inside one, not at its start)")
                      : "");
    }
    if (a->pool && set_has(&pools, a->pool)) {
        a->pool->used -= a->size;
        if (to_pool)
            a->pool->cached += a->size;
    }
    device_used -= a->size;
    live_device--;
    free((void *)a->base);
    *a = allocs[--n_allocs];
    return CUDA_SUCCESS;
}

CUresult f_cuMemAlloc(CUdeviceptr *p, size_t n)
{
    static const char fn[] = "cuMemAlloc";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), td_capture_unsafe(fn, 0));
    if (r == CUDA_SUCCESS)
        r = device_alloc(p, n, NULL, fn);
    td_unlock();
    return r;
}

CUresult f_cuMemFree(CUdeviceptr p)
{
    static const char fn[] = "cuMemFree";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), td_capture_unsafe(fn, 0));
    if (r == CUDA_SUCCESS)
        r = device_free(p, 0, fn);
    td_unlock();
    return r;
}

CUresult f_cuMemPoolCreate(CUmemoryPool *p, const CUmemPoolProps *props)
{
    static const char fn[] = "cuMemPoolCreate";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn),
           refuse_if(!p || !props, CUDA_ERROR_INVALID_VALUE, fn, "NULL argument"),
           refuse_if(props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
                         props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
                         props->location.id < 0 || props->location.id >= n_devices,
                     CUDA_ERROR_INVALID_VALUE, fn,
                     "bad props (allocType %d, location type %d id %d)", (int)props->allocType,
                     (int)props->location.type, props->location.id));
    if (r == CUDA_SUCCESS) {
        fake_pool *pool = calloc(1, sizeof *pool);
        if (!pool || !set_add(&pools, pool)) {
            free(pool);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            pool->magic = POOL_MAGIC;
            pool->reuse[0] = pool->reuse[1] = pool->reuse[2] = 1;
            *p = (CUmemoryPool)(void *)pool;
        }
    }
    td_unlock();
    return r;
}

CUresult f_cuMemPoolDestroy(CUmemoryPool p)
{
    static const char fn[] = "cuMemPoolDestroy";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), pool_ok(p, fn));
    if (r == CUDA_SUCCESS) {
        /* As CUDA: outstanding allocations stay valid and are freed on their own. */
        fake_pool *pool = (fake_pool *)(void *)p;
        for (size_t i = 0; i < n_allocs; i++)
            if (allocs[i].pool == pool)
                allocs[i].pool = NULL;
        set_remove(&pools, pool);
        free(pool);
    }
    td_unlock();
    return r;
}

CUresult f_cuMemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
    static const char fn[] = "cuMemPoolSetAttribute";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), pool_ok(p, fn), not_null(v, fn, "value"));
    if (r == CUDA_SUCCESS) {
        fake_pool *pool = (fake_pool *)(void *)p;
        switch ((int)a) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            pool->reuse[(int)a - 1] = *(int *)v;
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            pool->threshold = *(cuuint64_t *)v;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            if (*(cuuint64_t *)v != 0)
                r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                        "a high-water mark may only be reset to 0");
            else if ((int)a == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
                pool->reserved_high = pool->used + pool->cached;
            else
                pool->used_high = pool->used;
            break;
        default:
            r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                    "attribute %d can't be set", (int)a);
        }
    }
    td_unlock();
    return r;
}

CUresult f_cuMemPoolGetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
    static const char fn[] = "cuMemPoolGetAttribute";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), pool_ok(p, fn), not_null(v, fn, "value"));
    if (r == CUDA_SUCCESS) {
        fake_pool *pool = (fake_pool *)(void *)p;
        switch ((int)a) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            *(int *)v = pool->reuse[(int)a - 1];
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)v = pool->threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            *(cuuint64_t *)v = pool->used + pool->cached;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)v = pool->reserved_high; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)v = pool->used; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)v = pool->used_high; break;
        default:
            r = bad(CUDA_ERROR_INVALID_VALUE, fn, "unknown attribute %d",
                    (int)a);
        }
    }
    td_unlock();
    return r;
}

CUresult f_cuMemPoolTrimTo(CUmemoryPool p, size_t keep)
{
    static const char fn[] = "cuMemPoolTrimTo";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), pool_ok(p, fn));
    if (r == CUDA_SUCCESS) {
        fake_pool *pool = (fake_pool *)(void *)p;
        uint64_t reserved = pool->used + pool->cached;
        if (reserved > keep) {
            uint64_t drop = reserved - keep;
            pool->cached -= drop < pool->cached ? drop : pool->cached;
        }
    }
    td_unlock();
    return r;
}

/* Stream-ordered allocation on a capturing stream: CUDA records memory nodes, which the test
 * device does not model; safecuda never does it (its buffers outlive the graphs that use
 * them), so it is refused as misuse and invalidates the capture. */
static CUresult no_pool_capture(CUstream s, const char *fn)
{
    struct fake_capture *cap = NULL;
    CUresult r = td_capture_of(s, fn, &cap);
    if (r != CUDA_SUCCESS || !cap)
        return r;
    td_capture_failed(cap, fn);
    return bad(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, fn,
               "stream-ordered allocation or free on capturing stream %p (memory nodes are not "
               "modelled by the test device); the capture is invalidated",
               (void *)s);
}

CUresult f_cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)
{
    static const char fn[] = "cuMemAllocFromPoolAsync";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), pool_ok(pool, fn), need_stream(s, fn), no_pool_capture(s, fn));
    if (r == CUDA_SUCCESS)
        r = device_alloc(p, n, (fake_pool *)(void *)pool, fn);
    td_unlock();
    return r;
}

CUresult f_cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    static const char fn[] = "cuMemFreeAsync";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), no_pool_capture(s, fn));
    if (r == CUDA_SUCCESS)
        r = device_free(p, 1, fn);
    td_unlock();
    return r;
}

CUresult f_cuMemHostAlloc(void **p, size_t n, unsigned flags)
{
    static const char fn[] = "cuMemHostAlloc";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), td_capture_unsafe(fn, 0), not_null(p, fn, "out-pointer"),
           refuse_if(n == 0, CUDA_ERROR_INVALID_VALUE, fn, "0 bytes asked"),
           refuse_if(flags & ~0xfu, CUDA_ERROR_INVALID_VALUE, fn, "unknown flags 0x%x", flags));
    if (r == CUDA_SUCCESS) {
        void *mem = NULL;
        if (n > host_limit || host_used > host_limit - n ||
            posix_memalign(&mem, 4096, n) != 0 || !mem) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else if (!push_alloc((fake_alloc){.ctx = current, .base = (uintptr_t)mem, .size = n,
                                            .is_host = 1})) {
            free(mem);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            host_used += n;
            live_host++;
            *p = mem;
        }
    }
    td_unlock();
    return r;
}

CUresult f_cuMemFreeHost(void *p)
{
    static const char fn[] = "cuMemFreeHost";
    td_lock();
    CUresult r;
    fake_alloc *a = NULL;
    CHECKS(r, need_init(fn), td_capture_unsafe(fn, 0),
           refuse_if(!(a = find_base((uintptr_t)p)) || !a->is_host, CUDA_ERROR_INVALID_VALUE, fn,
                     "%p is not a live pinned host allocation", p));
    if (r == CUDA_SUCCESS) {
        host_used -= a->size;
        live_host--;
        free((void *)a->base);
        *a = allocs[--n_allocs];
    }
    td_unlock();
    return r;
}

/* A context that is not the primary one, for allocations a test marks as another
 * context's (only its address is used). */
static fake_ctx foreign_ctx = {CTX_MAGIC, 1, 0};

/* The attributes safecuda asks about (CU_POINTER_ATTRIBUTE_*): the truth about the live
 * allocation that contains p, or what a test set. An address in no live allocation
 * (pageable memory, freed memory) is CUDA_ERROR_INVALID_VALUE, as CUDA answers; another
 * attribute is CUDA_ERROR_INVALID_VALUE too (not misuse: the test device knows only these). */
CUresult f_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    static const char fn[] = "cuPointerGetAttribute";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), not_null(data, fn, "data"));
    fake_alloc *a = NULL;
    if (r == CUDA_SUCCESS && !(a = find_alloc((uintptr_t)p)))
        r = CUDA_ERROR_INVALID_VALUE; /* pageable or unknown memory, as CUDA */
    if (r != CUDA_SUCCESS) {
        td_unlock();
        return r;
    }
    const unsigned type = a->attrs_set ? a->memory_type : a->is_host ? CU_MEMORYTYPE_HOST
                                                                      : CU_MEMORYTYPE_DEVICE;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = type;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned char *)data = (unsigned char)(a->attrs_set && a->managed); /* a bool */
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a->attrs_set ? a->ordinal : a->ctx ? a->ctx->device : 0;
        break;
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data =
            (CUcontext)(void *)(a->attrs_set && a->foreign_context ? &foreign_ctx
                                : a->ctx                           ? a->ctx
                                                                   : &primaries[0]);
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = p; /* one address space (UVA): the same address */
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)a->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = (size_t)a->size;
        break;
    default:
        r = CUDA_ERROR_INVALID_VALUE;
    }
    td_unlock();
    return r;
}

/* ---- copies and memsets (synchronous, or recorded while capturing) ----------------------- */

/* The end of a copy or memset (lock held): on a capturing stream the validated operation is
 * recorded as a node, else it has run; an error on a capturing stream invalidates it. */
CUresult copy_done(CUresult r, struct fake_capture *cap, const char *fn)
{
    if (r != CUDA_SUCCESS && cap)
        td_capture_failed(cap, fn);
    return r;
}

CUresult f_cuMemcpyHtoDAsync(CUdeviceptr d, const void *h, size_t n, CUstream s)
{
    static const char fn[] = "cuMemcpyHtoDAsync";
    struct fake_capture *cap = NULL;
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), td_capture_of(s, fn, &cap),
           device_range(d, n, fn, "destination"), host_range(h, n, fn, "source"));
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_copy(cap, s, COPY_HTOD, (uintptr_t)d, (uintptr_t)h, n, fn);
    else if (r == CUDA_SUCCESS && n)
        memmove((void *)(uintptr_t)d, h, n);
    r = copy_done(r, cap, fn);
    td_unlock();
    return r;
}

CUresult f_cuMemcpyDtoHAsync(void *h, CUdeviceptr d, size_t n, CUstream s)
{
    static const char fn[] = "cuMemcpyDtoHAsync";
    struct fake_capture *cap = NULL;
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), td_capture_of(s, fn, &cap),
           device_range(d, n, fn, "source"), host_range(h, n, fn, "destination"));
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_copy(cap, s, COPY_DTOH, (uintptr_t)h, (uintptr_t)d, n, fn);
    else if (r == CUDA_SUCCESS && n)
        memmove(h, (const void *)(uintptr_t)d, n);
    r = copy_done(r, cap, fn);
    td_unlock();
    return r;
}

CUresult f_cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s)
{
    static const char fn[] = "cuMemcpyDtoDAsync";
    struct fake_capture *cap = NULL;
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), td_capture_of(s, fn, &cap),
           device_range(d, n, fn, "destination"), device_range(src, n, fn, "source"),
           refuse_if(n && d < src + n && src < d + n, CUDA_ERROR_INVALID_VALUE, fn,
                     "overlapping ranges [0x%llx, +%zu) and [0x%llx, +%zu)", (unsigned long long)d,
                     n, (unsigned long long)src, n));
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_copy(cap, s, COPY_DTOD, (uintptr_t)d, (uintptr_t)src, n, fn);
    else if (r == CUDA_SUCCESS && n)
        memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)src, n);
    r = copy_done(r, cap, fn);
    td_unlock();
    return r;
}

void fill_rows(uintptr_t d, size_t pitch, uint32_t v, size_t esize, size_t w, size_t h)
{
    for (size_t y = 0; y < h; y++) {
        unsigned char *p = (unsigned char *)(d + y * pitch);
        for (size_t x = 0; x < w; x++) {
            if (esize == 1)
                p[x] = (unsigned char)v;
            else if (esize == 2) {
                uint16_t v16 = (uint16_t)v;
                memcpy(p + 2 * x, &v16, 2);
            } else
                memcpy(p + 4 * x, &v, 4);
        }
    }
}

static CUresult memset_common(CUdeviceptr d, size_t pitch, uint32_t v, size_t esize, size_t w,
                              size_t h, CUstream s, const char *fn)
{
    struct fake_capture *cap = NULL;
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), need_stream(s, fn), td_capture_of(s, fn, &cap),
           refuse_if(d % esize, CUDA_ERROR_INVALID_VALUE, fn,
                     "address 0x%llx is not %zu-byte aligned", (unsigned long long)d, esize));
    size_t row = 0, span = 0;
    if (r == CUDA_SUCCESS && w && h) {
        if (__builtin_mul_overflow(w, esize, &row) ||
            (h > 1 && (pitch < row || pitch % esize)) ||
            __builtin_mul_overflow(h - 1, pitch, &span) ||
            __builtin_add_overflow(span, row, &span))
            r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                    "bad shape: %zu rows of %zu elements of %zu bytes, pitch %zu", h, w, esize,
                    pitch);
        else
            r = device_range(d, span, fn, "destination");
    }
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_memset(cap, s, (uintptr_t)d, pitch, v, esize, w, h, fn);
    else if (r == CUDA_SUCCESS && w && h)
        fill_rows((uintptr_t)d, pitch, v, esize, w, h);
    r = copy_done(r, cap, fn);
    td_unlock();
    return r;
}

CUresult f_cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    return memset_common(d, n, v, 1, n, 1, s, "cuMemsetD8Async");
}

CUresult f_cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s)
{
    return memset_common(d, 2 * n, v, 2, n, 1, s, "cuMemsetD16Async");
}

CUresult f_cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s)
{
    return memset_common(d, 4 * n, v, 4, n, 1, s, "cuMemsetD32Async");
}

CUresult f_cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned v, size_t w,
                              size_t h, CUstream s)
{
    return memset_common(d, pitch, v, 4, w, h, s, "cuMemsetD2D32Async");
}
