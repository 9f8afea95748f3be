// tests/test_bench.cpp — `flashattn bench` (docs/design.md, Command-line contract): every listed backend in one
// run, one JSON object per measured row with the promised fields, the human table, and exit 2 with
// "error:" for bad options. Timings themselves are not checked (no timing assertions in tests).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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
