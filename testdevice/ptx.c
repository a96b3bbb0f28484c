/* The test device's PTX reader: from PTX text, each `.entry` kernel's name, parameter
 * offsets and sizes, .maxntid / .reqntid, cluster directives and static shared memory; no
 * instruction is read (kernels never run). */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testdevice_internal.h"

/* ---- modules: a small PTX reader ------------------------------------------------------------- */

static const char *skip_space(const char *p, const char *end)
{
    for (;;) {
        while (p < end && isspace((unsigned char)*p))
            p++;
        if (p + 1 < end && p[0] == '/' && p[1] == '/') {
            while (p < end && *p != '\n')
                p++;
        } else if (p + 1 < end && p[0] == '/' && p[1] == '*') {
            const char *c = p + 2;
            while (c + 1 < end && !(c[0] == '*' && c[1] == '/'))
                c++;
            p = c + 1 < end ? c + 2 : end;
        } else {
            return p;
        }
    }
}

/* The next token: a word of [A-Za-z0-9_.$%] or one punctuation character. */
static const char *token(const char *p, const char *end, const char **tok, size_t *len)
{
    p = skip_space(p, end);
    *tok = p;
    if (p >= end) {
        *len = 0;
        return p;
    }
    const char *q = p;
    while (q < end && (isalnum((unsigned char)*q) || *q == '_' || *q == '.' || *q == '$' ||
                       *q == '%'))
        q++;
    if (q == p)
        q++;
    *len = (size_t)(q - p);
    return q;
}

static int tok_is(const char *tok, size_t len, const char *word)
{
    return strlen(word) == len && memcmp(tok, word, len) == 0;
}

static size_t type_size(const char *tok, size_t len)
{
    static const struct {
        const char *name;
        size_t size;
    } types[] = {
        {".u64", 8}, {".s64", 8}, {".b64", 8}, {".f64", 8}, {".u32", 4}, {".s32", 4},
        {".b32", 4}, {".f32", 4}, {".u16", 2}, {".s16", 2}, {".b16", 2}, {".f16", 2},
        {".u8", 1},  {".s8", 1},  {".b8", 1},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (tok_is(tok, len, types[i].name))
            return types[i].size;
    return 0;
}

void free_module(fake_module *m)
{
    for (int i = 0; i < m->n_funcs; i++) {
        set_remove(&funcs, m->funcs[i]);
        free(m->funcs[i]->name);
        free(m->funcs[i]);
    }
    free(m->funcs);
    free(m);
}

/* Parse the parameter list after "(" up to ")"; p points after "(". */
static const char *parse_params(const char *p, const char *end, fake_func *f, int *ok)
{
    size_t offset = 0;
    *ok = 0;
    for (;;) {
        const char *t;
        size_t n;
        p = token(p, end, &t, &n);
        if (n == 0)
            return p;
        if (tok_is(t, n, ")")) {
            *ok = 1;
            return p;
        }
        if (tok_is(t, n, ","))
            continue;
        if (!tok_is(t, n, ".param"))
            return p;
        size_t align = 0, size = 0, count = 1;
        int named = 0;
        for (;;) { /* the parameter's qualifiers, type, name and [N] */
            const char *save = p;
            p = token(p, end, &t, &n);
            if (n == 0)
                return p;
            if (tok_is(t, n, ",") || tok_is(t, n, ")")) {
                p = save;
                break;
            }
            if (tok_is(t, n, ".align")) {
                p = token(p, end, &t, &n);
                align = (size_t)strtoul(t, NULL, 10);
            } else if (type_size(t, n)) {
                size = type_size(t, n);
            } else if (tok_is(t, n, "[")) {
                p = token(p, end, &t, &n);
                count = (size_t)strtoul(t, NULL, 10);
                p = token(p, end, &t, &n); /* "]" */
            } else if (t[0] != '.') {
                named = 1;
            } /* .ptr, .global, ... : ignored */
        }
        if (!size || !named || f->n_params == MAX_PARAMS)
            return p;
        if (!align)
            align = size;
        offset = (offset + align - 1) / align * align;
        f->offset[f->n_params] = offset;
        f->size[f->n_params] = size * count;
        offset += size * count;
        f->n_params++;
    }
}

/* Up to three comma-separated numbers (the ones left out are 1). */
static const char *parse_dims(const char *p, const char *end, long dims[3])
{
    dims[0] = dims[1] = dims[2] = 1;
    for (int k = 0; k < 3; k++) {
        const char *t;
        size_t n;
        p = token(p, end, &t, &n);
        dims[k] = n ? strtol(t, NULL, 10) : 0;
        const char *save = p;
        p = token(p, end, &t, &n);
        if (!tok_is(t, n, ",")) {
            p = save;
            break;
        }
    }
    return p;
}

/* The PTX text's kernels; NULL on a parse error (no entry, bad parameter list). */
fake_module *parse_ptx(const char *text, char *log, size_t log_size)
{
    const char *end = text + strlen(text);
    fake_module *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->magic = MODULE_MAGIC;
    int version = 0;
    const char *v = strstr(text, ".version");
    if (v) {
        unsigned major = 0, minor = 0;
        if (sscanf(v + 8, " %u.%u", &major, &minor) == 2)
            version = (int)(major * 10 + minor);
    }
    if (!v || !strstr(text, ".target")) {
        if (log)
            snprintf(log, log_size, "safecuda test device: not PTX (no .version / .target directive)");
        free(m);
        return NULL;
    }
    const char *p = text;
    for (;;) {
        const char *t;
        size_t n;
        p = token(p, end, &t, &n);
        if (n == 0)
            break;
        if (!tok_is(t, n, ".entry"))
            continue;
        const char *name;
        size_t name_len;
        p = token(p, end, &name, &name_len);
        fake_func *f = calloc(1, sizeof *f);
        fake_func **grown = realloc(m->funcs, (size_t)(m->n_funcs + 1) * sizeof *grown);
        if (!f || !grown || name_len == 0 || !(isalpha((unsigned char)name[0]) ||
                                               name[0] == '_' || name[0] == '$')) {
            free(f);
            if (grown)
                m->funcs = grown;
            if (log)
                snprintf(log, log_size, "safecuda test device: bad .entry name");
            free_module(m);
            return NULL;
        }
        m->funcs = grown;
        m->funcs[m->n_funcs++] = f;
        f->magic = FUNC_MAGIC;
        f->module = m;
        f->name = strndup(name, name_len);
        f->max_threads = 1024;
        f->ptx_version = version;
        const char *paren;
        size_t plen;
        const char *after = token(p, end, &paren, &plen);
        if (plen && tok_is(paren, plen, "(")) {
            int ok;
            p = parse_params(after, end, f, &ok);
            if (!ok) {
                if (log)
                    snprintf(log, log_size, "safecuda test device: bad parameter list of .entry %s",
                             f->name);
                free_module(m);
                return NULL;
            }
        }
        /* Performance directives up to the body: .maxntid X, Y, Z; the cluster a
         * __cluster_dims__ kernel requires (.reqnctapercluster X, Y, Z) and whether a
         * launch must give one (.explicitcluster). */
        for (;;) {
            const char *save = p;
            p = token(p, end, &t, &n);
            if (n == 0 || tok_is(t, n, "{") || tok_is(t, n, ";")) {
                p = save;
                break;
            }
            if (tok_is(t, n, ".maxntid") || tok_is(t, n, ".reqntid")) {
                long dims[3];
                p = parse_dims(p, end, dims);
                long prod = dims[0] * dims[1] * dims[2];
                if (prod > 0 && prod < f->max_threads)
                    f->max_threads = (int)prod;
            } else if (tok_is(t, n, ".reqnctapercluster")) {
                long dims[3];
                p = parse_dims(p, end, dims);
                for (int k = 0; k < 3; k++)
                    f->req_cluster[k] = dims[k] > 0 && dims[k] <= 1024 ? (unsigned)dims[k] : 0;
                f->req_cluster_in_ptx = 1;
            } else if (tok_is(t, n, ".explicitcluster")) {
                f->explicit_cluster = 1;
            }
        }
        /* Static shared memory in the body: .shared .align A .b8 NAME[N]; */
        const char *t2;
        size_t n2;
        const char *body = token(p, end, &t2, &n2);
        if (n2 && tok_is(t2, n2, "{")) {
            int depth = 1;
            const char *q = body;
            while (q < end && depth > 0) {
                q = token(q, end, &t2, &n2);
                if (n2 == 0)
                    break;
                if (tok_is(t2, n2, "{"))
                    depth++;
                else if (tok_is(t2, n2, "}"))
                    depth--;
                else if (tok_is(t2, n2, ".shared")) {
                    size_t size = 0, count = 1;
                    for (;;) {
                        q = token(q, end, &t2, &n2);
                        if (n2 == 0 || tok_is(t2, n2, ";"))
                            break;
                        if (type_size(t2, n2))
                            size = type_size(t2, n2);
                        else if (tok_is(t2, n2, "[")) {
                            q = token(q, end, &t2, &n2);
                            count = (size_t)strtoul(t2, NULL, 10);
                        }
                    }
                    f->static_shared += (int)(size * count);
                }
            }
            p = q;
        }
        f->max_dynamic_shared = 48 * 1024 - f->static_shared;
        if (f->max_dynamic_shared < 0)
            f->max_dynamic_shared = 0;
    }
    return m;
}
