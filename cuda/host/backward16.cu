// cuda/host/backward16.cu — see cuda/host/backward16.hpp.
#include "cuda/host/backward16.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/host/check.hpp"
#include "cuda/host/prepared_backward.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/host/workspace.hpp"
#include "cuda/stages/backward_postpass.cuh"
#include "cuda/stages/backward_prepass.cuh"

namespace flashattn::cuda {
namespace {

// The backward device entry's workspace: D = rowsum(dO o O), in deterministic mode the dQ turn
// counters, and for a kernel with layouts dQ's float32 sum (used when the caller's dQ is strided
// or 16-bit: the size cannot depend on that, which is not known when it is asked).
struct BackwardWorkspace {
    float* D;
    int* dq_turns;
    float* dQ_sum;
};
BackwardWorkspace cut_backward_workspace(const AttentionProblem& p, DType dtype,
                                         const Kernel16Backward& kernel, WorkspaceCarver& w) {
    BackwardWorkspace parts{w.take<float>(static_cast<std::size_t>(p.lse_elements())), nullptr,
                            nullptr};
    if (deterministic_requested()) parts.dq_turns = w.take<int>(kernel.turn_count(p, dtype));
    if (kernel.layouts) parts.dQ_sum = w.take<float>(static_cast<std::size_t>(p.q_elements()));
    return parts;
}

// D = rowsum(dO o O) for dO of type In and O of o_dtype (float32 or In), and dQ's float32 sum
// zeroed in the same pass.
template <class In>
void queue_delta(const Backward16Args& args, cudaStream_t stream) {
    const auto* dO = static_cast<const In*>(args.dO);
    if (args.o_dtype == DType::f32)
        launch_delta(args.problem, dO, args.do_at, static_cast<const float*>(args.O), args.o_at,
                     args.D, args.dQ_sum, stream);
    else
        launch_delta(args.problem, dO, args.do_at, static_cast<const In*>(args.O), args.o_at,
                     args.D, args.dQ_sum, stream);
}

// prepare_backward's object: 16-bit Q, K, V, dO on the device (PreparedCudaBackward), D and the
// turn counters as workspace; execute() queues the kernel and waits.
class Prepared16Backward final : public PreparedCudaBackward {
public:
    Prepared16Backward(const AttentionProblem& p, const BackwardInputs& in, DType dtype,
                       const Kernel16Backward& kernel)
        : PreparedCudaBackward(kernel.backend, p, in, dtype, InputForm::bits16),
          kernel_(kernel),
          deterministic_(deterministic_requested()) {
        D_ = workspace<float>(static_cast<std::size_t>(p.lse_elements()));
        if (deterministic_) turns_ = workspace<int>(kernel.turn_count(p, dtype));
    }

    void execute() override {
        Backward16Args args;
        args.problem = problem_;
        args.dtype = dtype_;
        args.Q = Q16_.data(), args.K = K16_.data(), args.V = V16_.data(), args.dO = dO16_.data();
        args.O = O_.data(), args.lse = lse_.data();
        args.D = D_.data(), args.dq_turns = turns_.data();
        args.dQ = args.dQ_sum = dQ_.data(), args.dK = dK_.data(), args.dV = dV_.data();
        args.contiguous_layouts();
        kernel_.run(args, deterministic_);
        synchronize_device();
    }

private:
    Kernel16Backward kernel_;
    bool deterministic_;
    DeviceBuffer<float> D_;
    DeviceBuffer<int> turns_;
};

}  // namespace

void require_backward_arrays(const Backward16Args& args, bool deterministic) {
    require_array(args.Q, "Q"), require_array(args.K, "K"), require_array(args.V, "V");
    require_array(args.dO, "dO"), require_array(args.O, "O"), require_array(args.lse, "LSE");
    require_array(args.D, "D"), require_array(args.dQ, "dQ"), require_array(args.dK, "dK");
    require_array(args.dV, "dV"), require_array(args.dQ_sum, "dQ's sum");
    if (deterministic) require_array(args.dq_turns, "dq_turns");
}

void queue_backward_prepass(const Backward16Args& args, std::size_t turns) {
    const auto stream = static_cast<cudaStream_t>(args.stream);
    // The turn counters first, so that the D pass is the kernel right before the backward's
    // (cuda-fa3's is a dependent launch that waits for it).
    if (turns > 0) FA_CUDA_CHECK(cudaMemsetAsync(args.dq_turns, 0, sizeof(int) * turns, stream));
    // L4: D = rowsum(dO o O), in the dO the products read (rounded to 16 bits); L3: dQ's sum = 0.
    if (args.dtype == DType::f16)
        queue_delta<__half>(args, stream);
    else
        queue_delta<__nv_bfloat16>(args, stream);
}

void queue_backward_postpass(const Backward16Args& args) {
    if (args.dQ == args.dQ_sum) return;
    launch_store_dq(args.problem, args.dQ_sum, args.dQ, args.dq_at, args.grad_dtype,
                    static_cast<cudaStream_t>(args.stream));
}

namespace {

// The layouts and types of a device call into args, checked: O and the gradients in float32 or
// the inputs' dtype, the gradients' layouts fit for paired stores (require_output_layout), and
// dQ's float32 sum in the workspace unless dQ is itself contiguous float32. The kernel checks
// the layouts it reads with TMA.
void take_layouts(Backward16Args& args, const DeviceBackward& a, float* workspace_sum) {
    const AttentionProblem& p = args.problem;
    for (const auto& [type, name] :
         {std::pair{a.o_dtype, "O"}, std::pair{a.grad_dtype, "dQ, dK and dV"}})
        if (type != DType::f32 && type != a.dtype)
            throw std::invalid_argument(std::string(name) + "'s dtype = " + to_string(type) +
                                        ": float32 or the inputs' dtype (" + to_string(a.dtype) +
                                        ")");
    args.q_at = a.q_layout.resolved(p.heads, p.seq_q, p.dim);
    args.o_at = a.o_layout.resolved(p.heads, p.seq_q, p.dim);
    args.do_at = a.do_layout.resolved(p.heads, p.seq_q, p.dim);
    args.dq_at = a.dq_layout.resolved(p.heads, p.seq_q, p.dim);
    args.k_at = a.k_layout.resolved(p.heads_kv, p.seq_kv, p.dim);
    args.v_at = a.v_layout.resolved(p.heads_kv, p.seq_kv, p.dim);
    args.dk_at = a.dk_layout.resolved(p.heads_kv, p.seq_kv, p.dim);
    args.dv_at = a.dv_layout.resolved(p.heads_kv, p.seq_kv, p.dim);
    args.o_dtype = a.o_dtype, args.grad_dtype = a.grad_dtype;
    require_output_layout(a.dQ, args.dq_at, a.grad_dtype, "dQ");
    require_output_layout(a.dK, args.dk_at, a.grad_dtype, "dK");
    require_output_layout(a.dV, args.dv_at, a.grad_dtype, "dV");
    if (args.o_at.batch < 0 || args.o_at.head < 0 || args.o_at.row < 0)  // read value by value
        throw std::invalid_argument("O: its strides must be non-negative");
    const ArrayLayout dense = ArrayLayout::contiguous(p.heads, p.seq_q, p.dim);
    // cuda-fa3's kernel adds to dQ's sum with TMA, which needs a 16-byte aligned address: a dQ
    // that is not goes through the (256-byte aligned) working sum.
    const bool dq_dense_f32 = a.grad_dtype == DType::f32 && args.dq_at.batch == dense.batch &&
                              args.dq_at.head == dense.head && args.dq_at.row == dense.row &&
                              reinterpret_cast<std::uintptr_t>(a.dQ) % 16 == 0;
    args.dQ_sum = dq_dense_f32 ? static_cast<float*>(a.dQ) : workspace_sum;
}

}  // namespace

void add_16bit_backward(Backend& b, const Kernel16Backward& kernel) {
    b.device_layouts = b.device_layouts || kernel.layouts;
    b.prepare_backward = [kernel](const AttentionProblem& p, const BackwardInputs& in,
                                  DType dtype) -> std::unique_ptr<PreparedBackward> {
        kernel.check(p, dtype);
        return std::make_unique<Prepared16Backward>(p, in, dtype, kernel);
    };
    // The device entry: the same kernel on the caller's 16-bit arrays, queued on the caller's
    // stream (common/backend.hpp); its workspace is D, in deterministic mode the dQ turn counters
    // and, for a kernel with layouts, dQ's float32 sum (cut_backward_workspace).
    b.device_backward_workspace_bytes = [kernel](const AttentionProblem& p, DType dtype) {
        WorkspaceCarver counter;
        cut_backward_workspace(p, dtype, kernel, counter);
        return counter.bytes();
    };
    b.run_backward_device = [kernel](const AttentionProblem& problem, const DeviceBackward& a) {
        kernel.check(problem, a.dtype);
        if (!kernel.layouts) require_default_layouts(kernel.backend, a);
        Backward16Args args;
        args.problem = with_device_mask(problem, a.block_mask);
        WorkspaceCarver workspace(a.workspace, a.workspace_bytes,
                                        std::string(kernel.backend) + "'s backward");
        const BackwardWorkspace parts = cut_backward_workspace(problem, a.dtype, kernel, workspace);
        workspace.require_fits();
        args.dtype = a.dtype;
        args.Q = a.Q, args.K = a.K, args.V = a.V, args.dO = a.dO, args.O = a.O, args.lse = a.lse;
        args.D = parts.D, args.dq_turns = parts.dq_turns;
        args.dQ = a.dQ, args.dK = a.dK, args.dV = a.dV;
        args.stream = a.stream;
        if (kernel.layouts)
            take_layouts(args, a, parts.dQ_sum);
        else
            args.contiguous_layouts();
        if (args.dQ_sum == nullptr) args.dQ_sum = static_cast<float*>(a.dQ);
        kernel.run(args, deterministic_requested());
    };
}

}  // namespace flashattn::cuda
