/* The wrappers every other layer calls, one per entry point, and the fault-injection
 * hook they share. A wrapper costs one relaxed atomic load more than the raw call. */
#include <stdatomic.h>
#include <string.h>

#include "driver/driver.h"
#include "driver/table.h"

#define SCI_CU_ROW(name, ver, req, params, args) \
    {#name, ver, req, offsetof(struct sci_cu_table, name)},
const struct sci_cu_entry sci_cu_entries[] = {SCI_CU_FUNCS(SCI_CU_ROW)};
const size_t sci_cu_entry_count = sizeof sci_cu_entries / sizeof sci_cu_entries[0];

#define SCI_NVRTC_ROW(name, req, params, args) \
    {#name, req, offsetof(struct sci_nvrtc_table, name)},
const struct sci_nvrtc_entry sci_nvrtc_entries[] = {SCI_NVRTC_FUNCS(SCI_NVRTC_ROW)};
const size_t sci_nvrtc_entry_count = sizeof sci_nvrtc_entries / sizeof sci_nvrtc_entries[0];

/* ---- fault injection ------------------------------------------------------------------ */

static atomic_int fault_armed;       /* 0: off; -1: every entry; else 1 + the entry's index */
static _Atomic(const char *) fault_last_name; /* the entry point of the call that failed */
static atomic_uint_fast64_t fault_calls;
static uint64_t fault_nth;
static int fault_error;
static atomic_bool fault_fired;

bool sci_fault_arm(const char *name, uint64_t nth, int error)
{
    int index = -1;
    if (strcmp(name, "*") == 0)
        index = -2; /* armed value -1: count every entry point */
    for (size_t i = 0; i < sci_cu_entry_count; i++)
        if (strcmp(sci_cu_entries[i].name, name) == 0)
            index = (int)i;
    for (size_t i = 0; i < sci_nvrtc_entry_count; i++)
        if (strcmp(sci_nvrtc_entries[i].name, name) == 0)
            index = (int)(sci_cu_entry_count + i);
    if (index == -1)
        return false;
    atomic_store(&fault_armed, 0);
    fault_nth = nth;
    fault_error = error;
    atomic_store(&fault_calls, 0);
    atomic_store(&fault_fired, false);
    atomic_store(&fault_armed, index + 1);
    return true;
}

void sci_fault_disarm(void) { atomic_store(&fault_armed, 0); }
uint64_t sci_fault_calls(void) { return atomic_load(&fault_calls); }
const char *sci_fault_last_name(void) { return atomic_load(&fault_last_name); }
bool sci_fault_fired(void) { return atomic_load(&fault_fired); }

static const char *entry_name(int index)
{
    if ((size_t)index < sci_cu_entry_count)
        return sci_cu_entries[index].name;
    return sci_nvrtc_entries[(size_t)index - sci_cu_entry_count].name;
}

/* Returns true (and the error to answer) when this call of entry `index` must fail. */
static inline bool fault_hit(int index, int *error)
{
    int armed = atomic_load_explicit(&fault_armed, memory_order_relaxed);
    if (__builtin_expect(armed == 0, 1) || (armed != index + 1 && armed != -1))
        return false;
    uint64_t n = atomic_fetch_add(&fault_calls, 1) + 1;
    if (n != fault_nth)
        return false;
    atomic_store(&fault_fired, true);
    atomic_store(&fault_last_name, entry_name(index));
    *error = fault_error;
    return true;
}

/* Index constants: the position of each entry in its table. */
#define SCI_CU_ENUM(name, ver, req, params, args) SCI_IDX_##name,
enum { SCI_CU_FUNCS(SCI_CU_ENUM) SCI_IDX_CU_COUNT };
#define SCI_NVRTC_ENUM(name, req, params, args) SCI_IDX_##name,
enum { SCI_IDX_NVRTC_BASE = SCI_IDX_CU_COUNT - 1, SCI_NVRTC_FUNCS(SCI_NVRTC_ENUM) };

#define SCI_CU_WRAPPER(name, ver, req, params, args)               \
    CUresult sci_##name params                                     \
    {                                                              \
        int injected;                                              \
        if (fault_hit(SCI_IDX_##name, &injected))                  \
            return (CUresult)injected;                             \
        if (!sci_cu_table.name)                                    \
            return CUDA_ERROR_NOT_INITIALIZED;                     \
        return sci_cu_table.name args;                             \
    }
SCI_CU_FUNCS(SCI_CU_WRAPPER)

#define SCI_NVRTC_WRAPPER(name, req, params, args)                 \
    nvrtcResult sci_##name params                                  \
    {                                                              \
        int injected;                                              \
        if (fault_hit(SCI_IDX_##name, &injected))                  \
            return (nvrtcResult)injected;                          \
        if (!sci_nvrtc_table.name)                                 \
            return 7; /* NVRTC_ERROR_INTERNAL_ERROR */             \
        return sci_nvrtc_table.name args;                          \
    }
SCI_NVRTC_FUNCS(SCI_NVRTC_WRAPPER)
