// cuda/fa3/backend.cu — the cuda-fa3 backend: checks, the tensor maps TMA copies through, launch,
// split-KV at decoding shapes (the chunks' partial results, then cuda-tc's combine kernel: the
// host side is cuda/host/split_kv.hpp), and the upload path every CUDA backend shares
// (cuda/host/prepared.hpp: 16-bit Q, K, V with Q times q_sign, poisoned O and LSE).
#include "cuda/fa3/backend.hpp"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/gqa_packing.hpp"
#include "common/tiling.hpp"
#include "cuda/host/check.hpp"
#include "cuda/fa3/backward.hpp"
#include "cuda/fa3/kernel.cuh"
#include "cuda/fa3/tensor_map.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/host/split_kv.hpp"
#include "cuda/host/tensor_core_eligibility.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/host/workspace.hpp"

namespace flashattn::fa3 {
namespace {

// Whether O, at `o` with layout o_layout in o_dtype, can be stored by TMA from a staging block
// (store_output_staged): 16-bit (the inputs' dtype), at an address and strides TMA can write. A
// float32 O (the library's own arrays, split-KV's partials) is written from registers.
bool o_stageable(const void* o, const ArrayLayout& o_layout, DType o_dtype, DType dtype) {
    return o_dtype == dtype && tma_aligned(o) && tma_layout(o_layout);
}

// next_item: one int of device memory, the work-tile counter (zeroed on `stream` before the
// launch), or null where the grid has a CTA for every work tile (needs_counter). The tensor maps
// are host structs passed in the kernel's parameters: nothing else is allocated or copied.
template <class Cfg>
void launch(const KernelParams& base, const QkvLayouts& at, DType dtype, int* next_item,
            cudaStream_t stream) {
    const AttentionProblem& p = base.problem;
    Fa3Params params;
    params.base = base;
    params.Tr = int(tile_count(p.seq_q, Cfg::Br));
    // S work tiles per query tile under split-KV (plan_forward has checked the count fits int).
    params.items = params.Tr * int(p.heads) * int(p.batch) * base.kv_splits;
    params.next_item = next_item;
    params.tail = int(schedule_tail(p.causal, params.Tr, p.heads * p.batch,
                                    cuda::device_limits().sm_count));
    params.row_shift = int(query_tile_shift(p, Cfg::Br, 64));  // whole warpgroups
    params.q = tile_map(base.Q, dtype, p.batch, p.heads, p.seq_q, p.dim, at.q, Cfg::Br);
    params.k = tile_map(base.K, dtype, p.batch, p.heads_kv, p.seq_kv, p.dim, at.k, Cfg::Bc);
    params.v = tile_map(base.V, dtype, p.batch, p.heads_kv, p.seq_kv, p.dim, at.v, Cfg::Bc);
    // O_i through shared memory and a TMA store where the tile has the room (Cfg::kStagedO) and O
    // is 16-bit (the device entry's) at an address and strides TMA can write; else from registers,
    // as every chunk's partial result is under split-KV (float32, merged by the combine).
    params.o_staged = Cfg::kStagedO && base.kv_splits == 1 &&
                      o_stageable(base.O, base.o_layout, base.o_dtype, dtype);
    if (params.o_staged)
        params.o = tile_map(base.O, dtype, p.batch, p.heads, p.seq_q, p.dim, base.o_layout, 64);
    // Four instantiations (block mask or not, split-KV or not), each carrying only its own code.
    const bool split = base.kv_splits > 1;
    auto kernel = split ? fa3_forward_kernel<Cfg, false, true> : fa3_forward_kernel<Cfg, false, false>;
    if (p.block_mask.active())
        kernel = split ? fa3_forward_kernel<Cfg, true, true> : fa3_forward_kernel<Cfg, true, false>;
    static_assert(fits_shared_memory<Cfg>(), "cuda-fa3: the tile does not fit shared memory");
    constexpr int kSmem = smem_bytes<Cfg>();
    cuda::allow_dynamic_shared_memory(kernel, kSmem);
    // One CTA per SM (the registers allow no more), each taking work tiles until none is left.
    const int grid = std::min(params.items, cuda::device_limits().sm_count);
    if (grid == params.items) params.next_item = nullptr;  // a CTA per work tile: no counter
    // Past the grid's first wave the CTAs need the counter, which cut_workspace always provides
    // there; the test guards that invariant (without a counter, work tiles would be left undone).
    if (params.next_item == nullptr && grid < params.items)
        throw std::logic_error("cuda-fa3: more work tiles than CTAs and no work-tile counter");
    if (params.next_item) FA_CUDA_CHECK(cudaMemsetAsync(next_item, 0, sizeof(int), stream));
    kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(params);
    FA_CUDA_CHECK_LAUNCH();
}

// The compiled kernels per head dim: keys per tile Bc (the N of S's wgmma), a ring of 2, two
// consumer warpgroups (Br = 128) or three ("Br192"), and with ("-pingpong") or without the
// ping-pong between two consumer warpgroups. The first listed for a d is the one measured fastest
// where the work fills the device many times over (docs/cuda_fa3.md): at d = 128 with ping-pong;
// at d = 64 three consumer warpgroups (stage 5); at d = 256 Bc = 80, the most keys the shared
// memory holds. default_variant below picks another at sizes where another was measured faster,
// and split_variant the deeper ring at d = 64 ("-s4": four slots) for a split launch.
// FLASHATTN_VARIANT=cuda-fa3=<name> picks one by name.
struct Variant {
    const char* name;
    const char* kind;  // no groups: every variant is named on its own
    int dim;
    int Br;  // query rows per work tile: 64 per consumer warpgroup
    int Bc;  // keys per key tile
    void (*run)(const KernelParams&, const QkvLayouts&, DType, int* next_item, cudaStream_t);
};

template <int D, int Bc, int kStages, bool kPingPong, int kConsumers = 2>
void run_variant(const KernelParams& params, const QkvLayouts& at, DType dtype, int* next_item,
                 cudaStream_t stream) {
    if (dtype == DType::f16)
        launch<Fa3Tile<__half, D, Bc, kStages, kPingPong, kConsumers>>(params, at, dtype,
                                                                       next_item, stream);
    else
        launch<Fa3Tile<__nv_bfloat16, D, Bc, kStages, kPingPong, kConsumers>>(
            params, at, dtype, next_item, stream);
}

const Variant kVariants[] = {
    {"d64-Br192-Bc128", "", 64, 192, 128, run_variant<64, 128, 2, false, 3>},
    {"d64-Bc128", "", 64, 128, 128, run_variant<64, 128, 2, false>},
    {"d64-Bc128-pingpong", "", 64, 128, 128, run_variant<64, 128, 2, true>},
    {"d64-Bc128-s4-pingpong", "", 64, 128, 128, run_variant<64, 128, 4, true>},
    {"d128-Bc128-pingpong", "", 128, 128, 128, run_variant<128, 128, 2, true>},
    // Three K/V slots, and O_i stored from registers (its staging blocks no longer fit): the
    // default where O is not staged anyway (default_variant).
    {"d128-Bc128-s3-pingpong", "", 128, 128, 128, run_variant<128, 128, 3, true>},
    {"d128-Bc128", "", 128, 128, 128, run_variant<128, 128, 2, false>},
    {"d256-Bc80", "", 256, 128, 80, run_variant<256, 80, 2, false>},
    {"d256-Bc80-pingpong", "", 256, 128, 80, run_variant<256, 80, 2, true>},
    {"d256-Bc64", "", 256, 128, 64, run_variant<256, 64, 2, false>},
    {"d256-Bc64-pingpong", "", 256, 128, 64, run_variant<256, 64, 2, true>},
};

// The default variant for problem p on a device with sm_count SMs: a name of kVariants, or "" for
// the first row of p's head dim. Measured on an H100 (docs/cuda_fa3.md, "The tile for the
// problem's size"):
//  - d = 64: 192 query rows per work tile read each K_j, V_j once for 192 rows and take 8-17% less
//    time than 128 where the tiles fill the SMs many times over. Where the 128-row tiles fill at
//    most two waves, each SM runs one or two tiles and the smaller tile finishes first: 128 rows
//    with ping-pong, 3-20% faster there.
//  - d = 256: Bc = 64 up to N_kv = 2048, Bc = 80 beyond (3% faster at N_kv = 4096 without a mask
//    and up to 8% under the causal one). Under a causal mask Bc = 64's tiles that straddle the
//    diagonal are narrower (2-7% faster up to 2048). Only Bc = 64 leaves shared memory for O_i's
//    staging (Fa3Tile::kStagedO): with a 16-bit O it was 8% faster than Bc = 80 without a mask at
//    N_kv = 1024 and 4-5% at 2048 (H200; the two were within 1.5% either way before O was
//    staged).
//  - d = 128 (H200, docs/cuda_fa3.md, "Three K/V slots at d = 128"): where O is not staged
//    (o_staged false: a float32 O) three K/V slots in the staging blocks' room, 1-2% faster
//    without a mask and level under the causal one; with a staged 16-bit O the two-slot tile, 4-16%
//    faster than three slots with O from registers. The block-mask kernels were not measured so:
//    they keep the two-slot tile.
const char* default_variant(const AttentionProblem& p, int sm_count, bool o_staged) {
    if (p.dim == 64) {
        const std::int64_t tiles128 = tile_count(p.seq_q, 128) * p.heads * p.batch;
        return tiles128 <= 2 * std::int64_t{sm_count} ? "d64-Bc128-pingpong" : "";
    }
    if (p.dim == 128) return !o_staged && !p.block_mask.active() ? "d128-Bc128-s3-pingpong" : "";
    if (p.dim == 256) return p.seq_kv <= 2048 ? "d256-Bc64" : "";
    return "";
}

const Variant& choose_variant(const AttentionProblem& p, bool o_staged) {
    const std::string requested = cuda::requested_variant("cuda-fa3");
    const std::string_view fallback = default_variant(p, cuda::device_limits().sm_count, o_staged);
    if (requested.empty())  // the default, found without the chooser's list of names (a device
                            // entry asks on every call)
        for (const Variant& v : kVariants)
            if (v.dim == p.dim && (fallback.empty() || fallback == v.name)) return v;
    // A request, or a default no row has (the chooser's error names it).
    return cuda::choose_variant(
        "cuda-fa3", requested.empty() ? std::string(fallback) : requested, kVariants,
        [&](const Variant& v) { return v.dim == p.dim; }, "dim = " + std::to_string(p.dim));
}

// What one forward call runs. At decoding shapes a GQA group's query heads are read as one head's
// rows (common/gqa_packing.hpp), so that each K/V tile is copied once for all of them, where the
// layouts of Q and O allow it; then split-KV's S for the problem as the kernel sees it: with one
// persistent CTA per SM, S chunks of >= 4 key tiles when its work tiles leave SMs idle
// (cuda::kv_splits_for, as cuda-tc chooses, without its full wave for long chunks:
// docs/decoding.md), or the caller's kv_splits.
struct ForwardPlan {
    const Variant* variant;
    AttentionProblem problem;  // p, or p with its GQA groups packed
    std::int64_t kv_splits;
    std::int64_t work_tiles() const {
        return tile_count(problem.seq_q, variant->Br) * problem.heads * problem.batch * kv_splits;
    }
    // Whether the persistent CTAs need the work-tile counter: not where there are no more work
    // tiles than the device has SMs, so that the grid has a CTA for each (small problems, where
    // the counter's allocation and zeroing would be much of a call's host time).
    bool needs_counter() const { return work_tiles() > cuda::device_limits().sm_count; }
};

// The variant a split launch takes by default: at d = 64 the chosen 128-row tile with four K/V
// slots instead of two. A split work tile does little more than stream its chunk of K and V, and
// one CTA per SM keeps only as many tiles in flight as its ring holds: two 16 KiB K/V pairs were
// too few (graph-timed on an H200, docs/decoding.md: 97 against 77 us at N_kv = 131k). At d = 128
// the two-slot tile (chosen with three where O is float32): three slots were slower than two at
// 32k and 131k keys.
const Variant* split_variant(const Variant& chosen) {
    const char* name = chosen.dim == 64    ? "d64-Bc128-s4-pingpong"
                       : chosen.dim == 128 ? "d128-Bc128-pingpong"
                                           : nullptr;
    if (name == nullptr) return &chosen;
    for (const Variant& v : kVariants)
        if (std::string_view(v.name) == name && v.Br == chosen.Br && v.Bc == chosen.Bc) return &v;
    return &chosen;
}

// o_staged: whether O is one a staged tile stores by TMA (o_stageable), which picks the tile at
// d = 128 (default_variant).
ForwardPlan plan_forward(const AttentionProblem& p, bool layouts_packable, bool o_staged) {
    const Variant* v = &choose_variant(p, o_staged);
    const AttentionProblem run = layouts_packable ? gqa_packed(p, v->Br) : p;
    const std::int64_t S = cuda::kv_splits_for(run, tile_count(run.seq_q, v->Br), 1,
                                               tile_count(run.seq_kv, v->Bc), false);
    // The same Br and Bc: the packing and S stand. A variant named in FLASHATTN_VARIANT stays.
    if (S > 1 && cuda::requested_variant("cuda-fa3").empty()) v = split_variant(*v);
    ForwardPlan plan{v, run, S};
    // Work tiles are numbered with int: the counter is an int.
    if (plan.work_tiles() > (std::int64_t{1} << 30))
        throw std::invalid_argument(
            "batch x heads x ceil(seq_q / " + std::to_string(v->Br) + ") x kv_splits = " +
            std::to_string(plan.work_tiles()) + ": cuda-fa3 numbers its work tiles with int, at most 2^30");
    return plan;
}

// A forward call's workspace: split-KV's partial results (S > 1) and the work-tile counter (where
// one is needed).
struct ForwardWorkspace {
    cuda::SplitPartials partials;
    int* next_item = nullptr;
};
ForwardWorkspace cut_workspace(const ForwardPlan& plan, cuda::WorkspaceCarver& w) {
    ForwardWorkspace out;
    out.partials = cuda::cut_split_partials(plan.problem, plan.kv_splits, w);
    if (plan.needs_counter()) out.next_item = w.take<int>(1);
    return out;
}

// The forward on `stream`: the kernel, then under split-KV the combine that merges the chunks'
// partial results into O (at params.o_layout, in params.o_dtype) and LSE. `params` and `at`
// describe plan.problem.
void run_forward(const ForwardPlan& plan, KernelParams params, const QkvLayouts& at,
                 DType dtype, const ForwardWorkspace& w, cudaStream_t stream) {
    if (plan.kv_splits > 1)
        params.kv_splits = int(plan.kv_splits), params.O_partial = w.partials.O,
        params.lse_partial = w.partials.lse;
    plan.variant->run(params, at, dtype, w.next_item, stream);
    if (plan.kv_splits > 1)
        cuda::launch_combine(params.O_partial, params.lse_partial, plan.kv_splits,
                             plan.problem.lse_elements(), plan.problem.dim, params.O,
                             params.o_dtype, params.lse, stream, &plan.problem, &params.o_layout);
}

class PreparedFa3 final : public cuda::PreparedCuda {
public:
    // The library's own arrays are contiguous: GQA groups are packed wherever the problem allows.
    PreparedFa3(const AttentionProblem& p, const float* Q, const float* K, const float* V,
                DType dtype)
        : PreparedCuda("cuda-fa3", p, Q, K, V, dtype, cuda::InputForm::bits16),
          // problem_: the block mask's device copy; O is float32, never staged.
          plan_(plan_forward(problem_, true, false)) {
        cuda::WorkspaceCarver counter;
        cut_workspace(plan_, counter);
        memory_ = workspace<unsigned char>(counter.bytes());
        cuda::WorkspaceCarver carver(memory_.data(), counter.bytes(), "cuda-fa3");
        workspace_ = cut_workspace(plan_, carver);
    }

    void execute() override {
        const AttentionProblem& run = plan_.problem;
        run_forward(plan_,
                    mma::make_params(run, Q16_.data(), K16_.data(), V16_.data(), O_.data(),
                                     lse_.data()),
                    QkvLayouts::contiguous(run), dtype_, workspace_, nullptr);
        synchronize();
    }
    std::string tiles() const override {
        const Variant& v = *plan_.variant;
        return std::string(v.name) + ": Br = " + std::to_string(v.Br) + " (" +
               std::to_string(v.Br / 64) +
               " consumer warpgroups + 1 TMA producer), wgmma, one persistent CTA per SM" +
               (plan_.kv_splits > 1 ? ", split-KV S = " + std::to_string(plan_.kv_splits) : "");
    }
    std::int64_t kv_splits() const override { return plan_.kv_splits; }

private:
    ForwardPlan plan_;
    cuda::DeviceBuffer<unsigned char> memory_;  // split-KV's partials, the work-tile counter
    ForwardWorkspace workspace_;
};

}  // namespace

void fa3_check_inputs(const AttentionProblem& p, DType dtype) {
    validate(p);
    if (dtype != DType::f16 && dtype != DType::bf16)
        throw std::invalid_argument("dtype = " + to_string(dtype) +
                                    ": cuda-fa3 computes in f16 or bf16 (tensor cores)");
    if (p.dim != 64 && p.dim != 128 && p.dim != 256)
        throw std::invalid_argument("dim = " + std::to_string(p.dim) +
                                    ": cuda-fa3 supports head dim 64, 128 or 256");
    const std::string outside = cuda::mma_grid_limits(p);
    if (!outside.empty()) throw std::invalid_argument(outside);
}

bool fa3_available() {
#if defined(FLASHATTN_HAVE_SM90A)
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0;
#else
    return false;
#endif
}

Backend fa3_backend() {
    Backend b;
    b.name = "cuda-fa3";
    b.device = "cuda";
    b.summary =
        "FlashAttention-3 on Hopper: wgmma, TMA copies into an mbarrier ring, a producer warpgroup "
        "and two consumer warpgroups (three at d = 64), softmax overlapped with P V (and ping-pong "
        "at d = 128), persistent CTAs, split-KV for decoding; fp16/bf16, d = 64, 128 or 256; "
        "backward on wgmma too";
    b.dtypes = {DType::f16, DType::bf16};
    b.tile_sizes = TileSizes::own;
    b.prepare = [](const AttentionProblem& p, const float* Q, const float* K, const float* V,
                   DType dtype) -> std::unique_ptr<PreparedAttention> {
        fa3_check_inputs(p, dtype);  // and plan_forward, in the constructor: the work-tile count
        require_array(Q, "Q"), require_array(K, "K"), require_array(V, "V");
        return std::make_unique<PreparedFa3>(p, Q, K, V, dtype);
    };
    // The device entry: the same kernels on the caller's 16-bit arrays (Q times q_sign, as
    // cuda-tc's), queued on the caller's stream (common/backend.hpp), read where they lie (any
    // strides TMA can read) and O written at its layout, in float32 or the inputs' dtype. Its
    // workspace: split-KV's partial results and the persistent CTAs' work-tile counter (none where
    // each work tile has a CTA). The plan depends on whether the layouts let GQA groups be packed,
    // and on O's dtype, which the workspace's size is asked without: it covers every plan.
    b.device_layouts = true;
    b.device_o_dtype = true;
    b.device_workspace_bytes = [](const AttentionProblem& p, DType) {
        std::size_t bytes = 0;
        for (bool packable : {false, true})
            for (bool o_staged : {false, true}) {
                cuda::WorkspaceCarver counter;
                cut_workspace(plan_forward(p, packable, o_staged), counter);
                bytes = std::max(bytes, counter.bytes());
            }
        return bytes;
    };
    b.run_device = [](const AttentionProblem& problem, const DeviceForward& a) {
        fa3_check_inputs(problem, a.dtype);
        require_array(a.Q, "Q"), require_array(a.K, "K"), require_array(a.V, "V");
        require_array(a.O, "O"), require_array(a.lse, "LSE");
        require_tma_aligned(a.Q, "Q"), require_tma_aligned(a.K, "K"), require_tma_aligned(a.V, "V");
        const QkvLayouts at =
            QkvLayouts::resolved(problem, a.q_layout, a.k_layout, a.v_layout);
        require_tma_layout(at.q, "Q"), require_tma_layout(at.k, "K"), require_tma_layout(at.v, "V");
        if (a.o_dtype != DType::f32 && a.o_dtype != a.dtype)
            throw std::invalid_argument("O's dtype = " + to_string(a.o_dtype) +
                                        ": cuda-fa3 writes O in f32 or in the inputs' dtype (" +
                                        to_string(a.dtype) + ")");
        const ArrayLayout o_at = a.o_layout.resolved(problem.heads, problem.seq_q, problem.dim);
        require_output_layout(a.O, o_at, a.o_dtype, "O");
        const AttentionProblem p = cuda::with_device_mask(problem, a.block_mask);
        const ForwardPlan plan =
            plan_forward(p, gqa_packable_layout(at.q, p) && gqa_packable_layout(o_at, p),
                         o_stageable(a.O, o_at, a.o_dtype, a.dtype));
        cuda::WorkspaceCarver carver(a.workspace, a.workspace_bytes, "cuda-fa3");
        const ForwardWorkspace workspace = cut_workspace(plan, carver);
        carver.require_fits();
        const AttentionProblem& run = plan.problem;  // Q's and O's layouts as it reads them
        const QkvLayouts run_at{gqa_packed_layout(at.q, p, run), at.k, at.v};
        mma::KernelParams params = mma::make_params(run, a.Q, a.K, a.V, a.O, a.lse);
        params.o_layout = gqa_packed_layout(o_at, p, run), params.o_dtype = a.o_dtype;
        run_forward(plan, params, run_at, a.dtype, workspace, static_cast<cudaStream_t>(a.stream));
    };
    // The backward: cuda/fa3/backward.cu, with cuda-tc's entries around it (16-bit uploads, D and
    // the dQ turn counters as workspace); its device entry takes layouts and 16-bit O and
    // gradients too (cuda/host/backward16.hpp).
    cuda::add_16bit_backward(b, {"cuda-fa3", fa3_check_backward_problem, fa3_backward_turn_count,
                               fa3_backward, /*layouts=*/true});
    return b;
}

}  // namespace flashattn::fa3
