// common/tiling.hpp — how the sequence dimensions are cut into tiles (paper Algorithm 1, lines 1–4).
//
// Tiles have a fixed size except the last one, which holds whatever is left: N is almost never a
// multiple of the block size, and every form must treat that ragged tail as the normal case.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/config.hpp"
#include "common/problem.hpp"

namespace flashattn {

// Block sizes of Algorithm 1: Br rows of Q per tile, Bc rows of K/V per tile.
struct BlockSizes {
    std::int64_t Br = 0;
    std::int64_t Bc = 0;
};

// Algorithm 1 line 1: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d), with M counted in floats.
// The 4 is the paper's budget: K_j, V_j, Q_i and O_i must share the M floats of SRAM.
FA_HOST_DEVICE inline BlockSizes block_sizes_from_sram(std::int64_t M, std::int64_t d) {
    const std::int64_t Bc = ceil_div(M, 4 * d);
    const std::int64_t Br = Bc < d ? Bc : d;
    return {Br, Bc};
}

// The default SRAM budget of the CPU forms: 64 KiB, the order of an SM's shared memory the paper
// assumes (~100 KB) and of a CPU core's L1/L2 working set. For d = 64 it gives Br = Bc = 64.
inline constexpr std::int64_t kDefaultSramFloats = 16384;

// Block sizes a problem asks for: explicit ones win, else Algorithm 1 line 1 on its M.
FA_HOST_DEVICE inline BlockSizes block_sizes_for(const AttentionProblem& p) {
    if (p.block_q > 0 && p.block_kv > 0) return {p.block_q, p.block_kv};
    return block_sizes_from_sram(p.sram_floats > 0 ? p.sram_floats : kDefaultSramFloats, p.dim);
}

// Half-open index range [begin, end) of one tile.
struct TileRange {
    std::int64_t begin = 0;
    std::int64_t end = 0;
    FA_HOST_DEVICE std::int64_t size() const { return end - begin; }
};

// Algorithm 1 line 3: T = ceil(N / B) tiles.
FA_HOST_DEVICE inline std::int64_t tile_count(std::int64_t n, std::int64_t block) {
    return ceil_div(n, block);
}

// Tile t of a length-n dimension cut into blocks of `block` (the last one may be shorter).
FA_HOST_DEVICE inline TileRange tile_range(std::int64_t t, std::int64_t block, std::int64_t n) {
    const std::int64_t begin = t * block;
    const std::int64_t end = begin + block < n ? begin + block : n;
    return {begin, end};
}

// Where the ragged query tile goes. Tiles are cut from row 0, so the last one is short; under a
// causal mask the last tile is also the one that sees every key. Its missing rows are skipped
// only in whole units of `unit` rows (cuda-fa3: a warpgroup's 64, whose products are collective),
// and the units it has left run over every key tile. Shifted up by `shift` rows, tile i holds
// rows [i Br - shift, (i + 1) Br - shift): the whole units of missing rows go below row 0, into
// the first tile, which sees the fewest keys, and are never stored. shift is the largest multiple
// of `unit` at most Tr Br - N_q: a multiple, so that every unit still starts where the diagonal
// crosses it as before (a shift by a part of a unit makes the diagonal cut more key tiles per unit
// and costs more masking than it saves; docs/cuda_fa3.md). Without a causal mask every tile sees
// every key, and the cut stays at row 0 (shift 0); with a block mask too, whose row of blocks must
// exist for every row a kernel classifies.
FA_HOST_DEVICE inline std::int64_t query_tile_shift(const AttentionProblem& p, std::int64_t Br,
                                                    std::int64_t unit) {
    if (!p.causal || p.block_mask.active()) return 0;
    return (tile_count(p.seq_q, Br) * Br - p.seq_q) / unit * unit;
}

// How much of a (query tile) x (key tile) block the masks let through. Flash forms skip `none`
// tiles without loading them, skip per-element masking on `full` tiles, and mask `partial` ones.
enum class TileVisibility { none, partial, full };

// The causal mask alone on a rectangle of rows x cols.
FA_HOST_DEVICE inline TileVisibility classify_causal(const AttentionProblem& p, TileRange rows,
                                                     TileRange cols) {
    if (!p.causal) return TileVisibility::full;
    const std::int64_t off = p.causal_offset();
    // First column beyond the last row's diagonal: nothing visible.
    if (cols.begin > rows.end - 1 + off) return TileVisibility::none;
    // Last column at or before the first row's diagonal: everything visible.
    if (cols.end - 1 <= rows.begin + off) return TileVisibility::full;
    return TileVisibility::partial;
}

// Does a tile the masks let (at least partly) through need the per-element mask? A partial tile
// does, and so does a tile cut short by the end of the keys: its missing keys were zero-filled
// and must read as masked. Only `full` tiles of full width skip the per-element test.
FA_HOST_DEVICE inline bool needs_element_mask(TileVisibility seen, TileRange cols,
                                              std::int64_t block) {
    return seen == TileVisibility::partial || cols.size() < block;
}

// The order in which the GPU kernels take query tiles t = 0 .. T-1 (FlashAttention-2, Section
// 3.2, parallelism over the sequence): under a causal mask a later query tile sees more keys, so
// the longest are started first and the short ones fill the last wave. Without one, in order.
FA_HOST_DEVICE inline std::int64_t longest_first(bool causal, std::int64_t t, std::int64_t T) {
    return causal ? T - 1 - t : t;
}

// The order in which the GPU kernels start `units` x T tiles (a unit: one head of one batch entry,
// or a K/V head with its group; its T tiles: the query tiles of the forward, the key tiles of the
// backward; rank 0 = its longest tile under a causal mask). Item k of the launch (a CTA's linear
// index, or the persistent kernels' work-tile counter) is tile `rank` of unit `unit`:
//  * the tiles of one unit go out side by side, so CTAs running together read the same K_j, V_j (or
//    Q_i, dO_i) from L2;
//  * except for the last `tail` units, whose tiles go out rank by rank across those units (rank 0
//    of each, then rank 1, ...): the work that ends the launch then starts longest first, so the
//    last wave is made of short tiles and the SMs finish together. Their tiles are few enough to
//    share L2 in any order.
// A bijection of 0 .. units T - 1; rank r - 1 of a unit always comes before rank r, which
// deterministic mode's wait for the key tile before (cuda/stages/flash_backward.cuh) relies on.
// I: int in the kernels (their item counts fit it), std::int64_t on the host.
template <class I>
struct ScheduledTile {
    I unit, rank;
};
template <class I>
FA_HOST_DEVICE inline ScheduledTile<I> scheduled_tile(I item, I T, I units, I tail) {
    const I side_by_side = (units - tail) * T;
    if (item < side_by_side) return {item / T, item % T};
    const I k = item - side_by_side;
    return {units - tail + k % tail, k / tail};
}

// The tail of that order: without a causal mask every tile of a unit is as long as the others and
// nothing is reordered (tail = 0); with one, enough units for about two waves of the `slots` CTAs
// resident at once (their tiles then end the launch longest first). docs/cuda_fa3.md measures it.
FA_HOST_DEVICE inline std::int64_t schedule_tail(bool causal, std::int64_t T, std::int64_t units,
                                                 std::int64_t slots) {
    if (!causal || T < 2) return 0;
    const std::int64_t tail = (2 * slots + T - 1) / T;
    return tail < units ? tail : units;
}

// Split-KV (decoding): chunk s of S of the tiles [0, T) is [s T / S, (s + 1) T / S). The
// chunks cover every tile once, in order, and differ by at most one tile; with S > T some are
// empty (their partial result is that of a row with no visible key: O = 0, LSE = -inf).
FA_HOST_DEVICE inline TileRange split_chunk(std::int64_t T, std::int64_t S, std::int64_t s) {
    return {s * T / S, (s + 1) * T / S};
}

// Split-KV's S when the caller leaves it to the backend: `work_items` independent tasks (query
// tiles x heads x batch) on `slots` workers (CTAs resident at once, or threads). S = 1 when the
// tasks already fill 80% of the slots. Otherwise S is the smallest count whose wave efficiency
// -- tasks / (waves x slots) with tasks = work_items S -- is within 85% of the best over S = 1 ..
// min(128, key_tiles / min_chunk_tiles), so every chunk keeps at least min_chunk_tiles tiles
// (FlashAttention's split heuristic has the same shape). More splits cost partial results
// written and merged, so the smallest good S wins.
inline std::int64_t choose_kv_splits(std::int64_t work_items, std::int64_t slots,
                                     std::int64_t key_tiles, std::int64_t min_chunk_tiles) {
    if (work_items <= 0 || slots <= 0 || 10 * work_items >= 8 * slots) return 1;
    const std::int64_t max_splits = std::max<std::int64_t>(
        1, std::min<std::int64_t>(128, key_tiles / std::max<std::int64_t>(1, min_chunk_tiles)));
    auto efficiency = [&](std::int64_t S) {
        const std::int64_t tasks = work_items * S;
        return double(tasks) / double(ceil_div(tasks, slots) * slots);
    };
    double best = 0.0;
    for (std::int64_t S = 1; S <= max_splits; ++S) best = std::max(best, efficiency(S));
    for (std::int64_t S = 1; S <= max_splits; ++S)
        if (efficiency(S) >= 0.85 * best) return S;
    return 1;
}

// choose_kv_splits, then one refinement for long chunks: where every chunk would still hold at
// least `long_chunk_tiles` key tiles, S becomes as many chunks as one wave of the slots holds (at
// most `max_splits`). A task then streams its chunk for most of the step, and the step lasts as
// long as its longest chunk: the smallest good S leaves slots empty and every chunk longer (B = 1,
// 8 KV heads on 264 slots: S = 29, chunks of up to 36 tiles in 1024, where S = 32 has 32). Short
// chunks keep the smallest good S: there each chunk's start and the merge weigh more.
inline std::int64_t choose_kv_splits_filling_wave(std::int64_t work_items, std::int64_t slots,
                                                  std::int64_t key_tiles,
                                                  std::int64_t min_chunk_tiles,
                                                  std::int64_t long_chunk_tiles,
                                                  std::int64_t max_splits) {
    const std::int64_t S = choose_kv_splits(work_items, slots, key_tiles, min_chunk_tiles);
    if (S <= 1) return S;  // the tasks fill the slots (or nothing to split): no wave to fill
    const std::int64_t wave = std::min<std::int64_t>(max_splits, slots / work_items);
    return wave > S && key_tiles / wave >= long_chunk_tiles ? wave : S;
}

// classify_causal for every key tile of width `block` at once, for the query rows [rows): tiles
// [0, full) need no per-element mask, [full, seen) do (the causal diagonal and the ragged last
// tile), and tiles from `seen` on are hidden. For kernels that run the masked tiles in a loop of
// their own (cuda-fa3) instead of asking tile by tile.
struct KeyTileSplit {
    std::int64_t full, seen;
};
FA_HOST_DEVICE inline KeyTileSplit causal_key_tiles(const AttentionProblem& p, TileRange rows,
                                                    std::int64_t block) {
    if (rows.size() <= 0) return {0, 0};
    std::int64_t keys_all = p.seq_kv, keys_any = p.seq_kv;  // keys every row / some row may see
    if (p.causal) {
        const std::int64_t off = p.causal_offset();
        keys_all = rows.begin + off + 1;  // up to the first row's diagonal
        keys_any = rows.end + off;        // up to the last row's
        keys_all = keys_all < 0 ? 0 : (keys_all > p.seq_kv ? p.seq_kv : keys_all);
        keys_any = keys_any < 0 ? 0 : (keys_any > p.seq_kv ? p.seq_kv : keys_any);
    }
    return {keys_all / block, tile_count(keys_any, block)};
}

FA_HOST_DEVICE inline TileVisibility classify_tile(const AttentionProblem& p, TileRange rows,
                                                   TileRange cols) {
    if (!p.block_mask.active()) return classify_causal(p, rows, cols);
    // With a block mask, look at each mask block the tile overlaps: the causal mask decides
    // inside the blocks that are on, nothing is visible inside the blocks that are off.
    const BlockMask& mask = p.block_mask;
    const std::int64_t tc = ceil_div(p.seq_kv, mask.block_kv);
    bool any = false;
    bool all = true;
    for (std::int64_t bi = rows.begin / mask.block_q; bi <= (rows.end - 1) / mask.block_q; ++bi) {
        const TileRange sub_rows = {bi * mask.block_q > rows.begin ? bi * mask.block_q : rows.begin,
                                    (bi + 1) * mask.block_q < rows.end ? (bi + 1) * mask.block_q
                                                                       : rows.end};
        for (std::int64_t bj = cols.begin / mask.block_kv; bj <= (cols.end - 1) / mask.block_kv;
             ++bj) {
            const TileRange sub_cols = {
                bj * mask.block_kv > cols.begin ? bj * mask.block_kv : cols.begin,
                (bj + 1) * mask.block_kv < cols.end ? (bj + 1) * mask.block_kv : cols.end};
            const TileVisibility v = mask.data[bi * tc + bj] != 0
                                         ? classify_causal(p, sub_rows, sub_cols)
                                         : TileVisibility::none;
            any = any || v != TileVisibility::none;
            all = all && v == TileVisibility::full;
        }
    }
    if (!any) return TileVisibility::none;
    return all ? TileVisibility::full : TileVisibility::partial;
}

// Which tiles a loop walks: key tiles K_j for fixed query rows (FlashAttention-2's inner loop,
// cuda-fa2, cuda-tc) or query tiles Q_i for a fixed key tile (Algorithm 1's inner loop, cuda-fa1).
enum class TileAxis { keys, queries };

// The first tile t' in [t, t_end) of `block` elements along `axis` whose block with the `fixed`
// range the masks do not rule out entirely; t_end when there is none. This is how every flash
// form skips the zero blocks of a block mask (Algorithm 5) and the tiles past the causal diagonal.
FA_HOST_DEVICE inline std::int64_t next_visible_tile(const AttentionProblem& p, TileAxis axis,
                                                     TileRange fixed, std::int64_t t,
                                                     std::int64_t t_end, std::int64_t block) {
    for (; t < t_end; ++t) {
        const bool keys = axis == TileAxis::keys;
        const TileRange moving = tile_range(t, block, keys ? p.seq_kv : p.seq_q);
        const TileVisibility v =
            keys ? classify_tile(p, fixed, moving) : classify_tile(p, moving, fixed);
        if (v != TileVisibility::none) break;
    }
    return t;
}

}  // namespace flashattn
