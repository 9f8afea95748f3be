// tests/test_validation.cpp — every backend refuses a problem it cannot run with
// std::invalid_argument naming the field and its value, before it reads an input; and a problem
// too large for memory is std::runtime_error, never a crash.
#include <functional>
#include <limits>

#include "backends_under_test.hpp"
#include "common/tiling.hpp"
#include "cpu/scalar.hpp"
#include "cpu/standard.hpp"
#include "cpu/workspace.hpp"

using namespace flashattn;
using test::describe;

namespace {

AttentionProblem small_problem() {
    AttentionProblem p;
    p.batch = 2, p.heads = 4, p.heads_kv = 2, p.seq_q = 7, p.seq_kv = 9, p.dim = 5;
    return p;
}

struct BadCase {
    std::string expected;  // the message must contain this: "field = value"
    std::function<void(AttentionProblem&)> spoil;
};

const std::uint8_t kMaskByte = 1;

const std::vector<BadCase> kBadProblems = {
    {"batch = 0", [](AttentionProblem& p) { p.batch = 0; }},
    {"heads = -3", [](AttentionProblem& p) { p.heads = -3; }},
    {"heads_kv = 0", [](AttentionProblem& p) { p.heads_kv = 0; }},
    {"heads_kv = 3", [](AttentionProblem& p) { p.heads_kv = 3; }},  // 4 % 3 != 0
    {"heads_kv = 8", [](AttentionProblem& p) { p.heads_kv = 8; }},  // more K/V heads than Q heads
    {"seq_q = 0", [](AttentionProblem& p) { p.seq_q = 0; }},
    {"seq_kv = -1", [](AttentionProblem& p) { p.seq_kv = -1; }},
    {"dim = 0", [](AttentionProblem& p) { p.dim = 0; }},
    {"dim = 257", [](AttentionProblem& p) { p.dim = 257; }},
    // Products that overflow int64 if multiplied naively: 2^31 * 4 * 2^31 * 5.
    {"Q elements = 2147483648x4x2147483648x5",
     [](AttentionProblem& p) { p.batch = std::int64_t{1} << 31, p.seq_q = std::int64_t{1} << 31; }},
    {"K/V elements = 2x2x4611686018427387904x5",
     [](AttentionProblem& p) { p.seq_kv = std::int64_t{1} << 62; }},
    {"scale = inf", [](AttentionProblem& p) { p.scale = std::numeric_limits<float>::infinity(); }},
    {"scale = -inf",
     [](AttentionProblem& p) { p.scale = -std::numeric_limits<float>::infinity(); }},
    {"block_q = -4", [](AttentionProblem& p) { p.block_q = -4, p.block_kv = 4; }},
    {"block_q/block_kv = 4/0", [](AttentionProblem& p) { p.block_q = 4; }},
    {"sram_floats = -1", [](AttentionProblem& p) { p.sram_floats = -1; }},
    {"sram_floats = 19", [](AttentionProblem& p) { p.sram_floats = 19; }},  // < 4d = 20
    {"block mask block_q = 0",
     [](AttentionProblem& p) {
         p.block_mask = {&kMaskByte, 0, 4};
     }},
    {"block mask block_kv = -2",
     [](AttentionProblem& p) {
         p.block_mask = {&kMaskByte, 4, -2};
     }},
};

}  // namespace

TEST_CASE("validate() names the field and the value of every invalid problem") {
    for (const BadCase& c : kBadProblems) {
        AttentionProblem p = small_problem();
        c.spoil(p);
        INFO(c.expected);
        CHECK_THROWS_AS(validate(p), std::invalid_argument);
        CHECK_THROWS_WITH(validate(p), Catch::Contains(c.expected));
    }
    CHECK_NOTHROW(validate(small_problem()));
}

TEST_CASE("every backend refuses an invalid problem before reading its inputs") {
    // Inputs of a single float: a backend that read them before validating would read out of
    // bounds (AddressSanitizer in the asan preset reports it).
    const float one = 1.0f;
    for (const Backend& b : available_backends())
        for (const BadCase& c : kBadProblems) {
            AttentionProblem p = small_problem();
            c.spoil(p);
            INFO(b.name << ": " << c.expected);
            CHECK_THROWS_AS(b.prepare(p, &one, &one, &one, test::test_dtype(b)),
                            std::invalid_argument);
            CHECK_THROWS_WITH(b.prepare(p, &one, &one, &one, test::test_dtype(b)),
                              Catch::Contains(c.expected));
        }
}

TEST_CASE("every backend refuses a missing (null) input or output array") {
    const AttentionProblem p = test::make_problem(2, 4, 2, 7, 9, 32);
    const std::vector<float> q(p.q_elements(), 0.5f), kv(p.kv_elements(), 0.5f);
    std::vector<float> O(p.q_elements()), lse(p.lse_elements());
    for (const Backend& b : available_backends()) {
        if (!test::backend_accepts(b, p)) continue;
        INFO(b.name);
        const DType t = test::test_dtype(b);
        CHECK_THROWS_WITH(b.prepare(p, nullptr, kv.data(), kv.data(), t),
                          Catch::Contains("Q = null"));
        CHECK_THROWS_WITH(b.prepare(p, q.data(), nullptr, kv.data(), t),
                          Catch::Contains("K = null"));
        CHECK_THROWS_WITH(b.prepare(p, q.data(), kv.data(), nullptr, t),
                          Catch::Contains("V = null"));
        CHECK_THROWS_WITH(run_backend(b, p, q.data(), kv.data(), kv.data(), nullptr, lse.data(), t),
                          Catch::Contains("O = null"));
        CHECK_NOTHROW(run_backend(b, p, q.data(), kv.data(), kv.data(), O.data(), nullptr, t));
    }
    CHECK_THROWS_WITH(scalar_attention(p, q.data(), nullptr, kv.data(), O.data(), nullptr),
                      Catch::Contains("K = null"));
    CHECK_THROWS_WITH(
        standard_attention<float>(p, q.data(), kv.data(), kv.data(), nullptr, nullptr),
        Catch::Contains("O = null"));
}

TEST_CASE("every backend refuses a dtype it does not list, and the CPU forms list all three") {
    for (const Backend& b : available_backends()) {
        INFO(b.name);
        REQUIRE_FALSE(b.dtypes.empty());
        if (b.device == "cpu")
            CHECK(b.dtypes == std::vector<DType>{DType::f32, DType::f16, DType::bf16});
    }
    CHECK_THROWS_WITH(parse_dtype("f64"), Catch::Contains("dtype = f64"));
}

TEST_CASE("a block size or M far beyond the sequence runs as one tile instead of failing") {
    AttentionProblem p = small_problem();
    p.block_q = std::numeric_limits<std::int64_t>::max();
    p.block_kv = std::numeric_limits<std::int64_t>::max() - 1;
    const ScalarPlan plan = scalar_plan(p);
    CHECK(plan.blocks.Br == p.seq_q);
    CHECK(plan.blocks.Bc == p.seq_kv);
    CHECK(plan.Tr == 1);
    CHECK(plan.Tc == 1);
    CHECK(tile_count(p.seq_q, p.block_q) == 1);  // ceil_div must not overflow
    for (const Backend& b : available_backends())
        if (test::backend_accepts(b, p)) test::check_against_reference(b, p, test::test_dtype(b));

    AttentionProblem m = small_problem();
    m.sram_floats = std::numeric_limits<std::int64_t>::max() / 4;
    CHECK(scalar_plan(m).Tc == 1);
    test::check_against_reference(find_backend("scalar"), m);
}

TEST_CASE("standard attention too large for memory is std::runtime_error, not a crash") {
    // N_q = N_kv = 2^20: S alone is 4 TiB in float (8 TiB in float64); the inputs are 4 MiB.
    AttentionProblem p;
    p.seq_q = p.seq_kv = std::int64_t{1} << 20;
    p.dim = 1;
    const std::vector<float> x(p.q_elements(), 0.5f);
    std::vector<float> O(p.q_elements()), lse(p.lse_elements());
    CHECK_THROWS_AS(
        standard_attention<float>(p, x.data(), x.data(), x.data(), O.data(), lse.data()),
        std::runtime_error);
    std::vector<double> O64(p.q_elements()), lse64(p.lse_elements());
    CHECK_THROWS_WITH(
        standard_attention<double>(p, x.data(), x.data(), x.data(), O64.data(), lse64.data()),
        Catch::Contains("1048576 x 1048576"));
    // Every backend that materializes S (Algorithm 0: "standard", "cuda-standard"); the flash
    // forms need O(N) memory here and would run for hours, so they are not called.
    for (const Backend& b : available_backends()) {
        const std::string suffix = "standard";
        if (b.name.size() < suffix.size() ||
            b.name.compare(b.name.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;
        INFO(b.name);
        CHECK_THROWS_AS(run_backend(b, p, x.data(), x.data(), x.data(), O.data(), lse.data(),
                                    test::test_dtype(b)),
                        std::runtime_error);
    }
}

TEST_CASE("working-memory sizes that overflow are std::runtime_error") {
    CHECK(work_elements(1 << 20, 1 << 20) == std::int64_t{1} << 40);
    CHECK_THROWS_AS(work_elements(std::int64_t{1} << 40, std::int64_t{1} << 40),
                    std::runtime_error);
    CHECK_THROWS_AS(WorkBuffer<double>(std::size_t(-1) / 4), std::runtime_error);
    CHECK_THROWS_AS(require_memory(1e30, "a test buffer"), std::runtime_error);
    CHECK_THROWS_WITH(require_memory(1e30, "a test buffer"), Catch::Contains("a test buffer"));
    CHECK_NOTHROW(require_memory(1024, "a small buffer"));
}
