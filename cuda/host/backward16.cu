// cuda/host/backward16.cu — see cuda/host/backward16.hpp.
#include "cuda/host/backward16.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "cuda/host/check.hpp"
#include "cuda/host/prepared_backward.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/host/workspace.hpp"
#include "cuda/stages/backward_prepass.cuh"

namespace flashattn::cuda {
namespace {

// The backward device entry's workspace: D = rowsum(dO o O) and, in deterministic mode, the dQ
// turn counters.
struct BackwardWorkspace {
    float* D;
    int* dq_turns;
};
BackwardWorkspace cut_backward_workspace(const AttentionProblem& p, DType dtype,
                                         const Kernel16Backward& kernel, WorkspaceCarver& w) {
    BackwardWorkspace parts{w.take<float>(static_cast<std::size_t>(p.lse_elements())), nullptr};
    if (deterministic_requested()) parts.dq_turns = w.take<int>(kernel.turn_count(p, dtype));
    return parts;
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
        args.dQ = dQ_.data(), args.dK = dK_.data(), args.dV = dV_.data();
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
    require_array(args.dV, "dV");
    if (deterministic) require_array(args.dq_turns, "dq_turns");
}

void queue_backward_prepass(const Backward16Args& args, std::size_t turns) {
    const AttentionProblem& p = args.problem;
    const auto stream = static_cast<cudaStream_t>(args.stream);
    const std::int64_t rows = p.batch * p.heads * p.seq_q;
    const int d = static_cast<int>(p.dim);
    // L4: D = rowsum(dO o O), in the dO the products read (rounded to 16 bits).
    if (args.dtype == DType::f16)
        cuda::launch_delta(static_cast<const __half*>(args.dO), args.O, args.D, rows, d, stream);
    else
        cuda::launch_delta(static_cast<const __nv_bfloat16*>(args.dO), args.O, args.D, rows, d,
                           stream);
    FA_CUDA_CHECK(cudaMemsetAsync(args.dQ, 0, sizeof(float) * std::size_t(p.q_elements()), stream));
    if (turns > 0) FA_CUDA_CHECK(cudaMemsetAsync(args.dq_turns, 0, sizeof(int) * turns, stream));
}

void add_16bit_backward(Backend& b, const Kernel16Backward& kernel) {
    b.prepare_backward = [kernel](const AttentionProblem& p, const BackwardInputs& in,
                                  DType dtype) -> std::unique_ptr<PreparedBackward> {
        kernel.check(p, dtype);
        return std::make_unique<Prepared16Backward>(p, in, dtype, kernel);
    };
    // The device entry: the same kernel on the caller's 16-bit arrays, queued on the caller's
    // stream (common/backend.hpp); its workspace is D and, in deterministic mode, the dQ turn
    // counters (cut_backward_workspace).
    b.device_backward_workspace_bytes = [kernel](const AttentionProblem& p, DType dtype) {
        WorkspaceCarver counter;
        cut_backward_workspace(p, dtype, kernel, counter);
        return counter.bytes();
    };
    b.run_backward_device = [kernel](const AttentionProblem& problem, const DeviceBackward& a) {
        kernel.check(problem, a.dtype);
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
        kernel.run(args, deterministic_requested());
    };
}

}  // namespace flashattn::cuda
