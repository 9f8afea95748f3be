// cuda/fa3/pipeline.cuh — the pipeline cuda-fa3's kernel (cuda/fa3/kernel.cuh) runs on, apart from
// the algorithm: the mbarriers of the producer/consumer ring, where a thread is in that ring, the
// persistent schedule of work tiles, and the ping-pong turns of the consumer warpgroups.
// FlashAttention-3 (Shah et al., 2024, arXiv 2407.08608) Sections 3.1 (warp specialization, the
// ring) and 3.2 (ping-pong); the instructions are cuda/ptx/hopper.cuh's.
#pragma once

#include <cstdint>

#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/ptx/hopper.cuh"

namespace flashattn::fa3 {

// The ring's barriers (mbarriers in shared memory, after the tiles).
template <int kStages>
struct Fa3Barriers {
    std::uint64_t q;                // Q_i (and `item` below) of the next work tile have landed
    std::uint64_t q_empty;          // every consumer thread is done with Q_i and has read `item`
    std::uint64_t k_full[kStages];  // K_j in slot s has landed
    std::uint64_t v_full[kStages];  // V_j in slot s has landed
    // Every consumer thread is done with K_j (after S) or V_j (after P V) in slot s: released
    // apart, since the overlapped loop is done with K_j a tile earlier than with V_j.
    std::uint64_t k_empty[kStages];
    std::uint64_t v_empty[kStages];
    int item;  // the work tile the producer took next (written before `q` is signalled), or -1

    // By one thread, before the CTA's first __syncthreads: a "full" barrier waits for the
    // producer's one arrival (with the bytes of its copy), an "empty" one for every consumer
    // thread's.
    __device__ void init(int consumer_threads) {
        hopper::mbarrier_init(&q, 1);
        hopper::mbarrier_init(&q_empty, consumer_threads);
        for (int s = 0; s < kStages; ++s) {
            hopper::mbarrier_init(&k_full[s], 1);
            hopper::mbarrier_init(&v_full[s], 1);
            hopper::mbarrier_init(&k_empty[s], consumer_threads);
            hopper::mbarrier_init(&v_empty[s], consumer_threads);
        }
        hopper::fence_barrier_init();
    }
};

// Where the producer and a consumer are in the ring: slot `stage`, and the parity of the slot's
// current use (it flips each time the ring wraps).
struct RingPosition {
    int stage = 0;
    std::uint32_t phase = 0;
    template <int kStages>
    __device__ void advance() {
        if (++stage == kStages) stage = 0, phase ^= 1;
    }
};

// A work tile of the persistent schedule: query tile i of head h, batch b; its rows; the key
// tiles the CTA's rows can see (FA2 Algorithm 1 line 6's range, cut by the causal mask). Numbered
// by scheduled_tile (common/tiling.hpp): a head's query tiles side by side, so that CTAs working at
// the same time share its K and V in L2, under a causal mask the later query tiles (more keys)
// first, and the last `tail` heads' tiles longest first across those heads. Its rows start at
// i Br - shift (query_tile_shift, common/tiling.hpp): under a causal mask whole warpgroups of
// missing rows go below row 0, into the first tile, which sees the fewest keys; those rows read as
// zeros (TMA fills a box's rows outside the array), skip their products and are never stored.
//
// Split-KV (decoding, docs/decoding.md; kSplitKV, a kernel of its own so that the others carry
// none of it): with kv_splits = S there are S work tiles per (i, h, b), one per chunk of its
// visible key tiles (split_chunk), item = split x (Tr heads batch) + the unsplit item; each
// writes a partial result that the combine kernel merges. Without a split the chunk is all of
// them: [key_begin, key_end) = [0, Tc_seen).
struct WorkTile {
    int i;
    std::int64_t h, b;
    TileRange rows;
    int Tc_seen;
    int split;                 // the chunk (0 without a split)
    int key_begin, key_end;    // its key tiles [key_begin, key_end) of [0, Tc_seen)
};
template <int Br, int Bc, bool kSplitKV>
__device__ __forceinline__ WorkTile work_tile(const AttentionProblem& p, int Tr, int tail,
                                              int shift, int kv_splits, int item) {
    WorkTile t;
    t.split = 0;
    if constexpr (kSplitKV) {
        const int unsplit_items = Tr * int(p.heads * p.batch);
        t.split = item / unsplit_items;
        item -= t.split * unsplit_items;
    }
    const ScheduledTile<int> s = scheduled_tile(item, Tr, int(p.heads * p.batch), tail);
    const int head_of_all = s.unit;
    t.i = int(longest_first(p.causal, s.rank, Tr));
    t.h = head_of_all % p.heads;
    t.b = head_of_all / p.heads;
    const int row_begin = t.i * Br - shift;
    t.rows = {row_begin, min(row_begin + Br, int(p.seq_q))};
    t.Tc_seen = int(causal_key_tiles(p, t.rows, Bc).seen);
    t.key_begin = 0, t.key_end = t.Tc_seen;
    if constexpr (kSplitKV) {
        const TileRange chunk = split_chunk(t.Tc_seen, kv_splits, t.split);
        t.key_begin = int(chunk.begin), t.key_end = int(chunk.end);
    }
    return t;
}

// The named barriers (bar.sync ids) the kernel uses beside __syncthreads' barrier 0: consumer
// warpgroup w's turn to issue its products is barrier kTurn + w (w < 2), and its 128 threads meet
// around their O_i staging block at kOutput + w (w < 3).
enum NamedBarrier : int { kSyncThreads = 0, kTurn = 1, kOutput = 3 };

// Ping-pong (FA3 Section 3.2): consumer warpgroup w waits for its turn (begin), issues its
// products, and hands the turn to the other (end); warpgroup 1 first hands warpgroup 0 the opening
// turn. Both take the same number of turns, and warpgroup 0 takes the last hand-over (finish), so
// every barrier use is matched. kThreads: the threads of both consumer warpgroups, which meet at
// each turn's barrier.
template <bool kEnabled, int kThreads>
struct Turns {
    int mine, other;
    __device__ explicit Turns(int cg) : mine(kTurn + cg), other(kTurn + 1 - cg) {
        if (kEnabled && cg == 1) hopper::named_barrier_arrive(other, kThreads);
    }
    __device__ void begin() const {
        if (kEnabled) hopper::named_barrier_sync(mine, kThreads);
    }
    __device__ void end() const {
        if (kEnabled) hopper::named_barrier_arrive(other, kThreads);
    }
    __device__ void finish() const {
        if (kEnabled && mine == kTurn) hopper::named_barrier_sync(mine, kThreads);
    }
};

}  // namespace flashattn::fa3
