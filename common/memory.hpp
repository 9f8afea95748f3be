// common/memory.hpp — the checks that turn a problem too large for this machine into
// std::runtime_error before anything that large is allocated (require_memory, work_elements).
// Host-side; used by the CPU forms, the CUDA host code (cuda-standard's S and P) and the CLI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace flashattn {

// Bytes of physical memory of this machine (0 when the system does not say).
inline double physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page_size = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page_size > 0 ? double(pages) * double(page_size) : 0.0;
}

// Throws std::runtime_error naming `what` when `bytes` exceed this machine's physical memory.
// Checked before large allocations because an allocation that large either fails or, under
// Linux's memory overcommit, succeeds and gets the process killed once the pages are touched.
// (double: estimates such as 8 * N_q * N_kv must not overflow before they are compared.)
inline void require_memory(double bytes, const std::string& what) {
    const double physical = physical_memory_bytes();
    if (physical > 0 && bytes > physical) {
        char message[160];
        std::snprintf(message, sizeof message,
                      ": %.1f GiB needed, more than this machine's %.1f GiB of memory",
                      bytes / double(1 << 30), physical / double(1 << 30));
        throw std::runtime_error(what + message);
    }
}

// rows * cols as an element count for a WorkBuffer, or std::runtime_error when the product is
// beyond any memory (2^61 elements): validate() bounds each of N_q and N_kv by 2^40, not N_q*N_kv,
// so the product itself must not be computed in plain int64 arithmetic.
inline std::int64_t work_elements(std::int64_t rows, std::int64_t cols) {
    constexpr std::int64_t limit = std::int64_t{1} << 61;
    if (rows < 0 || cols < 0 || (cols != 0 && rows > limit / cols))
        throw std::runtime_error("working memory of " + std::to_string(rows) + " x " +
                                 std::to_string(cols) + " elements is more than any memory");
    return rows * cols;
}

}  // namespace flashattn
