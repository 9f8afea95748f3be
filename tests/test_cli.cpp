// tests/test_cli.cpp — the command-line contract of DESIGN.md: `run` writes correct outputs, and
// any bad input gives exit status 2, a message starting "error:", and no output created or changed.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "helpers.hpp"
#include "npy.hpp"

using namespace flashattn;
namespace fs = std::filesystem;

namespace {

struct Result {
    int status;
    std::string err;
};

Result flashattn_cli(const std::string& args, const fs::path& dir) {
    const fs::path err_file = dir / "stderr.txt";
    const std::string cmd = std::string(FLASHATTN_EXE) + " " + args + " 2> " + err_file.string() + " > /dev/null";
    const int raw = std::system(cmd.c_str());
    std::ifstream in(err_file);
    std::stringstream ss;
    ss << in.rdbuf();
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, ss.str()};
}

void write_file(const fs::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() / ("flashattn_cli_" + std::to_string(test::next_seed()));
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("flashattn run writes O and LSE that match float64 attention, (B,H,N,d) and (N,d)") {
    TempDir tmp;
    for (const std::string backend : {"standard", "scalar"})
        for (bool four_d : {true, false}) {
            AttentionProblem p;
            p.batch = four_d ? 2 : 1, p.heads = four_d ? 4 : 1, p.heads_kv = four_d ? 2 : 1;
            p.seq_q = 37, p.seq_kv = 53, p.dim = 11, p.causal = true;
            const ProblemData in = random_problem_data(p, test::next_seed());
            const std::vector<std::int64_t> qs = four_d ? std::vector<std::int64_t>{2, 4, 37, 11}
                                                        : std::vector<std::int64_t>{37, 11};
            const std::vector<std::int64_t> ks = four_d ? std::vector<std::int64_t>{2, 2, 53, 11}
                                                        : std::vector<std::int64_t>{53, 11};
            write_file(tmp.path / "q.npy", npy::serialize_float32(qs, in.Q.data()));
            write_file(tmp.path / "k.npy", npy::serialize_float32(ks, in.K.data()));
            write_file(tmp.path / "v.npy", npy::serialize_float32(ks, in.V.data()));
            const fs::path out = tmp.path / "o.npy", lse = tmp.path / "lse.npy";
            const Result r = flashattn_cli(
                "run --backend " + backend + " --causal --q " + (tmp.path / "q.npy").string() + " --k " +
                    (tmp.path / "k.npy").string() + " --v " + (tmp.path / "v.npy").string() +
                    " --out " + out.string() + " --lse " + lse.string() + " --block-q 5 --block-kv 7",
                tmp.path);
            INFO(r.err);
            REQUIRE(r.status == 0);
            const npy::Array O = npy::load(out.string()), L = npy::load(lse.string());
            CHECK(O.shape == qs);
            const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
            CHECK(max_abs_error(O.floats.data(), ref.O.data(), p.q_elements()) < 1e-5);
            CHECK(max_abs_error(L.floats.data(), ref.lse.data(), p.lse_elements()) < 1e-5);
            CHECK(L.size() == p.lse_elements());
        }
}

TEST_CASE("flashattn: bad input gives exit 2, 'error:' and leaves outputs untouched") {
    TempDir tmp;
    const std::vector<float> q(2 * 3 * 5 * 8, 0.5f), k(2 * 1 * 7 * 8, 0.25f);
    write_file(tmp.path / "q.npy", npy::serialize_float32({2, 3, 5, 8}, q.data()));
    write_file(tmp.path / "k.npy", npy::serialize_float32({2, 1, 7, 8}, k.data()));
    write_file(tmp.path / "k2.npy", npy::serialize_float32({2, 2, 7, 8}, k.data()));
    write_file(tmp.path / "kd.npy", npy::serialize_float32({2, 1, 7, 7}, k.data()));
    write_file(tmp.path / "junk.npy", "this is not an npy file");
    write_file(tmp.path / "mask.npy", npy::serialize_float32({1, 1}, q.data()));
    const std::string q_ = (tmp.path / "q.npy").string(), k_ = (tmp.path / "k.npy").string();
    const fs::path existing = tmp.path / "existing.npy";
    write_file(existing, "keep me");
    const fs::path fresh = tmp.path / "fresh.npy";
    const std::string io = " --q " + q_ + " --k " + k_ + " --v " + k_;
    const std::vector<std::string> bad = {
        "run --backend nosuch" + io,
        "run --backend scalar --q " + q_ + " --k " + (tmp.path / "k2.npy").string() + " --v " + k_,
        "run --backend scalar --q " + q_ + " --k " + (tmp.path / "kd.npy").string() + " --v " +
            (tmp.path / "kd.npy").string(),
        "run --backend scalar --q " + (tmp.path / "junk.npy").string() + " --k " + k_ + " --v " + k_,
        "run --backend scalar --q " + (tmp.path / "missing.npy").string() + " --k " + k_ + " --v " + k_,
        "run --backend scalar" + io + " --scale inf",
        "run --backend scalar" + io + " --scale abc",
        "run --backend scalar" + io + " --block-q 0 --block-kv 4",
        "run --backend scalar" + io + " --block-q 4",
        "run --backend scalar" + io + " --sram-bytes 8",
        "run --backend scalar" + io + " --sram-bytes 4096 --block-q 2 --block-kv 2",
        "run --backend scalar" + io + " --block-mask " + (tmp.path / "mask.npy").string() +
            " --block-q 2 --block-kv 2",
        "run --backend scalar" + io + " --dtype f64",
        "run --backend scalar" + io + " --no-such-option",
        "run --backend scalar --q " + q_,
    };
    for (const std::string& args : bad)
        for (const fs::path& out : {existing, fresh}) {
            const Result r = flashattn_cli(args + " --out " + out.string() + " --lse " + out.string() + ".lse", tmp.path);
            INFO("flashattn " << args << "\nstderr: " << r.err);
            CHECK(r.status == 2);
            CHECK(r.err.rfind("error:", 0) == 0);
            CHECK(read_file(existing) == "keep me");
            CHECK_FALSE(fs::exists(fresh));
            CHECK_FALSE(fs::exists(fs::path(out.string() + ".lse")));
        }
    // No temporary file is left behind either.
    for (const auto& entry : fs::directory_iterator(tmp.path))
        CHECK(entry.path().string().find(".tmp.") == std::string::npos);
}
