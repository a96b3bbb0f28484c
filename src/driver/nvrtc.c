/* Run-time loading of NVRTC, the CUDA C++ run-time compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "driver/table.h"

struct sci_nvrtc_table sci_nvrtc_table;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static sc_status load_status = SC_ERR_NO_COMPILER;
static char load_message[4096];
static char library_path[1024];
static void *handle;
static int archs[64];
static int n_archs;

static void appendf(char *buf, size_t size, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, size - len, fmt, ap);
    va_end(ap);
}

static bool try_open(const char *path, char *tried, size_t tried_size)
{
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle) {
        struct link_map *lm = NULL;
        if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
            snprintf(library_path, sizeof library_path, "%s", lm->l_name);
        else
            snprintf(library_path, sizeof library_path, "%s", path);
        return true;
    }
    (void)dlerror();
    appendf(tried, tried_size, "%s%s", tried[0] ? ", " : "", path);
    return false;
}

static void load(void)
{
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    char tried[2048] = "";
    const char *override = getenv("SAFECUDA_NVRTC");
    if (override && override[0]) {
        if (!try_open(override, tried, sizeof tried)) {
            snprintf(load_message, sizeof load_message,
                     "cannot load NVRTC from SAFECUDA_NVRTC=%s; install the CUDA toolkit's "
                     "NVRTC (e.g. the cuda-nvrtc package) or fix the variable",
                     override);
            return;
        }
    } else {
        const char *dirs[] = {getenv("CUDA_HOME"),
                              getenv("CUDA_PATH"),
                              "/usr/local/cuda",
                              "/usr/local/cuda/targets/x86_64-linux",
                              "/opt/cuda",
                              NULL};
        bool found = false;
        for (size_t i = 0; i < 3 && !found; i++)
            found = try_open(names[i], tried, sizeof tried);
        for (size_t d = 0; d < sizeof dirs / sizeof dirs[0] && !found; d++) {
            if (!dirs[d] || !dirs[d][0])
                continue;
            for (size_t i = 0; i < 3 && !found; i++) {
                char path[1024];
                snprintf(path, sizeof path, "%s/lib64/%s", dirs[d], names[i]);
                found = try_open(path, tried, sizeof tried);
                if (!found) {
                    snprintf(path, sizeof path, "%s/lib/%s", dirs[d], names[i]);
                    found = try_open(path, tried, sizeof tried);
                }
            }
        }
        if (!found) {
            snprintf(load_message, sizeof load_message,
                     "cannot load NVRTC: tried %s; install the CUDA toolkit's NVRTC (the "
                     "cuda-nvrtc package), set CUDA_HOME to the toolkit, or point "
                     "SAFECUDA_NVRTC at libnvrtc.so",
                     tried);
            return;
        }
    }

    for (size_t i = 0; i < sci_nvrtc_entry_count; i++) {
        const struct sci_nvrtc_entry *e = &sci_nvrtc_entries[i];
        void *fn = dlsym(handle, e->name);
        if (!fn && e->required) {
            snprintf(load_message, sizeof load_message,
                     "%s is not a usable NVRTC library: it lacks %s", library_path, e->name);
            dlclose(handle);
            handle = NULL;
            memset(&sci_nvrtc_table, 0, sizeof sci_nvrtc_table);
            return;
        }
        *(void **)((char *)&sci_nvrtc_table + e->offset) = fn;
    }
    sci_nvrtc_table.nvrtcGetErrorString =
        (const char *(*)(nvrtcResult))(uintptr_t)dlsym(handle, "nvrtcGetErrorString");

    if (sci_nvrtc_table.nvrtcGetNumSupportedArchs && sci_nvrtc_table.nvrtcGetSupportedArchs) {
        int n = 0;
        if (sci_nvrtc_table.nvrtcGetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 &&
            n <= (int)(sizeof archs / sizeof archs[0]) &&
            sci_nvrtc_table.nvrtcGetSupportedArchs(archs) == NVRTC_SUCCESS)
            n_archs = n;
    }
    int major = 0, minor = 0;
    sci_nvrtc_table.nvrtcVersion(&major, &minor);
    snprintf(load_message, sizeof load_message, "loaded %s (NVRTC %d.%d)", library_path, major,
             minor);
    load_status = SC_OK;
}

sc_status sci_nvrtc_load(void)
{
    pthread_once(&load_once, load);
    return load_status;
}

const char *sci_nvrtc_load_message(void) { return load_message; }
const char *sci_nvrtc_library_path(void) { return library_path; }

const char *sci_nvrtc_error_string(nvrtcResult r)
{
    const char *s = NULL;
    if (load_status == SC_OK && sci_nvrtc_table.nvrtcGetErrorString)
        s = sci_nvrtc_table.nvrtcGetErrorString(r);
    return s ? s : "NVRTC_ERROR";
}

bool sci_nvrtc_has_cubin(void) { return sci_nvrtc_table.nvrtcGetCUBIN != NULL; }

int sci_nvrtc_archs(const int **list)
{
    *list = archs;
    return n_archs;
}

bool sci_nvrtc_supports_arch(int sm)
{
    if (n_archs == 0)
        return true; /* old NVRTC without the query: let the compile decide */
    for (int i = 0; i < n_archs; i++)
        if (archs[i] == sm)
            return true;
    return false;
}
