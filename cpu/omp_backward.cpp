// cpu/omp_backward.cpp — FlashAttention-2's backward pass on the CPU; see omp.hpp and docs/omp.md.
//
// FlashAttention-2 (arXiv 2307.08691), §3.1.2 and Algorithm 2, with the rule of common/backward.hpp.
// Each statement that does a line of that Algorithm 2 carries a tag "FA2-Alg2 Ln:", linked from
// docs/fa2_backward_walkthrough.md and checked by tests/test_docs_drift.py. key_tile_task is the
// body of the loop over j (lines 6-18), in the paper's order; make_layout does lines 1-2 and
// omp_backward 3-5, 19, 20. Per (batch, K/V head), with D_i = rowsum(dO_i o O_i) first (line 4):
//   for each K/V tile j:                         dK_j = 0, dV_j = 0 (on chip)
//     for each query tile i (of every query head of the K/V head's GQA group):
//       S_ij  = scale Q_i K_j^T,   P_ij = exp(S_ij - L_i)            (lines 10, 11)
//       dV_j += P_ij^T dO_i                                            (line 12)
//       dP_ij = dO_i V_j^T,        dS_ij = P_ij o (dP_ij - D_i)        (lines 13, 14)
//       dQ_i += dS_ij K_j,         dK_j += dS_ij^T Q_i                 (lines 15, 16)
//     dK_j = scale dK_j, written once; dQ = scale dQ at the end        (line 18; the paper's
//                                                                        Algorithm 2 has no scale)
// Where this departs from the paper: O_i is never loaded (line 9 lists it, but only line 4's D
// needed it); the scale multiplies S and then, once, the finished dK_j and dQ; and dQ_i, which
// the GPU adds with atomics (§3.2), is added here without races, as below.
//
// Parallel, without races and with the same bits for any thread count:
//   * Every dK_j, dV_j is the sum of one task's tiles, in a fixed order (query heads of the group,
//     then query tiles i ascending). Tasks are (batch, K/V head) groups or (batch, K/V head, j).
//   * dQ_i is the sum over j ascending of dS_ij K_j. With at least as many (batch, K/V head)
//     groups as threads, one task per group runs j outer and adds every dQ_i contribution as it
//     goes (5 tile products per tile pair, as the paper counts: 2.5x the forward's FLOPs). With
//     fewer, there would be idle threads, so the work is split in two passes: dK, dV over tasks
//     (group, j), then dQ over tasks (query head, i), which recomputes S_ij, dP_ij (7 products
//     per tile pair, but every thread busy). Both passes compute each tile pair with the same
//     functions and add each dQ_i contribution in the same order, into an accumulator of the same
//     layout, so the two plans give identical bits (tests/test_backward.cpp checks 1-4 threads).
// Working memory: tile buffers per thread, the D vector (one float per query row) and, in the one-
// pass plan when d is not a multiple of the vector width, one group's dQ accumulator (N_q x d).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/backward.hpp"
#include "cpu/omp.hpp"
#include "cpu/parallel.hpp"
#include "cpu/tile_products.hpp"
#include "cpu/vector_softmax.hpp"
#include "cpu/workspace.hpp"

namespace flashattn {
namespace {

using tiles::kRows;
using tiles::round_up;

constexpr std::int64_t kAlignFloats = 16;  // 64 bytes

// Tile sizes of the backward: Br query rows (a multiple of 48, so of any row group), Bc keys (a
// multiple of 64, the widest score block). Five products per tile pair, and the buffers below are
// ~9 tiles: 96 x 128 at d <= 64 keeps one thread's buffers near 400 KiB, within its L2.
BlockSizes omp_backward_blocks(const AttentionProblem& p) {
    if (p.block_q > 0 || p.sram_floats > 0) return block_sizes_for(p);
    return {96, p.dim <= 64 ? 128 : 64};
}

struct Layout {
    BlockSizes blocks;
    std::int64_t Tr = 0, Tc = 0;
    std::int64_t vs = 0;        // value_stride: d rounded up to whole vectors
    std::int64_t rs = 0;        // row_stride: Br rounded up to whole row groups
    std::int64_t ks = 0;        // key_stride: Bc rounded up to whole score blocks
    std::int64_t key_rows = 0;  // Bc rounded up to whole row groups (rows of P^T, dK_j, dV_j)
};

Layout make_layout(const AttentionProblem& p) {
    Layout L;
    L.blocks = omp_backward_blocks(p);
    L.blocks.Br = std::min(L.blocks.Br, p.seq_q);
    L.blocks.Bc = std::min(L.blocks.Bc, p.seq_kv);
    // FA2-Alg2 L1: Q in Tr blocks of Br rows, K and V in Tc blocks of Bc rows (the last may be short)
    L.Tr = tile_count(p.seq_q, L.blocks.Br);  // FA2-Alg2 L2: dO and L (and line 4's D) in Tr blocks too
    L.Tc = tile_count(p.seq_kv, L.blocks.Bc);
    L.vs = round_up(p.dim, tiles::kLanes);
    L.rs = round_up(L.blocks.Br, kRows);
    L.ks = round_up(L.blocks.Bc, tiles::kBlockCols);
    L.key_rows = round_up(L.blocks.Bc, kRows);
    return L;
}

// One thread's buffers (64-byte aligned pieces of one WorkBuffer). Padding rows and columns are
// zero, so every product runs on whole blocks.
struct ThreadBuffers {
    WorkBuffer<float> storage;
    float *Qp, *dOp;      // rs x vs: Q_i, dO_i
    float *KT, *VT;       // vs x ks: K_j^T, V_j^T (rows k >= d zero)
    float* Kp;            // ks x vs: K_j
    float *P, *dS;        // rs x ks: P_ij, dS_ij (dP_ij first, in place)
    float *PT, *dST;      // key_rows x rs: their transposes
    float *dK, *dV;       // key_rows x vs: dK_j, dV_j accumulators
    float* dQ;            // rs x vs: the dQ_i accumulator of the two-pass plan
    float *L_i, *D_i;     // rs: the rows' LSE and D
    float* tail;          // kRows x vs: scratch for a partial row group of dQ
    bool query_nonfinite = false, key_nonfinite = false;  // Q_i/dO_i, K_j hold an inf or NaN

    explicit ThreadBuffers(const Layout& L)
        : storage(static_cast<std::size_t>(floats(L) + kAlignFloats), "omp's backward tiles") {
        const std::size_t misaligned = reinterpret_cast<std::uintptr_t>(storage.data()) % 64;
        float* next = storage.data() + (misaligned ? (64 - misaligned) / sizeof(float) : 0);
        const auto carve = [&next](std::int64_t n) {
            float* part = next;
            next += round_up(n, kAlignFloats);
            return part;
        };
        Qp = carve(L.rs * L.vs), dOp = carve(L.rs * L.vs);
        KT = carve(L.vs * L.ks), VT = carve(L.vs * L.ks), Kp = carve(L.ks * L.vs);
        P = carve(L.rs * L.ks), dS = carve(L.rs * L.ks);
        PT = carve(L.key_rows * L.rs), dST = carve(L.key_rows * L.rs);
        dK = carve(L.key_rows * L.vs), dV = carve(L.key_rows * L.vs), dQ = carve(L.rs * L.vs);
        L_i = carve(L.rs), D_i = carve(L.rs), tail = carve(kRows * L.vs);
    }
    static std::int64_t floats(const Layout& L) {
        return work_elements(L.rs, 3 * L.vs) + work_elements(L.vs, 3 * L.ks) +
               work_elements(L.rs, 2 * L.ks) + work_elements(L.key_rows, 2 * L.rs + 2 * L.vs) +
               2 * L.rs + kRows * L.vs + 16 * kAlignFloats;
    }
};

bool all_finite(const float* x, std::int64_t n) {
    for (std::int64_t e = 0; e < n; ++e)
        if (!std::isfinite(x[e])) return false;
    return true;
}

// Pointers to one (batch, query head) pair's rows.
struct HeadArrays {
    const float *Q, *K, *V, *dO, *lse, *D;
};

// Q_i, dO_i, L_i, D_i of query tile `rows` into the thread's buffers.
void load_query_tile(const AttentionProblem& p, const Layout& L, const HeadArrays& a,
                     TileRange rows, ThreadBuffers& t) {
    const std::int64_t d = p.dim, br = rows.size();
    for (std::int64_t r = 0; r < L.rs; ++r) {
        float* q = t.Qp + r * L.vs;
        float* g = t.dOp + r * L.vs;
        const std::int64_t n = r < br ? d : 0;
        std::copy(a.Q + (rows.begin + r) * d, a.Q + (rows.begin + r) * d + n, q);
        std::copy(a.dO + (rows.begin + r) * d, a.dO + (rows.begin + r) * d + n, g);
        std::fill(q + n, q + L.vs, 0.0f);
        std::fill(g + n, g + L.vs, 0.0f);
        t.L_i[r] = r < br ? a.lse[rows.begin + r] : -INFINITY;
        t.D_i[r] = r < br ? a.D[rows.begin + r] : 0.0f;
    }
    t.query_nonfinite = !all_finite(a.Q + rows.begin * d, br * d) ||
                        !all_finite(a.dO + rows.begin * d, br * d);
}

// K_j^T, V_j^T (for the score products) and K_j (for dQ += dS K_j) of key tile `cols`.
void load_key_tile(const AttentionProblem& p, const Layout& L, const HeadArrays& a,
                   TileRange cols, ThreadBuffers& t) {
    const std::int64_t d = p.dim, bc = cols.size();
    tiles::pack_keys_transposed(a.K + cols.begin * d, bc, d, L.ks, t.KT);
    tiles::pack_keys_transposed(a.V + cols.begin * d, bc, d, L.ks, t.VT);
    std::fill(t.KT + d * L.ks, t.KT + L.vs * L.ks, 0.0f);
    std::fill(t.VT + d * L.ks, t.VT + L.vs * L.ks, 0.0f);
    tiles::pack_values(a.K + cols.begin * d, bc, d, L.ks, L.vs, t.Kp);
    t.key_nonfinite = !all_finite(a.K + cols.begin * d, bc * d);
}

// Algorithm 2 line 10 (the scale folded in): S_ij = scale Q_i K_j^T into t.P, kRows rows at a time.
void tile_scores(const Layout& L, TileRange rows, TileRange cols, float scale, ThreadBuffers& t) {
    const std::int64_t keys = round_up(cols.size(), tiles::kBlockCols);
    for (std::int64_t r0 = 0; r0 < rows.size(); r0 += kRows)
        tiles::scores(t.Qp + r0 * L.vs, L.vs, t.KT, keys, L.ks, scale, t.P + r0 * L.ks);
}

// Algorithm 2 line 11: P_ij = exp(S_ij - L_i), in place; masked pairs and padding get exactly 0.
void tile_probabilities(const AttentionProblem& p, const Layout& L, TileRange rows,
                        TileRange cols, TileVisibility visibility, ThreadBuffers& t) {
    const std::int64_t br = rows.size(), bc = cols.size();
    for (std::int64_t r = 0; r < L.rs; ++r) {
        float* P_r = t.P + r * L.ks;
        if (r >= br) {  // a padding row
            std::fill(P_r, P_r + L.ks, 0.0f);
            continue;
        }
        if (visibility == TileVisibility::partial)
            for (std::int64_t c = 0; c < bc; ++c)
                if (!p.key_visible(rows.begin + r, cols.begin + c)) P_r[c] = -INFINITY;
        probability_row(P_r, bc, t.L_i[r]);
        std::fill(P_r + bc, P_r + L.ks, 0.0f);
    }
}

// Algorithm 2 line 13: dP_ij = dO_i V_j^T into t.dS (line 14 turns it into dS_ij in place).
void tile_output_gradient(const Layout& L, TileRange rows, TileRange cols, ThreadBuffers& t) {
    const std::int64_t keys = round_up(cols.size(), tiles::kBlockCols);
    for (std::int64_t r0 = 0; r0 < rows.size(); r0 += kRows)
        tiles::scores(t.dOp + r0 * L.vs, L.vs, t.VT, keys, L.ks, 1.0f, t.dS + r0 * L.ks);
}

// Algorithm 2 line 14: dS_ij = P_ij o (dP_ij - D_i), in place; masked pairs and padding get 0.
void tile_score_gradient(const AttentionProblem& p, const Layout& L, TileRange rows,
                         TileRange cols, TileVisibility visibility, ThreadBuffers& t) {
    const std::int64_t br = rows.size(), bc = cols.size();
    for (std::int64_t r = 0; r < L.rs; ++r) {
        const float* P_r = t.P + r * L.ks;
        float* dS_r = t.dS + r * L.ks;
        if (r >= br) {  // a padding row
            std::fill(dS_r, dS_r + L.ks, 0.0f);
            continue;
        }
        const float D = t.D_i[r];
#pragma omp simd
        for (std::int64_t c = 0; c < bc; ++c) dS_r[c] = score_gradient(P_r[c], dS_r[c], D);
        if (visibility == TileVisibility::partial)  // dP of a masked pair may be NaN (V's)
            for (std::int64_t c = 0; c < bc; ++c)
                if (!p.key_visible(rows.begin + r, cols.begin + c)) dS_r[c] = 0.0f;
        std::fill(dS_r + bc, dS_r + L.ks, 0.0f);
    }
}

// X^T of an rs x ks tile (P_ij or dS_ij) into key_rows x rs, for the products with key rows.
void transpose_tile(const Layout& L, TileRange cols, const float* X, float* XT) {
    const std::int64_t bc = cols.size();
    for (std::int64_t c = 0; c < L.key_rows; ++c)
        for (std::int64_t r = 0; r < L.rs; ++r) XT[c * L.rs + r] = c < bc ? X[r * L.ks + c] : 0.0f;
}

// A partly masked tile whose Q_i, dO_i or K_j holds an inf or NaN: 0 (a masked pair's P or dS)
// times inf is NaN, so there the products skip masked pairs one by one instead of multiplying
// by 0 (a masked pair is absent from every sum, common/backward.hpp). Rare; plain loops.
bool needs_masked_products(TileVisibility visibility, const ThreadBuffers& t) {
    return visibility == TileVisibility::partial && (t.query_nonfinite || t.key_nonfinite);
}

// Algorithm 2 lines 12 and 16, one product of two shapes: out_j += A^T B for the (rows x cols)
// tile A and the query tile's B. Line 12: dV_j += P_ij^T dO_i; line 16: dK_j += dS_ij^T Q_i
// (unscaled: the scale is applied once, at line 18). A^T is formed in AT for the tile product.
void add_transposed_product(const AttentionProblem& p, const Layout& L, TileRange rows,
                            TileRange cols, TileVisibility visibility, const ThreadBuffers& t,
                            const float* A, float* AT, const float* B, float* out) {
    const std::int64_t br = rows.size(), bc = cols.size();
    if (needs_masked_products(visibility, t)) {
        for (std::int64_t c = 0; c < bc; ++c)
            for (std::int64_t r = 0; r < br; ++r) {
                if (!p.key_visible(rows.begin + r, cols.begin + c)) continue;
                for (std::int64_t k = 0; k < p.dim; ++k)
                    out[c * L.vs + k] += A[r * L.ks + c] * B[r * L.vs + k];
            }
        return;
    }
    transpose_tile(L, cols, A, AT);
    for (std::int64_t c0 = 0; c0 < bc; c0 += kRows)
        tiles::add_values(AT + c0 * L.rs, br, L.rs, B, L.vs, out + c0 * L.vs);
}

// Algorithm 2 line 15: dQ_i += dS_ij K_j into an accumulator of rs rows x vs (dQ_i unscaled).
void accumulate_query_gradient(const AttentionProblem& p, const Layout& L, TileRange rows,
                               TileRange cols, TileVisibility visibility, ThreadBuffers& t,
                               float* dQ_acc) {
    const std::int64_t br = rows.size(), bc = cols.size();
    if (needs_masked_products(visibility, t)) {
        for (std::int64_t r = 0; r < br; ++r)
            for (std::int64_t c = 0; c < bc; ++c) {
                if (!p.key_visible(rows.begin + r, cols.begin + c)) continue;
                for (std::int64_t k = 0; k < p.dim; ++k)
                    dQ_acc[r * L.vs + k] += t.dS[r * L.ks + c] * t.Kp[c * L.vs + k];
            }
        return;
    }
    for (std::int64_t r0 = 0; r0 < br; r0 += kRows) {
        if (r0 + kRows <= br) {
            tiles::add_values(t.dS + r0 * L.ks, bc, L.ks, t.Kp, L.vs, dQ_acc + r0 * L.vs);
            continue;
        }
        // The last, partial row group: its padding rows must not touch the accumulator's next
        // rows (another tile's, or past the end), so it goes through a kRows-row scratch.
        const std::int64_t valid = (br - r0) * L.vs;
        std::copy(dQ_acc + r0 * L.vs, dQ_acc + r0 * L.vs + valid, t.tail);
        std::fill(t.tail + valid, t.tail + kRows * L.vs, 0.0f);
        tiles::add_values(t.dS + r0 * L.ks, bc, L.ks, t.Kp, L.vs, t.tail);
        std::copy(t.tail, t.tail + valid, dQ_acc + r0 * L.vs);
    }
}

struct Inputs {
    const AttentionProblem& p;
    const Layout& L;
    const BackwardInputs& in;
    const float* D;  // D_i of every (batch, head, row)
    HeadArrays head(std::int64_t b, std::int64_t h) const {
        return {in.Q + p.q_offset(b, h),    in.K + p.kv_offset(b, h), in.V + p.kv_offset(b, h),
                in.dO + p.q_offset(b, h),   in.lse + p.lse_offset(b, h),
                D + p.lse_offset(b, h)};
    }
};

// The body of Algorithm 2's loop over j (lines 6-18) for key tile j of K/V head g of batch b:
// dK_j, dV_j summed over the group's query heads and every query tile; with dQ_group set (the
// one-pass plan), also adds each tile pair's dS_ij K_j to the group's dQ accumulator (heads x N_q
// rows of vs floats, rows of head h at (h - first head) * N_q).
void key_tile_task(const Inputs& x, std::int64_t b, std::int64_t g, std::int64_t j,
                   ThreadBuffers& t, float* dQ_group, float* dK, float* dV) {
    const AttentionProblem& p = x.p;
    const Layout& L = x.L;
    const TileRange cols = tile_range(j, L.blocks.Bc, p.seq_kv);
    const std::int64_t G = p.group_size(), d = p.dim;
    const float scale = p.softmax_scale();
    // FA2-Alg2 L6: load K_j, V_j from HBM to on-chip SRAM (as K_j^T, V_j^T and K_j)
    load_key_tile(p, L, x.head(b, g * G), cols, t);
    // FA2-Alg2 L7: initialize dK_j = 0, dV_j = 0 on chip
    std::fill(t.dK, t.dK + L.key_rows * L.vs, 0.0f);
    std::fill(t.dV, t.dV + L.key_rows * L.vs, 0.0f);
    for (std::int64_t h = g * G; h < (g + 1) * G; ++h)  // (GQA: every query head that reads K_j, V_j)
        for (std::int64_t i = 0; i < L.Tr; ++i) {  // FA2-Alg2 L8: for 1 <= i <= Tr
            const TileRange rows = tile_range(i, L.blocks.Br, p.seq_q);
            const TileVisibility visibility = classify_tile(p, rows, cols);
            if (visibility == TileVisibility::none) continue;  // Algorithm 5: a zero block
            // FA2-Alg2 L9: load Q_i, dO_i, L_i, D_i (not O_i: D_i replaces it; dQ_i: at line 15)
            load_query_tile(p, L, x.head(b, h), rows, t);
            tile_scores(L, rows, cols, scale, t);  // FA2-Alg2 L10: S_ij = scale Q_i K_j^T
            tile_probabilities(p, L, rows, cols, visibility, t);  // FA2-Alg2 L11: P_ij = exp(S_ij - L_i)
            // FA2-Alg2 L12: dV_j += P_ij^T dO_i
            add_transposed_product(p, L, rows, cols, visibility, t, t.P, t.PT, t.dOp, t.dV);
            tile_output_gradient(L, rows, cols, t);  // FA2-Alg2 L13: dP_ij = dO_i V_j^T
            tile_score_gradient(p, L, rows, cols, visibility, t);  // FA2-Alg2 L14: dS_ij = P_ij o (dP_ij - D_i)
            if (dQ_group)  // FA2-Alg2 L15: dQ_i += dS_ij K_j (unscaled), in place of an atomic add
                accumulate_query_gradient(p, L, rows, cols, visibility, t,
                                          dQ_group + ((h - g * G) * p.seq_q + rows.begin) * L.vs);
            // FA2-Alg2 L16: dK_j += dS_ij^T Q_i
            add_transposed_product(p, L, rows, cols, visibility, t, t.dS, t.dST, t.Qp, t.dK);
        }  // FA2-Alg2 L17: end for (i)
    float* dK_j = dK + p.kv_offset(b, g * G) + cols.begin * d;
    float* dV_j = dV + p.kv_offset(b, g * G) + cols.begin * d;
    // FA2-Alg2 L18: write dK_j (times the scale, once), dV_j to HBM
    for (std::int64_t c = 0; c < cols.size(); ++c)
        for (std::int64_t k = 0; k < d; ++k) {
            dK_j[c * d + k] = scale * t.dK[c * L.vs + k];
            dV_j[c * d + k] = t.dV[c * L.vs + k];
        }
}

// The second pass of the two-pass plan: dQ_i of query head h, over every key tile in order. It
// repeats Algorithm 2's lines 10, 11, 13 and 14 for each tile pair and does line 15 on chip, so
// that no two threads add into the same dQ_i (the paper's GPU version uses atomic adds).
void query_tile_task(const Inputs& x, std::int64_t b, std::int64_t h, std::int64_t i,
                     ThreadBuffers& t, float* dQ) {
    const AttentionProblem& p = x.p;
    const Layout& L = x.L;
    const TileRange rows = tile_range(i, L.blocks.Br, p.seq_q);
    const HeadArrays a = x.head(b, h);
    const float scale = p.softmax_scale();
    load_query_tile(p, L, a, rows, t);
    std::fill(t.dQ, t.dQ + L.rs * L.vs, 0.0f);
    for (std::int64_t j = 0; j < L.Tc; ++j) {
        const TileRange cols = tile_range(j, L.blocks.Bc, p.seq_kv);
        const TileVisibility visibility = classify_tile(p, rows, cols);
        if (visibility == TileVisibility::none) continue;
        load_key_tile(p, L, a, cols, t);
        tile_scores(L, rows, cols, scale, t);
        tile_probabilities(p, L, rows, cols, visibility, t);
        tile_output_gradient(L, rows, cols, t);
        tile_score_gradient(p, L, rows, cols, visibility, t);
        accumulate_query_gradient(p, L, rows, cols, visibility, t, t.dQ);
    }
    float* out = dQ + p.q_offset(b, h) + rows.begin * p.dim;
    for (std::int64_t r = 0; r < rows.size(); ++r)
        for (std::int64_t k = 0; k < p.dim; ++k) out[r * p.dim + k] = scale * t.dQ[r * L.vs + k];
}

}  // namespace

void omp_backward(const AttentionProblem& p, const BackwardInputs& in, float* dQ, float* dK,
                  float* dV) {
    validate(p);
    require_backward_inputs(in);
    require_array(dQ, "dQ"), require_array(dK, "dK"), require_array(dV, "dV");
    const Layout L = make_layout(p);
    const std::int64_t d = p.dim, G = p.group_size(), groups = p.batch * p.heads_kv;

    // D_i = rowsum(dO_i o O_i) for every row first: the only place O is read.
    WorkBuffer<float> D(static_cast<std::size_t>(p.lse_elements()), "omp's backward D");
    // FA2-Alg2 L4: D = rowsum(dO o O), written to "HBM" (the D buffer), in Tr blocks like L
    parallel_for(p.batch * p.heads, [&](std::int64_t bh) {
        const std::int64_t off = bh * p.seq_q;
        for (std::int64_t r = 0; r < p.seq_q; ++r)
            D[off + r] = output_delta(in.dO + (off + r) * d, in.O + (off + r) * d, d);
    });
    const Inputs x{p, L, in, D.data()};
    const auto make_buffers = [&] { return ThreadBuffers(L); };

    if (groups >= omp_get_max_threads()) {
        // One pass: a task per (batch, K/V head), j outer, dQ added as it goes. The accumulator is
        // dQ itself where its rows already have the padded layout (d a multiple of the vector
        // width), else one group's N_q x vs rows per thread.
        const bool in_place = d == L.vs;
        parallel_for_with_state(
            groups,
            [&] {
                return std::make_pair(make_buffers(),
                                      WorkBuffer<float>(in_place ? 0 : G * p.seq_q * L.vs));
            },
            [&](auto& state, std::int64_t bg) {
                auto& [t, own_dQ] = state;
                const std::int64_t b = bg / p.heads_kv, g = bg % p.heads_kv;
                float* acc = in_place ? dQ + p.q_offset(b, g * G) : own_dQ.data();
                // FA2-Alg2 L3: initialize dQ = 0 (this group's; dK, dV are written whole at line 18)
                std::fill(acc, acc + G * p.seq_q * L.vs, 0.0f);
                for (std::int64_t j = 0; j < L.Tc; ++j)  // FA2-Alg2 L5: for 1 <= j <= Tc (in order)
                    key_tile_task(x, b, g, j, t, acc, dK, dV);  // FA2-Alg2 L19: end for (j)
                const float scale = p.softmax_scale();
                float* out = dQ + p.q_offset(b, g * G);
                for (std::int64_t r = 0; r < G * p.seq_q; ++r)
                    for (std::int64_t k = 0; k < d; ++k) out[r * d + k] = scale * acc[r * L.vs + k];
            });
        return;  // FA2-Alg2 L20: return dQ, dK, dV
    }
    // Two passes, every thread busy: dK, dV over (batch, K/V head, j), the first key tiles (the
    // most query rows under a causal mask) first; then dQ over (batch, head, i), last tiles first.
    // FA2-Alg2 L5: for 1 <= j <= Tc, every (group, j) a task, as the paper's thread blocks (§3.2)
    parallel_for_with_state(groups * L.Tc, make_buffers, [&](ThreadBuffers& t, std::int64_t item) {
        const std::int64_t bg = item / L.Tc, j = item % L.Tc;
        key_tile_task(x, bg / p.heads_kv, bg % p.heads_kv, j, t, nullptr, dK, dV);
    });  // FA2-Alg2 L19: end for (j)
    parallel_for_with_state(p.batch * p.heads * L.Tr, make_buffers,
                            [&](ThreadBuffers& t, std::int64_t item) {
                                const std::int64_t bh = item / L.Tr, i = L.Tr - 1 - item % L.Tr;
                                query_tile_task(x, bh / p.heads, bh % p.heads, i, t, dQ);
                            });
}  // FA2-Alg2 L20: return dQ, dK, dV

}  // namespace flashattn
