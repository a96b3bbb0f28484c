/* --arch's value for safecuda compile and safecuda precompile: one parser, one rule and one
 * message for every refusal (what was asked, why not, the targets NVRTC builds, and that the
 * architecture-specific sm_XYa exists for sm_90 and newer). */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tool.h"

/* sm_XY[a], compute_XY[a], XY[a] or native; XY two or three digits. 0: a target; 1: not a
 * target; 2: family-specific (sm_XYf, t->arch set). */
static int parse(const char *text, target *t)
{
    memset(t, 0, sizeof *t);
    if (strcmp(text, "native") == 0)
        return 0;
    const char *p = text;
    if (strncmp(p, "sm_", 3) == 0) {
        p += 3;
    } else if (strncmp(p, "compute_", 8) == 0) {
        p += 8;
        t->ptx = true;
    }
    int digits = 0, value = 0;
    while (p[digits] >= '0' && p[digits] <= '9' && digits < 4)
        value = value * 10 + (p[digits++] - '0');
    if (digits < 2 || digits > 3)
        return 1;
    p += digits;
    t->arch = value;
    if (p[0] == 'f' && p[1] == '\0')
        return 2;
    if (p[0] == 'a') {
        t->specific = true;
        p++;
    }
    return *p == '\0' ? 0 : 1;
}

/* The one refusal: "safecuda CMD: OPT 'TEXT': WHY. RANGE; the a form's rule." */
__attribute__((format(printf, 5, 6))) static bool refuse(const char *cmd, const char *opt,
                                                         const char *text, const char *range,
                                                         const char *why, ...)
{
    fprintf(stderr, "safecuda %s: %s '%s': ", cmd, opt, text);
    va_list ap;
    va_start(ap, why);
    vfprintf(stderr, why, ap);
    va_end(ap);
    fprintf(stderr,
            ". %s; sm_XYa and compute_XYa (architecture-specific) exist for sm_%d and newer\n",
            range, SC_ARCH_SPECIFIC_MIN);
    return false;
}

bool target_parse(const char *cmd, const char *opt, const char *text, target_use use, bool ptx,
                  target *t)
{
    /* What NVRTC builds, when it can be loaded (else the syntax and the fixed rules only). */
    int archs[64];
    size_t n = 0;
    int major = 0, minor = 0;
    char range[1024];
    if (sc_compiler_version(&major, &minor) == SC_OK &&
        sc_compiler_archs(archs, 64, &n) == SC_OK && n > 0 && n <= 64) {
        int len = snprintf(range, sizeof range, "NVRTC %d.%d builds sm_%d to sm_%d (", major,
                           minor, archs[0], archs[n - 1]);
        for (size_t i = 0; i < n && len > 0 && (size_t)len < sizeof range; i++)
            len += snprintf(range + len, sizeof range - (size_t)len, "%s%d", i ? ", " : "",
                            archs[i]);
        if (len > 0 && (size_t)len < sizeof range)
            snprintf(range + len, sizeof range - (size_t)len, ")");
    } else {
        n = 0;
        snprintf(range, sizeof range, "NVRTC can't be loaded to list the targets it builds (%s)",
                 sc_last_error());
    }

    int kind = parse(text, t);
    if (kind == 1)
        return refuse(cmd, opt, text, range,
                      use == TARGET_COMPILE
                          ? "not a target: write sm_XY, sm_XYa, compute_XY, compute_XYa, XY or "
                            "native (e.g. sm_90, sm_90a, compute_90)"
                          : "not a target: write sm_XY, sm_XYa, XY or native, the device's "
                            "architecture (e.g. sm_90a, sm_90, sm_80)");
    if (kind == 2)
        return refuse(cmd, opt, text, range,
                      "family-specific targets (sm_XYf) are not supported: write sm_%da (sm_%d "
                      "only) or sm_%d",
                      t->arch, t->arch, t->arch);
    if (t->arch == 0) /* native: the device's, checked by the library */
        return true;
    if (use == TARGET_DEVICE && t->ptx)
        return refuse(cmd, opt, text, range,
                      "the library loads cubins on a device, so PTX targets (compute_XY) are "
                      "not offered: write sm_%d",
                      t->arch);
    if (t->specific && t->arch < SC_ARCH_SPECIFIC_MIN)
        return refuse(cmd, opt, text, range, "sm_%d has no architecture-specific form",
                      t->arch);
    const int oldest = n ? archs[0] : 50;
    if (t->arch < oldest)
        return refuse(cmd, opt, text, range,
                      "older than sm_%d, the oldest architecture %s builds", oldest,
                      n ? "NVRTC" : "any NVRTC");
    bool built = n == 0;
    int below = 0;
    for (size_t i = 0; i < n; i++) {
        built |= archs[i] == t->arch;
        if (archs[i] < t->arch)
            below = archs[i];
    }
    /* The library builds PTX for the newest architecture below one NVRTC does not build: on
     * a device (precompile) that is what it runs; asked for a cubin, it is not what was asked. */
    if (built || use == TARGET_DEVICE)
        return true;
    if (t->specific)
        return refuse(cmd, opt, text, range,
                      "architecture-specific code needs an NVRTC that builds sm_%d (PTX for an "
                      "older architecture would not have its features)",
                      t->arch);
    if (!t->ptx && !ptx)
        return refuse(cmd, opt, text, range,
                      "NVRTC builds no cubin for sm_%d; the newest architecture it builds below "
                      "it is sm_%d: --ptx (or compute_%d) writes PTX for compute_%d, which the "
                      "driver compiles for sm_%d when it loads it",
                      t->arch, below, t->arch, below, t->arch);
    return true;
}
