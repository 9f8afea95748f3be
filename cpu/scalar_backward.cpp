// cpu/scalar_backward.cpp — Algorithm 4 (the FlashAttention backward pass, paper Appendix B.4)
// line by line; see scalar.hpp and docs/algorithm4_walkthrough.md.
//
// Each statement that implements a line of Algorithm 4 carries a tag "Alg4 Ln:", checked against
// the walkthrough by tests/test_docs_drift.py. Blocks are numbered from 0 here (j, i) and from 1
// in the paper: the code's step (j, i) is the paper's (j + 1, i + 1). The rule itself (P rebuilt from S and the saved
// statistics, dS = P o (dP - D), D = rowsum(dO o O)) is common/backward.hpp's.
//
// Two departures from the paper, both about the statistics and the sums, none about the order:
//   * the forward saves L = m + log(l) (FlashAttention-2's single statistic) rather than m and l;
//     line 13's diag(l_i)^-1 exp(S_ij - m_i) is exp(S_ij - L_i), the same number;
//   * the on-chip accumulators dK_j, dV_j and the "HBM" dQ are kept in double and rounded to float
//     once at the end: a float running sum over N rows drifts by ~sqrt(N) ulps, more than the
//     tests' 2x rule allows against standard attention's blocked GEMM sums (the forward's line 10
//     sums in double for the same reason).
#include <algorithm>
#include <vector>

#include "common/backward.hpp"
#include "cpu/scalar.hpp"
#include "cpu/workspace.hpp"

namespace flashattn {
namespace {

// Algorithm 4 for one query head h of (batch b). Q, O, dO, lse point at that head's rows; K, V at
// its K/V head's. dQ is that head's "HBM" dQ (double, N_q x d); dK, dV are the K/V head's "HBM"
// gradients (double, N_kv x d), to which line 24 adds this head's share (a GQA group sums there).
void algorithm4(const AttentionProblem& p, const ScalarPlan& plan, const float* Q, const float* K,
                const float* V, const float* O, const float* dO, const float* L, double* dQ,
                double* dK, double* dV, IoCounter& io, const ScalarBackwardTrace& trace,
                std::int64_t b, std::int64_t h) {
    const std::int64_t N_q = p.seq_q, N_kv = p.seq_kv, d = p.dim;
    // tau: the softmax scale of the paper's Algorithm 2 (the forward this is the backward of),
    // S = tau Q K^T; 1/sqrt(d) unless the problem sets another.
    const float tau = p.softmax_scale();
    // Alg4 L1: (dropout only) set the random generator's state R as the forward left it; no dropout here
    const std::int64_t Br = plan.blocks.Br, Bc = plan.blocks.Bc;  // Alg4 L2: Bc = ceil(M/4d), Br = min(ceil(M/4d), d)

    // The "SRAM": fixed-size buffers, allocated once; tiles at a ragged tail use a prefix.
    WorkBuffer<float> K_j(Bc * d), V_j(Bc * d), Q_i(Br * d), O_i(Br * d), dO_i(Br * d);
    WorkBuffer<float> L_i(Br), D_i(Br), P_ij(Br * Bc), dP_dropped(Br * Bc), dS_ij(Br * Bc);
    WorkBuffer<double> dK_j(Bc * d), dV_j(Bc * d), dQ_i(Br * d);

    // Alg4 L3: Q in Tr blocks of Br rows, K and V in Tc blocks of Bc rows (the last may be short)
    const std::int64_t Tr = plan.Tr, Tc = plan.Tc;
    // Alg4 L4: O, dO and the statistics L in Tr blocks like Q: block i of each is these rows
    const auto query_block = [&](std::int64_t i) { return tile_range(i, Br, N_q); };
    // Alg4 L5: dQ = 0 in HBM (this head's; dK = dV = 0 by the caller, once for a GQA group)
    std::fill(dQ, dQ + N_q * d, 0.0);
    io.writes += N_q * d;
    for (std::int64_t j = 0; j < Tc; ++j) {  // Alg4 L6: for 1 <= j <= Tc
        const TileRange cols = tile_range(j, Bc, N_kv);
        const std::int64_t bc = cols.size();

        // Alg4 L7: load K_j, V_j from HBM to on-chip SRAM
        for (std::int64_t r = 0; r < bc * d; ++r) {
            K_j[r] = K[cols.begin * d + r];
            V_j[r] = V[cols.begin * d + r];
        }
        io.reads += 2 * bc * d;
        // Alg4 L8: initialize dK_j = 0, dV_j = 0 on SRAM
        std::fill(dK_j.begin(), dK_j.end(), 0.0);
        std::fill(dV_j.begin(), dV_j.end(), 0.0);

        for (std::int64_t i = 0; i < Tr; ++i) {  // Alg4 L9: for 1 <= i <= Tr
            const TileRange rows = query_block(i);
            const std::int64_t br = rows.size();
            const TileVisibility visibility = classify_tile(p, rows, cols);
            if (visibility == TileVisibility::none) continue;  // Alg5: skip a zero block
            const auto visible = [&](std::int64_t r, std::int64_t c) {
                return visibility == TileVisibility::full ||
                       p.key_visible(rows.begin + r, cols.begin + c);
            };

            // Alg4 L10: load Q_i, O_i, dO_i, dQ_i, l_i, m_i (here L_i) from HBM to on-chip SRAM
            for (std::int64_t r = 0; r < br * d; ++r) {
                Q_i[r] = Q[rows.begin * d + r];
                O_i[r] = O[rows.begin * d + r];
                dO_i[r] = dO[rows.begin * d + r];
                dQ_i[r] = dQ[rows.begin * d + r];
            }
            for (std::int64_t r = 0; r < br; ++r) L_i[r] = L[rows.begin + r];
            io.reads += 4 * br * d + br;

            // Alg4 L11: S_ij = tau Q_i K_j^T (into the P_ij buffer, which line 13 turns into P_ij)
            for (std::int64_t r = 0; r < br; ++r)
                for (std::int64_t c = 0; c < bc; ++c) {
                    // The same float sum as the forward's line 9, so that S_ij is the forward's
                    // bit for bit and exp(S_ij - L_i) cancels what L_i took from it.
                    float s = 0.0f;
                    for (std::int64_t k = 0; k < d; ++k) s += Q_i[r * d + k] * K_j[c * d + k];
                    P_ij[r * Bc + c] = tau * s;
                }
            // Alg4 L12: S_ij^masked = MASK(S_ij): -inf, so that line 13 gives the pair exactly 0
            for (std::int64_t r = 0; r < br; ++r)
                for (std::int64_t c = 0; c < bc; ++c)
                    if (!visible(r, c)) P_ij[r * Bc + c] = -INFINITY;
            // Alg4 L13: P_ij = diag(l_i)^-1 exp(S_ij^masked - m_i) = exp(S_ij^masked - L_i)
            for (std::int64_t r = 0; r < br; ++r)
                for (std::int64_t c = 0; c < bc; ++c)
                    P_ij[r * Bc + c] = recomputed_probability(P_ij[r * Bc + c], L_i[r]);
            // Alg4 L14: (dropout only) draw the mask Z_ij, entries 1/(1 - p_drop) or 0; here Z_ij = 1
            const float* P_dropped = P_ij.data();  // Alg4 L15: P_ij^dropped = P_ij o Z_ij = P_ij

            // Alg4 L16: dV_j = dV_j + (P_ij^dropped)^T dO_i (a masked pair is absent, not 0 x dO)
            for (std::int64_t c = 0; c < bc; ++c)
                for (std::int64_t k = 0; k < d; ++k) {
                    double sum = 0.0;
                    for (std::int64_t r = 0; r < br; ++r)
                        if (visible(r, c)) sum += double(P_dropped[r * Bc + c]) * dO_i[r * d + k];
                    dV_j[c * d + k] += sum;
                }

            // Alg4 L17: dP_ij^dropped = dO_i V_j^T (masked pairs 0: nothing below reads them)
            for (std::int64_t r = 0; r < br; ++r)
                for (std::int64_t c = 0; c < bc; ++c) {
                    double dP = 0.0;
                    if (visible(r, c))
                        for (std::int64_t k = 0; k < d; ++k) dP += double(dO_i[r * d + k]) * V_j[c * d + k];
                    dP_dropped[r * Bc + c] = float(dP);
                }
            const float* dP_ij = dP_dropped.data();  // Alg4 L18: dP_ij = dP_ij^dropped o Z_ij = dP_ij^dropped

            // Alg4 L19: D_i = rowsum(dO_i o O_i): O_i was loaded (line 10) for this alone
            for (std::int64_t r = 0; r < br; ++r) D_i[r] = output_delta(&dO_i[r * d], &O_i[r * d], d);

            // Alg4 L20: dS_ij = P_ij o (dP_ij - D_i) (masked pairs 0)
            for (std::int64_t r = 0; r < br; ++r)
                for (std::int64_t c = 0; c < bc; ++c)
                    dS_ij[r * Bc + c] =
                        visible(r, c) ? score_gradient(P_ij[r * Bc + c], dP_ij[r * Bc + c], D_i[r]) : 0.0f;

            // Alg4 L21: write dQ_i = dQ_i + tau dS_ij K_j to HBM
            for (std::int64_t r = 0; r < br; ++r)
                for (std::int64_t k = 0; k < d; ++k) {
                    double sum = 0.0;
                    for (std::int64_t c = 0; c < bc; ++c)
                        if (visible(r, c)) sum += double(dS_ij[r * Bc + c]) * K_j[c * d + k];
                    dQ_i[r * d + k] += tau * sum;
                    dQ[rows.begin * d + r * d + k] = dQ_i[r * d + k];
                }
            io.writes += br * d;

            // Alg4 L22: dK_j = dK_j + tau dS_ij^T Q_i
            for (std::int64_t c = 0; c < bc; ++c)
                for (std::int64_t k = 0; k < d; ++k) {
                    double sum = 0.0;
                    for (std::int64_t r = 0; r < br; ++r)
                        if (visible(r, c)) sum += double(dS_ij[r * Bc + c]) * Q_i[r * d + k];
                    dK_j[c * d + k] += tau * sum;
                }

            if (trace) {
                ScalarBackwardStep seen;
                seen.batch = b, seen.head = h, seen.j = j, seen.i = i;
                seen.rows = rows, seen.cols = cols, seen.d = d, seen.Bc = Bc;
                seen.P_ij = P_ij.data(), seen.dP_ij = dP_ij, seen.dS_ij = dS_ij.data();
                seen.D_i = D_i.data(), seen.tau = tau;
                seen.dK_j = dK_j.data(), seen.dV_j = dV_j.data(), seen.dQ_i = dQ_i.data();
                trace(seen);
            }
        }  // Alg4 L23: end for (i)

        // Alg4 L24: write dK_j = dK_j, dV_j = dV_j to HBM (added: a GQA group's heads share them)
        for (std::int64_t r = 0; r < bc * d; ++r) {
            dK[cols.begin * d + r] += dK_j[r];
            dV[cols.begin * d + r] += dV_j[r];
        }
        io.writes += 2 * bc * d;
    }  // Alg4 L25: end for (j)
}  // Alg4 L26: return dQ, dK, dV (in the caller's "HBM" arrays)

}  // namespace

void scalar_backward(const AttentionProblem& p, const BackwardInputs& in, float* dQ, float* dK,
                     float* dV, IoCounter* io, const ScalarBackwardTrace& trace) {
    const ScalarPlan plan = scalar_plan(p);  // validates; Algorithm 4 line 2 is Algorithm 1 line 1
    require_backward_inputs(in);
    require_array(dQ, "dQ"), require_array(dK, "dK"), require_array(dV, "dV");
    IoCounter local;
    IoCounter& counter = io ? *io : local;
    // The "HBM" gradients of one (batch, K/V head) group, in double (see the top of this file).
    WorkBuffer<double> dQ_h(p.seq_q * p.dim), dK_g(p.seq_kv * p.dim), dV_g(p.seq_kv * p.dim);
    for (std::int64_t b = 0; b < p.batch; ++b)
        for (std::int64_t g = 0; g < p.heads_kv; ++g) {
            std::fill(dK_g.begin(), dK_g.end(), 0.0);  // (Algorithm 4 line 5 for dK, dV of this K/V head)
            std::fill(dV_g.begin(), dV_g.end(), 0.0);
            counter.writes += 2 * p.seq_kv * p.dim;
            for (std::int64_t h = g * p.group_size(); h < (g + 1) * p.group_size(); ++h) {
                algorithm4(p, plan, in.Q + p.q_offset(b, h), in.K + p.kv_offset(b, h),
                           in.V + p.kv_offset(b, h), in.O + p.q_offset(b, h),
                           in.dO + p.q_offset(b, h), in.lse + p.lse_offset(b, h), dQ_h.data(),
                           dK_g.data(), dV_g.data(), counter, trace, b, h);
                std::copy(dQ_h.begin(), dQ_h.end(), dQ + p.q_offset(b, h));
            }
            std::copy(dK_g.begin(), dK_g.end(), dK + p.kv_offset(b, g * p.group_size()));
            std::copy(dV_g.begin(), dV_g.end(), dV + p.kv_offset(b, g * p.group_size()));
        }
}

}  // namespace flashattn
