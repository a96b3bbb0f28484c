/* npy: numpy's .npy files, read and written (npy.h says what is taken and refused). */
#include "npy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define MAGIC "\x93NUMPY"
#define MAGIC_LEN 6
#define MAX_HEADER (1u << 20) /* numpy's own limit is far below: a header is a few lines */

typedef struct dtype_info {
    const char *descr;
    size_t size;
} dtype_info;

static const dtype_info dtypes[] = {{"<u2", 2}, {"<f4", 4}, {"<i4", 4}};

__attribute__((format(printf, 3, 4))) static bool fail(char *err, size_t size,
                                                       const char *fmt, ...)
{
    if (err && size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, size, fmt, ap);
        va_end(ap);
    }
    return false;
}

static const dtype_info *dtype_named(const char *descr)
{
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtypes[i].descr, descr) == 0)
            return &dtypes[i];
    return NULL;
}

void npy_shape_text(int ndim, const uint64_t *shape, char *buf, size_t size)
{
    if (!size)
        return;
    size_t n = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%" PRIu64, i ? ", " : "", shape[i]);
    if (n < size)
        snprintf(buf + n, size - n, "%s)", ndim == 1 ? "," : "");
}

/* ---- the header: a Python dict literal --------------------------------------------------- */

typedef struct cursor {
    const char *s, *end;
} cursor;

static void skip_space(cursor *c)
{
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r'))
        c->s++;
}

static bool take(cursor *c, char ch)
{
    skip_space(c);
    if (c->s < c->end && *c->s == ch) {
        c->s++;
        return true;
    }
    return false;
}

/* A quoted string ('...' or "...", no escapes) into out. */
static bool string(cursor *c, char *out, size_t size)
{
    skip_space(c);
    if (c->s >= c->end || (*c->s != '\'' && *c->s != '"'))
        return false;
    const char q = *c->s++;
    size_t n = 0;
    while (c->s < c->end && *c->s != q) {
        if (*c->s == '\\' || (unsigned char)*c->s < 0x20 || n + 1 >= size)
            return false;
        out[n++] = *c->s++;
    }
    if (c->s >= c->end)
        return false;
    c->s++;
    out[n] = '\0';
    return true;
}

static bool word(cursor *c, const char *w)
{
    skip_space(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->s) < n || memcmp(c->s, w, n) != 0)
        return false;
    const char *after = c->s + n;
    if (after < c->end && (*after == '_' || (*after >= 'a' && *after <= 'z') ||
                           (*after >= 'A' && *after <= 'Z') || (*after >= '0' && *after <= '9')))
        return false;
    c->s = after;
    return true;
}

/* A tuple of non-negative integers: (), (5,), (3, 4), (3, 4,); Python 2's 3L taken too. */
static bool shape_tuple(cursor *c, int *ndim, uint64_t *shape, char *why, size_t why_size)
{
    if (!take(c, '('))
        return fail(why, why_size, "'shape' is not a tuple");
    *ndim = 0;
    bool comma = false; /* a ',' followed the last integer */
    for (;;) {
        if (take(c, ')'))
            break;
        skip_space(c);
        if (c->s >= c->end || *c->s < '0' || *c->s > '9')
            return fail(why, why_size,
                        "'shape' holds something other than non-negative integers");
        uint64_t v = 0;
        while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
            if (v > (UINT64_MAX - 9) / 10)
                return fail(why, why_size, "a dimension of 'shape' is too large");
            v = v * 10 + (uint64_t)(*c->s++ - '0');
        }
        if (c->s < c->end && *c->s == 'L')
            c->s++;
        if (*ndim == NPY_MAX_DIMS)
            return fail(why, why_size, "'shape' has more than %d dimensions", NPY_MAX_DIMS);
        shape[(*ndim)++] = v;
        comma = take(c, ',');
        if (comma)
            continue;
        if (take(c, ')'))
            break;
        return fail(why, why_size, "'shape' is not a tuple of integers");
    }
    if (*ndim == 1 && !comma) /* (5) is the integer 5 in Python: numpy writes (5,) */
        return fail(why, why_size, "'shape' is (N) without a comma, which is not a tuple");
    return true;
}

/* Parse the dict of hdr[0..len) into n (descr, ndim, shape). */
static bool parse_header(npy_file *n, const char *hdr, size_t len, char *why, size_t why_size)
{
    cursor c = {hdr, hdr + len};
    if (len == 0 || hdr[len - 1] != '\n')
        return fail(why, why_size, "the header does not end with a newline");
    if (!take(&c, '{'))
        return fail(why, why_size, "the header is not a dict");
    bool have_descr = false, have_order = false, have_shape = false;
    for (;;) {
        if (take(&c, '}'))
            break;
        char key[32];
        if (!string(&c, key, sizeof key))
            return fail(why, why_size, "a key of the header is not a short quoted string");
        if (!take(&c, ':'))
            return fail(why, why_size, "no ':' after the header's key '%s'", key);
        if (strcmp(key, "descr") == 0) {
            if (have_descr)
                return fail(why, why_size, "the header repeats 'descr'");
            char d[64];
            if (!string(&c, d, sizeof d))
                return fail(why, why_size,
                            "'descr' is not a string (a structured dtype?): only '<u2', "
                            "'<f4' and '<i4' are read");
            const dtype_info *dt = dtype_named(d);
            if (!dt)
                return fail(why, why_size,
                            "dtype '%s' is not read: only '<u2' (bf16 bit patterns: "
                            "array.view(numpy.uint16)), '<f4' and '<i4', little-endian",
                            d);
            memcpy(n->descr, dt->descr, strlen(dt->descr) + 1);
            have_descr = true;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_order)
                return fail(why, why_size, "the header repeats 'fortran_order'");
            if (word(&c, "True"))
                return fail(why, why_size,
                            "fortran_order is True: only C order is read "
                            "(numpy.ascontiguousarray before saving)");
            if (!word(&c, "False"))
                return fail(why, why_size, "'fortran_order' is not True or False");
            have_order = true;
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape)
                return fail(why, why_size, "the header repeats 'shape'");
            if (!shape_tuple(&c, &n->ndim, n->shape, why, why_size))
                return false;
            have_shape = true;
        } else {
            return fail(why, why_size, "unexpected key '%s' in the header", key);
        }
        if (take(&c, ','))
            continue;
        if (take(&c, '}'))
            break;
        return fail(why, why_size, "no ',' or '}' after the header's '%s'", key);
    }
    skip_space(&c);
    if (c.s != c.end)
        return fail(why, why_size, "something other than spaces follows the header's dict");
    if (!have_descr || !have_order || !have_shape)
        return fail(why, why_size, "the header lacks '%s'",
                    !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    return true;
}

/* ---- reading -------------------------------------------------------------------------------- */

bool npy_open(npy_file *n, const char *path, char *err, size_t err_size)
{
    memset(n, 0, sizeof *n);
    n->path = path;
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(err, err_size, "%s: can't open: %s", path, strerror(errno));
    unsigned char pre[MAGIC_LEN + 2 + 4];
    char why[256] = "";
    size_t got = fread(pre, 1, MAGIC_LEN + 2, f);
    uint64_t hlen = 0, start = 0;
    if (got < MAGIC_LEN + 2 || memcmp(pre, MAGIC, MAGIC_LEN) != 0) {
        snprintf(why, sizeof why, "not a .npy file (no \\x93NUMPY magic at its start)");
    } else if (pre[7] != 0 || pre[6] < 1 || pre[6] > 3) {
        snprintf(why, sizeof why, "format version %u.%u is not read (1.0, 2.0 and 3.0 are)",
                 pre[6], pre[7]);
    } else {
        const size_t lbytes = pre[6] == 1 ? 2 : 4;
        if (fread(pre + MAGIC_LEN + 2, 1, lbytes, f) != lbytes) {
            snprintf(why, sizeof why, "the file ends inside the header length");
        } else {
            for (size_t i = 0; i < lbytes; i++)
                hlen |= (uint64_t)pre[MAGIC_LEN + 2 + i] << (8 * i);
            start = MAGIC_LEN + 2 + lbytes;
            if (hlen == 0 || hlen > MAX_HEADER)
                snprintf(why, sizeof why, "header length %" PRIu64 " is not 1 .. %u", hlen,
                         MAX_HEADER);
        }
    }
    char *hdr = NULL;
    if (!why[0]) {
        hdr = malloc(hlen + 1);
        if (!hdr)
            snprintf(why, sizeof why, "out of host memory for the header");
        else if (fread(hdr, 1, hlen, f) != hlen)
            snprintf(why, sizeof why,
                     "the file ends inside the header (%" PRIu64 " bytes announced)", hlen);
        else if (memchr(hdr, '\0', hlen))
            snprintf(why, sizeof why, "the header holds a NUL byte");
    }
    if (!why[0]) {
        hdr[hlen] = '\0';
        if (parse_header(n, hdr, hlen, why, sizeof why)) {
            n->elem_size = dtype_named(n->descr)->size;
            n->data_offset = start + hlen;
            n->count = 1;
            for (int i = 0; i < n->ndim && !why[0]; i++) {
                if (n->shape[i] && n->count > UINT64_MAX / n->shape[i])
                    snprintf(why, sizeof why, "shape overflows 64 bits");
                else
                    n->count *= n->shape[i];
            }
            if (!why[0] && n->count > (UINT64_MAX - n->data_offset) / n->elem_size)
                snprintf(why, sizeof why, "shape's bytes overflow 64 bits");
        }
    }
    free(hdr);
    if (!why[0]) {
        off_t size = -1;
        if (fseeko(f, 0, SEEK_END) == 0)
            size = ftello(f);
        const uint64_t want = n->data_offset + n->count * n->elem_size;
        char sh[160];
        npy_shape_text(n->ndim, n->shape, sh, sizeof sh);
        if (size < 0)
            snprintf(why, sizeof why, "can't find its size: %s", strerror(errno));
        else if ((uint64_t)size < want)
            snprintf(why, sizeof why,
                     "truncated: %" PRIu64 " bytes, but header (%" PRIu64 " bytes) + %s %s "
                     "needs %" PRIu64,
                     (uint64_t)size, n->data_offset, n->descr, sh, want);
        else if ((uint64_t)size > want)
            snprintf(why, sizeof why,
                     "%" PRIu64 " bytes after the data of %s %s (header %" PRIu64
                     " bytes): not one array",
                     (uint64_t)size - want, n->descr, sh, n->data_offset);
        else if (fseeko(f, (off_t)n->data_offset, SEEK_SET) != 0)
            snprintf(why, sizeof why, "can't seek to its data: %s", strerror(errno));
    }
    if (why[0]) {
        fclose(f);
        memset(n, 0, sizeof *n);
        return fail(err, err_size, "%s: %s", path, why);
    }
    n->f = f;
    return true;
}

bool npy_expect(const npy_file *n, const char *descr, int ndim, const uint64_t *shape,
                const char *what, char *err, size_t err_size)
{
    bool ok = strcmp(n->descr, descr) == 0 && n->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = n->shape[i] == shape[i];
    if (ok)
        return true;
    char got[160], want[160];
    npy_shape_text(n->ndim, n->shape, got, sizeof got);
    npy_shape_text(ndim, shape, want, sizeof want);
    return fail(err, err_size, "%s: holds %s %s, expected %s %s%s%s%s", n->path, n->descr, got,
                descr, want, what ? " (" : "", what ? what : "", what ? ")" : "");
}

bool npy_read(npy_file *n, void *dst, uint64_t elems, char *err, size_t err_size)
{
    if (!n->f)
        return fail(err, err_size, "%s: not open", n->path ? n->path : "npy");
    if (elems > n->count - n->next)
        return fail(err, err_size,
                    "%s: %" PRIu64 " elements asked for, %" PRIu64 " of %" PRIu64 " left",
                    n->path, elems, n->count - n->next, n->count);
    const size_t bytes = (size_t)(elems * n->elem_size);
    size_t got = bytes ? fread(dst, 1, bytes, n->f) : 0;
    if (got != bytes)
        return fail(err, err_size, "%s: read failed after element %" PRIu64 ": %s", n->path,
                    n->next + got / n->elem_size,
                    ferror(n->f) ? strerror(errno) : "the file ended (changed while read?)");
    n->next += elems;
    return true;
}

void npy_close(npy_file *n)
{
    if (n->f)
        fclose(n->f);
    n->f = NULL;
}

/* ---- writing -------------------------------------------------------------------------------- */

bool npy_create(npy_writer *w, const char *path, const char *descr, int ndim,
                const uint64_t *shape, char *err, size_t err_size)
{
    memset(w, 0, sizeof *w);
    w->path = path;
    const dtype_info *d = dtype_named(descr);
    if (!d)
        return fail(err, err_size, "%s: dtype '%s' is not written ('<u2', '<f4', '<i4')",
                    path, descr);
    if (ndim < 0 || ndim > NPY_MAX_DIMS)
        return fail(err, err_size, "%s: %d dimensions (0 .. %d)", path, ndim, NPY_MAX_DIMS);
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] && count > UINT64_MAX / d->size / shape[i])
            return fail(err, err_size, "%s: the shape's bytes overflow 64 bits", path);
        count *= shape[i];
    }
    char sh[NPY_MAX_DIMS * 22 + 8];
    npy_shape_text(ndim, shape, sh, sizeof sh);
    char dict[sizeof sh + 96];
    int dn = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                      descr, sh);
    /* magic + version + 2-byte length + dict + padding + '\n': a multiple of 64 bytes. */
    size_t pre = MAGIC_LEN + 2 + 2, hlen = (size_t)dn + 1;
    hlen += (64 - (pre + hlen) % 64) % 64;
    unsigned char head[MAGIC_LEN + 4 + sizeof dict + 64];
    memcpy(head, MAGIC, MAGIC_LEN);
    head[MAGIC_LEN] = 1;
    head[MAGIC_LEN + 1] = 0;
    head[MAGIC_LEN + 2] = (unsigned char)(hlen & 0xff);
    head[MAGIC_LEN + 3] = (unsigned char)(hlen >> 8);
    memcpy(head + pre, dict, (size_t)dn);
    memset(head + pre + dn, ' ', hlen - (size_t)dn - 1);
    head[pre + hlen - 1] = '\n';
    FILE *f = fopen(path, "wb");
    if (!f)
        return fail(err, err_size, "%s: can't create: %s", path, strerror(errno));
    if (fwrite(head, 1, pre + hlen, f) != pre + hlen) {
        int e = errno;
        fclose(f);
        remove(path);
        return fail(err, err_size, "%s: writing the header failed: %s", path, strerror(e));
    }
    w->f = f;
    w->elem_size = d->size;
    w->count = count;
    return true;
}

bool npy_write(npy_writer *w, const void *src, uint64_t elems, char *err, size_t err_size)
{
    if (!w->f)
        return fail(err, err_size, "%s: not open for writing", w->path ? w->path : "npy");
    if (elems > w->count - w->written)
        return fail(err, err_size,
                    "%s: %" PRIu64 " more elements given, the shape has room for %" PRIu64,
                    w->path, elems, w->count - w->written);
    const size_t bytes = (size_t)(elems * w->elem_size);
    if (bytes && fwrite(src, 1, bytes, w->f) != bytes)
        return fail(err, err_size, "%s: write failed: %s", w->path, strerror(errno));
    w->written += elems;
    return true;
}

bool npy_finish(npy_writer *w, char *err, size_t err_size)
{
    if (!w->f)
        return fail(err, err_size, "%s: not open for writing", w->path ? w->path : "npy");
    if (w->written != w->count) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: %" PRIu64 " of %" PRIu64 " elements written", w->path,
                 w->written, w->count);
        npy_abandon(w);
        return fail(err, err_size, "%s (file removed)", msg);
    }
    int r = fclose(w->f);
    w->f = NULL;
    if (r != 0) {
        int e = errno;
        remove(w->path);
        return fail(err, err_size, "%s: closing failed: %s (file removed)", w->path,
                    strerror(e));
    }
    return true;
}

void npy_abandon(npy_writer *w)
{
    if (w->f) {
        fclose(w->f);
        remove(w->path);
    }
    w->f = NULL;
}
