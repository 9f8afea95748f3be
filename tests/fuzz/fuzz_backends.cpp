// tests/fuzz/fuzz_backends.cpp — libFuzzer harness: random small attention problems through every
// CPU backend of the registry (standard, scalar, and omp once it is there), checked against the
// float64 reference.
//
// The fuzzer's bytes choose the shapes (B <= 2, H_kv <= 3, GQA group <= 3, N_q, N_kv <= 48,
// d <= 40), causal, the softmax scale (default, 0, negative, tiny, large, near float32's limit),
// how the tiles are chosen (automatic, explicit Br/Bc, an SRAM size M, or a random block mask),
// the input magnitude, and up to six special values placed anywhere: NaN, +-inf, +-1e30, +-1e4,
// subnormal and signed zeros. A problem whose scores float32 cannot hold must be refused by every
// backend (common/score_range.hpp). Otherwise each output element is judged by the inputs it
// reads (tests/input_dependence.hpp):
//   * reads a NaN: it must be NaN in every backend (docs/design.md, Numerics), and in the
//     reference;
//   * reads only "tame" values (finite, |x| <= 1e4): it must not be NaN, and must satisfy
//         |out - ref64| <= 2 * E_std + 1e-6 + C,
//     the 2x rule with E_std = the largest error of float32 standard attention over the tame
//     elements, widened by C, the error any float32 form may make on this row: (d + 2) u times
//     the largest |scale * q_i . k_j| term sum (a float32 score is that far off, and near a tie
//     that moves O by up to the spread of V), plus (N_kv + d) u |V| for the sums;
//   * reads an infinity or 1e30 without a NaN: docs/design.md promises nothing beyond "no crash"
//     (inf - inf is NaN in one summation order and not in another), so nothing is compared.
// A finding prints the case and aborts, so libFuzzer saves the input.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/tiling.hpp"
#include "common/registry.hpp"
#include "common/score_range.hpp"
#include "input_dependence.hpp"
#include "cpu/reference.hpp"

using namespace flashattn;

namespace {

constexpr float kTame = 1e4f;
constexpr double kUnit = 0x1p-24;  // float32 unit roundoff

struct Case {
    AttentionProblem p;
    std::vector<std::uint8_t> mask;
    ProblemData in;
};

float special_value(int kind, float unit) {
    switch (kind) {
        case 0:
            return std::numeric_limits<float>::quiet_NaN();
        case 1:
            return std::numeric_limits<float>::infinity();
        case 2:
            return -std::numeric_limits<float>::infinity();
        case 3:
            return (unit < 0.5f ? -1e30f : 1e30f);
        case 4:
            return (2 * unit - 1) * kTame;  // huge but tame
        case 5:
            return 1e-40f * (unit + 0.1f);  // subnormal
        case 6:
            return 0.0f;
        default:
            return -0.0f;
    }
}

Case make_case(FuzzedDataProvider& fdp) {
    Case c;
    AttentionProblem& p = c.p;
    p.batch = fdp.ConsumeIntegralInRange<std::int64_t>(1, 2);
    p.heads_kv = fdp.ConsumeIntegralInRange<std::int64_t>(1, 3);
    p.heads = p.heads_kv * fdp.ConsumeIntegralInRange<std::int64_t>(1, 3);
    p.seq_q = fdp.ConsumeIntegralInRange<std::int64_t>(1, 48);
    p.seq_kv = fdp.ConsumeIntegralInRange<std::int64_t>(1, 48);
    p.dim = fdp.ConsumeIntegralInRange<std::int64_t>(1, 40);
    p.causal = fdp.ConsumeBool();
    switch (fdp.ConsumeIntegralInRange(0, 7)) {
        case 0:
            break;  // default 1/sqrt(d)
        case 1:
            p.scale = 0.0f;
            break;
        case 2:
            p.scale = -0.5f;
            break;
        case 3:
            p.scale = 1e-3f;
            break;
        case 4:
            p.scale = 64.0f;
            break;
        case 5:  // near float32's limit: refused (common/score_range.hpp) unless |q| |k| is small
            p.scale = fdp.ConsumeBool() ? -1e35f : 3e38f;
            break;
        default:
            p.scale = fdp.ConsumeFloatingPointInRange(-4.0f, 4.0f);
            break;
    }
    switch (fdp.ConsumeIntegralInRange(0, 3)) {
        case 0:
            break;  // the form's default tiles
        case 1:
            p.block_q = fdp.ConsumeIntegralInRange<std::int64_t>(1, 64);
            p.block_kv = fdp.ConsumeIntegralInRange<std::int64_t>(1, 64);
            break;
        case 2:
            p.sram_floats = 4 * p.dim + fdp.ConsumeIntegralInRange<std::int64_t>(0, 20000);
            break;
        default: {  // Algorithm 5: a random block mask over random blocks
            p.block_q = fdp.ConsumeIntegralInRange<std::int64_t>(1, 20);
            p.block_kv = fdp.ConsumeIntegralInRange<std::int64_t>(1, 20);
            c.mask.resize(tile_count(p.seq_q, p.block_q) * tile_count(p.seq_kv, p.block_kv));
            for (auto& m : c.mask) m = fdp.ConsumeBool();
            p.block_mask = {c.mask.data(), p.block_q, p.block_kv};
        }
    }
    static const float kStddev[] = {1.0f, 1e-3f, 30.0f, 300.0f};
    const float stddev = kStddev[fdp.ConsumeIntegralInRange(0, 3)];
    const std::uint64_t seed = fdp.ConsumeIntegral<std::uint32_t>();
    c.in = {random_normal(p.q_elements(), seed, stddev),
            random_normal(p.kv_elements(), seed + 1, stddev),
            random_normal(p.kv_elements(), seed + 2, stddev)};
    const int specials = fdp.ConsumeIntegralInRange(0, 6);
    for (int s = 0; s < specials; ++s) {
        const int tensor = fdp.ConsumeIntegralInRange(0, 2);
        std::vector<float>& x = tensor == 0 ? c.in.Q : tensor == 1 ? c.in.K : c.in.V;
        const std::size_t at = fdp.ConsumeIntegralInRange<std::size_t>(0, x.size() - 1);
        x[at] = special_value(fdp.ConsumeIntegralInRange(0, 7), fdp.ConsumeProbability<float>());
    }
    return c;
}

std::string describe(const AttentionProblem& p) {
    char s[320];
    std::snprintf(s, sizeof s,
                  "B=%lld H=%lld Hkv=%lld Nq=%lld Nkv=%lld d=%lld causal=%d scale=%g Br=%lld "
                  "Bc=%lld M=%lld mask=%d",
                  (long long)p.batch, (long long)p.heads, (long long)p.heads_kv, (long long)p.seq_q,
                  (long long)p.seq_kv, (long long)p.dim, p.causal ? 1 : 0, double(p.scale),
                  (long long)p.block_q, (long long)p.block_kv, (long long)p.sram_floats,
                  p.block_mask.active() ? 1 : 0);
    return s;
}

[[noreturn]] void finding(const AttentionProblem& p, const std::string& backend, const char* what,
                          std::size_t at, double out, double ref, double bound) {
    std::fprintf(stderr,
                 "fuzz_backends: %s: %s at element %zu: out %.9g, ref %.9g, bound %.3g\n  %s\n",
                 backend.c_str(), what, at, out, ref, bound, describe(p).c_str());
    std::abort();
}

struct Outputs {
    std::vector<float> O, lse;
};

Outputs run(const Backend& b, const AttentionProblem& p, const ProblemData& in) {
    Outputs out{std::vector<float>(p.q_elements(), std::numeric_limits<float>::quiet_NaN()),
                std::vector<float>(p.lse_elements(), std::numeric_limits<float>::quiet_NaN())};
    run_backend(b, p, in.Q.data(), in.K.data(), in.V.data(), out.O.data(), out.lse.data());
    return out;
}

// C of the header: how far float32 may be off without a bug, per element of O and of LSE. Only
// read for tame elements; elsewhere it may be infinite.
struct Slack {
    std::vector<double> O, lse;
};

Slack float32_slack(const AttentionProblem& p, const ProblemData& in) {
    Slack s{std::vector<double>(p.q_elements()), std::vector<double>(p.lse_elements())};
    const std::int64_t d = p.dim;
    const double scale = std::fabs(double(p.softmax_scale()));
    std::vector<double> worst_v(d);
    for (std::int64_t b = 0; b < p.batch; ++b)
        for (std::int64_t h = 0; h < p.heads; ++h)
            for (std::int64_t i = 0; i < p.seq_q; ++i) {
                const float* q = in.Q.data() + p.q_offset(b, h) + i * d;
                double worst_score = 0;  // max_j scale * sum_c |q_c k_jc|
                worst_v.assign(d, 0.0);  // max_j |V_jc|
                for (std::int64_t j = 0; j < p.seq_kv; ++j) {
                    if (!p.key_visible(i, j)) continue;
                    const float* k = in.K.data() + p.kv_offset(b, h) + j * d;
                    const float* v = in.V.data() + p.kv_offset(b, h) + j * d;
                    double terms = 0;
                    for (std::int64_t c = 0; c < d; ++c) {
                        terms += std::fabs(double(q[c]) * k[c]);
                        worst_v[c] = std::max(worst_v[c], std::fabs(double(v[c])));
                    }
                    const double score = scale == 0 ? 0.0 : scale * terms;
                    worst_score = std::max(worst_score, std::isnan(score) ? INFINITY : score);
                }
                const double score_error = (d + 2) * kUnit * worst_score;
                const std::int64_t row = p.lse_offset(b, h) + i;
                s.lse[row] = 2 * score_error + (p.seq_kv + 4) * kUnit * (1 + worst_score);
                for (std::int64_t c = 0; c < d; ++c)
                    s.O[row * d + c] = 2 * std::min(1.0, 2 * score_error) * worst_v[c] +
                                       (p.seq_kv + d) * kUnit * worst_v[c];
            }
    return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider fdp(data, size);
    const Case c = make_case(fdp);
    const AttentionProblem& p = c.p;
    const ProblemData& in = c.in;

    // Scores float32 cannot hold (common/score_range.hpp): every backend refuses the problem with
    // a message naming the scale, so no overflowed row can come back looking fully masked.
    if (score_bound(p, in.Q.data(), in.K.data()) > kScoreLimit) {
        for (const Backend& b : available_backends()) {
            if (b.device != "cpu") continue;
            try {
                run(b, p, in);
            } catch (const std::invalid_argument& e) {
                if (std::string(e.what()).rfind("scale = ", 0) == 0) continue;
                finding(p, b.name, "refused, but not for its scores", 0, 0, 0, 0);
            }
            finding(p, b.name, "accepted scores beyond float32", 0, 0, 0, 0);
        }
        return 0;
    }

    const test::OutputFlags nan = test::expected_nans(p, in);
    const test::OutputFlags wild =
        test::reads_any(p, in, [](float x) { return !(std::fabs(x) <= kTame); });
    const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
    const Slack slack = float32_slack(p, in);

    // Float32 standard attention: the 2x rule's yardstick over the tame elements.
    const Outputs yard = run(find_backend("standard"), p, in);
    double e_std_o = 0, e_std_lse = 0;
    for (std::size_t k = 0; k < ref.O.size(); ++k)
        if (!wild.O[k]) e_std_o = std::max(e_std_o, std::fabs(yard.O[k] - ref.O[k]));
    for (std::size_t r = 0; r < ref.lse.size(); ++r)
        if (!wild.lse[r] && std::isfinite(ref.lse[r]))
            e_std_lse = std::max(e_std_lse, std::fabs(yard.lse[r] - ref.lse[r]));
    if (!std::isfinite(e_std_o) || !std::isfinite(e_std_lse))
        finding(p, "standard", "a NaN or inf where the inputs are tame", 0, e_std_o, e_std_lse, 0);

    // The reference itself obeys the NaN rule where the rule speaks (an infinity may make a NaN
    // of its own: inf * 0 with scale 0, inf - inf in a sum).
    for (std::size_t k = 0; k < ref.O.size(); ++k)
        if ((nan.O[k] || !wild.O[k]) && nan.O[k] != std::isnan(ref.O[k]))
            finding(p, "reference", "NaN rule broken in O", k, ref.O[k], 0, 0);
    for (std::size_t r = 0; r < ref.lse.size(); ++r)
        if ((nan.lse[r] || !wild.lse[r]) && nan.lse[r] != std::isnan(ref.lse[r]))
            finding(p, "reference", "NaN rule broken in LSE", r, ref.lse[r], 0, 0);

    for (const Backend& b : available_backends()) {
        if (b.device != "cpu") continue;
        const Outputs out = b.name == "standard" ? yard : run(b, p, in);
        for (std::size_t k = 0; k < ref.O.size(); ++k) {
            const bool is_nan = std::isnan(out.O[k]);
            if (nan.O[k]) {
                if (!is_nan)
                    finding(p, b.name, "O should be NaN (reads a NaN)", k, out.O[k], ref.O[k], 0);
            } else if (!wild.O[k]) {
                const double bound = 2 * e_std_o + 1e-6 + slack.O[k];
                if (is_nan || !(std::fabs(out.O[k] - ref.O[k]) <= bound))
                    finding(p, b.name, "O off the float64 reference", k, out.O[k], ref.O[k], bound);
            }
        }
        for (std::size_t r = 0; r < ref.lse.size(); ++r) {
            if (nan.lse[r]) {
                if (!std::isnan(out.lse[r]))
                    finding(p, b.name, "LSE should be NaN", r, out.lse[r], ref.lse[r], 0);
            } else if (!wild.lse[r]) {
                const double bound = 2 * e_std_lse + 1e-6 + slack.lse[r];
                const bool ok = std::isinf(ref.lse[r])
                                    ? out.lse[r] == ref.lse[r]  // -inf: no key
                                    : std::fabs(out.lse[r] - ref.lse[r]) <= bound;
                if (!ok)
                    finding(p, b.name, "LSE off the float64 reference", r, out.lse[r], ref.lse[r],
                            bound);
            }
        }
    }
    return 0;
}
