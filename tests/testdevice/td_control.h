/* The host tests' view of the test device (testdevice/testdevice.c, "the fake" here): its
 * counters, looked up in the copy of libsafecuda_testdevice.so that safecuda loaded
 * (SAFECUDA_LIBCUDA). The test device runs no kernels: nothing measured through it says
 * anything about a GPU. */
#ifndef SAFECUDA_TESTS_FAKE_CONTROL_H
#define SAFECUDA_TESTS_FAKE_CONTROL_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safecuda.h"

#ifndef RTLD_NOLOAD
#define RTLD_NOLOAD 0x00004 /* glibc's value; <dlfcn.h> hides it without _GNU_SOURCE */
#endif

static struct fake_api {
    int (*misuse_count)(void);
    long (*live_device_allocations)(void);
    long (*live_host_allocations)(void);
    long (*live_streams)(void);
    long (*live_events)(void);
    long (*live_modules)(void);
    long (*live_pools)(void);
    long (*primary_refcount)(void);
    unsigned long long (*device_used_bytes)(void);
    unsigned long long (*pool_cached_bytes)(void);
    long (*reclaimed_allocations)(void);
    long (*live_graphs)(void);
    long (*live_graph_execs)(void);
    long (*active_captures)(void);
    long (*refused_launches)(void);
    const char *(*last_misuse)(void);
    void (*set_reclaim_on_release)(int on);
    int (*set_pointer_attributes)(unsigned long long base, int memory_type, int managed,
                                  int ordinal, int foreign_context);
} fake;

/* The objects the fake holds: what a leak check compares. */
typedef struct fake_counts {
    long device, host, streams, events, modules, pools, refcount;
    long graphs, graph_execs, captures; /* captures: begun, not ended */
} fake_counts;

static inline void *fake_sym_(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "test device: no symbol %s in %s\n", name, getenv("SAFECUDA_LIBCUDA"));
        exit(1);
    }
    return p;
}

/* Load the driver through safecuda, then find the fake's test symbols. Exits on failure
 * (these tests mean nothing without the fake). */
static inline void fake_attach(void)
{
    const char *path = getenv("SAFECUDA_LIBCUDA");
    if (!path || !path[0]) {
        fprintf(stderr, "SAFECUDA_LIBCUDA is not set: these tests run against the test "
                        "device (libsafecuda_testdevice.so)\n");
        exit(1);
    }
    if (sc_init() != SC_OK) {
        fprintf(stderr, "sc_init failed against the test device: %s\n", sc_last_error());
        exit(1);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        fprintf(stderr, "the test device %s is not loaded: %s\n", path, dlerror());
        exit(1);
    }
#define FAKE_SYM(field, name) memcpy(&fake.field, &(void *){fake_sym_(h, name)}, sizeof(void *))
    FAKE_SYM(misuse_count, "safecuda_testdevice_misuse_count");
    FAKE_SYM(live_device_allocations, "safecuda_testdevice_live_device_allocations");
    FAKE_SYM(live_host_allocations, "safecuda_testdevice_live_host_allocations");
    FAKE_SYM(live_streams, "safecuda_testdevice_live_streams");
    FAKE_SYM(live_events, "safecuda_testdevice_live_events");
    FAKE_SYM(live_modules, "safecuda_testdevice_live_modules");
    FAKE_SYM(live_pools, "safecuda_testdevice_live_pools");
    FAKE_SYM(primary_refcount, "safecuda_testdevice_primary_refcount");
    FAKE_SYM(device_used_bytes, "safecuda_testdevice_device_used_bytes");
    FAKE_SYM(pool_cached_bytes, "safecuda_testdevice_pool_cached_bytes");
    FAKE_SYM(reclaimed_allocations, "safecuda_testdevice_reclaimed_allocations");
    FAKE_SYM(live_graphs, "safecuda_testdevice_live_graphs");
    FAKE_SYM(live_graph_execs, "safecuda_testdevice_live_graph_execs");
    FAKE_SYM(active_captures, "safecuda_testdevice_active_captures");
    FAKE_SYM(refused_launches, "safecuda_testdevice_refused_launches");
    FAKE_SYM(last_misuse, "safecuda_testdevice_last_misuse");
    FAKE_SYM(set_reclaim_on_release, "safecuda_testdevice_set_reclaim_on_release");
    FAKE_SYM(set_pointer_attributes, "safecuda_testdevice_set_pointer_attributes");
#undef FAKE_SYM
    dlclose(h); /* drops only the reference taken here: safecuda's keeps it loaded */
}

static inline fake_counts fake_counts_now(void)
{
    fake_counts c = {fake.live_device_allocations(), fake.live_host_allocations(),
                     fake.live_streams(),            fake.live_events(),
                     fake.live_modules(),            fake.live_pools(),
                     fake.primary_refcount(),        fake.live_graphs(),
                     fake.live_graph_execs(),        fake.active_captures()};
    return c;
}

/* Writes the differences into buf (if any) and returns how many counters differ. */
static inline int fake_counts_diff(fake_counts want, fake_counts got, char *buf, size_t size)
{
    int n = 0;
    size_t len = 0;
    if (size)
        buf[0] = '\0';
#define FAKE_CMP(f)                                                                         \
    if (want.f != got.f) {                                                                  \
        n++;                                                                                \
        if (len < size)                                                                     \
            len += (size_t)snprintf(buf + len, size - len, "%s%s %ld (want %ld)",           \
                                    len ? ", " : "", #f, got.f, want.f);                    \
    }
    FAKE_CMP(device) FAKE_CMP(host) FAKE_CMP(streams) FAKE_CMP(events) FAKE_CMP(modules)
    FAKE_CMP(pools) FAKE_CMP(refcount) FAKE_CMP(graphs) FAKE_CMP(graph_execs) FAKE_CMP(captures)
#undef FAKE_CMP
    return n;
}

/* A tensor map as the test device encodes it (testdevice/tensor_map.c): the arguments the
 * library passed to cuTensorMapEncodeTiled. 0 when the bytes are not the test device's
 * encoding. */
typedef struct fake_tensor_map {
    uint64_t address;
    unsigned rank, dtype, interleave, swizzle, l2_promotion, oob_fill;
    uint64_t dims[5], strides[4]; /* strides in bytes (globalStrides), rank - 1 of them */
    unsigned box[5], element_strides[5];
} fake_tensor_map;

static inline int fake_tensor_map_decode(const unsigned char encoded[128], fake_tensor_map *t)
{
    uint64_t o[16];
    memcpy(o, encoded, sizeof o);
    memset(t, 0, sizeof *t);
    if (o[1] >> 56 != 0x7d)
        return 0;
    t->address = o[0];
    t->rank = (unsigned)(o[1] & 0xff);
    t->dtype = (unsigned)(o[1] >> 8 & 0xff);
    t->interleave = (unsigned)(o[1] >> 16 & 0xff);
    t->swizzle = (unsigned)(o[1] >> 24 & 0xff);
    t->l2_promotion = (unsigned)(o[1] >> 32 & 0xff);
    t->oob_fill = (unsigned)(o[1] >> 40 & 0xff);
    for (int i = 0; i < 5; i++) {
        t->dims[i] = o[2 + i];
        if (i < 4)
            t->strides[i] = o[7 + i];
        t->box[i] = (unsigned)(i < 4 ? o[11] >> (16 * i) & 0xffff : o[12] & 0xffff);
        t->element_strides[i] = (unsigned)(o[12] >> (16 + 8 * i) & 0xff);
    }
    return 1;
}

#endif
