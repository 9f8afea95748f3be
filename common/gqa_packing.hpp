// common/gqa_packing.hpp — a GQA group's query heads read as the rows of one head (decoding).
//
// Under GQA (heads = G heads_kv) the G query heads h_kv G .. h_kv G + G - 1 all read K/V head h_kv.
// A kernel that gives every query head its own query tiles reads each K/V tile once per query
// head: G times the bytes the problem needs. At decoding shapes (a few query rows against a long
// KV cache) those bytes are the whole cost (docs/decoding.md), so such a kernel decodes G times
// slower than it must.
//
// The layout already holds the answer. Q is (batch, heads, seq_q, dim), row-major, so the G query
// heads of K/V head h_kv are G consecutive blocks of seq_q rows: Q is also (batch, heads_kv,
// G seq_q, dim), and so are O and, without dim, LSE. Read that way the group is ONE head of
// G seq_q rows against K/V head h_kv, with no GQA: any kernel runs the packed problem unchanged,
// and its query tiles now hold rows of several heads, so each K/V tile is read once for them all.
//
// Packed row r is query row r % seq_q of the group's head r / seq_q. The masks must say the same
// of it as of that row:
//   * causal: row i sees keys 0 .. i + seq_kv - seq_q, a bound on r % seq_q that the packed
//     problem cannot state -- except at seq_q = 1, where the one row sees every key (its bound is
//     seq_kv - 1), so the packed problem is not causal;
//   * a block mask: row i reads mask row i / block_q. With one mask row (block_q >= seq_q) every
//     packed row reads that row too once block_q >= G seq_q.
// Elsewhere the problem is not packed.
#pragma once

#include <cstdint>

#include "common/array_layout.hpp"
#include "common/problem.hpp"
#include "common/tiling.hpp"

namespace flashattn {

// Whether p's GQA groups can be read as single heads (the masks above allow it).
FA_HOST_DEVICE inline bool gqa_packable(const AttentionProblem& p) {
    if (p.group_size() == 1) return false;  // nothing to share
    if (p.causal && p.seq_q != 1) return false;
    if (p.block_mask.active() && p.block_mask.block_q < p.seq_q) return false;
    return true;
}

// p with each GQA group packed into one head of G seq_q rows, for a kernel whose query tiles
// hold Br rows -- where that is allowed and lowers the number of query tiles, i.e. the number
// of times K/V is read (a few query rows per head: decoding). Otherwise p itself. The packed
// problem has p's memory layout for Q, O and LSE, and p's K and V.
inline AttentionProblem gqa_packed(const AttentionProblem& p, std::int64_t Br) {
    const std::int64_t G = p.group_size();
    if (!gqa_packable(p) || tile_count(G * p.seq_q, Br) >= G * tile_count(p.seq_q, Br)) return p;
    AttentionProblem packed = p;
    packed.heads = p.heads_kv;
    packed.seq_q = G * p.seq_q;
    packed.causal = false;  // seq_q = 1 (gqa_packable): its one row sees every key
    if (p.block_mask.active()) packed.block_mask.block_q = packed.seq_q;  // the one mask row
    return packed;
}

// The same reading of an array at a caller's strides (cuda-fa3's device entry): the group's heads
// are one head of G seq_q rows only where each head's rows end where the next head's begin (head
// stride = seq_q row stride, as in a contiguous array). `layout` is resolved for p; `packed` is
// gqa_packed(p, ...). Returns the layout of the packed head, or p's own where nothing was packed.
inline bool gqa_packable_layout(const ArrayLayout& layout, const AttentionProblem& p) {
    return layout.head == p.seq_q * layout.row;
}
inline ArrayLayout gqa_packed_layout(const ArrayLayout& layout, const AttentionProblem& p,
                                     const AttentionProblem& packed) {
    if (packed.heads == p.heads) return layout;
    return {layout.batch, layout.head * p.group_size(), layout.row};
}

}  // namespace flashattn
