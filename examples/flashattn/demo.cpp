// examples/flashattn/demo.cpp — every available backend on one problem; see demo.hpp.
//
// A backend with a backward pass is also checked on it: after its forward, the backward on the
// forward's own O and LSE and a random dO, each of dQ, dK, dV against the float64 Algorithm 3 by
// the same rule (gradient_bounds: 2x in float32, 3x in fp16/bf16, FlashAttention's gradient rule).
// The table shows the worst of the three as error / bound.
#include "demo.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <memory>
#include <vector>

#include "common/registry.hpp"
#include "common/memory.hpp"
#include "format.hpp"
#include "cpu/reference.hpp"

namespace flashattn::cli {
namespace {

// A slow form (scalar) is not run ten times over: timing stops after this much, with >= 3 runs.
constexpr double kDemoTimeBudgetMs = 2000;

std::vector<double> time_runs(PreparedAttention& prepared, int repeat) {
    std::vector<double> times;
    double spent = 0;
    while (static_cast<int>(times.size()) < repeat &&
           (times.size() < 3 || spent < kDemoTimeBudgetMs)) {
        const auto start = std::chrono::steady_clock::now();
        prepared.execute();
        times.push_back(std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - start).count());
        spent += times.back();
    }
    return times;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The backward's check, summed up in one number: the largest of error / bound over dQ, dK and
// dV, so that <= 1 means every gradient passes the 2x rule.
double worst_gradient_ratio(const AttentionProblem& p, const std::vector<float>& dQ,
                            const std::vector<float>& dK, const std::vector<float>& dV,
                            const GradReference& ref, const GradBounds& bounds) {
    const double q = max_abs_error(dQ.data(), ref.dQ.data(), p.q_elements()) / bounds.dQ;
    const double k = max_abs_error(dK.data(), ref.dK.data(), p.kv_elements()) / bounds.dK;
    const double v = max_abs_error(dV.data(), ref.dV.data(), p.kv_elements()) / bounds.dV;
    return std::max({q, k, v});
}

}  // namespace

int run_demo(const DemoOptions& o, std::ostream& out) {
    AttentionProblem p;
    p.batch = o.batch, p.heads = o.heads, p.heads_kv = o.heads, p.seq_q = o.seq, p.seq_kv = o.seq;
    p.dim = o.dim;
    p.causal = o.causal;
    validate(p);
    // Inputs, the float64 reference and one backend's O and LSE, and for the backward dO, the
    // float64 gradients, the float32 baseline's and one backend's, before any is allocated.
    const double q = double(p.q_elements()), kv = double(p.kv_elements());
    const double rows = double(p.lse_elements());
    require_memory(sizeof(float) * (3 * q + 2 * kv + rows) + sizeof(double) * (q + rows) +
                       sizeof(float) * (q + 2 * (q + 2 * kv)) + sizeof(double) * (q + 2 * kv),
                   "demo's inputs and outputs");
    out << "flashattn demo: B=" << p.batch << " H=" << p.heads << " N=" << p.seq_q << " d=" << p.dim
        << (p.causal ? " causal" : "") << ", random normal inputs (seed " << o.seed << ")\n";
    const ProblemData data = random_problem_data(p, o.seed);
    std::fprintf(stderr, "computing the float64 reference...\n");
    const Reference ref = reference_attention(p, data.Q.data(), data.K.data(), data.V.data());

    // Per precision: the 2x rule's bound, from standard attention in that precision.
    std::map<DType, double> bounds;
    const auto bound_for = [&](DType t) {
        if (!bounds.count(t)) bounds[t] = rule_bounds(p, data, ref, t).O;
        return bounds[t];
    };
    // The backward's dO, reference and bounds: computed once, when the first backend with a
    // backward needs them (a build without any pays nothing).
    const std::vector<float> dO = random_normal(p.q_elements(), o.seed + 3);
    std::optional<GradReference> grad_ref;
    std::map<DType, GradBounds> grad_bounds;
    const auto grad_bounds_for = [&](DType t) -> const GradBounds& {
        if (!grad_ref) {
            std::fprintf(stderr, "computing the float64 reference backward...\n");
            grad_ref =
                reference_backward(p, data.Q.data(), data.K.data(), data.V.data(), dO.data());
        }
        if (!grad_bounds.count(t)) grad_bounds[t] = gradient_bounds(p, data, dO, *grad_ref, t);
        return grad_bounds[t];
    };

    const double flops = p.forward_flops();
    Table table({"backend", "device", "dtype", "time ms", "runs", "GFLOP/s", "working mem", "max |err|",
                 "2x bound", "grad err/bound", "check"});
    int failures = 0;
    std::vector<std::string> skipped;
    for (const Backend& b : available_backends()) {
        const DType t = b.supports(DType::f32) ? DType::f32 : b.dtypes.front();
        std::fprintf(stderr, "running %s...\n", b.name.c_str());
        std::unique_ptr<PreparedAttention> prepared;
        try {
            prepared = b.prepare(p, data.Q.data(), data.K.data(), data.V.data(), t);
        } catch (const std::invalid_argument& e) {
            // A backend with a narrower contract (e.g. cuda-tc's head dims): say so, skip it.
            table.add(
                {b.name, b.device, to_string(t), "-", "-", "-", "-", "-", "-", "-", "skipped"});
            skipped.push_back(b.name + ": " + e.what());
            continue;
        }
        // One untimed warm-up run (a GPU backend's first launch pays for loading its kernels and
        // creating library handles), then the median of timed runs.
        prepared->execute();
        const std::vector<double> times = time_runs(*prepared, o.repeat);
        const double ms = median(times);
        std::vector<float> O(p.q_elements()), lse(p.lse_elements());
        prepared->fetch(O.data(), lse.data());
        const double err = max_abs_error(O.data(), ref.O.data(), p.q_elements());
        const double bound = bound_for(t);
        bool ok = err <= bound;
        // The backward, on this forward's O and LSE, in the same precision.
        std::string grad_cell = "-";
        if (b.has_backward()) {
            std::fprintf(stderr, "running %s's backward...\n", b.name.c_str());
            const GradBounds& gb = grad_bounds_for(t);
            std::vector<float> dQ(p.q_elements()), dK(p.kv_elements()), dV(p.kv_elements());
            const BackwardInputs in{data.Q.data(), data.K.data(), data.V.data(),
                                    O.data(),      lse.data(),    dO.data()};
            try {
                run_backward(b, p, in, dQ.data(), dK.data(), dV.data(), t);
                const double ratio = worst_gradient_ratio(p, dQ, dK, dV, *grad_ref, gb);
                grad_cell = fixed(ratio, 2);
                ok = ok && ratio <= 1;
            } catch (const std::invalid_argument& e) {
                // A backward with a narrower contract than its forward: said, like a skip.
                grad_cell = "skipped";
                skipped.push_back(b.name + "'s backward: " + e.what());
            }
        }
        failures += ok ? 0 : 1;
        table.add({b.name, b.device, to_string(t), fixed(ms, 2), std::to_string(times.size()), fixed(flops / ms / 1e6, 1),
                   human_bytes(prepared->extra_bytes()), scientific(err), scientific(bound),
                   grad_cell, ok ? "ok" : "FAIL"});
    }
    table.print(out);
    for (const std::string& why : skipped) out << "skipped " << why << "\n";
    out << "time ms = median of `runs` timed runs after one untimed warm-up run (at most "
        << o.repeat << ", fewer once a backend has spent " << kDemoTimeBudgetMs / 1000
        << " s);\nFLOPs = 4*B*H*N_q*N_kv*d" << (p.causal ? " / 2 (causal)" : "")
        << "; working mem = measured peak beyond inputs and outputs;\n"
           "check: max|out - ref64| <= 2*max|standard_p - ref64| + 1e-6 (O), and for a backend\n"
           "with a backward pass the same rule on each of dQ, dK, dV (random dO; factor 3 in\n"
           "fp16/bf16) against float64 Algorithm 3; grad err/bound = the largest\n"
           "max|grad - ref64| / bound of the three (<= 1 passes; - = no backward pass)\n";
    return failures;
}

}  // namespace flashattn::cli
