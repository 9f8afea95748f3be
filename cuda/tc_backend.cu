// cuda/tc_backend.cu — the cuda-tc Backend: prepare() rounds Q, K, V to fp16 / bf16 and uploads
// them (and the block mask), execute() launches the kernel and waits, fetch() copies O and LSE back.
#include "cuda/tc_backend.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <vector>

#include "common/tiling.hpp"
#include "cuda/check.hpp"
#include "cuda/device_buffer.hpp"

namespace flashattn::tc {

std::uint16_t to_bits(float x, DType dtype) {
    if (dtype == DType::bf16) {
        const __nv_bfloat16_raw r = __float2bfloat16_rn(x);
        return r.x;
    }
    const __half_raw r = __float2half_rn(x);
    return r.x;
}

float from_bits(std::uint16_t bits, DType dtype) {
    if (dtype == DType::bf16) {
        __nv_bfloat16_raw r;
        r.x = bits;
        return __bfloat162float(__nv_bfloat16(r));
    }
    __half_raw r;
    r.x = bits;
    return __half2float(__half(r));
}

namespace {

// Rounds n floats to 16 bits (times `sign`, exact) and copies them to a new device array.
cuda::DeviceBuffer<std::uint16_t> upload(const float* x, std::int64_t n, DType dtype, float sign) {
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < n; ++k) bits[k] = to_bits(sign * x[k], dtype);
    cuda::DeviceBuffer<std::uint16_t> device(bits.size());
    FA_CUDA_CHECK(cudaMemcpy(device.data(), bits.data(), device.bytes(), cudaMemcpyHostToDevice));
    return device;
}

class PreparedTc final : public PreparedAttention {
public:
    PreparedTc(const AttentionProblem& p, const float* Q, const float* K, const float* V,
               DType dtype, const TcTileShape& tile)
        : tile_(tile),
          q_(upload(Q, p.q_elements(), dtype, q_sign(p))),
          k_(upload(K, p.kv_elements(), dtype, 1.0f)),
          v_(upload(V, p.kv_elements(), dtype, 1.0f)),
          o_(static_cast<std::size_t>(p.q_elements())),
          lse_(static_cast<std::size_t>(p.lse_elements())) {
        args_.problem = p;
        args_.dtype = dtype;
        if (p.block_mask.active()) {
            const std::int64_t count = tile_count(p.seq_q, p.block_mask.block_q) *
                                       tile_count(p.seq_kv, p.block_mask.block_kv);
            mask_ = cuda::DeviceBuffer<std::uint8_t>(static_cast<std::size_t>(count));
            FA_CUDA_CHECK(cudaMemcpy(mask_.data(), p.block_mask.data, mask_.bytes(),
                                cudaMemcpyHostToDevice));
            args_.problem.block_mask.data = mask_.data();
        }
        args_.Q = q_.data();
        args_.K = k_.data();
        args_.V = v_.data();
        args_.O = o_.data();
        args_.lse = lse_.data();
        // Poisoned outputs (all-ones bytes are NaN): an element the kernel skips shows up.
        FA_CUDA_CHECK(cudaMemset(o_.data(), 0xFF, o_.bytes()));
        FA_CUDA_CHECK(cudaMemset(lse_.data(), 0xFF, lse_.bytes()));
    }

    void execute() override {
        tc_forward(args_, tile_);
        FA_CUDA_CHECK(cudaDeviceSynchronize());
    }

    void fetch(float* O, float* lse) override {
        require_array(O, "O");
        FA_CUDA_CHECK(cudaMemcpy(O, o_.data(), o_.bytes(), cudaMemcpyDeviceToHost));
        if (lse) FA_CUDA_CHECK(cudaMemcpy(lse, lse_.data(), lse_.bytes(), cudaMemcpyDeviceToHost));
    }

    // The kernel keeps everything in registers and shared memory: no working memory in HBM.
    std::size_t extra_bytes() const override { return 0; }

private:
    TcTileShape tile_;
    cuda::DeviceBuffer<std::uint16_t> q_, k_, v_;
    cuda::DeviceBuffer<float> o_, lse_;
    cuda::DeviceBuffer<std::uint8_t> mask_;
    TcDeviceArgs args_;
};

Backend make_backend(std::string name, std::string summary, std::optional<TcTileShape> tile) {
    Backend b;
    b.name = std::move(name);
    b.device = "cuda";
    b.summary = std::move(summary);
    b.dtypes = {DType::f16, DType::bf16};
    b.prepare = [tile](const AttentionProblem& p, const float* Q, const float* K, const float* V,
                       DType dtype) -> std::unique_ptr<PreparedAttention> {
        tc_check_problem(p, dtype);
        require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
        const TcTileShape shape = tile ? *tile : tc_tile_shapes(p.dim, dtype).front();
        return std::make_unique<PreparedTc>(p, Q, K, V, dtype, shape);
    };
    return b;
}

}  // namespace

Backend tc_backend() {
    return make_backend("cuda-tc",
                        "FlashAttention-2 on tensor cores: fp16/bf16 mma.sync, ldmatrix, cp.async "
                        "ring, fp32 softmax and output; d in {32, 64, 96, 128, 256}",
                        std::nullopt);
}

Backend tc_backend_with_tile(const TcTileShape& tile) {
    return make_backend("cuda-tc[" + tile.name() + "]", "cuda-tc with a fixed tile shape", tile);
}

}  // namespace flashattn::tc
