// cpu/registry.cpp — the backends of this build; see registry.hpp.
#include "cpu/registry.hpp"

#include <fstream>
#include <stdexcept>

#include "cpu/omp.hpp"
#include "cpu/scalar.hpp"
#include "cpu/standard.hpp"
#ifdef FLASHATTN_WITH_CUDA
#include "cuda/backends.hpp"
#endif

namespace flashattn {
namespace {

std::vector<Backend> make_backends() {
    std::vector<Backend> list;
    list.push_back(cpu_backend(
        "standard", "Algorithm 0 on the CPU: Eigen GEMMs, S and P materialized (float32)",
        [](const AttentionProblem& p, const float* Q, const float* K, const float* V, float* O,
           float* lse) { standard_attention<float>(p, Q, K, V, O, lse); }));
    list.push_back(cpu_backend(
        "scalar", "Algorithm 1 line by line: plain loops, K/V blocks outer, Q blocks inner",
        [](const AttentionProblem& p, const float* Q, const float* K, const float* V, float* O,
           float* lse) { scalar_attention(p, Q, K, V, O, lse); }));
    list.push_back(cpu_backend(
        "omp",
        "FlashAttention-2 order on the CPU: Q tiles in parallel (OpenMP), register-blocked tile "
        "products",
        [](const AttentionProblem& p, const float* Q, const float* K, const float* V, float* O,
           float* lse) { omp_attention(p, Q, K, V, O, lse); }));
#ifdef FLASHATTN_WITH_CUDA
    for (Backend& b : cuda_backends()) list.push_back(std::move(b));
#endif
    return list;
}

}  // namespace

const std::vector<Backend>& available_backends() {
    static const std::vector<Backend> backends = make_backends();
    return backends;
}

const Backend& find_backend(const std::string& name) {
    std::string names;
    for (const Backend& b : available_backends()) {
        if (b.name == name) return b;
        names += (names.empty() ? "" : ", ") + b.name;
    }
    throw std::invalid_argument("backend = " + name + ": not available in this build (available: " +
                                names + ")");
}

std::string device_name(const std::string& device) {
#ifdef FLASHATTN_WITH_CUDA
    if (device == "cuda") return cuda_device_name();
#endif
    if (device != "cpu") return device;
    std::ifstream cpuinfo("/proc/cpuinfo");
    const std::string key = "model name";
    for (std::string line; std::getline(cpuinfo, line);)
        if (line.compare(0, key.size(), key) == 0 && line.find(':') != std::string::npos) {
            const std::size_t start = line.find_first_not_of(" \t", line.find(':') + 1);
            if (start != std::string::npos) return line.substr(start);
        }
    return device;
}

}  // namespace flashattn
