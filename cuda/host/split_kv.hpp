// cuda/host/split_kv.hpp — the host side of split-KV decoding for the tensor-core forwards
// (cuda-tc, cuda-fa3): how many chunks S a problem gets, the workspace its partial results
// need, and the launch of the combine kernel (cuda/stages/combine.cuh). docs/decoding.md teaches it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/array_layout.hpp"
#include "common/dtype.hpp"
#include "common/problem.hpp"
#include "cuda/host/workspace.hpp"

namespace flashattn::cuda {

// S for a launch of `query_tiles` x heads x batch CTAs, `ctas_per_sm` of which fit on one SM,
// over `key_tiles` key tiles: problem.kv_splits when the caller forced it (at most key_tiles),
// else choose_kv_splits (common/tiling.hpp) on the device's SM count, chunks of >= 4 tiles; with
// `fill_wave`, choose_kv_splits_filling_wave: one full wave of up to 32 chunks where each keeps
// >= 32 tiles (cuda-tc's decoding kernel; docs/decoding.md has what each form measured).
std::int64_t kv_splits_for(const AttentionProblem& p, std::int64_t query_tiles,
                           std::int64_t ctas_per_sm, std::int64_t key_tiles, bool fill_wave);

// The partial results of S chunks, S (O, LSE) pairs in fp32, cut from a device entry's workspace
// (cuda/host/workspace.hpp; a counting carver gives their bytes). Null pointers for S = 1.
struct SplitPartials {
    float* O = nullptr;
    float* lse = nullptr;
};
SplitPartials cut_split_partials(const AttentionProblem& p, std::int64_t S, WorkspaceCarver& w);

// Merges S partial results per row into O (rows x d, float32 or the inputs' 16-bit o_dtype) and
// LSE (rows, float32), queued on `stream`; d <= 256. With `problem` (rows = its B H N_q; its block
// mask, if any, on the device), rows whose scores all overflowed become NaN
// (cuda/stages/combine.cuh), and O's rows lie at `o_layout` (the problem's resolved layout; null:
// contiguous); without, the partials are merged as given into a contiguous O
// (flashattn.merge_partials).
void launch_combine(const float* O_partial, const float* lse_partial, std::int64_t S,
                    std::int64_t rows, std::int64_t d, void* O, DType o_dtype, float* lse,
                    void* stream, const AttentionProblem* problem = nullptr,
                    const ArrayLayout* o_layout = nullptr);

}  // namespace flashattn::cuda
