// examples/flashattn/tile_options.cpp — see tile_options.hpp.
#include "tile_options.hpp"

#include <stdexcept>

#include "number_options.hpp"

namespace flashattn::cli {
namespace {

void require_pair(const std::optional<std::int64_t>& a, const std::optional<std::int64_t>& b,
                  const std::string& names) {
    if (a.has_value() != b.has_value())
        throw std::invalid_argument(names + " must be given together");
    if (a && (*a < 1 || *b < 1))
        throw std::invalid_argument(names + " = " + std::to_string(*a) + "/" + std::to_string(*b) +
                                    ": must be at least 1");
}

}  // namespace

void add_tile_options(CLI::App* cmd, TileOptions& o) {
    const CLI::Validator int64 = whole_number<std::int64_t>();
    auto* bq = cmd->add_option("--block-q", o.block_q,
                               "Query tile size Br of the forms that take tiles: scalar, omp,\n"
                               "cuda-fa1 (with --block-kv); refused by forms with their own tiles")
                  ->transform(int64);
    auto* bkv = cmd->add_option("--block-kv", o.block_kv, "Key/value tile size Bc (with --block-q)")
                    ->transform(int64);
    auto* sram = cmd->add_option("--sram-bytes", o.sram_bytes,
                                 "SRAM size M in bytes; Algorithm 1 line 1 derives Br and Bc from it")
                     ->transform(int64);
    sram->excludes(bq)->excludes(bkv);
    cmd->add_option("--mask-block-q", o.mask_block_q,
                    "Query rows per block of the block mask (with --mask-block-kv)")
        ->transform(int64);
    cmd->add_option("--mask-block-kv", o.mask_block_kv,
                    "Keys per block of the block mask (with --mask-block-q). Without them, a\n"
                    "mask's blocks are --block-q x --block-kv (then not tile sizes)")
        ->transform(int64);
    cmd->add_option("--splits", o.splits,
                    "Split-KV (decoding): cut the keys into S chunks of whole tiles, attend to\n"
                    "each chunk apart and merge the partial results; 1 = no split, 0 = the\n"
                    "backend chooses (default). At most 1024; a backend clamps S to its number\n"
                    "of key tiles, and one that does not split (standard, scalar) ignores it")
        ->transform(int64)
        ->capture_default_str();
}

BlockSizes apply_tile_options(const TileOptions& o, const std::string& mask_option,
                              AttentionProblem& p) {
    require_pair(o.block_q, o.block_kv, "--block-q and --block-kv");
    require_pair(o.mask_block_q, o.mask_block_kv, "--mask-block-q and --mask-block-kv");
    if (o.sram_bytes && *o.sram_bytes < 16 * p.dim)
        throw std::invalid_argument("--sram-bytes = " + std::to_string(*o.sram_bytes) +
                                    ": must be at least 16*d = " + std::to_string(16 * p.dim) +
                                    " bytes (Algorithm 1 line 1 needs M >= 4d floats)");
    if (o.mask_block_q && mask_option.empty())
        throw std::invalid_argument(
            "--mask-block-q/--mask-block-kv are the block size of a block mask: give --block-mask");
    p.sram_floats = o.sram_bytes.value_or(0) / 4;
    if (o.splits < 0 || o.splits > kMaxKvSplits)
        throw std::invalid_argument("--splits = " + std::to_string(o.splits) + ": must be in [0, " +
                                    std::to_string(kMaxKvSplits) +
                                    "] (0 = the backend chooses, 1 = no split)");
    p.kv_splits = o.splits;

    BlockSizes mask_blocks;
    if (!mask_option.empty()) {
        if (o.mask_block_q) {
            mask_blocks = {*o.mask_block_q, *o.mask_block_kv};
        } else if (o.block_q) {  // the older spelling: the mask's block size, not tiles
            mask_blocks = {*o.block_q, *o.block_kv};
            return mask_blocks;
        } else {
            throw std::invalid_argument(mask_option +
                                        " needs its block size: --mask-block-q and --mask-block-kv");
        }
    }
    p.block_q = o.block_q.value_or(0), p.block_kv = o.block_kv.value_or(0);
    return mask_blocks;
}

}  // namespace flashattn::cli
