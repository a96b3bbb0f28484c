/* sc_kernels_precompile against the test device (compute capability 9.0).
 *
 * The proof that a precompiled cache is what the library looks up: the built-in kernels are
 * precompiled through the compile-only path (no context handed to NVRTC's program, the
 * architecture given), then a context loads every one of them the way the library does on
 * first use (an MoE layer on the SM90 backend: moe/moe.cu for sm_90 and moe/moe_sm90a.cu
 * for sm_90a; the element-wise kernels through the internal loader) while
 * nvrtcCompileProgram's calls are counted: none may happen, and the cache folder must be
 * left as it was (a miss would have written an entry). The same counter sees the
 * precompile's own compiles, so it is known to count. The test device loads PTX only, so
 * the images here are PTX, as the library compiles them there; on a GPU the same path
 * gives cubins (tests/gpu/test_gpu_precompile.c checks that on the device).
 *
 * Also: the refusals (desc fields, the cache folder off, missing, not creatable, not
 * writable, an entry that can't be stored, a stale context, NVRTC missing, a compile error
 * naming the file and quoting NVRTC's log) and the report and per-file callback.
 * Exits 77 (skipped) when NVRTC can't be loaded. */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../test.h"
#include "driver/driver.h"
#include "td_control.h"
#include "launch/builtin.h"
#include "safecuda/moe.h"

#define fn "sc_kernels_precompile" /* the function the messages name */

static char root[] = "/tmp/safecuda-test-precompile-XXXXXX";

static void path_of(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", root, name);
}

/* ---- a folder's entries: names, sizes and modification times -------------------------- */

typedef struct listing {
    size_t n;
    char names[32][64];
    long long sizes[32], mtimes[32], inodes[32];
} listing;

static int by_name(const void *a, const void *b) { return strcmp(a, b); }

static listing list_dir(const char *dir)
{
    listing l;
    memset(&l, 0, sizeof l);
    DIR *d = opendir(dir);
    if (!d)
        return l;
    for (struct dirent *e; (e = readdir(d)) && l.n < 32;)
        if (e->d_name[0] != '.')
            snprintf(l.names[l.n++], sizeof l.names[0], "%.63s", e->d_name);
    closedir(d);
    qsort(l.names, l.n, sizeof l.names[0], by_name);
    for (size_t i = 0; i < l.n; i++) {
        char p[512];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, l.names[i]);
        if (stat(p, &st) == 0) {
            l.sizes[i] = (long long)st.st_size;
            l.mtimes[i] = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
            l.inodes[i] = (long long)st.st_ino;
        }
    }
    return l;
}

static bool same_listing(const listing *a, const listing *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->names[i], b->names[i]) != 0 || a->sizes[i] != b->sizes[i] ||
            a->mtimes[i] != b->mtimes[i] || a->inodes[i] != b->inodes[i])
            return false;
    return true;
}

/* ---- the per-file callback ---------------------------------------------------------------- */

typedef struct seen {
    size_t n;
    sc_precompile_file files[16];
    char names[16][64];
    /* Run after the first file: rename the folder away and put a file in its place, so
     * the next entry can't be stored (works as root too, where permissions don't bind). */
    const char *sabotage_dir;
} seen;

static void on_file(const sc_precompile_file *f, void *user)
{
    seen *s = user;
    if (s->n < 16) {
        s->files[s->n] = *f;
        snprintf(s->names[s->n], sizeof s->names[0], "%s", f->name ? f->name : "(null)");
        s->files[s->n].name = s->names[s->n];
        s->n++;
    }
    if (s->sabotage_dir && s->n == 1) {
        char moved[512];
        snprintf(moved, sizeof moved, "%s.moved", s->sabotage_dir);
        REQUIRE(rename(s->sabotage_dir, moved) == 0);
        FILE *file = fopen(s->sabotage_dir, "w");
        REQUIRE(file != NULL);
        fclose(file);
    }
}

/* ---- NVRTC missing (a child process: NVRTC is loaded once per process) ------------------ */

static void test_no_nvrtc(void)
{
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        setenv("SAFECUDA_NVRTC", "/nonexistent/dir/libnvrtc.so", 1);
        char dir[512];
        path_of(dir, sizeof dir, "no-nvrtc");
        sc_precompile_report r;
        CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 90, .cache_dir = dir}, &r),
                   SC_ERR_NO_COMPILER, fn);
        CHECK_MSG("cannot load NVRTC from SAFECUDA_NVRTC=/nonexistent/dir/libnvrtc.so");
        CHECK(r.files == 0 && r.compiled == 0 && r.failed_file == NULL);
        struct stat st;
        CHECK(stat(dir, &st) != 0); /* nothing made before NVRTC was there */
        _exit(test_failures ? 1 : 0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- refusals of the desc and of the folder ------------------------------------------------ */

static void test_refusals(sc_context ctx)
{
    sc_precompile_report r;
    memset(&r, 0x5a, sizeof r);
    CHECK_FAIL(sc_kernels_precompile(NULL, &r), SC_ERR_INVALID_ARGUMENT, fn);
    CHECK_MSG("argument 'desc' is NULL");
    CHECK(r.files == 0 && r.arch == 0 && r.failed_file == NULL); /* zeroed on refusal too */
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){0}, &r), SC_ERR_INVALID_ARGUMENT, fn);
    CHECK_MSG("desc->arch is 0 and desc->ctx is the zero handle");
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 45}, NULL),
               SC_ERR_INVALID_ARGUMENT, fn);
    CHECK_MSG("desc->arch 45 is not an architecture");
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 1001}, NULL),
               SC_ERR_INVALID_ARGUMENT, fn);
    CHECK_MSG("desc->arch 1001");
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 90, .cache_dir = ""}, NULL),
               SC_ERR_INVALID_ARGUMENT, fn);
    CHECK_MSG("desc->cache_dir is \"\"");
    char longdir[402];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = '\0';
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 90, .cache_dir = longdir},
                                     NULL),
               SC_ERR_INVALID_ARGUMENT, fn);
    CHECK_MSG("desc->cache_dir is 401 characters long; at most 400");

    /* No folder named and the cache off, or no folder to be had. */
    const char *saved_dir = getenv("SAFECUDA_CACHE_DIR");
    char keep[512];
    snprintf(keep, sizeof keep, "%s", saved_dir ? saved_dir : "");
    setenv("SAFECUDA_CACHE", "0", 1);
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 90}, NULL),
               SC_ERR_INVALID_ARGUMENT, fn);
    CHECK_MSG("desc->cache_dir is NULL and the disk cache is off (SAFECUDA_CACHE=0)");
    unsetenv("SAFECUDA_CACHE");
    const char *home = getenv("HOME"), *xdg = getenv("XDG_CACHE_HOME");
    char keep_home[512], keep_xdg[512];
    snprintf(keep_home, sizeof keep_home, "%s", home ? home : "");
    snprintf(keep_xdg, sizeof keep_xdg, "%s", xdg ? xdg : "");
    unsetenv("SAFECUDA_CACHE_DIR");
    unsetenv("HOME");
    unsetenv("XDG_CACHE_HOME");
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 90}, NULL),
               SC_ERR_INVALID_ARGUMENT, fn);
    CHECK_MSG("there is no cache folder (none of SAFECUDA_CACHE_DIR, XDG_CACHE_HOME and HOME");
    if (home)
        setenv("HOME", keep_home, 1);
    if (xdg)
        setenv("XDG_CACHE_HOME", keep_xdg, 1);
    setenv("SAFECUDA_CACHE_DIR", keep, 1);

    /* A folder that can't be made: under a file, or a file itself. */
    char file[512], under[600];
    path_of(file, sizeof file, "a-file");
    FILE *f = fopen(file, "w");
    REQUIRE(f != NULL);
    fclose(f);
    snprintf(under, sizeof under, "%s/cache", file);
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 90, .cache_dir = under}, &r),
               SC_ERR_IO, fn);
    CHECK_MSG("cannot create the cache folder '");
    CHECK_MSG("a-file/cache': Not a directory");
    CHECK(r.compiled == 0 && r.files == 0);
    CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 90, .cache_dir = file}, NULL),
               SC_ERR_IO, fn);
    CHECK_MSG("a-file': Not a directory");
    /* A folder without write permission (root writes anyway: checked only for others). */
    if (geteuid() != 0) {
        char ro[512];
        path_of(ro, sizeof ro, "read-only");
        REQUIRE(mkdir(ro, 0555) == 0);
        CHECK_FAIL(sc_kernels_precompile(&(sc_precompile_desc){.arch = 90, .cache_dir = ro},
                                         NULL),
                   SC_ERR_IO, fn);
        CHECK_MSG("read-only' is not writable: Permission denied");
        chmod(ro, 0755);
    }

    /* A stale context. */
    sc_context gone;
    REQUIRE(sc_context_create(NULL, &gone) == SC_OK);
    REQUIRE(sc_context_destroy(gone) == SC_OK);
    CHECK_STATUS(sc_kernels_precompile(&(sc_precompile_desc){.ctx = gone}, NULL),
                 SC_ERR_STALE_HANDLE);
    (void)ctx;
}

/* ---- small sources of the test's own: the compile error, the skip, a failed store -------- */

static const char header_src[] = "#define SCALE 3.0f\n";
static const char good_src[] = "#include \"t/scale.cuh\"\n"
                               "extern \"C\" __global__ void scale(float *x) { x[0] *= SCALE; }\n";
static const char bad_src[] = "#include \"t/scale.cuh\"\n"
                              "extern \"C\" __global__ void broken(float *x)\n"
                              "{ x[0] = undeclared_thing; }\n";
static const char sm90a_src[] = "extern \"C\" __global__ void only90a(float *x) { x[0] = 1; }\n";

static void test_own_sources(void)
{
    const sci_builtin_source with_error[] = {
        {"t/a.cu", good_src}, {"t/b.cu", bad_src}, {"t/c_sm90a.cu", sm90a_src},
        {"t/scale.cuh", header_src}};
    char dir[512];
    path_of(dir, sizeof dir, "own");
    seen s = {0};
    sc_precompile_report r;
    sc_clear_error();
    CHECK_STATUS(sci_precompile(with_error, 4,
                                &(sc_precompile_desc){.arch = 90, .cache_dir = dir,
                                                      .on_file = on_file, .user = &s},
                                &r),
                 SC_ERR_COMPILE);
    CHECK_MSG("sc_kernels_precompile: 't/b.cu' failed to compile for sm_90: t/b.cu(3): error: "
              "identifier \"undeclared_thing\" is undefined");
    CHECK_MSG("--- NVRTC log (");
    CHECK(r.failed_file != NULL && strcmp(r.failed_file, "t/b.cu") == 0);
    CHECK(r.files == 2 && r.compiled == 1 && r.cache_hits == 0 && r.skipped == 0);
    CHECK(r.arch == 90 && !r.is_ptx && strcmp(r.cache_dir, dir) == 0);
    CHECK(s.n == 1 && strcmp(s.names[0], "t/a.cu") == 0); /* the failed file: no call */
    listing l = list_dir(dir);
    CHECK(l.n == 1); /* t/a.cu's entry, stored before the error */

    /* sm_80: the *_sm90a.cu file is skipped (and so never compiled), t/a.cu compiled. */
    const sci_builtin_source fine[] = {
        {"t/a.cu", good_src}, {"t/c_sm90a.cu", sm90a_src}, {"t/scale.cuh", header_src}};
    memset(&s, 0, sizeof s);
    CHECK_OK(sci_precompile(fine, 3,
                            &(sc_precompile_desc){.arch = 80, .cache_dir = dir,
                                                  .on_file = on_file, .user = &s},
                            &r));
    CHECK(r.files == 2 && r.compiled == 1 && r.cache_hits == 0 && r.skipped == 1);
    CHECK(r.failed_file == NULL && r.bytes > 0 && r.arch == 80);
    CHECK(s.n == 2);
    CHECK(strcmp(s.names[0], "t/a.cu") == 0 && !s.files[0].skipped && !s.files[0].from_cache &&
          s.files[0].arch == 80 && !s.files[0].arch_specific && !s.files[0].is_ptx &&
          s.files[0].image_bytes == r.bytes);
    CHECK(strcmp(s.names[1], "t/c_sm90a.cu") == 0 && s.files[1].skipped &&
          s.files[1].arch == 80 && s.files[1].image_bytes == 0);
    /* sm_90: the *_sm90a.cu file built for sm_90a; t/a.cu for sm_90 (new), twice. */
    for (int round = 0; round < 2; round++) {
        memset(&s, 0, sizeof s);
        CHECK_OK(sci_precompile(fine, 3,
                                &(sc_precompile_desc){.arch = 90, .cache_dir = dir,
                                                      .on_file = on_file, .user = &s},
                                &r));
        CHECK(r.files == 2 && r.skipped == 0);
        CHECK(round == 0 ? r.compiled == 1 && r.cache_hits == 1 /* a.cu from the error run */
                         : r.compiled == 0 && r.cache_hits == 2);
        CHECK(s.n == 2 && s.files[1].arch_specific && s.files[1].arch == 90 &&
              !s.files[0].arch_specific);
    }
    l = list_dir(dir);
    CHECK(l.n == 3); /* a.cu for sm_80 and sm_90, c_sm90a.cu for sm_90a */

    /* An entry that can't be stored: the folder replaced by a file after the first file. */
    char gone[512];
    path_of(gone, sizeof gone, "store-fails");
    const sci_builtin_source two[] = {{"t/a.cu", good_src}, {"t/d.cu", sm90a_src},
                                      {"t/scale.cuh", header_src}};
    memset(&s, 0, sizeof s);
    s.sabotage_dir = gone;
    sc_clear_error();
    CHECK_STATUS(sci_precompile(two, 3,
                                &(sc_precompile_desc){.arch = 90, .cache_dir = gone,
                                                      .on_file = on_file, .user = &s},
                                &r),
                 SC_ERR_IO);
    CHECK_MSG("sc_kernels_precompile: 't/d.cu' compiled for sm_90, but its cache entry ");
    CHECK_MSG("store-fails/");
    CHECK_MSG("could not be written: Not a directory");
    CHECK(r.failed_file && strcmp(r.failed_file, "t/d.cu") == 0 && r.compiled == 1);
}

/* ---- the built-in kernels: precompiled, then loaded without a compile ------------------- */

static sc_buffer zeros(sc_context ctx, sc_dtype dtype, uint64_t count)
{
    sc_buffer b;
    REQUIRE(sc_buffer_create(ctx, &(sc_buffer_desc){.dtype = dtype, .count = count,
                                                    .zero = true},
                             &b) == SC_OK);
    return b;
}

/* Load every built-in kernel a 9.0 device uses, as the library does on first use. */
static void load_builtins(sc_context ctx)
{
    enum { E = 16, K = 4, H = 128, I = 64 };
    sc_buffer router = zeros(ctx, SC_BF16, E * H), w13 = zeros(ctx, SC_BF16, E * 2 * I * H);
    sc_buffer w2 = zeros(ctx, SC_BF16, E * H * I);
    sc_moe layer;
    CHECK_OK(sc_moe_create(ctx,
                           &(sc_moe_desc){.experts = E, .top_k = K, .hidden = H,
                                          .intermediate = I, .router = router, .w13 = w13,
                                          .w2 = w2, .backend = SC_MOE_BACKEND_SM90},
                           &layer));
    CHECK_OK(sc_moe_destroy(layer));
    sci_context *c = NULL;
    REQUIRE(sci_context_acquire(ctx, "test", &c) == SC_OK);
    sc_kernel k;
    CHECK_OK(sci_builtin_kernel(c, "util/elementwise.cu", "sc_vector_add_f32", "test", &k));
    sci_context_release(c);
    CHECK_OK(sc_buffer_destroy(router));
    CHECK_OK(sc_buffer_destroy(w13));
    CHECK_OK(sc_buffer_destroy(w2));
}

static void test_builtins(void)
{
    char dir[512];
    path_of(dir, sizeof dir, "library-cache");
    /* The library's own cache folder, where it will look on first use. */
    REQUIRE(setenv("SAFECUDA_CACHE_DIR", dir, 1) == 0);
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);

    /* Precompile: arch from the context's device (9.0), the images its driver loads
     * (PTX), into the library's folder (desc.cache_dir NULL). */
    REQUIRE(sci_fault_arm("nvrtcCompileProgram", 0, 0));
    seen s = {0};
    sc_precompile_report r;
    CHECK_OK(sc_kernels_precompile(&(sc_precompile_desc){.ctx = ctx, .on_file = on_file,
                                                         .user = &s},
                                   &r));
    const uint64_t compiles = sci_fault_calls();
    size_t cu = 0;
    for (size_t i = 0; i < sci_builtin_count; i++) {
        const char *n = sci_builtin_sources[i].name;
        cu += strlen(n) > 3 && strcmp(n + strlen(n) - 3, ".cu") == 0;
    }
    CHECK(cu >= 3);
    CHECK(r.arch == 90 && r.is_ptx && strcmp(r.cache_dir, dir) == 0);
    CHECK(r.files == cu && r.compiled == cu && r.cache_hits == 0 && r.skipped == 0);
    CHECK(compiles == cu); /* the counter sees every compile */
    CHECK(s.n == cu);
    bool saw_sm90a = false;
    uint64_t bytes = 0;
    for (size_t i = 0; i < s.n; i++) {
        const bool sm90a = strcmp(s.names[i], "moe/moe_sm90a.cu") == 0;
        saw_sm90a |= sm90a;
        CHECK(s.files[i].is_ptx && s.files[i].arch == 90 && s.files[i].arch_specific == sm90a);
        CHECK(!s.files[i].skipped && !s.files[i].from_cache && s.files[i].image_bytes > 0);
        bytes += s.files[i].image_bytes;
        if (i)
            CHECK(strcmp(s.names[i - 1], s.names[i]) < 0);
    }
    CHECK(saw_sm90a && bytes == r.bytes);
    const listing before = list_dir(dir);
    CHECK(before.n == cu);

    /* First use: every kernel a cache hit, no NVRTC compile, the folder untouched. */
    REQUIRE(sci_fault_arm("nvrtcCompileProgram", 0, 0));
    load_builtins(ctx);
    CHECK(sci_fault_calls() == 0);
    if (sci_fault_calls())
        fprintf(stderr, "loading the built-in kernels compiled %llu times after precompile\n",
                (unsigned long long)sci_fault_calls());
    listing after = list_dir(dir);
    CHECK(same_listing(&before, &after));

    /* Again: all hits. */
    memset(&s, 0, sizeof s);
    CHECK_OK(sc_kernels_precompile(&(sc_precompile_desc){.ctx = ctx, .on_file = on_file,
                                                         .user = &s},
                                   &r));
    CHECK(r.compiled == 0 && r.cache_hits == cu && r.bytes == bytes);
    CHECK(sci_fault_calls() == 0);
    for (size_t i = 0; i < s.n; i++)
        CHECK(s.files[i].from_cache);
    sci_fault_disarm();
    after = list_dir(dir);
    CHECK(same_listing(&before, &after));
    CHECK_OK(sc_context_destroy(ctx));
}

int main(void)
{
    REQUIRE(mkdtemp(root) != NULL);
    test_no_nvrtc();
    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("test_td_precompile: skipped: %s\n", sc_last_error());
        return 77;
    }
    /* The suite turns the cache off for the fake tests: on here, in a folder of our own. */
    unsetenv("SAFECUDA_CACHE");
    char dir[512];
    path_of(dir, sizeof dir, "default");
    REQUIRE(setenv("SAFECUDA_CACHE_DIR", dir, 1) == 0);
    fake_attach();
    sc_context ctx;
    REQUIRE(sc_context_create(NULL, &ctx) == SC_OK);
    test_refusals(ctx);
    CHECK_OK(sc_context_destroy(ctx));
    test_own_sources();
    test_builtins();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return test_result("test_td_precompile");
}
