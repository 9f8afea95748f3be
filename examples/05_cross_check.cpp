// examples/05_cross_check.cpp — every backend of this build on one problem, in one table: time,
// working memory, and the error against float64 standard attention with the 2x rule's bound;
// for a backend with a backward pass, also its gradients dQ, dK, dV against the float64 backward.
//
// The same cross-check as `flashattn demo` (examples/flashattn/demo.cpp), on a problem small enough
// to step through and shaped so that nothing divides evenly: N = 203 is not a multiple of any
// block size and d = 59 is odd; B*H = 6 and the causal mask exercise the head offsets and the
// partially visible tiles. For other shapes: `flashattn demo --seq N --dim d ...`.
//
// Run: build/<preset>/bin/05_cross_check   (no arguments; exit 1 if a backend fails the check)
#include <iostream>

#include "common/registry.hpp"
#include "demo.hpp"

int main() {
    flashattn::cli::DemoOptions options;
    options.batch = 2;
    options.heads = 3;
    options.seq = 203;
    options.dim = 59;
    options.causal = true;
    std::cout << "Backends in this build:";
    for (const flashattn::Backend& b : flashattn::available_backends()) std::cout << " " << b.name;
    std::cout << "\n\n";
    const int failures = flashattn::cli::run_demo(options, std::cout);
    std::cout << (failures == 0 ? "check: every backend matches float64 standard attention (and "
                                  "the float64 backward, where it has one)\n"
                                : "CHECK FAILED: see the table\n");
    return failures == 0 ? 0 : 1;
}
