/* The resolved entry points (private to src/driver/). */
#ifndef SAFECUDA_DRIVER_TABLE_H
#define SAFECUDA_DRIVER_TABLE_H

#include <stddef.h>

#include "driver/cuda_api.h"

#define SCI_CU_FIELD(name, ver, req, params, args) CUresult (*name) params;
struct sci_cu_table {
    SCI_CU_FUNCS(SCI_CU_FIELD)
};
#undef SCI_CU_FIELD

#define SCI_NVRTC_FIELD(name, req, params, args) nvrtcResult (*name) params;
struct sci_nvrtc_table {
    SCI_NVRTC_FUNCS(SCI_NVRTC_FIELD)
    const char *(*nvrtcGetErrorString)(nvrtcResult r);
};
#undef SCI_NVRTC_FIELD

extern struct sci_cu_table sci_cu_table;
extern struct sci_nvrtc_table sci_nvrtc_table;

struct sci_cu_entry {
    const char *name;
    int version;
    int required;
    size_t offset;
};
extern const struct sci_cu_entry sci_cu_entries[];
extern const size_t sci_cu_entry_count;

struct sci_nvrtc_entry {
    const char *name;
    int required;
    size_t offset;
};
extern const struct sci_nvrtc_entry sci_nvrtc_entries[];
extern const size_t sci_nvrtc_entry_count;

#endif
