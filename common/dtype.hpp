// common/dtype.hpp — the precisions a backend computes its products in, and rounding to them.
//
// Inputs and outputs stay float32 at the interface (common/backend.hpp); f16/bf16 inputs are
// rounded to that precision first, so every backend of one precision sees the same values and
// the correctness rule's same-precision baseline (cpu/reference.hpp) sees them too.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashattn {

enum class DType { f32, f16, bf16 };

inline std::string to_string(DType t) {
    switch (t) {
        case DType::f32: return "f32";
        case DType::f16: return "f16";
        case DType::bf16: return "bf16";
    }
    return "?";
}

// "f32" | "f16" | "bf16"; throws std::invalid_argument for anything else.
inline DType parse_dtype(const std::string& s) {
    if (s == "f32") return DType::f32;
    if (s == "f16") return DType::f16;
    if (s == "bf16") return DType::bf16;
    throw std::invalid_argument("dtype = " + s + ": must be one of f32, f16, bf16");
}

namespace detail {

// IEEE binary16: 10 fraction bits, smallest normal 2^-14, subnormal step 2^-24, largest 65504.
inline float round_to_f16(float x) {
    if (x != x || std::isinf(x) || x == 0.0f) return x;
    int exponent = 0;
    std::frexp(x, &exponent);                   // |x| = f * 2^exponent, f in [0.5, 1)
    const int e = exponent - 1 < -14 ? -14 : exponent - 1;  // floor(log2|x|), clamped at subnormals
    const int ulp_exp = e - 10;
    const float r = std::ldexp(std::nearbyint(std::ldexp(x, -ulp_exp)), ulp_exp);  // ties to even
    if (std::fabs(r) > 65504.0f) return std::copysign(std::numeric_limits<float>::infinity(), x);
    return r;
}

// bfloat16: the upper 16 bits of a float, rounded to nearest even.
inline float round_to_bf16(float x) {
    if (x != x) return x;
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
}

}  // namespace detail

// Rounds to the nearest f16 / bf16 value (round-to-nearest-even), kept as float. f16 overflow goes
// to +-inf, as a real conversion does; NaN stays NaN.
inline float round_to_dtype(float x, DType t) {
    switch (t) {
        case DType::f32: return x;
        case DType::f16: return detail::round_to_f16(x);
        case DType::bf16: return detail::round_to_bf16(x);
    }
    return x;
}

inline void round_to_dtype(std::vector<float>& values, DType t) {
    if (t == DType::f32) return;
    for (float& x : values) x = round_to_dtype(x, t);
}

}  // namespace flashattn
