// examples/flashattn/demo.hpp — the cross-check behind `flashattn demo` and
// examples/05_cross_check.cpp: every available backend on one random problem, timed (median after
// a warm-up run), and checked against float64 standard attention by the 2x rule
// (cpu/reference.hpp); a backend with a backward pass also has its dQ, dK, dV checked by the same
// rule against the float64 backward (Algorithm 3).
#pragma once

#include <cstdint>
#include <ostream>

namespace flashattn::cli {

struct DemoOptions {
    std::int64_t batch = 1, heads = 4, seq = 1024, dim = 64;
    bool causal = false;
    std::uint64_t seed = 2022;
    int repeat = 10;  // timed runs per backend, after one warm-up run (fewer for slow forms)
};

// Prints the problem, a table (backend, time, GFLOP/s, working memory, error, bound, the
// gradients' worst error / bound or "-" without a backward, check) and its legend to `out`,
// progress to stderr. Returns how many backends failed the 2x rule (forward or backward).
// Throws std::invalid_argument for an invalid problem.
int run_demo(const DemoOptions& options, std::ostream& out);

}  // namespace flashattn::cli
