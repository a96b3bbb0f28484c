/* NVRTC programs: options, compilation, the log, the disk cache. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compile/program.h"
#include "core/library.h"
#include "core/log.h"
#include "driver/driver.h"

#define MAX_OPTIONS 64

static sc_status program_destroy(sci_object *obj, const char *fn);

static void describe_program(const sci_object *obj, sc_object_info *info)
{
    const sci_program *p = (const sci_program *)obj;
    snprintf(info->detail, sizeof info->detail, "%s for %s_%d%s",
             p->out.is_ptx ? "PTX" : "cubin", p->out.is_ptx ? "compute" : "sm", p->arch,
             p->arch_specific ? "a" : "");
    info->bytes = p->out.image_size;
}


static const sci_kind_ops program_ops = {"program", describe_program, program_destroy};

__attribute__((constructor)) static void register_program_kind(void)
{
    sci_registry_set_ops(SCI_KIND_PROGRAM, &program_ops);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The newest architecture NVRTC supports that is not newer than arch (0 if none). */
static int best_supported(int arch)
{
    for (int a = arch; a >= 50; a--)
        if (sci_nvrtc_supports_arch(a))
            return a;
    return 0;
}

/* "name(12): error: ..." : the first error line of an NVRTC log. */
static void first_error(const char *log, char *out, size_t size)
{
    out[0] = '\0';
    const char *hit = strstr(log, ": error");
    if (!hit)
        hit = strstr(log, "error");
    if (!hit)
        return;
    const char *start = hit;
    while (start > log && start[-1] != '\n')
        start--;
    const char *end = strchr(hit, '\n');
    size_t n = end ? (size_t)(end - start) : strlen(start);
    if (n >= size)
        n = size - 1;
    memcpy(out, start, n);
    out[n] = '\0';
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* Compile with NVRTC into p->out. */
static sc_status compile(sci_program *p, const sc_program_desc *d, const char *name,
                         const char *const *opts, int n_opts, const char *arch_text,
                         bool want_ptx, const char *fn)
{
    int n_headers = (int)d->n_headers;
    const char **hsrc = NULL, **hname = NULL;
    if (n_headers) {
        hsrc = calloc((size_t)n_headers, sizeof *hsrc);
        hname = calloc((size_t)n_headers, sizeof *hname);
        if (!hsrc || !hname) {
            free(hsrc);
            free(hname);
            return sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
        }
        for (int i = 0; i < n_headers; i++) {
            hsrc[i] = d->headers[i].source;
            hname[i] = d->headers[i].name;
        }
    }
    nvrtcProgram prog = NULL;
    nvrtcResult r = sci_nvrtcCreateProgram(&prog, d->source, name, n_headers, hsrc, hname);
    free(hsrc);
    free(hname);
    if (r != NVRTC_SUCCESS)
        return sci_fail(SC_ERR_COMPILE, fn, "nvrtcCreateProgram('%s') failed: %s", name,
                        sci_nvrtc_error_string(r));
    sc_status s = SC_OK;
    size_t n_names = 0;
    if (d->name_expressions)
        while (d->name_expressions[n_names])
            n_names++;
    for (size_t i = 0; i < n_names && r == NVRTC_SUCCESS; i++)
        r = sci_nvrtcAddNameExpression(prog, d->name_expressions[i]);
    if (r != NVRTC_SUCCESS) {
        s = sci_fail(SC_ERR_COMPILE, fn, "nvrtcAddNameExpression failed: %s",
                     sci_nvrtc_error_string(r));
        goto out;
    }
    nvrtcResult cr = sci_nvrtcCompileProgram(prog, n_opts, opts);
    size_t log_size = 0;
    sci_nvrtcGetProgramLogSize(prog, &log_size);
    p->log = calloc(log_size + 1, 1);
    if (p->log && log_size)
        sci_nvrtcGetProgramLog(prog, p->log);
    if (cr != NVRTC_SUCCESS) {
        char first[512];
        const char *log = p->log ? p->log : "";
        const size_t log_len = strlen(log);
        first_error(log, first, sizeof first);
        const char *what = first[0] ? first : sci_nvrtc_error_string(cr);
        s = sci_fail(SC_ERR_COMPILE, fn, "'%s' failed to compile for %s: %s", name, arch_text,
                     what);
        if (log_len) {
            sci_error_append("\n--- NVRTC log (%zu bytes) ---\n%s", log_len, log);
            if (sci_error_was_cut()) {
                /* Not lost: the whole log goes through the log callback (first, as the
                 * callback may set messages of its own), and the message says so. */
                sci_log(SC_LOG_ERROR,
                        "%s: the NVRTC log of '%s' for %s (%zu bytes), too long for the error "
                        "message:\n%s",
                        fn, name, arch_text, log_len, log);
                s = sci_fail(SC_ERR_COMPILE, fn, "'%s' failed to compile for %s: %s", name,
                             arch_text, what);
                sci_error_append("\n--- NVRTC log (%zu bytes; too long for this message: the "
                                 "whole log went to the log callback) ---\n%s",
                                 log_len, log);
            }
        }
        goto out;
    }
    size_t size = 0;
    p->out.is_ptx = want_ptx;
    r = want_ptx ? sci_nvrtcGetPTXSize(prog, &size) : sci_nvrtcGetCUBINSize(prog, &size);
    if (r == NVRTC_SUCCESS && size) {
        p->out.image = malloc(size);
        if (!p->out.image) {
            s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
            goto out;
        }
        r = want_ptx ? sci_nvrtcGetPTX(prog, p->out.image) : sci_nvrtcGetCUBIN(prog, p->out.image);
        p->out.image_size = size;
    }
    if (r != NVRTC_SUCCESS || !size) {
        s = sci_fail(SC_ERR_COMPILE, fn, "'%s': reading the compiled image failed: %s", name,
                     sci_nvrtc_error_string(r));
        goto out;
    }
    if (n_names) {
        p->out.exprs = calloc(n_names, sizeof *p->out.exprs);
        p->out.lowered = calloc(n_names, sizeof *p->out.lowered);
        if (!p->out.exprs || !p->out.lowered) {
            s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
            goto out;
        }
        p->out.n_names = n_names;
        for (size_t i = 0; i < n_names; i++) {
            const char *lowered = NULL;
            r = sci_nvrtcGetLoweredName(prog, d->name_expressions[i], &lowered);
            if (r != NVRTC_SUCCESS || !lowered) {
                s = sci_fail(SC_ERR_COMPILE, fn,
                             "'%s': no lowered name for the name expression '%s': %s", name,
                             d->name_expressions[i], sci_nvrtc_error_string(r));
                goto out;
            }
            p->out.exprs[i] = dup_or_null(d->name_expressions[i]);
            p->out.lowered[i] = dup_or_null(lowered);
        }
    }
out:
    sci_nvrtcDestroyProgram(&prog);
    return s;
}

static void program_free(sci_program *p)
{
    sci_cache_entry_free(&p->out);
    free(p->log);
    free(p);
}

sc_status sc_program_create_at(sc_context ctx, const sc_program_desc *desc, sc_program *program,
                               const char *file, int line)
{
    return sci_program_create(ctx, desc, NULL, program, file, line);
}

sc_status sci_program_create(sc_context ctx, const sc_program_desc *desc,
                             const sci_program_how *how, sc_program *program, const char *file,
                             int line)
{
    static const sci_program_how defaults = {0};
    if (!how)
        how = &defaults;
    const char *fn = how->fn ? how->fn : "sc_program_create";
    SCI_CHECK_PTR(fn, program);
    program->id = 0;
    SCI_CHECK_PTR(fn, desc);
    if (!desc->source)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->source is NULL");
    if (desc->n_headers && !desc->headers)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->headers is NULL but n_headers is %zu",
                        desc->n_headers);
    for (size_t i = 0; i < desc->n_headers; i++)
        if (!desc->headers[i].name || !desc->headers[i].source)
            return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "header %zu has a NULL name or source",
                            i);
    if (ctx.id == 0 && desc->arch == 0)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                        "a compile-only program (zero context) needs desc->arch (e.g. 90)");
    if (desc->arch != 0 && (desc->arch < 50 || desc->arch > 1000))
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "desc->arch %d is not an architecture "
                        "(write 90 for sm_90)", desc->arch);
    const char *name = desc->name && desc->name[0] ? desc->name : "program.cu";
    size_t n_user = 0;
    if (desc->options)
        while (desc->options[n_user])
            n_user++;
    if (n_user > MAX_OPTIONS - 8)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "too many options (%zu; at most %d)", n_user,
                        MAX_OPTIONS - 8);

    sci_context *c = NULL;
    sc_status s;
    if (ctx.id) {
        s = sci_context_acquire(ctx, fn, &c);
        if (s != SC_OK)
            return s;
        /* sm_90a code loads on compute capability 9.0 only. */
        const int device_arch = c->props.cc_major * 10 + c->props.cc_minor;
        if (desc->arch_specific && desc->arch && desc->arch != device_arch) {
            s = sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                         "desc->arch_specific: sm_%da code runs only on compute capability "
                         "%d.%d; the context's device %d is %d.%d (sm_%d); a compile-only "
                         "program (zero context) may target any architecture",
                         desc->arch, desc->arch / 10, desc->arch % 10, c->device,
                         c->props.cc_major, c->props.cc_minor, device_arch);
            goto fail_ctx;
        }
    }
    int arch = desc->arch ? desc->arch : c->props.cc_major * 10 + c->props.cc_minor;
    if (desc->arch_specific && arch < SC_ARCH_SPECIFIC_MIN) {
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "desc->arch_specific: sm_%d has no architecture-specific form (sm_XYa "
                     "exists for sm_%d and newer)",
                     arch, SC_ARCH_SPECIFIC_MIN);
        goto fail_ctx;
    }
    if ((s = sci_compiler_ready(fn)) != SC_OK)
        goto fail_ctx;

    int target = best_supported(arch);
    if (target == 0) {
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn, "NVRTC (%s) supports no architecture up to sm_%d",
                     sci_nvrtc_library_path(), arch);
        goto fail_ctx;
    }
    /* Architecture-specific code runs on its own architecture only: PTX for an older one
     * (the fallback below) would not run where it is meant to. */
    if (desc->arch_specific && target != arch) {
        int major = 0, minor = 0;
        sci_nvrtcVersion(&major, &minor);
        s = sci_fail(SC_ERR_NOT_SUPPORTED, fn,
                     "desc->arch_specific: sm_%da needs an NVRTC that knows sm_%d; NVRTC %d.%d "
                     "(%s) knows up to sm_%d",
                     arch, arch, major, minor, sci_nvrtc_library_path(), target);
        goto fail_ctx;
    }
    /* cubin for the exact architecture when NVRTC knows it; PTX otherwise (JIT-compiled by
     * the driver for the device), and for a context of the test device (which reads the
     * kernels' parameters from PTX). */
    bool want_ptx = desc->ptx || target != arch || !sci_nvrtc_has_cubin() ||
                    (ctx.id && sci_driver_ptx_only());
    char arch_opt[48], arch_text[32];
    const char *suffix = desc->arch_specific ? "a" : "";
    snprintf(arch_opt, sizeof arch_opt, "-arch=%s_%d%s", want_ptx ? "compute" : "sm", target,
             suffix);
    snprintf(arch_text, sizeof arch_text, "%s_%d%s", want_ptx ? "compute" : "sm", target, suffix);
    const char *opts[MAX_OPTIONS];
    int n_opts = 0;
    opts[n_opts++] = "-std=c++17";
    opts[n_opts++] = "-default-device";
    opts[n_opts++] = arch_opt;
    if (desc->fast_math)
        opts[n_opts++] = "--use_fast_math";
    for (size_t i = 0; i < n_user; i++)
        opts[n_opts++] = desc->options[i];

    sci_program *p = calloc(1, sizeof *p);
    if (!p) {
        s = sci_fail(SC_ERR_HOST_OUT_OF_MEMORY, fn, "out of host memory");
        goto fail_ctx;
    }
    p->ctx = c;
    p->arch = target;
    p->arch_specific = desc->arch_specific;

    /* The cache key: everything that can change the image. */
    int nv_major = 0, nv_minor = 0;
    sci_nvrtcVersion(&nv_major, &nv_minor);
    sci_hash h;
    sci_hash_init(&h);
    sci_hash_str(&h, "safecuda program cache v1");
    sci_hash_bytes(&h, &nv_major, sizeof nv_major);
    sci_hash_bytes(&h, &nv_minor, sizeof nv_minor);
    sci_hash_str(&h, want_ptx ? "ptx" : "cubin");
    for (int i = 0; i < n_opts; i++)
        sci_hash_str(&h, opts[i]);
    sci_hash_str(&h, "|");
    sci_hash_str(&h, name);
    sci_hash_str(&h, desc->source);
    for (size_t i = 0; i < desc->n_headers; i++) {
        sci_hash_str(&h, desc->headers[i].name);
        sci_hash_str(&h, desc->headers[i].source);
    }
    sci_hash_str(&h, "|");
    for (size_t i = 0; desc->name_expressions && desc->name_expressions[i]; i++)
        sci_hash_str(&h, desc->name_expressions[i]);
    sci_hash key = sci_hash_final(&h);

    double t0 = now_ms();
    bool use_cache = !desc->no_cache;
    if (use_cache && how->cache_dir)
        sci_cache_path_in(how->cache_dir, key, p->cache_path, sizeof p->cache_path);
    else if (use_cache)
        sci_cache_path(key, p->cache_path, sizeof p->cache_path);
    if (use_cache && p->cache_path[0] && sci_cache_load(p->cache_path, key, &p->out) &&
        p->out.is_ptx == want_ptx) {
        p->from_cache = true;
        p->log = calloc(1, 1);
    } else {
        sci_cache_entry_free(&p->out);
        s = compile(p, desc, name, opts, n_opts, arch_text, want_ptx, fn);
        if (s != SC_OK) {
            program_free(p);
            goto fail_ctx;
        }
        if (want_ptx) { /* keep PTX NUL-terminated inside image_size */
            if (p->out.image[p->out.image_size - 1] != '\0') {
                char *grown = realloc(p->out.image, p->out.image_size + 1);
                if (grown) {
                    grown[p->out.image_size] = '\0';
                    p->out.image = grown;
                    p->out.image_size++;
                }
            }
        }
        if (use_cache && p->cache_path[0] && !sci_cache_store(p->cache_path, key, &p->out) &&
            how->must_store) {
            s = sci_fail(SC_ERR_IO, fn, "'%s' compiled for %s, but its cache entry %s could "
                         "not be written: %s", name, arch_text, p->cache_path, strerror(errno));
            program_free(p);
            goto fail_ctx;
        }
    }
    p->compile_ms = now_ms() - t0;
    s = sci_registry_insert(&p->obj, SCI_KIND_PROGRAM, c ? c->obj.id : 0, name, file, line, fn);
    if (s != SC_OK) {
        program_free(p);
        goto fail_ctx;
    }
    program->id = p->obj.id;
    s = SC_OK;
fail_ctx:
    if (c)
        sci_context_release(c);
    return s;
}

/* The program's part of its destroy (sci_kind_ops.destroy), once unpublished. */
static sc_status program_destroy(sci_object *obj, const char *fn)
{
    (void)fn;
    program_free((sci_program *)obj);
    return SC_OK;
}

sc_status sc_program_destroy(sc_program program)
{
    /* The context's pin is not for its sake (a program does not use it once compiled), but
     * so that sc_context_destroy, listing its programs, never finds one gone under it. */
    return sci_object_destroy(SCI_KIND_PROGRAM, program.id, NULL, "sc_program_destroy");
}

sc_status sci_program_acquire(sc_program h, const char *fn, sci_program **out)
{
    sci_object *obj = NULL;
    sc_status s = sci_registry_acquire(SCI_KIND_PROGRAM, h.id, fn, &obj);
    if (s == SC_OK)
        *out = (sci_program *)obj;
    return s;
}

void sci_program_release(sci_program *p) { sci_registry_release(&p->obj); }

const char *sci_program_lowered(const sci_program *p, const char *expr)
{
    for (size_t i = 0; i < p->out.n_names; i++)
        if (strcmp(p->out.exprs[i], expr) == 0)
            return p->out.lowered[i];
    return NULL;
}

sc_status sc_program_info(sc_program program, sc_program_props *props)
{
    static const char fn[] = "sc_program_info";
    SCI_CHECK_PTR(fn, props);
    sci_program *p = NULL;
    sc_status s = sci_program_acquire(program, fn, &p);
    if (s != SC_OK)
        return s;
    memset(props, 0, sizeof *props);
    props->arch = p->arch;
    props->arch_specific = p->arch_specific;
    props->is_ptx = p->out.is_ptx;
    props->from_cache = p->from_cache;
    props->image_bytes = p->out.image_size;
    props->compile_ms = p->compile_ms;
    snprintf(props->cache_path, sizeof props->cache_path, "%s", p->cache_path);
    sci_program_release(p);
    return SC_OK;
}

sc_status sc_program_log(sc_program program, char *buf, size_t size, size_t *needed)
{
    static const char fn[] = "sc_program_log";
    if (size && !buf)
        return sci_fail(SC_ERR_INVALID_ARGUMENT, fn, "buf is NULL but size is %zu", size);
    sci_program *p = NULL;
    sc_status s = sci_program_acquire(program, fn, &p);
    if (s != SC_OK)
        return s;
    const char *log = p->log ? p->log : "";
    size_t n = strlen(log);
    if (needed)
        *needed = n + 1;
    if (size) {
        size_t k = n < size - 1 ? n : size - 1;
        memcpy(buf, log, k);
        buf[k] = '\0';
    }
    sci_program_release(p);
    return SC_OK;
}

sc_status sc_program_image(sc_program program, const void **image, uint64_t *bytes)
{
    static const char fn[] = "sc_program_image";
    SCI_CHECK_PTR(fn, image);
    SCI_CHECK_PTR(fn, bytes);
    sci_program *p = NULL;
    sc_status s = sci_program_acquire(program, fn, &p);
    if (s != SC_OK)
        return s;
    *image = p->out.image;
    *bytes = p->out.image_size;
    sci_program_release(p);
    return SC_OK;
}

sc_status sc_program_lowered_name(sc_program program, const char *name_expression,
                                  const char **lowered)
{
    static const char fn[] = "sc_program_lowered_name";
    SCI_CHECK_PTR(fn, name_expression);
    SCI_CHECK_PTR(fn, lowered);
    sci_program *p = NULL;
    sc_status s = sci_program_acquire(program, fn, &p);
    if (s != SC_OK)
        return s;
    *lowered = sci_program_lowered(p, name_expression);
    if (!*lowered)
        s = sci_fail(SC_ERR_INVALID_ARGUMENT, fn,
                     "'%s' is not a name expression of program '%s' (created at %s:%d)",
                     name_expression, p->obj.label, sci_basename(p->obj.file), p->obj.line);
    sci_program_release(p);
    return s;
}
