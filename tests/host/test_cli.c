/* The command-line tool without a driver: a clear reason and exit status 2; inputs it
 * cannot read: a clear reason and exit status 1. */
#define _POSIX_C_SOURCE 200809L
#include <sys/wait.h>
#include <unistd.h>

#include "../test.h"

static int run(const char *cmd, char *out, size_t size)
{
    FILE *p = popen(cmd, "r");
    REQUIRE(p != NULL);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void)
{
    char cmd[2048], out[16384];
    snprintf(cmd, sizeof cmd, "SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1 '%s' info 2>&1",
             SAFECUDA_CLI);
    CHECK(run(cmd, out, sizeof out) == 2);
    CHECK(strstr(out, "cannot load the CUDA driver library") != NULL);
    CHECK(strstr(out, "/nonexistent/libcuda.so.1") != NULL);
    CHECK(strstr(out, "install the NVIDIA driver") != NULL);

    snprintf(cmd, sizeof cmd,
             "SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1 '%s' info --json 2>/dev/null",
             SAFECUDA_CLI);
    CHECK(run(cmd, out, sizeof out) == 2);
    CHECK(strstr(out, "\"error\": \"SC_ERR_NO_DRIVER\"") != NULL);

    snprintf(cmd, sizeof cmd, "'%s' frobnicate 2>&1", SAFECUDA_CLI);
    CHECK(run(cmd, out, sizeof out) == 64);
    CHECK(strstr(out, "unknown command 'frobnicate'") != NULL);

    snprintf(cmd, sizeof cmd, "'%s' info --bogus 2>&1", SAFECUDA_CLI);
    CHECK(run(cmd, out, sizeof out) == 64);

    /* A folder as the source: it opens like a file and its size at SEEK_END is LONG_MAX
     * on ext4, which must not become an allocation (an abort under ASan). */
    char dir[] = "/tmp/safecuda-test-cli-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd,
             "SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1 '%s' compile '%s' --arch sm_90 2>&1",
             SAFECUDA_CLI, dir);
    CHECK(run(cmd, out, sizeof out) == 1);
    CHECK(strstr(out, "safecuda compile: cannot read") != NULL);
    CHECK(strstr(out, dir) != NULL);
    CHECK(strstr(out, "not a regular file") != NULL);
    CHECK(strstr(out, "AddressSanitizer") == NULL);
    rmdir(dir);

    /* A source that does not exist. */
    snprintf(cmd, sizeof cmd,
             "SAFECUDA_LIBCUDA=/nonexistent/libcuda.so.1 '%s' compile '%s/k.cu' --arch sm_90 "
             "2>&1",
             SAFECUDA_CLI, dir);
    CHECK(run(cmd, out, sizeof out) == 1);
    CHECK(strstr(out, "safecuda compile: cannot read") != NULL);
    CHECK(strstr(out, "No such file or directory") != NULL);

    snprintf(cmd, sizeof cmd, "'%s' version", SAFECUDA_CLI);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECK(strstr(out, "safecuda 0.1.0") != NULL);
    if (test_failures)
        fprintf(stderr, "last output:\n%s\n", out);
    return test_result("test_cli");
}
