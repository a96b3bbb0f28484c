/* The test device's settings (SAFECUDA_TESTDEVICE_*): every valid form works, and a bad
 * value is refused (SC_ERR_INVALID_ARGUMENT, as SAFECUDA_DEVICE=garbage is) with a message
 * naming the variable, the value and what is accepted -- never silently replaced by the
 * default. The driver is loaded once per process, so each setting is tried in a child
 * process (fork before the parent touches the library); the child reports through a pipe. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test.h"

/* What a child saw: sc_init's status and message, and the device's properties. */
typedef struct outcome {
    sc_status init;
    int devices;
    int cc;           /* 90 for 9.0 */
    uint64_t total;   /* device memory, bytes */
    int driver;       /* sc_driver_version */
    char message[2048];
} outcome;

static outcome try_setting(const char *name, const char *value)
{
    int fd[2];
    REQUIRE(pipe(fd) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        close(fd[0]);
        setenv(name, value, 1);
        outcome o;
        memset(&o, 0, sizeof o);
        o.init = sc_init();
        snprintf(o.message, sizeof o.message, "%s", o.init == SC_OK ? "" : sc_last_error());
        if (o.init == SC_OK && sc_device_count(&o.devices) == SC_OK && o.devices > 0) {
            sc_device_props p;
            uint64_t free_b = 0;
            if (sc_device_info(0, &p) == SC_OK)
                o.cc = p.cc_major * 10 + p.cc_minor;
            sc_device_memory(0, &free_b, &o.total);
        }
        if (o.init == SC_OK || o.init == SC_ERR_NO_DEVICE)
            sc_driver_version(&o.driver);
        ssize_t w = write(fd[1], &o, sizeof o);
        _exit(w == (ssize_t)sizeof o ? 0 : 1);
    }
    close(fd[1]);
    outcome o;
    memset(&o, 0, sizeof o);
    size_t got = 0;
    while (got < sizeof o) {
        ssize_t n = read(fd[0], (char *)&o + got, sizeof o - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(got == sizeof o && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return o;
}

static void refused(const char *name, const char *value, const char *accepted)
{
    outcome o = try_setting(name, value);
    char want[256];
    snprintf(want, sizeof want, "sc_init: %s=%s: ", name, value);
    if (o.init != SC_ERR_INVALID_ARGUMENT || !strstr(o.message, want) ||
        !strstr(o.message, accepted)) {
        fprintf(stderr, "%s=%s: %s, message:\n  %s\nwanted SC_ERR_INVALID_ARGUMENT, \"%s\" and "
                        "\"%s\"\n",
                name, value, sc_status_name(o.init), o.message, want, accepted);
        test_failures++;
    }
}

static void accepted_cc(const char *value, int cc)
{
    outcome o = try_setting("SAFECUDA_TESTDEVICE_CC", value);
    if (o.init != SC_OK || o.cc != cc) {
        fprintf(stderr, "SAFECUDA_TESTDEVICE_CC=%s: %s, cc %d (wanted %d): %s\n", value,
                sc_status_name(o.init), o.cc, cc, o.message);
        test_failures++;
    }
}

int main(void)
{
    /* Memory sizes: a whole number of MiB, 1 .. 16777216 (16 TiB). */
    static const char *const bad_mb[] = {"abc", "-5", "0", "16abc", "99999999999", " 64", "1e3",
                                         "16777217"};
    for (size_t i = 0; i < sizeof bad_mb / sizeof *bad_mb; i++) {
        refused("SAFECUDA_TESTDEVICE_MEMORY_MB", bad_mb[i],
                "the test device's memory in MiB: a whole number from 1 to 16777216 "
                "(default 4096)");
        refused("SAFECUDA_TESTDEVICE_PINNED_MB", bad_mb[i],
                "the pinned host memory the test device allows in MiB: a whole number from 1 "
                "to 16777216 (default 1024)");
    }
    outcome o = try_setting("SAFECUDA_TESTDEVICE_MEMORY_MB", "64");
    CHECK(o.init == SC_OK && o.total == 64ull << 20);
    o = try_setting("SAFECUDA_TESTDEVICE_MEMORY_MB", "16777216");
    CHECK(o.init == SC_OK && o.total == 16777216ull << 20);
    o = try_setting("SAFECUDA_TESTDEVICE_MEMORY_MB", "");
    CHECK(o.init == SC_OK && o.total == 4096ull << 20); /* empty: the default */
    CHECK(try_setting("SAFECUDA_TESTDEVICE_PINNED_MB", "64").init == SC_OK);

    /* Compute capabilities: 90 (as the tests and the README write it) or 9.0 (as
     * safecuda info and nvidia-smi show it); major 5 .. 12, minor 0 .. 9. */
    accepted_cc("90", 90);
    accepted_cc("80", 80);
    accepted_cc("75", 75);
    accepted_cc("9.0", 90);
    accepted_cc("8.0", 80);
    accepted_cc("8.6", 86);
    accepted_cc("10.0", 100);
    accepted_cc("12.1", 121);
    accepted_cc("121", 121);
    accepted_cc("50", 50);
    accepted_cc("", 90);
    static const char *const bad_cc[] = {"abc", "8", "8.", ".8", "8.10", "4.0", "49", "13.0",
                                         "130", "9.0a", "sm_90", "9,0", "-90", "1000"};
    for (size_t i = 0; i < sizeof bad_cc / sizeof *bad_cc; i++)
        refused("SAFECUDA_TESTDEVICE_CC", bad_cc[i],
                "the test device's compute capability, written 90 or 9.0: major 5 .. 12, "
                "minor 0 .. 9 (default 90)");

    /* Devices: none, one (the default) or up to 8 sharing one context and one memory. */
    o = try_setting("SAFECUDA_TESTDEVICE_DEVICES", "0");
    CHECK(o.init == SC_OK && o.devices == 0); /* a driver that sees no device */
    o = try_setting("SAFECUDA_TESTDEVICE_DEVICES", "1");
    CHECK(o.init == SC_OK && o.devices == 1);
    o = try_setting("SAFECUDA_TESTDEVICE_DEVICES", "8");
    CHECK(o.init == SC_OK && o.devices == 8);
    static const char *const bad_devices[] = {"9", "-1", "one", "01x", "100"};
    for (size_t i = 0; i < sizeof bad_devices / sizeof *bad_devices; i++)
        refused("SAFECUDA_TESTDEVICE_DEVICES", bad_devices[i],
                "0 (no device: cuInit answers CUDA_ERROR_NO_DEVICE) to 8 (the default is 1); "
                "each device has its primary context, all share one memory");

    /* Driver versions: 12000 .. 13000. */
    o = try_setting("SAFECUDA_TESTDEVICE_DRIVER_VERSION", "12030");
    CHECK(o.init == SC_OK && o.driver == 12030);
    static const char *const bad_driver[] = {"12.3", "abc", "11080", "13010", "12030x"};
    for (size_t i = 0; i < sizeof bad_driver / sizeof *bad_driver; i++)
        refused("SAFECUDA_TESTDEVICE_DRIVER_VERSION", bad_driver[i],
                "the CUDA version the test device reports, 1000 x major + 10 x minor: a whole "
                "number from 12000 to 13000 (12030 for CUDA 12.3; default 13000)");

    /* Switches: 0 or 1. */
    static const char *const switches[] = {"SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES",
                                           "SAFECUDA_TESTDEVICE_ABORT_ON_MISUSE"};
    for (size_t i = 0; i < 2; i++) {
        CHECK(try_setting(switches[i], "1").init == SC_OK);
        CHECK(try_setting(switches[i], "0").init == SC_OK);
        refused(switches[i], "yes", "1 (on) or 0 (off, the default)");
        refused(switches[i], "true", "1 (on) or 0 (off, the default)");
    }

    return test_result("test_testdevice_settings");
}
