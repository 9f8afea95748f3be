// examples/counted_standard.cpp — Algorithm 0 with HBM accesses counted; see counted_standard.hpp.
#include "counted_standard.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/online_softmax.hpp"

namespace flashattn::examples {

std::int64_t standard_tile_size(std::int64_t M, std::int64_t d) {
    std::int64_t b = static_cast<std::int64_t>(std::sqrt(double(d * d + M))) - d;
    while (b > 1 && 2 * b * d + b * b > M) --b;  // guard against rounding up
    while (2 * (b + 1) * d + (b + 1) * (b + 1) <= M) ++b;
    return std::max<std::int64_t>(b, 1);
}

void counted_standard_attention(const AttentionProblem& p, const float* Q, const float* K,
                                const float* V, float* O, std::int64_t M, IoCounter& io) {
    validate(p);
    if (p.batch * p.heads != 1)
        throw std::invalid_argument("batch*heads = " + std::to_string(p.batch * p.heads) +
                                    ": counted_standard_attention takes one (batch, head)");
    if (p.causal || p.block_mask.active())
        throw std::invalid_argument("causal/block mask: counted_standard_attention has no masks");
    if (M < 4 * p.dim)
        throw std::invalid_argument("M = " + std::to_string(M) + ": must be at least 4d = " +
                                    std::to_string(4 * p.dim));
    const std::int64_t N_q = p.seq_q, N_kv = p.seq_kv, d = p.dim;
    const std::int64_t b = standard_tile_size(M, d);
    const float scale = p.softmax_scale();
    std::vector<float> S(N_q * N_kv), P(N_q * N_kv);  // HBM: both N_q x N_kv, materialized
    std::vector<float> Q_blk(b * d), KV_blk(b * d), tile(b * b), O_blk(b * d);  // SRAM

    // Algorithm 0 line 1: load Q, K by blocks from HBM, compute S = QK^T, write S to HBM.
    for (std::int64_t r0 = 0; r0 < N_q; r0 += b) {
        const std::int64_t rows = std::min(b, N_q - r0);
        std::copy(Q + r0 * d, Q + (r0 + rows) * d, Q_blk.begin());
        io.reads += rows * d;
        for (std::int64_t c0 = 0; c0 < N_kv; c0 += b) {
            const std::int64_t cols = std::min(b, N_kv - c0);
            std::copy(K + c0 * d, K + (c0 + cols) * d, KV_blk.begin());
            io.reads += cols * d;
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t c = 0; c < cols; ++c) {
                    float s = 0.0f;
                    for (std::int64_t k = 0; k < d; ++k) s += Q_blk[r * d + k] * KV_blk[c * d + k];
                    tile[r * b + c] = scale * s;
                }
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t c = 0; c < cols; ++c) S[(r0 + r) * N_kv + c0 + c] = tile[r * b + c];
            io.writes += rows * cols;
        }
    }

    // Algorithm 0 line 2: read S from HBM, compute P = softmax(S), write P to HBM. Three passes
    // over each row: its maximum, its sum of exponentials, and P's row.
    for (std::int64_t i = 0; i < N_q; ++i) {
        const float* S_row = S.data() + i * N_kv;
        float m = neg_infinity();
        for (std::int64_t j = 0; j < N_kv; ++j) m = nan_max(m, S_row[j]);
        float l = 0.0f;
        for (std::int64_t j = 0; j < N_kv; ++j) l += exp_shifted(S_row[j], m);
        for (std::int64_t j = 0; j < N_kv; ++j) P[i * N_kv + j] = exp_shifted(S_row[j], m) / l;
        io.reads += 3 * N_kv;
        io.writes += N_kv;
    }

    // Algorithm 0 line 3: load P, V by blocks from HBM, compute O = PV, write O to HBM.
    for (std::int64_t r0 = 0; r0 < N_q; r0 += b) {
        const std::int64_t rows = std::min(b, N_q - r0);
        std::fill(O_blk.begin(), O_blk.end(), 0.0f);
        for (std::int64_t c0 = 0; c0 < N_kv; c0 += b) {
            const std::int64_t cols = std::min(b, N_kv - c0);
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t c = 0; c < cols; ++c) tile[r * b + c] = P[(r0 + r) * N_kv + c0 + c];
            std::copy(V + c0 * d, V + (c0 + cols) * d, KV_blk.begin());
            io.reads += rows * cols + cols * d;
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t c = 0; c < cols; ++c)
                    for (std::int64_t k = 0; k < d; ++k)
                        O_blk[r * d + k] += tile[r * b + c] * KV_blk[c * d + k];
        }
        std::copy(O_blk.begin(), O_blk.begin() + rows * d, O + r0 * d);
        io.writes += rows * d;
    }
}

}  // namespace flashattn::examples
