// cpu/omp.cpp — FlashAttention-2 on the CPU; see omp.hpp and docs/omp.md.
//
// Notation of the FlashAttention-2 paper (its Algorithm 1), per (batch, head) pair:
//   for each query tile Q_i (Br rows), in parallel:          O_i = 0, l_i = 0, m_i = -inf
//     for each key/value tile K_j, V_j (Bc rows), in order:
//       S_ij   = scale Q_i K_j^T                                        (GEMM)
//       m_new  = max(m_i, rowmax(S_ij))
//       P_ij   = exp(S_ij - m_new)           l_i = e^(m_i - m_new) l_i + rowsum(P_ij)
//       O_i    = diag(e^(m_i - m_new)) O_i + P_ij V_j                   (GEMM)
//       m_i    = m_new
//     O_i = diag(l_i)^-1 O_i,   LSE_i = m_i + log(l_i)
// Masks: a tile the masks hide entirely is skipped (classify_tile: none); a partly visible tile
// gets -inf at its hidden scores; a fully visible one is not looked at element by element.
#include "cpu/omp.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/online_softmax.hpp"
#include "cpu/parallel.hpp"
#include "cpu/vector_softmax.hpp"
#include "cpu/workspace.hpp"

namespace flashattn {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstTile = Eigen::Map<const RowMatrix>;  // rows of an input or output, contiguous
using Tile = Eigen::Map<RowMatrix>;
using StridedTile = Eigen::Map<RowMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;

constexpr std::int64_t kAlignFloats = 16;  // 64 bytes: a cache line, and the widest SIMD vector

std::int64_t round_up(std::int64_t n, std::int64_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

// One thread's tile buffers, carved from one WorkBuffer and aligned to 64 bytes, so that every
// thread's buffers have the same alignment. (Vectorized loops may split their reductions at
// alignment boundaries; equal alignment keeps the results equal whichever thread runs a tile.)
struct ThreadTiles {
    WorkBuffer<float> storage;
    float* S_ij = nullptr;       // Br x S_stride: scores, then P_ij in place
    float* m_i = nullptr;        // Br: running row maxima
    float* l_i = nullptr;        // Br: running row sums
    WorkBuffer<float> V_finite;  // Bc x d, only when a partly masked V_j has inf/NaN rows

    explicit ThreadTiles(const OmpPlan& plan)
        : storage(static_cast<std::size_t>(plan.thread_floats + kAlignFloats)) {
        const std::int64_t Br = plan.blocks.Br;
        // new[] gives at least 16-byte alignment; step to the next 64-byte boundary.
        const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(storage.data()) % 64;
        float* next = storage.data() + (misaligned ? (64 - misaligned) / sizeof(float) : 0);
        const auto carve = [&next](std::int64_t floats) {
            float* part = next;
            next += round_up(floats, kAlignFloats);
            return part;
        };
        S_ij = carve(Br * plan.S_stride);
        m_i = carve(Br);
        l_i = carve(Br);
    }
};

// O_i += P_ij V_j for a partly masked tile whose V_j has rows with inf or NaN. A masked key must
// be absent from the sum, but P_ij V_j would add 0 * inf = NaN for it; so (as standard.cpp does)
// the GEMM runs with those rows zeroed and they are added back only where the key is visible.
void add_pv_with_nonfinite_v(const AttentionProblem& p, TileRange rows, TileRange cols,
                             const StridedTile& P_ij, const ConstTile& V_j, Tile& O_i,
                             ThreadTiles& tiles) {
    const std::int64_t bc = cols.size(), d = p.dim;
    if (tiles.V_finite.size() < static_cast<std::size_t>(bc * d))
        tiles.V_finite = WorkBuffer<float>(static_cast<std::size_t>(bc * d));
    Tile V_clean(tiles.V_finite.data(), bc, d);
    V_clean = V_j;
    std::vector<std::int64_t> bad_rows;
    for (std::int64_t c = 0; c < bc; ++c)
        if (!V_j.row(c).allFinite()) {
            bad_rows.push_back(c);
            V_clean.row(c).setZero();
        }
    O_i.noalias() += P_ij * V_clean;
    for (std::int64_t c : bad_rows)
        for (std::int64_t r = 0; r < rows.size(); ++r)
            if (p.key_visible(rows.begin + r, cols.begin + c))
                O_i.row(r) += P_ij(r, c) * V_j.row(c);
}

// One work item: query tile `rows` of one (batch, head) pair, against every key/value tile.
// Q, K, V, O point at that pair's (seq, dim) matrices, lse at its seq_q values (or nullptr).
void attend_query_tile(const AttentionProblem& p, const OmpPlan& plan, TileRange rows,
                       const float* Q, const float* K, const float* V, float* O, float* lse,
                       ThreadTiles& tiles) {
    const std::int64_t d = p.dim, br = rows.size();
    const std::int64_t Bc = plan.blocks.Bc;

    const ConstTile Q_i(Q + rows.begin * d, br, d);
    const float scale = p.softmax_scale();
    // O_i accumulates in place in the output rows (unnormalized until the end).
    Tile O_i(O + rows.begin * d, br, d);
    O_i.setZero();
    float* m_i = tiles.m_i;
    float* l_i = tiles.l_i;
    std::fill(m_i, m_i + br, neg_infinity());
    std::fill(l_i, l_i + br, 0.0f);

    for (std::int64_t j = 0; j < plan.Tc; ++j) {
        const TileRange cols = tile_range(j, Bc, p.seq_kv);
        const TileVisibility visibility = classify_tile(p, rows, cols);
        if (visibility == TileVisibility::none) continue;  // hidden tile: K_j, V_j never read
        const std::int64_t bc = cols.size();
        const ConstTile K_j(K + cols.begin * d, bc, d);
        const ConstTile V_j(V + cols.begin * d, bc, d);

        // S_ij = scale Q_i K_j^T. Eigen applies the scale to each finished dot product (GEMM's
        // alpha), as standard attention does; scaling Q_i first would round every q once more,
        // which large logits (|S| ~ 1e4, where one ulp of S moves e^S by 1e-3) would show.
        StridedTile S_ij(tiles.S_ij, br, bc, Eigen::OuterStride<>(plan.S_stride));
        S_ij.noalias() = scale * (Q_i * K_j.transpose());
        if (visibility == TileVisibility::partial)
            for (std::int64_t r = 0; r < br; ++r)
                for (std::int64_t c = 0; c < bc; ++c)
                    if (!p.key_visible(rows.begin + r, cols.begin + c)) S_ij(r, c) = neg_infinity();

        // The online-softmax rule, row by row (common/online_softmax.hpp).
        for (std::int64_t r = 0; r < br; ++r) {
            float* S_r = tiles.S_ij + r * plan.S_stride;
            const float m_new = nan_max(m_i[r], row_max(S_r, bc));
            const float alpha = exp_shifted(m_i[r], m_new);         // rescales what came before
            const float row_sum = exp_shifted_row(S_r, bc, m_new);  // S_ij row -> P_ij row
            l_i[r] = alpha * l_i[r] + row_sum;
            if (alpha != 1.0f) O_i.row(r) *= alpha;  // (x * 1 == x: skipping it changes nothing)
            m_i[r] = m_new;
        }

        // O_i += P_ij V_j
        if (visibility == TileVisibility::partial && !V_j.allFinite())
            add_pv_with_nonfinite_v(p, rows, cols, S_ij, V_j, O_i, tiles);
        else
            O_i.noalias() += S_ij * V_j;
    }

    // O_i = diag(l_i)^-1 O_i (0 for a row that saw no key), LSE_i = m_i + log(l_i).
    for (std::int64_t r = 0; r < br; ++r) {
        float* O_r = O + (rows.begin + r) * d;
        for (std::int64_t k = 0; k < d; ++k) O_r[k] = normalize_output(O_r[k], l_i[r]);
        if (lse) lse[rows.begin + r] = log_sum_exp({m_i[r], l_i[r]});
    }
}

}  // namespace

BlockSizes omp_cache_blocks(std::int64_t dim) {
    // docs/omp.md has the arithmetic. Per thread, the tiles live in the core's private L2
    // (512 KiB - 2 MiB on current server cores): S_ij = Br x Bc floats = 128 KiB, K_j and V_j
    // together at most 256 KiB (2 Bc d floats), Q_i and O_i 2 Br d floats. Br = 128 rows of Q
    // reuse each K_j, V_j row 128 times, so that tile fetched from L3 costs little; Bc = 256 keeps
    // the GEMMs large enough for Eigen's kernels and the softmax loops long.
    const std::int64_t Br = 128;
    const std::int64_t Bc = std::clamp<std::int64_t>((32768 / dim) / 16 * 16, 16, 256);
    return {Br, Bc};
}

OmpPlan omp_plan(const AttentionProblem& p) {
    validate(p);
    OmpPlan plan;
    const bool asked = p.block_q > 0 || p.sram_floats > 0;
    plan.blocks = asked ? block_sizes_for(p) : omp_cache_blocks(p.dim);
    // A tile never has more rows than the sequence: a block beyond N is one tile of N rows.
    plan.blocks.Br = std::min(plan.blocks.Br, p.seq_q);
    plan.blocks.Bc = std::min(plan.blocks.Bc, p.seq_kv);
    plan.Tr = tile_count(p.seq_q, plan.blocks.Br);
    plan.Tc = tile_count(p.seq_kv, plan.blocks.Bc);
    plan.S_stride = round_up(plan.blocks.Bc, kAlignFloats);
    const std::int64_t Br = plan.blocks.Br;
    // Only block sizes asked for can make Br * S_stride huge (both near 2^40): refuse before the
    // product overflows.
    if (Br > (std::int64_t{1} << 56) / plan.S_stride)
        throw std::runtime_error("omp tiles of " + std::to_string(Br) + " x " +
                                 std::to_string(plan.blocks.Bc) + " are more than any memory");
    plan.thread_floats = Br * plan.S_stride + 2 * round_up(Br, kAlignFloats);
    return plan;
}

void omp_attention(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                   float* O, float* lse) {
    const OmpPlan plan = omp_plan(p);  // validates
    // Work items (b, h, i). Within a pair the query tiles go last-first: with a causal mask the
    // last tiles see the most keys, and starting the longest items first balances the threads.
    const std::int64_t pairs = p.batch * p.heads;
    parallel_for_with_state(
        pairs * plan.Tr, [&] { return ThreadTiles(plan); },
        [&](ThreadTiles& tiles, std::int64_t item) {
            const std::int64_t bh = item / plan.Tr;
            const std::int64_t i = plan.Tr - 1 - item % plan.Tr;
            const std::int64_t b = bh / p.heads, h = bh % p.heads;
            attend_query_tile(p, plan, tile_range(i, plan.blocks.Br, p.seq_q), Q + p.q_offset(b, h),
                              K + p.kv_offset(b, h), V + p.kv_offset(b, h), O + p.q_offset(b, h),
                              lse ? lse + p.lse_offset(b, h) : nullptr, tiles);
        });
}

}  // namespace flashattn
