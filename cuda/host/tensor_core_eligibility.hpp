// cuda/host/tensor_core_eligibility.hpp — may a tensor-core kernel run this problem? Decided here,
// once, for every CUDA backend: cuda-tc (which has no other kernel: a problem outside its limits is
// refused) and the fp32 backends cuda-fa1 and cuda-fa2 (which fall back to their FFMA kernels).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "common/array_layout.hpp"
#include "common/config.hpp"

#include "common/problem.hpp"

namespace flashattn::cuda {

// The launch limits every mma.sync kernel shares: one grid row per head and one grid layer per
// batch entry (each at most 65535), and row indices within a head held in an int (at most 2^30
// rows). Returns an empty string when the problem fits, else why it does not.
std::string mma_grid_limits(const AttentionProblem& p);

// Whether a 3xTF32 kernel that does not look at its own inputs (cuda-fa1 v5, cuda-fa2's backward,
// and its forward on problems past the one-launch size) may compute this fp32 problem:
//   * the grid limits above;
//   * d >= 16. 3xTF32 carries ~22 of fp32's 24 mantissa bits per operand; at tiny d a score is
//     one or two unscaled products and the error reached 1.27x the 2x rule's bound at d = 1
//     (docs/cuda_fp32_notes.md), while from d = 6 it stays within the bound like cuda-standard's;
//     and d < 16 would do 4x+ padded work on the D = 64 tile anyway;
//   * every input finite: the tf32 split (cuda/ptx/tf32_mma.cuh) turns inf into NaN, and a masked
//     key's P = 0 times a NaN would be NaN, where the FFMA kernels leave masked keys out.
// (cuda-fa2's forward kernel on a small problem looks at what it splits and computes a tile it
// cannot carry with its FFMA code: cuda/fa2/kernel_tf32.cuh. It asks only tf32_shape_allowed.)
// The kernels' own limits (largest D, shared memory) are their host code's to check.
bool tf32_tensor_cores_allowed(const AttentionProblem& p, const float* Q, const float* K,
                               const float* V);

// The backward's (cuda-fa2's 3xTF32 backward): the same, with O and dO finite too (O through
// D = rowsum(dO o O) and dO as an operand both reach the split products).
bool tf32_backward_allowed(const AttentionProblem& p, const float* Q, const float* K,
                           const float* V, const float* O, const float* dO);

// The part of the test above that does not read the inputs: d >= 16 and the grid limits.
bool tf32_shape_allowed(const AttentionProblem& p);

// The device entries cannot look at their inputs without waiting for them (common/backend.hpp).
// So cuda-fa2's entries (the forward past its one-launch size, the backward) queue the
// finiteness test on the device, and both kernels behind it, each with a gate.
// queue_nonfinite_test is one launch of kNonfiniteSlots CTAs over all the arrays on `stream` (a
// cudaStream_t); CTA b writes flags[b], 1 where its share of the elements holds a NaN or inf and
// 0 where not. Every CTA writes its flag either way, so nothing has to zero the flags
// first: a memset would be one more operation queued per call, and a call's host time is counted
// in launches (docs/python.md). A gated kernel reads the flags first thing and returns at once
// unless they select it; the kernel not chosen costs a launch of CTAs that exit there.
inline constexpr int kNonfiniteSlots = 128;  // 128 ints: one 16-byte load for each lane of a warp
struct KernelGate {
    const int* nonfinite = nullptr;  // kNonfiniteSlots flags, 16-byte aligned; nullptr: open
    bool runs_on_nonfinite = false;  // the FFMA kernels: true; the tensor-core kernels: false
#if defined(__CUDACC__)
    // Warp-collective: every lane of the warp calls it (the kernels do, before anything else).
    __device__ bool closed() const {
        static_assert(kNonfiniteSlots == 32 * 4, "one int4 of flags per lane");
        if (nonfinite == nullptr) return false;
        const int4 f = reinterpret_cast<const int4*>(nonfinite)[threadIdx.x % 32];
        const bool found = __any_sync(0xffffffffu, (f.x | f.y | f.z | f.w) != 0);
        return found != runs_on_nonfinite;
    }
#endif
};
// The memory an array's values lie in: n floats from x, its first value to its last
// (span_elements, common/array_layout.hpp). A strided view's span also holds the values between
// its rows (of the tensor it was cut from); the test reads those too, and a NaN among them only
// sends the call to the FFMA kernels, which give the same answer more slowly.
struct FloatSpan {
    const float* x;
    std::int64_t n;
};
// A (batch, heads, rows, d) array at `layout` (default: contiguous; strides not negative, as the
// device entries check).
inline FloatSpan span_of(const float* x, const ArrayLayout& layout, std::int64_t batch,
                         std::int64_t heads, std::int64_t rows, std::int64_t d) {
    return {x, span_elements(layout, batch, heads, rows, d)};
}
// At most five spans. Spans that overlap (q, k and v viewed out of one projection) are tested as
// one (merged_ranges), so that each value is read once.
void queue_nonfinite_test(const std::vector<FloatSpan>& arrays, int* flags, void* stream);

}  // namespace flashattn::cuda
