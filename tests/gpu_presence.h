/* The one rule for "no GPU here" that the GPU tests and the benchmarks share.
 *
 * A GPU program skips (exit 77, CTest's SKIP_RETURN_CODE) only when there is nothing to run
 * on: no driver (SC_ERR_NO_DRIVER) or a driver that sees no device. Any other failure of
 * the first driver call (a broken driver, a device that cannot be initialized, an
 * unexpected status) is a FAILURE (exit 1): skipping there would let a broken GPU machine
 * read as passed. */
#ifndef SAFECUDA_GPU_PRESENCE_H
#define SAFECUDA_GPU_PRESENCE_H

#include <stdio.h>
#include <stdlib.h>

#include "safecuda.h"

#define GPU_SKIP 77 /* CTest's SKIP_RETURN_CODE */

/* Return when a device is there; otherwise print "<name>: skipped: why" and exit 77, or
 * "<name>: FAILED: why" and exit 1. */
static inline void gpu_presence_require(const char *name)
{
    int n = 0;
    sc_status s = sc_device_count(&n);
    if (s == SC_OK && n > 0)
        return;
    if (s == SC_OK) {
        printf("%s: skipped: the CUDA driver sees no device\n", name);
        exit(GPU_SKIP);
    }
    if (s == SC_ERR_NO_DRIVER) {
        printf("%s: skipped: %s\n", name, sc_last_error());
        exit(GPU_SKIP);
    }
    printf("%s: FAILED: the driver is there but sc_device_count answered %s: %s\n", name,
           sc_status_name(s), sc_last_error());
    fflush(stdout);
    exit(1);
}

#endif
