// cuda/time_backends.cpp — a throwaway timing harness for cuda/compare_torch.py and
// cuda/gpu_check.sh, until `flashattn bench` (issue 3) lands; then delete this file and its
// target and let compare_torch.py call `flashattn bench --json` (it already tries that first).
//
// Prints one JSON object per backend in bench's contract (backend, shape, median_ms, min_ms,
// max_ms, gflops, extra_bytes, ...). All backends are prepared on the same random inputs and
// timed interleaved, `repeat` times each after `warmup` untimed runs; execute() blocks until the
// device is done, so a host clock around it is the kernel time plus a launch (~10 us).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "cpu/registry.hpp"
#include "format.hpp"
#include "verify.hpp"

int main(int argc, char** argv) {
    using namespace flashattn;
    CLI::App app{"Time backends side by side (JSON lines); a stand-in for `flashattn bench`"};
    std::string backends_csv;
    AttentionProblem p;
    std::int64_t sram_bytes = 0;
    int repeat = 20, warmup = 3;
    app.add_option("--backends", backends_csv, "Comma-separated backend names")->required();
    app.add_option("--batch", p.batch);
    app.add_option("--heads", p.heads);
    app.add_option("--heads-kv", p.heads_kv, "Default: --heads");
    app.add_option("--seq", p.seq_q)->required();
    app.add_option("--seq-kv", p.seq_kv, "Default: --seq");
    app.add_option("--dim", p.dim)->required();
    app.add_flag("--causal", p.causal);
    app.add_option("--block-q", p.block_q);
    app.add_option("--block-kv", p.block_kv);
    app.add_option("--sram-bytes", sram_bytes);
    app.add_option("--repeat", repeat);
    app.add_option("--warmup", warmup);
    app.add_flag("--json", "Accepted for bench compatibility; output is always JSON lines");
    try {
        app.parse(argc, argv);
        if (app.count("--heads-kv") == 0) p.heads_kv = p.heads;
        if (p.seq_kv == 0) p.seq_kv = p.seq_q;
        p.sram_floats = sram_bytes / 4;
        validate(p);

        std::vector<const Backend*> backends;
        std::stringstream names(backends_csv);
        for (std::string name; std::getline(names, name, ',');)
            backends.push_back(&find_backend(name));
        const ProblemData in = random_problem_data(p, 2022);
        std::vector<std::unique_ptr<PreparedAttention>> prepared;
        for (const Backend* b : backends)
            prepared.push_back(b->prepare(p, in.Q.data(), in.K.data(), in.V.data(), DType::f32));

        std::vector<std::vector<double>> ms(backends.size());
        for (int r = 0; r < warmup + repeat; ++r)
            for (std::size_t k = 0; k < prepared.size(); ++k) {
                const auto start = std::chrono::steady_clock::now();
                prepared[k]->execute();
                const auto stop = std::chrono::steady_clock::now();
                if (r >= warmup)
                    ms[k].push_back(
                        std::chrono::duration<double, std::milli>(stop - start).count());
            }
        for (std::size_t k = 0; k < backends.size(); ++k) {
            std::vector<double> t = ms[k];
            std::sort(t.begin(), t.end());
            const double median = t.empty() ? 0 : t[t.size() / 2];
            const double gflops = median > 0 ? cli::attention_flops(p) / median / 1e6 : 0;
            nlohmann::json row = {{"backend", backends[k]->name}, {"batch", p.batch},
                                  {"heads", p.heads}, {"heads_kv", p.heads_kv},
                                  {"seq_q", p.seq_q}, {"seq_kv", p.seq_kv}, {"dim", p.dim},
                                  {"causal", p.causal}, {"dtype", "f32"}, {"threads", 0},
                                  {"block_q", p.block_q}, {"block_kv", p.block_kv},
                                  {"sram_bytes", sram_bytes}, {"repeat", repeat},
                                  {"median_ms", median}, {"min_ms", t.empty() ? 0 : t.front()},
                                  {"max_ms", t.empty() ? 0 : t.back()},
                                  {"gflops", gflops},
                                  {"extra_bytes", prepared[k]->extra_bytes()}};
            std::cout << row.dump() << std::endl;
        }
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return 2;
    }
    return 0;
}
