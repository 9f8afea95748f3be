// cuda/fa3/backward.cu — launches cuda-fa3's backward (cuda/fa3/backward_kernel.cuh) after the D
// pass; see cuda/fa3/backward.hpp.
#include "cuda/fa3/backward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "common/tiling.hpp"
#include "cuda/fa3/backward_kernel.cuh"
#include "cuda/fa3/tensor_map.hpp"
#include "cuda/host/check.hpp"
#include "cuda/host/tensor_core_eligibility.hpp"

namespace flashattn::fa3 {
namespace {

// The tile sizes (the same for every T and D): the turn counters count query tiles of Br rows.
constexpr int kBr = Fa3BackwardTile<__half, 64>::Br, kBc = Fa3BackwardTile<__half, 64>::Bc;

template <class Cfg, bool kBlockMask, bool kDeterministic>
void launch_kernel(const Fa3BackwardParams& params, cudaStream_t stream) {
    const AttentionProblem& p = params.base.problem;
    const auto kernel = fa3_backward_kernel<Cfg, kBlockMask, kDeterministic>;
    constexpr int kSmem = backward_smem_bytes<Cfg>();
    FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    const dim3 grid(static_cast<unsigned>(tile_count(p.seq_kv, Cfg::Bc)),
                    static_cast<unsigned>(p.batch * p.heads_kv));
    kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(params);
    FA_CUDA_CHECK_LAUNCH();
}

template <class Cfg>
void launch(const Fa3BackwardParams& params, bool deterministic, cudaStream_t stream) {
    static_assert(Cfg::Br == kBr && Cfg::Bc == kBc, "one tile shape for every T and D");
    if (params.base.problem.block_mask.active())
        deterministic ? launch_kernel<Cfg, true, true>(params, stream)
                      : launch_kernel<Cfg, true, false>(params, stream);
    else
        deterministic ? launch_kernel<Cfg, false, true>(params, stream)
                      : launch_kernel<Cfg, false, false>(params, stream);
}

template <class T>
void launch_dim(const Fa3BackwardParams& params, bool deterministic, cudaStream_t stream) {
    if (params.base.problem.dim == 64)
        launch<Fa3BackwardTile<T, 64>>(params, deterministic, stream);
    else
        launch<Fa3BackwardTile<T, 128>>(params, deterministic, stream);
}

}  // namespace

void fa3_check_backward_problem(const AttentionProblem& p, DType dtype) {
    validate(p);
    if (dtype != DType::f16 && dtype != DType::bf16)
        throw std::invalid_argument("dtype = " + to_string(dtype) +
                                    ": cuda-fa3 computes in f16 or bf16 (tensor cores)");
    if (p.dim != 64 && p.dim != 128)
        throw std::invalid_argument("dim = " + std::to_string(p.dim) +
                                    ": cuda-fa3's backward supports head dim 64 or 128");
    const std::string outside = cuda::mma_grid_limits(p);
    if (!outside.empty()) throw std::invalid_argument(outside);
    if (p.batch * p.heads_kv > 65535)
        throw std::invalid_argument("batch*heads_kv = " + std::to_string(p.batch * p.heads_kv) +
                                    ": cuda-fa3's backward grid allows at most 65535");
}

std::size_t fa3_backward_turn_count(const AttentionProblem& p, DType) {
    return static_cast<std::size_t>(p.batch * p.heads * tile_count(p.seq_q, kBr));
}

void fa3_backward(const tc::TcBackwardArgs& args, bool deterministic) {
    const AttentionProblem& p = args.problem;
    fa3_check_backward_problem(p, args.dtype);
    tc::require_backward_arrays(args, deterministic);
    require_tma_aligned(args.Q, "Q"), require_tma_aligned(args.K, "K");
    require_tma_aligned(args.V, "V"), require_tma_aligned(args.dO, "dO");
    tc::queue_backward_prepass(args, deterministic ? fa3_backward_turn_count(p, args.dtype) : 0);
    Fa3BackwardParams params;
    params.base = cuda::make_backward_params(p, args.Q, args.K, args.V, args.dO, args.lse, args.D,
                                             args.dQ, args.dK, args.dV, args.dq_turns);
    params.q = tile_map(args.Q, args.dtype, p.batch * p.heads, p.seq_q, p.dim, kBr);
    params.dO = tile_map(args.dO, args.dtype, p.batch * p.heads, p.seq_q, p.dim, kBr);
    params.k = tile_map(args.K, args.dtype, p.batch * p.heads_kv, p.seq_kv, p.dim, kBc);
    params.v = tile_map(args.V, args.dtype, p.batch * p.heads_kv, p.seq_kv, p.dim, kBc);
    const auto stream = static_cast<cudaStream_t>(args.stream);
    if (args.dtype == DType::f16)
        launch_dim<__half>(params, deterministic, stream);
    else
        launch_dim<__nv_bfloat16>(params, deterministic, stream);
}

}  // namespace flashattn::fa3
