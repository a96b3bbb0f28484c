/* Ahead-of-time compilation of the library's built-in kernels into the disk cache: every
 * built-in .cu file goes through sci_builtin_compile, the function the library loads them
 * with, so each entry's key is the one the library will look up on the device. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compile/cache.h"
#include "compile/program.h"
#include "core/library.h"
#include "driver/driver.h"
#include "launch/builtin.h"

/* A cache folder's path plus "/" and an entry's 36-character name must fit a program's
 * cache_path (512 bytes). */
#define MAX_DIR 400

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* Create dir if needed and make sure an entry can be written there. */
static sc_status prepare_dir(const char *dir, const char *fn)
{
    if (sci_cache_mkdir(dir) != 0)
        return sci_fail(SC_ERR_IO, fn, "cannot create the cache folder '%s': %s", dir,
                        strerror(errno));
    char probe[MAX_DIR + 64];
    snprintf(probe, sizeof probe, "%s/.precompile-probe-XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0)
        return sci_fail(SC_ERR_IO, fn, "the cache folder '%s' is not writable: %s", dir,
                        strerror(errno));
    close(fd);
    unlink(probe);
    return SC_OK;
}

sc_status sci_precompile(const sci_builtin_source *files, size_t count,
                         const sc_precompile_desc *desc, sc_precompile_report *report)
{
    static const char fn[] = "sc_kernels_precompile";
    const double t0 = now_ms();
    sc_precompile_report local;
    sc_precompile_report *r = report ? report : &local;
    memset(r, 0, sizeof *r);
    SCI_CHECK_PTR(fn, desc);
    if (desc->arch != 0 && (desc->arch < 50 || desc->arch > 1000))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->arch %d is not an architecture (write 90 for a compute "
                        "capability 9.0 device)",
                        desc->arch);
    if (desc->arch == 0 && desc->ctx.id == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "desc->arch is 0 and desc->ctx is the zero handle: name the "
                        "architecture of the device that will use the cache (e.g. 90 for "
                        "compute capability 9.0), or give a context on it");
    char dir[MAX_DIR + 1];
    if (desc->cache_dir) {
        const size_t n = strlen(desc->cache_dir);
        if (n == 0)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->cache_dir is \"\": name a folder, or pass NULL for the "
                            "library's cache folder");
        if (n > MAX_DIR)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->cache_dir is %zu characters long; at most %d", n, MAX_DIR);
        memcpy(dir, desc->cache_dir, n + 1);
    } else {
        char configured[1024];
        if (!sci_cache_dir_configured(configured, sizeof configured)) {
            const char *off = getenv("SAFECUDA_CACHE");
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "desc->cache_dir is NULL and %s: name the folder in "
                            "desc->cache_dir",
                            off && strcmp(off, "0") == 0
                                ? "the disk cache is off (SAFECUDA_CACHE=0)"
                                : "there is no cache folder (none of SAFECUDA_CACHE_DIR, "
                                  "XDG_CACHE_HOME and HOME is set)");
        }
        if (strlen(configured) > MAX_DIR)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                            "the cache folder '%s' is %zu characters long; at most %d (name a "
                            "shorter one in desc->cache_dir or SAFECUDA_CACHE_DIR)",
                            configured, strlen(configured), MAX_DIR);
        memcpy(dir, configured, strlen(configured) + 1);
    }

    /* A context gives the architecture (when desc->arch is 0) and the kind of image its
     * driver loads: PTX on the test device, as the library compiles there. */
    int arch = desc->arch;
    bool ptx = false;
    if (desc->ctx.id) {
        sci_context *c = NULL;
        sc_status s = sci_context_acquire(desc->ctx, fn, &c);
        if (s != SC_OK)
            return s;
        if (!arch)
            arch = c->props.cc_major * 10 + c->props.cc_minor;
        ptx = sci_driver_ptx_only();
        sci_context_release(c);
    }
    r->arch = arch;
    r->is_ptx = ptx;
    snprintf(r->cache_dir, sizeof r->cache_dir, "%s", dir);

    sc_status s = sci_compiler_ready(fn);
    if (s == SC_OK)
        s = prepare_dir(dir, fn);
    const sci_builtin_how how = {
        .arch = arch, .ptx = ptx, .program = {.fn = fn, .cache_dir = dir, .must_store = true}};
    for (size_t i = 0; i < count && s == SC_OK; i++) {
        const char *name = files[i].name;
        if (!ends_with(name, ".cu"))
            continue;
        r->files++;
        sc_precompile_file f = {.name = name};
        if (sci_builtin_is_sm90a(name) && arch != 90) {
            /* The library never loads it elsewhere: nothing to build. */
            f.skipped = true;
            f.arch = arch;
            r->skipped++;
        } else {
            sc_program prog = {0};
            s = sci_builtin_compile(files, count, (sc_context){0}, name, &how, &prog);
            if (s != SC_OK) {
                r->failed_file = name;
                break;
            }
            sc_program_props pp;
            s = sc_program_info(prog, &pp);
            sc_program_destroy(prog);
            if (s != SC_OK)
                break;
            f.from_cache = pp.from_cache;
            f.is_ptx = pp.is_ptx;
            f.arch = pp.arch;
            f.arch_specific = pp.arch_specific;
            f.image_bytes = pp.image_bytes;
            f.ms = pp.compile_ms;
            r->bytes += pp.image_bytes;
            if (pp.from_cache)
                r->cache_hits++;
            else
                r->compiled++;
        }
        if (desc->on_file)
            desc->on_file(&f, desc->user);
    }
    r->ms = now_ms() - t0;
    return s;
}

sc_status sc_kernels_precompile(const sc_precompile_desc *desc, sc_precompile_report *report)
{
    return sci_precompile(sci_builtin_sources, sci_builtin_count, desc, report);
}
