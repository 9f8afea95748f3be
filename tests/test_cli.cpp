// tests/test_cli.cpp — the command-line contract of docs/design.md: `run` writes correct outputs, and
// any bad input gives exit status 2, a message starting "error:", and no output created or changed
// (a long list of bad inputs, hostile files, and output paths that cannot be written). Output files
// (docs/design.md, Output files): an output that names an input, however spelled or linked, is
// refused and the input stays byte-identical; a replaced file keeps its mode; symbolic links are
// written through; names up to 255 bytes work.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "helpers.hpp"
#include "npy.hpp"
#include "npy_files.hpp"

using namespace flashattn;
using test::npy_dict;
using test::npy_file;
using test::read_file;
using test::write_file;
namespace fs = std::filesystem;

namespace {

struct Result {
    int status;
    std::string err;
};

// Runs `flashattn ARGS` (in directory `cwd` when one is given, for relative paths).
Result flashattn_cli(const std::string& args, const fs::path& dir, const fs::path& cwd = {}) {
    const fs::path err_file = dir / "stderr.txt";
    const std::string cmd = (cwd.empty() ? "" : "cd " + cwd.string() + " && ") +
                            std::string(FLASHATTN_EXE) + " " + args + " 2> " + err_file.string() +
                            " > /dev/null";
    const int raw = std::system(cmd.c_str());
    const std::string err = read_file(err_file);
    fs::remove(err_file);
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, err};
}

struct TempDir {
    fs::path path;
    TempDir() {
        // The process id: ctest runs test cases as parallel processes, and the random seeds repeat.
        path = fs::temp_directory_path() / ("flashattn_cli_" + std::to_string(::getpid()) + "_" +
                                            std::to_string(test::next_seed()));
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::permissions(path / "readonly", fs::perms::owner_all, ec);
        fs::remove_all(path, ec);
    }
};

// What a refused command must leave behind: no temporary file anywhere in `dir` (".fa-XXXXXX",
// or ".tmp." as older versions named them).
void check_no_temporaries(const fs::path& dir) {
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        INFO("left behind: " << entry.path());
        CHECK(name.find(".tmp.") == std::string::npos);
        CHECK(name.rfind(".fa-", 0) != 0);
    }
}

// A refused command exits 2 and says why on a line starting "error:". For `run` that is the first
// line (its informational lines, such as scalar's block sizes, are printed only after a success);
// `demo` and `bench` may show progress lines before it.
void check_refused(const Result& r, bool error_first = true) {
    CHECK(r.status == 2);
    if (error_first)
        CHECK(r.err.rfind("error:", 0) == 0);
    else
        CHECK((r.err.rfind("error:", 0) == 0 || r.err.find("\nerror:") != std::string::npos));
}

// A directory of valid and broken inputs for `run`: q (2,3,5,8), k (2,1,7,8), and more.
struct Inputs {
    TempDir tmp;
    std::string q, k, io;
    explicit Inputs() {
        const std::vector<float> q_values(2 * 3 * 5 * 8, 0.5f), k_values(2 * 1 * 7 * 8, 0.25f);
        write_file(tmp.path / "q.npy", npy::serialize_float32({2, 3, 5, 8}, q_values.data()));
        write_file(tmp.path / "k.npy", npy::serialize_float32({2, 1, 7, 8}, k_values.data()));
        q = file("q.npy"), k = file("k.npy");
        io = " --q " + q + " --k " + k + " --v " + k;
    }
    std::string file(const std::string& name) const { return (tmp.path / name).string(); }
    // Writes a float32 array of that shape (zeros) and returns its path.
    std::string array(const std::string& name, const std::vector<std::int64_t>& shape) const {
        std::int64_t n = 1;
        for (std::int64_t d : shape) n *= d;
        const std::vector<float> zeros(n, 0.0f);
        write_file(tmp.path / name, npy::serialize_float32(shape, zeros.data()));
        return file(name);
    }
    std::string raw(const std::string& name, const std::string& bytes) const {
        write_file(tmp.path / name, bytes);
        return file(name);
    }
};

// Runs `flashattn ARGS --out OUT --lse OUT.lse` with OUT an existing file and with OUT a fresh
// name: both runs must be refused and leave the existing file as it was and create nothing.
void check_refused_with_outputs(const std::string& args, const fs::path& dir) {
    const fs::path existing = dir / "existing.npy", fresh = dir / "fresh.npy";
    write_file(existing, "keep me");
    for (const char* left : {"fresh.npy", "fresh.npy.lse", "existing.npy.lse"})
        fs::remove(dir / left);
    for (const fs::path& out : {existing, fresh}) {
        const Result r =
            flashattn_cli(args + " --out " + out.string() + " --lse " + out.string() + ".lse", dir);
        INFO("flashattn " << args << " --out " << out.filename() << "\nstderr: " << r.err);
        check_refused(r);
        CHECK(read_file(existing) == "keep me");
        CHECK_FALSE(fs::exists(fresh));
        CHECK_FALSE(fs::exists(fs::path(out.string() + ".lse")));
    }
    check_no_temporaries(dir);
}

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
                "run --backend " + backend + " --causal --q " + (tmp.path / "q.npy").string() +
                    " --k " + (tmp.path / "k.npy").string() + " --v " +
                    (tmp.path / "v.npy").string() + " --out " + out.string() + " --lse " +
                    lse.string() + " --block-q 5 --block-kv 7",
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

TEST_CASE("flashattn run --splits: omp merges the chunks asked for and matches float64 attention") {
    // Decoding: 3 query rows (GQA, causal bottom-right) against 2000 keys, 4 of omp's key tiles.
    TempDir tmp;
    AttentionProblem p;
    p.batch = 1, p.heads = 4, p.heads_kv = 2, p.seq_q = 3, p.seq_kv = 2000, p.dim = 64;
    p.causal = true;
    const ProblemData in = random_problem_data(p, test::next_seed());
    write_file(tmp.path / "q.npy", npy::serialize_float32({1, 4, 3, 64}, in.Q.data()));
    write_file(tmp.path / "k.npy", npy::serialize_float32({1, 2, 2000, 64}, in.K.data()));
    write_file(tmp.path / "v.npy", npy::serialize_float32({1, 2, 2000, 64}, in.V.data()));
    const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());
    const fs::path out = tmp.path / "o.npy", lse = tmp.path / "lse.npy";
    const std::string io = " --q " + (tmp.path / "q.npy").string() + " --k " +
                           (tmp.path / "k.npy").string() + " --v " +
                           (tmp.path / "v.npy").string() + " --out " + out.string() + " --lse " +
                           lse.string();
    for (const char* splits : {"1", "3", "1024"}) {
        const Result r =
            flashattn_cli("run --backend omp --causal --splits " + std::string(splits) + io,
                          tmp.path);
        INFO("--splits " << splits << "\nstderr: " << r.err);
        REQUIRE(r.status == 0);
        // 1024 is clamped to the 4 key tiles; 1 is no split, and nothing is said about it.
        const std::string said = std::string(splits) == "3"    ? "split-KV, 3 key chunks merged"
                                 : std::string(splits) == "1024" ? "split-KV, 4 key chunks merged"
                                                                 : "split-KV";
        CHECK((r.err.find(said) != std::string::npos) == (std::string(splits) != "1"));
        const npy::Array O = npy::load(out.string()), L = npy::load(lse.string());
        CHECK(max_abs_error(O.floats.data(), ref.O.data(), p.q_elements()) < 1e-5);
        CHECK(max_abs_error(L.floats.data(), ref.lse.data(), p.lse_elements()) < 1e-5);
    }
}

TEST_CASE("flashattn: bad options give exit 2, 'error:' and leave outputs untouched") {
    const Inputs in;
    const std::string& io = in.io;
    const std::vector<std::string> bad = {
        "run --backend nosuch" + io,
        "run --backend scalar" + io + " --scale inf",
        "run --backend scalar" + io + " --scale nan",
        "run --backend scalar" + io + " --scale 1e39",  // finite as a double, inf as a float
        "run --backend omp" + io + " --scale -3e38",    // scores beyond float32: not "masked"
        "run --backend standard" + io + " --scale 3e38",
        "run --backend scalar" + io + " --scale abc",
        "run --backend scalar" + io + " --block-q 0 --block-kv 4",
        "run --backend scalar" + io + " --block-q -1 --block-kv 4",
        "run --backend scalar" + io + " --block-q 4",
        "run --backend scalar" + io + " --sram-bytes 8",
        "run --backend scalar" + io + " --sram-bytes -4096",
        "run --backend scalar" + io + " --sram-bytes 4096 --block-q 2 --block-kv 2",
        "run --backend scalar" + io + " --dtype f64",
        "run --backend omp" + io + " --splits -1",
        "run --backend omp" + io + " --splits 1025",
        "run --backend omp" + io + " --splits 2.5",
        "run --backend omp" + io + " --splits x",
        "run --backend scalar" + io + " --no-such-option",
        "run --backend scalar --q " + in.q,
        "",
        "nosuchcommand",
        "demo --seq 0",
        "demo --dim 257",
        "demo --heads 0",
        "demo --batch -1",
        "demo --seq abc",
    };
    for (const std::string& args : bad) check_refused_with_outputs(args, in.tmp.path);
}

TEST_CASE("flashattn run and demo: an OMP_NUM_THREADS libgomp could not start is refused first") {
    // libgomp would end the process with status 1 and its own message; the contract is "error:"
    // and exit 2 (examples/flashattn/thread_count.hpp), as bench already gives for --threads.
    const Inputs in;
    ::setenv("OMP_NUM_THREADS", "100000000", 1);
    for (const std::string& args :
         {"run --backend omp" + in.io + " --out " + in.file("o.npy"), std::string("demo")}) {
        const Result r = flashattn_cli(args, in.tmp.path);
        INFO(args << "\nstderr: " << r.err);
        CHECK(r.status == 2);
        CHECK(r.err.rfind("error: OMP_NUM_THREADS = 100000000: at most ", 0) == 0);
    }
    ::unsetenv("OMP_NUM_THREADS");
}

TEST_CASE("flashattn run: arrays of the wrong rank or of mismatched shapes are refused") {
    const Inputs in;
    const std::string q = " --q " + in.q, k = " --k " + in.k + " --v " + in.k;
    const std::vector<std::string> bad = {
        // rank 3, 1, 0 and 5 (with K/V of the same rank)
        "--q " + in.array("q3.npy", {3, 5, 8}) + " --k " + in.array("k3.npy", {1, 7, 8}) + " --v " +
            in.file("k3.npy"),
        "--q " + in.array("q1.npy", {8}) + " --k " + in.array("k1.npy", {8}) + " --v " +
            in.file("k1.npy"),
        "--q " + in.array("q0.npy", {}) + " --k " + in.array("k0.npy", {}) + " --v " +
            in.file("k0.npy"),
        "--q " + in.array("q5.npy", {1, 2, 3, 5, 8}) + " --k " +
            in.array("k5.npy", {1, 2, 1, 7, 8}) + " --v " + in.file("k5.npy"),
        // Q (N, d) with K (B, H, N, d)
        "--q " + in.array("q2d.npy", {5, 8}) + k,
        // K and V of different shapes
        q + " --k " + in.k + " --v " + in.array("v6.npy", {2, 1, 6, 8}),
        // batch, head dimension and head count that do not match Q
        q + " --k " + in.array("kb.npy", {1, 1, 7, 8}) + " --v " + in.file("kb.npy"),
        q + " --k " + in.array("kd.npy", {2, 1, 7, 7}) + " --v " + in.file("kd.npy"),
        q + " --k " + in.array("kh.npy", {2, 2, 7, 8}) + " --v " + in.file("kh.npy"),  // 3 % 2
        q + " --k " + in.array("kh4.npy", {2, 6, 7, 8}) + " --v " + in.file("kh4.npy"),
        // empty sequences and head dimension 0 or beyond 256
        "--q " + in.array("qn0.npy", {2, 3, 0, 8}) + k,
        q + " --k " + in.array("kn0.npy", {2, 1, 0, 8}) + " --v " + in.file("kn0.npy"),
        "--q " + in.array("qd0.npy", {5, 0}) + " --k " + in.array("kd0.npy", {7, 0}) + " --v " +
            in.file("kd0.npy"),
        "--q " + in.array("qd.npy", {5, 300}) + " --k " + in.array("kdd.npy", {7, 300}) + " --v " +
            in.file("kdd.npy"),
    };
    for (const std::string& args : bad)
        check_refused_with_outputs("run --backend standard " + args, in.tmp.path);
}

TEST_CASE("flashattn run: hostile, empty and non-file inputs are refused") {
    const Inputs in;
    const std::string k = " --k " + in.k + " --v " + in.k;
    fs::create_directories(in.tmp.path / "dir.npy");
    const std::vector<std::string> bad_q = {
        in.raw("empty.npy", ""),
        in.file("dir.npy"),
        in.file("missing.npy"),
        in.raw("junk.npy", "this is not an npy file"),
        in.raw("f64.npy", npy_file(npy_dict("<f8", "(2, 3, 5, 8)"), 1, 8 * 240)),
        in.raw("be.npy", npy_file(npy_dict(">f4", "(2, 3, 5, 8)"), 1, 4 * 240)),
        in.raw("i32.npy", npy_file(npy_dict("<i4", "(2, 3, 5, 8)"), 1, 4 * 240)),
        in.raw("u8.npy", npy_file(npy_dict("|u1", "(2, 3, 5, 8)"), 1, 240)),
        in.raw("fortran.npy", npy_file(npy_dict("<f4", "(2, 3, 5, 8)", "True"), 1, 4 * 240)),
        in.raw("v9.npy",
               [] {
                   std::string f = npy_file(npy_dict("<f4", "(2, 3, 5, 8)"), 1, 960);
                   f[6] = 9;
                   return f;
               }()),
        in.raw("past.npy",
               [] {
                   std::string f = npy_file(npy_dict("<f4", "(2, 3, 5, 8)"), 1, 960);
                   f[9] = 0x7F;
                   return f;
               }()),
        in.raw("short.npy", npy_file(npy_dict("<f4", "(2, 3, 5, 8)"), 1, 959)),
        in.raw("claims.npy", npy_file(npy_dict("<f4", "(1024, 1024, 1024, 64)"), 1, 960)),
        in.raw("overflow.npy", npy_file(npy_dict("<f4", "(4294967296, 4294967296, 1, 1)"), 1, 960)),
    };
    for (const std::string& q : bad_q)
        check_refused_with_outputs("run --backend scalar --q " + q + k, in.tmp.path);
    // The same files as K or V.
    for (const std::string& bad : {in.file("empty.npy"), in.file("dir.npy"), in.file("f64.npy")}) {
        check_refused_with_outputs(
            "run --backend scalar --q " + in.q + " --k " + bad + " --v " + in.k, in.tmp.path);
        check_refused_with_outputs(
            "run --backend scalar --q " + in.q + " --k " + in.k + " --v " + bad, in.tmp.path);
    }
}

TEST_CASE("flashattn run: block masks of the wrong dtype, shape or values are refused") {
    const Inputs in;
    // q has N_q = 5, k has N_kv = 7: blocks of 2 x 3 give (Tr, Tc) = (3, 3).
    const std::string run =
        "run --backend scalar" + in.io + " --block-q 2 --block-kv 3 --block-mask ";
    const auto mask = [&](const std::string& name, const std::string& descr,
                          const std::string& shape, const std::string& bytes) {
        return in.raw(name, npy_file(npy_dict(descr, shape), 1, 0) + bytes);
    };
    const std::string ones9(9, '\x01');
    const std::vector<std::string> bad = {
        run + in.array("mf.npy", {3, 3}),                                    // float32
        run + mask("mi.npy", "<i4", "(3, 3)", std::string(36, '\0')),        // int32
        run + mask("m2.npy", "|u1", "(3, 3)", ones9.substr(0, 8) + "\x02"),  // a 2
        run + mask("mb.npy", "|b1", "(3, 3)", ones9.substr(0, 8) + "\x07"),  // a bool byte of 7
        run + mask("ms.npy", "|u1", "(3, 4)", ones9 + "\x01\x01\x01"),       // (3, 4)
        run + mask("mt.npy", "|u1", "(3, 3, 1)", ones9),                     // rank 3
        run + mask("m1.npy", "|u1", "(9,)", ones9),                          // rank 1
        run + in.raw("me.npy", ""),                                          // empty file
        run + in.file("missing_mask.npy"),
        "run --backend scalar" + in.io + " --block-mask " + mask("mn.npy", "|u1", "(3, 3)", ones9),
        "run --backend scalar" + in.io + " --sram-bytes 4096 --block-mask " + in.file("mn.npy"),
    };
    for (const std::string& args : bad) check_refused_with_outputs(args, in.tmp.path);
}

TEST_CASE("flashattn run: a block mask in either spelling, and tile sizes stay tile sizes") {
    TempDir tmp;
    AttentionProblem p = test::make_problem(1, 2, 1, 9, 11, 5);
    const ProblemData in = random_problem_data(p, test::next_seed());
    write_file(tmp.path / "q.npy", npy::serialize_float32({1, 2, 9, 5}, in.Q.data()));
    write_file(tmp.path / "k.npy", npy::serialize_float32({1, 1, 11, 5}, in.K.data()));
    write_file(tmp.path / "v.npy", npy::serialize_float32({1, 1, 11, 5}, in.V.data()));
    // Blocks of 2 x 3: (Tr, Tc) = (5, 4); query block 1 sees nothing (its rows get zeros).
    std::vector<std::uint8_t> mask(5 * 4);
    std::mt19937 gen(static_cast<unsigned>(test::next_seed()));
    for (auto& m : mask) m = gen() % 3 != 0;
    std::fill_n(mask.begin() + 4, 4, 0);
    write_file(tmp.path / "m.npy",
               npy_file(npy_dict("|u1", "(5, 4)"), 1, 0) + std::string(mask.begin(), mask.end()));
    p.block_mask = {mask.data(), 2, 3};
    const Reference ref = reference_attention(p, in.Q.data(), in.K.data(), in.V.data());

    const auto path = [&](const char* name) { return (tmp.path / name).string(); };
    const std::string io = " --q " + path("q.npy") + " --k " + path("k.npy") + " --v " +
                           path("v.npy") + " --out " + path("o.npy");
    const std::string mask_arg = " --block-mask " + path("m.npy");
    struct Case {
        std::string backend, options, says, never_says;
    };
    const std::vector<Case> cases = {
        // The older spelling: --block-q/--block-kv are the mask's blocks, not tiles.
        {"scalar", " --block-q 2 --block-kv 3" + mask_arg, "scalar: tiles M = ", "Br = 2, Bc = 3"},
        {"omp", " --block-q 2 --block-kv 3" + mask_arg, "omp: tiles Br = ", "Br = 2, Bc = 3"},
        {"standard", " --block-q 2 --block-kv 3" + mask_arg, "standard: no tiles", "Br ="},
        // The mask's blocks on their own options; --block-q/--block-kv are then the tiles.
        {"scalar", " --mask-block-q 2 --mask-block-kv 3 --block-q 4 --block-kv 1" + mask_arg,
         "scalar: tiles Br = 4, Bc = 1 (Tr = 3, Tc = 11)", "M ="},
        {"omp", " --mask-block-q 2 --mask-block-kv 3 --block-q 1 --block-kv 7" + mask_arg,
         "omp: tiles Br = 1, Bc = 7 (Tr = 9, Tc = 2)", "M ="},
        {"scalar", " --mask-block-q 2 --mask-block-kv 3 --sram-bytes 400" + mask_arg,
         "scalar: tiles M = 100 floats -> Br = 5, Bc = 5", "Br = 2"},
    };
    for (const Case& c : cases) {
        const Result r = flashattn_cli("run --backend " + c.backend + io + c.options, tmp.path);
        INFO("run --backend " << c.backend << c.options << "\nstderr: " << r.err);
        REQUIRE(r.status == 0);
        CHECK(r.err.find(c.says) != std::string::npos);
        CHECK(r.err.find(c.never_says) == std::string::npos);
        const npy::Array O = npy::load(path("o.npy"));
        CHECK(max_abs_error(O.floats.data(), ref.O.data(), p.q_elements()) < 1e-5);
    }
    // The mask's block size alone, half of it, or one that does not fit the mask's shape.
    const std::vector<std::string> bad = {
        " --mask-block-q 2 --mask-block-kv 3",
        " --mask-block-q 2" + mask_arg,
        " --mask-block-q 0 --mask-block-kv 3" + mask_arg,
        " --mask-block-q 3 --mask-block-kv 3" + mask_arg,
        " --mask-block-q 2 --mask-block-kv 3 --block-q 2" + mask_arg,
    };
    for (const std::string& options : bad) {
        fs::remove(path("o.npy"));
        const Result r = flashattn_cli("run --backend scalar" + io + options, tmp.path);
        INFO("run --backend scalar" << options << "\nstderr: " << r.err);
        check_refused(r);
        CHECK_FALSE(fs::exists(path("o.npy")));
    }
}

TEST_CASE("flashattn run: outputs that cannot be written are refused and change nothing") {
    const Inputs in;
    const fs::path dir = in.tmp.path;
    const std::string run = "run --backend scalar" + in.io;
    const fs::path existing = dir / "existing.npy", existing_lse = dir / "existing_lse.npy";
    const fs::path out_dir = dir / "out_dir.npy";
    fs::create_directories(out_dir);
    const fs::path fifo = dir / "fifo.npy";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    struct Case {
        std::string outputs;
        const char* why;
    };
    std::vector<Case> cases = {
        {" --out " + out_dir.string(), "--out is a directory"},
        {" --out " + existing.string() + " --lse " + out_dir.string(),
         "--lse is a directory (O would be written first)"},
        {" --out " + (dir / "no_such_dir" / "o.npy").string(), "directory does not exist"},
        {" --out " + existing.string() + " --lse " + (dir / "no_such_dir" / "l.npy").string(),
         "--lse directory does not exist"},
        {" --out " + (dir / "q.npy" / "o.npy").string(), "a file used as a directory"},
        {" --out /proc/flashattn_cannot_write_here.npy", "a directory nobody can create files in"},
        {" --out " + existing.string() + " --lse " + existing.string(),
         "--out and --lse are one file"},
        {" --out " + existing.string() + " --lse " + dir.string() + "/./existing.npy",
         "the same, spelled differently"},
        {" --out " + fifo.string(), "--out is a FIFO (never replaced by a regular file)"},
        {" --out ''", "--out is empty"},
    };
    // Permissions do not stop root, so a read-only directory is a test only for other users.
    if (::geteuid() != 0) {
        fs::create_directories(dir / "readonly");
        fs::permissions(dir / "readonly", fs::perms::owner_read | fs::perms::owner_exec);
        cases.push_back({" --out " + (dir / "readonly" / "o.npy").string(), "read-only directory"});
    }
    for (const Case& c : cases) {
        write_file(existing, "keep O");
        write_file(existing_lse, "keep LSE");
        const Result r = flashattn_cli(run + c.outputs, dir);
        INFO(c.why << "\nflashattn " << run << c.outputs << "\nstderr: " << r.err);
        check_refused(r);
        CHECK(read_file(existing) == "keep O");
        CHECK(read_file(existing_lse) == "keep LSE");
        CHECK(fs::is_directory(out_dir));
        CHECK(fs::is_fifo(fifo));
        CHECK_FALSE(fs::exists(dir / "o.npy"));
        check_no_temporaries(dir);
    }
    // The outputs are checked before anything is read or computed: with a missing input and an
    // output in a missing directory, the error is about the output.
    const std::string missing_input = "run --backend scalar --q " + (dir / "absent.npy").string() +
                                      " --k " + in.k + " --v " + in.k + " --out " +
                                      (dir / "no_such_dir" / "o.npy").string();
    const Result r = flashattn_cli(missing_input, dir);
    INFO("stderr: " << r.err);
    check_refused(r);
    CHECK(r.err.find("no_such_dir") != std::string::npos);
    check_no_temporaries(dir);
}

namespace {

fs::perms mode_of(const fs::path& p) { return fs::status(p).permissions() & fs::perms::all; }

}  // namespace

TEST_CASE("flashattn run: a successful run replaces existing outputs whole, keeping their mode") {
    const Inputs in;
    const fs::path out = in.tmp.path / "o.npy", lse = in.tmp.path / "l.npy";
    const fs::path fresh = in.tmp.path / "fresh.npy";
    write_file(out, std::string(100000, 'x'));  // longer than the new file: no stale tail
    write_file(lse, "old");
    const fs::perms owner_only = fs::perms::owner_read | fs::perms::owner_write;
    const fs::perms odd = fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                          fs::perms::others_exec;  // 0641: nobody's default
    fs::permissions(out, owner_only);
    fs::permissions(lse, odd);
    const mode_t old_mask = ::umask(027);
    const Result r = flashattn_cli("run --backend scalar" + in.io + " --out " + out.string() +
                                       " --lse " + lse.string() + " --dout " +
                                       in.array("do.npy", {2, 3, 5, 8}) + " --dq " +
                                       fresh.string() + " --dk " + in.file("dk.npy") + " --dv " +
                                       in.file("dv.npy"),
                                   in.tmp.path);
    ::umask(old_mask);
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(npy::load(out.string()).shape == std::vector<std::int64_t>{2, 3, 5, 8});
    CHECK(npy::load(lse.string()).shape == std::vector<std::int64_t>{2, 3, 5});
    // Replaced files keep their mode (0600 stays 0600); a new one gets 0666 & ~umask.
    CHECK(mode_of(out) == owner_only);
    CHECK(mode_of(lse) == odd);
    CHECK(mode_of(fresh) == (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
    check_no_temporaries(in.tmp.path);
    // Block sizes far beyond N are one tile, not an error.
    const Result huge = flashattn_cli("run --backend scalar" + in.io + " --out " + out.string() +
                                          " --block-q 9223372036854775807 --block-kv 4294967296",
                                      in.tmp.path);
    INFO(huge.err);
    CHECK(huge.status == 0);
}

TEST_CASE("flashattn demo and bench: a problem too large for memory is a clean error") {
    TempDir tmp;
    for (const std::string args : {
             "demo --seq 1099511627776 --dim 1 --heads 1",  // 4 TiB of inputs
             "demo --seq 1048576 --dim 1 --heads 1",        // 4 MiB inputs, 8 TiB float64 S
             "demo --batch 1048576 --heads 1048576 --seq 1048576 --dim 256",  // validate()
             "bench --backends scalar --batch 1 --heads 1 --seq 1099511627776 --dim 1",
             "bench --backends standard --batch 1 --heads 1 --seq 1048576 --dim 1 --repeat 1",
         }) {
        const Result r = flashattn_cli(args, tmp.path);
        INFO("flashattn " << args << "\nstderr: " << r.err);
        check_refused(r, /*error_first=*/false);  // demo shows its progress first
    }
}

// --- The backward pass on the command line: run --dout dO.npy --dq --dk --dv --------------------

namespace {

// Runs `flashattn run` with the backward on a backend, on random inputs written as .npy of the
// given shapes (4 entries: (B, H, N, d); 2: (N, d)), and checks dQ, dK, dV against the float64
// Algorithm 3 by the 2x rule (gradient_bounds), and their shapes against Q's and K's.
void check_run_backward(const std::string& backend, const AttentionProblem& p, bool four_d,
                        DType dtype, const TempDir& tmp) {
    INFO("run --backend " << backend << " " << test::describe(p) << " (" << (four_d ? 4 : 2)
                          << "-d files) dtype=" << to_string(dtype));
    const std::uint64_t seed = test::next_seed();
    INFO("seed=" << seed);
    const ProblemData in = random_problem_data(p, seed);
    const std::vector<float> dO = random_normal(p.q_elements(), seed + 3);
    const std::vector<std::int64_t> qs =
        four_d ? std::vector<std::int64_t>{p.batch, p.heads, p.seq_q, p.dim}
               : std::vector<std::int64_t>{p.seq_q, p.dim};
    const std::vector<std::int64_t> ks =
        four_d ? std::vector<std::int64_t>{p.batch, p.heads_kv, p.seq_kv, p.dim}
               : std::vector<std::int64_t>{p.seq_kv, p.dim};
    const auto path = [&](const char* name) { return (tmp.path / name).string(); };
    write_file(path("q.npy"), npy::serialize_float32(qs, in.Q.data()));
    write_file(path("k.npy"), npy::serialize_float32(ks, in.K.data()));
    write_file(path("v.npy"), npy::serialize_float32(ks, in.V.data()));
    write_file(path("do.npy"), npy::serialize_float32(qs, dO.data()));
    const Result r = flashattn_cli(
        "run --backend " + backend + (p.causal ? " --causal" : "") + " --dtype " +
            to_string(dtype) + " --q " + path("q.npy") + " --k " + path("k.npy") + " --v " +
            path("v.npy") + " --out " + path("o.npy") + " --dout " + path("do.npy") + " --dq " +
            path("dq.npy") + " --dk " + path("dk.npy") + " --dv " + path("dv.npy"),
        tmp.path);
    INFO("stderr: " << r.err);
    REQUIRE(r.status == 0);
    CHECK(r.err.find(backend + ": backward done") != std::string::npos);
    const npy::Array dQ = npy::load(path("dq.npy")), dK = npy::load(path("dk.npy")),
                     dV = npy::load(path("dv.npy"));
    CHECK(dQ.shape == qs);
    CHECK(dK.shape == ks);
    CHECK(dV.shape == ks);
    // Against the float64 backward, never against the code path under test.
    const GradReference ref =
        reference_backward(p, in.Q.data(), in.K.data(), in.V.data(), dO.data());
    const GradBounds bound = gradient_bounds(p, in, dO, ref, dtype);
    CHECK(max_abs_error(dQ.floats.data(), ref.dQ.data(), p.q_elements()) <= bound.dQ);
    CHECK(max_abs_error(dK.floats.data(), ref.dK.data(), p.kv_elements()) <= bound.dK);
    CHECK(max_abs_error(dV.floats.data(), ref.dV.data(), p.kv_elements()) <= bound.dV);
}

// The outputs of a run with the backward, each an existing file or a fresh name.
const std::vector<std::string> kAllOutputs = {"--out", "--lse", "--dq", "--dk", "--dv"};

// Runs `flashattn ARGS` plus the outputs named in `outputs` (a subset of kAllOutputs), first as
// existing files and then as fresh names: the command must be refused, leave every existing file
// as it was, create none of the fresh ones and leave no temporary file.
void check_backward_refused(const std::string& args, const std::vector<std::string>& outputs,
                            const fs::path& dir) {
    const auto file = [&](const char* kind, const std::string& option) {
        return dir / (kind + option.substr(2) + ".npy");  // "existing_dq.npy", "fresh_dq.npy"
    };
    for (const char* kind : {"existing_", "fresh_"}) {
        std::string command = args;
        for (const std::string& option : kAllOutputs) {
            fs::remove(file("fresh_", option));
            write_file(file("existing_", option), "keep " + option);
        }
        for (const std::string& option : outputs)
            command += " " + option + " " + file(kind, option).string();
        const Result r = flashattn_cli(command, dir);
        INFO("flashattn " << command << "\nstderr: " << r.err);
        check_refused(r);
        for (const std::string& option : kAllOutputs) {
            CHECK(read_file(file("existing_", option)) == "keep " + option);
            CHECK_FALSE(fs::exists(file("fresh_", option)));
        }
    }
    check_no_temporaries(dir);
}

}  // namespace

TEST_CASE("flashattn run --dout/--dq/--dk/--dv writes gradients that match the float64 backward") {
    // The command line is under test here, on every CPU backward (each runs its own forward
    // first, as `run` does); every backward's accuracy on the odd-shape grid is
    // tests/test_backward.cpp's.
    TempDir tmp;
    for (const std::string& name : test::cpu_backends_with_backward()) {
        for (bool causal : {true, false}) {
            // GQA (H = 4 over H_kv = 2), N_q != N_kv both ways, sizes that divide nothing.
            check_run_backward(name, test::make_problem(2, 4, 2, 37, 53, 11, causal), true,
                               DType::f32, tmp);
            check_run_backward(name, test::make_problem(1, 4, 2, 29, 17, 8, causal), true,
                               DType::f32, tmp);
            // (N, d) files: B = H = 1.
            check_run_backward(name, test::make_problem(1, 1, 1, 23, 41, 7, causal), false,
                               DType::f32, tmp);
        }
        // --dtype applies to the backward too: judged against float32 Algorithm 3 on bf16 inputs.
        check_run_backward(name, test::make_problem(1, 2, 1, 19, 31, 16, true), true, DType::bf16,
                           tmp);
    }
}

TEST_CASE("flashattn run: --dout, --dq, --dk and --dv come together or not at all") {
    const Inputs in;
    const std::string dO = in.array("do.npy", {2, 3, 5, 8});
    const std::string run = "run --backend standard" + in.io;
    // Each of the four missing in turn: refused, nothing written.
    for (const std::string missing : {"--dout", "--dq", "--dk", "--dv"}) {
        std::vector<std::string> outputs;
        for (const std::string& option : kAllOutputs)
            if (option != missing) outputs.push_back(option);
        check_backward_refused(missing == "--dout" ? run : run + " --dout " + dO, outputs,
                               in.tmp.path);
        const Result r = flashattn_cli(
            run + (missing == "--dout" ? "" : " --dout " + dO) + " --out " + in.file("o.npy") +
                (missing == "--dq" ? "" : " --dq " + in.file("dq.npy")) +
                (missing == "--dk" ? "" : " --dk " + in.file("dk.npy")) +
                (missing == "--dv" ? "" : " --dv " + in.file("dv.npy")),
            in.tmp.path);
        INFO("missing " << missing << ", stderr: " << r.err);
        check_refused(r);
        CHECK(r.err.find("missing " + missing) != std::string::npos);
    }
    // Only --dout, with no gradient outputs at all.
    check_backward_refused(run + " --dout " + dO, {"--out", "--lse"}, in.tmp.path);
    // All four: accepted.
    const Result ok = flashattn_cli(run + " --out " + in.file("o.npy") + " --dout " + dO +
                                        " --dq " + in.file("dq.npy") + " --dk " +
                                        in.file("dk.npy") + " --dv " + in.file("dv.npy"),
                                    in.tmp.path);
    INFO(ok.err);
    CHECK(ok.status == 0);
}

TEST_CASE("flashattn run: a bad dO is refused and nothing is written") {
    const Inputs in;
    const std::string run = "run --backend standard" + in.io + " --dout ";
    const std::vector<std::string> bad_dO = {
        in.array("do_short.npy", {2, 3, 4, 8}),     // N_q off by one
        in.array("do_kv.npy", {2, 1, 7, 8}),        // K's shape, not Q's
        in.array("do_3d.npy", {3, 5, 8}),           // rank 3
        in.array("do_2d.npy", {5, 8}),              // (N, d) for a (B, H, N, d) Q
        in.raw("do_f64.npy", npy_file(npy_dict("<f8", "(2, 3, 5, 8)"), 1, 8 * 240)),
        in.raw("do_u8.npy", npy_file(npy_dict("|u1", "(2, 3, 5, 8)"), 1, 240)),
        in.raw("do_empty.npy", ""),
        in.file("do_missing.npy"),
    };
    for (const std::string& dO : bad_dO) check_backward_refused(run + dO, kAllOutputs, in.tmp.path);
}

TEST_CASE("flashattn run: a backend without a backward is refused before any work") {
    const Inputs in;
    const std::string backend = test::backend_without_backward();
    if (backend.empty()) {
        WARN("every backend of this build has a backward pass: nothing to refuse");
        return;
    }
    const std::string dO = in.array("do.npy", {2, 3, 5, 8});
    check_backward_refused("run --backend " + backend + in.io + " --dout " + dO, kAllOutputs,
                           in.tmp.path);
    // Before any input is read: with a missing Q the error is still about the backward.
    const Result r = flashattn_cli("run --backend " + backend + " --q " + in.file("absent.npy") +
                                       " --k " + in.k + " --v " + in.k + " --out " +
                                       in.file("o.npy") + " --dout " + dO + " --dq " +
                                       in.file("dq.npy") + " --dk " + in.file("dk.npy") +
                                       " --dv " + in.file("dv.npy"),
                                   in.tmp.path);
    INFO("stderr: " << r.err);
    check_refused(r);
    CHECK(r.err.find("backend = " + backend + ": has no backward pass") != std::string::npos);
    CHECK_FALSE(fs::exists(in.file("o.npy")));
}

TEST_CASE("flashattn run: gradient outputs that cannot be written are refused before computing") {
    const Inputs in;
    const fs::path dir = in.tmp.path;
    const std::string dO = in.array("do.npy", {2, 3, 5, 8});
    fs::create_directories(dir / "dq_dir.npy");
    const std::string io = "run --backend standard" + in.io + " --dout " + dO;
    const auto with = [&](const std::string& dq, const std::string& dk) {
        return io + " --out " + in.file("o.npy") + " --dq " + dq + " --dk " + dk + " --dv " +
               in.file("dv.npy");
    };
    const std::vector<std::string> bad = {
        with((dir / "no_such_dir" / "dq.npy").string(), in.file("dk.npy")),
        with((dir / "dq_dir.npy").string(), in.file("dk.npy")),
        with(in.file("dk.npy"), in.file("dk.npy")),  // dQ and dK one file
        with(in.file("o.npy"), in.file("dk.npy")),   // dQ and O one file
    };
    for (const std::string& args : bad) {
        const Result r = flashattn_cli(args, dir);
        INFO("flashattn " << args << "\nstderr: " << r.err);
        check_refused(r);
        for (const char* name : {"o.npy", "dq.npy", "dk.npy", "dv.npy"})
            CHECK_FALSE(fs::exists(dir / name));
        CHECK(fs::is_directory(dir / "dq_dir.npy"));
        check_no_temporaries(dir);
    }
    // Probed before anything is read or computed: with a missing input, the error is about --dq.
    const Result r = flashattn_cli(
        "run --backend standard --q " + in.file("absent.npy") + " --k " + in.k + " --v " + in.k +
            " --out " + in.file("o.npy") + " --dout " + dO + " --dq " +
            (dir / "no_such_dir" / "dq.npy").string() + " --dk " + in.file("dk.npy") + " --dv " +
            in.file("dv.npy"),
        dir);
    INFO("stderr: " << r.err);
    check_refused(r);
    CHECK(r.err.find("no_such_dir") != std::string::npos);
    check_no_temporaries(dir);
}

// --- Output files: an output never replaces an input; links; long names; modes ------------------

namespace {

// Every input and output option of a backward run with a block mask: q (2,3,5,8), k = v
// (2,1,7,8), dO (2,3,5,8), a (3,3) mask over blocks of 2 x 3. `outputs` maps each output option
// to its path; the missing ones get fresh names in `dir`.
struct FullRun {
    const Inputs& in;
    std::string mask, dout, v;
    explicit FullRun(const Inputs& inputs) : in(inputs) {
        mask = in.raw("mask.npy", npy_file(npy_dict("|u1", "(3, 3)"), 1, 0) + std::string(9, '\x01'));
        dout = in.array("dout.npy", {2, 3, 5, 8});
        v = in.array("v.npy", {2, 1, 7, 8});
    }
    // The inputs, option -> path.
    std::vector<std::pair<std::string, std::string>> inputs() const {
        return {{"--q", in.q}, {"--k", in.k}, {"--v", v}, {"--dout", dout}, {"--block-mask", mask}};
    }
    std::string command(const std::string& option, const std::string& path) const {
        std::string c = "run --backend standard --block-q 2 --block-kv 3";
        for (const auto& [o, p] : inputs()) c += " " + o + " " + p;
        for (const std::string& o : kAllOutputs)
            c += " " + o + " " + (o == option ? path : in.file("fresh_" + o.substr(2) + ".npy"));
        return c;
    }
};

// Refused, with both options named, every input byte-identical and no output created.
void check_output_is_input(const FullRun& run, const std::string& output, const std::string& path,
                           const std::string& input, const fs::path& cwd = {}) {
    std::vector<std::string> before;
    for (const auto& [o, p] : run.inputs()) before.push_back(read_file(p));
    const std::string command = run.command(output, path);
    const Result r = flashattn_cli(command, run.in.tmp.path, cwd);
    INFO("flashattn " << command << "\n(in " << cwd << ")\nstderr: " << r.err);
    check_refused(r);
    CHECK(r.err.find(output + " ") != std::string::npos);
    CHECK(r.err.find(input + " ") != std::string::npos);
    CHECK(r.err.find("same file") != std::string::npos);
    std::size_t i = 0;
    for (const auto& [o, p] : run.inputs()) {
        INFO("input " << o);
        CHECK(read_file(p) == before[i++]);
    }
    for (const std::string& o : kAllOutputs)
        CHECK_FALSE(fs::exists(run.in.file("fresh_" + o.substr(2) + ".npy")));
    check_no_temporaries(run.in.tmp.path);
}

}  // namespace

TEST_CASE("flashattn run: an output that names an input is refused, however it is spelled") {
    const Inputs in;
    const FullRun run(in);
    const fs::path dir = in.tmp.path;
    fs::create_directories(dir / "sub");
    fs::create_directory_symlink(dir, dir / "sub" / "up");  // a directory reached by a link
    // The inputs as written: the run itself must succeed.
    const Result ok = flashattn_cli(run.command("", ""), dir);
    INFO("stderr: " << ok.err);
    REQUIRE(ok.status == 0);
    for (const std::string& o : kAllOutputs) fs::remove(in.file("fresh_" + o.substr(2) + ".npy"));

    for (const auto& [input, path] : run.inputs()) {
        const std::string name = fs::path(path).filename().string();
        // Links made fresh for this input: hard, symbolic, symbolic to a symbolic link, relative.
        const fs::path hard = dir / ("hard_" + name), sym = dir / ("sym_" + name),
                       sym2 = dir / ("sym2_" + name), rel = dir / "sub" / ("rel_" + name);
        for (const fs::path& p : {hard, sym, sym2, rel}) fs::remove(p);
        fs::create_hard_link(path, hard);
        fs::create_symlink(path, sym);
        fs::create_symlink(sym, sym2);
        fs::create_symlink("../" + name, rel);
        const std::vector<std::string> spellings = {
            path,
            (dir / "." / name).string(),
            (dir / "sub" / ".." / name).string(),
            (dir / "sub" / "up" / name).string(),
            dir.string() + "//" + name,
            hard.string(),
            sym.string(),
            sym2.string(),
            rel.string(),
        };
        for (const std::string& output : kAllOutputs) {
            for (const std::string& spelling : spellings)
                check_output_is_input(run, output, spelling, input);
            // Relative paths, from the inputs' directory and from below it.
            check_output_is_input(run, output, name, input, dir);
            check_output_is_input(run, output, "./" + name, input, dir);
            check_output_is_input(run, output, "../" + name, input, dir / "sub");
        }
    }
}

TEST_CASE("flashattn run: two outputs that are one file are refused, however spelled") {
    const Inputs in;
    const fs::path dir = in.tmp.path;
    const std::string dO = in.array("do.npy", {2, 3, 5, 8});
    const std::string run = "run --backend standard" + in.io + " --dout " + dO;
    fs::create_directories(dir / "sub");
    write_file(dir / "existing.npy", "keep");
    fs::create_hard_link(dir / "existing.npy", dir / "hard.npy");
    fs::create_symlink(dir / "existing.npy", dir / "sym.npy");
    fs::create_symlink(dir / "fresh.npy", dir / "dangling.npy");
    // (first output, second output): an existing file, and a name not created yet.
    const std::vector<std::pair<std::string, std::string>> pairs = {
        {in.file("existing.npy"), in.file("hard.npy")},
        {in.file("existing.npy"), in.file("sym.npy")},
        {in.file("sym.npy"), in.file("hard.npy")},
        {in.file("fresh.npy"), (dir / "sub" / ".." / "fresh.npy").string()},
        {in.file("fresh.npy"), dir.string() + "/./fresh.npy"},
    };
    const std::vector<std::pair<std::string, std::string>> options = {
        {"--out", "--lse"}, {"--out", "--dv"}, {"--dq", "--dk"}, {"--lse", "--dq"}};
    for (const auto& [first, second] : pairs)
        for (const auto& [a, b] : options) {
            std::string command = run;
            for (const std::string& o : kAllOutputs)
                command += " " + o + " " +
                           (o == a ? first : o == b ? second : in.file("f" + o.substr(2) + ".npy"));
            const Result r = flashattn_cli(command, dir);
            INFO("flashattn " << command << "\nstderr: " << r.err);
            check_refused(r);
            CHECK(r.err.find(a + " ") != std::string::npos);
            CHECK(r.err.find(b + " ") != std::string::npos);
            CHECK(read_file(dir / "existing.npy") == "keep");
            CHECK_FALSE(fs::exists(dir / "fresh.npy"));
            for (const std::string& o : kAllOutputs)
                CHECK_FALSE(fs::exists(in.file("f" + o.substr(2) + ".npy")));
            check_no_temporaries(dir);
        }
}

TEST_CASE("flashattn run: an output that is a symbolic link is written through to its target") {
    const Inputs in;
    const fs::path dir = in.tmp.path;
    fs::create_directories(dir / "elsewhere");
    const fs::path target = dir / "elsewhere" / "o.npy", link = dir / "o_link.npy";
    const fs::path link2 = dir / "o_link2.npy";  // a link to the link
    write_file(target, "old");
    const fs::perms mode = fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read;
    fs::permissions(target, mode);
    fs::create_symlink("elsewhere/o.npy", link);  // relative: resolved from the link's directory
    fs::create_symlink(link, link2);
    for (const fs::path& out : {link, link2}) {
        write_file(target, "old");
        const Result r = flashattn_cli("run --backend scalar" + in.io + " --out " + out.string(), dir);
        INFO("--out " << out << "\nstderr: " << r.err);
        REQUIRE(r.status == 0);
        CHECK(fs::is_symlink(link));  // the link stays a link...
        CHECK(fs::read_symlink(link) == "elsewhere/o.npy");
        CHECK(fs::is_symlink(link2));
        CHECK(npy::load(target.string()).shape == std::vector<std::int64_t>{2, 3, 5, 8});  // ...
        CHECK(mode_of(target) == mode);  // and its target is replaced, keeping its mode
        check_no_temporaries(dir);
    }
}

TEST_CASE("flashattn run: links to nothing, to directories and in loops are refused as outputs") {
    const Inputs in;
    const fs::path dir = in.tmp.path;
    fs::create_directories(dir / "a_dir");
    fs::create_symlink(dir / "missing" / "o.npy", dir / "dangling.npy");
    fs::create_symlink(dir / "no_such.npy", dir / "dangling_here.npy");
    fs::create_symlink(dir / "a_dir", dir / "dir_link.npy");
    fs::create_symlink(dir / "loop_b.npy", dir / "loop_a.npy");
    fs::create_symlink(dir / "loop_a.npy", dir / "loop_b.npy");
    fs::create_symlink("/dev/null", dir / "null_link.npy");
    for (const char* name : {"dangling.npy", "dangling_here.npy", "dir_link.npy", "loop_a.npy",
                             "null_link.npy", "dir_link.npy/"}) {
        const Result r =
            flashattn_cli("run --backend scalar" + in.io + " --out " + in.file(name), dir);
        INFO("--out " << name << "\nstderr: " << r.err);
        check_refused(r);
        CHECK(r.err.find("--out") != std::string::npos);
        CHECK_FALSE(fs::exists(dir / "no_such.npy"));
        CHECK_FALSE(fs::exists(dir / "missing"));
        CHECK(fs::is_empty(dir / "a_dir"));
        std::string link = name;
        if (link.back() == '/') link.pop_back();
        CHECK(fs::is_symlink(dir / link));
        check_no_temporaries(dir);
    }
}

TEST_CASE("flashattn run: output names of up to 255 bytes work, and 256 is a clean refusal") {
    const Inputs in;
    const fs::path dir = in.tmp.path;
    for (std::size_t length : {250, 254, 255}) {
        const std::string name = std::string(length - 4, 'o') + ".npy";
        const std::string lse = std::string(length - 4, 'l') + ".npy";
        write_file(dir / lse, "old");  // one replaced, one created
        const Result r = flashattn_cli(
            "run --backend scalar" + in.io + " --out " + in.file(name) + " --lse " + in.file(lse),
            dir);
        INFO("length " << length << "\nstderr: " << r.err);
        REQUIRE(r.status == 0);
        CHECK(npy::load(in.file(name)).shape == std::vector<std::int64_t>{2, 3, 5, 8});
        CHECK(npy::load(in.file(lse)).shape == std::vector<std::int64_t>{2, 3, 5});
        check_no_temporaries(dir);
    }
    // One byte too long for the file system (NAME_MAX = 255): refused, nothing written.
    const std::string too_long = std::string(252, 'x') + ".npy";
    check_refused_with_outputs("run --backend scalar" + in.io + " --dq " + in.file(too_long),
                               dir);  // half a backward: refused before the name matters
    const Result r =
        flashattn_cli("run --backend scalar" + in.io + " --out " + in.file(too_long), dir);
    INFO("stderr: " << r.err);
    check_refused(r);
    CHECK(r.err.find("--out") != std::string::npos);
    check_no_temporaries(dir);
}

TEST_CASE("flashattn run: odd output paths are refused and change nothing") {
    const Inputs in;
    const fs::path dir = in.tmp.path;
    fs::create_directories(dir / "sub");
    struct Case {
        std::string out;
        fs::path cwd;
        const char* why;
    };
    std::vector<Case> cases = {
        {".", dir, "the current directory"},
        {"..", dir / "sub", "the parent directory"},
        {"/", {}, "the root directory"},
        {"sub/", dir, "a directory, with a slash"},
        {"fresh.npy/", dir, "a file name with a trailing slash"},
        {in.file("sub") + "/.", {}, "a directory's '.'"},
        {"/dev/null", {}, "a device"},
        {"/dev/full", {}, "a device that is always full"},
        {"' '", dir, "a name that is one space: fine as a name, but --lse is a directory"},
        {in.file("k.npy") + "/o.npy", {}, "a file used as a directory"},
    };
    for (const Case& c : cases) {
        std::string args = "run --backend scalar" + in.io + " --out " + c.out;
        if (c.out == "' '") args += " --lse sub";
        const Result r = flashattn_cli(args, dir, c.cwd);
        INFO(c.why << ": flashattn " << args << "\nstderr: " << r.err);
        check_refused(r);
        CHECK_FALSE(fs::exists(dir / "fresh.npy"));
        CHECK_FALSE(fs::exists(dir / " "));
        CHECK(fs::is_directory(dir / "sub"));
        check_no_temporaries(dir);
    }
}

TEST_CASE("flashattn run: read-only outputs and directories are refused (for users other than root)") {
    if (::geteuid() == 0) {
        WARN("running as root: permissions do not stop root, nothing to refuse");
        return;
    }
    const Inputs in;
    const fs::path dir = in.tmp.path;
    write_file(dir / "locked.npy", "keep");
    fs::permissions(dir / "locked.npy", fs::perms::owner_read);
    fs::create_directories(dir / "readonly");
    fs::permissions(dir / "readonly", fs::perms::owner_read | fs::perms::owner_exec);
    for (const std::string& out : {in.file("locked.npy"), in.file("readonly") + "/o.npy"}) {
        const Result r = flashattn_cli("run --backend scalar" + in.io + " --out " + out, dir);
        INFO("--out " << out << "\nstderr: " << r.err);
        check_refused(r);
        CHECK(read_file(dir / "locked.npy") == "keep");
        CHECK(fs::is_empty(dir / "readonly"));
    }
    fs::permissions(dir / "locked.npy", fs::perms::owner_all);
}

TEST_CASE("flashattn: messages show the values as given, and name what is wrong") {
    const Inputs in;
    const fs::path dir = in.tmp.path;
    const std::string run = "run --backend scalar" + in.io + " --out " + in.file("o.npy");
    struct Case {
        std::string args, says;
    };
    const std::vector<Case> cases = {
        {run + " --scale 1e39", "scale = 1e39"},
        {run + " --scale -3.5e38", "scale = -3.5e38"},
        {run + " --scale 1e-50", "scale = 1e-50"},
        {run + " --scale 1e400", "scale = 1e400"},
        {run + " --scale 0x1p200", "scale = 0x1p200"},
        {run + " --block-q 18446744073709551617 --block-kv 2", "18446744073709551617"},
        {run + " --block-q 9223372036854775808 --block-kv 2", "9223372036854775808"},
        {run + " --block-q 2 --block-kv -9223372036854775809", "-9223372036854775809"},
        {run + " --sram-bytes 1e20", "1e20"},
        {run + " --block-q 0x10 --block-kv 2", "0x10"},
        {run + " --mask-block-q 1.5 --mask-block-kv 2 --block-mask " + in.q, "1.5"},
        {"demo --batch 1e20", "1e20"},
        {"demo --seq 99999999999999999999", "99999999999999999999"},
        {"demo --seed -1", "-1"},
        {"demo --repeat 4294967297", "4294967297"},
        {"bench --backends scalar --batch 1e20 --heads 1 --seq 4 --dim 4", "1e20"},
        {"nosuchcommand", "'nosuchcommand'"},
        {"rnu --backend scalar", "'rnu'"},
    };
    for (const Case& c : cases) {
        const Result r = flashattn_cli(c.args, dir);
        INFO("flashattn " << c.args << "\nstderr: " << r.err);
        check_refused(r);
        CHECK(r.err.find(c.says) != std::string::npos);
        CHECK_FALSE(fs::exists(dir / "o.npy"));
    }
    // A Q of the wrong rank is Q's fault, whatever K and V are; a V unlike K is V's.
    for (const std::vector<std::int64_t>& shape :
         std::vector<std::vector<std::int64_t>>{{8}, {5, 8, 1, 1, 1}, {3, 5, 8}, {}}) {
        const std::string q = in.array("q_rank.npy", shape);
        const Result r = flashattn_cli("run --backend scalar --q " + q + " --k " + in.k + " --v " +
                                           in.k + " --out " + in.file("o.npy"),
                                       dir);
        INFO("Q of rank " << shape.size() << ", stderr: " << r.err);
        check_refused(r);
        CHECK(r.err.rfind("error: --q shape", 0) == 0);
    }
    const std::string k3 = in.array("k_rank.npy", {2, 7, 8});
    Result r = flashattn_cli(
        "run --backend scalar --q " + in.q + " --k " + k3 + " --v " + k3 + " --out " + in.file("o.npy"),
        dir);
    INFO("stderr: " << r.err);
    CHECK(r.err.rfind("error: --k shape", 0) == 0);
    r = flashattn_cli("run --backend scalar --q " + in.q + " --k " + in.k + " --v " + k3 +
                          " --out " + in.file("o.npy"),
                      dir);
    INFO("stderr: " << r.err);
    CHECK(r.err.rfind("error: --v shape", 0) == 0);
    // Values that fit are read as written: a leading zero is decimal, not octal.
    r = flashattn_cli(run + " --sram-bytes 0400", dir);  // octal 0400 would be 256 bytes
    INFO("stderr: " << r.err);
    CHECK(r.status == 0);
    CHECK(r.err.find("M = 100 floats") != std::string::npos);
    r = flashattn_cli(run + " --block-q +02 --block-kv 003", dir);
    INFO("stderr: " << r.err);
    CHECK(r.status == 0);
    CHECK(r.err.find("Br = 2, Bc = 3") != std::string::npos);
}
