/* The disk cache's folder as the library sees it (sc_cache_info), and an unusable folder
 * (SAFECUDA_CACHE_DIR naming a file, a folder under a file, a place that can't be made):
 * the cache is off, and the library says so once through the log callback -- not silently
 * recompiling on every run. SAFECUDA_CACHE=0 turns it off without a warning. */
#include <unistd.h>

#include "../test.h"

static char dir[] = "/tmp/safecuda-test-cache-dir-XXXXXX";
static int warnings;
static char last[4096];

static void capture(sc_log_level level, const char *text, void *user)
{
    (void)user;
    if (level == SC_LOG_WARN && strstr(text, "disk cache")) {
        warnings++;
        snprintf(last, sizeof last, "%s", text);
    }
}

static sc_cache_props info_for(const char *cache_dir)
{
    if (cache_dir)
        setenv("SAFECUDA_CACHE_DIR", cache_dir, 1);
    else
        unsetenv("SAFECUDA_CACHE_DIR");
    sc_cache_props p;
    memset(&p, 0x5a, sizeof p);
    CHECK_OK(sc_cache_info(&p));
    return p;
}

/* Compile a small program twice with the cache as configured now; its cache entry path. */
static void compile_twice(char *cache_path, size_t size)
{
    static const char *const src = "extern \"C\" __global__ void k(float *x) { x[0] = 2; }";
    for (int i = 0; i < 2; i++) {
        sc_program p;
        CHECK_OK(sc_program_create((sc_context){0},
                                   &(sc_program_desc){.source = src, .arch = 80}, &p));
        sc_program_props props;
        CHECK_OK(sc_program_info(p, &props));
        snprintf(cache_path, size, "%s", props.cache_path);
        CHECK_OK(sc_program_destroy(p));
    }
}

int main(void)
{
    REQUIRE(mkdtemp(dir) != NULL);
    unsetenv("SAFECUDA_CACHE");
    char file[256], under_file[300], good[300], xdg[300], want[600];
    snprintf(file, sizeof file, "%s/a-file", dir);
    snprintf(under_file, sizeof under_file, "%s/kc", file);
    snprintf(good, sizeof good, "%s/kc", dir);
    snprintf(xdg, sizeof xdg, "%s/xdg", dir);
    FILE *f = fopen(file, "w");
    REQUIRE(f && fputs("not a folder\n", f) >= 0 && fclose(f) == 0);

    CHECK_FAIL(sc_cache_info(NULL), SC_ERR_INVALID_ARGUMENT, "sc_cache_info");

    /* A usable folder: on, made as a compile would make it. */
    sc_cache_props p = info_for(good);
    CHECK(p.on && strcmp(p.dir, good) == 0 && p.problem[0] == '\0');
    CHECK(access(good, W_OK) == 0);
    /* Unusable folders: off, the folder and why. */
    const char *paths[] = {file, under_file, "/proc/self/safecuda-cache"};
    for (size_t i = 0; i < 3; i++) {
        p = info_for(paths[i]);
        CHECK(!p.on && strcmp(p.dir, paths[i]) == 0);
        snprintf(want, sizeof want, "SAFECUDA_CACHE_DIR=%s can't be used: ", paths[i]);
        const char *why = i < 2 ? "Not a directory" : "";
        if (!strstr(p.problem, want) || !strstr(p.problem, why)) {
            fprintf(stderr, "%s: problem '%s' lacks '%s' or '%s'\n", paths[i], p.problem, want,
                    why);
            test_failures++;
        }
    }
    /* Off on purpose, and no folder configured at all. */
    setenv("SAFECUDA_CACHE", "0", 1);
    p = info_for(good);
    CHECK(!p.on && strstr(p.problem, "off: SAFECUDA_CACHE=0") != NULL);
    unsetenv("SAFECUDA_CACHE");
    const char *home = getenv("HOME");
    char saved_home[512] = "";
    if (home)
        snprintf(saved_home, sizeof saved_home, "%s", home);
    unsetenv("HOME");
    unsetenv("XDG_CACHE_HOME");
    p = info_for(NULL);
    CHECK(!p.on && p.dir[0] == '\0' &&
          strstr(p.problem, "no folder: none of SAFECUDA_CACHE_DIR, XDG_CACHE_HOME, HOME is "
                            "set") != NULL);
    setenv("XDG_CACHE_HOME", xdg, 1);
    p = info_for(NULL);
    snprintf(want, sizeof want, "%s/safecuda", xdg);
    CHECK(p.on && strcmp(p.dir, want) == 0);
    if (saved_home[0])
        setenv("HOME", saved_home, 1);

    int major = 0, minor = 0;
    if (sc_compiler_version(&major, &minor) != SC_OK) {
        printf("skipped the checks that compile: %s\n", sc_last_error());
    } else {
        /* Programs compiled with an unusable folder: no cache entry, and one warning for
         * the folder (not one per program), naming it, why, and SAFECUDA_CACHE=0. */
        sc_set_log_callback(capture, NULL);
        char path[600];
        info_for(under_file);
        compile_twice(path, sizeof path);
        CHECK(path[0] == '\0');
        CHECK(warnings == 1);
        snprintf(want, sizeof want, "the disk cache is off: SAFECUDA_CACHE_DIR=%s can't be used: ",
                 under_file);
        CHECK(strstr(last, want) != NULL);
        CHECK(strstr(last, "Not a directory") != NULL);
        CHECK(strstr(last, "every program is compiled again") != NULL);
        CHECK(strstr(last, "SAFECUDA_CACHE=0 turns the cache off") != NULL);
        compile_twice(path, sizeof path);
        CHECK(warnings == 1);
        /* Another unusable folder is said once too. */
        info_for(file);
        compile_twice(path, sizeof path);
        CHECK(warnings == 2);
        /* Off on purpose: no warning; a usable folder: entries there. */
        setenv("SAFECUDA_CACHE", "0", 1);
        compile_twice(path, sizeof path);
        CHECK(warnings == 2 && path[0] == '\0');
        unsetenv("SAFECUDA_CACHE");
        info_for(good);
        compile_twice(path, sizeof path);
        CHECK(warnings == 2 && strncmp(path, good, strlen(good)) == 0);
        sc_set_log_callback(NULL, NULL);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", dir);
    return test_result("test_cache_dir");
}
