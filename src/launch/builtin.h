/* The library's own kernels: CUDA C++ sources under kernels/, embedded into the library
 * at build time (the generated builtin_sources.c) and compiled on first use. */
#ifndef SAFECUDA_LAUNCH_BUILTIN_H
#define SAFECUDA_LAUNCH_BUILTIN_H

#include <stddef.h>

#include "core/context.h"

typedef struct sci_builtin_source {
    const char *name;   /* path under kernels/, e.g. "util/elementwise.cu" */
    const char *source;
} sci_builtin_source;

extern const sci_builtin_source sci_builtin_sources[];
extern const size_t sci_builtin_count;

/* The embedded source of a built-in file, or NULL. */
const char *sci_builtin_find(const char *name);

/* Compile a built-in .cu file (with every built-in .cuh as a header) for ctx, or for arch
 * when ctx is the zero handle (compile-only). */
sc_status sci_builtin_program(sc_context ctx, const char *file, int arch, sc_program *out);

/* A kernel of a built-in file for the context: compiled (through the disk cache) and
 * loaded once per context, then kept until the context is destroyed. The kernel handle
 * is internal (never reported as a leak). */
sc_status sci_builtin_kernel(sci_context *ctx, const char *file, const char *kernel,
                             const char *fn, sc_kernel *out);

#endif
