/* The FP8 quantization kernels (kernels/quant/fp8_quant.cu) compiled without a GPU, as the
 * library compiles them: cubin for sm_90a (H100) and sm_100, with every kernel
 * include/safecuda/quant.h's calls launch and no register spills; PTX for sm_90a and sm_89,
 * which must use the hardware e4m3 conversions, the correctly rounded multiply and divide
 * and 16-byte loads; for sm_80 it compiles too (the conversions are then a trap: the
 * library refuses such devices before any launch). test_compile_host compiles every
 * built-in file for sm_80 and sm_90 besides. Exits 77 (skipped) when NVRTC can't be
 * loaded. */
#include "../test.h"
#include "launch/builtin.h"
#include "quant/quant.h"

/* The text (PTX, or the kernel names of a cubin) holds s. */
static bool has(const void *img, uint64_t bytes, const char *s)
{
    const size_t n = strlen(s);
    for (uint64_t i = 0; i + n <= bytes; i++)
        if (memcmp((const char *)img + i, s, n) == 0)
            return true;
    return false;
}

/* Compile the file for arch (sm_XYa with arch_specific), as cubin or PTX. */
static bool compile(int arch, bool arch_specific, bool ptx, sc_program *p, const void **img,
                    uint64_t *bytes, char *log, size_t log_size)
{
    static const char *const verbose[] = {"--ptxas-options=-v", NULL};
    /* the built-in headers (.cuh) it may include, as the library gives them */
    sc_program_header headers[32];
    size_t n_headers = 0;
    for (size_t i = 0; i < sci_builtin_count && n_headers < 32; i++) {
        const size_t len = strlen(sci_builtin_sources[i].name);
        if (len > 4 && strcmp(sci_builtin_sources[i].name + len - 4, ".cuh") == 0)
            headers[n_headers++] = (sc_program_header){sci_builtin_sources[i].name,
                                                       sci_builtin_sources[i].source};
    }
    const sc_program_desc d = {.source = sci_builtin_find(SCI_QUANT_FILE),
                               .name = SCI_QUANT_FILE,
                               .headers = headers,
                               .n_headers = n_headers,
                               .options = ptx ? NULL : verbose,
                               .arch = arch,
                               .arch_specific = arch_specific,
                               .ptx = ptx,
                               .no_cache = true};
    sc_status s = sc_program_create((sc_context){0}, &d, p);
    if (s != SC_OK) {
        fprintf(stderr, "%s for sm_%d%s (%s): %s: %s\n", SCI_QUANT_FILE, arch,
                arch_specific ? "a" : "", ptx ? "PTX" : "cubin", sc_status_name(s),
                sc_last_error());
        test_failures++;
        return false;
    }
    CHECK_OK(sc_program_image(*p, img, bytes));
    size_t needed = 0;
    log[0] = 0;
    CHECK_OK(sc_program_log(*p, log, log_size, &needed));
    return true;
}

static void check_arch(int arch, bool arch_specific, bool cubin, bool ptx)
{
    const bool fp8 = arch >= 89;
    static char log[65536];
    sc_program p = {0};
    const void *img = NULL;
    uint64_t bytes = 0;
    const char *a = arch_specific ? "a" : "";

    /* cubin: every kernel, and ptxas's report of no spills (-v). */
    if (cubin && compile(arch, arch_specific, false, &p, &img, &bytes, log, sizeof log)) {
        sc_program_props props;
        CHECK_OK(sc_program_info(p, &props));
        for (int k = 0; k < SCI_QUANT_K_COUNT; k++)
            if (!has(img, bytes, sci_quant_kernels[k])) {
                fprintf(stderr, "sm_%d%s: the image lacks %s\n", arch, a, sci_quant_kernels[k]);
                test_failures++;
            }
        if (!props.is_ptx) {
            /* "0 bytes spill stores, 0 bytes spill loads" once per kernel. */
            int reports = 0;
            for (const char *at = log; (at = strstr(at, "bytes spill stores")) != NULL; at++) {
                reports++;
                const char *num = at;
                while (num > log && num[-1] == ' ')
                    num--;
                while (num > log && num[-1] >= '0' && num[-1] <= '9')
                    num--;
                if (atoi(num) != 0) {
                    fprintf(stderr, "sm_%d%s: a kernel spills registers:\n%s\n", arch, a, log);
                    test_failures++;
                    break;
                }
            }
            if (reports < SCI_QUANT_K_COUNT) {
                fprintf(stderr, "sm_%d%s: ptxas reported %d kernels, not %d; log:\n%s\n",
                        arch, a, reports, SCI_QUANT_K_COUNT, log);
                test_failures++;
            }
        }
        printf("  sm_%d%s: %s, %llu bytes\n", arch, a, props.is_ptx ? "PTX" : "cubin",
               (unsigned long long)bytes);
        CHECK_OK(sc_program_destroy(p));
    }

    /* PTX: what the kernels are made of. */
    if (ptx && compile(arch, arch_specific, true, &p, &img, &bytes, log, sizeof log)) {
        static const char *const fp8_ops[] = {"cvt.rn.satfinite.e4m3x2.f32",
                                              "cvt.rn.f16x2.e4m3x2"};
        static const char *const ops[] = {"mul.rn.f32", "div.rn.f32", "ld.global.cs.v4.u32",
                                          "st.global.cs.v2.u32", "redux.sync.max.u32"};
        for (size_t i = 0; i < sizeof fp8_ops / sizeof fp8_ops[0]; i++)
            if (has(img, bytes, fp8_ops[i]) != fp8) {
                fprintf(stderr, "sm_%d%s: the PTX %s %s\n", arch, a,
                        fp8 ? "lacks" : "unexpectedly has", fp8_ops[i]);
                test_failures++;
            }
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
            if (!has(img, bytes, ops[i])) {
                fprintf(stderr, "sm_%d%s: the PTX lacks %s\n", arch, a, ops[i]);
                test_failures++;
            }
        if (has(img, bytes, "trap;") == fp8) {
            fprintf(stderr, "sm_%d%s: the PTX %s trap\n", arch, a, fp8 ? "has a" : "lacks the");
            test_failures++;
        }
        CHECK(!has(img, bytes, ".ftz"));
        CHECK_OK(sc_program_destroy(p));
    }
}

int main(void)
{
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("test_compile_quant: skipped: %s\n", sc_last_error());
        return 77;
    }
    setenv("SAFECUDA_CACHE", "0", 1);
    REQUIRE(sci_builtin_find(SCI_QUANT_FILE) != NULL);
    printf("NVRTC %d.%d\n", major, minor);
    /* What runs on H100 (sm_90a) both ways and the PTX of a device without the
     * conversions; then the PTX of the oldest device with them and Blackwell's cubin, left
     * out under valgrind (NVRTC runs there for minutes a program; valgrind's preload is in
     * LD_PRELOAD). test_compile_host compiles the file for sm_80 and sm_90 besides. */
    check_arch(90, true, true, true);
    check_arch(80, false, false, true);
    const char *preload = getenv("LD_PRELOAD");
    if (preload && strstr(preload, "vgpreload")) {
        printf("  under valgrind: sm_89 and sm_100 left out\n");
    } else {
        check_arch(89, false, false, true);
        if (major >= 13 || (major == 12 && minor >= 8))
            check_arch(100, false, true, false);
    }
    return test_result("test_compile_quant");
}
