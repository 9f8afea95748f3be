// cuda/tc/backend.cu — the cuda-tc Backend, on the upload path every CUDA backend shares
// (cuda/host/prepared.hpp, cuda/host/prepared_backward.hpp): Q, K, V (and dO) as 16-bit values,
// poisoned outputs, fetch() copies them back. The forward is cuda/tc/forward.cu, the backward
// cuda/tc/backward.cu.
#include "cuda/tc/backend.hpp"

#include <algorithm>
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

// The default tile shape for problem p is tc_default_tile's (the decoding shape at decoding
// shapes, else the first of tc_tile_shapes); FLASHATTN_VARIANT (cuda/host/variants.hpp) may name
// another by TcTileShape::name().
TcTileShape choose_tile(const AttentionProblem& p, DType dtype) {
    // No request: the default, without the named table below (a device entry asks every call).
    if (cuda::requested_variant("cuda-tc").empty()) return tc_default_tile(p, dtype);
    std::vector<TcTileShape> shapes = tc_tile_shapes(p.dim, dtype);
    if (!shapes.empty()) {  // the chooser's default is the first row
        const TcTileShape first = tc_default_tile(p, dtype);
        std::stable_partition(shapes.begin(), shapes.end(),
                              [&](const TcTileShape& s) { return s == first; });
    }
    return choose_shape("cuda-tc", shapes, p.dim, dtype);
}

// The backward's shape: the first of tc_backward_shapes, or
// FLASHATTN_VARIANT=cuda-tc-backward=<name>.
TcBackwardShape choose_backward_shape(std::int64_t dim, DType dtype) {
    return choose_shape("cuda-tc-backward", tc_backward_shapes(dim, dtype), dim, dtype);
}

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
        const TcTileShape tile = choose_tile(p, dtype);
        return std::make_unique<PreparedTc>(p, Q, K, V, dtype, tile);
    };
    // The device entries: the same kernels on the caller's 16-bit arrays, queued on the caller's
    // stream (common/backend.hpp). The forward's entry reads and writes contiguous arrays, O in
    // float32 or in the inputs' dtype (the epilogue or split-KV's combine rounds it once).
    // The device entry's workspace: split-KV's partial results (none when S = 1).
    b.device_workspace_bytes = [](const AttentionProblem& p, DType dtype) {
        cuda::WorkspaceCarver counter;
        cuda::cut_split_partials(p, tc_kv_splits(p, dtype, choose_tile(p, dtype)), counter);
        return counter.bytes();
    };
    b.device_o_dtype = true;
    b.run_device = [](const AttentionProblem& problem, const DeviceForward& a) {
        tc_check_problem(problem, a.dtype);
        require_array(a.Q, "Q"), require_array(a.K, "K"), require_array(a.V, "V");
        require_array(a.O, "O"), require_array(a.lse, "LSE");
        require_contiguous_layouts("cuda-tc", a);
        TcDeviceArgs args;
        args.problem = cuda::with_device_mask(problem, a.block_mask);
        args.dtype = a.dtype;
        args.Q = a.Q, args.K = a.K, args.V = a.V, args.lse = a.lse;
        args.O = a.O, args.o_dtype = a.o_dtype;  // contiguous, float32 or the inputs' dtype
        require_output_layout(
            a.O, ArrayLayout::contiguous(problem.heads, problem.seq_q, problem.dim), a.o_dtype, "O");
        args.stream = a.stream;
        const TcTileShape tile = choose_tile(problem, a.dtype);
        args.kv_splits = tc_kv_splits(problem, a.dtype, tile);
        cuda::WorkspaceCarver workspace(a.workspace, a.workspace_bytes, "cuda-tc");
        const cuda::SplitPartials partials = cuda::cut_split_partials(problem, args.kv_splits, workspace);
        workspace.require_fits();
        args.O_partial = partials.O, args.lse_partial = partials.lse;
        tc_forward(args, tile);
    };
    cuda::add_16bit_backward(b, {"cuda-tc", tc_check_backward_problem,
                           [](const AttentionProblem& p, DType dtype) {
                               return tc_backward_turn_count(p, choose_backward_shape(p.dim, dtype));
                           },
                           [](const TcBackwardArgs& args, bool deterministic) {
                               tc_backward(args, choose_backward_shape(args.problem.dim, args.dtype),
                                           deterministic);
                           }});
    return b;
}

}  // namespace flashattn::tc
