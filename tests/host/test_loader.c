/* Loading libcuda and NVRTC: each mode runs in its own process (loading happens once),
 * with the environment CTest sets for it. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <limits.h>
#include <stdlib.h>

#include "../test.h"

/* SAFECUDA_DEVICE=test found the test device at `want` (compared as real paths). */
static void found_test_device(const char *want)
{
    CHECK_OK(sc_init());
    char path[1024] = "", a[PATH_MAX], b[PATH_MAX];
    CHECK_OK(sc_driver_path(path, sizeof path));
    CHECK(strstr(path, "libsafecuda_testdevice.so") != NULL);
    if (!realpath(path, a) || !realpath(want, b) || strcmp(a, b) != 0) {
        fprintf(stderr, "loaded %s, expected %s\n", path, want);
        test_failures++;
    }
    sc_device_props p;
    CHECK_OK(sc_device_info(0, &p));
    CHECK(strcmp(p.name, "safecuda test device (host memory, runs no kernels)") == 0);
    int n = 0;
    CHECK_OK(sc_device_count(&n));
    CHECK(n == 1);
}

static void no_driver_everywhere(const char *needle)
{
    for (int i = 0; i < 2; i++) { /* the answer is stable */
        CHECK_STATUS(sc_init(), SC_ERR_NO_DRIVER);
        CHECK_MSG("sc_init: ");
        CHECK_MSG(needle);
        CHECK_MSG("install the NVIDIA driver");
        /* A CI machine without a GPU wants the test device: say it. */
        CHECK_MSG("without a GPU (CI), SAFECUDA_DEVICE=test selects safecuda's test device");
    }
    int n = 5, v = 0;
    CHECK_STATUS(sc_device_count(&n), SC_ERR_NO_DRIVER);
    CHECK(n == 0);
    CHECK_MSG("sc_device_count: ");
    CHECK_STATUS(sc_driver_version(&v), SC_ERR_NO_DRIVER);
    sc_device_props p;
    CHECK_STATUS(sc_device_info(0, &p), SC_ERR_NO_DRIVER);
    CHECK_MSG("sc_device_info: ");
    uint64_t f, t;
    CHECK_STATUS(sc_device_memory(0, &f, &t), SC_ERR_NO_DRIVER);
    sc_context ctx = {12345};
    CHECK_STATUS(sc_context_create(&(sc_context_desc){.device = 0}, &ctx), SC_ERR_NO_DRIVER);
    CHECK(ctx.id == 0);
    CHECK_MSG("sc_context_create: ");
    CHECK_MSG(needle);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "missing") == 0) {
        /* SAFECUDA_LIBCUDA points at a file that does not exist. */
        no_driver_everywhere(getenv("SAFECUDA_LIBCUDA"));
        CHECK_MSG("SAFECUDA_LIBCUDA=");
    } else if (strcmp(mode, "stub") == 0) {
        no_driver_everywhere("stub driver library");
        CHECK_MSG("CUDA_ERROR_STUB_LIBRARY");
        CHECK_MSG(getenv("SAFECUDA_LIBCUDA"));
    } else if (strcmp(mode, "toolkit-stub") == 0) {
        const char *path = getenv("SAFECUDA_LIBCUDA");
        FILE *f = fopen(path, "rb");
        if (!f) {
            printf("skipped: no CUDA toolkit stub at %s\n", path);
            return TEST_SKIP;
        }
        fclose(f);
        no_driver_everywhere("stub driver library");
    } else if (strcmp(mode, "broken") == 0) {
        /* A libcuda whose cuInit fails (SAFECUDA_STUB_INIT_RESULT=999): the driver is there
         * but unusable, SC_ERR_DRIVER, never "no driver" (which GPU tests read as a skip). */
        for (int i = 0; i < 2; i++) {
            CHECK_STATUS(sc_init(), SC_ERR_DRIVER);
            CHECK_MSG("sc_init: cuInit failed with");
            CHECK_MSG("(999)");
            CHECK_MSG("the driver is installed but not usable");
        }
        int n = 5;
        CHECK_STATUS(sc_device_count(&n), SC_ERR_DRIVER);
        CHECK(n == 0);
        sc_context ctx = {12345};
        CHECK_STATUS(sc_context_create(NULL, &ctx), SC_ERR_DRIVER);
        CHECK(ctx.id == 0);
    } else if (strcmp(mode, "not-a-driver") == 0) {
        no_driver_everywhere("is not a CUDA driver library");
    } else if (strcmp(mode, "default") == 0) {
        /* Whatever this machine has: a working driver, or a clear reason. */
        sc_status s = sc_init();
        if (s == SC_OK) {
            char path[512];
            CHECK_OK(sc_driver_path(path, sizeof path));
            CHECK(strstr(path, "libcuda") != NULL);
            int v = 0;
            CHECK_OK(sc_driver_version(&v));
            CHECK(v >= 12000);
        } else {
            CHECK(s == SC_ERR_NO_DRIVER);
            CHECK_MSG("libcuda.so.1");
        }
    } else if (strcmp(mode, "device-test") == 0) {
        /* SAFECUDA_DEVICE=test: the test device where argv[2] says it must be found. */
        REQUIRE(argc > 2);
        found_test_device(argv[2]);
    } else if (strcmp(mode, "device-test-override") == 0) {
        /* SAFECUDA_LIBCUDA names the file, also for the test device. */
        CHECK_STATUS(sc_init(), SC_ERR_NO_DRIVER);
        CHECK_MSG("sc_init: cannot load the safecuda test device from SAFECUDA_LIBCUDA=");
        CHECK_MSG(getenv("SAFECUDA_LIBCUDA"));
        CHECK_MSG("libsafecuda_testdevice.so");
    } else if (strcmp(mode, "device-unknown") == 0) {
        for (int i = 0; i < 2; i++) {
            CHECK_STATUS(sc_init(), SC_ERR_INVALID_ARGUMENT);
            CHECK_MSG("sc_init: SAFECUDA_DEVICE=gpu is not a device safecuda knows");
            CHECK_MSG("SAFECUDA_DEVICE=test");
        }
        int n = 3;
        CHECK_STATUS(sc_device_count(&n), SC_ERR_INVALID_ARGUMENT);
        CHECK_MSG("sc_device_count: SAFECUDA_DEVICE=gpu");
        sc_context ctx;
        CHECK_STATUS(sc_context_create(NULL, &ctx), SC_ERR_INVALID_ARGUMENT);
        CHECK_MSG("sc_context_create: SAFECUDA_DEVICE=gpu");
    } else if (strcmp(mode, "nvrtc-missing") == 0) {
        int major, minor;
        CHECK_STATUS(sc_compiler_version(&major, &minor), SC_ERR_NO_COMPILER);
        CHECK_MSG("sc_compiler_version: cannot load NVRTC from SAFECUDA_NVRTC=");
        CHECK_MSG(getenv("SAFECUDA_NVRTC"));
        char path[512] = "unchanged";
        CHECK_STATUS(sc_compiler_path(path, sizeof path), SC_ERR_NO_COMPILER);
        CHECK_MSG("sc_compiler_path: cannot load NVRTC from SAFECUDA_NVRTC=");
        CHECK(strcmp(path, "unchanged") == 0);
    } else if (strcmp(mode, "nvrtc") == 0) {
        int major = 0, minor = 0;
        sc_status s = sc_compiler_version(&major, &minor);
        if (s == SC_ERR_NO_COMPILER) {
            /* The override is honoured strictly; without it, the usual names are tried. */
            const char *override = getenv("SAFECUDA_NVRTC");
            if (override && override[0]) {
                CHECK_MSG("cannot load NVRTC from SAFECUDA_NVRTC=");
                CHECK_MSG(override);
            } else {
                CHECK_MSG("tried libnvrtc.so.13");
            }
            printf("skipped: %s\n", sc_last_error());
            return test_failures ? 1 : TEST_SKIP;
        }
        CHECK_OK(s);
        CHECK(major >= 11);
        char path[512] = "";
        CHECK_OK(sc_compiler_path(path, sizeof path));
        CHECK(strstr(path, "libnvrtc") != NULL);
        char small[5] = "xxxxx"; /* cut to the buffer, NUL-terminated */
        CHECK_OK(sc_compiler_path(small, sizeof small));
        CHECK(strlen(small) == 4 && strncmp(small, path, 4) == 0);
    } else {
        fprintf(stderr, "unknown mode '%s'\n", mode);
        return 1;
    }
    CHECK_STATUS(sc_driver_version(NULL), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_driver_version: argument 'version' is NULL");
    char buf[8];
    CHECK_STATUS(sc_compiler_path(NULL, 8), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_compiler_path: argument 'buf' is NULL");
    CHECK_STATUS(sc_compiler_path(buf, 0), SC_ERR_INVALID_ARGUMENT);
    CHECK_MSG("sc_compiler_path: size is 0");
    return test_result(mode);
}
