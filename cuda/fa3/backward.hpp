// cuda/fa3/backward.hpp — host interface of cuda-fa3's backward kernel
// (cuda/fa3/backward_kernel.cuh): which problems it runs, and the launch on device arrays, with
// the arguments every 16-bit backward takes (cuda/host/backward16.hpp). No CUDA types here.
#pragma once

#include <cstddef>

#include "common/backend.hpp"
#include "common/problem.hpp"
#include "cuda/host/backward16.hpp"

namespace flashattn::fa3 {

// Throws std::invalid_argument naming the field for a problem (or dtype) the backward cannot run:
// fp16/bf16, d = 64, 128 or 256.
void fa3_check_backward_problem(const AttentionProblem& p, DType dtype);

// How many counters the deterministic mode needs (one per query tile and query head).
std::size_t fa3_backward_turn_count(const AttentionProblem& p, DType dtype);

// Queues D = rowsum(dO o O), dQ = 0 and the kernel on args.stream (asynchronous). Q, K, V and dO
// must be 16-byte aligned (TMA). `deterministic`: dQ's additions in a fixed order.
void fa3_backward(const cuda::Backward16Args& args, bool deterministic);

}  // namespace flashattn::fa3
