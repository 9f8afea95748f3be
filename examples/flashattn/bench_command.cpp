// examples/flashattn/bench_command.cpp — `flashattn bench`: backends side by side on one problem.
//
// Every listed backend runs in this one process on the same random inputs, interleaved: each
// round runs every backend once, in the order given, so that a slow phase of the machine (another
// job, a clock change) hits all of them alike. After the warm-up rounds, `--repeat` timed rounds;
// each backend reports the median, min and max of its execute() times (steady_clock; a CUDA
// backend's execute() returns when its kernels have finished), GFLOP/s of the median, and its
// measured working memory (PreparedAttention::extra_bytes(), PreparedBackward::extra_bytes()).
//
// --gemm-ceiling adds Eigen's SGEMM 2048^3 to every round, with the same threads: the rate a tuned
// GEMM reaches on these cores, which the attention forms (two GEMMs and a softmax) are judged by.
//
// --pass backward times the backward pass instead (PreparedBackward::execute() alone), on the O
// and LSE of one untimed forward run and a random dO; --pass both gives each backend a forward
// row and a backward row. A backward row counts 2.5x the forward's FLOPs, FlashAttention's
// convention (the backward's five GEMMs against the forward's two).
//
// Every phase that runs longer than --progress seconds (default 1) is reported on stderr: each
// backend's preparation and untimed forward, each warm-up run and each timed round (progress.hpp).
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>

#include "commands.hpp"
#include "common/tiling.hpp"
#include "common/registry.hpp"
#include "common/memory.hpp"
#include "format.hpp"
#include "gemm_ceiling.hpp"
#include "cpu/reference.hpp"
#include "number_options.hpp"
#include "progress.hpp"
#include "thread_count.hpp"
#include "tile_options.hpp"

namespace flashattn::cli {
namespace {

struct BenchOptions {
    std::string backends;
    std::int64_t batch = 0, heads = 0, seq = 0, dim = 0;
    std::optional<std::int64_t> heads_kv, seq_kv;
    bool causal = false;
    std::string dtype = "f32";
    std::string pass = "forward";  // forward, backward or both
    int repeat = 10, warmup = 1;
    std::optional<int> threads;
    bool json = false, gemm_ceiling = false;
    std::uint64_t seed = 2022;
    TileOptions tiles;
    std::optional<double> block_density;
    double progress_after = 1;  // seconds a phase runs before it is reported
};

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// One thing that is timed in every round: a prepared backend's forward or backward, or the SGEMM.
struct Contender {
    std::string name, device, device_name;
    std::string pass;  // "forward" or "backward"; empty for the SGEMM
    std::function<void()> run;
    std::function<std::size_t()> extra_bytes;  // working memory of the last run; empty for SGEMM
    // Split-KV chunks the last run merged (PreparedAttention::kv_splits(); 1 for a backward, which
    // does not split); empty for the SGEMM.
    std::function<std::int64_t()> kv_splits;
    double flops = 0;
    std::vector<double> ms;
};

// FlashAttention's convention for the backward's FLOPs: 2.5x the forward's. The backward does five
// matrix products of the forward's size (S recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K,
// dK = dS^T Q) where the forward does two (S = Q K^T, O = P V).
constexpr double kBackwardFlopsFactor = 2.5;

// The O and LSE of one untimed forward run, which a backward reads: kept alive, at a fixed address,
// as long as the PreparedBackward that points at them.
struct SavedForward {
    std::vector<float> O, lse;
};

struct Stats {
    double median = 0, min = 0, max = 0;
};

Stats stats_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return {n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

std::vector<std::string> split_names(const std::string& list) {
    std::vector<std::string> names;
    std::set<std::string> seen;
    std::stringstream in(list);
    for (std::string name; std::getline(in, name, ',');) {
        name.erase(0, name.find_first_not_of(" "));
        name.erase(name.find_last_not_of(" ") + 1);
        if (name.empty())
            throw std::invalid_argument("--backends = " + list + ": an empty backend name");
        if (!seen.insert(name).second)
            throw std::invalid_argument("--backends = " + list + ": " + name + " is listed twice");
        names.push_back(name);
    }
    if (names.empty()) throw std::invalid_argument("--backends is empty");
    return names;
}

std::string utc_now() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

void check_options(const BenchOptions& o) {
    const auto positive = [](const char* name, std::int64_t v) {
        if (v < 1)
            throw std::invalid_argument(std::string(name) + " = " + std::to_string(v) +
                                        ": must be at least 1");
    };
    positive("--batch", o.batch);
    positive("--heads", o.heads);
    positive("--seq", o.seq);
    positive("--dim", o.dim);
    positive("--repeat", o.repeat);
    if (o.heads_kv) positive("--heads-kv", *o.heads_kv);
    if (o.seq_kv) positive("--seq-kv", *o.seq_kv);
    if (o.threads) positive("--threads", *o.threads);
    if (o.tiles.sram_bytes) positive("--sram-bytes", *o.tiles.sram_bytes);
    if (o.warmup < 0)
        throw std::invalid_argument("--warmup = " + std::to_string(o.warmup) +
                                    ": must not be negative");
    if (!(o.progress_after >= 0))
        throw std::invalid_argument("--progress: must be a number of seconds, at least 0");
}

int bench(const BenchOptions& o) {
    check_options(o);
    const std::vector<std::string> names = split_names(o.backends);
    const DType dtype = parse_dtype(o.dtype);

    AttentionProblem p;
    p.batch = o.batch, p.heads = o.heads, p.heads_kv = o.heads_kv.value_or(o.heads);
    p.seq_q = o.seq, p.seq_kv = o.seq_kv.value_or(o.seq), p.dim = o.dim, p.causal = o.causal;
    const BlockSizes mask_blocks =
        apply_tile_options(o.tiles, o.block_density ? "--block-density" : "", p);
    // Block-sparse (Algorithm 5): a random (Tr, Tc) mask keeping a fraction of the blocks, so the
    // time of the flash forms can be seen falling with the work kept.
    std::vector<std::uint8_t> mask;
    if (o.block_density) {
        std::mt19937_64 gen(o.seed + 99);
        std::bernoulli_distribution keep(*o.block_density);
        mask.resize(static_cast<std::size_t>(tile_count(p.seq_q, mask_blocks.Br) *
                                             tile_count(p.seq_kv, mask_blocks.Bc)));
        for (auto& m : mask) m = keep(gen) ? 1 : 0;
        p.block_mask = {mask.data(), mask_blocks.Br, mask_blocks.Bc};
    }
    validate(p);
    const bool time_forward = o.pass != "backward", time_backward = o.pass != "forward";

    // One thread count for every CPU backend: OpenMP's, and Eigen's (standard's GEMMs, SGEMM).
    const int threads = checked_thread_count(o.threads);
    omp_set_num_threads(threads);
    Eigen::setNbThreads(threads);

    std::vector<const Backend*> backends;
    for (const std::string& name : names) {
        const Backend& b = find_backend(name);
        if (!b.supports(dtype)) {
            std::string supported;
            for (DType t : b.dtypes) supported += (supported.empty() ? "" : ", ") + to_string(t);
            throw std::invalid_argument("--dtype = " + o.dtype + ": backend " + name +
                                        " does not support it (it supports " + supported + ")");
        }
        if (time_backward) {
            try {
                require_backward(b);
            } catch (const std::invalid_argument& e) {
                throw std::invalid_argument("--pass " + o.pass + ": " + e.what());
            }
        }
        backends.push_back(&b);
    }

    // The inputs and each backend's O and LSE, and for the backward dO and each backend's dQ, dK,
    // dV, before any of them is allocated.
    const double q = double(p.q_elements()), kv = double(p.kv_elements());
    const double per_backend = q + p.lse_elements() + (time_backward ? q + 2 * kv : 0);
    require_memory(sizeof(float) * (q + 2 * kv + (time_backward ? q : 0) +
                                    double(backends.size()) * per_backend),
                   "bench's inputs and outputs");
    Progress progress(o.progress_after);
    progress.phase("making the random inputs");
    const ProblemData data = random_problem_data(p, o.seed);
    // dO from the same seed as the inputs (random_problem_data uses seed, seed + 1, seed + 2).
    const std::vector<float> dO =
        time_backward ? random_normal(p.q_elements(), o.seed + 3) : std::vector<float>{};
    std::vector<std::unique_ptr<PreparedAttention>> prepared;
    std::vector<std::unique_ptr<PreparedBackward>> prepared_backward;
    std::deque<SavedForward> saved;  // a deque: growing it never moves the arrays already there
    std::vector<Contender> contenders;
    for (const Backend* b : backends) {
        std::unique_ptr<PreparedAttention> forward;
        progress.phase("preparing " + b->name);
        try {
            forward = b->prepare(p, data.Q.data(), data.K.data(), data.V.data(), dtype);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument("backend " + b->name +
                                        " rejects this problem: " + e.what());
        } catch (const std::exception& e) {
            throw std::runtime_error("backend " + b->name + " failed to prepare: " + e.what());
        }
        PreparedAttention* run = forward.get();
        if (time_forward)
            contenders.push_back({b->name, b->device, device_name(b->device), "forward",
                                  [run] { run->execute(); }, [run] { return run->extra_bytes(); },
                                  [run] { return run->kv_splits(); }, p.forward_flops(), {}});
        if (time_backward) {
            // The backward reads what the forward saved: one untimed forward run gives O and LSE.
            SavedForward& f = saved.emplace_back();
            f.O.resize(static_cast<std::size_t>(p.q_elements()));
            f.lse.resize(static_cast<std::size_t>(p.lse_elements()));
            try {
                progress.phase(b->name + "'s untimed forward (the backward reads its O and LSE)");
                run->execute();
                run->fetch(f.O.data(), f.lse.data());
                const BackwardInputs in{data.Q.data(), data.K.data(), data.V.data(),
                                        f.O.data(),    f.lse.data(),  dO.data()};
                progress.phase("preparing " + b->name + "'s backward");
                prepared_backward.push_back(b->prepare_backward(p, in, dtype));
            } catch (const std::invalid_argument& e) {
                throw std::invalid_argument("backend " + b->name +
                                            " rejects this problem's backward: " + e.what());
            } catch (const std::exception& e) {
                throw std::runtime_error("backend " + b->name +
                                         " failed to prepare its backward: " + e.what());
            }
            PreparedBackward* back = prepared_backward.back().get();
            contenders.push_back({b->name, b->device, device_name(b->device), "backward",
                                  [back] { back->execute(); },
                                  [back] { return back->extra_bytes(); },
                                  [] { return std::int64_t{1}; },
                                  kBackwardFlopsFactor * p.forward_flops(), {}});
        }
        if (time_forward) prepared.push_back(std::move(forward));  // else done with: free it
    }
    std::unique_ptr<SgemmCeiling> sgemm;
    if (o.gemm_ceiling) {
        progress.phase("preparing the SGEMM ceiling");
        sgemm = std::make_unique<SgemmCeiling>();
        contenders.push_back({"eigen-sgemm", "cpu", device_name("cpu"), "",
                              [g = sgemm.get()] { g->run(); }, {}, {}, SgemmCeiling::flops(),
                              {}});
    }

    // Warm-up rounds, then timed rounds; round-robin over the contenders in each.
    {
        const int rounds = o.warmup + o.repeat;
        for (int round = 0; round < rounds; ++round)
            for (Contender& c : contenders) {
                const std::string what = c.pass == "backward" ? c.name + " backward" : c.name;
                progress.phase(round < o.warmup
                                   ? "warm-up " + std::to_string(round + 1) + "/" +
                                         std::to_string(o.warmup) + ", " + what
                                   : "timed round " + std::to_string(round - o.warmup + 1) + "/" +
                                         std::to_string(o.repeat) + ", " + what);
                const auto start = Clock::now();
                try {
                    c.run();
                } catch (const std::exception& e) {
                    throw std::runtime_error(c.name + ": " + e.what());
                }
                if (round >= o.warmup) c.ms.push_back(ms_since(start));
            }
        progress.done();
    }

    const std::string date = utc_now();
    // The attention rows come first, the SGEMM (if any) last.
    const std::size_t attention_rows = contenders.size() - (sgemm ? 1 : 0);
    // "vs first": against the first backend's row of the same pass (a backward is compared with
    // a backward, never with a forward).
    const auto first_median = [&](const std::string& pass) {
        for (std::size_t i = 0; i < attention_rows; ++i)
            if (contenders[i].pass == pass) return stats_of(contenders[i].ms).median;
        return 0.0;
    };
    std::optional<double> ceiling;
    if (sgemm) ceiling = contenders.back().flops / stats_of(contenders.back().ms).median / 1e6;

    if (o.json) {
        for (std::size_t i = 0; i < contenders.size(); ++i) {
            const Contender& c = contenders[i];
            const Stats s = stats_of(c.ms);
            nlohmann::json row;
            row["kind"] = i < attention_rows ? "attention" : "gemm_ceiling";
            row["backend"] = c.name;
            if (i < attention_rows) {
                row["pass"] = c.pass;
                row["batch"] = p.batch, row["heads"] = p.heads, row["heads_kv"] = p.heads_kv;
                row["seq_q"] = p.seq_q, row["seq_kv"] = p.seq_kv, row["dim"] = p.dim;
                row["causal"] = p.causal, row["dtype"] = to_string(dtype);
                row["splits"] = c.kv_splits();
                if (p.block_q) row["block_q"] = p.block_q, row["block_kv"] = p.block_kv;
                if (p.sram_floats) row["sram_bytes"] = *o.tiles.sram_bytes;
                if (o.block_density) {
                    row["block_density"] = *o.block_density;
                    row["mask_block_q"] = mask_blocks.Br, row["mask_block_kv"] = mask_blocks.Bc;
                }
            } else {
                row["m"] = row["n"] = row["k"] = SgemmCeiling::kSize;
                row["dtype"] = "f32";
            }
            row["threads"] = threads;
            row["repeat"] = o.repeat, row["warmup"] = o.warmup;
            row["median_ms"] = s.median, row["min_ms"] = s.min, row["max_ms"] = s.max;
            row["gflops"] = c.flops / s.median / 1e6;
            if (i < attention_rows) {
                row["extra_bytes"] = c.extra_bytes();
                row["speedup_vs_first"] = first_median(c.pass) / s.median;
                if (ceiling) row["gemm_ceiling_gflops"] = *ceiling;
            }
            row["device"] = c.device, row["device_name"] = c.device_name, row["date"] = date;
            std::cout << row.dump() << "\n";
        }
        return 0;
    }

    std::printf(
        "flashattn bench: B=%lld H=%lld H_kv=%lld N_q=%lld N_kv=%lld d=%lld%s %s, "
        "%d threads, %d warm-up + %d timed runs each, interleaved\n",
        (long long)p.batch, (long long)p.heads, (long long)p.heads_kv, (long long)p.seq_q,
        (long long)p.seq_kv, (long long)p.dim, p.causal ? " causal" : "", to_string(dtype).c_str(),
        threads, o.warmup, o.repeat);
    if (o.block_density)
        std::printf("block-sparse: %zu of %zu blocks of %lldx%lld kept (density %.2f)\n",
                    static_cast<std::size_t>(std::count(mask.begin(), mask.end(), 1)), mask.size(),
                    (long long)mask_blocks.Br, (long long)mask_blocks.Bc, *o.block_density);
    std::vector<std::string> header = {"backend", "pass",    "device",   "splits",
                                       "median ms", "min ms", "max ms",  "GFLOP/s",
                                       "vs first",  "working mem"};
    if (ceiling) header.push_back("of SGEMM");
    Table table(header);
    for (std::size_t i = 0; i < attention_rows; ++i) {
        const Contender& c = contenders[i];
        const Stats s = stats_of(c.ms);
        const double gflops = c.flops / s.median / 1e6;
        std::vector<std::string> row = {c.name,
                                        c.pass,
                                        c.device,
                                        std::to_string(c.kv_splits()),
                                        fixed(s.median, 2),
                                        fixed(s.min, 2),
                                        fixed(s.max, 2),
                                        fixed(gflops, 1),
                                        fixed(first_median(c.pass) / s.median, 2) + "x",
                                        human_bytes(c.extra_bytes())};
        if (ceiling) row.push_back(fixed(100 * gflops / *ceiling, 0) + "%");
        table.add(row);
    }
    table.print(std::cout);
    if (ceiling) {
        const Stats s = stats_of(contenders.back().ms);
        std::printf(
            "SGEMM ceiling: Eigen %ld^3 float32, %d threads: median %.2f ms (min %.2f, max "
            "%.2f), %.1f GFLOP/s\n",
            SgemmCeiling::kSize, threads, s.median, s.min, s.max, *ceiling);
    }
    std::printf("device: %s; %s\n", contenders.front().device_name.c_str(), date.c_str());
    std::printf(
        "FLOPs = 4*B*H*N_q*N_kv*d%s, backward FLOPs = 2.5 x forward's (FlashAttention's "
        "convention);\nsplits = key chunks merged (split-KV, --splits; 1 = none); vs first = "
        "speed relative to %s's row of the same pass;\nworking mem = measured peak beyond "
        "inputs and outputs\n",
        p.causal && p.seq_q == p.seq_kv ? " / 2 (causal)" : "", contenders.front().name.c_str());
    return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
    auto* cmd = app.add_subcommand(
        "bench",
        "Time backends side by side on one random problem: all in this process, on the\n"
        "same inputs, interleaved (one run of each backend per round), warm-up first.\n"
        "Prints median/min/max ms, GFLOP/s, speed vs the first backend and working memory.\n"
        "--pass backward|both times the backward pass too (2.5x the forward's FLOPs).");
    auto o = std::make_shared<BenchOptions>();
    cmd->add_option("--backends", o->backends, "Comma-separated backend names, e.g. standard,omp")
        ->required();
    const CLI::Validator int64 = whole_number<std::int64_t>(), int32 = whole_number<int>();
    cmd->add_option("--batch", o->batch, "Batch size B")->required()->transform(int64);
    cmd->add_option("--heads", o->heads, "Query heads H")->required()->transform(int64);
    cmd->add_option("--heads-kv", o->heads_kv, "Key/value heads H_kv (default H; H % H_kv == 0)")
        ->transform(int64);
    cmd->add_option("--seq", o->seq, "Query sequence length N_q")->required()->transform(int64);
    cmd->add_option("--seq-kv", o->seq_kv, "Key/value sequence length N_kv (default N_q)")
        ->transform(int64);
    cmd->add_option("--dim", o->dim, "Head dimension d")->required()->transform(int64);
    cmd->add_flag("--causal", o->causal, "Causal mask (bottom-right aligned)");
    cmd->add_option("--dtype", o->dtype, "Precision: f32, f16 or bf16")
        ->check(CLI::IsMember({"f32", "f16", "bf16"}))
        ->capture_default_str();
    cmd->add_option("--pass", o->pass,
                    "What is timed: forward, backward (PreparedBackward::execute() alone, on\n"
                    "the O and LSE of one forward run and a random dO) or both (two rows per\n"
                    "backend)")
        ->check(CLI::IsMember({"forward", "backward", "both"}))
        ->capture_default_str();
    cmd->add_option("--repeat", o->repeat, "Timed runs per backend")
        ->transform(int32)
        ->capture_default_str();
    cmd->add_option("--warmup", o->warmup, "Untimed runs per backend first")
        ->transform(int32)
        ->capture_default_str();
    cmd->add_option("--threads", o->threads,
                    "Threads of every CPU backend (OpenMP and Eigen; default OMP_NUM_THREADS or\n"
                    "all), at most 4x the processors here (" + std::to_string(max_thread_count()) + ")")
        ->transform(int32);
    cmd->add_flag("--json", o->json, "One JSON object per measured row instead of the table");
    cmd->add_flag("--gemm-ceiling", o->gemm_ceiling,
                  "Also time Eigen SGEMM 2048^3 with the same threads (the machine's GEMM rate)");
    cmd->add_option("--seed", o->seed, "Random seed of the inputs")
        ->transform(whole_number<std::uint64_t>())
        ->capture_default_str();
    cmd->add_option("--progress", o->progress_after,
                    "Report on stderr each phase (preparation, untimed forward, warm-up, timed\n"
                    "round) running longer than this many seconds, then every 10 s (0: each one)")
        ->capture_default_str();
    add_tile_options(cmd, o->tiles);
    cmd->add_option("--block-density", o->block_density,
                    "Block-sparse run: a random mask over --mask-block-q x --mask-block-kv blocks\n"
                    "keeping this fraction (0, 1]; FLOPs and GFLOP/s stay the dense problem's")
        ->check(fraction());
    return {cmd, [o] { return bench(*o); }};
}

}  // namespace flashattn::cli
