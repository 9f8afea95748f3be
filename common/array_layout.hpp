// common/array_layout.hpp — where the rows of a (batch, heads, rows, d) array lie in memory.
//
// The library's own arrays are contiguous: row r of head h of batch b starts at
// ((b * heads + h) * rows + r) * d. A PyTorch tensor need not be: q, k and v cut from one
// (B, N, 3 H d) projection and viewed as (B, H, N, d) have rows 3 H d elements apart and heads d
// apart. A device entry that takes an ArrayLayout reads (or writes) such a tensor where it lies,
// instead of the caller copying it into the contiguous order first. The last axis, d, is always
// contiguous.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/config.hpp"
#include "common/dtype.hpp"
#include "common/problem.hpp"

namespace flashattn {

struct ArrayLayout {
    // Element strides of the batch, head and row axes. All zero (the default) means contiguous.
    std::int64_t batch = 0, head = 0, row = 0;

    FA_HOST_DEVICE bool is_default() const { return batch == 0 && head == 0 && row == 0; }
    FA_HOST_DEVICE bool non_negative() const { return batch >= 0 && head >= 0 && row >= 0; }

    static FA_HOST_DEVICE ArrayLayout contiguous(std::int64_t heads, std::int64_t rows,
                                                 std::int64_t d) {
        return {heads * rows * d, rows * d, d};
    }
    // The strides this layout means for an array of `heads` x `rows` x `d` per batch entry.
    FA_HOST_DEVICE ArrayLayout resolved(std::int64_t heads, std::int64_t rows,
                                        std::int64_t d) const {
        return is_default() ? contiguous(heads, rows, d) : *this;
    }
    // The element offset of head h of batch entry b (of a resolved layout).
    FA_HOST_DEVICE std::int64_t offset(std::int64_t b, std::int64_t h) const {
        return b * batch + h * head;
    }
    // Where row `index` starts when the rows of an array of `heads` x `rows` rows per batch entry
    // are counted in contiguous order (index = (b heads + h) rows + r), for a kernel that walks
    // them one by one.
    FA_HOST_DEVICE std::int64_t row_start(std::int64_t index, std::int64_t heads,
                                          std::int64_t rows) const {
        const std::int64_t bh = index / rows;
        return offset(bh / heads, bh % heads) + (index % rows) * row;
    }
};

// How many values a (batch, heads, rows, d) array at `layout` (a default layout: contiguous;
// strides not negative) lies among: from its first value to its last, those between its rows
// included (of the tensor a view was cut from). 0 for an empty array.
inline std::int64_t span_elements(const ArrayLayout& layout, std::int64_t batch,
                                  std::int64_t heads, std::int64_t rows, std::int64_t d) {
    if (batch == 0 || heads == 0 || rows == 0 || d == 0) return 0;
    const ArrayLayout at = layout.resolved(heads, rows, d);
    return (batch - 1) * at.batch + (heads - 1) * at.head + (rows - 1) * at.row + d;
}

// Bytes [begin, end) of memory.
struct MemoryRange {
    std::uintptr_t begin = 0, end = 0;
};

// The ranges in address order, those that overlap or touch merged into one and empty ones left
// out: a pass over several arrays' memory then reads each byte once, also where the arrays are
// views of one tensor (q, k and v cut from one projection lie among each other's values).
inline std::vector<MemoryRange> merged_ranges(std::vector<MemoryRange> ranges) {
    std::sort(ranges.begin(), ranges.end(),
              [](const MemoryRange& a, const MemoryRange& b) { return a.begin < b.begin; });
    std::vector<MemoryRange> out;
    for (const MemoryRange& r : ranges) {
        if (r.end <= r.begin) continue;
        if (!out.empty() && r.begin <= out.back().end)
            out.back().end = std::max(out.back().end, r.end);
        else
            out.push_back(r);
    }
    return out;
}

// Where the rows of the three inputs lie, for the kernels that read Q, K and V in place (resolved
// layouts: contiguous ones spelled out, none left at the default).
struct QkvLayouts {
    ArrayLayout q, k, v;

    // The given layouts of p's Q, K and V, resolved (a default one: contiguous).
    static FA_HOST_DEVICE QkvLayouts resolved(const AttentionProblem& p, const ArrayLayout& q,
                                              const ArrayLayout& k, const ArrayLayout& v) {
        return {q.resolved(p.heads, p.seq_q, p.dim), k.resolved(p.heads_kv, p.seq_kv, p.dim),
                v.resolved(p.heads_kv, p.seq_kv, p.dim)};
    }
    static FA_HOST_DEVICE QkvLayouts contiguous(const AttentionProblem& p) {
        return resolved(p, {}, {}, {});
    }
};

// The kernels store an output's values two adjacent columns at a time (8 bytes in float32, 4 in a
// 16-bit type): throws std::invalid_argument naming the array unless its address is aligned to
// that and every stride of its (resolved) layout is even and non-negative. The rows it names must
// not overlap; that is the caller's to keep (the Python package allocates them itself).
inline void require_output_layout(const void* array, const ArrayLayout& layout, DType dtype,
                                  const char* name) {
    const std::uintptr_t pair_bytes = dtype == DType::f32 ? 8 : 4;
    const bool strides_even = layout.batch >= 0 && layout.head >= 0 && layout.row >= 0 &&
                              layout.batch % 2 == 0 && layout.head % 2 == 0 && layout.row % 2 == 0;
    if (reinterpret_cast<std::uintptr_t>(array) % pair_bytes != 0 || !strides_even)
        throw std::invalid_argument(
            std::string(name) + ": an output needs an address aligned to " +
            std::to_string(pair_bytes) + " bytes and even, non-negative strides (batch, head, row "
            "= " + std::to_string(layout.batch) + ", " + std::to_string(layout.head) + ", " +
            std::to_string(layout.row) + " elements)");
}

// The same for cuda-fa2's kernels, which store two floats at a time only where d is even: at an odd
// d, any strides that are not negative.
inline void require_output_layout(const void* array, const ArrayLayout& layout, std::int64_t d,
                                  DType dtype, const char* name) {
    if (d % 2 == 0) return require_output_layout(array, layout, dtype, name);
    if (!layout.non_negative())
        throw std::invalid_argument(std::string(name) + ": an output needs non-negative strides "
                                    "(batch, head, row = " + std::to_string(layout.batch) + ", " +
                                    std::to_string(layout.head) + ", " +
                                    std::to_string(layout.row) + " elements)");
}

// cuda-fa2's kernels copy an input's rows 16 bytes at a time (cp.async) where the row stride and
// d are multiples of 16 bytes, and value by value otherwise: throws std::invalid_argument naming
// the array unless its strides (resolved) are non-negative and, where 16-byte copies are taken,
// its address and its batch and head strides are 16-byte multiples too (a PyTorch tensor's
// allocation is aligned; a view at an odd offset into one may not be).
inline void require_input_layout(const void* array, const ArrayLayout& layout, std::int64_t d,
                                 DType dtype, const char* name) {
    const std::int64_t bytes = dtype == DType::f32 ? 4 : 2;
    const bool wide = layout.row * bytes % 16 == 0 && d * bytes % 16 == 0;
    const bool aligned = reinterpret_cast<std::uintptr_t>(array) % 16 == 0 &&
                         layout.batch * bytes % 16 == 0 && layout.head * bytes % 16 == 0;
    const bool row_fits = layout.row < (std::int64_t{1} << 31);  // the copies' row stride: an int
    if (!layout.non_negative() || !row_fits || (wide && !aligned))
        throw std::invalid_argument(
            std::string(name) + ": an input read in place needs non-negative strides, a row "
            "stride below 2^31 elements, and where "
            "its rows are read 16 bytes at a time, an address and batch and head strides that are "
            "multiples of 16 bytes (batch, head, row = " + std::to_string(layout.batch) + ", " +
            std::to_string(layout.head) + ", " + std::to_string(layout.row) + " elements)");
}

}  // namespace flashattn
