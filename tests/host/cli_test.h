/* What the command-line tool's tests share (test_cli.c, test_cli_arch.c): running the tool
 * through popen, checking its exit status and output, and a temporary folder. */
#ifndef SAFECUDA_TEST_CLI_H
#define SAFECUDA_TEST_CLI_H

#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test.h"

/* Commands run without a driver (so also without a device) and without the disk cache. */
#define ENV "SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1 SAFECUDA_CACHE=0 "

static char out[1 << 20]; /* the command's output (stdout and stderr as the command says) */

/* Run cmd, keep the first sizeof out - 1 bytes of its output and drain the rest. */
static inline int run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    REQUIRE(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0)
        ;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static inline int runf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int runf(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    REQUIRE(n > 0 && (size_t)n < sizeof cmd);
    return run(cmd);
}

/* The output has needle; else say which command and what it printed. */
#define CHECK_OUT(needle)                                                                     \
    do {                                                                                      \
        if (!strstr(out, (needle))) {                                                         \
            fprintf(stderr, "%s:%d: output lacks \"%s\":\n%.2000s\n", __FILE__, __LINE__,    \
                    (needle), out);                                                           \
            test_failures++;                                                                  \
        }                                                                                     \
    } while (0)
#define CHECK_NOT_OUT(needle)                                                                 \
    do {                                                                                      \
        if (strstr(out, (needle))) {                                                          \
            fprintf(stderr, "%s:%d: output has \"%s\":\n%.2000s\n", __FILE__, __LINE__,      \
                    (needle), out);                                                           \
            test_failures++;                                                                  \
        }                                                                                     \
    } while (0)
#define CHECK_RC(got, want)                                                                   \
    do {                                                                                      \
        int rc_ = (got);                                                                      \
        if (rc_ != (want)) {                                                                  \
            fprintf(stderr, "%s:%d: exit status %d, expected %d; output:\n%.2000s\n",         \
                    __FILE__, __LINE__, rc_, (want), out);                                    \
            test_failures++;                                                                  \
        }                                                                                     \
    } while (0)

static char dir[] = "/tmp/safecuda-test-cli-XXXXXX";

static inline void write_file(const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    REQUIRE(fputs(text, f) >= 0);
    REQUIRE(fclose(f) == 0);
}

/* The first bytes of dir/name ("" when missing). */
static inline void read_head(const char *name, char *buf, size_t size)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f)
        return;
    size_t n = fread(buf, 1, size - 1, f);
    buf[n] = '\0';
    fclose(f);
}

static inline bool exists(const char *name)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

#endif
