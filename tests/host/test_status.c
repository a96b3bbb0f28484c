/* Status names, error messages and checked arithmetic. */
#include <pthread.h>

#include "../test.h"
#include "core/error.h"
#include "core/log.h"
#include "driver/driver.h"

static void *other_thread(void *arg)
{
    (void)arg;
    /* A fresh thread has no message, whatever the main thread's is. */
    int empty = sc_last_error()[0] == '\0';
    sci_fail(SC_ERR_BUSY, "thread_fn", "value %d", 2);
    return (void *)(intptr_t)empty;
}

/* "... [message cut: N of M bytes shown]" ends a message that did not fit: N is what is
 * left of the text before the marker, M the length the whole message had. */
static void check_cut(size_t whole, const char *what)
{
    const char *m = sc_last_error();
    size_t len = strlen(m);
    const char *marker = strstr(m, "... [message cut: ");
    size_t shown = 0, total = 0;
    char tail = 0;
    if (!marker || sscanf(marker, "... [message cut: %zu of %zu bytes shown%c", &shown, &total,
                          &tail) != 3) {
        fprintf(stderr, "%s: no cut marker at the end of a %zu-byte message: ...%s\n", what, len,
                len > 80 ? m + len - 80 : m);
        test_failures++;
        return;
    }
    CHECK(tail == ']' && m[len - 1] == ']' && marker[strlen(marker) - 1] == ']');
    CHECK(strchr(marker, ']') == m + len - 1); /* the marker ends the message */
    CHECK(shown == (size_t)(marker - m));
    if (total != whole)
        fprintf(stderr, "%s: the marker says %zu bytes, the message had %zu\n", what, total,
                whole);
    CHECK(total == whole);
    CHECK(len < 16384 && len > 16000); /* the buffer is used, not wasted */
}

static void test_cut_messages(const char *big)
{
    const size_t n = strlen(big);
    const size_t prefix = strlen("sc_program_create: ");

    /* A message that fits has no marker. */
    sci_fail(SC_ERR_COMPILE, "f", "%.*s", 1000, big);
    CHECK(strstr(sc_last_error(), "message cut") == NULL);
    CHECK(strlen(sc_last_error()) == 1003);

    /* Cut by sci_fail: the marker gives the length of the whole message. */
    sci_fail(SC_ERR_COMPILE, "sc_program_create", "%s", big);
    check_cut(prefix + n, "sci_fail");
    CHECK(strncmp(sc_last_error(), "sc_program_create: xxx", 22) == 0);

    /* Appending to a cut message adds to the length, not to the text. */
    sci_error_append(" and %d more", 12345); /* 15 bytes */
    check_cut(prefix + n + 15, "append after a cut");
    CHECK(strstr(sc_last_error(), "12345") == NULL);

    /* Cut by an append to a message that fitted. */
    sci_fail(SC_ERR_COMPILE, "g", "first part;");
    sci_error_append("%s", big);
    check_cut(strlen("g: first part;") + n, "append");
    CHECK_MSG("g: first part;xxx");

    /* A message of exactly the buffer's size minus one fits; one more byte does not. */
    sci_fail(SC_ERR_COMPILE, "h", "%.*s", 16384 - 1 - 3, big);
    CHECK(strstr(sc_last_error(), "message cut") == NULL);
    CHECK(strlen(sc_last_error()) == 16383);
    sci_error_append("y");
    check_cut(16384, "one byte over");

    /* The cut does not split a UTF-8 character: every kept byte sequence is whole. */
    static char utf8[30000];
    for (size_t i = 0; i + 2 < sizeof utf8; i += 2) {
        utf8[i] = (char)0xc3; /* U+00E9, two bytes */
        utf8[i + 1] = (char)0xa9;
    }
    for (int shift = 0; shift < 2; shift++) {
        sci_fail(SC_ERR_COMPILE, shift ? "ab" : "a", "%s", utf8);
        const char *m = sc_last_error();
        const char *marker = strstr(m, "... [message cut: ");
        REQUIRE(marker != NULL);
        size_t start = strlen(shift ? "ab: " : "a: ");
        CHECK((size_t)(marker - m - start) % 2 == 0);
        check_cut(start + strlen(utf8), "utf-8");
    }

    /* A saved cut message comes back with its marker, and appends still count. */
    sci_fail(SC_ERR_COMPILE, "sc_program_create", "%s", big);
    char *saved = sci_error_save();
    sci_fail(SC_ERR_IO, "other", "message");
    sci_error_restore(saved);
    check_cut(prefix + n, "restored");
    sci_error_append("%s", "12345");
    check_cut(prefix + n + 5, "append after restore");

    /* Cleared, the next message starts afresh. */
    sc_clear_error();
    sci_error_append("%s", "appended to nothing");
    CHECK(strcmp(sc_last_error(), "appended to nothing") == 0);
    sci_fail(SC_ERR_IO, "f", "short");
    CHECK(strcmp(sc_last_error(), "f: short") == 0);
}

static char logged[50000];
static size_t logged_len;
static sc_log_level logged_level;

static void capture_log(sc_log_level level, const char *text, void *user)
{
    (void)user;
    logged_level = level;
    logged_len = strlen(text);
    snprintf(logged, sizeof logged, "%s", text);
}

/* Log lines reach the callback whole, however long (a compile log that was too long for the
 * error message goes there). */
static void test_long_log_lines(const char *big)
{
    sc_set_log_callback(capture_log, NULL);
    sci_log(SC_LOG_WARN, "short %d", 7);
    CHECK(strcmp(logged, "short 7") == 0 && logged_level == SC_LOG_WARN);
    sci_log(SC_LOG_ERROR, "long: %s|end", big);
    CHECK(logged_level == SC_LOG_ERROR);
    CHECK(logged_len == strlen("long: ") + strlen(big) + strlen("|end"));
    CHECK(logged_len > 30000 && strcmp(logged + logged_len - 4, "|end") == 0);
    sc_set_log_callback(NULL, NULL);
}

int main(void)
{
    /* Every enum value has its own name, spelled as in the header. */
    for (int i = 0; i < SC_STATUS_COUNT; i++) {
        const char *name = sc_status_name((sc_status)i);
        CHECK(name != NULL);
        CHECK(strncmp(name, "SC_", 3) == 0);
        CHECK(strcmp(name, "SC_STATUS_UNKNOWN") != 0);
        for (int j = 0; j < i; j++)
            CHECK(strcmp(name, sc_status_name((sc_status)j)) != 0);
    }
    CHECK(strcmp(sc_status_name(SC_OK), "SC_OK") == 0);
    CHECK(strcmp(sc_status_name(SC_ERR_STALE_HANDLE), "SC_ERR_STALE_HANDLE") == 0);
    CHECK(strcmp(sc_status_name(SC_ERR_CONTEXT_LOST), "SC_ERR_CONTEXT_LOST") == 0);
    CHECK(strcmp(sc_status_name(SC_STATUS_COUNT), "SC_STATUS_UNKNOWN") == 0);
    CHECK(strcmp(sc_status_name((sc_status)-1), "SC_STATUS_UNKNOWN") == 0);

    /* Messages name the function and the values. */
    sc_clear_error();
    CHECK(sc_last_error()[0] == '\0');
    CHECK(sci_fail(SC_ERR_OUT_OF_BOUNDS, "sc_copy_to_host", "elements [%d, %d) outside %d",
                   200, 300, 256) == SC_ERR_OUT_OF_BOUNDS);
    CHECK(strcmp(sc_last_error(), "sc_copy_to_host: elements [200, 300) outside 256") == 0);
    sci_error_append("; more");
    CHECK_MSG("outside 256; more");

    /* Driver errors keep the CUDA name and text (built-in table without a driver). */
    CHECK(sci_fail_cu(CUDA_ERROR_ILLEGAL_ADDRESS, "sc_stream_synchronize", "stream %d", 3) ==
          SC_ERR_CONTEXT_LOST);
    CHECK_MSG("sc_stream_synchronize: stream 3: CUDA_ERROR_ILLEGAL_ADDRESS");
    CHECK_MSG("illegal memory access");
    CHECK(sci_fail_cu(CUDA_ERROR_OUT_OF_MEMORY, "f", "x") == SC_ERR_OUT_OF_MEMORY);
    CHECK(sci_fail_cu(CUDA_ERROR_INVALID_VALUE, "f", "x") == SC_ERR_DRIVER);
    CHECK_MSG("CUDA_ERROR_INVALID_VALUE");
    CHECK(sci_fail_cu((CUresult)12345, "f", "x") == SC_ERR_DRIVER);
    CHECK_MSG("CUDA_ERROR_UNRECOGNIZED");
    CHECK(sci_status_from_cu(CUDA_SUCCESS) == SC_OK);
    CHECK(sci_status_from_cu(CUDA_ERROR_LAUNCH_FAILED) == SC_ERR_CONTEXT_LOST);
    CHECK(sci_status_from_cu(CUDA_ERROR_NOT_READY) == SC_ERR_NOT_READY);
    CHECK(sci_status_from_cu(CUDA_ERROR_NOT_SUPPORTED) == SC_ERR_NOT_SUPPORTED);

    /* The built-in table knows every sticky error by name (a lost context's message
     * must say which), with CUDA's own text. */
    const CUresult sticky[] = {CUDA_ERROR_ILLEGAL_ADDRESS,      CUDA_ERROR_LAUNCH_TIMEOUT,
                               CUDA_ERROR_ASSERT,               CUDA_ERROR_HARDWARE_STACK_ERROR,
                               CUDA_ERROR_ILLEGAL_INSTRUCTION,  CUDA_ERROR_MISALIGNED_ADDRESS,
                               CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_INVALID_PC,
                               CUDA_ERROR_LAUNCH_FAILED,        CUDA_ERROR_ECC_UNCORRECTABLE,
                               CUDA_ERROR_CONTAINED};
    for (size_t i = 0; i < sizeof sticky / sizeof sticky[0]; i++) {
        CHECK(sci_cu_error_is_sticky(sticky[i]));
        if (strcmp(sci_cu_error_name(sticky[i]), "CUDA_ERROR_UNRECOGNIZED") == 0) {
            fprintf(stderr, "error code %d is sticky but has no built-in name\n",
                    (int)sticky[i]);
            test_failures++;
        }
    }
    CHECK(strcmp(sci_cu_error_name(CUDA_ERROR_CONTAINED), "CUDA_ERROR_CONTAINED") == 0);
    CHECK(strcmp(sci_cu_error_string(CUDA_ERROR_HARDWARE_STACK_ERROR), "hardware stack error") ==
          0);
    CHECK(strcmp(sci_cu_error_string(CUDA_ERROR_ECC_UNCORRECTABLE),
                 "uncorrectable ECC error encountered") == 0);
    /* ... and every code of the shared list (src/driver/cu_errors.h), by its own name. */
#define CHECK_ERROR_ROW(name, value, text)                                                \
    CHECK((int)name == (value) && strcmp(sci_cu_error_name(name), #name) == 0 &&          \
          strcmp(sci_cu_error_string(name), text) == 0 && ((const char *)text)[0]);
    SCI_CU_ERRORS(CHECK_ERROR_ROW)
#undef CHECK_ERROR_ROW

    /* Long messages are truncated, never overflow. */
    char big[40000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    sci_fail(SC_ERR_COMPILE, "sc_program_create", "%s", big);
    CHECK(strlen(sc_last_error()) < sizeof big);
    CHECK(strncmp(sc_last_error(), "sc_program_create: xxx", 22) == 0);
    test_cut_messages(big);
    test_long_log_lines(big);

    /* The message is per thread. */
    sci_fail(SC_ERR_IO, "main_fn", "here");
    pthread_t t;
    void *empty = NULL;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, &empty);
    CHECK(empty == (void *)1);
    CHECK(strcmp(sc_last_error(), "main_fn: here") == 0);

    /* Checked arithmetic. */
    uint64_t out = 0;
    CHECK(sci_mul_ok(1u << 20, 4, &out) && out == (1u << 22));
    CHECK(!sci_mul_ok(UINT64_MAX / 2 + 1, 2, &out));
    CHECK(sci_add_ok(UINT64_MAX - 1, 1, &out) && out == UINT64_MAX);
    CHECK(!sci_add_ok(UINT64_MAX, 1, &out));

    CHECK(strcmp(sci_basename("/a/b/demo.c"), "demo.c") == 0);
    CHECK(strcmp(sci_basename("demo.c"), "demo.c") == 0);
    CHECK(strcmp(sci_basename(NULL), "?") == 0);
    CHECK(strcmp(sc_version_string(), "0.1.0") == 0);
    return test_result("test_status");
}
