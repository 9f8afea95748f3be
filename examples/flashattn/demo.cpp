// examples/flashattn/demo.cpp — every available backend on one problem; see demo.hpp.
#include "demo.hpp"

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "cpu/registry.hpp"
#include "cpu/workspace.hpp"
#include "format.hpp"
#include "verify.hpp"

namespace flashattn::cli {

int run_demo(const DemoOptions& o, std::ostream& out) {
    AttentionProblem p;
    p.batch = o.batch, p.heads = o.heads, p.heads_kv = o.heads, p.seq_q = o.seq, p.seq_kv = o.seq;
    p.dim = o.dim;
    p.causal = o.causal;
    validate(p);
    // Inputs, the float64 reference and one backend's O and LSE, before any of them is allocated.
    const double q = double(p.q_elements()), kv = double(p.kv_elements());
    const double rows = double(p.lse_elements());
    require_memory(sizeof(float) * (3 * q + 2 * kv + rows) + sizeof(double) * (q + rows),
                   "demo's inputs and outputs");
    out << "flashattn demo: B=" << p.batch << " H=" << p.heads << " N=" << p.seq_q << " d=" << p.dim
        << (p.causal ? " causal" : "") << ", random normal inputs (seed " << o.seed << ")\n";
    const ProblemData data = random_problem_data(p, o.seed);
    std::fprintf(stderr, "computing the float64 reference...\n");
    const Reference ref = reference_attention(p, data.Q.data(), data.K.data(), data.V.data());

    // Per precision: the error of standard attention in that precision (the 2x rule's yardstick).
    std::map<DType, double> yardstick;
    const auto bound_for = [&](DType t) {
        if (!yardstick.count(t)) {
            std::vector<float> O(p.q_elements());
            run_backend(find_backend("standard"), p, data.Q.data(), data.K.data(), data.V.data(),
                        O.data(), nullptr, t);
            yardstick[t] = max_abs_error(O.data(), ref.O.data(), p.q_elements());
        }
        return 2 * yardstick[t] + 1e-6;
    };

    const double flops = attention_flops(p);
    Table table({"backend", "device", "dtype", "time ms", "GFLOP/s", "working mem", "max |err|",
                 "2x bound", "check"});
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
            table.add({b.name, b.device, to_string(t), "-", "-", "-", "-", "-", "skipped"});
            skipped.push_back(b.name + ": " + e.what());
            continue;
        }
        const auto start = std::chrono::steady_clock::now();
        prepared->execute();
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        std::vector<float> O(p.q_elements());
        prepared->fetch(O.data(), nullptr);
        const double err = max_abs_error(O.data(), ref.O.data(), p.q_elements());
        const double bound = bound_for(t);
        const bool ok = err <= bound;
        failures += ok ? 0 : 1;
        table.add({b.name, b.device, to_string(t), fixed(ms, 1), fixed(flops / ms / 1e6, 1),
                   human_bytes(prepared->extra_bytes()), scientific(err), scientific(bound),
                   ok ? "ok" : "FAIL"});
    }
    table.print(out);
    for (const std::string& why : skipped) out << "skipped " << why << "\n";
    out << "FLOPs = 4*B*H*N_q*N_kv*d" << (p.causal ? " / 2 (causal)" : "")
        << "; working mem = measured peak beyond inputs and outputs;\n"
           "check: max|out - ref64| <= 2*max|standard_p - ref64| + 1e-6 (one run each, no warm-up)\n";
    return failures;
}

}  // namespace flashattn::cli
