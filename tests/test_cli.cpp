// tests/test_cli.cpp — the command-line contract of docs/design.md: `run` writes correct outputs, and
// any bad input gives exit status 2, a message starting "error:", and no output created or changed
// (a long list of bad inputs, hostile files, and output paths that cannot be written).
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

Result flashattn_cli(const std::string& args, const fs::path& dir) {
    const fs::path err_file = dir / "stderr.txt";
    const std::string cmd =
        std::string(FLASHATTN_EXE) + " " + args + " 2> " + err_file.string() + " > /dev/null";
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

// What a refused command must leave behind: no temporary file anywhere in `dir`.
void check_no_temporaries(const fs::path& dir) {
    for (const auto& entry : fs::recursive_directory_iterator(dir))
        CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
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

TEST_CASE("flashattn: bad options give exit 2, 'error:' and leave outputs untouched") {
    const Inputs in;
    const std::string& io = in.io;
    const std::vector<std::string> bad = {
        "run --backend nosuch" + io,
        "run --backend scalar" + io + " --scale inf",
        "run --backend scalar" + io + " --scale nan",
        "run --backend scalar" + io + " --scale 1e39",  // finite as a double, inf as a float
        "run --backend scalar" + io + " --scale abc",
        "run --backend scalar" + io + " --block-q 0 --block-kv 4",
        "run --backend scalar" + io + " --block-q -1 --block-kv 4",
        "run --backend scalar" + io + " --block-q 4",
        "run --backend scalar" + io + " --sram-bytes 8",
        "run --backend scalar" + io + " --sram-bytes -4096",
        "run --backend scalar" + io + " --sram-bytes 4096 --block-q 2 --block-kv 2",
        "run --backend scalar" + io + " --dtype f64",
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

TEST_CASE("flashattn run: a successful run replaces existing outputs whole, with the usual mode") {
    const Inputs in;
    const fs::path out = in.tmp.path / "o.npy", lse = in.tmp.path / "l.npy";
    write_file(out, std::string(100000, 'x'));  // longer than the new file: no stale tail
    write_file(lse, "old");
    const mode_t old_mask = ::umask(022);
    const Result r = flashattn_cli(
        "run --backend scalar" + in.io + " --out " + out.string() + " --lse " + lse.string(),
        in.tmp.path);
    ::umask(old_mask);
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(npy::load(out.string()).shape == std::vector<std::int64_t>{2, 3, 5, 8});
    CHECK(npy::load(lse.string()).shape == std::vector<std::int64_t>{2, 3, 5});
    CHECK((fs::status(out).permissions() & fs::perms::all) ==
          (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
           fs::perms::others_read));
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
