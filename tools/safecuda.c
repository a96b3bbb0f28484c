/* safecuda: the command-line tool.
 *
 *   safecuda info [--json]   driver, compiler and device properties
 *   safecuda compile FILE.cu [--arch sm_90] [--ptx] [-o OUT] [-DNAME[=V] ...]
 *   safecuda version
 *
 * Exit status: 0 success, 1 failure, 2 no usable driver or device, 64 bad usage. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safecuda.h"

#define EXIT_NO_GPU 2
#define EXIT_USAGE 64

static void usage(FILE *f)
{
    fprintf(f,
            "usage: safecuda <command> [options]\n"
            "\n"
            "commands:\n"
            "  info [--json]   show the driver, NVRTC and every device's properties\n"
            "  compile FILE.cu [--arch sm_XY] [--ptx] [-o OUT] [NVRTC options...]\n"
            "                  compile with NVRTC as the library does (same options and\n"
            "                  disk cache); print the log and, when a device is present,\n"
            "                  registers and shared memory per kernel\n"
            "  version         show safecuda's version\n"
            "  help            show this text\n");
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

static int cmd_info(int argc, char **argv)
{
    bool json = false;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else {
            fprintf(stderr, "safecuda info: unknown option '%s'\n", argv[i]);
            return EXIT_USAGE;
        }
    }
    int driver = 0, count = 0;
    sc_status s = sc_driver_version(&driver);
    if (s == SC_OK)
        s = sc_device_count(&count);
    if (s != SC_OK) {
        if (json) {
            printf("{\"error\": ");
            json_string(sc_status_name(s));
            printf(", \"message\": ");
            json_string(sc_last_error());
            printf("}\n");
        }
        fprintf(stderr, "safecuda info: %s\n", sc_last_error());
        return s == SC_ERR_NO_DRIVER || s == SC_ERR_NO_DEVICE ? EXIT_NO_GPU : 1;
    }
    char path[1024] = "";
    sc_driver_path(path, sizeof path);
    int nv_major = 0, nv_minor = 0;
    sc_status nv = sc_compiler_version(&nv_major, &nv_minor);
    char nv_error[1024] = "";
    if (nv != SC_OK)
        snprintf(nv_error, sizeof nv_error, "%s", sc_last_error());

    if (json) {
        printf("{\n  \"safecuda\": ");
        json_string(sc_version_string());
        printf(",\n  \"driver_cuda_version\": \"%d.%d\",\n  \"driver_path\": ", driver / 1000,
               (driver % 1000) / 10);
        json_string(path);
        if (nv == SC_OK)
            printf(",\n  \"nvrtc_version\": \"%d.%d\"", nv_major, nv_minor);
        else {
            printf(",\n  \"nvrtc_version\": null,\n  \"nvrtc_error\": ");
            json_string(nv_error);
        }
        printf(",\n  \"devices\": [");
    } else {
        printf("safecuda %s\n", sc_version_string());
        printf("driver:  CUDA %d.%d (%s)\n", driver / 1000, (driver % 1000) / 10, path);
        if (nv == SC_OK)
            printf("NVRTC:   %d.%d\n", nv_major, nv_minor);
        else
            printf("NVRTC:   not available (%s)\n", nv_error);
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

static int cmd_compile(int argc, char **argv)
{
    const char *path = NULL, *out = NULL;
    int arch = 0;
    bool ptx = false;
    const char *options[64];
    int n_options = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc) {
            const char *a = argv[++i];
            if (strncmp(a, "sm_", 3) == 0 || strncmp(a, "compute_", 8) == 0)
                a = strchr(a, '_') + 1;
            arch = atoi(a);
            if (arch < 50) {
                fprintf(stderr, "safecuda compile: bad --arch '%s' (write sm_90)\n", argv[i]);
                return EXIT_USAGE;
            }
        } else if (strcmp(argv[i], "--ptx") == 0) {
            ptx = true;
        } else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] == '-' && n_options < 62) {
            options[n_options++] = argv[i];
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "safecuda compile: unexpected argument '%s'\n", argv[i]);
            return EXIT_USAGE;
        }
    }
    if (!path) {
        fprintf(stderr, "safecuda compile: no input file\n");
        return EXIT_USAGE;
    }
    /* #include "..." finds files beside the source, as with nvcc. */
    char include_dir[1100];
    const char *slash = strrchr(path, '/');
    snprintf(include_dir, sizeof include_dir, "-I%.*s", slash ? (int)(slash - path) : 1,
             slash ? path : ".");
    options[n_options++] = include_dir;
    options[n_options] = NULL;
    const char *why = NULL;
    char *source = read_text(path, &why);
    if (!source) {
        fprintf(stderr, "safecuda compile: cannot read '%s': %s\n", path, why);
        return 1;
    }
    /* With a device (and no --arch), compile for it and report per-kernel resources. */
    sc_context ctx = {0};
    int count = 0;
    bool have_device = sc_device_count(&count) == SC_OK && count > 0 &&
                       sc_context_create(NULL, &ctx) == SC_OK;
    if (!have_device && arch == 0) {
        fprintf(stderr, "safecuda compile: no CUDA device here: name the target with --arch "
                        "(e.g. --arch sm_90)\n");
        free(source);
        return EXIT_NO_GPU;
    }
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    sc_program prog;
    sc_status s = sc_program_create(arch ? (sc_context){0} : ctx,
                                    &(sc_program_desc){.source = source, .name = name,
                                                       .options = options, .ptx = ptx,
                                                       .arch = arch},
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
    printf("%s: %s for sm_%d, %llu bytes, %s in %.1f ms\n", path, pp.is_ptx ? "PTX" : "cubin",
           pp.arch, (unsigned long long)pp.image_bytes,
           pp.from_cache ? "from the cache" : "compiled", pp.compile_ms);
    int rc = 0;
    if (out) {
        const void *image;
        uint64_t bytes;
        sc_program_image(prog, &image, &bytes);
        if (pp.is_ptx && bytes && ((const char *)image)[bytes - 1] == '\0')
            bytes--; /* write PTX as text */
        FILE *f = fopen(out, "wb");
        if (!f || fwrite(image, 1, bytes, f) != bytes) {
            fprintf(stderr, "safecuda compile: cannot write '%s'\n", out);
            rc = 1;
        }
        if (f)
            fclose(f);
        if (!rc)
            printf("wrote %s\n", out);
    }
    if (have_device) {
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

int main(int argc, char **argv)
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
