// common/online_softmax.hpp — the online-softmax rule, written once for every form.
//
// FlashAttention §3.1, "Tiling" (the softmax decomposition): for a row split into blocks x1, x2 with block maxima m(x1),
// m(x2) and block sums l(x) = sum_k exp(x_k - m(x)),
//     m  = max(m(x1), m(x2))
//     l  = exp(m(x1) - m) l(x1) + exp(m(x2) - m) l(x2)                          (eqs. 17/18)
// and softmax(x) = f(x) / l with each block's f rescaled by the same exp(m(xk) - m). (Equation
// numbers as in docs/online_softmax.md, after https://zhuanlan.zhihu.com/p/626079753.)
//
// Algorithm 1 lines 10–12 apply this with (m_i, l_i) = the rows seen so far and
// (m_tilde, l_tilde) = the current tile. FlashAttention-2 applies the same rule but shifts the
// tile's exponentials by m_new directly, so l_tilde needs no separate rescale.
//
// Edge cases that every form inherits from here:
//   * masked scores are -inf; a row whose keys are all masked so far has m = -inf and l = 0, and
//     exp_shifted(-inf, -inf) is 0 (not exp(NaN)), so nothing becomes NaN;
//   * a NaN score makes m NaN (nan_max never drops it), so the row's output becomes NaN;
//   * huge finite logits (|s| ~ 1e4) are safe: every exponent is s - m <= 0.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/config.hpp"

namespace flashattn {

FA_HOST_DEVICE inline float neg_infinity() { return -INFINITY; }

// max that propagates NaN (fmaxf and std::max would silently drop it and hide a bad input).
// On sm_80+ GPUs the same rule is one instruction (max.NaN), which matters in the tensor-core
// kernel, where a row maximum is taken for every score.
FA_HOST_DEVICE inline float nan_max(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
#else
    if (a != a || b != b) return a + b;  // NaN + anything is NaN
    return a > b ? a : b;
#endif
}

// exp(x - m) for x <= m, with exp(-inf - m) = 0 even when m is -inf too (a fully masked row).
FA_HOST_DEVICE inline float exp_shifted(float x, float m) {
    return x == -INFINITY ? 0.0f : expf(x - m);
}

// FlashAttention-2's fast form of exp_shifted, for kernels that keep raw scores s = q.k (the
// softmax scale not yet applied) and a row maximum m of raw scores:
//     exp(scale (s - m)) = 2^(s c - m c),   c = scale * log2(e) > 0,
// one fused multiply-add and one hardware 2^x per score (ex2.approx on NVIDIA GPUs, relative error
// ~2^-22) instead of a multiply, a subtract and a full-precision expf. The shift m c is computed
// once per row by exp2_shift and is 0 when m = -inf (a row whose keys are all masked so far), so
// a masked score (-inf) still gives exactly 0 and nothing becomes NaN, as with exp_shifted; a NaN
// score or a NaN maximum gives NaN. c must be positive: then max(s c) = c max(s).
inline constexpr float kLog2e = 1.4426950408889634f;

FA_HOST_DEVICE inline float exp2_shift(float m, float scale_log2) {
    return m == -INFINITY ? 0.0f : m * scale_log2;
}

// 2^x: on the GPU the hardware instruction (MUFU.EX2; 2^-inf = 0), on the CPU std::exp2.
FA_HOST_DEVICE inline float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return std::exp2(x);
#endif
}

FA_HOST_DEVICE inline float exp2_shifted(float s, float shift, float scale_log2) {
    return fast_exp2(s * scale_log2 - shift);  // contracted to one FFMA on the GPU
}

// The same value with the difference taken first: 2^((s - m) c). One instruction more than
// exp2_shifted, but s - m is exact when s and m are close (Sterbenz), so a score at or near the
// row maximum gets the weight fp32 standard attention gives it; in s c - m c both products are
// rounded, which at large logits (|s c| ~ 1e4, ulp ~ 1e-3) moves the weight by ~0.1%. For the
// fp32 kernels, which are held to fp32 standard attention's accuracy. m = -inf (nothing visible
// yet) gives 0, as exp2_shifted does.
FA_HOST_DEVICE inline float exp2_of_difference(float s, float m, float scale_log2) {
    return fast_exp2(m == -INFINITY ? -INFINITY : (s - m) * scale_log2);
}

// Lazy rescaling (FlashAttention-4's conditional rescale). Algorithm 1 rescales O_i and l_i by
// e^(m_old - m_new) whenever a block raises the row maximum (lines 10-11). But the maximum is only
// a reference that keeps the exponentials in range: for any reference r, O_i = sum_j P~_j V_j / l_i
// with P~ = e^(s - r) and l_i = rowsum(P~), and L_i = r + log(l_i), are the same values. A kernel
// may therefore keep its reference while a new block's maximum exceeds it by at most
// kLazyRescaleLog2 in the base-2 exponents (s c - r c <= 8: P~ <= 2^8 = 256, far inside fp16's and
// bf16's range and the float32 sums'), and rescale (with the block's maximum as the new reference)
// only when it exceeds that: after the first block of a row, rarely. False when r = -inf (nothing
// seen yet) and for a NaN maximum, so those take Algorithm 1's update as before.
inline constexpr float kLazyRescaleLog2 = 8.0f;

FA_HOST_DEVICE inline bool keeps_reference_max(float r, float m_new, float scale_log2) {
    return (m_new - r) * scale_log2 <= kLazyRescaleLog2;
}

// (m, l) of one row: the running maximum and the running sum of exp(s - m).
struct SoftmaxState {
    float m = -INFINITY;
    float l = 0.0f;
};

// Result of merging a row's state with a new block's state (eqs. 17/18; Algorithm 1 line 11).
struct SoftmaxMerge {
    float m_new;        // max(m_i, m_tilde)
    float l_new;        // exp(m_i - m_new) l_i + exp(m_tilde - m_new) l_tilde
    float old_scale;    // exp(m_i - m_new): rescales everything accumulated before this block
    float block_scale;  // exp(m_tilde - m_new): rescales this block's P_tilde
};

FA_HOST_DEVICE inline SoftmaxMerge merge_softmax(SoftmaxState running, SoftmaxState block) {
    SoftmaxMerge r;
    r.m_new = nan_max(running.m, block.m);
    r.old_scale = exp_shifted(running.m, r.m_new);
    r.block_scale = exp_shifted(block.m, r.m_new);
    r.l_new = r.old_scale * running.l + r.block_scale * block.l;
    return r;
}

// Algorithm 1 line 12 for one output element: the new, normalized O_i entry from the old one
// (normalized by l_i), and this tile's unnormalized (P_tilde V_j) entry. diag(l_new)^-1 is a
// multiplication by 1 / l_new, as the paper writes it: inlined into a loop over a row's
// elements, the reciprocal and the two row factors are the same expressions for every element,
// so the compiler computes them once per row, and each element costs a multiply and an FMA
// instead of a division (counted in cuda-fa1 v5 at d = 128: 64 divisions per thread and step,
// ~6% of its instructions; docs/cuda_fp32_notes.md).
FA_HOST_DEVICE inline float fa1_output_update(float o_old, float l_old, float pv,
                                              const SoftmaxMerge& r) {
    // l_new = 0: no key so far carried any weight. Usually every key was masked, and then O_i and
    // P_tilde V_j are exactly 0 (masked keys are left out of P_tilde V_j). But a visible key
    // whose float32 score overflowed to -inf has weight 0 too, and a NaN in its V row must still
    // reach O (docs/design.md, Numerics: an output reading a NaN is NaN; the fuzzer found this): so O stays
    // what was summed, not a forced 0.
    if (r.l_new == 0.0f) return o_old + pv;
    const float inv_l_new = 1.0f / r.l_new;
    return (l_old * r.old_scale * inv_l_new) * o_old + (r.block_scale * inv_l_new) * pv;
}

// FlashAttention-2 keeps O unnormalized; the final division by l happens once, at the end. For
// l = 0 (no key carried weight) O is what was summed: 0 for a row with no visible key (masked
// keys are left out of the sum), a NaN that a visible key with an overflowed score read (see
// fa1_output_update).
FA_HOST_DEVICE inline float normalize_output(float o_unnormalized, float l) {
    return l == 0.0f ? o_unnormalized : o_unnormalized / l;
}

// LSE = m + log(l), natural log; -inf for a row with no visible key.
FA_HOST_DEVICE inline float log_sum_exp(SoftmaxState s) {
    return s.l == 0.0f ? -INFINITY : s.m + logf(s.l);
}

// The end of a row whose sum l is 0 (no key carried weight) has two causes, told apart by the
// masks alone (has_visible_key: AttentionProblem::row_has_visible_key):
//   * the row has no visible key: O = 0, LSE = -inf, the answer reserved for a fully masked row;
//   * it has, but every visible score overflowed float32 to -inf (|scale q.k| too large): float32
//     standard attention's softmax gives exp(-inf - (-inf)) = NaN there, and so do the kernels,
//     O = NaN and LSE = NaN (final_output, final_lse), so that an overflow never reads as a mask.
// A row with weight (l > 0) has overflowed too when its LSE, m + log(l) with m in LSE's units,
// is infinite: the kernels that form q.k before scaling (the tensor-core ones) can get weights
// for a row whose scaled scores, and so its true LSE, lie beyond float32; it is NaN as well, not
// a LSE of -inf that would again read as "no visible key". That LSE is infinite exactly when m or
// l is: a finite l has log(l) <= 89, which cannot carry a finite m past FLT_MAX (the spacing of
// floats there is 2^104), so the test needs no log -- a kernel's O stores need not wait for one.
// has_visible_key is a callable, called only when l == 0: the common path pays a few compares.
template <class HasVisibleKey>
FA_HOST_DEVICE inline bool scores_overflowed(SoftmaxState s, const HasVisibleKey& has_visible_key) {
    if (s.l > 0.0f) return fabsf(s.m) == INFINITY || s.l == INFINITY;  // |m + log(l)| = inf
    return s.l == 0.0f && has_visible_key();
}

// A row's epilogue (FA2 Algorithm 1 lines 12-15): O / l and LSE = m + log(l), or NaN for a row
// whose scores overflowed (scores_overflowed).
FA_HOST_DEVICE inline float final_output(float o_unnormalized, float l, bool overflowed) {
    return overflowed ? NAN : normalize_output(o_unnormalized, l);
}
FA_HOST_DEVICE inline float final_lse(SoftmaxState s, bool overflowed) {
    return overflowed ? NAN : log_sum_exp(s);
}

// The same end with one division per row instead of one per element, for the kernels that write
// a whole row of O at once (the tensor-core epilogues): diag(l)^-1 O as Algorithm 1 line 12
// writes it, its factor taken once per row (output_scale) and each element multiplied. A row with
// weight has l >= 1 (its largest score contributes e^0), so the factor is finite and at most 1;
// l = 0 keeps O as summed. o * (1 / l) rounds twice: within 2 ulp of o / l.
FA_HOST_DEVICE inline float output_scale(float l) {
    return l == 0.0f ? 1.0f : 1.0f / l;
}
FA_HOST_DEVICE inline float final_output_scaled(float o_unnormalized, float scale,
                                                bool overflowed) {
    return overflowed ? NAN : o_unnormalized * scale;
}

// The merge of two partial results of one row over disjoint sets of keys: (O_a, LSE_a) and
// (O_b, LSE_b), each O normalized by its own sum and LSE = m + log(l). This is the update above
// applied to whole blocks: a part is the softmax state (m, l) = (LSE, 1), its sum measured from
// its own LSE, so merge_softmax gives m_new = max(LSE_a, LSE_b) and
//     l_new = e^(LSE_a - m_new) + e^(LSE_b - m_new),   LSE = m_new + log(l_new),
//     O = (e^(LSE_a - m_new) / l_new) O_a + (e^(LSE_b - m_new) / l_new) O_b
//       =  e^(LSE_a - LSE) O_a + e^(LSE_b - LSE) O_b.
// A part with no visible key (LSE = -inf, O = 0) contributes nothing; two such parts give the
// empty row's O = 0, LSE = -inf; a NaN LSE makes both NaN. Split-KV decoding merges the partial
// results of its key chunks with it, and ring attention those of its steps.
struct PartialMerge {
    float lse;      // the merged LSE
    float scale_a;  // e^(LSE_a - LSE): O_a's weight in the merged O
    float scale_b;  // e^(LSE_b - LSE)
};
FA_HOST_DEVICE inline PartialMerge merge_partials(float lse_a, float lse_b) {
    const SoftmaxMerge r = merge_softmax(SoftmaxState{lse_a, 1.0f}, SoftmaxState{lse_b, 1.0f});
    if (r.l_new == 0.0f) return {-INFINITY, 0.0f, 0.0f};  // both parts empty
    const float inv_l = 1.0f / r.l_new;
    return {r.m_new + logf(r.l_new), r.old_scale * inv_l, r.block_scale * inv_l};
}

// S partial results of one row, (O_s, LSE_s) for s = 0 .. S-1, merged: the two-part rule above
// applied S - 1 times gives LSE = log(sum_s e^LSE_s) and O = sum_s e^(LSE_s - LSE) O_s. The LSE
// is folded with merge_partials in a fixed order (s = 0, 1, ...), so the result does not depend
// on who computes it; each O_s is then weighted by partial_weight.
FA_HOST_DEVICE inline float merged_lse(int S, const float* lse, std::int64_t lse_stride) {
    float merged = -INFINITY;
    for (int s = 0; s < S; ++s) merged = merge_partials(merged, lse[s * lse_stride]).lse;
    return merged;
}
// The same merged LSE in two passes, for a merge that reads its S parts in parallel (the lanes of
// a GPU warp, cuda/stages/combine.cuh): m = max_s LSE_s (nan_max), then
//     LSE = m + log(sum_s e^(LSE_s - m))        (exp_shifted: an empty part adds 0)
// -- log(sum_s e^LSE_s), as merged_lse's fold is, summed in another order (so the last bits may
// differ). All parts empty (m = -inf): -inf; a NaN LSE: NaN.
FA_HOST_DEVICE inline float lse_from_max_and_sum(float m, float sum_of_exp) {
    return m == -INFINITY ? -INFINITY : m + logf(sum_of_exp);
}
// e^(LSE_s - LSE): part s's weight in the merged O. 0 for an empty part (LSE_s = -inf), and for
// every part when all are empty (LSE = -inf, so O = 0); NaN when either LSE is NaN.
FA_HOST_DEVICE inline float partial_weight(float lse_s, float lse) {
    return lse == -INFINITY ? 0.0f : expf(lse_s - lse);
}
// One row, written out: part s's O row starts at O_parts + s * o_stride and its LSE is
// lse[s * lse_stride]; the columns first, first + step, ... < d of O are written (a CPU caller
// passes first = 0, step = 1). Returns the merged LSE. A GPU kernel keeps the sums in registers
// instead (cuda/stages/combine.cuh) but uses the same two functions.
FA_HOST_DEVICE inline float merge_partial_row(int S, const float* lse, std::int64_t lse_stride,
                                              const float* O_parts, std::int64_t o_stride,
                                              std::int64_t d, std::int64_t first,
                                              std::int64_t step, float* O) {
    const float lse_merged = merged_lse(S, lse, lse_stride);
    for (std::int64_t c = first; c < d; c += step) O[c] = 0.0f;
    for (int s = 0; s < S; ++s) {
        const float w = partial_weight(lse[s * lse_stride], lse_merged);
        const float* O_s = O_parts + s * o_stride;
        for (std::int64_t c = first; c < d; c += step) O[c] += w * O_s[c];
    }
    return lse_merged;
}

}  // namespace flashattn
