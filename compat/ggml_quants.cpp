// ggml_quants: ggml's own block conversions, for checking llamacmp's (compat/gen_quant_goldens.py).
//   ggml_quants to_float TYPE IN.bin OUT.bin     blocks of TYPE -> float32, ggml_get_type_traits(TYPE)->to_float
//   ggml_quants from_float TYPE IN.bin OUT.bin   float32 -> blocks of TYPE, ggml_get_type_traits_cpu(TYPE)->from_float
//   ggml_quants vec_dot TYPE N W.bin X.bin OUT.bin  rows of N values: TYPE blocks (w) . float32 (x) -> float32
//                                                   [x rows, w rows]: x converted to the vec_dot_type, then vec_dot
// TYPE is a ggml type name (q4_K, iq4_xs, q8_1, ...; any case). from_float is what the CPU backend's mul_mat uses to
// quantize activations to a weight's vec_dot_type (the x86 SIMD version where this build has one). The inputs are
// raw little-endian files; their length must be a whole number of blocks. Built by compat/build_oracle_tools.sh.
#include "ggml.h"
#include "ggml-cpu.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <strings.h>
#include <vector>

static int fail(const char * msg) { fprintf(stderr, "ggml_quants: %s\n", msg); return 1; }

static bool type_by_name(const char * name, ggml_type * out) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && !strcasecmp(n, name)) { *out = (ggml_type) t; return true; }
    }
    return false;
}

static std::vector<char> read_all(const char * path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// Every row of x (float32, n values) dotted with every row of w (TYPE blocks, n values), as the CPU mul_mat does
// it: x converted once to the type's vec_dot_type by its from_float, then one vec_dot per pair.
static int vec_dot(const char * type_name, int64_t n, const char * w_path, const char * x_path, const char * out_path) {
    ggml_type type;
    if (!type_by_name(type_name, &type)) return fail("unknown ggml type name");
    ggml_cpu_init();
    const auto * traits = ggml_get_type_traits_cpu(type);
    const ggml_type vt = traits->vec_dot_type;
    const size_t w_row = ggml_row_size(type, n), x_row = ggml_row_size(vt, n);
    std::vector<char> w = read_all(w_path), x = read_all(x_path);
    if (n <= 0 || n % ggml_blck_size(type) || n % ggml_blck_size(vt) || w.empty() || w.size() % w_row ||
        x.empty() || x.size() % (n * sizeof(float))) return fail("sizes are not whole rows of whole blocks");
    const int64_t nw = (int64_t) (w.size() / w_row), nx = (int64_t) (x.size() / (n * sizeof(float)));
    std::vector<char> xq(nx * x_row);
    for (int64_t i = 0; i < nx; i++)
        ggml_get_type_traits_cpu(vt)->from_float((const float *) x.data() + i * n, xq.data() + i * x_row, n);
    std::vector<float> out(nx * nw);
    for (int64_t i = 0; i < nx; i++)
        for (int64_t j = 0; j < nw; j++)
            traits->vec_dot((int) n, &out[i * nw + j], 0, w.data() + j * w_row, 0, xq.data() + i * x_row, 0, 1);
    std::ofstream(out_path, std::ios::binary).write((const char *) out.data(), (std::streamsize) (out.size() * 4));
    return 0;
}

int main(int argc, char ** argv) {
    if (argc == 7 && !strcmp(argv[1], "vec_dot")) return vec_dot(argv[2], atoll(argv[3]), argv[4], argv[5], argv[6]);
    if (argc != 5) return fail("usage: ggml_quants to_float|from_float TYPE IN OUT | vec_dot TYPE N W X OUT");
    ggml_type type;
    if (!type_by_name(argv[2], &type)) return fail("unknown ggml type name");
    ggml_cpu_init();
    const size_t bs = ggml_blck_size(type), ts = ggml_type_size(type);
    std::vector<char> in = read_all(argv[3]);
    std::vector<char> out;
    if (!strcmp(argv[1], "to_float")) {
        const auto * traits = ggml_get_type_traits(type);
        if (!traits->to_float) return fail("type has no to_float");
        if (in.empty() || in.size() % ts) return fail("input is not a whole number of blocks");
        const int64_t n = (int64_t) (in.size() / ts * bs);
        out.resize(n * sizeof(float));
        traits->to_float(in.data(), (float *) out.data(), n);
    } else if (!strcmp(argv[1], "from_float")) {
        const auto * traits = ggml_get_type_traits_cpu(type);
        if (!traits->from_float) return fail("type has no CPU from_float");
        if (in.empty() || in.size() % (bs * sizeof(float))) return fail("input is not a whole number of blocks");
        const int64_t n = (int64_t) (in.size() / sizeof(float));
        out.resize(n / bs * ts);
        traits->from_float((const float *) in.data(), out.data(), n);
    } else {
        return fail("mode must be to_float or from_float");
    }
    std::ofstream(argv[4], std::ios::binary).write(out.data(), (std::streamsize) out.size());
    return 0;
}
