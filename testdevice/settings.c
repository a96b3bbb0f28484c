/* The test device's settings, read from the environment at cuInit: every variable's valid
 * forms, and for anything else a message naming the variable, the value and what is
 * accepted (cuInit then fails and the library quotes the message), never a silent default. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testdevice_internal.h"

/* A setting's value; NULL when unset or empty (the default). */
static const char *setting(const char *name)
{
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

/* v is a whole number in [min, max] (digits only: no sign, space or suffix). */
static int whole(const char *v, unsigned long long min, unsigned long long max,
                 unsigned long long *out)
{
    unsigned long long n = 0;
    if (!v[0])
        return 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9' || n > max)
            return 0;
        n = n * 10 + (unsigned long long)(*p - '0');
    }
    if (n < min || n > max)
        return 0;
    *out = n;
    return 1;
}

/* 90 or 9.0: major 5 .. 12, minor 0 .. 9. */
static int parse_compute_capability(const char *v, int *cc)
{
    unsigned long long major = 0, minor = 0, n = 0;
    const char *dot = strchr(v, '.');
    if (dot) {
        char m[3] = "";
        size_t len = (size_t)(dot - v);
        if (len < 1 || len > 2 || strlen(dot + 1) != 1)
            return 0;
        memcpy(m, v, len);
        m[len] = '\0';
        if (!whole(m, 5, 12, &major) || !whole(dot + 1, 0, 9, &minor))
            return 0;
        *cc = (int)(major * 10 + minor);
        return 1;
    }
    size_t len = strlen(v);
    if (len < 2 || len > 3 || !whole(v, 50, 129, &n))
        return 0;
    *cc = (int)n;
    return 1;
}

#define MAX_MB (1ull << 24) /* 16 TiB */

int td_read_settings(td_settings *s, char *error, size_t size)
{
    const char *v, *name = NULL, *accepted = NULL;
    unsigned long long n = 0;
    if ((v = setting(name = "SAFECUDA_TESTDEVICE_MEMORY_MB"))) {
        if (!whole(v, 1, MAX_MB, &n))
            goto bad_memory;
        s->total_bytes = n << 20;
    }
    if ((v = setting(name = "SAFECUDA_TESTDEVICE_PINNED_MB"))) {
        if (!whole(v, 1, MAX_MB, &n)) {
            accepted = "the pinned host memory the test device allows in MiB: a whole number "
                       "from 1 to 16777216 (default 1024)";
            goto bad;
        }
        s->host_limit = n << 20;
    }
    if ((v = setting(name = "SAFECUDA_TESTDEVICE_DEVICES"))) {
        if (!whole(v, 0, 8, &n)) {
            accepted = "0 (no device: cuInit answers CUDA_ERROR_NO_DEVICE) to 8 (the default "
                       "is 1); each device has its primary context, all share one memory";
            goto bad;
        }
        s->n_devices = (int)n;
    }
    if ((v = setting(name = "SAFECUDA_TESTDEVICE_CC")) &&
        !parse_compute_capability(v, &s->compute_capability)) {
        accepted = "the test device's compute capability, written 90 or 9.0: major 5 .. 12, "
                   "minor 0 .. 9 (default 90)";
        goto bad;
    }
    if ((v = setting(name = "SAFECUDA_TESTDEVICE_DRIVER_VERSION"))) {
        if (!whole(v, 12000, 13000, &n)) {
            accepted = "the CUDA version the test device reports, 1000 x major + 10 x minor: "
                       "a whole number from 12000 to 13000 (12030 for CUDA 12.3; default "
                       "13000)";
            goto bad;
        }
        s->driver_version = (int)n;
    }
    static const char *const switches[] = {"SAFECUDA_TESTDEVICE_ABORT_ON_MISUSE",
                                           "SAFECUDA_TESTDEVICE_ACCEPT_LAUNCHES"};
    int *flags[] = {&s->abort_on_misuse, &s->accept_launches};
    for (int i = 0; i < 2; i++) {
        if ((v = setting(name = switches[i]))) {
            if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
                accepted = "1 (on) or 0 (off, the default)";
                goto bad;
            }
            *flags[i] = v[0] == '1';
        }
    }
    return 1;
bad_memory:
    accepted = "the test device's memory in MiB: a whole number from 1 to 16777216 (default "
               "4096)";
bad:
    snprintf(error, size, "%s=%s: %s", name, v, accepted);
    return 0;
}
