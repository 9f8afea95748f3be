// cuda/host/backward16.hpp — what the 16-bit tensor-core backwards (cuda-tc's on mma.sync,
// cuda-fa3's on wgmma) share on the host: their arguments, the checks of the arrays, the D pass and
// zeroed sums before the kernel, and the Backend entries around a kernel. No CUDA types here.
#pragma once

#include <cstddef>

#include "common/array_layout.hpp"
#include "common/backend.hpp"
#include "common/problem.hpp"

namespace flashattn::cuda {

// Q (times q_sign), K, V and dO as 16-bit values of `dtype`; O of the forward as float32 (or
// o_dtype) and LSE as float; dQ, dK, dV float32 (or grad_dtype). D (B H N_q floats) is working
// memory; dq_turns (the kernel's turn_count ints) too, used only when `deterministic`. The kernels
// add dQ into dQ_sum (float32, contiguous): dQ itself where dQ is contiguous float32, else working
// memory that queue_backward_postpass writes to dQ.
struct Backward16Args {
    AttentionProblem problem;  // block_mask.data, if set, must point to device memory
    DType dtype = DType::f16;
    const void *Q = nullptr, *K = nullptr, *V = nullptr, *dO = nullptr;
    const void* O = nullptr;
    const float* lse = nullptr;
    float* D = nullptr;
    int* dq_turns = nullptr;
    float* dQ_sum = nullptr;
    void *dQ = nullptr, *dK = nullptr, *dV = nullptr;
    void* stream = nullptr;  // a cudaStream_t; nullptr for the default stream
    // Where the arrays lie (resolved layouts) and the types of O and the gradients: contiguous and
    // float32 (contiguous_layouts) except through cuda-fa3's device entry (DeviceBackward).
    ArrayLayout q_at, k_at, v_at, o_at, do_at, dq_at, dk_at, dv_at;
    DType o_dtype = DType::f32, grad_dtype = DType::f32;

    void contiguous_layouts() {
        const AttentionProblem& p = problem;
        q_at = o_at = do_at = dq_at = ArrayLayout::contiguous(p.heads, p.seq_q, p.dim);
        k_at = v_at = dk_at = dv_at = ArrayLayout::contiguous(p.heads_kv, p.seq_kv, p.dim);
    }
};

// Throws std::invalid_argument for a missing array of `args` (dq_turns only when deterministic).
void require_backward_arrays(const Backward16Args& args, bool deterministic);

// Algorithm 2 L4 and the zeroed sums, on args.stream: D = rowsum(dO o O) (from the 16-bit dO the
// products read), dQ_sum = 0 (in the same pass), and `turns` dQ turn counters = 0 (none when 0).
void queue_backward_prepass(const Backward16Args& args, std::size_t turns);

// After the kernel, on args.stream: dQ written from dQ_sum where the two differ
// (cuda/stages/backward_postpass.cuh); nothing otherwise.
void queue_backward_postpass(const Backward16Args& args);

// A backward kernel on Backward16Args: cuda-tc's (mma.sync, cuda/tc/backward.hpp) or cuda-fa3's
// (wgmma, cuda/fa3/backward.hpp). add_16bit_backward gives a Backend its backward entries around one:
// prepare_backward (16-bit uploads, poisoned dQ, dK, dV), the device entry and its workspace (D
// and, in deterministic mode, the dQ turn counters).
struct Kernel16Backward {
    const char* backend;                                          // named in messages
    void (*check)(const AttentionProblem&, DType);                // throws for what it cannot run
    std::size_t (*turn_count)(const AttentionProblem&, DType);    // deterministic mode's counters
    void (*run)(const Backward16Args&, bool deterministic);       // queues D, dQ = 0, the kernel
    // The kernel reads Q, K, V, dO at any TMA-readable layout and writes dK, dV at theirs
    // (Backend::device_layouts): cuda-fa3. The device entry then also takes a 16-bit O and
    // 16-bit or strided gradients (dQ through the post-pass).
    bool layouts = false;
};
void add_16bit_backward(Backend& b, const Kernel16Backward& kernel);

}  // namespace flashattn::cuda
