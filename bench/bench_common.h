/* Shared helpers for the benchmarks: status checks, clocks, medians, random data, the
 * command line (--out DIR, --quick), the no-GPU skip rule and the Python peers.
 *
 * Every function is static inline so a program that leaves one unused still builds with
 * -Werror. The benchmarks use the public API only (include/; a host test keeps src/ out of
 * bench/); the raw driver baselines load libcuda themselves (raw_driver.h). */
#ifndef SAFECUDA_BENCH_COMMON_H
#define SAFECUDA_BENCH_COMMON_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_presence.h"
#include "safecuda.h"

#ifndef SAFECUDA_SOURCE_DIR
#define SAFECUDA_SOURCE_DIR "."
#endif

/* ---- status checks: any failure ends the benchmark with exit status 1 ---------------- */

static inline void bench_fail_sc(const char *expr, sc_status s, const char *file, int line)
{
    fflush(stdout);
    fprintf(stderr, "bench: %s:%d: %s failed: %s: %s\n", file, line, expr, sc_status_name(s),
            sc_last_error());
    printf("FAILED: %s returned %s: %s\n", expr, sc_status_name(s), sc_last_error());
    exit(1);
}

/* Evaluate an sc_status expression; on failure print sc_last_error() and exit 1. */
#define SC_TRY(expr)                                          \
    do {                                                      \
        sc_status sc_try_ = (expr);                           \
        if (sc_try_ != SC_OK)                                 \
            bench_fail_sc(#expr, sc_try_, __FILE__, __LINE__); \
    } while (0)

static inline void *bench_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        printf("FAILED: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---- command line ----------------------------------------------------------------------- */

typedef struct bench_opts {
    const char *out_dir; /* NULL: write no data files */
    bool quick;          /* smoke-test sizes and counts: the numbers are not results */
} bench_opts;

/* Make --out's folder (and its parents) at the start, so that a run never ends unable to
 * write its results; one that can't be made ends the program here (exit 2, as bad usage). */
static inline void bench_make_out_dir(const char *program, const char *dir)
{
    const char *slash = strrchr(program, '/');
    const char *name = slash ? slash + 1 : program;
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        fprintf(stderr, "%s: --out %s: can't make the folder: %s\n", name, dir,
                strerror(ENAMETOOLONG));
        exit(2);
    }
    for (char *p = path + 1;; p++) {
        bool end = *p == '\0';
        if (!end && *p != '/')
            continue;
        *p = '\0';
        struct stat st;
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "%s: --out %s: can't make the folder: %s\n", name, dir,
                    strerror(errno));
            exit(2);
        }
        if (end && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) {
            fprintf(stderr, "%s: --out %s: can't make the folder: %s\n", name, dir,
                    strerror(ENOTDIR));
            exit(2);
        }
        if (end)
            break;
        *p = '/';
    }
}

static inline bench_opts bench_parse_args(int argc, char **argv, const char *about)
{
    bench_opts o = {NULL, false};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--quick") == 0) {
            o.quick = true;
        } else if (strcmp(a, "--out") == 0 && i + 1 < argc) {
            o.out_dir = argv[++i];
        } else if (strncmp(a, "--out=", 6) == 0) {
            o.out_dir = a + 6;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            printf("usage: %s [--out DIR] [--quick]\n%s\n"
                   "  --out DIR  also write the results as CSV into DIR (made if needed)\n"
                   "  --quick    few sizes and repetitions (a smoke test, not a result)\n"
                   "environment: SAFECUDA_BENCH_PYTHON (default python3), "
                   "SAFECUDA_BENCH_NO_PEER=1 (skip the torch peer)\n",
                   argv[0], about);
            exit(0);
        } else {
            fprintf(stderr, "%s: unknown argument '%s' (try --help)\n", argv[0], a);
            exit(2);
        }
    }
    if (o.out_dir && !*o.out_dir)
        o.out_dir = NULL;
    if (o.out_dir)
        bench_make_out_dir(argv[0], o.out_dir);
    return o;
}

/* Open DIR/name for writing, or NULL (with a note) when --out was not given or it fails. */
static inline FILE *bench_open_out(const bench_opts *o, const char *name, char *path,
                                   size_t path_size)
{
    if (!o->out_dir)
        return NULL;
    snprintf(path, path_size, "%s/%s", o->out_dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        printf("note: can't write %s: %s\n", path, strerror(errno));
    return f;
}

/* Without a driver or a device the benchmark has nothing to measure: it says so and exits
 * 77 (skipped); any other failure to reach the GPU exits 1 (tests/gpu_presence.h). */
static inline void bench_require_gpu(const char *name) { gpu_presence_require(name); }

/* "NVIDIA H100 80GB HBM3, cc 9.0, 132 SMs, driver CUDA 13.0" */
static inline void bench_describe_device(int device, sc_device_props *props, char *buf,
                                         size_t size)
{
    SC_TRY(sc_device_info(device, props));
    int v = 0;
    SC_TRY(sc_driver_version(&v));
    snprintf(buf, size, "%s, cc %d.%d, %d SMs, driver CUDA %d.%d", props->name,
             props->cc_major, props->cc_minor, props->sm_count, v / 1000, (v % 1000) / 10);
}

/* ---- clocks, statistics, data ------------------------------------------------------------ */

static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (v is reordered). 0 for n == 0. */
static inline double bench_median(double *v, size_t n)
{
    if (n == 0)
        return 0.0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* xorshift64*: fast, seedable, never zero. */
/* The multi-GPU benchmarks' --gpus N (2 .. max): taken out of argv (argc shrinks; the rest
 * stays for bench_parse_args). 0 when not given; a bad value ends the program (exit 2). */
static inline int bench_take_gpus(int *argc, char **argv, int max)
{
    int want = 0, kept = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--gpus") == 0 && i + 1 < *argc) {
            char *end = NULL;
            const long v = strtol(argv[++i], &end, 10);
            if (!end || *end || v < 2 || v > max) {
                fprintf(stderr, "%s: --gpus '%s': a number of GPUs from 2 to %d\n", argv[0],
                        argv[i], max);
                exit(2);
            }
            want = (int)v;
        } else {
            argv[kept++] = argv[i];
        }
    }
    argv[kept] = NULL;
    *argc = kept;
    return want;
}

/* The median over `samples` samples of the slowest of n ranks' times (ms[rank][sample]):
 * what a collective step of n GPUs takes. */
static inline double bench_median_of_slowest(const double (*ms)[64], int n, int samples)
{
    double v[64];
    for (int i = 0; i < samples && i < 64; i++) {
        v[i] = 0;
        for (int r = 0; r < n; r++)
            v[i] = ms[r][i] > v[i] ? ms[r][i] : v[i];
    }
    return bench_median(v, (size_t)(samples < 64 ? samples : 64));
}

static inline uint64_t bench_rand(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* Fill p[0..bytes) with random bytes (so nothing timed moves zeros). */
static inline void bench_fill_random(void *p, size_t bytes, uint64_t seed)
{
    uint64_t st = seed ? seed : 0x9E3779B97F4A7C15ULL;
    unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t r = bench_rand(&st);
        memcpy(b + i, &r, 8);
    }
    if (i < bytes) {
        uint64_t r = bench_rand(&st);
        memcpy(b + i, &r, bytes - i);
    }
}

/* "1 KiB", "256 MiB", "1 GiB", "1000 B" */
static inline const char *bench_size_name(uint64_t bytes, char *buf, size_t size)
{
    if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0)
        snprintf(buf, size, "%" PRIu64 " GiB", bytes >> 30);
    else if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0)
        snprintf(buf, size, "%" PRIu64 " MiB", bytes >> 20);
    else if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0)
        snprintf(buf, size, "%" PRIu64 " KiB", bytes >> 10);
    else
        snprintf(buf, size, "%" PRIu64 " B", bytes);
    return buf;
}

/* ---- peers: Python scripts in bench/peers that measure the same thing with PyTorch -----
 *
 * A peer prints lines "peer <kind> <bytes> <value>" (the value's unit is the benchmark's:
 * GB/s or ns/op), "# ..." lines of information, and anything else (warnings, the reason it
 * failed). It runs before the C measurements, alone on the GPU. */

#define BENCH_PEER_MAX_ROWS 256

typedef struct bench_peer_row {
    char kind[40];
    uint64_t bytes;
    double value;
} bench_peer_row;

typedef struct bench_peer {
    bool ok;            /* at least one row came back */
    char info[256];     /* the first "# ..." line (versions, device) */
    char reason[256];   /* why it is unavailable or incomplete (last other line, exit code) */
    size_t n;
    bench_peer_row rows[BENCH_PEER_MAX_ROWS];
} bench_peer;

/* Append s to buf as one single-quoted shell word. */
static inline void bench_shell_quote(char *buf, size_t size, const char *s)
{
    size_t n = strlen(buf);
    if (n + 1 < size)
        buf[n++] = '\'';
    for (; *s && n + 5 < size; s++) {
        if (*s == '\'') {
            memcpy(buf + n, "'\\''", 4);
            n += 4;
        } else {
            buf[n++] = *s;
        }
    }
    if (n + 1 < size)
        buf[n++] = '\'';
    buf[n] = '\0';
}

static inline void bench_chomp(char *s)
{
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
        s[--n] = '\0';
}

/* Start bench/peers/<script> with the given (already shell-safe) arguments: the pipe of
 * its output (stdout and stderr together), or NULL with the reason in reason (disabled by
 * SAFECUDA_BENCH_NO_PEER, the script missing, popen failing). The script is looked up in
 * $SAFECUDA_BENCH_PEERS or SAFECUDA_SOURCE_DIR/bench/peers, run by $SAFECUDA_BENCH_PYTHON
 * or python3 from PATH, under `timeout timeout_s` when that exists. */
static inline FILE *bench_peer_open(const char *script, const char *args, int timeout_s,
                                    char *reason, size_t reason_size)
{
    const char *off = getenv("SAFECUDA_BENCH_NO_PEER");
    if (off && *off && strcmp(off, "0") != 0) {
        snprintf(reason, reason_size, "disabled by SAFECUDA_BENCH_NO_PEER");
        return NULL;
    }
    const char *dir = getenv("SAFECUDA_BENCH_PEERS");
    char path[1024];
    if (dir && *dir)
        snprintf(path, sizeof path, "%s/%s", dir, script);
    else
        snprintf(path, sizeof path, "%s/bench/peers/%s", SAFECUDA_SOURCE_DIR, script);
    if (access(path, R_OK) != 0) {
        snprintf(reason, reason_size, "%.200s: %.40s", path, strerror(errno));
        return NULL;
    }
    const char *py = getenv("SAFECUDA_BENCH_PYTHON");
    if (!py || !*py)
        py = "python3";

    char run[4096] = "";
    bench_shell_quote(run, sizeof run, py);
    size_t n = strlen(run);
    snprintf(run + n, sizeof run - n, " ");
    bench_shell_quote(run, sizeof run, path);
    n = strlen(run);
    snprintf(run + n, sizeof run - n, " %s", args ? args : "");

    char cmd[2 * 4096 + 256];
    snprintf(cmd, sizeof cmd,
             "if command -v timeout >/dev/null 2>&1; then timeout %d %s; else %s; fi 2>&1",
             timeout_s, run, run);
    fflush(stdout);
    FILE *f = popen(cmd, "r");
    if (!f)
        snprintf(reason, reason_size, "popen failed: %.200s", strerror(errno));
    return f;
}

/* Close a peer started by bench_peer_open. When it did not exit 0, reason becomes
 * "exit N[ (timed out)][: <reason so far>]". */
static inline void bench_peer_close(FILE *f, char *reason, size_t reason_size)
{
    int st = pclose(f);
    if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return;
    char last[256];
    snprintf(last, sizeof last, "%s", reason);
    int code = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
    snprintf(reason, reason_size, "exit %d%s%s%.200s", code, code == 124 ? " (timed out)" : "",
             last[0] ? ": " : "", last);
}

/* Run bench/peers/<script> (bench_peer_open) and collect its "peer <kind> <bytes> <value>"
 * rows. Never fails the benchmark: p->ok says whether anything came back. */
static inline void bench_peer_run(const char *script, const char *args, int timeout_s,
                                  bench_peer *p)
{
    memset(p, 0, sizeof *p);
    FILE *f = bench_peer_open(script, args, timeout_s, p->reason, sizeof p->reason);
    if (!f)
        return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        bench_chomp(line);
        bench_peer_row r;
        char kind[40];
        if (sscanf(line, "peer %39s %" SCNu64 " %lf", kind, &r.bytes, &r.value) == 3) {
            if (p->n < BENCH_PEER_MAX_ROWS) {
                snprintf(r.kind, sizeof r.kind, "%s", kind);
                p->rows[p->n++] = r;
            }
        } else if (line[0] == '#') {
            if (!p->info[0])
                snprintf(p->info, sizeof p->info, "%.250s", line + (line[1] == ' ' ? 2 : 1));
        } else if (line[0]) {
            snprintf(p->reason, sizeof p->reason, "%.250s", line);
        }
    }
    p->ok = p->n > 0;
    bench_peer_close(f, p->reason, sizeof p->reason);
}

/* The peer's value for (kind, bytes); false when it has none. */
static inline bool bench_peer_find(const bench_peer *p, const char *kind, uint64_t bytes,
                                   double *value)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->rows[i].bytes == bytes && strcmp(p->rows[i].kind, kind) == 0) {
            *value = p->rows[i].value;
            return true;
        }
    return false;
}

/* One line on the peer's state: "peer: torch 2.11 ..." or "peer: unavailable (...)". */
static inline void bench_peer_print(const bench_peer *p, const char *what)
{
    if (p->ok)
        printf("peer: %s: %s (%zu results)%s%s\n", what, p->info[0] ? p->info : "ok", p->n,
               p->reason[0] ? "; note: " : "", p->reason);
    else
        printf("peer: unavailable (%s)\n", p->reason[0] ? p->reason : "no output");
}

#endif
