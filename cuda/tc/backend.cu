// cuda/tc/backend.cu — the cuda-tc Backend, on the upload path every CUDA backend shares
// (cuda/host/prepared.hpp, cuda/host/prepared_backward.hpp): Q, K, V (and dO) as 16-bit values,
// poisoned outputs, fetch() copies them back. The forward is cuda/tc/forward.cu, the backward
// cuda/tc/backward.cu.
#include "cuda/tc/backend.hpp"

#include <memory>
#include <string>
#include <vector>

#include "common/tiling.hpp"
#include <cuda_runtime.h>

#include "cuda/host/check.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/host/prepared_backward.hpp"
#include "cuda/host/split_kv.hpp"
#include "cuda/tc/backward.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/host/workspace.hpp"

namespace flashattn::tc {

namespace {

// prepare() (PreparedCuda's constructor) rounds Q, K, V to 16 bits and uploads them with the block
// mask, and poisons O and LSE; execute() launches the kernel and waits.
class PreparedTc final : public cuda::PreparedCuda {
public:
    PreparedTc(const AttentionProblem& p, const float* Q, const float* K, const float* V,
               DType dtype, const TcTileShape& tile)
        : PreparedCuda("cuda-tc", p, Q, K, V, dtype, cuda::InputForm::bits16),
          tile_(tile),
          kv_splits_(tc_kv_splits(p, dtype, tile)) {
        cuda::WorkspaceCarver counter;
        cuda::cut_split_partials(p, kv_splits_, counter);
        memory_ = workspace<unsigned char>(counter.bytes());
        cuda::WorkspaceCarver carver(memory_.data(), counter.bytes(), "cuda-tc");
        partials_ = cuda::cut_split_partials(p, kv_splits_, carver);
    }

    void execute() override {
        TcDeviceArgs args;
        args.problem = problem_;
        args.dtype = dtype_;
        args.Q = Q16_.data(), args.K = K16_.data(), args.V = V16_.data();
        args.O = O_.data(), args.lse = lse_.data();
        args.kv_splits = kv_splits_;
        args.O_partial = partials_.O, args.lse_partial = partials_.lse;
        tc_forward(args, tile_);
        synchronize();
    }
    // Working memory in HBM: only split-KV's partial results (extra_bytes counts them).
    std::string tiles() const override {
        return "tile shape " + tile_.name() +
               (kv_splits_ > 1 ? ", split-KV S = " + std::to_string(kv_splits_) : "");
    }
    std::int64_t kv_splits() const override { return kv_splits_; }

private:
    TcTileShape tile_;
    std::int64_t kv_splits_;
    cuda::DeviceBuffer<unsigned char> memory_;
    cuda::SplitPartials partials_;
};

// A compiled shape as a row of cuda/host/variants.hpp's chooser.
template <class Shape>
struct ShapeRow {
    std::string name, kind;
    Shape shape;
};
template <class Shape>
Shape choose_shape(const char* backend, const std::vector<Shape>& shapes, std::int64_t dim,
                   DType dtype) {
    std::vector<ShapeRow<Shape>> rows;
    for (const Shape& s : shapes) rows.push_back({s.name(), "", s});
    return cuda::choose_variant(backend, cuda::requested_variant(backend), rows,
                                [](const ShapeRow<Shape>&) { return true; },
                                "dim = " + std::to_string(dim) + ", " + to_string(dtype))
        .shape;
}

// The default tile shape for (d, dtype) is the first of tc_tile_shapes; FLASHATTN_VARIANT
// (cuda/host/variants.hpp) may name another by TcTileShape::name().
TcTileShape choose_tile(std::int64_t dim, DType dtype) {
    return choose_shape("cuda-tc", tc_tile_shapes(dim, dtype), dim, dtype);
}

// The backward's shape: the first of tc_backward_shapes, or
// FLASHATTN_VARIANT=cuda-tc-backward=<name>.
TcBackwardShape choose_backward_shape(std::int64_t dim, DType dtype) {
    return choose_shape("cuda-tc-backward", tc_backward_shapes(dim, dtype), dim, dtype);
}

// The backward device entry's workspace: D = rowsum(dO o O) and, in deterministic mode, the dQ
// turn counters.
struct BackwardWorkspace {
    float* D;
    int* dq_turns;
};
BackwardWorkspace cut_backward_workspace(const AttentionProblem& p, DType dtype,
                                         const Kernel16Backward& kernel, cuda::WorkspaceCarver& w) {
    BackwardWorkspace parts{w.take<float>(static_cast<std::size_t>(p.lse_elements())), nullptr};
    if (cuda::deterministic_requested()) parts.dq_turns = w.take<int>(kernel.turn_count(p, dtype));
    return parts;
}

// prepare_backward's object: 16-bit Q, K, V, dO on the device (PreparedCudaBackward), D and the
// turn counters as workspace; execute() queues the kernel and waits.
class Prepared16Backward final : public cuda::PreparedCudaBackward {
public:
    Prepared16Backward(const AttentionProblem& p, const BackwardInputs& in, DType dtype,
                       const Kernel16Backward& kernel)
        : PreparedCudaBackward(kernel.backend, p, in, dtype, cuda::InputForm::bits16),
          kernel_(kernel),
          deterministic_(cuda::deterministic_requested()) {
        D_ = workspace<float>(static_cast<std::size_t>(p.lse_elements()));
        if (deterministic_) turns_ = workspace<int>(kernel.turn_count(p, dtype));
    }

    void execute() override {
        TcBackwardArgs args;
        args.problem = problem_;
        args.dtype = dtype_;
        args.Q = Q16_.data(), args.K = K16_.data(), args.V = V16_.data(), args.dO = dO16_.data();
        args.O = O_.data(), args.lse = lse_.data();
        args.D = D_.data(), args.dq_turns = turns_.data();
        args.dQ = dQ_.data(), args.dK = dK_.data(), args.dV = dV_.data();
        kernel_.run(args, deterministic_);
        cuda::synchronize_device();
    }

private:
    Kernel16Backward kernel_;
    bool deterministic_;
    cuda::DeviceBuffer<float> D_;
    cuda::DeviceBuffer<int> turns_;
};

}  // namespace

Backend tc_backend() {
    Backend b;
    b.name = "cuda-tc";
    b.device = "cuda";
    b.summary =
        "FlashAttention-2 on tensor cores: fp16/bf16 mma.sync, ldmatrix, cp.async ring, fp32 "
        "softmax and output; d in {32, 64, 96, 128, 256}";
    b.dtypes = {DType::f16, DType::bf16};
    b.tile_sizes = TileSizes::own;
    b.prepare = [](const AttentionProblem& p, const float* Q, const float* K, const float* V,
                   DType dtype) -> std::unique_ptr<PreparedAttention> {
        tc_check_problem(p, dtype);
        require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
        const TcTileShape tile = choose_tile(p.dim, dtype);
        return std::make_unique<PreparedTc>(p, Q, K, V, dtype, tile);
    };
    // The device entries: the same kernels on the caller's 16-bit arrays, queued on the caller's
    // stream (common/backend.hpp).
    // The device entry's workspace: split-KV's partial results (none when S = 1).
    b.device_workspace_bytes = [](const AttentionProblem& p, DType dtype) {
        cuda::WorkspaceCarver counter;
        cuda::cut_split_partials(p, tc_kv_splits(p, dtype, choose_tile(p.dim, dtype)), counter);
        return counter.bytes();
    };
    b.run_device = [](const AttentionProblem& problem, const DeviceForward& a) {
        tc_check_problem(problem, a.dtype);
        require_array(a.Q, "Q"), require_array(a.K, "K"), require_array(a.V, "V");
        require_array(a.O, "O"), require_array(a.lse, "LSE");
        TcDeviceArgs args;
        args.problem = cuda::with_device_mask(problem, a.block_mask);
        args.dtype = a.dtype;
        args.Q = a.Q, args.K = a.K, args.V = a.V, args.O = a.O, args.lse = a.lse;
        args.stream = a.stream;
        const TcTileShape tile = choose_tile(problem.dim, a.dtype);
        args.kv_splits = tc_kv_splits(problem, a.dtype, tile);
        cuda::WorkspaceCarver workspace(a.workspace, a.workspace_bytes, "cuda-tc");
        const cuda::SplitPartials partials = cuda::cut_split_partials(problem, args.kv_splits, workspace);
        workspace.require_fits();
        args.O_partial = partials.O, args.lse_partial = partials.lse;
        tc_forward(args, tile);
    };
    add_16bit_backward(b, {"cuda-tc", tc_check_backward_problem,
                           [](const AttentionProblem& p, DType dtype) {
                               return tc_backward_turn_count(p, choose_backward_shape(p.dim, dtype));
                           },
                           [](const TcBackwardArgs& args, bool deterministic) {
                               tc_backward(args, choose_backward_shape(args.problem.dim, args.dtype),
                                           deterministic);
                           }});
    return b;
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
        cuda::WorkspaceCarver counter;
        cut_backward_workspace(p, dtype, kernel, counter);
        return counter.bytes();
    };
    b.run_backward_device = [kernel](const AttentionProblem& problem, const DeviceBackward& a) {
        kernel.check(problem, a.dtype);
        TcBackwardArgs args;
        args.problem = cuda::with_device_mask(problem, a.block_mask);
        cuda::WorkspaceCarver workspace(a.workspace, a.workspace_bytes,
                                        std::string(kernel.backend) + "'s backward");
        const BackwardWorkspace parts = cut_backward_workspace(problem, a.dtype, kernel, workspace);
        workspace.require_fits();
        args.dtype = a.dtype;
        args.Q = a.Q, args.K = a.K, args.V = a.V, args.dO = a.dO, args.O = a.O, args.lse = a.lse;
        args.D = parts.D, args.dq_turns = parts.dq_turns;
        args.dQ = a.dQ, args.dK = a.dK, args.dV = a.dV;
        args.stream = a.stream;
        kernel.run(args, cuda::deterministic_requested());
    };
}

}  // namespace flashattn::tc
