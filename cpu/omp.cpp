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
// and P V for one group, then the next, so a group's S_ij never leaves L1. A tile of a single
// row (decoding) uses the one-row products instead (scores_row, add_values<1>).
//
// Split-KV (omp.hpp, docs/decoding.md): the loop over j runs over one chunk of the key tiles at a
// time, and the chunks' (O_s, LSE_s) are merged afterwards, FlashAttention Algorithm 1 lines 10-12
// applied to whole chunks (merge_partial_row).
#include "cpu/omp.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/gqa_packing.hpp"
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

// One task: query tile `rows` of one (batch, head) pair against the key/value tiles j in
// [key_tiles.begin, key_tiles.end) (all Tc of them, or one split-KV chunk). Q, K, V, O point at
// that pair's (seq, dim) matrices, lse at its seq_q values (or nullptr). O and LSE are those of
// the softmax over the keys of these tiles alone: O = 0, LSE = -inf for a row that sees none.
void attend_query_tile(const AttentionProblem& p, const OmpPlan& plan, TileRange rows,
                       TileRange key_tiles, const float* Q, const float* K, const float* V,
                       float* O, float* lse, ThreadTiles& t) {
    const std::int64_t d = p.dim, br = rows.size();
    const std::int64_t key_stride = plan.key_stride, value_stride = plan.value_stride;
    const float scale = p.softmax_scale();

    // Q_i (rows past the tile zero, so every row group is whole); O_i = 0, m_i = -inf, l_i = 0.
    std::copy(Q + rows.begin * d, Q + rows.end * d, t.Q_i);
    std::fill(t.Q_i + br * d, t.Q_i + plan.row_stride * d, 0.0f);
    std::fill(t.O_i, t.O_i + plan.row_stride * value_stride, 0.0f);
    std::fill(t.m_i, t.m_i + br, neg_infinity());
    std::fill(t.l_i, t.l_i + br, 0.0f);

    for (std::int64_t j = key_tiles.begin; j < key_tiles.end; ++j) {
        const TileRange cols = tile_range(j, plan.blocks.Bc, p.seq_kv);
        const TileVisibility visibility = classify_tile(p, rows, cols);
        if (visibility == TileVisibility::none) continue;  // hidden tile: K_j, V_j never read
        const std::int64_t bc = cols.size();
        // A tile of one query row (decoding without GQA) takes the one-row products, which read
        // K_j where it lies (tiles::scores_row says why); otherwise K_j^T is packed for the blocks.
        const bool one_row = br == 1;
        const std::int64_t group_rows = one_row ? 1 : kRows;
        if (!one_row) tiles::pack_keys_transposed(K + cols.begin * d, bc, d, key_stride, t.K_jT);
        const float* V_tile = values_of_tile(V + cols.begin * d, bc, d, plan, visibility, t);

        // Each group of kRows rows goes through S, softmax and P V while its S_ij is in L1.
        for (std::int64_t r0 = 0; r0 < br; r0 += kRows) {
            // Under the causal mask a row sees a prefix of the keys, so the group sees the keys
            // up to its last row's diagonal and no further: its products stop there, in blocks of
            // kBlockCols keys (FlashAttention-2's skip of hidden tiles, inside a tile: with the
            // large tiles of omp_cache_blocks most of a diagonal tile lies past it). The keys left
            // out would have had P = 0; the row sums add the same terms, the vector reduction in
            // another order near the row's end (results move by an ulp or so).
            std::int64_t group_bc = bc;
            if (visibility == TileVisibility::partial && p.causal) {
                const std::int64_t last_row = rows.begin + std::min(r0 + group_rows, br) - 1;
                group_bc = std::max<std::int64_t>(
                    p.last_causal_key(last_row, cols.end) - cols.begin + 1, 0);
                if (group_bc == 0) continue;  // no row of the group sees a key of this tile
            }
            const std::int64_t group_keys = round_up(group_bc, tiles::kBlockCols);
            if (one_row)
                tiles::scores_row(t.Q_i, d, K + cols.begin * d, group_bc, scale, t.S);  // S_ij
            else
                tiles::scores(t.Q_i + r0 * d, d, t.K_jT, group_keys, key_stride, scale, t.S);
            for (std::int64_t r = r0; r < r0 + group_rows; ++r) {
                float* S_r = t.S + (r - r0) * key_stride;
                if (r >= br) {  // a padding row: P = 0, so it adds nothing
                    std::fill(S_r, S_r + key_stride, 0.0f);
                    continue;
                }
                if (visibility == TileVisibility::partial && p.block_mask.active()) {
                    for (std::int64_t c = 0; c < group_bc; ++c)
                        if (!p.key_visible(rows.begin + r, cols.begin + c)) S_r[c] = neg_infinity();
                } else if (visibility == TileVisibility::partial) {  // the causal mask alone
                    const std::int64_t seen = std::clamp<std::int64_t>(
                        p.last_causal_key(rows.begin + r, cols.end) - cols.begin + 1, 0, group_bc);
                    std::fill(S_r + seen, S_r + group_bc, neg_infinity());  // one bound per row
                }
                // The online-softmax rule (common/online_softmax.hpp), in its row form.
                const float m_new = nan_max(t.m_i[r], row_max(S_r, group_bc));
                const float alpha = exp_shifted(t.m_i[r], m_new);  // rescales what came before
                const float row_sum = exp_shifted_row(S_r, group_bc, m_new);  // S_ij -> P_ij
                std::fill(S_r + group_bc, S_r + group_keys, 0.0f);  // keys left out: P = 0
                t.l_i[r] = alpha * t.l_i[r] + row_sum;
                t.m_i[r] = m_new;
                float* O_r = t.O_i + r * value_stride;
                if (alpha != 1.0f)  // (x * 1 == x: skipping it changes nothing)
                    for (std::int64_t k = 0; k < value_stride; ++k) O_r[k] *= alpha;
            }
            float* O_group = t.O_i + r0 * value_stride;
            if (one_row)
                tiles::add_values<1>(t.S, group_keys, key_stride, V_tile, value_stride, O_group);
            else
                tiles::add_values(t.S, group_keys, key_stride, V_tile, value_stride,
                                  O_group);  // += P V_j
            for (std::int64_t c : t.nonfinite_keys)  // see values_of_tile (c < group_bc: visible)
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

// Work item `item` of batch * heads * Tr: query tile i of the pair (b, h). Within a pair the
// query tiles go last-first: with a causal mask the last tiles see the most keys, and starting
// the longest items first balances the threads.
struct WorkItem {
    std::int64_t b, h;
    TileRange rows;  // the query rows of tile i
};
WorkItem work_item(const AttentionProblem& p, const OmpPlan& plan, std::int64_t item) {
    const std::int64_t bh = item / plan.Tr, i = plan.Tr - 1 - item % plan.Tr;
    return {bh / p.heads, bh % p.heads, tile_range(i, plan.blocks.Br, p.seq_q)};
}

// Split-KV's partial results in float32 working memory: for each (b, h) pair and chunk s, O_s
// (seq_q x d, normalized by the chunk's own sum) and LSE_s (seq_q). The chunks of a pair are
// consecutive, so one row's S partials lie at a fixed stride, as merge_partial_row reads them.
class PartialResults {
public:
    PartialResults(const AttentionProblem& p, std::int64_t S)
        : S_(S), seq_q_(p.seq_q), dim_(p.dim) {
        const std::int64_t rows = work_elements(p.batch * p.heads * S, p.seq_q);
        require_memory(double(rows) * double(p.dim + 1) * sizeof(float),
                       "omp's split-KV partial results (S = " + std::to_string(S) + " chunks)");
        O_ = WorkBuffer<float>(static_cast<std::size_t>(work_elements(rows, p.dim)),
                               "omp's split-KV partial outputs O_s");
        lse_ = WorkBuffer<float>(static_cast<std::size_t>(rows), "omp's split-KV partial LSE_s");
    }
    std::int64_t splits() const { return S_; }
    // Chunk s's (seq_q, d) matrix O_s and its seq_q values LSE_s, for the pair bh = b * heads + h.
    float* O_of(std::int64_t bh, std::int64_t s) {
        return O_.data() + (bh * S_ + s) * seq_q_ * dim_;
    }
    float* lse_of(std::int64_t bh, std::int64_t s) { return lse_.data() + (bh * S_ + s) * seq_q_; }

private:
    std::int64_t S_, seq_q_, dim_;
    WorkBuffer<float> O_, lse_;
};

// Each output row from its S partials, merged in the order s = 0 .. S-1 (merge_partial_row: a
// fixed order, so the result does not depend on which thread merges it).
void merge_chunks(const AttentionProblem& p, PartialResults& parts, float* O, float* lse) {
    const std::int64_t n = p.seq_q, d = p.dim;
    parallel_for(p.batch * p.heads * n, [&](std::int64_t row) {
        const std::int64_t bh = row / n, r = row % n;
        const float merged =
            merge_partial_row(static_cast<int>(parts.splits()), parts.lse_of(bh, 0) + r, n,
                              parts.O_of(bh, 0) + r * d, n * d, d, 0, 1, O + row * d);
        if (lse) lse[row] = merged;
    });
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

AttentionProblem omp_problem(const AttentionProblem& p) {
    validate(p);
    const bool asked = p.block_q > 0 || p.sram_floats > 0;
    return asked ? p : gqa_packed(p, omp_cache_blocks(p.dim).Br);
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
    plan.splits = omp_kv_splits(p, p.batch * p.heads * plan.Tr, plan.Tc, omp_get_max_threads());
    return plan;
}

std::int64_t omp_kv_splits(const AttentionProblem& p, std::int64_t items, std::int64_t Tc,
                           std::int64_t threads) {
    if (p.kv_splits >= 1) return std::min(p.kv_splits, Tc);
    // Automatic: split only when the work items leave threads idle or badly balanced (fewer than
    // two per thread, the target omp_plan's Br also aims at), into enough chunks for two tasks per
    // thread, so that dynamic scheduling evens out chunks of unequal cost (a ragged last tile, the
    // causal diagonal). A chunk keeps at least kMinChunkTiles tiles: below that a task's fixed
    // costs (loading Q_i, writing and merging its partial O) weigh against too little work.
    constexpr std::int64_t kMinChunkTiles = 2;
    if (threads <= 1 || items >= 2 * threads) return 1;
    return std::max<std::int64_t>(1, std::min(ceil_div(2 * threads, items), Tc / kMinChunkTiles));
}

std::int64_t omp_attention(const AttentionProblem& problem, const float* Q, const float* K,
                           const float* V, float* O, float* lse) {
    // The same memory, read as the packed problem where decoding packs GQA groups.
    const AttentionProblem p = omp_problem(problem);  // validates
    const OmpPlan plan = omp_plan(p);
    // Every thread of the team allocates its tiles (parallel_for_with_state), however few tasks.
    const std::int64_t threads = omp_get_max_threads();
    require_memory(double(threads) * double(plan.thread_floats + kAlignFloats) * sizeof(float),
                   "omp's tile buffers (" + std::to_string(threads) + " threads, tiles of Br = " +
                       std::to_string(plan.blocks.Br) + ", Bc = " +
                       std::to_string(plan.blocks.Bc) + ")");
    // Task t is chunk s = t % S of work item t / S. Without a split (S = 1, one chunk of all Tc
    // tiles) a task writes its rows of O and LSE; with one, its chunk's partial result, and the
    // merge of the partials follows.
    const std::int64_t S = plan.splits;
    std::optional<PartialResults> parts;
    if (S > 1) parts.emplace(p, S);
    parallel_for_with_state(
        p.batch * p.heads * plan.Tr * S, [&] { return ThreadTiles(plan, p.dim); },
        [&](ThreadTiles& tiles, std::int64_t task) {
            const WorkItem w = work_item(p, plan, task / S);
            const std::int64_t s = task % S, bh = w.b * p.heads + w.h;
            float* O_out = parts ? parts->O_of(bh, s) : O + p.q_offset(w.b, w.h);
            float* lse_out = parts  ? parts->lse_of(bh, s)
                             : lse ? lse + p.lse_offset(w.b, w.h)
                                   : nullptr;
            attend_query_tile(p, plan, w.rows, split_chunk(plan.Tc, S, s),
                              Q + p.q_offset(w.b, w.h), K + p.kv_offset(w.b, w.h),
                              V + p.kv_offset(w.b, w.h), O_out, lse_out, tiles);
        });
    if (parts) merge_chunks(p, *parts, O, lse);
    return S;
}

}  // namespace flashattn
