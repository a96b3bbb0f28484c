// The public headers used from C++17: every macro and inline helper compiles (with
// -Wall -Wextra -Werror -pedantic, under g++ and clang++) and works. Runs against the test
// device (host memory: nothing here says anything about a GPU).
#include <safecuda.h>
#include <safecuda/moe.h>
#include <safecuda/quant.h>
#include <safecuda/interop.h>
#include <safecuda/comm.h>

#include <cstdio>
#include <cstring>
#include <vector>

static int failures;

#define EXPECT(cond)                                                                  \
    do {                                                                              \
        if (!(cond)) {                                                                \
            std::fprintf(stderr, "%s:%d: EXPECT failed: %s (last error: %s)\n", __FILE__, \
                         __LINE__, #cond, sc_last_error());                           \
            failures++;                                                               \
        }                                                                             \
    } while (0)

// add(const float *a, float *b, unsigned n) as PTX: what the test device reads.
static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                          ".visible .entry add(\n"
                          "    .param .u64 add_param_0,\n"
                          "    .param .u64 add_param_1,\n"
                          "    .param .u32 add_param_2\n"
                          ")\n{\n    ret;\n}\n";

int main()
{
    sc_context ctx{};
    sc_context_desc cd{};
    cd.device = 0;
    if (sc_context_create(&cd, &ctx) != SC_OK) {
        std::printf("test_cxx_header: skipped: %s\n", sc_last_error());
        return 77;
    }
    const int n = 256;
    sc_buffer a{}, b{};
    sc_buffer_desc bd{};
    bd.dtype = SC_F32;
    bd.count = n;
    bd.label = "a";
    EXPECT(sc_buffer_create(ctx, &bd, &a) == SC_OK);
    bd.label = "b";
    EXPECT(sc_buffer_create(ctx, &bd, &b) == SC_OK);

    std::vector<float> host(n), back(n, -1.0f);
    for (int i = 0; i < n; i++)
        host[i] = 0.5f * static_cast<float>(i) + 1.0f;
    EXPECT(sc_copy_from_host(SC_DEFAULT_STREAM, sc_view_of(a), host.data(),
                             host.size() * sizeof(float)) == SC_OK);
    EXPECT(sc_copy(SC_DEFAULT_STREAM, sc_view_of(b), sc_view_of(a)) == SC_OK);
    EXPECT(sc_copy_to_host(SC_DEFAULT_STREAM, back.data(), back.size() * sizeof(float),
                           sc_view_of(b)) == SC_OK);
    EXPECT(std::memcmp(host.data(), back.data(), host.size() * sizeof(float)) == 0);

    sc_view half{};
    EXPECT(sc_buffer_view(a, 0, n / 2, &half) == SC_OK);
    EXPECT(sc_copy_to_host(SC_DEFAULT_STREAM, back.data(), back.size() * sizeof(float), half) ==
           SC_ERR_OUT_OF_BOUNDS);

    sc_stream s{};
    sc_stream_desc sd{};
    sd.label = "side";
    EXPECT(sc_stream_create(ctx, &sd, &s) == SC_OK);
    sc_event e{};
    EXPECT(sc_event_create(ctx, nullptr, &e) == SC_OK);
    EXPECT(sc_event_record(e, s) == SC_OK);
    EXPECT(sc_stream_wait(s, e) == SC_OK);

    sc_module mod{};
    sc_kernel add{};
    EXPECT(sc_module_load_image(ctx, ptx, sizeof ptx, &mod) == SC_OK);
    EXPECT(sc_kernel_get(mod, "add", &add) == SC_OK);
    sc_launch_desc cfg{};
    cfg.grid = sc_dim3{1, 1, 1};
    cfg.block = sc_dim3{256, 1, 1};
    // SC_LAUNCH in C++: one argument too few is refused before the driver sees it.
    EXPECT(SC_LAUNCH(s, add, &cfg, sc_arg_in(sc_view_of(a)), sc_arg_inout(sc_view_of(b))) ==
           SC_ERR_LAUNCH);
    EXPECT(std::strstr(sc_last_error(), "takes 3 arguments but 2 were given") != nullptr);
    // The right list passes the checks (the test device then refuses to run it: kernels do not run there).
    sc_status launched = SC_LAUNCH(s, add, &cfg, sc_arg_in(sc_view_of(a)),
                                   sc_arg_inout(sc_view_of(b)), sc_arg_u32(n));
    EXPECT(launched == SC_ERR_NOT_SUPPORTED);
    EXPECT(std::strstr(sc_last_error(), "kernels do not run on the safecuda test device") != nullptr);
    EXPECT(sc_stream_synchronize(s) == SC_OK);

    // Every inline helper and type of the headers, used once.
    sc_arg args[] = {sc_arg_i32(-1), sc_arg_u32(1), sc_arg_i64(-2), sc_arg_u64(2),
                     sc_arg_f32(1.5f), sc_arg_f64(2.5), sc_arg_bytes(&n, sizeof n),
                     sc_arg_out(sc_view_of(a))};
    EXPECT(args[4].dtype == SC_F32 && args[6].size == sizeof n && args[7].kind == SC_ARG_OUT);
    sc_tensor_map map{};
    static_assert(alignof(sc_tensor_map) == 64, "the encoded map is 64-byte aligned");
    EXPECT(sc_arg_tensor_map_in(&map).kind == SC_ARG_TENSOR_MAP_IN);
    EXPECT(sc_arg_tensor_map_out(&map).size == 128);
    sc_moe_desc md{};
    md.experts = 0; // refused: the layer checks its desc
    sc_moe layer{};
    EXPECT(sc_moe_create(ctx, &md, &layer) == SC_ERR_INVALID_ARGUMENT);
    sc_quant_desc qd{};
    qd.rows = 1; // cols 0: refused
    EXPECT(sc_quantize_fp8_blocks(SC_DEFAULT_STREAM, &qd, sc_view_of(a), sc_view_of(a),
                                  sc_view_of(a)) == SC_ERR_INVALID_ARGUMENT);
    EXPECT(std::strcmp(sc_status_name(SC_ERR_STALE_HANDLE), "SC_ERR_STALE_HANDLE") == 0);
    EXPECT(sc_dtype_size(SC_BF16) == 2);
    // The interop macros and DLPack's types: b exported read-only and imported back.
    DLManagedTensorVersioned *t = nullptr;
    sc_dlpack_export_desc xd{};
    xd.read_only = true;
    EXPECT(sc_view_to_dlpack(sc_view_of(b), &xd, &t) == SC_OK && t != nullptr);
    sc_buffer again{};
    EXPECT(sc_buffer_from_dlpack(ctx, t, nullptr, &again) == SC_OK);
    sc_buffer_origin origin{};
    EXPECT(sc_buffer_get_origin(again, &origin) == SC_OK && origin.borrowed && origin.read_only);
    EXPECT(sc_buffer_destroy(again) == SC_OK); // its release runs the export's deleter
    DLDataType dl{};
    EXPECT(sc_dtype_to_dlpack(SC_BF16, &dl) == SC_OK && dl.code == kDLBfloat && dl.bits == 16);

    EXPECT(sc_module_destroy(mod) == SC_OK);
    EXPECT(sc_event_destroy(e) == SC_OK);
    EXPECT(sc_stream_destroy(s) == SC_OK);
    EXPECT(sc_buffer_destroy(a) == SC_OK);
    EXPECT(sc_copy(SC_DEFAULT_STREAM, sc_view_of(b), sc_view_of(a)) == SC_ERR_STALE_HANDLE);
    EXPECT(sc_buffer_destroy(b) == SC_OK);
    EXPECT(sc_context_destroy(ctx) == SC_OK);
    if (failures) {
        std::fprintf(stderr, "test_cxx_header: %d check(s) failed\n", failures);
        return 1;
    }
    std::printf("test_cxx_header: all checks passed\n");
    return 0;
}
