// examples/06_backward_trace.cpp — Algorithm 4 (the backward pass by recomputation, FlashAttention
// arXiv 2205.14135, Appendix B.4) traced step by step on the problem of example 2: N = 12 rows,
// d = 4, blocks of Br = 3 query rows and Bc = 2 key rows (examples/figure6_problem.hpp).
//
// It runs the scalar forward (Algorithm 1) to get O and L = m + log l, draws dO, then runs THE
// scalar backward (cpu/scalar_backward.cpp) with an observer and prints, for every (j, i) step,
// the recomputed tile P_ij (line 13), dP_ij (line 17), D_i (line 19), dS_ij (line 20), dQ_i as
// line 21 wrote it and the on-chip accumulators dK_j, dV_j after line 22. Blocks and rows are
// printed numbered from 1, as in the paper (the code counts from 0). At the end the gradients
// are compared with standard attention's backward (Algorithm 3) in float64, and printed whole:
// example 07 (FlashAttention-2's backward) prints the same numbers. Docs:
// docs/algorithm4_walkthrough.md.
//
// Run: build/<preset>/bin/06_backward_trace   (no arguments; exit 1 if the check fails)
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/registry.hpp"
#include "cpu/reference.hpp"
#include "cpu/scalar.hpp"
#include "figure6_problem.hpp"
#include "print.hpp"

using namespace flashattn;
using examples::print_matrix;
using examples::print_values;

namespace {

// One printed step: rows of the tile (numbered from 1, as in the paper) with P_ij, dP_ij, D_i,
// dS_ij and dQ_i, then the key rows of dK_j and dV_j accumulated so far.
void print_step(const ScalarBackwardStep& s) {
    const std::int64_t br = s.rows.size(), bc = s.cols.size();
    std::printf("  -- j = %lld, i = %lld: K_%lld/V_%lld = rows %lld-%lld, Q_%lld = rows %lld-%lld --\n",
                (long long)s.j + 1, (long long)s.i + 1, (long long)s.j + 1, (long long)s.j + 1,
                (long long)s.cols.begin + 1, (long long)s.cols.end, (long long)s.i + 1,
                (long long)s.rows.begin + 1, (long long)s.rows.end);
    std::printf("     row |%*s |%*s |%8s |%*s |  dQ_i (line 21)\n", static_cast<int>(8 * bc),
                "P_ij (L13)", static_cast<int>(8 * bc), "dP_ij (L17)", "D_i", static_cast<int>(8 * bc),
                "dS_ij (L20)");
    for (std::int64_t r = 0; r < br; ++r) {
        std::printf("     %3lld |", (long long)(s.rows.begin + r + 1));
        print_values(s.P_ij + r * s.Bc, bc);
        std::printf(" |");
        print_values(s.dP_ij + r * s.Bc, bc);
        std::printf(" |");
        print_values(s.D_i + r, 1);
        std::printf(" |");
        print_values(s.dS_ij + r * s.Bc, bc);
        std::printf(" |");
        print_values(s.dQ_i + r * s.d, s.d);
        std::printf("\n");
    }
    for (std::int64_t c = 0; c < bc; ++c) {
        std::printf("     key %3lld: dK_j", (long long)(s.cols.begin + c + 1));
        print_values(s.dK_j + c * s.d, s.d);
        std::printf("   dV_j");
        print_values(s.dV_j + c * s.d, s.d);
        std::printf("\n");
    }
}

}  // namespace

int main() {
    const examples::Figure6 f = examples::figure6_problem();
    const AttentionProblem& p = f.problem;
    const ScalarPlan plan = scalar_plan(p);
    const std::int64_t N = p.seq_q, d = p.dim;

    // The forward (Algorithm 1) saves O and L = m + log l: O(N) statistics, never P.
    std::vector<float> O(p.q_elements()), L(p.lse_elements());
    IoCounter io_forward;
    scalar_attention(p, f.data.Q.data(), f.data.K.data(), f.data.V.data(), O.data(), L.data(),
                     &io_forward);
    const std::vector<float> dO = examples::figure6_output_gradient(p);

    std::printf("Algorithm 4 on N = %lld, d = %lld, Br = %lld, Bc = %lld (Tr = %lld, Tc = %lld)\n",
                (long long)N, (long long)d, (long long)plan.blocks.Br, (long long)plan.blocks.Bc,
                (long long)plan.Tr, (long long)plan.Tc);
    std::printf("tau = 1/sqrt(d) = %.4f: the softmax scale, S = tau Q K^T (lines 11, 21, 22)\n",
                p.softmax_scale());
    std::printf("Blocks and rows are numbered from 1, as in the paper (the code's j, i count from 0).\n");
    std::printf("Inputs: Q, K, V of example 2; O and L = m + log l from the forward; dO below.\n");
    print_matrix("dO = dloss/dO", dO.data(), N, d, d, 1, 2);
    print_values(L.data(), N);
    std::printf("  <- L (one number per row: all the backward keeps of the softmax)\n\n");
    std::printf("Each step rebuilds P_ij = exp(S_ij - L_i) from Q_i, K_j (lines 11-13), then\n"
                "dV_j += P_ij^T dO_i (16), dP_ij = dO_i V_j^T (17), D_i = rowsum(dO_i o O_i) (19),\n"
                "dS_ij = P_ij o (dP_ij - D_i) (20), dQ_i += tau dS_ij K_j (21), dK_j += tau dS_ij^T Q_i (22).\n"
                "(No dropout here: lines 1, 14, 15 and 18 leave the numbers as they are.)\n");

    std::vector<float> dQ(p.q_elements()), dK(p.kv_elements()), dV(p.kv_elements());
    IoCounter io;
    int steps = 0;
    std::int64_t current_j = -1;
    const BackwardInputs in{f.data.Q.data(), f.data.K.data(), f.data.V.data(),
                            O.data(),        L.data(),        dO.data()};
    scalar_backward(p, in, dQ.data(), dK.data(), dV.data(), &io, [&](const ScalarBackwardStep& s) {
        if (s.j != current_j) {
            current_j = s.j;
            std::printf("\n== j = %lld (line 6): line 7 loads K_%lld, V_%lld; line 8 sets dK_j = dV_j = 0 ==\n",
                        (long long)s.j + 1, (long long)s.j + 1, (long long)s.j + 1);
        }
        print_step(s);
        ++steps;
    });
    std::printf("\nLine 26: return dQ, dK, dV. %d steps (j, i) = Tc x Tr.\n", steps);
    std::printf("HBM element accesses: forward reads %lld, writes %lld; backward reads %lld, writes %lld\n\n",
                (long long)io_forward.reads, (long long)io_forward.writes, (long long)io.reads,
                (long long)io.writes);

    // Standard attention's backward (Algorithm 3) in float64, and in float32 for the 2x rule.
    const GradReference ref =
        reference_backward(p, f.data.Q.data(), f.data.K.data(), f.data.V.data(), dO.data());
    const GradBounds bound = gradient_bounds(p, f.data, dO, ref, DType::f32);
    print_matrix("dQ from Algorithm 4 (scalar)", dQ.data(), N, d, d);
    print_matrix("dQ from Algorithm 3 (standard, float64)", ref.dQ.data(), N, d, d);
    const double eq = max_abs_error(dQ.data(), ref.dQ.data(), p.q_elements());
    const double ek = max_abs_error(dK.data(), ref.dK.data(), p.kv_elements());
    const double ev = max_abs_error(dV.data(), ref.dV.data(), p.kv_elements());
    std::printf("max error against float64: dQ %.2e (bound %.2e), dK %.2e (bound %.2e), dV %.2e (bound %.2e)\n",
                eq, bound.dQ, ek, bound.dK, ev, bound.dV);
    examples::print_gradients(dQ.data(), dK.data(), dV.data(), N, d);
    const bool ok = eq <= bound.dQ && ek <= bound.dK && ev <= bound.dV && steps == plan.Tr * plan.Tc;
    std::printf("%s\n", ok ? "check: Algorithm 4 gives standard attention's gradients"
                           : "CHECK FAILED: Algorithm 4 differs from standard attention's backward");
    return ok ? 0 : 1;
}
