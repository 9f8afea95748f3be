// cuda/host/variants.hpp — one way to choose a kernel variant, for every CUDA backend.
//
// A backend with more than one compiled kernel keeps them in a table of its own (a name, the
// problems it covers, its launch) and picks its default itself (the fastest measured that can
// run the problem). Tests, sweeps and comparisons ask for another with one environment variable:
//
//     FLASHATTN_VARIANT="cuda-fa2=d64_tf32_64x32,cuda-fa1=ffma,cuda-tc=Br64w4-Bc64-s2"
//
// Backends not named there run their default. A name the backend does not know is an error
// (std::invalid_argument listing the names it does know), never a silent default. The variants of
// each backend: cuda-fa1 tf32 | ffma; cuda-fa2 tf32 | ffma | one configuration of its kVariants
// table (cuda/fa2/backend.cu); cuda-tc one tile shape of tc_tile_shapes (cuda/tc/forward.hpp).
#pragma once

#include <string>
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

// The backward passes that add dQ with fp32 atomics (cuda-tc, cuda-fa2's tensor-core kernel) add
// them in a fixed order instead when FLASHATTN_DETERMINISTIC=1: the same bits on every run,
// slower (docs/cuda_backward.md). Unset, empty or "0": atomics. Any other value throws
// std::invalid_argument naming it.
inline constexpr const char* kDeterministicVariable = "FLASHATTN_DETERMINISTIC";
bool deterministic_requested();

}  // namespace flashattn::cuda
