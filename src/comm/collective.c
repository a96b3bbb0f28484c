/* The collectives: each call's checks, and issuing a list of them as one NCCL group,
 * ordered by the stream layer (src/stream/order.h) like any other use of their buffers. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "memory/buffer.h"
#include "memory/dtype.h"
#include "stream/capture.h"

static const char *const kind_names[] = {"all-reduce", "reduce-scatter", "all-gather",
                                         "all-to-all", "all-to-all-v", "send", "receive"};
static const char *const op_names[SC_REDUCE_OP_COUNT] = {"sum", "prod", "min", "max", "avg"};
static const ncclRedOp_t nccl_ops[SC_REDUCE_OP_COUNT] = {ncclSum, ncclProd, ncclMin, ncclMax,
                                                        ncclAvg};

static bool has_dst(sci_comm_kind k) { return k != SCI_COMM_SEND; }
static bool has_src(sci_comm_kind k) { return k != SCI_COMM_RECV; }
static bool reduces(sci_comm_kind k)
{
    return k == SCI_COMM_ALL_REDUCE || k == SCI_COMM_REDUCE_SCATTER;
}

/* A call with its objects acquired. */
typedef struct resolved {
    sci_comm_call *call;
    sci_comm *comm;
    sci_stream *st;
    sci_resolved_view dst, src; /* .buf NULL when the kind has none */
    sc_dtype dtype;
    size_t esize;
    bool empty;     /* nothing to move: not issued */
    char what[112]; /* "all-reduce of 1024 x f32 (sum)" */
} resolved;

static void release(resolved *r)
{
    sci_view_release(&r->dst);
    sci_view_release(&r->src);
    if (r->st)
        sci_stream_release(r->st);
    sci_comm_release(r->comm);
    r->st = NULL;
    r->comm = NULL;
}

static bool overlap(uint64_t a_lo, uint64_t a_hi, uint64_t b_lo, uint64_t b_hi)
{
    return a_lo < a_hi && b_lo < b_hi && a_lo < b_hi && b_lo < a_hi;
}

static sc_status same_context(resolved *r, const sci_resolved_view *v, const char *arg)
{
    if (v->buf->ctx == r->comm->ctx)
        return SC_OK;
    char vd[200], cd[300];
    return sci_fail(SC_ERR_WRONG_CONTEXT, r->call->fn, "%s %s belongs to another context than %s",
                    arg, sci_buffer_describe(v->buf, vd, sizeof vd),
                    sci_comm_describe(r->comm, cd, sizeof cd));
}

/* dst and src may share elements only as the kind's in-place form (in_place). */
static sc_status overlap_rule(resolved *r, bool in_place, const char *rule)
{
    const sci_resolved_view *d = &r->dst, *v = &r->src;
    if (in_place || !overlap(d->ptr, d->ptr + d->bytes, v->ptr, v->ptr + v->bytes))
        return SC_OK;
    char dd[200], sd[200];
    return sci_fail(SC_ERR_INVALID_ARGUMENT, r->call->fn,
                    "dst elements [%llu, %llu) of %s overlap src elements [%llu, %llu) of %s: %s",
                    (unsigned long long)d->offset, (unsigned long long)(d->offset + d->count),
                    sci_buffer_describe(d->buf, dd, sizeof dd), (unsigned long long)v->offset,
                    (unsigned long long)(v->offset + v->count),
                    sci_buffer_describe(v->buf, sd, sizeof sd), rule);
}

/* The reduction's operation and element type. */
static sc_status reduction_rule(resolved *r)
{
    const sci_comm_call *c = r->call;
    const char *dt = sc_dtype_name(r->dtype);
    if ((unsigned)c->op >= SC_REDUCE_OP_COUNT)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, c->fn, "op %d is not an sc_reduce_op "
                        "(SC_REDUCE_SUM .. SC_REDUCE_AVG)", (int)c->op);
    const bool fp8 = r->dtype == SC_F8E4M3 || r->dtype == SC_F8E5M2;
    if (c->op == SC_REDUCE_AVG && !sci_dtype_is_float(r->dtype))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, c->fn,
                        "SC_REDUCE_AVG of %s elements: NCCL divides an integer sum by the rank "
                        "count with truncation, which is not the average; reduce with "
                        "SC_REDUCE_SUM and divide",
                        dt);
    if (c->op == SC_REDUCE_AVG && fp8)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, c->fn,
                        "SC_REDUCE_AVG of %s elements: NCCL multiplies each value by 1/nranks "
                        "rounded to fp8 (1/3 is 0.34375 in e4m3), which is not the average; "
                        "reduce a wider type",
                        dt);
    if (sci_dtype_nccl(r->dtype) < 0)
        return sci_fail(SC_ERR_NOT_SUPPORTED, c->fn,
                        "NCCL can't reduce %s elements (it has no 16-bit integer type); widen "
                        "them to 32 bits (moving them works: all-gather, all-to-all, send)",
                        dt);
    if (fp8 && sci_nccl_version() < SCI_NCCL_FP8_VERSION) {
        char v[32];
        sci_nccl_version_text(sci_nccl_version(), v, sizeof v);
        return sci_fail(SC_ERR_NOT_SUPPORTED, c->fn,
                        "NCCL %s (%s) has no fp8 types: reductions of %s need NCCL 2.24.3 or "
                        "newer",
                        v, sci_nccl_library_path(), dt);
    }
    const sc_device_props *p = &r->comm->ctx->props;
    if (fp8 && p->cc_major < 9)
        return sci_fail(SC_ERR_NOT_SUPPORTED, c->fn,
                        "NCCL reduces %s elements on sm_90 and newer devices only; device %d "
                        "is sm_%d%d",
                        dt, r->comm->ctx->device, p->cc_major, p->cc_minor);
    return SC_OK;
}

static sc_status counts_rule(resolved *r, uint64_t got, uint64_t want, const char *arg,
                             const char *why)
{
    if (got == want)
        return SC_OK;
    return sci_fail(SC_ERR_OUT_OF_BOUNDS, r->call->fn, "%s has %llu elements; %s needs %llu",
                    arg, (unsigned long long)got, why, (unsigned long long)want);
}

/* all-to-all-v: each segment inside its view, the received ones apart. */
static sc_status segments_rule(resolved *r, bool *empty)
{
    const sci_comm_call *c = r->call;
    const int n = r->comm->nranks;
    const uint64_t *sc = c->counts, *so = sc + n, *rc = so + n, *ro = rc + n;
    *empty = true;
    for (int side = 0; side < 2; side++) {
        const uint64_t *cnt = side ? rc : sc, *off = side ? ro : so;
        const sci_resolved_view *v = side ? &r->dst : &r->src;
        const char *name = side ? "receive" : "send";
        for (int p = 0; p < n; p++) {
            uint64_t end;
            if (!sci_add_ok(off[p], cnt[p], &end))
                return sci_fail(SC_ERR_OVERFLOW, c->fn, "the %s segment of rank %d: offset "
                                "%llu + count %llu overflows", name, p,
                                (unsigned long long)off[p], (unsigned long long)cnt[p]);
            if (end > v->count)
                return sci_fail(SC_ERR_OUT_OF_BOUNDS, c->fn,
                                "the %s segment of rank %d, elements [%llu, %llu), is outside "
                                "the %s view's %llu elements",
                                name, p, (unsigned long long)off[p], (unsigned long long)end,
                                side ? "dst" : "src", (unsigned long long)v->count);
            if (cnt[p])
                *empty = false;
        }
    }
    for (int p = 0; p < n; p++)
        for (int q = 0; q < p; q++)
            if (overlap(ro[p], ro[p] + rc[p], ro[q], ro[q] + rc[q]))
                return sci_fail(SC_ERR_INVALID_ARGUMENT, c->fn,
                                "the receive segments of ranks %d, elements [%llu, %llu), and "
                                "%d, elements [%llu, %llu), of dst overlap",
                                q, (unsigned long long)ro[q],
                                (unsigned long long)(ro[q] + rc[q]), p,
                                (unsigned long long)ro[p], (unsigned long long)(ro[p] + rc[p]));
    return SC_OK;
}

static sc_status peer_rule(resolved *r)
{
    if (r->call->peer >= 0 && r->call->peer < r->comm->nranks)
        return SC_OK;
    return sci_fail(SC_ERR_INVALID_ARGUMENT, r->call->fn, "peer %d is outside [0, %d)",
                    r->call->peer, r->comm->nranks);
}

/* Reduce-scatter and all-gather: `whole` (named whole_name) holds a `part` of every rank,
 * this rank's at [rank x n, (rank + 1) x n) when in place. */
static sc_status whole_and_part_rule(resolved *r, const sci_resolved_view *whole,
                                     const sci_resolved_view *part, const char *whole_name,
                                     const char *what, const char *in_place_rule)
{
    const uint64_t n = (uint64_t)r->comm->nranks, rank = (uint64_t)r->comm->rank;
    uint64_t need;
    if (!sci_mul_ok(n, part->count, &need))
        return sci_fail(SC_ERR_OVERFLOW, r->call->fn, "%llu ranks x %llu elements overflows",
                        (unsigned long long)n, (unsigned long long)part->count);
    sc_status s = counts_rule(r, whole->count, need, whole_name, what);
    r->call->in_place = part->ptr == whole->ptr + rank * part->bytes;
    if (s == SC_OK)
        s = overlap_rule(r, r->call->in_place, in_place_rule);
    r->empty = part->count == 0;
    return s;
}

/* The kind's counts and overlap rules; sets r->empty and call->in_place. */
static sc_status shape_rules(resolved *r)
{
    sci_comm_call *c = r->call;
    const uint64_t n = (uint64_t)r->comm->nranks;
    const sci_resolved_view *d = &r->dst, *v = &r->src;
    sc_status s = SC_OK;
    switch (c->kind) {
    case SCI_COMM_ALL_REDUCE:
        s = counts_rule(r, d->count, v->count, "dst", "an all-reduce of src");
        c->in_place = d->ptr == v->ptr && d->bytes == v->bytes;
        if (s == SC_OK)
            s = overlap_rule(r, c->in_place, "an all-reduce is in place only when dst is src "
                                             "(the same elements)");
        r->empty = d->count == 0;
        break;
    case SCI_COMM_REDUCE_SCATTER:
        s = whole_and_part_rule(r, v, d, "src", "a reduce-scatter into the ranks' dst",
                                "a reduce-scatter is in place only when dst is src's "
                                "elements [rank x n, (rank + 1) x n)");
        break;
    case SCI_COMM_ALL_GATHER:
        s = whole_and_part_rule(r, d, v, "dst", "an all-gather of the ranks' src",
                                "an all-gather is in place only when src is dst's elements "
                                "[rank x n, (rank + 1) x n)");
        break;
    case SCI_COMM_ALL_TO_ALL:
        s = counts_rule(r, d->count, v->count, "dst", "an all-to-all of src");
        if (s == SC_OK && v->count % n)
            s = sci_fail(SC_ERR_OUT_OF_BOUNDS, c->fn, "src has %llu elements, not a multiple "
                         "of the %llu ranks", (unsigned long long)v->count,
                         (unsigned long long)n);
        if (s == SC_OK)
            s = overlap_rule(r, false, "an all-to-all can't be in place");
        r->empty = v->count == 0;
        break;
    case SCI_COMM_ALL_TO_ALL_V:
        s = segments_rule(r, &r->empty);
        if (s == SC_OK)
            s = overlap_rule(r, false, "an all-to-all-v can't be in place");
        break;
    case SCI_COMM_SEND:
        s = peer_rule(r);
        r->empty = v->count == 0;
        break;
    case SCI_COMM_RECV:
        s = peer_rule(r);
        r->empty = d->count == 0;
        break;
    }
    return s;
}

static void describe_call(resolved *r)
{
    const sci_comm_call *c = r->call;
    const sci_resolved_view *v = has_src(c->kind) ? &r->src : &r->dst;
    const char *dt = sc_dtype_name(r->dtype);
    int n = snprintf(r->what, sizeof r->what, "%s of %llu x %s", kind_names[c->kind],
                     (unsigned long long)v->count, dt);
    if (n < 0 || (size_t)n >= sizeof r->what)
        return;
    if (reduces(c->kind))
        snprintf(r->what + n, sizeof r->what - (size_t)n, " (%s)", op_names[c->op]);
    else if (c->kind == SCI_COMM_SEND || c->kind == SCI_COMM_RECV)
        snprintf(r->what + n, sizeof r->what - (size_t)n, " %s rank %d",
                 c->kind == SCI_COMM_SEND ? "to" : "from", c->peer);
}

/* Acquire and check one call (on success the caller releases r). */
static sc_status resolve(sci_comm_call *c, resolved *r)
{
    memset(r, 0, sizeof *r);
    r->call = c;
    const char *fn = c->fn;
    sc_status s = sci_comm_acquire(c->comm, fn, &r->comm);
    if (s == SC_OK)
        s = sci_comm_check_alive(r->comm, fn);
    if (s == SC_OK)
        s = sci_stream_resolve(c->stream, r->comm->ctx, fn, &r->st);
    if (s == SC_OK && has_dst(c->kind) &&
        (s = sci_view_resolve(c->dst, fn, "dst", &r->dst)) == SC_OK)
        s = same_context(r, &r->dst, "dst");
    if (s == SC_OK && has_src(c->kind) &&
        (s = sci_view_resolve(c->src, fn, "src", &r->src)) == SC_OK)
        s = same_context(r, &r->src, "src");
    if (s != SC_OK) {
        release(r);
        return s;
    }
    r->dtype = (r->src.buf ? r->src.buf : r->dst.buf)->dtype;
    r->esize = sc_dtype_size(r->dtype);
    if (r->src.buf && r->dst.buf && r->src.buf->dtype != r->dst.buf->dtype) {
        char dd[200], sd[200];
        s = sci_fail(SC_ERR_TYPE_MISMATCH, fn, "dst is %s (%s) but src is %s (%s)",
                     sc_dtype_name(r->dst.buf->dtype),
                     sci_buffer_describe(r->dst.buf, dd, sizeof dd),
                     sc_dtype_name(r->src.buf->dtype),
                     sci_buffer_describe(r->src.buf, sd, sizeof sd));
    }
    if (s == SC_OK && r->dst.buf && r->dst.buf->tracker.read_only) {
        char dd[200];
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "dst %s is read-only (borrowed or imported "
                     "read-only): it can't be written", sci_buffer_describe(r->dst.buf, dd,
                                                                            sizeof dd));
    }
    if (s == SC_OK && reduces(c->kind))
        s = reduction_rule(r);
    if (s == SC_OK)
        s = shape_rules(r);
    if (s != SC_OK) {
        release(r);
        return s;
    }
    describe_call(r);
    c->ctx_id = r->comm->ctx->obj.id;
    c->stream_id = r->st->obj.id;
    c->dst_buf = r->dst.buf ? r->dst.buf->obj.id : 0;
    c->dst_begin = r->dst.ptr;
    c->dst_end = r->dst.ptr + r->dst.bytes;
    c->src_buf = r->src.buf ? r->src.buf->obj.id : 0;
    c->src_begin = r->src.ptr;
    c->src_end = r->src.ptr + r->src.bytes;
    return SC_OK;
}

sc_status sci_comm_call_check(sci_comm_call *call)
{
    resolved r;
    sc_status s = resolve(call, &r);
    if (s == SC_OK)
        release(&r);
    return s;
}

void sci_comm_call_free(sci_comm_call *call)
{
    free(call->counts);
    call->counts = NULL;
}

sc_status sci_comm_group_rules(const sci_comm_call *calls, size_t latest, const char *fn)
{
    const sci_comm_call *b = &calls[latest];
    for (size_t j = 0; j < latest; j++) {
        const sci_comm_call *a = &calls[j];
        if (a->ctx_id != b->ctx_id)
            continue;
        if (a->stream_id != b->stream_id)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "call %zu of the group (%s) uses another stream of the same context "
                            "than call %zu (%s): a group uses one stream per context",
                            latest + 1, b->fn, j + 1, a->fn);
        const char *what = NULL;
        if (b->dst_buf && a->dst_buf && overlap(b->dst_begin, b->dst_end, a->dst_begin, a->dst_end))
            what = "dst overlaps the dst";
        else if (b->dst_buf && a->src_buf &&
                 overlap(b->dst_begin, b->dst_end, a->src_begin, a->src_end))
            what = "dst overlaps the src";
        else if (b->src_buf && a->dst_buf &&
                 overlap(b->src_begin, b->src_end, a->dst_begin, a->dst_end))
            what = "src overlaps the dst";
        if (what)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "the %s of call %zu (%s) %s of call %zu (%s) of the group: the "
                            "operations of a group run concurrently",
                            what[0] == 'd' ? "dst" : "src", latest + 1, b->fn, what + 4, j + 1,
                            a->fn);
    }
    return SC_OK;
}

/* ---- issuing -------------------------------------------------------------------------------- */

static bool going(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

/* Grouped sends and receives of all-to-all(-v): the segments with elements. */
static ncclResult_t exchange(resolved *r, const uint64_t *sc, const uint64_t *so,
                             const uint64_t *rc, const uint64_t *ro)
{
    ncclComm_t nc = r->comm->nccl;
    CUstream cu = r->st->cu;
    ncclResult_t res = sci_ncclGroupStart();
    for (int p = 0; p < r->comm->nranks && going(res); p++) {
        if (sc[p])
            res = sci_ncclSend((const void *)(uintptr_t)(r->src.ptr + so[p] * r->esize),
                               sc[p] * r->esize, ncclUint8, p, nc, cu);
        if (rc[p] && going(res))
            res = sci_ncclRecv((void *)(uintptr_t)(r->dst.ptr + ro[p] * r->esize),
                               rc[p] * r->esize, ncclUint8, p, nc, cu);
    }
    ncclResult_t end = sci_ncclGroupEnd();
    return going(res) ? end : res;
}

static ncclResult_t issue_one(resolved *r)
{
    const sci_comm_call *c = r->call;
    ncclComm_t nc = r->comm->nccl;
    CUstream cu = r->st->cu;
    const void *src = (const void *)(uintptr_t)r->src.ptr;
    void *dst = (void *)(uintptr_t)r->dst.ptr;
    switch (c->kind) {
    case SCI_COMM_ALL_REDUCE:
        return sci_ncclAllReduce(src, dst, r->dst.count, sci_dtype_nccl(r->dtype),
                                 nccl_ops[c->op], nc, cu);
    case SCI_COMM_REDUCE_SCATTER:
        return sci_ncclReduceScatter(src, dst, r->dst.count, sci_dtype_nccl(r->dtype),
                                     nccl_ops[c->op], nc, cu);
    case SCI_COMM_ALL_GATHER: /* data moves as bytes: any element type */
        return sci_ncclAllGather(src, dst, r->src.bytes, ncclUint8, nc, cu);
    case SCI_COMM_ALL_TO_ALL: {
        const int n = r->comm->nranks;
        const uint64_t chunk = r->src.count / (uint64_t)n;
        uint64_t *seg = malloc(4 * (size_t)n * sizeof *seg);
        if (!seg)
            return ncclSystemError;
        for (int p = 0; p < n; p++) {
            seg[p] = seg[2 * n + p] = chunk;
            seg[n + p] = seg[3 * n + p] = chunk * (uint64_t)p;
        }
        ncclResult_t res = exchange(r, seg, seg + n, seg + 2 * n, seg + 3 * n);
        free(seg);
        return res;
    }
    case SCI_COMM_ALL_TO_ALL_V: {
        const int n = r->comm->nranks;
        return exchange(r, c->counts, c->counts + n, c->counts + 2 * n, c->counts + 3 * n);
    }
    case SCI_COMM_SEND:
        return sci_ncclSend(src, r->src.bytes, ncclUint8, c->peer, nc, cu);
    case SCI_COMM_RECV:
        return sci_ncclRecv(dst, r->dst.bytes, ncclUint8, c->peer, nc, cu);
    }
    return ncclInternalError;
}

/* The stream's access set, built from every call on it. */
static size_t build_sets(resolved *rs, size_t n, sci_access_set *sets, sci_access *acc)
{
    size_t n_sets = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < n_sets && !seen; j++)
            seen = sets[j].stream == rs[i].st;
        if (seen)
            continue;
        sci_access_set *set = &sets[n_sets++];
        set->stream = rs[i].st;
        set->acc = acc + k;
        set->n = 0;
        for (size_t m = i; m < n; m++) {
            if (rs[m].st != set->stream || rs[m].empty)
                continue;
            if (rs[m].dst.buf)
                set->acc[set->n++] = (sci_access){&rs[m].dst.buf->tracker, SCI_WRITE};
            if (rs[m].src.buf)
                set->acc[set->n++] = (sci_access){&rs[m].src.buf->tracker, SCI_READ};
        }
        k += set->n;
    }
    return n_sets;
}

static struct sci_capture *capture_of(sci_access_set *sets, size_t n_sets, sci_stream *st)
{
    for (size_t j = 0; j < n_sets; j++)
        if (sets[j].stream == st)
            return sets[j].cap;
    return NULL;
}

/* Issue the resolved calls (the GPUs' issue locks and the trackers held). */
static sc_status issue_all(resolved *rs, size_t n, sci_comm **comms, size_t n_comms,
                           sci_access_set *sets, size_t n_sets, const char *fn)
{
    char what[200];
    if (n == 1)
        snprintf(what, sizeof what, "issuing the %s", rs[0].what);
    else
        snprintf(what, sizeof what, "issuing a group of %zu operations (the first: the %s)", n,
                 rs[0].what);
    const uint64_t t0 = sci_comm_now_ns();
    ncclResult_t err = ncclSuccess;
    size_t err_at = 0;
    sc_status s = SC_OK;
    sci_ncclGroupStart();
    for (size_t i = 0; i < n && s == SC_OK && going(err); i++) {
        if (rs[i].empty)
            continue;
        const char *call;
        CUresult cr = sci_context_make_current_cu(rs[i].comm->ctx, &call);
        if (cr != CUDA_SUCCESS) {
            s = sci_context_fail_cu(rs[i].comm->ctx, cr, fn, "%s failed", call);
            break;
        }
        err = issue_one(&rs[i]);
        err_at = i;
    }
    ncclResult_t end = sci_ncclGroupEnd();
    if (going(err) && !going(end)) {
        err = end;
        err_at = 0;
    }
    if (s == SC_OK && !going(err)) {
        char e[600];
        sci_comm_nccl_error(err, rs[err_at].comm->nccl, e, sizeof e);
        for (size_t i = 0; i < n_comms; i++)
            sci_comm_abort_locked(comms[i], SC_ERR_COMM, true,
                                  "NCCL refused the %s: %s; the state of its ranks is unknown",
                                  rs[err_at].what, e);
        s = sci_comm_check_alive(rs[err_at].comm, fn);
    } else if (s != SC_OK) {
        for (size_t i = 0; i < n_comms; i++)
            sci_comm_abort_locked(comms[i], SC_ERR_COMM, true, "%s failed: %s", what,
                                  sc_last_error());
    } else {
        s = sci_comm_wait_issued(comms, n_comms, what, fn);
    }
    for (size_t i = 0; i < n && s == SC_OK; i++)
        if (!rs[i].empty && !capture_of(sets, n_sets, rs[i].st))
            s = sci_comm_track(rs[i].comm, rs[i].st, t0, rs[i].what, fn);
    return s;
}

sc_status sci_comm_issue(sci_comm_call *calls, size_t n, const char *fn)
{
    const bool group = n > 1 || strcmp(fn, calls[0].fn) != 0;
    resolved *rs = calloc(n, sizeof *rs);
    sci_comm **comms = calloc(n, sizeof *comms);
    int *devices = calloc(n, sizeof *devices);
    sci_access_set *sets = calloc(n, sizeof *sets);
    sci_access *acc = calloc(2 * n, sizeof *acc);
    size_t done = 0;
    sc_status s = SC_OK;
    if (!rs || !comms || !devices || !sets || !acc) {
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
        goto out;
    }
    for (; done < n; done++)
        if ((s = resolve(&calls[done], &rs[done])) != SC_OK)
            break;
    if (s != SC_OK && group) {
        char *saved = sci_error_save();
        s = sci_fail(s, fn, "call %zu of the %zu of the group: %s; nothing was issued",
                     done + 1, n, saved ? saved : "");
        free(saved);
    }
    for (size_t i = 1; i < n && s == SC_OK; i++)
        s = sci_comm_group_rules(calls, i, fn);
    if (s != SC_OK)
        goto out;
    size_t n_comms = 0;
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < n_comms && !seen; j++)
            seen = comms[j] == rs[i].comm;
        if (!seen) {
            comms[n_comms] = rs[i].comm;
            devices[n_comms++] = rs[i].comm->ctx->device;
        }
    }
    const size_t n_locked = sci_comm_lock_devices(devices, n_comms);
    for (size_t i = 0; i < n_comms && s == SC_OK; i++)
        s = sci_comm_check_alive(comms[i], fn);
    size_t n_sets = build_sets(rs, n, sets, acc);
    if (s == SC_OK && (s = sci_access_begin_sets(sets, n_sets, fn)) == SC_OK) {
        /* A captured collective: its graph remembers the communicator (replay checks). */
        for (size_t j = 0; j < n_sets; j++)
            for (size_t i = 0; i < n && sets[j].cap; i++)
                if (rs[i].st == sets[j].stream)
                    sci_capture_remember_locked(sets[j].cap, rs[i].comm->obj.id, 0);
        bool any = false;
        for (size_t i = 0; i < n; i++)
            any |= !rs[i].empty;
        if (any)
            s = issue_all(rs, n, comms, n_comms, sets, n_sets, fn);
        sc_status e = sci_access_end_sets(sets, n_sets, any, fn);
        if (s == SC_OK)
            s = e;
    }
    sci_comm_unlock_devices(devices, n_locked);
out:
    for (size_t i = 0; rs && i < done && i < n; i++)
        release(&rs[i]);
    free(rs), free(comms), free(devices), free(sets), free(acc);
    return s;
}

/* ---- the public calls ---------------------------------------------------------------------- */

static sc_status submit(sci_comm_call *call)
{
    sc_status s;
    if (sci_comm_group_take(call, &s))
        return s;
    s = sci_comm_issue(call, 1, call->fn);
    sci_comm_call_free(call);
    return s;
}

sc_status sc_comm_all_reduce(sc_comm comm, sc_stream stream, sc_view dst, sc_view src,
                             sc_reduce_op op)
{
    sci_comm_call c = {.kind = SCI_COMM_ALL_REDUCE, .fn = "sc_comm_all_reduce", .comm = comm,
                       .stream = stream, .dst = dst, .src = src, .op = op};
    return submit(&c);
}

sc_status sc_comm_reduce_scatter(sc_comm comm, sc_stream stream, sc_view dst, sc_view src,
                                 sc_reduce_op op)
{
    sci_comm_call c = {.kind = SCI_COMM_REDUCE_SCATTER, .fn = "sc_comm_reduce_scatter",
                       .comm = comm, .stream = stream, .dst = dst, .src = src, .op = op};
    return submit(&c);
}

sc_status sc_comm_all_gather(sc_comm comm, sc_stream stream, sc_view dst, sc_view src)
{
    sci_comm_call c = {.kind = SCI_COMM_ALL_GATHER, .fn = "sc_comm_all_gather", .comm = comm,
                       .stream = stream, .dst = dst, .src = src};
    return submit(&c);
}

sc_status sc_comm_all_to_all(sc_comm comm, sc_stream stream, sc_view dst, sc_view src)
{
    sci_comm_call c = {.kind = SCI_COMM_ALL_TO_ALL, .fn = "sc_comm_all_to_all", .comm = comm,
                       .stream = stream, .dst = dst, .src = src};
    return submit(&c);
}

/* counts and offsets (packed when NULL) into out[0 .. n) and out[n .. 2n). */
static sc_status copy_segments(const uint64_t *counts, const uint64_t *offsets, int n,
                               uint64_t *out, const char *name, const char *fn)
{
    uint64_t at = 0;
    for (int p = 0; p < n; p++) {
        out[p] = counts[p];
        if (offsets) {
            out[n + p] = offsets[p];
        } else {
            out[n + p] = at;
            if (!sci_add_ok(at, counts[p], &at))
                return sci_fail(SC_ERR_OVERFLOW, fn, "the sum of %s passes 64 bits (at rank "
                                "%d)", name, p);
        }
    }
    return SC_OK;
}

sc_status sc_comm_all_to_all_v(sc_comm comm, sc_stream stream, sc_view dst,
                               const uint64_t *recv_counts, const uint64_t *recv_offsets,
                               sc_view src, const uint64_t *send_counts,
                               const uint64_t *send_offsets)
{
    static const char fn[] = "sc_comm_all_to_all_v";
    SCI_CHECK_PTR(fn, recv_counts);
    SCI_CHECK_PTR(fn, send_counts);
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_COMM, comm.id, fn, &obj);
    if (s != SC_OK)
        return s;
    const int n = ((sci_comm *)obj)->nranks;
    sci_registry_release(obj);
    uint64_t *counts = malloc(4 * (size_t)n * sizeof *counts);
    if (!counts)
        return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
    if ((s = copy_segments(send_counts, send_offsets, n, counts, "send_counts", fn)) != SC_OK ||
        (s = copy_segments(recv_counts, recv_offsets, n, counts + 2 * n, "recv_counts", fn)) !=
            SC_OK) {
        free(counts);
        return s;
    }
    sci_comm_call c = {.kind = SCI_COMM_ALL_TO_ALL_V, .fn = fn, .comm = comm, .stream = stream,
                       .dst = dst, .src = src, .counts = counts};
    return submit(&c);
}

sc_status sc_comm_send(sc_comm comm, sc_stream stream, sc_view src, int peer)
{
    sci_comm_call c = {.kind = SCI_COMM_SEND, .fn = "sc_comm_send", .comm = comm,
                       .stream = stream, .src = src, .peer = peer};
    return submit(&c);
}

sc_status sc_comm_recv(sc_comm comm, sc_stream stream, sc_view dst, int peer)
{
    sci_comm_call c = {.kind = SCI_COMM_RECV, .fn = "sc_comm_recv", .comm = comm,
                       .stream = stream, .dst = dst, .peer = peer};
    return submit(&c);
}
