// cuda/fa2/backend.cu — cuda-fa2: FlashAttention-2 (Dao 2023, arXiv 2307.08691, Algorithm 1) in
// float32, the host side: which kernel and tile configuration runs a problem, and the backend.
// The kernels: cuda/fa2/kernel_ffma.cuh (FFMA, v3) and cuda/fa2/kernel_tf32.cuh (tensor cores, v4);
// how each version was measured: docs/cuda_fp32_notes.md.
//
// Two kernels (PreparedFa2 and the device entry choose alike, so that both give the same bits):
//   * v4, the default for 16 <= d <= 128: both products on tensor cores in 3xTF32
//     (cuda/fa2/kernel_tf32.cuh; cuda/ptx/tf32_mma.cuh explains why that is fp32-accurate), with
//     the register-level softmax of cuda/stages/mma_stages.cuh. d is padded to D = 64 or 128.
//     Each k-step's mma result is added to S and O with an fp32 add: the tensor core truncates the
//     sums it forms, and longer mma chains broke the tests' 2x rule. It cannot take every input
//     (a NaN or an inf; cuda/ptx/tf32_mma.cuh says which): on a small problem
//     (inspects_own_inputs) it looks at them itself and computes a query tile that holds one with
//     the FFMA kernel's code, in one launch; on a larger one it runs only where a test of the
//     inputs found them finite (on the host, or on the device: queue_nonfinite_test, then both
//     kernels behind its flags).
//   * v3, the FFMA kernel (cuda/fa2/kernel_ffma.cuh): where tf32_tensor_cores_allowed
//     (cuda/host/tensor_core_eligibility.hpp) says no on a larger problem, and d > 128. d is
//     padded to D = 64, 128 or 256.
//   FLASHATTN_VARIANT=cuda-fa2=ffma forces v3, =tf32 v4, =<name> one configuration (kVariants).
// Any N >= 1 on both.
// Tiles, the fastest of the compiled configurations as measured (kVariants below; the timings
// are in docs/cuda_fp32_notes.md):
//   v3  D = 64:  Br x Bc = 128 x 32, 256 threads, 2 blocks per SM
//       D = 128: Br x Bc = 128 x 64, 512 threads, 1 block per SM (16 warps)
//       D = 256: Br x Bc =  64 x 64, 256 threads
//   v4  D = 64:  Br x Bc = 128 x 64, 8 warps
//       D = 128: Br x Bc = 128 x 64, 8 warps
// Blocks of one head are consecutive (K/V reuse in L2); inside a head the last query block runs
// first (under the causal mask it sees the most keys).
//
// Weaknesses: v3 is plain FP32 FMAs, latency-bound at 8-16 warps per SM. v4 does three tensor-core
// products per product and splits every operand as it reads it (ALU work beside the mma's), and
// keeps 8 warps per SM at d = 128 (registers). d = 1..63 does the work of D = 64. D = 256 needs
// ~214 KB of shared memory per block, which Hopper has and Ampere (163 KB) does not: the backend
// says so instead of launching.
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/fa2/backend.hpp"
#include "cuda/fa2/kernel_ffma.cuh"
#include "cuda/fa2/kernel_tf32.cuh"
#include "cuda/host/prepared.hpp"
#include "cuda/host/tensor_core_eligibility.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/host/workspace.hpp"

namespace flashattn::cuda {
namespace {

using fa2::Fa2Config;
using fa2::launch_fa2;

// The compiled configurations. The default for d is the first tensor-core one whose D covers d
// where tf32_tensor_cores_allowed() allows it, else the first FFMA one; FLASHATTN_VARIANT picks
// another (the tuning knob of cuda/tools/gpu_check.sh; docs/cuda_fp32_notes.md records which won).
struct Fa2Variant {
    const char* name;
    const char* kind;  // "tf32" (the 3xTF32 kernel: finite inputs, cuda-tc's grid limits) or "ffma"
    int max_dim;
    std::size_t smem_bytes;
    // (problem, Q, K, V, where their rows lie, O, where its rows lie, LSE, gate, inspect: the
    // 3xTF32 kernel looks at its own inputs, stream)
    void (*launch)(const AttentionProblem&, const float*, const float*, const float*,
                   const QkvLayouts&, float*, const ArrayLayout&, float*, KernelGate, bool,
                   cudaStream_t);
};
template <class C>
constexpr Fa2Variant variant(const char* name) {
    return {name, "ffma", C::D, C::SMEM_BYTES, &launch_fa2<C>};
}
template <class C>
constexpr Fa2Variant tf32_variant(const char* name) {
    return {name, "tf32", C::D, C::SMEM_BYTES, &launch_fa2_tf32<C>};
}
// Every one of them is checked by tests/test_cuda.cpp. The first entry for each D and kernel is
// its default. Tensor cores (v4), Tf32Tile<D, warps (Br = 16 warps), Bc, CTAs per SM>:
const Fa2Variant kVariants[] = {
    tf32_variant<Tf32Tile<64, 8, 64, 1>>("d64_tf32_128x64"),
    tf32_variant<Tf32Tile<64, 4, 32, 3>>("d64_tf32_64x32"),
    tf32_variant<Tf32Tile<128, 8, 64, 1>>("d128_tf32_128x64"),
    tf32_variant<Tf32Tile<128, 8, 32, 1>>("d128_tf32_128x32"),
    tf32_variant<Tf32Tile<128, 4, 32, 2>>("d128_tf32_64x32"),
// FP32 FMAs (v1-v3):       D   Br  Bc  threads  blocks/SM  TM
    variant<Fa2Config<64, 128, 32, 256, 2>>("d64_128x32_2b"),
    variant<Fa2Config<64, 128, 64, 256, 1>>("d64_128x64"),
    variant<Fa2Config<64, 128, 64, 512, 1>>("d64_128x64_t512"),
    variant<Fa2Config<64, 64, 32, 128, 4>>("d64_64x32_t128_4b"),
    variant<Fa2Config<128, 128, 64, 512, 1>>("d128_128x64_t512"),
    variant<Fa2Config<128, 128, 32, 256, 1>>("d128_128x32"),
    variant<Fa2Config<128, 128, 64, 256, 1>>("d128_128x64"),
    variant<Fa2Config<128, 64, 32, 128, 2>>("d128_64x32_t128_2b"),
    variant<Fa2Config<256, 64, 64, 256, 1>>("d256_64x64"),
};

// FLASHATTN_VARIANT=cuda-fa2=... (cuda/host/variants.hpp): "tf32" (the default) or "ffma" picks the
// first configuration of that kernel whose D covers d, a configuration's name picks that one. A
// tensor-core configuration runs only where tf32_tensor_cores_allowed() allows it and d <= 128;
// a request that nothing covering the problem answers gets the FFMA default (the FFMA kernels
// cover every d up to 256).
const Fa2Variant& choose_variant(std::int64_t dim, bool tensor_cores) {
    const auto runs = [&](const Fa2Variant& v) {
        return v.max_dim >= dim && (tensor_cores || std::string(v.kind) != "tf32");
    };
    std::string wanted = requested_variant("cuda-fa2");
    if (wanted.empty()) wanted = "tf32";
    bool named = false, answered = false;
    for (const Fa2Variant& v : kVariants)
        if (wanted == v.name || wanted == v.kind) named = true, answered = answered || runs(v);
    if (named && !answered) wanted = "ffma";
    return cuda::choose_variant("cuda-fa2", wanted, kVariants, runs,
                                "dim = " + std::to_string(dim));
}

// Throws std::invalid_argument when the variant's shared memory exceeds this device's.
void require_fits(const Fa2Variant& v, const AttentionProblem& p) {
    const std::size_t have = device_limits().smem_per_block_optin;
    if (v.smem_bytes > have)
        throw std::invalid_argument("dim = " + std::to_string(p.dim) + ": cuda-fa2's d <= " +
                                    std::to_string(v.max_dim) + " kernel needs " +
                                    std::to_string(v.smem_bytes) +
                                    " bytes of shared memory per block; this device allows " +
                                    std::to_string(have));
}

// Whether the 3xTF32 kernel looks at its own inputs (one launch) rather than running behind a test
// of them (three launches on the device: the test, and both kernels behind its flags). Looking
// costs the kernel 4-7% of its time; the test costs a pass over Q, K and V and ~3.6 us of GPU time
// for the two extra launches, and a PyTorch call two launches of host time. Up to 2^30 FLOPs
// (forward_flops: a kernel of at most ~60 us on an H200) the GPU pays about the same either way
// and one launch returns sooner; past it the test is the cheaper (docs/cuda_fp32_notes.md, "One
// launch").
bool inspects_own_inputs(const AttentionProblem& p) {
    return p.forward_flops() <= double(std::int64_t{1} << 30);
}

// Whether the device entry's default for this problem is the tensor-core kernel behind the
// finiteness test on the device.
bool tested_on_device(const AttentionProblem& p) {
    return std::string(choose_variant(p.dim, tf32_shape_allowed(p)).kind) == "tf32" &&
           !inspects_own_inputs(p);
}

// The device entry's workspace: the finiteness test's kNonfiniteSlots flags, where the test runs.
int* cut_forward_workspace(const AttentionProblem& p, WorkspaceCarver& w) {
    return tested_on_device(p) ? w.take<int>(kNonfiniteSlots) : nullptr;
}

}  // namespace

std::vector<Fa2VariantInfo> fa2_variants() {
    std::vector<Fa2VariantInfo> list;
    for (const Fa2Variant& v : kVariants) list.push_back({v.name, v.max_dim});
    return list;
}

namespace {

class PreparedFa2 final : public PreparedCuda {
public:
    PreparedFa2(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                DType dtype)
        : PreparedCuda("cuda-fa2", p, Q, K, V, dtype),
          inspects_(inspects_own_inputs(p)),
          variant_(choose_variant(p.dim, inspects_ ? tf32_shape_allowed(p)
                                                   : tf32_tensor_cores_allowed(p, Q, K, V))) {
        require_fits(variant_, p);
    }

    void execute() override {
        const QkvLayouts at = QkvLayouts::contiguous(problem_);
        variant_.launch(problem_, Q_.data(), K_.data(), V_.data(), at, O_.data(), at.q,
                        lse_.data(), {}, inspects_, nullptr);
        synchronize();
    }

    std::string tiles() const override {
        return std::string("configuration ") + variant_.name + " (Br x Bc in its name)";
    }

private:
    const bool inspects_;
    const Fa2Variant& variant_;
};

}  // namespace

Backend cuda_fa2_backend() {
    Backend b = make_cuda_backend<PreparedFa2>(
        "cuda-fa2",
        "FlashAttention-2 in fp32: Q tile resident, K/V streamed (cp.async); "
        "tensor cores (3xTF32) for 16 <= d <= 128, FFMA register micro-tiles otherwise",
        TileSizes::own);
    add_cuda_fa2_backward(b);
    b.device_layouts = true;  // float32 in and out: O and the gradients are written in it
    // The device entry: the same kernels on the caller's device arrays, queued on the caller's
    // stream (common/backend.hpp). The host cannot see whether the inputs are finite without
    // waiting: on a small problem the tensor-core kernel looks at them itself; on a larger one
    // both kernels are queued behind a test on the device (queue_nonfinite_test) and its flags in
    // the workspace let one of them run.
    b.device_workspace_bytes = [](const AttentionProblem& p, DType) {
        WorkspaceCarver counter;
        cut_forward_workspace(p, counter);
        return counter.bytes();
    };
    b.run_device = [](const AttentionProblem& problem, const DeviceForward& a) {
        require_array(a.Q, "Q"), require_array(a.K, "K"), require_array(a.V, "V");
        require_array(a.O, "O"), require_array(a.lse, "LSE");
        if (a.o_dtype != DType::f32)
            throw std::invalid_argument("o_dtype = " + to_string(a.o_dtype) +
                                        ": cuda-fa2 writes a float32 O");
        if (a.dtype != DType::f32)
            throw std::invalid_argument("dtype = " + to_string(a.dtype) +
                                        ": cuda-fa2 computes in float32 only (cuda-tc runs f16/bf16)");
        const AttentionProblem p = with_device_mask(problem, a.block_mask);
        const auto* Q = static_cast<const float*>(a.Q);
        const auto* K = static_cast<const float*>(a.K);
        const auto* V = static_cast<const float*>(a.V);
        auto* O = static_cast<float*>(a.O);
        // Q, K and V read and O written where they lie: a PyTorch caller's views need no copy.
        const QkvLayouts at = QkvLayouts::resolved(p, a.q_layout, a.k_layout, a.v_layout);
        const ArrayLayout o_at = a.o_layout.resolved(p.heads, p.seq_q, p.dim);
        require_input_layout(Q, at.q, p.dim, DType::f32, "Q");
        require_input_layout(K, at.k, p.dim, DType::f32, "K");
        require_input_layout(V, at.v, p.dim, DType::f32, "V");
        require_output_layout(O, o_at, p.dim, DType::f32, "O");
        const auto stream = static_cast<cudaStream_t>(a.stream);
        WorkspaceCarver workspace(a.workspace, a.workspace_bytes, "cuda-fa2");
        int* nonfinite = cut_forward_workspace(p, workspace);
        workspace.require_fits();
        const Fa2Variant& ffma = choose_variant(p.dim, false);
        const Fa2Variant& chosen = choose_variant(p.dim, tf32_shape_allowed(p));
        require_fits(ffma, p), require_fits(chosen, p);
        if (!tested_on_device(p)) {
            chosen.launch(p, Q, K, V, at, O, o_at, a.lse, {}, inspects_own_inputs(p), stream);
            return;
        }
        queue_nonfinite_test({span_of(Q, at.q, p.batch, p.heads, p.seq_q, p.dim),
                              span_of(K, at.k, p.batch, p.heads_kv, p.seq_kv, p.dim),
                              span_of(V, at.v, p.batch, p.heads_kv, p.seq_kv, p.dim)},
                             nonfinite, stream);
        chosen.launch(p, Q, K, V, at, O, o_at, a.lse, {nonfinite, false}, false, stream);
        ffma.launch(p, Q, K, V, at, O, o_at, a.lse, {nonfinite, true}, false, stream);
    };
    return b;
}

}  // namespace flashattn::cuda
