/* The test device's modules, functions and launches (the model: testdevice.c's header
 * comment): module loads (PTX only, read by ptx.c), function attributes, occupancy, and
 * launches, validated and then refused (or recorded while a stream captures). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testdevice_internal.h"

/* ---- modules ----------------------------------------------------------------------------- */

static void jit_log(unsigned n, CUjit_option *opts, void **vals, const char *msg)
{
    char *buf = NULL;
    size_t size = 0;
    for (unsigned i = 0; opts && vals && i < n; i++) {
        if (opts[i] == 5)
            buf = vals[i];
        else if (opts[i] == 6)
            size = (size_t)(uintptr_t)vals[i];
    }
    if (buf && size)
        snprintf(buf, size, "%s", msg);
}

CUresult f_cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n,
                              CUjit_option *opts, void **vals)
{
    static const char fn[] = "cuModuleLoadDataEx";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), td_capture_unsafe(fn, 0),
           refuse_if(!m || !image, CUDA_ERROR_INVALID_VALUE, fn, "NULL argument"),
           refuse_if(n && (!opts || !vals), CUDA_ERROR_INVALID_VALUE, fn,
                     "%u options but NULL arrays", n));
    td_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    const unsigned char *b = image;
    if ((b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F') ||
        (b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba)) {
        jit_log(n, opts, vals, "safecuda test device: cubin and fatbin images can't be loaded (PTX only)");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    char log[256] = "";
    fake_module *mod = parse_ptx(image, log, sizeof log);
    if (!mod) {
        jit_log(n, opts, vals, log);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    td_lock();
    mod->ctx = current;
    int ok = set_add(&modules, mod);
    static uint64_t func_serial;
    for (int i = 0; ok && i < mod->n_funcs; i++) {
        mod->funcs[i]->serial = ++func_serial;
        ok = set_add(&funcs, mod->funcs[i]);
    }
    if (!ok) {
        set_remove(&modules, mod);
        free_module(mod);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *m = (CUmodule)(void *)mod;
    }
    td_unlock();
    return r;
}

CUresult f_cuModuleUnload(CUmodule m)
{
    static const char fn[] = "cuModuleUnload";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), module_ok(m, fn), td_capture_unsafe(fn, 0));
    if (r == CUDA_SUCCESS) {
        set_remove(&modules, m);
        free_module((fake_module *)(void *)m);
    }
    td_unlock();
    return r;
}

CUresult f_cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    static const char fn[] = "cuModuleGetFunction";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), module_ok(m, fn),
           refuse_if(!f || !name, CUDA_ERROR_INVALID_VALUE, fn, "NULL argument"));
    if (r == CUDA_SUCCESS) {
        fake_module *mod = (fake_module *)(void *)m;
        r = CUDA_ERROR_NOT_FOUND;
        for (int i = 0; i < mod->n_funcs; i++)
            if (strcmp(mod->funcs[i]->name, name) == 0) {
                *f = (CUfunction)(void *)mod->funcs[i];
                r = CUDA_SUCCESS;
                break;
            }
    }
    td_unlock();
    return r;
}

CUresult f_cuModuleGetFunctionCount(unsigned *n, CUmodule m)
{
    static const char fn[] = "cuModuleGetFunctionCount";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), module_ok(m, fn), not_null(n, fn, "count"));
    if (r == CUDA_SUCCESS)
        *n = (unsigned)((fake_module *)(void *)m)->n_funcs;
    td_unlock();
    return r;
}

CUresult f_cuModuleEnumerateFunctions(CUfunction *fns, unsigned n, CUmodule m)
{
    static const char fn[] = "cuModuleEnumerateFunctions";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), module_ok(m, fn),
           refuse_if(n && !fns, CUDA_ERROR_INVALID_VALUE, fn, "NULL array"));
    if (r == CUDA_SUCCESS) {
        fake_module *mod = (fake_module *)(void *)m;
        for (unsigned i = 0; i < n && i < (unsigned)mod->n_funcs; i++)
            fns[i] = (CUfunction)(void *)mod->funcs[i];
    }
    td_unlock();
    return r;
}

CUresult f_cuFuncGetName(const char **name, CUfunction f)
{
    static const char fn[] = "cuFuncGetName";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), func_ok(f, fn), not_null(name, fn, "name"));
    if (r == CUDA_SUCCESS)
        *name = ((fake_func *)(void *)f)->name;
    td_unlock();
    return r;
}

CUresult f_cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f)
{
    static const char fn[] = "cuFuncGetAttribute";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), func_ok(f, fn), not_null(v, fn, "value"));
    if (r == CUDA_SUCCESS) {
        const fake_func *fu = (const fake_func *)(void *)f;
        switch ((int)a) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = fu->max_threads; break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = fu->static_shared; break;
        case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 16; break;
        case CU_FUNC_ATTRIBUTE_PTX_VERSION: *v = fu->ptx_version; break;
        case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = 90; break;
        case 7 /* CU_FUNC_ATTRIBUTE_CACHE_MODE_CA */: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = fu->max_dynamic_shared; break;
        case 9 /* CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT */: *v = -1; break;
        case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: *v = fu->explicit_cluster; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: *v = (int)fu->req_cluster[0]; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: *v = (int)fu->req_cluster[1]; break;
        case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: *v = (int)fu->req_cluster[2]; break;
        case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
            *v = fu->non_portable_cluster;
            break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    td_unlock();
    return r;
}

CUresult f_cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v)
{
    static const char fn[] = "cuFuncSetAttribute";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), func_ok(f, fn));
    if (r == CUDA_SUCCESS) {
        fake_func *fu = (fake_func *)(void *)f;
        if ((int)a == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
            if (v < 0 || v > 227 * 1024 - fu->static_shared)
                r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                        "%d bytes of dynamic shared memory (at most %d)", v,
                        227 * 1024 - fu->static_shared);
            else
                fu->max_dynamic_shared = v;
        } else if ((int)a == CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED) {
            if (v != 0 && v != 1)
                r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                        "NON_PORTABLE_CLUSTER_SIZE_ALLOWED is 0 or 1, not %d", v);
            else
                fu->non_portable_cluster = v;
        } else if ((int)a >= CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH &&
                   (int)a <= CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH) {
            if (fu->req_cluster_in_ptx) /* as CUDA: a compile-time cluster is fixed */
                r = bad(CUDA_ERROR_NOT_PERMITTED, fn,
                        "kernel %s was compiled with its cluster (.reqnctapercluster)", fu->name);
            else if (v < 0 || v > 1024)
                r = bad(CUDA_ERROR_INVALID_VALUE, fn, "required cluster dimension %d", v);
            else
                fu->req_cluster[(int)a - CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH] = (unsigned)v;
        } else if ((int)a != 9) {
            r = bad(CUDA_ERROR_INVALID_VALUE, fn, "attribute %d can't be set", (int)a);
        }
    }
    td_unlock();
    return r;
}

CUresult f_cuFuncGetParamInfo(CUfunction f, size_t i, size_t *off, size_t *size)
{
    static const char fn[] = "cuFuncGetParamInfo";
    td_lock();
    CUresult r;
    CHECKS(r, need_init(fn), func_ok(f, fn));
    if (r == CUDA_SUCCESS) {
        const fake_func *fu = (const fake_func *)(void *)f;
        if (i >= (size_t)fu->n_params) {
            r = CUDA_ERROR_INVALID_VALUE; /* how callers find the count: not misuse */
        } else {
            if (off)
                *off = fu->offset[i];
            if (size)
                *size = fu->size[i];
        }
    }
    td_unlock();
    return r;
}

/* Tensor maps: tensor_map.c. */
CUresult f_cuTensorMapEncodeTiled(CUtensorMap *map, int dtype, cuuint32_t rank,
                                  void *address, const cuuint64_t *dims,
                                  const cuuint64_t *strides, const cuuint32_t *box,
                                  const cuuint32_t *element_strides, int interleave,
                                  int swizzle, int l2_promotion, int oob_fill)
{
    return td_cuTensorMapEncodeTiled(map, dtype, rank, address, dims, strides, box,
                                     element_strides, interleave, swizzle, l2_promotion,
                                     oob_fill);
}

/* Resident blocks per SM of a kernel (16 registers a thread, as the attributes say). */
static int occupancy(const fake_func *f, int block, size_t dyn)
{
    if (block <= 0 || block > f->max_threads)
        return 0;
    int warps = (block + 31) / 32;
    int by_threads = 2048 / (warps * 32);
    int by_regs = 65536 / (warps * 32 * 16);
    size_t shared = dyn + (size_t)f->static_shared + 1024; /* 1 KiB reserved per block */
    int by_shared = (int)((size_t)(228 * 1024) / shared);
    int n = by_threads;
    if (by_regs < n)
        n = by_regs;
    if (by_shared < n)
        n = by_shared;
    if (n > 32)
        n = 32;
    return n;
}

CUresult f_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int block,
                                                      size_t dyn)
{
    static const char fn[] = "cuOccupancyMaxActiveBlocksPerMultiprocessor";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), func_ok(f, fn), not_null(n, fn, "out-pointer"));
    if (r == CUDA_SUCCESS)
        *n = occupancy((const fake_func *)(void *)f, block, dyn);
    td_unlock();
    return r;
}

CUresult f_cuOccupancyMaxPotentialBlockSize(int *grid, int *block, CUfunction f,
                                            CUoccupancyB2DSize dyn_of, size_t dyn, int limit)
{
    static const char fn[] = "cuOccupancyMaxPotentialBlockSize";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), func_ok(f, fn),
           refuse_if(!grid || !block, CUDA_ERROR_INVALID_VALUE, fn, "NULL out-pointer"));
    fake_func copy;
    if (r == CUDA_SUCCESS)
        copy = *(const fake_func *)(void *)f;
    td_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    int max = copy.max_threads;
    if (limit > 0 && limit < max)
        max = limit;
    int best = 0, best_block = 32;
    for (int b = 32; b <= max; b += 32) {
        int blocks = occupancy(&copy, b, dyn_of ? dyn_of(b) : dyn);
        if (blocks * b >= best && blocks > 0) {
            best = blocks * b;
            best_block = b;
        }
    }
    *block = best_block;
    *grid = best / best_block * 132;
    return CUDA_SUCCESS;
}

/* The largest cluster a launch of f may use: the kernel's compiled cluster when it has one;
 * else 8 (the portable size), or 16 (an H100's non-portable maximum) once non-portable sizes
 * are allowed on f. Both are read through cuFuncGetAttribute, so this follows whatever the
 * function attributes model (an attribute they do not answer counts as 0). */
CUresult f_cuOccupancyMaxPotentialClusterSize(int *size, CUfunction f,
                                              const CUlaunchConfig *c)
{
    static const char fn[] = "cuOccupancyMaxPotentialClusterSize";
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), func_ok(f, fn),
           refuse_if(!size || !c, CUDA_ERROR_INVALID_VALUE, fn, "NULL %s",
                     size ? "config" : "out-pointer"));
    td_unlock();
    if (r != CUDA_SUCCESS)
        return r;
    int dims[3] = {0, 0, 0}, non_portable = 0;
    for (int i = 0; i < 3; i++)
        if (f_cuFuncGetAttribute(&dims[i], (CUfunction_attribute)(11 + i), f) != CUDA_SUCCESS)
            dims[i] = 0; /* CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH + i */
    if (f_cuFuncGetAttribute(&non_portable, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                             f) != CUDA_SUCCESS)
        non_portable = 0;
    if (dims[0] > 0 && dims[1] > 0 && dims[2] > 0)
        *size = dims[0] * dims[1] * dims[2];
    else
        *size = non_portable ? 16 : 8;
    return CUDA_SUCCESS;
}

/* The number of SMs, and how clusters are placed: inside GPCs, modelled as 8 of 16 SMs. */
#define SM_COUNT 132
#define GPC_COUNT 8
#define SMS_PER_GPC 16

/* The cluster a launch of fu runs with (lock held): dims, all 0 for none. Misuse: a zero
 * dimension, a cluster other than the one the kernel was compiled with, a partly set
 * required cluster, none for a kernel that needs one, any on a device before sm_90. */
static CUresult launch_cluster(const fake_func *fu, const launch_attrs *a, unsigned dims[3],
                               const char *fn)
{
    const unsigned *req = fu->req_cluster;
    int req_any = req[0] || req[1] || req[2], req_all = req[0] && req[1] && req[2];
    dims[0] = dims[1] = dims[2] = 0;
    if (req_any && !req_all)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "kernel %s: required cluster %ux%ux%u mixes zero and non-zero dimensions",
                   fu->name, req[0], req[1], req[2]);
    if (a->has_cluster) {
        const unsigned *c = a->cluster;
        if (!c[0] || !c[1] || !c[2])
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s: cluster %ux%ux%u has a zero",
                       fu->name, c[0], c[1], c[2]);
        if (req_all && (c[0] != req[0] || c[1] != req[1] || c[2] != req[2]))
            return bad(CUDA_ERROR_INVALID_VALUE, fn,
                       "kernel %s: cluster %ux%ux%u, but the kernel requires %ux%ux%u", fu->name,
                       c[0], c[1], c[2], req[0], req[1], req[2]);
        memcpy(dims, c, 3 * sizeof *dims);
    } else if (req_all) {
        memcpy(dims, req, 3 * sizeof *dims);
    } else if (fu->explicit_cluster) {
        return bad(CUDA_ERROR_INVALID_CLUSTER_SIZE, fn,
                   "kernel %s must be launched with a cluster dimension (.explicitcluster)",
                   fu->name);
    } else {
        return CUDA_SUCCESS;
    }
    if (compute_capability < 90)
        return bad(CUDA_ERROR_NOT_SUPPORTED, fn,
                   "kernel %s: thread block clusters need compute capability 9.0 (the device "
                   "reports %d.%d)",
                   fu->name, compute_capability / 10, compute_capability % 10);
    return CUDA_SUCCESS;
}

/* The most blocks a cluster may have: 8 (portable), 16 with NON_PORTABLE_CLUSTER_SIZE_ALLOWED. */
static unsigned cluster_limit(const fake_func *fu) { return fu->non_portable_cluster ? 16 : 8; }

/* A launch's checks (lock held), the same with or without capture. */
static CUresult check_launch(const fake_func *fu, const unsigned g[3], const unsigned b[3],
                             unsigned shared, void **params, void **extra,
                             const launch_attrs *a, const char *fn)
{
    uint64_t threads = (uint64_t)b[0] * b[1] * b[2];
    if (!g[0] || !g[1] || !g[2] || !b[0] || !b[1] || !b[2])
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s: grid %ux%ux%u block %ux%ux%u",
                   fu->name, g[0], g[1], g[2], b[0], b[1], b[2]);
    if (g[0] > 2147483647u || g[1] > 65535 || g[2] > 65535 || b[0] > 1024 || b[1] > 1024 ||
        b[2] > 64 || threads > (uint64_t)fu->max_threads)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "kernel %s: grid %ux%ux%u block %ux%ux%u exceeds the limits", fu->name, g[0],
                   g[1], g[2], b[0], b[1], b[2]);
    if (shared > (unsigned)fu->max_dynamic_shared)
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "kernel %s: %u bytes of dynamic shared memory (limit %d)", fu->name, shared,
                   fu->max_dynamic_shared);
    unsigned c[3];
    CUresult r = launch_cluster(fu, a, c, fn);
    if (r != CUDA_SUCCESS)
        return r;
    if (c[0] && (g[0] % c[0] || g[1] % c[1] || g[2] % c[2]))
        return bad(CUDA_ERROR_INVALID_VALUE, fn,
                   "kernel %s: grid %ux%ux%u is not a whole number of %ux%ux%u clusters",
                   fu->name, g[0], g[1], g[2], c[0], c[1], c[2]);
    if (c[0] && c[0] * c[1] * c[2] > cluster_limit(fu))
        return bad(CUDA_ERROR_INVALID_CLUSTER_SIZE, fn,
                   "kernel %s: a cluster of %ux%ux%u = %u blocks, more than %u%s", fu->name, c[0],
                   c[1], c[2], c[0] * c[1] * c[2], cluster_limit(fu),
                   fu->non_portable_cluster ? "" : " (the portable size; see "
                                                   "NON_PORTABLE_CLUSTER_SIZE_ALLOWED)");
    if (a->cooperative) {
        if (compute_capability < 60)
            return bad(CUDA_ERROR_NOT_SUPPORTED, fn,
                       "kernel %s: cooperative launches need compute capability 6.0", fu->name);
        uint64_t blocks = (uint64_t)g[0] * g[1] * g[2];
        uint64_t per_sm = (uint64_t)occupancy(fu, (int)threads, shared);
        if (blocks > per_sm * SM_COUNT)
            return bad(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, fn,
                       "kernel %s: a cooperative grid of %llu blocks; at most %llu can be "
                       "resident (%llu a multiprocessor x %d)",
                       fu->name, (unsigned long long)blocks,
                       (unsigned long long)(per_sm * SM_COUNT), (unsigned long long)per_sm,
                       SM_COUNT);
    }
    if (extra)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s: 'extra' is not supported", fu->name);
    if (fu->n_params > 0 && !params)
        return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s has %d parameters but params is NULL",
                   fu->name, fu->n_params);
    for (int i = 0; i < fu->n_params; i++)
        if (!params[i])
            return bad(CUDA_ERROR_INVALID_VALUE, fn, "kernel %s: params[%d] is NULL", fu->name, i);
    return CUDA_SUCCESS;
}

/* A kernel runs in the context its module was loaded into, which must be the current one,
 * on a stream of that context; CUDA answers CUDA_ERROR_INVALID_HANDLE otherwise. */
static CUresult launch_context(CUfunction f, CUstream s, const char *fn)
{
    const fake_func *fu = (const fake_func *)(void *)f;
    const fake_ctx *mc = fu->module ? fu->module->ctx : current;
    if (mc != current)
        return refuse_if(1, CUDA_ERROR_INVALID_HANDLE, fn,
                         "a kernel of a module loaded in device %d's context launched while "
                         "device %d's is current",
                         mc ? mc->device : -1, current ? current->device : -1);
    const fake_ctx *sc = td_stream_ctx(s);
    return refuse_if(sc && sc != current, CUDA_ERROR_INVALID_HANDLE, fn,
                     "a kernel launched on a stream of device %d's context while device %d's "
                     "is current",
                     sc ? sc->device : -1, current ? current->device : -1);
}

/* A launch: validated, then recorded on a capturing stream; otherwise nothing runs (this is
 * not a GPU), so it is refused, unless safecuda's own bookkeeping tests asked for launches
 * to be accepted without running. */

static CUresult launch(CUfunction f, const unsigned g[3], const unsigned b[3], unsigned shared,
                       CUstream s, void **params, void **extra, const launch_attrs *a,
                       const char *fn)
{
    struct fake_capture *cap = NULL;
    td_lock();
    CUresult r;
    CHECKS(r, need_ctx(fn), func_ok(f, fn), need_stream(s, fn), launch_context(f, s, fn),
           td_capture_of(s, fn, &cap));
    if (r == CUDA_SUCCESS)
        r = check_launch((const fake_func *)(void *)f, g, b, shared, params, extra, a, fn);
    if (r == CUDA_SUCCESS && cap)
        r = td_capture_kernel(cap, s, (const fake_func *)(void *)f, g, b, shared, params, a, fn);
    else if (r == CUDA_SUCCESS && !accept_launches) {
        refused_launches++;
        r = CUDA_ERROR_NOT_SUPPORTED;
    }
    r = copy_done(r, cap, fn);
    td_unlock();
    return r;
}

CUresult f_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                          unsigned bx, unsigned by, unsigned bz, unsigned shared,
                          CUstream s, void **params, void **extra)
{
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    const launch_attrs none = {0};
    return launch(f, g, b, shared, s, params, extra, &none, "cuLaunchKernel");
}

/* The attributes of an extensible launch the test device knows: cooperative, cluster
 * dimension, programmatic stream serialization (which changes nothing here). Another
 * attribute is CUDA_ERROR_NOT_SUPPORTED (not misuse: a newer caller may try it). */
static CUresult launch_attributes(const CUlaunchConfig *c, launch_attrs *a, const char *fn)
{
    memset(a, 0, sizeof *a);
    if (!c) {
        td_lock();
        CUresult r = bad(CUDA_ERROR_INVALID_VALUE, fn, "NULL config");
        td_unlock();
        return r;
    }
    if (c->numAttrs && !c->attrs) {
        td_lock();
        CUresult r = bad(CUDA_ERROR_INVALID_VALUE, fn, "%u attributes, NULL list", c->numAttrs);
        td_unlock();
        return r;
    }
    for (unsigned i = 0; i < c->numAttrs; i++) {
        const CUlaunchAttribute *at = &c->attrs[i];
        switch (at->id) {
        case CU_LAUNCH_ATTRIBUTE_COOPERATIVE: a->cooperative = at->value.cooperative != 0; break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
            a->has_cluster = 1;
            a->cluster[0] = at->value.clusterDim.x;
            a->cluster[1] = at->value.clusterDim.y;
            a->cluster[2] = at->value.clusterDim.z;
            break;
        case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
            a->programmatic = at->value.programmatic_stream_serialization_allowed != 0;
            break;
        default: return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    return CUDA_SUCCESS;
}

CUresult f_cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                            void **extra)
{
    launch_attrs a;
    CUresult r = launch_attributes(c, &a, "cuLaunchKernelEx");
    if (r != CUDA_SUCCESS)
        return r;
    const unsigned g[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    const unsigned b[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    return launch(f, g, b, c->sharedMemBytes, c->hStream, params, extra, &a, "cuLaunchKernelEx");
}

/* Clusters that can be resident at once. The model: clusters are placed inside GPCs (8 of
 * 16 SMs here), each GPC holds (16 x the kernel's blocks per SM) / cluster size of them;
 * 0 for a cluster larger than the kernel may launch (8, or 16 when non-portable sizes are
 * allowed). The cluster comes from the configuration or the kernel's compiled one. */
CUresult f_cuOccupancyMaxActiveClusters(int *n, CUfunction f, const CUlaunchConfig *c)
{
    static const char fn[] = "cuOccupancyMaxActiveClusters";
    launch_attrs a;
    CUresult r = launch_attributes(c, &a, fn);
    if (r != CUDA_SUCCESS)
        return r;
    td_lock();
    CHECKS(r, need_ctx(fn), func_ok(f, fn), not_null(n, fn, "out-pointer"));
    unsigned dims[3] = {0, 0, 0};
    const fake_func *fu = (const fake_func *)(void *)f;
    if (r == CUDA_SUCCESS)
        r = launch_cluster(fu, &a, dims, fn);
    if (r == CUDA_SUCCESS && !dims[0])
        r = bad(CUDA_ERROR_INVALID_VALUE, fn,
                "kernel %s: no cluster dimension in the configuration, and none compiled in",
                fu->name);
    if (r == CUDA_SUCCESS) {
        unsigned size = dims[0] * dims[1] * dims[2];
        uint64_t threads = (uint64_t)c->blockDimX * c->blockDimY * c->blockDimZ;
        int per_sm = threads > 1024 ? 0 : occupancy(fu, (int)threads, c->sharedMemBytes);
        *n = size > cluster_limit(fu) ? 0 : GPC_COUNT * (SMS_PER_GPC * per_sm / (int)size);
    }
    td_unlock();
    return r;
}
