// cpu/cpu_backend.cpp — the wrapper that turns a CPU function into a Backend; see cpu_backend.hpp.
#include "cpu/cpu_backend.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "cpu/workspace.hpp"

namespace flashattn {
namespace {

// A dtype-rounded copy of `count` floats, or nothing for f32 (the caller's array is read as is).
class RoundedInput {
public:
    RoundedInput(const float* data, std::int64_t count, DType dtype) : data_(data) {
        if (dtype == DType::f32) return;
        copy_.assign(data, data + count);
        round_to_dtype(copy_, dtype);
        data_ = copy_.data();
    }
    RoundedInput(RoundedInput&&) = delete;  // data_ may point into copy_
    const float* get() const { return data_; }

private:
    const float* data_;
    std::vector<float> copy_;
};

std::vector<float> poisoned(std::int64_t count) {
    return std::vector<float>(static_cast<std::size_t>(count),
                              std::numeric_limits<float>::quiet_NaN());
}

// Runs `work` and returns the peak of WorkBuffer bytes it added.
template <class Work>
std::size_t measure_workspace(Work&& work) {
    const std::size_t before = WorkspaceMeter::current();
    WorkspaceMeter::reset_peak();
    work();
    return WorkspaceMeter::peak() - before;
}

class PreparedCpu final : public PreparedAttention {
public:
    PreparedCpu(CpuAttentionFn fn, const CpuTilesFn& tiles, const AttentionProblem& p,
                const float* Q, const float* K, const float* V, DType dtype)
        : fn_(std::move(fn)),
          tiles_(tiles ? tiles(p) : std::string()),
          problem_(p),
          Q_(Q, p.q_elements(), dtype),
          K_(K, p.kv_elements(), dtype),
          V_(V, p.kv_elements(), dtype),
          O_(poisoned(p.q_elements())),
          lse_(poisoned(p.lse_elements())) {}

    void execute() override {
        extra_bytes_ = measure_workspace(
            [&] { fn_(problem_, Q_.get(), K_.get(), V_.get(), O_.data(), lse_.data()); });
    }

    void fetch(float* O, float* lse) override {
        require_array(O, "O");
        std::copy(O_.begin(), O_.end(), O);
        if (lse) std::copy(lse_.begin(), lse_.end(), lse);
    }

    std::size_t extra_bytes() const override { return extra_bytes_; }
    std::string tiles() const override { return tiles_; }

private:
    CpuAttentionFn fn_;
    std::string tiles_;
    AttentionProblem problem_;
    RoundedInput Q_, K_, V_;
    std::vector<float> O_, lse_;
    std::size_t extra_bytes_ = 0;
};

// The backward rounds the 16-bit tensors of a mixed-precision pipeline (Q, K, V, O, dO) and keeps
// LSE in float32, as the forward produced it.
class PreparedCpuBackward final : public PreparedBackward {
public:
    PreparedCpuBackward(CpuBackwardFn fn, const AttentionProblem& p, const BackwardInputs& in,
                        DType dtype)
        : fn_(std::move(fn)),
          problem_(p),
          Q_(in.Q, p.q_elements(), dtype),
          K_(in.K, p.kv_elements(), dtype),
          V_(in.V, p.kv_elements(), dtype),
          O_(in.O, p.q_elements(), dtype),
          dO_(in.dO, p.q_elements(), dtype),
          lse_(in.lse),
          dQ_(poisoned(p.q_elements())),
          dK_(poisoned(p.kv_elements())),
          dV_(poisoned(p.kv_elements())) {}

    void execute() override {
        const BackwardInputs in{Q_.get(), K_.get(), V_.get(), O_.get(), lse_, dO_.get()};
        extra_bytes_ = measure_workspace(
            [&] { fn_(problem_, in, dQ_.data(), dK_.data(), dV_.data()); });
    }

    void fetch(float* dQ, float* dK, float* dV) override {
        require_array(dQ, "dQ"), require_array(dK, "dK"), require_array(dV, "dV");
        std::copy(dQ_.begin(), dQ_.end(), dQ);
        std::copy(dK_.begin(), dK_.end(), dK);
        std::copy(dV_.begin(), dV_.end(), dV);
    }

    std::size_t extra_bytes() const override { return extra_bytes_; }

private:
    CpuBackwardFn fn_;
    AttentionProblem problem_;
    RoundedInput Q_, K_, V_, O_, dO_;
    const float* lse_;
    std::vector<float> dQ_, dK_, dV_;
    std::size_t extra_bytes_ = 0;
};

}  // namespace

Backend cpu_backend(std::string name, std::string summary, CpuAttentionFn forward,
                    CpuTilesFn tiles, CpuBackwardFn backward) {
    Backend b;
    b.name = std::move(name);
    b.device = "cpu";
    b.summary = std::move(summary);
    b.dtypes = {DType::f32, DType::f16, DType::bf16};
    b.tile_sizes = tiles ? TileSizes::caller : TileSizes::none;
    b.prepare = [forward, tiles](const AttentionProblem& p, const float* Q, const float* K,
                                 const float* V, DType dtype) -> std::unique_ptr<PreparedAttention> {
        validate(p);
        require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
        return std::make_unique<PreparedCpu>(forward, tiles, p, Q, K, V, dtype);
    };
    if (backward)
        b.prepare_backward = [backward](const AttentionProblem& p, const BackwardInputs& in,
                                        DType dtype) -> std::unique_ptr<PreparedBackward> {
            validate(p);
            require_backward_inputs(in);
            return std::make_unique<PreparedCpuBackward>(backward, p, in, dtype);
        };
    return b;
}

}  // namespace flashattn
