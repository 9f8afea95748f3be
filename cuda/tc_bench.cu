// cuda/tc_bench.cu — `tc_bench`: times the cuda-tc kernel alone, for cuda/compare_tc.py.
//
//   tc_bench [--repeat R] [--warmup W] [--no-check] SPEC...
//   SPEC = B,H,N,d,causal,dtype[,tile]   e.g. 4,32,4096,64,1,f16  or  4,16,4096,128,0,f16,Br128w4-Bc64-s3
//                                        (tile: a name from tc_tile_shapes, "default" or "all")
//
// For each SPEC: random fp16/bf16 Q, K, V generated on the device (uniform, unit variance; never
// zeros, which run faster than real data), W warm-up launches, then R launches each timed with CUDA
// events; one JSON object per line with the median / min / max milliseconds and the throughput
// (FLOPs = 4 B H N^2 d, halved for causal). Unless --no-check, it also recomputes 16 random query
// rows in float64 on the host (from the same 16-bit inputs) and reports the largest error of O and
// LSE, so a fast but wrong configuration cannot go unnoticed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/tc_attention.hpp"
#include "cuda/tc_backend.hpp"
#include "cuda/check.hpp"
#include "cuda/device_buffer.hpp"

using namespace flashattn;
using namespace flashattn::tc;

namespace {

struct Spec {
    AttentionProblem problem;
    DType dtype = DType::f16;
    TcTileShape tile;
};

// One SPEC may expand to several runs: tile "all" means every compiled shape for (d, dtype).
std::vector<Spec> parse_spec(const std::string& text) {
    std::vector<std::string> f;
    std::stringstream ss(text);
    for (std::string item; std::getline(ss, item, ',');) f.push_back(item);
    if (f.size() != 6 && f.size() != 7)
        throw std::invalid_argument("spec = " + text + ": expected B,H,N,d,causal,dtype[,tile]");
    Spec s;
    AttentionProblem& p = s.problem;
    p.batch = std::stoll(f[0]);
    p.heads = p.heads_kv = std::stoll(f[1]);
    p.seq_q = p.seq_kv = std::stoll(f[2]);
    p.dim = std::stoll(f[3]);
    p.causal = f[4] == "1";
    s.dtype = parse_dtype(f[5]);
    tc_check_problem(p, s.dtype);
    const std::vector<TcTileShape> shapes = tc_tile_shapes(p.dim, s.dtype);
    const std::string tile = f.size() == 7 ? f[6] : "default";
    std::vector<Spec> runs;
    for (const TcTileShape& t : shapes)
        if (tile == "all" || t.name() == tile || (tile == "default" && t == shapes.front())) {
            s.tile = t;
            runs.push_back(s);
        }
    if (runs.empty()) throw std::invalid_argument("tile = " + tile + ": not compiled for this d/dtype");
    return runs;
}

// Uniform in [-sqrt(3), sqrt(3)) (unit variance), from a hash of the index: no state, any size.
template <class T>
__global__ void fill_random(T* x, std::int64_t n, std::uint64_t seed) {
    for (std::int64_t k = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; k < n;
         k += std::int64_t{gridDim.x} * blockDim.x) {
        std::uint64_t z = seed + static_cast<std::uint64_t>(k) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        x[k] = T(1.7320508f * (2.0f * u - 1.0f));
    }
}

void fill(void* x, std::int64_t n, DType dtype, std::uint64_t seed) {
    if (dtype == DType::f16)
        fill_random<<<1024, 256>>>(static_cast<__half*>(x), n, seed);
    else
        fill_random<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x), n, seed);
    FA_CUDA_CHECK(cudaGetLastError());
}

std::vector<float> download(const std::uint16_t* device, std::int64_t offset, std::int64_t n,
                            DType dtype) {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
    FA_CUDA_CHECK(cudaMemcpy(bits.data(), device + offset, n * 2, cudaMemcpyDeviceToHost));
    std::vector<float> values(bits.size());
    for (std::size_t k = 0; k < bits.size(); ++k) values[k] = from_bits(bits[k], dtype);
    return values;
}

// Largest |O - O64| and |LSE - LSE64| over 16 random query rows, float64 on the host.
std::pair<double, double> spot_check(const Spec& s, const TcDeviceArgs& a, std::uint64_t seed) {
    const AttentionProblem& p = s.problem;
    std::mt19937_64 gen(seed);
    double err_o = 0, err_lse = 0;
    const double scale = p.softmax_scale();
    for (int sample = 0; sample < 16; ++sample) {
        const std::int64_t b = gen() % p.batch, h = gen() % p.heads, i = gen() % p.seq_q;
        const auto q = download(static_cast<const std::uint16_t*>(a.Q), p.q_offset(b, h) + i * p.dim,
                                p.dim, s.dtype);
        const auto K = download(static_cast<const std::uint16_t*>(a.K), p.kv_offset(b, h),
                                p.seq_kv * p.dim, s.dtype);
        const auto V = download(static_cast<const std::uint16_t*>(a.V), p.kv_offset(b, h),
                                p.seq_kv * p.dim, s.dtype);
        std::vector<float> o(p.dim);
        float lse = 0;
        FA_CUDA_CHECK(cudaMemcpy(o.data(), a.O + p.q_offset(b, h) + i * p.dim, p.dim * 4,
                            cudaMemcpyDeviceToHost));
        FA_CUDA_CHECK(cudaMemcpy(&lse, a.lse + p.lse_offset(b, h) + i, 4, cudaMemcpyDeviceToHost));
        std::vector<double> scores;
        double m = -INFINITY;
        for (std::int64_t j = 0; j < p.seq_kv && p.causal_visible(i, j); ++j) {
            double dot = 0;
            for (std::int64_t c = 0; c < p.dim; ++c) dot += double(q[c]) * K[j * p.dim + c];
            scores.push_back(dot * scale);
            m = std::max(m, scores.back());
        }
        double l = 0;
        std::vector<double> out(p.dim, 0.0);
        for (std::size_t j = 0; j < scores.size(); ++j) {
            const double w = std::exp(scores[j] - m);
            l += w;
            for (std::int64_t c = 0; c < p.dim; ++c) out[c] += w * V[j * p.dim + c];
        }
        for (std::int64_t c = 0; c < p.dim; ++c)
            err_o = std::max(err_o, std::fabs(o[c] - out[c] / l));
        err_lse = std::max(err_lse, std::fabs(lse - (m + std::log(l))));
    }
    return {err_o, err_lse};
}

void run(const Spec& s, int warmup, int repeat, bool check) {
    const AttentionProblem& p = s.problem;
    cuda::DeviceBuffer<std::uint16_t> Q(p.q_elements()), K(p.kv_elements()), V(p.kv_elements());
    cuda::DeviceBuffer<float> O(p.q_elements()), lse(p.lse_elements());
    fill(Q.data(), p.q_elements(), s.dtype, 1);
    fill(K.data(), p.kv_elements(), s.dtype, 2);
    fill(V.data(), p.kv_elements(), s.dtype, 3);
    TcDeviceArgs a;
    a.problem = p;
    a.dtype = s.dtype;
    a.Q = Q.data(), a.K = K.data(), a.V = V.data(), a.O = O.data(), a.lse = lse.data();

    cudaEvent_t start, stop;
    FA_CUDA_CHECK(cudaEventCreate(&start));
    FA_CUDA_CHECK(cudaEventCreate(&stop));
    for (int r = 0; r < warmup; ++r) tc_forward(a, s.tile);
    std::vector<float> ms(static_cast<std::size_t>(repeat));
    for (float& t : ms) {
        FA_CUDA_CHECK(cudaEventRecord(start));
        tc_forward(a, s.tile);
        FA_CUDA_CHECK(cudaEventRecord(stop));
        FA_CUDA_CHECK(cudaEventSynchronize(stop));
        FA_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    }
    FA_CUDA_CHECK(cudaEventDestroy(start));
    FA_CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double flops = 4.0 * p.batch * p.heads * double(p.seq_q) * p.seq_kv * p.dim *
                         (p.causal ? 0.5 : 1.0);

    std::printf("{\"backend\": \"cuda-tc\", \"tile\": \"%s\", \"batch\": %lld, \"heads\": %lld, "
                "\"heads_kv\": %lld, \"seq_q\": %lld, \"seq_kv\": %lld, \"dim\": %lld, "
                "\"causal\": %s, \"dtype\": \"%s\", \"median_ms\": %.5f, \"min_ms\": %.5f, "
                "\"max_ms\": %.5f, \"gflops\": %.1f",
                s.tile.name().c_str(), (long long)p.batch, (long long)p.heads,
                (long long)p.heads_kv, (long long)p.seq_q, (long long)p.seq_kv, (long long)p.dim,
                p.causal ? "true" : "false", to_string(s.dtype).c_str(), median, ms.front(),
                ms.back(), flops / (median * 1e6));
    if (check) {
        const auto [err_o, err_lse] = spot_check(s, a, 7);
        std::printf(", \"check_max_err_o\": %.3g, \"check_max_err_lse\": %.3g", err_o, err_lse);
    }
    std::printf("}\n");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        int warmup = 5, repeat = 30;
        bool check = true;
        std::vector<Spec> specs;
        for (int k = 1; k < argc; ++k) {
            const std::string arg = argv[k];
            if (arg == "--repeat" && k + 1 < argc) repeat = std::max(1, std::atoi(argv[++k]));
            else if (arg == "--warmup" && k + 1 < argc) warmup = std::max(0, std::atoi(argv[++k]));
            else if (arg == "--no-check") check = false;
            else for (const Spec& s : parse_spec(arg)) specs.push_back(s);
        }
        if (specs.empty()) {
            std::fprintf(stderr, "usage: tc_bench [--repeat R] [--warmup W] [--no-check] "
                                 "B,H,N,d,causal,dtype[,tile]...\n");
            return 2;
        }
        for (const Spec& s : specs) run(s, warmup, repeat, check);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
}
