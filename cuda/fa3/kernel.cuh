// cuda/fa3/kernel.cuh — cuda-fa3: FlashAttention-2's forward on Hopper the way FlashAttention-3
// runs it: both products on warpgroup MMA (wgmma), K_j and V_j copied by the tensor memory
// accelerator (TMA) into an mbarrier ring, warp specialization (one producer warpgroup copies, two
// consumer warpgroups compute, three at d = 64), and the softmax overlapped with the products.
// Host side: cuda/fa3/backend.cu; the instructions: cuda/ptx/hopper.cuh. Needs sm_90a; in a build
// for other architectures the kernel body is empty and the backend is not registered.
//
// FlashAttention-3 (Shah et al., 2024, arXiv 2407.08608), its ideas in the order the notes page
// (docs/cuda_fa3.md) measures them, stage by stage:
//   1. wgmma (Section 2.2, 3): a warpgroup (4 warps, 128 threads) multiplies 64 x N x 16 tiles with
//      its operands read from shared memory by the tensor cores (mma.sync, cuda-tc's instruction,
//      needs every operand in registers, loaded by ldmatrix, 16 rows per warp).
//   2. TMA and warp specialization (Section 3.1): the producer warpgroup keeps one thread that
//      asks the copy engine for Q_i once and for K_j, V_j tile after tile, into a ring of kStages
//      slots; each slot has "full" barriers (the copy's bytes have landed) and "empty" barriers
//      (every consumer thread is done reading K_j, V_j). The producer gives most of its registers
//      to the consumers (setmaxnreg), which need them for S, P~ and O of 64 rows each.
//   3. Overlap (Section 3.2), two ways:
//      * within a warpgroup: tile j's S = Q_i K_j^T and tile j-1's O += P~ V_{j-1} are issued
//        together, and the softmax of tile j runs while the P V is still on the tensor cores;
//        O's rescale waits for that product (softmax_update, then rescale_output), and at
//        d = 256 is put off to the next step, between its S and its P V (kRescaleBeforePv);
//        at d = 256 a row's maximum is also a reference that moves only when a key tile exceeds
//        it by more than 2^8 (FlashAttention-4's conditional rescale; kLazyRescale), so that
//        most steps skip the rescale altogether;
//      * between the two warpgroups (ping-pong, kPingPong): they take turns issuing their products
//        (named barriers), so that one warpgroup's softmax tends to run while the other's products
//        do. A compile-time choice: measured, it pays at d = 128 and costs at d = 64
//        (docs/cuda_fa3.md, stage 3, says why we think so).
//   4. A persistent grid (as FlashAttention-3's implementation schedules tiles): one CTA per SM
//      takes work tiles (query tile i, head h, batch b) one after another, the next from a counter
//      in device memory. Once the consumers are done with Q_i (each warpgroup's last S has
//      landed), the producer copies the next tile's Q_i, K_j, V_j while they run this one's last
//      P V and write its O and LSE, instead of every CTA starting with an empty pipeline. The
//      counter hands out work tiles in scheduled_tile's order (common/tiling.hpp): under a causal
//      mask the last heads' tiles go out longest first across heads, so the launch ends on short
//      tiles, and a head's query tiles are cut from its last row (query_tile_shift), so that the
//      short one is the first, which sees the fewest keys.
//   5. At d = 64, three consumer warpgroups (Br = 192; FlashAttention-3's tile there): a K_j, V_j
//      tile copied once serves 192 query rows, and three softmaxes take turns with the tensor
//      cores. The registers then allow 160 per consumer thread (setmaxnreg), and ptxas compiles
//      the kernel within 128 (launch bounds of 512 threads) with a few bytes of spill.
//   6. P~ V_j as one wgmma of N = d per k-step, reading all of V_j's 64-column panels at once
//      (products.cuh, issue_a_regs_b), instead of one wgmma per panel; at d = 256 that leaves
//      room for key tiles of Bc = 80 (S's wgmma N = 80), the most shared memory holds.
//   7. O_i stored by TMA (FlashAttention-3's epilogue, where shared memory has the room: up to
//      d = 128, and at d = 256 with Bc = 64 half a row at a time): each consumer warpgroup writes
//      its O_i / l_i into a staging block in shared memory and one thread hands it to the copy
//      engine (store_output_staged), instead of every lane storing its values to HBM from
//      registers.
//   And for decoding (a few query rows against a long KV cache, whose work tiles leave SMs idle),
//   split-KV (Flash-Decoding; docs/decoding.md): kSplitKV kernels give each work tile one chunk of
//   its key tiles and write that chunk's partial (O, LSE) in float32 from registers; the combine
//   kernel (cuda/stages/combine.cuh, cuda-tc's) merges the chunks by Algorithm 1's update.
//
// Shared-memory tiles are panels of 64 columns (128 bytes per row) in the 128-byte swizzle (16-byte
// chunk c of row r at c ^ (r % 8)): TMA writes that layout and wgmma reads it (descriptors checked
// by cuda/tools/wgmma_probe.cu); d = 128 is two panels. The accumulators are m16n8's C layout warp
// by warp (cuda/ptx/hopper.cuh), so masking, the online softmax (FA2 Algorithm 1 lines 9-10) and
// the epilogue (lines 12-15) are the shared cuda/stages/mma_stages.cuh, as in cuda-tc.
//
// FA2 Algorithm 1 lines: L3 work tiles (i, h, b), taken in turn by persistent CTAs | L4 Q_i ->
// shared memory (TMA, producer) | L5 O, l, m = 0, 0, -inf | L6 loop over key tiles j | L7 K_j,
// V_j -> shared memory (TMA, producer, ring) | L8 S = Q_i K_j^T on wgmma | L9-L10 mask_scores,
// softmax_update, rescale_output | L10 O += P~ V_j on wgmma (one tile later) | L12-L15
// store_output_staged or write_output (finish_work_tile).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/problem.hpp"
#include "common/tiling.hpp"
#include "cuda/fa3/pipeline.cuh"
#include "cuda/fa3/products.cuh"
#include "cuda/ptx/hopper.cuh"
#include "cuda/stages/mma_stages.cuh"
#include "cuda/ptx/mma_sync.cuh"

namespace flashattn::fa3 {

using mma::KernelParams;

// One CTA: a producer warpgroup and kConsumers (2 or 3) consumer warpgroups of 64 query rows each
// (Br = 128 or 192); key tiles of Bc; head dim D = 64, 128 or 256 (1, 2 or 4 panels); a ring of
// kStages K_j / V_j slots; kPingPong: whether the two consumer warpgroups take turns issuing their
// products.
template <class T_, int D_, int Bc_, int kStages_, bool kPingPong_, int kConsumers_ = 2>
struct Fa3Tile {
    using T = T_;
    static constexpr int D = D_;
    static constexpr int Bc = Bc_;
    static constexpr int kStages = kStages_;
    static constexpr bool kPingPong = kPingPong_;
    static constexpr int kConsumers = kConsumers_;
    static constexpr int Br = 64 * kConsumers;
    static constexpr int kConsumerThreads = 128 * kConsumers;  // a warpgroup is 128 threads
    static constexpr int kThreads = 128 + kConsumerThreads;    // and one producer warpgroup
    static constexpr int kMTiles = 1;  // mma_stages: one 16-row tile per warp
    static constexpr int kPanels = D / 64;
    // setmaxnreg budgets (multiples of 8): 128 x 24 + 256 x 240 = 64,512 of the SM's 65,536
    // registers with two consumer warpgroups, 128 x 24 + 384 x 160 = 64,512 with three.
    static constexpr int kProducerRegisters = 24;
    static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
    // Where the overlapped loop rescales O by the last softmax's factor (FA2 L10): at d = 256,
    // between issuing the next S and the pending P V, while S runs (FlashAttention-3's order at
    // head dims above 128); below, after that P V has landed (consume_overlapped says why).
    static constexpr bool kRescaleBeforePv = D > 128;
    // At d = 256, the row maximum as a reference moved only when a key tile exceeds it by more
    // than 2^8 (common/online_softmax.hpp, keeps_reference_max): most steps then skip O's rescale,
    // 128 multiplications a thread. Below, where O is 64 or 32 registers, the warp's vote and
    // branch cost more than they save (docs/cuda_fa3.md, "A reference maximum that rarely moves").
    static constexpr bool kLazyRescale = D > 128;
    static constexpr std::uint32_t kQBytes = Br * D * sizeof(T_);
    static constexpr std::uint32_t kTileBytes = Bc * D * sizeof(T_);  // one K_j or V_j
    // O_i's staging blocks (store_output_staged), one per consumer warpgroup of 64 rows x up to
    // two panels: a whole row of O_i up to D = 128, half of one at D = 256, staged in two rounds.
    // Where they fit beside Q_i and the ring: at D = 256 with Bc = 64 (Q_i 64 KiB, the ring 128,
    // the blocks 32), not with Bc = 80 (the ring 160).
    static constexpr int kOStagePanels = kPanels < 2 ? kPanels : 2;
    static constexpr std::uint32_t kOStageBytes = Br * 64 * kOStagePanels * sizeof(T_);
    // Dynamic shared memory without the staging blocks: Q_i, the ring, the barriers, and 1024
    // bytes to start the tiles on a 1024-byte boundary (the 128-byte swizzle repeats every 8 rows
    // of 128 bytes). An SM gives a CTA at most 227 KiB.
    static constexpr std::uint32_t kUnstagedBytes =
        kQBytes + 2 * kStages * kTileBytes + sizeof(Fa3Barriers<kStages_>) + 1024;
    static constexpr std::uint32_t kMaxSharedBytes = 227 * 1024;
    static constexpr bool kStagedO = kUnstagedBytes + kOStageBytes <= kMaxSharedBytes;
    static constexpr std::uint32_t kOBytes = kStagedO ? kOStageBytes : 0;
    static_assert(D == 64 || D == 128 || D == 256, "cuda-fa3: D = 64, 128 or 256");
    static_assert(Bc == 64 || Bc == 80 || Bc == 128,
                  "cuda-fa3: Bc = 64, 80 or 128 (the N of S's wgmma)");
    static_assert(kConsumers == 2 || (kConsumers == 3 && D == 64 && !kPingPong),
                  "cuda-fa3: three consumer warpgroups at d = 64 only (their 160 registers), "
                  "without ping-pong (a turn between two)");
};

// Tiles must start on 1024 bytes: the dynamic shared memory is over-allocated by 1024 and its
// start rounded up (Fa3Tile::kUnstagedBytes).
template <class Cfg>
constexpr int smem_bytes() {
    return int(Cfg::kUnstagedBytes + Cfg::kOBytes);
}
// At d = 256 the limit leaves room for Bc = 80 at most (Q_i 64 KiB, two K_j and two V_j slots of
// 40 KiB each: 224 KiB).
template <class Cfg>
constexpr bool fits_shared_memory() {
    return std::uint32_t(smem_bytes<Cfg>()) <= Cfg::kMaxSharedBytes;
}

// What the kernel reads: cuda-tc's parameters and the tensor maps (built by cuda/fa3/backend.cu:
// 4-D, (d, rows, heads, batch) innermost first at the arrays' strides, boxes of 64 columns x Br or
// Bc rows of one head; O's of 64 x 64, a consumer warpgroup's rows, used where o_staged).
struct Fa3Params {
    KernelParams base;
    CUtensorMap q, k, v, o;
    int o_staged;    // O_i goes out through shared memory and a TMA store (store_output_staged):
                     // O in the inputs' 16-bit type at strides TMA can write, and Cfg::kStagedO
    int Tr;          // query tiles per head
    int items;       // work tiles: Tr x heads x batch
    int tail;        // heads whose tiles end the schedule longest first (scheduled_tile)
    int row_shift;   // query tile i starts at row i Br - row_shift (query_tile_shift: a multiple
                     // of 64, so whole warpgroups lie below row 0)
    int* next_item;  // device counter, zero at launch: work tiles taken past the first gridDim.x
                     // (null where the grid has a CTA for every work tile: each takes its own)
    // Split-KV (decoding) is base.kv_splits = S > 1: items counts S work tiles per query tile, one
    // per chunk of its key tiles (WorkTile::split), each writing its partial result to
    // base.O_partial / base.lse_partial (never staged: o_staged = 0); the host then launches the
    // combine kernel (cuda/stages/combine.cuh).
};

// FA2 L8: issues S = Q_i K_j^T for a consumer warpgroup's 64 rows (not waited for): d / 16
// k-steps over Q_i's and K_j's panels (cuda/fa3/products.cuh).
template <class Cfg>
__device__ __forceinline__ void issue_scores(float (&S)[Cfg::Bc / 8][4], const typename Cfg::T* sQ_wg,
                                             const typename Cfg::T* sK) {
    issue_ab_t<typename Cfg::T, Cfg::Bc, Cfg::kPanels>(S, sQ_wg, Cfg::Br * 64, sK, Cfg::Bc * 64);
}

// P~ packed into wgmma's register A operand (16 keys per k-step), as cuda-tc packs it for mma.sync.
template <class Cfg>
__device__ __forceinline__ void pack_p(std::uint32_t (&a)[Cfg::Bc / 16][4],
                                       const float (&P)[Cfg::Bc / 8][4]) {
    pack_a<typename Cfg::T, Cfg::Bc / 16>(a, P);
}

// FA2 L10 (second half): issues O_i += P~ V_j (not waited for), Bc / 16 k-steps of 16 keys, each
// one wgmma over all of V_j's D columns.
template <class Cfg>
__device__ __forceinline__ void issue_pv(float (&O)[Cfg::D / 8][4],
                                         const std::uint32_t (&a)[Cfg::Bc / 16][4],
                                         const typename Cfg::T* sV) {
    issue_a_regs_b<typename Cfg::T, Cfg::Bc / 16, Cfg::kPanels>(O, a, sV, Cfg::Bc * 64);
}

// The producer (one thread): for each work tile it takes (the CTA's own first, then the counter's),
// FA2 L4 (once the consumers are done with the last Q_i), then L7 for every key tile the CTA's rows
// can see, in the order the consumers take them. A slot's K (V) is refilled once every consumer
// thread has released the K (V) it held. The ring runs on across work tiles, so the next tile's
// copies start while the consumers still work on this one. Ends by handing the consumers item -1.
template <class Cfg, bool kBlockMask, bool kSplitKV>
__device__ void produce(const Fa3Params& params, typename Cfg::T* sQ, typename Cfg::T* sK,
                        typename Cfg::T* sV, Fa3Barriers<Cfg::kStages>* bars) {
    constexpr int Br = Cfg::Br, Bc = Cfg::Bc;
    const AttentionProblem& p = params.base.problem;
    RingPosition ring;
    std::uint32_t q_phase = 0;
    for (int item = int(blockIdx.x);;
         item = params.next_item ? int(gridDim.x) + atomicAdd(params.next_item, 1) : params.items) {
        hopper::mbarrier_wait(&bars->q_empty, q_phase ^ 1);  // the last Q_i is read
        if (item >= params.items) {
            bars->item = -1;
            hopper::mbarrier_arrive(&bars->q);  // release: the consumers read item = -1 after it
            return;
        }
        bars->item = item;
        const WorkTile t = work_tile<Br, Bc, kSplitKV>(p, params.Tr, params.tail,
                                                       params.row_shift, params.base.kv_splits,
                                                       item);
        // Tensor-map coordinates (cuda/fa3/tensor_map.hpp): column, row, head, batch entry.
        const int b = int(t.b), q_head = int(t.h), kv_head = int(p.kv_head(t.h));

        hopper::mbarrier_arrive_expect_bytes(&bars->q, Cfg::kQBytes);  // FA2 L4
#pragma unroll
        for (int pn = 0; pn < Cfg::kPanels; ++pn)
            hopper::tma_load_4d(sQ + pn * Br * 64, &params.q, &bars->q, 64 * pn, int(t.rows.begin),
                                q_head, b);

        for (int j = mma::next_key_tile<kBlockMask>(p, t.rows, t.key_begin, t.key_end, Bc);
             j < t.key_end; j = mma::next_key_tile<kBlockMask>(p, t.rows, j + 1, t.key_end, Bc)) {
            const int s = ring.stage;
            hopper::mbarrier_wait(&bars->k_empty[s], ring.phase ^ 1);  // the slot's last K is read
            hopper::mbarrier_arrive_expect_bytes(&bars->k_full[s], Cfg::kTileBytes);  // FA2 L7
#pragma unroll
            for (int pn = 0; pn < Cfg::kPanels; ++pn)
                hopper::tma_load_4d(sK + (s * Cfg::kPanels + pn) * Bc * 64, &params.k,
                                    &bars->k_full[s], 64 * pn, j * Bc, kv_head, b);
            hopper::mbarrier_wait(&bars->v_empty[s], ring.phase ^ 1);  // the slot's last V is read
            hopper::mbarrier_arrive_expect_bytes(&bars->v_full[s], Cfg::kTileBytes);
#pragma unroll
            for (int pn = 0; pn < Cfg::kPanels; ++pn)
                hopper::tma_load_4d(sV + (s * Cfg::kPanels + pn) * Bc * 64, &params.v,
                                    &bars->v_full[s], 64 * pn, j * Bc, kv_head, b);
            ring.advance<Cfg::kStages>();
        }
        q_phase ^= 1;
    }
}

// What a consumer warpgroup keeps from one work tile to the next: where it is in the ring, the
// ping-pong turns, and the parity of the Q barrier.
template <class Cfg, bool kBlockMask>
struct ConsumerState {
    RingPosition ring;  // the slot of the next key tile
    const Turns<Cfg::kPingPong && !kBlockMask, Cfg::kConsumerThreads> turns;
    std::uint32_t q_phase = 0;
    __device__ explicit ConsumerState(int cg) : turns(cg) {}
};

// Where one consumer warp works in a work tile: its warpgroup cg (0 .. kConsumers - 1), the first
// of its 16 rows, and the warpgroup's rows that exist (in [0, N_q): empty for a warpgroup past the
// last row or below row 0, which then skips every product). A warpgroup's wgmma is collective, so
// whether to skip a key tile or mask it is decided per warpgroup.
struct ConsumerRows {
    int cg, wg_warp, warp_begin;
    TileRange wg_rows;
    __device__ ConsumerRows(const WorkTile& t, int cw) : cg(cw / 4), wg_warp(cw % 4) {
        const int row_begin = int(t.rows.begin), row_end = int(t.rows.end);
        warp_begin = row_begin + 16 * cw;
        const int wg_begin = min(max(row_begin + 64 * cg, 0), row_end);
        wg_rows = {wg_begin, max(min(row_begin + 64 * cg + 64, row_end), wg_begin)};
    }
};

// FA2 L5 (O_i = 0; the softmax state starts at m = -inf, l = 0) for one warp's 16 rows.
template <class Cfg>
__device__ __forceinline__ void zero_output(float (&O)[Cfg::D / 8][4]) {
    zero(O);
}

// This thread's warpgroup has no product left that reads Q_i: once every consumer thread has said
// so, the producer copies the next work tile's Q_i into the same slot.
template <int kStages>
__device__ __forceinline__ void release_q(Fa3Barriers<kStages>* bars) {
    hopper::mbarrier_arrive(&bars->q_empty);
}

// FA2 L12-L15 through shared memory, as FlashAttention-3 ends a tile: the warpgroup writes its 64
// rows of O_i / l_i, rounded to T, into its staging block of sO (Cfg::kOStagePanels panels of 64
// rows x 64 columns in the 128-byte swizzle: the layout a TMA load of the box would write), and one
// thread hands the panels to the copy engine, which stores them in O while the warpgroup goes on.
// At D = 256 the block holds half a row: two rounds, the second waiting until the copy engine has
// read the first. Stored from registers (write_output), each store instruction of a warp writes 4
// bytes to each of 8 rows of O, and those stores held the consumers back (docs/cuda_fa3.md, "O_i
// stored by TMA", measures both ways). Here a warp's shared-memory store lands in 32 different
// banks (chunk c of row r at c ^ (r % 8), and r % 8 = lane / 4).
// Rows outside [0, N_q) lie outside O's tensor map and are not written; L_i is written by the
// lanes (finish_rows). The block's previous store must have read it before it is written again.
template <class Cfg, bool kBlockMask, class Softmax>
__device__ __forceinline__ void store_output_staged(const Fa3Params& params, const WorkTile& t,
                                                    const ConsumerRows& at, const Softmax& softmax,
                                                    const float (&O)[Cfg::D / 8][4],
                                                    typename Cfg::T* sO, int lane) {
    using T = typename Cfg::T;
    constexpr int kStagePanels = Cfg::kOStagePanels, kRounds = Cfg::kPanels / kStagePanels;
    const AttentionProblem& p = params.base.problem;
    const bool issuer = at.wg_warp == 0 && lane == 0;
    T* const block = sO + at.cg * 64 * 64 * kStagePanels;
    // 1 / l_i and the overflow test of the thread's two rows, once (rows outside [0, N_q) keep
    // scale 0: their values are staged but never stored).
    float scale[2] = {0.0f, 0.0f};
    bool overflowed[2] = {false, false};
    float* const lse_head = params.base.lse + p.lse_offset(t.b, t.h);
    mma::finish_rows<kBlockMask>(softmax.m, softmax.l, params.base, at.warp_begin, lse_head, false,
                                 lane, [&](int r, int, float row_scale, bool row_overflowed) {
                                     scale[r] = row_scale;
                                     overflowed[r] = row_overflowed;
                                 });
    // Row 16 wg_warp + lane / 4 + 8 r of the block, columns 8 dt + 2 (lane % 4) (+1): panel dt / 8,
    // 16-byte chunk dt % 8 of the row, at chunk ^ (lane / 4). The thread's part of the address
    // once, each store's as one XOR and an immediate offset (store_score_gradients' way).
    constexpr std::uint32_t kRowBytes = 128, kPanelBytes = 64 * kRowBytes;
    const std::uint32_t thread_at = hopper::smem_address(block) +
                                    (16 * at.wg_warp + lane / 4) * kRowBytes +
                                    std::uint32_t((lane / 4) << 4) + 4 * (lane % 4);
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
        if (issuer) hopper::bulk_wait_read<0>();
        hopper::named_barrier_sync(kOutput + at.cg, 128);
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int dt = 0; dt < 8 * kStagePanels; ++dt) {
                const int col = 8 * kStagePanels * round + dt;  // O's column tile (of 8)
                hopper::st_shared_b32(
                    (thread_at ^ ((dt % 8) << 4)) + (dt / 8) * kPanelBytes + 8 * r * kRowBytes,
                    tc::pack2<T>(final_output_scaled(O[col][2 * r], scale[r], overflowed[r]),
                                 final_output_scaled(O[col][2 * r + 1], scale[r], overflowed[r])));
            }
        hopper::fence_proxy_async();  // the stores, read next by the copy engine
        hopper::named_barrier_sync(kOutput + at.cg, 128);
        if (issuer && at.wg_rows.size() > 0) {
#pragma unroll
            for (int pn = 0; pn < kStagePanels; ++pn)
                hopper::tma_store_4d(&params.o, block + pn * 64 * 64,
                                     64 * (kStagePanels * round + pn),
                                     int(t.rows.begin) + 64 * at.cg, int(t.h), int(t.b));
            hopper::bulk_commit();
        }
    }
}

// FA2 L12-L15 for the warp's rows (Q_i already released): through shared memory where the
// tile has the room and O suits TMA (params.o_staged), else from registers.
template <class Cfg, bool kBlockMask, bool kSplitKV, class Softmax>
__device__ __forceinline__ void finish_work_tile(const Fa3Params& params, const WorkTile& t,
                                                 const ConsumerRows& at, const Softmax& softmax,
                                                 const float (&O)[Cfg::D / 8][4],
                                                 typename Cfg::T* sO, int lane) {
    if constexpr (Cfg::kStagedO && !kSplitKV)
        if (params.o_staged) {
            store_output_staged<Cfg, kBlockMask>(params, t, at, softmax, O, sO, lane);
            return;
        }
    if (at.warp_begin < t.rows.end)  // O_i, or under split-KV chunk t.split's partial result
        softmax.template finalize<kBlockMask>(O, params.base, at.warp_begin, t.b, t.h, lane,
                                              kSplitKV ? t.split : 0);
}

// One consumer warpgroup's share of one work tile with a block mask: FA2 L5-L15 for its 64 rows.
// A tile may be hidden from this warpgroup or need the mask, asked tile by tile (64-bit divisions,
// subroutine calls). ptxas serializes a wgmma left running across such branches, so here each
// tile's products are waited for at once (stage 2 of docs/cuda_fa3.md).
template <class Cfg, bool kSplitKV>
__device__ __forceinline__ void consume_block_masked(const Fa3Params& params, const WorkTile& t,
                                                     const typename Cfg::T* sQ,
                                                     const typename Cfg::T* sK,
                                                     const typename Cfg::T* sV,
                                                     typename Cfg::T* sO,
                                                     Fa3Barriers<Cfg::kStages>* bars,
                                                     ConsumerState<Cfg, true>& state, int cw,
                                                     int lane) {
    constexpr int Bc = Cfg::Bc, D = Cfg::D, kStages = Cfg::kStages;
    const AttentionProblem& p = params.base.problem;
    const ConsumerRows at(t, cw);
    const auto* sQ_wg = sQ + 64 * at.cg * 64;  // this warpgroup's 64 rows of the first panel
    RingPosition& ring = state.ring;

    float O[D / 8][4];  // FA2 L5
    zero_output<Cfg>(O);
    mma::RowSoftmax<Cfg, false, Cfg::kLazyRescale> softmax;
    for (int j = mma::next_key_tile<true>(p, t.rows, t.key_begin, t.key_end, Bc); j < t.key_end;
         j = mma::next_key_tile<true>(p, t.rows, j + 1, t.key_end, Bc)) {
        const int s = ring.stage;
        const TileRange cols = tile_range(j, Bc, p.seq_kv);
        const TileVisibility seen = at.wg_rows.size() > 0
                                        ? mma::visibility<true>(p, at.wg_rows, cols)
                                        : TileVisibility::none;
        hopper::mbarrier_wait(&bars->k_full[s], ring.phase);  // FA2 L7
        hopper::mbarrier_wait(&bars->v_full[s], ring.phase);
        if (seen != TileVisibility::none) {
            float S[Bc / 8][4];
            issue_scores<Cfg>(S, sQ_wg, sK + s * Bc * D);  // FA2 L8
            hopper::wgmma_wait<0>();
            hopper::wgmma_fence_registers(S);
            // Rows past N_q in a short warpgroup must read as masked too (never stored).
            if (needs_element_mask(seen, cols, Bc) || at.wg_rows.size() < 64)
                mma::mask_scores<Cfg, true>(S, p, at.warp_begin, int(cols.begin), lane);
            softmax.update(S, O, params.base.scale_log2);  // FA2 L9, L10
            std::uint32_t a[Bc / 16][4];
            pack_p<Cfg>(a, S);
            issue_pv<Cfg>(O, a, sV + s * Bc * D);  // FA2 L10
            hopper::wgmma_wait<0>();
            hopper::wgmma_fence_registers(O);
            hopper::wgmma_fence_registers(a);
        }
        hopper::mbarrier_arrive(&bars->k_empty[s]);
        hopper::mbarrier_arrive(&bars->v_empty[s]);
        ring.advance<kStages>();
    }
    release_q(bars);
    finish_work_tile<Cfg, true, kSplitKV>(params, t, at, softmax, O, sO, lane);
}

// One consumer warpgroup's share of one work tile without a block mask: FA2 L5-L15 for its 64
// rows, the products overlapped with the softmax (FA3 Section 3.2). The tiles this warpgroup sees
// are a prefix of the producer's sequence, and those that need the mask a suffix of that prefix
// (causal_key_tiles): a loop for each, so that no run-time branch separates a wgmma from its wait.
// Under split-KV the producer's sequence is the chunk [key_begin, key_end), and the warpgroup's
// tiles are that chunk's prefix up to `seen`.
template <class Cfg, bool kSplitKV>
__device__ __forceinline__ void consume_overlapped(const Fa3Params& params, const WorkTile& t,
                                                   const typename Cfg::T* sQ,
                                                   const typename Cfg::T* sK,
                                                   const typename Cfg::T* sV,
                                                   typename Cfg::T* sO,
                                                   Fa3Barriers<Cfg::kStages>* bars,
                                                   ConsumerState<Cfg, false>& state, int cw,
                                                   int lane) {
    constexpr int Bc = Cfg::Bc, D = Cfg::D, kStages = Cfg::kStages;
    const AttentionProblem& p = params.base.problem;
    const ConsumerRows at(t, cw);
    const auto* sQ_wg = sQ + 64 * at.cg * 64;  // this warpgroup's 64 rows of the first panel
    RingPosition& ring = state.ring;
    const auto& turns = state.turns;

    float O[D / 8][4];  // FA2 L5
    zero_output<Cfg>(O);
    mma::RowSoftmax<Cfg, false, Cfg::kLazyRescale> softmax;
    // Tiles [first, full) need no mask, [full, seen) do, [seen, t.key_end) only the CTA's other
    // warpgroup sees (all within this work tile's chunk). Without a split these are
    // causal_key_tiles' own: the clamps to the chunk cost the kernels at the register limit spills.
    const KeyTileSplit tiles = causal_key_tiles(p, at.wg_rows, Bc);
    const int first = kSplitKV ? t.key_begin : 0;
    const int seen = kSplitKV ? min(int(tiles.seen), t.key_end) : int(tiles.seen);
    const int full = kSplitKV ? min(int(tiles.full), seen) : int(tiles.full);
    RingPosition pv;              // the slot of the tile whose P~ V is pending
    std::uint32_t a[Bc / 16][4];  // that tile's P~, wgmma's A operand
    // The factor exp(scale (m_old - m_new)) of the last softmax_update, by which O is rescaled
    // (FA2 L10) before the next P~ V adds to it. The rescale cannot start before O is ours again,
    // once the pending P V has landed. Below d = 256 it runs right then, at the end of the step.
    // At d = 256 (Cfg::kRescaleBeforePv) O is 128 registers a thread, and the rescale is put off
    // to the next step, between issuing its S and the pending P V: the multiplications then run
    // while S does, not between this step's last product and the next step's first, when the
    // warpgroup has nothing on the tensor cores. The same sums: O s + P~ V instead of (O + P~ V) s,
    // with the factor applied one product later.
    float old_scale[2];

    // One step of the overlapped loop: tile j's S is issued with tile j-1's P V; tile j's softmax
    // runs while that P V does; then O's rescale (or in the next step) and P~_j.
    const auto step = [&](int j, auto masked) {
        const int s = ring.stage;
        hopper::mbarrier_wait(&bars->k_full[s], ring.phase);       // FA2 L7: K_j
        hopper::mbarrier_wait(&bars->v_full[pv.stage], pv.phase);  // V_{j-1}
        float S[Bc / 8][4];
        turns.begin();
        issue_scores<Cfg>(S, sQ_wg, sK + s * Bc * D);  // FA2 L8, tile j
        if constexpr (Cfg::kRescaleBeforePv) softmax.rescale(O, old_scale);  // tile j-1's factor
        issue_pv<Cfg>(O, a, sV + pv.stage * Bc * D);  // FA2 L10, tile j-1
        turns.end();
        hopper::wgmma_wait<1>();  // S has landed; the P V still runs
        hopper::wgmma_fence_registers(S);
        hopper::mbarrier_arrive(&bars->k_empty[s]);
        if constexpr (decltype(masked)::value)
            mma::mask_scores<Cfg, false>(S, p, at.warp_begin, j * Bc, lane);
        softmax.update_only(S, params.base.scale_log2, old_scale);  // FA2 L9
        hopper::wgmma_wait<0>();  // the P V has landed: O is ours again, V_{j-1} free
        hopper::wgmma_fence_registers(O);
        hopper::wgmma_fence_registers(a);
        hopper::mbarrier_arrive(&bars->v_empty[pv.stage]);
        if constexpr (!Cfg::kRescaleBeforePv) softmax.rescale(O, old_scale);  // FA2 L10
        pack_p<Cfg>(a, S);
        pv = ring;
        ring.advance<kStages>();
    };

    if (seen > first) {
        {  // The first tile: its S alone (nothing is pending), its softmax; O is still zero
            // (a rescale put off to the next step multiplies zeros, by 0 where m was -inf).
            hopper::mbarrier_wait(&bars->k_full[ring.stage], ring.phase);
            float S[Bc / 8][4];
            turns.begin();
            issue_scores<Cfg>(S, sQ_wg, sK + ring.stage * Bc * D);
            turns.end();
            hopper::wgmma_wait<0>();
            hopper::wgmma_fence_registers(S);
            hopper::mbarrier_arrive(&bars->k_empty[ring.stage]);
            if (full <= first) mma::mask_scores<Cfg, false>(S, p, at.warp_begin, first * Bc, lane);
            softmax.update_only(S, params.base.scale_log2, old_scale);
            pack_p<Cfg>(a, S);
            pv = ring;
            ring.advance<kStages>();
        }
        int j = first + 1;
        for (; j < full; ++j) step(j, std::false_type{});
        for (; j < seen; ++j) step(j, std::true_type{});
        // Every S has landed: Q_i is released, so that the next work tile's Q_i is copied while
        // the last P V and the epilogue run. Then FA2 L10 for the last tile.
        release_q(bars);
        if constexpr (Cfg::kRescaleBeforePv) softmax.rescale(O, old_scale);  // the last factor
        hopper::mbarrier_wait(&bars->v_full[pv.stage], pv.phase);
        turns.begin();
        issue_pv<Cfg>(O, a, sV + pv.stage * Bc * D);
        turns.end();
        hopper::wgmma_wait<0>();
        hopper::wgmma_fence_registers(O);
        hopper::wgmma_fence_registers(a);
        hopper::mbarrier_arrive(&bars->v_empty[pv.stage]);
    } else {
        release_q(bars);  // no rows here: Q_i is never read
        turns.begin();    // the last P V's turn, with nothing to issue
        turns.end();
    }
    // Tiles only the CTA's other warpgroup sees: released unread, each after both its copies have
    // landed (the producer must not refill a slot a copy is still writing).
    for (int j = kSplitKV ? max(seen, first) : seen; j < t.key_end; ++j) {
        turns.begin();
        turns.end();
        hopper::mbarrier_wait(&bars->k_full[ring.stage], ring.phase);
        hopper::mbarrier_wait(&bars->v_full[ring.stage], ring.phase);
        hopper::mbarrier_arrive(&bars->k_empty[ring.stage]);
        hopper::mbarrier_arrive(&bars->v_empty[ring.stage]);
        ring.advance<kStages>();
    }
    finish_work_tile<Cfg, false, kSplitKV>(params, t, at, softmax, O, sO, lane);
}

// ---- the kernel ------------------------------------------------------------------------------
// Grid: min(work tiles, SMs) persistent CTAs. Block: Cfg::kThreads (warpgroup 0 produces, the
// kConsumers others consume). Dynamic shared memory: smem_bytes<Cfg>(): Q_i (Br x D), kStages K_j
// slots, kStages V_j slots (each a tile of kPanels panels), O_i's staging blocks (Cfg::kOBytes),
// the barriers; from a 1024-byte boundary.
template <class Cfg, bool kBlockMask, bool kSplitKV>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    fa3_forward_kernel(const __grid_constant__ Fa3Params params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using T = typename Cfg::T;
    constexpr int Br = Cfg::Br, Bc = Cfg::Bc, D = Cfg::D, kStages = Cfg::kStages;
    extern __shared__ uint4 smem_raw[];
    const std::uintptr_t raw = reinterpret_cast<std::uintptr_t>(smem_raw);
    T* sQ = reinterpret_cast<T*>((raw + 1023) & ~std::uintptr_t(1023));
    T* sK = sQ + Br * D;
    T* sV = sK + kStages * Bc * D;
    T* sO = sV + kStages * Bc * D;
    auto* bars = reinterpret_cast<Fa3Barriers<kStages>*>(sO + Cfg::kOBytes / sizeof(T));
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, wg = warp / 4;

    if (threadIdx.x == 0) bars->init(Cfg::kConsumerThreads);
    __syncthreads();

    if (wg == 0) {
        // The producer warpgroup: one thread issues every copy; the registers go to the consumers.
        hopper::release_registers<Cfg::kProducerRegisters>();
        if (warp == 0 && lane == 0) produce<Cfg, kBlockMask, kSplitKV>(params, sQ, sK, sV, bars);
    } else {
        hopper::claim_registers<Cfg::kConsumerRegisters>();
        const int cw = warp - 4;  // consumer warp 0 .. 4 kConsumers - 1
        ConsumerState<Cfg, kBlockMask> state(cw / 4);
        for (;;) {
            hopper::mbarrier_wait(&bars->q, state.q_phase);  // Q_i of the next work tile
            const int item = *static_cast<volatile int*>(&bars->item);
            if (item < 0) break;
            const WorkTile t = work_tile<Br, Bc, kSplitKV>(params.base.problem, params.Tr,
                                                           params.tail, params.row_shift,
                                                           params.base.kv_splits, item);
            if constexpr (kBlockMask)
                consume_block_masked<Cfg, kSplitKV>(params, t, sQ, sK, sV, sO, bars, state, cw,
                                                    lane);
            else
                consume_overlapped<Cfg, kSplitKV>(params, t, sQ, sK, sV, sO, bars, state, cw,
                                                  lane);
            state.q_phase ^= 1;
        }
        state.turns.finish();
        // The last O_i stores must have read their staging block before the CTA's shared memory
        // goes (and be done before the kernel ends).
        if (Cfg::kStagedO && params.o_staged && cw % 4 == 0 && lane == 0) hopper::bulk_wait<0>();
    }
#endif
}

}  // namespace flashattn::fa3
