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
};

const char *sc_status_name(sc_status status)
{
    if ((unsigned)status >= SC_STATUS_COUNT || !status_names[status])
        return "SC_STATUS_UNKNOWN";
    return status_names[status];
}

const char *sc_last_error(void) { return message; }
void sc_clear_error(void) { message[0] = '\0'; }

static void vset(const char *fn, const char *fmt, va_list ap)
{
    int n = snprintf(message, sizeof message, "%s: ", fn ? fn : "safecuda");
    if (n < 0 || (size_t)n >= sizeof message)
        return;
    vsnprintf(message + n, sizeof message - (size_t)n, fmt, ap);
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
    size_t len = strlen(message);
    if (len + 1 >= sizeof message)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message + len, sizeof message - len, fmt, ap);
    va_end(ap);
}

char *sci_error_save(void)
{
    size_t len = strlen(message);
    char *copy = len ? malloc(len + 1) : NULL;
    if (copy)
        memcpy(copy, message, len + 1);
    return copy;
}

void sci_error_restore(char *saved)
{
    if (!saved)
        return;
    snprintf(message, sizeof message, "%s", saved);
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
