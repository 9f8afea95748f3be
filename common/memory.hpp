// common/memory.hpp — the checks that turn a problem too large for this process into
// std::runtime_error before anything that large is allocated (require_memory, work_elements), and
// the message of an allocation that fails anyway (out_of_memory). Host-side; used by the CPU
// forms, the CUDA host code (cuda-standard's S and P) and the CLI.
//
// The rule, for every backend: a message about memory says how many bytes were needed and for
// what, and which limit they exceed. Two limits matter, whichever is smaller:
//   * the machine's physical memory: beyond it an allocation either fails or, under Linux's
//     overcommit, succeeds and gets the process killed once the pages are touched;
//   * the address-space limit (`ulimit -v`, RLIMIT_AS): under it an allocation fails as soon as
//     the process's mappings (not the memory it touched) would exceed the limit, long before
//     physical memory runs out. What is already mapped (code, thread stacks, malloc's arenas)
//     counts against it too.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace flashattn {

// Bytes of physical memory of this machine (0 when the system does not say).
inline double physical_memory_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long page_size = ::sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page_size > 0 ? double(pages) * double(page_size) : 0.0;
}

// This process's address-space limit in bytes (ulimit -v, RLIMIT_AS); infinity without one.
inline double address_space_limit_bytes() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return HUGE_VAL;
    return double(limit.rlim_cur);
}

// Bytes this process has mapped now (VmSize, the first field of /proc/self/statm; 0 where that
// cannot be read).
inline double mapped_bytes() {
    unsigned long pages = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%lu", &pages) != 1) pages = 0;
        std::fclose(f);
    }
    return double(pages) * double(::sysconf(_SC_PAGE_SIZE));
}

// "1073741824 bytes (1.0 GiB)": the exact count a reader can check, and a size a person reads.
inline std::string bytes_text(double bytes) {
    static const char* const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double size = bytes;
    int unit = 0;
    while (size >= 1024 && unit < 6) size /= 1024, ++unit;
    char text[96];
    if (unit == 0)
        std::snprintf(text, sizeof text, "%.0f bytes", bytes);
    else if (bytes < 1e15)  // exact in a double, and short enough to read
        std::snprintf(text, sizeof text, "%.0f bytes (%.1f %s)", bytes, size, units[unit]);
    else
        std::snprintf(text, sizeof text, "%.3g bytes (%.1f %s)", bytes, size, units[unit]);
    return text;
}

namespace detail {
// "; the address-space limit (ulimit -v) is 2147483648 bytes (2.0 GiB)" where there is one.
inline std::string address_space_note() {
    const double limit = address_space_limit_bytes();
    if (std::isinf(limit)) return {};
    return "; the address-space limit (ulimit -v) is " + bytes_text(limit);
}
}  // namespace detail

// Throws std::runtime_error naming `what` and the bytes when `bytes` exceed this machine's
// physical memory or what the address-space limit leaves this process. Checked before large
// allocations; `bytes` is a double so that estimates such as 8 * N_q * N_kv cannot overflow before
// they are compared.
inline void require_memory(double bytes, const std::string& what) {
    const double physical = physical_memory_bytes();
    if (physical > 0 && bytes > physical)
        throw std::runtime_error(what + ": " + bytes_text(bytes) +
                                 " needed, more than this machine's " + bytes_text(physical) +
                                 " of memory");
    const double limit = address_space_limit_bytes();
    if (std::isinf(limit)) return;
    const double left = limit > mapped_bytes() ? limit - mapped_bytes() : 0.0;
    if (bytes > left)
        throw std::runtime_error(what + ": " + bytes_text(bytes) + " needed, more than the " +
                                 bytes_text(left) + " this process may still map under its " +
                                 "address-space limit (ulimit -v: " + bytes_text(limit) + ")");
}

// The error for an allocation of `bytes` for `what` that failed (std::bad_alloc, or nullptr from
// new (std::nothrow)): allocations that passed require_memory can still fail, since the estimate
// does not count the allocator's own overhead or what other threads map meanwhile.
inline std::runtime_error out_of_memory(double bytes, const std::string& what) {
    return std::runtime_error(what + ": out of memory allocating " + bytes_text(bytes) +
                              detail::address_space_note());
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
