/* Communicators: the object, its NCCL communicator and its life (create, create_all,
 * destroy, abort), the GPUs' issue locks, waiting for NCCL with the timeout. */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/log.h"
#include "driver/driver.h"

/* ---- time, waiting, issue locks --------------------------------------------------------- */

uint64_t sci_comm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sci_comm_backoff(uint64_t since_ns)
{
    /* NCCL's non-blocking calls finish their work in NCCL's own threads, typically within
     * tens of microseconds: a sleep there would be most of a small collective's time (a
     * 100 us sleep made every checked collective take 0.2 ms on two H200s, against NCCL's
     * 9 us). So: yields for the first 2 ms, then short sleeps, then 1 ms ones. */
    const uint64_t waited = sci_comm_now_ns() - since_ns;
    if (waited < 2000000u) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, waited < 50000000u ? 50000L : 1000000L};
    nanosleep(&ts, NULL);
}

#define DEVICE_LOCKS 64
static pthread_mutex_t device_locks[DEVICE_LOCKS];
static pthread_once_t device_locks_once = PTHREAD_ONCE_INIT;

static void init_device_locks(void)
{
    for (int i = 0; i < DEVICE_LOCKS; i++)
        pthread_mutex_init(&device_locks[i], NULL);
}

static pthread_mutex_t *device_lock(int device)
{
    pthread_once(&device_locks_once, init_device_locks);
    return &device_locks[(unsigned)device % DEVICE_LOCKS];
}

void sci_comm_lock_device(int device) { pthread_mutex_lock(device_lock(device)); }
bool sci_comm_trylock_device(int device) { return pthread_mutex_trylock(device_lock(device)) == 0; }
void sci_comm_unlock_device(int device) { pthread_mutex_unlock(device_lock(device)); }

static int by_lock(const void *a, const void *b)
{
    unsigned x = (unsigned)*(const int *)a % DEVICE_LOCKS;
    unsigned y = (unsigned)*(const int *)b % DEVICE_LOCKS;
    return x < y ? -1 : x > y;
}

size_t sci_comm_lock_devices(int *devices, size_t n)
{
    qsort(devices, n, sizeof *devices, by_lock);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || by_lock(&devices[m - 1], &devices[i]) != 0)
            devices[m++] = devices[i];
    for (size_t i = 0; i < m; i++)
        sci_comm_lock_device(devices[i]);
    return m;
}

void sci_comm_unlock_devices(const int *devices, size_t n)
{
    for (size_t i = n; i-- > 0;)
        sci_comm_unlock_device(devices[i]);
}

/* ---- the object --------------------------------------------------------------------------- */

static void describe_comm(const sci_object *obj, sc_object_info *info)
{
    const sci_comm *c = (const sci_comm *)obj;
    snprintf(info->detail, sizeof info->detail, "rank %d of %d, device %d", c->rank, c->nranks,
             c->ctx->device);
}

static sc_status comm_destroy(sci_object *obj, const char *fn);
static const sci_kind_ops comm_ops = {"communicator", describe_comm, comm_destroy};

__attribute__((constructor)) static void register_comm_kind(void)
{
    sci_registry_set_ops(SCI_KIND_COMM, &comm_ops);
}

const char *sci_comm_describe(const sci_comm *c, char *buf, size_t size)
{
    snprintf(buf, size, "communicator '%s' (rank %d of %d on device %d, created at %s:%d)",
             c->obj.label, c->rank, c->nranks, c->ctx->device, sci_basename(c->obj.file),
             c->obj.line);
    return buf;
}

sc_status sci_comm_acquire(sc_comm h, const char *fn, sci_comm **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_COMM, h.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_comm *c = (sci_comm *)obj;
    if ((s = sci_context_enter(c->ctx, fn)) != SC_OK) {
        sci_registry_release(obj);
        return s;
    }
    *out = c;
    return SC_OK;
}

void sci_comm_release(sci_comm *c)
{
    if (c)
        sci_registry_release(&c->obj);
}

sc_status sci_comm_check_alive(sci_comm *c, const char *fn)
{
    pthread_mutex_lock(&c->lock);
    sc_status s = SC_OK;
    if (c->aborted)
        s = sci_fail(c->abort_status, fn, "%s", c->abort_reason);
    pthread_mutex_unlock(&c->lock);
    return s;
}

sc_status sci_comm_check_usable(sci_object *obj, const char *fn)
{
    if (obj->kind != SCI_KIND_COMM)
        return SC_OK;
    return sci_comm_check_alive((sci_comm *)obj, fn);
}

const char *sci_comm_nccl_error(ncclResult_t r, ncclComm_t comm, char *buf, size_t size)
{
    const char *last = sci_nccl_last_error(comm);
    snprintf(buf, size, "%s (%s)%s%s", sci_nccl_error_name(r), sci_nccl_error_string(r),
             last[0] ? "; NCCL's last error: " : "", last);
    return buf;
}

void sci_comm_abort_locked(sci_comm *c, sc_status status, bool log, const char *fmt, ...)
{
    char what[900], desc[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    sci_comm_describe(c, desc, sizeof desc);
    pthread_mutex_lock(&c->lock);
    if (c->aborted) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    c->aborted = true;
    c->abort_status = status;
    snprintf(c->abort_reason, sizeof c->abort_reason, "%s was aborted: %s", desc, what);
    ncclComm_t nccl = c->nccl;
    c->nccl = NULL;
    char reason[sizeof c->abort_reason];
    memcpy(reason, c->abort_reason, sizeof reason);
    pthread_mutex_unlock(&c->lock);
    if (log && c->obj.id) /* (not one that create gives up on: its caller reports it) */
        sci_log(SC_LOG_ERROR, "%s", reason);
    if (nccl) {
        ncclResult_t r = sci_ncclCommAbort(nccl);
        if (r != ncclSuccess) {
            char err[600];
            sci_log(SC_LOG_WARN, "ncclCommAbort of %s failed: %s", desc,
                    sci_comm_nccl_error(r, NULL, err, sizeof err));
        }
    }
}

/* ---- waiting for NCCL ------------------------------------------------------------------- */

sc_status sci_comm_wait_issued(sci_comm **comms, size_t n, const char *what, const char *fn)
{
    const uint64_t start = sci_comm_now_ns();
    sc_status s = SC_OK;
    char why[900] = "";
    size_t failed = 0;
    for (size_t i = 0; i < n && s == SC_OK; i++) {
        sci_comm *c = comms[i];
        if (!c->nccl)
            continue; /* aborted meanwhile: reported below */
        const uint64_t deadline = start + (uint64_t)c->timeout_ms * 1000000u;
        for (;;) {
            ncclResult_t state = ncclInProgress;
            ncclResult_t r = sci_ncclCommGetAsyncError(c->nccl, &state);
            if (r != ncclSuccess)
                state = r;
            if (state == ncclSuccess)
                break;
            if (state != ncclInProgress) {
                char err[600];
                snprintf(why, sizeof why, "%s failed: %s", what,
                         sci_comm_nccl_error(state, c->nccl, err, sizeof err));
                s = SC_ERR_COMM;
                failed = i;
                break;
            }
            if (sci_comm_now_ns() >= deadline) {
                snprintf(why, sizeof why,
                         "%s did not complete within the timeout of %u ms (NCCL still in "
                         "progress: a rank has not joined, or a peer hangs)",
                         what, c->timeout_ms);
                s = SC_ERR_TIMEOUT;
                failed = i;
                break;
            }
            sci_comm_backoff(start);
        }
    }
    if (s == SC_OK) {
        for (size_t i = 0; i < n; i++)
            if ((s = sci_comm_check_alive(comms[i], fn)) != SC_OK)
                return s;
        return SC_OK;
    }
    for (size_t i = 0; i < n; i++) /* NCCL: a failed group aborts all its communicators */
        sci_comm_abort_locked(comms[i], s, true, "%s%s", why,
                              i == failed ? "" : " (on another rank of the same group)");
    return sci_comm_check_alive(comms[failed], fn);
}

/* ---- the library ---------------------------------------------------------------------------- */

static sc_status nccl_ready(const char *fn)
{
    sc_status s = sci_nccl_load();
    if (s != SC_OK)
        return sci_fail(s, fn, "%s", sci_nccl_load_message());
    return SC_OK;
}

sc_status sc_comm_library_version(int *version)
{
    static const char fn[] = "sc_comm_library_version";
    SCI_CHECK_PTR(fn, version);
    sc_status s = nccl_ready(fn);
    if (s == SC_OK)
        *version = sci_nccl_version();
    return s;
}

sc_status sc_comm_library_path(char *buf, size_t size)
{
    static const char fn[] = "sc_comm_library_path";
    if (!buf || size == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "buf is %s and size is %zu: a buffer of at "
                        "least 1 byte is needed", buf ? "given" : "NULL", size);
    sc_status s = nccl_ready(fn);
    if (s == SC_OK)
        snprintf(buf, size, "%s", sci_nccl_library_path());
    return s;
}

sc_status sc_comm_unique_id(sc_comm_id *id)
{
    static const char fn[] = "sc_comm_unique_id";
    SCI_CHECK_PTR(fn, id);
    sc_status s = nccl_ready(fn);
    if (s != SC_OK)
        return s;
    ncclUniqueId nid;
    memset(&nid, 0, sizeof nid);
    ncclResult_t r = sci_ncclGetUniqueId(&nid);
    if (r != ncclSuccess) {
        char err[600];
        return sci_fail(SC_ERR_COMM, fn, "ncclGetUniqueId failed: %s",
                        sci_comm_nccl_error(r, NULL, err, sizeof err));
    }
    _Static_assert(sizeof id->bytes == sizeof nid.internal, "unique id size");
    memcpy(id->bytes, nid.internal, sizeof id->bytes);
    return SC_OK;
}

/* The test device runs no NCCL, and the NCCL test double moves test-device memory only. */
static sc_status check_pairing(const char *fn)
{
    if (sci_driver_ptx_only() && !sci_nccl_is_test_double())
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "the driver is safecuda's test device, which runs no NCCL, and %s is "
                        "a real NCCL (it needs GPUs); host tests on the test device load "
                        "safecuda's NCCL test double (SAFECUDA_LIBNCCL=<build>/tests/ncclfault/"
                        "libsafecuda_ncclfault.so)",
                        sci_nccl_library_path());
    if (!sci_driver_ptx_only() && sci_nccl_is_test_double())
        return sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                        "%s is safecuda's NCCL test double, which works on the test device "
                        "(SAFECUDA_DEVICE=test) only and never stands in for a GPU: point "
                        "SAFECUDA_LIBNCCL at a real libnccl.so.2, or unset it",
                        sci_nccl_library_path());
    return SC_OK;
}

static void init_config(sci_nccl_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->size = sizeof *cfg;
    cfg->magic = SCI_NCCL_CONFIG_MAGIC;
    cfg->version = SCI_NCCL_MIN_VERSION;
    cfg->blocking = 0; /* non-blocking: every call returns, ncclCommAbort works at any time */
    cfg->cgaClusterSize = SCI_NCCL_UNDEF_INT;
    cfg->minCTAs = SCI_NCCL_UNDEF_INT;
    cfg->maxCTAs = SCI_NCCL_UNDEF_INT;
    cfg->netName = NULL;
    cfg->splitShare = SCI_NCCL_UNDEF_INT;
}

static sci_comm *new_comm(sci_context *ctx, int rank, int nranks, uint32_t timeout_ms,
                          const char *label, const char *file, int line)
{
    sci_comm *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->ctx = ctx;
    c->rank = rank;
    c->nranks = nranks;
    c->timeout_ms = timeout_ms ? timeout_ms : SC_COMM_DEFAULT_TIMEOUT_MS;
    pthread_mutex_init(&c->lock, NULL);
    /* (the registry sets these again when it publishes the communicator) */
    snprintf(c->obj.label, sizeof c->obj.label, "%s", label && label[0] ? label : "comm");
    c->obj.file = file;
    c->obj.line = line;
    return c;
}

static void free_comm(sci_comm *c)
{
    pthread_mutex_destroy(&c->lock);
    free(c->ops);
    free(c->spare);
    free(c);
}

/* Publish a communicator whose NCCL communicator is ready, then watch it (the watchdog sees
 * it complete). On failure it is aborted and freed. */
static sc_status publish(sci_comm *c, const char *label, const char *file, int line,
                         const char *fn)
{
    sc_status s = sci_registry_insert(&c->obj, SCI_KIND_COMM, c->ctx->obj.id,
                                      label && label[0] ? label : "comm", file, line, fn);
    if (s == SC_OK && (s = sci_comm_watch(c, fn)) != SC_OK) {
        char *saved = sci_error_save();
        sci_object *obj = NULL;
        sci_registry_remove(SCI_KIND_COMM, c->obj.id, fn, &obj);
        sci_error_restore(saved);
    }
    if (s != SC_OK) {
        c->obj.id = 0;
        sci_comm_lock_device(c->ctx->device);
        sci_comm_abort_locked(c, SC_ERR_COMM, true, "it could not be published");
        sci_comm_unlock_device(c->ctx->device);
        free_comm(c);
    }
    return s;
}

sc_status sc_comm_create_at(sc_context ctx, const sc_comm_desc *desc, sc_comm *comm,
                            const char *file, int line)
{
    static const char fn[] = "sc_comm_create";
    SCI_CHECK_PTR(fn, comm);
    comm->id = 0;
    SCI_CHECK_PTR(fn, desc);
    if (desc->nranks < 1)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->nranks is %d: at least 1",
                        desc->nranks);
    if (desc->rank < 0 || desc->rank >= desc->nranks)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->rank %d is outside [0, %d)",
                        desc->rank, desc->nranks);
    sc_status s = nccl_ready(fn);
    sci_context *cx = NULL;
    if (s != SC_OK || (s = sci_context_acquire(ctx, fn, &cx)) != SC_OK)
        return s;
    if ((s = check_pairing(fn)) != SC_OK) {
        sci_context_release(cx);
        return s;
    }
    sci_comm *c = new_comm(cx, desc->rank, desc->nranks, desc->timeout_ms, desc->label, file,
                           line);
    if (!c) {
        sci_context_release(cx);
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a communicator");
    }
    sci_comm_lock_device(cx->device);
    sci_nccl_config cfg;
    init_config(&cfg);
    ncclUniqueId id;
    memcpy(id.internal, desc->unique_id.bytes, sizeof id.internal);
    ncclResult_t r = sci_ncclCommInitRankConfig(&c->nccl, desc->nranks, id, desc->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        char err[600];
        s = sci_fail(SC_ERR_COMM, fn, "ncclCommInitRankConfig(rank %d of %d, device %d) failed: %s",
                     desc->rank, desc->nranks, cx->device,
                     sci_comm_nccl_error(r, c->nccl, err, sizeof err));
        if (c->nccl)
            sci_ncclCommAbort(c->nccl);
        c->nccl = NULL;
    } else {
        s = sci_comm_wait_issued(&c, 1, "creating the communicator (every rank must join)", fn);
    }
    sci_comm_unlock_device(cx->device);
    if (s == SC_OK && (s = publish(c, desc->label, file, line, fn)) == SC_OK)
        comm->id = c->obj.id;
    else if (s != SC_OK)
        free_comm(c);
    sci_context_release(cx);
    return s;
}

sc_status sc_comm_create_all_at(const sc_context *contexts, int n, const sc_comm_all_desc *desc,
                                sc_comm *comms, const char *file, int line)
{
    static const char fn[] = "sc_comm_create_all";
    SCI_CHECK_PTR(fn, comms);
    SCI_CHECK_PTR(fn, contexts);
    if (n < 1)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "n is %d: at least 1 context", n);
    for (int i = 0; i < n; i++)
        comms[i].id = 0;
    sc_comm_all_desc d = desc ? *desc : (sc_comm_all_desc){0};
    sc_status s = nccl_ready(fn);
    if (s != SC_OK)
        return s;
    sci_context **cx = calloc((size_t)n, sizeof *cx);
    sci_comm **c = calloc((size_t)n, sizeof *c);
    int *devices = calloc((size_t)n, sizeof *devices);
    if (!cx || !c || !devices) {
        free(cx), free(c), free(devices);
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    }
    int acquired = 0;
    for (; acquired < n && s == SC_OK; acquired++)
        if ((s = sci_context_acquire(contexts[acquired], fn, &cx[acquired])) != SC_OK)
            sci_error_append(" (contexts[%d])", acquired);
    if (s != SC_OK)
        acquired--;
    for (int i = 0; i < n && s == SC_OK; i++)
        for (int j = 0; j < i && s == SC_OK; j++)
            if (cx[i]->device == cx[j]->device)
                s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                             "contexts[%d] and contexts[%d] are both on device %d: NCCL takes "
                             "one rank per GPU",
                             j, i, cx[i]->device);
    if (s == SC_OK)
        s = check_pairing(fn);
    for (int i = 0; i < n && s == SC_OK; i++)
        if (!(c[i] = new_comm(cx[i], i, n, d.timeout_ms, d.label, file, line)))
            s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "cannot allocate a communicator");
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t r = ncclSuccess;
    if (s == SC_OK && (r = sci_ncclGetUniqueId(&id)) != ncclSuccess) {
        char err[600];
        s = sci_fail(SC_ERR_COMM, fn, "ncclGetUniqueId failed: %s",
                     sci_comm_nccl_error(r, NULL, err, sizeof err));
    }
    size_t n_locked = 0;
    if (s == SC_OK) {
        for (int i = 0; i < n; i++)
            devices[i] = cx[i]->device;
        n_locked = sci_comm_lock_devices(devices, (size_t)n);
        sci_nccl_config cfg;
        init_config(&cfg);
        sci_ncclGroupStart();
        for (int i = 0; i < n && (r == ncclSuccess || r == ncclInProgress); i++) {
            const char *call;
            CUresult cr = sci_context_make_current_cu(cx[i], &call);
            if (cr != CUDA_SUCCESS) {
                s = sci_context_fail_cu(cx[i], cr, fn, "%s failed", call);
                break;
            }
            r = sci_ncclCommInitRankConfig(&c[i]->nccl, n, id, i, &cfg);
        }
        ncclResult_t end = sci_ncclGroupEnd();
        if (r == ncclSuccess || r == ncclInProgress)
            r = end;
        if (s == SC_OK && r != ncclSuccess && r != ncclInProgress) {
            char err[600];
            s = sci_fail(SC_ERR_COMM, fn, "ncclCommInitRankConfig of %d ranks failed: %s", n,
                         sci_comm_nccl_error(r, NULL, err, sizeof err));
        }
        if (s == SC_OK)
            s = sci_comm_wait_issued(c, (size_t)n, "creating the communicators", fn);
        else
            for (int i = 0; i < n; i++)
                sci_comm_abort_locked(c[i], s, true, "creating it failed");
        sci_comm_unlock_devices(devices, n_locked);
    }
    for (int i = 0; i < n && s == SC_OK; i++) {
        if ((s = publish(c[i], d.label, file, line, fn)) == SC_OK)
            comms[i].id = c[i]->obj.id;
        else
            c[i] = NULL; /* publish freed it */
    }
    if (s != SC_OK) { /* all or nothing */
        char *saved = sci_error_save();
        for (int i = 0; i < n; i++) {
            if (comms[i].id) { /* published: aborted, then destroyed (which frees it) */
                sci_comm_lock_device(c[i]->ctx->device);
                sci_comm_abort_locked(c[i], s, true, "another rank of sc_comm_create_all failed");
                sci_comm_unlock_device(c[i]->ctx->device);
                sci_registry_destroy(SCI_KIND_COMM, comms[i].id, fn);
                comms[i].id = 0;
            } else if (c[i]) {
                if (c[i]->nccl) {
                    sci_comm_lock_device(c[i]->ctx->device);
                    sci_comm_abort_locked(c[i], s, true, "creating it failed");
                    sci_comm_unlock_device(c[i]->ctx->device);
                }
                free_comm(c[i]);
            }
        }
        sci_error_restore(saved);
    }
    for (int i = 0; i < acquired; i++)
        sci_context_release(cx[i]);
    free(cx), free(c), free(devices);
    return s;
}

/* The communicator's part of its destroy (sci_kind_ops.destroy), once unpublished: wait for
 * its work (ncclCommFinalize) within its timeout, then ncclCommDestroy; abort instead when
 * the wait fails. */
static sc_status comm_destroy(sci_object *obj, const char *fn)
{
    sci_comm *c = (sci_comm *)obj;
    sci_comm_unwatch(c);
    sci_release rl;
    sci_release_begin(&rl, c->ctx, fn);
    sci_release_make_current(&rl);
    sci_comm_lock_device(c->ctx->device);
    if (c->nccl && !sci_release_live(&rl)) { /* a lost context: nothing can finish */
        sci_comm_abort_locked(c, SC_ERR_COMM, true, "its context was lost");
    } else if (c->nccl) {
        ncclResult_t r = sci_ncclCommFinalize(c->nccl);
        sc_status s;
        if (r == ncclSuccess || r == ncclInProgress) {
            s = sci_comm_wait_issued(&c, 1, "finishing its work (ncclCommFinalize)", fn);
        } else {
            char err[600];
            sci_comm_abort_locked(c, SC_ERR_COMM, true, "ncclCommFinalize failed: %s",
                                  sci_comm_nccl_error(r, c->nccl, err, sizeof err));
            s = sci_comm_check_alive(c, fn);
        }
        if (s == SC_OK) {
            r = sci_ncclCommDestroy(c->nccl);
            c->nccl = NULL;
            if (r != ncclSuccess) {
                char err[600];
                s = sci_fail(SC_ERR_COMM, fn, "ncclCommDestroy failed: %s",
                             sci_comm_nccl_error(r, NULL, err, sizeof err));
            }
        }
        sci_release_status(&rl, s);
    }
    for (size_t i = 0; i < c->n_ops; i++)
        sci_release_check(&rl, sci_cuEventDestroy(c->ops[i].event), "cuEventDestroy failed");
    for (size_t i = 0; i < c->n_spare; i++)
        sci_release_check(&rl, sci_cuEventDestroy(c->spare[i]), "cuEventDestroy failed");
    sci_comm_unlock_device(c->ctx->device);
    free_comm(c);
    return sci_release_end(&rl);
}

sc_status sc_comm_destroy(sc_comm comm)
{
    return sci_object_destroy(SCI_KIND_COMM, comm.id, NULL, "sc_comm_destroy");
}

sc_status sc_comm_abort(sc_comm comm)
{
    static const char fn[] = "sc_comm_abort";
    sci_comm *c = NULL;
    sc_status s = sci_comm_acquire(comm, fn, &c);
    if (s != SC_OK)
        return s;
    sci_comm_lock_device(c->ctx->device);
    sci_comm_abort_locked(c, SC_ERR_COMM, false, "sc_comm_abort was called");
    sci_comm_unlock_device(c->ctx->device);
    sci_comm_release(c);
    return SC_OK;
}

sc_status sc_comm_info(sc_comm comm, sc_comm_props *props)
{
    static const char fn[] = "sc_comm_info";
    SCI_CHECK_PTR(fn, props);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_COMM, comm.id, fn, &obj);
    if (s != SC_OK)
        return s;
    sci_comm *c = (sci_comm *)obj;
    memset(props, 0, sizeof *props);
    props->rank = c->rank;
    props->nranks = c->nranks;
    props->device = c->ctx->device;
    props->timeout_ms = c->timeout_ms;
    props->context.id = c->ctx->obj.id;
    snprintf(props->label, sizeof props->label, "%s", c->obj.label);
    props->file = sci_basename(c->obj.file);
    props->line = c->obj.line;
    pthread_mutex_lock(&c->lock);
    props->aborted = c->aborted;
    pthread_mutex_unlock(&c->lock);
    sci_registry_release(obj);
    return SC_OK;
}
