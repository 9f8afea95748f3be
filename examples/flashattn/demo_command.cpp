// examples/flashattn/demo_command.cpp — `flashattn demo`: the command-line options of run_demo
// (demo.hpp): every available backend on one problem, checked against float64 standard attention.
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "demo.hpp"
#include "number_options.hpp"

namespace flashattn::cli {

Command add_demo_command(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "demo", "Run every available backend on one random problem (default B=1, H=4, N=1024,\n"
                "d=64) and print the median time, GFLOP/s, working memory and the error against float64\n"
                "standard attention. Exit 2 if any backend fails the 2x rule.");
    auto o = std::make_shared<DemoOptions>();
    const CLI::Validator int64 = whole_number<std::int64_t>();
    cmd->add_option("--batch", o->batch, "Batch size B")->transform(int64)->capture_default_str();
    cmd->add_option("--heads", o->heads, "Heads H")->transform(int64)->capture_default_str();
    cmd->add_option("--seq", o->seq, "Sequence length N")->transform(int64)->capture_default_str();
    cmd->add_option("--dim", o->dim, "Head dimension d")->transform(int64)->capture_default_str();
    cmd->add_flag("--causal", o->causal, "Causal mask");
    cmd->add_option("--seed", o->seed, "Random seed")
        ->transform(whole_number<std::uint64_t>())
        ->capture_default_str();
    cmd->add_option("--repeat", o->repeat,
                    "Timed runs per backend after one warm-up run (fewer once a backend has\n"
                    "spent 2 s); the table shows their median")
        ->transform(whole_number<int>())
        ->check(CLI::Range(1, 1000000))
        ->capture_default_str();
    return {cmd, [o] { return run_demo(*o, std::cout) == 0 ? 0 : 2; }};
}

}  // namespace flashattn::cli
