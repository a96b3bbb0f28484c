/* The MoE torch peer's reader, shared by bench_moe and bench_graph: both run
 * bench/peers/torch_moe.py and read the same lines back. */
#ifndef SAFECUDA_BENCH_PEER_H
#define SAFECUDA_BENCH_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bench_moe_peer {
    bool ok;               /* at least one row came back */
    double matmul_tflops;  /* bf16 8192^3 matmul; NAN when missing */
    double f8_tflops;      /* --fp8: e4m3 8192^3 _scaled_mm, use_fast_accum=False; NAN ... */
    double f8_fast_tflops; /* ... and with use_fast_accum=True */
    double copy_tbs;       /* device copy rate, TB/s; NAN when missing */
    char info[256];        /* the first "# ..." line */
    char f8_info[256];     /* the first "# fp8..." line (how its fp8 layers scale) */
    char reason[256];      /* why it is unavailable or incomplete */
    size_t rows;
} bench_moe_peer;

/* One "peer CONFIG T LOOP_MS GROUPED_MS" line: store it and return true when (config, T) is
 * one of the caller's points (counted as a row), false to ignore it. */
typedef bool (*bench_moe_peer_point_fn)(void *user, const char *config, uint64_t tokens,
                                        double loop_ms, double grouped_ms);

/* Run the peer script with args (already shell-quoted) under `timeout limit_s`, echo its
 * "# ..." lines ("  peer # ...") and other lines ("  peer: ...") as they come, and collect:
 * "peer KEY VALUE" (matmul_tflops, matmul_f8_tflops, matmul_f8_fast_tflops, copy_tbs; any
 * other key counts as a row, unstored), "peer CONFIG T LOOP_MS GROUPED_MS" (through point).
 * Ends with "peer: done|unavailable in S s: N results[; reason]". Never fails the
 * benchmark: p->ok says whether anything came back. */
void bench_moe_peer_run(const char *script, const char *args, int limit_s,
                        bench_moe_peer_point_fn point, void *user, bench_moe_peer *p);

#endif
