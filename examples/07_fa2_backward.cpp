// examples/07_fa2_backward.cpp — FlashAttention-2's backward pass (arXiv 2307.08691, §3.1.2,
// Algorithm 2) in plain loops, on the problem of examples 02 and 06: N = 12 rows, d = 4, blocks of
// Br = 3 query rows and Bc = 2 key rows (examples/figure6_problem.hpp).
//
// The loops are the paper's, numbered by its lines; docs/fa2_backward_walkthrough.md maps them to
// the fast form, cpu/omp_backward.cpp. Against Algorithm 4 (example 06) two things move:
//   * D = rowsum(dO o O) is computed for every row before the loops (line 4), so the inner step
//     loads D_i (Br numbers) instead of O_i (Br x d): O is read once instead of Tc times;
//   * the statistic is L = m + log l (the scalar form of example 06 already uses it).
// The arithmetic of every step is Algorithm 4's, summed in the same order and precision, so the
// gradients are example 06's bit for bit: the program checks that, prints them as example 06
// does, and CTest compares the two printouts. It also runs the variant the omp form uses when
// threads outnumber (batch, head) groups: dQ in a separate pass over query blocks that recomputes
// S and dP, instead of adding into dQ_i from every K/V block (the GPU's atomic adds), and checks
// that its dQ is the same. The paper's Algorithm 2 leaves the softmax scale out; it is tau here,
// where Algorithm 4 has it.
//
// Run: build/<preset>/bin/07_fa2_backward   (no arguments; exit 1 if a check fails)
#include <cstdio>
#include <vector>

#include "common/backward.hpp"
#include "common/registry.hpp"
#include "common/tiling.hpp"
#include "cpu/reference.hpp"
#include "cpu/scalar.hpp"
#include "figure6_problem.hpp"
#include "print.hpp"

using namespace flashattn;
using examples::print_values;

namespace {

// HBM accesses of the loops below, counted as cpu/scalar_backward.cpp counts Algorithm 4's.
struct Counts {
    long long reads = 0, writes = 0;
};

// The on-chip tiles of one step (i, j): P_ij and dS_ij (Br x Bc), from Q_i, K_j, V_j, dO_i, L_i,
// D_i. Lines 10, 11, 13 and 14, as Algorithm 4's lines 11, 13, 17 and 20 compute them.
struct Step {
    std::vector<float> P, dS;
};
Step tile(const float* Q_i, const float* K_j, const float* V_j, const float* dO_i, const float* L_i,
          const float* D_i, std::int64_t br, std::int64_t bc, std::int64_t d, float tau) {
    Step t{std::vector<float>(br * bc), std::vector<float>(br * bc)};
    for (std::int64_t r = 0; r < br; ++r)
        for (std::int64_t c = 0; c < bc; ++c) {
            float s = 0.0f;  // line 10: S_ij = tau Q_i K_j^T
            for (std::int64_t k = 0; k < d; ++k) s += Q_i[r * d + k] * K_j[c * d + k];
            const float P = recomputed_probability(tau * s, L_i[r]);  // line 11: exp(S_ij - L_i)
            double dP = 0.0;  // line 13: dP_ij = dO_i V_j^T
            for (std::int64_t k = 0; k < d; ++k) dP += double(dO_i[r * d + k]) * V_j[c * d + k];
            t.P[r * bc + c] = P;
            t.dS[r * bc + c] = score_gradient(P, float(dP), D_i[r]);  // line 14
        }
    return t;
}

// dQ_i += tau dS_ij K_j (line 15), into double rows as Algorithm 4's line 21 adds them.
void add_query_gradient(const Step& t, const float* K_j, std::int64_t br, std::int64_t bc,
                        std::int64_t d, float tau, double* dQ_i) {
    for (std::int64_t r = 0; r < br; ++r)
        for (std::int64_t k = 0; k < d; ++k) {
            double sum = 0.0;
            for (std::int64_t c = 0; c < bc; ++c) sum += double(t.dS[r * bc + c]) * K_j[c * d + k];
            dQ_i[r * d + k] += tau * sum;
        }
}

}  // namespace

int main() {
    const examples::Figure6 f = examples::figure6_problem();
    const AttentionProblem& p = f.problem;
    const std::int64_t N = p.seq_q, d = p.dim, Br = p.block_q, Bc = p.block_kv;
    const float tau = p.softmax_scale();
    const float *Q = f.data.Q.data(), *K = f.data.K.data(), *V = f.data.V.data();

    // The forward's O and L (Algorithm 1, as in example 06) and the same dO.
    std::vector<float> O(p.q_elements()), L(p.lse_elements());
    scalar_attention(p, Q, K, V, O.data(), L.data());
    const std::vector<float> dO = examples::figure6_output_gradient(p);

    // Line 1: Q in Tr blocks of Br rows, K and V in Tc blocks of Bc rows. Line 2: O, dO, L like Q.
    const std::int64_t Tr = tile_count(N, Br), Tc = tile_count(N, Bc);
    std::printf("FlashAttention-2's backward (its Algorithm 2) on N = %lld, d = %lld, Br = %lld, "
                "Bc = %lld (Tr = %lld, Tc = %lld)\n",
                (long long)N, (long long)d, (long long)Br, (long long)Bc, (long long)Tr, (long long)Tc);
    std::printf("tau = 1/sqrt(d) = %.4f (the paper's Algorithm 2 omits it; Algorithm 4's places)\n", tau);
    std::printf("Inputs: Q, K, V, O, L and dO of example 06. Blocks and rows numbered from 1.\n\n");

    Counts io;
    // Line 3: dQ = 0 in HBM (double, as the scalar form keeps it); dK, dV are written whole at 18.
    std::vector<double> dQ(N * d, 0.0), dK(N * d), dV(N * d);
    io.writes += N * d;

    // Line 4: D = rowsum(dO o O) for every row, written to HBM: the only time O is read.
    std::vector<float> D(N);
    for (std::int64_t r = 0; r < N; ++r) D[r] = output_delta(&dO[r * d], &O[r * d], d);
    io.reads += 2 * N * d, io.writes += N;
    std::printf("Line 4, before the loops: D = rowsum(dO o O), one number per row:\n");
    print_values(D.data(), N);
    std::printf("\n\n");

    for (std::int64_t j = 0; j < Tc; ++j) {  // line 5
        const TileRange cols = tile_range(j, Bc, N);
        const std::int64_t bc = cols.size();
        const float *K_j = K + cols.begin * d, *V_j = V + cols.begin * d;  // line 6: load K_j, V_j
        io.reads += 2 * bc * d;
        std::vector<double> dK_j(bc * d, 0.0), dV_j(bc * d, 0.0);  // line 7
        for (std::int64_t i = 0; i < Tr; ++i) {  // line 8
            const TileRange rows = tile_range(i, Br, N);
            const std::int64_t br = rows.size();
            // Line 9: load Q_i, dO_i, dQ_i, L_i, D_i (the paper lists O_i too: nothing reads it).
            const float *Q_i = Q + rows.begin * d, *dO_i = &dO[rows.begin * d];
            const float *L_i = &L[rows.begin], *D_i = &D[rows.begin];
            io.reads += 3 * br * d + 2 * br;
            const Step t = tile(Q_i, K_j, V_j, dO_i, L_i, D_i, br, bc, d, tau);  // lines 10-14
            for (std::int64_t c = 0; c < bc; ++c)  // line 12: dV_j += P_ij^T dO_i
                for (std::int64_t k = 0; k < d; ++k) {
                    double sum = 0.0;
                    for (std::int64_t r = 0; r < br; ++r) sum += double(t.P[r * bc + c]) * dO_i[r * d + k];
                    dV_j[c * d + k] += sum;
                }
            add_query_gradient(t, K_j, br, bc, d, tau, &dQ[rows.begin * d]);  // line 15
            io.writes += br * d;
            for (std::int64_t c = 0; c < bc; ++c)  // line 16: dK_j += tau dS_ij^T Q_i
                for (std::int64_t k = 0; k < d; ++k) {
                    double sum = 0.0;
                    for (std::int64_t r = 0; r < br; ++r) sum += double(t.dS[r * bc + c]) * Q_i[r * d + k];
                    dK_j[c * d + k] += tau * sum;
                }
        }  // line 17
        std::copy(dK_j.begin(), dK_j.end(), dK.begin() + cols.begin * d);  // line 18: write dK_j, dV_j
        std::copy(dV_j.begin(), dV_j.end(), dV.begin() + cols.begin * d);
        io.writes += 2 * bc * d;
        std::printf("j = %lld: lines 6-18 wrote dK_j, dV_j for key rows %lld-%lld:\n", (long long)j + 1,
                    (long long)cols.begin + 1, (long long)cols.end);
        for (std::int64_t c = 0; c < bc; ++c) {
            std::printf("  key %3lld: dK_j", (long long)(cols.begin + c + 1));
            print_values(&dK_j[c * d], d);
            std::printf("   dV_j");
            print_values(&dV_j[c * d], d);
            std::printf("\n");
        }
    }  // line 19
    // Line 20: return dQ, dK, dV (rounded to float once, as the scalar form does).
    std::vector<float> dQf(dQ.begin(), dQ.end()), dKf(dK.begin(), dK.end()), dVf(dV.begin(), dV.end());

    // The dQ pass of the omp form's two-pass plan: query blocks outer, every dQ_i summed on chip
    // over j in the same order, S and dP recomputed; no dQ_i is ever shared between blocks.
    std::vector<double> dQ_pass(N * d, 0.0);
    for (std::int64_t i = 0; i < Tr; ++i) {
        const TileRange rows = tile_range(i, Br, N);
        for (std::int64_t j = 0; j < Tc; ++j) {
            const TileRange cols = tile_range(j, Bc, N);
            const Step t = tile(Q + rows.begin * d, K + cols.begin * d, V + cols.begin * d,
                                &dO[rows.begin * d], &L[rows.begin], &D[rows.begin], rows.size(),
                                cols.size(), d, tau);
            add_query_gradient(t, K + cols.begin * d, rows.size(), cols.size(), d, tau,
                               &dQ_pass[rows.begin * d]);
        }
    }
    const bool same_dq_pass = dQ_pass == dQ;

    // Algorithm 4 (example 06's backward), and its HBM accesses.
    std::vector<float> dQ4(p.q_elements()), dK4(p.kv_elements()), dV4(p.kv_elements());
    IoCounter io4;
    const BackwardInputs in{Q, K, V, O.data(), L.data(), dO.data()};
    scalar_backward(p, in, dQ4.data(), dK4.data(), dV4.data(), &io4);
    const bool identical = dQf == dQ4 && dKf == dK4 && dVf == dV4;

    // The omp form (FlashAttention-2's backward, vectorized; the scale applied once at the end):
    // the same numbers up to rounding, within the tests' 2x rule.
    const GradReference ref = reference_backward(p, Q, K, V, dO.data());
    const GradBounds bound = gradient_bounds(p, f.data, dO, ref, DType::f32);
    std::vector<float> dQo(p.q_elements()), dKo(p.kv_elements()), dVo(p.kv_elements());
    run_backward(find_backend("omp"), p, in, dQo.data(), dKo.data(), dVo.data());
    const double eq = max_abs_error(dQo.data(), ref.dQ.data(), p.q_elements());
    const double ek = max_abs_error(dKo.data(), ref.dK.data(), p.kv_elements());
    const double ev = max_abs_error(dVo.data(), ref.dV.data(), p.kv_elements());
    const bool omp_ok = eq <= bound.dQ && ek <= bound.dK && ev <= bound.dV;

    std::printf("\nHBM element accesses: this loop reads %lld, writes %lld (%lld in all); Algorithm 4\n"
                "(example 06) reads %lld, writes %lld (%lld): the pre-pass reads O once, where\n"
                "Algorithm 4 streams O_i past every K/V block only to form D_i.\n",
                io.reads, io.writes, io.reads + io.writes, (long long)io4.reads, (long long)io4.writes,
                (long long)(io4.reads + io4.writes));
    std::printf("dQ from the separate dQ pass (query blocks outer, S and dP recomputed): %s\n",
                same_dq_pass ? "the same bits" : "DIFFERENT");
    std::printf("omp backend against float64: dQ %.2e (bound %.2e), dK %.2e (bound %.2e), "
                "dV %.2e (bound %.2e)\n\n",
                eq, bound.dQ, ek, bound.dK, ev, bound.dV);
    examples::print_gradients(dQf.data(), dKf.data(), dVf.data(), N, d);
    const bool ok = identical && same_dq_pass && omp_ok;
    std::printf("%s\n", ok ? "check: FlashAttention-2's backward gives Algorithm 4's gradients, bit for bit"
                           : "CHECK FAILED: FlashAttention-2's backward differs from Algorithm 4");
    return ok ? 0 : 1;
}
