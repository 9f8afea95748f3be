// examples/02_algorithm1_trace.cpp — Algorithm 1 traced step by step on N = 12, d = 4, Br = 3,
// Bc = 2 (a blocking small enough to print).
//
// It runs THE scalar form (cpu/scalar.cpp) with an observer (ScalarTrace, cpu/scalar.hpp) and
// prints, for every (j, i) step, the tile S_ij (line 9), m_tilde and l_tilde (line 10), the m_i and
// l_i loaded at line 8, m_new and l_new (line 11) and the new O_i (line 12). At the end O is
// compared with standard attention. Docs: docs/algorithm1_walkthrough.md (each paper line) and
// docs/debugging.md (where to break).
//
// Run: build/<preset>/bin/02_algorithm1_trace   (no arguments; exit 1 if the check fails)
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/registry.hpp"
#include "cpu/scalar.hpp"
#include "figure6_problem.hpp"
#include "print.hpp"
#include "cpu/reference.hpp"

using namespace flashattn;
using examples::print_matrix;
using examples::print_number;
using examples::print_values;

namespace {

// Prints each step of Algorithm 1 as the scalar form performs it. Rows are numbered from 1, and
// the tile indices too, as in the paper (the code counts from 0).
class PrintingTrace : public ScalarTrace {
public:
    // After line 9: keep what line 10 and 11 are about to overwrite (S_ij, the old m_i and l_i).
    void after_scores(const ScalarStep& s) override {
        if (s.j != current_j_) {
            current_j_ = s.j;
            std::printf("\n== j = %lld (line 5). Line 6 loads K_%lld, V_%lld = rows %lld-%lld of K, V ==\n",
                        (long long)s.j + 1, (long long)s.j + 1, (long long)s.j + 1,
                        (long long)s.cols.begin + 1, (long long)s.cols.end);
        }
        const std::int64_t br = s.rows.size(), bc = s.cols.size();
        S_.assign(br * bc, 0.0f);
        for (std::int64_t r = 0; r < br; ++r)
            for (std::int64_t c = 0; c < bc; ++c) S_[r * bc + c] = s.S_ij[r * s.Bc + c];
        m_old_.assign(s.m_i, s.m_i + br);
        l_old_.assign(s.l_i, s.l_i + br);
    }

    // After line 13: print the whole step, one line per row of the tile.
    void after_update(const ScalarStep& s) override {
        const std::int64_t br = s.rows.size(), bc = s.cols.size();
        ++steps_;
        std::printf("  -- i = %lld (line 7). Line 8 loads Q_%lld, O_%lld, l_%lld, m_%lld = rows %lld-%lld --\n",
                    (long long)s.i + 1, (long long)s.i + 1, (long long)s.i + 1, (long long)s.i + 1,
                    (long long)s.i + 1, (long long)s.rows.begin + 1, (long long)s.rows.end);
        std::printf("     row |%*s |%8s%8s |%8s%8s |%8s%8s |  %s\n", static_cast<int>(8 * bc), "S_ij",
                    "m~", "l~", "m_i", "l_i", "m_new", "l_new", "O_i");
        for (std::int64_t r = 0; r < br; ++r) {
            std::printf("     %3lld |", (long long)(s.rows.begin + r + 1));
            print_values(S_.data() + r * bc, bc);
            std::printf(" |");
            print_number(s.m_tilde[r]);
            print_number(s.l_tilde[r]);
            std::printf(" |");
            print_number(m_old_[r]);
            print_number(l_old_[r]);
            std::printf(" |");
            print_number(s.m_i[r]);  // now m_new (line 13 wrote it back)
            print_number(s.l_i[r]);  // now l_new
            std::printf(" |");
            print_values(s.O_i + r * s.d, s.d);
            std::printf("\n");
        }
    }

    int steps() const { return steps_; }

private:
    std::int64_t current_j_ = -1;
    int steps_ = 0;
    std::vector<float> S_, m_old_, l_old_;
};

}  // namespace

int main() {
    const examples::Figure6 f = examples::figure6_problem();
    const AttentionProblem& p = f.problem;
    const ScalarPlan plan = scalar_plan(p);
    const std::int64_t N = p.seq_q, d = p.dim;

    std::printf("Algorithm 1 on N = %lld, d = %lld, Br = %lld, Bc = %lld\n",
                (long long)N, (long long)d, (long long)plan.blocks.Br, (long long)plan.blocks.Bc);
    std::printf("Line 1: Br, Bc given directly here (from M they would be ceil(M/4d), min(ceil(M/4d), d))\n");
    std::printf("Line 3: Tr = ceil(N/Br) = %lld blocks Q_i, Tc = ceil(N/Bc) = %lld blocks K_j, V_j\n",
                (long long)plan.Tr, (long long)plan.Tc);
    std::printf("Line 2: O = 0, l = 0, m = -inf in HBM.  S = scale * Q K^T with scale = 1/sqrt(d) = %.4f\n\n",
                p.softmax_scale());
    print_matrix("Q", f.data.Q.data(), N, d, d, 1, 2);
    print_matrix("K", f.data.K.data(), N, d, d, 1, 2);
    print_matrix("V", f.data.V.data(), N, d, d, 1, 2);

    std::printf("\nEach step (j, i) below shows, per row of the tile: S_ij = scale * Q_i K_j^T (line 9);\n"
                "m~ = rowmax(S_ij) and l~ = rowsum(exp(S_ij - m~)) (line 10); m_i, l_i as line 8\n"
                "loaded them; m_new, l_new (line 11, written back by line 13); the new O_i (line 12).\n");

    std::vector<float> O(p.q_elements()), lse(p.lse_elements());
    PrintingTrace trace;
    IoCounter io;
    scalar_attention(p, f.data.Q.data(), f.data.K.data(), f.data.V.data(), O.data(), lse.data(),
                     &io, &trace);

    std::printf("\nLine 16: return O. %d steps (j, i) = Tc x Tr; HBM element reads %lld, writes %lld\n\n",
                trace.steps(), (long long)io.reads, (long long)io.writes);

    // Standard attention (Algorithm 0) in float64, and in float32 for the 2x rule's yardstick.
    const Reference ref = reference_attention(p, f.data.Q.data(), f.data.K.data(), f.data.V.data());
    std::vector<float> O_std(p.q_elements());
    run_backend(find_backend("standard"), p, f.data.Q.data(), f.data.K.data(), f.data.V.data(),
                O_std.data(), nullptr);
    print_matrix("O from Algorithm 1 (scalar)", O.data(), N, d, d);
    print_matrix("O from standard attention (Algorithm 0, float64)", ref.O.data(), N, d, d);
    const double err = max_abs_error(O.data(), ref.O.data(), p.q_elements());
    const double bound = 2 * max_abs_error(O_std.data(), ref.O.data(), p.q_elements()) + 1e-6;
    const double err_lse = max_abs_error(lse.data(), ref.lse.data(), p.lse_elements());
    std::printf("max |O_scalar - O_standard| = %.2e (bound 2 x float32 standard's error + 1e-6 = %.2e)\n",
                err, bound);
    std::printf("max |LSE_scalar - LSE_standard| = %.2e  (LSE = m + log l, from the final m and l)\n",
                err_lse);
    const bool ok = err <= bound && trace.steps() == plan.Tr * plan.Tc;
    std::printf("%s\n", ok ? "check: Algorithm 1 gives standard attention's O"
                           : "CHECK FAILED: Algorithm 1 differs from standard attention");
    return ok ? 0 : 1;
}
