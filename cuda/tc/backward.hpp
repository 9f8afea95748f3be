// cuda/tc/backward.hpp — host interface of cuda-tc's backward kernel (cuda/tc/backward_ops.cuh):
// which problems and tile shapes it has, and the launch on device arrays. No CUDA types here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/backend.hpp"
#include "common/problem.hpp"
#include "cuda/host/backward16.hpp"

namespace flashattn::tc {

// One CTA: `warps` warps of 16 keys each (Bc = 16 warps), query tiles of Br rows, and whether a
// warp keeps its K_j and V_j fragments in registers for the whole loop.
struct TcBackwardShape {
    int warps = 4;
    int Br = 64;
    bool kv_in_registers = true;

    int Bc() const { return 16 * warps; }
    std::string name() const;  // e.g. "Bc64w4-Br64-kvreg"
    bool operator==(const TcBackwardShape& o) const {
        return warps == o.warps && Br == o.Br && kv_in_registers == o.kv_in_registers;
    }
};

// The head dimensions the backward is compiled for (d = 256 is forward-only: dK_j and dV_j of a
// warp's 16 keys would take 256 registers per thread).
const std::vector<std::int64_t>& tc_backward_head_dims();

// The shapes compiled for (dim, dtype); the first is the default, the others are there to be
// compared (FLASHATTN_VARIANT=cuda-tc-backward=<name>). Empty for an unsupported dim.
std::vector<TcBackwardShape> tc_backward_shapes(std::int64_t dim, DType dtype);

// Throws std::invalid_argument naming the field for a problem (or dtype) the backward cannot run.
void tc_check_backward_problem(const AttentionProblem& p, DType dtype);

// The arguments: cuda/host/backward16.hpp's (shared with cuda-fa3's backward).
using TcBackwardArgs = cuda::Backward16Args;

// How many counters the deterministic mode needs (one per query tile and query head).
std::size_t tc_backward_turn_count(const AttentionProblem& p, const TcBackwardShape& shape);

// Queues D = rowsum(dO o O), dQ = 0 and the kernel on args.stream (asynchronous).
// `deterministic`: dQ's additions in a fixed order, the same bits on every run (slower; see
// docs/cuda_backward.md). Throws std::invalid_argument for an unsupported problem or shape,
// std::runtime_error for a CUDA failure.
void tc_backward(const TcBackwardArgs& args, const TcBackwardShape& shape, bool deterministic);

}  // namespace flashattn::tc
