// cuda/tc/forward.hpp — host interface of the cuda-tc kernel (cuda/tc/kernel.cuh): which
// problems and tile shapes it has, and the launch on device arrays. No CUDA types here, so plain
// C++ (the tests, the backend registry) can include it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/problem.hpp"
#include "common/backend.hpp"
#include "cuda/host/half_bits.hpp"

namespace flashattn::tc {

// One CTA's work: `warps` warps, each owning `m_tiles` row tiles of 16 query rows (Br = 16 warps
// m_tiles), key tiles of Bc rows, and a ring of `stages` K_j/V_j buffers. A decoding shape
// (`decode`, cuda/tc/decode_kernel.cuh) has one row tile of 16 rows that all its warps share;
// the warps split each key tile instead (Bc / warps keys each).
struct TcTileShape {
    int warps = 4;
    int m_tiles = 2;
    int Bc = 64;
    int stages = 2;
    bool decode = false;

    std::int64_t Br() const { return decode ? 16 : 16 * std::int64_t{warps} * m_tiles; }
    std::string name() const;  // e.g. "Br128w4-Bc64-s2", "decode-w4-Bc64-s3"
    bool operator==(const TcTileShape& o) const {
        return warps == o.warps && m_tiles == o.m_tiles && Bc == o.Bc && stages == o.stages &&
               decode == o.decode;
    }
    bool operator!=(const TcTileShape& o) const { return !(*this == o); }
};

// The head dimensions cuda-tc is compiled for.
const std::vector<std::int64_t>& tc_head_dims();

// The tile shapes compiled for (dim, dtype); the first one is the default, the others are there
// to be compared (FLASHATTN_VARIANT=cuda-tc=<name>, cuda/tools/compare_tc.py --tiles), except the
// decoding shape, which is the default where tc_decodes says so. Empty for an unsupported dim.
std::vector<TcTileShape> tc_tile_shapes(std::int64_t dim, DType dtype);

// Whether p is decoding for cuda-tc: at most 16 query rows per head once its GQA groups are
// packed (common/gqa_packing.hpp), one row tile of the decoding kernel. There the default shape
// is the decoding one (cuda/tc/decode_kernel.cuh): a 128-row tile would compute mostly rows that
// do not exist, and the products, not HBM, would set the pace (docs/decoding.md).
bool tc_decodes(const AttentionProblem& p);

// The default shape for problem p: the decoding shape of p.dim where tc_decodes(p), else the
// first of tc_tile_shapes.
TcTileShape tc_default_tile(const AttentionProblem& p, DType dtype);

// Throws std::invalid_argument naming the field and value for a problem (or dtype) cuda-tc cannot
// run: validate()'s checks, then dim outside tc_head_dims(), dtype f32, grid limits.
void tc_check_problem(const AttentionProblem& p, DType dtype);

// Q (B, H, N_q, d), K and V (B, H_kv, N_kv, d) as 16-bit values of `dtype`, contiguous; O
// contiguous, as float32 or as values of `dtype` (o_dtype); LSE as float.
// Q must hold q_sign(problem) * Q: the kernel folds a negative scale into Q (negating a 16-bit
// value is exact) so that its row maxima are maxima of |scale| s.
struct TcDeviceArgs {
    AttentionProblem problem;  // block_mask.data, if set, must point to device memory
    DType dtype = DType::f16;
    const void* Q = nullptr;
    const void* K = nullptr;
    const void* V = nullptr;
    void* O = nullptr;
    DType o_dtype = DType::f32;
    float* lse = nullptr;
    // Split-KV: S key chunks (tc_kv_splits), their partial results in O_partial / lse_partial
    // (cuda::cut_split_partials; unused for S = 1), merged into O and LSE.
    std::int64_t kv_splits = 1;
    float* O_partial = nullptr;
    float* lse_partial = nullptr;
    void* stream = nullptr;  // a cudaStream_t; nullptr: the default stream
};

// Split-KV: the S a launch of `tile` uses for problem p -- p.kv_splits when forced, else
// cuda::kv_splits_for with this tile's query tiles and CTAs per SM (cuda/host/split_kv.hpp).
std::int64_t tc_kv_splits(const AttentionProblem& p, DType dtype, const TcTileShape& tile);

using cuda::q_sign;  // cuda/host/half_bits.hpp

// Launches the kernel (and, for S > 1, the merge of the partial results) on args.stream,
// asynchronously. Throws std::invalid_argument for an
// unsupported problem or tile shape, std::runtime_error for a CUDA failure (e.g. a device with too
// little shared memory per block for this tile).
void tc_forward(const TcDeviceArgs& args, const TcTileShape& tile);

}  // namespace flashattn::tc
