/* The handle registry: one pool of slots per object kind, each slot with a generation
 * counter (sokol_gfx's design). A handle id packs the kind, the slot and the generation:
 *
 *     bits 63..56 kind   bits 55..24 generation (1 .. 2^32-1)   bits 23..0 slot
 *
 * Destroying an object bumps its slot's generation, so an old id no longer matches: a
 * later use or a second destroy is SC_ERR_STALE_HANDLE. A slot whose generation would
 * wrap is retired, never reused, so no id can ever name two objects. An id of another kind
 * is SC_ERR_WRONG_KIND; 0 and ids never issued are SC_ERR_STALE_HANDLE.
 *
 * Lookups take a reference (acquire/release); removal unpublishes the id at once and then
 * waits until the references taken before it are released, so an object is never freed
 * under a thread that is using it. All functions are thread-safe. */
#ifndef SAFECUDA_CORE_REGISTRY_H
#define SAFECUDA_CORE_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

typedef enum sci_kind {
    SCI_KIND_NONE = 0,
    SCI_KIND_CONTEXT,
    SCI_KIND_BUFFER,
    SCI_KIND_HOST_BUFFER,
    SCI_KIND_STREAM,
    SCI_KIND_EVENT,
    SCI_KIND_PROGRAM,
    SCI_KIND_MODULE,
    SCI_KIND_KERNEL,
    SCI_KIND_MOE,
    SCI_KIND_GRAPH,
    SCI_KIND_GRAPH_EXEC,
    SCI_KIND_DLPACK_EXPORT, /* a DLPack export whose deleter has not run (src/interop/) */
    SCI_KIND_COMM,          /* a communicator (src/comm/) */
    SCI_KIND_TEST_A, /* for the registry's own tests */
    SCI_KIND_TEST_B,
    SCI_KIND_COUNT
} sci_kind;

#define SCI_SLOT_BITS 24
#define SCI_MAX_SLOTS (1u << SCI_SLOT_BITS)

/* The header every registered object starts with. */
typedef struct sci_object {
    sci_kind kind;
    uint64_t id;
    uint64_t owner;  /* the owning context's id; 0 for contexts */
    uint64_t serial; /* creation order, for reports */
    const char *file;
    int line;
    char label[64];
    bool internal;   /* owned by the library (e.g. a default stream): never a leak */
} sci_object;

/* What a kind tells the registry: its name, how to describe an object in a leak report,
 * and how to free an object that sci_registry_remove has unpublished: the kind's part of
 * its destroy, which returns what the public destroy would (fn names that destroy). Every
 * destroy of an object, the public one and sc_context_destroy's of a leaked object alike,
 * goes through one path: sci_object_destroy (core/context.h), which pins the context,
 * removes the object and calls destroy. */
typedef struct sci_kind_ops {
    const char *name;
    void (*describe)(const sci_object *obj, sc_object_info *info);
    sc_status (*destroy)(sci_object *obj, const char *fn);
} sci_kind_ops;

void sci_registry_set_ops(sci_kind kind, const sci_kind_ops *ops);
const char *sci_kind_name(sci_kind kind);

/* Initialise obj's header (kind, owner, site, label) and publish it; sets obj->id. */
sc_status sci_registry_insert(sci_object *obj, sci_kind kind, uint64_t owner,
                              const char *label, const char *file, int line, const char *fn);

/* Find the live object of `kind` named by id and take a reference on it. */
sc_status sci_registry_acquire(sci_kind kind, uint64_t id, const char *fn, sci_object **out);
void sci_registry_release(sci_object *obj);

/* Unpublish id and wait for earlier references to drop; *out gets the object, which the
 * caller then frees. The caller must not hold a reference to it. */
sc_status sci_registry_remove(sci_kind kind, uint64_t id, const char *fn, sci_object **out);

/* The ids of the live objects of `kind` owned by `owner` (internal ones included), in
 * creation order (malloc'd; the caller frees). owner 0 lists every object of the kind. */
size_t sci_registry_list(sci_kind kind, uint64_t owner, uint64_t **ids);

/* Describe the live user objects (internal ones left out) of every kind owned by owner,
 * in creation order (kind by kind). Writes up to capacity entries; returns the count. */
size_t sci_registry_describe(uint64_t owner, sc_object_info *out, size_t capacity);

/* Mark a live object as the library's own (never a leak), under the registry's lock: other
 * threads read the flag when they list live objects. False if id names no live object. */
bool sci_registry_mark_internal(sci_kind kind, uint64_t id);

/* Unpublish the object of `kind` named by id (sci_registry_remove) and free it through its
 * kind's ops->destroy; its status. SC_OK and nothing done for a kind without ops->destroy.
 * Without the context's pin: sci_object_destroy is the destroy of the library's objects. */
sc_status sci_registry_destroy(sci_kind kind, uint64_t id, const char *fn);

/* Number of live objects of a kind (all owners). */
size_t sci_registry_live_count(sci_kind kind);

/* Tests only: force the generation of the slot an id names. */
void sci_registry_debug_set_generation(sci_kind kind, uint64_t id, uint32_t generation);

static inline uint32_t sci_id_slot(uint64_t id) { return (uint32_t)(id & (SCI_MAX_SLOTS - 1)); }
static inline uint32_t sci_id_generation(uint64_t id) { return (uint32_t)(id >> 24); }
static inline sci_kind sci_id_kind(uint64_t id) { return (sci_kind)(id >> 56); }

#endif
