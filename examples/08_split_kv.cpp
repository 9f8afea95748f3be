// examples/08_split_kv.cpp — split-KV decoding (Flash-Decoding) on one query row, stepped through.
//
// A decoding step attends one query row to a long key sequence. Split-KV cuts the keys into S
// chunks, computes each chunk's partial result on its own -- Algorithm 1's loop (FlashAttention,
// arXiv 2205.14135, lines 9-12) over the chunk's key tiles only, ending with O_s normalized by the
// chunk's own sum and LSE_s = m_s + log l_s -- and merges the S partials. The merge is Algorithm
// 1's update applied to whole chunks: a chunk is the state (m, l) = (LSE_s, 1), so line 11 gives
// LSE = log(sum_s e^LSE_s) and line 12 gives O = sum_s e^(LSE_s - LSE) O_s. The rules are
// common/online_softmax.hpp's (merge_softmax, fa1_output_update for the chunks; merge_partials and
// merge_partial_row for the merge); this program only feeds them and prints what they return.
//
// Then the same row with the middle chunk hidden by a block mask: that chunk's partial is the
// empty one (O = 0, LSE = -inf) and adds nothing. Last, the omp backend, which splits the same way
// (kv_splits = 3 chunks of the same tiles), on the same inputs. Docs: docs/decoding.md.
//
// Run: build/<preset>/bin/08_split_kv   (no arguments; exit 1 if a check fails)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/online_softmax.hpp"
#include "common/registry.hpp"
#include "common/tiling.hpp"
#include "cpu/reference.hpp"
#include "print.hpp"

using namespace flashattn;
using examples::print_number;
using examples::print_values;

namespace {

constexpr int kD = 4;       // head dim d
constexpr int kN = 12;      // keys N_kv
constexpr int kBc = 2;      // keys per tile (Algorithm 1's B_c)
constexpr int kS = 3;       // chunks: 6 tiles, 2 per chunk
constexpr int kMaskBlock = 4;  // the block mask's blocks of keys: one per chunk

// One chunk's partial result: Algorithm 1 for one query row over the key tiles [tiles), keys a
// block mask may hide (visible[block] == 0 hides keys [4 block, 4 block + 4)).
struct Partial {
    SoftmaxState state;  // (m_s, l_s) after the chunk's last tile
    float O[kD] = {};    // O_s, normalized by l_s (Algorithm 1 keeps O_i normalized)
    float lse = -INFINITY;
};
Partial chunk_partial(const float* q, const float* K, const float* V, float scale, TileRange tiles,
                      const std::uint8_t* visible) {
    Partial part;
    for (std::int64_t j = tiles.begin; j < tiles.end; ++j) {
        // Line 9: this tile's scores (masked keys: -inf). Line 10: its m~, l~ and P~ V.
        float s[kBc];
        SoftmaxState tile;
        for (int k = 0; k < kBc; ++k) {
            const std::int64_t key = j * kBc + k;
            float dot = 0.0f;
            for (int c = 0; c < kD; ++c) dot += q[c] * K[key * kD + c];
            s[k] = visible[key / kMaskBlock] ? scale * dot : -INFINITY;
            tile.m = nan_max(tile.m, s[k]);
        }
        float pv[kD] = {};
        for (int k = 0; k < kBc; ++k) {
            const float p = exp_shifted(s[k], tile.m);  // 0 for a masked key
            tile.l += p;
            for (int c = 0; c < kD; ++c) pv[c] += p * V[(j * kBc + k) * kD + c];
        }
        // Line 11: the running state and this tile's, merged. Line 12: O_s rescaled and updated.
        const SoftmaxMerge merged = merge_softmax(part.state, tile);
        for (int c = 0; c < kD; ++c) part.O[c] = fa1_output_update(part.O[c], part.state.l, pv[c], merged);
        part.state = {merged.m_new, merged.l_new};
    }
    part.lse = log_sum_exp(part.state);
    return part;
}

// Splits the row, prints each chunk's partial and the merge step by step, and returns the merged
// O and LSE (merge_partial_row: the rule every form's merge calls).
struct Merged {
    float O[kD];
    float lse;
};
Merged split_and_merge(const float* q, const float* K, const float* V, float scale,
                       const std::uint8_t* visible) {
    const std::int64_t Tc = tile_count(kN, kBc);
    float lse[kS], O_parts[kS * kD];
    std::printf("  chunk | key tiles | keys     |      m_s      l_s    LSE_s | O_s\n");
    for (int s = 0; s < kS; ++s) {
        const TileRange tiles = split_chunk(Tc, kS, s);  // the chunks every form cuts
        const Partial part = chunk_partial(q, K, V, scale, tiles, visible);
        lse[s] = part.lse;
        for (int c = 0; c < kD; ++c) O_parts[s * kD + c] = part.O[c];
        std::printf("  %5d | [%lld, %lld)    | [%2lld, %2lld) |", s, (long long)tiles.begin,
                    (long long)tiles.end, (long long)(tiles.begin * kBc), (long long)(tiles.end * kBc));
        print_number(part.state.m, 9);
        print_number(part.state.l, 9);
        print_number(part.lse, 9);
        std::printf(" |");
        print_values(part.O, kD);
        std::printf("\n");
    }
    // The merge, folded in a fixed order (s = 0, 1, 2): each step is Algorithm 1's line 11 on two
    // states (LSE_a, 1) and (LSE_b, 1), and scale_a, scale_b are the two parts' weights.
    std::printf("  merge_partials, folded:\n");
    float running = -INFINITY;
    for (int s = 0; s < kS; ++s) {
        const PartialMerge m = merge_partials(running, lse[s]);
        std::printf("    with chunk %d: LSE =", s);
        print_number(m.lse, 9);
        std::printf("   weight of the parts before =");
        print_number(m.scale_a, 7);
        std::printf(", of chunk %d =", s);
        print_number(m.scale_b, 7);
        std::printf("\n");
        running = m.lse;
    }
    Merged out;
    out.lse = merge_partial_row(kS, lse, 1, O_parts, kD, kD, 0, 1, out.O);
    std::printf("  merge_partial_row: O = sum_s e^(LSE_s - LSE) O_s = [");
    print_values(out.O, kD);
    std::printf(" ], LSE =");
    print_number(out.lse, 9);
    std::printf("\n");
    return out;
}

// The merged row against the float64 reference (standard attention, Algorithm 0) and against the
// omp backend splitting the same problem into the same chunks. Returns whether both agree.
bool check(const AttentionProblem& p, const ProblemData& in, const Merged& merged) {
    const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
    const double err = max_abs_error(merged.O, ref.O.data(), kD);
    const double err_lse = max_abs_error(&merged.lse, ref.lse.data(), 1);
    std::printf("  against standard attention in float64: max |O - O_ref| = %.2e, |LSE - LSE_ref| = %.2e\n",
                err, err_lse);

    const Backend& omp = find_backend("omp");
    auto prepared = omp.prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f32);
    prepared->execute();
    float O_omp[kD], lse_omp;
    prepared->fetch(O_omp, &lse_omp);
    double omp_diff = std::fabs(lse_omp - merged.lse);
    if (std::isinf(lse_omp) && std::isinf(merged.lse) && lse_omp == merged.lse) omp_diff = 0;
    for (int c = 0; c < kD; ++c) omp_diff = std::max(omp_diff, double(std::fabs(O_omp[c] - merged.O[c])));
    std::printf("  the omp backend (kv_splits = %lld, it used S = %lld): O = [",
                (long long)p.kv_splits, (long long)prepared->kv_splits());
    print_values(O_omp, kD);
    std::printf(" ], max difference from the merge above %.2e\n", omp_diff);
    return err < 1e-5 && err_lse < 1e-5 && omp_diff < 1e-5 && prepared->kv_splits() == kS;
}

}  // namespace

int main() {
    // One query row, one head, 12 keys of d = 4; tiles of 2 keys (block_kv), 3 chunks (kv_splits).
    AttentionProblem p;
    p.seq_q = 1, p.seq_kv = kN, p.dim = kD;
    p.block_q = 1, p.block_kv = kBc, p.kv_splits = kS;
    const ProblemData in = random_problem_data(p, 8);
    const float* q = in.Q.data();
    const float* K = in.K.data();
    const float* V = in.V.data();
    const float scale = p.softmax_scale();

    std::printf("Split-KV decoding of one query row: N_kv = %d keys, d = %d, tiles of B_c = %d keys,\n"
                "S = %d chunks of %d tiles (docs/decoding.md)\n\n", kN, kD, kBc, kS,
                int(tile_count(kN, kBc) / kS));
    std::printf("q = [");
    print_values(q, kD);
    std::printf(" ], scale = 1/sqrt(d) = %.4f\n\n", scale);

    std::printf("1. Every key visible. Each chunk runs Algorithm 1 (lines 9-12) over its own tiles:\n");
    const std::uint8_t all[kS] = {1, 1, 1};
    const Merged merged = split_and_merge(q, K, V, scale, all);
    bool ok = check(p, in, merged);

    // The same row with keys 4..7 (chunk 1) hidden by a block mask of one row of 4-key blocks.
    std::printf("\n2. A block mask hides keys [4, 8): chunk 1 sees no key, and its partial is the empty one\n"
                "   (m = -inf, l = 0: O_s = 0, LSE_s = -inf), which the merge gives weight e^(-inf) = 0:\n");
    const std::uint8_t middle_hidden[kS] = {1, 0, 1};
    AttentionProblem masked = p;
    masked.block_mask = {middle_hidden, 1, kMaskBlock};
    const Merged merged_masked = split_and_merge(q, K, V, scale, middle_hidden);
    ok = check(masked, in, merged_masked) && ok;

    std::printf("\n%s\n", ok ? "check: the merged chunks give standard attention's O and LSE, and so does omp's split"
                             : "CHECK FAILED: the merged chunks differ");
    return ok ? 0 : 1;
}
