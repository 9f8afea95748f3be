// cuda/minimal/backend.cu — cuda-minimal: FlashAttention's Algorithm 1 (Dao et al. 2022, arXiv
// 2205.14135) with one GPU thread per query row; the first GPU step of the learning path
// (docs/cuda_minimal.md). The kernel is the first screen below; the host part after it only checks
// shared memory and launches.
//
// Loop order: the paper runs K/V blocks outer (line 5) and query blocks inner (line 7), so O_i,
// l_i, m_i go to HBM and back at every step (lines 8, 12, 13); cuda-fa1 keeps that order. Query
// blocks are independent, so here they are the grid instead: one thread block per (batch, head,
// Q_i) loops over K_j, V_j and keeps m_i, l_i, O_i on chip from start to end. Each step is
// Algorithm 1's arithmetic (lines 9-13; O_i renormalized at every step by fa1_output_update of
// common/online_softmax.hpp); the loop order is the one FlashAttention-2 made standard (cuda-fa2).
//
// Tiles: Br = Bc = 32, fixed: 32 query rows are one warp (a row per lane) and 32 keys keep S_ij
// small. Explicit tile sizes (p.block_q/block_kv, p.sram_floats) are refused (TileSizes::own); a
// block mask keeps its own block sizes. Shared memory per thread block, in floats:
//     Q_i, O_i: 2 Br (d|1)    K_j, V_j: 2 Bc d    S_ij: Br (Bc + 1)
// (cuda_minimal_smem_bytes): 132 KiB at d = 256, which an A100 or H100 grants (163 / 227 KiB per
// block after opting in); a GPU with 99 KiB refuses d >= 190 with std::invalid_argument.
// The rows one thread walks alone (its rows of Q_i, O_i, S_ij) have an odd length, so the 32 lanes,
// each reading element c of its own row, hit 32 different banks; all lanes read the same K_j / V_j
// element at once (a broadcast).
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/online_softmax.hpp"
#include "common/tiling.hpp"
#include "cuda/host/check.hpp"
#include "cuda/minimal/backend.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/stages/warp_softmax.cuh"

namespace flashattn::cuda {
namespace {

constexpr int kBr = 32;  // query rows per thread block = threads per block (one warp)
constexpr int kBc = 32;  // keys per K_j, V_j tile

__global__ void minimal_forward_kernel(const AttentionProblem p, const float* __restrict__ Q,
                                       const float* __restrict__ K, const float* __restrict__ V,
                                       float* __restrict__ O, float* __restrict__ lse) {
    extern __shared__ float smem[];
    const int d = static_cast<int>(p.dim), ds = d | 1, t = threadIdx.x;
    float* Q_i = smem;            // Br x ds
    float* O_i = Q_i + kBr * ds;  // Br x ds, normalized after every step (line 12)
    float* K_j = O_i + kBr * ds;  // Bc x d
    float* V_j = K_j + kBc * d;   // Bc x d
    float* S_ij = V_j + kBc * d;  // Br x (Bc + 1): S_ij, then P~_ij in place
    const std::int64_t Tr = tile_count(p.seq_q, kBr), Tc = tile_count(p.seq_kv, kBc);
    const std::int64_t bh = blockIdx.x / Tr, b = bh / p.heads, h = bh % p.heads;
    const TileRange rows = tile_range(blockIdx.x % Tr, kBr, p.seq_q);
    const std::int64_t i = rows.begin + t;  // this thread's query row
    const bool active = i < rows.end;       // threads past seq_q only load and synchronize
    Q += p.q_offset(b, h), O += p.q_offset(b, h), lse += p.lse_offset(b, h);
    K += p.kv_offset(b, h), V += p.kv_offset(b, h);  // GQA: K/V head kv_head(h)
    float *q = Q_i + t * ds, *o = O_i + t * ds, *s = S_ij + t * (kBc + 1);  // this row's
    const float scale = p.softmax_scale();
    for (std::int64_t e = t; e < rows.size() * d; e += kBr) {
        Q_i[e / d * ds + e % d] = Q[rows.begin * d + e];  // Alg1 L8: Q_i to shared memory
        O_i[e / d * ds + e % d] = 0.0f;                   // Alg1 L2: O = 0 (l = 0, m = -inf: row)
    }
    SoftmaxState row;  // (m_i, l_i) = (-inf, 0)
    // Alg1 L5: each K_j, V_j a row here sees (skipping tiles past the diagonal, Alg5's zeros)
    for (std::int64_t j = next_visible_tile(p, TileAxis::keys, rows, 0, Tc, kBc); j < Tc;
         j = next_visible_tile(p, TileAxis::keys, rows, j + 1, Tc, kBc)) {
        const TileRange cols = tile_range(j, kBc, p.seq_kv);  // the last tile may be short
        const int bc = static_cast<int>(cols.size());
        __syncthreads();  // every thread is done with the previous K_j, V_j
        for (std::int64_t e = t; e < bc * d; e += kBr)  // Alg1 L6: K_j, V_j to shared memory
            K_j[e] = K[cols.begin * d + e], V_j[e] = V[cols.begin * d + e];
        __syncthreads();
        if (!active) continue;  // an idle thread still meets both barriers of every step
        float m_tilde = -INFINITY, l_tilde = 0.0f;
        for (int k = 0; k < bc; ++k) {  // Alg1 L9: S_ij = scale Q_i K_j^T, masked keys -inf
            const bool visible = p.key_visible(i, cols.begin + k);  // causal, block mask
            double dot = 0.0;  // a float chain of d products loses ~sqrt(d) ulps (d up to 256)
            for (int c = 0; visible && c < d; ++c) dot = fma(double(q[c]), double(K_j[k * d + c]), dot);
            s[k] = visible ? scale * float(dot) : -INFINITY;
            m_tilde = nan_max(m_tilde, s[k]);  // Alg1 L10: m~ = rowmax(S_ij)
        }
        for (int k = 0; k < bc; ++k) {  // Alg1 L10: P~ = exp(S_ij - m~), l~ = rowsum(P~)
            const float p_tilde = exp_shifted(s[k], m_tilde);
            l_tilde += p_tilde;
            s[k] = p.key_visible(i, cols.begin + k) ? p_tilde : masked_p();  // not in P~ V_j
        }
        // Alg1 L11: m_new = max(m_i, m~), l_new = e^(m_i - m_new) l_i + e^(m~ - m_new) l~
        const SoftmaxMerge merged = merge_softmax(row, {m_tilde, l_tilde});
        for (int c = 0; c < d; ++c) {  // Alg1 L12: O_i = diag(l_new)^-1 (... O_i + ... P~ V_j)
            float pv = 0.0f;
            for (int k = 0; k < bc; ++k)
                if (!is_masked_p(s[k])) pv = fmaf(s[k], V_j[k * d + c], pv);
            o[c] = fa1_output_update(o[c], row.l, pv, merged);
        }
        row = {merged.m_new, merged.l_new};  // Alg1 L13: m_i = m_new, l_i = l_new
    }
    __syncthreads();  // every row of O_i is final (line 12 already divided by l_i)
    for (std::int64_t e = t; e < rows.size() * d; e += kBr)  // Alg1 L12's write of O_i to HBM
        O[rows.begin * d + e] = O_i[e / d * ds + e % d];
    if (active) lse[i] = log_sum_exp(row);  // m_i + log(l_i); -inf when no key is visible
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Host side: the shared-memory check and the launch.

std::size_t cuda_minimal_smem_bytes(std::int64_t d) {
    const std::int64_t floats = 2 * kBr * (d | 1) + 2 * kBc * d + kBr * (kBc + 1);
    return static_cast<std::size_t>(floats) * sizeof(float);
}

namespace {

class PreparedMinimal final : public PreparedCuda {
public:
    PreparedMinimal(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                    DType dtype)
        : PreparedCuda("cuda-minimal", p, Q, K, V, dtype),  // validates p (d in [1, 256])
          smem_(cuda_minimal_smem_bytes(p.dim)),
          blocks_(p.batch * p.heads * tile_count(p.seq_q, kBr)) {
        const std::size_t limit = device_limits().smem_per_block_optin;
        if (smem_ > limit)
            throw std::invalid_argument(
                "dim = " + std::to_string(p.dim) + ": cuda-minimal needs " +
                std::to_string(smem_) + " bytes of shared memory per block (Q_i, O_i, K_j, V_j, " +
                "S_ij at Br = Bc = 32); this device allows " + std::to_string(limit) + " bytes");
        if (blocks_ > std::numeric_limits<int>::max())
            throw std::invalid_argument("batch*heads*ceil(seq_q/32) = " +
                                        std::to_string(blocks_) +
                                        ": too many thread blocks for one cuda-minimal launch");
    }

    void execute() override {
        // More than 48 KiB of dynamic shared memory needs the kernel's opt-in.
        FA_CUDA_CHECK(cudaFuncSetAttribute(minimal_forward_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_)));
        minimal_forward_kernel<<<static_cast<unsigned>(blocks_), kBr, smem_>>>(
            problem_, Q_.data(), K_.data(), V_.data(), O_.data(), lse_.data());
        FA_CUDA_CHECK_LAUNCH();
        synchronize();
    }

    std::string tiles() const override {
        return "Br = " + std::to_string(kBr) + ", Bc = " + std::to_string(kBc) + " (fixed)";
    }

private:
    std::size_t smem_;
    std::int64_t blocks_;
};

}  // namespace

Backend cuda_minimal_backend() {
    return make_cuda_backend<PreparedMinimal>(
        "cuda-minimal",
        "Algorithm 1 with one thread per query row (Br = Bc = 32): the shortest correct GPU form",
        TileSizes::own);
}

}  // namespace flashattn::cuda
