/* Errors: the thread-local message of the last failure and helpers that set it. */
#ifndef SAFECUDA_CORE_ERROR_H
#define SAFECUDA_CORE_ERROR_H

#include "driver/cuda_api.h"
#include "safecuda.h"

#define SCI_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Set the thread's message to "fn: <formatted>" and return status. */
sc_status sci_fail(sc_status status, const char *fn, const char *fmt, ...) SCI_PRINTF(3, 4);

/* A driver call failed: "fn: <formatted>: CUDA_ERROR_X (driver text)". The status is
 * SC_ERR_OUT_OF_MEMORY, SC_ERR_NOT_READY, SC_ERR_CONTEXT_LOST (sticky errors) or
 * SC_ERR_DRIVER. Contexts mark themselves lost through sci_context_fail_cu instead. */
sc_status sci_fail_cu(CUresult r, const char *fn, const char *fmt, ...) SCI_PRINTF(3, 4);
sc_status sci_status_from_cu(CUresult r);

/* Append to the current message (for multi-part messages such as compile logs). */
void sci_error_append(const char *fmt, ...) SCI_PRINTF(1, 2);

/* The current message did not fit and ends with the cut marker. */
bool sci_error_was_cut(void);

/* Keep the thread's current message across calls that may set their own: save returns a
 * copy (NULL if there is none or no memory), restore puts it back and frees it. */
char *sci_error_save(void);
void sci_error_restore(char *saved);

/* "demo.c" for "/home/me/src/demo.c"; "?" for NULL. */
const char *sci_basename(const char *path);

/* Checked size arithmetic: false on overflow. */
static inline bool sci_mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool sci_add_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

/* Return early with an invalid-argument error if a required pointer is NULL. */
#define SCI_CHECK_PTR(fn, p)                                                            \
    do {                                                                               \
        if (!(p))                                                                      \
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "argument '%s' is NULL", #p);  \
    } while (0)

#endif
