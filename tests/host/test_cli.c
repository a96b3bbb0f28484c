/* The command-line tool, run through popen.
 *
 * Without NVRTC: no driver (a clear reason, exit 2, and the NVRTC line still printed);
 * unreadable inputs (exit 1); every kind of bad usage of `compile` (exit 64 with a message
 * saying what is wrong) and `compile --help` (exit 0); output that cannot be written.
 * With NVRTC (skipped with the reason when it can't be loaded): --arch in nvcc's
 * spellings and forms (sm_90a builds the sm_90a MoE kernels, sm_90 refuses them, compute_90
 * writes PTX), -I/-D/-U in their separate and attached forms, options passed on to NVRTC,
 * -o that cannot be written (exit 1, the reason, no partial file), a compile log too long
 * for the error message, a target other than the device's (with the test device).
 * precompile: --help, every bad usage (64), no device and no --arch (2), NVRTC missing (2),
 * the cache off (1); with NVRTC a folder that can't be made (1), the built-in kernels for
 * sm_80 (one line per file, the sm_90a file skipped, the summary), then all from the cache. */
#include "cli_test.h"

/* ---- without NVRTC ----------------------------------------------------------------------- */

static void test_info_without_driver(void)
{
    CHECK_RC(runf(ENV "'%s' info 2>&1", SAFECUDA_CLI), 2);
    CHECK_OUT("cannot load the CUDA driver library");
    CHECK_OUT("/nonexistent/libcuda.so.1");
    CHECK_OUT("install the NVIDIA driver");
    CHECK_OUT("without a GPU (CI), SAFECUDA_DEVICE=test selects safecuda's test device");
    CHECK_OUT("NVRTC:   "); /* the compiler is there or not whatever the driver */

    CHECK_RC(runf(ENV "'%s' info --json 2>/dev/null", SAFECUDA_CLI), 2);
    CHECK_OUT("\"error\": \"SC_ERR_NO_DRIVER\"");
    CHECK_OUT("\"nvrtc_version\": ");

    /* Neither driver nor NVRTC: both reasons. */
    CHECK_RC(runf(ENV "SAFECUDA_NVRTC=/nonexistent/libnvrtc.so '%s' info 2>&1", SAFECUDA_CLI),
             2);
    CHECK_OUT("cannot load the CUDA driver library");
    CHECK_OUT("NVRTC:   not available (");
    CHECK_OUT("cannot load NVRTC from SAFECUDA_NVRTC=/nonexistent/libnvrtc.so");
    CHECK_RC(runf(ENV "SAFECUDA_NVRTC=/nonexistent/libnvrtc.so '%s' info --json 2>/dev/null",
                  SAFECUDA_CLI),
             2);
    CHECK_OUT("\"error\": \"SC_ERR_NO_DRIVER\"");
    CHECK_OUT("\"nvrtc_version\": null");
    CHECK_OUT("\"nvrtc_error\": \"sc_compiler_version: cannot load NVRTC from SAFECUDA_NVRTC=");

    /* NCCL: where it was found, or why not, with or without a driver. */
    CHECK_RC(runf(ENV "SAFECUDA_LIBNCCL=/nonexistent/libnccl.so.2 '%s' info 2>&1", SAFECUDA_CLI),
             2);
    CHECK_OUT("NCCL:    not available (sc_comm_library_version: cannot use NCCL from "
              "SAFECUDA_LIBNCCL=/nonexistent/libnccl.so.2: ");
    CHECK_RC(runf(ENV "SAFECUDA_LIBNCCL=/nonexistent/libnccl.so.2 '%s' info --json 2>/dev/null",
                  SAFECUDA_CLI),
             2);
    CHECK_OUT("\"nccl_version\": null,\n  \"nccl_error\": \"sc_comm_library_version: cannot use "
              "NCCL from SAFECUDA_LIBNCCL=/nonexistent/libnccl.so.2: ");
    CHECK_RC(runf(ENV "SAFECUDA_LIBNCCL='%s' '%s' info 2>&1", SAFECUDA_NCCLFAULT_LIB,
                  SAFECUDA_CLI),
             2);
    char want[1200];
    snprintf(want, sizeof want, "NCCL:    2.28.9 (%s)\n", SAFECUDA_NCCLFAULT_LIB);
    CHECK_OUT(want);
    CHECK_RC(runf(ENV "SAFECUDA_LIBNCCL='%s' '%s' info --json 2>/dev/null",
                  SAFECUDA_NCCLFAULT_LIB, SAFECUDA_CLI),
             2);
    snprintf(want, sizeof want, "\"nccl_version\": \"2.28.9\",\n  \"nccl_path\": \"%s\"",
             SAFECUDA_NCCLFAULT_LIB);
    CHECK_OUT(want);
}

/* The one table of exit statuses, in every command's help, and what the statuses are: a
 * bad SAFECUDA_* setting is bad usage (64) everywhere the driver is used, no driver is 2. */
#define EXIT_TABLE                                                                            \
    "exit status (every command):\n"                                                          \
    "  0   done\n"                                                                            \
    "  1   failed: a compile error, an input that can't be read, an output that can't be\n"  \
    "      written, a driver that is installed but not usable\n"                              \
    "  2   nothing to run on: no NVIDIA driver or no device (info; compile and precompile\n"  \
    "      without --arch), or no NVRTC (compile, precompile)\n"                             \
    "  64  bad usage: an unknown command, option or argument, a bad value, or a bad\n"      \
    "      SAFECUDA_* setting (SAFECUDA_DEVICE, SAFECUDA_TESTDEVICE_*)\n"

static void test_exit_statuses(void)
{
    static const char *const helps[] = {"help", "--help", "info --help", "info -h",
                                        "compile --help", "precompile --help"};
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        CHECK_RC(runf(ENV "'%s' %s 2>&1", SAFECUDA_CLI, helps[i]), 0);
        CHECK_OUT(EXIT_TABLE);
    }
    CHECK_RC(runf(ENV "'%s' info --help 2>&1", SAFECUDA_CLI), 0);
    CHECK_OUT("usage: safecuda info [--json]");

    /* A bad setting: 64 with the setting named, for info (text and JSON), compile without
     * --arch and precompile without --arch (both need the driver then). */
    static const struct {
        const char *env, *named;
    } settings[] = {
        {"SAFECUDA_DEVICE=garbage", "SAFECUDA_DEVICE=garbage is not a device safecuda knows"},
        {"SAFECUDA_DEVICE=test SAFECUDA_TESTDEVICE_CC=abc", "SAFECUDA_TESTDEVICE_CC=abc: "},
        {"SAFECUDA_DEVICE=test SAFECUDA_TESTDEVICE_MEMORY_MB=0",
         "SAFECUDA_TESTDEVICE_MEMORY_MB=0: "},
    };
    write_file("k.cu", "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f; }\n");
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
        const char *env = settings[i].env;
        CHECK_RC(runf("SAFECUDA_CACHE=0 %s '%s' info 2>&1", env, SAFECUDA_CLI), 64);
        CHECK_OUT(settings[i].named);
        CHECK_RC(runf("SAFECUDA_CACHE=0 %s '%s' info --json 2>&1", env, SAFECUDA_CLI), 64);
        CHECK_OUT("\"error\": \"SC_ERR_INVALID_ARGUMENT\"");
        CHECK_RC(runf("SAFECUDA_CACHE=0 %s '%s' compile '%s/k.cu' 2>&1", env, SAFECUDA_CLI,
                      dir),
                 64);
        CHECK_OUT(settings[i].named);
        CHECK_NOT_OUT("no CUDA device here");
        CHECK_RC(runf("SAFECUDA_CACHE=0 %s '%s' precompile 2>&1", env, SAFECUDA_CLI), 64);
        CHECK_OUT(settings[i].named);
        CHECK_NOT_OUT("no CUDA device here");
    }
    /* No driver stays 2; a broken driver is 1 (not "no GPU"). */
    CHECK_RC(runf(ENV "'%s' info 2>&1", SAFECUDA_CLI), 2);
}

/* safecuda info says where the disk cache is, and why it is off when it is: on purpose
 * (SAFECUDA_CACHE=0) or a folder that can't be used (every run compiles again). */
static void test_info_cache(void)
{
    const char *no_driver = "SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1";
    CHECK_RC(runf(ENV "'%s' info 2>&1", SAFECUDA_CLI), 2);
    CHECK_OUT("cache:   off: SAFECUDA_CACHE=0\n");
    write_file("not-a-folder", "x\n");
    char want[512];
    CHECK_RC(runf("%s SAFECUDA_CACHE_DIR='%s/not-a-folder/kc' '%s' info 2>&1", no_driver, dir,
                  SAFECUDA_CLI),
             2);
    snprintf(want, sizeof want,
             "cache:   off: SAFECUDA_CACHE_DIR=%s/not-a-folder/kc can't be used: Not a "
             "directory; every program is compiled again on every run\n",
             dir);
    CHECK_OUT(want);
    CHECK_RC(runf("%s SAFECUDA_CACHE_DIR='%s/not-a-folder/kc' '%s' info --json 2>&1", no_driver,
                  dir, SAFECUDA_CLI),
             2);
    CHECK_OUT("\"cache_on\": false");
    snprintf(want, sizeof want, "\"cache_dir\": \"%s/not-a-folder/kc\"", dir);
    CHECK_OUT(want);
    CHECK_OUT("\"cache_problem\": \"SAFECUDA_CACHE_DIR=");
    /* A usable folder, with the test device (the devices' part prints it too). */
    CHECK_RC(runf("SAFECUDA_DEVICE=test SAFECUDA_CACHE_DIR='%s/info-kc' '%s' info 2>&1", dir,
                  SAFECUDA_CLI),
             0);
    snprintf(want, sizeof want, "cache:   %s/info-kc\n", dir);
    CHECK_OUT(want);
    CHECK_RC(runf("SAFECUDA_DEVICE=test SAFECUDA_CACHE_DIR='%s/info-kc' '%s' info --json 2>&1",
                  dir, SAFECUDA_CLI),
             0);
    CHECK_OUT("\"cache_on\": true");
    CHECK_OUT("\"cache_problem\": \"\"");
    /* The help says how to turn it off. */
    CHECK_RC(runf("'%s' info --help 2>&1", SAFECUDA_CLI), 0);
    CHECK_OUT("SAFECUDA_CACHE=0");
}

static void test_usage(void)
{
    CHECK_RC(runf("'%s' frobnicate 2>&1", SAFECUDA_CLI), 64);
    CHECK_OUT("unknown command 'frobnicate'");
    CHECK_RC(runf("'%s' info --bogus 2>&1", SAFECUDA_CLI), 64);
    CHECK_OUT("safecuda info: unknown option '--bogus'");
    CHECK_RC(runf("'%s' version", SAFECUDA_CLI), 0);
    CHECK_OUT("safecuda 0.1.0");

    /* compile --help and -h: the compile usage on stdout, exit 0, anywhere on the line. */
    static const char *const helps[] = {"--help", "-h", "k.cu --arch sm_90 --help"};
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        CHECK_RC(runf(ENV "'%s' compile %s 2>/dev/null", SAFECUDA_CLI, helps[i]), 0);
        CHECK_OUT("usage: safecuda compile FILE.cu");
        CHECK_OUT("--arch");
        CHECK_OUT("compute_XY");
        CHECK_OUT("-I DIR");
        CHECK_OUT("-o FILE");
    }
    /* The general usage points at it. */
    CHECK_RC(runf("'%s' help", SAFECUDA_CLI), 0);
    CHECK_OUT("safecuda compile --help");

    /* Bad usage: exit 64 with what is wrong, before reading the input (which does not
     * exist: that would be exit 1). */
    static const struct {
        const char *args, *says;
    } bad[] = {
        {"", "safecuda compile: no input file (safecuda compile --help shows the options)"},
        {"/nonexistent/k.cu --arch", "safecuda compile: --arch needs a value, e.g. --arch sm_90"},
        {"/nonexistent/k.cu --arch=", "safecuda compile: --arch needs a value, e.g. --arch sm_90"},
        {"/nonexistent/k.cu -arch", "safecuda compile: -arch needs a value, e.g. -arch sm_90"},
        {"/nonexistent/k.cu --gpu-architecture",
         "safecuda compile: --gpu-architecture needs a value, e.g. --gpu-architecture sm_90"},
        {"/nonexistent/k.cu --arch -o x.cubin",
         "safecuda compile: --arch needs a value, e.g. --arch sm_90"},
        {"/nonexistent/k.cu --arch sm_90 -o", "safecuda compile: -o needs a value, e.g. -o "},
        {"/nonexistent/k.cu -o --ptx", "safecuda compile: -o needs a value"},
        {"/nonexistent/k.cu --output-file", "safecuda compile: --output-file needs a value"},
        {"/nonexistent/k.cu --arch sm_90 -I", "safecuda compile: -I needs a value, e.g. -I "},
        {"/nonexistent/k.cu --arch sm_90 --include-path",
         "safecuda compile: --include-path needs a value"},
        {"/nonexistent/k.cu --arch sm_90 -D", "safecuda compile: -D needs a value, e.g. -D "},
        {"/nonexistent/k.cu --arch sm_90 --define-macro",
         "safecuda compile: --define-macro needs a value"},
        {"/nonexistent/k.cu --arch sm_90 -U", "safecuda compile: -U needs a value"},
        {"/nonexistent/k.cu --arch sm_80 --arch sm_90",
         "safecuda compile: --arch given twice ('sm_80' and 'sm_90')"},
        {"/nonexistent/k.cu --arch sm_90 -o a -o b", "safecuda compile: -o given twice ('a' and 'b')"},
        {"/nonexistent/k.cu /nonexistent/j.cu --arch sm_90",
         "safecuda compile: more than one input file ('/nonexistent/k.cu' and '/nonexistent/j.cu')"},
        {"/nonexistent/k.cu -maxrregcount 64 --arch sm_90",
         "NVRTC options take their values as -option=value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = runf(ENV "'%s' compile %s 2>&1", SAFECUDA_CLI, bad[i].args);
        if (rc != 64 || !strstr(out, bad[i].says)) {
            fprintf(stderr, "compile %s: exit %d (want 64), output:\n%s\nwanted: %s\n",
                    bad[i].args, rc, out, bad[i].says);
            test_failures++;
        }
    }
}

static void test_unreadable_input(void)
{
    /* A folder as the source: it opens like a file and its size at SEEK_END is LONG_MAX
     * on ext4, which must not become an allocation (an abort under ASan). */
    CHECK_RC(runf(ENV "'%s' compile '%s' --arch sm_90 2>&1", SAFECUDA_CLI, dir), 1);
    CHECK_OUT("safecuda compile: cannot read");
    CHECK_OUT(dir);
    CHECK_OUT("not a regular file");
    CHECK_NOT_OUT("AddressSanitizer");

    /* A source that does not exist. */
    CHECK_RC(runf(ENV "'%s' compile '%s/nope.cu' --arch sm_90 2>&1", SAFECUDA_CLI, dir), 1);
    CHECK_OUT("safecuda compile: cannot read");
    CHECK_OUT("No such file or directory");

    /* No --arch and no device: say to name the target. */
    write_file("k.cu", "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f; }\n");
    CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' 2>&1", SAFECUDA_CLI, dir), 2);
    CHECK_OUT("no CUDA device here: name the target with --arch (e.g. --arch sm_90)");
    CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch native 2>&1", SAFECUDA_CLI, dir), 2);
    CHECK_OUT("no CUDA device here");
}

/* SAFECUDA_DEVICE=test from a copy of the command elsewhere: where it is not, the message
 * lists every folder looked in (beside the program, its prefix's library folders, the
 * configured libdir, the prefix); then found in <prefix>/lib64, through PATH (argv[0] names
 * no folder), and through a link to the program from another folder. */
static void test_finds_test_device(void)
{
    CHECK_RC(runf("mkdir -p '%s/tree/bin' '%s/links' && cp '%s' '%s/tree/bin/safecuda'", dir, dir,
                  SAFECUDA_CLI, dir),
             0);
    const char *env = "SAFECUDA_DEVICE=test SAFECUDA_CACHE=0 LD_LIBRARY_PATH= ";
    CHECK_RC(runf("%s'%s/tree/bin/safecuda' info 2>&1", env, dir), 2);
    char want[1024];
    snprintf(want, sizeof want,
             "cannot load the safecuda test device (SAFECUDA_DEVICE=test): "
             "libsafecuda_testdevice.so is not in %s/tree/bin, %s/tree/lib, %s/tree/lib64",
             dir, dir, dir);
    CHECK_OUT(want);
    snprintf(want, sizeof want, ", %s/tree, nor found by the dynamic linker", dir);
    CHECK_OUT(want);

    CHECK_RC(runf("mkdir -p '%s/tree/lib64' && cp '%s' '%s/tree/lib64/'", dir,
                  SAFECUDA_TESTDEVICE_LIB, dir),
             0);
    CHECK_RC(runf("%s'%s/tree/bin/safecuda' info 2>&1", env, dir), 0);
    CHECK_OUT("safecuda test device (host memory, runs no kernels)");
    snprintf(want, sizeof want, "(%s/tree/lib64/libsafecuda_testdevice.so)", dir);
    CHECK_OUT(want);
    CHECK_RC(runf("%sPATH='%s/tree/bin':\"$PATH\" safecuda info 2>&1", env, dir), 0);
    CHECK_OUT(want);
    CHECK_RC(runf("ln -s '%s/tree/bin/safecuda' '%s/links/safecuda' && %s'%s/links/safecuda' "
                  "info 2>&1",
                  dir, dir, env, dir),
             0);
    CHECK_OUT(want);
}

static void test_stdout_unwritable(void)
{
    /* What the tool prints is its output: a failed write to stdout is a failure. */
    CHECK_RC(runf("'%s' version 2>&1 >/dev/full", SAFECUDA_CLI), 1);
    CHECK_OUT("safecuda: cannot write the output: No space left on device");
    CHECK_RC(runf("'%s' help 2>&1 >/dev/full", SAFECUDA_CLI), 1);
    CHECK_OUT("cannot write the output");
}

/* safecuda precompile without NVRTC: --help, bad usage (64), no device and no --arch (2),
 * NVRTC missing (2, also past a device), the cache off and no --cache-dir (1). */
static void test_precompile_usage(void)
{
    static const char *const helps[] = {"--help", "-h", "--arch sm_90 --help"};
    for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++) {
        CHECK_RC(runf(ENV "'%s' precompile %s 2>/dev/null", SAFECUDA_CLI, helps[i]), 0);
        CHECK_OUT("usage: safecuda precompile [--arch TARGET] [--cache-dir DIR]");
        CHECK_OUT("--cache-dir DIR");
        CHECK_OUT("sm_XYa       the same as sm_XY");
        CHECK_OUT("exit status (every command):");
    }
    CHECK_RC(runf("'%s' help", SAFECUDA_CLI), 0);
    CHECK_OUT("precompile [--arch TARGET] [--cache-dir DIR]");
    CHECK_OUT("safecuda precompile --help");

    static const struct {
        const char *args, *says;
    } bad[] = {
        {"--arch", "safecuda precompile: --arch needs a value, e.g. --arch sm_90a"},
        {"--arch=", "safecuda precompile: --arch needs a value, e.g. --arch sm_90a"},
        {"--arch --cache-dir d", "safecuda precompile: --arch needs a value"},
        {"--cache-dir", "safecuda precompile: --cache-dir needs a value, e.g. --cache-dir "},
        {"--arch sm_90 --cache-dir=", "safecuda precompile: --cache-dir needs a value"},
        {"--arch sm_80 --arch sm_90",
         "safecuda precompile: --arch given twice ('sm_80' and 'sm_90')"},
        {"--cache-dir a --cache-dir=b",
         "safecuda precompile: --cache-dir given twice ('a' and 'b')"},
        {"--bogus", "safecuda precompile: unknown argument '--bogus' (safecuda precompile "
                    "--help shows the options)"},
        {"--arch sm_90 kernels", "safecuda precompile: unknown argument 'kernels'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = runf(ENV "'%s' precompile %s 2>&1", SAFECUDA_CLI, bad[i].args);
        if (rc != 64 || !strstr(out, bad[i].says)) {
            fprintf(stderr, "precompile %s: exit %d (want 64), output:\n%s\nwanted: %s\n",
                    bad[i].args, rc, out, bad[i].says);
            test_failures++;
        }
    }
    /* No device (no driver here) and no --arch, or native: exit 2 with the reason. */
    static const char *const no_arch[] = {"", "--arch native", "--cache-dir x"};
    for (size_t i = 0; i < sizeof no_arch / sizeof no_arch[0]; i++) {
        CHECK_RC(runf(ENV "'%s' precompile %s 2>&1", SAFECUDA_CLI, no_arch[i]), 2);
        CHECK_OUT("safecuda precompile: no CUDA device here (");
        CHECK_OUT("cannot load the CUDA driver library");
        CHECK_OUT("): name the target with --arch (e.g. --arch sm_90a)");
    }
    /* The cache off and no --cache-dir: nothing to fill (said before NVRTC is needed). */
    CHECK_RC(runf(ENV "'%s' precompile --arch sm_90 2>&1", SAFECUDA_CLI), 1);
    CHECK_OUT("sc_kernels_precompile: desc->cache_dir is NULL and the disk cache is off "
              "(SAFECUDA_CACHE=0): name the folder in desc->cache_dir");
    /* NVRTC missing: exit 2 and what was tried; nothing made. With the test device and no
     * --arch too (past the device: its context is made, then NVRTC is missing). */
    CHECK_RC(runf(ENV "SAFECUDA_NVRTC=/nonexistent/libnvrtc.so '%s' precompile --arch sm_90 "
                      "--cache-dir '%s/no-nvrtc' 2>&1",
                  SAFECUDA_CLI, dir),
             2);
    CHECK_OUT("sc_kernels_precompile: cannot load NVRTC from SAFECUDA_NVRTC=/nonexistent/"
              "libnvrtc.so");
    CHECK(!exists("no-nvrtc"));
    CHECK_RC(runf("SAFECUDA_LIBCUDA='" SAFECUDA_TESTDEVICE_LIB "' SAFECUDA_CACHE=0 "
                  "SAFECUDA_NVRTC=/nonexistent/libnvrtc.so '%s' precompile --cache-dir "
                  "'%s/no-nvrtc' 2>&1",
                  SAFECUDA_CLI, dir),
             2);
    CHECK_OUT("sc_kernels_precompile: cannot load NVRTC from SAFECUDA_NVRTC=");
    CHECK_NOT_OUT("no CUDA device here");
}

/* ---- with NVRTC ------------------------------------------------------------------------- */

static void test_info_nvrtc(const char *version)
{
    char want[64];
    snprintf(want, sizeof want, "NVRTC:   %s (", version);
    CHECK_RC(runf(ENV "'%s' info 2>&1", SAFECUDA_CLI), 2);
    CHECK_OUT(want);
    CHECK_OUT("libnvrtc");
    CHECK_OUT("cannot load the CUDA driver library");
    snprintf(want, sizeof want, "\"nvrtc_version\": \"%s\"", version);
    CHECK_RC(runf(ENV "'%s' info --json 2>/dev/null", SAFECUDA_CLI), 2);
    CHECK_OUT(want);
    CHECK_OUT("\"nvrtc_path\": \"");
    CHECK_OUT("libnvrtc");
    CHECK_OUT("\"error\": \"SC_ERR_NO_DRIVER\"");
    CHECK_NOT_OUT("nvrtc_error");
}

static void test_moe_sm90a(void)
{
    /* The project's own sm_90a kernels: they build for sm_90a, and the message of a build for
     * sm_90 names the instruction that needs sm_90a. */
    const char *src = SAFECUDA_SOURCE_DIR "/kernels";
    CHECK_RC(runf(ENV "'%s' compile '%s/moe/moe_sm90a.cu' --arch sm_90a -I '%s' 2>&1",
                  SAFECUDA_CLI, src, src),
             0);
    CHECK_OUT("moe_sm90a.cu: cubin for sm_90a, ");
    CHECK_RC(runf(ENV "'%s' compile '%s/moe/moe_sm90a.cu' --arch sm_90 -I '%s' 2>&1",
                  SAFECUDA_CLI, src, src),
             1);
    CHECK_OUT("'moe_sm90a.cu' failed to compile for sm_90:");
    CHECK_OUT("wgmma");
    CHECK_OUT("not supported on .target 'sm_90'");
}

static void test_include_and_define(void)
{
    char sub[256];
    snprintf(sub, sizeof sub, "%s/inc", dir);
    REQUIRE(mkdir(sub, 0700) == 0 || errno == EEXIST);
    write_file("inc/width.cuh", "#define HEADER_WIDTH 4\n");
    write_file("needs.cu", "#include \"width.cuh\"\n"
                           "#ifndef WIDTH\n#error WIDTH is not defined\n#endif\n"
                           "extern \"C\" __global__ void w(float *x) { x[0] = WIDTH * "
                           "HEADER_WIDTH; }\n");
    static const char *const forms[] = {
        "-I '%s/inc' -D WIDTH=2",
        "'-I%s/inc' -DWIDTH=2",
        "--include-path '%s/inc' --define-macro WIDTH=2",
        "'--include-path=%s/inc' --define-macro=WIDTH=2",
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        char opts[512];
        snprintf(opts, sizeof opts, forms[i], dir);
        int rc = runf(ENV "'%s' compile '%s/needs.cu' --arch sm_80 %s 2>&1", SAFECUDA_CLI, dir,
                      opts);
        if (rc != 0 || !strstr(out, "cubin for sm_80")) {
            fprintf(stderr, "compile needs.cu %s: exit %d (want 0), output:\n%s\n", opts, rc,
                    out);
            test_failures++;
        }
    }
    /* Without them the compile fails on the missing header; -U takes a definition back. */
    CHECK_RC(runf(ENV "'%s' compile '%s/needs.cu' --arch sm_80 -DWIDTH=2 2>&1", SAFECUDA_CLI,
                  dir),
             1);
    CHECK_OUT("width.cuh");
    CHECK_RC(runf(ENV "'%s' compile '%s/needs.cu' --arch sm_80 -I '%s/inc' -D WIDTH -U WIDTH "
                      "2>&1",
                  SAFECUDA_CLI, dir, dir),
             1);
    CHECK_OUT("WIDTH is not defined");

    /* Options the tool does not know go to NVRTC as they are; NVRTC's error is shown. */
    CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch sm_80 -lineinfo --use_fast_math 2>&1",
                  SAFECUDA_CLI, dir),
             0);
    CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch sm_80 --not-an-option 2>&1", SAFECUDA_CLI,
                  dir),
             1);
    CHECK_OUT("--not-an-option");
}

static void test_unwritable_output(void)
{
    /* A device that is full: small PTX fits in stdio's buffer, so the failure shows only at
     * fflush/fclose; a cubin fails in fwrite. Both: exit 1, the reason, no "wrote". */
    static const char *const archs[] = {"compute_80", "sm_90"};
    for (size_t i = 0; i < 2; i++) {
        CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch %s -o /dev/full 2>&1", SAFECUDA_CLI,
                      dir, archs[i]),
                 1);
        CHECK_OUT("safecuda compile: cannot write '/dev/full': No space left on device");
        CHECK_NOT_OUT("wrote");
    }
    /* A folder that does not exist. */
    CHECK_RC(runf(ENV "'%s' compile '%s/k.cu' --arch sm_90 -o '%s/no/such/k.cubin' 2>&1",
                  SAFECUDA_CLI, dir, dir),
             1);
    CHECK_OUT("cannot write");
    CHECK_OUT("/no/such/k.cubin': No such file or directory");
    CHECK_NOT_OUT("wrote");
    /* A regular file cut short (the file size limit; SIGXFSZ ignored so that the write
     * fails instead of killing the tool): the partial file is removed. */
    CHECK_RC(runf("trap '' XFSZ; ulimit -f 1; " ENV
                  "'%s' compile '%s/k.cu' --arch sm_90 -o '%s/cut.cubin' 2>&1",
                  SAFECUDA_CLI, dir, dir),
             1);
    CHECK_OUT("/cut.cubin': File too large");
    CHECK_NOT_OUT("wrote");
    CHECK(!exists("cut.cubin"));
}

/* safecuda precompile with NVRTC: a folder that can't be made (1); the built-in kernels
 * for sm_80 (the sm_90a file skipped), one line per file and the summary, then the same
 * again from SAFECUDA_CACHE_DIR (no --cache-dir; 80 spelled): all from the cache. */
static void test_precompile(void)
{
    write_file("a-file", "not a folder\n");
    CHECK_RC(runf(ENV "'%s' precompile --arch sm_80 --cache-dir '%s/a-file/kc' 2>&1",
                  SAFECUDA_CLI, dir),
             1);
    CHECK_OUT("sc_kernels_precompile: cannot create the cache folder '");
    CHECK_OUT("a-file/kc': Not a directory");

    CHECK_RC(runf(ENV "'%s' precompile --arch sm_80 --cache-dir '%s/kc' 2>&1", SAFECUDA_CLI,
                  dir),
             0);
    CHECK_OUT("moe/ep.cu: cubin for sm_80, ");
    CHECK_OUT("moe/moe.cu: cubin for sm_80, ");
    CHECK_OUT(" bytes, compiled in ");
    CHECK_OUT("moe/moe_sm90a.cu: skipped (for sm_90a only: the library does not use it on "
              "sm_80)\n");
    CHECK_OUT("quant/fp8_quant.cu: cubin for sm_80, ");
    CHECK_OUT("util/elementwise.cu: cubin for sm_80, ");
    char summary[512];
    snprintf(summary, sizeof summary,
             "precompile: 5 files for sm_80 into %s/kc: 4 compiled, 0 from the cache, 1 "
             "skipped; ",
             dir);
    CHECK_OUT(summary);
    /* One line per file, in order, then the summary. */
    const char *e = strstr(out, "moe/ep.cu:");
    const char *a = strstr(out, "moe/moe.cu:"), *b = strstr(out, "moe/moe_sm90a.cu:");
    const char *c = strstr(out, "util/elementwise.cu:"), *d = strstr(out, "precompile: 5");
    CHECK(e && a && b && c && d && e < a && a < b && b < c && c < d);
    char kc[300];
    snprintf(kc, sizeof kc, "%s/kc", dir);
    CHECK_RC(runf("ls '%s' | wc -l", kc), 0);
    CHECK(atoi(out) == 4);

    CHECK_RC(runf("SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1 SAFECUDA_CACHE_DIR='%s' '%s' "
                  "precompile --arch=80 2>&1",
                  kc, SAFECUDA_CLI),
             0);
    CHECK_OUT("moe/moe.cu: cubin for sm_80, ");
    CHECK_OUT(" bytes, from the cache in ");
    CHECK_NOT_OUT("compiled in");
    CHECK_OUT(": 0 compiled, 4 from the cache, 1 skipped; ");
    CHECK_RC(runf("ls '%s' | wc -l", kc), 0);
    CHECK(atoi(out) == 4);
}

static void test_with_a_device(void)
{
    /* The test device (host bookkeeping only, no GPU claim: it reports one sm_90 device and
     * loads PTX, not cubins). A target other than the device's is built and not loaded:
     * its image would not load there; the device's own target gets the kernel table. */
    const char *env = "SAFECUDA_LIBCUDA='" SAFECUDA_TESTDEVICE_LIB "' SAFECUDA_CACHE=0 ";
    CHECK_RC(runf("%s'%s' compile '%s/k.cu' --arch sm_80 2>&1", env, SAFECUDA_CLI, dir), 0);
    CHECK_OUT("cubin for sm_80");
    CHECK_NOT_OUT("loading the module failed");
    CHECK_NOT_OUT("regs");
    CHECK_RC(runf("%s'%s' compile '%s/k.cu' --arch compute_90 2>&1", env, SAFECUDA_CLI, dir), 0);
    CHECK_OUT("PTX for compute_90");
    CHECK_OUT("regs");
}

static void test_huge_log(void)
{
    /* A log far longer than the error message: the message is cut with a marker and says
     * the log's length; the whole log still reaches stderr through the log. */
    enum { WARNINGS = 3000 };
    size_t size = 64 + WARNINGS * 32 + 128, len = 0;
    char *src = malloc(size);
    REQUIRE(src != NULL);
    len += (size_t)snprintf(src + len, size - len, "extern \"C\" __global__ void k(float *x)\n{\n");
    for (int i = 0; i < WARNINGS; i++)
        len += (size_t)snprintf(src + len, size - len, "    int unused_%d;\n", i);
    snprintf(src + len, size - len, "    x[0] = not_declared_at_the_end;\n}\n");
    write_file("huge.cu", src);
    free(src);
    CHECK_RC(runf(ENV "'%s' compile '%s/huge.cu' --arch sm_80 2>&1", SAFECUDA_CLI, dir), 1);
    CHECK_OUT("'huge.cu' failed to compile for sm_80: huge.cu(3003): error");
    CHECK_OUT("bytes; too long for this message: the whole log went to the log callback) ---");
    CHECK_OUT("... [message cut: ");
    CHECK_OUT("variable \"unused_2999\""); /* from the whole log */
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    signal(SIGPIPE, SIG_IGN);
    test_info_without_driver();
    test_usage();
    test_info_cache();
    test_exit_statuses();
    test_unreadable_input();
    test_finds_test_device();
    test_stdout_unwritable();
    test_precompile_usage();

    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("skipped the checks that compile: %s\n", sc_last_error());
    } else {
        char version[32];
        snprintf(version, sizeof version, "%d.%d", major, minor);
        test_info_nvrtc(version);
        test_moe_sm90a();
        test_include_and_define();
        test_unwritable_output();
        test_huge_log();
        test_with_a_device();
        test_precompile();
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", dir);
    return test_result("test_cli");
}
