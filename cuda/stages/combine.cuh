// cuda/stages/combine.cuh — split-KV's second kernel: S partial results per query row, (O_s, LSE_s)
// over disjoint chunks of the keys, merged into the row's O and LSE. The rule is
// common/online_softmax.hpp's (merged_lse, partial_weight: Algorithm 1's update applied to whole
// chunks); this kernel only lays the work out.
//
// One warp per row. The S partials of a row lie far apart (a whole partial O between them), so
// a loop that loads one partial's LSE, then its weight, then its O row waits for memory S times
// in a row. Instead the loads are issued together: the lanes stage up to kStagedParts LSEs of the row in
// shared memory at once (one load each), every lane folds them from there in the fixed order
// s = 0, 1, ... (merge_partials, so the merged LSE is merged_lse's), the lanes turn them into
// weights (partial_weight) the same way, and lane l sums columns l, l + 32, ... of the partial
// rows, kUnrollParts partials per step so that their loads are in flight together. Partial s of
// row r sits at O_partial[(s rows + r) d ...] and lse_partial[s rows + r], the layout the forward
// kernels write (KernelParams::O_partial).
//
// With the problem given (a split forward's combine), a merged row with no weight (LSE = -inf)
// that has a visible key had every score overflow: it becomes NaN (scores_overflowed), as the
// unsplit kernels' epilogue does; an empty chunk alone is not that, so the chunks do not test it.
#pragma once

#include <cstdint>

#include "common/online_softmax.hpp"
#include "common/problem.hpp"

namespace flashattn::mma {

constexpr int kCombineWarps = 4;       // rows per CTA
constexpr int kCombineMaxDim = 8 * 32;  // 8 columns per lane: d <= 256
constexpr int kStagedParts = 256;       // LSEs (then weights) of one row in shared memory at once
constexpr int kUnrollParts = 8;         // partial O rows whose loads are in flight together

__global__ void __launch_bounds__(32 * kCombineWarps)
    combine_partials_kernel(const float* O_partial, const float* lse_partial, int S,
                            std::int64_t rows, int d, float* O, float* lse,
                            const AttentionProblem problem, bool mark_overflow) {
    __shared__ float staged[kCombineWarps][kStagedParts];
    const std::int64_t row = std::int64_t(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
    const int lane = int(threadIdx.x) % 32;
    if (row >= rows) return;
    float* const part = staged[threadIdx.x / 32];

    // The merged LSE: S LSEs folded in order, kStagedParts at a time.
    float lse_row = -INFINITY;
    for (int s0 = 0; s0 < S; s0 += kStagedParts) {
        const int n = min(kStagedParts, S - s0);
        for (int s = lane; s < n; s += 32) part[s] = lse_partial[(s0 + s) * rows + row];
        __syncwarp();
        for (int s = 0; s < n; ++s) lse_row = merge_partials(lse_row, part[s]).lse;
        __syncwarp();  // before the next chunk overwrites `part`
    }
    // The merged row as a softmax state (m, l) = (LSE, 1), or l = 0 when no part had weight.
    const SoftmaxState merged{lse_row, lse_row == -INFINITY ? 0.0f : 1.0f};
    if (mark_overflow && scores_overflowed(merged, [&] {
            return problem.row_has_visible_key(row % problem.seq_q);
        }))
        lse_row = NAN;  // every weight becomes NaN, and so does O

    float sum[kCombineMaxDim / 32] = {};
    for (int s0 = 0; s0 < S; s0 += kStagedParts) {
        const int n = min(kStagedParts, S - s0);
        for (int s = lane; s < n; s += 32)
            part[s] = partial_weight(lse_partial[(s0 + s) * rows + row], lse_row);
        __syncwarp();
#pragma unroll kUnrollParts
        for (int s = 0; s < n; ++s) {
            const float w = part[s];
            const float* O_s = O_partial + ((s0 + s) * rows + row) * d;
#pragma unroll
            for (int k = 0; k < kCombineMaxDim / 32; ++k)
                if (lane + 32 * k < d) sum[k] += w * O_s[lane + 32 * k];
        }
        __syncwarp();
    }
#pragma unroll
    for (int k = 0; k < kCombineMaxDim / 32; ++k)
        if (lane + 32 * k < d) O[row * d + lane + 32 * k] = sum[k];
    if (lane == 0) lse[row] = lse_row;
}

}  // namespace flashattn::mma
