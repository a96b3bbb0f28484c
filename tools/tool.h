/* What the command-line tool's files share. */
#ifndef SAFECUDA_TOOL_H
#define SAFECUDA_TOOL_H

#include <stdbool.h>
#include <stdio.h>

#include "safecuda.h"

#define EXIT_NO_GPU 2
#define EXIT_USAGE 64

/* --arch's value. */
typedef struct target {
    int arch;      /* 90 for sm_90; 0 for native (the device) */
    bool specific; /* sm_90a */
    bool ptx;      /* compute_90: PTX */
} target;

/* sm_XY[a], compute_XY[a], XY[a] or native; XY is two or three digits, 50 or more. False
 * for anything else, with *family set for sm_XYf (family-specific, not supported). */
bool parse_target(const char *text, target *t, bool *family);

/* The table of exit statuses every command's help shows. */
void print_exit_statuses(FILE *f);

/* The exit status for a status of the driver's or NVRTC's loading: 0, 2 (no driver, device
 * or NVRTC), 64 (SC_ERR_INVALID_ARGUMENT: a bad SAFECUDA_* setting) or 1. */
int driver_exit(sc_status s);

/* safecuda precompile (tools/precompile.c). */
int cmd_precompile(int argc, char **argv);

#endif
