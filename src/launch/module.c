/* Modules (loaded images) and kernels (their functions, with parameter info). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compile/program.h"
#include "core/guard.h"
#include "core/log.h"
#include "driver/driver.h"
#include "launch/launch_attr.h"
#include "launch/module.h"

static sc_status module_destroy(sci_object *obj, const char *fn);
static sc_status kernel_destroy(sci_object *obj, const char *fn);

static void describe_module(const sci_object *obj, sc_object_info *info)
{
    const sci_module *m = (const sci_module *)obj;
    snprintf(info->detail, sizeof info->detail, "%zu name expression%s", m->n_names,
             m->n_names == 1 ? "" : "s");
}

static void describe_kernel(const sci_object *obj, sc_object_info *info)
{
    const sci_kernel *k = (const sci_kernel *)obj;
    snprintf(info->detail, sizeof info->detail, "%.90s", k->display);
}

static const sci_kind_ops module_ops = {"module", describe_module, module_destroy};
static const sci_kind_ops kernel_ops = {"kernel", describe_kernel, kernel_destroy};

__attribute__((constructor)) static void register_module_kinds(void)
{
    sci_registry_set_ops(SCI_KIND_MODULE, &module_ops);
    sci_registry_set_ops(SCI_KIND_KERNEL, &kernel_ops);
}

static void free_names(size_t n, char **exprs, char **lowered)
{
    for (size_t i = 0; i < n; i++) {
        free(exprs ? exprs[i] : NULL);
        free(lowered ? lowered[i] : NULL);
    }
    free(exprs);
    free(lowered);
}

static void unload_module(void *cu) { sci_cuModuleUnload((CUmodule)cu); }

sc_status sci_module_load(sci_context *c, const void *image, size_t bytes, bool is_ptx,
                          size_t n_names, char *const *exprs, char *const *lowered,
                          bool internal, const char *label, const char *file, int line,
                          const char *fn, sci_module **out)
{
    (void)bytes;
    sc_status refused = sci_guard_refuse(fn, "loading a module");
    if (refused != SC_OK)
        return refused;
    sci_module *m = calloc(1, sizeof *m);
    if (!m)
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    m->ctx = c;
    if (n_names) {
        m->exprs = calloc(n_names, sizeof *m->exprs);
        m->lowered = calloc(n_names, sizeof *m->lowered);
        if (!m->exprs || !m->lowered) {
            free_names(0, m->exprs, m->lowered);
            free(m);
            return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
        }
        m->n_names = n_names;
        for (size_t i = 0; i < n_names; i++) {
            m->exprs[i] = strdup(exprs[i]);
            m->lowered[i] = strdup(lowered[i]);
        }
    }
    char log[4096] = "";
    CUjit_option opts[2] = {5 /* CU_JIT_ERROR_LOG_BUFFER */,
                            6 /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */};
    void *vals[2] = {log, (void *)(uintptr_t)sizeof log};
    CUresult r = sci_cuModuleLoadDataEx(&m->cu, image, is_ptx ? 2u : 0u, is_ptx ? opts : NULL,
                                        is_ptx ? vals : NULL);
    if (r != CUDA_SUCCESS) {
        free_names(m->n_names, m->exprs, m->lowered);
        free(m);
        sc_status s = sci_context_fail_cu(c, r, fn, "cuModuleLoadDataEx (%s image of %zu bytes)",
                                          is_ptx ? "PTX" : "binary", bytes);
        if (log[0])
            sci_error_append("\n--- JIT log ---\n%s", log);
        return s;
    }
    m->obj.internal = internal;
    /* Whole before it is published: other threads may list it from then on. */
    sc_status s = sci_registry_insert(&m->obj, SCI_KIND_MODULE, c->obj.id, label, file, line,
                                      fn);
    if (s != SC_OK) {
        s = sci_context_cleanup_cu(c, s, sci_cuModuleUnload(m->cu), "cuModuleUnload");
        free_names(m->n_names, m->exprs, m->lowered);
        free(m);
        return s;
    }
    *out = m;
    return SC_OK;
}

sc_status sc_module_load_at(sc_context ctx, sc_program program, sc_module *module,
                            const char *file, int line)
{
    static const char fn[] = "sc_module_load";
    SCI_CHECK_PTR(fn, module);
    module->id = 0;
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    sci_program *p = NULL;
    s = sci_program_acquire(program, fn, &p);
    if (s != SC_OK) {
        sci_context_release(c);
        return s;
    }
    if (p->ctx && p->ctx != c) {
        s = sci_fail(SC_ERR_WRONG_CONTEXT, fn,
                     "program '%s' (created at %s:%d) was compiled for another context",
                     p->obj.label, sci_basename(p->obj.file), p->obj.line);
    } else {
        sci_module *m = NULL;
        s = sci_module_load(c, p->out.image, p->out.image_size, p->out.is_ptx, p->out.n_names,
                            p->out.exprs, p->out.lowered, false, p->obj.label, file, line, fn,
                            &m);
        if (s == SC_OK)
            module->id = m->obj.id;
    }
    sci_program_release(p);
    sci_context_release(c);
    return s;
}

sc_status sc_module_load_image_at(sc_context ctx, const void *image, uint64_t bytes,
                                  sc_module *module, const char *file, int line)
{
    static const char fn[] = "sc_module_load_image";
    SCI_CHECK_PTR(fn, module);
    module->id = 0;
    SCI_CHECK_PTR(fn, image);
    if (bytes < 4)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "an image of %llu bytes is too small",
                        (unsigned long long)bytes);
    const unsigned char *b = image;
    bool elf = b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
    bool fatbin = b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba;
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(ctx, fn, &c);
    if (s != SC_OK)
        return s;
    char *ptx = NULL;
    if (!elf && !fatbin) { /* PTX text: make sure it is NUL-terminated */
        ptx = malloc(bytes + 1);
        if (!ptx) {
            sci_context_release(c);
            return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
        }
        memcpy(ptx, image, bytes);
        ptx[bytes] = '\0';
    }
    sci_module *m = NULL;
    s = sci_module_load(c, ptx ? ptx : image, bytes, ptx != NULL, 0, NULL, NULL, false, NULL,
                        file, line, fn, &m);
    free(ptx);
    if (s == SC_OK)
        module->id = m->obj.id;
    sci_context_release(c);
    return s;
}

sc_status sc_module_load_file_at(sc_context ctx, const char *path, sc_module *module,
                                 const char *file, int line)
{
    static const char fn[] = "sc_module_load_file";
    SCI_CHECK_PTR(fn, module);
    module->id = 0;
    SCI_CHECK_PTR(fn, path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return sci_fail(SC_ERR_IO, fn, "cannot open '%s'", path);
    /* Only a regular file, sized by fstat: a folder opens too, and its "size" at SEEK_END
     * can be LONG_MAX (ext4), which must not become an allocation. */
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return sci_fail(SC_ERR_IO, fn, "cannot read '%s': %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        fclose(f);
        return sci_fail(SC_ERR_IO, fn, "cannot read '%s': not a regular file", path);
    }
    if (st.st_size <= 0) {
        fclose(f);
        return sci_fail(SC_ERR_IO, fn, "cannot read '%s': the file is empty", path);
    }
    size_t n = (size_t)st.st_size;
    char *data = malloc(n);
    if (!data) {
        fclose(f);
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate %zu bytes for '%s'",
                        n, path);
    }
    size_t got = fread(data, 1, n, f);
    fclose(f);
    if (got != n) {
        free(data);
        return sci_fail(SC_ERR_IO, fn, "cannot read '%s' (%zu of %zu bytes)", path, got, n);
    }
    sc_status s = sc_module_load_image_at(ctx, data, (uint64_t)n, module, file, line);
    free(data);
    if (s != SC_OK)
        sci_error_append(" (file '%s')", path);
    return s;
}

/* The kernel's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status kernel_destroy(sci_object *obj, const char *fn)
{
    (void)fn;
    free(obj);
    return SC_OK;
}

/* The module's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status module_destroy(sci_object *obj, const char *fn)
{
    sci_module *m = (sci_module *)obj;
    /* The module's kernels go with it. */
    uint64_t *ids = NULL;
    size_t n = sci_registry_list(SCI_KIND_KERNEL, m->ctx->obj.id, &ids);
    for (size_t i = 0; i < n; i++) {
        sci_object *ko = NULL;
        if (sci_registry_acquire(SCI_KIND_KERNEL, ids[i], fn, &ko) != SC_OK)
            continue;
        bool mine = ((sci_kernel *)ko)->module == m;
        sci_registry_release(ko);
        if (mine)
            sci_registry_destroy(SCI_KIND_KERNEL, ids[i], fn);
    }
    free(ids);
    sci_release rl;
    sci_release_begin(&rl, m->ctx, fn);
    sci_release_make_current(&rl);
    /* An unload would invalidate a capture that forbids it: it waits for its end then. */
    if (sci_guard_active())
        sci_guard_defer(unload_module, m->cu);
    else
        sci_release_check(&rl, sci_cuModuleUnload(m->cu), "cuModuleUnload failed");
    free_names(m->n_names, m->exprs, m->lowered);
    free(m);
    return sci_release_end(&rl);
}

sc_status sc_module_destroy(sc_module module)
{
    return sci_object_destroy(SCI_KIND_MODULE, module.id, NULL, "sc_module_destroy");
}

sc_status sc_module_kernel_names(sc_module module, const char **names, size_t capacity,
                                 size_t *count)
{
    static const char fn[] = "sc_module_kernel_names";
    SCI_CHECK_PTR(fn, count);
    if (capacity && !names)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "names is NULL but capacity is %zu",
                        capacity);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MODULE, module.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_module *m = (sci_module *)obj;
    unsigned n = 0;
    CUfunction *fns = NULL;
    CUresult r;
    if ((s = sci_context_enter(m->ctx, fn)) != SC_OK)
        goto out;
    r = sci_cuModuleGetFunctionCount(&n, m->cu);
    if (r == CUDA_ERROR_NOT_INITIALIZED) { /* the entry point is missing: old driver */
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "the driver can't list a module's kernels "
                     "(CUDA 12.4 or newer needed)");
        goto out;
    }
    if (r != CUDA_SUCCESS) {
        s = sci_context_fail_cu(m->ctx, r, fn, "cuModuleGetFunctionCount");
        goto out;
    }
    *count = n;
    if (n && capacity) {
        fns = calloc(n, sizeof *fns);
        if (!fns) {
            s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
            goto out;
        }
        r = sci_cuModuleEnumerateFunctions(fns, n, m->cu);
        for (unsigned i = 0; i < n && i < capacity && r == CUDA_SUCCESS; i++)
            r = sci_cuFuncGetName(&names[i], fns[i]);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(m->ctx, r, fn, "listing the module's kernels");
    }
out:
    free(fns);
    sci_registry_release(obj);
    return s;
}

/* ---- kernels ----------------------------------------------------------------------------- */

/* The kernel's parameter sizes. cuFuncGetParamInfo answers CUDA_ERROR_INVALID_VALUE for
 * the index past the last parameter: that ends the list. Any other error is a failure
 * (a kernel that believed it takes fewer parameters would refuse every correct launch). */
static sc_status read_params(sci_kernel *k, const char *fn)
{
    k->n_params = -1;
    if (!sci_driver_has_param_info()) {
        /* Said once per kernel (sc_kernel_get makes each kernel once), never silently. */
        sci_log(SC_LOG_WARN,
                "%s: kernel '%s': the driver (CUDA %d.%d, before 12.4) can't report a "
                "kernel's parameters, so launches of it skip the argument count, size and "
                "type checks",
                fn, k->display, sci_driver_cuda_version() / 1000,
                (sci_driver_cuda_version() % 1000) / 10);
        return SC_OK;
    }
    int n = 0;
    for (; n < SCI_MAX_PARAMS; n++) {
        size_t off = 0, size = 0;
        CUresult r = sci_cuFuncGetParamInfo(k->fn, (size_t)n, &off, &size);
        if (r == CUDA_ERROR_INVALID_VALUE)
            break;
        if (r != CUDA_SUCCESS)
            return sci_context_fail_cu(k->ctx, r, fn,
                                       "cuFuncGetParamInfo('%s', parameter %d) failed",
                                       k->display, n);
        k->param_size[n] = (uint32_t)size;
    }
    k->n_params = n;
    if (strncmp(k->name, "_Z", 2) == 0) {
        int typed = sci_demangle_params(k->name, k->types, SCI_MAX_PARAMS);
        k->typed = typed == n;
    }
    return SC_OK;
}

sc_status sci_kernel_get(sci_module *m, const char *name, bool internal, const char *file,
                         int line, const char *fn, sc_kernel *out)
{
    sci_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    const char *symbol = name;
    CUresult r = sci_cuModuleGetFunction(&k->fn, m->cu, name);
    if (r == CUDA_ERROR_NOT_FOUND) {
        for (size_t i = 0; i < m->n_names; i++) {
            if (strcmp(m->exprs[i], name) == 0) {
                symbol = m->lowered[i];
                r = sci_cuModuleGetFunction(&k->fn, m->cu, symbol);
                break;
            }
        }
    }
    if (r != CUDA_SUCCESS) {
        free(k);
        if (r == CUDA_ERROR_NOT_FOUND)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "module '%s' (created at %s:%d) has no kernel '%s' (C++ kernels are "
                            "found by their mangled name, or by a name expression given when "
                            "the program was compiled)",
                            m->obj.label, sci_basename(m->obj.file), m->obj.line, name);
        return sci_context_fail_cu(m->ctx, r, fn, "cuModuleGetFunction('%s')", name);
    }
    k->ctx = m->ctx;
    k->module = m;
    snprintf(k->name, sizeof k->name, "%s", symbol);
    snprintf(k->display, sizeof k->display, "%s", name);
    int dyn = 0;
    if ((r = sci_cuFuncGetAttribute(&k->max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                    k->fn)) != CUDA_SUCCESS ||
        (r = sci_cuFuncGetAttribute(&k->static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                    k->fn)) != CUDA_SUCCESS ||
        (r = sci_cuFuncGetAttribute(&dyn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    k->fn)) != CUDA_SUCCESS) {
        free(k);
        return sci_context_fail_cu(m->ctx, r, fn, "cuFuncGetAttribute('%s')", name);
    }
    atomic_store(&k->max_dynamic_shared, dyn);
    sc_status s = sci_kernel_read_cluster_attrs(k, fn);
    if (s != SC_OK) {
        free(k);
        return s;
    }
    s = read_params(k, fn);
    if (s != SC_OK) {
        free(k);
        return s;
    }
    k->obj.internal = internal;
    s = sci_registry_insert(&k->obj, SCI_KIND_KERNEL, m->ctx->obj.id, name, file, line,
                                      fn);
    if (s != SC_OK) {
        free(k);
        return s;
    }
    out->id = k->obj.id;
    return SC_OK;
}

sc_status sc_kernel_get_at(sc_module module, const char *name, sc_kernel *kernel,
                           const char *file, int line)
{
    static const char fn[] = "sc_kernel_get";
    SCI_CHECK_PTR(fn, kernel);
    kernel->id = 0;
    SCI_CHECK_PTR(fn, name);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_MODULE, module.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_module *m = (sci_module *)obj;
    s = sci_context_enter(m->ctx, fn);
    if (s == SC_OK)
        s = sci_kernel_get(m, name, false, file, line, fn, kernel);
    sci_registry_release(obj);
    return s;
}

sc_status sci_kernel_acquire(sc_kernel h, const char *fn, sci_kernel **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_KERNEL, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_kernel *k = (sci_kernel *)obj;
    s = sci_context_enter(k->ctx, fn);
    if (s != SC_OK) {
        sci_registry_release(obj);
        return s;
    }
    *out = k;
    return SC_OK;
}

void sci_kernel_release(sci_kernel *k) { sci_registry_release(&k->obj); }

sc_status sc_kernel_info(sc_kernel kernel, sc_kernel_props *props)
{
    static const char fn[] = "sc_kernel_info";
    SCI_CHECK_PTR(fn, props);
    sci_kernel *k = NULL;
    sc_status s = sci_kernel_acquire(kernel, fn, &k);
    if (s != SC_OK)
        return s;
    memset(props, 0, sizeof *props);
    snprintf(props->name, sizeof props->name, "%s", k->name);
    struct {
        CUfunction_attribute a;
        int *out;
    } attrs[] = {
        {CU_FUNC_ATTRIBUTE_NUM_REGS, &props->registers},
        {CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &props->local_bytes},
        {CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, &props->const_bytes},
        {CU_FUNC_ATTRIBUTE_PTX_VERSION, &props->ptx_version},
        {CU_FUNC_ATTRIBUTE_BINARY_VERSION, &props->binary_version},
    };
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0] && s == SC_OK; i++) {
        CUresult r = sci_cuFuncGetAttribute(attrs[i].out, attrs[i].a, k->fn);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(k->ctx, r, fn, "cuFuncGetAttribute failed");
    }
    props->static_shared_bytes = k->static_shared;
    props->max_dynamic_shared_bytes = atomic_load(&k->max_dynamic_shared);
    props->max_threads_per_block = k->max_threads;
    props->n_params = k->n_params;
    props->typed = k->typed;
    props->cluster_dims = k->cluster_dims;
    props->cluster_required = k->cluster_required;
    sci_kernel_release(k);
    return s;
}

sc_status sc_kernel_set_max_dynamic_shared(sc_kernel kernel, int bytes)
{
    static const char fn[] = "sc_kernel_set_max_dynamic_shared";
    sci_kernel *k = NULL;
    sc_status s = sci_kernel_acquire(kernel, fn, &k);
    if (s != SC_OK)
        return s;
    int limit = k->ctx->props.shared_per_block_optin - k->static_shared;
    if (bytes < 0 || bytes > limit) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "kernel '%s': %d bytes of dynamic shared memory asked; the device allows "
                     "%d per block (opt-in) and the kernel uses %d statically, so at most %d",
                     k->display, bytes, k->ctx->props.shared_per_block_optin, k->static_shared,
                     limit);
    } else {
        CUresult r = sci_cuFuncSetAttribute(k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            bytes);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(k->ctx, r, fn, "cuFuncSetAttribute(%d bytes)", bytes);
        else
            atomic_store(&k->max_dynamic_shared, bytes);
    }
    sci_kernel_release(k);
    return s;
}

sc_status sc_kernel_occupancy(sc_kernel kernel, int block_threads, uint64_t shared_bytes,
                              int *blocks_per_sm)
{
    static const char fn[] = "sc_kernel_occupancy";
    SCI_CHECK_PTR(fn, blocks_per_sm);
    sci_kernel *k = NULL;
    sc_status s = sci_kernel_acquire(kernel, fn, &k);
    if (s != SC_OK)
        return s;
    if (block_threads <= 0 || block_threads > k->max_threads) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "kernel '%s': block of %d threads (the kernel allows 1..%d)", k->display,
                     block_threads, k->max_threads);
    } else {
        CUresult r = sci_cuOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, k->fn,
                                                                      block_threads,
                                                                      (size_t)shared_bytes);
        if (r != CUDA_SUCCESS)
            s = sci_context_fail_cu(k->ctx, r, fn, "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    }
    sci_kernel_release(k);
    return s;
}

sc_status sc_launch_config_for(uint64_t n, sc_kernel kernel, sc_launch_desc *desc)
{
    static const char fn[] = "sc_launch_config_for";
    SCI_CHECK_PTR(fn, desc);
    if (n == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "n is 0");
    sci_kernel *k = NULL;
    sc_status s = sci_kernel_acquire(kernel, fn, &k);
    if (s != SC_OK)
        return s;
    int min_grid = 0, block = 0;
    CUresult r = sci_cuOccupancyMaxPotentialBlockSize(&min_grid, &block, k->fn, NULL, 0, 0);
    if (r != CUDA_SUCCESS) {
        s = sci_context_fail_cu(k->ctx, r, fn, "cuOccupancyMaxPotentialBlockSize");
    } else {
        uint64_t blocks = (n + (uint64_t)block - 1) / (uint64_t)block;
        uint64_t max_grid = (uint64_t)k->ctx->props.max_grid[0];
        memset(desc, 0, sizeof *desc);
        desc->block = (sc_dim3){(uint32_t)block, 1, 1};
        desc->grid = (sc_dim3){(uint32_t)(blocks < max_grid ? blocks : max_grid), 1, 1};
    }
    sci_kernel_release(k);
    return s;
}
