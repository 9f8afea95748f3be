// cuda/fa2/backward.cu — cuda-fa2's backward pass, host side. Two kernels, as for the forward:
//   * tensor cores (3xTF32): cuda/stages/flash_backward.cuh with the fp32 stages of
//     cuda/fa2/backward_tf32.cuh, for 16 <= d <= 128 and finite inputs
//     (cuda/host/tensor_core_eligibility.hpp says why); dQ by fp32 atomics, or in a fixed order
//     with FLASHATTN_DETERMINISTIC=1. At d <= 64, 4 warps of 16 keys per CTA (two CTAs per SM;
//     FLASHATTN_VARIANT=cuda-fa2-backward=tf32-bc128 runs 8, one CTA per SM); above, 8 warps;
//   * FFMA (cuda/fa2/backward_ffma.cuh, deterministic, no atomics) for every other problem, or when
//     FLASHATTN_VARIANT=cuda-fa2-backward=ffma asks for it.
//
// FFMA tiles: Br = Bc = 64 for d <= 64, 32 above (so that d = 256 fits in an H100's 227 KiB of
// shared memory per block), 256 threads. The shared memory a tile needs is checked against the
// device's limit in prepare(), with a clear error where it does not fit.
#include <limits>
#include <stdexcept>
#include <string>

#include "cuda/stages/backward_prepass.cuh"
#include "cuda/host/check.hpp"
#include "cuda/fa2/backend.hpp"
#include "cuda/fa2/backward_ffma.cuh"
#include "cuda/fa2/backward_tf32.cuh"
#include "cuda/host/prepared_backward.hpp"
#include "cuda/host/tensor_core_eligibility.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/host/workspace.hpp"

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

// The FFMA kernels on `stream`: dK and dV, then dQ (D must be there already).
template <class T>
void launch(const fa2_backward::Params& a, cudaStream_t stream) {
    const AttentionProblem& p = a.p;
    const std::size_t bytes = static_cast<std::size_t>(T::smem_floats(p.dim)) * sizeof(float);
    const auto key_kernel = fa2_backward::key_gradients_kernel<T>;
    const auto query_kernel = fa2_backward::query_gradient_kernel<T>;
    allow_dynamic_shared_memory(key_kernel, static_cast<int>(bytes));
    allow_dynamic_shared_memory(query_kernel, static_cast<int>(bytes));
    const dim3 key_grid(static_cast<unsigned>(tile_count(p.seq_kv, T::Bc)),
                        static_cast<unsigned>(p.batch * p.heads_kv));
    key_kernel<<<key_grid, T::threads, bytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH();
    const dim3 query_grid(static_cast<unsigned>(tile_count(p.seq_q, T::Br)),
                          static_cast<unsigned>(p.batch * p.heads));
    query_kernel<<<query_grid, T::threads, bytes, stream>>>(a);
    FA_CUDA_CHECK_LAUNCH();
}

void launch_ffma(const fa2_backward::Params& a, cudaStream_t stream) {
    if (a.p.dim <= 64)
        launch<SmallD>(a, stream);
    else
        launch<LargeD>(a, stream);
}

// D = rowsum(dO o O), on `stream`: the first kernel of both paths, reading dO and O where their
// (resolved) layouts put their rows. dQ_to_zero: the tensor-core kernel's dQ (at dQ_at), which it
// adds into (Algorithm 2 line 3, dQ = 0, done by the same launch: one operation fewer than a
// memset), or null (the FFMA kernels write dQ whole).
void queue_delta(const AttentionProblem& p, const float* dO, const ArrayLayout& dO_at,
                 const float* O, const ArrayLayout& O_at, float* D, float* dQ_to_zero,
                 const ArrayLayout& dQ_at, cudaStream_t stream) {
    cuda::launch_delta(p, dO, dO_at, O, O_at, D, dQ_to_zero, stream, dQ_at);
}

// ---- the tensor-core kernel ---------------------------------------------------------------------

// d <= 64 runs on D = 64 tiles, 64 < d <= 128 on D = 128 (the columns past d zero-filled). At
// D = 64, 64 keys per CTA (4 warps): two CTAs per SM (79 KiB of shared memory each), faster than
// one of 128 keys (8 warps, 123 KiB; FLASHATTN_VARIANT=cuda-fa2-backward=tf32-bc128) at every
// point measured (docs/cuda_backward.md).
using Tf32Small = Tf32BackwardTile<64, 4, 32>;
using Tf32SmallBc128 = Tf32BackwardTile<64, 8, 32>;
using Tf32Large = Tf32BackwardTile<128, 8, 32>;
static_assert(Tf32SmallBc128::Br == Tf32Small::Br, "turn_count counts Tf32Small's query tiles");

// Whether the 3xTF32 kernel runs this problem: d and the inputs (tf32_backward_allowed), and no
// FLASHATTN_VARIANT=cuda-fa2-backward=ffma.
bool use_tensor_cores(const AttentionProblem& p, bool inputs_allowed) {
    const std::string wanted = requested_variant("cuda-fa2-backward");
    require_known_variant("cuda-fa2-backward", wanted, {"tf32", "tf32-bc128", "ffma"});
    if (wanted == "ffma") return false;
    const bool fits = p.dim <= 128 && inputs_allowed;
    if (wanted == "tf32" && !fits)
        throw std::invalid_argument("FLASHATTN_VARIANT: cuda-fa2-backward=tf32 needs 16 <= d <= "
                                    "128 and finite inputs");
    if (wanted == "tf32-bc128" && !(fits && p.dim <= 64))
        throw std::invalid_argument("FLASHATTN_VARIANT: cuda-fa2-backward=tf32-bc128 needs 16 <= d "
                                    "<= 64 and finite inputs");
    return fits;
}

std::size_t turn_count(const AttentionProblem& p) {
    return static_cast<std::size_t>(p.batch * p.heads * tile_count(p.seq_q, Tf32Small::Br));
}

template <class Cfg, bool kBlockMask, bool kDeterministic>
void launch_tf32_kernel(const BackwardParams& params, cudaStream_t stream) {
    const AttentionProblem& p = params.problem;
    const auto kernel = backward_kernel<Tf32BackwardOps<Cfg>, kBlockMask, kDeterministic>;
    require_shared_memory(Cfg::kSmemBytes,
                          "cuda-fa2 backward: the tensor-core tile at D = " + std::to_string(Cfg::D));
    allow_dynamic_shared_memory(kernel, Cfg::kSmemBytes);
    const dim3 grid(static_cast<unsigned>(tile_count(p.seq_kv, Cfg::Bc)),
                    static_cast<unsigned>(p.batch * p.heads_kv));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
    FA_CUDA_CHECK_LAUNCH();
}

template <class Cfg>
void launch_tf32(const BackwardParams& params, bool deterministic, cudaStream_t stream) {
    if (params.problem.block_mask.active())
        deterministic ? launch_tf32_kernel<Cfg, true, true>(params, stream)
                      : launch_tf32_kernel<Cfg, true, false>(params, stream);
    else
        deterministic ? launch_tf32_kernel<Cfg, false, true>(params, stream)
                      : launch_tf32_kernel<Cfg, false, false>(params, stream);
}

// The turn counters = 0 (deterministic mode), then the tensor-core kernel behind `gate`, on
// `stream`; D must be there already and dQ zeroed (queue_delta); dq_turns may be null unless
// deterministic.
void launch_tf32_all(const BackwardParams& params, bool deterministic, cudaStream_t stream) {
    const AttentionProblem& p = params.problem;
    if (deterministic)
        FA_CUDA_CHECK(cudaMemsetAsync(params.dq_turns, 0, sizeof(int) * turn_count(p), stream));
    if (p.dim <= 64 && requested_variant("cuda-fa2-backward") == "tf32-bc128")
        launch_tf32<Tf32SmallBc128>(params, deterministic, stream);
    else if (p.dim <= 64)
        launch_tf32<Tf32Small>(params, deterministic, stream);
    else
        launch_tf32<Tf32Large>(params, deterministic, stream);
}

// The device entry's workspace: D, and where the tensor-core kernel may run, the finiteness
// flags and (deterministic mode) the dQ turn counters.
struct BackwardWorkspace {
    float* D;
    int* nonfinite;
    int* dq_turns;
};
BackwardWorkspace cut_backward_workspace(const AttentionProblem& p, WorkspaceCarver& w) {
    BackwardWorkspace parts{w.take<float>(static_cast<std::size_t>(p.lse_elements())), nullptr,
                            nullptr};
    if (use_tensor_cores(p, tf32_shape_allowed(p))) {
        parts.nonfinite = w.take<int>(kNonfiniteSlots);
        if (deterministic_requested()) parts.dq_turns = w.take<int>(turn_count(p));
    }
    return parts;
}

class PreparedFa2Backward final : public PreparedCudaBackward {
public:
    PreparedFa2Backward(const AttentionProblem& p, const BackwardInputs& in, DType dtype)
        : PreparedCudaBackward("cuda-fa2", p, in, dtype),
          tensor_cores_(use_tensor_cores(p, tf32_backward_allowed(p, in.Q, in.K, in.V, in.O, in.dO))),
          deterministic_(deterministic_requested()) {
        require_backward_fits(p);
        D_ = workspace<float>(static_cast<std::size_t>(p.lse_elements()));
        if (tensor_cores_ && deterministic_) turns_ = workspace<int>(turn_count(p));
    }

    void execute() override {
        const ArrayLayout rows =
            ArrayLayout::contiguous(problem_.heads, problem_.seq_q, problem_.dim);
        queue_delta(problem_, dO_.data(), rows, O_.data(), rows, D_.data(),
                    tensor_cores_ ? dQ_.data() : nullptr, rows, nullptr);
        if (tensor_cores_) {
            launch_tf32_all(make_backward_params(problem_, Q_.data(), K_.data(), V_.data(),
                                                 dO_.data(), lse_.data(), D_.data(), dQ_.data(),
                                                 dK_.data(), dV_.data(), turns_.data()),
                            deterministic_, nullptr);
        } else {
            const QkvLayouts at = QkvLayouts::contiguous(problem_);
            launch_ffma({problem_, Q_.data(), K_.data(), V_.data(), O_.data(), dO_.data(),
                         lse_.data(), D_.data(), dQ_.data(), dK_.data(), dV_.data(), {}, at, at.q,
                         at.q, at.k, at.v},
                        nullptr);
        }
        synchronize_device();
    }

private:
    bool tensor_cores_, deterministic_;
    DeviceBuffer<float> D_;
    DeviceBuffer<int> turns_;
};

}  // namespace

void add_cuda_fa2_backward(Backend& b) {
    add_cuda_backward<PreparedFa2Backward>(b);
    // The device entry: the same kernels on the caller's device arrays, queued on the caller's
    // stream (common/backend.hpp). As in the forward, where the tensor-core kernel may run, both
    // kernels are queued behind the finiteness test on the device, which picks one of them.
    b.device_backward_workspace_bytes = [](const AttentionProblem& p, DType) {
        WorkspaceCarver counter;
        cut_backward_workspace(p, counter);
        return counter.bytes();
    };
    b.run_backward_device = [](const AttentionProblem& problem, const DeviceBackward& a) {
        require_array(a.Q, "Q"), require_array(a.K, "K"), require_array(a.V, "V");
        require_array(a.O, "O"), require_array(a.lse, "LSE"), require_array(a.dO, "dO");
        require_array(a.dQ, "dQ"), require_array(a.dK, "dK"), require_array(a.dV, "dV");
        require_backward_fits(problem);
        if (a.dtype != DType::f32 || a.o_dtype != DType::f32 || a.grad_dtype != DType::f32)
            throw std::invalid_argument("dtype = " + to_string(a.dtype) + ", o_dtype = " +
                                        to_string(a.o_dtype) + ", grad_dtype = " +
                                        to_string(a.grad_dtype) +
                                        ": cuda-fa2's backward reads and writes float32 only");
        const AttentionProblem p = with_device_mask(problem, a.block_mask);
        const bool tensor_cores = use_tensor_cores(p, tf32_shape_allowed(p));
        const bool deterministic = deterministic_requested();
        WorkspaceCarver workspace(a.workspace, a.workspace_bytes, "cuda-fa2's backward");
        const BackwardWorkspace parts = cut_backward_workspace(p, workspace);
        workspace.require_fits();
        const auto stream = static_cast<cudaStream_t>(a.stream);
        const auto f32 = [](const void* x) { return static_cast<const float*>(x); };
        const float *Q = f32(a.Q), *K = f32(a.K), *V = f32(a.V), *dO = f32(a.dO), *O = f32(a.O);
        // Every array read and written where it lies: a PyTorch caller's views need no copy.
        const QkvLayouts at = QkvLayouts::resolved(p, a.q_layout, a.k_layout, a.v_layout);
        const auto q_rows = [&](const ArrayLayout& x) {
            return x.resolved(p.heads, p.seq_q, p.dim);
        };
        const auto kv_rows = [&](const ArrayLayout& x) {
            return x.resolved(p.heads_kv, p.seq_kv, p.dim);
        };
        const ArrayLayout do_at = q_rows(a.do_layout), o_at = q_rows(a.o_layout);
        const ArrayLayout dq_at = q_rows(a.dq_layout), dk_at = kv_rows(a.dk_layout),
                          dv_at = kv_rows(a.dv_layout);
        require_input_layout(Q, at.q, p.dim, DType::f32, "Q");
        require_input_layout(K, at.k, p.dim, DType::f32, "K");
        require_input_layout(V, at.v, p.dim, DType::f32, "V");
        require_input_layout(dO, do_at, p.dim, DType::f32, "dO");
        // O is read value by value, or 8 at a time where aligned (the D pass): any strides that
        // are not negative.
        if (!o_at.non_negative())
            throw std::invalid_argument("O: strides must not be negative (batch, head, row = " +
                                        std::to_string(o_at.batch) + ", " +
                                        std::to_string(o_at.head) + ", " +
                                        std::to_string(o_at.row) + ")");
        float *dQ = static_cast<float*>(a.dQ), *dK = static_cast<float*>(a.dK);
        float* dV = static_cast<float*>(a.dV);
        require_output_layout(dQ, dq_at, p.dim, DType::f32, "dQ");
        require_output_layout(dK, dk_at, p.dim, DType::f32, "dK");
        require_output_layout(dV, dv_at, p.dim, DType::f32, "dV");
        queue_delta(p, dO, do_at, O, o_at, parts.D, tensor_cores ? dQ : nullptr, dq_at, stream);
        fa2_backward::Params ffma{p,  Q,  K,  V,  O,     dO,    a.lse, parts.D, dQ,
                                  dK, dV, {}, at, do_at, dq_at, dk_at, dv_at};
        if (!tensor_cores) {
            launch_ffma(ffma, stream);
            return;
        }
        queue_nonfinite_test({span_of(Q, at.q, p.batch, p.heads, p.seq_q, p.dim),
                              span_of(K, at.k, p.batch, p.heads_kv, p.seq_kv, p.dim),
                              span_of(V, at.v, p.batch, p.heads_kv, p.seq_kv, p.dim),
                              span_of(O, o_at, p.batch, p.heads, p.seq_q, p.dim),
                              span_of(dO, do_at, p.batch, p.heads, p.seq_q, p.dim)},
                             parts.nonfinite, stream);
        BackwardParams tf32 = make_backward_params(p, Q, K, V, dO, a.lse, parts.D, dQ, dK, dV,
                                                   parts.dq_turns);
        tf32.in = at, tf32.do_layout = do_at, tf32.dq_layout = dq_at;
        tf32.dk_layout = dk_at, tf32.dv_layout = dv_at;
        tf32.gate = {parts.nonfinite, false};
        launch_tf32_all(tf32, deterministic, stream);
        ffma.gate = {parts.nonfinite, true};
        launch_ffma(ffma, stream);
    };
}

}  // namespace flashattn::cuda
