// cuda/tc/backward.hpp — host interface of cuda-tc's backward kernel (cuda/tc/backward_ops.cuh):
// which problems and tile shapes it has, and the launch on device arrays. No CUDA types here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/backend.hpp"
#include "common/problem.hpp"

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

// Q (times q_sign), K, V and dO as 16-bit values of `dtype`; O and LSE of the forward as float;
// dQ, dK, dV float. D (B H N_q floats) is working memory; dq_turns (tc_backward_turn_count ints)
// too, used only when `deterministic`.
struct TcBackwardArgs {
    AttentionProblem problem;  // block_mask.data, if set, must point to device memory
    DType dtype = DType::f16;
    const void *Q = nullptr, *K = nullptr, *V = nullptr, *dO = nullptr;
    const float *O = nullptr, *lse = nullptr;
    float* D = nullptr;
    int* dq_turns = nullptr;
    float *dQ = nullptr, *dK = nullptr, *dV = nullptr;
    void* stream = nullptr;  // a cudaStream_t; nullptr for the default stream
};

// How many counters the deterministic mode needs (one per query tile and query head).
std::size_t tc_backward_turn_count(const AttentionProblem& p, const TcBackwardShape& shape);

// Throws std::invalid_argument for a missing array of `args` (dq_turns only when deterministic).
void require_backward_arrays(const TcBackwardArgs& args, bool deterministic);

// Algorithm 2 L4 and the zeroed sums, on args.stream: D = rowsum(dO o O) (from the 16-bit dO the
// products read), dQ = 0, and `turns` dQ turn counters = 0 (none when 0).
void queue_backward_prepass(const TcBackwardArgs& args, std::size_t turns);

// Queues D = rowsum(dO o O), dQ = 0 and the kernel on args.stream (asynchronous).
// `deterministic`: dQ's additions in a fixed order, the same bits on every run (slower; see
// docs/cuda_backward.md). Throws std::invalid_argument for an unsupported problem or shape,
// std::runtime_error for a CUDA failure.
void tc_backward(const TcBackwardArgs& args, const TcBackwardShape& shape, bool deterministic);

// A backward kernel on TcBackwardArgs: cuda-tc's (mma.sync, above) or cuda-fa3's (wgmma,
// cuda/fa3/backward.hpp). add_16bit_backward gives a Backend its backward entries around one:
// prepare_backward (16-bit uploads, poisoned dQ, dK, dV), the device entry and its workspace (D
// and, in deterministic mode, the dQ turn counters).
struct Kernel16Backward {
    const char* backend;                                          // named in messages
    void (*check)(const AttentionProblem&, DType);                // throws for what it cannot run
    std::size_t (*turn_count)(const AttentionProblem&, DType);    // deterministic mode's counters
    void (*run)(const TcBackwardArgs&, bool deterministic);       // queues D, dQ = 0, the kernel
};
void add_16bit_backward(Backend& b, const Kernel16Backward& kernel);

}  // namespace flashattn::tc
