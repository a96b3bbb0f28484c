/* The handle registry: stale, double-destroy, foreign and wrapped handles, enumeration,
 * 10^6 cycles and concurrent use. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "../test.h"
#include "core/registry.h"

typedef struct thing {
    sci_object obj;
    int value;
} thing;

static atomic_int destroyed;

static void describe_thing(const sci_object *obj, sc_object_info *info)
{
    snprintf(info->detail, sizeof info->detail, "value %d", ((const thing *)obj)->value);
    info->bytes = 16;
}

static sc_status destroy_thing(sci_object *obj, const char *fn)
{
    (void)fn;
    free(obj);
    atomic_fetch_add(&destroyed, 1);
    return SC_OK;
}

static const sci_kind_ops thing_ops = {"thing", describe_thing, destroy_thing};

static uint64_t make(int value, uint64_t owner, int line)
{
    thing *t = calloc(1, sizeof *t);
    t->value = value;
    REQUIRE(sci_registry_insert(&t->obj, SCI_KIND_TEST_A, owner, "lbl", "dir/maker.c", line,
                                "make") == SC_OK);
    return t->obj.id;
}

static sc_status destroy(uint64_t id)
{
    sci_object *obj;
    sc_status s = sci_registry_remove(SCI_KIND_TEST_A, id, "thing_destroy", &obj);
    if (s == SC_OK)
        free(obj);
    return s;
}

static void test_stale_and_double(void)
{
    uint64_t id = make(1, 0, 10);
    sci_object *obj;
    CHECK_OK(sci_registry_acquire(SCI_KIND_TEST_A, id, "use", &obj));
    CHECK(((thing *)obj)->value == 1);
    sci_registry_release(obj);
    CHECK_OK(destroy(id));
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, id, "use", &obj), SC_ERR_STALE_HANDLE);
    CHECK_MSG("use: stale test-a handle: the test-a created at maker.c:10 was destroyed");
    CHECK_STATUS(destroy(id), SC_ERR_STALE_HANDLE); /* double destroy */
    CHECK_MSG("thing_destroy: stale");
    /* The slot is reused with a new generation: the old id stays stale. */
    uint64_t id2 = make(2, 0, 11);
    CHECK(id2 != id);
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, id, "use", &obj), SC_ERR_STALE_HANDLE);
    CHECK_OK(destroy(id2));
}

static void test_foreign(void)
{
    uint64_t id = make(3, 0, 20);
    sci_object *obj;
    /* A handle of another kind. */
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_B, id, "other_use", &obj),
                 SC_ERR_WRONG_KIND);
    CHECK_MSG("other_use: handle 0x");
    CHECK_MSG("is a test-a handle, not a test-b");
    /* Null and never-issued handles. */
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, 0, "use", &obj), SC_ERR_STALE_HANDLE);
    CHECK_MSG("null test-a handle");
    uint64_t forged = ((uint64_t)SCI_KIND_TEST_A << 56) | (1ull << 24) | 999999;
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, forged, "use", &obj),
                 SC_ERR_STALE_HANDLE);
    CHECK_MSG("was never issued");
    uint64_t future = id + (5ull << 24); /* a generation the slot has not reached */
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, future, "use", &obj),
                 SC_ERR_STALE_HANDLE);
    CHECK_MSG("was never issued");
    uint64_t zero_gen = id & ~(0xffffffffull << 24);
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, zero_gen, "use", &obj),
                 SC_ERR_STALE_HANDLE);
    CHECK_OK(destroy(id));
}

static void test_generation_wrap(void)
{
    uint64_t id = make(4, 0, 30);
    sci_registry_debug_set_generation(SCI_KIND_TEST_A, id, UINT32_MAX);
    sci_object *obj;
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, id, "use", &obj), SC_ERR_STALE_HANDLE);
    uint64_t wrapped = (id & ~(0xffffffffull << 24)) | ((uint64_t)UINT32_MAX << 24);
    CHECK(sci_id_generation(wrapped) == UINT32_MAX);
    CHECK_OK(sci_registry_acquire(SCI_KIND_TEST_A, wrapped, "use", &obj));
    sci_registry_release(obj);
    CHECK_OK(destroy(wrapped));
    /* The slot is retired: no later object may take it, so no old id can alias. */
    for (int i = 0; i < 200; i++) {
        uint64_t other = make(i, 0, 31);
        CHECK(sci_id_slot(other) != sci_id_slot(wrapped));
        CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, wrapped, "use", &obj),
                     SC_ERR_STALE_HANDLE);
        CHECK_OK(destroy(other));
    }
    CHECK_MSG("was destroyed");
}

static void test_enumeration(void)
{
    uint64_t owner = 0xabcdef;
    uint64_t ids[5];
    for (int i = 0; i < 5; i++)
        ids[i] = make(100 + i, i == 2 ? 7 : owner, 40 + i);
    uint64_t *list;
    size_t n = sci_registry_list(SCI_KIND_TEST_A, owner, &list);
    CHECK(n == 4);
    for (size_t i = 0; i < n && i < 4; i++)
        CHECK(list[i] == ids[i < 2 ? i : i + 1]); /* creation order, owner filtered */
    free(list);

    sci_registry_set_ops(SCI_KIND_TEST_A, &thing_ops);
    sc_object_info info[8];
    size_t total = sci_registry_describe(owner, info, 8);
    CHECK(total == 4);
    CHECK(strcmp(info[0].kind, "thing") == 0);
    CHECK(strcmp(info[0].label, "lbl") == 0);
    CHECK(strcmp(info[0].detail, "value 100") == 0);
    CHECK(strcmp(info[0].file, "maker.c") == 0 && info[0].line == 40);
    CHECK(info[3].line == 44 && info[3].bytes == 16);
    CHECK(sci_registry_describe(owner, info, 2) == 4); /* count past capacity */
    CHECK(sci_registry_describe(owner, NULL, 0) == 4);

    /* Destroy-by-id removes the object and frees it through the kind's destroy function
     * (every destroy's path); a stale id is refused before it, with the caller's name. */
    n = sci_registry_list(SCI_KIND_TEST_A, owner, &list);
    atomic_store(&destroyed, 0);
    for (size_t i = 0; i < n; i++)
        CHECK_OK(sci_registry_destroy(SCI_KIND_TEST_A, list[i], "destroy_thing"));
    CHECK(atomic_load(&destroyed) == 4);
    CHECK_STATUS(sci_registry_destroy(SCI_KIND_TEST_A, list[0], "destroy_thing"),
                 SC_ERR_STALE_HANDLE);
    CHECK_MSG("destroy_thing: stale test-a handle: the test-a created at maker.c:40 was "
              "destroyed");
    free(list);
    CHECK(atomic_load(&destroyed) == 4);
    CHECK(sci_registry_describe(owner, NULL, 0) == 0);
    CHECK_OK(destroy(ids[2]));
    sci_registry_set_ops(SCI_KIND_TEST_A, NULL);
}

static void test_million_cycles(void)
{
    size_t before = sci_registry_live_count(SCI_KIND_TEST_A);
    thing *t = calloc(1, sizeof *t);
    uint64_t first = 0, last = 0;
    for (int i = 0; i < 1000000; i++) {
        if (sci_registry_insert(&t->obj, SCI_KIND_TEST_A, 1, NULL, __FILE__, __LINE__, "cyc") !=
            SC_OK) {
            CHECK(!"insert failed");
            break;
        }
        if (i == 0)
            first = t->obj.id;
        last = t->obj.id;
        sci_object *obj;
        if (sci_registry_remove(SCI_KIND_TEST_A, t->obj.id, "cyc", &obj) != SC_OK) {
            CHECK(!"remove failed");
            break;
        }
    }
    free(t);
    sci_object *obj;
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, first, "use", &obj), SC_ERR_STALE_HANDLE);
    CHECK_STATUS(sci_registry_acquire(SCI_KIND_TEST_A, last, "use", &obj), SC_ERR_STALE_HANDLE);
    CHECK(sci_registry_live_count(SCI_KIND_TEST_A) == before);
}

/* ---- concurrency ---------------------------------------------------------------------- */

#define THREADS 8
#define SHARED 64
static uint64_t shared_ids[SHARED];
static atomic_int bad;

static void *hammer(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg * 7919 + 1;
    for (int i = 0; i < 50000; i++) {
        uint64_t r = test_rand(&seed);
        /* Private objects: create, use, destroy. */
        uint64_t id = make((int)(r & 0xffff), 2, 50);
        sci_object *obj;
        if (sci_registry_acquire(SCI_KIND_TEST_A, id, "t", &obj) != SC_OK ||
            ((thing *)obj)->value != (int)(r & 0xffff))
            atomic_fetch_add(&bad, 1);
        else
            sci_registry_release(obj);
        if (destroy(id) != SC_OK || destroy(id) != SC_ERR_STALE_HANDLE)
            atomic_fetch_add(&bad, 1);
        /* Shared objects: every thread reads them at once. */
        uint64_t sid = shared_ids[r % SHARED];
        if (sci_registry_acquire(SCI_KIND_TEST_A, sid, "t", &obj) != SC_OK ||
            ((thing *)obj)->value != (int)(r % SHARED))
            atomic_fetch_add(&bad, 1);
        else
            sci_registry_release(obj);
    }
    return NULL;
}

static void test_threads(void)
{
    for (int i = 0; i < SHARED; i++)
        shared_ids[i] = make(i, 3, 60);
    pthread_t t[THREADS];
    for (intptr_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, hammer, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    CHECK(atomic_load(&bad) == 0);
    for (int i = 0; i < SHARED; i++)
        CHECK_OK(destroy(shared_ids[i]));
}

/* Destroy waits for a reference taken before it, and the id is stale at once. */
static atomic_int holder_done;
static void *holder(void *arg)
{
    sci_object *obj = arg;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    atomic_store(&holder_done, 1);
    sci_registry_release(obj);
    return NULL;
}

static void test_remove_waits(void)
{
    uint64_t id = make(9, 0, 70);
    sci_object *obj;
    CHECK_OK(sci_registry_acquire(SCI_KIND_TEST_A, id, "use", &obj));
    pthread_t t;
    pthread_create(&t, NULL, holder, obj);
    CHECK_OK(destroy(id)); /* blocks until holder releases */
    CHECK(atomic_load(&holder_done) == 1);
    pthread_join(t, NULL);
}

int main(void)
{
    test_stale_and_double();
    test_foreign();
    test_generation_wrap();
    test_enumeration();
    test_million_cycles();
    test_threads();
    test_remove_waits();
    CHECK(sci_registry_live_count(SCI_KIND_TEST_A) == 0);
    return test_result("test_registry");
}
