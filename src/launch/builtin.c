/* The library's own kernels, compiled on first use per context (through the disk cache)
 * and loaded as internal modules that go with the context. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "launch/builtin.h"
#include "launch/module.h"

const char *sci_builtin_find(const char *name)
{
    for (size_t i = 0; i < sci_builtin_count; i++)
        if (strcmp(sci_builtin_sources[i].name, name) == 0)
            return sci_builtin_sources[i].source;
    return NULL;
}

typedef struct cached {
    uint64_t ctx_id;
    const char *file;   /* points into sci_builtin_sources: compared by address */
    char kernel[128];
    uint64_t kernel_id;
} cached;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cached *table;
static size_t n_table, cap_table;

/* Entries whose kernel is gone (their context was destroyed) are dropped. */
static void prune(void)
{
    size_t k = 0;
    for (size_t i = 0; i < n_table; i++) {
        sci_object *obj = NULL;
        if (sci_registry_acquire(SCI_KIND_KERNEL, table[i].kernel_id, "prune", &obj) == SC_OK) {
            sci_registry_release(obj);
            table[k++] = table[i];
        }
    }
    n_table = k;
}

/* Every header (.cuh) of the table, named by its path under kernels/
 * ("moe/moe_config.cuh"). */
static size_t builtin_headers(const sci_builtin_source *files, size_t count,
                              sc_program_header *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < count && n < cap; i++) {
        size_t len = strlen(files[i].name);
        if (len > 4 && strcmp(files[i].name + len - 4, ".cuh") == 0)
            out[n++] = (sc_program_header){files[i].name, files[i].source};
    }
    return n;
}

bool sci_builtin_is_sm90a(const char *file)
{
    const size_t len = strlen(file), suffix = strlen("_sm90a.cu");
    return len > suffix && strcmp(file + len - suffix, "_sm90a.cu") == 0;
}

sc_status sci_builtin_compile(const sci_builtin_source *files, size_t count, sc_context ctx,
                              const char *file, const sci_builtin_how *how, sc_program *out)
{
    const char *fn = how->program.fn ? how->program.fn : "sci_builtin_program";
    const char *source = NULL;
    for (size_t i = 0; i < count && !source; i++)
        if (strcmp(files[i].name, file) == 0)
            source = files[i].source;
    if (!source)
        return sci_fail(SC_ERR_INTERNAL, fn, "no built-in file '%s'", file);
    /* Files named *_sm90a.cu use the architecture-specific instructions of sm_90a (wgmma,
     * setmaxnreg): compiled for exactly that, and refused for anything else. */
    const bool sm90a = sci_builtin_is_sm90a(file);
    if (sm90a) {
        int target = how->arch;
        if (!target && ctx.id) {
            sci_context *c = NULL;
            sc_status s = sci_context_acquire(ctx, fn, &c);
            if (s != SC_OK)
                return s;
            target = c->props.cc_major * 10 + c->props.cc_minor;
            sci_context_release(c);
        }
        if (target != 90)
            return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                            "'%s' is for sm_90a (compute capability 9.0) only, not sm_%d", file,
                            target);
    }
    /* Everything here goes into the program's cache key: sc_kernels_precompile fills the
     * cache through this same function, so the keys agree by construction. */
    sc_program_header headers[32];
    size_t n = builtin_headers(files, count, headers, 32);
    return sci_program_create(ctx,
                              &(sc_program_desc){.source = source, .name = file,
                                                 .headers = headers, .n_headers = n,
                                                 .arch = how->arch, .arch_specific = sm90a,
                                                 .ptx = how->ptx},
                              &how->program, out, __FILE__, __LINE__);
}

sc_status sci_builtin_program(sc_context ctx, const char *file, int arch, sc_program *out)
{
    return sci_builtin_compile(sci_builtin_sources, sci_builtin_count, ctx, file,
                               &(sci_builtin_how){.arch = arch}, out);
}

static sc_status load_module(sci_context *ctx, const char *file, const char *source,
                             const char *fn, sci_module **out)
{
    (void)source;
    sc_program prog = {0};
    sc_status s = sci_builtin_program((sc_context){ctx->obj.id}, file, 0, &prog);
    if (s != SC_OK)
        return s;
    sci_program *p = NULL;
    s = sci_program_acquire(prog, fn, &p);
    if (s == SC_OK) {
        s = sci_module_load(ctx, p->out.image, p->out.image_size, p->out.is_ptx, p->out.n_names,
                            p->out.exprs, p->out.lowered, true, NULL, __FILE__, __LINE__, fn,
                            out);
        sci_program_release(p);
    }
    sc_program_destroy(prog);
    return s;
}

sc_status sci_builtin_kernel(sci_context *ctx, const char *file, const char *kernel,
                             const char *fn, sc_kernel *out)
{
    const char *source = NULL;
    for (size_t i = 0; i < sci_builtin_count; i++)
        if (strcmp(sci_builtin_sources[i].name, file) == 0)
            source = sci_builtin_sources[i].source;
    if (!source)
        return sci_fail(SC_ERR_INTERNAL, fn, "no built-in kernel file '%s'", file);
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_table; i++) {
        if (table[i].ctx_id == ctx->obj.id && table[i].file == source &&
            strcmp(table[i].kernel, kernel) == 0) {
            sci_object *obj = NULL;
            if (sci_registry_acquire(SCI_KIND_KERNEL, table[i].kernel_id, fn, &obj) == SC_OK) {
                sci_registry_release(obj);
                out->id = table[i].kernel_id;
                pthread_mutex_unlock(&lock);
                return SC_OK;
            }
        }
    }
    prune();
    /* One module per file and context: reuse it for the file's other kernels. */
    sci_module *m = NULL;
    for (size_t i = 0; i < n_table && !m; i++) {
        if (table[i].ctx_id != ctx->obj.id || table[i].file != source)
            continue;
        sci_object *obj = NULL;
        if (sci_registry_acquire(SCI_KIND_KERNEL, table[i].kernel_id, fn, &obj) == SC_OK) {
            m = ((sci_kernel *)obj)->module;
            sci_registry_release(obj);
        }
    }
    sc_status s = SC_OK;
    if (!m)
        s = load_module(ctx, file, source, fn, &m);
    if (s == SC_OK)
        s = sci_kernel_get(m, kernel, true, __FILE__, __LINE__, fn, out);
    if (s == SC_OK && n_table == cap_table) {
        size_t cap = cap_table ? cap_table * 2 : 16;
        cached *grown = realloc(table, cap * sizeof *grown);
        if (grown) {
            table = grown;
            cap_table = cap;
        }
    }
    if (s == SC_OK && n_table < cap_table) {
        cached *c = &table[n_table++];
        c->ctx_id = ctx->obj.id;
        c->file = source;
        snprintf(c->kernel, sizeof c->kernel, "%s", kernel);
        c->kernel_id = out->id;
    }
    pthread_mutex_unlock(&lock);
    return s;
}
