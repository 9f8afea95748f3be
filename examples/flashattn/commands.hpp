// examples/flashattn/commands.hpp — the subcommands of the `flashattn` program.
//
// Each add_*_command() registers its options on the CLI11 app and returns the action to run when
// that subcommand was chosen. Actions throw on bad input; main() turns any exception into
// "error: ..." on stderr and exit status 2 (docs/design.md, Command-line contract).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace flashattn::cli {

using Action = std::function<int()>;
struct Command {
    CLI::App* app;  // the subcommand
    Action action;  // what to do when it was parsed
};

Command add_backends_command(CLI::App& app);
Command add_run_command(CLI::App& app);
Command add_demo_command(CLI::App& app);
Command add_bench_command(CLI::App& app);

}  // namespace flashattn::cli
