#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/registry.h"

typedef struct entry {
    sci_object *obj;    /* NULL when the slot is free or retired */
    uint32_t generation;
    uint32_t refs;
    uint32_t next_free; /* free-queue link (slot index + 1, 0 = end) */
    bool retired;
    bool removing;
    const char *dead_file; /* creation site of the slot's last destroyed object */
    int dead_line;
} entry;

typedef struct registry {
    pthread_mutex_t lock;
    pthread_cond_t released;
    entry *entries;
    uint32_t capacity;
    uint32_t used;       /* slots ever handed out */
    uint32_t free_head;  /* FIFO of free slots (index + 1), so reuse is spread out */
    uint32_t free_tail;
    size_t live;
    const sci_kind_ops *ops;
} registry;

static registry registries[SCI_KIND_COUNT] = {
#define R {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0, 0, NULL}
    R, R, R, R, R, R, R, R, R, R, R, R, R, R, R, R,
#undef R
};
_Static_assert(SCI_KIND_COUNT == 16, "update the registries initializer");

static atomic_uint_fast64_t next_serial = 1;

static const char *const default_names[SCI_KIND_COUNT] = {
    [SCI_KIND_NONE] = "invalid",     [SCI_KIND_CONTEXT] = "context",
    [SCI_KIND_BUFFER] = "buffer",    [SCI_KIND_HOST_BUFFER] = "host buffer",
    [SCI_KIND_STREAM] = "stream",    [SCI_KIND_EVENT] = "event",
    [SCI_KIND_PROGRAM] = "program",  [SCI_KIND_MODULE] = "module",
    [SCI_KIND_KERNEL] = "kernel",    [SCI_KIND_MOE] = "moe layer",
    [SCI_KIND_GRAPH] = "graph",      [SCI_KIND_GRAPH_EXEC] = "executable graph",
    [SCI_KIND_DLPACK_EXPORT] = "dlpack export", [SCI_KIND_COMM] = "communicator",
    [SCI_KIND_TEST_A] = "test-a",    [SCI_KIND_TEST_B] = "test-b",
};

const char *sci_kind_name(sci_kind kind)
{
    if ((unsigned)kind >= SCI_KIND_COUNT)
        return "unknown";
    return default_names[kind];
}

void sci_registry_set_ops(sci_kind kind, const sci_kind_ops *ops)
{
    registry *r = &registries[kind];
    pthread_mutex_lock(&r->lock);
    r->ops = ops;
    pthread_mutex_unlock(&r->lock);
}

static uint64_t make_id(sci_kind kind, uint32_t generation, uint32_t slot)
{
    return ((uint64_t)kind << 56) | ((uint64_t)generation << 24) | slot;
}

sc_status sci_registry_insert(sci_object *obj, sci_kind kind, uint64_t owner,
                              const char *label, const char *file, int line, const char *fn)
{
    registry *r = &registries[kind];
    pthread_mutex_lock(&r->lock);
    uint32_t slot;
    if (r->free_head) {
        slot = r->free_head - 1;
        r->free_head = r->entries[slot].next_free;
        if (!r->free_head)
            r->free_tail = 0;
    } else {
        if (r->used == SCI_MAX_SLOTS) {
            pthread_mutex_unlock(&r->lock);
            return sci_fail(SC_ERR_LIMIT, fn, "too many live %s objects (%u)",
                            sci_kind_name(kind), SCI_MAX_SLOTS);
        }
        if (r->used == r->capacity) {
            uint32_t cap = r->capacity ? r->capacity * 2 : 64;
            if (cap > SCI_MAX_SLOTS)
                cap = SCI_MAX_SLOTS;
            entry *grown = realloc(r->entries, (size_t)cap * sizeof *grown);
            if (!grown) {
                pthread_mutex_unlock(&r->lock);
                return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn,
                                "cannot grow the %s table to %u slots", sci_kind_name(kind),
                                cap);
            }
            memset(grown + r->capacity, 0, (size_t)(cap - r->capacity) * sizeof *grown);
            r->entries = grown;
            r->capacity = cap;
        }
        slot = r->used++;
        r->entries[slot].generation = 1;
    }
    entry *e = &r->entries[slot];
    e->next_free = 0;
    e->obj = obj;
    e->refs = 0;
    e->removing = false;
    obj->kind = kind;
    obj->owner = owner;
    obj->file = file;
    obj->line = line;
    obj->serial = atomic_fetch_add(&next_serial, 1);
    snprintf(obj->label, sizeof obj->label, "%s", label ? label : "");
    obj->id = make_id(kind, e->generation, slot);
    r->live++;
    pthread_mutex_unlock(&r->lock);
    return SC_OK;
}

/* Under r->lock: the entry id names, or an error message. */
static sc_status find(registry *r, sci_kind kind, uint64_t id, const char *fn, entry **out)
{
    const char *kname = sci_kind_name(kind);
    if (id == 0)
        return sci_fail(SC_ERR_STALE_HANDLE, fn,
                        "null %s handle (zero-initialised, or its create call failed)", kname);
    sci_kind got = sci_id_kind(id);
    if (got != kind)
        return sci_fail(SC_ERR_WRONG_KIND, fn, "handle 0x%016llx is a %s handle, not a %s",
                        (unsigned long long)id, sci_kind_name(got), kname);
    uint32_t slot = sci_id_slot(id), gen = sci_id_generation(id);
    if (slot >= r->used || gen == 0)
        return sci_fail(SC_ERR_STALE_HANDLE, fn,
                        "%s handle 0x%016llx was never issued (slot %u, generation %u)", kname,
                        (unsigned long long)id, slot, gen);
    entry *e = &r->entries[slot];
    if (e->removing && e->generation == gen)
        return sci_fail(SC_ERR_STALE_HANDLE, fn,
                        "stale %s handle: the %s created at %s:%d is being destroyed", kname,
                        kname, sci_basename(e->obj->file), e->obj->line);
    if (!e->obj || e->generation != gen) {
        bool last = (e->retired && gen == e->generation) ||
                    (!e->retired && (uint64_t)gen + 1 == e->generation);
        if (last)
            return sci_fail(SC_ERR_STALE_HANDLE, fn,
                            "stale %s handle: the %s created at %s:%d was destroyed", kname,
                            kname, sci_basename(e->dead_file), e->dead_line);
        if (gen < e->generation)
            return sci_fail(SC_ERR_STALE_HANDLE, fn,
                            "stale %s handle 0x%016llx: its %s was destroyed", kname,
                            (unsigned long long)id, kname);
        return sci_fail(SC_ERR_STALE_HANDLE, fn,
                        "%s handle 0x%016llx was never issued (slot %u, generation %u)", kname,
                        (unsigned long long)id, slot, gen);
    }
    *out = e;
    return SC_OK;
}

sc_status sci_registry_acquire(sci_kind kind, uint64_t id, const char *fn, sci_object **out)
{
    registry *r = &registries[kind];
    pthread_mutex_lock(&r->lock);
    entry *e = NULL;
    sc_status s = find(r, kind, id, fn, &e);
    if (s == SC_OK) {
        e->refs++;
        *out = e->obj;
    }
    pthread_mutex_unlock(&r->lock);
    return s;
}

void sci_registry_release(sci_object *obj)
{
    registry *r = &registries[obj->kind];
    pthread_mutex_lock(&r->lock);
    entry *e = &r->entries[sci_id_slot(obj->id)];
    if (--e->refs == 0 && e->removing)
        pthread_cond_broadcast(&r->released);
    pthread_mutex_unlock(&r->lock);
}

sc_status sci_registry_remove(sci_kind kind, uint64_t id, const char *fn, sci_object **out)
{
    registry *r = &registries[kind];
    pthread_mutex_lock(&r->lock);
    entry *e = NULL;
    sc_status s = find(r, kind, id, fn, &e);
    if (s != SC_OK) {
        pthread_mutex_unlock(&r->lock);
        return s;
    }
    e->removing = true; /* from now on the id is stale for everyone */
    while (e->refs > 0)
        pthread_cond_wait(&r->released, &r->lock);
    /* e may have moved if the table grew while we waited: look it up again. */
    uint32_t slot = sci_id_slot(id);
    e = &r->entries[slot];
    *out = e->obj;
    e->dead_file = e->obj->file;
    e->dead_line = e->obj->line;
    e->obj = NULL;
    e->removing = false;
    r->live--;
    if (e->generation == UINT32_MAX) {
        e->retired = true; /* never reuse: an old id could name the next object */
    } else {
        e->generation++;
        e->next_free = 0;
        if (r->free_tail)
            r->entries[r->free_tail - 1].next_free = slot + 1;
        else
            r->free_head = slot + 1;
        r->free_tail = slot + 1;
    }
    pthread_mutex_unlock(&r->lock);
    return SC_OK;
}

static int by_serial(const void *a, const void *b)
{
    const sci_object *x = *(sci_object *const *)a, *y = *(sci_object *const *)b;
    return (x->serial > y->serial) - (x->serial < y->serial);
}

static bool listed(const entry *e, uint64_t owner, bool with_internal)
{
    return e->obj && !e->removing && (owner == 0 || e->obj->owner == owner) &&
           (with_internal || !e->obj->internal);
}

/* Under r->lock: the live objects of owner, sorted by creation; malloc'd. */
static size_t collect(registry *r, uint64_t owner, bool with_internal, sci_object ***out)
{
    *out = NULL;
    size_t n = 0;
    for (uint32_t i = 0; i < r->used; i++)
        if (listed(&r->entries[i], owner, with_internal))
            n++;
    if (n == 0)
        return 0;
    sci_object **list = malloc(n * sizeof *list);
    if (!list)
        return 0;
    size_t k = 0;
    for (uint32_t i = 0; i < r->used; i++)
        if (listed(&r->entries[i], owner, with_internal))
            list[k++] = r->entries[i].obj;
    qsort(list, n, sizeof *list, by_serial);
    *out = list;
    return n;
}

size_t sci_registry_list(sci_kind kind, uint64_t owner, uint64_t **ids)
{
    registry *r = &registries[kind];
    *ids = NULL;
    pthread_mutex_lock(&r->lock);
    sci_object **list;
    size_t n = collect(r, owner, true, &list);
    uint64_t *out = n ? malloc(n * sizeof *out) : NULL;
    if (n && !out)
        n = 0;
    for (size_t i = 0; i < n; i++)
        out[i] = list[i]->id;
    pthread_mutex_unlock(&r->lock);
    free(list);
    *ids = out;
    return n;
}

size_t sci_registry_describe(uint64_t owner, sc_object_info *out, size_t capacity)
{
    size_t total = 0;
    for (int k = 1; k < SCI_KIND_COUNT; k++) {
        registry *r = &registries[k];
        pthread_mutex_lock(&r->lock);
        sci_object **list;
        size_t n = collect(r, owner, false, &list);
        for (size_t i = 0; i < n; i++, total++) {
            if (total >= capacity || !out)
                continue;
            sc_object_info *info = &out[total];
            memset(info, 0, sizeof *info);
            info->kind = r->ops && r->ops->name ? r->ops->name : sci_kind_name((sci_kind)k);
            snprintf(info->label, sizeof info->label, "%s", list[i]->label);
            info->file = sci_basename(list[i]->file);
            info->line = list[i]->line;
            if (r->ops && r->ops->describe)
                r->ops->describe(list[i], info);
        }
        pthread_mutex_unlock(&r->lock);
        free(list);
    }
    return total;
}

size_t sci_registry_live_count(sci_kind kind)
{
    registry *r = &registries[kind];
    pthread_mutex_lock(&r->lock);
    size_t n = r->live;
    pthread_mutex_unlock(&r->lock);
    return n;
}

void sci_registry_debug_set_generation(sci_kind kind, uint64_t id, uint32_t generation)
{
    registry *r = &registries[kind];
    pthread_mutex_lock(&r->lock);
    uint32_t slot = sci_id_slot(id);
    if (slot < r->used && r->entries[slot].obj) {
        r->entries[slot].generation = generation;
        r->entries[slot].obj->id = make_id(kind, generation, slot);
    }
    pthread_mutex_unlock(&r->lock);
}

bool sci_registry_mark_internal(sci_kind kind, uint64_t id)
{
    registry *r = &registries[kind];
    pthread_mutex_lock(&r->lock);
    uint32_t slot = sci_id_slot(id);
    entry *e = slot < r->used ? &r->entries[slot] : NULL;
    bool live = e && e->obj && !e->removing && e->generation == sci_id_generation(id) &&
                sci_id_kind(id) == kind;
    if (live)
        e->obj->internal = true;
    pthread_mutex_unlock(&r->lock);
    return live;
}

sc_status sci_registry_destroy(sci_kind kind, uint64_t id, const char *fn)
{
    registry *r = &registries[kind];
    pthread_mutex_lock(&r->lock);
    const sci_kind_ops *ops = r->ops;
    pthread_mutex_unlock(&r->lock);
    if (!ops || !ops->destroy)
        return SC_OK;
    sci_object *obj = NULL;
    sc_status s = sci_registry_remove(kind, id, fn, &obj);
    if (s != SC_OK)
        return s;
    return ops->destroy(obj, fn);
}
