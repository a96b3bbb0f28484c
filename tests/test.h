/* A small test harness: CHECK macros that count failures, and the GPU skip rule. */
#ifndef SAFECUDA_TEST_H
#define SAFECUDA_TEST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_presence.h"
#include "safecuda.h"

#define TEST_SKIP GPU_SKIP

static int test_failures;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            test_failures++;                                                        \
        }                                                                           \
    } while (0)

/* Evaluate expr (an sc_status) and require the given status. */
#define CHECK_STATUS(expr, want)                                                          \
    do {                                                                                  \
        sc_status got_ = (expr);                                                          \
        if (got_ != (want)) {                                                             \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n",      \
                    __FILE__, __LINE__, #expr, sc_status_name(got_), sc_status_name(want), \
                    sc_last_error());                                                     \
            test_failures++;                                                              \
        }                                                                                 \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, SC_OK)

/* The last error message contains needle. */
#define CHECK_MSG(needle)                                                              \
    do {                                                                               \
        if (!strstr(sc_last_error(), (needle))) {                                      \
            fprintf(stderr, "%s:%d: message lacks \"%s\": %s\n", __FILE__, __LINE__,    \
                    (needle), sc_last_error());                                        \
            test_failures++;                                                           \
        }                                                                              \
    } while (0)

/* A failure: the status, and a message that starts with the public function's name
 * (sc_last_error cleared first, so the message is the call's own). */
#define CHECK_FAIL(expr, want, fn)                                                        \
    do {                                                                                  \
        sc_clear_error();                                                                 \
        CHECK_STATUS(expr, want);                                                         \
        CHECK_MSG(fn ": ");                                                               \
    } while (0)

/* Fail the whole test now (for setup that later checks depend on). */
#define REQUIRE(cond)                                                                    \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s (last error: %s)\n", __FILE__,    \
                    __LINE__, #cond, sc_last_error());                                   \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static inline int test_result(const char *name)
{
    if (test_failures)
        fprintf(stderr, "%s: %d check%s failed\n", name, test_failures,
                test_failures == 1 ? "" : "s");
    else
        printf("%s: all checks passed\n", name);
    return test_failures ? 1 : 0;
}

/* GPU tests call this first: without a driver or a device they exit with 77 (skipped);
 * any other failure to reach the GPU fails the test (tests/gpu_presence.h). */
#define gpu_require() gpu_presence_require(test_basename_(__FILE__))
static inline const char *test_basename_(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* A fast, seedable random generator for test data (xorshift64*). */
static inline uint64_t test_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* ---- helpers the tests share ---------------------------------------------------------------- */

static inline double test_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void *test_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    REQUIRE(p != NULL);
    return p;
}

/* Fresh random bytes from a per-case seed (never the all-zero pattern). */
static inline void test_fill_random(void *p, size_t bytes, uint64_t seed)
{
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    if (state == 0)
        state = 1;
    uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t r = test_rand(&state);
        memcpy(b + i, &r, 8);
    }
    if (i < bytes) {
        uint64_t r = test_rand(&state);
        memcpy(b + i, &r, bytes - i);
    }
}

/* Byte-exact comparison; on a mismatch say where and how much. */
static inline bool test_same_bytes(const void *got, const void *want, size_t n, const char *what)
{
    if (memcmp(got, want, n) == 0)
        return true;
    const uint8_t *g = got, *w = want;
    size_t first = SIZE_MAX, bad = 0;
    for (size_t i = 0; i < n; i++)
        if (g[i] != w[i]) {
            if (first == SIZE_MAX)
                first = i;
            bad++;
        }
    fprintf(stderr, "%s: %zu of %zu bytes differ, first at byte %zu (got 0x%02x, want 0x%02x)\n",
            what, bad, n, first, g[first], w[first]);
    return false;
}
#define CHECK_BYTES(got, want, n, what) CHECK(test_same_bytes((got), (want), (n), (what)))

/* The library's log, captured: sc_set_log_callback(test_log_capture, NULL) appends every
 * message as a line to test_log_text (clear it with test_log_text[0] = '\0'). */
static char test_log_text[65536] __attribute__((unused));
static inline void test_log_capture(sc_log_level level, const char *msg, void *user)
{
    (void)level, (void)user;
    size_t n = strlen(test_log_text);
    snprintf(test_log_text + n, sizeof test_log_text - n, "%s\n", msg);
}

/* Run one test function and print its wall time. */
#define TEST_RUN(f)                                                       \
    do {                                                                  \
        double t_ = test_now_s();                                         \
        f();                                                              \
        printf("%-28s %.2f s\n", #f, test_now_s() - t_);                  \
        fflush(stdout);                                                   \
    } while (0)

#endif
