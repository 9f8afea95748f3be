// cpu/cpu_backend.cpp — the wrapper that turns a CPU function into a Backend; see cpu_backend.hpp.
#include "cpu/cpu_backend.hpp"

#include <algorithm>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
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

// Runs `work` and returns the peak of WorkBuffer bytes it added. A form's WorkBuffers name their
// size when they fail; anything else that runs out of memory inside a form (an Eigen temporary, a
// std::vector) is reported with the backend's name and the working memory it held by then.
template <class Work>
std::size_t measure_workspace(const std::string& backend, Work&& work) {
    const std::size_t before = WorkspaceMeter::current();
    WorkspaceMeter::reset_peak();
    try {
        work();
    } catch (const std::bad_alloc&) {
        throw std::runtime_error("backend " + backend + ": out of memory while computing, with " +
                                 bytes_text(double(WorkspaceMeter::current() - before)) +
                                 " of working memory in use" + detail::address_space_note());
    }
    return WorkspaceMeter::peak() - before;
}

// What a prepared call holds from prepare to fetch, in floats: the outputs it writes before
// fetch copies them out (poisoned, so that an element a form forgets is seen), and for f16/bf16
// the rounded copies of the inputs. Checked up front (require_memory), with the same words when
// an allocation fails anyway, so that running out says how many bytes, for what.
struct PreparedMemory {
    double bytes;
    std::string what;
};

PreparedMemory forward_memory(const std::string& backend, const AttentionProblem& p,
                              DType dtype) {
    const double q = double(p.q_elements()), kv = double(p.kv_elements());
    const bool rounded = dtype != DType::f32;
    return {sizeof(float) * (q + double(p.lse_elements()) + (rounded ? q + 2 * kv : 0.0)),
            "backend " + backend + ": its O and LSE until fetched" +
                (rounded ? ", and Q, K, V rounded to " + to_string(dtype) : "")};
}

PreparedMemory backward_memory(const std::string& backend, const AttentionProblem& p,
                               DType dtype) {
    const double q = double(p.q_elements()), kv = double(p.kv_elements());
    const bool rounded = dtype != DType::f32;
    return {sizeof(float) * (q + 2 * kv + (rounded ? 3 * q + 2 * kv : 0.0)),
            "backend " + backend + ": its dQ, dK, dV until fetched" +
                (rounded ? ", and Q, K, V, O, dO rounded to " + to_string(dtype) : "")};
}

// make() after require_memory(need), with std::bad_alloc from make() reported in the same words.
template <class Make>
auto prepare_within(const PreparedMemory& need, Make&& make) {
    require_memory(need.bytes, need.what);
    try {
        return make();
    } catch (const std::bad_alloc&) {
        throw out_of_memory(need.bytes, need.what);
    }
}

class PreparedCpu final : public PreparedAttention {
public:
    PreparedCpu(std::string name, CpuAttentionFn fn, const CpuTilesFn& tiles,
                const AttentionProblem& p, const float* Q, const float* K, const float* V,
                DType dtype)
        : name_(std::move(name)),
          fn_(std::move(fn)),
          tiles_(tiles ? tiles(p) : std::string()),
          problem_(p),
          Q_(Q, p.q_elements(), dtype),
          K_(K, p.kv_elements(), dtype),
          V_(V, p.kv_elements(), dtype),
          O_(poisoned(p.q_elements())),
          lse_(poisoned(p.lse_elements())) {}

    void execute() override {
        extra_bytes_ = measure_workspace(name_, [&] {
            kv_splits_ = fn_(problem_, Q_.get(), K_.get(), V_.get(), O_.data(), lse_.data());
        });
    }

    void fetch(float* O, float* lse) override {
        require_array(O, "O");
        std::copy(O_.begin(), O_.end(), O);
        if (lse) std::copy(lse_.begin(), lse_.end(), lse);
    }

    std::size_t extra_bytes() const override { return extra_bytes_; }
    std::string tiles() const override { return tiles_; }
    std::int64_t kv_splits() const override { return kv_splits_; }

private:
    std::string name_;
    CpuAttentionFn fn_;
    std::string tiles_;
    AttentionProblem problem_;
    RoundedInput Q_, K_, V_;
    std::vector<float> O_, lse_;
    std::size_t extra_bytes_ = 0;
    std::int64_t kv_splits_ = 1;
};

// The backward rounds the 16-bit tensors of a mixed-precision pipeline (Q, K, V, O, dO) and keeps
// LSE in float32, as the forward produced it.
class PreparedCpuBackward final : public PreparedBackward {
public:
    PreparedCpuBackward(std::string name, CpuBackwardFn fn, const AttentionProblem& p,
                        const BackwardInputs& in, DType dtype)
        : name_(std::move(name)),
          fn_(std::move(fn)),
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
            name_, [&] { fn_(problem_, in, dQ_.data(), dK_.data(), dV_.data()); });
    }

    void fetch(float* dQ, float* dK, float* dV) override {
        require_array(dQ, "dQ"), require_array(dK, "dK"), require_array(dV, "dV");
        std::copy(dQ_.begin(), dQ_.end(), dQ);
        std::copy(dK_.begin(), dK_.end(), dK);
        std::copy(dV_.begin(), dV_.end(), dV);
    }

    std::size_t extra_bytes() const override { return extra_bytes_; }

private:
    std::string name_;
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
    b.prepare = [name = b.name, forward, tiles](
                    const AttentionProblem& p, const float* Q, const float* K, const float* V,
                    DType dtype) -> std::unique_ptr<PreparedAttention> {
        validate(p);
        require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
        return prepare_within(forward_memory(name, p, dtype), [&] {
            return std::make_unique<PreparedCpu>(name, forward, tiles, p, Q, K, V, dtype);
        });
    };
    if (backward)
        b.prepare_backward = [name = b.name, backward](
                                 const AttentionProblem& p, const BackwardInputs& in,
                                 DType dtype) -> std::unique_ptr<PreparedBackward> {
            validate(p);
            require_backward_inputs(in);
            return prepare_within(backward_memory(name, p, dtype), [&] {
                return std::make_unique<PreparedCpuBackward>(name, backward, p, in, dtype);
            });
        };
    return b;
}

}  // namespace flashattn
