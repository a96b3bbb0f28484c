/* What the command-line tool's files share. */
#ifndef SAFECUDA_TOOL_H
#define SAFECUDA_TOOL_H

#include <stdbool.h>
#include <stdio.h>

#include "safecuda.h"

#define EXIT_NO_GPU 2
#define EXIT_USAGE 64

/* --arch's value (tools/target.c). */
typedef struct target {
    int arch;      /* 90 for sm_90; 0 for native (the device) */
    bool specific; /* sm_90a */
    bool ptx;      /* compute_90: PTX */
} target;

/* What the target is for: a compile (cubin or PTX for it), or the device that will use the
 * library's cache (precompile: the library's own choice of image there, no PTX targets). */
typedef enum target_use { TARGET_COMPILE, TARGET_DEVICE } target_use;

/* Parse and check opt's value text (sm_XY[a], compute_XY[a], XY[a] or native) for safecuda
 * cmd: the spelling, sm_XYa for sm_90 and newer only, nothing older than NVRTC's oldest
 * architecture, and for a compile a cubin only for what NVRTC builds (ptx or compute_XY opts
 * in to PTX for the newest below it). True with *t set; false after the one refusal message
 * on stderr (the caller exits 64). */
bool target_parse(const char *cmd, const char *opt, const char *text, target_use use, bool ptx,
                  target *t);

/* The table of exit statuses every command's help shows. */
void print_exit_statuses(FILE *f);

/* The exit status for a status of the driver's or NVRTC's loading: 0, 2 (no driver, device
 * or NVRTC), 64 (SC_ERR_INVALID_ARGUMENT: a bad SAFECUDA_* setting) or 1. */
int driver_exit(sc_status s);

/* safecuda precompile (tools/precompile.c). */
int cmd_precompile(int argc, char **argv);

#endif
