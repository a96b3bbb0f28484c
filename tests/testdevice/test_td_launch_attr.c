/* Launch attributes against the test device: thread-block clusters, non-portable cluster
 * sizes, cooperative launches and the cluster occupancy query.
 *
 * Every refusal is checked with its status and message, and that nothing reached the
 * driver's launch (cuLaunchKernel / cuLaunchKernelEx counted through the fault hook); valid
 * configurations reach cuLaunchKernelEx once, with the attribute list the plan makes.
 *
 * Some checks need the test device to model what a GPU answers: a kernel's compile-time
 * cluster (CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_* from the PTX's .reqnctapercluster,
 * CLUSTER_SIZE_MUST_BE_SET from .explicitcluster), NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
 * CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH and CLUSTER_LAUNCH, launches with cluster and
 * cooperative attributes, cuOccupancyMaxActiveClusters. The test asks the test device
 * whether it answers them and runs those checks only then; each group it leaves out says
 * so on stdout ("not modelled: ...").
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include <stdint.h>

#include "../test.h"
#include "driver/driver.h"
#include "td_control.h"
#include "launch/launch_attr.h"

/* plain(u64): no cluster. fixed(u64): __cluster_dims__(2, 1, 1). only(u64):
 * __cluster_dims__() (clusters given at launch). Valid PTX (ptxas -arch=sm_90 takes it). */
static const char cluster_ptx[] = ".version 8.0\n"
                                  ".target sm_90\n"
                                  ".address_size 64\n"
                                  "\n"
                                  ".visible .entry plain(\n"
                                  "    .param .u64 plain_param_0\n"
                                  ")\n"
                                  "{\n"
                                  "    ret;\n"
                                  "}\n"
                                  "\n"
                                  ".visible .entry fixed(\n"
                                  "    .param .u64 fixed_param_0\n"
                                  ")\n"
                                  ".explicitcluster\n"
                                  ".reqnctapercluster 2, 1, 1\n"
                                  "{\n"
                                  "    ret;\n"
                                  "}\n"
                                  "\n"
                                  ".visible .entry only(\n"
                                  "    .param .u64 only_param_0\n"
                                  ")\n"
                                  ".explicitcluster\n"
                                  "{\n"
                                  "    ret;\n"
                                  "}\n";

static sc_context ctx;
static sc_kernel plain, fixed, only;
static sc_buffer buf;
static bool models_func_attrs, models_cluster_launch, models_coop;

static void not_modelled(const char *what)
{
    printf("not modelled by the test device yet, checks left out: %s\n", what);
}

/* Launch k(buf) with d; the status. */
static sc_status launch(sc_kernel k, const sc_launch_desc *d)
{
    return SC_LAUNCH(SC_DEFAULT_STREAM, k, d, sc_arg_inout(sc_view_of(buf)));
}

/* d is refused with want and a message holding the needle; no launch reached the driver. */
#define REFUSED(k, d, want, needle)                                                      \
    do {                                                                                 \
        REQUIRE(sci_fault_arm("cuLaunchKernelEx", 0, 0));                                \
        sc_clear_error();                                                                \
        CHECK_STATUS(launch((k), (d)), (want));                                          \
        CHECK_MSG("sc_kernel_launch: ");                                                 \
        CHECK_MSG(needle);                                                               \
        CHECK(sci_fault_calls() == 0);                                                   \
        REQUIRE(sci_fault_arm("cuLaunchKernel", 0, 0));                                  \
        CHECK_STATUS(launch((k), (d)), (want));                                          \
        CHECK(sci_fault_calls() == 0);                                                   \
        sci_fault_disarm();                                                              \
    } while (0)

/* d reaches cuLaunchKernelEx exactly once: SC_OK where the test device models the launch's
 * attributes, else its answer for attributes it does not know (SC_ERR_NOT_SUPPORTED). */
static void reaches_driver(sc_kernel k, const sc_launch_desc *d, bool modelled, const char *what)
{
    REQUIRE(sci_fault_arm("cuLaunchKernelEx", 0, 0));
    sc_clear_error();
    sc_status s = launch(k, d);
    if (sci_fault_calls() != 1)
        fprintf(stderr, "%s: cuLaunchKernelEx called %llu times (%s: %s)\n", what,
                (unsigned long long)sci_fault_calls(), sc_status_name(s), sc_last_error());
    CHECK(sci_fault_calls() == 1);
    sci_fault_disarm();
    if (modelled) {
        if (s != SC_OK)
            fprintf(stderr, "%s: %s: %s\n", what, sc_status_name(s), sc_last_error());
        CHECK(s == SC_OK);
    } else {
        CHECK(s == SC_ERR_NOT_SUPPORTED);
    }
    CHECK(fake.misuse_count() == 0);
}

/* The attribute list a plan makes, and the plan a desc makes (no driver call needed). */
static void test_plan(void)
{
    CUlaunchAttribute attrs[SCI_MAX_LAUNCH_ATTRS];
    sci_launch_plan plan = {.cluster = {2, 3, 1}, .cluster_attr = true, .cooperative = true,
                            .programmatic = true};
    CHECK(sci_launch_attrs_fill(&plan, attrs) == 3);
    CHECK(attrs[0].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION &&
          attrs[0].value.programmatic_stream_serialization_allowed == 1);
    CHECK(attrs[1].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION && attrs[1].value.clusterDim.x == 2 &&
          attrs[1].value.clusterDim.y == 3 && attrs[1].value.clusterDim.z == 1);
    CHECK(attrs[2].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && attrs[2].value.cooperative == 1);
    plan = (sci_launch_plan){.cluster = {2, 1, 1}}; /* compiled dims: no attribute */
    CHECK(sci_launch_attrs_fill(&plan, attrs) == 0);
    plan = (sci_launch_plan){.cooperative = true};
    CHECK(sci_launch_attrs_fill(&plan, attrs) == 1 && attrs[0].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE);

    /* A runtime cluster: y and z of 0 are 1, and it is passed as an attribute. */
    sci_kernel *k = NULL;
    REQUIRE(sci_kernel_acquire(plain, "test", &k) == SC_OK);
    sc_launch_desc d = {.grid = {8, 1, 1}, .block = {128, 1, 1}, .cluster = {4, 0, 0},
                        .programmatic = true};
    sc_dim3 grid, block;
    CHECK_OK(sci_launch_check_config(k, &d, &grid, &block, "test"));
    CHECK_OK(sci_launch_attrs_check(k, &d, grid, block, "test", &plan));
    CHECK(plan.cluster.x == 4 && plan.cluster.y == 1 && plan.cluster.z == 1);
    CHECK(plan.cluster_attr && plan.programmatic && !plan.cooperative);
    d.cluster = (sc_dim3){0, 0, 0};
    CHECK_OK(sci_launch_attrs_check(k, &d, grid, block, "test", &plan));
    CHECK(plan.cluster.x == 0 && !plan.cluster_attr);
    sci_kernel_release(k);
    if (!models_func_attrs)
        return;
    /* Compiled dims, asked again or not: never passed as an attribute. */
    REQUIRE(sci_kernel_acquire(fixed, "test", &k) == SC_OK);
    d = (sc_launch_desc){.grid = {8, 1, 1}, .block = {128, 1, 1}, .cluster = {2, 1, 1}};
    CHECK_OK(sci_launch_check_config(k, &d, &grid, &block, "test"));
    CHECK_OK(sci_launch_attrs_check(k, &d, grid, block, "test", &plan));
    CHECK(plan.cluster.x == 2 && plan.cluster.y == 1 && plan.cluster.z == 1 && !plan.cluster_attr);
    d.cluster = (sc_dim3){0, 0, 0};
    CHECK_OK(sci_launch_attrs_check(k, &d, grid, block, "test", &plan));
    CHECK(plan.cluster.x == 2 && !plan.cluster_attr);
    sci_kernel_release(k);
}

static void test_kernel_info(void)
{
    sc_kernel_props p;
    CHECK_OK(sc_kernel_info(plain, &p));
    CHECK(p.cluster_dims.x == 0 && p.cluster_dims.y == 0 && p.cluster_dims.z == 0);
    CHECK(!p.cluster_required);
    if (!models_func_attrs) {
        not_modelled("compile-time cluster dims in sc_kernel_info");
        return;
    }
    CHECK_OK(sc_kernel_info(fixed, &p));
    CHECK(p.cluster_dims.x == 2 && p.cluster_dims.y == 1 && p.cluster_dims.z == 1);
    CHECK(p.cluster_required);
    CHECK_OK(sc_kernel_info(only, &p));
    CHECK(p.cluster_dims.x == 0 && p.cluster_required);
}

/* Reading a kernel's cluster attributes: an error fails sc_kernel_get (naming the call and
 * the attribute); CUDA_ERROR_INVALID_VALUE is a driver that does not report the attribute. */
static void test_read_attrs(sc_module m)
{
    sc_kernel k = {7};
    /* sci_kernel_get reads 3 attributes, then the 4 cluster ones. */
    REQUIRE(sci_fault_arm("cuFuncGetAttribute", 4, CUDA_ERROR_UNKNOWN));
    CHECK_STATUS(sc_kernel_get(m, "fixed", &k), SC_ERR_DRIVER);
    CHECK(sci_fault_fired());
    CHECK_MSG("sc_kernel_get: cuFuncGetAttribute('fixed', REQUIRED_CLUSTER_WIDTH)");
    CHECK_MSG("CUDA_ERROR_UNKNOWN");
    CHECK(k.id == 0);
    REQUIRE(sci_fault_arm("cuFuncGetAttribute", 7, CUDA_ERROR_UNKNOWN));
    CHECK_STATUS(sc_kernel_get(m, "fixed", &k), SC_ERR_DRIVER);
    CHECK_MSG("cuFuncGetAttribute('fixed', CLUSTER_SIZE_MUST_BE_SET)");
    REQUIRE(sci_fault_arm("cuFuncGetAttribute", 4, CUDA_ERROR_INVALID_VALUE));
    CHECK_OK(sc_kernel_get(m, "fixed", &k));
    sc_kernel_props p;
    CHECK_OK(sc_kernel_info(k, &p));
    CHECK(p.cluster_dims.x == 0); /* the width was not reported: no compiled dims */
    sci_fault_disarm();
}

static void test_cluster_refusals(void)
{
    sc_launch_desc d = {.grid = {4, 2, 1}, .block = {128, 1, 1}, .cluster = {0, 2, 0}};
    REFUSED(plain, &d, SC_ERR_LAUNCH,
            "kernel 'plain': cluster = 0 x 2 x 0: cluster.x is 0 (a cluster needs x >= 1; "
            "0 x 0 x 0 means no cluster)");
    d.cluster = (sc_dim3){0, 0, 3};
    REFUSED(plain, &d, SC_ERR_LAUNCH, "cluster = 0 x 0 x 3: cluster.x is 0");
    d = (sc_launch_desc){.grid = {6, 1, 1}, .block = {128, 1, 1}, .cluster = {4, 1, 1}};
    REFUSED(plain, &d, SC_ERR_LAUNCH,
            "kernel 'plain': grid.x = 6 is not a multiple of cluster.x = 4 (grid 6 x 1 x 1, "
            "cluster 4 x 1 x 1)");
    d = (sc_launch_desc){.grid = {4, 3, 1}, .block = {128, 1, 1}, .cluster = {2, 2, 0}};
    REFUSED(plain, &d, SC_ERR_LAUNCH,
            "grid.y = 3 is not a multiple of cluster.y = 2 (grid 4 x 3 x 1, cluster 2 x 2 x 1)");
    d = (sc_launch_desc){.grid = {4, 4, 5}, .block = {128, 1, 1}, .cluster = {1, 2, 2}};
    REFUSED(plain, &d, SC_ERR_LAUNCH, "grid.z = 5 is not a multiple of cluster.z = 2");
    /* A cluster larger than the grid is not a divisor of it either. */
    d = (sc_launch_desc){.grid = {2, 1, 1}, .block = {128, 1, 1}, .cluster = {4, 1, 1}};
    REFUSED(plain, &d, SC_ERR_LAUNCH, "grid.x = 2 is not a multiple of cluster.x = 4");
    /* Past the portable size without non_portable_cluster: refused before the driver is
     * asked anything (the kernel's attribute is not set). */
    d = (sc_launch_desc){.grid = {32, 4, 1}, .block = {128, 1, 1}, .cluster = {4, 4, 1}};
    REQUIRE(sci_fault_arm("cuFuncSetAttribute", 0, 0));
    CHECK_STATUS(launch(plain, &d), SC_ERR_LAUNCH);
    CHECK(sci_fault_calls() == 0);
    sci_fault_disarm();
    REFUSED(plain, &d, SC_ERR_LAUNCH,
            "kernel 'plain': cluster 4 x 4 x 1 = 16 blocks exceeds the portable cluster size of "
            "8; set non_portable_cluster to allow up to the kernel's non-portable maximum on "
            "this device");
    /* The grid is checked before the cluster's size. */
    d = (sc_launch_desc){.grid = {0, 1, 1}, .block = {128, 1, 1}, .cluster = {16, 1, 1}};
    REFUSED(plain, &d, SC_ERR_LAUNCH, "kernel 'plain': grid.x is 0");
    /* Huge dims: no overflow in the size. */
    d = (sc_launch_desc){.grid = {65536u * 1024u, 65535, 65535}, .block = {128, 1, 1},
                         .cluster = {65536u * 1024u, 65535, 65535}};
    REFUSED(plain, &d, SC_ERR_LAUNCH, "= 288221580125798400 blocks exceeds the portable cluster");

    if (!models_func_attrs) {
        not_modelled("compile-time cluster dims (mismatch, grid divisibility, cluster-only "
                     "kernels) and non-portable cluster sizes");
        return;
    }
    d = (sc_launch_desc){.grid = {8, 1, 1}, .block = {128, 1, 1}, .cluster = {4, 1, 1}};
    REFUSED(fixed, &d, SC_ERR_LAUNCH,
            "kernel 'fixed' was compiled with __cluster_dims__(2, 1, 1) but cluster = 4 x 1 x 1 "
            "was asked (leave cluster 0 x 0 x 0 or give the same dims)");
    d.cluster = (sc_dim3){2, 2, 1};
    REFUSED(fixed, &d, SC_ERR_LAUNCH, "but cluster = 2 x 2 x 1 was asked");
    d = (sc_launch_desc){.grid = {3, 1, 1}, .block = {128, 1, 1}};
    REFUSED(fixed, &d, SC_ERR_LAUNCH,
            "kernel 'fixed': grid.x = 3 is not a multiple of cluster.x = 2 (grid 3 x 1 x 1, "
            "the kernel's compiled cluster 2 x 1 x 1)");
    d = (sc_launch_desc){.grid = {4, 1, 1}, .block = {128, 1, 1}};
    REFUSED(only, &d, SC_ERR_LAUNCH,
            "kernel 'only' runs only in clusters (compiled with __cluster_dims__() without "
            "dims) but cluster is 0 x 0 x 0: give the cluster's dims");
    /* Non-portable: the kernel's maximum (the test device answers 16). */
    d = (sc_launch_desc){.grid = {64, 1, 1}, .block = {128, 1, 1}, .cluster = {32, 1, 1},
                         .non_portable_cluster = true};
    REFUSED(plain, &d, SC_ERR_LAUNCH,
            "kernel 'plain': cluster 32 x 1 x 1 = 32 blocks exceeds the kernel's non-portable "
            "maximum of 16 on device 0 (blocks of 128 x 1 x 1 threads, 0 bytes of dynamic "
            "shared memory)");
    /* The query's failure and a missing entry point. */
    REQUIRE(sci_fault_arm("cuOccupancyMaxPotentialClusterSize", 1, CUDA_ERROR_UNKNOWN));
    CHECK_STATUS(launch(plain, &d), SC_ERR_DRIVER);
    CHECK_MSG("sc_kernel_launch: cuOccupancyMaxPotentialClusterSize('plain')");
    REQUIRE(sci_fault_arm("cuOccupancyMaxPotentialClusterSize", 1, CUDA_ERROR_NOT_INITIALIZED));
    CHECK_STATUS(launch(plain, &d), SC_ERR_NOT_SUPPORTED);
    CHECK_MSG("sc_kernel_launch: kernel 'plain': the driver can't report the largest "
              "non-portable cluster (no cuOccupancyMaxPotentialClusterSize)");
    sci_fault_disarm();
}

static void test_cluster_launches(void)
{
    /* Valid runtime clusters reach cuLaunchKernelEx. */
    sc_launch_desc d = {.grid = {8, 2, 1}, .block = {128, 1, 1}, .cluster = {2, 0, 0}};
    reaches_driver(plain, &d, models_cluster_launch, "cluster 2 x 1 x 1");
    d.cluster = (sc_dim3){8, 1, 1};
    reaches_driver(plain, &d, models_cluster_launch, "cluster 8 x 1 x 1 (portable)");
    d = (sc_launch_desc){.grid = {4, 4, 2}, .block = {64, 2, 1}, .cluster = {2, 2, 2},
                         .programmatic = true};
    reaches_driver(plain, &d, models_cluster_launch, "cluster 2 x 2 x 2, programmatic");
    if (!models_cluster_launch)
        not_modelled("cluster launches accepted (they reach cuLaunchKernelEx, which answers "
                     "CUDA_ERROR_NOT_SUPPORTED)");
    if (!models_func_attrs)
        return;
    /* Compiled dims: a plain cuLaunchKernel, with or without the same dims given. */
    d = (sc_launch_desc){.grid = {8, 1, 1}, .block = {128, 1, 1}};
    REQUIRE(sci_fault_arm("cuLaunchKernel", 0, 0));
    CHECK_OK(launch(fixed, &d));
    d.cluster = (sc_dim3){2, 1, 1};
    CHECK_OK(launch(fixed, &d));
    CHECK(sci_fault_calls() == 2);
    sci_fault_disarm();
    d = (sc_launch_desc){.grid = {8, 1, 1}, .block = {128, 1, 1}, .cluster = {4, 1, 1}};
    reaches_driver(only, &d, models_cluster_launch, "cluster-only kernel, cluster given");
    /* Non-portable 16 (on a kernel not launched so yet): the kernel's attribute is set once,
     * for the first such launch. */
    sc_module m2;
    sc_kernel fresh, fresh2;
    REQUIRE(sc_module_load_image(ctx, cluster_ptx, sizeof cluster_ptx - 1, &m2) == SC_OK);
    REQUIRE(sc_kernel_get(m2, "plain", &fresh) == SC_OK);
    REQUIRE(sc_kernel_get(m2, "plain", &fresh2) == SC_OK);
    d = (sc_launch_desc){.grid = {32, 1, 1}, .block = {128, 1, 1}, .cluster = {16, 1, 1},
                         .non_portable_cluster = true};
    REQUIRE(sci_fault_arm("cuFuncSetAttribute", 0, 0));
    sc_status s1 = launch(fresh, &d), s2 = launch(fresh, &d);
    CHECK(sci_fault_calls() == 1);
    sci_fault_disarm();
    CHECK(s1 == s2 && (s1 == SC_OK || (!models_cluster_launch && s1 == SC_ERR_NOT_SUPPORTED)));
    reaches_driver(fresh, &d, models_cluster_launch, "non-portable cluster 16 x 1 x 1");
    /* A failed set is reported, and tried again by the next launch. */
    REQUIRE(sci_fault_arm("cuFuncSetAttribute", 1, CUDA_ERROR_UNKNOWN));
    CHECK_STATUS(launch(fresh2, &d), SC_ERR_DRIVER);
    CHECK_MSG("sc_kernel_launch: cuFuncSetAttribute('plain', NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)");
    sci_fault_disarm();
    reaches_driver(fresh2, &d, models_cluster_launch, "non-portable after a failed set");
    CHECK_OK(sc_module_destroy(m2));
}

static void test_cooperative(void)
{
    /* The device attribute's query failing is reported. */
    sc_launch_desc d = {.grid = {4, 1, 1}, .block = {256, 1, 1}, .cooperative = true};
    REQUIRE(sci_fault_arm("cuDeviceGetAttribute", 1, CUDA_ERROR_UNKNOWN));
    CHECK_STATUS(launch(plain, &d), SC_ERR_DRIVER);
    CHECK_MSG("sc_kernel_launch: cuDeviceGetAttribute(COOPERATIVE_LAUNCH, device 0)");
    CHECK_MSG("CUDA_ERROR_UNKNOWN");
    sci_fault_disarm();
    /* A cluster's checks come first. */
    d.cluster = (sc_dim3){3, 1, 1};
    REFUSED(plain, &d, SC_ERR_LAUNCH, "grid.x = 4 is not a multiple of cluster.x = 3");
    d.cluster = (sc_dim3){0, 0, 0};
    if (!models_coop) {
        not_modelled("cooperative launches (CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)");
        return;
    }
    /* 256 threads: 8 blocks per SM on the test device, 132 SMs. */
    int per_sm = 0;
    CHECK_OK(sc_kernel_occupancy(plain, 256, 0, &per_sm));
    const uint32_t max = (uint32_t)per_sm * 132u;
    d.grid.x = max + 1;
    char want[200];
    snprintf(want, sizeof want,
             "kernel 'plain': a cooperative grid of %u x 1 x 1 = %u blocks exceeds the %u that "
             "can be resident at once (%d per SM for blocks of 256 threads and 0 bytes of "
             "dynamic shared memory, x 132 SMs)",
             max + 1, max + 1, max, per_sm);
    REFUSED(plain, &d, SC_ERR_LAUNCH, want);
    d.grid = (sc_dim3){max / 4 + 1, 2, 2}; /* 3-D grids count every block */
    REFUSED(plain, &d, SC_ERR_LAUNCH, "a cooperative grid of ");
    d.grid = (sc_dim3){max, 1, 1};
    reaches_driver(plain, &d, true, "cooperative, largest grid");
    d.grid = (sc_dim3){1, 1, 1};
    reaches_driver(plain, &d, true, "cooperative, 1 block");
    /* Dynamic shared memory counts: fewer 40 KiB blocks fit a SM. */
    d = (sc_launch_desc){.grid = {max, 1, 1}, .block = {256, 1, 1}, .shared_bytes = 40 << 10,
                         .cooperative = true};
    CHECK_OK(sc_kernel_occupancy(plain, 256, 40 << 10, &per_sm));
    snprintf(want, sizeof want, "exceeds the %u that can be resident at once (%d per SM",
             (unsigned)per_sm * 132u, per_sm);
    REFUSED(plain, &d, SC_ERR_LAUNCH, want);
    /* The occupancy query's failure. */
    d = (sc_launch_desc){.grid = {4, 1, 1}, .block = {256, 1, 1}, .cooperative = true};
    REQUIRE(sci_fault_arm("cuOccupancyMaxActiveBlocksPerMultiprocessor", 1, CUDA_ERROR_UNKNOWN));
    CHECK_STATUS(launch(plain, &d), SC_ERR_DRIVER);
    CHECK_MSG("sc_kernel_launch: cuOccupancyMaxActiveBlocksPerMultiprocessor('plain')");
    sci_fault_disarm();
    if (!models_cluster_launch) {
        not_modelled("cooperative launches in clusters (cuOccupancyMaxActiveClusters)");
        return;
    }
    /* In clusters: also bounded by the resident clusters. */
    int clusters = 0;
    const sc_launch_desc q = {.block = {256, 1, 1}, .cluster = {2, 1, 1}};
    CHECK_OK(sc_kernel_occupancy_clusters(plain, &q, &clusters));
    const uint32_t by_cluster = (uint32_t)clusters * 2u;
    if (by_cluster < max) {
        d = (sc_launch_desc){.grid = {by_cluster + 2, 1, 1}, .block = {256, 1, 1},
                             .cluster = {2, 1, 1}, .cooperative = true};
        snprintf(want, sizeof want,
                 "exceeds the %u that can be resident at once in clusters of 2 x 1 x 1 (%d "
                 "clusters fit)",
                 by_cluster, clusters);
        REFUSED(plain, &d, SC_ERR_LAUNCH, want);
    }
    d = (sc_launch_desc){.grid = {(by_cluster < max ? by_cluster : max) & ~1u, 1, 1},
                         .block = {256, 1, 1}, .cluster = {2, 1, 1}, .cooperative = true};
    reaches_driver(plain, &d, true, "cooperative in clusters, largest grid");
}

static void test_occupancy_clusters(void)
{
    int n = -1;
    const sc_launch_desc two = {.block = {128, 1, 1}, .cluster = {2, 1, 1}};
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, &two, NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_kernel_occupancy_clusters: ");
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, NULL, &n), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_kernel_occupancy_clusters: ");
    CHECK_MSG("desc");
    CHECK(n == 0);
    n = -1;
    CHECK_STATUS(sc_kernel_occupancy_clusters((sc_kernel){0}, &two, &n), SC_ERR_STALE_HANDLE);
    CHECK_MSG("sc_kernel_occupancy_clusters: ");
    CHECK(n == 0);
    CHECK_STATUS(sc_kernel_occupancy_clusters((sc_kernel){buf.id}, &two, &n), SC_ERR_WRONG_KIND);
    const sc_launch_desc none = {.block = {128, 1, 1}};
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, &none, &n), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'plain': desc->cluster is 0 x 0 x 0 and the "
              "kernel has no compiled cluster dims: there is no cluster to ask about");
    /* Checked as a launch is (the grid is not asked about: 0 here). */
    const sc_launch_desc big_block = {.block = {2048, 1, 1}, .cluster = {2, 1, 1}};
    n = -1;
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, &big_block, &n), SC_ERR_LAUNCH);
    CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'plain': block.x = 2048 exceeds the device's 1024");
    CHECK(n == 0);
    const sc_launch_desc too_much_shared = {.block = {128, 1, 1}, .shared_bytes = 1 << 20,
                                            .cluster = {2, 1, 1}};
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, &too_much_shared, &n), SC_ERR_LAUNCH);
    CHECK_MSG("bytes of dynamic shared memory asked");
    const sc_launch_desc x0 = {.block = {128, 1, 1}, .cluster = {0, 2, 1}};
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, &x0, &n), SC_ERR_LAUNCH);
    CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'plain': cluster = 0 x 2 x 1: cluster.x is 0");
    const sc_launch_desc sixteen = {.block = {128, 1, 1}, .cluster = {16, 1, 1}};
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, &sixteen, &n), SC_ERR_LAUNCH);
    CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'plain': cluster 16 x 1 x 1 = 16 blocks "
              "exceeds the portable cluster size of 8");
    CHECK(n == 0);
    /* The query itself: its failure, a missing entry point. */
    REQUIRE(sci_fault_arm("cuOccupancyMaxActiveClusters", 1, CUDA_ERROR_UNKNOWN));
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, &two, &n), SC_ERR_DRIVER);
    CHECK_MSG("sc_kernel_occupancy_clusters: cuOccupancyMaxActiveClusters('plain', cluster 2 x 1 "
              "x 1)");
    CHECK(n == 0);
    REQUIRE(sci_fault_arm("cuOccupancyMaxActiveClusters", 1, CUDA_ERROR_NOT_INITIALIZED));
    CHECK_STATUS(sc_kernel_occupancy_clusters(plain, &two, &n), SC_ERR_NOT_SUPPORTED);
    CHECK_MSG("sc_kernel_occupancy_clusters: kernel 'plain': the driver can't count resident "
              "clusters (no cuOccupancyMaxActiveClusters)");
    sci_fault_disarm();
    if (!models_cluster_launch) {
        not_modelled("cuOccupancyMaxActiveClusters answers");
        return;
    }
    n = -1;
    CHECK_OK(sc_kernel_occupancy_clusters(plain, &two, &n));
    CHECK(n >= 1);
    if (models_func_attrs) {
        int f = -1;
        CHECK_OK(sc_kernel_occupancy_clusters(fixed, &none, &f));
        CHECK(f == n);
        const sc_launch_desc np = {.block = {128, 1, 1}, .cluster = {16, 1, 1},
                                   .non_portable_cluster = true};
        CHECK_OK(sc_kernel_occupancy_clusters(plain, &np, &f));
        CHECK(f >= 1 && f <= n);
    }
}

int main(void)
{
    fake_attach();
    sc_set_log_callback(NULL, NULL);
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_module m;
    REQUIRE(sc_module_load_image(ctx, cluster_ptx, sizeof cluster_ptx - 1, &m) == SC_OK);
    REQUIRE(sc_kernel_get(m, "plain", &plain) == SC_OK);
    REQUIRE(sc_kernel_get(m, "fixed", &fixed) == SC_OK);
    REQUIRE(sc_kernel_get(m, "only", &only) == SC_OK);
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 1024, .label = "buf"},
                             &buf) == SC_OK);

    /* What the test device models (it answers these queries without counting misuse). */
    int v = 0;
    models_cluster_launch = sci_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 0) ==
                                CUDA_SUCCESS && v == 1;
    models_coop = sci_cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 0) ==
                      CUDA_SUCCESS && v == 1;
    sci_kernel *k = NULL;
    REQUIRE(sci_kernel_acquire(fixed, "test", &k) == SC_OK);
    int w = 0, np = 0;
    models_func_attrs =
        sci_cuFuncGetAttribute(&w, CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, k->fn) == CUDA_SUCCESS &&
        w == 2 &&
        sci_cuFuncGetAttribute(&np, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, k->fn) ==
            CUDA_SUCCESS;
    sci_kernel_release(k);
    printf("the test device models: function cluster attributes %s, cluster launches %s, "
           "cooperative launches %s\n",
           models_func_attrs ? "yes" : "no", models_cluster_launch ? "yes" : "no",
           models_coop ? "yes" : "no");

    TEST_RUN(test_plan);
    TEST_RUN(test_kernel_info);
    TEST_RUN(test_cluster_refusals);
    TEST_RUN(test_cluster_launches);
    TEST_RUN(test_cooperative);
    TEST_RUN(test_occupancy_clusters);
    test_read_attrs(m);

    /* Nothing was lost, nothing misused. */
    CHECK_OK(sc_context_check(ctx));
    CHECK(fake.misuse_count() == 0);
    if (fake.misuse_count())
        fprintf(stderr, "misuse: %s\n", fake.last_misuse());
    CHECK_OK(sc_buffer_destroy(buf));
    CHECK_OK(sc_module_destroy(m));
    CHECK_OK(sc_context_destroy(ctx));
    return test_result("test_td_launch_attr");
}
