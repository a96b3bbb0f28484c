/* A small test harness: CHECK macros that count failures, and the GPU skip rule. */
#ifndef SAFECUDA_TEST_H
#define SAFECUDA_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static inline void gpu_require(void) { gpu_presence_require("test"); }

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

#endif
