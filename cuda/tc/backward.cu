// cuda/tc/backward.cu — picks a compiled tile shape for a problem and launches cuda-tc's backward
// (cuda/stages/flash_backward.cuh with the 16-bit stages of cuda/tc/backward_ops.cuh) after the D
// pass; see cuda/tc/backward.hpp.
#include "cuda/tc/backward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "common/tiling.hpp"
#include "cuda/host/check.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/tc/backward_ops.cuh"
#include "cuda/host/tensor_core_eligibility.hpp"

namespace flashattn::tc {

using cuda::mma_grid_limits;

std::string TcBackwardShape::name() const {
    return "Bc" + std::to_string(Bc()) + "w" + std::to_string(warps) + "-Br" + std::to_string(Br) +
           (kv_in_registers ? "-kvreg" : "-kvsmem");
}

namespace {

// ---- the compiled tile shapes ------------------------------------------------------------------
// Measured on an H100 (docs/cuda_backward.md, "cuda-tc"; fp16, B = 4, N = 4096, not causal): at
// d = 64, 8 warps (Bc = 128) with Br = 64 ran at 209 TFLOP/s against 203 for 4 warps with K_j and
// V_j in registers and 162 for Br = 128; at d = 128, 8 warps with Br = 32 ran at 212 against 167
// for 4 warps with Br = 64 (which spills ~280 bytes: S^T, dP^T, dK_j, dV_j take 192 registers)
// and 201 for 8 warps with Br = 64. A larger Bc halves how often Q_i and dO_i stream past per key,
// and the dQ atomics per tile pair are shared by more keys. The alternatives (fp16 only) stay
// compiled to be compared on the device (FLASHATTN_VARIANT=cuda-tc-backward=<name>).
struct CompiledShape {
    std::int64_t dim;
    TcBackwardShape shape;
    bool f16_only;  // a tuning alternative
    void (*launch_f16)(const BackwardParams&, bool deterministic, cudaStream_t);
    void (*launch_bf16)(const BackwardParams&, bool deterministic, cudaStream_t);  // or nullptr
};

template <class Cfg, bool kBlockMask, bool kDeterministic>
void launch_kernel(const BackwardParams& params, cudaStream_t stream) {
    const AttentionProblem& p = params.problem;
    const auto kernel = cuda::backward_kernel<TcBackwardOps<Cfg>, kBlockMask, kDeterministic>;
    cuda::allow_dynamic_shared_memory(kernel, Cfg::kSmemBytes);
    const dim3 grid(static_cast<unsigned>(tile_count(p.seq_kv, Cfg::Bc)),
                    static_cast<unsigned>(p.batch * p.heads_kv));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
    FA_CUDA_CHECK_LAUNCH();
}

// One compiled shape. kTuning: an alternative, without the block-mask and deterministic kernels.
template <class Cfg, bool kTuning>
void launch(const BackwardParams& params, bool deterministic, cudaStream_t stream) {
    const AttentionProblem& p = params.problem;
    cuda::require_shared_memory(Cfg::kSmemBytes, "cuda-tc backward: tile Bc" +
                                                      std::to_string(Cfg::Bc) + "-Br" +
                                                      std::to_string(Cfg::Br) +
                                                      " at d = " + std::to_string(Cfg::D));
    if constexpr (kTuning) {
        if (p.block_mask.active() || deterministic)
            throw std::invalid_argument("tile: the tuning shapes of cuda-tc's backward have no "
                                        "block-mask or deterministic kernel; use the default");
        launch_kernel<Cfg, false, false>(params, stream);
    } else {
        if (p.block_mask.active())
            deterministic ? launch_kernel<Cfg, true, true>(params, stream)
                          : launch_kernel<Cfg, true, false>(params, stream);
        else
            deterministic ? launch_kernel<Cfg, false, true>(params, stream)
                          : launch_kernel<Cfg, false, false>(params, stream);
    }
}

// One row of the table: the shape and its instantiations (f16, and bf16 unless a tuning
// alternative), so that a shape is written once.
template <int D, int W, int Br, bool kReg, bool kTuning = false>
CompiledShape shape() {
    CompiledShape s{D, {W, Br, kReg}, kTuning,
                    &launch<BackwardTile<__half, D, W, Br, kReg>, kTuning>, nullptr};
    if constexpr (!kTuning)
        s.launch_bf16 = &launch<BackwardTile<__nv_bfloat16, D, W, Br, kReg>, false>;
    return s;
}

const std::vector<CompiledShape>& compiled_shapes() {
    constexpr bool kTuning = true;
    static const std::vector<CompiledShape> shapes = {
        shape<32, 4, 64, true>(),
        shape<64, 8, 64, false>(),
        shape<64, 4, 64, true, kTuning>(),
        shape<64, 4, 128, false, kTuning>(),
        shape<96, 4, 64, false>(),
        shape<128, 8, 32, false>(),
        shape<128, 4, 64, false, kTuning>(),
        shape<128, 4, 32, false, kTuning>(),
        shape<128, 8, 64, false, kTuning>(),
    };
    return shapes;
}

}  // namespace

const std::vector<std::int64_t>& tc_backward_head_dims() {
    static const std::vector<std::int64_t> dims = cuda::table_dims(compiled_shapes());
    return dims;
}

std::vector<TcBackwardShape> tc_backward_shapes(std::int64_t dim, DType dtype) {
    std::vector<TcBackwardShape> shapes;
    for (const CompiledShape& s : compiled_shapes())
        if (s.dim == dim && (!s.f16_only || dtype == DType::f16)) shapes.push_back(s.shape);
    return shapes;
}

void tc_check_backward_problem(const AttentionProblem& p, DType dtype) {
    validate(p);
    if (dtype != DType::f16 && dtype != DType::bf16)
        throw std::invalid_argument("dtype = " + to_string(dtype) +
                                    ": cuda-tc computes in f16 or bf16 (tensor cores)");
    const auto& dims = tc_backward_head_dims();
    if (std::find(dims.begin(), dims.end(), p.dim) == dims.end())
        throw std::invalid_argument("dim = " + std::to_string(p.dim) +
                                    ": cuda-tc's backward supports head dims 32, 64, 96, 128 (at "
                                    "d = 256 a warp's dK_j and dV_j would not fit its registers)");
    const std::string outside = mma_grid_limits(p);
    if (!outside.empty()) throw std::invalid_argument(outside);
    if (p.batch * p.heads_kv > 65535)
        throw std::invalid_argument("batch*heads_kv = " + std::to_string(p.batch * p.heads_kv) +
                                    ": cuda-tc's backward grid allows at most 65535");
}

std::size_t tc_backward_turn_count(const AttentionProblem& p, const TcBackwardShape& shape) {
    return static_cast<std::size_t>(p.batch * p.heads * tile_count(p.seq_q, shape.Br));
}

void tc_backward(const TcBackwardArgs& args, const TcBackwardShape& shape, bool deterministic) {
    const AttentionProblem& p = args.problem;
    tc_check_backward_problem(p, args.dtype);
    cuda::require_backward_arrays(args, deterministic);
    cuda::queue_backward_prepass(args, deterministic ? tc_backward_turn_count(p, shape) : 0);
    const auto stream = static_cast<cudaStream_t>(args.stream);
    const BackwardParams params = cuda::make_backward_params(
        p, args.Q, args.K, args.V, args.dO, args.lse, args.D, args.dQ_sum, args.dK, args.dV,
        args.dq_turns);
    for (const CompiledShape& c : compiled_shapes())
        if (c.dim == p.dim && c.shape == shape && (args.dtype == DType::f16 || !c.f16_only)) {
            (args.dtype == DType::f16 ? c.launch_f16 : c.launch_bf16)(params, deterministic,
                                                                        stream);
            return;
        }
    throw std::invalid_argument("tile = " + shape.name() + ": not compiled for d = " +
                                std::to_string(p.dim) + ", dtype " + to_string(args.dtype) +
                                " (see tc_backward_shapes)");
}

}  // namespace flashattn::tc
