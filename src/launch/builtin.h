/* The library's own kernels: CUDA C++ sources under kernels/, embedded into the library
 * at build time (the generated builtin_sources.c) and compiled on first use. */
#ifndef SAFECUDA_LAUNCH_BUILTIN_H
#define SAFECUDA_LAUNCH_BUILTIN_H

#include <stddef.h>

#include "compile/program.h"
#include "core/context.h"

typedef struct sci_builtin_source {
    const char *name;   /* path under kernels/, e.g. "util/elementwise.cu" */
    const char *source;
} sci_builtin_source;

extern const sci_builtin_source sci_builtin_sources[];
extern const size_t sci_builtin_count;

/* The embedded source of a built-in file, or NULL. */
const char *sci_builtin_find(const char *name);

/* Whether the file is one of those for sm_90a only (named *_sm90a.cu). */
bool sci_builtin_is_sm90a(const char *file);

/* How a built-in file is compiled. All zero but arch is what the library loads with. */
typedef struct sci_builtin_how {
    int arch;                /* e.g. 90; 0: the context's device */
    bool ptx;                /* PTX where a cubin is possible (what the test device loads) */
    sci_program_how program; /* the function messages name, the cache folder, must_store */
} sci_builtin_how;

/* Compile file of files (count entries; every .cuh of it is a header) for ctx, or for
 * how->arch when ctx is the zero handle. A *_sm90a.cu file for another architecture than
 * 9.0 is SC_ERR_NOT_SUPPORTED. */
sc_status sci_builtin_compile(const sci_builtin_source *files, size_t count, sc_context ctx,
                              const char *file, const sci_builtin_how *how, sc_program *out);

/* Compile a built-in .cu file (with every built-in .cuh as a header) for ctx, or for arch
 * when ctx is the zero handle (compile-only). */
sc_status sci_builtin_program(sc_context ctx, const char *file, int arch, sc_program *out);

/* sc_kernels_precompile over files (count entries) instead of the built-in ones (tests
 * give sources of their own). */
sc_status sci_precompile(const sci_builtin_source *files, size_t count,
                         const sc_precompile_desc *desc, sc_precompile_report *report);

/* A kernel of a built-in file for the context: compiled (through the disk cache) and
 * loaded once per context, then kept until the context is destroyed. The kernel handle
 * is internal (never reported as a leak). */
sc_status sci_builtin_kernel(sci_context *ctx, const char *file, const char *kernel,
                             const char *fn, sc_kernel *out);

#endif
