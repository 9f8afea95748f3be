// common/backend.hpp — the one interface every form (CPU or CUDA) is reached through.
//
// A backend prepares a problem once (copies inputs where it needs them, allocates outputs), then
// `execute()` is the part that is timed, and `fetch()` copies the results back to host memory.
// Tests, `flashattn run`, `bench` and `demo` all go through this interface, so every backend is
// checked and measured the same way. The backward pass (paper Section 3.1 "Recomputation",
// Algorithm 4) has the same three steps: prepare_backward, execute, fetch.
//
// Host-side only; no Eigen, OpenMP or CUDA runtime: cpu/ and cuda/ both implement it, and the
// registry (common/registry.hpp) lists what a build has.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/array_layout.hpp"
#include "common/dtype.hpp"
#include "common/problem.hpp"

namespace flashattn {

class PreparedAttention {
public:
    virtual ~PreparedAttention() = default;
    // Computes O (and LSE) for the prepared inputs. Blocks until the result is complete.
    virtual void execute() = 0;
    // Copies the result of the last execute() to host arrays; lse may be nullptr.
    virtual void fetch(float* O, float* lse) = 0;
    // Peak working memory of the last execute(), in bytes, beyond inputs and outputs.
    virtual std::size_t extra_bytes() const = 0;
    // The tiles this run uses, in the paper's names ("Br = 64, Bc = 32"); empty for a form that
    // does not tile (Algorithm 0). `flashattn run` prints it.
    virtual std::string tiles() const { return {}; }
    // Split-KV (decoding): the number of key chunks S the last execute() merged (1 = no split).
    // `bench --json` reports it as "splits".
    virtual std::int64_t kv_splits() const { return 1; }
};

// What the backward pass reads: the forward's inputs, its outputs O and LSE (L = m + log l, the
// statistics the forward saves instead of P), and dO = dLoss/dO. Shapes as in problem.hpp;
// dO has the shape of O. All host arrays of float32.
struct BackwardInputs {
    const float* Q = nullptr;
    const float* K = nullptr;
    const float* V = nullptr;
    const float* O = nullptr;
    const float* lse = nullptr;
    const float* dO = nullptr;
};

class PreparedBackward {
public:
    virtual ~PreparedBackward() = default;
    // Computes dQ, dK, dV for the prepared inputs. Blocks until the result is complete.
    virtual void execute() = 0;
    // Copies the gradients of the last execute() to host arrays: dQ has the shape of Q, dK and
    // dV the shape of K and V (summed over the query heads of a GQA group).
    virtual void fetch(float* dQ, float* dK, float* dV) = 0;
    // Peak working memory of the last execute(), in bytes, beyond inputs and outputs.
    virtual std::size_t extra_bytes() const = 0;
};

// How a backend treats explicit tile sizes (AttentionProblem::block_q/block_kv, sram_floats). One
// meaning only: they are tile sizes; a block mask's granularity is its own (BlockMask).
enum class TileSizes {
    none,    // the form does not tile (Algorithm 0): there is nothing for them to change
    caller,  // honored: scalar, omp, cuda-fa1 (Algorithm 1 line 1 on M, or Br/Bc as given)
    own,     // compiled tiles of the backend's choosing: explicit ones are refused
};

// Arrays already on the device (CUDA), for a backend that can compute on them in place: nothing is
// copied to or from the host. Q, K, V (and dO) hold values of `dtype` (float32, or the 16-bit
// f16 / bf16 patterns for cuda-tc, whose Q must then be q_sign * Q as in cuda/host/half_bits.hpp); O,
// LSE and the gradients are float32.
//
// Asynchronous, like a PyTorch operator: the backend queues its kernels on `stream` (a
// cudaStream_t; nullptr for the default stream) behind the work already there and returns without
// waiting; it allocates nothing and copies nothing to or from the host. Everything it needs
// beyond inputs and outputs comes from the caller:
//   - workspace: at least device_workspace_bytes(problem, dtype) bytes (the backward's own
//     function for DeviceBackward) of device memory, 256-byte aligned, alive until the stream
//     has run the queued work (PyTorch's caching allocator guarantees this for memory allocated
//     on the same stream);
//   - block_mask: the problem's block mask (problem.block_mask, a host array, is still what is
//     validated) copied to the device, or nullptr without one.
// Launch failures are thrown (std::runtime_error); a failure inside a kernel surfaces at the
// caller's next synchronization, as it does in PyTorch.
//
// Arrays are contiguous unless their layouts say otherwise, and O is float32 unless o_dtype says
// `dtype`: only a backend with Backend::device_layouts takes other layouts, and only one with
// Backend::device_o_dtype a 16-bit O (the others refuse them: require_contiguous_layouts,
// require_default_layouts). Reading Q, K, V where they lie and writing O in the inputs' dtype
// spares a PyTorch caller a copy of each (python/flashattn, _cuda_forward).
struct DeviceForward {
    const void *Q = nullptr, *K = nullptr, *V = nullptr;
    void* O = nullptr;  // float32, or o_dtype
    float* lse = nullptr;  // always contiguous float32
    void* stream = nullptr;
    DType dtype = DType::f32;
    void* workspace = nullptr;
    std::size_t workspace_bytes = 0;
    const std::uint8_t* block_mask = nullptr;
    ArrayLayout q_layout, k_layout, v_layout, o_layout;
    DType o_dtype = DType::f32;
};
// The backward's arrays, likewise: contiguous, O and the gradients float32, unless the layouts,
// o_dtype (the forward's O as given) and grad_dtype (dQ, dK, dV as written) say otherwise.
struct DeviceBackward {
    const void *Q = nullptr, *K = nullptr, *V = nullptr, *dO = nullptr;
    const void* O = nullptr;  // float32, or o_dtype
    const float* lse = nullptr;  // always contiguous float32
    void *dQ = nullptr, *dK = nullptr, *dV = nullptr;  // float32, or grad_dtype
    void* stream = nullptr;
    DType dtype = DType::f32;
    void* workspace = nullptr;
    std::size_t workspace_bytes = 0;
    const std::uint8_t* block_mask = nullptr;
    ArrayLayout q_layout, k_layout, v_layout, o_layout, do_layout, dq_layout, dk_layout, dv_layout;
    DType o_dtype = DType::f32, grad_dtype = DType::f32;
};

struct Backend {
    using PrepareForward = std::function<std::unique_ptr<PreparedAttention>(
        const AttentionProblem&, const float* Q, const float* K, const float* V, DType)>;
    using PrepareBackward = std::function<std::unique_ptr<PreparedBackward>(
        const AttentionProblem&, const BackwardInputs&, DType)>;

    std::string name;     // as on the command line: "scalar", "cuda-fa2", ...
    std::string device;   // "cpu" or "cuda"
    std::string summary;  // one line for `flashattn backends --verbose` and --help
    std::vector<DType> dtypes;
    TileSizes tile_sizes = TileSizes::none;
    // Throws std::invalid_argument for a problem this backend cannot run (naming the reason).
    PrepareForward prepare;
    // Empty for a backend without a backward pass.
    PrepareBackward prepare_backward;
    // Device-resident arrays of one of `dtypes` (block_mask.data stays a host array); empty where
    // the backend has no such entry. Used by the Python package for CUDA tensors.
    std::function<void(const AttentionProblem&, const DeviceForward&)> run_device;
    std::function<void(const AttentionProblem&, const DeviceBackward&)> run_backward_device;
    // The workspace the device entries need (DeviceForward::workspace); empty = none.
    std::function<std::size_t(const AttentionProblem&, DType)> device_workspace_bytes;
    std::function<std::size_t(const AttentionProblem&, DType)> device_backward_workspace_bytes;
    // The device entries read and write their arrays at the layouts DeviceForward and
    // DeviceBackward give, and O and the gradients in the inputs' dtype when asked.
    bool device_layouts = false;
    // The forward's device entry writes O in the inputs' dtype when DeviceForward::o_dtype asks
    // (contiguous, unless device_layouts).
    bool device_o_dtype = false;

    bool supports(DType t) const {
        return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end();
    }
    bool has_backward() const { return static_cast<bool>(prepare_backward); }
};

// Throws std::invalid_argument when the problem asks for tile sizes the backend does not take
// (TileSizes::own). The registry (common/registry.cpp) checks this before every prepare.
inline void require_tile_choice(const Backend& backend, const AttentionProblem& p) {
    if (backend.tile_sizes != TileSizes::own || (p.block_q == 0 && p.sram_floats == 0)) return;
    throw std::invalid_argument(
        "backend = " + backend.name +
        ": chooses its own tiles, so explicit block sizes or an SRAM size M cannot apply (they "
        "are honored by scalar, omp and cuda-fa1; a block mask's block size is given on its own, "
        "--mask-block-q/--mask-block-kv)");
}

// Convenience: prepare, execute once, fetch. O holds q_elements(), lse lse_elements() floats.
inline void run_backend(const Backend& backend, const AttentionProblem& problem, const float* Q,
                        const float* K, const float* V, float* O, float* lse,
                        DType dtype = DType::f32) {
    require_array(O, "O");
    auto prepared = backend.prepare(problem, Q, K, V, dtype);
    prepared->execute();
    prepared->fetch(O, lse);
}

// Throws std::invalid_argument when a forward's arrays are not contiguous: a backend without
// Backend::device_layouts reads Q, K, V and writes O that way.
inline void require_contiguous_layouts(const std::string& backend, const DeviceForward& a) {
    const bool strided = !a.q_layout.is_default() || !a.k_layout.is_default() ||
                         !a.v_layout.is_default() || !a.o_layout.is_default();
    if (strided)
        throw std::invalid_argument(
            "backend = " + backend + ": its device entry reads contiguous Q, K, V and writes a "
            "contiguous O (strided arrays are cuda-fa3's and cuda-fa2's)");
}

// Throws std::invalid_argument when a backward's arrays are not the contiguous ones, with a
// float32 O and float32 gradients, that a backend without Backend::device_layouts reads and
// writes (cuda-tc's).
inline void require_default_layouts(const std::string& backend, const DeviceBackward& a) {
    const bool strided = !a.q_layout.is_default() || !a.k_layout.is_default() ||
                         !a.v_layout.is_default() || !a.o_layout.is_default() ||
                         !a.do_layout.is_default() || !a.dq_layout.is_default() ||
                         !a.dk_layout.is_default() || !a.dv_layout.is_default();
    if (strided || a.o_dtype != DType::f32 || a.grad_dtype != DType::f32)
        throw std::invalid_argument(
            "backend = " + backend + ": its backward device entry reads contiguous arrays and a "
            "float32 O and writes contiguous float32 gradients (strided arrays are cuda-fa3's and "
            "cuda-fa2's, 16-bit O and gradients cuda-fa3's)");
}

// Throws std::invalid_argument naming the backend when it has no backward pass.
inline void require_backward(const Backend& backend) {
    if (!backend.has_backward())
        throw std::invalid_argument("backend = " + backend.name + ": has no backward pass");
}

// Convenience for the backward: prepare, execute once, fetch dQ, dK, dV.
inline void run_backward(const Backend& backend, const AttentionProblem& problem,
                         const BackwardInputs& in, float* dQ, float* dK, float* dV,
                         DType dtype = DType::f32) {
    require_backward(backend);
    require_array(dQ, "dQ"), require_array(dK, "dK"), require_array(dV, "dV");
    auto prepared = backend.prepare_backward(problem, in, dtype);
    prepared->execute();
    prepared->fetch(dQ, dK, dV);
}

// Throws std::invalid_argument for a missing array of the backward's inputs.
inline void require_backward_inputs(const BackwardInputs& in) {
    require_array(in.Q, "Q"), require_array(in.K, "K"), require_array(in.V, "V");
    require_array(in.O, "O"), require_array(in.lse, "LSE"), require_array(in.dO, "dO");
}

}  // namespace flashattn
