// examples/print.hpp — how the step-through examples print numbers, vectors and small matrices:
// fixed width and decimals, so columns line up and a learner can compare values by eye.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>

namespace flashattn::examples {

// One number in a fixed-width field; -inf and NaN are spelled out (they are states a learner
// must recognize: m = -inf before the first block, NaN only from a NaN input).
inline void print_number(double v, int width = 8, int decimals = 4) {
    if (std::isnan(v))
        std::printf("%*s", width, "nan");
    else if (std::isinf(v))
        std::printf("%*s", width, v < 0 ? "-inf" : "inf");
    else
        std::printf("%*.*f", width, decimals, v);
}

// n numbers on one line, without a newline.
template <class T>
void print_values(const T* values, std::int64_t n, int width = 8, int decimals = 4) {
    for (std::int64_t k = 0; k < n; ++k) print_number(static_cast<double>(values[k]), width, decimals);
}

// A rows x cols matrix whose row r starts at data + r * stride, under a title; rows are numbered
// from `first_row` (1 to follow the paper, which counts from 1).
template <class T>
void print_matrix(const char* title, const T* data, std::int64_t rows, std::int64_t cols,
                  std::int64_t stride, std::int64_t first_row = 1, int decimals = 4) {
    std::printf("%s\n", title);
    for (std::int64_t r = 0; r < rows; ++r) {
        std::printf("  %3lld |", static_cast<long long>(first_row + r));
        print_values(data + r * stride, cols, decimals + 5, decimals);
        std::printf("\n");
    }
}

// The gradients of a figure-6 problem between two marker lines, in one format for examples 06
// and 07: the test "examples 06 and 07 print the same gradients" compares the text between them.
template <class T>
void print_gradients(const T* dQ, const T* dK, const T* dV, std::int64_t N, std::int64_t d) {
    std::printf("---- gradients ----\n");
    print_matrix("dQ", dQ, N, d, d, 1, 6);
    print_matrix("dK", dK, N, d, d, 1, 6);
    print_matrix("dV", dV, N, d, d, 1, 6);
    std::printf("---- end of gradients ----\n");
}

}  // namespace flashattn::examples
