// cpu/backends.cpp — the CPU forms as Backend entries, in the order a learner meets them.
#include <string>

#include "cpu/cpu_backend.hpp"
#include "cpu/omp.hpp"
#include "cpu/scalar.hpp"
#include "cpu/standard.hpp"

namespace flashattn {
namespace {

std::string block_words(const BlockSizes& b, std::int64_t Tr, std::int64_t Tc) {
    return "Br = " + std::to_string(b.Br) + ", Bc = " + std::to_string(b.Bc) +
           " (Tr = " + std::to_string(Tr) + ", Tc = " + std::to_string(Tc) + ")";
}

}  // namespace

std::vector<Backend> cpu_backends() {
    std::vector<Backend> list;
    list.push_back(cpu_backend(
        "standard", "Algorithm 0 on the CPU: Eigen GEMMs, S and P materialized (float32)",
        [](const AttentionProblem& p, const float* Q, const float* K, const float* V, float* O,
           float* lse) {
            standard_attention<float>(p, Q, K, V, O, lse);
            return std::int64_t{1};  // no split
        },
        {},
        [](const AttentionProblem& p, const BackwardInputs& in, float* dQ, float* dK, float* dV) {
            standard_backward<float>(p, in.Q, in.K, in.V, in.dO, dQ, dK, dV);  // Algorithm 3
        }));
    list.push_back(cpu_backend(
        "scalar", "Algorithm 1 line by line: plain loops, K/V blocks outer, Q blocks inner",
        [](const AttentionProblem& p, const float* Q, const float* K, const float* V, float* O,
           float* lse) {
            scalar_attention(p, Q, K, V, O, lse);
            return std::int64_t{1};  // no split
        },
        [](const AttentionProblem& p) {
            const ScalarPlan plan = scalar_plan(p);
            return (plan.M ? "M = " + std::to_string(plan.M) + " floats -> " : std::string()) +
                   block_words(plan.blocks, plan.Tr, plan.Tc) + "; SRAM buffers hold " +
                   std::to_string(plan.sram_floats) + " floats";
        },
        [](const AttentionProblem& p, const BackwardInputs& in, float* dQ, float* dK, float* dV) {
            scalar_backward(p, in, dQ, dK, dV);  // Algorithm 4
        }));
    list.push_back(cpu_backend(
        "omp",
        "FlashAttention-2 order on the CPU: Q tiles in parallel (OpenMP), register-blocked tile "
        "products, split-KV for decoding",
        [](const AttentionProblem& p, const float* Q, const float* K, const float* V, float* O,
           float* lse) { return omp_attention(p, Q, K, V, O, lse); },
        [](const AttentionProblem& p) {
            const AttentionProblem run = omp_problem(p);  // GQA groups packed for decoding
            const OmpPlan plan = omp_plan(run);
            return block_words(plan.blocks, plan.Tr, plan.Tc) +
                   (run.heads != p.heads ? " (GQA groups packed: " + std::to_string(run.heads) +
                                               " heads of " + std::to_string(run.seq_q) + " rows)"
                                         : "");
        },
        [](const AttentionProblem& p, const BackwardInputs& in, float* dQ, float* dK, float* dV) {
            omp_backward(p, in, dQ, dK, dV);  // FlashAttention-2's backward
        }));
    return list;
}

}  // namespace flashattn
