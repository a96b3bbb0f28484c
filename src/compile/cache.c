#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compile/cache.h"
#include "core/error.h"
#include "core/log.h"

#define MAGIC "SCCACHE1"
#define FORMAT_VERSION 1u

/* Entry layout (little-endian host order; the key covers the machine anyway):
 *   char magic[8]; u32 version; u32 flags (1 = PTX); u64 key.a, key.b;
 *   u64 image_size; u64 image_checksum; u32 n_names; u32 reserved;
 *   n_names x { u32 expr_len; u32 lowered_len; expr bytes; lowered bytes }
 *   image bytes
 *   u64 checksum of everything before it */
typedef struct header {
    char magic[8];
    uint32_t version;
    uint32_t flags;
    uint64_t key_a, key_b;
    uint64_t image_size;
    uint64_t image_checksum;
    uint32_t n_names;
    uint32_t reserved;
} header;

void sci_cache_entry_free(sci_cache_entry *e)
{
    free(e->image);
    for (size_t i = 0; i < e->n_names; i++) {
        free(e->exprs ? e->exprs[i] : NULL);
        free(e->lowered ? e->lowered[i] : NULL);
    }
    free(e->exprs);
    free(e->lowered);
    memset(e, 0, sizeof *e);
}

int sci_cache_mkdir(const char *path)
{
    char tmp[1024];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return -1;
    /* EEXIST for a file of that name: not a folder. */
    struct stat st;
    if (stat(tmp, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Which variable named the folder (for messages): 0 SAFECUDA_CACHE_DIR, 1 XDG_CACHE_HOME,
 * 2 HOME; -1 none (the cache off or no folder). */
static int configured(char *dir, size_t size)
{
    if (size)
        dir[0] = '\0';
    const char *off = getenv("SAFECUDA_CACHE");
    if (off && strcmp(off, "0") == 0)
        return -1;
    const char *explicit_dir = getenv("SAFECUDA_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (explicit_dir && explicit_dir[0]) {
        snprintf(dir, size, "%s", explicit_dir);
        return 0;
    }
    if (xdg && xdg[0]) {
        snprintf(dir, size, "%s/safecuda", xdg);
        return 1;
    }
    if (home && home[0]) {
        snprintf(dir, size, "%s/.cache/safecuda", home);
        return 2;
    }
    return -1;
}

bool sci_cache_dir_configured(char *dir, size_t size) { return configured(dir, size) >= 0; }

bool sci_cache_state(char *dir, size_t dir_size, char *problem, size_t problem_size)
{
    snprintf(problem, problem_size, "%s", "");
    int from = configured(dir, dir_size);
    if (from < 0) {
        const char *off = getenv("SAFECUDA_CACHE");
        snprintf(problem, problem_size, "%s",
                 off && strcmp(off, "0") == 0
                     ? "off: SAFECUDA_CACHE=0"
                     : "no folder: none of SAFECUDA_CACHE_DIR, XDG_CACHE_HOME, HOME is set");
        return false;
    }
    int err = 0;
    if (sci_cache_mkdir(dir) != 0 || access(dir, W_OK | X_OK) != 0)
        err = errno ? errno : EIO;
    if (!err)
        return true;
    if (from == 0)
        snprintf(problem, problem_size, "SAFECUDA_CACHE_DIR=%s can't be used: %s", dir,
                 strerror(err));
    else
        snprintf(problem, problem_size, "%s (from %s) can't be used: %s", dir,
                 from == 1 ? "XDG_CACHE_HOME" : "HOME", strerror(err));
    return false;
}

const char *sci_cache_dir(void)
{
    static _Thread_local char dir[768];
    char problem[1024];
    if (sci_cache_state(dir, sizeof dir, problem, sizeof problem))
        return dir;
    /* A folder that can't be used turns the cache off: say so once per folder (every
     * program would be compiled again on every run, silently). */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static char said[768];
    bool say = false;
    if (dir[0]) {
        pthread_mutex_lock(&lock);
        if (strcmp(said, dir) != 0) {
            snprintf(said, sizeof said, "%s", dir);
            say = true;
        }
        pthread_mutex_unlock(&lock);
    }
    if (say)
        sci_log(SC_LOG_WARN,
                "the disk cache is off: %s; every program is compiled again on every run "
                "(point SAFECUDA_CACHE_DIR at a folder that can be written; SAFECUDA_CACHE=0 "
                "turns the cache off without this warning)",
                problem);
    return "";
}

sc_status sc_cache_info(sc_cache_props *props)
{
    SCI_CHECK_PTR("sc_cache_info", props);
    memset(props, 0, sizeof *props);
    char dir[768], problem[1024];
    props->on = sci_cache_state(dir, sizeof dir, problem, sizeof problem);
    snprintf(props->dir, sizeof props->dir, "%s", dir);
    snprintf(props->problem, sizeof props->problem, "%s", problem);
    return SC_OK;
}

void sci_cache_path(sci_hash key, char *path, size_t size)
{
    sci_cache_path_in(sci_cache_dir(), key, path, size);
}

void sci_cache_path_in(const char *dir, sci_hash key, char *path, size_t size)
{
    if (!dir || !dir[0]) {
        if (size)
            path[0] = '\0';
        return;
    }
    snprintf(path, size, "%s/%016llx%016llx.bin", dir, (unsigned long long)key.a,
             (unsigned long long)key.b);
}

static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    /* Only a regular file is an entry: a folder opens too, and its "size" at SEEK_END can
     * be LONG_MAX (ext4), which must not become an allocation. */
    struct stat st;
    char *data = NULL;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        size_t n = (size_t)st.st_size;
        if ((data = malloc(n)) && fread(data, 1, n, f) != n) {
            free(data);
            data = NULL;
        } else if (data) {
            *size = n;
        }
    }
    fclose(f);
    return data;
}

bool sci_cache_load(const char *path, sci_hash key, sci_cache_entry *out)
{
    memset(out, 0, sizeof *out);
    if (!path || !path[0])
        return false;
    size_t size = 0;
    char *data = read_file(path, &size);
    if (!data)
        return false;
    bool ok = false;
    header h;
    size_t pos = sizeof h;
    if (size < sizeof h + sizeof(uint64_t))
        goto done;
    memcpy(&h, data, sizeof h);
    uint64_t trailer;
    memcpy(&trailer, data + size - sizeof trailer, sizeof trailer);
    if (memcmp(h.magic, MAGIC, 8) != 0 || h.version != FORMAT_VERSION || h.key_a != key.a ||
        h.key_b != key.b || trailer != sci_checksum(data, size - sizeof trailer) ||
        h.n_names > 4096 || h.image_size == 0)
        goto done;
    out->is_ptx = (h.flags & 1u) != 0;
    out->n_names = h.n_names;
    if (h.n_names) {
        out->exprs = calloc(h.n_names, sizeof *out->exprs);
        out->lowered = calloc(h.n_names, sizeof *out->lowered);
        if (!out->exprs || !out->lowered)
            goto done;
    }
    size_t body_end = size - sizeof trailer;
    for (uint32_t i = 0; i < h.n_names; i++) {
        uint32_t lens[2];
        if (body_end - pos < sizeof lens)
            goto done;
        memcpy(lens, data + pos, sizeof lens);
        pos += sizeof lens;
        if (body_end - pos < (size_t)lens[0] + lens[1])
            goto done;
        out->exprs[i] = strndup(data + pos, lens[0]);
        out->lowered[i] = strndup(data + pos + lens[0], lens[1]);
        pos += (size_t)lens[0] + lens[1];
        if (!out->exprs[i] || !out->lowered[i])
            goto done;
    }
    if (body_end - pos != h.image_size ||
        sci_checksum(data + pos, h.image_size) != h.image_checksum)
        goto done;
    out->image = malloc(h.image_size);
    if (!out->image)
        goto done;
    memcpy(out->image, data + pos, h.image_size);
    out->image_size = h.image_size;
    if (out->is_ptx && out->image[out->image_size - 1] != '\0')
        goto done;
    ok = true;
done:
    free(data);
    if (!ok)
        sci_cache_entry_free(out);
    return ok;
}

static bool write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

bool sci_cache_store(const char *path, sci_hash key, const sci_cache_entry *e)
{
    if (!path || !path[0])
        return false;
    /* Build the whole entry in memory, then write it to a unique temporary file. */
    size_t size = sizeof(header) + e->image_size + sizeof(uint64_t);
    for (size_t i = 0; i < e->n_names; i++)
        size += 2 * sizeof(uint32_t) + strlen(e->exprs[i]) + strlen(e->lowered[i]);
    char *data = malloc(size);
    if (!data)
        return false;
    header h = {0};
    memcpy(h.magic, MAGIC, 8);
    h.version = FORMAT_VERSION;
    h.flags = e->is_ptx ? 1u : 0u;
    h.key_a = key.a;
    h.key_b = key.b;
    h.image_size = e->image_size;
    h.image_checksum = sci_checksum(e->image, e->image_size);
    h.n_names = (uint32_t)e->n_names;
    size_t pos = 0;
    memcpy(data, &h, sizeof h);
    pos += sizeof h;
    for (size_t i = 0; i < e->n_names; i++) {
        uint32_t lens[2] = {(uint32_t)strlen(e->exprs[i]), (uint32_t)strlen(e->lowered[i])};
        memcpy(data + pos, lens, sizeof lens);
        pos += sizeof lens;
        memcpy(data + pos, e->exprs[i], lens[0]);
        pos += lens[0];
        memcpy(data + pos, e->lowered[i], lens[1]);
        pos += lens[1];
    }
    memcpy(data + pos, e->image, e->image_size);
    pos += e->image_size;
    uint64_t trailer = sci_checksum(data, pos);
    memcpy(data + pos, &trailer, sizeof trailer);

    char tmp[1200];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%lx", path, (long)getpid(),
             (unsigned long)(ts.tv_nsec ^ (long)(uintptr_t)&ts));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    bool ok = false;
    int err = errno;
    if (fd >= 0) {
        ok = write_all(fd, data, size) && fsync(fd) == 0;
        err = errno;
        if (close(fd) != 0 && ok) {
            ok = false;
            err = errno;
        }
        if (ok && rename(tmp, path) != 0) {
            ok = false;
            err = errno;
        }
        if (!ok)
            unlink(tmp);
    }
    free(data);
    if (!ok)
        errno = err ? err : EIO;
    return ok;
}
