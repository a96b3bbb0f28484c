/* Devices: ordinal checks and property queries. */
#ifndef SAFECUDA_CORE_DEVICE_H
#define SAFECUDA_CORE_DEVICE_H

#include "core/error.h"

/* Load the driver and check that ordinal names a device; *dev gets its CUdevice. */
sc_status sci_device_get(int ordinal, const char *fn, CUdevice *dev);
sc_status sci_device_props(int ordinal, CUdevice dev, const char *fn, sc_device_props *props);

#endif
