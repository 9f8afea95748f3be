// examples/flashattn/tile_options.hpp — the tile and block-mask options of `run` and `bench`, one
// meaning each (docs/design.md, Command-line contract):
//
//   --block-q Br --block-kv Bc   tile sizes of the forms that take them (scalar, omp, cuda-fa1);
//   --sram-bytes M               the SRAM size Algorithm 1 line 1 derives Br and Bc from;
//   --mask-block-q/--mask-block-kv  the block size of a block mask (Algorithm 5);
//   --splits S                   split-KV: the key tiles cut into S chunks whose partial results
//                                are merged (AttentionProblem::kv_splits; docs/decoding.md).
//
// The older spelling of a mask's block size, `--block-mask` (or `--block-density`) with
// --block-q/--block-kv and no --mask-block-*, keeps working: there the two options are the mask's
// block size only, and every form chooses its tiles as it would without them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "common/problem.hpp"
#include "common/tiling.hpp"

namespace flashattn::cli {

struct TileOptions {
    std::optional<std::int64_t> block_q, block_kv, sram_bytes, mask_block_q, mask_block_kv;
    std::int64_t splits = 0;  // 0: the backend chooses
};

// Registers the six options on a subcommand.
void add_tile_options(CLI::App* cmd, TileOptions& o);

// Checks the options (std::invalid_argument naming the option) and sets p.block_q, p.block_kv,
// p.sram_floats and p.kv_splits. `mask_option` names the option that brings a block mask ("--block-mask",
// "--block-density"), or is empty when there is none. Returns the mask's block size {Br, Bc}
// (zeros without a mask). p.dim must be set.
BlockSizes apply_tile_options(const TileOptions& o, const std::string& mask_option,
                                    AttentionProblem& p);

}  // namespace flashattn::cli
