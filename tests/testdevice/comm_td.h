/* What the communicators' host tests share: contexts on the test device's devices, the NCCL
 * test double's counters, buffers made in one place (so messages name one creation line),
 * whole-message checks. The test device and the NCCL test double (tests/ncclfault) run no
 * GPU code: these tests check the library's bookkeeping, checks and plumbing (which pointer,
 * count, type and peer reaches NCCL), never anything about GPUs or NCCL itself. */
#ifndef SAFECUDA_TESTS_COMM_TD_H
#define SAFECUDA_TESTS_COMM_TD_H

#include <dlfcn.h>
#include <pthread.h>

#include "../test.h"
#include "safecuda/comm.h"
#include "td_control.h"

#define CHECK_WHOLE(want)                                                                  \
    do {                                                                                   \
        if (strcmp(sc_last_error(), (want)) != 0) {                                        \
            fprintf(stderr, "%s:%d: message\n  got:  %s\n  want: %s\n", __FILE__, __LINE__, \
                    sc_last_error(), (want));                                              \
            test_failures++;                                                               \
        }                                                                                  \
    } while (0)

/* expr fails with want and exactly the message printf(fmt, ...) gives. */
#define CHECK_REFUSED(expr, want, ...)                                                     \
    do {                                                                                   \
        char msg_[4096];                                                                   \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                                          \
        sc_clear_error();                                                                  \
        CHECK_STATUS(expr, want);                                                          \
        CHECK_WHOLE(msg_);                                                                 \
    } while (0)

#define MAX_RANKS 8
static sc_context ctxs[MAX_RANKS];
static sc_comm comms[MAX_RANKS];
static int buffer_line; /* where buf() creates buffers */
static int comms_line;  /* where world() creates communicators */
static int contexts_line; /* where open_contexts() creates contexts */

static struct {
    long (*live_comms)(void);
    long (*pending)(void);
} ncclfault;

/* A rank thread's outcome: s (a call's status) or, when it succeeded, the wait for comm's
 * work; the status into *status and the last error's text into message. */
static inline void rank_outcome(sc_status s, sc_comm comm, sc_status *status, char *message,
                                size_t size)
{
    if (s == SC_OK)
        s = sc_comm_synchronize(comm);
    *status = s;
    snprintf(message, size, "%s", sc_last_error());
}

static inline void comm_td_attach(void)
{
    fake_attach();
    const char *lib = getenv("SAFECUDA_LIBNCCL");
    REQUIRE(lib && lib[0]);
    int v = 0;
    REQUIRE(sc_comm_library_version(&v) == SC_OK);
    void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(h != NULL);
    memcpy(&ncclfault.live_comms, &(void *){dlsym(h, "safecuda_ncclfault_live_comms")},
           sizeof(void *));
    memcpy(&ncclfault.pending, &(void *){dlsym(h, "safecuda_ncclfault_pending")},
           sizeof(void *));
    REQUIRE(ncclfault.live_comms && ncclfault.pending);
}

static inline void open_contexts(int n)
{
    for (int i = 0; i < n; i++) {
        sc_context_desc d = {.device = i};
        contexts_line = __LINE__ + 1;
        REQUIRE(sc_context_create(&d, &ctxs[i]) == SC_OK);
    }
}

static inline void close_contexts(int n)
{
    for (int i = 0; i < n; i++)
        CHECK_OK(sc_context_destroy(ctxs[i]));
}

/* n communicators over contexts 0 .. n-1, labelled "world". */
static inline void world(int n, uint32_t timeout_ms)
{
    sc_comm_all_desc d = {.timeout_ms = timeout_ms, .label = "world"};
    comms_line = __LINE__ + 1;
    REQUIRE(sc_comm_create_all(ctxs, n, &d, comms) == SC_OK);
}

static inline void end_world(int n)
{
    for (int i = 0; i < n; i++)
        CHECK_OK(sc_comm_destroy(comms[i]));
    CHECK(ncclfault.live_comms() == 0);
    CHECK(ncclfault.pending() == 0);
}

static inline sc_buffer buf(sc_context ctx, sc_dtype dtype, uint64_t count, const char *label)
{
    sc_buffer b;
    sc_buffer_desc d = {.dtype = dtype, .count = count, .label = label, .zero = true};
    buffer_line = __LINE__ + 1;
    REQUIRE(sc_buffer_create(ctx, &d, &b) == SC_OK);
    return b;
}

/* "buffer 'x' of 16 f32 (created at comm_td.h:LINE)" */
static inline const char *bdesc(const char *label, uint64_t count, const char *dtype, char *out,
                                size_t size)
{
    snprintf(out, size, "buffer '%s' of %llu %s (created at comm_td.h:%d)", label,
             (unsigned long long)count, dtype, buffer_line);
    return out;
}

/* "communicator 'world' (rank R of N on device D, created at comm_td.h:LINE)" */
static inline const char *cdesc(int rank, int n, char *out, size_t size)
{
    snprintf(out, size, "communicator 'world' (rank %d of %d on device %d, created at "
             "comm_td.h:%d)", rank, n, rank, comms_line);
    return out;
}

static inline void upload(sc_buffer b, const void *data, size_t bytes)
{
    REQUIRE(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), data, bytes) == SC_OK);
}

static inline void download(sc_buffer b, void *data, size_t bytes)
{
    REQUIRE(sc_copy_to_host(SC_DEFAULT_STREAM, data, bytes, sc_view_of(b)) == SC_OK);
}

#endif
