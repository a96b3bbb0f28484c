/* Launch attributes: thread-block clusters (sm_90+) and cooperative launches, checked before
 * the driver sees them, the attribute list of cuLaunchKernelEx, and the cluster occupancy
 * query.
 *
 * Clusters. A launch runs in clusters when sc_launch_desc.cluster is set or when the kernel
 * was compiled with __cluster_dims__(X, Y, Z) (PTX .reqnctapercluster, read once by
 * sc_kernel_get from CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH). Compiled dims
 * are never passed to the driver again: a kernel that has them gets them at every launch,
 * and asking for the same dims at run time adds nothing. The portable cluster size is 8
 * blocks (the one CUDA guarantees on sm_90 and every later GPU); past it the caller must
 * allow non-portable sizes, and the limit is then the kernel's, for the launch's block size
 * and shared memory, as cuOccupancyMaxPotentialClusterSize answers it once the kernel
 * allows non-portable sizes (16 on H100).
 *
 * Cooperative launches. cuda.h bounds a cooperative grid by the blocks that fit at once:
 * cuOccupancyMaxActiveBlocksPerMultiprocessor x the SM count. With clusters the blocks are
 * placed a cluster at a time inside one GPC, which can leave room unused, so the grid must
 * also fit in cuOccupancyMaxActiveClusters clusters (on an H100, blocks of 128 threads: 16
 * a SM x 132 SMs = 2112 blocks alone, but 528 clusters of 2 = 1056 blocks in pairs; the
 * driver refuses a grid past either bound with CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE).
 * cuda.h documents no restriction on the two attributes together, and cuLaunchKernelEx
 * takes both in one list, so both are allowed, under both bounds. */
#include <stdio.h>
#include <string.h>

#include "driver/driver.h"
#include "launch/launch_attr.h"

/* The cluster size guaranteed to launch on sm_90 and later GPUs. */
#define SCI_PORTABLE_CLUSTER 8

static bool dims_equal(sc_dim3 a, sc_dim3 b) { return a.x == b.x && a.y == b.y && a.z == b.z; }

sc_status sci_kernel_read_cluster_attrs(sci_kernel *k, const char *fn)
{
    k->cluster_dims = (sc_dim3){0, 0, 0};
    k->cluster_required = false;
    atomic_store(&k->non_portable, false);
    if (k->ctx->props.cc_major < 9)
        return SC_OK; /* no clusters before sm_90 */
    static const struct {
        CUfunction_attribute a;
        const char *name;
    } attrs[] = {
        {CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, "REQUIRED_CLUSTER_WIDTH"},
        {CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT, "REQUIRED_CLUSTER_HEIGHT"},
        {CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH, "REQUIRED_CLUSTER_DEPTH"},
        {CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET, "CLUSTER_SIZE_MUST_BE_SET"},
    };
    int v[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        CUresult r = sci_cuFuncGetAttribute(&v[i], attrs[i].a, k->fn);
        /* CUDA_ERROR_INVALID_VALUE: a driver that does not report the attribute. The kernel
         * is then taken to have no compile-time cluster; the driver still checks the launch. */
        if (r == CUDA_ERROR_INVALID_VALUE) {
            v[i] = 0;
            continue;
        }
        if (r != CUDA_SUCCESS)
            return sci_context_fail_cu(k->ctx, r, fn, "cuFuncGetAttribute('%s', %s)", k->display,
                                       attrs[i].name);
    }
    if (v[0] > 0)
        k->cluster_dims = (sc_dim3){(uint32_t)v[0], v[1] > 0 ? (uint32_t)v[1] : 1u,
                                    v[2] > 0 ? (uint32_t)v[2] : 1u};
    k->cluster_required = v[3] != 0 || v[0] > 0;
    return SC_OK;
}

/* Allow non-portable cluster sizes on the kernel (once). */
static sc_status allow_non_portable(sci_kernel *k, const char *fn)
{
    if (atomic_load(&k->non_portable))
        return SC_OK;
    CUresult r =
        sci_cuFuncSetAttribute(k->fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(k->ctx, r, fn,
                                   "cuFuncSetAttribute('%s', NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)",
                                   k->display);
    atomic_store(&k->non_portable, true);
    return SC_OK;
}

static CUlaunchConfig query_config(sc_dim3 grid, sc_dim3 block, uint32_t shared,
                                   CUlaunchAttribute *attrs, unsigned n_attrs)
{
    /* A NULL stream: the driver computes for the current context (the kernel's). */
    const CUlaunchConfig cfg = {grid.x,  grid.y, grid.z, block.x, block.y, block.z,
                                shared, NULL,   attrs,  n_attrs};
    return cfg;
}

/* The largest cluster the kernel can be launched with for this block and shared memory,
 * non-portable sizes allowed. */
static sc_status non_portable_max(sci_kernel *k, sc_dim3 grid, sc_dim3 block, uint32_t shared,
                                  const char *fn, int *max)
{
    sc_status s = allow_non_portable(k, fn);
    if (s != SC_OK)
        return s;
    const CUlaunchConfig cfg = query_config(grid, block, shared, NULL, 0);
    CUresult r = sci_cuOccupancyMaxPotentialClusterSize(max, k->fn, &cfg);
    if (r == CUDA_ERROR_NOT_INITIALIZED) /* the entry point is missing */
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "kernel '%s': the driver can't report the largest non-portable cluster "
                        "(no cuOccupancyMaxPotentialClusterSize)",
                        k->display);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(k->ctx, r, fn, "cuOccupancyMaxPotentialClusterSize('%s')",
                                   k->display);
    return SC_OK;
}

/* How many clusters of plan's shape fit on the device at once. */
static sc_status active_clusters(sci_kernel *k, const sci_launch_plan *plan, sc_dim3 grid,
                                 sc_dim3 block, uint32_t shared, const char *fn, int *n)
{
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = plan->cluster.x;
    attr.value.clusterDim.y = plan->cluster.y;
    attr.value.clusterDim.z = plan->cluster.z;
    const CUlaunchConfig cfg = query_config(grid, block, shared, &attr, plan->cluster_attr);
    *n = 0;
    CUresult r = sci_cuOccupancyMaxActiveClusters(n, k->fn, &cfg);
    if (r == CUDA_ERROR_NOT_INITIALIZED)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "kernel '%s': the driver can't count resident clusters (no "
                        "cuOccupancyMaxActiveClusters)",
                        k->display);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(k->ctx, r, fn,
                                   "cuOccupancyMaxActiveClusters('%s', cluster %u x %u x %u)",
                                   k->display, plan->cluster.x, plan->cluster.y, plan->cluster.z);
    return SC_OK;
}

/* Which cluster the launch runs in: the one asked for, the compiled one, or none. */
static sc_status resolve_cluster(sci_kernel *k, const sc_launch_desc *d, const char *fn,
                                 sci_launch_plan *plan)
{
    const sc_device_props *p = &k->ctx->props;
    sc_dim3 c = d->cluster;
    const bool asked = c.x || c.y || c.z;
    if (asked) {
        if (c.x == 0)
            return sci_fail(SC_ERR_LAUNCH, fn,
                            "kernel '%s': cluster = %u x %u x %u: cluster.x is 0 (a cluster "
                            "needs x >= 1; 0 x 0 x 0 means no cluster)",
                            k->display, c.x, c.y, c.z);
        if (c.y == 0)
            c.y = 1;
        if (c.z == 0)
            c.z = 1;
        if (p->cc_major < 9)
            return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                            "kernel '%s': thread-block clusters (cluster = %u x %u x %u) need "
                            "compute capability 9.0 or newer; device %d is %d.%d",
                            k->display, c.x, c.y, c.z, p->ordinal, p->cc_major, p->cc_minor);
        if (!sci_driver_has_launch_ex())
            return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                            "kernel '%s': thread-block clusters need the driver's "
                            "cuLaunchKernelEx (CUDA 12.0 or newer)",
                            k->display);
    }
    const sc_dim3 r = k->cluster_dims;
    if (r.x) {
        if (asked && !dims_equal(c, r))
            return sci_fail(SC_ERR_LAUNCH, fn,
                            "kernel '%s' was compiled with __cluster_dims__(%u, %u, %u) but "
                            "cluster = %u x %u x %u was asked (leave cluster 0 x 0 x 0 or give "
                            "the same dims)",
                            k->display, r.x, r.y, r.z, c.x, c.y, c.z);
        plan->cluster = r;
    } else if (asked) {
        plan->cluster = c;
        plan->cluster_attr = true;
    } else if (k->cluster_required) {
        return sci_fail(SC_ERR_LAUNCH, fn,
                        "kernel '%s' runs only in clusters (compiled with __cluster_dims__() "
                        "without dims) but cluster is 0 x 0 x 0: give the cluster's dims",
                        k->display);
    }
    return SC_OK;
}

sc_status sci_launch_attrs_check(sci_kernel *k, const sc_launch_desc *d, sc_dim3 grid,
                                 sc_dim3 block, const char *fn, sci_launch_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    const sc_device_props *p = &k->ctx->props;
    plan->programmatic = d->programmatic && p->cc_major >= 9 && sci_driver_has_launch_ex();
    sc_status s = resolve_cluster(k, d, fn, plan);
    if (s != SC_OK)
        return s;
    const uint32_t g[3] = {grid.x, grid.y, grid.z};
    const uint64_t blocks = (uint64_t)g[0] * g[1] * g[2];
    const sc_dim3 c = plan->cluster;
    const uint64_t cluster_size = (uint64_t)c.x * c.y * c.z;
    const char *which = plan->cluster_attr ? "cluster" : "the kernel's compiled cluster";
    if (c.x) {
        const uint32_t cl[3] = {c.x, c.y, c.z};
        for (int i = 0; i < 3; i++)
            if (g[i] % cl[i] != 0)
                return sci_fail(SC_ERR_LAUNCH, fn,
                                "kernel '%s': grid.%c = %u is not a multiple of cluster.%c = %u "
                                "(grid %u x %u x %u, %s %u x %u x %u)",
                                k->display, "xyz"[i], g[i], "xyz"[i], cl[i], g[0], g[1], g[2],
                                which, c.x, c.y, c.z);
        if (cluster_size > SCI_PORTABLE_CLUSTER) {
            if (!d->non_portable_cluster)
                return sci_fail(SC_ERR_LAUNCH, fn,
                                "kernel '%s': %s %u x %u x %u = %llu blocks exceeds the portable "
                                "cluster size of %d; set non_portable_cluster to allow up to "
                                "the kernel's non-portable maximum on this device",
                                k->display, which, c.x, c.y, c.z,
                                (unsigned long long)cluster_size, SCI_PORTABLE_CLUSTER);
            int max = 0;
            if ((s = non_portable_max(k, grid, block, d->shared_bytes, fn, &max)) != SC_OK)
                return s;
            if (cluster_size > (uint64_t)(max > 0 ? max : 0))
                return sci_fail(SC_ERR_LAUNCH, fn,
                                "kernel '%s': %s %u x %u x %u = %llu blocks exceeds the "
                                "kernel's non-portable maximum of %d on device %d (blocks of "
                                "%u x %u x %u threads, %u bytes of dynamic shared memory)",
                                k->display, which, c.x, c.y, c.z,
                                (unsigned long long)cluster_size, max, p->ordinal, block.x,
                                block.y, block.z, d->shared_bytes);
        }
    }
    if (!d->cooperative)
        return SC_OK;
    int coop = 0;
    CUresult r = sci_cuDeviceGetAttribute(&coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
                                          k->ctx->cu_device);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(k->ctx, r, fn,
                                   "cuDeviceGetAttribute(COOPERATIVE_LAUNCH, device %d)",
                                   p->ordinal);
    if (!coop)
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "kernel '%s': device %d (%s) does not support cooperative launches "
                        "(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH is 0)",
                        k->display, p->ordinal, p->name);
    if (!sci_driver_has_launch_ex())
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "kernel '%s': cooperative launches need the driver's cuLaunchKernelEx "
                        "(CUDA 12.0 or newer)",
                        k->display);
    const int threads = (int)((uint64_t)block.x * block.y * block.z); /* checked: <= 1024 */
    int per_sm = 0;
    r = sci_cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k->fn, threads,
                                                        (size_t)d->shared_bytes);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(k->ctx, r, fn,
                                   "cuOccupancyMaxActiveBlocksPerMultiprocessor('%s')",
                                   k->display);
    const uint64_t by_sm = (uint64_t)(per_sm > 0 ? per_sm : 0) * (uint64_t)p->sm_count;
    if (blocks > by_sm)
        return sci_fail(SC_ERR_LAUNCH, fn,
                        "kernel '%s': a cooperative grid of %u x %u x %u = %llu blocks exceeds "
                        "the %llu that can be resident at once (%d per SM for blocks of %d "
                        "threads and %u bytes of dynamic shared memory, x %d SMs)",
                        k->display, g[0], g[1], g[2], (unsigned long long)blocks,
                        (unsigned long long)by_sm, per_sm, threads, d->shared_bytes,
                        p->sm_count);
    if (c.x) {
        int n = 0;
        if ((s = active_clusters(k, plan, grid, block, d->shared_bytes, fn, &n)) != SC_OK)
            return s;
        const uint64_t by_cluster = (uint64_t)(n > 0 ? n : 0) * cluster_size;
        if (blocks > by_cluster)
            return sci_fail(SC_ERR_LAUNCH, fn,
                            "kernel '%s': a cooperative grid of %u x %u x %u = %llu blocks "
                            "exceeds the %llu that can be resident at once in clusters of "
                            "%u x %u x %u (%d clusters fit)",
                            k->display, g[0], g[1], g[2], (unsigned long long)blocks,
                            (unsigned long long)by_cluster, c.x, c.y, c.z, n);
    }
    plan->cooperative = true;
    return SC_OK;
}

unsigned sci_launch_attrs_fill(const sci_launch_plan *plan, CUlaunchAttribute *attrs)
{
    unsigned n = 0;
    memset(attrs, 0, SCI_MAX_LAUNCH_ATTRS * sizeof *attrs);
    if (plan->programmatic) {
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n++].value.programmatic_stream_serialization_allowed = 1;
    }
    if (plan->cluster_attr) {
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[n].value.clusterDim.x = plan->cluster.x;
        attrs[n].value.clusterDim.y = plan->cluster.y;
        attrs[n++].value.clusterDim.z = plan->cluster.z;
    }
    if (plan->cooperative) {
        attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attrs[n++].value.cooperative = 1;
    }
    return n;
}

sc_status sc_kernel_occupancy_clusters(sc_kernel kernel, const sc_launch_desc *desc,
                                       int *clusters)
{
    static const char fn[] = "sc_kernel_occupancy_clusters";
    SCI_CHECK_PTR(fn, clusters);
    *clusters = 0;
    SCI_CHECK_PTR(fn, desc);
    sci_kernel *k = NULL;
    sc_status s = sci_kernel_acquire(kernel, fn, &k);
    if (s != SC_OK)
        return s;
    /* The grid is not asked about: one cluster's worth of blocks stands for it, so that the
     * checks below see a grid the cluster divides. */
    sc_launch_desc q = *desc;
    q.cooperative = false;
    q.programmatic = false;
    const sc_dim3 c = desc->cluster;
    if (c.x)
        q.grid = (sc_dim3){c.x, c.y ? c.y : 1u, c.z ? c.z : 1u};
    else if (k->cluster_dims.x)
        q.grid = k->cluster_dims;
    else
        q.grid = (sc_dim3){1, 1, 1};
    sc_dim3 grid, block;
    sci_launch_plan plan;
    s = sci_launch_check_config(k, &q, &grid, &block, fn);
    if (s == SC_OK)
        s = sci_launch_attrs_check(k, &q, grid, block, fn, &plan);
    if (s == SC_OK && !plan.cluster.x)
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "kernel '%s': desc->cluster is 0 x 0 x 0 and the kernel has no compiled "
                     "cluster dims: there is no cluster to ask about",
                     k->display);
    if (s == SC_OK)
        s = active_clusters(k, &plan, grid, block, desc->shared_bytes, fn, clusters);
    if (s != SC_OK)
        *clusters = 0;
    sci_kernel_release(k);
    return s;
}
