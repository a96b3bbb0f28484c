/* Programs without a GPU: compile-only programs (the zero context and desc.arch) need only
 * NVRTC. Every embedded built-in kernel file for sm_80 and sm_90 (sm_90a for the files
 * named *_sm90a.cu), each with every kernel the MoE layer loads from it; compile errors (the
 * file name and line in the message), missing and in-memory headers, name expressions
 * and their lowered names, argument checks, the disk cache (hits, misses on any change,
 * truncated, overwritten, emptied and foreign entries recompiled, four processes
 * compiling one program at once, no_cache and SAFECUDA_CACHE=0), images and logs, and
 * stale handles after destroy.
 *
 * The cache lives in a fresh mkdtemp folder (SAFECUDA_CACHE_DIR, set before the first
 * program). Exits 77 (skipped) when NVRTC can't be loaded. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../test.h"
#include "core/registry.h"
#include "launch/builtin.h"
#include "moe/plan.h"

static char cache_dir[256];

/* ---- helpers ------------------------------------------------------------------------------ */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    REQUIRE(p != NULL);
    return p;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Create a compile-only program; on failure print the message and return false. */
static bool create(const sc_program_desc *d, sc_program *p, sc_program_props *props,
                   const char *what)
{
    sc_status s = sc_program_create((sc_context){0}, d, p);
    if (s != SC_OK) {
        fprintf(stderr, "%s: sc_program_create returned %s: %s\n", what, sc_status_name(s),
                sc_last_error());
        test_failures++;
        return false;
    }
    CHECK(p->id != 0);
    if (props) {
        memset(props, 0, sizeof *props);
        CHECK_OK(sc_program_info(*p, props));
    }
    return true;
}

/* Destroy, then check that the handle is stale. */
static void destroy(sc_program p)
{
    CHECK_OK(sc_program_destroy(p));
    CHECK_STATUS(sc_program_destroy(p), SC_ERR_STALE_HANDLE);
}

/* A copy of the program's image (free it). */
static void *image_copy(sc_program p, uint64_t *bytes)
{
    const void *img = NULL;
    *bytes = 0;
    CHECK_OK(sc_program_image(p, &img, bytes));
    REQUIRE(img != NULL && *bytes > 0);
    void *copy = xmalloc((size_t)*bytes);
    memcpy(copy, img, (size_t)*bytes);
    return copy;
}

static off_t file_size(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    return st.st_size;
}

/* The image is a cubin (ELF) or NUL-terminated PTX, as the props say. */
static void check_image(sc_program p, const sc_program_props *props, const char *what)
{
    const void *img = NULL;
    uint64_t bytes = 0;
    CHECK_OK(sc_program_image(p, &img, &bytes));
    CHECK(img != NULL);
    CHECK(bytes > 0);
    CHECK(bytes == props->image_bytes);
    if (!img || bytes < 4)
        return;
    const unsigned char *b = img;
    if (props->is_ptx) {
        /* PTX text, NUL-terminated with the NUL counted in bytes. */
        const char *nul = memchr(img, 0, (size_t)bytes);
        if (nul != (const char *)img + bytes - 1) {
            fprintf(stderr, "%s: PTX image of %" PRIu64 " bytes: NUL at %td\n", what, bytes,
                    nul ? nul - (const char *)img : (ptrdiff_t)-1);
            test_failures++;
            return;
        }
        CHECK(strstr(img, ".version") != NULL);
        CHECK(strstr(img, ".target") != NULL);
    } else if (!(b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F')) {
        fprintf(stderr, "%s: cubin image does not start with the ELF magic\n", what);
        test_failures++;
    }
}

/* ---- built-in kernels ---------------------------------------------------------------------- */

/* The image holds the string (a kernel's name in the cubin's or PTX's symbols). */
static bool image_has(sc_program p, const char *s)
{
    const void *img = NULL;
    uint64_t bytes = 0;
    if (sc_program_image(p, &img, &bytes) != SC_OK || !img)
        return false;
    const size_t n = strlen(s);
    for (uint64_t i = 0; i + n <= bytes; i++)
        if (memcmp((const char *)img + i, s, n) == 0)
            return true;
    return false;
}

/* Every kernel the MoE layer loads from this file is in its image. */
static void check_moe_kernels(sc_program p, const char *file, int arch, bool sm90a)
{
    for (int i = 0; i < SCI_MOE_K_COUNT; i++) {
        if (strcmp(sci_moe_kernels[i].file, file) != 0)
            continue;
        if (!image_has(p, sci_moe_kernels[i].name)) {
            fprintf(stderr, "%s for sm_%d%s lacks the MoE kernel %s\n", file, arch,
                    sm90a ? "a" : "", sci_moe_kernels[i].name);
            test_failures++;
        }
    }
}

static void test_builtins(void)
{
    CHECK(sci_builtin_count > 0);
    CHECK(sci_builtin_find("util/elementwise.cu") != NULL);
    CHECK(sci_builtin_find("no/such/file.cu") == NULL);

    /* Every embedded .cuh is offered as a header, under its path below kernels/. */
    sc_program_header headers[64];
    size_t n_headers = 0, n_cu = 0;
    for (size_t i = 0; i < sci_builtin_count; i++) {
        CHECK(sci_builtin_sources[i].name != NULL && sci_builtin_sources[i].source != NULL);
        if (ends_with(sci_builtin_sources[i].name, ".cuh") && n_headers < 64)
            headers[n_headers++] = (sc_program_header){sci_builtin_sources[i].name,
                                                       sci_builtin_sources[i].source};
    }
    static const int arches[] = {80, 90};
    for (size_t i = 0; i < sci_builtin_count; i++) {
        const char *name = sci_builtin_sources[i].name;
        if (!ends_with(name, ".cu"))
            continue;
        n_cu++;
        /* Files named *_sm90a.cu use sm_90a instructions (wgmma, setmaxnreg): sm_90a only. */
        const bool sm90a = ends_with(name, "_sm90a.cu");
        for (size_t a = 0; a < sizeof arches / sizeof arches[0]; a++) {
            if (sm90a && arches[a] != 90)
                continue;
            sc_program_desc d = {.source = sci_builtin_sources[i].source,
                                 .name = name,
                                 .headers = headers,
                                 .n_headers = n_headers,
                                 .arch = arches[a],
                                 .arch_specific = sm90a};
            sc_program p = {0};
            sc_program_props props;
            double t0 = now_ms();
            if (!create(&d, &p, &props, name))
                continue;
            printf("  built-in %-22s sm_%d%s: %s, %7" PRIu64 " bytes, %8.1f ms%s\n", name,
                   arches[a], sm90a ? "a" : " ", props.is_ptx ? "PTX  " : "cubin",
                   props.image_bytes, now_ms() - t0, props.from_cache ? " (cache)" : "");
            CHECK(props.arch == arches[a]);
            check_image(p, &props, name);
            check_moe_kernels(p, name, arches[a], sm90a);
            destroy(p);
        }

        /* Through the library's own path too (sci_builtin_program adds the headers). */
        sc_program p = {0};
        CHECK_OK(sci_builtin_program((sc_context){0}, name, 90, &p));
        if (p.id)
            destroy(p);
        if (sm90a) { /* and nowhere else */
            CHECK_STATUS(sci_builtin_program((sc_context){0}, name, 80, &p), SC_ERR_NOT_SUPPORTED);
            CHECK_MSG("sm_90a");
        }
    }
    CHECK(n_cu > 0);
}

/* ---- compile errors ------------------------------------------------------------------------ */

static void test_compile_errors(void)
{
    sc_program p = {0};

    /* A syntax error on line 3 of "syntax_error.cu". */
    const char *syntax = "extern \"C\" __global__ void broken(float *x)\n"
                         "{\n"
                         "    int a = ;\n"
                         "    x[0] = (float)a;\n"
                         "}\n";
    sc_clear_error();
    p.id = 99;
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = syntax,
                                                      .name = "syntax_error.cu", .arch = 80},
                                   &p),
                 SC_ERR_COMPILE);
    CHECK(p.id == 0);
    CHECK_MSG("error");
    CHECK_MSG("syntax_error.cu");
    CHECK_MSG("syntax_error.cu(3)");

    /* An undefined identifier on line 4 of "undefined.cu"; the log is quoted. */
    const char *undefined = "// line 1\n"
                            "extern \"C\" __global__ void k(float *x)\n"
                            "{\n"
                            "    x[0] = not_declared_anywhere;\n"
                            "}\n";
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = undefined,
                                                      .name = "undefined.cu", .arch = 90},
                                   &p),
                 SC_ERR_COMPILE);
    CHECK_MSG("undefined.cu(4)");
    CHECK_MSG("error");
    CHECK_MSG("not_declared_anywhere");

    /* Without desc.name the file is called "program.cu". */
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = syntax, .arch = 90}, &p),
                 SC_ERR_COMPILE);
    CHECK_MSG("program.cu(3)");

    /* A missing header is named. */
    const char *missing = "#include \"nope.h\"\n"
                          "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f; }\n";
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = missing, .name = "missing.cu",
                                                      .arch = 80},
                                   &p),
                 SC_ERR_COMPILE);
    CHECK_MSG("nope.h");
    CHECK_MSG("missing.cu");

    /* An option NVRTC does not know. */
    const char *fine = "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f; }\n";
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = fine, .arch = 80,
                                                      .options = (const char *const[]){
                                                          "--not-an-option", NULL}},
                                   &p),
                 SC_ERR_COMPILE);

    /* A name expression that names nothing. */
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = fine, .arch = 80,
                                                      .name_expressions = (const char *const[]){
                                                          "no_such_template<int>", NULL}},
                                   &p),
                 SC_ERR_COMPILE);
    CHECK(p.id == 0);
    CHECK(sci_registry_live_count(SCI_KIND_PROGRAM) == 0); /* failures leave nothing behind */
}

/* ---- headers ---------------------------------------------------------------------------------- */

static void test_headers(void)
{
    const char *src = "#include \"my/consts.h\"\n"
                      "extern \"C\" __global__ void k(float *x) { x[0] = twice(SCALE); }\n";
    sc_program_header h1[] = {
        {"my/consts.h", "#pragma once\n#include \"my/inner.h\"\n#define SCALE 3.0f\n"},
        {"my/inner.h", "#pragma once\n__device__ inline float twice(float v) { return 2 * v; }\n"},
    };
    sc_program p = {0};
    sc_program_props props;
    if (create(&(sc_program_desc){.source = src, .name = "headers.cu", .headers = h1,
                                  .n_headers = 2, .arch = 80},
               &p, &props, "in-memory headers")) {
        CHECK(!props.from_cache);
        check_image(p, &props, "in-memory headers");
        destroy(p);
    }
    /* The same again: a hit. */
    if (create(&(sc_program_desc){.source = src, .name = "headers.cu", .headers = h1,
                                  .n_headers = 2, .arch = 80},
               &p, &props, "in-memory headers again")) {
        CHECK(props.from_cache);
        destroy(p);
    }
    /* A header's text is part of the key: a changed header is a miss. */
    sc_program_header h2[] = {
        {"my/consts.h", "#pragma once\n#include \"my/inner.h\"\n#define SCALE 4.0f\n"},
        h1[1],
    };
    if (create(&(sc_program_desc){.source = src, .name = "headers.cu", .headers = h2,
                                  .n_headers = 2, .arch = 80},
               &p, &props, "changed header")) {
        CHECK(!props.from_cache);
        destroy(p);
    }
    /* Without the inner header: a compile error naming it. */
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = src, .name = "headers.cu",
                                                      .headers = h1, .n_headers = 1,
                                                      .arch = 80},
                                   &p),
                 SC_ERR_COMPILE);
    CHECK_MSG("my/inner.h");
    /* n_headers without headers, a header without a name or source. */
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = src, .n_headers = 1, .arch = 80},
                                   &p),
                 SC_ERR_INVALID_ARGUMENT);
    sc_program_header bad[] = {{NULL, "int x;\n"}};
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = src, .headers = bad,
                                                      .n_headers = 1, .arch = 80},
                                   &p),
                 SC_ERR_INVALID_ARGUMENT);
    sc_program_header bad2[] = {{"my/consts.h", NULL}};
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = src, .headers = bad2,
                                                      .n_headers = 1, .arch = 80},
                                   &p),
                 SC_ERR_INVALID_ARGUMENT);
}

/* ---- name expressions ----------------------------------------------------------------------- */

static const char template_src[] =
    "template <typename T>\n"
    "__global__ void scale(T *x, T s, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        x[i] *= s;\n"
    "}\n";

static void test_name_expressions(void)
{
    const char *const exprs[] = {"scale<float>", "scale<double>", NULL};
    char lowered[2][256] = {"", ""};
    for (int round = 0; round < 2; round++) {
        sc_program p = {0};
        sc_program_props props;
        if (!create(&(sc_program_desc){.source = template_src, .name = "scale.cu",
                                       .name_expressions = exprs, .arch = 90},
                    &p, &props, "name expressions"))
            return;
        /* The lowered names come back from the cache too. */
        CHECK(props.from_cache == (round == 1));
        for (int i = 0; i < 2; i++) {
            const char *l = NULL;
            CHECK_OK(sc_program_lowered_name(p, exprs[i], &l));
            if (!l) {
                test_failures++;
                continue;
            }
            printf("  %s -> %s%s\n", exprs[i], l, round ? " (from the cache)" : "");
            CHECK(strncmp(l, "_Z", 2) == 0);
            CHECK(strstr(l, "scale") != NULL);
            if (round == 0)
                snprintf(lowered[i], sizeof lowered[i], "%s", l);
            else
                CHECK(strcmp(lowered[i], l) == 0);
        }
        CHECK(strcmp(lowered[0], lowered[1]) != 0);
        /* The template arguments are in the names: scale<float> "IfE", scale<double> "IdE". */
        CHECK(strstr(lowered[0], "IfE") != NULL);
        CHECK(strstr(lowered[1], "IdE") != NULL);
        const char *l = "unchanged";
        sc_clear_error();
        CHECK_STATUS(sc_program_lowered_name(p, "scale<int>", &l), SC_ERR_INVALID_ARGUMENT);
        CHECK_MSG("scale<int>");
        CHECK_STATUS(sc_program_lowered_name(p, NULL, &l), SC_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(sc_program_lowered_name(p, "scale<float>", NULL), SC_ERR_INVALID_ARGUMENT);
        if (p.id)
            destroy(p);
        CHECK_STATUS(sc_program_lowered_name(p, "scale<float>", &l), SC_ERR_STALE_HANDLE);
    }
    /* A program without name expressions has no lowered names. */
    sc_program p = {0};
    if (create(&(sc_program_desc){.source = template_src, .name = "scale_none.cu",
                                  .options = (const char *const[]){"-DNONE", NULL},
                                  .arch = 90},
               &p, NULL, "no name expressions")) {
        const char *l = NULL;
        CHECK(sc_program_lowered_name(p, "scale<float>", &l) != SC_OK);
        destroy(p);
    }
}

/* ---- argument checks ------------------------------------------------------------------------ */

static void test_invalid_arguments(void)
{
    const char *src = "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f; }\n";
    sc_program p = {0};
    CHECK_STATUS(sc_program_create((sc_context){0}, NULL, &p), SC_ERR_INVALID_ARGUMENT);
    CHECK(p.id == 0);
    CHECK_STATUS(sc_program_create((sc_context){0}, &(sc_program_desc){.arch = 80}, &p),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = NULL, .arch = 80}, &p),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_program_create_at((sc_context){0}, &(sc_program_desc){.source = src,
                                                                          .arch = 80},
                                      NULL, __FILE__, __LINE__),
                 SC_ERR_INVALID_ARGUMENT);
    /* Compile-only needs an architecture. */
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0}, &(sc_program_desc){.source = src}, &p),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("arch");
    CHECK(p.id == 0);
    /* Not an architecture. */
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = src, .arch = -90}, &p),
                 SC_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = src, .arch = 9}, &p),
                 SC_ERR_INVALID_ARGUMENT);

    /* The other functions on the zero handle and NULL pointers. */
    sc_program_props props;
    const void *img = NULL;
    uint64_t bytes = 0;
    const char *l = NULL;
    char buf[8];
    size_t needed = 0;
    CHECK_STATUS(sc_program_destroy((sc_program){0}), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_program_info((sc_program){0}, &props), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_program_image((sc_program){0}, &img, &bytes), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_program_log((sc_program){0}, buf, sizeof buf, &needed), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sc_program_lowered_name((sc_program){0}, "k", &l), SC_ERR_STALE_HANDLE);
    if (create(&(sc_program_desc){.source = src, .arch = 80}, &p, NULL, "valid")) {
        CHECK_STATUS(sc_program_info(p, NULL), SC_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(sc_program_image(p, NULL, &bytes), SC_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(sc_program_image(p, &img, NULL), SC_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(sc_program_log(p, NULL, 8, &needed), SC_ERR_INVALID_ARGUMENT);
        /* A handle of another kind. */
        CHECK_STATUS(sc_program_info((sc_program){((uint64_t)SCI_KIND_BUFFER << 56) |
                                                  (p.id & ((1ull << 56) - 1))},
                                     &props),
                     SC_ERR_WRONG_KIND);
        destroy(p);
        CHECK_STATUS(sc_program_info(p, &props), SC_ERR_STALE_HANDLE);
        CHECK_MSG("sc_program_info");
        CHECK_STATUS(sc_program_image(p, &img, &bytes), SC_ERR_STALE_HANDLE);
        CHECK_STATUS(sc_program_log(p, buf, sizeof buf, &needed), SC_ERR_STALE_HANDLE);
    }
}

/* ---- images, logs, options ------------------------------------------------------------------ */

static void test_images_and_logs(void)
{
    /* An unused variable: NVRTC warns, the program still compiles. */
    const char *src = "extern \"C\" __global__ void warn_me(float *x)\n"
                      "{\n"
                      "    int unused_variable_here;\n"
                      "    x[0] = 1.0f;\n"
                      "}\n";
    sc_program p = {0};
    sc_program_props props;
    if (create(&(sc_program_desc){.source = src, .name = "warn.cu", .arch = 80}, &p, &props,
               "warning")) {
        CHECK(!props.from_cache);
        CHECK(props.arch == 80);
        CHECK(props.compile_ms >= 0.0);
        check_image(p, &props, "warn.cu");
        size_t needed = 0;
        CHECK_OK(sc_program_log(p, NULL, 0, &needed));
        CHECK(needed >= 1);
        char *log = xmalloc(needed);
        size_t needed2 = 0;
        CHECK_OK(sc_program_log(p, log, needed, &needed2));
        CHECK(needed2 == needed);
        CHECK(strlen(log) + 1 == needed);
        if (!strstr(log, "unused_variable_here"))
            printf("  note: the NVRTC log does not mention the unused variable: \"%s\"\n", log);
        /* Truncated copies stay NUL-terminated. */
        if (needed > 4) {
            char small[4];
            memset(small, 'x', sizeof small);
            CHECK_OK(sc_program_log(p, small, sizeof small, NULL));
            CHECK(small[3] == '\0' && memcmp(small, log, 3) == 0);
        }
        free(log);
        destroy(p);
    }
    /* From the cache the log is "". */
    if (create(&(sc_program_desc){.source = src, .name = "warn.cu", .arch = 80}, &p, &props,
               "warning again")) {
        CHECK(props.from_cache);
        char log[16] = "garbage";
        size_t needed = 0;
        CHECK_OK(sc_program_log(p, log, sizeof log, &needed));
        CHECK(needed == 1 && log[0] == '\0');
        destroy(p);
    }

    /* PTX on request: text for compute_80 / sm_80. */
    const char *k = "extern \"C\" __global__ void ptx_kernel(float *x) { x[threadIdx.x] = 2.0f; }\n";
    if (create(&(sc_program_desc){.source = k, .name = "ptx.cu", .ptx = true, .arch = 80}, &p,
               &props, "ptx")) {
        CHECK(props.is_ptx);
        check_image(p, &props, "ptx.cu");
        const void *img = NULL;
        uint64_t bytes = 0;
        CHECK_OK(sc_program_image(p, &img, &bytes));
        if (img) {
            CHECK(strstr(img, "ptx_kernel") != NULL);
            CHECK(strstr(img, "sm_80") != NULL);
        }
        destroy(p);
    }
    /* Architecture-specific PTX: sm_90a. */
    if (create(&(sc_program_desc){.source = k, .name = "ptx.cu", .ptx = true, .arch = 90,
                                  .arch_specific = true},
               &p, &props, "ptx sm_90a")) {
        CHECK(props.is_ptx);
        CHECK(props.arch == 90);
        const void *img = NULL;
        uint64_t bytes = 0;
        CHECK_OK(sc_program_image(p, &img, &bytes));
        if (img)
            CHECK(strstr(img, "sm_90a") != NULL);
        destroy(p);
    }
    /* Without .ptx: cubin where NVRTC knows the architecture (CUDA 12+ knows sm_90). */
    if (create(&(sc_program_desc){.source = k, .name = "cubin.cu", .arch = 90}, &p, &props,
               "cubin")) {
        if (props.is_ptx)
            printf("  note: NVRTC gave PTX for sm_90 (no cubin support?)\n");
        check_image(p, &props, "cubin.cu");
        destroy(p);
    }
    /* fast_math and an option that defines a macro the source needs. */
    const char *needs = "#ifndef WIDTH\n#error WIDTH is not defined\n#endif\n"
                        "extern \"C\" __global__ void w(float *x) { x[0] = WIDTH * 1.5f; }\n";
    if (create(&(sc_program_desc){.source = needs, .name = "opts.cu",
                                  .options = (const char *const[]){"-DWIDTH=4", "-lineinfo",
                                                                   NULL},
                                  .fast_math = true, .arch = 80},
               &p, &props, "options"))
        destroy(p);
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = needs, .name = "opts.cu",
                                                      .arch = 80},
                                   &p),
                 SC_ERR_COMPILE);
    CHECK_MSG("WIDTH is not defined");
}

/* ---- architecture-specific targets --------------------------------------------------------- */

/* The leak-report detail of the compile-only program p ("cubin for sm_90a"). */
static void check_detail(sc_program p, const char *want)
{
    sc_object_info info[64];
    size_t n = sci_registry_describe(0, info, 64);
    (void)p;
    bool found = false;
    for (size_t i = 0; i < n && i < 64; i++)
        if (strcmp(info[i].kind, "program") == 0 && strcmp(info[i].detail, want) == 0)
            found = true;
    if (!found) {
        fprintf(stderr, "no program described as \"%s\" among %zu objects:", want, n);
        for (size_t i = 0; i < n && i < 64; i++)
            fprintf(stderr, " [%s: %s]", info[i].kind, info[i].detail);
        fprintf(stderr, "\n");
        test_failures++;
    }
}

static void test_arch_specific(void)
{
    const char *k = "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] = 2.0f; }\n";
    sc_program p = {0};
    sc_program_props props;

    /* sc_program_props.arch_specific says which target was built, and so does the
     * leak-report detail. */
    if (create(&(sc_program_desc){.source = k, .name = "a.cu", .arch = 90, .arch_specific = true},
               &p, &props, "cubin sm_90a")) {
        CHECK(props.arch == 90);
        CHECK(props.arch_specific);
        if (!props.is_ptx)
            check_detail(p, "cubin for sm_90a");
        destroy(p);
    }
    if (create(&(sc_program_desc){.source = k, .name = "a.cu", .arch = 90, .ptx = true,
                                  .arch_specific = true},
               &p, &props, "PTX compute_90a")) {
        CHECK(props.is_ptx && props.arch == 90 && props.arch_specific);
        check_detail(p, "PTX for compute_90a");
        destroy(p);
    }
    if (create(&(sc_program_desc){.source = k, .name = "a.cu", .arch = 90}, &p, &props,
               "cubin sm_90")) {
        CHECK(props.arch == 90);
        CHECK(!props.arch_specific);
        if (!props.is_ptx)
            check_detail(p, "cubin for sm_90");
        destroy(p);
    }
    if (create(&(sc_program_desc){.source = k, .name = "a.cu", .arch = 80, .ptx = true}, &p,
               &props, "PTX compute_80")) {
        CHECK(props.is_ptx && !props.arch_specific);
        check_detail(p, "PTX for compute_80");
        destroy(p);
    }

    /* An architecture NVRTC does not know: plain code falls back to PTX for the newest one
     * it knows (the driver JIT-compiles it), but architecture-specific code runs only on
     * its own architecture, so the fallback would not run: refused. */
    if (create(&(sc_program_desc){.source = k, .name = "a.cu", .arch = 990}, &p, &props,
               "fallback")) {
        CHECK(props.is_ptx && props.arch < 990 && !props.arch_specific);
        destroy(p);
    }
    sc_clear_error();
    p.id = 7;
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = k, .name = "a.cu", .arch = 990,
                                                      .arch_specific = true},
                                   &p),
                 SC_ERR_NOT_SUPPORTED);
    CHECK(p.id == 0);
    CHECK_MSG("sc_program_create: desc->arch_specific: sm_990a needs an NVRTC that knows sm_990");
    CHECK_MSG("knows up to sm_");
    CHECK(sci_registry_live_count(SCI_KIND_PROGRAM) == 0);
}

/* ---- a compile log longer than the error message ------------------------------------------- */

static char *captured;
static size_t captured_len;

static void capture_log(sc_log_level level, const char *text, void *user)
{
    (void)user;
    if (level != SC_LOG_ERROR)
        return;
    size_t n = strlen(text);
    char *grown = realloc(captured, captured_len + n + 1);
    REQUIRE(grown != NULL);
    memcpy(grown + captured_len, text, n + 1);
    captured = grown;
    captured_len += n;
}

static void test_huge_log(void)
{
    /* 3000 warnings (unused variables), then one error: a log of several hundred KiB. */
    enum { WARNINGS = 3000 };
    size_t size = 64 + WARNINGS * 32 + 128, len = 0;
    char *src = xmalloc(size);
    len += (size_t)snprintf(src + len, size - len, "extern \"C\" __global__ void k(float *x)\n{\n");
    for (int i = 0; i < WARNINGS; i++)
        len += (size_t)snprintf(src + len, size - len, "    int unused_%d;\n", i);
    snprintf(src + len, size - len, "    x[0] = not_declared_at_the_end;\n}\n");

    sc_set_log_callback(capture_log, NULL);
    sc_program p = {0};
    sc_clear_error();
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = src, .name = "huge_log.cu",
                                                      .arch = 80, .no_cache = true},
                                   &p),
                 SC_ERR_COMPILE);
    sc_set_log_callback(NULL, NULL);
    free(src);

    /* The message: the first error (at the end of the log), the log's length, where the
     * whole log went, and the cut marker. */
    const char *m = sc_last_error();
    size_t m_len = strlen(m);
    CHECK(m_len < 16384);
    CHECK_MSG("sc_program_create: 'huge_log.cu' failed to compile for sm_80: huge_log.cu(3003)");
    CHECK_MSG("not_declared_at_the_end");
    size_t log_bytes = 0;
    const char *head = strstr(m, "--- NVRTC log (");
    CHECK(head != NULL && sscanf(head, "--- NVRTC log (%zu bytes", &log_bytes) == 1);
    CHECK(log_bytes > 100000);
    CHECK_MSG("bytes; too long for this message: the whole log went to the log callback) ---");
    CHECK_MSG("huge_log.cu(3): warning"); /* the start of the log is shown */
    const char *marker = strstr(m, "... [message cut: ");
    size_t shown = 0, whole = 0;
    CHECK(marker != NULL &&
          sscanf(marker, "... [message cut: %zu of %zu bytes shown]", &shown, &whole) == 2);
    CHECK(shown == (size_t)(marker - m));
    CHECK(whole > log_bytes);
    CHECK(m_len > 0 && m[m_len - 1] == ']');

    /* The log callback got all of it. */
    CHECK(captured != NULL);
    if (captured) {
        CHECK(captured_len >= log_bytes);
        CHECK(strstr(captured, "huge_log.cu") != NULL);
        CHECK(strstr(captured, "unused_0\"") != NULL);
        CHECK(strstr(captured, "unused_2999\"") != NULL);
        CHECK(strstr(captured, "not_declared_at_the_end") != NULL);
        char want[128];
        snprintf(want, sizeof want, "(%zu bytes)", log_bytes);
        CHECK(strstr(captured, want) != NULL);
    }
    free(captured);
    captured = NULL;
    captured_len = 0;

    /* A log that fits is quoted whole, with its length, and nothing goes to the log. */
    sc_set_log_callback(capture_log, NULL);
    CHECK_STATUS(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = "int x = ;\n", .name = "small.cu",
                                                      .arch = 80},
                                   &p),
                 SC_ERR_COMPILE);
    sc_set_log_callback(NULL, NULL);
    CHECK(captured == NULL);
    CHECK_MSG("--- NVRTC log (");
    CHECK(strstr(sc_last_error(), "message cut") == NULL);
    CHECK(strstr(sc_last_error(), "log callback") == NULL);
    free(captured);
    captured = NULL;
    captured_len = 0;
}

/* ---- the disk cache ----------------------------------------------------------------------- */

static const char cache_src[] =
    "extern \"C\" __global__ void cached_kernel(const float *a, float *b, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        b[i] = a[i] * 3.0f + 1.0f;\n"
    "}\n";

static void test_cache_hits(void)
{
    sc_program_desc d = {.source = cache_src, .name = "cached.cu", .arch = 80};
    sc_program p1 = {0}, p2 = {0}, p3 = {0};
    sc_program_props a, b, c;
    if (!create(&d, &p1, &a, "cache first"))
        return;
    CHECK(!a.from_cache);
    CHECK(a.cache_path[0] != '\0');
    CHECK(strncmp(a.cache_path, cache_dir, strlen(cache_dir)) == 0);
    CHECK(file_size(a.cache_path) > (off_t)a.image_bytes);
    printf("  cache entry %s (%lld bytes), compiled in %.1f ms\n", a.cache_path,
           (long long)file_size(a.cache_path), a.compile_ms);

    /* Identical: a hit with the same image, while the first program still lives. */
    if (create(&d, &p2, &b, "cache second")) {
        CHECK(b.from_cache);
        CHECK(strcmp(a.cache_path, b.cache_path) == 0);
        CHECK(a.image_bytes == b.image_bytes && a.is_ptx == b.is_ptx && a.arch == b.arch);
        uint64_t n1 = 0, n2 = 0;
        void *i1 = image_copy(p1, &n1), *i2 = image_copy(p2, &n2);
        CHECK(n1 == n2 && memcmp(i1, i2, (size_t)n1) == 0);
        free(i1);
        free(i2);
        printf("  cache hit in %.3f ms\n", b.compile_ms);
        destroy(p2);
    }
    /* A different option, architecture, name, source, PTX or fast math: misses. */
    const char *const opt[] = {"-DFOO=1", NULL};
    sc_program_desc variants[] = {
        {.source = cache_src, .name = "cached.cu", .arch = 80, .options = opt},
        {.source = cache_src, .name = "cached.cu", .arch = 90},
        {.source = cache_src, .name = "other_name.cu", .arch = 80},
        {.source = "// changed\nextern \"C\" __global__ void cached_kernel(const float *a, "
                   "float *b, int n) { if (n) b[0] = a[0]; }\n",
         .name = "cached.cu", .arch = 80},
        {.source = cache_src, .name = "cached.cu", .arch = 80, .ptx = true},
        {.source = cache_src, .name = "cached.cu", .arch = 80, .fast_math = true},
    };
    const char *what[] = {"-DFOO=1", "sm_90", "name", "source", "ptx", "fast_math"};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        if (!create(&variants[i], &p3, &c, what[i]))
            continue;
        if (c.from_cache) {
            fprintf(stderr, "cache: the variant '%s' was a hit\n", what[i]);
            test_failures++;
        }
        CHECK(strcmp(c.cache_path, a.cache_path) != 0);
        destroy(p3);
        /* ... and hits the second time. */
        if (create(&variants[i], &p3, &c, what[i])) {
            CHECK(c.from_cache);
            destroy(p3);
        }
    }
    destroy(p1);
}

/* Compile, damage the entry with `damage`, compile again: a recompile with the same image. */
typedef void (*damage_fn)(const char *path, off_t size);

static void damage_truncate_half(const char *path, off_t size)
{
    REQUIRE(truncate(path, size / 2) == 0);
}

static void damage_flip_middle(const char *path, off_t size)
{
    FILE *f = fopen(path, "r+b");
    REQUIRE(f != NULL);
    unsigned char buf[64];
    off_t at = size / 2 - (off_t)sizeof buf / 2;
    REQUIRE(at >= 0);
    REQUIRE(fseeko(f, at, SEEK_SET) == 0);
    REQUIRE(fread(buf, 1, sizeof buf, f) == sizeof buf);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] ^= 0x5A;
    REQUIRE(fseeko(f, at, SEEK_SET) == 0);
    REQUIRE(fwrite(buf, 1, sizeof buf, f) == sizeof buf);
    REQUIRE(fclose(f) == 0);
}

static void damage_flip_one_byte_at_end(const char *path, off_t size)
{
    FILE *f = fopen(path, "r+b");
    REQUIRE(f != NULL);
    REQUIRE(fseeko(f, size - 1, SEEK_SET) == 0);
    int ch = fgetc(f);
    REQUIRE(ch != EOF);
    REQUIRE(fseeko(f, size - 1, SEEK_SET) == 0);
    REQUIRE(fputc(ch ^ 1, f) != EOF);
    REQUIRE(fclose(f) == 0);
}

static void damage_empty(const char *path, off_t size)
{
    (void)size;
    REQUIRE(truncate(path, 0) == 0);
}

static void damage_garbage(const char *path, off_t size)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL);
    uint64_t st = 12345;
    for (off_t i = 0; i < size; i++)
        fputc((int)(test_rand(&st) & 0xff), f);
    REQUIRE(fclose(f) == 0);
}

static void damage_first_byte(const char *path, off_t size)
{
    (void)size;
    FILE *f = fopen(path, "r+b");
    REQUIRE(f != NULL);
    REQUIRE(fputc('X', f) != EOF);
    REQUIRE(fclose(f) == 0);
}

static void check_recompiled(const char *label, const char *src, bool ptx, damage_fn damage)
{
    sc_program_desc d = {.source = src, .name = "corrupt.cu", .arch = 80, .ptx = ptx};
    sc_program p = {0};
    sc_program_props a, b;
    if (!create(&d, &p, &a, label))
        return;
    uint64_t n0 = 0;
    void *img0 = image_copy(p, &n0);
    destroy(p);
    off_t size = file_size(a.cache_path);
    REQUIRE(size > 0);

    damage(a.cache_path, size);

    if (create(&d, &p, &b, label)) {
        if (b.from_cache) {
            fprintf(stderr, "cache (%s): the damaged entry was loaded\n", label);
            test_failures++;
        }
        CHECK(b.image_bytes == a.image_bytes);
        CHECK(b.is_ptx == a.is_ptx);
        uint64_t n1 = 0;
        void *img1 = image_copy(p, &n1);
        CHECK(n1 == n0);
        if (n1 == n0 && memcmp(img0, img1, (size_t)n0) != 0)
            printf("  note (%s): the recompiled image differs from the first (same size)\n",
                   label);
        free(img1);
        check_image(p, &b, label);
        destroy(p);
    }
    /* The recompile rewrote the entry: a hit again, whole. */
    CHECK(file_size(a.cache_path) == size);
    if (create(&d, &p, &b, label)) {
        CHECK(b.from_cache);
        CHECK(b.image_bytes == a.image_bytes);
        destroy(p);
    }
    free(img0);
}

static void test_cache_corruption(void)
{
    static const struct {
        const char *label;
        damage_fn fn;
    } cases[] = {
        {"truncated to half", damage_truncate_half},
        {"bytes overwritten in the middle", damage_flip_middle},
        {"last byte flipped", damage_flip_one_byte_at_end},
        {"emptied", damage_empty},
        {"random bytes", damage_garbage},
        {"first byte changed", damage_first_byte},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* A distinct program per case, so every case starts from a fresh entry. */
        char src[512];
        snprintf(src, sizeof src, "// case %zu\n%s", i, cache_src);
        check_recompiled(cases[i].label, src, false, cases[i].fn);
        snprintf(src, sizeof src, "// PTX case %zu\n%s", i, cache_src);
        char label[96];
        snprintf(label, sizeof label, "PTX, %s", cases[i].label);
        check_recompiled(label, src, true, cases[i].fn);
    }

    /* A whole, valid entry of another program copied over this one's: foreign, a miss. */
    sc_program_desc da = {.source = "// foreign a\n", .name = "fa.cu", .arch = 80};
    sc_program_desc db = {.source = "// foreign b\n", .name = "fb.cu", .arch = 80};
    char sa[600], sb[600];
    snprintf(sa, sizeof sa, "%s%s", da.source, cache_src);
    snprintf(sb, sizeof sb, "%s%s", db.source, cache_src);
    da.source = sa;
    db.source = sb;
    sc_program pa = {0}, pb = {0};
    sc_program_props a, b;
    if (create(&da, &pa, &a, "foreign a") && create(&db, &pb, &b, "foreign b")) {
        destroy(pa);
        destroy(pb);
        char cmd[1400];
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", b.cache_path, a.cache_path);
        REQUIRE(system(cmd) == 0);
        if (create(&da, &pa, &a, "foreign a again")) {
            CHECK(!a.from_cache);
            destroy(pa);
        }
        if (create(&db, &pb, &b, "foreign b again")) {
            CHECK(b.from_cache); /* the source of the copy is still whole */
            destroy(pb);
        }
    }

    /* A cache entry that is a folder: unreadable, compiled anyway. */
    sc_program_desc dd = {.source = "// a folder\nextern \"C\" __global__ void f() {}\n",
                          .name = "dir.cu", .arch = 80, .no_cache = false};
    sc_program pd = {0};
    sc_program_props pp;
    if (create(&dd, &pd, &pp, "entry becomes a folder")) {
        destroy(pd);
        REQUIRE(unlink(pp.cache_path) == 0);
        REQUIRE(mkdir(pp.cache_path, 0755) == 0);
        if (create(&dd, &pd, &pp, "entry is a folder")) {
            CHECK(!pp.from_cache);
            destroy(pd);
        }
        rmdir(pp.cache_path);
    }
}

/* Four processes compile one program at the same moment. */
static void test_cache_concurrent(void)
{
    enum { CHILDREN = 3 };
    /* Large enough that the compiles overlap. */
    const char *src =
        "template <int N> __device__ float poly(float x)\n"
        "{ float r = 0.f;\n"
        "#pragma unroll\n"
        "  for (int i = 0; i < N; i++) r = r * x + (float)(i % 7);\n"
        "  return r; }\n"
        "extern \"C\" __global__ void concurrent(const float *a, float *b, int n)\n"
        "{ int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "  if (i < n) b[i] = poly<512>(a[i]) + poly<384>(a[i] * 0.5f) + poly<256>(-a[i]); }\n";
    sc_program_desc d = {.source = src, .name = "concurrent.cu", .arch = 90};

    int gate[2];
    REQUIRE(pipe(gate) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pids[CHILDREN];
    for (int i = 0; i < CHILDREN; i++) {
        pids[i] = fork();
        REQUIRE(pids[i] >= 0);
        if (pids[i] == 0) {
            close(gate[1]);
            char c;
            while (read(gate[0], &c, 1) < 0 && errno == EINTR)
                ;
            sc_program p = {0};
            sc_status s = sc_program_create((sc_context){0}, &d, &p);
            if (s != SC_OK) {
                fprintf(stderr, "child %d: %s: %s\n", i, sc_status_name(s), sc_last_error());
                _exit(1);
            }
            const void *img = NULL;
            uint64_t bytes = 0;
            if (sc_program_image(p, &img, &bytes) != SC_OK || bytes == 0)
                _exit(2);
            if (sc_program_destroy(p) != SC_OK)
                _exit(3);
            _exit(0);
        }
    }
    close(gate[0]);
    close(gate[1]); /* opens the gate: every child's read returns 0 */
    sc_program p = {0};
    sc_program_props props;
    bool ok = create(&d, &p, &props, "concurrent (parent)");
    for (int i = 0; i < CHILDREN; i++) {
        int st = 0;
        REQUIRE(waitpid(pids[i], &st, 0) == pids[i]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "concurrent compile: child %d ended with status 0x%x\n", i, st);
            test_failures++;
        }
    }
    if (ok)
        destroy(p);
    /* A third create: a hit on a whole entry. */
    if (create(&d, &p, &props, "concurrent (after)")) {
        CHECK(props.from_cache);
        check_image(p, &props, "concurrent");
        destroy(p);
    }
    /* No temporary files left behind. */
    DIR *dir = opendir(cache_dir);
    REQUIRE(dir != NULL);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strstr(e->d_name, ".tmp")) {
            fprintf(stderr, "cache: temporary file left behind: %s\n", e->d_name);
            test_failures++;
        }
    }
    closedir(dir);
}

static void test_cache_off(void)
{
    const char *src = "// no cache\nextern \"C\" __global__ void nc(float *x) { x[0] = 5.f; }\n";
    sc_program_desc d = {.source = src, .name = "nocache.cu", .arch = 80, .no_cache = true};
    for (int i = 0; i < 2; i++) {
        sc_program p = {0};
        sc_program_props props;
        if (create(&d, &p, &props, "no_cache")) {
            CHECK(!props.from_cache);
            CHECK(props.cache_path[0] == '\0');
            check_image(p, &props, "no_cache");
            destroy(p);
        }
    }
    /* no_cache wrote nothing: the same program with the cache on is a miss, then a hit. */
    d.no_cache = false;
    for (int i = 0; i < 2; i++) {
        sc_program p = {0};
        sc_program_props props;
        if (create(&d, &p, &props, "cache back on")) {
            CHECK(props.from_cache == (i == 1));
            destroy(p);
        }
    }
    /* SAFECUDA_CACHE=0 turns it off too, even for a program that is in the cache. */
    REQUIRE(setenv("SAFECUDA_CACHE", "0", 1) == 0);
    for (int i = 0; i < 2; i++) {
        sc_program p = {0};
        sc_program_props props;
        if (create(&d, &p, &props, "SAFECUDA_CACHE=0")) {
            CHECK(!props.from_cache);
            CHECK(props.cache_path[0] == '\0');
            destroy(p);
        }
    }
    REQUIRE(unsetenv("SAFECUDA_CACHE") == 0);
}

/* ---- registry ------------------------------------------------------------------------------- */

static void test_many_programs(void)
{
    enum { N = 16 };
    sc_program p[N];
    const char *src = "extern \"C\" __global__ void many(float *x) { x[0] = 1.0f; }\n";
    size_t before = sci_registry_live_count(SCI_KIND_PROGRAM);
    for (int i = 0; i < N; i++)
        REQUIRE(sc_program_create((sc_context){0},
                                  &(sc_program_desc){.source = src, .name = "many.cu",
                                                     .arch = 80},
                                  &p[i]) == SC_OK);
    CHECK(sci_registry_live_count(SCI_KIND_PROGRAM) == before + N);
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            CHECK(p[i].id != p[j].id);
    for (int i = 0; i < N; i += 2)
        destroy(p[i]);
    for (int i = 1; i < N; i += 2) {
        sc_program_props props;
        CHECK_OK(sc_program_info(p[i], &props));
        CHECK(props.from_cache);
        destroy(p[i]);
    }
    CHECK(sci_registry_live_count(SCI_KIND_PROGRAM) == before);
}

/* ---- main ----------------------------------------------------------------------------------- */

static void remove_tree(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", path);
}

int main(void)
{
    /* A fresh cache folder before anything compiles. */
    const char *tmp = getenv("TMPDIR");
    snprintf(cache_dir, sizeof cache_dir, "%s/safecuda-compile-test-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    REQUIRE(mkdtemp(cache_dir) != NULL);
    REQUIRE(setenv("SAFECUDA_CACHE_DIR", cache_dir, 1) == 0);
    REQUIRE(unsetenv("SAFECUDA_CACHE") == 0);

    int major = 0, minor = 0;
    sc_status s = sc_compiler_version(&major, &minor);
    if (s == SC_ERR_NO_COMPILER) {
        printf("skipped: %s\n", sc_last_error());
        remove_tree(cache_dir);
        return TEST_SKIP;
    }
    REQUIRE(s == SC_OK);
    printf("NVRTC %d.%d, cache in %s\n", major, minor, cache_dir);

#define RUN(f)                                                      \
    do {                                                            \
        double t_ = now_ms();                                       \
        f();                                                        \
        printf("%-24s %8.1f ms\n", #f, now_ms() - t_);              \
        fflush(stdout);                                             \
    } while (0)
    RUN(test_invalid_arguments);
    RUN(test_compile_errors);
    RUN(test_headers);
    RUN(test_name_expressions);
    RUN(test_images_and_logs);
    RUN(test_arch_specific);
    RUN(test_huge_log);
    RUN(test_cache_hits);
    RUN(test_cache_corruption);
    RUN(test_cache_concurrent);
    RUN(test_cache_off);
    RUN(test_many_programs);
    RUN(test_builtins);

    /* Every program was destroyed. */
    CHECK(sci_registry_live_count(SCI_KIND_PROGRAM) == 0);
    remove_tree(cache_dir);
    return test_result("test_compile_host");
}
