// cpu/tile_products.hpp — the two tile products of the omp form, register-blocked:
//
//     scores:  S = scale Q_i K_j^T      (FA-2 Algorithm 1 line 8)
//     values:  O_i += P_ij V_j          (line 9, after the softmax has turned S into P)
//
// Why not a library GEMM: the products here are small (128 x 64 times 64 x 256) and run once per
// tile pair, and a general GEMM spends part of each call packing and unpacking. Measured on the
// development machine's cores (docs/omp.md): Eigen's GEMM ran these tiles at 83-88 GFLOP/s, the
// 8 x 64 blocks below at 104-110, of a 115 GFLOP/s FMA peak. That difference is what lets the
// flash form beat standard attention by more than standard's N x N memory traffic.
//
// How: a block of 8 query rows x 64 columns lives in 32 vector registers of 16 floats (AVX-512
// has exactly 32); every step of the inner loop loads 4 vectors of one operand, broadcasts 8
// scalars of the other and issues 32 fused multiply-adds, so the arithmetic, not the loads, sets
// the pace. Each output element is one running sum in a fixed order (k = 0, 1, ... for S; key
// 0, 1, ... for O), whatever thread runs it.
//
// The vectors are GCC/Clang vector extensions (`vector_size`): with -march=native on an AVX-512
// machine each Vec16 is one zmm register, on AVX2 two ymm, on the x86-64 baseline four xmm --
// the same code, portable, only slower without wide registers.
//
// Layouts (all row-major, padded with zeros so that every block is whole):
//   Q rows:  kRows rows of d floats (stride d).
//   K_j^T:   d rows of key_stride floats: K_j transposed, keys bc .. key_stride-1 zero.
//   V_j:     key_stride rows of value_stride floats: rows bc.. zero, columns d.. zero.
//   S / P:   kRows rows of key_stride floats.   O_i rows: kRows rows of value_stride floats.
// key_stride is a multiple of kBlockCols (64), value_stride a multiple of kLanes (16).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace flashattn::tiles {

using Vec16 = float __attribute__((vector_size(64)));
constexpr std::int64_t kLanes = 16;      // floats per Vec16
constexpr int kRows = 6;                 // query rows per block
constexpr int kVecs = 4;                 // Vec16 columns per block
constexpr std::int64_t kBlockCols = kVecs * kLanes;  // 64 columns per block

inline Vec16 load(const float* p) {
    Vec16 v;
    std::memcpy(&v, p, sizeof v);  // an unaligned vector load
    return v;
}
inline void store(float* p, Vec16 v) { std::memcpy(p, &v, sizeof v); }
// (Not `Vec16{} + x`: 0 + x is not x for x = -0, so the compiler keeps a scalar add per splat.)
inline Vec16 splat(float x) { return Vec16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

inline std::int64_t round_up(std::int64_t n, std::int64_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

// K_j (bc x d, stride d) -> K_j^T (d x key_stride), zero beyond key bc.
inline void pack_keys_transposed(const float* K_j, std::int64_t bc, std::int64_t d,
                                 std::int64_t key_stride, float* KT) {
    for (std::int64_t k = 0; k < d; ++k) {
        float* row = KT + k * key_stride;
        for (std::int64_t c = 0; c < bc; ++c) row[c] = K_j[c * d + k];
        std::fill(row + bc, row + key_stride, 0.0f);
    }
}

// V_j (bc x d, stride d) -> padded V_j (rows x value_stride), zero beyond row bc and column d.
inline void pack_values(const float* V_j, std::int64_t bc, std::int64_t d, std::int64_t rows,
                        std::int64_t value_stride, float* VP) {
    for (std::int64_t c = 0; c < rows; ++c) {
        float* row = VP + c * value_stride;
        const std::int64_t valid = c < bc ? d : 0;
        std::memcpy(row, V_j + c * d, static_cast<std::size_t>(valid) * sizeof(float));
        std::fill(row + valid, row + value_stride, 0.0f);
    }
}

// S[r][c] = scale * sum_k Q[r][k] K^T[k][c] for kRows rows and the kBlockCols keys at KT.
inline void scores_block(const float* Q, std::int64_t d, const float* KT, std::int64_t key_stride,
                         float scale, float* S) {
    Vec16 acc[kRows][kVecs] = {};
    for (std::int64_t k = 0; k < d; ++k) {
        Vec16 keys[kVecs];
        for (int v = 0; v < kVecs; ++v) keys[v] = load(KT + k * key_stride + v * kLanes);
        for (int r = 0; r < kRows; ++r) {
            const Vec16 q = splat(Q[r * d + k]);
            for (int v = 0; v < kVecs; ++v) acc[r][v] += q * keys[v];
        }
    }
    // The scale multiplies each finished dot product (as standard attention's GEMM alpha does):
    // scaling Q first would round every q once more, which large logits would show.
    for (int r = 0; r < kRows; ++r)
        for (int v = 0; v < kVecs; ++v) store(S + r * key_stride + v * kLanes, acc[r][v] * scale);
}

// S = scale Q K_j^T for kRows rows of Q and keys [0, keys), keys a multiple of kBlockCols.
inline void scores(const float* Q, std::int64_t d, const float* KT, std::int64_t keys,
                   std::int64_t key_stride, float scale, float* S) {
    for (std::int64_t c = 0; c < keys; c += kBlockCols)
        scores_block(Q, d, KT + c, key_stride, scale, S + c);
}

// O[r][.] += sum_c P[r][c] V[c][.] for kRows rows and kV vectors of output columns.
template <int kV>
inline void values_block(const float* P, std::int64_t keys, std::int64_t key_stride,
                         const float* VP, std::int64_t value_stride, float* O) {
    Vec16 acc[kRows][kV];
    for (int r = 0; r < kRows; ++r)
        for (int v = 0; v < kV; ++v) acc[r][v] = load(O + r * value_stride + v * kLanes);
    for (std::int64_t c = 0; c < keys; ++c) {
        Vec16 values[kV];
        for (int v = 0; v < kV; ++v) values[v] = load(VP + c * value_stride + v * kLanes);
        for (int r = 0; r < kRows; ++r) {
            const Vec16 p = splat(P[r * key_stride + c]);
            for (int v = 0; v < kV; ++v) acc[r][v] += p * values[v];
        }
    }
    for (int r = 0; r < kRows; ++r)
        for (int v = 0; v < kV; ++v) store(O + r * value_stride + v * kLanes, acc[r][v]);
}

// O += P V_j for kRows rows, keys [0, keys), all value_stride columns: blocks of 64 columns, then
// the 16-, 32- or 48-column rest.
inline void add_values(const float* P, std::int64_t keys, std::int64_t key_stride,
                       const float* VP, std::int64_t value_stride, float* O) {
    std::int64_t col = 0;
    for (; col + kBlockCols <= value_stride; col += kBlockCols)
        values_block<kVecs>(P, keys, key_stride, VP + col, value_stride, O + col);
    switch ((value_stride - col) / kLanes) {
        case 3: values_block<3>(P, keys, key_stride, VP + col, value_stride, O + col); break;
        case 2: values_block<2>(P, keys, key_stride, VP + col, value_stride, O + col); break;
        case 1: values_block<1>(P, keys, key_stride, VP + col, value_stride, O + col); break;
        default: break;
    }
}

}  // namespace flashattn::tiles
