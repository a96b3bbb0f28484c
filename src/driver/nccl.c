/* Run-time loading of NCCL (libnccl.so.2), its version check, its entry points and its
 * error texts.
 *
 * Where NCCL is looked for (the first usable one is loaded):
 *   - SAFECUDA_LIBNCCL, when set and not empty: that file only (strictly: nothing else is
 *     tried, as SAFECUDA_NVRTC and SAFECUDA_LIBCUDA are);
 *   - a libnccl.so.2 already loaded in the process (torch's, say), so that both use one;
 *   - the nvidia-nccl-cu12 / -cu13 wheels' nvidia/nccl/lib/libnccl.so.2 in Python
 *     environments: the site-packages (or dist-packages) folders of the libraries the
 *     process has loaded (a Python program has loaded its packages' extensions, safecuda's
 *     own libsafecuda.so when pip-installed), then under $VIRTUAL_ENV, $CONDA_PREFIX,
 *     $PYTHONHOME and the running program's prefix (python3's, as started and as resolved:
 *     a virtual environment's bin/python3 links to the system's): lib/python3.*\/
 *     site-packages and the same under lib64;
 *   - libnccl.so.2 through the dynamic linker (LD_LIBRARY_PATH, the program's RUNPATH, the
 *     system's folders: the libnccl2 package);
 *   - the CUDA toolkit's folders: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda (lib64, lib).
 * A library that is found but can't be used (not NCCL, older than SCI_NCCL_MIN_VERSION, an
 * entry point missing) is closed and the search goes on; the message lists each one tried
 * and why it was not used. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <glob.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/nccl_api.h"

#define SCI_NCCL_FIELD(name, req, params, args) ncclResult_t (*name) params;
static struct nccl_table {
    SCI_NCCL_FUNCS(SCI_NCCL_FIELD)
    const char *(*ncclGetErrorString)(ncclResult_t r);
    const char *(*ncclGetLastError)(ncclComm_t comm);
} table;
#undef SCI_NCCL_FIELD

#define SCI_NCCL_ROW(name, req, params, args) {#name, req, offsetof(struct nccl_table, name)},
static const struct {
    const char *name;
    int required;
    size_t offset;
} entries[] = {SCI_NCCL_FUNCS(SCI_NCCL_ROW)};
#undef SCI_NCCL_ROW

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static sc_status load_status = SC_ERR_NO_NCCL;
static char load_message[8192];
static char library_path[1024];
static int nccl_version;
static bool test_double;
static void *handle;

__attribute__((format(printf, 3, 4))) static void appendf(char *buf, size_t size,
                                                          const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, size - len, fmt, ap);
    va_end(ap);
}

/* "2.28.9" for 22809 (and 2.8.4 for 2804: the older encoding). */
void sci_nccl_version_text(int code, char *out, size_t size)
{
    if (code >= 10000)
        snprintf(out, size, "%d.%d.%d", code / 10000, (code / 100) % 100, code % 100);
    else
        snprintf(out, size, "%d.%d.%d", code / 1000, (code / 100) % 10, code % 100);
}

/* ---- one candidate ---------------------------------------------------------------------- */

static const char *const install_hint =
    "install NCCL 2.19.4 or newer (pip install nvidia-nccl-cu13, or -cu12, in the Python "
    "environment; or the libnccl2 package), or point SAFECUDA_LIBNCCL at a libnccl.so.2";

/* Try to use the library at path: true when it is loaded and usable (handle, table, version
 * and library_path set). Otherwise why it was not used goes into tried. */
static bool try_library(const char *path, int flags, char *tried, size_t size)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | flags);
    if (!h) {
        const char *why = dlerror();
        size_t len = strlen(path);
        if (why && strncmp(why, path, len) == 0 && strncmp(why + len, ": ", 2) == 0)
            why += len + 2; /* dlerror repeats the name */
        if (!(flags & RTLD_NOLOAD))
            appendf(tried, size, "%s%s (%s)", tried[0] ? "; " : "", path,
                    why ? why : "not found");
        return false;
    }
    char where[1024];
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(where, sizeof where, "%s", lm->l_name);
    else
        snprintf(where, sizeof where, "%s", path);
    ncclResult_t (*get_version)(int *) =
        (ncclResult_t(*)(int *))(uintptr_t)dlsym(h, "ncclGetVersion");
    int v = 0;
    if (!get_version) {
        appendf(tried, size, "%s%s (not an NCCL library: it lacks ncclGetVersion)",
                tried[0] ? "; " : "", where);
        dlclose(h);
        return false;
    }
    if (get_version(&v) != 0 || v < SCI_NCCL_MIN_VERSION) {
        char have[32], need[32];
        sci_nccl_version_text(v, have, sizeof have);
        sci_nccl_version_text(SCI_NCCL_MIN_VERSION, need, sizeof need);
        appendf(tried, size,
                "%s%s (NCCL %s is too old: safecuda needs NCCL %s or newer, for its "
                "non-blocking communicators (2.14) and the fixes of 2.19.4 to graph capture "
                "and to all-to-all-v with a self send)",
                tried[0] ? "; " : "", where, have, need);
        /* Keep the version found for sci_nccl_version (the first one found). */
        if (!nccl_version)
            nccl_version = v;
        dlclose(h);
        return false;
    }
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        void *fn = dlsym(h, entries[i].name);
        if (!fn && entries[i].required) {
            char have[32];
            sci_nccl_version_text(v, have, sizeof have);
            appendf(tried, size, "%s%s (NCCL %s lacks the entry point %s)",
                    tried[0] ? "; " : "", where, have, entries[i].name);
            memset(&table, 0, sizeof table);
            dlclose(h);
            return false;
        }
        memcpy((char *)&table + entries[i].offset, &fn, sizeof fn);
    }
    table.ncclGetErrorString =
        (const char *(*)(ncclResult_t))(uintptr_t)dlsym(h, "ncclGetErrorString");
    table.ncclGetLastError = (const char *(*)(ncclComm_t))(uintptr_t)dlsym(h, "ncclGetLastError");
    handle = h;
    nccl_version = v;
    snprintf(library_path, sizeof library_path, "%s", where);
    test_double = dlsym(h, "safecuda_ncclfault_double") != NULL;
    return true;
}

/* ---- where to look ---------------------------------------------------------------------- */

#define MAX_PREFIXES 24
typedef struct prefix_list {
    char items[MAX_PREFIXES][1024];
    int n;
} prefix_list;

static void add_prefix(prefix_list *l, const char *p, size_t len)
{
    while (len > 1 && p[len - 1] == '/')
        len--;
    if (len == 0 || len >= sizeof l->items[0] || l->n == MAX_PREFIXES)
        return;
    for (int i = 0; i < l->n; i++)
        if (strlen(l->items[i]) == len && strncmp(l->items[i], p, len) == 0)
            return;
    memcpy(l->items[l->n], p, len);
    l->items[l->n++][len] = '\0';
}

/* The site-packages (or dist-packages) folder a loaded library's path lies in. */
static int collect_site_packages(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *name = info->dlpi_name;
    if (!name || !name[0])
        return 0;
    static const char *const markers[] = {"/site-packages/", "/dist-packages/"};
    for (size_t i = 0; i < 2; i++) {
        const char *m = strstr(name, markers[i]);
        if (m)
            add_prefix(data, name, (size_t)(m - name) + strlen(markers[i]) - 1);
    }
    return 0;
}

/* The site-packages folders under an environment's prefix. */
static void add_environment(prefix_list *sites, const char *prefix)
{
    if (!prefix || !prefix[0])
        return;
    static const char *const patterns[] = {"%s/lib/python3*/site-packages",
                                           "%s/lib64/python3*/site-packages",
                                           "%s/lib/python3*/dist-packages",
                                           "%s/local/lib/python3*/dist-packages"};
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        char pattern[1100];
        snprintf(pattern, sizeof pattern, patterns[i], prefix);
        glob_t g;
        if (glob(pattern, GLOB_ONLYDIR, NULL, &g) == 0)
            for (size_t k = 0; k < g.gl_pathc; k++)
                add_prefix(sites, g.gl_pathv[k], strlen(g.gl_pathv[k]));
        globfree(&g);
    }
}

/* The prefix of a program path (<prefix>/bin/python3 -> <prefix>). */
static void add_prefix_of(prefix_list *sites, char *exe)
{
    char *slash = strrchr(exe, '/');
    if (!slash)
        return;
    *slash = '\0';
    slash = strrchr(exe, '/');
    if (!slash || slash == exe)
        return;
    *slash = '\0';
    add_environment(sites, exe);
}

/* The running program's prefixes: as it was started (argv[0] with a folder: a virtual
 * environment's bin/python3, which is a link to the system's), and as resolved. */
static void add_program_prefixes(prefix_list *sites)
{
    char exe[1024] = "";
    FILE *f = fopen("/proc/self/cmdline", "r");
    if (f) {
        size_t n = fread(exe, 1, sizeof exe - 1, f);
        exe[n] = '\0'; /* argv[0] ends at its NUL */
        fclose(f);
        if (strchr(exe, '/'))
            add_prefix_of(sites, exe);
    }
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        add_prefix_of(sites, exe);
    }
}

static bool search_python(char *tried, size_t size)
{
    static prefix_list sites; /* (load runs once) */
    memset(&sites, 0, sizeof sites);
    dl_iterate_phdr(collect_site_packages, &sites);
    add_environment(&sites, getenv("VIRTUAL_ENV"));
    add_environment(&sites, getenv("CONDA_PREFIX"));
    add_environment(&sites, getenv("PYTHONHOME"));
    add_program_prefixes(&sites);
    for (int i = 0; i < sites.n; i++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/nvidia/nccl/lib/libnccl.so.2", sites.items[i]);
        if (access(path, F_OK) == 0 && try_library(path, 0, tried, size))
            return true;
    }
    if (sites.n == 0)
        appendf(tried, size, "%sno Python environment's nvidia/nccl/lib/libnccl.so.2 (none "
                "found: no site-packages among the loaded libraries, no VIRTUAL_ENV or "
                "CONDA_PREFIX)", tried[0] ? "; " : "");
    else {
        appendf(tried, size, "%sno nvidia/nccl/lib/libnccl.so.2 in ", tried[0] ? "; " : "");
        for (int i = 0; i < sites.n; i++)
            appendf(tried, size, "%s%s", i ? ", " : "", sites.items[i]);
    }
    return false;
}

static bool search_toolkit(char *tried, size_t size)
{
    const char *dirs[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    static const char *const subdirs[] = {"lib64", "lib"};
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        if (!dirs[d] || !dirs[d][0])
            continue;
        for (size_t s = 0; s < 2; s++) {
            char path[1100];
            snprintf(path, sizeof path, "%s/%s/libnccl.so.2", dirs[d], subdirs[s]);
            if (access(path, F_OK) == 0 && try_library(path, 0, tried, size))
                return true;
        }
    }
    return false;
}

static void load(void)
{
    char tried[6144] = "";
    const char *override = getenv("SAFECUDA_LIBNCCL");
    if (override && override[0]) {
        if (!try_library(override, 0, tried, sizeof tried))
            snprintf(load_message, sizeof load_message,
                     "cannot use NCCL from SAFECUDA_LIBNCCL=%s: %s; point the variable at a "
                     "libnccl.so.2 of NCCL 2.19.4 or newer, or unset it to search the usual "
                     "places",
                     override, tried);
    } else if (!try_library("libnccl.so.2", RTLD_NOLOAD, tried, sizeof tried) &&
               !search_python(tried, sizeof tried) &&
               !try_library("libnccl.so.2", 0, tried, sizeof tried) &&
               !search_toolkit(tried, sizeof tried)) {
        snprintf(load_message, sizeof load_message, "cannot load NCCL: tried %s; %s", tried,
                 install_hint);
    }
    if (!handle)
        return;
    char text[32];
    sci_nccl_version_text(nccl_version, text, sizeof text);
    snprintf(load_message, sizeof load_message, "loaded %s (NCCL %s)", library_path, text);
    load_status = SC_OK;
}

sc_status sci_nccl_load(void)
{
    pthread_once(&load_once, load);
    return load_status;
}

const char *sci_nccl_load_message(void) { return load_message; }
const char *sci_nccl_library_path(void) { return library_path; }
int sci_nccl_version(void) { return nccl_version; }
bool sci_nccl_is_test_double(void) { return test_double; }

/* ---- errors ------------------------------------------------------------------------------ */

static const char *const result_names[] = {
    "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
    "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
/* (NCCL's own texts come from ncclGetErrorString once it is loaded) */
static const char *const result_texts[] = {
    "no error",
    "unhandled cuda error",
    "unhandled system error",
    "internal error",
    "invalid argument",
    "invalid usage",
    "remote process exited or there was a network error",
    "NCCL operation in progress"};

const char *sci_nccl_error_name(ncclResult_t r)
{
    if (r >= 0 && (size_t)r < sizeof result_names / sizeof result_names[0])
        return result_names[r];
    return "ncclResultUnknown";
}

const char *sci_nccl_error_string(ncclResult_t r)
{
    const char *s = NULL;
    if (load_status == SC_OK && table.ncclGetErrorString)
        s = table.ncclGetErrorString(r);
    if (s)
        return s;
    if (r >= 0 && (size_t)r < sizeof result_texts / sizeof result_texts[0])
        return result_texts[r];
    return "unknown result code";
}

const char *sci_nccl_last_error(ncclComm_t comm)
{
    const char *s = NULL;
    if (load_status == SC_OK && table.ncclGetLastError)
        s = table.ncclGetLastError(comm);
    return s ? s : "";
}

/* ---- the wrappers ------------------------------------------------------------------------- */

#define SCI_NCCL_WRAPPER(name, req, params, args)                  \
    ncclResult_t sci_##name params                                 \
    {                                                              \
        if (!table.name)                                           \
            return ncclInternalError;                              \
        return table.name args;                                    \
    }
SCI_NCCL_FUNCS(SCI_NCCL_WRAPPER)
