/* safecuda precompile: the library's built-in kernels into the disk cache ahead of time
 * (sc_kernels_precompile), one line per file and a summary. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool.h"

static void precompile_usage(FILE *f)
{
    fprintf(f,
            "usage: safecuda precompile [--arch TARGET] [--cache-dir DIR]\n"
            "\n"
            "Compiles every built-in kernel of the library (the MoE layer's and the\n"
            "element-wise ones) into the disk cache, exactly as the library compiles them on\n"
            "a device of TARGET, so that their first use there loads them from the cache\n"
            "instead of waiting for NVRTC. Needs NVRTC, not a GPU. The cache's keys depend on\n"
            "the NVRTC version and the kernels' sources only: a folder filled here serves a\n"
            "GPU machine with the same NVRTC version (point SAFECUDA_CACHE_DIR at it there).\n"
            "\n"
            "  --arch TARGET      the device's architecture:\n"
            "        sm_XY, XY    e.g. sm_90 (the library builds the *_sm90a.cu files for\n"
            "                     sm_90a there and the others for sm_90) or sm_80 (the\n"
            "                     *_sm90a.cu files are skipped)\n"
            "        sm_XYa       the same as sm_XY (sm_90 and newer have this form)\n"
            "        native       the device here (the default when there is one; with\n"
            "                     SAFECUDA_DEVICE=test, PTX images as the test device loads)\n"
            "        Without a device, --arch is required.\n"
            "  --cache-dir DIR    the folder to fill (created if needed); default the\n"
            "                     library's cache folder: $SAFECUDA_CACHE_DIR, else\n"
            "                     $XDG_CACHE_HOME/safecuda, else ~/.cache/safecuda\n"
            "  -h, --help         show this text\n"
            "\n");
    print_exit_statuses(f);
}

static void print_file(const sc_precompile_file *f, void *user)
{
    (void)user;
    if (f->skipped)
        printf("%s: skipped (for sm_90a only: the library does not use it on sm_%d)\n",
               f->name, f->arch);
    else
        printf("%s: %s for %s_%d%s, %llu bytes, %s in %.1f ms\n", f->name,
               f->is_ptx ? "PTX" : "cubin", f->is_ptx ? "compute" : "sm", f->arch,
               f->arch_specific ? "a" : "", (unsigned long long)f->image_bytes,
               f->from_cache ? "from the cache" : "compiled", f->ms);
    fflush(stdout);
}

/* An option's value: "--name VALUE" or "--name=VALUE". 1: argv[*i] is the option (*value
 * set, *i past a separate value); 0: it is not; -1: the value is missing (said). */
static int option_value(int argc, char **argv, int *i, const char *name, const char *example,
                        const char **value)
{
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || (arg[n] != '\0' && arg[n] != '='))
        return 0;
    const char *v = NULL;
    if (arg[n] == '=')
        v = arg + n + 1;
    else if (*i + 1 < argc && argv[*i + 1][0] != '-')
        v = argv[++*i];
    if (!v || !*v) {
        fprintf(stderr, "safecuda precompile: %s needs a value, e.g. %s %s\n", name, name,
                example);
        return -1;
    }
    *value = v;
    return 1;
}

int cmd_precompile(int argc, char **argv)
{
    const char *arch_text = NULL, *cache_dir = NULL;
    target t = {0};
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            precompile_usage(stdout);
            return 0;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        int r = option_value(argc, argv, &i, "--arch", "sm_90a", &v);
        if (r < 0)
            return EXIT_USAGE;
        if (r > 0) {
            if (arch_text) {
                fprintf(stderr, "safecuda precompile: --arch given twice ('%s' and '%s')\n",
                        arch_text, v);
                return EXIT_USAGE;
            }
            arch_text = v;
            continue;
        }
        r = option_value(argc, argv, &i, "--cache-dir", "kcache", &v);
        if (r < 0)
            return EXIT_USAGE;
        if (r > 0) {
            if (cache_dir) {
                fprintf(stderr,
                        "safecuda precompile: --cache-dir given twice ('%s' and '%s')\n",
                        cache_dir, v);
                return EXIT_USAGE;
            }
            cache_dir = v;
            continue;
        }
        fprintf(stderr,
                "safecuda precompile: unknown argument '%s' (safecuda precompile --help shows "
                "the options)\n",
                argv[i]);
        return EXIT_USAGE;
    }

    if (arch_text && !target_parse("precompile", "--arch", arch_text, TARGET_DEVICE, false, &t))
        return EXIT_USAGE;

    /* Without --arch (or with native): the device here, through a context on it. */
    sc_context ctx = {0};
    if (t.arch == 0) {
        int count = 0;
        sc_status s = sc_device_count(&count);
        if (s == SC_ERR_INVALID_ARGUMENT) { /* a bad SAFECUDA_* setting */
            fprintf(stderr, "safecuda precompile: %s\n", sc_last_error());
            return EXIT_USAGE;
        }
        if (s != SC_OK || count == 0) {
            fprintf(stderr,
                    "safecuda precompile: no CUDA device here (%s): name the target with "
                    "--arch (e.g. --arch sm_90a)\n",
                    s != SC_OK ? sc_last_error() : "the driver sees none");
            return EXIT_NO_GPU;
        }
        if (sc_context_create(NULL, &ctx) != SC_OK) {
            fprintf(stderr, "safecuda precompile: %s\n", sc_last_error());
            return EXIT_NO_GPU;
        }
    }
    sc_precompile_report report;
    sc_status s = sc_kernels_precompile(&(sc_precompile_desc){.arch = t.arch,
                                                              .ctx = ctx,
                                                              .cache_dir = cache_dir,
                                                              .on_file = print_file},
                                        &report);
    if (ctx.id)
        sc_context_destroy(ctx);
    if (s != SC_OK) {
        fflush(stdout);
        fprintf(stderr, "%s\n", sc_last_error());
        if (report.failed_file)
            fprintf(stderr, "safecuda precompile: stopped at %s (%zu files done before it)\n",
                    report.failed_file, report.compiled + report.cache_hits + report.skipped);
        return s == SC_ERR_NO_COMPILER ? EXIT_NO_GPU : 1;
    }
    printf("precompile: %zu files for %s_%d into %s: %zu compiled, %zu from the cache, %zu "
           "skipped; %llu bytes in %.1f s\n",
           report.files, report.is_ptx ? "compute" : "sm", report.arch, report.cache_dir,
           report.compiled, report.cache_hits, report.skipped,
           (unsigned long long)report.bytes, report.ms / 1e3);
    return 0;
}
