// cuda/fa1/backend.cu — cuda-fa1: Algorithm 1 of FlashAttention (Dao et al. 2022, arXiv
// 2205.14135), the host side: line 1's block sizes from this device's shared memory (fa1_plan),
// which kernel runs a problem, and the backend. The kernels: cuda/fa1/kernel_ffma.cuh (FFMA, v3;
// its header maps each line of Algorithm 1) and cuda/fa1/kernel_tf32.cuh (lines 9 and 12 on tensor
// cores, v5). How each version was measured: docs/cuda_fp32_notes.md.
//
// Weaknesses: v5 is only just faster than cuda-standard's cuBLAS at d = 128; v3, which runs where
// v5 cannot (line 1's Bc > 256 at d < 57, d > 128, inputs with inf/NaN), is slower than
// cuda-standard without a mask; 1 block of 8 warps per SM (the tiles fill M by design) leaves the
// kernels latency-bound; K_j, V_j are not overlapped with the previous step (line 1 gives them all
// of M); v3 rounds d up to a multiple of 4; Br = min(Bc, d) makes tiny d (d = 1 -> Br = 1) slow.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "common/tiling.hpp"
#include "cuda/host/check.hpp"
#include "cuda/fa1/backend.hpp"
#include "cuda/fa1/kernel_ffma.cuh"
#include "cuda/fa1/kernel_tf32.cuh"
#include "cuda/host/prepared.hpp"
#include "cuda/host/tensor_core_eligibility.hpp"
#include "cuda/host/variants.hpp"

namespace flashattn::cuda {
namespace {

using fa1::Fa1Layout;
using fa1::fa1_forward_kernel;
using fa1::kThreads;

std::string bytes_str(std::size_t b) { return std::to_string(b) + " bytes"; }

}  // namespace

Fa1Plan fa1_plan(const AttentionProblem& p, std::size_t smem_per_block_bytes, int sm_count) {
    validate(p);
    const std::int64_t d = p.dim;
    // A tile larger than the sequence is the sequence: clamp, so it costs no shared memory.
    const auto clamp_to_seq = [&](BlockSizes s) {
        return BlockSizes{std::min(s.Br, p.seq_q), std::min(s.Bc, p.seq_kv)};
    };
    const auto bytes_for = [&](BlockSizes s) {
        if (s.Br > 65536 || s.Bc > 65536) return std::numeric_limits<std::size_t>::max();
        return Fa1Layout::make(s.Br, s.Bc, d).bytes();
    };
    const auto too_big = [&](const std::string& field, const std::string& value, BlockSizes s) {
        return std::invalid_argument(
            field + " = " + value + ": cuda-fa1 tiles Br = " + std::to_string(s.Br) +
            ", Bc = " + std::to_string(s.Bc) + " (d = " + std::to_string(d) + ") need " +
            bytes_str(bytes_for(s)) + " of shared memory; this device allows " +
            bytes_str(smem_per_block_bytes) + " per block");
    };

    Fa1Plan plan;
    if (p.block_q > 0) {  // given directly (a block-size sweep, or a block mask's blocks)
        plan.blocks = clamp_to_seq({p.block_q, p.block_kv});
        if (bytes_for(plan.blocks) > smem_per_block_bytes)
            throw too_big("block_q/block_kv",
                          std::to_string(p.block_q) + "/" + std::to_string(p.block_kv),
                          plan.blocks);
        // Line 8 stages m_i, l_i one row per thread (line 1 itself never gives Br > d <= 256).
        if (plan.blocks.Br > kThreads)
            throw std::invalid_argument("block_q = " + std::to_string(p.block_q) +
                                        ": cuda-fa1 takes at most " + std::to_string(kThreads) +
                                        " query rows per block");
    } else if (p.sram_floats > 0) {  // Alg1 L1 on the M the caller asked for
        plan.M = p.sram_floats;
        plan.blocks = clamp_to_seq(block_sizes_from_sram(plan.M, d));
        if (bytes_for(plan.blocks) > smem_per_block_bytes)
            throw too_big("sram_floats", std::to_string(p.sram_floats), plan.blocks);
    } else {  // Alg1 L1 on this device's M, lowered until S_ij fits beside K_j, V_j, Q_i
        plan.M = static_cast<std::int64_t>(smem_per_block_bytes / sizeof(float));
        for (;;) {
            plan.blocks = clamp_to_seq(block_sizes_from_sram(plan.M, d));
            if (bytes_for(plan.blocks) <= smem_per_block_bytes || plan.M <= 4 * d) break;
            plan.M -= 4 * d;  // one key row less: Bc = ceil(M / 4d) drops by one
        }
        if (bytes_for(plan.blocks) > smem_per_block_bytes)
            throw too_big("dim", std::to_string(d), plan.blocks);
    }
    plan.Tr = tile_count(p.seq_q, plan.blocks.Br);
    plan.Tc = tile_count(p.seq_kv, plan.blocks.Bc);
    plan.smem_bytes = bytes_for(plan.blocks);
    // Enough blocks for about four waves over the SMs, each owning whole query blocks.
    const std::int64_t pairs = p.batch * p.heads;
    plan.row_groups = std::clamp<std::int64_t>(ceil_div(4 * std::int64_t{sm_count}, pairs), 1,
                                               plan.Tr);
    if (pairs * plan.row_groups > std::numeric_limits<int>::max())
        throw std::invalid_argument("batch*heads = " + std::to_string(pairs) +
                                    ": too many thread blocks for one launch");
    return plan;
}

namespace {

// v5, the tensor-core kernel (cuda/fa1/kernel_tf32.cuh): D = 64 for Bc <= 256, D = 128 for Bc <=
// 128 (S_ij's 16 x Bc scores per warp in registers), 8 warps.
using Fa1Tf32D64 = Fa1Tf32Tile<64, 32, 8, 8, false, 1>;
using Fa1Tf32D128 = Fa1Tf32Tile<128, 16, 8, 4, true, 4>;

template <class Cfg>
void launch_fa1_tf32(const Fa1Tf32Params& params, unsigned blocks) {
    auto kernel = params.problem.block_mask.active() ? fa1_tf32_kernel<Cfg, true>
                                                     : fa1_tf32_kernel<Cfg, false>;
    const std::size_t smem = Cfg::smem_bytes(params.Bc);
    FA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    kernel<<<blocks, Cfg::kThreads, smem>>>(params);
    FA_CUDA_CHECK_LAUNCH();
}

// Which kernel runs a problem. v5 (tensor cores) can run it when
//   * tf32_tensor_cores_allowed (cuda/host/tensor_core_eligibility.hpp) and d <= 128;
//   * line 1's Bc is within the instantiation's kMaxBc, and its shared memory fits this device.
// The default (or FLASHATTN_VARIANT=cuda-fa1=tf32, cuda/host/variants.hpp) runs v5 wherever it can:
// it was measured faster than v3 at both bar shapes (docs/cuda_fp32_notes.md); cuda-fa1=ffma runs
// v3 everywhere (e.g. for a block-size sweep that should time one kernel throughout).
enum class Fa1Kernel { ffma, tf32_d64, tf32_d128 };

Fa1Kernel choose_fa1_kernel(const AttentionProblem& p, const Fa1Plan& plan, const float* Q,
                            const float* K, const float* V) {
    const std::string wanted = requested_variant("cuda-fa1");
    require_known_variant("cuda-fa1", wanted, {"tf32", "ffma"});
    if (wanted == "ffma" || p.dim > 128 || !tf32_tensor_cores_allowed(p, Q, K, V))
        return Fa1Kernel::ffma;
    const Fa1Kernel k = p.dim <= 64 ? Fa1Kernel::tf32_d64 : Fa1Kernel::tf32_d128;
    const int max_bc = k == Fa1Kernel::tf32_d64 ? Fa1Tf32D64::kMaxBc : Fa1Tf32D128::kMaxBc;
    if (plan.blocks.Bc > max_bc) return Fa1Kernel::ffma;
    const int bc = int(plan.blocks.Bc);
    const std::size_t smem = k == Fa1Kernel::tf32_d64 ? Fa1Tf32D64::smem_bytes(bc)
                                                      : Fa1Tf32D128::smem_bytes(bc);
    return smem <= device_limits().smem_per_block_optin ? k : Fa1Kernel::ffma;
}

class PreparedFa1 final : public PreparedCuda {
public:
    PreparedFa1(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                DType dtype)
        : PreparedCuda("cuda-fa1", p, Q, K, V, dtype),
          plan_(fa1_plan(p, device_limits().smem_per_block_optin, device_limits().sm_count)),
          kernel_(choose_fa1_kernel(p, plan_, Q, K, V)) {
        // The "HBM" statistics of Algorithm 1: l and m for every query row.
        l_ = workspace<float>(static_cast<std::size_t>(p.lse_elements()));
        m_ = workspace<float>(static_cast<std::size_t>(p.lse_elements()));
    }

    void execute() override {
        const AttentionProblem& p = problem_;
        const auto blocks = static_cast<unsigned>(p.batch * p.heads * plan_.row_groups);
        if (kernel_ != Fa1Kernel::ffma) {
            const Fa1Tf32Params params{p,         Q_.data(),     K_.data(),
                                       V_.data(), O_.data(),     l_.data(),
                                       m_.data(), lse_.data(),   int(plan_.blocks.Br),
                                       int(plan_.blocks.Bc),     int(plan_.row_groups)};
            if (kernel_ == Fa1Kernel::tf32_d64)
                launch_fa1_tf32<Fa1Tf32D64>(params, blocks);
            else
                launch_fa1_tf32<Fa1Tf32D128>(params, blocks);
            synchronize();
            return;
        }
        const Fa1Layout L = Fa1Layout::make(plan_.blocks.Br, plan_.blocks.Bc, p.dim);
        FA_CUDA_CHECK(cudaFuncSetAttribute(
            fa1_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(L.bytes())));
        fa1_forward_kernel<<<blocks, kThreads, L.bytes()>>>(p, L, plan_.row_groups, Q_.data(),
                                                            K_.data(), V_.data(), O_.data(),
                                                            l_.data(), m_.data(), lse_.data());
        FA_CUDA_CHECK_LAUNCH();
        synchronize();
    }

    std::string tiles() const override {
        return (plan_.M ? "M = " + std::to_string(plan_.M) + " floats -> " : std::string()) +
               "Br = " + std::to_string(plan_.blocks.Br) + ", Bc = " +
               std::to_string(plan_.blocks.Bc) + " (Tr = " + std::to_string(plan_.Tr) +
               ", Tc = " + std::to_string(plan_.Tc) + "), " +
               (kernel_ == Fa1Kernel::ffma ? "FFMA" : "3xTF32 tensor-core") + " kernel";
    }

private:
    Fa1Plan plan_;
    Fa1Kernel kernel_;
    DeviceBuffer<float> l_, m_;
};

}  // namespace

Backend cuda_fa1_backend() {
    return make_cuda_backend<PreparedFa1>(
        "cuda-fa1",
        "Algorithm 1 on the GPU: K/V blocks outer, Q blocks inner, O/l/m in HBM, "
        "Br/Bc from the device's M",
        TileSizes::caller);
}

}  // namespace flashattn::cuda
