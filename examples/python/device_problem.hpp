// examples/python/device_problem.hpp — what both C++ halves of the Python package
// (module.cpp, the pybind11 module; torch_ops.cpp, the operators' CUDA implementations) need to
// describe a call of a device entry: the problem of a (B, H, H_kv, N_q, N_kv, d) shape, the
// softmax scale as the library's float, and the backend that has the device entry.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/registry.hpp"

namespace flashattn::python {

// The softmax scale as the library's float: NaN stays NaN (the default 1/sqrt(d)); a value float32
// cannot hold is refused with the value as given (a plain cast would turn 1e39 into inf, and the
// message would then show inf instead of what the caller wrote).
inline float checked_scale(double scale) {
    if (std::isnan(scale)) return std::numeric_limits<float>::quiet_NaN();
    if (!(std::fabs(scale) <= double(std::numeric_limits<float>::max()))) {
        char given[32];  // the shortest spelling that reads back as the same double: "1e+39"
        *std::to_chars(given, given + sizeof given - 1, scale).ptr = '\0';
        throw std::invalid_argument(std::string("scale = ") + given +
                                    ": must be finite and at most 3.4028235e+38 in magnitude "
                                    "(float32's largest value)");
    }
    return static_cast<float>(scale);
}

// The device entries' shapes: (B, H, H_kv, N_q, N_kv, d).
struct Shape {
    std::int64_t B, H, Hkv, Nq, Nkv, d;
};

inline AttentionProblem device_problem(const Shape& s, bool causal, double scale) {
    AttentionProblem p;
    p.batch = s.B, p.heads = s.H, p.heads_kv = s.Hkv, p.seq_q = s.Nq, p.seq_kv = s.Nkv,
    p.dim = s.d;
    p.causal = causal;
    p.scale = checked_scale(scale);
    return p;
}

// The backend `name`, which must have a device entry (of its backward pass, for `backward`).
inline const Backend& device_backend(const std::string& name, bool backward) {
    const Backend& b = find_backend(name);
    if (backward ? !b.run_backward_device : !b.run_device)
        throw std::invalid_argument("backend = " + name + ": takes no device arrays" +
                                    (backward ? " in its backward pass" : "") +
                                    " (cuda-fa2 does in float32, cuda-tc and cuda-fa3 (forward) "
                                    "in f16/bf16)");
    return b;
}

}  // namespace flashattn::python
