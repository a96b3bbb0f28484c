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

sc_status sci_program_acquire(sc_program h, const char *fn, sci_program **out);
void sci_program_release(sci_program *p);

/* The lowered name of a name expression, or NULL. */
const char *sci_program_lowered(const sci_program *p, const char *expr);

#endif
