/* What NVRTC builds, as the library says it (sc_compiler_archs), and the one rule for the
 * architecture-specific form: sm_XYa exists for sm_90 and newer (SC_ARCH_SPECIFIC_MIN),
 * refused before NVRTC for anything older (so with or without NVRTC). */
#include "../test.h"

int main(void)
{
    /* The form's rule needs no NVRTC: refused before it is loaded. */
    static const char *const src = "extern \"C\" __global__ void k(float *x) { x[0] = 1; }";
    sc_program p = {7};
    CHECK_FAIL(sc_program_create((sc_context){0},
                                 &(sc_program_desc){.source = src, .arch = 80,
                                                    .arch_specific = true},
                                 &p),
               SC_ERR_INVALID_ARGUMENT, "sc_program_create");
    CHECK_MSG("desc->arch_specific: sm_80 has no architecture-specific form (sm_XYa exists "
              "for sm_90 and newer)");
    CHECK(p.id == 0);
    CHECK(SC_ARCH_SPECIFIC_MIN == 90);

    size_t n = 99;
    CHECK_FAIL(sc_compiler_archs(NULL, 0, NULL), SC_ERR_INVALID_ARGUMENT, "sc_compiler_archs");
    CHECK_FAIL(sc_compiler_archs(NULL, 4, &n), SC_ERR_INVALID_ARGUMENT, "sc_compiler_archs");
    CHECK_MSG("archs is NULL but capacity is 4");
    CHECK(n == 0);

    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        CHECK_FAIL(sc_compiler_archs(NULL, 0, &n), SC_ERR_NO_COMPILER, "sc_compiler_archs");
        CHECK(n == 0);
        printf("skipped the checks with NVRTC: %s\n", sc_last_error());
        return test_result("test_compiler_archs");
    }
    /* The count alone, then the list: ascending, real architectures, the same count. */
    CHECK_OK(sc_compiler_archs(NULL, 0, &n));
    CHECK(n > 0 && n <= 64);
    int archs[64] = {0};
    size_t again = 0;
    CHECK_OK(sc_compiler_archs(archs, 64, &again));
    CHECK(again == n);
    for (size_t i = 0; i < n; i++) {
        CHECK(archs[i] >= 50 && archs[i] <= 200);
        if (i)
            CHECK(archs[i] > archs[i - 1]);
    }
    /* A short array gets the first ones, and the full count. */
    int two[2] = {0, 0};
    CHECK_OK(sc_compiler_archs(two, 2, &again));
    CHECK(again == n && two[0] == archs[0] && (n < 2 || two[1] == archs[1]));
    /* NVRTC 12 and 13 build sm_90 (the MoE kernels' target). */
    bool has90 = false;
    for (size_t i = 0; i < n; i++)
        has90 |= archs[i] == 90;
    CHECK(has90);
    /* NVRTC there or not, the oldest architecture it builds has no a form either (before
     * this rule, sm_75a reached NVRTC, which answered "catastrophic error"). */
    if (archs[0] < SC_ARCH_SPECIFIC_MIN) {
        CHECK_FAIL(sc_program_create((sc_context){0},
                                     &(sc_program_desc){.source = src, .arch = archs[0],
                                                        .arch_specific = true},
                                     &p),
                   SC_ERR_INVALID_ARGUMENT, "sc_program_create");
        CHECK_MSG("has no architecture-specific form");
    }
    return test_result("test_compiler_archs");
}
