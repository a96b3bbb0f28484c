/* Devices on a real GPU: count, properties (checked against nvidia-smi), memory. */
#include "../test.h"

static unsigned parse_bus(const char *s, unsigned *domain, unsigned *bus, unsigned *dev,
                          unsigned *fn)
{
    return (unsigned)sscanf(s, "%x:%x:%x.%x", domain, bus, dev, fn) == 4;
}

static void trim(char *s)
{
    char *start = s;
    while (*start == ' ')
        start++;
    memmove(s, start, strlen(start) + 1);
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
}

/* Compare with nvidia-smi's view of the same PCI device. Returns matched fields. */
static int compare_with_smi(const sc_device_props *p)
{
    FILE *f = popen("nvidia-smi --query-gpu=pci.bus_id,name,memory.total,uuid "
                    "--format=csv,noheader,nounits 2>/dev/null",
                    "r");
    if (!f)
        return -1;
    char line[1024];
    int matched = -1;
    unsigned d0, b0, v0, f0;
    REQUIRE(parse_bus(p->pci_bus_id, &d0, &b0, &v0, &f0));
    while (fgets(line, sizeof line, f)) {
        char *fields[4] = {0};
        char *save = NULL;
        int n = 0;
        for (char *tok = strtok_r(line, ",", &save); tok && n < 4;
             tok = strtok_r(NULL, ",", &save))
            fields[n++] = tok;
        if (n != 4)
            continue;
        for (int i = 0; i < 4; i++)
            trim(fields[i]);
        unsigned d, b, v, fn;
        if (!parse_bus(fields[0], &d, &b, &v, &fn) || d != d0 || b != b0 || v != v0 ||
            fn != f0)
            continue;
        matched = 0;
        printf("nvidia-smi: %s | %s | %s MiB | %s\n", fields[0], fields[1], fields[2],
               fields[3]);
        CHECK(strcmp(fields[1], p->name) == 0);
        /* nvidia-smi shows the whole framebuffer; CUDA's total leaves out what the driver
         * reserves for itself (480 MiB on an H100 80GB with driver 580): ours must be at
         * most nvidia-smi's and within 2% of it. */
        long long mib = atoll(fields[2]);
        long long ours = (long long)(p->total_memory >> 20);
        printf("memory total: nvidia-smi %lld MiB, CUDA %lld MiB (driver reserve %lld MiB)\n",
               mib, ours, mib - ours);
        CHECK(ours <= mib && ours * 100 >= mib * 98);
        CHECK(strcmp(fields[3], p->uuid) == 0);
        matched = 3;
    }
    pclose(f);
    return matched;
}

int main(void)
{
    gpu_require();
    int count = 0;
    CHECK_OK(sc_device_count(&count));
    CHECK(count >= 1);
    for (int d = 0; d < count; d++) {
        sc_device_props p;
        memset(&p, 0x5a, sizeof p); /* poisoned: every field must be written */
        CHECK_OK(sc_device_info(d, &p));
        printf("device %d: %s, sm_%d%d, %d SMs, %llu bytes, bus %s, %s, %.1f GB/s\n", d,
               p.name, p.cc_major, p.cc_minor, p.sm_count, (unsigned long long)p.total_memory,
               p.pci_bus_id, p.uuid, p.memory_bandwidth_gbs);
        CHECK(p.ordinal == d);
        CHECK(strlen(p.name) > 0 && strlen(p.name) < sizeof p.name);
        CHECK(strncmp(p.uuid, "GPU-", 4) == 0 && strlen(p.uuid) == 40);
        CHECK(p.cc_major >= 5 && p.cc_minor >= 0 && p.cc_minor < 10);
        CHECK(p.sm_count > 0 && p.sm_count < 1000);
        CHECK(p.total_memory > (1ull << 30));
        CHECK(p.l2_cache_bytes > 0);
        CHECK(p.shared_per_block == 48 * 1024);
        CHECK(p.shared_per_block_optin >= p.shared_per_block);
        CHECK(p.shared_per_sm >= p.shared_per_block_optin);
        CHECK(p.max_threads_per_block == 1024);
        CHECK(p.warp_size == 32);
        CHECK(p.memory_clock_khz > 0 && p.memory_bus_width_bits > 0);
        CHECK(p.memory_bandwidth_gbs > 100.0 && p.memory_bandwidth_gbs < 20000.0);
        CHECK(p.max_grid[0] == 2147483647);
        CHECK(p.max_block[0] == 1024);
        CHECK(p.memory_pools_supported);
        if (p.cc_major == 9 && p.cc_minor == 0) { /* Hopper: H100/H200 */
            CHECK(p.sm_count == 132 || p.sm_count == 114);
            CHECK(p.shared_per_block_optin == 227 * 1024);
        }
        int smi = compare_with_smi(&p);
        if (smi < 0)
            printf("nvidia-smi not available: fields not cross-checked\n");
        else
            CHECK(smi == 3);

        uint64_t free_b = 0, total_b = 0;
        CHECK_OK(sc_device_memory(d, &free_b, &total_b));
        CHECK(free_b > 0 && free_b <= total_b);
        CHECK(total_b == p.total_memory);
    }
    sc_device_props p;
    CHECK_STATUS(sc_device_info(count, &p), SC_ERR_NO_DEVICE);
    CHECK_MSG("sc_device_info: device");
    CHECK_MSG("does not exist");
    CHECK_STATUS(sc_device_info(-1, &p), SC_ERR_NO_DEVICE);
    CHECK_MSG("device -1 does not exist");
    CHECK_STATUS(sc_device_info(0, NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_device_info: argument 'props' is NULL");
    uint64_t f;
    CHECK_STATUS(sc_device_memory(0, &f, NULL), SC_ERR_INVALID_ARGUMENT);
    int v = 0;
    CHECK_OK(sc_driver_version(&v));
    CHECK(v >= 12000);
    return test_result("test_gpu_device");
}
