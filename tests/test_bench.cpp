// tests/test_bench.cpp — `flashattn bench` (docs/design.md, Command-line contract): every listed backend in one
// run, one JSON object per measured row with the promised fields, the human table, and exit 2 with
// "error:" for bad options (numbers refused as given, --threads bounded), progress of every long
// phase on stderr. Timings themselves are not checked (no timing assertions in tests).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "helpers.hpp"

namespace fs = std::filesystem;

namespace {

struct Result {
    int status;
    std::string out, err;
};

std::string read_file(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Runs `flashattn ARGS`, capturing stdout and stderr (files named after this process, so that
// test processes running side by side do not share them).
Result bench_cli(const std::string& args) {
    const fs::path base =
        fs::temp_directory_path() / ("flashattn_bench_" + std::to_string(getpid()));
    const std::string out = base.string() + ".out", err = base.string() + ".err";
    const std::string cmd = std::string(FLASHATTN_EXE) + " " + args + " > " + out + " 2> " + err;
    const int raw = std::system(cmd.c_str());
    Result r{WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, read_file(out), read_file(err)};
    fs::remove(out);
    fs::remove(err);
    return r;
}

// Runs `flashattn ARGS` (with --json), which must succeed, and parses each line of its output.
std::vector<nlohmann::json> bench_json(const std::string& args) {
    const Result r = bench_cli(args);
    INFO("flashattn " << args << "\nstderr: " << r.err);
    REQUIRE(r.status == 0);
    std::vector<nlohmann::json> rows;
    std::stringstream in(r.out);
    for (std::string line; std::getline(in, line);)
        if (!line.empty()) rows.push_back(nlohmann::json::parse(line));
    return rows;
}

}  // namespace

TEST_CASE("flashattn bench --json: one row per backend, in order, with every promised field") {
    const std::vector<nlohmann::json> rows = bench_json(
        "bench --backends omp,standard,scalar --batch 2 --heads 4 --heads-kv 2 --seq 37 "
        "--seq-kv 53 --dim 11 --causal --repeat 3 --threads 2 --json");
    REQUIRE(rows.size() == 3);
    const std::vector<std::string> names = {"omp", "standard", "scalar"};
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const nlohmann::json& row = rows[i];
        INFO(row.dump());
        CHECK(row.at("backend") == names[i]);
        CHECK(row.at("pass") == "forward");  // the default --pass
        CHECK(row.at("batch") == 2);
        CHECK(row.at("heads") == 4);
        CHECK(row.at("heads_kv") == 2);
        CHECK(row.at("seq_q") == 37);
        CHECK(row.at("seq_kv") == 53);
        CHECK(row.at("dim") == 11);
        CHECK(row.at("causal") == true);
        CHECK(row.at("dtype") == "f32");
        CHECK(row.at("threads") == 2);
        const double median = row.at("median_ms"), lo = row.at("min_ms"), hi = row.at("max_ms");
        CHECK(lo <= median);
        CHECK(median <= hi);
        CHECK(row.at("gflops").get<double>() > 0);
        CHECK(row.at("extra_bytes").is_number_unsigned());
        CHECK(row.at("device") == "cpu");
        CHECK_FALSE(row.at("device_name").get<std::string>().empty());
        CHECK(row.at("date").get<std::string>().size() == 20);  // 2026-01-31T12:34:56Z
    }
    // The flash forms tile; standard materializes S (N_q x N_kv floats per thread at least).
    CHECK(rows[1].at("extra_bytes").get<std::size_t>() >= 37 * 53 * sizeof(float));
}

TEST_CASE("flashattn bench: the table has a 'vs first' column, and --gemm-ceiling adds the SGEMM row") {
    const Result table = bench_cli(
        "bench --backends standard,omp --batch 1 --heads 2 --seq 64 --dim 16 --repeat 2 --dtype "
        "bf16");
    INFO(table.err);
    REQUIRE(table.status == 0);
    CHECK(table.out.find("vs first") != std::string::npos);
    CHECK(table.out.find("1.00x") != std::string::npos);  // the first backend against itself
    CHECK(table.out.find("omp") != std::string::npos);

    const std::vector<nlohmann::json> rows = bench_json(
        "bench --backends omp --batch 1 --heads 1 --seq 16 --dim 8 --repeat 1 --warmup 0 "
        "--gemm-ceiling --json");
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].at("kind") == "attention");
    CHECK(rows[0].contains("gemm_ceiling_gflops"));
    CHECK(rows[1].at("kind") == "gemm_ceiling");
    CHECK(rows[1].at("m") == 2048);
    CHECK(rows[1].at("gflops").get<double>() > 0);
}

TEST_CASE("flashattn bench: bad options give exit 2 and a message starting with 'error:'") {
    const std::string shape = " --batch 1 --heads 2 --seq 16 --dim 8 --repeat 1";
    const std::vector<std::string> bad = {
        "bench --backends nosuch" + shape,
        "bench --backends omp,,standard" + shape,
        "bench --backends omp,omp" + shape,
        "bench --backends ''" + shape,
        "bench --backends omp --batch 1 --heads 2 --heads-kv 3 --seq 16 --dim 8",
        "bench --backends omp --batch 1 --heads 2 --seq 0 --dim 8",
        "bench --backends omp --batch 1 --heads 2 --seq 16 --dim 257",
        "bench --backends omp --batch 0 --heads 2 --seq 16 --dim 8",
        "bench --backends omp" + shape + " --repeat 0",
        "bench --backends omp" + shape + " --threads 0",
        "bench --backends omp" + shape + " --warmup -1",
        "bench --backends omp" + shape + " --dtype f64",
        "bench --backends omp" + shape + " --seq-kv -4",
        "bench --backends standard" + shape + " --pass sideways",
        "bench --backends standard" + shape + " --pass",
        "bench --backends omp --batch 1 --heads 2 --seq 16",  // no --dim
        "bench --batch 1 --heads 2 --seq 16 --dim 8",         // no --backends
    };
    for (const std::string& args : bad) {
        const Result r = bench_cli(args);
        INFO("flashattn " << args << "\nstderr: " << r.err);
        CHECK(r.status == 2);
        CHECK(r.err.rfind("error:", 0) == 0);
    }
}

TEST_CASE("flashattn bench --splits: rows report the S each backend used, and a bad S is refused") {
    // One decoding row against 4099 keys (9 of omp's tiles at d = 64), one head, two threads: omp
    // splits on its own; standard never does.
    const std::string decode = "bench --backends omp,standard --batch 1 --heads 1 --seq 1 "
                               "--seq-kv 4099 --dim 64 --repeat 1 --warmup 0 --threads 2 --json";
    const std::vector<nlohmann::json> automatic = bench_json(decode);
    REQUIRE(automatic.size() == 2);
    CHECK(automatic[0].at("splits").get<std::int64_t>() > 1);
    CHECK(automatic[1].at("splits") == 1);
    // Forced: 1 is no split, 1024 is clamped to the 9 key tiles.
    for (const auto& [asked, used] :
         std::vector<std::pair<std::string, int>>{{"1", 1}, {"3", 3}, {"1024", 9}}) {
        const std::vector<nlohmann::json> rows = bench_json(decode + " --splits " + asked);
        INFO("--splits " << asked);
        REQUIRE(rows.size() == 2);
        CHECK(rows[0].at("splits") == used);
        CHECK(rows[1].at("splits") == 1);
    }
    // A backward row does not split.
    const std::vector<nlohmann::json> both = bench_json(decode + " --splits 3 --pass both");
    REQUIRE(both.size() == 4);
    CHECK(both[0].at("splits") == 3);
    CHECK(both[1].at("pass") == "backward");
    CHECK(both[1].at("splits") == 1);
    // The table has the column.
    const Result table = bench_cli(
        "bench --backends omp --batch 1 --heads 1 --seq 1 --seq-kv 4099 --dim 64 --repeat 1 "
        "--splits 3");
    REQUIRE(table.status == 0);
    CHECK(table.out.find("splits") != std::string::npos);

    for (const char* bad : {"-1", "1025", "1e3", "2.5", "x", "''", "99999999999999999999"}) {
        const Result r = bench_cli(
            "bench --backends omp --batch 1 --heads 1 --seq 1 --seq-kv 64 --dim 8 --repeat 1 "
            "--splits " + std::string(bad));
        INFO("--splits " << bad << "\nstderr: " << r.err);
        CHECK(r.status == 2);
        CHECK(r.err.rfind("error:", 0) == 0);
        CHECK(r.err.find("--splits") != std::string::npos);
    }
}

namespace {

// The FLOPs a row claims, from the row's own fields: 4*B*H*N_q*N_kv*d, halved for causal when
// N_q == N_kv, and 2.5x that for a backward row (docs/design.md, Command-line contract).
double row_flops(const nlohmann::json& row) {
    const double forward = 4.0 * row.at("batch").get<double>() * row.at("heads").get<double>() *
                           row.at("seq_q").get<double>() * row.at("seq_kv").get<double>() *
                           row.at("dim").get<double>();
    const bool halved = row.at("causal").get<bool>() && row.at("seq_q") == row.at("seq_kv");
    return (halved ? forward / 2 : forward) * (row.at("pass") == "backward" ? 2.5 : 1.0);
}

}  // namespace

TEST_CASE("flashattn bench --pass backward: rows time the backward and count 2.5x the FLOPs") {
    for (const char* shape : {"--seq 48 --causal", "--seq 37 --seq-kv 53"}) {
        const std::vector<nlohmann::json> rows =
            bench_json(std::string("bench --backends standard --batch 2 --heads 4 --heads-kv 2 ") +
                       shape + " --dim 16 --repeat 3 --threads 2 --pass backward --json");
        REQUIRE(rows.size() == 1);
        const nlohmann::json& row = rows[0];
        INFO(row.dump());
        CHECK(row.at("kind") == "attention");
        CHECK(row.at("backend") == "standard");
        CHECK(row.at("pass") == "backward");
        CHECK(row.at("heads_kv") == 2);
        // gflops = FLOPs / median, by the row's own numbers.
        const double median = row.at("median_ms");
        REQUIRE(median > 0);
        CHECK(row.at("gflops").get<double>() ==
              Approx(row_flops(row) / median / 1e6).epsilon(1e-9));
        // standard's backward materializes P and dP: its working memory is not zero.
        CHECK(row.at("extra_bytes").get<std::size_t>() > 0);
        CHECK(row.at("speedup_vs_first").get<double>() == Approx(1.0));
    }
}

TEST_CASE("flashattn bench --pass both: a forward row then a backward row for each backend") {
    const std::vector<std::string> backends = flashattn::test::cpu_backends_with_backward();
    REQUIRE_FALSE(backends.empty());
    std::string list;
    for (const std::string& b : backends) list += (list.empty() ? "" : ",") + b;
    const std::vector<nlohmann::json> rows =
        bench_json("bench --backends " + list +
                   " --batch 1 --heads 2 --seq 32 --dim 8 --repeat 2 --threads 2 --pass both"
                   " --json");
    REQUIRE(rows.size() == 2 * backends.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
        INFO(rows[i].dump());
        CHECK(rows[i].at("backend") == backends[i / 2]);
        CHECK(rows[i].at("pass") == (i % 2 == 0 ? "forward" : "backward"));
        CHECK(rows[i].at("gflops").get<double>() ==
              Approx(row_flops(rows[i]) / rows[i].at("median_ms").get<double>() / 1e6)
                  .epsilon(1e-9));
    }
    // The table says which pass each row is, and how a backward's FLOPs are counted.
    const Result table = bench_cli("bench --backends " + list +
                                   " --batch 1 --heads 2 --seq 32 --dim 8 --repeat 1 --pass both");
    INFO(table.err);
    REQUIRE(table.status == 0);
    CHECK(table.out.find("pass") != std::string::npos);
    CHECK(table.out.find("backward") != std::string::npos);
    CHECK(table.out.find("backward FLOPs = 2.5 x forward's") != std::string::npos);
}

TEST_CASE("flashattn bench --pass backward|both: a backend without a backward is refused") {
    const std::string backend = flashattn::test::backend_without_backward();
    if (backend.empty()) {
        WARN("every backend of this build has a backward pass: nothing to refuse");
        return;
    }
    for (const char* pass : {"backward", "both"}) {
        const Result r = bench_cli("bench --backends standard," + backend +
                                   " --batch 1 --heads 2 --seq 16 --dim 8 --repeat 1 --pass " +
                                   pass);
        INFO("--pass " << pass << "\nstderr: " << r.err);
        CHECK(r.status == 2);
        CHECK(r.err.rfind("error:", 0) == 0);
        CHECK(r.err.find(backend) != std::string::npos);
        CHECK(r.out.empty());  // refused before any timing
    }
}

TEST_CASE("flashattn bench --threads: at most 4x the processors, refused with 'error:' and exit 2") {
    const std::string shape = " --batch 1 --heads 2 --seq 16 --dim 8 --repeat 1";
    // Far beyond the bound: refused by us (libgomp would end the process with status 1).
    const Result huge = bench_cli("bench --backends omp" + shape + " --threads 100000");
    INFO("stderr: " << huge.err);
    CHECK(huge.status == 2);
    REQUIRE(huge.err.rfind("error: --threads = 100000: at most ", 0) == 0);
    const int bound = std::stoi(huge.err.substr(huge.err.find("at most ") + 8));
    CHECK(bound >= 4);
    CHECK(huge.out.empty());
    // The bound itself runs; one more is refused.
    const Result at_bound =
        bench_cli("bench --backends omp" + shape + " --threads " + std::to_string(bound));
    INFO("stderr: " << at_bound.err);
    CHECK(at_bound.status == 0);
    const Result over =
        bench_cli("bench --backends omp" + shape + " --threads " + std::to_string(bound + 1));
    CHECK(over.status == 2);
    CHECK(over.err.rfind("error:", 0) == 0);
    // Beyond int: refused as given, not wrapped or clamped.
    for (const char* threads : {"2147483648", "99999999999999999999", "1e3", "-2"}) {
        const Result r = bench_cli("bench --backends omp" + shape + " --threads " + threads);
        INFO("--threads " << threads << ", stderr: " << r.err);
        CHECK(r.status == 2);
        CHECK(r.err.rfind("error:", 0) == 0);
        CHECK(r.err.find(threads) != std::string::npos);
    }
    // The default from OMP_NUM_THREADS has the same bound, and the message names where it came from.
    ::setenv("OMP_NUM_THREADS", "100000", 1);
    const Result env = bench_cli("bench --backends omp" + shape);
    ::unsetenv("OMP_NUM_THREADS");
    INFO("stderr: " << env.err);
    CHECK(env.status == 2);
    CHECK(env.err.rfind("error: OMP_NUM_THREADS = 100000: at most ", 0) == 0);
    // --help says what the bound is.
    const Result help = bench_cli("bench --help");
    CHECK(help.status == 0);
    CHECK(help.out.find("at most 4x the processors here (" + std::to_string(bound) + ")") !=
          std::string::npos);
}

TEST_CASE("flashattn bench: numbers that do not fit are refused with the text as given") {
    const std::string shape = " --batch 1 --heads 2 --seq 16 --dim 8 --repeat 1";
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"bench --backends omp --batch 1e20 --heads 2 --seq 16 --dim 8", "1e20"},
        {"bench --backends omp --batch 1 --heads 2 --seq 18446744073709551617 --dim 8",
         "18446744073709551617"},
        {"bench --backends omp --batch 1 --heads 2 --seq 16 --dim 0x8", "0x8"},
        {"bench --backends omp" + shape + " --repeat 4294967297", "4294967297"},
        {"bench --backends omp" + shape + " --warmup 1.5", "1.5"},
        {"bench --backends omp" + shape + " --seed -1", "-1"},
        {"bench --backends omp" + shape + " --seed 18446744073709551616", "18446744073709551616"},
        {"bench --backends omp" + shape + " --mask-block-q 4 --mask-block-kv 4 --block-density 1e-400",
         "1e-400"},
        {"bench --backends omp" + shape + " --mask-block-q 4 --mask-block-kv 4 --block-density 1.5",
         "1.5"},
        {"bench --backends omp" + shape + " --mask-block-q 4 --mask-block-kv 4 --block-density nan",
         "nan"},
        {"bench --backends omp" + shape + " --progress -1", "--progress"},
        {"bench --backends omp" + shape + " --progress nan", "--progress"},
    };
    for (const auto& [args, says] : bad) {
        const Result r = bench_cli(args);
        INFO("flashattn " << args << "\nstderr: " << r.err);
        CHECK(r.status == 2);
        CHECK(r.err.rfind("error:", 0) == 0);
        CHECK(r.err.find(says) != std::string::npos);
        CHECK(r.out.empty());
    }
}

TEST_CASE("flashattn bench: every long phase is reported on stderr, and --json's stdout stays JSON") {
    // --progress 0 reports every phase as it starts: preparation, the untimed forward a backward
    // reads, each warm-up run and each timed round.
    for (const char* pass : {"forward", "backward", "both"}) {
        const Result r = bench_cli(std::string("bench --backends standard,omp --batch 1 --heads 2 "
                                               "--seq 16 --dim 8 --repeat 2 --warmup 1 --pass ") +
                                   pass + " --progress 0 --json");
        INFO("--pass " << pass << "\nstderr: " << r.err);
        REQUIRE(r.status == 0);
        std::vector<std::string> phases = {"bench: preparing standard", "bench: preparing omp",
                                           "bench: warm-up 1/1, standard",
                                           "bench: timed round 2/2, omp"};
        if (std::string(pass) != "forward")
            phases.insert(phases.end(), {"bench: standard's untimed forward",
                                         "bench: omp's untimed forward",
                                         "bench: timed round 1/2, omp backward"});
        for (const std::string& phase : phases) {
            INFO("expected: " << phase);
            CHECK(r.err.find(phase) != std::string::npos);
        }
        std::stringstream out(r.out);
        std::size_t rows = 0;
        for (std::string line; std::getline(out, line); ++rows) {
            INFO("stdout line: " << line);
            CHECK_NOTHROW(nlohmann::json::parse(line));
        }
        CHECK(rows == (std::string(pass) == "both" ? 4u : 2u));
    }
    // A phase that takes longer than --progress is reported while it runs, from inside one call:
    // the timed run of scalar (Algorithm 1, one thread) on N = 2048, d = 32.
    const Result slow = bench_cli("bench --backends scalar --batch 1 --heads 1 --seq 2048 --dim 32 "
                                  "--repeat 1 --warmup 0 --progress 0.05 --json");
    INFO("stderr: " << slow.err);
    REQUIRE(slow.status == 0);
    CHECK(slow.err.find("bench: timed round 1/1, scalar, ") != std::string::npos);
    // With the default (1 s), a quick run says nothing.
    const Result quick = bench_cli("bench --backends omp --batch 1 --heads 2 --seq 16 --dim 8 "
                                   "--repeat 1 --json");
    INFO("stderr: " << quick.err);
    REQUIRE(quick.status == 0);
    CHECK(quick.err.find("bench:") == std::string::npos);
}
