// examples/flashattn/backends_command.cpp — `flashattn backends`: one available backend per line
// (with --verbose: tab-separated name, device, dtypes, backward: yes/no, summary).
#include <iostream>

#include "commands.hpp"
#include "common/registry.hpp"

namespace flashattn::cli {

Command add_backends_command(CLI::App& app) {
    auto* cmd = app.add_subcommand("backends", "List the backends available in this build, one per line");
    auto verbose = std::make_shared<bool>(false);
    cmd->add_flag("-v,--verbose", *verbose,
                  "Also print each backend's device, dtypes, whether it has a backward pass\n"
                  "(\"backward: yes\" or \"backward: no\") and summary");
    return {cmd, [verbose] {
        for (const Backend& b : available_backends()) {
            std::cout << b.name;
            if (*verbose) {
                std::cout << "\t" << b.device << "\t";
                for (std::size_t i = 0; i < b.dtypes.size(); ++i)
                    std::cout << (i ? "," : "") << to_string(b.dtypes[i]);
                // Which backends `run --dout ...` and `bench --pass backward` accept.
                std::cout << "\tbackward: " << (b.has_backward() ? "yes" : "no");
                std::cout << "\t" << b.summary;
            }
            std::cout << "\n";
        }
        return 0;
    }};
}

}  // namespace flashattn::cli
