// cuda/host/variants.hpp — one way to declare and choose a kernel variant, for every CUDA backend.
//
// A backend with more than one compiled kernel keeps them in one table: a row per compiled
// configuration, {name, kind, what it can run (head dim, dtypes), its launch}, the measured
// default first. The rows drive the template instantiations (each row's launch is a pointer to
// one), the choice (choose_variant below, the one chooser), and what tests and docs list, so a
// variant is declared once. Tests, sweeps and comparisons ask for another with one environment
// variable:
//
//     FLASHATTN_VARIANT="cuda-fa2=d64_tf32_64x32,cuda-fa1=ffma,cuda-tc=Br64w4-Bc64-s2"
//
// Backends not named there run their default. A name the backend does not know is an error
// (std::invalid_argument listing the names it does know), never a silent default. The variants of
// each backend: cuda-fa1 tf32 | ffma; cuda-fa2 tf32 | ffma | one configuration of its kVariants
// table (cuda/fa2/backend.cu); cuda-tc one tile shape of tc_tile_shapes (cuda/tc/forward.hpp);
// cuda-fa3 and cuda-fa3-backward one row of their kVariants tables (cuda/fa3/backend.cu,
// cuda/fa3/backward.cu).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace flashattn::cuda {

inline constexpr const char* kVariantVariable = "FLASHATTN_VARIANT";

// The variant FLASHATTN_VARIANT names for `backend` ("" when it names none). Throws
// std::invalid_argument when the variable is malformed.
std::string requested_variant(const std::string& backend);

// Throws std::invalid_argument naming the backend, the request and the known names unless
// `requested` is empty or one of `known`.
void require_known_variant(const std::string& backend, const std::string& requested,
                           const std::vector<std::string>& known);

// The one chooser. `rows` is a backend's table (each row has `name` and `kind`, a group name such
// as "tf32" or "ffma" that selects the first row of that kind); `runs(row)` says whether the row
// can run this problem (its head dim, dtype, ...). Returns the first row that runs the problem and
// that `wanted` (FLASHATTN_VARIANT's request, or a backend's own default request; empty: any)
// names by name or kind. Throws std::invalid_argument when `wanted` names no row at all (listing
// the known names) or only rows for other problems (`problem` says which, e.g. "dim = 64, f16";
// the message lists the variants that would run it).
template <class Rows, class Runs>
auto choose_variant(const std::string& backend, const std::string& wanted, const Rows& rows,
                    Runs runs, const std::string& problem) -> decltype(*std::begin(rows)) {
    using Row = std::remove_reference_t<decltype(*std::begin(rows))>;
    if (!wanted.empty()) {  // (without a request, nothing to check: no list built on every call)
        std::vector<std::string> known;
        for (const Row& r : rows) {
            known.push_back(r.name);
            if (std::string(r.kind) != "" &&
                std::find(known.begin(), known.end(), std::string(r.kind)) == known.end())
                known.push_back(r.kind);
        }
        require_known_variant(backend, wanted, known);
    }
    std::string runnable;
    for (const Row& r : rows) {
        if (!runs(r)) continue;
        if (wanted.empty() || wanted == r.name || wanted == r.kind) return r;
        runnable += (runnable.empty() ? "" : ", ") + std::string(r.name);
    }
    if (wanted.empty() || runnable.empty())
        throw std::invalid_argument(backend + ": no compiled variant runs " + problem);
    throw std::invalid_argument(std::string(kVariantVariable) + ": " + backend + "=" + wanted +
                                " is for another head dim or dtype than " + problem +
                                " (variants for it: " + runnable + ")");
}

// The head dims of a table whose rows have a `dim`, each once, in the table's order.
template <class Rows>
std::vector<std::int64_t> table_dims(const Rows& rows) {
    std::vector<std::int64_t> dims;
    for (const auto& r : rows)
        if (std::find(dims.begin(), dims.end(), r.dim) == dims.end()) dims.push_back(r.dim);
    return dims;
}

// The backward passes that add dQ with fp32 atomics (cuda-tc, cuda-fa2's tensor-core kernel) add
// them in a fixed order instead when FLASHATTN_DETERMINISTIC=1: the same bits on every run,
// slower (docs/cuda_backward.md). Unset, empty or "0": atomics. Any other value throws
// std::invalid_argument naming it.
inline constexpr const char* kDeterministicVariable = "FLASHATTN_DETERMINISTIC";
bool deterministic_requested();

}  // namespace flashattn::cuda
