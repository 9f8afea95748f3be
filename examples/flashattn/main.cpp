// examples/flashattn/main.cpp — the `flashattn` command-line program.
//
//   flashattn backends | run | bench | demo      (see --help of each)
//
// Exit status: 0 on success, 2 on any bad input or failure, with a message starting "error:".
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "thread_count.hpp"

int main(int argc, char** argv) {
    CLI::App app{
        "flashattn — FlashAttention (Dao et al. 2022; FlashAttention-2, 2023) in three forms,\n"
        "cross-checked against standard attention. Inputs and outputs are float32 .npy files\n"
        "of shape (B, H, N, d) or (N, d)."};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "Help for every subcommand");
    using namespace flashattn::cli;
    const std::vector<Command> commands = {add_backends_command(app), add_run_command(app),
                                           add_bench_command(app), add_demo_command(app)};

    // An unknown command is named (CLI11 would say only that an argument was not expected).
    if (argc > 1 && argv[1][0] != '-') {
        std::string known;
        bool found = false;
        for (const Command& c : commands) {
            known += (known.empty() ? "" : ", ") + c.app->get_name();
            found = found || c.app->get_name() == argv[1];
        }
        if (!found) {
            std::cerr << "error: unknown command '" << argv[1] << "' (commands: " << known
                      << "; see flashattn --help)\n";
            return 2;
        }
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << "error: " << e.what() << "\n(see: flashattn --help)\n";
        return 2;
    }
    try {
        // run and demo take OpenMP's default thread count (OMP_NUM_THREADS): checked first, as
        // bench checks --threads, so that libgomp never ends the process on a count it cannot
        // start (thread_count.hpp).
        for (const Command& c : commands)
            if (c.app->parsed() && (c.app->get_name() == "run" || c.app->get_name() == "demo"))
                checked_thread_count(std::nullopt);
        for (const Command& c : commands)
            if (c.app->parsed()) return c.action();
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 2;
    }
}
