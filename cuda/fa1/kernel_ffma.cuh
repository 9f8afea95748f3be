// cuda/fa1/kernel_ffma.cuh — cuda-fa1's FFMA kernel (v3): Algorithm 1 of FlashAttention (Dao et al.
// 2022, arXiv 2205.14135) as the paper ran it, in float32 on CUDA cores. The host side (line 1's
// plan, the choice between this kernel and the tensor-core one of cuda/fa1/kernel_tf32.cuh, the
// backend) is cuda/fa1/backend.cu.
//
//   line 1   Br, Bc from M (common/tiling.hpp block_sizes_from_sram), M = this device's shared
//            memory per block (cudaDevAttrMaxSharedMemoryPerBlockOptin); p.sram_floats or
//            p.block_q/block_kv override it, so the block size can be swept
//   line 2   O = 0, l = 0, m = -inf in HBM
//   line 5   for each K/V block j                       <- outer loop
//   line 6     load K_j, V_j to shared memory
//   line 7     for each query block i                   <- inner loop
//   line 8       load Q_i, l_i, m_i (and, in line 12, O_i) from HBM
//   line 9       S_ij = scale * Q_i K_j^T                (masked keys -> -inf)
//   line 10      m~ = rowmax(S_ij), P~ = exp(S_ij - m~), l~ = rowsum(P~)
//   line 11      m_new, l_new = merge_softmax((m_i, l_i), (m~, l~))
//   line 12      O_i = diag(l_new)^-1 (diag(l_i) e^(m_i-m_new) O_i + e^(m~-m_new) P~ V_j) -> HBM
//   line 13      l_i = l_new, m_i = m_new -> HBM
// Lines 10-12 call common/online_softmax.hpp (nan_max, exp_shifted, merge_softmax,
// fa1_output_update); cpu/scalar.cpp is the same algorithm in plain loops, tagged line by line.
//
// What changed from cuda-standard (cuda/standard/backend.cu) and why: S and P never leave the chip.
// The price, which FlashAttention-2 removes (cuda/fa2/backend.cu), is that O, l and m go to HBM and
// back at every (j, i) step: Theorem 2's Theta(N^2 d^2 / M) accesses, visible in `flashattn bench`
// and ncu as traffic that falls when M (the block size) grows.
//
// GPU mapping: the j loop must stay outside the i loop, so the query blocks cannot be spread over
// the grid the way FlashAttention-2 does. Instead each (batch, head) gets `row_groups` thread
// blocks, each owning a contiguous range of query blocks (its own rows of O, l, m -- no two
// blocks touch the same row) and running lines 5-13 over them in the paper's order. All 256
// threads of a block cooperate on each step; S_ij and O_i are computed in 64 x 64 chunks where
// each thread owns a 4 x 4 register micro-tile. Br and Bc come from line 1, so they are whatever
// M gives (e.g. Br = 64, Bc = 227 for d = 64 on an H100): every chunk loop handles ragged edges.
//
// Masks: tiles the masks rule out entirely are skipped (no K_j load when none of the block's
// query blocks sees it); per-key masking only on partial tiles. A masked key is left out of
// P~ V_j on those tiles (masked_p), so a NaN in a V row a query row does not attend stays out.
//
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/online_softmax.hpp"
#include "common/tiling.hpp"
#include "cuda/stages/async_copy.cuh"
#include "cuda/stages/warp_softmax.cuh"

namespace flashattn::cuda::fa1 {


constexpr int kThreads = 256;  // 16 x 16 threads, each owning a 4 x 4 micro-tile of a 64 x 64 chunk
constexpr int kChunk = 64;

__host__ __device__ inline int round_up4(std::int64_t x) {
    return static_cast<int>((x + 3) / 4 * 4);
}

// Where each "SRAM" buffer of Algorithm 1 sits in shared memory (offsets and strides in floats).
// Rows are padded so float4 reads stay aligned and lanes reading different rows hit different
// banks; the padding is zero-filled where a loop reads it.
struct Fa1Layout {
    int Br = 0, Bc = 0, d = 0;
    int dp = 0;         // d rounded up to 4: Q_i, K_j, V_j columns d..dp-1 are 0
    int bcp = 0;        // Bc rounded up to 4: V_j rows and P~ columns bc..bcp-1 are 0
    int qk_stride = 0;  // row stride of Q_i and K_j (dp + 4)
    int v_stride = 0;   // row stride of V_j (dp)
    int s_stride = 0;   // row stride of S_ij / P~ (bcp + 4)
    int K_at = 0, V_at = 0, Q_at = 0, S_at = 0, stats_at = 0;
    std::int64_t floats = 0;

    static Fa1Layout make(std::int64_t Br, std::int64_t Bc, std::int64_t d) {
        Fa1Layout L;
        L.Br = static_cast<int>(Br), L.Bc = static_cast<int>(Bc), L.d = static_cast<int>(d);
        L.dp = round_up4(d);
        L.bcp = round_up4(Bc);
        L.qk_stride = L.dp + 4;
        L.v_stride = L.dp;
        L.s_stride = L.bcp + 4;
        std::int64_t at = 0;
        L.K_at = 0;
        at += Bc * L.qk_stride;
        L.V_at = static_cast<int>(at);
        at += std::int64_t{L.bcp} * L.v_stride;
        L.Q_at = static_cast<int>(at);
        at += Br * L.qk_stride;
        L.S_at = static_cast<int>(at);
        at += Br * L.s_stride;
        L.stats_at = static_cast<int>(at);
        at += 8 * Br;  // per row: SoftmaxMerge (4 floats), then m_i and l_i in two slots
        L.floats = at;
        return L;
    }
    std::size_t bytes() const { return static_cast<std::size_t>(floats) * sizeof(float); }
};

// Lines 9-11 for one query block, 64 rows at a time:
//   line 9    S_ij = scale * Q_i K_j^T (masked keys -> -inf), to shared memory, 64 x 64 chunks of
//             4 x 4 register micro-tiles; each thread keeps the running max of its 4 rows,
//   line 10   m~ = rowmax: the 16 lanes of a row combine their maxima (nan_max shuffles);
//             P~ = exp(S_ij - m~) over each thread's own elements, l~ = their sum, combined
//             the same way,
//   line 11   (m_new, l_new) = merge_softmax((m_i, l_i), (m~, l~)), kept in `merged` for line 12.
// Every row's statistics stay in the registers of the lanes that computed its scores: no pass of
// one warp per row, whose serial chain of shuffles would leave the SM idle.
__device__ __forceinline__ void scores_and_statistics(
    const AttentionProblem& p, const Fa1Layout& L, const float* Q_i, const float* K_j,
    float* S_ij, const float* m_i, const float* l_i, SoftmaxMerge* merged, TileRange rows,
    TileRange cols, bool partial, float scale) {
    const int rg = threadIdx.x / 16, cg = threadIdx.x % 16;
    const int br = static_cast<int>(rows.size()), bc = static_cast<int>(cols.size());
    const int bc4 = round_up4(bc);
    for (int r0 = 0; r0 < br; r0 += kChunk) {
        float m_tilde[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) m_tilde[t] = neg_infinity();

        for (int c0 = 0; c0 < bc; c0 += kChunk) {  // Alg1 L9
            float acc[4][4] = {};
            int q_row[4], k_row[4];  // rows read (clamped inside the tile; extras are discarded)
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                q_row[t] = min(r0 + rg + 16 * t, br - 1) * L.qk_stride;
                k_row[t] = min(c0 + cg + 16 * t, bc - 1) * L.qk_stride;
            }
#pragma unroll 4
            for (int k = 0; k < L.dp; k += 4) {
                float4 q[4], kv[4];
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    q[t] = *reinterpret_cast<const float4*>(&Q_i[q_row[t] + k]);
                    kv[t] = *reinterpret_cast<const float4*>(&K_j[k_row[t] + k]);
                }
#pragma unroll
                for (int t = 0; t < 4; ++t)
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        acc[t][u] = fmaf(q[t].x, kv[u].x, acc[t][u]);
                        acc[t][u] = fmaf(q[t].y, kv[u].y, acc[t][u]);
                        acc[t][u] = fmaf(q[t].z, kv[u].z, acc[t][u]);
                        acc[t][u] = fmaf(q[t].w, kv[u].w, acc[t][u]);
                    }
            }
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int r = r0 + rg + 16 * t, c = c0 + cg + 16 * u;
                    if (r >= br || c >= bc) continue;
                    const bool visible =
                        !partial || p.key_visible(rows.begin + r, cols.begin + c);
                    const float s = visible ? scale * acc[t][u] : neg_infinity();
                    S_ij[r * L.s_stride + c] = s;
                    m_tilde[t] = nan_max(m_tilde[t], s);
                }
        }

        float l_tilde[4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {  // Alg1 L10: m~ = rowmax(S_ij) across the row's lanes
            m_tilde[t] = lanes_max<16>(m_tilde[t]);
            l_tilde[t] = 0.0f;
        }
        for (int c0 = 0; c0 < bc4; c0 += kChunk)  // Alg1 L10: P~ = exp(S_ij - m~), l~ = rowsum
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int r = r0 + rg + 16 * t, c = c0 + cg + 16 * u;
                    if (r >= br || c >= bc4) continue;
                    float* entry = &S_ij[r * L.s_stride + c];
                    if (c >= bc) {  // padding up to a multiple of 4, read by line 12's float4s
                        *entry = 0.0f;
                        continue;
                    }
                    const float s = *entry;
                    const float p_tilde = exp_shifted(s, m_tilde[t]);
                    l_tilde[t] += p_tilde;
                    *entry = s == neg_infinity() ? masked_p() : p_tilde;
                }
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            l_tilde[t] = lanes_sum<16>(l_tilde[t]);
            const int r = r0 + rg + 16 * t;
            if (cg == 0 && r < br)  // Alg1 L11: m_new, l_new
                merged[r] = merge_softmax({m_i[r], l_i[r]}, {m_tilde[t], l_tilde[t]});
        }
    }
}

// Line 12: O_i = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_j), read from
// and written back to HBM. Each thread computes a 4 x 4 micro-tile of P~ V_j per 64 x 64 chunk;
// its O_i values are requested from HBM before the products so their latency is hidden.
template <bool kSkipMasked>
__device__ __forceinline__ void update_output(const Fa1Layout& L, const float* P_tilde,
                                              const float* V_j, const float* l_i,
                                              const SoftmaxMerge* merged, float* O_i, int br,
                                              int bc) {
    const int rg = threadIdx.x / 16, cg = threadIdx.x % 16;
    const int d = L.d, bc4 = round_up4(bc);
    const bool vector_io = d % 4 == 0;
    for (int r0 = 0; r0 < br; r0 += kChunk)
        for (int dc = 0; dc < L.dp; dc += kChunk) {
            const int col = dc + 4 * cg;  // this thread's 4 columns of O: col..col+3
            const bool col_ok = col < L.dp;
            const int v_col = min(col, L.dp - 4);  // read inside V_j; results of !col_ok dropped
            float4 o_old[4], pv[4];
            int p_row[4];
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int r = r0 + rg + 16 * t;
                p_row[t] = min(r, br - 1) * L.s_stride;
                pv[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                o_old[t] = pv[t];
                if (r < br && col_ok) {
                    const float* src = &O_i[std::int64_t{r} * d + col];
                    if (vector_io) {
                        o_old[t] = *reinterpret_cast<const float4*>(src);
                    } else {
                        if (col + 0 < d) o_old[t].x = src[0];
                        if (col + 1 < d) o_old[t].y = src[1];
                        if (col + 2 < d) o_old[t].z = src[2];
                        if (col + 3 < d) o_old[t].w = src[3];
                    }
                }
            }
            // P~ V_j summed kChunk keys at a time into a fresh accumulator, then added: one fp32
            // chain over a whole key block (Bc = 14528 at d = 1) failed the 2x rule at d = 1,
            // N_kv = 1023 (1.03x, H100), the error cuda-fa2's FFMA kernel had
            // (cuda/fa2/backend.cu).
            for (int c0 = 0; c0 < bc4; c0 += kChunk) {
                float4 chunk[4];
#pragma unroll
                for (int t = 0; t < 4; ++t) chunk[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                const int c_end = min(c0 + kChunk, bc4);
#pragma unroll 4
                for (int c = c0; c < c_end; c += 4) {
                    float4 p4[4];
#pragma unroll
                    for (int t = 0; t < 4; ++t)
                        p4[t] = *reinterpret_cast<const float4*>(&P_tilde[p_row[t] + c]);
#pragma unroll
                    for (int k = 0; k < 4; ++k) {
                        const float4 v =
                            *reinterpret_cast<const float4*>(&V_j[(c + k) * L.v_stride + v_col]);
#pragma unroll
                        for (int t = 0; t < 4; ++t) {
                            const float p = component(p4[t], k);
                            if (kSkipMasked && is_masked_p(p)) continue;  // absent, not 0 * V
                            chunk[t].x = fmaf(p, v.x, chunk[t].x);
                            chunk[t].y = fmaf(p, v.y, chunk[t].y);
                            chunk[t].z = fmaf(p, v.z, chunk[t].z);
                            chunk[t].w = fmaf(p, v.w, chunk[t].w);
                        }
                    }
                }
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    pv[t].x += chunk[t].x, pv[t].y += chunk[t].y;
                    pv[t].z += chunk[t].z, pv[t].w += chunk[t].w;
                }
            }
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int r = r0 + rg + 16 * t;
                if (r >= br || !col_ok) continue;
                const SoftmaxMerge m = merged[r];
                const float4 o = {fa1_output_update(o_old[t].x, l_i[r], pv[t].x, m),
                                  fa1_output_update(o_old[t].y, l_i[r], pv[t].y, m),
                                  fa1_output_update(o_old[t].z, l_i[r], pv[t].z, m),
                                  fa1_output_update(o_old[t].w, l_i[r], pv[t].w, m)};
                float* dst = &O_i[std::int64_t{r} * d + col];
                if (vector_io) {
                    *reinterpret_cast<float4*>(dst) = o;
                } else {
                    for (int e = 0; e < 4 && col + e < d; ++e) dst[e] = component(o, e);
                }
            }
        }
}

// One thread block: lines 2-13 for the query blocks [i_begin, i_end) of one (batch, head).
__global__ void __launch_bounds__(kThreads, 1)
    fa1_forward_kernel(const AttentionProblem p, const Fa1Layout L, const std::int64_t row_groups,
                       const float* __restrict__ Q, const float* __restrict__ K,
                       const float* __restrict__ V, float* __restrict__ O,
                       float* __restrict__ l_hbm, float* __restrict__ m_hbm,
                       float* __restrict__ lse) {
    extern __shared__ float4 smem_float4[];
    float* smem = reinterpret_cast<float*>(smem_float4);
    float* K_j = smem + L.K_at;
    float* V_j = smem + L.V_at;
    float* Q_i = smem + L.Q_at;
    float* S_ij = smem + L.S_at;  // S_ij, then P~_ij in place
    SoftmaxMerge* merged = reinterpret_cast<SoftmaxMerge*>(smem + L.stats_at);
    float* m_i = smem + L.stats_at + 4 * L.Br;  // two slots of Br: this step's and the next's
    float* l_i = m_i + 2 * L.Br;

    const std::int64_t Tr = tile_count(p.seq_q, L.Br), Tc = tile_count(p.seq_kv, L.Bc);
    const std::int64_t bh = blockIdx.x / row_groups, group = blockIdx.x % row_groups;
    const std::int64_t b = bh / p.heads, h = bh % p.heads;
    const std::int64_t per_group = ceil_div(Tr, row_groups);
    const std::int64_t i_begin = group * per_group, i_end = min(Tr, i_begin + per_group);
    if (i_begin >= i_end) return;
    const std::int64_t d = p.dim;
    const int tid = threadIdx.x;
    Q += p.q_offset(b, h);
    K += p.kv_offset(b, h);
    V += p.kv_offset(b, h);
    O += p.q_offset(b, h);
    l_hbm += p.lse_offset(b, h);
    m_hbm += p.lse_offset(b, h);
    lse += p.lse_offset(b, h);
    const TileRange my_rows = {i_begin * L.Br, min(i_end * L.Br, p.seq_q)};
    const float scale = p.softmax_scale();

    // Alg1 L2: O = 0, l = 0, m = -inf (this block's rows)
    for (std::int64_t e = tid; e < my_rows.size() * d; e += kThreads)
        O[my_rows.begin * d + e] = 0.0f;
    for (std::int64_t r = my_rows.begin + tid; r < my_rows.end; r += kThreads) {
        l_hbm[r] = 0.0f;
        m_hbm[r] = neg_infinity();
    }

    // The next query block at or after i that sees K_j (Alg5: zero blocks are skipped).
    const auto next_visible = [&](std::int64_t i, TileRange cols) {
        return next_visible_tile(p, TileAxis::queries, cols, i, i_end, L.Br);
    };
    // Alg1 L8 for query block i into `slot`: Q_i by cp.async (waited for at the top of its step),
    // m_i and l_i given as values already read from HBM.
    const auto stage_query_block = [&](std::int64_t i, int slot, float m_row, float l_row) {
        const TileRange rows = tile_range(i, L.Br, p.seq_q);
        load_tile_async(Q_i, L.qk_stride, Q + rows.begin * d, d, L.Br, L.dp, int(rows.size()),
                        int(d), tid, kThreads);
        cp_async_commit();
        if (tid < rows.size()) {
            m_i[slot * L.Br + tid] = m_row;
            l_i[slot * L.Br + tid] = l_row;
        }
    };

    for (std::int64_t j = 0; j < Tc; ++j) {  // Alg1 L5
        const TileRange cols = tile_range(j, L.Bc, p.seq_kv);
        if (classify_tile(p, my_rows, cols) == TileVisibility::none) continue;  // no row sees K_j
        const int bc = static_cast<int>(cols.size());

        // Alg1 L6: load K_j, V_j to shared memory
        cp_async_wait_all();
        __syncthreads();  // the previous K_j, V_j (and Q_i) are no longer read
        load_tile_async(K_j, L.qk_stride, K + cols.begin * d, d, L.Bc, L.dp, bc, int(d), tid,
                        kThreads);
        load_tile_async(V_j, L.v_stride, V + cols.begin * d, d, L.bcp, L.dp, bc, int(d), tid,
                        kThreads);
        std::int64_t i = next_visible(i_begin, cols);
        int slot = 0;
        if (i < i_end) {
            const std::int64_t row = i * L.Br + tid;
            const bool mine = tid < tile_range(i, L.Br, p.seq_q).size();
            stage_query_block(i, slot, mine ? m_hbm[row] : 0.0f, mine ? l_hbm[row] : 0.0f);
        }

        while (i < i_end) {  // Alg1 L7 (over the query blocks that see K_j)
            const TileRange rows = tile_range(i, L.Br, p.seq_q);
            const bool partial = classify_tile(p, rows, cols) == TileVisibility::partial;
            const int br = static_cast<int>(rows.size());
            const float* m_cur = m_i + slot * L.Br;
            const float* l_cur = l_i + slot * L.Br;

            // Ask HBM early for the next step's m_i, l_i (Alg1 L8 of step i+1), so the reads
            // overlap this step's arithmetic.
            const std::int64_t next = next_visible(i + 1, cols);
            float m_next = 0.0f, l_next = 0.0f;
            if (next < i_end && tid < tile_range(next, L.Br, p.seq_q).size()) {
                m_next = m_hbm[next * L.Br + tid];
                l_next = l_hbm[next * L.Br + tid];
            }

            cp_async_wait_all();
            __syncthreads();  // Q_i (with K_j, V_j), m_i, l_i have landed; the last step is done

            // Alg1 L9-11: S_ij = scale Q_i K_j^T, m~, P~, l~, then m_new, l_new
            scores_and_statistics(p, L, Q_i, K_j, S_ij, m_cur, l_cur, merged, rows, cols, partial,
                                  scale);
            __syncthreads();  // P~ and the merged statistics are complete; Q_i is free

            // Alg1 L8 of the next step, early: Q_{i+1} arrives while line 12 runs.
            if (next < i_end) stage_query_block(next, slot ^ 1, m_next, l_next);

            // Alg1 L12: O_i update, read from and written to HBM
            if (partial)
                update_output<true>(L, S_ij, V_j, l_cur, merged, O + rows.begin * d, br, bc);
            else
                update_output<false>(L, S_ij, V_j, l_cur, merged, O + rows.begin * d, br, bc);

            // Alg1 L13: write l_i = l_new, m_i = m_new to HBM
            for (int r = tid; r < br; r += kThreads) {
                l_hbm[rows.begin + r] = merged[r].l_new;
                m_hbm[rows.begin + r] = merged[r].m_new;
            }
            i = next;
            slot ^= 1;
        }
    }
    // Alg1 L16 returns O; the LSE of each row is m + log(l).
    cp_async_wait_all();
    __syncthreads();
    for (std::int64_t r = my_rows.begin + tid; r < my_rows.end; r += kThreads)
        lse[r] = log_sum_exp({m_hbm[r], l_hbm[r]});
}

}  // namespace flashattn::cuda::fa1
