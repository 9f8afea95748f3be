// cuda/tc_backend.cu — the cuda-tc Backend, on the upload path every CUDA backend shares
// (cuda/prepared.hpp): Q, K, V as 16-bit values, poisoned O and LSE, fetch() copies them back.
#include "cuda/tc_backend.hpp"

#include <memory>
#include <string>
#include <vector>

#include "common/tiling.hpp"
#include "cuda/prepared.hpp"
#include "cuda/variants.hpp"

namespace flashattn::tc {

namespace {

// prepare() (PreparedCuda's constructor) rounds Q, K, V to 16 bits and uploads them with the block
// mask, and poisons O and LSE; execute() launches the kernel and waits.
class PreparedTc final : public cuda::PreparedCuda {
public:
    PreparedTc(const AttentionProblem& p, const float* Q, const float* K, const float* V,
               DType dtype, const TcTileShape& tile)
        : PreparedCuda("cuda-tc", p, Q, K, V, dtype, cuda::InputForm::bits16), tile_(tile) {}

    void execute() override {
        TcDeviceArgs args;
        args.problem = problem_;
        args.dtype = dtype_;
        args.Q = Q16_.data(), args.K = K16_.data(), args.V = V16_.data();
        args.O = O_.data(), args.lse = lse_.data();
        tc_forward(args, tile_);
        synchronize();
    }
    // The kernel keeps everything in registers and shared memory: no working memory in HBM.
    std::string tiles() const override { return "tile shape " + tile_.name(); }

private:
    TcTileShape tile_;
};

// The default tile shape for (d, dtype) is the first of tc_tile_shapes; FLASHATTN_VARIANT
// (cuda/variants.hpp) may name another by TcTileShape::name().
TcTileShape choose_tile(std::int64_t dim, DType dtype) {
    const std::vector<TcTileShape> shapes = tc_tile_shapes(dim, dtype);
    const std::string wanted = cuda::requested_variant("cuda-tc");
    std::vector<std::string> names;
    for (const TcTileShape& s : shapes) names.push_back(s.name());
    cuda::require_known_variant("cuda-tc", wanted, names);
    for (const TcTileShape& s : shapes)
        if (s.name() == wanted) return s;
    return shapes.front();
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
        const TcTileShape tile = choose_tile(p.dim, dtype);
        return std::make_unique<PreparedTc>(p, Q, K, V, dtype, tile);
    };
    return b;
}

}  // namespace flashattn::tc
