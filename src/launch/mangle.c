/* A small Itanium C++ ABI decoder for kernel parameter lists.
 *
 * Handles: plain, nested (N...E) and std (St) names; function templates (template args
 * I...E, the return type that then precedes the parameters, template parameters T_);
 * substitutions (S_, S<seq>_) with the ABI's candidate rules; builtin types; CV
 * qualifiers; pointers and references; class types by name (__half, __nv_bfloat16 and the
 * fp8 classes of cuda_fp8.h, __nv_fp8_e4m3 and __nv_fp8_e5m2). */
#include <stdio.h>
#include <string.h>

#include "launch/mangle.h"

enum { T_BUILTIN, T_CLASS, T_POINTER, T_QUAL, T_REF, T_TEMPLATE_ID };

typedef struct node {
    int tag;
    const char *s; /* builtin code or class name */
    int len;
    int child;     /* pointer/qual/ref: the inner type */
    bool is_const;
} node;

#define MAX_NODES 256
#define MAX_SUBS 128

typedef struct parser {
    const char *p, *end;
    node nodes[MAX_NODES];
    int n_nodes;
    int subs[MAX_SUBS]; /* node indices of substitution candidates */
    int n_subs;
    int targs[32];      /* the function's template arguments (node indices, -1 literal) */
    int n_targs;
    bool failed;
} parser;

static int add_node(parser *ps, node n)
{
    if (ps->n_nodes == MAX_NODES) {
        ps->failed = true;
        return 0;
    }
    ps->nodes[ps->n_nodes] = n;
    return ps->n_nodes++;
}

static void add_sub(parser *ps, int idx)
{
    if (ps->n_subs < MAX_SUBS)
        ps->subs[ps->n_subs++] = idx;
}

static int parse_number(parser *ps)
{
    int n = 0;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') {
        ps->failed = true;
        return 0;
    }
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
        n = n * 10 + (*ps->p++ - '0');
    return n;
}

static int parse_source_name(parser *ps)
{
    int len = parse_number(ps);
    if (ps->failed || len <= 0 || ps->end - ps->p < len) {
        ps->failed = true;
        return 0;
    }
    node n = {T_CLASS, ps->p, len, -1, false};
    ps->p += len;
    return add_node(ps, n);
}

/* S_ or S<base36>_ */
static int parse_substitution(parser *ps)
{
    ps->p++; /* 'S' */
    if (ps->p < ps->end && *ps->p == 't') { /* St: std:: prefix, then a name */
        ps->p++;
        return parse_source_name(ps);
    }
    int idx = 0;
    if (ps->p < ps->end && *ps->p == '_') {
        ps->p++;
    } else {
        int seq = 0;
        while (ps->p < ps->end && *ps->p != '_') {
            char c = *ps->p++;
            if (c >= '0' && c <= '9')
                seq = seq * 36 + (c - '0');
            else if (c >= 'A' && c <= 'Z')
                seq = seq * 36 + (c - 'A' + 10);
            else {
                ps->failed = true;
                return 0;
            }
        }
        if (ps->p >= ps->end) {
            ps->failed = true;
            return 0;
        }
        ps->p++;
        idx = seq + 1;
    }
    if (idx >= ps->n_subs) {
        ps->failed = true;
        return 0;
    }
    return ps->subs[idx];
}

static int parse_type(parser *ps);

/* I <args> E; records them as the function's template args when top is set. */
static void parse_template_args(parser *ps, bool top)
{
    ps->p++; /* 'I' */
    if (top)
        ps->n_targs = 0;
    while (!ps->failed && ps->p < ps->end && *ps->p != 'E') {
        int idx = -1;
        if (*ps->p == 'L') { /* literal: L <type> <value> E */
            ps->p++;
            parse_type(ps);
            while (ps->p < ps->end && *ps->p != 'E')
                ps->p++;
            if (ps->p >= ps->end) {
                ps->failed = true;
                return;
            }
            ps->p++;
        } else if (*ps->p == 'J') { /* pack: unsupported in parameter decoding */
            ps->failed = true;
            return;
        } else {
            idx = parse_type(ps);
        }
        if (top && ps->n_targs < 32)
            ps->targs[ps->n_targs++] = idx;
    }
    if (ps->p >= ps->end)
        ps->failed = true;
    else
        ps->p++; /* 'E' */
}

/* N [CV] <prefix components> E: each prefix is a substitution candidate. Returns the
 * node of the full name; *templated tells if the last component had template args. */
static int parse_nested(parser *ps, bool top, bool *templated)
{
    ps->p++; /* 'N' */
    while (ps->p < ps->end && (*ps->p == 'K' || *ps->p == 'V' || *ps->p == 'r'))
        ps->p++;
    int last = -1;
    *templated = false;
    while (!ps->failed && ps->p < ps->end && *ps->p != 'E') {
        if (*ps->p == 'S') {
            last = parse_substitution(ps);
            *templated = false;
            continue; /* a substitution is not a new candidate */
        }
        if (*ps->p == 'I') {
            parse_template_args(ps, top);
            node n = {T_TEMPLATE_ID, ps->nodes[last].s, ps->nodes[last].len, last, false};
            last = add_node(ps, n);
            *templated = true;
        } else if (*ps->p >= '0' && *ps->p <= '9') {
            last = parse_source_name(ps);
            *templated = false;
        } else {
            ps->failed = true;
            return 0;
        }
        /* Every prefix is a candidate, except the function's own final name. */
        if (ps->p < ps->end && *ps->p != 'E')
            add_sub(ps, last);
        else if (!top)
            add_sub(ps, last);
    }
    if (ps->p >= ps->end || last < 0) {
        ps->failed = true;
        return 0;
    }
    ps->p++; /* 'E' */
    return last;
}

static int builtin(parser *ps, const char *code, int len)
{
    node n = {T_BUILTIN, code, len, -1, false};
    return add_node(ps, n);
}

static int parse_type(parser *ps)
{
    if (ps->failed || ps->p >= ps->end) {
        ps->failed = true;
        return 0;
    }
    char c = *ps->p;
    switch (c) {
    case 'v': case 'w': case 'b': case 'c': case 'a': case 'h': case 's': case 't':
    case 'i': case 'j': case 'l': case 'm': case 'x': case 'y': case 'n': case 'o':
    case 'f': case 'd': case 'e': case 'g': case 'z':
        return builtin(ps, ps->p++, 1);
    case 'D': { /* Dh (half), DF16_ (_Float16), DF16b (bfloat16), Dn (nullptr_t) ... */
        const char *start = ps->p;
        ps->p++;
        if (ps->p < ps->end && *ps->p == 'F') {
            while (ps->p < ps->end && *ps->p != '_' && *ps->p != 'b')
                ps->p++;
            if (ps->p >= ps->end) {
                ps->failed = true;
                return 0;
            }
            ps->p++;
        } else if (ps->p < ps->end) {
            ps->p++;
        }
        return builtin(ps, start, (int)(ps->p - start));
    }
    case 'K': case 'V': case 'r': {
        bool is_const = false;
        while (ps->p < ps->end && (*ps->p == 'K' || *ps->p == 'V' || *ps->p == 'r')) {
            if (*ps->p == 'K')
                is_const = true;
            ps->p++;
        }
        int inner = parse_type(ps);
        node n = {T_QUAL, NULL, 0, inner, is_const};
        int idx = add_node(ps, n);
        add_sub(ps, idx);
        return idx;
    }
    case 'P': case 'R': case 'O': {
        ps->p++;
        int inner = parse_type(ps);
        node n = {c == 'P' ? T_POINTER : T_REF, NULL, 0, inner, false};
        int idx = add_node(ps, n);
        add_sub(ps, idx);
        return idx;
    }
    case 'S': {
        bool std_name = ps->end - ps->p > 1 && ps->p[1] == 't';
        int idx = parse_substitution(ps);
        if (std_name)
            add_sub(ps, idx);
        if (!ps->failed && ps->p < ps->end && *ps->p == 'I') { /* template-id on a sub */
            parse_template_args(ps, false);
            node n = {T_TEMPLATE_ID, ps->nodes[idx].s, ps->nodes[idx].len, idx, false};
            idx = add_node(ps, n);
            add_sub(ps, idx);
        }
        return idx;
    }
    case 'T': { /* T_ or T<n>_ : a template parameter (itself a candidate) */
        ps->p++;
        int k = 0;
        if (ps->p < ps->end && *ps->p != '_')
            k = parse_number(ps) + 1;
        if (ps->p >= ps->end || *ps->p != '_' || k >= ps->n_targs || ps->targs[k] < 0) {
            ps->failed = true;
            return 0;
        }
        ps->p++;
        int idx = ps->targs[k];
        add_sub(ps, idx);
        return idx;
    }
    case 'N': {
        bool templated;
        return parse_nested(ps, false, &templated);
    }
    default:
        if (c >= '0' && c <= '9') {
            int idx = parse_source_name(ps);
            add_sub(ps, idx);
            if (!ps->failed && ps->p < ps->end && *ps->p == 'I') {
                parse_template_args(ps, false);
                node n = {T_TEMPLATE_ID, ps->nodes[idx].s, ps->nodes[idx].len, idx, false};
                idx = add_node(ps, n);
                add_sub(ps, idx);
            }
            return idx;
        }
        ps->failed = true;
        return 0;
    }
}

static void builtin_info(const node *n, sc_dtype *dtype, const char **text)
{
    static const struct {
        const char *code;
        sc_dtype dtype;
        const char *text;
    } table[] = {
        {"v", SC_DTYPE_INVALID, "void"},   {"b", SC_DTYPE_INVALID, "bool"},
        {"c", SC_I8, "char"},              {"a", SC_I8, "signed char"},
        {"h", SC_U8, "unsigned char"},     {"s", SC_I16, "short"},
        {"t", SC_U16, "unsigned short"},   {"i", SC_I32, "int"},
        {"j", SC_U32, "unsigned int"},     {"l", SC_I64, "long"},
        {"m", SC_U64, "unsigned long"},    {"x", SC_I64, "long long"},
        {"y", SC_U64, "unsigned long long"}, {"f", SC_F32, "float"},
        {"d", SC_F64, "double"},           {"Dh", SC_F16, "half"},
        {"DF16_", SC_F16, "_Float16"},     {"DF16b", SC_BF16, "bfloat16"},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if ((int)strlen(table[i].code) == n->len && strncmp(table[i].code, n->s, n->len) == 0) {
            *dtype = table[i].dtype;
            *text = table[i].text;
            return;
        }
    }
    *dtype = SC_DTYPE_INVALID;
    *text = NULL;
}

/* Element type of a class name: the CUDA 16- and 8-bit float types (cuda_fp16.h,
 * cuda_bf16.h, cuda_fp8.h). Their vector forms (__half2, __nv_fp8x2_e4m3, ...) and the
 * other fp8 flavours (__nv_fp8_e8m0) have no sc_dtype. */
static sc_dtype class_dtype(const node *n)
{
    static const struct {
        const char *name;
        sc_dtype dtype;
    } table[] = {
        {"__half", SC_F16},
        {"__nv_bfloat16", SC_BF16},
        {"__nv_fp8_e4m3", SC_F8E4M3},
        {"__nv_fp8_e5m2", SC_F8E5M2},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if ((int)strlen(table[i].name) == n->len && strncmp(table[i].name, n->s, n->len) == 0)
            return table[i].dtype;
    return SC_DTYPE_INVALID;
}

/* Name of a non-pointer type for messages; sets *dtype. */
static void plain_type(const parser *ps, int idx, sc_dtype *dtype, bool *is_const, char *text,
                       size_t size)
{
    const node *n = &ps->nodes[idx];
    *is_const = false;
    if (n->tag == T_QUAL) {
        *is_const = n->is_const;
        n = &ps->nodes[n->child];
    }
    *dtype = SC_DTYPE_INVALID;
    if (n->tag == T_BUILTIN) {
        const char *t;
        builtin_info(n, dtype, &t);
        if (t)
            snprintf(text, size, "%s%s", *is_const ? "const " : "", t);
        else
            snprintf(text, size, "%s%.*s", *is_const ? "const " : "", n->len, n->s);
    } else if (n->tag == T_CLASS || n->tag == T_TEMPLATE_ID) {
        *dtype = n->tag == T_CLASS ? class_dtype(n) : SC_DTYPE_INVALID;
        snprintf(text, size, "%s%.*s%s", *is_const ? "const " : "", n->len, n->s,
                 n->tag == T_TEMPLATE_ID ? "<...>" : "");
    } else {
        snprintf(text, size, "%s", n->tag == T_POINTER ? "pointer" : "type");
    }
}

static void describe(const parser *ps, int idx, sci_param_type *out)
{
    memset(out, 0, sizeof *out);
    const node *n = &ps->nodes[idx];
    if (n->tag == T_QUAL) /* top-level const on a by-value parameter changes nothing */
        n = &ps->nodes[n->child];
    char inner[56];
    if (n->tag == T_POINTER) {
        const node *pointee = &ps->nodes[n->child];
        out->kind = SCI_PARAM_POINTER;
        if (pointee->tag == T_POINTER || (pointee->tag == T_QUAL &&
                                         ps->nodes[pointee->child].tag == T_POINTER)) {
            snprintf(out->text, sizeof out->text, "pointer to pointer");
            out->kind = SCI_PARAM_OTHER;
            return;
        }
        plain_type(ps, n->child, &out->dtype, &out->is_const, inner, sizeof inner);
        snprintf(out->text, sizeof out->text, "%s*", inner);
    } else if (n->tag == T_BUILTIN) {
        bool c;
        plain_type(ps, idx, &out->dtype, &c, out->text, sizeof out->text);
        out->kind = SCI_PARAM_SCALAR;
    } else {
        bool c;
        plain_type(ps, idx, &out->dtype, &c, inner, sizeof inner);
        snprintf(out->text, sizeof out->text, "%s%s", inner, n->tag == T_REF ? "&" : "");
        out->kind = SCI_PARAM_OTHER;
        out->dtype = SC_DTYPE_INVALID;
    }
}

int sci_demangle_params(const char *mangled, sci_param_type *out, int max)
{
    if (!mangled || strncmp(mangled, "_Z", 2) != 0)
        return -1;
    parser ps;
    memset(&ps, 0, sizeof ps);
    ps.p = mangled + 2;
    ps.end = mangled + strlen(mangled);
    bool templated = false;
    if (*ps.p == 'N') {
        parse_nested(&ps, true, &templated);
    } else if (*ps.p == 'S' && ps.p + 1 < ps.end && ps.p[1] == 't') {
        ps.p += 2;
        int idx = parse_source_name(&ps);
        if (!ps.failed && ps.p < ps.end && *ps.p == 'I') {
            add_sub(&ps, idx);
            parse_template_args(&ps, true);
            templated = true;
        }
    } else if (*ps.p >= '0' && *ps.p <= '9') {
        int idx = parse_source_name(&ps);
        if (!ps.failed && ps.p < ps.end && *ps.p == 'I') {
            add_sub(&ps, idx); /* an unscoped template name is a candidate */
            parse_template_args(&ps, true);
            templated = true;
        }
    } else {
        return -1;
    }
    if (ps.failed)
        return -1;
    if (templated)
        parse_type(&ps); /* the return type */
    int count = 0;
    if (ps.p < ps.end && *ps.p == 'v' && ps.p + 1 == ps.end)
        return 0; /* (void) */
    while (!ps.failed && ps.p < ps.end) {
        int idx = parse_type(&ps);
        if (ps.failed)
            return -1;
        if (count < max)
            describe(&ps, idx, &out[count]);
        count++;
    }
    return ps.failed ? -1 : count;
}
