// cpu/vector_softmax.hpp — the online-softmax rule's per-element steps over a whole row, in a form
// the compiler vectorizes (`#pragma omp simd`).
//
// common/online_softmax.hpp states the rule one scalar at a time: `nan_max` for the running
// maximum, `exp_shifted(x, m)` for the shifted exponentials. The CPU forms that work on whole rows
// of a tile (omp, and standard in float) apply the same two steps to Bc values at once; this file
// is where those row forms live, written once:
//
//   row_max(x, n)             = nan_max(x[0], ..., x[n-1])   (NaN if any x is NaN; -inf if n = 0)
//   exp_shifted_row(x, n, m)  : x[c] <- exp_shifted(x[c], m) for every c, returns the sum
//
// Their edge cases are exactly those of the scalar rule: a masked score (-inf) gives 0 even when
// m = -inf (a row with no visible key so far), a NaN stays NaN, and exponents x - m <= 0 never
// overflow. The only difference is the exponential itself: libm's expf does not vectorize, so
// exp_nonpositive() below computes it with a polynomial (within ~1 ulp of exp on [-87, 0]; results
// below e^-87 ~ 1.6e-38, i.e. subnormal, are flushed to 0).
//
// GCC vectorizes these loops only with -fno-trapping-math (set for the CPU library in
// cpu/CMakeLists.txt): without it, it refuses to turn the comparisons into vector selects because
// they could raise a floating-point exception flag. Values are unchanged by that flag.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace flashattn {

namespace detail {

template <class To, class From>
inline To bit_cast(From from) {
    static_assert(sizeof(To) == sizeof(From), "bit_cast needs equal sizes");
    To to;
    std::memcpy(&to, &from, sizeof to);
    return to;
}

}  // namespace detail

// exp(t) for t <= 0 (and NaN -> NaN), in plain arithmetic that vectorizes; 0 below -87, where
// exp(t) < 1.7e-38 would be subnormal. Range reduction: t = n ln2 + r with n = round(t / ln2) and
// |r| <= ln2 / 2, so exp(t) = 2^n e^r; e^r from Cephes' polynomial for expf; 2^n is built directly
// in the exponent bits. No clamping of t: below -87 the arithmetic may produce garbage, which the
// final select throws away (a select, not arithmetic, so no garbage NaN can leak).
inline float exp_nonpositive(float t) {
    constexpr float kLowest = -87.0f;      // from here up, n >= -126 and 2^n is a normal float
    constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    // n = round(t / ln2), found as the low bits of t/ln2 + 1.5 * 2^23 (no float-to-int conversion,
    // so a NaN passes through without undefined behaviour).
    const float shifted = t * 1.44269504088896341f + kRound;
    const float n = shifted - kRound;
    // r = t - n ln2, with ln2 split in two (0.693359375 is exact in 9 bits) to keep r accurate.
    const float r = (t - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float exp_r = (p * r) * r + r + 1.0f;
    // The low bits of `shifted` hold n + 0x4B400000; exponent field n + 127 makes 2^n.
    const std::uint32_t n_bits = detail::bit_cast<std::uint32_t>(shifted) - 0x4B400000u;
    const float two_to_n = detail::bit_cast<float>((n_bits + 127u) << 23);
    return t < kLowest ? 0.0f : exp_r * two_to_n;
}

// nan_max over a row: the largest value, or NaN if any value is NaN (a NaN must never be
// dropped: it would hide a bad input). -inf for an all-masked row.
inline float row_max(const float* x, std::int64_t n) {
    float m = -INFINITY;
    int any_nan = 0;
#pragma omp simd reduction(max : m) reduction(| : any_nan)
    for (std::int64_t c = 0; c < n; ++c) {
        m = x[c] > m ? x[c] : m;
        any_nan |= x[c] != x[c];
    }
    return any_nan ? NAN : m;
}

// x[c] <- exp_shifted(x[c], m) for the whole row (the P_tilde of a row of S_ij), returning the row
// sum. As in exp_shifted, a masked score (-inf) gives 0 whatever m is: for finite m, -inf - m is
// -inf and exp_nonpositive gives 0; m = -inf (every key masked so far, so every x is -inf) would
// make -inf - m NaN, so that row is answered before the loop, which then needs no per-element test.
inline float exp_shifted_row(float* x, std::int64_t n, float m) {
    if (m == -INFINITY) {
        for (std::int64_t c = 0; c < n; ++c) x[c] = 0.0f;
        return 0.0f;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t c = 0; c < n; ++c) {
        x[c] = exp_nonpositive(x[c] - m);
        sum += x[c];
    }
    return sum;
}

// The backward's P rebuilt for a whole row (common/backward.hpp, recomputed_probability): x[c] <-
// exp(x[c] - L), 0 for a masked score (-inf), and the whole row 0 when L = -inf (no visible key
// carried weight). L >= max(x) in exact arithmetic (L = m + log l with l >= 1); a score a rounding
// above L would give an exponent a hair above 0, which is taken as 0 (P = 1, its largest value).
inline void probability_row(float* x, std::int64_t n, float L) {
    if (L == -INFINITY) {
        for (std::int64_t c = 0; c < n; ++c) x[c] = 0.0f;
        return;
    }
#pragma omp simd
    for (std::int64_t c = 0; c < n; ++c) {
        const float t = x[c] - L;  // NaN stays NaN: the comparison below is false for it
        x[c] = exp_nonpositive(t > 0.0f ? 0.0f : t);
    }
}

}  // namespace flashattn
