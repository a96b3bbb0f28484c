/* Launch attributes (internal): thread-block clusters and cooperative launches, checked
 * before the driver sees them, and the attribute list of cuLaunchKernelEx. */
#ifndef SAFECUDA_LAUNCH_LAUNCH_ATTR_H
#define SAFECUDA_LAUNCH_LAUNCH_ATTR_H

#include "launch/launch_config.h"
#include "launch/module.h"

/* What a checked launch asks the driver for beyond grid, block and shared memory. */
typedef struct sci_launch_plan {
    sc_dim3 cluster;   /* the cluster the grid runs in (given or compiled), 0 x 0 x 0: none */
    bool cluster_attr; /* pass cluster as CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION (a kernel
                          with compiled dims gets them without it) */
    bool cooperative;
    bool programmatic;
} sci_launch_plan;

#define SCI_MAX_LAUNCH_ATTRS 3

/* Check d's cluster, non-portable and cooperative fields for a launch of grid x block
 * (already checked by sci_launch_check_config, launch_config.h) and fill *plan. May call
 * the driver (occupancy queries, and the kernel's non-portable cluster attribute, set
 * once). */
sc_status sci_launch_attrs_check(sci_kernel *k, const sc_launch_desc *d, sc_dim3 grid,
                                 sc_dim3 block, const char *fn, sci_launch_plan *plan);

/* The cuLaunchKernelEx attributes of plan into attrs (SCI_MAX_LAUNCH_ATTRS of them at
 * most); returns how many (0: a plain cuLaunchKernel does). */
unsigned sci_launch_attrs_fill(const sci_launch_plan *plan, CUlaunchAttribute *attrs);

/* Read the kernel's compile-time cluster attributes into k (sc_kernel_get; sm_90+). */
sc_status sci_kernel_read_cluster_attrs(sci_kernel *k, const char *fn);

#endif
