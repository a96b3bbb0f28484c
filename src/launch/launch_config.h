/* A launch's configuration check (internal), shared by launch.c and launch_attr.c. */
#ifndef SAFECUDA_LAUNCH_LAUNCH_CONFIG_H
#define SAFECUDA_LAUNCH_LAUNCH_CONFIG_H

#include "launch/module.h"

/* The grid, block and shared memory of d against the device's and the kernel's limits;
 * *grid and *block get d's with zero y and z made 1. */
sc_status sci_launch_check_config(const sci_kernel *k, const sc_launch_desc *d, sc_dim3 *grid,
                                  sc_dim3 *block, const char *fn);

#endif
