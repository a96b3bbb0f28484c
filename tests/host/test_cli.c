/* The command-line tool without a driver: a clear reason and exit status 2. */
#include <sys/wait.h>

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

    snprintf(cmd, sizeof cmd, "'%s' version", SAFECUDA_CLI);
    CHECK(run(cmd, out, sizeof out) == 0);
    CHECK(strstr(out, "safecuda 0.1.0") != NULL);
    if (test_failures)
        fprintf(stderr, "last output:\n%s\n", out);
    return test_result("test_cli");
}
