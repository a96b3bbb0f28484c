/* Library messages (leak reports, warnings) through the user's callback or stderr. */
#ifndef SAFECUDA_CORE_LOG_H
#define SAFECUDA_CORE_LOG_H

#include "core/error.h"

void sci_log(sc_log_level level, const char *fmt, ...) SCI_PRINTF(2, 3);

#endif
