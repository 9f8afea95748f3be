// cuda/fa3.cu — the cuda-fa3 backend: checks, launch, and the upload path every CUDA backend
// shares (cuda/prepared.hpp: 16-bit Q, K, V with Q times q_sign, poisoned O and LSE).
#include "cuda/fa3.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "common/tiling.hpp"
#include "cuda/check.hpp"
#include "cuda/fa3_kernel.cuh"
#include "cuda/prepared.hpp"
#include "cuda/tensor_cores.hpp"

namespace flashattn::fa3 {
namespace {

// Two warpgroups (128 query rows) per CTA: each K_j, V_j tile loaded serves both, as cuda-tc's
// Br = 128 does.
template <class T>
using DefaultTile = Fa3Tile<T, 2>;

void check_problem(const AttentionProblem& p, DType dtype) {
    validate(p);
    if (dtype != DType::f16 && dtype != DType::bf16)
        throw std::invalid_argument("dtype = " + to_string(dtype) +
                                    ": cuda-fa3 computes in f16 or bf16 (tensor cores)");
    if (p.dim != 64)
        throw std::invalid_argument("dim = " + std::to_string(p.dim) +
                                    ": cuda-fa3 (stage 1) supports head dim 64 only");
    const std::string outside = cuda::mma_grid_limits(p);
    if (!outside.empty()) throw std::invalid_argument(outside);
}

template <class Cfg>
void launch(const KernelParams& params) {
    const AttentionProblem& p = params.problem;
    auto kernel = fa3_forward_kernel<Cfg, false>;
    if (p.block_mask.active()) kernel = fa3_forward_kernel<Cfg, true>;
    FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Cfg::kSmemBytes));
    const dim3 grid(static_cast<unsigned>(tile_count(p.seq_q, Cfg::Br)),
                    static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes>>>(params);
    FA_CUDA_CHECK_LAUNCH();
}

class PreparedFa3 final : public cuda::PreparedCuda {
public:
    PreparedFa3(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                DType dtype)
        : PreparedCuda("cuda-fa3", p, Q, K, V, dtype, cuda::InputForm::bits16) {}

    void execute() override {
        const KernelParams params =
            mma::make_params(problem_, Q16_.data(), K16_.data(), V16_.data(), O_.data(), lse_.data());
        if (dtype_ == DType::f16)
            launch<DefaultTile<__half>>(params);
        else
            launch<DefaultTile<__nv_bfloat16>>(params);
        synchronize();
    }
    std::string tiles() const override { return "Br = 128 (2 warpgroups), Bc = 64, wgmma m64n64k16"; }
};

}  // namespace

bool fa3_available() {
#if defined(FLASHATTN_HAVE_SM90A)
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0;
#else
    return false;
#endif
}

Backend fa3_backend() {
    Backend b;
    b.name = "cuda-fa3";
    b.device = "cuda";
    b.summary =
        "FlashAttention-3 on Hopper, stage 1: both products on wgmma (warpgroup MMA, operands "
        "read from shared memory), cp.async ring; fp16/bf16, d = 64, forward only";
    b.dtypes = {DType::f16, DType::bf16};
    b.tile_sizes = TileSizes::own;
    b.prepare = [](const AttentionProblem& p, const float* Q, const float* K, const float* V,
                   DType dtype) -> std::unique_ptr<PreparedAttention> {
        check_problem(p, dtype);
        require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
        return std::make_unique<PreparedFa3>(p, Q, K, V, dtype);
    };
    return b;
}

}  // namespace flashattn::fa3
