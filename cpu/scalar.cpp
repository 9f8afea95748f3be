// cpu/scalar.cpp — Algorithm 1 line by line; see scalar.hpp and docs/algorithm1_walkthrough.md.
//
// Each statement that implements a line of the paper's Algorithm 1 carries a tag "Alg1 Ln:"; the
// block-sparse variant's extra test carries "Alg5". The tags are checked against the docs by a
// test, so they move with the code.
#include "cpu/scalar.hpp"

#include <algorithm>
#include <vector>

#include "common/online_softmax.hpp"
#include "cpu/workspace.hpp"

namespace flashattn {

ScalarPlan scalar_plan(const AttentionProblem& p) {
    validate(p);
    ScalarPlan plan;
    const bool explicit_blocks = p.block_q > 0;
    plan.M = explicit_blocks ? 0 : (p.sram_floats > 0 ? p.sram_floats : kDefaultSramFloats);
    plan.blocks = block_sizes_for(p);  // Alg1 L1: Bc = ceil(M/4d), Br = min(ceil(M/4d), d)
    // A tile never holds more rows than the sequence has: a block size (or an M) beyond N gives
    // the same single tile (line 3: T = 1) without sizing the "SRAM" buffers for rows that do not
    // exist, and keeps Br * Bc bounded by N_q * N_kv.
    plan.blocks.Br = std::min(plan.blocks.Br, p.seq_q);
    plan.blocks.Bc = std::min(plan.blocks.Bc, p.seq_kv);
    plan.Tr = tile_count(p.seq_q, plan.blocks.Br);
    plan.Tc = tile_count(p.seq_kv, plan.blocks.Bc);
    const std::int64_t Br = plan.blocks.Br, Bc = plan.blocks.Bc, d = p.dim;
    plan.sram_floats = 2 * Bc * d + 2 * Br * d + 2 * Br + work_elements(Br, Bc);
    return plan;
}

namespace {

// Algorithm 1 for one (batch, head) pair. Q, K, V, O point at that pair's matrices; l and m are
// its seq_q-long "HBM" vectors. `trace` (may be null) observes each step of the pair (b, h).
void algorithm1(const AttentionProblem& p, const ScalarPlan& plan, const float* Q, const float* K,
                const float* V, float* O, float* l, float* m, IoCounter& io, ScalarTrace* trace,
                std::int64_t b, std::int64_t h) {
    const std::int64_t N_q = p.seq_q, N_kv = p.seq_kv, d = p.dim;
    const std::int64_t Br = plan.blocks.Br, Bc = plan.blocks.Bc;
    const float scale = p.softmax_scale();

    // The "SRAM": fixed-size buffers, allocated once. Tiles at a ragged tail use a prefix.
    WorkBuffer<float> K_j(Bc * d), V_j(Bc * d), Q_i(Br * d), O_i(Br * d);
    WorkBuffer<float> l_i(Br), m_i(Br), S_ij(Br * Bc);
    WorkBuffer<float> m_tilde(Br), l_tilde(Br);
    // What an observer sees of step (j, i): the SRAM buffers above.
    const auto step = [&](std::int64_t j, std::int64_t i, TileRange rows, TileRange cols) {
        ScalarStep seen;
        seen.batch = b, seen.head = h, seen.j = j, seen.i = i, seen.rows = rows, seen.cols = cols;
        seen.d = d, seen.Bc = Bc;
        seen.Q_i = Q_i.data(), seen.K_j = K_j.data(), seen.V_j = V_j.data(), seen.S_ij = S_ij.data();
        seen.m_tilde = m_tilde.data(), seen.l_tilde = l_tilde.data();
        seen.m_i = m_i.data(), seen.l_i = l_i.data(), seen.O_i = O_i.data();
        return seen;
    };

    // Alg1 L2: initialize O = 0, l = 0, m = -inf in HBM
    for (std::int64_t r = 0; r < N_q * d; ++r) O[r] = 0.0f;
    for (std::int64_t r = 0; r < N_q; ++r) { l[r] = 0.0f; m[r] = neg_infinity(); }
    io.writes += N_q * d + 2 * N_q;

    // Alg1 L3: Q in Tr blocks of Br rows, K and V in Tc blocks of Bc rows (the last may be short)
    const std::int64_t Tr = plan.Tr, Tc = plan.Tc;
    // Alg1 L4: O, l, m in Tr blocks like Q: block i of each is these rows
    const auto query_block = [&](std::int64_t i) { return tile_range(i, Br, N_q); };
    for (std::int64_t j = 0; j < Tc; ++j) {  // Alg1 L5: for 1 <= j <= Tc
        const TileRange cols = tile_range(j, Bc, N_kv);
        const std::int64_t bc = cols.size();

        // Alg1 L6: load K_j, V_j from HBM to on-chip SRAM
        for (std::int64_t r = 0; r < bc * d; ++r) {
            K_j[r] = K[cols.begin * d + r];
            V_j[r] = V[cols.begin * d + r];
        }
        io.reads += 2 * bc * d;

        for (std::int64_t i = 0; i < Tr; ++i) {  // Alg1 L7: for 1 <= i <= Tr
            const TileRange rows = query_block(i);
            const std::int64_t br = rows.size();
            const TileVisibility visibility = classify_tile(p, rows, cols);
            if (visibility == TileVisibility::none) continue;  // Alg5 L8: skip a zero block

            // Alg1 L8: load Q_i, O_i, l_i, m_i from HBM to on-chip SRAM
            for (std::int64_t r = 0; r < br * d; ++r) {
                Q_i[r] = Q[rows.begin * d + r];
                O_i[r] = O[rows.begin * d + r];
            }
            for (std::int64_t r = 0; r < br; ++r) {
                l_i[r] = l[rows.begin + r];
                m_i[r] = m[rows.begin + r];
            }
            io.reads += 2 * br * d + 2 * br;

            // Alg1 L9: S_ij = Q_i K_j^T (scaled; masked keys get -inf)
            for (std::int64_t r = 0; r < br; ++r)
                for (std::int64_t c = 0; c < bc; ++c) {
                    float s = 0.0f;
                    for (std::int64_t k = 0; k < d; ++k) s += Q_i[r * d + k] * K_j[c * d + k];
                    const bool visible = visibility == TileVisibility::full ||
                                         p.key_visible(rows.begin + r, cols.begin + c);
                    S_ij[r * Bc + c] = visible ? scale * s : neg_infinity();
                }
            if (trace) trace->after_scores(step(j, i, rows, cols));

            // Alg1 L10: m_tilde = rowmax(S_ij), P_tilde = exp(S_ij - m_tilde), l_tilde = rowsum(P_tilde)
            for (std::int64_t r = 0; r < br; ++r) {
                float row_max = neg_infinity();
                for (std::int64_t c = 0; c < bc; ++c) row_max = nan_max(row_max, S_ij[r * Bc + c]);
                // Sums over up to N_kv keys in double: a float running sum of ~1000 terms is
                // off by ~sqrt(N) ulps, more than the tests' 2x rule allows against standard
                // attention's blocked GEMM sums at small d (tests/test_variants.cpp, long sums).
                double row_sum = 0.0;
                for (std::int64_t c = 0; c < bc; ++c) {
                    S_ij[r * Bc + c] = exp_shifted(S_ij[r * Bc + c], row_max);  // now P_tilde
                    row_sum += S_ij[r * Bc + c];
                }
                m_tilde[r] = row_max;
                l_tilde[r] = row_sum;
            }

            for (std::int64_t r = 0; r < br; ++r) {
                // Alg1 L11: m_new = max(m_i, m_tilde), l_new = e^(m_i - m_new) l_i + e^(m_tilde - m_new) l_tilde
                const SoftmaxMerge merged = merge_softmax({m_i[r], l_i[r]}, {m_tilde[r], l_tilde[r]});

                // Alg1 L12: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m_tilde - m_new) P_tilde V_j)
                for (std::int64_t k = 0; k < d; ++k) {
                    double pv = 0.0;  // (double for the reason given at line 10's row_sum)
                    for (std::int64_t c = 0; c < bc; ++c) {
                        // A masked key is absent, not 0 * V_j: a NaN in V_j must not leak.
                        if (visibility == TileVisibility::partial &&
                            !p.key_visible(rows.begin + r, cols.begin + c))
                            continue;
                        pv += S_ij[r * Bc + c] * V_j[c * d + k];
                    }
                    O_i[r * d + k] = fa1_output_update(O_i[r * d + k], l_i[r], pv, merged);
                }
                l_i[r] = merged.l_new;
                m_i[r] = merged.m_new;
            }
            for (std::int64_t r = 0; r < br * d; ++r) O[rows.begin * d + r] = O_i[r];  // (write of L12)

            // Alg1 L13: write l_i = l_new, m_i = m_new to HBM
            for (std::int64_t r = 0; r < br; ++r) {
                l[rows.begin + r] = l_i[r];
                m[rows.begin + r] = m_i[r];
            }
            io.writes += br * d + 2 * br;
            if (trace) trace->after_update(step(j, i, rows, cols));
        }  // Alg1 L14: end for (i)
    }  // Alg1 L15: end for (j)
}  // Alg1 L16: return O (already in HBM; normalized at every step by line 12)

}  // namespace

void scalar_attention(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                      float* O, float* lse, IoCounter* io, ScalarTrace* trace) {
    const ScalarPlan plan = scalar_plan(p);  // validates
    require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V"), require_array(O, "O");
    IoCounter local;
    IoCounter& counter = io ? *io : local;
    WorkBuffer<float> l(p.seq_q), m(p.seq_q);  // the "HBM" statistics of one (batch, head)
    for (std::int64_t b = 0; b < p.batch; ++b)
        for (std::int64_t h = 0; h < p.heads; ++h) {
            algorithm1(p, plan, Q + p.q_offset(b, h), K + p.kv_offset(b, h),
                       V + p.kv_offset(b, h), O + p.q_offset(b, h), l.data(), m.data(), counter,
                       trace, b, h);
            if (lse)
                for (std::int64_t r = 0; r < p.seq_q; ++r)
                    lse[p.lse_offset(b, h) + r] = log_sum_exp({m[r], l[r]});
        }
}

}  // namespace flashattn
