// examples/03_flashattention2_order.cpp — the FlashAttention-2 loop order on the figure 6 input
// (N = 12, d = 4, Br = 3, Bc = 2), beside Algorithm 1's.
//
// FlashAttention-2 (FlashAttention-2, arXiv 2307.08691, Algorithm 1) swaps the loops: query
// blocks i outside, key/value blocks j inside. O_i, l_i and m_i then stay on chip for the whole
// inner loop, O_i is kept unnormalized and divided by l_i once at the end, and O_i is written to
// HBM once per row block instead of once per (j, i) step. Same result, far fewer O writes.
//
// fa2_order() below is a learner's trace of that order in plain loops; the rule it applies is
// common/online_softmax.hpp's. The fast, parallel form is cpu/omp.cpp (backend `omp`) and, on the
// GPU, cuda/fa2/backend.cu; when `omp` is in this build its O is compared too. Docs: docs/flashattention2.md.
//
// Run: build/<preset>/bin/03_flashattention2_order   (no arguments; exit 1 if a check fails)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/online_softmax.hpp"
#include "common/tiling.hpp"
#include "common/registry.hpp"
#include "cpu/scalar.hpp"
#include "figure6_problem.hpp"
#include "print.hpp"
#include "cpu/reference.hpp"

using namespace flashattn;
using examples::print_matrix;
using examples::print_values;

namespace {

struct OutputWrites {
    std::int64_t blocks = 0;    // how many times an O_i block is written to HBM
    std::int64_t elements = 0;  // how many O elements that is
};

// FlashAttention-2's forward pass for one (batch, head) of `p` (B = H = 1), printing m and l of
// each row block after every inner step. Q, K, V: (N, d); O: (N_q, d); lse: (N_q).
OutputWrites fa2_order(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                       float* O, float* lse) {
    const std::int64_t d = p.dim;
    const BlockSizes blocks = block_sizes_for(p);
    const std::int64_t Tr = tile_count(p.seq_q, blocks.Br), Tc = tile_count(p.seq_kv, blocks.Bc);
    const float scale = p.softmax_scale();
    OutputWrites writes;
    std::vector<float> O_i(blocks.Br * d), P_tilde(blocks.Bc);
    std::vector<SoftmaxState> row(blocks.Br);  // (m_i, l_i) of each row of the block

    for (std::int64_t i = 0; i < Tr; ++i) {  // outer loop: query blocks (independent: parallel)
        const TileRange rows = tile_range(i, blocks.Br, p.seq_q);
        std::printf("\n== i = %lld: Q_%lld = rows %lld-%lld stays on chip; O_i = 0, l_i = 0, m_i = -inf ==\n",
                    (long long)i + 1, (long long)i + 1, (long long)rows.begin + 1, (long long)rows.end);
        std::printf("   after j |%*s |%*s\n", static_cast<int>(8 * rows.size()), "m_i (per row)",
                    static_cast<int>(8 * rows.size()), "l_i (per row)");
        for (std::int64_t r = 0; r < rows.size(); ++r) row[r] = SoftmaxState{};
        for (std::int64_t x = 0; x < rows.size() * d; ++x) O_i[x] = 0.0f;

        for (std::int64_t j = 0; j < Tc; ++j) {  // inner loop: key/value blocks
            const TileRange cols = tile_range(j, blocks.Bc, p.seq_kv);
            for (std::int64_t r = 0; r < rows.size(); ++r) {
                const float* q = Q + (rows.begin + r) * d;
                // S_ij row r, its maximum, and the running maximum m_new.
                std::vector<float> S(cols.size());
                float m_tilde = neg_infinity();
                for (std::int64_t c = 0; c < cols.size(); ++c) {
                    float s = 0.0f;
                    for (std::int64_t k = 0; k < d; ++k) s += q[k] * K[(cols.begin + c) * d + k];
                    S[c] = p.key_visible(rows.begin + r, cols.begin + c) ? scale * s : neg_infinity();
                    m_tilde = nan_max(m_tilde, S[c]);
                }
                const float m_new = nan_max(row[r].m, m_tilde);
                // FA2 exponentiates with m_new directly, so this block's state is (m_new, rowsum)
                // and merge_softmax's block_scale is 1: only the old O_i and l_i are rescaled.
                float rowsum = 0.0f;
                for (std::int64_t c = 0; c < cols.size(); ++c) {
                    P_tilde[c] = exp_shifted(S[c], m_new);
                    rowsum += P_tilde[c];
                }
                const SoftmaxMerge merged = merge_softmax(row[r], {m_new, rowsum});
                // O_i = diag(e^(m_i - m_new)) O_i + P_tilde V_j — unnormalized, no division here.
                for (std::int64_t k = 0; k < d; ++k) {
                    float pv = 0.0f;
                    for (std::int64_t c = 0; c < cols.size(); ++c)
                        if (p.key_visible(rows.begin + r, cols.begin + c))  // masked: absent
                            pv += P_tilde[c] * V[(cols.begin + c) * d + k];
                    O_i[r * d + k] = merged.old_scale * O_i[r * d + k] + merged.block_scale * pv;
                }
                row[r] = {merged.m_new, merged.l_new};
            }
            std::printf("   %7lld |", (long long)j + 1);
            for (std::int64_t r = 0; r < rows.size(); ++r) examples::print_number(row[r].m);
            std::printf(" |");
            for (std::int64_t r = 0; r < rows.size(); ++r) examples::print_number(row[r].l);
            std::printf("\n");
        }

        // After the inner loop: divide by l_i once, write O_i and LSE_i = m_i + log(l_i) to HBM.
        for (std::int64_t r = 0; r < rows.size(); ++r) {
            for (std::int64_t k = 0; k < d; ++k)
                O[(rows.begin + r) * d + k] = normalize_output(O_i[r * d + k], row[r].l);
            lse[rows.begin + r] = log_sum_exp(row[r]);
        }
        writes.blocks += 1;
        writes.elements += rows.size() * d;
        print_matrix("   O_i = O_i / l_i, written to HBM once:", O + rows.begin * d, rows.size(), d, d,
                     rows.begin + 1);
    }
    return writes;
}

// Counts Algorithm 1's O writes by watching the scalar form: line 12 writes O_i at every step.
class CountOutputWrites : public ScalarTrace {
public:
    void after_update(const ScalarStep& s) override {
        writes.blocks += 1;
        writes.elements += s.rows.size() * s.d;
    }
    OutputWrites writes;
};

}  // namespace

int main() {
    const examples::Figure6 f = examples::figure6_problem();
    const AttentionProblem& p = f.problem;
    const float *Q = f.data.Q.data(), *K = f.data.K.data(), *V = f.data.V.data();
    std::printf("FlashAttention-2 order on the figure 6 input: N = 12, d = 4, Br = 3, Bc = 2\n"
                "(the same Q, K, V as 02_algorithm1_trace; query blocks outside, key blocks inside)\n");

    std::vector<float> O_fa2(p.q_elements()), lse_fa2(p.lse_elements());
    const OutputWrites fa2 = fa2_order(p, Q, K, V, O_fa2.data(), lse_fa2.data());

    std::vector<float> O_fa1(p.q_elements()), lse_fa1(p.lse_elements());
    CountOutputWrites counter;
    scalar_attention(p, Q, K, V, O_fa1.data(), lse_fa1.data(), nullptr, &counter);
    const OutputWrites fa1 = counter.writes;

    const Reference ref = reference_attention(p, Q, K, V);
    std::vector<float> O_std(p.q_elements());
    run_backend(find_backend("standard"), p, Q, K, V, O_std.data(), nullptr);
    const double bound = 2 * max_abs_error(O_std.data(), ref.O.data(), p.q_elements()) + 1e-6;

    double fa1_vs_fa2 = 0;
    for (std::int64_t x = 0; x < p.q_elements(); ++x)
        fa1_vs_fa2 = std::max(fa1_vs_fa2, static_cast<double>(std::fabs(O_fa1[x] - O_fa2[x])));
    const double err_fa2 = max_abs_error(O_fa2.data(), ref.O.data(), p.q_elements());
    const double err_fa1 = max_abs_error(O_fa1.data(), ref.O.data(), p.q_elements());
    const double err_lse = max_abs_error(lse_fa2.data(), ref.lse.data(), p.lse_elements());

    std::printf("\nSame result:\n");
    std::printf("  max |O_FA2 - O_Algorithm1 (scalar)|   = %.2e\n", fa1_vs_fa2);
    std::printf("  max |O_FA2 - O_standard (float64)|    = %.2e  (bound %.2e)\n", err_fa2, bound);
    std::printf("  max |O_scalar - O_standard (float64)| = %.2e\n", err_fa1);
    std::printf("  max |LSE_FA2 - LSE_standard|          = %.2e\n", err_lse);
    bool ok = err_fa2 <= bound && err_fa1 <= bound;
    for (const Backend& b : available_backends()) {
        if (b.name != "omp") continue;
        std::vector<float> O_omp(p.q_elements());
        run_backend(b, p, Q, K, V, O_omp.data(), nullptr);
        const double err_omp = max_abs_error(O_omp.data(), ref.O.data(), p.q_elements());
        std::printf("  max |O_omp - O_standard (float64)|    = %.2e  (backend omp, cpu/omp.cpp)\n", err_omp);
        ok = ok && err_omp <= bound;
    }

    std::printf("\nWrites of O to HBM:\n");
    std::printf("  Algorithm 1 (j outside): %3lld block writes, %4lld elements  (once per (j, i) step: Tc x Tr)\n",
                (long long)fa1.blocks, (long long)fa1.elements);
    std::printf("  FlashAttention-2       : %3lld block writes, %4lld elements  (once per row block: Tr)\n",
                (long long)fa2.blocks, (long long)fa2.elements);
    std::printf("  Algorithm 1 also reads O_i back at every step (line 8) and writes l_i, m_i (line 13);\n"
                "  FlashAttention-2 writes only O_i and LSE_i = m_i + log(l_i), once.\n");
    const std::int64_t Tr = tile_count(p.seq_q, p.block_q), Tc = tile_count(p.seq_kv, p.block_kv);
    ok = ok && fa1.blocks == Tr * Tc && fa2.blocks == Tr;
    std::printf("\n%s\n", ok ? "check: both orders give standard attention's O"
                             : "CHECK FAILED: an order differs from standard attention");
    return ok ? 0 : 1;
}
