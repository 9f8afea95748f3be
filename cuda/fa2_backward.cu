// cuda/fa2_backward.cu — cuda-fa2's backward pass, host side: the kernels are in
// fa2_backward_kernel.cuh (FlashAttention-2's backward in float32, deterministic, no atomics).
//
// Tiles: Br = Bc = 64 for d <= 64, 32 above (so that d = 256 fits in an H100's 227 KiB of shared
// memory per block), 256 threads. The shared memory a tile needs is checked against the device's
// limit in prepare(), with a clear error where it does not fit.
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda/backward_stages.cuh"
#include "cuda/check.hpp"
#include "cuda/fa2.hpp"
#include "cuda/fa2_backward_kernel.cuh"
#include "cuda/prepared_backward.hpp"

namespace flashattn::cuda {
namespace {

using SmallD = fa2_backward::Tile<64, 64, 256>;
using LargeD = fa2_backward::Tile<32, 32, 256>;

// Throws std::invalid_argument where the tiles' shared memory or the grid do not fit this device.
void require_backward_fits(const AttentionProblem& p) {
    const std::size_t need =
        static_cast<std::size_t>(p.dim <= 64 ? SmallD::smem_floats(p.dim)
                                             : LargeD::smem_floats(p.dim)) *
        sizeof(float);
    const std::size_t have = device_limits().smem_per_block_optin;
    if (need > have)
        throw std::invalid_argument("dim = " + std::to_string(p.dim) +
                                    ": cuda-fa2's backward needs " + std::to_string(need) +
                                    " bytes of shared memory per block; this device allows " +
                                    std::to_string(have));
    if (p.batch * p.heads > 65535)
        throw std::invalid_argument("batch*heads = " + std::to_string(p.batch * p.heads) +
                                    ": cuda-fa2's backward grid allows at most 65535");
    if (tile_count(p.seq_q, 32) > std::numeric_limits<int>::max() ||
        tile_count(p.seq_kv, 32) > std::numeric_limits<int>::max())
        throw std::invalid_argument("seq_q/seq_kv: too many tiles for one launch");
}

template <class T>
void launch(const fa2_backward::Params& a) {
    const AttentionProblem& p = a.p;
    const std::size_t bytes = static_cast<std::size_t>(T::smem_floats(p.dim)) * sizeof(float);
    const auto key_kernel = fa2_backward::key_gradients_kernel<T>;
    const auto query_kernel = fa2_backward::query_gradient_kernel<T>;
    FA_CUDA_CHECK(cudaFuncSetAttribute(key_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
    FA_CUDA_CHECK(cudaFuncSetAttribute(query_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
    const dim3 key_grid(static_cast<unsigned>(tile_count(p.seq_kv, T::Bc)),
                        static_cast<unsigned>(p.batch * p.heads_kv));
    key_kernel<<<key_grid, T::threads, bytes>>>(a);
    FA_CUDA_CHECK_LAUNCH();
    const dim3 query_grid(static_cast<unsigned>(tile_count(p.seq_q, T::Br)),
                          static_cast<unsigned>(p.batch * p.heads));
    query_kernel<<<query_grid, T::threads, bytes>>>(a);
    FA_CUDA_CHECK_LAUNCH();
}

// The three kernels in order: D, then dK and dV, then dQ.
void launch_all(const fa2_backward::Params& a) {
    const AttentionProblem& p = a.p;
    launch_delta(a.dO, a.O, a.D, p.batch * p.heads * p.seq_q, static_cast<int>(p.dim), nullptr);
    if (p.dim <= 64)
        launch<SmallD>(a);
    else
        launch<LargeD>(a);
}

class PreparedFa2Backward final : public PreparedCudaBackward {
public:
    PreparedFa2Backward(const AttentionProblem& p, const BackwardInputs& in, DType dtype)
        : PreparedCudaBackward("cuda-fa2", p, in, dtype) {
        require_backward_fits(p);
        D_ = workspace<float>(static_cast<std::size_t>(p.lse_elements()));
    }

    void execute() override {
        const fa2_backward::Params a{problem_,  Q_.data(),  K_.data(),  V_.data(),
                                     O_.data(),  dO_.data(), lse_.data(), D_.data(),
                                     dQ_.data(), dK_.data(), dV_.data()};
        launch_all(a);
        synchronize_device();
    }

private:
    DeviceBuffer<float> D_;
};

}  // namespace

void add_cuda_fa2_backward(Backend& b) {
    add_cuda_backward<PreparedFa2Backward>(b);
    // The device entry: the same kernels on the caller's device arrays, no copies.
    b.run_backward_device = [](const AttentionProblem& problem, const DeviceBackward& a) {
        require_array(a.Q, "Q"), require_array(a.K, "K"), require_array(a.V, "V");
        require_array(a.O, "O"), require_array(a.lse, "LSE"), require_array(a.dO, "dO");
        require_array(a.dQ, "dQ"), require_array(a.dK, "dK"), require_array(a.dV, "dV");
        require_backward_fits(problem);
        if (a.dtype != DType::f32)
            throw std::invalid_argument("dtype = " + to_string(a.dtype) +
                                        ": cuda-fa2's backward computes in float32 only");
        FA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(a.stream)));
        AttentionProblem p = problem;
        const DeviceBuffer<std::uint8_t> mask = upload_block_mask(p);
        DeviceBuffer<float> D(static_cast<std::size_t>(p.lse_elements()));
        const auto f32 = [](const void* x) { return static_cast<const float*>(x); };
        launch_all({p, f32(a.Q), f32(a.K), f32(a.V), a.O, f32(a.dO), a.lse, D.data(), a.dQ,
                    a.dK, a.dV});
        synchronize_device();
    };
}

}  // namespace flashattn::cuda
