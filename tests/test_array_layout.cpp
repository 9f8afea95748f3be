// tests/test_array_layout.cpp — where a strided array's rows lie (common/array_layout.hpp): the
// contiguous order, the span of a view, the merge of overlapping spans, and the rules the device
// entries check a caller's layouts by. Host code only: these run on every machine, though the
// layouts themselves are read by CUDA kernels.
#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "catch.hpp"
#include "common/array_layout.hpp"

using namespace flashattn;

namespace {

// Every element index (from the array's address) of a (batch, heads, rows, d) array at `at`,
// found by walking the four axes: the independent count that span_elements must agree with.
std::set<std::int64_t> elements(const ArrayLayout& at, std::int64_t batch, std::int64_t heads,
                                std::int64_t rows, std::int64_t d) {
    std::set<std::int64_t> out;
    for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t h = 0; h < heads; ++h)
            for (std::int64_t r = 0; r < rows; ++r)
                for (std::int64_t c = 0; c < d; ++c)
                    out.insert(b * at.batch + h * at.head + r * at.row + c);
    return out;
}

}  // namespace

TEST_CASE("array layouts: the default layout is the contiguous order, and spans the array") {
    for (auto [B, H, N, d] : std::vector<std::array<std::int64_t, 4>>{
             {1, 1, 1, 1}, {2, 3, 5, 7}, {3, 1, 17, 64}, {1, 4, 9, 37}}) {
        const ArrayLayout at = ArrayLayout{}.resolved(H, N, d);
        for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < H; ++h)
                for (std::int64_t r = 0; r < N; ++r)
                    REQUIRE(at.offset(b, h) + r * at.row == ((b * H + h) * N + r) * d);
        CHECK(span_elements(ArrayLayout{}, B, H, N, d) == B * H * N * d);
        CHECK(span_elements(at, B, H, N, d) == B * H * N * d);
    }
    CHECK(span_elements(ArrayLayout{}, 0, 3, 5, 7) == 0);
    CHECK(span_elements(ArrayLayout{}, 2, 3, 0, 7) == 0);
}

TEST_CASE("array layouts: q, k and v cut from one projection span it, and their spans merge into it") {
    // A (B, N, 3, H, d) projection; q, k, v are its thirds viewed as (B, H, N, d).
    for (auto [B, N, H, d] : std::vector<std::array<std::int64_t, 4>>{
             {2, 5, 3, 4}, {1, 7, 2, 37}, {3, 4, 1, 8}}) {
        const std::int64_t row = 3 * H * d, size = B * N * row;
        const ArrayLayout at{N * row, d, row};
        std::vector<MemoryRange> ranges;
        const std::uintptr_t base = 4096;  // an address, in floats' bytes
        for (std::int64_t third = 0; third < 3; ++third) {
            const std::set<std::int64_t> e = elements(at, B, H, N, d);
            const std::int64_t span = span_elements(at, B, H, N, d);
            INFO("B N H d = " << B << " " << N << " " << H << " " << d << ", third " << third);
            CHECK(span == *e.rbegin() - *e.begin() + 1);  // first value to last
            CHECK(*e.begin() == 0);
            const std::uintptr_t begin = base + std::uintptr_t(third * H * d) * sizeof(float);
            ranges.push_back({begin, begin + std::uintptr_t(span) * sizeof(float)});
        }
        // The three spans overlap, and their union is the whole projection: one range.
        const std::vector<MemoryRange> merged = merged_ranges(ranges);
        REQUIRE(merged.size() == 1);
        CHECK(merged[0].begin == base);
        CHECK(merged[0].end == base + std::uintptr_t(size) * sizeof(float));
    }
}

TEST_CASE("array layouts: merged ranges keep disjoint ones apart, join touching and nested ones, drop empty ones") {
    const std::vector<MemoryRange> ranges = {
        {100, 200}, {300, 400}, {200, 250},  // touching: 100-250
        {320, 330},                          // inside 300-400
        {500, 500},                          // empty
        {390, 450},                          // overlapping: 300-450
        {1000, 1016}};
    const std::vector<MemoryRange> expect = {{100, 250}, {300, 450}, {1000, 1016}};
    std::vector<MemoryRange> shuffled = ranges;
    std::mt19937 rng(7);
    for (int round = 0; round < 20; ++round) {
        std::shuffle(shuffled.begin(), shuffled.end(), rng);
        const std::vector<MemoryRange> got = merged_ranges(shuffled);
        REQUIRE(got.size() == expect.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
            CHECK(got[i].begin == expect[i].begin);
            CHECK(got[i].end == expect[i].end);
        }
    }
    CHECK(merged_ranges({}).empty());
    CHECK(merged_ranges({{8, 8}, {16, 8}}).empty());
}

TEST_CASE("array layouts: an input read in place needs 16-byte strides only where its rows are copied 16 bytes at a time") {
    alignas(16) static float buffer[64];
    const void* aligned = buffer;
    const void* odd = buffer + 1;  // 4 bytes past a 16-byte boundary
    // Rows of d = 64 floats, 16-byte strides: read in place, from an aligned address only.
    CHECK_NOTHROW(require_input_layout(aligned, {4096, 64, 768}, 64, DType::f32, "K"));
    CHECK_THROWS_AS(require_input_layout(odd, {4096, 64, 768}, 64, DType::f32, "K"),
                    std::invalid_argument);
    // A head stride that breaks the 16-byte copies: refused, naming the array.
    CHECK_THROWS_WITH(require_input_layout(aligned, {4096, 65, 768}, 64, DType::f32, "K"),
                      Catch::Contains("K:"));
    CHECK_THROWS_AS(require_input_layout(aligned, {4098, 64, 768}, 64, DType::f32, "K"),
                    std::invalid_argument);
    // Rows copied value by value (d = 37, or a row stride that is no multiple of 16 bytes): any
    // strides that are not negative, any address.
    CHECK_NOTHROW(require_input_layout(odd, {4099, 37, 111}, 37, DType::f32, "Q"));
    CHECK_NOTHROW(require_input_layout(odd, {4099, 65, 769}, 64, DType::f32, "Q"));
    CHECK_THROWS_AS(require_input_layout(aligned, {4096, -64, 768}, 64, DType::f32, "Q"),
                    std::invalid_argument);
    // The copies take a row stride as an int: one of 2^31 elements or more is refused.
    CHECK_NOTHROW(require_input_layout(aligned, {0, 0, (std::int64_t{1} << 31) - 4}, 64,
                                       DType::f32, "Q"));
    CHECK_THROWS_WITH(require_input_layout(aligned, {0, 0, std::int64_t{1} << 31}, 64,
                                           DType::f32, "Q"),
                      Catch::Contains("2^31"));
    // 16-bit values: 16 bytes are 8 of them.
    CHECK_NOTHROW(require_input_layout(aligned, {4096, 64, 776}, 64, DType::bf16, "V"));
    CHECK_THROWS_AS(require_input_layout(aligned, {4096, 68, 776}, 64, DType::bf16, "V"),
                    std::invalid_argument);
}

TEST_CASE("array layouts: an output of cuda-fa2's needs even strides only at an even d") {
    alignas(16) static float buffer[64];
    // Even d: stored two floats at a time, so even strides and an 8-byte aligned address.
    CHECK_NOTHROW(require_output_layout(buffer, {4096, 64, 770}, 64, DType::f32, "O"));
    CHECK_THROWS_AS(require_output_layout(buffer, {4096, 64, 771}, 64, DType::f32, "O"),
                    std::invalid_argument);
    CHECK_THROWS_AS(require_output_layout(buffer + 1, {4096, 64, 770}, 64, DType::f32, "O"),
                    std::invalid_argument);
    // Odd d: one float at a time, so any strides that are not negative (a contiguous d = 37 O
    // has odd ones).
    CHECK_NOTHROW(require_output_layout(buffer + 1, {37 * 5 * 3, 37 * 5, 37}, 37, DType::f32, "O"));
    CHECK_THROWS_WITH(require_output_layout(buffer, {4096, -37, 111}, 37, DType::f32, "dQ"),
                      Catch::Contains("dQ:"));
}
