/* safecuda: the command-line tool.
 *
 *   safecuda info [--json]   driver, compiler and device properties
 *   safecuda version
 *
 * Exit status: 0 success, 1 failure, 2 no usable driver or device, 64 bad usage. */
#include <stdio.h>
#include <string.h>

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

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") == 0)
        return cmd_info(argc - 2, argv + 2);
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
