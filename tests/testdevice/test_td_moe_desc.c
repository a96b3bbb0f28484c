/* sc_moe_create's checks of the MoE layer's fields on the test device
 * (tests/moe_desc_checks.h, shared with tests/gpu/test_gpu_moe_v2.c): every refusal comes
 * before a kernel is loaded, so it needs no GPU. The valid descs are not created here
 * (the test device loads no real kernel image); the GPU test creates them.
 *
 * FAKE DRIVER FOR HOST TESTS OF BOOKKEEPING ONLY: nothing here says anything about a GPU. */
#include "../moe_desc_checks.h"
#include "../test.h"

int main(void)
{
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    moe_desc_checks(ctx, false);
    size_t live = 0;
    CHECK_OK(sc_context_live_objects(ctx, NULL, 0, &live));
    CHECK(live == 0);
    CHECK_OK(sc_context_destroy(ctx));
    return test_result("test_td_moe_desc");
}
