#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "driver/driver.h"

#define SCI_MESSAGE_SIZE 16384

static _Thread_local char message[SCI_MESSAGE_SIZE];

static const char *const status_names[SC_STATUS_COUNT] = {
    [SC_OK] = "SC_OK",
    [SC_ERR_INVALID_ARGUMENT] = "SC_ERR_INVALID_ARGUMENT",
    [SC_ERR_NO_DRIVER] = "SC_ERR_NO_DRIVER",
    [SC_ERR_NO_COMPILER] = "SC_ERR_NO_COMPILER",
    [SC_ERR_NO_DEVICE] = "SC_ERR_NO_DEVICE",
    [SC_ERR_STALE_HANDLE] = "SC_ERR_STALE_HANDLE",
    [SC_ERR_WRONG_KIND] = "SC_ERR_WRONG_KIND",
    [SC_ERR_WRONG_CONTEXT] = "SC_ERR_WRONG_CONTEXT",
    [SC_ERR_OUT_OF_MEMORY] = "SC_ERR_OUT_OF_MEMORY",
    [SC_ERR_HOST_OUT_OF_MEMORY] = "SC_ERR_HOST_OUT_OF_MEMORY",
    [SC_ERR_BUDGET_EXCEEDED] = "SC_ERR_BUDGET_EXCEEDED",
    [SC_ERR_OUT_OF_BOUNDS] = "SC_ERR_OUT_OF_BOUNDS",
    [SC_ERR_OVERFLOW] = "SC_ERR_OVERFLOW",
    [SC_ERR_TYPE_MISMATCH] = "SC_ERR_TYPE_MISMATCH",
    [SC_ERR_BUSY] = "SC_ERR_BUSY",
    [SC_ERR_NOT_READY] = "SC_ERR_NOT_READY",
    [SC_ERR_LEAKED] = "SC_ERR_LEAKED",
    [SC_ERR_CONTEXT_LOST] = "SC_ERR_CONTEXT_LOST",
    [SC_ERR_DRIVER] = "SC_ERR_DRIVER",
    [SC_ERR_COMPILE] = "SC_ERR_COMPILE",
    [SC_ERR_LAUNCH] = "SC_ERR_LAUNCH",
    [SC_ERR_NOT_SUPPORTED] = "SC_ERR_NOT_SUPPORTED",
    [SC_ERR_IO] = "SC_ERR_IO",
    [SC_ERR_LIMIT] = "SC_ERR_LIMIT",
    [SC_ERR_INTERNAL] = "SC_ERR_INTERNAL",
    [SC_ERR_CAPTURE] = "SC_ERR_CAPTURE",
    [SC_ERR_CAPTURE_INVALIDATED] = "SC_ERR_CAPTURE_INVALIDATED",
    [SC_ERR_NO_NCCL] = "SC_ERR_NO_NCCL",
    [SC_ERR_COMM] = "SC_ERR_COMM",
    [SC_ERR_TIMEOUT] = "SC_ERR_TIMEOUT",
};

const char *sc_status_name(sc_status status)
{
    if ((unsigned)status >= SC_STATUS_COUNT || !status_names[status])
        return "SC_STATUS_UNKNOWN";
    return status_names[status];
}

/* A message longer than the buffer keeps its start and ends with
 * "... [message cut: N of M bytes shown]": N bytes of the text, M its whole length. */
static _Thread_local size_t whole_length; /* the message's length, had it not been cut */
static _Thread_local size_t kept_length;  /* when cut: the bytes kept before the marker; else 0 */

const char *sc_last_error(void) { return message; }

void sc_clear_error(void)
{
    message[0] = '\0';
    whole_length = kept_length = 0;
}

bool sci_error_was_cut(void) { return kept_length != 0; }

/* Write the marker after as much of the text as fits (at most kept_length bytes, never
 * ending inside a UTF-8 sequence). */
static void write_marker(void)
{
    static const char fmt[] = "... [message cut: %zu of %zu bytes shown]";
    char marker[96];
    size_t keep = kept_length;
    int m = snprintf(marker, sizeof marker, fmt, keep, whole_length);
    if (m < 0)
        return;
    if (keep + (size_t)m + 1 > sizeof message)
        keep = sizeof message - 1 - (size_t)m;
    while (keep > 0 && ((unsigned char)message[keep] & 0xc0) == 0x80)
        keep--;
    /* keep only shrank, so the marker is no longer than measured */
    m = snprintf(marker, sizeof marker, fmt, keep, whole_length);
    kept_length = keep;
    memcpy(message + keep, marker, (size_t)m + 1);
}

/* n bytes were formatted at message + at (vsnprintf's count: the whole text, also when
 * it did not fit). */
static void account(size_t at, int n)
{
    if (n < 0)
        return;
    whole_length = at + (size_t)n;
    if (whole_length < sizeof message)
        return;
    kept_length = sizeof message - 1;
    write_marker();
}

static void vset(const char *fn, const char *fmt, va_list ap)
{
    whole_length = kept_length = 0;
    int n = snprintf(message, sizeof message, "%s: ", fn ? fn : "safecuda");
    if (n < 0)
        return;
    if ((size_t)n >= sizeof message) {
        account(0, n);
        return;
    }
    account((size_t)n, vsnprintf(message + n, sizeof message - (size_t)n, fmt, ap));
}

sc_status sci_fail(sc_status status, const char *fn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fn, fmt, ap);
    va_end(ap);
    return status;
}

void sci_error_append(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (kept_length) { /* already cut: the text is not shown, its length is counted */
        int n = vsnprintf(NULL, 0, fmt, ap);
        if (n > 0) {
            whole_length += (size_t)n;
            write_marker();
        }
    } else {
        size_t len = strlen(message);
        account(len, vsnprintf(message + len, sizeof message - len, fmt, ap));
    }
    va_end(ap);
}

/* The saved copy: the text, its NUL, then the two lengths. */
char *sci_error_save(void)
{
    size_t len = strlen(message);
    char *copy = len ? malloc(len + 1 + 2 * sizeof(size_t)) : NULL;
    if (copy) {
        memcpy(copy, message, len + 1);
        memcpy(copy + len + 1, &whole_length, sizeof whole_length);
        memcpy(copy + len + 1 + sizeof whole_length, &kept_length, sizeof kept_length);
    }
    return copy;
}

void sci_error_restore(char *saved)
{
    if (!saved)
        return;
    size_t len = strlen(saved);
    memcpy(message, saved, len + 1);
    memcpy(&whole_length, saved + len + 1, sizeof whole_length);
    memcpy(&kept_length, saved + len + 1 + sizeof whole_length, sizeof kept_length);
    free(saved);
}

sc_status sci_status_from_cu(CUresult r)
{
    if (r == CUDA_SUCCESS)
        return SC_OK;
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return SC_ERR_OUT_OF_MEMORY;
    if (r == CUDA_ERROR_NOT_READY)
        return SC_ERR_NOT_READY;
    if (r == CUDA_ERROR_STUB_LIBRARY)
        return SC_ERR_NO_DRIVER;
    if (r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_INVALID_DEVICE)
        return SC_ERR_NO_DEVICE;
    if (r == CUDA_ERROR_NOT_SUPPORTED)
        return SC_ERR_NOT_SUPPORTED;
    /* A capture the driver refused or invalidated: not a device fault, the context stays. */
    if (r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED || r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
        return SC_ERR_CAPTURE_INVALIDATED;
    if (r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == CUDA_ERROR_STREAM_CAPTURE_MERGE ||
        r == CUDA_ERROR_STREAM_CAPTURE_UNMATCHED || r == CUDA_ERROR_STREAM_CAPTURE_ISOLATION ||
        r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || r == CUDA_ERROR_CAPTURED_EVENT ||
        r == CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
        return SC_ERR_CAPTURE;
    if (sci_cu_error_is_sticky(r))
        return SC_ERR_CONTEXT_LOST;
    return SC_ERR_DRIVER;
}

sc_status sci_fail_cu(CUresult r, const char *fn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(fn, fmt, ap);
    va_end(ap);
    sci_error_append(": %s (%s)", sci_cu_error_name(r), sci_cu_error_string(r));
    return sci_status_from_cu(r);
}

const char *sci_basename(const char *path)
{
    if (!path)
        return "?";
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}
