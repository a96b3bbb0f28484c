/* The MoE torch peer's reader: see peer.h. */
#include "peer.h"

#include <math.h> /* NAN: a macro only, no libm needed */

#include "bench_common.h"

void bench_moe_peer_run(const char *script, const char *args, int limit_s,
                        bench_moe_peer_point_fn point, void *user, bench_moe_peer *p)
{
    memset(p, 0, sizeof *p);
    p->matmul_tflops = NAN;
    p->f8_tflops = p->f8_fast_tflops = NAN;
    p->copy_tbs = NAN;
    const uint64_t t0 = bench_now_ns();
    FILE *f = bench_peer_open(script, args, limit_s, p->reason, sizeof p->reason);
    if (!f)
        return;
    printf("peer: running %s (up to %d s)\n", script, limit_s);
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        bench_chomp(line);
        char w1[64], w2[64], w3[64], w4[64];
        int got = sscanf(line, "peer %63s %63s %63s %63s", w1, w2, w3, w4);
        if (got == 2) {
            double v = strtod(w2, NULL);
            if (strcmp(w1, "matmul_tflops") == 0)
                p->matmul_tflops = v;
            else if (strcmp(w1, "matmul_f8_tflops") == 0)
                p->f8_tflops = v;
            else if (strcmp(w1, "matmul_f8_fast_tflops") == 0)
                p->f8_fast_tflops = v;
            else if (strcmp(w1, "copy_tbs") == 0)
                p->copy_tbs = v;
            p->rows++;
        } else if (got == 4) {
            if (point(user, w1, strtoull(w2, NULL, 10), strtod(w3, NULL), strtod(w4, NULL)))
                p->rows++;
        } else if (line[0] == '#') {
            const char *text = line + (line[1] == ' ' ? 2 : 1);
            if (!p->info[0])
                snprintf(p->info, sizeof p->info, "%.250s", text);
            if (!p->f8_info[0] && strncmp(text, "fp8", 3) == 0)
                snprintf(p->f8_info, sizeof p->f8_info, "%.250s", text);
            printf("  peer %s\n", line);
        } else if (line[0]) {
            snprintf(p->reason, sizeof p->reason, "%.250s", line);
            printf("  peer: %.300s\n", line);
        }
        fflush(stdout);
    }
    p->ok = p->rows > 0;
    bench_peer_close(f, p->reason, sizeof p->reason);
    printf("peer: %s in %.1f s: %zu results%s%s\n", p->ok ? "done" : "unavailable",
           (double)(bench_now_ns() - t0) * 1e-9, p->rows, p->reason[0] ? "; " : "",
           p->reason);
}
