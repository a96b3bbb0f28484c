/* Run-time loading of libcuda and resolution of the driver entry points. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/driver.h"
#include "driver/table.h"

struct sci_cu_table sci_cu_table;

typedef CUresult (*pfn_init)(unsigned);
typedef CUresult (*pfn_version)(int *);
typedef CUresult (*pfn_get_proc)(const char *, void **, int, cuuint64_t, int *);
typedef CUresult (*pfn_error_text)(CUresult, const char **);

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static sc_status load_status = SC_ERR_NO_DRIVER;
static char load_message[4096];
static char library_path[1024];
static int cuda_version;
static bool has_devices;
static void *handle;

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

/* The file a dlopen handle came from (the name given may have been a bare soname). */
static void handle_path(void *h, const char *fallback, char *out, size_t size)
{
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0])
        snprintf(out, size, "%s", lm->l_name);
    else
        snprintf(out, size, "%s", fallback);
}

static const char *const install_hint =
    "install the NVIDIA driver (it provides libcuda.so.1), or point SAFECUDA_LIBCUDA at it; "
    "on a machine without a GPU (CI), SAFECUDA_DEVICE=test selects safecuda's test device "
    "(device memory is host memory, kernels do not run)";

static void fail_status(sc_status status, const char *fmt, va_list ap)
{
    load_status = status;
    vsnprintf(load_message, sizeof load_message, fmt, ap);
    if (handle)
        dlclose(handle);
    handle = NULL;
    memset(&sci_cu_table, 0, sizeof sci_cu_table);
}

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_status(SC_ERR_NO_DRIVER, fmt, ap);
    va_end(ap);
}

/* A libcuda was found but can't be used: the driver is there and broken (or too old),
 * which is SC_ERR_DRIVER, not "no driver": a GPU machine in this state must not read as
 * one without a GPU. */
__attribute__((format(printf, 1, 2))) static void fail_broken(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_status(SC_ERR_DRIVER, fmt, ap);
    va_end(ap);
}

__attribute__((format(printf, 1, 2))) static void fail_config(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_status(SC_ERR_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
}

/* ---- the test device -------------------------------------------------------------------
 * SAFECUDA_DEVICE=test loads libsafecuda_testdevice.so (testdevice/) instead of libcuda,
 * from the first of these folders that has it:
 *   - beside the file this code is in (libsafecuda.so, or the program that linked
 *     libsafecuda.a: /proc/self/exe, so also when it was run through PATH), as resolved
 *     (symbolic links followed), then as named where that differs;
 *   - that folder's prefix's library folders (<prefix>/bin/safecuda: <prefix>/<libdir>,
 *     <prefix>/lib, <prefix>/lib64, <prefix>/lib/<multiarch>), so an installed tree works
 *     wherever it was installed or staged (--prefix, DESTDIR);
 *   - the libdir configured at build time;
 *   - by name through the dynamic linker (LD_LIBRARY_PATH, the program's RUNPATH, the
 *     system's folders);
 *   - the prefix itself (a build tree: build/bench/bench_memory finds build/'s). */
#define TESTDEVICE_NAME "libsafecuda_testdevice.so"

static bool try_open(const char *name, char *tried, size_t size)
{
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle) {
        handle_path(handle, name, library_path, sizeof library_path);
        return true;
    }
    const char *why = dlerror();
    size_t len = strlen(name);
    if (why && strncmp(why, name, len) == 0 && strncmp(why + len, ": ", 2) == 0)
        why += len + 2; /* dlerror repeats the name */
    appendf(tried, size, "%s%s (%s)", tried[0] ? "; " : "", name, why ? why : "not found");
    return false;
}

#define MAX_DIRS 16
typedef struct dir_list {
    char items[MAX_DIRS][1024];
    int n;
    char prefixes[2][1024]; /* tried last, after the dynamic linker */
    int n_prefixes;
} dir_list;

static void add_dir(dir_list *d, const char *dir, size_t len)
{
    if (len == 0 || len >= sizeof d->items[0] || d->n == MAX_DIRS)
        return;
    for (int i = 0; i < d->n; i++)
        if (strlen(d->items[i]) == len && strncmp(d->items[i], dir, len) == 0)
            return;
    memcpy(d->items[d->n], dir, len);
    d->items[d->n++][len] = '\0';
}

/* The folder of file, and its prefix's library folders. */
static void add_dirs_of(dir_list *d, const char *file)
{
    const char *slash = strrchr(file, '/');
    if (!slash)
        return;
    size_t dir_len = slash == file ? 1 : (size_t)(slash - file);
    add_dir(d, file, dir_len);
    const char *up = NULL; /* the prefix: the folder's parent */
    for (const char *p = file; p < file + dir_len; p++)
        if (*p == '/')
            up = p;
    if (!up || up == file)
        return;
    int prefix = (int)(up - file);
    bool known = false;
    for (int i = 0; i < d->n_prefixes; i++)
        known |= strlen(d->prefixes[i]) == (size_t)prefix &&
                 strncmp(d->prefixes[i], file, (size_t)prefix) == 0;
    if (!known && d->n_prefixes < 2 && (size_t)prefix < sizeof d->prefixes[0])
        snprintf(d->prefixes[d->n_prefixes++], sizeof d->prefixes[0], "%.*s", prefix, file);
    static const char *const libdirs[] = {
#ifdef SAFECUDA_RELATIVE_LIBDIR
        SAFECUDA_RELATIVE_LIBDIR,
#endif
        "lib", "lib64",
#ifdef SAFECUDA_MULTIARCH
        ("lib/" SAFECUDA_MULTIARCH), /* (one name: lib/x86_64-linux-gnu) */
#endif
    };
    char path[1024];
    for (size_t i = 0; i < sizeof libdirs / sizeof libdirs[0]; i++) {
        int n = snprintf(path, sizeof path, "%.*s/%s", prefix, file, libdirs[i]);
        if (n > 0 && (size_t)n < sizeof path)
            add_dir(d, path, (size_t)n);
    }
}

static bool open_test_device(char *tried, size_t size)
{
    static dir_list dirs; /* (load runs once) */
    memset(&dirs, 0, sizeof dirs);
    char resolved[4096];
    Dl_info info;
    struct link_map *lm = NULL;
    if (dladdr1((void *)(uintptr_t)sci_driver_load, &info, (void **)&lm, RTLD_DL_LINKMAP) &&
        lm) {
        const char *named = lm->l_name && lm->l_name[0] ? lm->l_name : NULL;
        if (named) { /* a shared library: libsafecuda.so */
            if (realpath(named, resolved))
                add_dirs_of(&dirs, resolved);
            add_dirs_of(&dirs, named);
        } else { /* the program itself: argv[0] may name no folder (run through PATH) */
            ssize_t n = readlink("/proc/self/exe", resolved, sizeof resolved - 1);
            if (n > 0) {
                resolved[n] = '\0';
                add_dirs_of(&dirs, resolved);
            }
            if (info.dli_fname)
                add_dirs_of(&dirs, info.dli_fname);
        }
    }
#ifdef SAFECUDA_INSTALL_LIBDIR
    add_dir(&dirs, SAFECUDA_INSTALL_LIBDIR, strlen(SAFECUDA_INSTALL_LIBDIR));
#endif
    char path[1100];
    char missing[2048] = ""; /* the folders without the file */
    for (int i = 0; i < dirs.n; i++) {
        snprintf(path, sizeof path, "%s/%s", dirs.items[i], TESTDEVICE_NAME);
        if (access(path, F_OK) != 0) {
            appendf(missing, sizeof missing, "%s%s", missing[0] ? ", " : "", dirs.items[i]);
            continue;
        }
        if (try_open(path, tried, size)) /* there but not loadable: tried says why */
            return true;
    }
    handle = dlopen(TESTDEVICE_NAME, RTLD_NOW | RTLD_LOCAL);
    if (handle) {
        handle_path(handle, TESTDEVICE_NAME, library_path, sizeof library_path);
        return true;
    }
    const char *why = dlerror(); /* found by name but not loadable: say why */
    if (why && !strstr(why, "cannot open shared object file"))
        appendf(tried, size, "%s%s", tried[0] ? "; " : "", why);
    for (int i = 0; i < dirs.n_prefixes; i++) {
        snprintf(path, sizeof path, "%s/%s", dirs.prefixes[i], TESTDEVICE_NAME);
        if (access(path, F_OK) != 0)
            appendf(missing, sizeof missing, "%s%s", missing[0] ? ", " : "", dirs.prefixes[i]);
        else if (try_open(path, tried, size))
            return true;
    }
    appendf(tried, size, "%s%s is not in %s, nor found by the dynamic linker (LD_LIBRARY_PATH, "
            "the program's RUNPATH, the system's folders)",
            tried[0] ? "; " : "", TESTDEVICE_NAME, missing[0] ? missing : "the program's folder");
    return false;
}

static bool ptx_only; /* the loaded driver is safecuda's test device */

static void load(void)
{
    /* SAFECUDA_DEVICE: unset, empty or "cuda" for the NVIDIA driver, "test" for the test
     * device. SAFECUDA_LIBCUDA, when set, names the file to load either way. */
    const char *device = getenv("SAFECUDA_DEVICE");
    bool test_device = false;
    if (device && device[0] && strcmp(device, "cuda") != 0) {
        if (strcmp(device, "test") != 0) {
            fail_config("SAFECUDA_DEVICE=%s is not a device safecuda knows: set "
                        "SAFECUDA_DEVICE=test for the test device (no GPU: device memory is "
                        "host memory, kernels do not run), or leave it unset (or \"cuda\") "
                        "for the NVIDIA driver",
                        device);
            return;
        }
        test_device = true;
    }
    const char *override = getenv("SAFECUDA_LIBCUDA");
    const char *defaults[] = {"libcuda.so.1", "libcuda.so"};
    const char *const *names = defaults;
    size_t n_names = 2;
    if (override && override[0]) {
        names = &override;
        n_names = 1;
    }

    char tried[3072] = "";
    if (test_device && !(override && override[0])) {
        if (!open_test_device(tried, sizeof tried)) {
            fail("cannot load the safecuda test device (SAFECUDA_DEVICE=test): %s; it is "
                 "installed with safecuda, beside libsafecuda: point SAFECUDA_LIBCUDA at the "
                 "installed %s",
                 tried, TESTDEVICE_NAME);
            return;
        }
    }
    for (size_t i = 0; i < n_names && !handle; i++)
        try_open(names[i], tried, sizeof tried);
    if (!handle) {
        if (override && override[0])
            fail("cannot load the %s from SAFECUDA_LIBCUDA=%s: tried %s; %s",
                 test_device ? "safecuda test device" : "CUDA driver library", override, tried,
                 test_device ? "point it at " TESTDEVICE_NAME : install_hint);
        else
            fail("cannot load the CUDA driver library: tried %s; %s", tried, install_hint);
        return;
    }

    pfn_init init = (pfn_init)(uintptr_t)dlsym(handle, "cuInit");
    pfn_version version = (pfn_version)(uintptr_t)dlsym(handle, "cuDriverGetVersion");
    pfn_get_proc get_proc = (pfn_get_proc)(uintptr_t)dlsym(handle, "cuGetProcAddress_v2");
    if (!init || !version) {
        fail("%s is not a CUDA driver library (it lacks cuInit/cuDriverGetVersion); %s",
             library_path, install_hint);
        return;
    }

    CUresult r = init(0);
    if (r == CUDA_ERROR_STUB_LIBRARY || strstr(library_path, "/stubs/")) {
        fail("found only the CUDA toolkit's stub driver library %s (its calls answer "
             "CUDA_ERROR_STUB_LIBRARY): no NVIDIA driver is installed on this machine; %s",
             library_path, install_hint);
        return;
    }
    /* safecuda's test device refuses a bad SAFECUDA_TESTDEVICE_* setting at cuInit and says
     * which and what is accepted: a configuration error, as SAFECUDA_DEVICE=garbage is. */
    typedef const char *(*pfn_settings_error)(void);
    pfn_settings_error settings_error =
        (pfn_settings_error)(uintptr_t)dlsym(handle, "safecuda_testdevice_settings_error");
    if (r != CUDA_SUCCESS && settings_error && settings_error()) {
        fail_config("%s", settings_error());
        return;
    }
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NO_DEVICE) {
        pfn_error_text name_fn = (pfn_error_text)(uintptr_t)dlsym(handle, "cuGetErrorName");
        const char *name = NULL;
        if (!name_fn || name_fn(r, &name) != CUDA_SUCCESS || !name)
            name = sci_cu_error_name(r);
        fail_broken("cuInit failed with %s (%d) in %s: the driver is installed but not usable "
             "(kernel module not loaded, version mismatch or no permission on /dev/nvidia*)",
             name, (int)r, library_path);
        return;
    }
    has_devices = (r == CUDA_SUCCESS);

    if (version(&cuda_version) != CUDA_SUCCESS) {
        fail_broken("cuDriverGetVersion failed in %s", library_path);
        return;
    }
    if (cuda_version < SCI_CUDA_MIN_VERSION || !get_proc) {
        fail_broken("the NVIDIA driver at %s supports CUDA %d.%d; safecuda needs CUDA %d.%d or "
             "newer: update the NVIDIA driver",
             library_path, cuda_version / 1000, (cuda_version % 1000) / 10,
             SCI_CUDA_MIN_VERSION / 1000, (SCI_CUDA_MIN_VERSION % 1000) / 10);
        return;
    }

    for (size_t i = 0; i < sci_cu_entry_count; i++) {
        const struct sci_cu_entry *e = &sci_cu_entries[i];
        void *fn = NULL;
        int query = 0;
        int want = e->version < cuda_version ? e->version : cuda_version;
        CUresult gr = get_proc(e->name, &fn, want, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &query);
        if (gr != CUDA_SUCCESS || query != CU_GET_PROC_ADDRESS_SUCCESS)
            fn = NULL;
        if (!fn && e->required) {
            fail_broken("the NVIDIA driver at %s (CUDA %d.%d) lacks the entry point %s (query "
                 "result %d): update the NVIDIA driver",
                 library_path, cuda_version / 1000, (cuda_version % 1000) / 10, e->name,
                 query);
            return;
        }
        *(void **)((char *)&sci_cu_table + e->offset) = fn;
    }
    /* The test device (testdevice/) exports its counters; it loads modules from PTX only. */
    ptx_only = dlsym(handle, "safecuda_testdevice_misuse_count") != NULL;
    load_status = SC_OK;
    snprintf(load_message, sizeof load_message, "loaded %s (CUDA %d.%d)", library_path,
             cuda_version / 1000, (cuda_version % 1000) / 10);
}

sc_status sci_driver_load(void)
{
    pthread_once(&load_once, load);
    return load_status;
}

const char *sci_driver_load_message(void) { return load_message; }
int sci_driver_cuda_version(void) { return cuda_version; }
const char *sci_driver_library_path(void) { return library_path; }
bool sci_driver_has_devices(void) { return has_devices; }
bool sci_driver_has_param_info(void) { return sci_cu_table.cuFuncGetParamInfo != NULL; }
bool sci_driver_has_tensor_maps(void) { return sci_cu_table.cuTensorMapEncodeTiled != NULL; }
bool sci_driver_has_launch_ex(void) { return sci_cu_table.cuLaunchKernelEx != NULL; }
bool sci_driver_ptx_only(void) { return ptx_only; }

/* ---- error names ----------------------------------------------------------------------- */

#define SCI_CU_ERROR_ROW(name, value, text) {name, #name, text},
static const struct {
    CUresult code;
    const char *name;
    const char *text;
} known_errors[] = {SCI_CU_ERRORS(SCI_CU_ERROR_ROW)};
#undef SCI_CU_ERROR_ROW

static const char *builtin_error(CUresult r, int which)
{
    for (size_t i = 0; i < sizeof known_errors / sizeof known_errors[0]; i++)
        if (known_errors[i].code == r)
            return which ? known_errors[i].text : known_errors[i].name;
    return which ? "unrecognized error code" : "CUDA_ERROR_UNRECOGNIZED";
}

const char *sci_cu_error_name(CUresult r)
{
    const char *s = NULL;
    if (load_status == SC_OK && sci_cu_table.cuGetErrorName &&
        sci_cu_table.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    return builtin_error(r, 0);
}

const char *sci_cu_error_string(CUresult r)
{
    const char *s = NULL;
    if (load_status == SC_OK && sci_cu_table.cuGetErrorString &&
        sci_cu_table.cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
        return s;
    return builtin_error(r, 1);
}

bool sci_cu_error_is_sticky(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
        return true;
    default:
        return false;
    }
}
