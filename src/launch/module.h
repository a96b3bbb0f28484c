/* Modules and kernels (internal). */
#ifndef SAFECUDA_LAUNCH_MODULE_H
#define SAFECUDA_LAUNCH_MODULE_H

#include "core/context.h"
#include "launch/mangle.h"

#define SCI_MAX_PARAMS 64

typedef struct sci_module {
    sci_object obj;
    sci_context *ctx;
    CUmodule cu;
    size_t n_names;  /* the program's name expressions and their lowered names */
    char **exprs;
    char **lowered;
} sci_module;

typedef struct sci_kernel {
    sci_object obj;
    sci_context *ctx;
    sci_module *module;
    CUfunction fn;
    char name[256];      /* the symbol */
    char display[256];   /* what the caller asked for (e.g. "scale<float>") */
    int n_params;        /* -1: unknown (driver without cuFuncGetParamInfo) */
    uint32_t param_size[SCI_MAX_PARAMS];
    bool typed;
    sci_param_type types[SCI_MAX_PARAMS];
    int max_threads;
    int static_shared;
    atomic_int max_dynamic_shared;
    sc_dim3 cluster_dims;        /* compiled (__cluster_dims__), 0 x 0 x 0 when none */
    bool cluster_required;       /* launches need a cluster (compiled dims or given) */
    atomic_bool non_portable;    /* NON_PORTABLE_CLUSTER_SIZE_ALLOWED set on fn */
} sci_kernel;

sc_status sci_kernel_acquire(sc_kernel h, const char *fn, sci_kernel **out);
void sci_kernel_release(sci_kernel *k);

/* Load a module from an image for ctx (internal modules are not reported as leaks); label
 * may be NULL. */
sc_status sci_module_load(sci_context *c, const void *image, size_t bytes, bool is_ptx,
                          size_t n_names, char *const *exprs, char *const *lowered,
                          bool internal, const char *label, const char *file, int line,
                          const char *fn, sci_module **out);
/* Get a kernel of a module (internal kernels are not reported as leaks). */
sc_status sci_kernel_get(sci_module *m, const char *name, bool internal, const char *file,
                         int line, const char *fn, sc_kernel *out);

#endif
