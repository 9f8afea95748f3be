// cpu/backend.hpp — the one interface every form (CPU or CUDA) is reached through.
//
// A backend prepares a problem once (copies inputs where it needs them, allocates outputs), then
// `execute()` is the part that is timed, and `fetch()` copies O and LSE back to host memory.
// Tests, `flashattn run`, `bench` and `demo` all go through this interface, so every backend is
// checked and measured the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/problem.hpp"

namespace flashattn {

// Precision the backend computes its products in. Inputs and outputs stay float32 at the
// interface; f16/bf16 inputs are rounded to that precision first (see round_to_dtype).
enum class DType { f32, f16, bf16 };

std::string to_string(DType t);
DType parse_dtype(const std::string& s);  // "f32" | "f16" | "bf16"; throws std::invalid_argument

// Round every value to the nearest f16 / bf16 value (round-to-nearest-even), kept as float.
// f16 overflow goes to +-inf, as a real conversion does; NaN stays NaN.
float round_to_dtype(float x, DType t);
void round_to_dtype(std::vector<float>& values, DType t);

class PreparedAttention {
public:
    virtual ~PreparedAttention() = default;
    // Computes O (and LSE) for the prepared inputs. Blocks until the result is complete.
    virtual void execute() = 0;
    // Copies the result of the last execute() to host arrays; lse may be nullptr.
    virtual void fetch(float* O, float* lse) = 0;
    // Peak working memory of the last execute(), in bytes, beyond inputs and outputs.
    virtual std::size_t extra_bytes() const = 0;
};

struct Backend {
    std::string name;     // as on the command line: "scalar", "cuda-fa2", ...
    std::string device;   // "cpu" or "cuda"
    std::string summary;  // one line for `flashattn backends --verbose` and --help
    std::vector<DType> dtypes;
    // Throws std::invalid_argument for a problem this backend cannot run (naming the reason).
    std::function<std::unique_ptr<PreparedAttention>(const AttentionProblem&, const float* Q,
                                                     const float* K, const float* V, DType)>
        prepare;

    bool supports(DType t) const;
};

// Convenience: prepare, execute once, fetch. O holds q_elements(), lse lse_elements() floats.
void run_backend(const Backend& backend, const AttentionProblem& problem, const float* Q,
                 const float* K, const float* V, float* O, float* lse, DType dtype = DType::f32);

// CPU forms are plain functions of this shape; cpu_backend() wraps one into a Backend whose
// prepare() rounds inputs to the dtype, and whose execute() measures WorkBuffer peak.
using CpuAttentionFn = std::function<void(const AttentionProblem&, const float* Q, const float* K,
                                          const float* V, float* O, float* lse)>;
Backend cpu_backend(std::string name, std::string summary, CpuAttentionFn fn);

}  // namespace flashattn
