// cuda/tc/forward.cu — picks a compiled tile shape for a problem and launches the cuda-tc
// kernel (cuda/tc/kernel.cuh); see cuda/tc/forward.hpp.
#include "cuda/tc/forward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include "common/tiling.hpp"
#include "common/gqa_packing.hpp"
#include "cuda/host/check.hpp"
#include "cuda/host/device_buffer.hpp"
#include "cuda/host/prepared.hpp"
#include "cuda/host/dependent_launch.hpp"
#include "cuda/host/split_kv.hpp"
#include "cuda/host/variants.hpp"
#include "cuda/tc/decode_kernel.cuh"
#include "cuda/tc/kernel.cuh"
#include "cuda/host/tensor_core_eligibility.hpp"

namespace flashattn::tc {

using cuda::mma_grid_limits;

std::string TcTileShape::name() const {
    if (decode)
        return "decode-w" + std::to_string(warps) + "-Bc" + std::to_string(Bc) + "-s" +
               std::to_string(stages);
    return "Br" + std::to_string(Br()) + "w" + std::to_string(warps) + "-Bc" + std::to_string(Bc) +
           "-s" + std::to_string(stages);
}

namespace {

// ---- the compiled tile shapes ------------------------------------------------------------------
// Why these defaults (measurements: docs/cuda_tc.md, section "cuda/tc/forward.cu"):
//   * Br = 128 everywhere: every CTA streams all of K and V of its head through L2 once, so the
//     L2 traffic is 4 N_kv d bytes per Br query rows; Br = 64 would double it.
//   * d <= 64: 4 warps of 2 row tiles (32 rows) each, as FlashAttention-2 does: every K/V fragment
//     read from shared memory feeds two mma's, and Q_i (d/2 registers) still fits in registers.
//   * d = 96, 128: 8 warps of one row tile. Two row tiles would need O_i (2 x d/2 registers) + S
//     (2 x Bc/2) beside each other, which spills at d = 128; one row tile fits in ~250 registers
//     with Q_i in registers.
//   * Bc = 64, 2 stages: a third stage bought nothing (the copy of tile j+1 already hides behind
//     the math of tile j); Bc = 32 or 128 were slower or spilled.
//   * d = 256: O_i alone takes 128 registers for one row tile, so Bc = 32 and Q_i stays in shared
//     memory.
//   * decoding (tc_decodes; cuda/tc/decode_kernel.cuh): 4 warps share 16 query rows and split
//     each key tile; tiles of 16 KiB (K) + 16 KiB (V) at d = 64 and 128 (32 KiB each at d = 256).
//     At d = 64 (128-key tiles) and d = 96, 256, three in the ring, two in flight while one is
//     multiplied. At d = 128 two (64-key tiles, about 68 KB per CTA; the registers allow two
//     CTAs per SM either way): measured against three stages, four, and 8 warps of 128 keys
//     (graph timing, H100, docs/decoding.md) it was the fastest or tied at 3 of 4 decoding
//     shapes (the fourth 3% behind four stages). At d = 64 the alternatives (decode-w4-Bc64-s4
//     and the others measured there) were slower.
// The alternative shapes (fp16, d = 64 and 128) are compiled so that they can be compared on the
// device (FLASHATTN_VARIANT=cuda-tc=<name>); they are used only when asked for.
struct CompiledTile {
    std::int64_t dim;
    TcTileShape shape;
    bool f16_only;  // a tuning alternative
    void (*launch_f16)(const KernelParams&, cudaStream_t);
    void (*launch_bf16)(const KernelParams&, cudaStream_t);  // nullptr for a tuning alternative
    int (*ctas_per_sm)();  // of the f16 split-KV kernel without a block mask (bf16 alike)
};

// Launches one compiled shape. kTuning: a tuning alternative, compiled without the block-mask
// kernel (block-sparse problems run with the default shapes).
template <class Cfg, bool kTuning>
void launch(const KernelParams& params, cudaStream_t stream) {
    const AttentionProblem& p = params.problem;
    cuda::require_shared_memory(Cfg::kSmemBytes, "cuda-tc: tile Br" + std::to_string(Cfg::Br) +
                                                      "-Bc" + std::to_string(Cfg::Bc) +
                                                      " at d = " + std::to_string(Cfg::D));
    // Four instantiations (block mask or not, split-KV or not), each carrying only its own code.
    const bool split = params.kv_splits > 1;
    auto kernel = split ? tc_forward_kernel<Cfg, false, true> : tc_forward_kernel<Cfg, false, false>;
    if (p.block_mask.active()) {
        if constexpr (kTuning)
            throw std::invalid_argument("block mask: tuning tile shapes have no block-mask kernel; "
                                        "use the default tile");
        else
            kernel = split ? tc_forward_kernel<Cfg, true, true> : tc_forward_kernel<Cfg, true, false>;
    }
    cuda::allow_dynamic_shared_memory(kernel, Cfg::kSmemBytes);
    // x: the query tiles, times the key chunks under split-KV (KernelParams::kv_splits).
    const dim3 grid(static_cast<unsigned>(tile_count(p.seq_q, Cfg::Br) * params.kv_splits),
                    static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
    kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
    FA_CUDA_CHECK_LAUNCH();
}

// The decoding kernel of one compiled shape (cuda/tc/decode_kernel.cuh): the same four
// instantiations, a grid of 16-row query tiles.
template <class Tile>
void launch_decode(const KernelParams& params, cudaStream_t stream) {
    const AttentionProblem& p = params.problem;
    cuda::require_shared_memory(Tile::kSmemBytes, "cuda-tc: decoding tile Bc" +
                                                      std::to_string(Tile::Bc) + " at d = " +
                                                      std::to_string(Tile::D));
    const bool split = params.kv_splits > 1;
    auto kernel = split ? tc_decode_kernel<Tile, false, true> : tc_decode_kernel<Tile, false, false>;
    if (p.block_mask.active())
        kernel = split ? tc_decode_kernel<Tile, true, true> : tc_decode_kernel<Tile, true, false>;
    cuda::allow_dynamic_shared_memory(kernel, Tile::kSmemBytes);
    const dim3 grid(static_cast<unsigned>(tile_count(p.seq_q, Tile::Br) * params.kv_splits),
                    static_cast<unsigned>(p.heads), static_cast<unsigned>(p.batch));
    // The kernel waits for the stream's previous kernel before it touches memory, so its launch
    // may overlap that kernel's end (cuda/host/dependent_launch.hpp).
    cuda::launch_overlapping_previous(kernel, grid, dim3(Tile::kThreads), Tile::kSmemBytes, stream,
                                      params);
}

// CTAs of the split-KV kernel (S is chosen for it) that fit on one SM. Asked once per process:
// the kernels are compiled for one architecture, so every device that runs them has the same
// per-SM limits, and the query would otherwise cost host time on every decoding step.
template <class Cfg, bool kDecode = false>
int ctas_per_sm() {
    static const int n = [] {
        auto kernel = [] {
            if constexpr (kDecode)
                return tc_decode_kernel<Cfg, false, true>;
            else
                return tc_forward_kernel<Cfg, false, true>;
        }();
        FA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           Cfg::kSmemBytes));
        int ctas = 0;
        FA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, Cfg::kThreads,
                                                                    Cfg::kSmemBytes));
        return ctas;
    }();
    return n;
}

// One row of the table: the shape and its instantiations (f16, and bf16 unless a tuning
// alternative), so that a shape is written once.
template <int D, int W, int M, int Bc, int S, bool kTuning = false>
CompiledTile tile() {
    using F16 = TcTile<__half, D, W, M, Bc, S>;
    CompiledTile t{D, {W, M, Bc, S}, kTuning, &launch<F16, kTuning>, nullptr, &ctas_per_sm<F16>};
    if constexpr (!kTuning) t.launch_bf16 = &launch<TcTile<__nv_bfloat16, D, W, M, Bc, S>, false>;
    return t;
}

// A decoding shape's row: `warps` warps of `warp_keys` keys each, `stages` tiles in the ring.
template <int D, int W, int kWarpKeys, int S, bool kTuning = false>
CompiledTile decode_tile() {
    using F16 = DecodeTile<__half, D, W, kWarpKeys, S>;
    CompiledTile t{D, {W, 1, W * kWarpKeys, S, true}, kTuning, &launch_decode<F16>, nullptr,
                   &ctas_per_sm<F16, true>};
    if constexpr (!kTuning) t.launch_bf16 = &launch_decode<DecodeTile<__nv_bfloat16, D, W, kWarpKeys, S>>;
    return t;
}

const std::vector<CompiledTile>& compiled_tiles() {
    constexpr bool kTuning = true;
    static const std::vector<CompiledTile> tiles = {
        tile<32, 4, 2, 64, 2>(),
        tile<64, 4, 2, 64, 2>(),
        tile<64, 4, 2, 64, 3, kTuning>(),
        tile<64, 8, 1, 64, 2, kTuning>(),
        tile<64, 8, 2, 64, 2, kTuning>(),
        tile<96, 8, 1, 64, 2>(),
        tile<128, 8, 1, 64, 2>(),
        tile<128, 8, 1, 64, 3, kTuning>(),
        tile<128, 8, 1, 32, 2, kTuning>(),
        tile<128, 4, 2, 64, 2, kTuning>(),
        tile<256, 8, 1, 32, 2>(),
        decode_tile<32, 4, 32, 3>(),
        decode_tile<64, 4, 32, 3>(),
        decode_tile<64, 4, 16, 4, kTuning>(),
        decode_tile<96, 4, 16, 3>(),
        decode_tile<128, 4, 16, 2>(),
        decode_tile<128, 4, 16, 3, kTuning>(),
        decode_tile<128, 8, 16, 3, kTuning>(),
        decode_tile<256, 4, 16, 3>(),
    };
    return tiles;
}

std::string list(const std::vector<std::int64_t>& values) {
    std::string s;
    for (std::int64_t v : values) s += (s.empty() ? "" : ", ") + std::to_string(v);
    return s;
}

}  // namespace

const std::vector<std::int64_t>& tc_head_dims() {
    static const std::vector<std::int64_t> dims = cuda::table_dims(compiled_tiles());
    return dims;
}

std::vector<TcTileShape> tc_tile_shapes(std::int64_t dim, DType dtype) {
    std::vector<TcTileShape> shapes;
    for (const CompiledTile& t : compiled_tiles())
        if (t.dim == dim && (!t.f16_only || dtype == DType::f16)) shapes.push_back(t.shape);
    return shapes;
}

void tc_check_problem(const AttentionProblem& p, DType dtype) {
    validate(p);
    if (dtype != DType::f16 && dtype != DType::bf16)
        throw std::invalid_argument("dtype = " + to_string(dtype) +
                                    ": cuda-tc computes in f16 or bf16 (tensor cores)");
    const auto& dims = tc_head_dims();
    if (std::find(dims.begin(), dims.end(), p.dim) == dims.end())
        throw std::invalid_argument("dim = " + std::to_string(p.dim) +
                                    ": cuda-tc supports head dims " + list(dims));
    const std::string outside = mma_grid_limits(p);
    if (!outside.empty()) throw std::invalid_argument(outside);
}

bool tc_decodes(const AttentionProblem& p) {
    return gqa_packed(p, kDecodeRows).seq_q <= kDecodeRows;
}

TcTileShape tc_default_tile(const AttentionProblem& p, DType dtype) {
    const std::vector<TcTileShape> shapes = tc_tile_shapes(p.dim, dtype);
    if (shapes.empty())
        throw std::invalid_argument("dim = " + std::to_string(p.dim) +
                                    ": cuda-tc supports head dims " + list(tc_head_dims()));
    const bool decode = tc_decodes(p);
    for (const TcTileShape& s : shapes)
        if (s.decode == decode) return s;
    return shapes.front();
}

namespace {

const CompiledTile& compiled_tile(std::int64_t dim, DType dtype, const TcTileShape& tile) {
    for (const CompiledTile& t : compiled_tiles())
        if (t.dim == dim && t.shape == tile && (dtype == DType::f16 || !t.f16_only)) return t;
    throw std::invalid_argument("tile = " + tile.name() + ": not compiled for d = " +
                                std::to_string(dim) + ", dtype " + to_string(dtype) +
                                " (see tc_tile_shapes)");
}

}  // namespace

std::int64_t tc_kv_splits(const AttentionProblem& problem, DType dtype, const TcTileShape& tile) {
    const CompiledTile& t = compiled_tile(problem.dim, dtype, tile);
    const AttentionProblem p = gqa_packed(problem, tile.Br());  // the problem tc_forward runs
    // The full wave where chunks are long for the decoding kernel, where it was measured faster
    // (docs/decoding.md, "S, the chunks"); the prefill tiles keep the smallest good S.
    return cuda::kv_splits_for(p, tile_count(p.seq_q, tile.Br()), t.ctas_per_sm(),
                               tile_count(p.seq_kv, tile.Bc), tile.decode);
}

void tc_forward(const TcDeviceArgs& args, const TcTileShape& tile) {
    tc_check_problem(args.problem, args.dtype);
    // At decoding shapes a GQA group's query heads share query tiles, so that K/V is read once
    // per group (common/gqa_packing.hpp): the same memory, read as a problem without GQA.
    const AttentionProblem p = gqa_packed(args.problem, tile.Br());
    tc_check_problem(p, args.dtype);  // its grid
    const CompiledTile& t = compiled_tile(p.dim, args.dtype, tile);
    KernelParams params = make_params(p, args.Q, args.K, args.V, args.O, args.lse);
    if (args.o_dtype != DType::f32 && args.o_dtype != args.dtype)
        throw std::invalid_argument("O's dtype = " + to_string(args.o_dtype) +
                                    ": cuda-tc writes O in f32 or in the inputs' dtype (" +
                                    to_string(args.dtype) + ")");
    params.o_dtype = args.o_dtype;
    const auto stream = static_cast<cudaStream_t>(args.stream);
    const std::int64_t S = args.kv_splits;
    if (S < 1 || S > 1024)
        throw std::invalid_argument("kv_splits = " + std::to_string(S) + ": must be in [1, 1024]");
    if (S > 1) {
        require_array(args.O_partial, "split-KV's partial O"),
            require_array(args.lse_partial, "split-KV's partial LSE");
        params.kv_splits = int(S), params.O_partial = args.O_partial,
        params.lse_partial = args.lse_partial;
    }
    (args.dtype == DType::f16 ? t.launch_f16 : t.launch_bf16)(params, stream);
    if (S > 1)
        cuda::launch_combine(params.O_partial, params.lse_partial, S, p.lse_elements(), p.dim,
                             args.O, args.o_dtype, args.lse, args.stream, &p);
}

}  // namespace flashattn::tc
