// cpu/omp.cpp — FlashAttention-2 on the CPU; see omp.hpp and docs/omp.md.
//
// Notation of the FlashAttention-2 paper (its Algorithm 1), per (batch, head) pair:
//   for each query tile Q_i (Br rows), in parallel:          O_i = 0, l_i = 0, m_i = -inf
//     for each key/value tile K_j, V_j (Bc rows), in order:
//       S_ij   = scale Q_i K_j^T                      (tile_products.hpp: scores)
//       m_new  = max(m_i, rowmax(S_ij))
//       P_ij   = exp(S_ij - m_new)           l_i = e^(m_i - m_new) l_i + rowsum(P_ij)
//       O_i    = diag(e^(m_i - m_new)) O_i + P_ij V_j (tile_products.hpp: add_values)
//       m_i    = m_new
//     O_i = diag(l_i)^-1 O_i,   LSE_i = m_i + log(l_i)
// Masks: a tile the masks hide entirely is skipped (classify_tile: none); a partly visible tile
// gets -inf at its hidden scores; a fully visible one is not looked at element by element.
// Inside a tile pair the rows go in groups of kRows (6 with AVX-512 or AVX2, 4 otherwise:
// tile_products.hpp's block height): S, softmax
// and P V for one group, then the next, so a group's S_ij never leaves L1.
#include "cpu/omp.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/online_softmax.hpp"
#include "cpu/parallel.hpp"
#include "cpu/tile_products.hpp"
#include "cpu/vector_softmax.hpp"
#include "cpu/workspace.hpp"

namespace flashattn {
namespace {

using tiles::kRows;
using tiles::round_up;

constexpr std::int64_t kAlignFloats = 16;  // 64 bytes: a cache line, and the widest SIMD vector
// Query tiles are a multiple of 48 rows: whole row groups of any build (6 or 4 rows).
constexpr std::int64_t kRowMultiple = 48;

// One thread's tile buffers, carved from one WorkBuffer and aligned to 64 bytes, so that every
// thread's buffers have the same alignment (and so the same results, whichever thread runs a tile).
struct ThreadTiles {
    WorkBuffer<float> storage;
    float* Q_i = nullptr;   // row_stride x d: Q_i, rows past the tile zero
    float* O_i = nullptr;   // row_stride x value_stride: unnormalized O_i
    float* K_jT = nullptr;  // d x key_stride: K_j transposed
    float* V_j = nullptr;   // key_stride x value_stride: V_j, padded
    float* S = nullptr;     // kRows x key_stride: one row group's S_ij, then its P_ij in place
    float* m_i = nullptr;   // row_stride: running row maxima
    float* l_i = nullptr;   // row_stride: running row sums
    std::vector<std::int64_t> nonfinite_keys;  // keys of a partly masked V_j with inf/NaN rows

    explicit ThreadTiles(const OmpPlan& plan, std::int64_t d)
        : storage(static_cast<std::size_t>(plan.thread_floats + kAlignFloats),
                  "omp's tile buffers of one thread (Q_i, O_i, K_j^T, V_j, S)") {
        // new[] gives at least 16-byte alignment; step to the next 64-byte boundary.
        const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(storage.data()) % 64;
        float* next = storage.data() + (misaligned ? (64 - misaligned) / sizeof(float) : 0);
        const auto carve = [&next](std::int64_t floats) {
            float* part = next;
            next += round_up(floats, kAlignFloats);
            return part;
        };
        Q_i = carve(plan.row_stride * d);
        O_i = carve(plan.row_stride * plan.value_stride);
        K_jT = carve(d * plan.key_stride);
        V_j = carve(plan.key_stride * plan.value_stride);
        S = carve(kRows * plan.key_stride);
        m_i = carve(plan.row_stride);
        l_i = carve(plan.row_stride);
    }
};

// V_j as add_values reads it: rows of value_stride floats, `keys` rows. The input rows serve as
// they are when they already have that shape (d a multiple of 16, a whole number of 64-key
// blocks) and no key is masked; otherwise V_j is copied into the padded tile, and on a partly
// masked tile its rows with inf or NaN are zeroed and listed: a masked key must be absent from
// O_i, but P_ij V_j would add 0 * inf = NaN for it, so those keys are added back one by one
// where they are visible (in attend_query_tile).
const float* values_of_tile(const float* V_j, std::int64_t bc, std::int64_t d,
                            const OmpPlan& plan, TileVisibility visibility, ThreadTiles& t) {
    t.nonfinite_keys.clear();
    const std::int64_t keys = round_up(bc, tiles::kBlockCols);
    if (visibility == TileVisibility::full && d == plan.value_stride && keys == bc) return V_j;
    tiles::pack_values(V_j, bc, d, keys, plan.value_stride, t.V_j);
    if (visibility == TileVisibility::partial)
        for (std::int64_t c = 0; c < bc; ++c) {
            float* row = t.V_j + c * plan.value_stride;
            if (std::all_of(row, row + d, [](float x) { return std::isfinite(x); })) continue;
            t.nonfinite_keys.push_back(c);
            std::fill(row, row + d, 0.0f);
        }
    return t.V_j;
}

// One work item: query tile `rows` of one (batch, head) pair, against every key/value tile.
// Q, K, V, O point at that pair's (seq, dim) matrices, lse at its seq_q values (or nullptr).
void attend_query_tile(const AttentionProblem& p, const OmpPlan& plan, TileRange rows,
                       const float* Q, const float* K, const float* V, float* O, float* lse,
                       ThreadTiles& t) {
    const std::int64_t d = p.dim, br = rows.size();
    const std::int64_t key_stride = plan.key_stride, value_stride = plan.value_stride;
    const float scale = p.softmax_scale();

    // Q_i (rows past the tile zero, so every row group is whole); O_i = 0, m_i = -inf, l_i = 0.
    std::copy(Q + rows.begin * d, Q + rows.end * d, t.Q_i);
    std::fill(t.Q_i + br * d, t.Q_i + plan.row_stride * d, 0.0f);
    std::fill(t.O_i, t.O_i + plan.row_stride * value_stride, 0.0f);
    std::fill(t.m_i, t.m_i + br, neg_infinity());
    std::fill(t.l_i, t.l_i + br, 0.0f);

    for (std::int64_t j = 0; j < plan.Tc; ++j) {
        const TileRange cols = tile_range(j, plan.blocks.Bc, p.seq_kv);
        const TileVisibility visibility = classify_tile(p, rows, cols);
        if (visibility == TileVisibility::none) continue;  // hidden tile: K_j, V_j never read
        const std::int64_t bc = cols.size(), keys = round_up(bc, tiles::kBlockCols);
        tiles::pack_keys_transposed(K + cols.begin * d, bc, d, key_stride, t.K_jT);
        const float* V_tile = values_of_tile(V + cols.begin * d, bc, d, plan, visibility, t);

        // Each group of kRows rows goes through S, softmax and P V while its S_ij is in L1.
        for (std::int64_t r0 = 0; r0 < br; r0 += kRows) {
            tiles::scores(t.Q_i + r0 * d, d, t.K_jT, keys, key_stride, scale, t.S);  // S_ij
            for (std::int64_t r = r0; r < r0 + kRows; ++r) {
                float* S_r = t.S + (r - r0) * key_stride;
                if (r >= br) {  // a padding row: P = 0, so it adds nothing
                    std::fill(S_r, S_r + key_stride, 0.0f);
                    continue;
                }
                if (visibility == TileVisibility::partial)
                    for (std::int64_t c = 0; c < bc; ++c)
                        if (!p.key_visible(rows.begin + r, cols.begin + c)) S_r[c] = neg_infinity();
                // The online-softmax rule (common/online_softmax.hpp), in its row form.
                const float m_new = nan_max(t.m_i[r], row_max(S_r, bc));
                const float alpha = exp_shifted(t.m_i[r], m_new);  // rescales what came before
                const float row_sum = exp_shifted_row(S_r, bc, m_new);  // S_ij row -> P_ij row
                std::fill(S_r + bc, S_r + key_stride, 0.0f);  // padding keys: P = 0
                t.l_i[r] = alpha * t.l_i[r] + row_sum;
                t.m_i[r] = m_new;
                float* O_r = t.O_i + r * value_stride;
                if (alpha != 1.0f)  // (x * 1 == x: skipping it changes nothing)
                    for (std::int64_t k = 0; k < value_stride; ++k) O_r[k] *= alpha;
            }
            float* O_group = t.O_i + r0 * value_stride;
            tiles::add_values(t.S, keys, key_stride, V_tile, value_stride, O_group);  // += P V_j
            for (std::int64_t c : t.nonfinite_keys)  // see values_of_tile
                for (std::int64_t r = r0; r < std::min(r0 + kRows, br); ++r)
                    if (p.key_visible(rows.begin + r, cols.begin + c))
                        for (std::int64_t k = 0; k < d; ++k)
                            O_group[(r - r0) * value_stride + k] +=
                                t.S[(r - r0) * key_stride + c] * V[(cols.begin + c) * d + k];
        }
    }

    // O_i = diag(l_i)^-1 O_i (0 for a row that saw no key), LSE_i = m_i + log(l_i).
    for (std::int64_t r = 0; r < br; ++r) {
        float* O_r = O + (rows.begin + r) * d;
        for (std::int64_t k = 0; k < d; ++k)
            O_r[k] = normalize_output(t.O_i[r * value_stride + k], t.l_i[r]);
        if (lse) lse[rows.begin + r] = log_sum_exp({t.m_i[r], t.l_i[r]});
    }
}

}  // namespace

BlockSizes omp_cache_blocks(std::int64_t dim) {
    // docs/omp.md has the arithmetic and the measurements. One thread's tiles live in its core's
    // private L2 (1 MiB here), about 800 KiB of it: Q_i and O_i (2 Br d floats) at most 512 KiB,
    // K_j^T and V_j (2 Bc d floats) at most 256 KiB, and one row group of S_ij in L1. Each
    // K_j, V_j value is reused by the Br rows of Q_i and K_j^T is packed once per tile pair, so
    // the largest tiles that fit make the packing and the per-tile softmax steps cheap: at d = 64,
    // 1008 x 512 ran 20% faster than 128 x 256 (one core: 94 against 79 GFLOP/s). Br is a
    // multiple of 48, so of the row groups (6 or 4 rows); Bc a multiple of 16.
    const std::int64_t Br =
        std::clamp<std::int64_t>((65536 / dim) / kRowMultiple * kRowMultiple, 96, 1008);
    const std::int64_t Bc = std::clamp<std::int64_t>((32768 / dim) / 16 * 16, 16, 512);
    return {Br, Bc};
}

OmpPlan omp_plan(const AttentionProblem& p) {
    validate(p);
    OmpPlan plan;
    const bool asked = p.block_q > 0 || p.sram_floats > 0;
    plan.blocks = asked ? block_sizes_for(p) : omp_cache_blocks(p.dim);
    if (!asked) {
        // As few query tiles as the cache allows, but at least two work items per thread while a
        // tile keeps 96 rows or more; then tiles of (about) equal height, so that no thread gets
        // a sliver at the end (N = 4096: 4 x 864 + 640 rows, not 4 x 1008 + 64). A row's
        // arithmetic does not depend on Br, so neither does the result.
        const std::int64_t threads = omp_get_max_threads(), pairs = p.batch * p.heads;
        std::int64_t Tr = tile_count(p.seq_q, plan.blocks.Br);
        while (pairs * Tr < 2 * threads && tile_count(p.seq_q, Tr + 1) >= 96) ++Tr;
        plan.blocks.Br = std::min(plan.blocks.Br, round_up(tile_count(p.seq_q, Tr), kRowMultiple));
    }
    // A tile never has more rows than the sequence: a block beyond N is one tile of N rows.
    plan.blocks.Br = std::min(plan.blocks.Br, p.seq_q);
    plan.blocks.Bc = std::min(plan.blocks.Bc, p.seq_kv);
    plan.Tr = tile_count(p.seq_q, plan.blocks.Br);
    plan.Tc = tile_count(p.seq_kv, plan.blocks.Bc);
    plan.row_stride = round_up(plan.blocks.Br, kRows);
    plan.key_stride = round_up(plan.blocks.Bc, tiles::kBlockCols);
    plan.value_stride = round_up(p.dim, tiles::kLanes);
    // Only block sizes asked for can be huge (up to N ~ 2^40): work_elements refuses a product
    // beyond any memory before it overflows.
    const std::int64_t d = p.dim, rs = plan.row_stride, ks = plan.key_stride;
    plan.thread_floats = work_elements(rs, d + plan.value_stride) +  // Q_i, O_i
                         work_elements(ks, d + plan.value_stride) +  // K_j^T, V_j
                         work_elements(kRows, ks) + 2 * rs +         // S, m_i, l_i
                         7 * kAlignFloats;                           // alignment of 7 buffers
    return plan;
}

void omp_attention(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                   float* O, float* lse) {
    const OmpPlan plan = omp_plan(p);  // validates
    // Work items (b, h, i). Within a pair the query tiles go last-first: with a causal mask the
    // last tiles see the most keys, and starting the longest items first balances the threads.
    const std::int64_t pairs = p.batch * p.heads;
    // Every thread of the team allocates its tiles (parallel_for_with_state), however few items.
    const std::int64_t threads = omp_get_max_threads();
    require_memory(double(threads) * double(plan.thread_floats + kAlignFloats) * sizeof(float),
                   "omp's tile buffers (" + std::to_string(threads) + " threads, tiles of Br = " +
                       std::to_string(plan.blocks.Br) + ", Bc = " +
                       std::to_string(plan.blocks.Bc) + ")");
    parallel_for_with_state(
        pairs * plan.Tr, [&] { return ThreadTiles(plan, p.dim); },
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
