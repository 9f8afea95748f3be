// common/problem.hpp — what an attention call computes: shapes, options and the masking rules.
//
// Shapes (all contiguous, row-major):
//   Q   (batch, heads,    seq_q,  dim)      O   (batch, heads, seq_q, dim)
//   K,V (batch, heads_kv, seq_kv, dim)      LSE (batch, heads, seq_q)
// heads % heads_kv == 0 (MQA/GQA): query head h reads K/V head h / (heads / heads_kv).
//
// Masking (docs/design.md, Numerics):
//   * causal is bottom-right aligned: query row i may attend key j iff j <= i + (seq_kv - seq_q);
//   * an optional (Tr, Tc) block mask (paper Algorithm 5) of 0/1 bytes with its own block sizes;
//     a key is visible only if both masks allow it.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "common/config.hpp"

namespace flashattn {

// ceil(a / b) for a >= 0, b >= 1, written so that it cannot overflow: (a + b - 1) / b does when a
// user asks for a block size near INT64_MAX.
FA_HOST_DEVICE inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
    return a / b + (a % b != 0 ? 1 : 0);
}

// Block-sparsity mask of paper Algorithm 5: entry (bi, bj) of a row-major (Tr, Tc) byte array
// says whether query block bi may attend key block bj. Blocks are block_q x block_kv elements;
// Tr = ceil(seq_q / block_q), Tc = ceil(seq_kv / block_kv). One mask serves every batch and head.
struct BlockMask {
    const std::uint8_t* data = nullptr;  // nullptr: no block mask
    std::int64_t block_q = 0;
    std::int64_t block_kv = 0;

    FA_HOST_DEVICE bool active() const { return data != nullptr; }
};

struct AttentionProblem {
    std::int64_t batch = 1;
    std::int64_t heads = 1;
    std::int64_t heads_kv = 1;
    std::int64_t seq_q = 0;
    std::int64_t seq_kv = 0;
    std::int64_t dim = 0;

    // Softmax scale; NaN means "use the default 1/sqrt(dim)" (see softmax_scale()).
    float scale = std::numeric_limits<float>::quiet_NaN();
    bool causal = false;

    // Tile sizes for the forms that take them (scalar, and the block size of a block mask).
    // 0 = derive them from sram_floats as Algorithm 1 line 1 does.
    std::int64_t block_q = 0;
    std::int64_t block_kv = 0;
    // M of Algorithm 1, counted in floats (the CLI's --sram-bytes / 4). 0 = the form's default.
    std::int64_t sram_floats = 0;
    // Split-KV (decoding): the number of key chunks S whose partial results are merged
    // (merge_partial_row, common/online_softmax.hpp). 0 = the backend chooses; 1 = no split.
    // Backends without a split ignore it.
    std::int64_t kv_splits = 0;

    BlockMask block_mask;

    FA_HOST_DEVICE float softmax_scale() const {
        return scale == scale ? scale : 1.0f / sqrtf(static_cast<float>(dim));
    }
    FA_HOST_DEVICE std::int64_t group_size() const { return heads / heads_kv; }
    FA_HOST_DEVICE std::int64_t kv_head(std::int64_t h) const { return h / group_size(); }
    // Bottom-right alignment of the causal mask: the diagonal ends at the last key.
    FA_HOST_DEVICE std::int64_t causal_offset() const { return seq_kv - seq_q; }

    FA_HOST_DEVICE std::int64_t q_elements() const { return batch * heads * seq_q * dim; }
    FA_HOST_DEVICE std::int64_t kv_elements() const { return batch * heads_kv * seq_kv * dim; }
    FA_HOST_DEVICE std::int64_t lse_elements() const { return batch * heads * seq_q; }
    // FLOPs of the forward: 4 * B * H * N_q * N_kv * d (QK^T and PV, a multiply-add = 2), halved
    // for causal when N_q == N_kv (docs/design.md, Command-line contract).
    double forward_flops() const {
        const double full = 4.0 * double(batch) * double(heads) * double(seq_q) * double(seq_kv) *
                            double(dim);
        return causal && seq_q == seq_kv ? full / 2 : full;
    }

    // Offsets of the (seq, dim) matrix of one (batch, head) pair.
    FA_HOST_DEVICE std::int64_t q_offset(std::int64_t b, std::int64_t h) const {
        return (b * heads + h) * seq_q * dim;
    }
    FA_HOST_DEVICE std::int64_t kv_offset(std::int64_t b, std::int64_t h) const {
        return (b * heads_kv + kv_head(h)) * seq_kv * dim;
    }
    FA_HOST_DEVICE std::int64_t lse_offset(std::int64_t b, std::int64_t h) const {
        return (b * heads + h) * seq_q;
    }

    FA_HOST_DEVICE bool causal_visible(std::int64_t i, std::int64_t j) const {
        return !causal || j <= i + causal_offset();
    }
    FA_HOST_DEVICE bool block_visible(std::int64_t i, std::int64_t j) const {
        if (!block_mask.active()) return true;
        const std::int64_t tc = ceil_div(seq_kv, block_mask.block_kv);
        return block_mask.data[(i / block_mask.block_q) * tc + j / block_mask.block_kv] != 0;
    }
    // The last key (of keys 0 .. last) that the causal mask lets row i see among keys before
    // `end`: a row's visible keys are a prefix, so a kernel masks a tile with one bound per row
    // instead of a test per key. -1 (or less) when the mask hides every key.
    FA_HOST_DEVICE std::int64_t last_causal_key(std::int64_t i, std::int64_t end) const {
        const std::int64_t diagonal = i + causal_offset();
        return causal && diagonal < end - 1 ? diagonal : end - 1;
    }
    // The same rule read from the key's side: the first query row that the causal mask lets see
    // key j (rows first .. seq_q - 1 see it: a key's visible rows are a suffix), so a kernel
    // whose tiles have keys as rows (the backward's S^T) masks with one bound per key. Without the
    // causal mask every row sees it (0). May be negative or past the last row.
    FA_HOST_DEVICE std::int64_t first_causal_row(std::int64_t j) const {
        return causal ? j - causal_offset() : 0;
    }
    // May query row i attend key j? Both masks must allow it.
    FA_HOST_DEVICE bool key_visible(std::int64_t i, std::int64_t j) const {
        return causal_visible(i, j) && block_visible(i, j);
    }
    // May query row i attend any key at all (both masks; seq_kv >= 1)? A kernel's epilogue asks
    // only for a row whose softmax sum came out 0, to tell a fully masked row from one whose scores
    // overflowed (scores_overflowed, common/online_softmax.hpp). Reads block_mask.data: in a
    // kernel, the device copy. Visible keys are 0 .. last under the causal mask, so the mask row's
    // tiles past `last` do not count.
    FA_HOST_DEVICE bool row_has_visible_key(std::int64_t i) const {
        const std::int64_t last = last_causal_key(i, seq_kv);
        if (last < 0) return false;
        if (!block_mask.active()) return true;
        const std::int64_t tc = ceil_div(seq_kv, block_mask.block_kv);
        const std::uint8_t* mask_row = block_mask.data + (i / block_mask.block_q) * tc;
        for (std::int64_t bj = 0; bj <= last / block_mask.block_kv; ++bj)
            if (mask_row[bj] != 0) return true;
        return false;
    }
};

// Largest sizes we accept: every element count must fit comfortably in int64 and size_t.
inline constexpr std::int64_t kMaxDim = 256;
inline constexpr std::int64_t kMaxElements = std::int64_t{1} << 40;
// Most split-KV chunks a problem may ask for (AttentionProblem::kv_splits).
inline constexpr std::int64_t kMaxKvSplits = 1024;

namespace detail {
inline void require(bool ok, const std::string& field, const std::string& value,
                    const std::string& why) {
    if (!ok) throw std::invalid_argument(field + " = " + value + ": " + why);
}
inline std::string str(std::int64_t v) { return std::to_string(v); }
}  // namespace detail

// Throws std::invalid_argument naming the field and its value for any problem no form can run.
inline void validate(const AttentionProblem& p) {
    using detail::require;
    using detail::str;
    require(p.batch >= 1, "batch", str(p.batch), "must be at least 1");
    require(p.heads >= 1, "heads", str(p.heads), "must be at least 1");
    require(p.heads_kv >= 1, "heads_kv", str(p.heads_kv), "must be at least 1");
    require(p.heads % p.heads_kv == 0, "heads_kv", str(p.heads_kv),
            "must divide heads (" + str(p.heads) + ") for MQA/GQA");
    require(p.seq_q >= 1, "seq_q", str(p.seq_q), "must be at least 1");
    require(p.seq_kv >= 1, "seq_kv", str(p.seq_kv), "must be at least 1");
    require(p.dim >= 1 && p.dim <= kMaxDim, "dim", str(p.dim),
            "must be in [1, " + str(kMaxDim) + "]");
    // Overflow-safe size checks: divide instead of multiplying.
    const auto fits = [](std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
        std::int64_t limit = kMaxElements;
        for (std::int64_t f : {a, b, c, d}) {
            if (f > limit) return false;
            limit /= f;
        }
        return true;
    };
    require(fits(p.batch, p.heads, p.seq_q, p.dim), "Q elements",
            str(p.batch) + "x" + str(p.heads) + "x" + str(p.seq_q) + "x" + str(p.dim),
            "exceed the supported 2^40");
    require(fits(p.batch, p.heads_kv, p.seq_kv, p.dim), "K/V elements",
            str(p.batch) + "x" + str(p.heads_kv) + "x" + str(p.seq_kv) + "x" + str(p.dim),
            "exceed the supported 2^40");
    require(std::isfinite(p.scale) || std::isnan(p.scale), "scale", std::to_string(p.scale),
            "must be finite");
    require(p.block_q >= 0, "block_q", str(p.block_q), "must be positive (or 0 for automatic)");
    require(p.block_kv >= 0, "block_kv", str(p.block_kv), "must be positive (or 0 for automatic)");
    require((p.block_q == 0) == (p.block_kv == 0), "block_q/block_kv",
            str(p.block_q) + "/" + str(p.block_kv), "give both block sizes or neither");
    require(p.sram_floats >= 0, "sram_floats", str(p.sram_floats), "must not be negative");
    require(p.kv_splits >= 0 && p.kv_splits <= kMaxKvSplits, "kv_splits", str(p.kv_splits),
            "must be in [0, " + str(kMaxKvSplits) + "] (0 = automatic)");
    if (p.sram_floats > 0)
        require(p.sram_floats >= 4 * p.dim, "sram_floats", str(p.sram_floats),
                "must hold at least 4*dim = " + str(4 * p.dim) +
                    " floats (Algorithm 1 line 1 needs M >= 4d)");
    if (p.block_mask.active()) {
        require(p.block_mask.block_q >= 1, "block mask block_q", str(p.block_mask.block_q),
                "must be at least 1");
        require(p.block_mask.block_kv >= 1, "block mask block_kv", str(p.block_mask.block_kv),
                "must be at least 1");
    }
}

// Throws std::invalid_argument when an input or output array is missing (a null pointer): the
// entry points that take raw arrays check before they touch one.
inline void require_array(const void* data, const char* name) {
    if (data == nullptr)
        throw std::invalid_argument(std::string(name) + " = null: the array is required");
}

}  // namespace flashattn
