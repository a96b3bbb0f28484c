#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context.h"
#include "core/guard.h"
#include "core/device.h"
#include "core/library.h"
#include "core/log.h"
#include "driver/driver.h"

static void describe_context(const sci_object *obj, sc_object_info *info)
{
    const sci_context *c = (const sci_context *)obj;
    snprintf(info->detail, sizeof info->detail, "device %d", c->device);
}

static const sci_kind_ops context_ops = {"context", describe_context, NULL};

__attribute__((constructor)) static void register_context_kind(void)
{
    sci_registry_set_ops(SCI_KIND_CONTEXT, &context_ops);
}

/* ---- teardown hooks ---------------------------------------------------------------------- */

#define SCI_MAX_TEARDOWN 8
static struct {
    sci_context_teardown_fn fn;
    int order;
} teardowns[SCI_MAX_TEARDOWN];
static int n_teardowns;

void sci_context_add_teardown(sci_context_teardown_fn fn, int order)
{
    if (n_teardowns == SCI_MAX_TEARDOWN)
        return;
    int i = n_teardowns++;
    while (i > 0 && teardowns[i - 1].order > order) {
        teardowns[i] = teardowns[i - 1];
        i--;
    }
    teardowns[i].fn = fn;
    teardowns[i].order = order;
}

/* ---- health and current context ---------------------------------------------------------- */

static sc_status lost_error(sci_context *c, const char *fn)
{
    return sci_fail(SC_ERR_CONTEXT_LOST, fn,
                    "the context on device %d (created at %s:%d) is lost: %s; destroy it "
                    "(and, as CUDA requires after such errors, restart the process to use the "
                    "device again)",
                    c->device, sci_basename(c->obj.file), c->obj.line, c->lost_message);
}

bool sci_context_mark_lost(sci_context *c, CUresult r, const char *fn, const char *what)
{
    if (!sci_cu_error_is_sticky(r))
        return false;
    pthread_mutex_lock(&c->lost_lock);
    if (!atomic_load(&c->lost)) {
        snprintf(c->lost_message, sizeof c->lost_message, "%s: %s: %s (%s)", fn, what,
                 sci_cu_error_name(r), sci_cu_error_string(r));
        atomic_store(&c->lost, true);
    }
    pthread_mutex_unlock(&c->lost_lock);
    return true;
}

static sc_status vfail_cu(sci_context *c, CUresult r, const char *fn, const char *fmt,
                          va_list ap)
{
    char what[512];
    vsnprintf(what, sizeof what, fmt, ap);
    if (sci_context_mark_lost(c, r, fn, what))
        return lost_error(c, fn);
    return sci_fail_cu(r, fn, "%s", what);
}

sc_status sci_context_fail_cu(sci_context *c, CUresult r, const char *fn, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sc_status s = vfail_cu(c, r, fn, fmt, ap);
    va_end(ap);
    return s;
}

sc_status sci_context_tolerate_cu(sci_context *c, CUresult r, const char *fn, const char *fmt,
                                  ...)
{
    if (!sci_cu_error_is_sticky(r))
        return SC_OK;
    va_list ap;
    va_start(ap, fmt);
    sc_status s = vfail_cu(c, r, fn, fmt, ap);
    va_end(ap);
    return s;
}

sc_status sci_context_cleanup_cu(sci_context *c, sc_status s, CUresult r, const char *call)
{
    if (r == CUDA_SUCCESS)
        return s;
    sci_error_append(" (and %s failed while cleaning up: %s)", call, sci_cu_error_name(r));
    if (sci_context_mark_lost(c, r, "cleanup", call))
        return SC_ERR_CONTEXT_LOST;
    return s;
}

/* ---- destroy paths --------------------------------------------------------------------- */

void sci_release_begin(sci_release *rl, sci_context *c, const char *fn)
{
    rl->c = c;
    rl->fn = fn;
    rl->was_lost = atomic_load(&c->lost);
    rl->status = SC_OK;
    rl->message = NULL;
}

bool sci_release_live(const sci_release *rl) { return !atomic_load(&rl->c->lost); }

static void release_note(sci_release *rl, CUresult r, bool tolerate, const char *fmt,
                         va_list ap)
{
    if (r == CUDA_SUCCESS || (tolerate && !sci_cu_error_is_sticky(r)))
        return;
    if (rl->was_lost)
        return; /* expected on a lost context: everything goes with it */
    if (rl->status != SC_OK) { /* not the first failure: only the context's health */
        char what[512];
        vsnprintf(what, sizeof what, fmt, ap);
        sci_context_mark_lost(rl->c, r, rl->fn, what);
        return;
    }
    rl->status = vfail_cu(rl->c, r, rl->fn, fmt, ap);
    rl->message = sci_error_save();
}

void sci_release_check(sci_release *rl, CUresult r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    release_note(rl, r, false, fmt, ap);
    va_end(ap);
}

void sci_release_tolerate(sci_release *rl, CUresult r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    release_note(rl, r, true, fmt, ap);
    va_end(ap);
}

void sci_release_status(sci_release *rl, sc_status s)
{
    if (s == SC_OK || rl->was_lost || rl->status != SC_OK)
        return;
    rl->status = s;
    rl->message = sci_error_save();
}

sc_status sci_release_end(sci_release *rl)
{
    if (rl->was_lost) {
        free(rl->message);
        rl->message = NULL;
        return SC_OK;
    }
    if (rl->status != SC_OK)
        sci_error_restore(rl->message); /* later calls may have set their own */
    else
        free(rl->message);
    rl->message = NULL;
    return rl->status;
}

CUresult sci_context_make_current_cu(sci_context *c, const char **call)
{
    CUcontext cur = NULL;
    *call = "cuCtxGetCurrent";
    CUresult r = sci_cuCtxGetCurrent(&cur);
    if (r == CUDA_SUCCESS && cur == c->cu)
        return CUDA_SUCCESS;
    if (sci_cu_error_is_sticky(r)) /* else: not known to be current, so make it current */
        return r;
    *call = "cuCtxSetCurrent";
    return sci_cuCtxSetCurrent(c->cu);
}

static sc_status make_current(sci_context *c, const char *fn)
{
    const char *call;
    CUresult r = sci_context_make_current_cu(c, &call);
    if (r != CUDA_SUCCESS)
        return sci_context_fail_cu(c, r, fn, "%s failed", call);
    return SC_OK;
}

void sci_release_make_current(sci_release *rl)
{
    const char *call;
    CUresult r = sci_context_make_current_cu(rl->c, &call);
    sci_release_tolerate(rl, r, "%s failed", call);
}

sc_status sci_context_enter(sci_context *c, const char *fn)
{
    if (atomic_load_explicit(&c->lost, memory_order_acquire))
        return lost_error(c, fn);
    return make_current(c, fn);
}

sc_status sci_context_acquire(sc_context h, const char *fn, sci_context **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_CONTEXT, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_context *c = (sci_context *)obj;
    s = sci_context_enter(c, fn);
    if (s != SC_OK) {
        sci_registry_release(obj);
        return s;
    }
    *out = c;
    return SC_OK;
}

void sci_context_release(sci_context *c) { sci_registry_release(&c->obj); }

/* ---- destroys on other threads ---------------------------------------------------------- */

/* The context sc_context_destroy is destroying on this thread (0: none): the destroys of its
 * objects that it runs need no reference on it. */
static _Thread_local uint64_t destroying;

sc_status sci_context_pin(sci_kind kind, uint64_t id, const char *fn, sci_context **pinned)
{
    *pinned = NULL;
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(kind, id, fn, &obj);
    if (s != SC_OK)
        return s;
    const uint64_t owner = obj->owner;
    const char *file = obj->file;
    const int line = obj->line;
    sci_registry_release(obj);
    if (owner == 0 || owner == destroying)
        return SC_OK;
    sci_object *co = NULL;
    if (sci_registry_acquire(SCI_KIND_CONTEXT, owner, fn, &co) != SC_OK)
        return sci_fail(SC_ERR_STALE_HANDLE, fn,
                        "stale %s handle: the %s created at %s:%d is being destroyed with its "
                        "context",
                        sci_kind_name(kind), sci_kind_name(kind), sci_basename(file), line);
    *pinned = (sci_context *)co;
    return SC_OK;
}

void sci_context_unpin(sci_context *pinned)
{
    if (pinned)
        sci_registry_release(&pinned->obj);
}

sc_status sci_object_destroy(sci_kind kind, uint64_t id, sci_destroy_check_fn check,
                             const char *fn)
{
    sci_context *pin = NULL; /* the context outlives the destroy */
    sc_status s = sci_context_pin(kind, id, fn, &pin);
    if (s != SC_OK)
        return s;
    if (check)
        s = check(id, fn);
    if (s == SC_OK)
        s = sci_registry_destroy(kind, id, fn);
    sci_context_unpin(pin);
    return s;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

sc_status sc_context_create_at(const sc_context_desc *desc, sc_context *out, const char *file,
                               int line)
{
    static const char fn[] = "sc_context_create";
    SCI_CHECK_PTR(fn, out);
    out->id = 0;
    sc_context_desc d = desc ? *desc : (sc_context_desc){0};
    CUdevice dev;
    sc_status s = sci_device_get(d.device, fn, &dev);
    if (s != SC_OK)
        return s;

    sci_context *c = calloc(1, sizeof *c);
    if (!c)
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a context");
    c->device = d.device;
    c->cu_device = dev;
    c->vram_budget = d.vram_budget;
    c->tracking = !d.disable_event_tracking;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->lost_lock, NULL);
    s = sci_device_props(d.device, dev, fn, &c->props);
    if (s != SC_OK)
        goto fail_free;

    CUresult r = sci_cuDevicePrimaryCtxRetain(&c->cu, dev);
    if (r != CUDA_SUCCESS) {
        s = sci_fail_cu(r, fn, "cuDevicePrimaryCtxRetain(device %d) failed", d.device);
        goto fail_free;
    }
    r = sci_cuCtxSetCurrent(c->cu);
    if (r != CUDA_SUCCESS) {
        s = sci_fail_cu(r, fn, "cuCtxSetCurrent(device %d) failed", d.device);
        goto fail_release;
    }
    char label[32];
    snprintf(label, sizeof label, "device %d", d.device);
    s = sci_registry_insert(&c->obj, SCI_KIND_CONTEXT, 0, label, file, line, fn);
    if (s != SC_OK)
        goto fail_release;
    out->id = c->obj.id;
    return SC_OK;

fail_release:
    sci_cuDevicePrimaryCtxRelease(dev);
fail_free:
    pthread_mutex_destroy(&c->lost_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return s;
}

/* Kinds in the order their leaked objects are freed: users before what they use (DLPack
 * exports let go of their buffers' memory before the buffers go; a communicator finishes
 * its collectives, which use buffers and streams, before those go). */
static const sci_kind destroy_order[] = {
    SCI_KIND_GRAPH_EXEC, SCI_KIND_GRAPH,          SCI_KIND_MOE,    SCI_KIND_COMM,
    SCI_KIND_KERNEL,     SCI_KIND_MODULE,         SCI_KIND_PROGRAM, SCI_KIND_EVENT,
    SCI_KIND_DLPACK_EXPORT, SCI_KIND_BUFFER,      SCI_KIND_HOST_BUFFER, SCI_KIND_STREAM,
    SCI_KIND_TEST_A,     SCI_KIND_TEST_B,
};

static size_t report_live(sci_context *c, const char *why)
{
    size_t n = sci_registry_describe(c->obj.id, NULL, 0);
    if (n == 0)
        return 0;
    sc_object_info *list = calloc(n, sizeof *list);
    if (!list) {
        sci_log(SC_LOG_WARN, "%s: %zu live objects (no memory to list them)", why, n);
        return n;
    }
    size_t got = sci_registry_describe(c->obj.id, list, n);
    if (got < n)
        n = got;
    sci_log(SC_LOG_WARN, "%s: context on device %d (created at %s:%d) has %zu live object%s:",
            why, c->device, sci_basename(c->obj.file), c->obj.line, n, n == 1 ? "" : "s");
    for (size_t i = 0; i < n; i++)
        sci_log(SC_LOG_WARN, "  %s '%s' %s, %llu bytes, created at %s:%d", list[i].kind,
                list[i].label, list[i].detail, (unsigned long long)list[i].bytes, list[i].file,
                list[i].line);
    free(list);
    return n;
}

sc_status sc_context_destroy(sc_context h)
{
    static const char fn[] = "sc_context_destroy";
    sci_object *obj = NULL;
    /* Waits for every reference, the destroys of its objects running on other threads
     * included (sci_context_pin); none can be taken from now on. */
    sc_status s = sci_registry_remove(SCI_KIND_CONTEXT, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_context *c = (sci_context *)obj;
    sci_release rl;
    sci_release_begin(&rl, c, fn);
    sci_release_make_current(&rl);
    const uint64_t outer = destroying;
    destroying = c->obj.id;

    /* Every object still alive (the default stream included) goes through its kind's
     * destroy, which reports its own release failures. */
    size_t leaked = report_live(c, fn);
    for (size_t k = 0; k < sizeof destroy_order / sizeof destroy_order[0]; k++) {
        uint64_t *ids;
        size_t n = sci_registry_list(destroy_order[k], c->obj.id, &ids);
        for (size_t i = 0; i < n; i++)
            sci_release_status(&rl, sci_object_destroy(destroy_order[k], ids[i], NULL, fn));
        free(ids);
    }
    destroying = outer;
    /* (Not while another context's capture forbids it: the primary context's release
     * waits for the work then.) */
    if (sci_release_live(&rl) && !sci_guard_active())
        sci_release_check(&rl, sci_cuCtxSynchronize(), "cuCtxSynchronize failed");
    for (int i = 0; i < n_teardowns; i++)
        teardowns[i].fn(c, &rl);
    sci_release_tolerate(&rl, sci_cuCtxSetCurrent(NULL), "cuCtxSetCurrent(NULL) failed");
    /* The primary context's release is reported even on a lost context: while it stays
     * retained, so does everything the context holds. */
    CUresult r = sci_cuDevicePrimaryCtxRelease(c->cu_device);
    sc_status result = sci_release_end(&rl);
    if (r != CUDA_SUCCESS) {
        if (result == SC_OK)
            result = sci_fail_cu(r, fn, "cuDevicePrimaryCtxRelease(device %d) failed: the "
                                 "primary context stays retained", c->device);
        else
            sci_error_append(" (and cuDevicePrimaryCtxRelease(device %d) failed: %s)",
                             c->device, sci_cu_error_name(r));
    }
    pthread_mutex_destroy(&c->lost_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
    if (leaked && result == SC_OK)
        result = sci_fail(SC_ERR_LEAKED, fn,
                          "%zu object%s still alive at destroy (listed in the log) and now "
                          "freed",
                          leaked, leaked == 1 ? " was" : "s were");
    return result;
}

/* ---- queries --------------------------------------------------------------------------------- */

sc_status sc_context_device(sc_context h, int *device)
{
    SCI_CHECK_PTR("sc_context_device", device);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_CONTEXT, h.id, "sc_context_device", &obj);
    if (s != SC_OK)
        return s;
    *device = ((sci_context *)obj)->device;
    sci_registry_release(obj);
    return SC_OK;
}

sc_status sc_context_synchronize(sc_context h)
{
    static const char fn[] = "sc_context_synchronize";
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(h, fn, &c);
    if (s != SC_OK)
        return s;
    if ((s = sci_guard_refuse_context(c, fn, "synchronizing the context")) != SC_OK) {
        sci_context_release(c);
        return s;
    }
    CUresult r = sci_cuCtxSynchronize();
    if (r != CUDA_SUCCESS)
        s = sci_context_fail_cu(c, r, fn, "cuCtxSynchronize failed");
    sci_context_release(c);
    return s;
}

sc_status sc_context_check(sc_context h)
{
    sci_context *c = NULL;
    sc_status s = sci_context_acquire(h, "sc_context_check", &c);
    if (s != SC_OK)
        return s;
    sci_context_release(c);
    return SC_OK;
}

sc_status sc_context_live_objects(sc_context h, sc_object_info *out, size_t capacity,
                                  size_t *count)
{
    static const char fn[] = "sc_context_live_objects";
    SCI_CHECK_PTR(fn, count);
    if (!out && capacity)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "out is NULL but capacity is %zu",
                        capacity);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_CONTEXT, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    *count = sci_registry_describe(obj->id, out, capacity);
    sci_registry_release(obj);
    return SC_OK;
}

sc_status sc_context_live_report(sc_context h, size_t *count)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_CONTEXT, h.id, "sc_context_live_report", &obj);
    if (s != SC_OK)
        return s;
    size_t n = report_live((sci_context *)obj, "sc_context_live_report");
    sci_registry_release(obj);
    if (count)
        *count = n;
    return SC_OK;
}
