/* The allocator under injected out-of-memory errors (test device, 64 MiB device).
 *
 * On CUDA_ERROR_OUT_OF_MEMORY from cuMemAllocFromPoolAsync, sc_buffer_create gives the
 * pool's cached memory back to the device (synchronize, trim) and tries once more:
 *   - nth = 1 on an idle device: the first attempt fails, the retry succeeds: SC_OK;
 *   - nth = 2 after a real out-of-memory first attempt (the pool caches freed memory):
 *     the retry fails too: SC_ERR_OUT_OF_MEMORY, and the accounting is unchanged.
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include "../test.h"
#include "core/registry.h"
#include "driver/driver.h"
#include "td_control.h"

#define MiB (1ull << 20)

static sc_memory_stats memory(sc_context c)
{
    sc_memory_stats m;
    memset(&m, 0, sizeof m);
    CHECK_OK(sc_context_memory(c, &m));
    return m;
}

/* Fill the pool's cache: allocate and free `bytes` (the pool keeps it until trimmed). */
static void cache(sc_context ctx, uint64_t bytes)
{
    sc_buffer b;
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = bytes,
                                                     .label = "cached"},
                              &b));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK(memory(ctx).pool_reserved >= bytes);
}

int main(void)
{
    fake_attach();
    fake_counts start = fake_counts_now();
    uint64_t total = 0, free_b = 0;
    REQUIRE(sc_device_memory(0, &free_b, &total) == SC_OK);
    REQUIRE(total == 64 * MiB); /* SAFECUDA_TESTDEVICE_MEMORY_MB=64 */
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    sc_buffer keep;
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 1024,
                                                     .label = "keep"},
                              &keep));
    const sc_memory_stats m0 = memory(ctx);
    CHECK(m0.bytes_in_use == 4096 && m0.live_buffers == 1);

    /* 1. A real out-of-memory first attempt: cached memory is trimmed, the retry works. */
    cache(ctx, 40 * MiB);
    sc_buffer big;
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 48 * MiB,
                                                     .label = "big"},
                              &big));
    CHECK(memory(ctx).bytes_in_use == m0.bytes_in_use + 48 * MiB);
    CHECK_OK(sc_buffer_destroy(big));
    CHECK_OK(sc_context_trim(ctx));

    /* 2. nth = 1: the injected error is retried away. */
    cache(ctx, 1 * MiB);
    REQUIRE(sci_fault_arm("cuMemAllocFromPoolAsync", 1, CUDA_ERROR_OUT_OF_MEMORY));
    sc_buffer b;
    sc_clear_error();
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_F32, .count = 256,
                                                     .label = "retried"},
                              &b));
    CHECK(sci_fault_fired());
    CHECK(sci_fault_calls() == 2); /* the failed attempt and the retry */
    sci_fault_disarm();
    CHECK(fake.pool_cached_bytes() == 0); /* the retry trimmed the pool first */
    sc_memory_stats m = memory(ctx);
    CHECK(m.bytes_in_use == m0.bytes_in_use + 1024 && m.live_buffers == 2);
    float data[256], back[256];
    for (int i = 0; i < 256; i++)
        data[i] = (float)i;
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), data, sizeof data));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, back, sizeof back, sc_view_of(b)));
    CHECK(memcmp(data, back, sizeof data) == 0);
    CHECK_OK(sc_buffer_destroy(b));

    /* 3. nth = 2 after a real first failure: the retry fails too. */
    cache(ctx, 40 * MiB);
    m = memory(ctx);
    const uint64_t peak = m.peak_bytes;
    const long device_allocs = fake.live_device_allocations();
    REQUIRE(sci_fault_arm("cuMemAllocFromPoolAsync", 2, CUDA_ERROR_OUT_OF_MEMORY));
    sc_buffer fail = {99};
    sc_clear_error();
    CHECK_STATUS(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 48 * MiB,
                                                         .label = "refused"},
                                  &fail),
                 SC_ERR_OUT_OF_MEMORY);
    CHECK(sci_fault_fired() && sci_fault_calls() == 2);
    sci_fault_disarm();
    CHECK(fail.id == 0);
    CHECK_MSG("sc_buffer_create: ");
    CHECK_MSG("'refused'");
    CHECK_MSG("CUDA_ERROR_OUT_OF_MEMORY");
    m = memory(ctx);
    CHECK(m.bytes_in_use == m0.bytes_in_use);
    CHECK(m.live_buffers == m0.live_buffers);
    CHECK(m.peak_bytes == peak); /* the failed request's bytes never count as a peak */
    CHECK(fake.live_device_allocations() == device_allocs);
    CHECK_OK(sc_context_check(ctx)); /* out of memory is not sticky */
    /* ... and the context still works: the same request now succeeds. */
    CHECK_OK(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = SC_U8, .count = 48 * MiB}, &b));
    CHECK_OK(sc_buffer_destroy(b));

    /* 4. Named arming counts only its entry point; unknown names are refused. */
    REQUIRE(sci_fault_arm("cuMemPoolTrimTo", 0, 0));
    CHECK_OK(sc_context_trim(ctx));
    CHECK(sci_fault_calls() == 1);
    sci_fault_disarm();
    CHECK(!sci_fault_arm("cuNoSuchEntryPoint", 1, 1));

    CHECK_OK(sc_buffer_destroy(keep));
    CHECK_OK(sc_context_destroy(ctx));
    char diff[256];
    if (fake_counts_diff(start, fake_counts_now(), diff, sizeof diff)) {
        fprintf(stderr, "the test device still holds: %s\n", diff);
        test_failures++;
    }
    for (int k = SCI_KIND_CONTEXT; k < SCI_KIND_TEST_A; k++)
        CHECK(sci_registry_live_count((sci_kind)k) == 0);
    CHECK(fake.misuse_count() == 0);
    return test_result("test_fault_alloc");
}
