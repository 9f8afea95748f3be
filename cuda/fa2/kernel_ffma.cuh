// cuda/fa2/kernel_ffma.cuh — cuda-fa2's FFMA kernel (v3): FlashAttention-2 (Dao 2023, arXiv
// 2307.08691, Algorithm 1) in float32 on CUDA cores, and its launcher. The host side that chooses
// between it and the 3xTF32 tensor-core kernel (cuda/fa2/kernel_tf32.cuh) is cuda/fa2/backend.cu.
//
// What changed from cuda-fa1 (Algorithm 1 of FlashAttention, cuda/fa1/backend.cu) and why:
//   * loop order: the query-block loop is now the outer one and each query block is independent,
//     so the grid is (query block i) x (batch*head) and one thread block owns Q_i from start to
//     finish: O_i, m_i and l_i stay in registers and are written to HBM once, not once per K/V
//     block (fa1 reads and writes O, l, m at every step: Theorem 2's extra traffic);
//   * O_i is kept unnormalized and divided by l_i once at the end (normalize_output), instead of
//     being rescaled by diag(l_new)^-1 at every step (fewer FLOPs, same rule: exp_shifted);
//   * K_j, V_j stream through shared memory with cp.async, and the copy of the next tile overlaps
//     the math on this one: V_j is fetched while S_ij = Q_i K_j^T is computed, K_{j+1} while
//     O_i += P_ij V_j is -- one buffer each, the double buffering is across the two halves;
//   * register blocking: each thread owns TM = 4 rows x TN columns of S_ij and the same 4 rows x
//     TD columns of O_i, so every value read from shared memory feeds 4-8 FMAs, and the row
//     statistics (m, l) of the online softmax live in the registers of the lanes of that row.
//
// Per iteration over visible K/V tiles j (masks: "none" tiles are never loaded):
//   S = scale * Q_i K_j^T               (registers; masked keys and the ragged tail -> -inf)
//   m_new = max(m, rowmax S)            nan_max, across the CG lanes of a row with shuffles
//   alpha = exp_shifted(m, m_new)       rescales l and O
//   P = exp_shifted(S, m_new)           to shared memory (masked keys stored as -0.0f)
//   l = alpha * l + rowsum P            per lane; lanes are summed once at the end
//   O = alpha * O + P V_j               P V_j into a fresh accumulator, then one FMA per entry;
//                                       on tiles with masked keys, a masked key is skipped
// End: O / l, LSE = m + log l (final_output, final_lse: NaN for a row whose visible scores all
// overflowed), one write each.
//
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/array_layout.hpp"
#include "common/online_softmax.hpp"
#include "common/tiling.hpp"
#include "cuda/stages/async_copy.cuh"
#include "cuda/host/check.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/host/tensor_core_eligibility.hpp"
#include "cuda/stages/warp_softmax.cuh"

namespace flashattn::cuda::fa2 {


// One kernel configuration: padded head dim D, tile Br x Bc, THREADS threads per block, TM rows
// per thread.
template <int D_, int Br_, int Bc_, int THREADS_, int MIN_BLOCKS_, int TM_ = 4>
struct Fa2Config {
    static constexpr int D = D_, Br = Br_, Bc = Bc_, THREADS = THREADS_;
    static constexpr int MIN_BLOCKS = MIN_BLOCKS_;  // blocks per SM the registers must allow
    static constexpr int TM = TM_;                   // rows of S and O per thread
    static constexpr int RG = Br / TM;               // row groups: thread (rg, cg) owns rows
    static constexpr int CG = THREADS / RG;          //   rg + RG*t (t < TM); CG lanes share a row
    static constexpr int TN = Bc / CG;               // columns of S per thread: cg + CG*u
    static constexpr int TD = D / CG;                // columns of O per thread: float4 groups
                                                     //   4*cg + 4*CG*v + (0..3), v < TD/4
    // Shared-memory row strides (floats). K and Q rows are read as float4 along d by lanes that
    // own different rows: +4 floats shifts each row by 4 banks, so 8 rows hit 32 distinct banks.
    // P rows: +CG makes the CG x (32/CG) scalar stores of a warp land in 32 distinct banks.
    static constexpr int Q_STRIDE = D + 4, K_STRIDE = D + 4, V_STRIDE = D, P_STRIDE = Bc + CG;
    static constexpr int SMEM_FLOATS =
        Br * Q_STRIDE + Bc * K_STRIDE + Bc * V_STRIDE + Br * P_STRIDE;
    static constexpr std::size_t SMEM_BYTES = SMEM_FLOATS * sizeof(float);

    static_assert(Br % TM == 0 && THREADS % RG == 0, "threads must tile the rows");
    static_assert(CG <= 32 && 32 % CG == 0, "the lanes of a row must sit in one warp");
    static_assert(TN * CG == Bc && TD * CG == D && TD % 4 == 0, "columns must tile evenly");
};


// s[t][u] = Q_i[row t] . K_j[col u]: the thread's TM x TN micro-tile of S_ij (unscaled).
template <class C>
__device__ inline void qk_micro_tile(const float* Q_i, const float* K_j, int rg, int cg,
                                     float (&s)[C::TM][C::TN]) {
#pragma unroll
    for (int t = 0; t < C::TM; ++t)
#pragma unroll
        for (int u = 0; u < C::TN; ++u) s[t][u] = 0.0f;
#pragma unroll
    for (int k = 0; k < C::D; k += 4) {
        float4 q[C::TM], kv[C::TN];
#pragma unroll
        for (int t = 0; t < C::TM; ++t)
            q[t] = *reinterpret_cast<const float4*>(&Q_i[(rg + C::RG * t) * C::Q_STRIDE + k]);
#pragma unroll
        for (int u = 0; u < C::TN; ++u)
            kv[u] = *reinterpret_cast<const float4*>(&K_j[(cg + C::CG * u) * C::K_STRIDE + k]);
#pragma unroll
        for (int t = 0; t < C::TM; ++t)
#pragma unroll
            for (int u = 0; u < C::TN; ++u) {
                s[t][u] = fmaf(q[t].x, kv[u].x, s[t][u]);
                s[t][u] = fmaf(q[t].y, kv[u].y, s[t][u]);
                s[t][u] = fmaf(q[t].z, kv[u].z, s[t][u]);
                s[t][u] = fmaf(q[t].w, kv[u].w, s[t][u]);
            }
    }
}

// o[t][.] = alpha[t] o[t][.] + sum_c P_ij[row t][c] * V_j[c][.]. The tile's sum goes into a fresh
// accumulator first and is added to o once: one fp32 chain over all N_kv keys (o += p v per key,
// v3) lost accuracy at d = 3, N_kv = 1023 (1.37-1.68x the 2x rule on an H100, reproduced by
// docs/scripts/fa2_ffma_emulation.cpp), chains of Bc keys do not. With kSkipMasked (tiles that
// have masked keys), a key whose P is the masked marker contributes nothing, not 0 * V (see
// cuda/stages/warp_softmax.cuh).
template <class C, bool kSkipMasked>
__device__ inline void pv_micro_tile(const float* P_ij, const float* V_j, int rg, int cg,
                                     const float (&alpha)[C::TM], float (&o)[C::TM][C::TD]) {
    float tile[C::TM][C::TD];
#pragma unroll
    for (int t = 0; t < C::TM; ++t)
#pragma unroll
        for (int c = 0; c < C::TD; ++c) tile[t][c] = 0.0f;
#pragma unroll 2
    for (int c = 0; c < C::Bc; c += 4) {
        float4 p4[C::TM];
#pragma unroll
        for (int t = 0; t < C::TM; ++t)
            p4[t] = *reinterpret_cast<const float4*>(&P_ij[(rg + C::RG * t) * C::P_STRIDE + c]);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            float4 v4[C::TD / 4];
#pragma unroll
            for (int v = 0; v < C::TD / 4; ++v)
                v4[v] = *reinterpret_cast<const float4*>(
                    &V_j[(c + k) * C::V_STRIDE + 4 * cg + 4 * C::CG * v]);
#pragma unroll
            for (int t = 0; t < C::TM; ++t) {
                const float p = component(p4[t], k);
                const bool skip = kSkipMasked && is_masked_p(p);
#pragma unroll
                for (int v = 0; v < C::TD / 4; ++v) {
                    float* acc = &tile[t][4 * v];
                    acc[0] = skip ? acc[0] : fmaf(p, v4[v].x, acc[0]);
                    acc[1] = skip ? acc[1] : fmaf(p, v4[v].y, acc[1]);
                    acc[2] = skip ? acc[2] : fmaf(p, v4[v].z, acc[2]);
                    acc[3] = skip ? acc[3] : fmaf(p, v4[v].w, acc[3]);
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < C::TM; ++t)
#pragma unroll
        for (int c = 0; c < C::TD; ++c) o[t][c] = fmaf(alpha[t], o[t][c], tile[t][c]);
}

// The block-mask lookup of AttentionProblem::key_visible (two 64-bit divisions), kept out of line:
// inlined, its registers would count against the register-blocked loops even on tiles (and in
// problems) that have no block mask.
__device__ __noinline__ inline bool block_allows(const std::uint8_t* mask, std::int64_t block_q,
                                                 std::int64_t block_kv, std::int64_t seq_kv,
                                                 std::int64_t row, std::int64_t col) {
    AttentionProblem masked;
    masked.seq_kv = seq_kv;
    masked.block_mask = {mask, block_q, block_kv};
    return masked.block_visible(row, col);
}

// The online softmax of FlashAttention-2 on this thread's rows of S_ij (registers):
//   m_new = max(m, rowmax S), alpha = exp(m - m_new), P = exp(S - m_new) -> shared memory,
//   l = alpha l + rowsum P (this lane's part); alpha is returned for pv_micro_tile's
//   O = alpha O + P V_j.
// kMasked (partial tiles and the ragged last tile): masked keys and keys past N_kv get -inf, and
// their P is stored as the masked marker; other tiles skip both tests.
template <class C, bool kMasked>
__device__ inline void online_softmax_tile(const AttentionProblem& p, float (&s)[C::TM][C::TN],
                                           float (&m)[C::TM], float (&l)[C::TM],
                                           float (&alpha)[C::TM], float* P_ij, int rg, int cg,
                                           TileRange rows, TileRange cols, float scale) {
#pragma unroll
    for (int t = 0; t < C::TM; ++t) {
        const int r = rg + C::RG * t;
        float row_max = neg_infinity();
#pragma unroll
        for (int u = 0; u < C::TN; ++u) {
            float x = s[t][u] * scale;
            if constexpr (kMasked) {
                const std::int64_t row = rows.begin + r, col = cols.begin + cg + C::CG * u;
                // p.key_visible(row, col), with the block-mask part out of line
                const bool visible =
                    row < p.seq_q && col < p.seq_kv && p.causal_visible(row, col) &&
                    (!p.block_mask.active() ||
                     block_allows(p.block_mask.data, p.block_mask.block_q, p.block_mask.block_kv,
                                  p.seq_kv, row, col));
                x = visible ? x : neg_infinity();
            }
            s[t][u] = x;
            row_max = nan_max(row_max, x);
        }
        row_max = lanes_max<C::CG>(row_max);
        const float m_new = nan_max(m[t], row_max);
        alpha[t] = exp_shifted(m[t], m_new);  // rescales what came before
        m[t] = m_new;
        float row_sum = 0.0f;
#pragma unroll
        for (int u = 0; u < C::TN; ++u) {
            const float prob = exp_shifted(s[t][u], m_new);
            row_sum += prob;
            float& entry = P_ij[r * C::P_STRIDE + cg + C::CG * u];
            if constexpr (kMasked)
                entry = s[t][u] == neg_infinity() ? masked_p() : prob;
            else
                entry = prob;
        }
        l[t] = alpha[t] * l[t] + row_sum;
    }
}

// Query tile i of head h of batch b, computed by the C::THREADS threads of one thread block in
// `smem` (C::SMEM_BYTES). The FFMA kernel below runs one per block; the 3xTF32 kernel
// (cuda/fa2/kernel_tf32.cuh) runs it for a tile whose inputs it cannot take. Q, K and V are read
// and O written where `at` and `o_at` (resolved layouts) say their rows lie.
template <class C>
__device__ inline void fa2_forward_tile(const AttentionProblem& p, const float* __restrict__ Q,
                                        const float* __restrict__ K, const float* __restrict__ V,
                                        const QkvLayouts& at, float* __restrict__ O,
                                        const ArrayLayout& o_at, float* __restrict__ lse,
                                        std::int64_t b, std::int64_t h, std::int64_t i,
                                        void* smem) {
    float* Q_i = static_cast<float*>(smem);
    float* K_j = Q_i + C::Br * C::Q_STRIDE;
    float* V_j = K_j + C::Bc * C::K_STRIDE;
    float* P_ij = V_j + C::Bc * C::V_STRIDE;

    const std::int64_t Tc = tile_count(p.seq_kv, C::Bc);
    const TileRange rows = tile_range(i, C::Br, p.seq_q);
    const std::int64_t d = p.dim;
    Q += at.q.offset(b, h) + rows.begin * at.q.row;
    K += at.k.offset(b, p.kv_head(h));  // GQA
    V += at.v.offset(b, p.kv_head(h));
    O += o_at.offset(b, h) + rows.begin * o_at.row;
    lse += p.lse_offset(b, h) + rows.begin;

    const int tid = threadIdx.x;
    const int cg = tid % C::CG, rg = tid / C::CG;
    const float scale = p.softmax_scale();

    float o[C::TM][C::TD];  // unnormalized O_i rows of this thread
    float m[C::TM], l[C::TM];  // running max; this lane's part of the running sum
#pragma unroll
    for (int t = 0; t < C::TM; ++t) {
        m[t] = neg_infinity();
        l[t] = 0.0f;
#pragma unroll
        for (int c = 0; c < C::TD; ++c) o[t][c] = 0.0f;
    }

    std::int64_t j = next_visible_tile(p, TileAxis::keys, rows, 0, Tc, C::Bc);
    if (j < Tc) {  // Q_i once, and the first K_j
        load_tile_async(Q_i, C::Q_STRIDE, Q, at.q.row, C::Br, C::D, int(rows.size()), int(d), tid,
                        C::THREADS);
        const TileRange cols = tile_range(j, C::Bc, p.seq_kv);
        load_tile_async(K_j, C::K_STRIDE, K + cols.begin * at.k.row, at.k.row, C::Bc, C::D,
                        int(cols.size()), int(d), tid, C::THREADS);
        cp_async_commit();
    }
    while (j < Tc) {
        const TileRange cols = tile_range(j, C::Bc, p.seq_kv);
        // Per-key masking only where needed: partial tiles and the ragged last tile.
        const bool needs_mask = needs_element_mask(classify_tile(p, rows, cols), cols, C::Bc);

        cp_async_wait_all();
        __syncthreads();  // K_j (and Q_i) have landed; nobody reads V or P of the last tile now
        load_tile_async(V_j, C::V_STRIDE, V + cols.begin * at.v.row, at.v.row, C::Bc, C::D,
                        int(cols.size()), int(d), tid, C::THREADS);
        cp_async_commit();  // V_j arrives while S_ij is computed

        float s[C::TM][C::TN], alpha[C::TM];
        qk_micro_tile<C>(Q_i, K_j, rg, cg, s);

        if (needs_mask)
            online_softmax_tile<C, true>(p, s, m, l, alpha, P_ij, rg, cg, rows, cols, scale);
        else
            online_softmax_tile<C, false>(p, s, m, l, alpha, P_ij, rg, cg, rows, cols, scale);

        cp_async_wait_all();
        __syncthreads();  // V_j has landed, P_ij is complete, nobody reads K_j any more
        const std::int64_t next = next_visible_tile(p, TileAxis::keys, rows, j + 1, Tc, C::Bc);
        if (next < Tc) {  // K_{j+1} arrives while O_i += P_ij V_j is computed
            const TileRange next_cols = tile_range(next, C::Bc, p.seq_kv);
            load_tile_async(K_j, C::K_STRIDE, K + next_cols.begin * at.k.row, at.k.row, C::Bc,
                            C::D, int(next_cols.size()), int(d), tid, C::THREADS);
            cp_async_commit();
        }
        if (needs_mask)
            pv_micro_tile<C, true>(P_ij, V_j, rg, cg, alpha, o);
        else
            pv_micro_tile<C, false>(P_ij, V_j, rg, cg, alpha, o);
        j = next;
    }

    // O_i = diag(l)^-1 O_i and LSE = m + log(l), written once (NaN where the scores overflowed).
    // 16-byte stores where every row of O starts on 16 bytes (a contiguous O with d % 4 == 0).
    const bool vector_store =
        d % 4 == 0 && o_at.row % 4 == 0 && reinterpret_cast<std::uintptr_t>(O) % 16 == 0;
#pragma unroll
    for (int t = 0; t < C::TM; ++t) {
        const int r = rg + C::RG * t;
        const float l_row = lanes_sum<C::CG>(l[t]);
        if (r >= rows.size()) continue;
        const SoftmaxState state{m[t], l_row};
        const bool overflowed =
            scores_overflowed(state, [&] { return p.row_has_visible_key(rows.begin + r); });
#pragma unroll
        for (int v = 0; v < C::TD / 4; ++v) {
            const int col = 4 * cg + 4 * C::CG * v;
            if (col >= d) continue;
            const float4 out = {final_output(o[t][4 * v + 0], l_row, overflowed),
                                final_output(o[t][4 * v + 1], l_row, overflowed),
                                final_output(o[t][4 * v + 2], l_row, overflowed),
                                final_output(o[t][4 * v + 3], l_row, overflowed)};
            if (vector_store) {
                *reinterpret_cast<float4*>(&O[r * o_at.row + col]) = out;
            } else {
                for (int e = 0; e < 4 && col + e < d; ++e)
                    O[r * o_at.row + col + e] = component(out, e);
            }
        }
        if (cg == 0) lse[r] = final_lse(state, overflowed);
    }
}

// One thread block = one query tile Q_i of one (batch, head). gate: closed when the device
// entry's finiteness test chose the tensor-core kernel (cuda/host/tensor_core_eligibility.hpp).
template <class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_BLOCKS)
    fa2_forward_kernel(const AttentionProblem p, const float* __restrict__ Q,
                       const float* __restrict__ K, const float* __restrict__ V,
                       const QkvLayouts at, float* __restrict__ O, const ArrayLayout o_at,
                       float* __restrict__ lse, const KernelGate gate) {
    if (gate.closed()) return;
    extern __shared__ float4 smem_float4[];
    // Which (b, h, i): consecutive blocks are the query tiles of one head, so the blocks that
    // run at the same time share K and V and read them from L2, not HBM (a head-minor order
    // read K, V from HBM once per query tile: 3.7x less traffic than cuda-standard instead of
    // >9x, docs/cuda_fp32_notes.md). Inside a head, longest first (common/tiling.hpp).
    const std::int64_t Tr = tile_count(p.seq_q, C::Br);
    const std::int64_t bh = blockIdx.x / Tr;
    const std::int64_t i = longest_first(p.causal, blockIdx.x % Tr, Tr);
    fa2_forward_tile<C>(p, Q, K, V, at, O, o_at, lse, bh / p.heads, bh % p.heads, i, smem_float4);
}

// The launch, queued on `stream` (asynchronous), behind `gate`. (`inspect` is the 3xTF32
// kernel's choice, cuda/fa2/kernel_tf32.cuh: this kernel takes every float as it is.)
template <class C>
void launch_fa2(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                const QkvLayouts& at, float* O, const ArrayLayout& o_at, float* lse,
                KernelGate gate, bool /*inspect*/, cudaStream_t stream) {
    const std::int64_t blocks = tile_count(p.seq_q, C::Br) * p.batch * p.heads;
    if (blocks > 0x7fffffff)
        throw std::invalid_argument("batch*heads*ceil(seq_q/" + std::to_string(C::Br) +
                                    ") = " + std::to_string(blocks) +
                                    ": more query blocks than one launch can hold");
    cuda::allow_dynamic_shared_memory(fa2_forward_kernel<C>, int(C::SMEM_BYTES));
    fa2_forward_kernel<C><<<unsigned(blocks), C::THREADS, C::SMEM_BYTES, stream>>>(
        p, Q, K, V, at, O, o_at, lse, gate);
    FA_CUDA_CHECK_LAUNCH();
}

}  // namespace flashattn::cuda::fa2
