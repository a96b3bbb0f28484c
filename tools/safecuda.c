/* safecuda: the command-line tool.
 *
 *   safecuda info [--json]   safecuda's version, NVRTC and NCCL (with or without a driver),
 *                            the driver and every device's properties
 *   safecuda compile FILE.cu [--arch TARGET] [--ptx] [-o OUT] [-I DIR] [-D NAME[=V]]
 *                            [-U NAME] [NVRTC options...]
 *                            compile as the library does; TARGET is sm_XY, sm_XYa
 *                            (architecture-specific), compute_XY or compute_XYa (PTX), XY or
 *                            native; nvcc's spellings of the options work (--arch=sm_90,
 *                            -arch sm_90, --gpu-architecture, -Idir, --include-path,
 *                            --define-macro, --output-file); other options go to NVRTC as
 *                            they are. `safecuda compile --help` says more.
 *   safecuda precompile [--arch TARGET] [--cache-dir DIR]
 *                            compile the library's built-in kernels into the disk cache
 *                            ahead of time, as the library compiles them on a device of
 *                            TARGET (sm_XY, sm_XYa, XY or native); tools/precompile.c
 *   safecuda version
 *
 * Exit status: one table for every command (print_exit_statuses): 0 done, 1 failed (also
 * output that cannot be written, a driver that is there but broken), 2 nothing to run on
 * (no driver or device; no NVRTC for compile and precompile), 64 bad usage (also a bad
 * SAFECUDA_* setting, SC_ERR_INVALID_ARGUMENT from the driver's loading). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safecuda/comm.h"
#include "tool.h"

void print_exit_statuses(FILE *f)
{
    fprintf(f,
            "exit status (every command):\n"
            "  0   done\n"
            "  1   failed: a compile error, an input that can't be read, an output that can't be\n"
            "      written, a driver that is installed but not usable\n"
            "  2   nothing to run on: no NVIDIA driver or no device (info; compile and precompile\n"
            "      without --arch), or no NVRTC (compile, precompile)\n"
            "  64  bad usage: an unknown command, option or argument, a bad value, or a bad\n"
            "      SAFECUDA_* setting (SAFECUDA_DEVICE, SAFECUDA_TESTDEVICE_*)\n");
}

int driver_exit(sc_status s)
{
    if (s == SC_OK)
        return 0;
    if (s == SC_ERR_NO_DRIVER || s == SC_ERR_NO_DEVICE || s == SC_ERR_NO_COMPILER)
        return EXIT_NO_GPU;
    return s == SC_ERR_INVALID_ARGUMENT ? EXIT_USAGE : 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: safecuda <command> [options]\n"
            "\n"
            "commands:\n"
            "  info [--json]   show NVRTC, the driver and every device's properties\n"
            "                  (safecuda info --help says more)\n"
            "  compile FILE.cu [--arch TARGET] [--ptx] [-o OUT] [-I DIR] [-D NAME[=V]]\n"
            "                  [NVRTC options...]\n"
            "                  compile with NVRTC as the library does (same options and\n"
            "                  disk cache); print the log and, when a device is present,\n"
            "                  registers and shared memory per kernel\n"
            "                  (safecuda compile --help shows the options)\n"
            "  precompile [--arch TARGET] [--cache-dir DIR]\n"
            "                  compile the library's built-in kernels into the disk cache\n"
            "                  ahead of time, as the library compiles them on a device of\n"
            "                  TARGET (sm_90a, sm_90, sm_80, ...), so that their first use\n"
            "                  there never waits for NVRTC\n"
            "                  (safecuda precompile --help shows the options)\n"
            "  version         show safecuda's version\n"
            "  help            show this text\n"
            "\n");
    print_exit_statuses(f);
}

static void info_usage(FILE *f)
{
    fprintf(f,
            "usage: safecuda info [--json]\n"
            "\n"
            "Shows safecuda's version, NVRTC (the compiler needs no GPU), NCCL (for\n"
            "communicators; where it was found, or why not), the disk cache of compiled\n"
            "kernels, the driver and every device's properties. Without a driver or a device\n"
            "it says why, still shows NVRTC, NCCL and the cache, and exits 2.\n"
            "SAFECUDA_DEVICE=test shows the test device instead of a GPU.\n"
            "\n"
            "The cache is $SAFECUDA_CACHE_DIR, else $XDG_CACHE_HOME/safecuda, else\n"
            "~/.cache/safecuda; a folder that can't be used turns it off (said here and once\n"
            "through the library's log), and SAFECUDA_CACHE=0 turns it off on purpose.\n"
            "\n"
            "  --json      the same as one JSON object (\"error\" and \"message\" say why\n"
            "              where there is no driver or device)\n"
            "  -h, --help  show this text\n"
            "\n");
    print_exit_statuses(f);
}

static void compile_usage(FILE *f)
{
    fprintf(f,
            "usage: safecuda compile FILE.cu [options] [NVRTC options...]\n"
            "\n"
            "Compiles FILE.cu with NVRTC as the library does (-std=c++17 -default-device, the\n"
            "same disk cache), prints the log and what was built; with a device and no --arch,\n"
            "also each kernel's registers and shared memory. #include \"...\" finds files beside\n"
            "FILE.cu. Options take their value as the next argument or after '='.\n"
            "\n"
            "  --arch TARGET, -arch TARGET, --gpu-architecture TARGET\n"
            "        sm_XY        cubin for sm_XY (e.g. sm_90); XY alone (90) is the same\n"
            "        sm_XYa       cubin with sm_XY's architecture-specific features (sm_90a:\n"
            "                     wgmma, setmaxnreg); it runs on that architecture only;\n"
            "                     sm_90 and newer have this form\n"
            "        compute_XY, compute_XYa\n"
            "                     PTX for that virtual architecture\n"
            "        native       the device here (the default when there is one)\n"
            "        Without a device, --arch is required. A cubin is built for what this\n"
            "        NVRTC builds only (a refusal lists it); for another architecture, --ptx\n"
            "        or compute_XY gives PTX for the newest one it builds below it.\n"
            "  --ptx, -ptx        PTX instead of a cubin (compute_XY for sm_XY)\n"
            "  -o FILE, --output-file FILE\n"
            "                     write the image to FILE (a cubin, or PTX as text)\n"
            "  -I DIR, -IDIR, --include-path DIR\n"
            "                     add DIR to the #include search\n"
            "  -D NAME[=VALUE], -DNAME[=VALUE], --define-macro NAME[=VALUE]\n"
            "                     define a macro\n"
            "  -U NAME, -UNAME, --undefine-macro NAME\n"
            "                     undefine a macro\n"
            "  -h, --help         show this text\n"
            "\n"
            "Other options starting with '-' go to NVRTC as they are, in NVRTC's form\n"
            "(-lineinfo, --use_fast_math, -maxrregcount=64, ...).\n"
            "\n"
            "\n");
    print_exit_statuses(f);
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static double gib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }

/* NVRTC works without a driver or a device: info reports it either way. */
typedef struct nvrtc_info {
    bool ok;
    int major, minor;
    char path[1024];
    char error[8192];
} nvrtc_info;

static void nvrtc_query(nvrtc_info *nv)
{
    memset(nv, 0, sizeof *nv);
    nv->ok = sc_compiler_version(&nv->major, &nv->minor) == SC_OK &&
             sc_compiler_path(nv->path, sizeof nv->path) == SC_OK;
    if (!nv->ok)
        snprintf(nv->error, sizeof nv->error, "%s", sc_last_error());
}

static void nvrtc_json(const nvrtc_info *nv)
{
    if (nv->ok) {
        printf(",\n  \"nvrtc_version\": \"%d.%d\",\n  \"nvrtc_path\": ", nv->major, nv->minor);
        json_string(nv->path);
    } else {
        printf(",\n  \"nvrtc_version\": null,\n  \"nvrtc_error\": ");
        json_string(nv->error);
    }
}

static void nvrtc_text(const nvrtc_info *nv)
{
    if (nv->ok)
        printf("NVRTC:   %d.%d (%s)\n", nv->major, nv->minor, nv->path);
    else
        printf("NVRTC:   not available (%s)\n", nv->error);
}

/* NCCL (for communicators; needs no driver): its version and path, or why it is not
 * loaded. Never a reason to fail: most programs need no NCCL. */
typedef struct nccl_info {
    bool ok;
    char version[32];
    char path[1024];
    char error[8192];
} nccl_info;

static void nccl_query(nccl_info *nc)
{
    memset(nc, 0, sizeof *nc);
    int v = 0;
    nc->ok = sc_comm_library_version(&v) == SC_OK &&
             sc_comm_library_path(nc->path, sizeof nc->path) == SC_OK;
    if (nc->ok)
        snprintf(nc->version, sizeof nc->version, "%d.%d.%d", v / 10000, (v / 100) % 100,
                 v % 100);
    else
        snprintf(nc->error, sizeof nc->error, "%s", sc_last_error());
}

static void nccl_json(const nccl_info *nc)
{
    if (nc->ok) {
        printf(",\n  \"nccl_version\": \"%s\",\n  \"nccl_path\": ", nc->version);
        json_string(nc->path);
    } else {
        printf(",\n  \"nccl_version\": null,\n  \"nccl_error\": ");
        json_string(nc->error);
    }
}

static void nccl_text(const nccl_info *nc)
{
    if (nc->ok)
        printf("NCCL:    %s (%s)\n", nc->version, nc->path);
    else
        printf("NCCL:    not available (%s)\n", nc->error);
}

/* The disk cache: its folder, or why it is off. */
static void cache_json(void)
{
    sc_cache_props c;
    sc_cache_info(&c);
    printf(",\n  \"cache_on\": %s,\n  \"cache_dir\": ", c.on ? "true" : "false");
    json_string(c.dir);
    printf(",\n  \"cache_problem\": ");
    json_string(c.problem);
}

static void cache_text(void)
{
    sc_cache_props c;
    sc_cache_info(&c);
    if (c.on)
        printf("cache:   %s\n", c.dir);
    else if (strncmp(c.problem, "off: ", 5) == 0) /* on purpose */
        printf("cache:   %s\n", c.problem);
    else
        printf("cache:   off: %s; every program is compiled again on every run\n", c.problem);
}

static int cmd_info(int argc, char **argv)
{
    bool json = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            info_usage(stdout);
            return 0;
        }
    }
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else {
            fprintf(stderr, "safecuda info: unknown option '%s'\n", argv[i]);
            return EXIT_USAGE;
        }
    }
    nvrtc_info nv;
    nvrtc_query(&nv);
    static nccl_info nc;
    nccl_query(&nc);
    int driver = 0, count = 0;
    char path[1024] = "";
    sc_status s = sc_driver_version(&driver);
    const bool have_driver = s == SC_OK;
    if (have_driver) {
        sc_driver_path(path, sizeof path);
        s = sc_device_count(&count);
    }
    if (s != SC_OK) {
        /* No driver (or no device): say why, and still what NVRTC is. */
        static char reason[16384];
        snprintf(reason, sizeof reason, "%s", sc_last_error());
        if (json) {
            printf("{\n  \"safecuda\": ");
            json_string(sc_version_string());
            printf(",\n  \"error\": ");
            json_string(sc_status_name(s));
            printf(",\n  \"message\": ");
            json_string(reason);
            if (have_driver) {
                printf(",\n  \"driver_cuda_version\": \"%d.%d\",\n  \"driver_path\": ",
                       driver / 1000, (driver % 1000) / 10);
                json_string(path);
            }
            nvrtc_json(&nv);
            nccl_json(&nc);
            cache_json();
            printf("\n}\n");
        } else {
            printf("safecuda %s\n", sc_version_string());
            if (have_driver)
                printf("driver:  CUDA %d.%d (%s)\n", driver / 1000, (driver % 1000) / 10, path);
            else
                printf("driver:  not available (the reason follows)\n");
            nvrtc_text(&nv);
            nccl_text(&nc);
            cache_text();
        }
        fflush(stdout);
        fprintf(stderr, "safecuda info: %s\n", reason);
        return driver_exit(s);
    }

    if (json) {
        printf("{\n  \"safecuda\": ");
        json_string(sc_version_string());
        printf(",\n  \"driver_cuda_version\": \"%d.%d\",\n  \"driver_path\": ", driver / 1000,
               (driver % 1000) / 10);
        json_string(path);
        nvrtc_json(&nv);
        nccl_json(&nc);
        cache_json();
        printf(",\n  \"devices\": [");
    } else {
        printf("safecuda %s\n", sc_version_string());
        printf("driver:  CUDA %d.%d (%s)\n", driver / 1000, (driver % 1000) / 10, path);
        nvrtc_text(&nv);
        nccl_text(&nc);
        cache_text();
        printf("devices: %d\n", count);
    }

    int failures = 0;
    for (int d = 0; d < count; d++) {
        sc_device_props p;
        uint64_t free_b = 0, total_b = 0;
        s = sc_device_info(d, &p);
        if (s == SC_OK)
            s = sc_device_memory(d, &free_b, &total_b);
        if (s != SC_OK) {
            fprintf(stderr, "safecuda info: device %d: %s\n", d, sc_last_error());
            failures++;
            continue;
        }
        if (json) {
            printf("%s\n    {\"ordinal\": %d, \"name\": ", d ? "," : "", d);
            json_string(p.name);
            printf(", \"uuid\": \"%s\", \"pci_bus_id\": \"%s\",\n", p.uuid, p.pci_bus_id);
            printf("     \"compute_capability\": \"%d.%d\", \"sm_count\": %d,\n", p.cc_major,
                   p.cc_minor, p.sm_count);
            printf("     \"total_memory\": %llu, \"free_memory\": %llu, \"used_memory\": %llu,\n",
                   (unsigned long long)total_b, (unsigned long long)free_b,
                   (unsigned long long)(total_b - free_b));
            printf("     \"l2_cache_bytes\": %d, \"shared_per_block\": %d, "
                   "\"shared_per_block_optin\": %d, \"shared_per_sm\": %d,\n",
                   p.l2_cache_bytes, p.shared_per_block, p.shared_per_block_optin,
                   p.shared_per_sm);
            printf("     \"max_threads_per_block\": %d, \"max_threads_per_sm\": %d, "
                   "\"registers_per_sm\": %d, \"clock_khz\": %d,\n",
                   p.max_threads_per_block, p.max_threads_per_sm, p.registers_per_sm,
                   p.clock_khz);
            printf("     \"memory_clock_khz\": %d, \"memory_bus_width_bits\": %d, "
                   "\"memory_bandwidth_gbs\": %.1f, \"ecc\": %s}",
                   p.memory_clock_khz, p.memory_bus_width_bits, p.memory_bandwidth_gbs,
                   p.ecc_enabled ? "true" : "false");
        } else {
            printf("\ndevice %d: %s\n", d, p.name);
            printf("  uuid                 %s\n", p.uuid);
            printf("  pci bus id           %s\n", p.pci_bus_id);
            printf("  compute capability   %d.%d (sm_%d%d)\n", p.cc_major, p.cc_minor,
                   p.cc_major, p.cc_minor);
            printf("  multiprocessors      %d\n", p.sm_count);
            printf("  memory               %.2f GiB total, %.2f GiB free (%llu total, %llu free "
                   "bytes)\n",
                   gib(total_b), gib(free_b), (unsigned long long)total_b,
                   (unsigned long long)free_b);
            printf("  memory bus           %d bits at %d MHz: %.1f GB/s theoretical\n",
                   p.memory_bus_width_bits, p.memory_clock_khz / 1000, p.memory_bandwidth_gbs);
            printf("  L2 cache             %d KiB\n", p.l2_cache_bytes / 1024);
            printf("  shared memory        %d KiB/block (%d KiB opt-in), %d KiB/SM\n",
                   p.shared_per_block / 1024, p.shared_per_block_optin / 1024,
                   p.shared_per_sm / 1024);
            printf("  threads              %d/block, %d/SM, warp %d\n", p.max_threads_per_block,
                   p.max_threads_per_sm, p.warp_size);
            printf("  registers            %d/block, %d/SM\n", p.registers_per_block,
                   p.registers_per_sm);
            printf("  SM clock             %d MHz\n", p.clock_khz / 1000);
            printf("  ECC                  %s\n", p.ecc_enabled ? "on" : "off");
        }
    }
    if (json)
        printf("%s]\n}\n", count ? "\n  " : "");
    if (count == 0) {
        fprintf(stderr, "safecuda info: the driver sees no CUDA device\n");
        return EXIT_NO_GPU;
    }
    return failures ? 1 : 0;
}

/* The whole file, NUL-terminated; NULL with the reason in *why. Only a regular file, sized
 * by fstat: a folder opens too, and its "size" at SEEK_END can be LONG_MAX (ext4), which
 * must not become an allocation. */
static char *read_text(const char *path, const char **why)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        *why = strerror(errno);
        return NULL;
    }
    struct stat st;
    char *data = NULL;
    if (fstat(fileno(f), &st) != 0) {
        *why = strerror(errno);
    } else if (!S_ISREG(st.st_mode)) {
        *why = "not a regular file";
    } else if (!(data = malloc((size_t)st.st_size + 1))) {
        *why = "out of memory";
    } else if (fread(data, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        *why = "read error";
        free(data);
        data = NULL;
    } else {
        data[st.st_size] = '\0';
    }
    fclose(f);
    return data;
}

/* An option with a value, in nvcc's spellings: "NAME VALUE" and "NAME=VALUE", and when
 * attached, for the one-letter names, "-XVALUE". 1: argv[*i] is the option (*value and
 * *name set, *i past a separate value); 0: it is not; -1: the value is missing (said on
 * stderr). A following argument that starts with '-' is not taken as the value. */
static int option_value(int argc, char **argv, int *i, const char *const *names, bool attached,
                        const char *example, const char **value, const char **name)
{
    const char *arg = argv[*i];
    for (; *names; names++) {
        size_t n = strlen(*names);
        if (strncmp(arg, *names, n) != 0)
            continue;
        const char *v = NULL;
        if (arg[n] == '\0') {
            if (*i + 1 < argc && !(argv[*i + 1][0] == '-' && argv[*i + 1][1] != '\0'))
                v = argv[++*i];
        } else if (arg[n] == '=') {
            v = arg + n + 1;
        } else if (attached && n == 2) {
            v = arg + n;
        } else {
            continue; /* another option that starts alike (-arch vs -architecture...) */
        }
        if (!v || !*v) {
            fprintf(stderr, "safecuda compile: %s needs a value, e.g. %s %s\n", *names, *names,
                    example);
            return -1;
        }
        *value = v;
        *name = *names;
        return 1;
    }
    return 0;
}

/* Write the image to path. On failure say why, remove what was written of a regular file
 * (a partial image is worse than none) and return false. */
static bool write_image(const char *path, const void *image, uint64_t bytes)
{
    errno = 0;
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "safecuda compile: cannot write '%s': %s\n", path, strerror(errno));
        return false;
    }
    struct stat st;
    const bool regular = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
    int err = 0;
    errno = 0;
    if (fwrite(image, 1, (size_t)bytes, f) != (size_t)bytes)
        err = errno ? errno : EIO;
    errno = 0;
    if (fflush(f) != 0 && !err)
        err = errno ? errno : EIO;
    errno = 0;
    if (fclose(f) != 0 && !err)
        err = errno ? errno : EIO;
    if (!err)
        return true;
    fprintf(stderr, "safecuda compile: cannot write '%s': %s\n", path, strerror(err));
    if (regular)
        remove(path);
    return false;
}

typedef struct compile_args {
    const char *path, *out;
    const char *arch_text; /* as given, for messages */
    const char *arch_name; /* the option's name as given (--arch, -arch, ...) */
    target t;
    bool ptx;
    const char **options; /* for NVRTC, NULL-terminated */
    int n_options;
    char **owned; /* options built here ("-I" + DIR), freed at the end */
    int n_owned;
} compile_args;

static const char *const arch_names[] = {"--arch", "-arch", "--gpu-architecture",
                                         "-gpu-architecture", NULL};
static const char *const out_names[] = {"-o", "--output-file", NULL};

/* Parse compile's arguments into a; EXIT_USAGE (said on stderr), 1 (out of memory), a
 * negative number for --help, or 0. */
static int parse_compile(int argc, char **argv, compile_args *a)
{
    /* -I/-D/-U in nvcc's spellings, passed on in NVRTC's form. */
    static const struct {
        const char *const names[3];
        const char *nvrtc, *example;
    } passed[] = {
        {{"-I", "--include-path", NULL}, "-I", "include"},
        {{"-D", "--define-macro", NULL}, "-D", "NAME=VALUE"},
        {{"-U", "--undefine-macro", NULL}, "-U", "NAME"},
    };
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return -1;
    int passed_on = -1; /* the last argument passed to NVRTC as it is */
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *v = NULL, *name = NULL;
        int r = option_value(argc, argv, &i, arch_names, false, "sm_90", &v, &name);
        if (r < 0)
            return EXIT_USAGE;
        if (r > 0) {
            if (a->arch_text) {
                fprintf(stderr, "safecuda compile: --arch given twice ('%s' and '%s')\n",
                        a->arch_text, v);
                return EXIT_USAGE;
            }
            a->arch_text = v; /* checked once --ptx is known */
            a->arch_name = name;
            continue;
        }
        r = option_value(argc, argv, &i, out_names, false, "kernel.cubin", &v, &name);
        if (r < 0)
            return EXIT_USAGE;
        if (r > 0) {
            if (a->out) {
                fprintf(stderr, "safecuda compile: -o given twice ('%s' and '%s')\n", a->out, v);
                return EXIT_USAGE;
            }
            a->out = v;
            continue;
        }
        bool done = false;
        for (size_t k = 0; k < sizeof passed / sizeof passed[0] && !done; k++) {
            r = option_value(argc, argv, &i, passed[k].names, true, passed[k].example, &v,
                             &name);
            if (r < 0)
                return EXIT_USAGE;
            if (r > 0) {
                size_t n = strlen(passed[k].nvrtc) + strlen(v) + 1;
                char *opt = malloc(n);
                if (!opt) {
                    fprintf(stderr, "safecuda compile: out of memory\n");
                    return 1;
                }
                snprintf(opt, n, "%s%s", passed[k].nvrtc, v);
                a->owned[a->n_owned++] = opt;
                a->options[a->n_options++] = opt;
                done = true;
            }
        }
        if (done)
            continue;
        if (strcmp(arg, "--ptx") == 0 || strcmp(arg, "-ptx") == 0) {
            a->ptx = true;
        } else if (arg[0] == '-') {
            a->options[a->n_options++] = arg; /* NVRTC's own; its error says if it is not */
            passed_on = i;
        } else if (!a->path) {
            a->path = arg;
        } else {
            fprintf(stderr, "safecuda compile: more than one input file ('%s' and '%s')%s\n",
                    a->path, arg,
                    passed_on == i - 1 ? " (NVRTC options take their values as -option=value)"
                                       : "");
            return EXIT_USAGE;
        }
    }
    if (a->arch_text &&
        !target_parse("compile", a->arch_name, a->arch_text, TARGET_COMPILE, a->ptx, &a->t))
        return EXIT_USAGE;
    if (!a->path) {
        fprintf(stderr,
                "safecuda compile: no input file (safecuda compile --help shows the options)\n");
        return EXIT_USAGE;
    }
    return 0;
}

static int compile_file(compile_args *a)
{
    const char *path = a->path;
    /* #include "..." finds files beside the source, as with nvcc. */
    char include_dir[1100];
    const char *slash = strrchr(path, '/');
    snprintf(include_dir, sizeof include_dir, "-I%.*s", slash ? (int)(slash - path) : 1,
             slash ? path : ".");
    a->options[a->n_options++] = include_dir;
    a->options[a->n_options] = NULL;
    const char *why = NULL;
    char *source = read_text(path, &why);
    if (!source) {
        fprintf(stderr, "safecuda compile: cannot read '%s': %s\n", path, why);
        return 1;
    }
    /* With a device (and no --arch), compile for it and report per-kernel resources. */
    const int arch = a->t.arch;
    sc_context ctx = {0};
    int count = 0;
    sc_status ds = sc_device_count(&count);
    if (ds == SC_ERR_INVALID_ARGUMENT) { /* a bad SAFECUDA_* setting */
        fprintf(stderr, "safecuda compile: %s\n", sc_last_error());
        free(source);
        return EXIT_USAGE;
    }
    bool have_device = ds == SC_OK && count > 0 && sc_context_create(NULL, &ctx) == SC_OK;
    if (!have_device && arch == 0) {
        fprintf(stderr, "safecuda compile: no CUDA device here: name the target with --arch "
                        "(e.g. --arch sm_90)\n");
        free(source);
        return EXIT_NO_GPU;
    }
    int device_arch = 0;
    sc_device_props dp;
    if (have_device && sc_device_info(0, &dp) == SC_OK)
        device_arch = dp.cc_major * 10 + dp.cc_minor;
    const char *name = slash ? slash + 1 : path;
    sc_program prog;
    sc_status s = sc_program_create(arch ? (sc_context){0} : ctx,
                                    &(sc_program_desc){.source = source,
                                                       .name = name,
                                                       .options = a->options,
                                                       .ptx = a->ptx || a->t.ptx,
                                                       .arch = arch,
                                                       .arch_specific = a->t.specific},
                                    &prog);
    free(source);
    if (s != SC_OK) {
        fprintf(stderr, "%s\n", sc_last_error());
        if (have_device)
            sc_context_destroy(ctx);
        return s == SC_ERR_NO_COMPILER ? EXIT_NO_GPU : 1;
    }
    sc_program_props pp;
    sc_program_info(prog, &pp);
    size_t log_size = 0;
    sc_program_log(prog, NULL, 0, &log_size);
    char *log = malloc(log_size);
    if (log && log_size > 1 && sc_program_log(prog, log, log_size, NULL) == SC_OK)
        fprintf(stderr, "%s", log);
    free(log);
    /* PTX is written as text, without the NUL the library keeps after it: the size said is
     * the size written. */
    const void *image;
    uint64_t bytes;
    sc_program_image(prog, &image, &bytes);
    if (pp.is_ptx && bytes && ((const char *)image)[bytes - 1] == '\0')
        bytes--;
    printf("%s: %s for %s_%d%s, %llu bytes, %s in %.1f ms\n", path, pp.is_ptx ? "PTX" : "cubin",
           pp.is_ptx ? "compute" : "sm", pp.arch, pp.arch_specific ? "a" : "",
           (unsigned long long)bytes, pp.from_cache ? "from the cache" : "compiled",
           pp.compile_ms);
    if (arch && pp.arch != arch) /* PTX opted in for an architecture NVRTC does not build */
        fprintf(stderr,
                "note: NVRTC builds no sm_%d: PTX for compute_%d, which the driver compiles for "
                "sm_%d when it loads it\n",
                arch, pp.arch, arch);
    int rc = 0;
    if (a->out) {
        if (write_image(a->out, image, bytes))
            printf("wrote %s\n", a->out);
        else
            rc = 1;
    }
    /* The kernel table: for the device's own architecture only (an image for another one
     * would not load here). */
    if (have_device && (arch == 0 || arch == device_arch)) {
        sc_module mod;
        const char *names[256];
        size_t n = 0;
        if (sc_module_load(ctx, prog, &mod) == SC_OK) {
            if (sc_module_kernel_names(mod, names, 256, &n) == SC_OK) {
                printf("%-40s %5s %8s %8s %8s %7s\n", "kernel", "regs", "shared", "local",
                       "threads", "params");
                for (size_t i = 0; i < n && i < 256; i++) {
                    sc_kernel k;
                    sc_kernel_props kp;
                    if (sc_kernel_get(mod, names[i], &k) == SC_OK &&
                        sc_kernel_info(k, &kp) == SC_OK)
                        printf("%-40.40s %5d %8d %8d %8d %7d\n", names[i], kp.registers,
                               kp.static_shared_bytes, kp.local_bytes, kp.max_threads_per_block,
                               kp.n_params);
                }
            }
            sc_module_destroy(mod);
        } else {
            fprintf(stderr, "safecuda compile: loading the module failed: %s\n", sc_last_error());
            rc = 1;
        }
    }
    sc_program_destroy(prog);
    if (have_device)
        sc_context_destroy(ctx);
    return rc;
}

static int cmd_compile(int argc, char **argv)
{
    compile_args a = {0};
    a.options = calloc((size_t)argc + 2, sizeof *a.options);
    a.owned = calloc((size_t)argc + 1, sizeof *a.owned);
    int rc = 1;
    if (!a.options || !a.owned) {
        fprintf(stderr, "safecuda compile: out of memory\n");
    } else {
        rc = parse_compile(argc, argv, &a);
        if (rc < 0) {
            compile_usage(stdout);
            rc = 0;
        } else if (rc == 0) {
            rc = compile_file(&a);
        }
    }
    for (int i = 0; i < a.n_owned; i++)
        free(a.owned[i]);
    free(a.owned);
    free(a.options);
    return rc;
}

static int run_command(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") == 0)
        return cmd_info(argc - 2, argv + 2);
    if (strcmp(cmd, "compile") == 0)
        return cmd_compile(argc - 2, argv + 2);
    if (strcmp(cmd, "precompile") == 0)
        return cmd_precompile(argc - 2, argv + 2);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("safecuda %s\n", sc_version_string());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "safecuda: unknown command '%s'\n", cmd);
    usage(stderr);
    return EXIT_USAGE;
}

int main(int argc, char **argv)
{
    int rc = run_command(argc, argv);
    /* What the tool prints is its result: output that could not be written is a failure. */
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "safecuda: cannot write the output: %s\n",
                errno ? strerror(errno) : "write error");
        return rc ? rc : 1;
    }
    return rc;
}
