// cuda/fa3/backward.cu — launches cuda-fa3's backward (cuda/fa3/backward_kernel.cuh) after the D
// pass; see cuda/fa3/backward.hpp.
#include "cuda/fa3/backward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "common/tiling.hpp"
#include "cuda/fa3/backend.hpp"
#include "cuda/fa3/backward_kernel.cuh"
#include "cuda/fa3/tensor_map.hpp"
#include "cuda/host/check.hpp"
#include "cuda/host/dependent_launch.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/stages/backward_prepass.cuh"

namespace flashattn::fa3 {
namespace {

template <class Cfg, bool kBlockMask, bool kDeterministic>
void launch_kernel(const Fa3BackwardParams& params, cudaStream_t stream) {
    const AttentionProblem& p = params.base.problem;
    const auto kernel = fa3_backward_kernel<Cfg, kBlockMask, kDeterministic>;
    constexpr int kSmem = backward_smem_bytes<Cfg>();
    static_assert(kSmem <= 227 * 1024, "shared memory of one CTA");
    cuda::allow_dynamic_shared_memory(kernel, kSmem);
    const dim3 grid(static_cast<unsigned>(tile_count(p.seq_kv, Cfg::Bc)),
                    static_cast<unsigned>(p.batch * p.heads_kv));
    // Placed while the D pass before it ends; the kernel waits for it after asking for K_j, V_j.
    cuda::launch_overlapping_previous(kernel, grid, dim3(Cfg::kThreads), kSmem, stream, params);
}

// The tensor maps Cfg's kernels read: boxes of Br rows for Q and dO, Bc for K and V, and dQ's
// blocks' rows for its float32 sum.
template <class Cfg>
void set_tensor_maps(Fa3BackwardParams& params, const cuda::Backward16Args& args) {
    const AttentionProblem& p = args.problem;
    const DType t = args.dtype;
    params.q = tile_map(args.Q, t, p.batch, p.heads, p.seq_q, p.dim, args.q_at, Cfg::Br);
    params.dO = tile_map(args.dO, t, p.batch, p.heads, p.seq_q, p.dim, args.do_at, Cfg::Br);
    params.k = tile_map(args.K, t, p.batch, p.heads_kv, p.seq_kv, p.dim, args.k_at, Cfg::Bc);
    params.v = tile_map(args.V, t, p.batch, p.heads_kv, p.seq_kv, p.dim, args.v_at, Cfg::Bc);
    params.dq_sum = sum_map(args.dQ_sum, p.batch, p.heads, p.seq_q, p.dim, Cfg::kDqBlockRows);
    params.tail = int(schedule_tail(p.causal, tile_count(p.seq_kv, Cfg::Bc), p.batch * p.heads_kv,
                                    cuda::device_limits().sm_count));
}

// The tensor maps, then the kernel: Cfg's, or with a block mask or in deterministic mode Plain's
// (Cfg without a producer warpgroup, whose kernels exist only without both:
// Fa3BackwardTile::kProducer).
template <class Cfg, class Plain>
void launch(Fa3BackwardParams params, const cuda::Backward16Args& args, bool deterministic,
            cudaStream_t stream) {
    static_assert(!Plain::kProducer && Plain::D == Cfg::D && Plain::Br == Cfg::Br &&
                      Plain::Bc == Cfg::Bc && Plain::kDqBlockRows == Cfg::kDqBlockRows,
                  "the plain kernels read the same tensor maps");
    set_tensor_maps<Cfg>(params, args);
    if (params.base.problem.block_mask.active())
        deterministic ? launch_kernel<Plain, true, true>(params, stream)
                      : launch_kernel<Plain, true, false>(params, stream);
    else
        deterministic ? launch_kernel<Plain, false, true>(params, stream)
                      : launch_kernel<Cfg, false, false>(params, stream);
}

// kPlainSlots: the ring of the kernels without a producer (block masks, deterministic mode).
template <int D, int Br, int kSlots = 2, bool kOverlap = false, bool kProducer = false,
          int kPlainSlots = kSlots>
void run_variant(const Fa3BackwardParams& params, const cuda::Backward16Args& args,
                 bool deterministic, cudaStream_t stream) {
    if (args.dtype == DType::f16)
        launch<Fa3BackwardTile<__half, D, Br, kSlots, kOverlap, kProducer>,
               Fa3BackwardTile<__half, D, Br, kPlainSlots, kOverlap, false>>(params, args,
                                                                            deterministic, stream);
    else
        launch<Fa3BackwardTile<__nv_bfloat16, D, Br, kSlots, kOverlap, kProducer>,
               Fa3BackwardTile<__nv_bfloat16, D, Br, kPlainSlots, kOverlap, false>>(
            params, args, deterministic, stream);
}

template <class T, bool kRaggedKeys>
void launch_query80(Fa3BackwardParams params, const cuda::Backward16Args& args,
                    cudaStream_t stream) {
    using Cfg = Fa3BackwardTile<T, 128, 80, 2, true, true, kRaggedKeys>;
    set_tensor_maps<Cfg>(params, args);
    launch_kernel<Cfg, false, false>(params, stream);
}

// d = 128's 80-row query tile (Fa3BackwardTile::kDqTransposed), FlashAttention-3's without a
// mask: its kernel exists in the -dq-overlap-producer form only and masks no more than the keys
// past N_kv (score_gradients), so under a causal or block mask or in deterministic mode the
// 64-row tile runs (whose query tiles dQ's turns then count; FlashAttention-3 also takes 64 rows
// under a causal mask).
void run_query80(const Fa3BackwardParams& params, const cuda::Backward16Args& args,
                 bool deterministic, cudaStream_t stream) {
    if (deterministic || args.problem.causal || args.problem.block_mask.active())
        return run_variant<128, 64, 2, true, true>(params, args, deterministic, stream);
    const bool ragged = args.problem.seq_kv % 128 != 0;
    if (args.dtype == DType::f16)
        ragged ? launch_query80<__half, true>(params, args, stream)
               : launch_query80<__half, false>(params, args, stream);
    else
        ragged ? launch_query80<__nv_bfloat16, true>(params, args, stream)
               : launch_query80<__nv_bfloat16, false>(params, args, stream);
}

// The compiled tiles per head dim, Bc = 128 keys each (64 at d = 256, whose warpgroups split the
// columns of dK_j, dV_j and the queries of S^T, dP^T: Fa3BackwardTile), with a ring of 2 slots for
// Q_i, dO_i, L_i, D_i or 3 (-ring3), dQ_i's product overlapped with dK_j's or not (-dq-overlap,
// Fa3BackwardTile::kOverlapDq), a producer warpgroup or not (-producer, Fa3BackwardTile::kProducer;
// with a block mask or in deterministic mode such a tile runs without it, at d = 64 with the
// three slots of the tile that was the default before it), and at d = 128 an 80-row query tile
// without a causal or block mask (Br80, run_query80): the default (first listed for a d) is
// the one measured fastest in docs/cuda_fa3.md ("backward");
// FLASHATTN_VARIANT=cuda-fa3-backward=<name> picks another.
struct Variant {
    const char* name;
    const char* kind;  // no groups: every variant is named on its own
    int dim;
    int Br;  // the query tile of its deterministic kernel, whose turns count dQ's additions
    void (*run)(const Fa3BackwardParams&, const cuda::Backward16Args&, bool, cudaStream_t);
};
const Variant kVariants[] = {
    {"d64-Br128-producer", "", 64, 128, run_variant<64, 128, 2, false, true, 3>},
    {"d64-Br128-ring3", "", 64, 128, run_variant<64, 128, 3>},
    {"d64-Br128", "", 64, 128, run_variant<64, 128>},
    {"d64-Br64", "", 64, 64, run_variant<64, 64>},
    {"d128-Br80-dq-overlap-producer", "", 128, 64, run_query80},
    {"d128-Br64-dq-overlap-producer", "", 128, 64, run_variant<128, 64, 2, true, true>},
    {"d128-Br64-dq-overlap", "", 128, 64, run_variant<128, 64, 2, true>},
    {"d128-Br64", "", 128, 64, run_variant<128, 64>},
    {"d256-Br64", "", 256, 64, run_variant<256, 64>},
};

const Variant& choose_variant(const AttentionProblem& p) {
    return cuda::choose_variant(
        "cuda-fa3-backward", cuda::requested_variant("cuda-fa3-backward"), kVariants,
        [&](const Variant& v) { return v.dim == p.dim; }, "dim = " + std::to_string(p.dim));
}

}  // namespace

void fa3_check_backward_problem(const AttentionProblem& p, DType dtype) {
    fa3_check_inputs(p, dtype);  // head dim 64, 128 or 256, as the forward
    if (p.heads > 0x7fffffff)
        throw std::invalid_argument("heads = " + std::to_string(p.heads) +
                                    ": cuda-fa3's backward indexes heads in 32 bits");
    if (p.batch * p.heads_kv > 65535)
        throw std::invalid_argument("batch*heads_kv = " + std::to_string(p.batch * p.heads_kv) +
                                    ": cuda-fa3's backward grid allows at most 65535");
    // The kernel numbers its CTAs (Bc keys each) with int in scheduled_tile's order.
    const int Bc = p.dim == 256 ? 64 : 128;
    const std::int64_t ctas = tile_count(p.seq_kv, Bc) * p.batch * p.heads_kv;
    if (ctas > (std::int64_t{1} << 30))
        throw std::invalid_argument("batch x heads_kv x ceil(seq_kv / " + std::to_string(Bc) +
                                    ") = " + std::to_string(ctas) +
                                    ": cuda-fa3's backward numbers its CTAs with int, at most 2^30");
}

std::size_t fa3_backward_turn_count(const AttentionProblem& p, DType) {
    return static_cast<std::size_t>(p.batch * p.heads * tile_count(p.seq_q, choose_variant(p).Br));
}

void fa3_backward(const cuda::Backward16Args& args, bool deterministic) {
    const AttentionProblem& p = args.problem;
    fa3_check_backward_problem(p, args.dtype);
    cuda::require_backward_arrays(args, deterministic);
    require_tma_aligned(args.Q, "Q"), require_tma_aligned(args.K, "K");
    require_tma_aligned(args.V, "V"), require_tma_aligned(args.dO, "dO");
    require_tma_layout(args.q_at, "Q"), require_tma_layout(args.k_at, "K");
    require_tma_layout(args.v_at, "V"), require_tma_layout(args.do_at, "dO");
    require_tma_aligned(args.dQ_sum, "dQ's float32 sum");
    cuda::queue_backward_prepass(args, deterministic ? fa3_backward_turn_count(p, args.dtype) : 0);
    Fa3BackwardParams params;
    params.base = cuda::make_backward_params(p, args.Q, args.K, args.V, args.dO, args.lse, args.D,
                                             args.dQ_sum, args.dK, args.dV, args.dq_turns);
    params.base.dk_layout = args.dk_at, params.base.dv_layout = args.dv_at;
    params.base.grad_dtype = args.grad_dtype;
    // dK and dV staged in shared memory where they are 16-bit, with rows on 16-byte boundaries
    // (store_key_gradient_staged); float32 ones from registers (docs/cuda_fa3.md measures both).
    params.key_gradients_staged = args.grad_dtype == args.dtype &&
                                  cuda::rows_in_16_byte_chunks(args.dK, args.dk_at, p.dim, 2) &&
                                  cuda::rows_in_16_byte_chunks(args.dV, args.dv_at, p.dim, 2);
    choose_variant(p).run(params, args, deterministic, static_cast<cudaStream_t>(args.stream));
    cuda::queue_backward_postpass(args);  // dQ from its float32 sum, where the caller wants another
}

}  // namespace flashattn::fa3
