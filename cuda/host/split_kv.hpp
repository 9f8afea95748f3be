// cuda/host/split_kv.hpp — the host side of split-KV decoding for the tensor-core forwards
// (cuda-tc, cuda-fa3): how many chunks S a problem gets, the workspace its partial results
// need, and the launch of the combine kernel (cuda/stages/combine.cuh). docs/decoding.md teaches it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/problem.hpp"

namespace flashattn::cuda {

// S for a launch of `query_tiles` x heads x batch CTAs, `ctas_per_sm` of which fit on one SM,
// over `key_tiles` key tiles: problem.kv_splits when the caller forced it (at most key_tiles),
// else choose_kv_splits (common/tiling.hpp) on the device's SM count, chunks of >= 4 tiles.
std::int64_t kv_splits_for(const AttentionProblem& p, std::int64_t query_tiles,
                           std::int64_t ctas_per_sm, std::int64_t key_tiles);

// Bytes of the partial results of S chunks: S (O, LSE) pairs in fp32; 0 for S = 1.
std::size_t split_workspace_bytes(const AttentionProblem& p, std::int64_t S);

// Where the partial O and LSE live inside a workspace of split_workspace_bytes(p, S).
struct SplitWorkspace {
    float* O_partial = nullptr;
    float* lse_partial = nullptr;
};
SplitWorkspace split_workspace(const AttentionProblem& p, std::int64_t S, void* workspace);

// Merges S partial results per row into O and LSE (float32, the problem's shapes), queued on
// `stream`. rows = B H N_q; d <= 256.
void launch_combine(const float* O_partial, const float* lse_partial, std::int64_t S,
                    std::int64_t rows, std::int64_t d, float* O, float* lse, void* stream);

}  // namespace flashattn::cuda
