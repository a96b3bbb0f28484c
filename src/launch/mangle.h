/* Parameter types of a kernel from its Itanium C++ mangled name (what NVRTC and nvcc
 * produce for kernels without extern "C"), enough to check launch arguments: pointers to
 * (const) element types and scalar types. Unknown constructs end the decoding (the caller
 * falls back to size checks). */
#ifndef SAFECUDA_LAUNCH_MANGLE_H
#define SAFECUDA_LAUNCH_MANGLE_H

#include <stdbool.h>

#include "safecuda.h"

typedef enum sci_param_kind {
    SCI_PARAM_OTHER = 0, /* a struct by value, a reference, ...: size checks only */
    SCI_PARAM_SCALAR,    /* dtype INVALID for scalars without an sc_dtype (bool, char16_t) */
    SCI_PARAM_POINTER    /* dtype INVALID for void* and pointers to structs */
} sci_param_kind;

typedef struct sci_param_type {
    sci_param_kind kind;
    sc_dtype dtype;
    bool is_const; /* pointers: const element type */
    char text[64]; /* "const float*", "int", ... */
} sci_param_type;

/* Decode up to max parameter types; returns how many there are, or -1 if the name is
 * not a mangled function name this decoder understands. */
int sci_demangle_params(const char *mangled, sci_param_type *out, int max);

#endif
