/* Library-wide state: loading the driver on first use. */
#ifndef SAFECUDA_CORE_LIBRARY_H
#define SAFECUDA_CORE_LIBRARY_H

#include "core/error.h"

/* Load the driver if needed; on failure set fn's message from the loader's reason. */
sc_status sci_driver_ready(const char *fn);
/* Likewise for NVRTC. */
sc_status sci_compiler_ready(const char *fn);

#endif
