// cpu/backend.cpp — dtype rounding, run_backend and the wrapper that turns a CPU function into a
// Backend; see backend.hpp.
#include "cpu/backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "cpu/workspace.hpp"

namespace flashattn {

std::string to_string(DType t) {
    switch (t) {
        case DType::f32: return "f32";
        case DType::f16: return "f16";
        case DType::bf16: return "bf16";
    }
    return "?";
}

DType parse_dtype(const std::string& s) {
    if (s == "f32") return DType::f32;
    if (s == "f16") return DType::f16;
    if (s == "bf16") return DType::bf16;
    throw std::invalid_argument("dtype = " + s + ": must be one of f32, f16, bf16");
}

namespace {

// IEEE binary16: 10 fraction bits, smallest normal 2^-14, subnormal step 2^-24, largest 65504.
float round_to_f16(float x) {
    if (x != x || std::isinf(x) || x == 0.0f) return x;
    int exponent = 0;
    std::frexp(x, &exponent);              // |x| = f * 2^exponent, f in [0.5, 1)
    const int e = std::max(exponent - 1, -14);  // floor(log2|x|), clamped at the subnormal range
    const float ulp_exp = static_cast<float>(e - 10);
    const float r = std::ldexp(std::nearbyint(std::ldexp(x, -static_cast<int>(ulp_exp))),
                               static_cast<int>(ulp_exp));  // ties to even
    if (std::fabs(r) > 65504.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
    return r;
}

// bfloat16: the upper 16 bits of a float, rounded to nearest even.
float round_to_bf16(float x) {
    if (x != x) return x;
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
}

}  // namespace

float round_to_dtype(float x, DType t) {
    switch (t) {
        case DType::f32: return x;
        case DType::f16: return round_to_f16(x);
        case DType::bf16: return round_to_bf16(x);
    }
    return x;
}

void round_to_dtype(std::vector<float>& values, DType t) {
    if (t == DType::f32) return;
    for (float& x : values) x = round_to_dtype(x, t);
}

bool Backend::supports(DType t) const {
    return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end();
}

void run_backend(const Backend& backend, const AttentionProblem& problem, const float* Q,
                 const float* K, const float* V, float* O, float* lse, DType dtype) {
    require_array(O, "O");
    auto prepared = backend.prepare(problem, Q, K, V, dtype);
    prepared->execute();
    prepared->fetch(O, lse);
}

namespace {

class PreparedCpu final : public PreparedAttention {
public:
    PreparedCpu(CpuAttentionFn fn, const AttentionProblem& p, const float* Q, const float* K,
                const float* V, DType dtype)
        : fn_(std::move(fn)), problem_(p), Q_(Q), K_(K), V_(V) {
        if (dtype != DType::f32) {  // keep rounded copies; f32 reads the caller's arrays
            rounded_q_.assign(Q, Q + p.q_elements());
            rounded_k_.assign(K, K + p.kv_elements());
            rounded_v_.assign(V, V + p.kv_elements());
            round_to_dtype(rounded_q_, dtype);
            round_to_dtype(rounded_k_, dtype);
            round_to_dtype(rounded_v_, dtype);
            Q_ = rounded_q_.data();
            K_ = rounded_k_.data();
            V_ = rounded_v_.data();
        }
        // Poisoned outputs: an element the form forgets to write shows up as NaN.
        O_.assign(p.q_elements(), std::numeric_limits<float>::quiet_NaN());
        lse_.assign(p.lse_elements(), std::numeric_limits<float>::quiet_NaN());
    }

    void execute() override {
        const std::size_t before = WorkspaceMeter::current();
        WorkspaceMeter::reset_peak();
        fn_(problem_, Q_, K_, V_, O_.data(), lse_.data());
        extra_bytes_ = WorkspaceMeter::peak() - before;
    }

    void fetch(float* O, float* lse) override {
        require_array(O, "O");
        std::copy(O_.begin(), O_.end(), O);
        if (lse) std::copy(lse_.begin(), lse_.end(), lse);
    }

    std::size_t extra_bytes() const override { return extra_bytes_; }

private:
    CpuAttentionFn fn_;
    AttentionProblem problem_;
    const float* Q_;
    const float* K_;
    const float* V_;
    std::vector<float> rounded_q_, rounded_k_, rounded_v_;
    std::vector<float> O_, lse_;
    std::size_t extra_bytes_ = 0;
};

}  // namespace

Backend cpu_backend(std::string name, std::string summary, CpuAttentionFn fn) {
    Backend b;
    b.name = std::move(name);
    b.device = "cpu";
    b.summary = std::move(summary);
    b.dtypes = {DType::f32, DType::f16, DType::bf16};
    b.prepare = [fn](const AttentionProblem& p, const float* Q, const float* K, const float* V,
                     DType dtype) -> std::unique_ptr<PreparedAttention> {
        validate(p);
        require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
        return std::make_unique<PreparedCpu>(fn, p, Q, K, V, dtype);
    };
    return b;
}

}  // namespace flashattn
