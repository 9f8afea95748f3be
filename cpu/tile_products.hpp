// cpu/tile_products.hpp — the two tile products of the omp form, register-blocked:
//
//     scores:  S = scale Q_i K_j^T      (FA-2 Algorithm 1 line 8)
//     values:  O_i += P_ij V_j          (line 9, after the softmax has turned S into P)
//
// Why not a library GEMM: the products here are small (a few rows of Q_i at a time against a
// 64 x 512 K_j^T) and run once per tile pair, and a general GEMM spends part of each call packing
// and unpacking. The blocks below run these tiles faster than Eigen's GEMM, and that is what lets
// the flash form beat standard attention (which keeps Eigen's GEMMs) by more than standard's
// N x N memory traffic costs it (measurements: docs/omp.md, section "tile_products.hpp").
//
// How: a block of kRows query rows x kVecs vectors of columns lives in kRows kVecs vector
// registers; every step of the inner loop loads kVecs vectors of one operand, broadcasts kRows
// scalars of the other and issues kRows kVecs fused multiply-adds, so the arithmetic, not the
// loads, sets the pace. The block is sized to the register file the compiler targets:
//   AVX-512: 16-float vectors, 6 rows x 4 vectors (6 x 64 floats): 24 accumulators + 4 operands
//            + 1 broadcast of its 32 registers (8 rows, 32 accumulators, did not fit: the
//            compiler spilled some, and it measured 1-2% slower);
//   AVX2:    8-float vectors, 6 x 2 (6 x 16 floats): 12 + 2 + 1 of its 16 registers;
//   other:   4-float vectors (SSE2, the x86-64 baseline), 4 x 3 (4 x 12): 12 + 3 + 1 of 16
//            (SSE2 has no broadcast from memory, so fewer rows and more columns; 6 x 2 ran ~8%
//            slower than Eigen's GEMM there, 4 x 3 as fast).
// Each output element is one running sum in a fixed order (k = 0, 1, ... for S; key 0, 1, ...
// for O), whatever thread runs it.
//
// The vectors are GCC/Clang vector extensions (`vector_size`), so the same code builds for each
// of those targets (and for any other CPU, where the compiler splits or scalarizes them).
//
// Layouts (all row-major, padded with zeros so that every block is whole):
//   Q rows:  kRows rows of d floats (stride d).
//   K_j^T:   d rows of key_stride floats: K_j transposed, keys bc .. key_stride-1 zero.
//   V_j:     key_stride rows of value_stride floats: rows bc.. zero, columns d.. zero.
//   S / P:   kRows rows of key_stride floats.   O_i rows: kRows rows of value_stride floats.
// key_stride is a multiple of kBlockCols (kVecs vectors), value_stride a multiple of kLanes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common/problem.hpp"

namespace flashattn::tiles {

#if defined(__AVX512F__)
constexpr std::int64_t kLanes = 16;  // floats per vector
constexpr int kVecs = 4;             // vectors of columns per block
constexpr int kRows = 6;             // query rows per block
#elif defined(__AVX__)
constexpr std::int64_t kLanes = 8;
constexpr int kVecs = 2;
constexpr int kRows = 6;
#else
constexpr std::int64_t kLanes = 4;
constexpr int kVecs = 3;
constexpr int kRows = 4;
#endif
constexpr std::int64_t kBlockCols = kVecs * kLanes;
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));

inline Vec load(const float* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);  // an unaligned vector load
    return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

// {x, x, ..., x}: one broadcast instruction. (Not `Vec{} + x`: 0 + x is not x for x = -0, so
// the compiler keeps a scalar add for every broadcast.)
template <std::size_t... lane>
inline Vec splat(float x, std::index_sequence<lane...>) {
    return Vec{((void)lane, x)...};
}
inline Vec splat(float x) { return splat(x, std::make_index_sequence<kLanes>{}); }

inline std::int64_t round_up(std::int64_t n, std::int64_t multiple) {
    return ceil_div(n, multiple) * multiple;
}

// K_j (bc x d, stride d) -> K_j^T (d x key_stride), zero beyond key bc, kTransposeKeys keys at a
// time: their rows of K_j (d floats each) stay in L1 while each row k of K_j^T gets
// kTransposeKeys consecutive floats, one whole 64-byte line. Writing one key's d values at a time
// instead touches d lines key_stride floats apart; when key_stride is a power of two (512 at
// d = 64) those lines share a few L1 sets and evict each other on every key. In prefill the
// packing is shared by a thousand query rows; in a decoding step it serves a few, and that
// layout made it most of the step's time (docs/decoding.md).
constexpr std::int64_t kTransposeKeys = 16;
inline void pack_keys_transposed(const float* K_j, std::int64_t bc, std::int64_t d,
                                 std::int64_t key_stride, float* KT) {
    for (std::int64_t c0 = 0; c0 < bc; c0 += kTransposeKeys) {
        const std::int64_t c1 = std::min(c0 + kTransposeKeys, bc);
        for (std::int64_t k = 0; k < d; ++k) {
            float* KT_k = KT + k * key_stride;
            for (std::int64_t c = c0; c < c1; ++c) KT_k[c] = K_j[c * d + k];
        }
    }
    for (std::int64_t k = 0; k < d; ++k)
        std::fill(KT + k * key_stride + bc, KT + (k + 1) * key_stride, 0.0f);
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
    Vec acc[kRows][kVecs] = {};
    for (std::int64_t k = 0; k < d; ++k) {
        Vec keys[kVecs];
        for (int v = 0; v < kVecs; ++v) keys[v] = load(KT + k * key_stride + v * kLanes);
        for (int r = 0; r < kRows; ++r) {
            const Vec q = splat(Q[r * d + k]);
            for (int v = 0; v < kVecs; ++v) acc[r][v] += q * keys[v];
        }
    }
    // The scale multiplies each finished dot product (as standard attention's GEMM alpha does):
    // scaling Q first would round every q once more, which large logits would show.
    for (int r = 0; r < kRows; ++r)
        for (int v = 0; v < kVecs; ++v) store(S + r * key_stride + v * kLanes, acc[r][v] * scale);
}

// S[c] = scale * sum_k q[k] K_j[c][k] for one query row q and keys c in [0, bc), K_j read where it
// lies (bc x d, stride d). For a single row (decoding without GQA) packing K_j^T would copy the
// tile to use it once, and scores_block's rows would be kRows - 1 rows of zeros; here each key's
// row is read once. kKeys keys at a time keep that many independent sums in flight. Each dot
// product sums in a fixed order, whatever thread runs it: lane l of the vector takes k = l,
// l + kLanes, ...; then the lanes in order; then the k past the last whole vector.
inline void scores_row(const float* q, std::int64_t d, const float* K_j, std::int64_t bc,
                       float scale, float* S) {
    constexpr int kKeys = 4;
    const std::int64_t whole = d / kLanes * kLanes;
    const auto finish = [&](const Vec& acc, const float* key) {
        float sum = 0.0f;
        for (int lane = 0; lane < kLanes; ++lane) sum += acc[lane];
        for (std::int64_t k = whole; k < d; ++k) sum += q[k] * key[k];
        return sum * scale;  // the scale after the sum, as scores_block says
    };
    std::int64_t c = 0;
    for (; c + kKeys <= bc; c += kKeys) {
        Vec acc[kKeys] = {};
        for (std::int64_t k = 0; k < whole; k += kLanes) {
            const Vec qk = load(q + k);
            for (int u = 0; u < kKeys; ++u) acc[u] += qk * load(K_j + (c + u) * d + k);
        }
        for (int u = 0; u < kKeys; ++u) S[c + u] = finish(acc[u], K_j + (c + u) * d);
    }
    for (; c < bc; ++c) {
        Vec acc = {};
        for (std::int64_t k = 0; k < whole; k += kLanes) acc += load(q + k) * load(K_j + c * d + k);
        S[c] = finish(acc, K_j + c * d);
    }
}

// S = scale Q K_j^T for kRows rows of Q and keys [0, keys), keys a multiple of kBlockCols.
inline void scores(const float* Q, std::int64_t d, const float* KT, std::int64_t keys,
                   std::int64_t key_stride, float scale, float* S) {
    for (std::int64_t c = 0; c < keys; c += kBlockCols)
        scores_block(Q, d, KT + c, key_stride, scale, S + c);
}

// O[r][.] += sum_c P[r][c] V[c][.] for kR rows (kRows, or 1 for decoding) and kV vectors of
// output columns. The keys go
// in chunks of kKeyChunk, each summed in fresh registers and then added to O: one float chain
// over every key of a long row drifts by ~sqrt(N) ulps, more than the tests' 2x rule allows
// against standard attention's blocked GEMM sums at small d (test_variants, "long sums").
constexpr std::int64_t kKeyChunk = 128;
template <int kV, int kR>
inline void values_block(const float* P, std::int64_t keys, std::int64_t key_stride,
                         const float* VP, std::int64_t value_stride, float* O) {
    for (std::int64_t c0 = 0; c0 < keys; c0 += kKeyChunk) {
        const std::int64_t c1 = std::min(keys, c0 + kKeyChunk);
        Vec acc[kR][kV] = {};
        for (std::int64_t c = c0; c < c1; ++c) {
            Vec values[kV];
            for (int v = 0; v < kV; ++v) values[v] = load(VP + c * value_stride + v * kLanes);
            for (int r = 0; r < kR; ++r) {
                const Vec p = splat(P[r * key_stride + c]);
                for (int v = 0; v < kV; ++v) acc[r][v] += p * values[v];
            }
        }
        for (int r = 0; r < kR; ++r)
            for (int v = 0; v < kV; ++v) {
                float* out = O + r * value_stride + v * kLanes;
                store(out, load(out) + acc[r][v]);
            }
    }
}

// O += P V_j for kR rows (kRows, or 1 for decoding), keys [0, keys), all value_stride columns:
// blocks of kBlockCols columns, then the rest (1 to kVecs - 1 vectors; with AVX-512, 16, 32 or
// 48 floats).
template <int kR = kRows>
inline void add_values(const float* P, std::int64_t keys, std::int64_t key_stride,
                       const float* VP, std::int64_t value_stride, float* O) {
    std::int64_t col = 0;
    for (; col + kBlockCols <= value_stride; col += kBlockCols)
        values_block<kVecs, kR>(P, keys, key_stride, VP + col, value_stride, O + col);
    switch ((value_stride - col) / kLanes) {
        case 3: values_block<3, kR>(P, keys, key_stride, VP + col, value_stride, O + col); break;
        case 2: values_block<2, kR>(P, keys, key_stride, VP + col, value_stride, O + col); break;
        case 1: values_block<1, kR>(P, keys, key_stride, VP + col, value_stride, O + col); break;
        default: break;
    }
}

}  // namespace flashattn::tiles
