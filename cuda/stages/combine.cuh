// cuda/stages/combine.cuh — split-KV's second kernel: S partial results per query row, (O_s, LSE_s)
// over disjoint chunks of the keys, merged into the row's O and LSE. The rule is
// common/online_softmax.hpp's (lse_from_max_and_sum, partial_weight: Algorithm 1's update applied
// to whole chunks); this kernel only lays the work out.
//
// One CTA per row, its kCombineWarps warps each taking a quarter of the row's columns, and the S
// parts of the row spread over the lanes of each warp. The parts lie far apart in memory (a
// whole partial O between two of a row's), so a loop that loads one part's LSE, folds it in,
// then loads the next, waits for memory S times in a row (docs/decoding.md measures what that
// cost). Here lane l reads parts l, l + 32, ... at once: the maximum of their LSEs and the sum
// of e^(LSE_s - max) are two shuffle trees (lanes_max, lanes_sum), the merged LSE is
// lse_from_max_and_sum (every warp computes it, the same bits), each lane turns its parts' LSEs
// into weights (partial_weight), and the weights go to every lane by shuffle while each lane sums
// its columns of the S partial rows, the loads of 32 parts (two arrays of kUnrollParts) issued
// before any is used.
// The first 32 parts' O values (16 a round, the second round only where S > 16) are asked for
// together with the LSEs, before the LSE is merged: at S <= 32 (every split the heuristic picks)
// the merge then waits for memory once, not once for the LSEs and again for O, nor once more for
// parts 16 to 31; the combine ends every split step, so each wait adds to the step
// (docs/decoding.md measures it).
// A row per CTA rather than per warp: a decoding step has few rows (32 for B = 1, H_kv = 8,
// N_q = 4 packed), which four rows per CTA would put on a handful of SMs. The order of every sum
// is fixed: the same bits on every run. Partial s of row r sits at O_partial[(s rows + r) d ...]
// and lse_partial[s rows + r], the layout the forward kernels write (KernelParams::O_partial).
//
// O is written as float32 or in the inputs' 16-bit type (o_dtype, rounded once from the float32
// sum), at o_layout (row r is row r % o_rows of head (r / o_rows) % o_heads of batch entry
// r / (o_rows o_heads): contiguous for cuda-tc, a caller's strides for cuda-fa3's device entry): a
// split forward's O needs no cast or copy afterwards.
//
// With the problem given (a split forward's combine), a merged row with no weight (LSE = -inf)
// that has a visible key had every score overflow: it becomes NaN (scores_overflowed), as the
// unsplit kernels' epilogue does; an empty chunk alone is not that, so the chunks do not test it.
#pragma once

#include <cstdint>

#include "common/array_layout.hpp"
#include "common/online_softmax.hpp"
#include "common/dtype.hpp"
#include "common/problem.hpp"
#include "cuda/ptx/dependent_launch.cuh"
#include "cuda/stages/output_store.cuh"
#include "cuda/stages/warp_softmax.cuh"

namespace flashattn::mma {

constexpr int kCombineWarps = 4;    // warps per row, each a quarter of its columns
constexpr int kCombineMaxDim = 256;  // d

// kCols: columns per lane, d <= 32 kCols kCombineWarps (1 up to d = 128, 2 up to 256). Warp w
// takes columns [32 kCols w, 32 kCols (w + 1)); the loads in flight, kUnrollParts rows of the
// parts, take kUnrollParts kCols registers.
template <int kCols>
__global__ void __launch_bounds__(32 * kCombineWarps)
    combine_partials_kernel(const float* O_partial, const float* lse_partial, int S,
                            std::int64_t rows, int d, void* O, ArrayLayout o_layout,
                            std::int64_t o_heads, std::int64_t o_rows, DType o_dtype, float* lse,
                            const AttentionProblem problem, bool mark_overflow) {
    // Launched right behind the split forward (programmatic dependent launch): this CTA may
    // start while the forward's last CTAs still run, and waits here for all of their partials.
    cuda::wait_for_prerequisite_grid();
    // And the next decoding step's kernel, launched the same way, may start as this one ends: it
    // too waits for this grid before it touches memory.
    cuda::allow_dependent_launch();
    const std::int64_t row = blockIdx.x;
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int col0 = 32 * kCols * warp + lane;  // this lane's columns: col0 + 32 k, k < kCols
    auto lse_of = [&](int s) { return lse_partial[s * rows + row]; };
    // Parts first .. first + kUnrollParts - 1 of this lane's columns (0 past S or d), all loads
    // issued before any value is used.
    constexpr int kUnrollParts = 16;
    static_assert(32 % kUnrollParts == 0, "a round of parts lies within one block of 32 weights");
    auto load_parts = [&](float (&x)[kUnrollParts][kCols], int first) {
#pragma unroll
        for (int u = 0; u < kUnrollParts; ++u) {
            const float* O_s = O_partial + ((first + u) * rows + row) * d;
#pragma unroll
            for (int k = 0; k < kCols; ++k)
                x[u][k] = first + u < S && col0 + 32 * k < d ? O_s[col0 + 32 * k] : 0.0f;
        }
    };

    // The first 32 parts' LSEs (one per lane) and their O values, asked for together (the header
    // says why): parts 0 to 15 in x, 16 to 31 in x_next where S > 16.
    const float lse_first = lane < S ? lse_of(lane) : -INFINITY;
    float x[kUnrollParts][kCols], x_next[kUnrollParts][kCols] = {};
    load_parts(x, 0);
    if (S > kUnrollParts) load_parts(x_next, kUnrollParts);

    // The merged LSE: max over the parts, then the sum of their exponentials below it.
    float m = lse_first;
    for (int s = lane + 32; s < S; s += 32) m = nan_max(m, lse_of(s));
    m = cuda::lanes_max<32>(m);
    float sum_of_exp = exp_shifted(lse_first, m);
    for (int s = lane + 32; s < S; s += 32) sum_of_exp += exp_shifted(lse_of(s), m);
    float lse_row = lse_from_max_and_sum(m, cuda::lanes_sum<32>(sum_of_exp));
    // The merged row as a softmax state (m, l) = (LSE, 1), or l = 0 when no part had weight.
    const SoftmaxState merged{lse_row, lse_row == -INFINITY ? 0.0f : 1.0f};
    if (mark_overflow && scores_overflowed(merged, [&] {
            return problem.row_has_visible_key(row % problem.seq_q);
        }))
        lse_row = NAN;  // every weight becomes NaN, and so does O

    // O = sum_s w_s O_s, kUnrollParts parts at a time. Part s's weight is computed by lane s % 32
    // (32 parts at a time, from s = 0, 32, ...) and goes to every lane by shuffle.
    static_assert(32 * kCols * kCombineWarps <= kCombineMaxDim, "d <= 256");
    float sum[kCols] = {};
    auto add_parts = [&](const float (&parts)[kUnrollParts][kCols], int s1, float my_weight) {
#pragma unroll
        for (int u = 0; u < kUnrollParts; ++u) {
            // Part s1 + u's weight, from its lane (every lane takes part in the shuffle).
            const float from_lane = __shfl_sync(0xffffffffu, my_weight, (s1 + u) % 32);
            const float w = s1 + u < S ? from_lane : 0.0f;
#pragma unroll
            for (int k = 0; k < kCols; ++k) sum[k] += w * parts[u][k];
        }
    };
    float my_weight = lane < S ? partial_weight(lse_first, lse_row) : 0.0f;
    add_parts(x, 0, my_weight);
    if (S > kUnrollParts) add_parts(x_next, kUnrollParts, my_weight);
    // Past 32 parts (S forced above the heuristic's 32), rounds of 32 the same way: both halves'
    // loads issued before the weights are computed and the sums run.
    for (int s1 = 32; s1 < S; s1 += 32) {
        load_parts(x, s1);
        if (s1 + kUnrollParts < S) load_parts(x_next, s1 + kUnrollParts);
        my_weight = s1 + lane < S ? partial_weight(lse_of(s1 + lane), lse_row) : 0.0f;
        add_parts(x, s1, my_weight);
        if (s1 + kUnrollParts < S) add_parts(x_next, s1 + kUnrollParts, my_weight);
    }
    const std::int64_t O_row = o_layout.row_start(row, o_heads, o_rows);
#pragma unroll
    for (int k = 0; k < kCols; ++k)
        if (col0 + 32 * k < d) store_output(O, o_dtype, O_row + col0 + 32 * k, sum[k]);
    if (threadIdx.x == 0) lse[row] = lse_row;
}

}  // namespace flashattn::mma
