/* NVRTC programs (internal). */
#ifndef SAFECUDA_COMPILE_PROGRAM_H
#define SAFECUDA_COMPILE_PROGRAM_H

#include "compile/cache.h"
#include "core/context.h"

typedef struct sci_program {
    sci_object obj;
    sci_context *ctx;    /* NULL for compile-only programs */
    int arch;
    bool arch_specific;  /* built for sm_XYa (compute_XYa) */
    bool from_cache;
    double compile_ms;
    char *log;
    char cache_path[512];
    sci_cache_entry out; /* image and lowered names */
} sci_program;

/* How the library itself creates a program; all zero (or NULL) is sc_program_create. */
typedef struct sci_program_how {
    const char *fn;        /* the function its messages name (NULL: "sc_program_create") */
    const char *cache_dir; /* the cache folder, made by the caller (NULL: the library's) */
    bool must_store;       /* an entry that can't be written is SC_ERR_IO, not a best-effort
                              write */
} sci_program_how;

/* sc_program_create_at, as how says. */
sc_status sci_program_create(sc_context ctx, const sc_program_desc *desc,
                             const sci_program_how *how, sc_program *program, const char *file,
                             int line);

sc_status sci_program_acquire(sc_program h, const char *fn, sci_program **out);
void sci_program_release(sci_program *p);

/* The lowered name of a name expression, or NULL. */
const char *sci_program_lowered(const sci_program *p, const char *expr);

#endif
