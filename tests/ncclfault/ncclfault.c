/* safecuda's NCCL test double: a fault-injecting stand-in for libnccl.so.2, for host tests on
 * safecuda's test device only (SAFECUDA_DEVICE=test or SAFECUDA_LIBCUDA=the test device, with
 * SAFECUDA_LIBNCCL=libsafecuda_ncclfault.so). It is NOT an NCCL, talks to no GPU and proves
 * nothing about one: the library refuses to pair it with a real driver, and nothing measured
 * through it is ever a claim about GPUs. It exists so the library's communicator code (the
 * loader, every check, the ordering, timeouts and aborts) can be tested where there is no GPU.
 *
 * What it models, in one process: the entry points safecuda loads (src/driver/nccl_api.h),
 * with NCCL's non-blocking semantics. Ranks of one communicator are the communicators made
 * with the same unique id in this process (threads, or one thread in a group). A
 * communicator's init is ncclInProgress until all its ranks have joined. A collective is
 * complete when every rank has issued its part: then the double computes it on the test
 * device's memory (host memory: the device pointers are host addresses), all-reduce by
 * actually reducing the ranks' buffers (nf_reduce); until then each issuing rank's stream is
 * held (the test device's safecuda_testdevice_hold_stream: its queries answer NOT_READY, its
 * synchronizations wait), as a real NCCL kernel would wait for its peers. Sends and receives
 * pair in order per (sender, receiver). ncclGroupStart/End queue a thread's calls and issue
 * them at the outermost end. ncclCommAbort ends the aborting rank's part: its holds are
 * released (its outputs are left as they were) and the collective never completes for the
 * others, who stay held until they abort too, as with real NCCL.
 *
 * Faults, from the environment (read at each call):
 *   SAFECUDA_NCCLFAULT_VERSION=CODE   ncclGetVersion answers CODE (default 22809, 2.28.9);
 *   SAFECUDA_NCCLFAULT_FAIL=ENTRY[:N[:RESULT]]  the Nth call (default 1, counted since the
 *       value was set) of entry point ENTRY (ncclAllReduce, ncclCommInitRankConfig, ...)
 *       answers RESULT (a number or a name, default ncclInternalError) and does nothing;
 *       ncclGetLastError then says "ncclfault: injected RESULT into ENTRY (call N)";
 *   SAFECUDA_NCCLFAULT_HANG=WHAT[:N]  the Nth (default 1) WHAT never completes: init (a
 *       communicator's init stays in progress), allreduce, reducescatter, allgather, send,
 *       recv (the collective or transfer keeps its ranks' streams held until they abort),
 *       finalize (ncclCommFinalize stays in progress);
 *   SAFECUDA_NCCLFAULT_ASYNC=RESULT[:N]  ncclCommGetAsyncError answers RESULT once a
 *       communicator has issued N operations (default 1).
 * A mismatch between ranks (another kind, count, type or operation at the same position)
 * sets ncclInvalidUsage as every rank's asynchronous error. The build variant
 * libsafecuda_ncclfault_nosend.so lacks ncclSend (the loader's missing-entry-point test).
 * Test counters (exported): safecuda_ncclfault_live_comms, _pending. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ncclfault.h"

#define EXPORT __attribute__((visibility("default")))

/* Every entry point has exactly the signature the library declares (a mismatch is a compile
 * error). */
#define NF_PROTO(name, req, params, args) EXPORT ncclResult_t name params;
SCI_NCCL_FUNCS(NF_PROTO)
#undef NF_PROTO

EXPORT const int safecuda_ncclfault_double = 1; /* the library's marker: never a real NCCL */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local char last_error[512];

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
}

/* ---- the test device's holds ----------------------------------------------------------- */

static int (*hold_stream)(void *stream);
static void (*release_hold)(int id);

static int find_testdevice(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "safecuda_testdevice")) {
        snprintf(data, 1024, "%s", info->dlpi_name);
        return 1;
    }
    return 0;
}

static void attach_testdevice(void)
{
    char path[1024] = "";
    const char *env = getenv("SAFECUDA_LIBCUDA");
    if (env && env[0])
        snprintf(path, sizeof path, "%s", env);
    else
        dl_iterate_phdr(find_testdevice, path);
    void *h = path[0] ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    if (!h)
        return;
    *(void **)&hold_stream = dlsym(h, "safecuda_testdevice_hold_stream");
    *(void **)&release_hold = dlsym(h, "safecuda_testdevice_release_hold");
    dlclose(h); /* (NOLOAD took a reference; the library keeps it loaded) */
}

static pthread_once_t attach_once = PTHREAD_ONCE_INIT;

static int hold(CUstream s)
{
    pthread_once(&attach_once, attach_testdevice);
    return hold_stream && s ? hold_stream(s) : 0;
}

static void release(int id)
{
    if (id && release_hold)
        release_hold(id);
}

/* ---- faults ------------------------------------------------------------------------------- */

static const char *const result_names[] = {"ncclSuccess", "ncclUnhandledCudaError",
                                           "ncclSystemError", "ncclInternalError",
                                           "ncclInvalidArgument", "ncclInvalidUsage",
                                           "ncclRemoteError", "ncclInProgress"};

static ncclResult_t parse_result(const char *s, ncclResult_t fallback)
{
    if (!s || !s[0])
        return fallback;
    for (int i = 0; i < 8; i++)
        if (strcmp(s, result_names[i]) == 0)
            return i;
    return atoi(s);
}

/* "NAME[:N[:REST]]" into name, n (default 1) and rest. */
static void parse_spec(const char *v, char *name, size_t size, long *n, char *rest, size_t rsize)
{
    const char *c1 = strchr(v, ':');
    size_t len = c1 ? (size_t)(c1 - v) : strlen(v);
    snprintf(name, size, "%.*s", (int)len, v);
    *n = 1;
    rest[0] = '\0';
    if (c1) {
        *n = strtol(c1 + 1, NULL, 10);
        const char *c2 = strchr(c1 + 1, ':');
        if (c2)
            snprintf(rest, rsize, "%s", c2 + 1);
    }
}

static char fail_spec[256];
static long fail_calls;

/* Whether this call of entry must fail (lock held); *result gets the answer. */
static int injected(const char *entry, ncclResult_t *result)
{
    const char *v = getenv("SAFECUDA_NCCLFAULT_FAIL");
    if (!v || !v[0])
        return 0;
    if (strcmp(v, fail_spec) != 0) {
        snprintf(fail_spec, sizeof fail_spec, "%s", v);
        fail_calls = 0;
    }
    char name[128], rest[64];
    long nth;
    parse_spec(v, name, sizeof name, &nth, rest, sizeof rest);
    if (strcmp(name, entry) != 0 || ++fail_calls != nth)
        return 0;
    *result = parse_result(rest, ncclInternalError);
    set_error("ncclfault: injected %s into %s (call %ld)",
              *result >= 0 && *result < 8 ? result_names[*result] : "an error", entry, nth);
    return 1;
}

static char hang_spec[256];
static long hang_seen;

/* Whether the operation of kind what now starting must never complete (lock held). */
static int hangs(const char *what)
{
    const char *v = getenv("SAFECUDA_NCCLFAULT_HANG");
    if (!v || !v[0])
        return 0;
    if (strcmp(v, hang_spec) != 0) {
        snprintf(hang_spec, sizeof hang_spec, "%s", v);
        hang_seen = 0;
    }
    char name[64], rest[8];
    long nth;
    parse_spec(v, name, sizeof name, &nth, rest, sizeof rest);
    return strcmp(name, what) == 0 && ++hang_seen == nth;
}

/* ---- communicators ------------------------------------------------------------------------ */

#define COMM_MAGIC 0x6e63636cu
#define ID_MAGIC "ncclfalt"

typedef struct clique clique;
typedef struct nf_comm {
    unsigned magic;
    clique *cl;
    int rank;
    ncclResult_t state;  /* ncclInProgress during init (and finalize), then ncclSuccess */
    ncclResult_t async;  /* an error NCCL would report asynchronously (a mismatch) */
    int finalizing, finalize_hangs;
    long issued;         /* operations issued */
    long coll_seq;       /* its next collective's position */
} nf_comm;

/* One rank's part of a collective or transfer. */
typedef struct part {
    int present;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int hold_id;
} part;

enum { K_ALLREDUCE, K_REDUCESCATTER, K_ALLGATHER, K_SEND };
static const char *const kind_names[] = {"allreduce", "reducescatter", "allgather", "send"};

typedef struct nf_op {
    int kind;
    long seq;        /* collectives: the position; transfers: unused */
    int from, to;    /* transfers */
    int hangs, poisoned;
    part *parts;     /* collectives: nranks; transfers: [0] the send, [1] the receive */
    struct nf_op *next;
} nf_op;

struct clique {
    char id[SCI_NCCL_UNIQUE_ID_BYTES];
    int nranks, joined, init_hangs;
    nf_comm **ranks;
    nf_op *ops;
    clique *next;
};

static clique *cliques;
static long live_comms, id_counter;

EXPORT long safecuda_ncclfault_live_comms(void)
{
    pthread_mutex_lock(&lock);
    long n = live_comms;
    pthread_mutex_unlock(&lock);
    return n;
}

EXPORT long safecuda_ncclfault_pending(void)
{
    pthread_mutex_lock(&lock);
    long n = 0;
    for (clique *c = cliques; c; c = c->next)
        for (nf_op *o = c->ops; o; o = o->next)
            n++;
    pthread_mutex_unlock(&lock);
    return n;
}

static nf_comm *valid(ncclComm_t h)
{
    nf_comm *c = (nf_comm *)(void *)h;
    return c && c->magic == COMM_MAGIC ? c : NULL;
}

/* The comm still has parts in unfinished operations (lock held). */
static int has_parts(const nf_comm *c)
{
    for (nf_op *o = c->cl->ops; o; o = o->next) {
        int n = o->kind == K_SEND ? 2 : c->cl->nranks;
        for (int i = 0; i < n; i++) {
            int r = o->kind == K_SEND ? (i ? o->to : o->from) : i;
            if (r == c->rank && o->parts[i].present)
                return 1;
        }
    }
    return 0;
}

EXPORT ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    const char *v = getenv("SAFECUDA_NCCLFAULT_VERSION");
    *version = v && v[0] ? atoi(v) : 22809;
    return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r)
{
    static const char *const texts[] = {
        "no error",
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        "internal error - please report this issue to the NCCL developers",
        "invalid argument (run with NCCL_DEBUG=WARN for details)",
        "invalid usage (run with NCCL_DEBUG=WARN for details)",
        "remote process exited or there was a network error",
        "NCCL operation in progress"};
    return r >= 0 && r < 8 ? texts[r] : "unknown result code";
}

EXPORT const char *ncclGetLastError(ncclComm_t c)
{
    (void)c;
    return last_error;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return ncclInvalidArgument;
    pthread_mutex_lock(&lock);
    ncclResult_t r;
    if (!injected("ncclGetUniqueId", &r)) {
        memset(id, 0, sizeof *id);
        memcpy(id->internal, ID_MAGIC, 8);
        long n = ++id_counter;
        memcpy(id->internal + 8, &n, sizeof n);
        r = ncclSuccess;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id,
                                           int rank, sci_nccl_config *config)
{
    if (!out)
        return ncclInvalidArgument;
    *out = NULL;
    pthread_mutex_lock(&lock);
    ncclResult_t r = ncclSuccess;
    if (injected("ncclCommInitRankConfig", &r)) {
    } else if (!config || config->magic != SCI_NCCL_CONFIG_MAGIC || config->blocking != 0) {
        set_error("ncclfault: the config must come from NCCL_CONFIG_INITIALIZER with "
                  "blocking = 0 (the double models non-blocking communicators only)");
        r = ncclInvalidArgument;
    } else if (nranks < 1 || rank < 0 || rank >= nranks || memcmp(id.internal, ID_MAGIC, 8)) {
        set_error("ncclfault: rank %d of %d, or an id not made by ncclGetUniqueId", rank, nranks);
        r = ncclInvalidArgument;
    }
    clique *cl = NULL;
    for (clique *c = cliques; c && r == ncclSuccess && !cl; c = c->next)
        if (memcmp(c->id, id.internal, sizeof c->id) == 0)
            cl = c;
    if (r == ncclSuccess && cl && (cl->nranks != nranks || cl->ranks[rank])) {
        set_error("ncclfault: rank %d of %d joins a communicator of %d ranks%s", rank, nranks,
                  cl->nranks, cl->nranks == nranks ? " that already has it" : "");
        r = ncclInvalidUsage;
    }
    if (r == ncclSuccess && !cl) {
        cl = calloc(1, sizeof *cl);
        cl->ranks = calloc((size_t)nranks, sizeof *cl->ranks);
        memcpy(cl->id, id.internal, sizeof cl->id);
        cl->nranks = nranks;
        cl->init_hangs = hangs("init");
        cl->next = cliques;
        cliques = cl;
    }
    if (r == ncclSuccess) {
        nf_comm *c = calloc(1, sizeof *c);
        c->magic = COMM_MAGIC;
        c->cl = cl;
        c->rank = rank;
        c->state = ncclInProgress;
        cl->ranks[rank] = c;
        live_comms++;
        if (++cl->joined == nranks && !cl->init_hangs)
            for (int i = 0; i < nranks; i++)
                cl->ranks[i]->state = ncclSuccess;
        *out = (ncclComm_t)(void *)c;
        r = c->state;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t h, ncclResult_t *error)
{
    nf_comm *c = valid(h);
    if (!c || !error)
        return ncclInvalidArgument;
    pthread_mutex_lock(&lock);
    if (c->finalizing && c->state == ncclInProgress && !c->finalize_hangs && !has_parts(c))
        c->state = ncclSuccess;
    *error = c->async != ncclSuccess ? c->async : c->state;
    const char *v = getenv("SAFECUDA_NCCLFAULT_ASYNC");
    if (*error == ncclSuccess && v && v[0]) {
        char name[64], rest[8];
        long after;
        parse_spec(v, name, sizeof name, &after, rest, sizeof rest);
        if (c->issued >= after) {
            *error = parse_result(name, ncclRemoteError);
            set_error("ncclfault: injected asynchronous error %s after %ld operations", name,
                      c->issued);
        }
    }
    pthread_mutex_unlock(&lock);
    return ncclSuccess;
}

/* ---- operations --------------------------------------------------------------------------- */

static void free_op(clique *cl, nf_op *o)
{
    for (nf_op **p = &cl->ops; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            break;
        }
    int n = o->kind == K_SEND ? 2 : cl->nranks;
    for (int i = 0; i < n; i++)
        release(o->parts[i].hold_id);
    free(o->parts);
    free(o);
}

/* Every rank's part is there: compute the collective on the ranks' memory. */
static void complete(clique *cl, nf_op *o)
{
    const int n = cl->nranks;
    part *p = o->parts;
    const size_t es = nf_type_size(p[0].type);
    if (o->kind == K_SEND) {
        memmove(p[1].recv, p[0].send, p[0].count * es);
    } else if (o->kind == K_ALLGATHER) {
        unsigned char *all = malloc(n * p[0].count * es + 1);
        for (int r = 0; r < n; r++)
            memcpy(all + r * p[0].count * es, p[r].send, p[0].count * es);
        for (int r = 0; r < n; r++)
            memcpy(p[r].recv, all, n * p[0].count * es);
        free(all);
    } else {
        const size_t total = o->kind == K_ALLREDUCE ? p[0].count : p[0].count * (size_t)n;
        const void **in = malloc((size_t)n * sizeof *in);
        unsigned char *result = malloc(total * es + 1);
        for (int r = 0; r < n; r++)
            in[r] = p[r].send;
        nf_reduce(result, in, n, total, p[0].type, p[0].op);
        for (int r = 0; r < n; r++) {
            if (o->kind == K_ALLREDUCE)
                memcpy(p[r].recv, result, total * es);
            else
                memcpy(p[r].recv, result + (size_t)r * p[0].count * es, p[0].count * es);
        }
        free(result);
        free((void *)in);
    }
    free_op(cl, o);
}

static void mismatch(clique *cl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mismatch(clique *cl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    for (int i = 0; i < cl->nranks; i++)
        if (cl->ranks[i])
            cl->ranks[i]->async = ncclInvalidUsage;
}

/* One rank's part of a collective (kind, at the rank's next position) or of a transfer
 * (K_SEND: a send to peer, or with is_recv a receive from peer). */
static void add_part(nf_comm *c, int kind, int is_recv, int peer, part p, CUstream stream)
{
    clique *cl = c->cl;
    c->issued++;
    nf_op *o = NULL;
    int slot;
    if (kind == K_SEND) {
        const int from = is_recv ? peer : c->rank, to = is_recv ? c->rank : peer;
        slot = is_recv ? 1 : 0;
        for (nf_op *x = cl->ops; x && !o; x = x->next)
            if (x->kind == K_SEND && x->from == from && x->to == to && !x->parts[slot].present)
                o = x;
        if (!o) {
            o = calloc(1, sizeof *o);
            o->kind = K_SEND;
            o->from = from;
            o->to = to;
            o->parts = calloc(2, sizeof *o->parts);
            o->hangs = hangs(is_recv ? "recv" : "send");
            nf_op **end = &cl->ops;
            while (*end)
                end = &(*end)->next;
            *end = o;
        }
    } else {
        const long seq = c->coll_seq++;
        for (nf_op *x = cl->ops; x && !o; x = x->next)
            if (x->kind != K_SEND && x->seq == seq)
                o = x;
        if (!o) {
            o = calloc(1, sizeof *o);
            o->kind = kind;
            o->seq = seq;
            o->parts = calloc((size_t)cl->nranks, sizeof *o->parts);
            o->hangs = hangs(kind_names[kind]);
            o->next = cl->ops;
            cl->ops = o;
        }
        slot = c->rank;
        const part *q = NULL;
        for (int r = 0; r < cl->nranks && !q; r++)
            if (o->parts[r].present)
                q = &o->parts[r];
        if (o->kind != kind || (q && (q->count != p.count || q->type != p.type || q->op != p.op)))
            mismatch(cl, "ncclfault: rank %d's %s #%ld (%zu elements, type %d, op %d) does not "
                     "match the other ranks' %s", c->rank, kind_names[kind], seq, p.count,
                     (int)p.type, (int)p.op, kind_names[o->kind]);
    }
    p.present = 1;
    p.hold_id = hold(stream);
    o->parts[slot] = p;
    int all = 1, n = o->kind == K_SEND ? 2 : cl->nranks;
    for (int i = 0; i < n; i++)
        all &= o->parts[i].present;
    if (o->kind == K_SEND && all && o->parts[0].count * nf_type_size(o->parts[0].type) !=
                                        o->parts[1].count * nf_type_size(o->parts[1].type))
        mismatch(cl, "ncclfault: rank %d sends %zu elements to rank %d, which receives %zu",
                 o->from, o->parts[0].count, o->to, o->parts[1].count);
    if (all && !o->hangs && !o->poisoned && c->async == ncclSuccess)
        complete(cl, o);
}

/* ---- the entry points of operations -------------------------------------------------------- */

typedef struct queued {
    nf_comm *c;
    int kind, is_recv, peer;
    part p;
    CUstream stream;
} queued;

static _Thread_local int group_depth;
static _Thread_local queued *queue;
static _Thread_local size_t n_queue, cap_queue;

static int arguments_ok(const nf_comm *c, int kind, int is_recv, int peer, const part *p)
{
    if (!nf_type_size(p->type) || p->op < ncclSum || p->op > ncclAvg)
        return 0;
    if (kind != K_SEND)
        return !p->count || (p->send && p->recv);
    const void *buf = is_recv ? (const void *)p->recv : p->send;
    return peer >= 0 && peer < c->cl->nranks && (!p->count || buf);
}

static ncclResult_t submit(const char *entry, ncclComm_t h, int kind, int is_recv, int peer,
                           part p, CUstream stream)
{
    nf_comm *c = valid(h);
    if (!c) {
        set_error("ncclfault: %s: not a communicator", entry);
        return ncclInvalidArgument;
    }
    pthread_mutex_lock(&lock);
    ncclResult_t r = ncclSuccess;
    if (injected(entry, &r)) {
    } else if (c->state != ncclSuccess || c->finalizing) {
        set_error("ncclfault: %s on a communicator that is not ready (initializing or "
                  "finalized)", entry);
        r = ncclInvalidUsage;
    } else if (!arguments_ok(c, kind, is_recv, peer, &p)) {
        set_error("ncclfault: %s: bad arguments (type %d, op %d, %zu elements, peer %d)", entry,
                  (int)p.type, (int)p.op, p.count, peer);
        r = ncclInvalidArgument;
    } else if (group_depth) {
        if (n_queue == cap_queue) {
            cap_queue = cap_queue ? 2 * cap_queue : 16;
            queue = realloc(queue, cap_queue * sizeof *queue);
        }
        queue[n_queue++] = (queued){c, kind, is_recv, peer, p, stream};
    } else {
        add_part(c, kind, is_recv, peer, p, stream);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count,
                                  ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                  CUstream stream)
{
    part p = {.send = send, .recv = recv, .count = count, .type = type, .op = op};
    return submit("ncclAllReduce", comm, K_ALLREDUCE, 0, -1, p, stream);
}

EXPORT ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recv_count,
                                      ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                      CUstream stream)
{
    part p = {.send = send, .recv = recv, .count = recv_count, .type = type, .op = op};
    return submit("ncclReduceScatter", comm, K_REDUCESCATTER, 0, -1, p, stream);
}

EXPORT ncclResult_t ncclAllGather(const void *send, void *recv, size_t send_count,
                                  ncclDataType_t type, ncclComm_t comm, CUstream stream)
{
    part p = {.send = send, .recv = recv, .count = send_count, .type = type, .op = ncclSum};
    return submit("ncclAllGather", comm, K_ALLGATHER, 0, -1, p, stream);
}

#ifndef NCCLFAULT_NO_SEND
EXPORT ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, CUstream stream)
{
    part p = {.send = send, .count = count, .type = type, .op = ncclSum};
    return submit("ncclSend", comm, K_SEND, 0, peer, p, stream);
}
#endif

EXPORT ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, CUstream stream)
{
    part p = {.recv = recv, .count = count, .type = type, .op = ncclSum};
    return submit("ncclRecv", comm, K_SEND, 1, peer, p, stream);
}

EXPORT ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0) {
        set_error("ncclfault: ncclGroupEnd without ncclGroupStart");
        return ncclInvalidUsage;
    }
    if (--group_depth > 0)
        return ncclSuccess;
    pthread_mutex_lock(&lock);
    ncclResult_t r = ncclSuccess;
    if (!injected("ncclGroupEnd", &r))
        for (size_t i = 0; i < n_queue; i++)
            if (valid((ncclComm_t)(void *)queue[i].c))
                add_part(queue[i].c, queue[i].kind, queue[i].is_recv, queue[i].peer, queue[i].p,
                         queue[i].stream);
    pthread_mutex_unlock(&lock);
    n_queue = 0;
    free(queue);
    queue = NULL;
    cap_queue = 0;
    return r;
}

/* ---- finalize, destroy, abort -------------------------------------------------------------- */

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t h)
{
    nf_comm *c = valid(h);
    if (!c)
        return ncclInvalidArgument;
    pthread_mutex_lock(&lock);
    ncclResult_t r;
    if (!injected("ncclCommFinalize", &r)) {
        c->finalizing = 1;
        c->finalize_hangs = hangs("finalize");
        c->state = c->finalize_hangs || has_parts(c) ? ncclInProgress : ncclSuccess;
        r = c->state;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* c leaves its clique: its parts of unfinished operations end (released), and those
 * operations never complete for the other ranks (lock held). */
static void drop_comm(nf_comm *c)
{
    clique *cl = c->cl;
    for (nf_op *o = cl->ops, *next; o; o = next) {
        next = o->next;
        int n = o->kind == K_SEND ? 2 : cl->nranks, left = 0;
        for (int i = 0; i < n; i++) {
            int r = o->kind == K_SEND ? (i ? o->to : o->from) : i;
            if (r == c->rank && o->parts[i].present) {
                release(o->parts[i].hold_id);
                o->parts[i].present = 0;
                o->parts[i].hold_id = 0;
                o->poisoned = 1;
            }
            left += o->parts[i].present;
        }
        if (o->poisoned && !left)
            free_op(cl, o);
    }
    cl->ranks[c->rank] = NULL;
    c->magic = 0;
    free(c);
    live_comms--;
    for (int i = 0; i < cl->nranks; i++)
        if (cl->ranks[i])
            return;
    while (cl->ops)
        free_op(cl, cl->ops);
    for (clique **p = &cliques; *p; p = &(*p)->next)
        if (*p == cl) {
            *p = cl->next;
            break;
        }
    free(cl->ranks);
    free(cl);
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t h)
{
    nf_comm *c = valid(h);
    if (!c)
        return ncclInvalidArgument;
    pthread_mutex_lock(&lock);
    ncclResult_t r;
    if (!injected("ncclCommDestroy", &r)) {
        drop_comm(c);
        r = ncclSuccess;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t h)
{
    nf_comm *c = valid(h);
    if (!c)
        return ncclInvalidArgument;
    pthread_mutex_lock(&lock);
    drop_comm(c);
    pthread_mutex_unlock(&lock);
    return ncclSuccess;
}
