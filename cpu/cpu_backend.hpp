// cpu/cpu_backend.hpp — turns a CPU form (a plain function) into a Backend (common/backend.hpp).
//
// The wrapper does what every CPU form would otherwise repeat: validate the problem, round the
// inputs to the requested precision, poison the outputs (NaN, so an element a form forgets to
// write is seen), and measure the form's working memory (cpu/workspace.hpp) around execute().
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/backend.hpp"

namespace flashattn {

// A CPU forward: O and lse hold q_elements() and lse_elements() floats. Returns the number of
// split-KV key chunks it merged (PreparedAttention::kv_splits(); 1 for a form that does not split).
using CpuAttentionFn = std::function<std::int64_t(
    const AttentionProblem&, const float* Q, const float* K, const float* V, float* O, float* lse)>;
// A CPU backward: dQ, dK, dV hold q_elements(), kv_elements(), kv_elements() floats.
using CpuBackwardFn = std::function<void(const AttentionProblem&, const BackwardInputs&,
                                         float* dQ, float* dK, float* dV)>;

// The tiles a tiled CPU form uses for a problem, in words ("Br = 3, Bc = 5"; PreparedAttention::
// tiles()).
using CpuTilesFn = std::function<std::string(const AttentionProblem&)>;

// A Backend on device "cpu" for every dtype. A form with `tiles` tiles and honors explicit tile
// sizes (TileSizes::caller); one without does not tile (TileSizes::none). `backward` may be empty
// (no backward pass).
Backend cpu_backend(std::string name, std::string summary, CpuAttentionFn forward,
                    CpuTilesFn tiles = {}, CpuBackwardFn backward = {});

// The CPU forms of this build: standard, scalar, omp (cpu/backends.cpp).
std::vector<Backend> cpu_backends();

}  // namespace flashattn
