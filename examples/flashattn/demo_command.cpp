// examples/flashattn/demo_command.cpp — `flashattn demo`: every available backend on one problem,
// checked against float64 standard attention, in a table.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>

#include "commands.hpp"
#include "cpu/registry.hpp"
#include "cpu/standard.hpp"
#include "format.hpp"
#include "verify.hpp"

namespace flashattn::cli {
namespace {

struct DemoOptions {
    std::int64_t batch = 1, heads = 4, seq = 1024, dim = 64;
    bool causal = false;
    std::uint64_t seed = 2022;
};

int demo(const DemoOptions& o) {
    AttentionProblem p;
    p.batch = o.batch, p.heads = o.heads, p.heads_kv = o.heads, p.seq_q = o.seq, p.seq_kv = o.seq;
    p.dim = o.dim;
    p.causal = o.causal;
    validate(p);
    std::printf("flashattn demo: B=%lld H=%lld N=%lld d=%lld%s, random normal inputs (seed %llu)\n",
                (long long)p.batch, (long long)p.heads, (long long)p.seq_q, (long long)p.dim,
                p.causal ? " causal" : "", (unsigned long long)o.seed);
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
    for (const Backend& b : available_backends()) {
        const DType t = b.supports(DType::f32) ? DType::f32 : b.dtypes.front();
        std::fprintf(stderr, "running %s...\n", b.name.c_str());
        auto prepared = b.prepare(p, data.Q.data(), data.K.data(), data.V.data(), t);
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
    table.print(std::cout);
    std::printf("FLOPs = 4*B*H*N_q*N_kv*d%s; working mem = measured peak beyond inputs and outputs;\n"
                "check: max|out - ref64| <= 2*max|standard_p - ref64| + 1e-6 (one run each, no warm-up)\n",
                p.causal ? " / 2 (causal)" : "");
    return failures == 0 ? 0 : 2;
}

}  // namespace

Command add_demo_command(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "demo", "Run every available backend on one random problem (default B=1, H=4, N=1024,\n"
                "d=64) and print time, GFLOP/s, working memory and the error against float64\n"
                "standard attention. Exit 2 if any backend fails the 2x rule.");
    auto o = std::make_shared<DemoOptions>();
    cmd->add_option("--batch", o->batch, "Batch size B")->capture_default_str();
    cmd->add_option("--heads", o->heads, "Heads H")->capture_default_str();
    cmd->add_option("--seq", o->seq, "Sequence length N")->capture_default_str();
    cmd->add_option("--dim", o->dim, "Head dimension d")->capture_default_str();
    cmd->add_flag("--causal", o->causal, "Causal mask");
    cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
    return {cmd, [o] { return demo(*o); }};
}

}  // namespace flashattn::cli
