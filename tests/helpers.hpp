// tests/helpers.hpp — what every backend test does: fresh random inputs, poisoned outputs, the
// float64 reference and the 2x rule (cpu/reference.hpp; docs/design.md "Correctness rule").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "common/backend.hpp"
#include "common/online_softmax.hpp"
#include "common/registry.hpp"
#include "cpu/reference.hpp"

namespace flashattn::test {

inline std::string describe(const AttentionProblem& p) {
    return "B=" + std::to_string(p.batch) + " H=" + std::to_string(p.heads) +
           " Hkv=" + std::to_string(p.heads_kv) + " Nq=" + std::to_string(p.seq_q) +
           " Nkv=" + std::to_string(p.seq_kv) + " d=" + std::to_string(p.dim) +
           (p.causal ? " causal" : "") + (p.block_q ? " Br=" + std::to_string(p.block_q) +
                                                      " Bc=" + std::to_string(p.block_kv)
                                                : "") +
           (p.block_mask.active() ? " block-mask" : "");
}

// A problem of the given shape, everything else default (scale 1/sqrt(d), no mask).
inline AttentionProblem make_problem(std::int64_t B, std::int64_t H, std::int64_t Hkv,
                                     std::int64_t Nq, std::int64_t Nkv, std::int64_t d,
                                     bool causal = false) {
    AttentionProblem p;
    p.batch = B, p.heads = H, p.heads_kv = Hkv, p.seq_q = Nq, p.seq_kv = Nkv, p.dim = d;
    p.causal = causal;
    return p;
}

// Inputs whose every score is near -c^2 d = -128 .. -144 for d = 64, 128, 256 (the caller sets
// p.scale = 1), so that L_i < -88 and e^(-L_i) overflows float32: a key past N_kv that a kernel
// fails to mask (a zero K_j row, S = 0) turns dQ NaN. Q and K are multiples of 1/8 near -c and c
// plus 1% of a normal draw: not exact in 16 bits, so that their rounding enters the rule's
// baseline as in every other case. (Exact, the baseline holds only V's and dO's rounding, and a
// kernel that rounds P and dS to 16 bits exceeds the fp16 bound by up to 2x: test_backward.cpp's
// emulation of one checks the family as it is.)
inline ProblemData low_score_data(const AttentionProblem& p, std::uint64_t seed) {
    const float c = p.dim <= 64 ? 1.5f : p.dim <= 128 ? 1.0f : 0.75f;
    ProblemData in = random_problem_data(p, seed);
    std::mt19937 gen(static_cast<std::uint32_t>(seed));
    const auto near = [&](float x) { return x + 0.125f * float(int(gen() % 5) - 2); };
    for (float& q : in.Q) q = near(-c) + 0.01f * q;
    for (float& k : in.K) k = near(c) + 0.01f * k;
    return in;
}

// The odd-shape grid (docs/design.md, Correctness rule): (N_q, N_kv) pairs equal, N_q < N_kv and
// N_q > N_kv, and head
// dimensions, none a multiple of any block size except the power-of-two dims a kernel may favour.
inline const std::vector<std::pair<std::int64_t, std::int64_t>> kOddSeqPairs = {
    {1, 1}, {1, 203}, {7, 113}, {113, 7}, {113, 113}, {203, 1023}, {1023, 203}};
inline const std::vector<std::int64_t> kOddDims = {1, 3, 59, 64, 111, 128, 256};

// A fresh seed per call, so no two checks share inputs (reported on failure).
inline std::uint64_t next_seed() {
    static std::uint64_t seed = 0x5eed0000 + static_cast<std::uint64_t>(Catch::rngSeed());
    return seed += 7919;
}

// A backend of this build without a backward pass, for the tests that such a backend is refused:
// found at run time, since more backends gain a backward as they are written. Empty when every
// backend has one (the caller then WARNs and skips that check).
inline std::string backend_without_backward() {
    for (const Backend& b : available_backends())
        if (!b.has_backward()) return b.name;
    return {};
}

// The CPU backends that have a backward pass, in the registry's order (standard first).
inline std::vector<std::string> cpu_backends_with_backward() {
    std::vector<std::string> names;
    for (const Backend& b : available_backends())
        if (b.device == "cpu" && b.has_backward()) names.push_back(b.name);
    return names;
}

struct Outputs {
    std::vector<float> O, lse;
};

// Runs a backend with output buffers poisoned (NaN) beforehand.
inline Outputs run_poisoned(const Backend& backend, const AttentionProblem& p, const ProblemData& in,
                            DType dtype = DType::f32) {
    Outputs out;
    out.O.assign(p.q_elements(), std::numeric_limits<float>::quiet_NaN());
    out.lse.assign(p.lse_elements(), std::numeric_limits<float>::quiet_NaN());
    run_backend(backend, p, in.Q.data(), in.K.data(), in.V.data(), out.O.data(), out.lse.data(),
                dtype);
    return out;
}

// Checks one backend on one problem against float64 standard attention by the 2x rule, for O
// and LSE. The yardstick is standard attention in float32 (on dtype-rounded inputs). This form
// takes the inputs (for inputs with a special structure, NaN included); the next one draws
// fresh random ones. A NaN must be exactly where the reference has one: max_abs_error counts a
// mismatch as an infinite error, so a NaN left in a poisoned output fails, and the yardstick
// must match the reference's NaNs too, or the bound would be infinite. Returns the outputs.
inline Outputs check_against_reference(const Backend& backend, const AttentionProblem& p,
                                       const ProblemData& in, DType dtype = DType::f32) {
    INFO(backend.name << " " << describe(p) << " dtype=" << to_string(dtype));
    const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
    const RuleBounds bound = rule_bounds(p, in, ref, dtype);
    Outputs out = run_poisoned(backend, p, in, dtype);
    const double err_o = max_abs_error(out.O.data(), ref.O.data(), p.q_elements());
    const double err_lse = max_abs_error(out.lse.data(), ref.lse.data(), p.lse_elements());
    INFO("O error " << err_o << " (bound " << bound.O << "), LSE error " << err_lse << " (bound "
                    << bound.lse << ")");
    REQUIRE(std::isfinite(bound.O));
    REQUIRE(std::isfinite(bound.lse));
    // FLASHATTN_TEST_MARGINS=1: one line per check with error / bound (1 = at the bound), to see
    // how close a backend runs to the 2x rule over many seeds (docs/testing.md).
    if (std::getenv("FLASHATTN_TEST_MARGINS"))
        std::fprintf(stderr, "margin %s %s O %.3f LSE %.3f\n", backend.name.c_str(),
                     describe(p).c_str(), err_o / bound.O, err_lse / bound.lse);
    CHECK(err_o <= bound.O);
    CHECK(err_lse <= bound.lse);
    return out;
}

// The same on fresh random normal inputs, where the reference has no NaN: a NaN left in the
// output is an unwritten (poisoned) element.
inline void check_against_reference(const Backend& backend, const AttentionProblem& p,
                                    DType dtype = DType::f32) {
    const std::uint64_t seed = next_seed();
    INFO("seed=" << seed);
    const Outputs out = check_against_reference(backend, p, random_problem_data(p, seed), dtype);
    bool any_nan = false;
    for (float x : out.O) any_nan = any_nan || std::isnan(x);
    CHECK_FALSE(any_nan);
}

// Inputs whose rows' maximum climbs, jumps and drops across the key tiles, for the kernels that
// keep a reference maximum while a tile exceeds it by at most 2^8 (keeps_reference_max,
// common/online_softmax.hpp) and move it only beyond: on random normal inputs a row's maximum
// hardly grows after its first tile, so only the first branch would run. Query rows are u + noise
// with u = (1, ..., 1) / 4 and keys noise + g(t) u, so the score of key t rises by
// g(t) |u|^2 = g(t) d / 16, and g makes the base-2 exponent e(t): 0.06 per key (a reference is
// kept for about 130 keys, then moved: kept at some tiles and moved at others, for tiles of 32 to
// 128 keys), plus a jump of 20 (moved) a third of the way and a drop of 30 (kept: a lower
// maximum) two thirds of the way.
inline ProblemData climbing_maximum_data(const AttentionProblem& p, std::uint64_t seed) {
    ProblemData in = random_problem_data(p, seed);
    const std::int64_t d = p.dim;
    const double per_unit = (double(d) / 16) * p.softmax_scale() * kLog2e;
    for (float& q : in.Q) q = 0.25f + 0.1f * q;
    for (std::int64_t key_row = 0; key_row < p.batch * p.heads_kv * p.seq_kv; ++key_row) {
        const std::int64_t t = key_row % p.seq_kv;  // K is (B, H_kv, N_kv, d)
        double e = 0.06 * double(t);
        if (t >= p.seq_kv / 3) e += 20.0;
        if (t >= 2 * p.seq_kv / 3) e -= 30.0;
        const float g = float(e / per_unit);
        float* k = &in.K[key_row * d];
        for (std::int64_t c = 0; c < d; ++c) k[c] = 0.1f * k[c] + 0.25f * g;
    }
    return in;
}

// The backward pass (Algorithm 4) checked the same way, on each of dQ, dK, dV: the float64
// reference is Algorithm 3 in double, the yardstick Algorithm 3 in float32 on dtype-rounded
// inputs (cpu/reference.hpp). The backward reads the O and LSE of the same backend's forward, as
// in training (`flashattn run --dout`): the flash forms rebuild P as exp(S - L), and their own
// forward's L was computed from the same S.
struct Gradients {
    std::vector<float> dQ, dK, dV;
};

// One forward then backward of `backend` on these inputs, unchecked (for tests that compare runs
// or look for NaN): the backward reads the forward's O and LSE, and dQ, dK, dV are poisoned (NaN)
// before the run, so an element the backward leaves unwritten reads as NaN.
inline Gradients run_forward_backward(const Backend& backend, const AttentionProblem& p,
                                      const ProblemData& in, const std::vector<float>& dO,
                                      DType dtype) {
    const Outputs fwd = run_poisoned(backend, p, in, dtype);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Gradients g{std::vector<float>(p.q_elements(), nan), std::vector<float>(p.kv_elements(), nan),
                std::vector<float>(p.kv_elements(), nan)};
    const BackwardInputs bin{in.Q.data(), in.K.data(), in.V.data(), fwd.O.data(), fwd.lse.data(),
                             dO.data()};
    run_backward(backend, p, bin, g.dQ.data(), g.dK.data(), g.dV.data(), dtype);
    return g;
}

// Whether row `row` of a (rows x d) array holds a NaN.
inline bool row_has_nan(const std::vector<float>& v, std::int64_t row, std::int64_t d) {
    for (std::int64_t k = 0; k < d; ++k)
        if (std::isnan(v[row * d + k])) return true;
    return false;
}

// The registry's cuda-fa3, or nullptr (with a warning) where this build or GPU has none.
inline const Backend* cuda_fa3_or_warn() {
    for (const Backend& b : available_backends())
        if (b.name == "cuda-fa3") return &b;
    WARN("no cuda-fa3 here (it needs a build with CMAKE_CUDA_ARCHITECTURES=90a and a Hopper GPU)");
    return nullptr;
}

// Prepares one problem once, executes it `runs` + 1 times and checks that every run gives the
// first run's bits, O and LSE: a race, or a sum whose order changes from run to run, would show as
// a difference. Returns the first run's outputs.
inline Outputs check_identical_runs(const Backend& backend, const AttentionProblem& p,
                                    const ProblemData& in, DType dtype, int runs = 5) {
    INFO(backend.name << " " << describe(p) << " dtype=" << to_string(dtype));
    auto prepared = backend.prepare(p, in.Q.data(), in.K.data(), in.V.data(), dtype);
    Outputs first{std::vector<float>(p.q_elements()), std::vector<float>(p.lse_elements())};
    prepared->execute();
    prepared->fetch(first.O.data(), first.lse.data());
    for (int run = 0; run < runs; ++run) {
        std::vector<float> O(p.q_elements()), lse(p.lse_elements());
        prepared->execute();
        prepared->fetch(O.data(), lse.data());
        CHECK(std::memcmp(O.data(), first.O.data(), O.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(lse.data(), first.lse.data(), lse.size() * sizeof(float)) == 0);
    }
    return first;
}

inline Gradients check_backward_against_reference(const Backend& backend,
                                                  const AttentionProblem& p, const ProblemData& in,
                                                  const std::vector<float>& dO,
                                                  DType dtype = DType::f32) {
    INFO(backend.name << " backward " << describe(p) << " dtype=" << to_string(dtype));
    const Outputs fwd = run_poisoned(backend, p, in, dtype);
    const std::vector<float>& O = fwd.O;
    const std::vector<float>& lse = fwd.lse;
    const GradReference ref = reference_backward(p, in.Q.data(), in.K.data(), in.V.data(), dO.data());
    const GradBounds bound = gradient_bounds(p, in, dO, ref, dtype);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Gradients g{std::vector<float>(p.q_elements(), nan), std::vector<float>(p.kv_elements(), nan),
                std::vector<float>(p.kv_elements(), nan)};
    const BackwardInputs bin{in.Q.data(), in.K.data(), in.V.data(), O.data(), lse.data(), dO.data()};
    run_backward(backend, p, bin, g.dQ.data(), g.dK.data(), g.dV.data(), dtype);
    const double err_q = max_abs_error(g.dQ.data(), ref.dQ.data(), p.q_elements());
    const double err_k = max_abs_error(g.dK.data(), ref.dK.data(), p.kv_elements());
    const double err_v = max_abs_error(g.dV.data(), ref.dV.data(), p.kv_elements());
    INFO("dQ error " << err_q << " (bound " << bound.dQ << "), dK error " << err_k << " (bound "
                     << bound.dK << "), dV error " << err_v << " (bound " << bound.dV << ")");
    REQUIRE(std::isfinite(bound.dQ));
    REQUIRE(std::isfinite(bound.dK));
    REQUIRE(std::isfinite(bound.dV));
    if (std::getenv("FLASHATTN_TEST_MARGINS"))
        std::fprintf(stderr, "margin %s backward %s dQ %.3f dK %.3f dV %.3f\n",
                     backend.name.c_str(), describe(p).c_str(), err_q / bound.dQ,
                     err_k / bound.dK, err_v / bound.dV);
    CHECK(err_q <= bound.dQ);
    CHECK(err_k <= bound.dK);
    CHECK(err_v <= bound.dV);
    return g;
}

// The same on fresh random inputs and a fresh random dO; no gradient may be NaN.
inline void check_backward_against_reference(const Backend& backend, const AttentionProblem& p,
                                             DType dtype = DType::f32) {
    const std::uint64_t seed = next_seed();
    INFO("seed=" << seed);
    const ProblemData in = random_problem_data(p, seed);
    const std::vector<float> dO = random_normal(p.q_elements(), seed + 3);
    const Gradients g = check_backward_against_reference(backend, p, in, dO, dtype);
    const auto any_nan = [](const std::vector<float>& v) {
        return std::any_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
    };
    CHECK_FALSE(any_nan(g.dQ));
    CHECK_FALSE(any_nan(g.dK));
    CHECK_FALSE(any_nan(g.dV));
}

// Sets an environment variable for one scope and restores the caller's value (or its absence)
// afterwards: FLASHATTN_VARIANT picks a kernel (cuda/host/variants.hpp), and the caller's choice
// (cuda/tools/fa2_margins.sh runs the suites under one) must hold again for the test cases that
// follow.
struct ScopedEnv {
    std::string name;
    const char* env;
    std::string saved;
    explicit ScopedEnv(std::string n)
        : name(std::move(n)), env(std::getenv(name.c_str())), saved(env ? env : "") {}
    void set(const std::string& value) const { setenv(name.c_str(), value.c_str(), 1); }
    ~ScopedEnv() {
        if (env) setenv(name.c_str(), saved.c_str(), 1);
        else unsetenv(name.c_str());
    }
};

}  // namespace flashattn::test
