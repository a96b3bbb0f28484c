/* Communicators on the test device with the NCCL test double (comm_td.h says what these tests
 * can and can't show): creation both ways, every collective's plumbing against a CPU
 * reference on fresh random data (the double really reduces and moves the test device's
 * memory, so a wrong pointer, count, offset, type or peer shows), in place and not, one
 * thread with groups and one thread per rank. The refusals are in test_td_comm_checks.c.
 * SAFECUDA_TESTDEVICE_DEVICES=4. */
#define _GNU_SOURCE

#include "../bf16.h"
#include "comm_td.h"

/* ---- a CPU reference: the double's rule (accumulate in double in rank order, round once) */

static bool is_float(sc_dtype t) { return t == SC_F32 || t == SC_F64 || t == SC_BF16; }

static double load(const void *p, size_t i, sc_dtype t)
{
    const unsigned char *b = p;
    switch (t) {
    case SC_F32: { float v; memcpy(&v, b + 4 * i, 4); return v; }
    case SC_F64: { double v; memcpy(&v, b + 8 * i, 8); return v; }
    case SC_BF16: { uint16_t v; memcpy(&v, b + 2 * i, 2); return bf2f(v); }
    case SC_I32: { int32_t v; memcpy(&v, b + 4 * i, 4); return v; }
    case SC_U8: return b[i];
    default: return 0;
    }
}

static void store(void *p, size_t i, sc_dtype t, double v)
{
    unsigned char *b = p;
    switch (t) {
    case SC_F32: { float x = (float)v; memcpy(b + 4 * i, &x, 4); break; }
    case SC_F64: memcpy(b + 8 * i, &v, 8); break;
    case SC_BF16: { uint16_t x = f2bf((float)v); memcpy(b + 2 * i, &x, 2); break; }
    case SC_I32: { int32_t x = (int32_t)v; memcpy(b + 4 * i, &x, 4); break; }
    case SC_U8: b[i] = (uint8_t)v; break;
    default: break;
    }
}

/* Fresh random elements: floats in [-1, 1), small integers (four ranks' sums and products
 * fit every type). */
static void random_elements(void *p, size_t count, sc_dtype t, uint64_t seed)
{
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < count; i++) {
        uint64_t r = test_rand(&st);
        double v = is_float(t) ? (double)(r >> 11) / 9007199254740992.0 * 2 - 1
                               : (double)(r % 4) + (t == SC_U8 ? 0 : -2) + (r % 4 == 2);
        store(p, i, t, v);
    }
}

static void reference(void *out, void *const *in, int n, size_t count, sc_dtype t,
                      sc_reduce_op op)
{
    for (size_t i = 0; i < count; i++) {
        double acc = load(in[0], i, t);
        for (int r = 1; r < n; r++) {
            double v = load(in[r], i, t);
            acc = op == SC_REDUCE_PROD ? acc * v
                : op == SC_REDUCE_MIN  ? (v < acc ? v : acc)
                : op == SC_REDUCE_MAX  ? (v > acc ? v : acc)
                                       : acc + v;
        }
        if (op == SC_REDUCE_AVG)
            acc /= n;
        store(out, i, t, acc);
    }
}

static const uint8_t POISON = 0xa5;

/* ---- reductions ----------------------------------------------------------------------------- */

/* All-reduce (scatter = false) or reduce-scatter over n ranks from one thread (a group), in
 * place or not. */
static void reduction(int n, sc_dtype t, sc_reduce_op op, bool scatter, bool in_place)
{
    const size_t c = 37, es = sc_dtype_size(t), total = scatter ? c * (size_t)n : c;
    const size_t out_count = scatter ? c : total;
    void *in[MAX_RANKS];
    unsigned char *want = test_xmalloc(total * es), *got = test_xmalloc(total * es);
    sc_buffer src[MAX_RANKS], dst[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        in[r] = test_xmalloc(total * es);
        random_elements(in[r], total, t, 1000u * (unsigned)t + 10u * (unsigned)op + (unsigned)r);
        src[r] = buf(ctxs[r], t, total, "src");
        upload(src[r], in[r], total * es);
        if (!in_place) {
            dst[r] = buf(ctxs[r], t, out_count, "dst");
            memset(got, POISON, out_count * es);
            upload(dst[r], got, out_count * es);
        }
    }
    reference(want, in, n, total, t, op);
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++) {
        sc_view d = sc_view_of(in_place ? src[r] : dst[r]);
        if (in_place && scatter)
            CHECK_OK(sc_buffer_view(src[r], (uint64_t)r * c, c, &d));
        if (scatter)
            CHECK_OK(sc_comm_reduce_scatter(comms[r], SC_DEFAULT_STREAM, d, sc_view_of(src[r]),
                                            op));
        else
            CHECK_OK(sc_comm_all_reduce(comms[r], SC_DEFAULT_STREAM, d, sc_view_of(src[r]), op));
    }
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_synchronize(comms[r]));
        const size_t at = scatter ? (size_t)r * c : 0;
        sc_view d = sc_view_of(in_place ? src[r] : dst[r]);
        if (in_place && scatter)
            CHECK_OK(sc_buffer_view(src[r], at, c, &d));
        CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, got, out_count * es, d));
        char what[96];
        snprintf(what, sizeof what, "%s %s %s of %d ranks, rank %d%s",
                 scatter ? "reduce-scatter" : "all-reduce", sc_dtype_name(t),
                 (const char *[]){"sum", "prod", "min", "max", "avg"}[op], n, r,
                 in_place ? " in place" : "");
        CHECK_BYTES(got, want + at * es, out_count * es, what);
        CHECK_OK(sc_buffer_destroy(src[r]));
        if (!in_place)
            CHECK_OK(sc_buffer_destroy(dst[r]));
        free(in[r]);
    }
    free(want);
    free(got);
}

static void test_reductions(void)
{
    static const sc_dtype types[] = {SC_F32, SC_BF16, SC_I32, SC_U8, SC_F64};
    for (int n = 2; n <= 4; n += 2) {
        open_contexts(n);
        world(n, 0);
        for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
            for (int op = 0; op < SC_REDUCE_OP_COUNT; op++) {
                if (op == SC_REDUCE_AVG && !is_float(types[k]))
                    continue; /* refused (test_td_comm_checks.c) */
                for (int scatter = 0; scatter < 2; scatter++)
                    reduction(n, types[k], (sc_reduce_op)op, scatter, false);
            }
        reduction(n, SC_F32, SC_REDUCE_SUM, false, true);
        reduction(n, SC_BF16, SC_REDUCE_SUM, true, true);
        end_world(n);
        close_contexts(n);
    }
}

/* ---- data movement -------------------------------------------------------------------------- */

/* All-gather of c elements per rank, in place or not; u16 (which NCCL can't reduce) moves. */
static void gather(int n, bool in_place)
{
    const size_t c = 29, es = 2;
    uint16_t *in[MAX_RANKS], *want = test_xmalloc(n * c * es), *got = test_xmalloc(n * c * es);
    sc_buffer src[MAX_RANKS], dst[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        in[r] = test_xmalloc(c * es);
        test_fill_random(in[r], c * es, 300u + (unsigned)r);
        memcpy(want + (size_t)r * c, in[r], c * es);
        dst[r] = buf(ctxs[r], SC_U16, n * c, "dst");
        memset(got, POISON, n * c * es);
        upload(dst[r], got, n * c * es);
        if (in_place) {
            CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM,
                                       (sc_view){dst[r], (uint64_t)r * c, c}, in[r], c * es));
        } else {
            src[r] = buf(ctxs[r], SC_U16, c, "src");
            upload(src[r], in[r], c * es);
        }
    }
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++) {
        sc_view s = in_place ? (sc_view){dst[r], (uint64_t)r * c, c} : sc_view_of(src[r]);
        CHECK_OK(sc_comm_all_gather(comms[r], SC_DEFAULT_STREAM, sc_view_of(dst[r]), s));
    }
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_synchronize(comms[r]));
        download(dst[r], got, n * c * es);
        CHECK_BYTES(got, want, n * c * es, in_place ? "all-gather in place" : "all-gather");
        CHECK_OK(sc_buffer_destroy(dst[r]));
        if (!in_place)
            CHECK_OK(sc_buffer_destroy(src[r]));
        free(in[r]);
    }
    free(want);
    free(got);
}

/* All-to-all-v with m[p][q] elements from rank p to rank q (zeros included). Even ranks
 * pass NULL offsets (packed), odd ones explicit offsets with gaps of 3 elements, which must
 * keep their poison. equal: every count the same, through sc_comm_all_to_all. */
static void exchange(int n, bool equal)
{
    enum { GAP = 3 };
    uint64_t m[MAX_RANKS][MAX_RANKS];
    for (int p = 0; p < n; p++)
        for (int q = 0; q < n; q++)
            m[p][q] = equal ? 5 : (uint64_t)((p + 2 * q) % 4) * 3; /* 0, 3, 6 or 9 */
    uint64_t so[MAX_RANKS][MAX_RANKS], ro[MAX_RANKS][MAX_RANKS], slen[MAX_RANKS], rlen[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        const uint64_t gap = equal || r % 2 == 0 ? 0 : GAP;
        slen[r] = rlen[r] = gap;
        for (int q = 0; q < n; q++) {
            so[r][q] = slen[r];
            slen[r] += m[r][q] + gap;
            ro[r][q] = rlen[r];
            rlen[r] += m[q][r] + gap;
        }
    }
    float *in[MAX_RANKS], *got[MAX_RANKS];
    sc_buffer src[MAX_RANKS], dst[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        in[r] = test_xmalloc(slen[r] * 4);
        random_elements(in[r], slen[r], SC_F32, 500u + (unsigned)r);
        src[r] = buf(ctxs[r], SC_F32, slen[r], "src");
        upload(src[r], in[r], slen[r] * 4);
        got[r] = test_xmalloc(rlen[r] * 4);
        memset(got[r], POISON, rlen[r] * 4);
        dst[r] = buf(ctxs[r], SC_F32, rlen[r], "dst");
        upload(dst[r], got[r], rlen[r] * 4);
    }
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++) {
        uint64_t sc[MAX_RANKS], rc[MAX_RANKS];
        for (int q = 0; q < n; q++) {
            sc[q] = m[r][q];
            rc[q] = m[q][r];
        }
        if (equal)
            CHECK_OK(sc_comm_all_to_all(comms[r], SC_DEFAULT_STREAM, sc_view_of(dst[r]),
                                        sc_view_of(src[r])));
        else
            CHECK_OK(sc_comm_all_to_all_v(comms[r], SC_DEFAULT_STREAM, sc_view_of(dst[r]), rc,
                                          r % 2 ? ro[r] : NULL, sc_view_of(src[r]), sc,
                                          r % 2 ? so[r] : NULL));
    }
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_synchronize(comms[r]));
        float *want = test_xmalloc(rlen[r] * 4);
        memset(want, POISON, rlen[r] * 4);
        for (int p = 0; p < n; p++)
            memcpy(want + ro[r][p], in[p] + so[p][r], m[p][r] * 4);
        download(dst[r], got[r], rlen[r] * 4);
        CHECK_BYTES(got[r], want, rlen[r] * 4, equal ? "all-to-all" : "all-to-all-v");
        free(want);
    }
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_buffer_destroy(src[r]));
        CHECK_OK(sc_buffer_destroy(dst[r]));
        free(in[r]);
        free(got[r]);
    }
}

/* A ring of sends and receives in one group, and a rank's send to itself. */
static void ring(int n)
{
    const size_t c = 17;
    int32_t *in[MAX_RANKS], got[17];
    sc_buffer src[MAX_RANKS], dst[MAX_RANKS], self[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        in[r] = test_xmalloc(c * 4);
        random_elements(in[r], c, SC_I32, 700u + (unsigned)r);
        src[r] = buf(ctxs[r], SC_I32, c, "src");
        dst[r] = buf(ctxs[r], SC_I32, c, "dst");
        self[r] = buf(ctxs[r], SC_I32, c, "self");
        upload(src[r], in[r], c * 4);
    }
    CHECK_OK(sc_comm_group_begin());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_send(comms[r], SC_DEFAULT_STREAM, sc_view_of(src[r]), (r + 1) % n));
        CHECK_OK(sc_comm_recv(comms[r], SC_DEFAULT_STREAM, sc_view_of(dst[r]), (r + n - 1) % n));
        CHECK_OK(sc_comm_send(comms[r], SC_DEFAULT_STREAM, sc_view_of(src[r]), r));
        CHECK_OK(sc_comm_recv(comms[r], SC_DEFAULT_STREAM, sc_view_of(self[r]), r));
    }
    CHECK_OK(sc_comm_group_end());
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_comm_synchronize(comms[r]));
        download(dst[r], got, c * 4);
        CHECK_BYTES(got, in[(r + n - 1) % n], c * 4, "ring receive");
        download(self[r], got, c * 4);
        CHECK_BYTES(got, in[r], c * 4, "receive from itself");
    }
    for (int r = 0; r < n; r++) {
        CHECK_OK(sc_buffer_destroy(src[r]));
        CHECK_OK(sc_buffer_destroy(dst[r]));
        CHECK_OK(sc_buffer_destroy(self[r]));
        free(in[r]);
    }
}

static void test_movement(void)
{
    for (int n = 2; n <= 4; n += 2) {
        open_contexts(n);
        world(n, 0);
        gather(n, false);
        gather(n, true);
        exchange(n, false);
        exchange(n, true);
        ring(n);
        /* Nested groups issue at the outermost end. */
        sc_buffer g[MAX_RANKS];
        int32_t one[3] = {1, 2, 3}, sum[3], want[3] = {n, 2 * n, 3 * n};
        CHECK_OK(sc_comm_group_begin());
        for (int r = 0; r < n; r++) {
            g[r] = buf(ctxs[r], SC_I32, 3, "g");
            upload(g[r], one, sizeof one);
            CHECK_OK(sc_comm_group_begin());
            CHECK_OK(sc_comm_all_reduce(comms[r], SC_DEFAULT_STREAM, sc_view_of(g[r]),
                                        sc_view_of(g[r]), SC_REDUCE_SUM));
            CHECK_OK(sc_comm_group_end()); /* inner: nothing issued yet */
            download(g[r], sum, sizeof sum);
            CHECK_BYTES(sum, one, sizeof sum, "not issued before the outer end");
            CHECK_OK(sc_comm_query(comms[r]));
        }
        CHECK_OK(sc_comm_group_end());
        for (int r = 0; r < n; r++) {
            CHECK_OK(sc_comm_synchronize(comms[r]));
            download(g[r], sum, sizeof sum);
            CHECK_BYTES(sum, want, sizeof sum, "nested group");
            CHECK_OK(sc_buffer_destroy(g[r]));
        }
        /* Zero elements: nothing to do (every rank gives zero). */
        sc_buffer z = buf(ctxs[0], SC_F32, 4, "z");
        CHECK_OK(sc_comm_group_begin());
        for (int r = 0; r < n; r++)
            CHECK_OK(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, (sc_view){z, 4, 0},
                                        (sc_view){z, 4, 0}, SC_REDUCE_SUM));
        CHECK_OK(sc_comm_group_end());
        CHECK_OK(sc_comm_query(comms[0]));
        CHECK_OK(sc_buffer_destroy(z));
        end_world(n);
        close_contexts(n);
    }
}

/* ---- one thread per rank, the unique-id form ------------------------------------------------ */

typedef struct rank_job {
    int rank, n;
    sc_comm_id id;
    sc_stream stream;
} rank_job;

static void *rank_thread(void *arg)
{
    rank_job *j = arg;
    sc_comm comm;
    sc_comm_desc d = {.unique_id = j->id, .nranks = j->n, .rank = j->rank, .label = "threads"};
    if (sc_comm_create(ctxs[j->rank], &d, &comm) != SC_OK) {
        fprintf(stderr, "rank %d: %s\n", j->rank, sc_last_error());
        test_failures++;
        return NULL;
    }
    sc_comm_props p;
    CHECK_OK(sc_comm_info(comm, &p));
    CHECK(p.rank == j->rank && p.nranks == j->n && p.device == j->rank && !p.aborted);
    CHECK(p.timeout_ms == SC_COMM_DEFAULT_TIMEOUT_MS && strcmp(p.label, "threads") == 0);
    CHECK(p.context.id == ctxs[j->rank].id && strcmp(p.file, "test_td_comm.c") == 0);
    enum { C = 64, ROUNDS = 20 };
    float in[C], out[C], want[C];
    sc_buffer b = buf(ctxs[j->rank], SC_F32, C, "x");
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < C; i++) {
            in[i] = (float)(j->rank + 1) * (float)(i + round);
            want[i] = 0;
            for (int r = 0; r < j->n; r++)
                want[i] += (float)(r + 1) * (float)(i + round);
        }
        CHECK_OK(sc_copy_from_host(j->stream, sc_view_of(b), in, sizeof in));
        CHECK_OK(sc_comm_all_reduce(comm, j->stream, sc_view_of(b), sc_view_of(b),
                                    SC_REDUCE_SUM));
        /* The double finishes a collective when the last rank joins: wait before reading
         * (on a GPU the stream orders the copy after it). */
        CHECK_OK(sc_comm_synchronize(comm));
        CHECK_OK(sc_copy_to_host(j->stream, out, sizeof out, sc_view_of(b)));
        CHECK_BYTES(out, want, sizeof out, "thread all-reduce");
    }
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_comm_destroy(comm));
    return NULL;
}

static void test_threads(void)
{
    const int n = 4;
    open_contexts(n);
    sc_comm_id id;
    CHECK_OK(sc_comm_unique_id(&id));
    rank_job jobs[MAX_RANKS];
    pthread_t t[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r] = (rank_job){.rank = r, .n = n, .id = id};
        REQUIRE(sc_stream_create(ctxs[r], NULL, &jobs[r].stream) == SC_OK);
        REQUIRE(pthread_create(&t[r], NULL, rank_thread, &jobs[r]) == 0);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(t[r], NULL);
        CHECK_OK(sc_stream_destroy(jobs[r].stream));
    }
    CHECK(ncclfault.live_comms() == 0);
    close_contexts(n);
}

/* One communicator of one rank: a collective is a copy. */
static void test_one_rank(void)
{
    open_contexts(1);
    world(1, 0);
    float in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    sc_buffer a = buf(ctxs[0], SC_F32, 8, "a"), b = buf(ctxs[0], SC_F32, 8, "b");
    upload(a, in, sizeof in);
    CHECK_OK(sc_comm_all_reduce(comms[0], SC_DEFAULT_STREAM, sc_view_of(b), sc_view_of(a),
                                SC_REDUCE_MAX));
    CHECK_OK(sc_comm_synchronize(comms[0]));
    download(b, out, sizeof out);
    CHECK_BYTES(out, in, sizeof in, "one rank");
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
    end_world(1);
    close_contexts(1);
}

int main(void)
{
    comm_td_attach();
    TEST_RUN(test_one_rank);
    TEST_RUN(test_reductions);
    TEST_RUN(test_movement);
    TEST_RUN(test_threads);
    CHECK(fake.misuse_count() == 0);
    return test_result("test_td_comm");
}
