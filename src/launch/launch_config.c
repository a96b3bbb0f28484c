/* A launch's grid, block and shared memory against the device's and the kernel's limits:
 * the check that sc_kernel_launch (launch.c) and sc_kernel_occupancy_clusters
 * (launch_attr.c) both make first. */
#include <stdatomic.h>

#include "launch/launch_config.h"

sc_status sci_launch_check_config(const sci_kernel *k, const sc_launch_desc *d, sc_dim3 *grid,
                                  sc_dim3 *block, const char *fn)
{
    const sc_device_props *p = &k->ctx->props;
    *grid = d->grid;
    *block = d->block;
    if (grid->y == 0)
        grid->y = 1;
    if (grid->z == 0)
        grid->z = 1;
    if (block->y == 0)
        block->y = 1;
    if (block->z == 0)
        block->z = 1;
    if (grid->x == 0 || block->x == 0)
        return sci_fail(SC_ERR_LAUNCH, fn, "kernel '%s': %s.x is 0", k->display,
                        grid->x == 0 ? "grid" : "block");
    const uint32_t g[3] = {grid->x, grid->y, grid->z}, b[3] = {block->x, block->y, block->z};
    for (int i = 0; i < 3; i++) {
        if (g[i] > (uint32_t)p->max_grid[i])
            return sci_fail(SC_ERR_LAUNCH, fn, "kernel '%s': grid.%c = %u exceeds the device's %d",
                            k->display, "xyz"[i], g[i], p->max_grid[i]);
        if (b[i] > (uint32_t)p->max_block[i])
            return sci_fail(SC_ERR_LAUNCH, fn,
                            "kernel '%s': block.%c = %u exceeds the device's %d", k->display,
                            "xyz"[i], b[i], p->max_block[i]);
    }
    uint64_t threads = (uint64_t)b[0] * b[1] * b[2];
    if (threads > (uint64_t)k->max_threads)
        return sci_fail(SC_ERR_LAUNCH, fn,
                        "kernel '%s': a block of %u x %u x %u = %llu threads; the kernel allows "
                        "at most %d (device limit %d)",
                        k->display, b[0], b[1], b[2], (unsigned long long)threads, k->max_threads,
                        p->max_threads_per_block);
    int dyn = atomic_load(&k->max_dynamic_shared);
    if (d->shared_bytes > (uint32_t)dyn) {
        int optin = p->shared_per_block_optin - k->static_shared;
        if (d->shared_bytes <= (uint32_t)optin)
            return sci_fail(SC_ERR_LAUNCH, fn,
                            "kernel '%s': %u bytes of dynamic shared memory asked; the kernel's "
                            "limit is %d (raise it up to %d with "
                            "sc_kernel_set_max_dynamic_shared)",
                            k->display, d->shared_bytes, dyn, optin);
        return sci_fail(SC_ERR_LAUNCH, fn,
                        "kernel '%s': %u bytes of dynamic shared memory asked; the device allows "
                        "%d per block and the kernel uses %d statically (at most %d dynamic)",
                        k->display, d->shared_bytes, p->shared_per_block_optin, k->static_shared,
                        optin);
    }
    return SC_OK;
}
