// examples/01_online_softmax.cpp — the online softmax of one vector split into two blocks.
//
// The softmax decomposition of FlashAttention §3.1, "Tiling": compute each block's local statistics
// m(x_k), f(x_k), l(x_k) and local softmax, merge the running statistics with eqs. (17)/(18),
// and rescale each local softmax with eq. (23); the result equals the softmax of the whole
// vector. The rule itself is common/online_softmax.hpp's (merge_softmax, fa1_output_update):
// this program only feeds it and prints what it returns. Docs: docs/online_softmax.md. The
// equation numbers are those of https://zhuanlan.zhihu.com/p/626079753 (not the paper's).
//
// Run: build/<preset>/bin/01_online_softmax   (no arguments; exit 1 if a check fails)
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/online_softmax.hpp"
#include "print.hpp"

using namespace flashattn;
using examples::print_number;
using examples::print_values;

namespace {

constexpr int kB = 4;  // block length B: x has 2B entries, x = [x1 x2]

// Local statistics of one block (eqs. 9–12 for x1, 13–16 for x2): its maximum m, f = exp(x - m)
// and l = sum(f). The same three steps as Algorithm 1 line 10 on one row.
SoftmaxState block_statistics(const float* x, float* f) {
    SoftmaxState s;
    for (int k = 0; k < kB; ++k) s.m = nan_max(s.m, x[k]);  // eq. 9 / 13
    for (int k = 0; k < kB; ++k) {
        f[k] = exp_shifted(x[k], s.m);  // eq. 10 / 14
        s.l += f[k];                    // eq. 11 / 15
    }
    return s;
}

// eq: a label for the block's first statistic in the printout (9 for x1, 13 for x2).
void print_block(const char* name, int eq, const float* x, const float* f, SoftmaxState s) {
    std::printf("%s = [", name);
    print_values(x, kB);
    std::printf(" ]\n");
    std::printf("  m(%s) = %.4f                        (eq. %d: block maximum)\n", name, s.m, eq);
    std::printf("  f(%s) = [", name);
    print_values(f, kB);
    std::printf(" ]   (eq. %d: exp(x - m))\n", eq + 1);
    std::printf("  l(%s) = %.4f                        (eq. %d: sum of f)\n", name, s.l, eq + 2);
    std::printf("  local softmax(%s) = [", name);
    for (int k = 0; k < kB; ++k) print_number(f[k] / s.l);
    std::printf(" ]   (eq. %d: f / l)\n\n", eq + 3);
}

}  // namespace

int main() {
    // Hand-written so the maximum sits in the second block: the first block's values must be
    // rescaled when the second one arrives, which is the whole point.
    const float x[2 * kB] = {1.0f, 2.5f, -0.5f, 0.0f, /* | */ 3.0f, -1.0f, 1.5f, 2.0f};
    const float v[2 * kB] = {0.5f, -1.0f, 2.0f, 1.0f, /* | */ -0.5f, 1.5f, 0.0f, 3.0f};
    const float* x1 = x;
    const float* x2 = x + kB;

    std::printf("Online softmax of x = [x1 x2], two blocks of B = %d (FlashAttention §3.1)\n\n", kB);

    // Block 1. The running state (m_max, l_all in the printout) is block 1's own statistics.
    float f1[kB], f2[kB];
    const SoftmaxState s1 = block_statistics(x1, f1);
    print_block("x1", 9, x1, f1, s1);
    SoftmaxState running = s1;
    std::printf("after block 1: running m = %.4f, l = %.4f\n\n", running.m, running.l);

    // Block 2, then the merge of eqs. (17)/(18).
    const SoftmaxState s2 = block_statistics(x2, f2);
    print_block("x2", 13, x2, f2, s2);
    const SoftmaxMerge merged = merge_softmax(running, s2);
    std::printf("merge_softmax (eqs. 17/18):\n");
    std::printf("  m_new = max(m(x1), m(x2))                        = %.4f\n", merged.m_new);
    std::printf("  old_scale   = exp(m(x1) - m_new)                 = %.4f\n", merged.old_scale);
    std::printf("  block_scale = exp(m(x2) - m_new)                 = %.4f\n", merged.block_scale);
    std::printf("  l_new = old_scale * l(x1) + block_scale * l(x2)  = %.4f\n", merged.l_new);
    running = {merged.m_new, merged.l_new};
    std::printf("after block 2: running m = %.4f, l = %.4f\n\n", running.m, running.l);

    // Eq. (23): each local softmax, rescaled by l(x_k) exp(m(x_k) - m_new) / l_new. (Written as
    // walkthroughs often write it; local softmax times l(x_k) is just f(x_k) again.)
    std::vector<double> online(2 * kB);
    for (int k = 0; k < kB; ++k) {
        online[k] = (f1[k] / s1.l) * s1.l * merged.old_scale / merged.l_new;
        online[kB + k] = (f2[k] / s2.l) * s2.l * merged.block_scale / merged.l_new;
    }

    // The softmax of the whole vector in double, directly from eqs. (5)–(8).
    double m = x[0];
    for (float xi : x) m = std::max(m, static_cast<double>(xi));
    double l = 0;
    for (float xi : x) l += std::exp(xi - m);
    std::vector<double> direct(2 * kB);
    for (int k = 0; k < 2 * kB; ++k) direct[k] = std::exp(x[k] - m) / l;

    std::printf("softmax(x), blocks rescaled by eq. 23 = [");
    print_values(online.data(), 2 * kB);
    std::printf(" ]\nsoftmax(x), whole vector (eqs. 5-8)   = [");
    print_values(direct.data(), 2 * kB);
    double worst = 0;
    for (int k = 0; k < 2 * kB; ++k) worst = std::max(worst, std::fabs(online[k] - direct[k]));
    std::printf(" ]\nmax |difference| = %.2e\n\n", worst);

    // The same rescaling carried through a weighted sum o = softmax(x) . v (eq. 26, Algorithm 1
    // line 12 for one row and d = 1): o after block 1 is block 1's normalized local output; block 2
    // contributes its unnormalized f(x2) . v2, and fa1_output_update combines them.
    float o = 0.0f;
    for (int k = 0; k < kB; ++k) o += f1[k] / s1.l * v[k];
    float pv2 = 0.0f;
    for (int k = 0; k < kB; ++k) pv2 += f2[k] * v[kB + k];
    const float o_new = fa1_output_update(o, s1.l, pv2, merged);
    double o_direct = 0;
    for (int k = 0; k < 2 * kB; ++k) o_direct += direct[k] * v[k];
    std::printf("with values v = [");
    print_values(v, 2 * kB);
    std::printf(" ]\n  o after block 1 (local softmax(x1) . v1)     = %.6f\n", o);
    std::printf("  o after block 2 (fa1_output_update, eq. 26) = %.6f\n", o_new);
    std::printf("  softmax(x) . v, whole vector                = %.6f\n", o_direct);

    const bool ok = worst < 1e-6 && std::fabs(o_new - o_direct) < 1e-5;
    std::printf("\n%s\n", ok ? "check: the two-block result equals the whole-vector softmax"
                             : "CHECK FAILED: the two-block result differs");
    return ok ? 0 : 1;
}
