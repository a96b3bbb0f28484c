/* safecuda compile --arch and safecuda precompile --arch: one parser and one rule, one
 * message for every refusal (exit 64): what was asked, why not, the targets NVRTC builds
 * (sc_compiler_archs) and that sm_XYa exists for sm_90 and newer.
 *
 * Without NVRTC (forced: SAFECUDA_NVRTC names no file): spellings that are not targets,
 * family-specific targets, the a form before sm_90 and targets older than sm_50, for both
 * commands; PTX targets for precompile. With NVRTC (skipped with the reason where it can't
 * be loaded): targets older than NVRTC's oldest, sm_80a (no NVRTC "catastrophic error"), a
 * cubin for an architecture NVRTC does not build (an error naming the newest below it;
 * --ptx or compute_XY opts in to its PTX), the accepted spellings and what they build. */
#include "cli_test.h"

#define NO_NVRTC ENV "SAFECUDA_NVRTC=/nonexistent/libnvrtc.so "

/* Run cmd; require exit 64 and every needle (up to 3) in the output. */
static void refused(const char *cmd, const char *a, const char *b, const char *c)
{
    int rc = run(cmd);
    const char *needles[] = {a, b, c};
    bool ok = rc == 64;
    for (int i = 0; i < 3; i++)
        ok = ok && (!needles[i] || strstr(out, needles[i]));
    if (!ok) {
        fprintf(stderr, "%s: exit %d (want 64), output:\n%s\nwanted: %s | %s | %s\n", cmd, rc,
                out, a, b ? b : "", c ? c : "");
        test_failures++;
    }
}

static void refusedf(const char *a, const char *b, const char *c, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refusedf(const char *a, const char *b, const char *c, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    refused(cmd, a, b, c);
}

#define NO_RANGE "NVRTC can't be loaded to list the targets it builds ("
#define A_FORM "sm_XYa and compute_XYa (architecture-specific) exist for sm_90 and newer"

/* ---- without NVRTC ------------------------------------------------------------------------ */

static void test_spellings_without_nvrtc(void)
{
    static const char *const not_targets[] = {"sm_9x", "sm_", "90b", "sm_90aa", "compute_",
                                               "sm_9", "sm_1000", "gfx90a", "sm_90f0", "9"};
    char want[256];
    for (size_t i = 0; i < sizeof not_targets / sizeof *not_targets; i++) {
        snprintf(want, sizeof want,
                 "safecuda compile: --arch '%s': not a target: write sm_XY, sm_XYa, "
                 "compute_XY, compute_XYa, XY or native (e.g. sm_90, sm_90a, compute_90). ",
                 not_targets[i]);
        refusedf(want, NO_RANGE, A_FORM, NO_NVRTC "'%s' compile /nonexistent/k.cu --arch %s 2>&1",
                 SAFECUDA_CLI, not_targets[i]);
        snprintf(want, sizeof want,
                 "safecuda precompile: --arch '%s': not a target: write sm_XY, sm_XYa, XY or "
                 "native, the device's architecture (e.g. sm_90a, sm_90, sm_80). ",
                 not_targets[i]);
        refusedf(want, NO_RANGE, A_FORM, NO_NVRTC "'%s' precompile --arch %s 2>&1", SAFECUDA_CLI,
                 not_targets[i]);
    }
    /* The option's name as given. */
    refusedf("safecuda compile: -arch 'sm_9x': not a target", NULL, NULL,
             NO_NVRTC "'%s' compile /nonexistent/k.cu -arch=sm_9x 2>&1", SAFECUDA_CLI);
    refusedf("safecuda compile: --gpu-architecture 'x': not a target", NULL, NULL,
             NO_NVRTC "'%s' compile /nonexistent/k.cu --gpu-architecture x 2>&1", SAFECUDA_CLI);

    /* Family-specific targets. */
    refusedf("safecuda compile: --arch 'sm_100f': family-specific targets (sm_XYf) are not "
             "supported: write sm_100a (sm_100 only) or sm_100. ",
             NO_RANGE, A_FORM, NO_NVRTC "'%s' compile /nonexistent/k.cu --arch sm_100f 2>&1",
             SAFECUDA_CLI);
    refusedf("safecuda precompile: --arch 'compute_120f': family-specific targets (sm_XYf) are "
             "not supported: write sm_120a (sm_120 only) or sm_120. ",
             NULL, NULL, NO_NVRTC "'%s' precompile --arch compute_120f 2>&1", SAFECUDA_CLI);

    /* The a form before sm_90: the same rule for both commands, every spelling. */
    static const char *const a_forms[] = {"sm_80a", "compute_80a", "80a", "sm_75a", "sm_89a"};
    for (size_t i = 0; i < sizeof a_forms / sizeof *a_forms; i++) {
        char num[8];
        const char *digits = strpbrk(a_forms[i], "0123456789");
        snprintf(num, sizeof num, "%.2s", digits);
        snprintf(want, sizeof want, "--arch '%s': sm_%s has no architecture-specific form. ",
                 a_forms[i], num);
        refusedf(want, NO_RANGE, A_FORM, NO_NVRTC "'%s' compile /nonexistent/k.cu --arch %s 2>&1",
                 SAFECUDA_CLI, a_forms[i]);
        if (strncmp(a_forms[i], "compute_", 8) != 0)
            refusedf(want, NO_RANGE, A_FORM, NO_NVRTC "'%s' precompile --arch %s 2>&1",
                     SAFECUDA_CLI, a_forms[i]);
    }
    /* Older than any NVRTC builds. */
    static const char *const old[] = {"sm_35", "sm_30", "45", "compute_37", "sm_10"};
    for (size_t i = 0; i < sizeof old / sizeof *old; i++) {
        refusedf("': older than sm_50, the oldest architecture any NVRTC builds. ", NO_RANGE,
                 A_FORM, NO_NVRTC "'%s' compile /nonexistent/k.cu --arch %s 2>&1", SAFECUDA_CLI,
                 old[i]);
        if (strncmp(old[i], "compute_", 8) != 0)
            refusedf("': older than sm_50, the oldest architecture any NVRTC builds. ", NO_RANGE,
                     A_FORM, NO_NVRTC "'%s' precompile --arch %s 2>&1", SAFECUDA_CLI, old[i]);
    }
    /* precompile: the device's architecture, so no PTX targets. */
    refusedf("safecuda precompile: --arch 'compute_90': the library loads cubins on a device, "
             "so PTX targets (compute_XY) are not offered: write sm_90. ",
             NO_RANGE, A_FORM, NO_NVRTC "'%s' precompile --arch compute_90 2>&1", SAFECUDA_CLI);
    /* A target that is fine reaches NVRTC's absence (exit 2), not a refusal. */
    CHECK_RC(runf(NO_NVRTC "'%s' precompile --arch sm_90a --cache-dir '%s/kc' 2>&1",
                  SAFECUDA_CLI, dir),
             2);
    CHECK_RC(runf(NO_NVRTC "'%s' compile /nonexistent/k.cu --arch sm_101 2>&1", SAFECUDA_CLI), 1);
    CHECK_OUT("cannot read");
}

/* ---- with NVRTC ------------------------------------------------------------------------- */

static int archs[64];
static size_t n_archs;
static char range[1024]; /* "NVRTC 13.0 builds sm_75 to sm_121 (75, 80, ...)" */

static void test_arch_spellings(void)
{
    write_file("k.cu", "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] = 1.0f; }\n");
    static const struct {
        const char *args, *says;
    } ok[] = {
        {"--arch sm_90a", "cubin for sm_90a, "},
        {"--arch=sm_90a", "cubin for sm_90a, "},
        {"-arch sm_90a", "cubin for sm_90a, "},
        {"-arch=sm_90a", "cubin for sm_90a, "},
        {"--gpu-architecture sm_90a", "cubin for sm_90a, "},
        {"--gpu-architecture=sm_90a", "cubin for sm_90a, "},
        {"--arch 90a", "cubin for sm_90a, "},
        {"--arch sm_90", "cubin for sm_90, "},
        {"--arch 90", "cubin for sm_90, "},
        {"--arch sm_80", "cubin for sm_80, "},
        {"--arch compute_90", "PTX for compute_90, "},
        {"--arch compute_90a", "PTX for compute_90a, "},
        {"--arch sm_90 --ptx", "PTX for compute_90, "},
        {"--arch sm_90a -ptx", "PTX for compute_90a, "},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int rc = runf(ENV "'%s' compile '%s/k.cu' %s 2>&1", SAFECUDA_CLI, dir, ok[i].args);
        if (rc != 0 || !strstr(out, ok[i].says)) {
            fprintf(stderr, "compile k.cu %s: exit %d (want 0), output:\n%s\nwanted: %s\n",
                    ok[i].args, rc, out, ok[i].says);
            test_failures++;
        }
    }

    /* compute_90 writes PTX (text), not an sm_90 cubin; sm_90 writes a cubin (ELF). */
    char head[4096];
    CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch compute_90 -o '%s/k.ptx' 2>&1",
                  SAFECUDA_CLI, dir, dir),
             0);
    CHECK_OUT("wrote ");
    read_head("k.ptx", head, sizeof head);
    CHECK(strncmp(head, "//", 2) == 0 || strncmp(head, ".version", 8) == 0);
    CHECK(strstr(head, ".target sm_90") != NULL && strstr(head, ".target sm_90a") == NULL);
    CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch compute_90a -o '%s/k.ptx' 2>&1",
                  SAFECUDA_CLI, dir, dir),
             0);
    read_head("k.ptx", head, sizeof head);
    CHECK(strstr(head, ".target sm_90a") != NULL);
    /* The size said is the size written (PTX as text: no NUL), for PTX and cubins. */
    static const char *const sized[] = {"--arch sm_90 --ptx", "--arch compute_80", "--arch sm_90"};
    for (size_t i = 0; i < sizeof sized / sizeof sized[0]; i++) {
        CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' %s -o '%s/sized.out' 2>&1", SAFECUDA_CLI, dir,
                      sized[i], dir),
                 0);
        const char *comma = strstr(out, ", ");
        unsigned long long said = comma ? strtoull(comma + 2, NULL, 10) : 0;
        char path[300];
        snprintf(path, sizeof path, "%s/sized.out", dir);
        struct stat st;
        REQUIRE(stat(path, &st) == 0);
        if (said != (unsigned long long)st.st_size) {
            fprintf(stderr, "compile %s -o: said %llu bytes, wrote %lld:\n%s\n", sized[i], said,
                    (long long)st.st_size, out);
            test_failures++;
        }
    }
    CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch sm_90 -o '%s/k.cubin' 2>&1",
                  SAFECUDA_CLI, dir, dir),
             0);
    read_head("k.cubin", head, sizeof head);
    CHECK(memcmp(head, "\x7f" "ELF", 4) == 0);
    char wrote[300];
    snprintf(wrote, sizeof wrote, "wrote %s/k.cubin", dir);
    CHECK_OUT(wrote);
}


/* Refusals that depend on what NVRTC builds. */
static void test_refusals_with_nvrtc(void)
{
    write_file("k.cu", "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] = 1.0f; }\n");
    const int oldest = archs[0], newest = archs[n_archs - 1];
    char want[512];
    /* Older than NVRTC's oldest (sm_50 with NVRTC 13: what used to reach NVRTC). */
    static const int old[] = {35, 50, 52, 60};
    for (size_t i = 0; i < sizeof old / sizeof *old; i++) {
        if (old[i] >= oldest)
            continue;
        snprintf(want, sizeof want, "--arch 'sm_%d': older than sm_%d, the oldest architecture "
                 "NVRTC builds. ", old[i], oldest);
        refusedf(want, range, A_FORM, ENV "'%s' compile '%s/k.cu' --arch sm_%d 2>&1",
                 SAFECUDA_CLI, dir, old[i]);
        refusedf(want, range, A_FORM, ENV "'%s' precompile --arch sm_%d 2>&1", SAFECUDA_CLI,
                 old[i]);
    }
    /* sm_80a never reaches NVRTC (it answered "catastrophic error"). */
    refusedf("safecuda compile: --arch 'sm_80a': sm_80 has no architecture-specific form. ",
             range, A_FORM, ENV "'%s' compile '%s/k.cu' --arch sm_80a 2>&1", SAFECUDA_CLI, dir);
    CHECK_NOT_OUT("catastrophic");

    /* A cubin for an architecture NVRTC does not build: newer than its newest, and one in a
     * gap of its list (sm_101 with NVRTC 13, which has sm_100 and sm_103). */
    int gap = 0;
    for (size_t i = 0; i + 1 < n_archs && !gap; i++)
        if (archs[i] < 101 && archs[i + 1] > 101)
            gap = 101;
    for (size_t i = 0; i + 1 < n_archs && !gap; i++)
        if (archs[i + 1] > archs[i] + 1)
            gap = archs[i] + 1;
    const int unbuilt[] = {newest + 8 <= 999 ? newest + 8 : 999, gap};
    for (size_t i = 0; i < 2; i++) {
        int u = unbuilt[i];
        if (!u)
            continue;
        int below = 0;
        for (size_t j = 0; j < n_archs; j++)
            if (archs[j] < u)
                below = archs[j];
        snprintf(want, sizeof want,
                 "safecuda compile: --arch 'sm_%d': NVRTC builds no cubin for sm_%d; the newest "
                 "architecture it builds below it is sm_%d: --ptx (or compute_%d) writes PTX for "
                 "compute_%d, which the driver compiles for sm_%d when it loads it. ",
                 u, u, below, u, below, u);
        refusedf(want, range, A_FORM, ENV "'%s' compile '%s/k.cu' --arch sm_%d -o '%s/u.cubin' 2>&1",
                 SAFECUDA_CLI, dir, u, dir);
        CHECK(!exists("u.cubin"));
        /* The a form needs NVRTC to know the architecture: no PTX way out. */
        if (u >= 90) {
            snprintf(want, sizeof want,
                     "--arch 'sm_%da': architecture-specific code needs an NVRTC that builds "
                     "sm_%d (PTX for an older architecture would not have its features). ",
                     u, u);
            refusedf(want, range, A_FORM, ENV "'%s' compile '%s/k.cu' --arch sm_%da 2>&1",
                     SAFECUDA_CLI, dir, u);
        }
        /* The opt-in to PTX: --ptx or compute_XY, said in a note. */
        char built[64], note[256];
        snprintf(built, sizeof built, "PTX for compute_%d, ", below);
        snprintf(note, sizeof note,
                 "note: NVRTC builds no sm_%d: PTX for compute_%d, which the driver compiles "
                 "for sm_%d when it loads it", u, below, u);
        CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch sm_%d --ptx -o '%s/u.ptx' 2>&1",
                      SAFECUDA_CLI, dir, u, dir),
                 0);
        CHECK_OUT(built);
        CHECK_OUT(note);
        CHECK(exists("u.ptx"));
        CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch compute_%d 2>&1", SAFECUDA_CLI, dir, u),
                 0);
        CHECK_OUT(built);
        CHECK_OUT(note);
    }
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    signal(SIGPIPE, SIG_IGN);
    test_spellings_without_nvrtc();

    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK ||
        sc_compiler_archs(archs, 64, &n_archs) != SC_OK || n_archs == 0 || n_archs > 64) {
        printf("skipped the checks that compile: %s\n", sc_last_error());
    } else {
        int len = snprintf(range, sizeof range, "NVRTC %d.%d builds sm_%d to sm_%d (", major,
                           minor, archs[0], archs[n_archs - 1]);
        for (size_t i = 0; i < n_archs; i++)
            len += snprintf(range + len, sizeof range - (size_t)len, "%s%d", i ? ", " : "",
                            archs[i]);
        snprintf(range + len, sizeof range - (size_t)len, ")");
        test_refusals_with_nvrtc();
        test_arch_spellings();
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", dir);
    return test_result("test_cli_arch");
}
