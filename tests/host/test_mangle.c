/* Kernel parameter types from mangled names (checked against g++'s manglings and
 * c++filt's reading of them). */
#include "../test.h"
#include "launch/mangle.h"

typedef struct expect {
    const char *mangled;
    int n;
    const char *texts[8];
    sc_dtype dtypes[8];
    sci_param_kind kinds[8];
} expect;

#define P SCI_PARAM_POINTER
#define S SCI_PARAM_SCALAR
#define O SCI_PARAM_OTHER

static const expect cases[] = {
    {"_Z2k1PKfS0_Pfi", 4, {"const float*", "const float*", "float*", "int"},
     {SC_F32, SC_F32, SC_F32, SC_I32}, {P, P, P, S}},
    {"_Z2k2PfS_PKfS1_yd", 6,
     {"float*", "float*", "const float*", "const float*", "unsigned long long", "double"},
     {SC_F32, SC_F32, SC_F32, SC_F32, SC_U64, SC_F64}, {P, P, P, P, S, S}},
    {"_Z2k3PK6__halfPS_PK13__nv_bfloat16PS3_", 4,
     {"const __half*", "__half*", "const __nv_bfloat16*", "__nv_bfloat16*"},
     {SC_F16, SC_F16, SC_BF16, SC_BF16}, {P, P, P, P}},
    {"_Z2k46ParamsPKS_PS_Pf", 4, {"Params", "const Params*", "Params*", "float*"},
     {SC_DTYPE_INVALID, SC_DTYPE_INVALID, SC_DTYPE_INVALID, SC_F32}, {O, P, P, P}},
    {"_Z2k5v", 0, {0}, {0}, {0}},
    {"_Z2k6PKfPfj", 3, {"const float*", "float*", "unsigned int"}, {SC_F32, SC_F32, SC_U32},
     {P, P, S}},
    {"_Z2k7PKiS0_PKjS2_PKlPl", 6,
     {"const int*", "const int*", "const unsigned int*", "const unsigned int*", "const long*",
      "long*"},
     {SC_I32, SC_I32, SC_U32, SC_U32, SC_I64, SC_I64}, {P, P, P, P, P, P}},
    {"_Z2tkI6__halfLi128EEvPKT_PS1_S3_l", 4,
     {"const __half*", "__half*", "const __half*", "long"}, {SC_F16, SC_F16, SC_F16, SC_I64},
     {P, P, P, S}},
    {"_Z5scaleIdEvPT_S0_i", 3, {"double*", "double", "int"}, {SC_F64, SC_F64, SC_I32},
     {P, S, S}},
    {"_Z5scaleIfEvPT_S0_i", 3, {"float*", "float", "int"}, {SC_F32, SC_F32, SC_I32}, {P, S, S}},
    {"_ZN2ns5inner2f1EPKfPfi", 3, {"const float*", "float*", "int"}, {SC_F32, SC_F32, SC_I32},
     {P, P, S}},
    /* cuda_fp8.h's classes: e4m3 and e5m2 are dtypes; by value they are structs (size
     * checks only); the vector and e8m0 classes have no dtype; __nv_fp8_storage_t is
     * unsigned char (u8). */
    {"_Z2k8PK13__nv_fp8_e4m3PS_PK13__nv_fp8_e5m2PS3_j", 5,
     {"const __nv_fp8_e4m3*", "__nv_fp8_e4m3*", "const __nv_fp8_e5m2*", "__nv_fp8_e5m2*",
      "unsigned int"},
     {SC_F8E4M3, SC_F8E4M3, SC_F8E5M2, SC_F8E5M2, SC_U32}, {P, P, P, P, S}},
    {"_Z1kI13__nv_fp8_e4m3EvPKT_PS1_j", 3,
     {"const __nv_fp8_e4m3*", "__nv_fp8_e4m3*", "unsigned int"},
     {SC_F8E4M3, SC_F8E4M3, SC_U32}, {P, P, S}},
    {"_Z1kI13__nv_fp8_e5m2EvPKT_PS1_j", 3,
     {"const __nv_fp8_e5m2*", "__nv_fp8_e5m2*", "unsigned int"},
     {SC_F8E5M2, SC_F8E5M2, SC_U32}, {P, P, S}},
    {"_Z1qI13__nv_fp8_e4m313__nv_fp8_e5m2EvPKT_PT0_PKfi", 4,
     {"const __nv_fp8_e4m3*", "__nv_fp8_e5m2*", "const float*", "int"},
     {SC_F8E4M3, SC_F8E5M2, SC_F32, SC_I32}, {P, P, P, S}},
    {"_Z2k913__nv_fp8_e4m313__nv_fp8_e5m2Pf", 3, {"__nv_fp8_e4m3", "__nv_fp8_e5m2", "float*"},
     {SC_DTYPE_INVALID, SC_DTYPE_INVALID, SC_F32}, {O, O, P}},
    {"_Z2kaPK15__nv_fp8x2_e4m3P13__nv_fp8_e8m0PKh", 3,
     {"const __nv_fp8x2_e4m3*", "__nv_fp8_e8m0*", "const unsigned char*"},
     {SC_DTYPE_INVALID, SC_DTYPE_INVALID, SC_U8}, {P, P, P}},
    {"_Z3vvvPvPKvPPf", 3, {"void*", "const void*", "pointer to pointer"},
     {SC_DTYPE_INVALID, SC_DTYPE_INVALID, SC_DTYPE_INVALID}, {P, P, O}},
};

int main(void)
{
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const expect *e = &cases[c];
        sci_param_type t[16];
        int n = sci_demangle_params(e->mangled, t, 16);
        if (n != e->n) {
            fprintf(stderr, "%s: %d parameters, expected %d\n", e->mangled, n, e->n);
            test_failures++;
            continue;
        }
        for (int i = 0; i < n; i++) {
            if (strcmp(t[i].text, e->texts[i]) != 0 || t[i].dtype != e->dtypes[i] ||
                t[i].kind != e->kinds[i]) {
                fprintf(stderr, "%s parameter %d: got '%s' %s kind %d, expected '%s' %s kind %d\n",
                        e->mangled, i, t[i].text, sc_dtype_name(t[i].dtype), t[i].kind,
                        e->texts[i], sc_dtype_name(e->dtypes[i]), e->kinds[i]);
                test_failures++;
            }
        }
        CHECK(n == 0 || t[0].is_const == (strncmp(e->texts[0], "const", 5) == 0));
    }
    /* Not mangled, or not understood: -1 (the launch then checks sizes only). */
    sci_param_type t[4];
    CHECK(sci_demangle_params("vector_add", t, 4) == -1);
    CHECK(sci_demangle_params("", t, 4) == -1);
    CHECK(sci_demangle_params(NULL, t, 4) == -1);
    CHECK(sci_demangle_params("_Z", t, 4) == -1);
    CHECK(sci_demangle_params("_Z3fooPK", t, 4) == -1);
    CHECK(sci_demangle_params("_Z3fooS5_", t, 4) == -1); /* substitution never defined */
    CHECK(sci_demangle_params("_Z99foo", t, 4) == -1);   /* name longer than the string */
    CHECK(sci_demangle_params("_Z1fIJifEEvDpT_", t, 4) == -1); /* packs: not decoded */
    /* More parameters than room: the count is still right. */
    CHECK(sci_demangle_params("_Z2k2PfS_PKfS1_yd", t, 2) == 6);
    return test_result("test_mangle");
}
