/* sc_kernels_precompile on a GPU: the built-in kernels precompiled the way a machine
 * without a GPU does it (no context, the device's architecture named: what `safecuda
 * precompile --arch sm_90a` runs), then a context on the device loads every built-in
 * kernel it uses (an MoE layer of the device's backend, SM90 on 9.0, and the element-wise
 * kernels) with no NVRTC compile (nvrtcCompileProgram's calls counted) and the cache
 * folder untouched: the keys of the compile-only path are those the library looks up on
 * the device, cubins included. The cached element-wise kernel then runs: a vector add on
 * fresh random inputs into a poisoned output, checked against the CPU. */
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <sys/stat.h>

#include "../test.h"
#include "driver/driver.h"
#include "launch/builtin.h"
#include "safecuda/moe.h"

/* The folder's entries as "name:size:mtime", sorted by name. */
static int by_name(const void *a, const void *b) { return strcmp(a, b); }

static size_t snapshot(const char *dir, char names[][160], size_t cap)
{
    size_t n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    for (struct dirent *e; (e = readdir(d)) && n < cap;) {
        if (e->d_name[0] == '.')
            continue;
        char p[600];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &st) != 0)
            continue;
        snprintf(names[n++], 160, "%.64s:%lld:%lld.%09ld", e->d_name, (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
    }
    closedir(d);
    qsort(names, n, 160, by_name);
    return n;
}

static sc_buffer zeros(sc_context ctx, sc_dtype dtype, uint64_t count)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                    .zero = true},
                             &b) == SC_OK);
    return b;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

int main(void)
{
    gpu_require();
    char cache[] = "/tmp/safecuda-test-precompile-XXXXXX";
    REQUIRE(mkdtemp(cache) != NULL);
    REQUIRE(setenv("SAFECUDA_CACHE_DIR", cache, 1) == 0);
    unsetenv("SAFECUDA_CACHE");
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("test_gpu_precompile: skipped: %s\n", sc_last_error());
        return TEST_SKIP;
    }
    rng ^= (uint64_t)time(NULL) * 0x2545f4914f6cdd1dull;
    sc_device_props props;
    REQUIRE(sc_device_info(0, &props) == SC_OK);
    const int arch = props.cc_major * 10 + props.cc_minor;

    /* Precompile as a machine without a GPU does: no context, the architecture named. */
    REQUIRE(sci_fault_arm("nvrtcCompileProgram", 0, 0));
    sc_precompile_report r;
    sc_status s = sc_kernels_precompile(&(sc_precompile_desc){.arch = arch}, &r);
    if (s != SC_OK)
        fprintf(stderr, "sc_kernels_precompile: %s\n", sc_last_error());
    REQUIRE(s == SC_OK);
    printf("precompiled for sm_%d (%s): %zu files, %zu compiled, %zu skipped, %" PRIu64
           " bytes in %.1f s (NVRTC %d.%d)\n",
           arch, props.name, r.files, r.compiled, r.skipped, r.bytes, r.ms / 1e3, major, minor);
    CHECK(r.arch == arch && strcmp(r.cache_dir, cache) == 0);
    CHECK(r.compiled + r.skipped == r.files && r.cache_hits == 0 && r.files >= 3);
    CHECK(r.skipped == (arch == 90 ? 0u : 1u));
    CHECK(sci_fault_calls() == r.compiled);
    char before[32][160], after[32][160];
    const size_t n_before = snapshot(cache, before, 32);
    CHECK(n_before == r.compiled);

    /* First use on the device: all cache hits. */
    REQUIRE(sci_fault_arm("nvrtcCompileProgram", 0, 0));
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    enum { E = 16, K = 4, H = 256, I = 128 };
    sc_buffer router = zeros(ctx, SC_BF16, E * H), w13 = zeros(ctx, SC_BF16, E * 2 * I * H);
    sc_buffer w2 = zeros(ctx, SC_BF16, E * H * I);
    sc_moe layer;
    CHECK_OK(sc_moe_create(ctx,
                           &(sc_moe_desc){.experts = E, .top_k = K, .hidden = H,
                                          .intermediate = I, .router = router, .w13 = w13,
                                          .w2 = w2,
                                          .backend = arch == 90 ? SC_MOE_BACKEND_SM90
                                                                : SC_MOE_BACKEND_MMA},
                           &layer));
    sci_context *c = NULL;
    REQUIRE(sci_context_acquire(ctx, "test", &c) == SC_OK);
    sc_kernel add = {0};
    CHECK_OK(sci_builtin_kernel(c, "util/elementwise.cu", "sc_vector_add_f32", "test", &add));
    sci_context_release(c);
    const uint64_t compiles = sci_fault_calls();
    sci_fault_disarm();
    CHECK(compiles == 0);
    if (compiles)
        fprintf(stderr, "loading the built-in kernels after precompile compiled %" PRIu64
                        " times: the cache keys differ\n",
                compiles);
    const size_t n_after = snapshot(cache, after, 32);
    CHECK(n_after == n_before);
    for (size_t i = 0; i < n_before && i < n_after; i++)
        if (strcmp(before[i], after[i]) != 0) {
            fprintf(stderr, "cache entry changed: %s -> %s\n", before[i], after[i]);
            test_failures++;
        }

    /* The cached image runs: c = a + b, fresh random inputs, c poisoned first. */
    enum { N = 1 << 20 };
    float *ha = malloc(N * sizeof *ha), *hb = malloc(N * sizeof *hb), *hc = malloc(N * sizeof *hc);
    REQUIRE(ha && hb && hc);
    for (size_t i = 0; i < N; i++) {
        ha[i] = uniform() * 100.0f;
        hb[i] = uniform();
    }
    sc_buffer a = zeros(ctx, SC_F32, N), b = zeros(ctx, SC_F32, N), out = zeros(ctx, SC_F32, N);
    const float poison = NAN;
    CHECK_OK(sc_fill(SC_DEFAULT_STREAM, sc_view_of(out), &poison));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(a), ha, N * sizeof *ha));
    CHECK_OK(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(b), hb, N * sizeof *hb));
    const sc_launch_desc grid = {.grid = {.x = 264}, .block = {.x = 256}};
    CHECK_OK(SC_LAUNCH(SC_DEFAULT_STREAM, add, &grid, sc_arg_in(sc_view_of(a)),
                       sc_arg_in(sc_view_of(b)),
                       sc_arg_out(sc_view_of(out)), sc_arg_u64(N)));
    CHECK_OK(sc_copy_to_host(SC_DEFAULT_STREAM, hc, N * sizeof *hc, sc_view_of(out)));
    size_t bad = 0;
    for (size_t i = 0; i < N; i++) {
        const double want = (double)ha[i] + (double)hb[i];
        /* One float rounding of the exact sum. */
        if (!(fabs((double)hc[i] - want) <= fabs(want) * 6e-8 + 1e-30)) {
            if (bad++ < 5)
                fprintf(stderr, "c[%zu] = %.9g, want %.9g\n", i, hc[i], want);
        }
    }
    CHECK(bad == 0);
    free(ha);
    free(hb);
    free(hc);

    CHECK_OK(sc_moe_destroy(layer));
    CHECK_OK(sc_buffer_destroy(a));
    CHECK_OK(sc_buffer_destroy(b));
    CHECK_OK(sc_buffer_destroy(out));
    CHECK_OK(sc_buffer_destroy(router));
    CHECK_OK(sc_buffer_destroy(w13));
    CHECK_OK(sc_buffer_destroy(w2));
    CHECK_OK(sc_context_destroy(ctx));
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", cache);
    return test_result("test_gpu_precompile");
}
