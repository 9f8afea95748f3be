// examples/flashattn/bench_command.cpp — `flashattn bench` (being written; see issue 3).
#include "commands.hpp"

namespace flashattn::cli {

Command add_bench_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("bench", "Benchmark backends side by side");
    return {cmd, [] () -> int { throw std::runtime_error("bench is not implemented yet"); }};
}

}  // namespace flashattn::cli
