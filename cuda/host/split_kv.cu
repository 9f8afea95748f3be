// cuda/host/split_kv.cu — see split_kv.hpp.
#include "cuda/host/split_kv.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/tiling.hpp"
#include "cuda/host/check.hpp"
#include "cuda/host/dependent_launch.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/stages/combine.cuh"

namespace flashattn::cuda {

std::int64_t kv_splits_for(const AttentionProblem& p, std::int64_t query_tiles,
                           std::int64_t ctas_per_sm, std::int64_t key_tiles, bool fill_wave) {
    if (p.kv_splits > 0) return std::clamp<std::int64_t>(p.kv_splits, 1, std::max<std::int64_t>(1, key_tiles));
    const std::int64_t slots = std::int64_t{device_limits().sm_count} * std::max<std::int64_t>(1, ctas_per_sm);
    const std::int64_t work_items = query_tiles * p.heads * p.batch;
    // Chunks of at least 4 key tiles. With fill_wave, where they hold 32 or more, one full wave of
    // CTAs, up to 32 chunks: the combine's lanes read the LSEs of 32 parts in one round
    // (cuda/stages/combine.cuh), and S = 33 was slower than 32 (docs/decoding.md, "S, the chunks").
    return fill_wave ? choose_kv_splits_filling_wave(work_items, slots, key_tiles, 4, 32, 32)
                     : choose_kv_splits(work_items, slots, key_tiles, 4);
}

SplitPartials cut_split_partials(const AttentionProblem& p, std::int64_t S, WorkspaceCarver& w) {
    if (S <= 1) return {};
    return {w.take<float>(std::size_t(S) * std::size_t(p.q_elements())),
            w.take<float>(std::size_t(S) * std::size_t(p.lse_elements()))};
}

void launch_combine(const float* O_partial, const float* lse_partial, std::int64_t S,
                    std::int64_t rows, std::int64_t d, void* O, DType o_dtype, float* lse,
                    void* stream, const AttentionProblem* problem, const ArrayLayout* o_layout) {
    if (d < 1 || d > mma::kCombineMaxDim)
        throw std::invalid_argument("dim = " + std::to_string(d) +
                                    ": the merge of partial results takes d in [1, 256]");
    if (rows == 0 || S == 0) return;
    if (rows > std::int64_t{0x7fffffff})
        throw std::invalid_argument("rows = " + std::to_string(rows) +
                                    ": the merge of partial results takes at most 2^31 - 1 rows");
    // O's rows: the problem's heads of N_q rows at o_layout, or one contiguous block of rows.
    const std::int64_t o_heads = problem ? problem->heads : 1, o_rows = problem ? problem->seq_q : rows;
    const ArrayLayout at = o_layout && problem ? *o_layout : ArrayLayout::contiguous(o_heads, o_rows, d);
    // One CTA per row; a column per lane and warp up to d = 128, two beyond.
    auto kernel = d <= 128 ? mma::combine_partials_kernel<1> : mma::combine_partials_kernel<2>;
    // Launched right behind the split forward (cuda/host/dependent_launch.hpp): the CTAs start
    // while its last CTAs run and wait in the kernel for its partials, so the launch's latency is
    // hidden behind that kernel's tail.
    launch_overlapping_previous(kernel, dim3(static_cast<unsigned>(rows)),
                                dim3(32 * mma::kCombineWarps), 0, static_cast<cudaStream_t>(stream),
                                O_partial, lse_partial, int(S), rows, int(d), O, at, o_heads,
                                o_rows, o_dtype, lse, problem ? *problem : AttentionProblem{},
                                problem != nullptr);
}

}  // namespace flashattn::cuda
