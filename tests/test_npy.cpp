// tests/test_npy.cpp — the .npy reader accepts what numpy writes and rejects everything else,
// with a clear message and without allocating what a hostile header claims.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "catch.hpp"
#include "npy.hpp"
#include "npy_files.hpp"

using namespace flashattn;
using test::npy_dict;
using test::npy_file;
namespace fs = std::filesystem;

namespace {

const std::string kGood = npy_dict("<f4", "(2, 3)");

void rejects(const std::string& bytes, const std::string& fragment) {
    INFO("expecting an error containing: " << fragment);
    CHECK_THROWS_AS(npy::parse(bytes, "bad.npy"), std::invalid_argument);
    CHECK_THROWS_WITH(npy::parse(bytes, "bad.npy"), Catch::Contains(fragment));
}

struct TempDir {
    fs::path path;
    TempDir() {
        path = fs::temp_directory_path() / ("flashattn_npy_" + std::to_string(::getpid()));
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("npy round trip of float32 arrays, versions 1 to 3") {
    const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
    const std::string bytes = npy::serialize_float32({2, 3}, values.data());
    const npy::Array a = npy::parse(bytes, "x.npy");
    CHECK(a.shape == std::vector<std::int64_t>{2, 3});
    CHECK(a.floats == values);
    CHECK((bytes.size() - 24) % 64 == 0);  // header padded to a multiple of 64 bytes
    for (int version : {2, 3}) {
        const npy::Array v = npy::parse(npy_file(kGood, version, 24), "v.npy");
        CHECK(v.shape == std::vector<std::int64_t>{2, 3});
        CHECK(v.floats.size() == 6);
    }
    const npy::Array mask = npy::parse(npy_file(npy_dict("|b1", "(3,)"), 1, 3), "m");
    CHECK(mask.type == npy::ElementType::boolean);
    CHECK(mask.bytes.size() == 3);
    const npy::Array u8 = npy::parse(npy_file(npy_dict("|u1", "(2, 2)"), 1, 4), "m");
    CHECK(u8.type == npy::ElementType::uint8);
    // Empty and scalar arrays are well-formed files (the command line rejects their shapes).
    CHECK(npy::parse(npy_file(npy_dict("<f4", "(0, 5)")), "e").size() == 0);
    CHECK(npy::parse(npy_file(npy_dict("<f4", "()"), 1, 4), "s").size() == 1);
    // Python 2's long suffix and double quotes, as old numpy wrote them.
    CHECK(npy::parse(npy_file("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2L, 3L)}",
                              1, 24),
                     "p")
              .shape == std::vector<std::int64_t>{2, 3});
}

TEST_CASE("npy reader rejects a wrong magic string, version or header length") {
    rejects("", "magic");
    rejects("\x93NUM", "magic");
    rejects("NUMPY\x01\x00", "magic");
    rejects(std::string("\x93NUMPX\x01\x00\x10\x00", 10) + std::string(16, ' '), "magic");
    rejects(std::string("\x93NUMPY", 6), "ends inside");
    rejects(std::string("\x93NUMPY\x01\x00\x10", 9), "ends inside");
    rejects(std::string("\x93NUMPY\x02\x00\x10\x00", 10), "ends inside the header length");
    for (auto [major, minor] :
         std::vector<std::pair<int, int>>{{0, 0}, {1, 1}, {4, 0}, {255, 255}}) {
        std::string v = npy_file(kGood, 1, 24);
        v[6] = char(major), v[7] = char(minor);
        rejects(
            v, "unsupported format version " + std::to_string(major) + "." + std::to_string(minor));
    }
    std::string long_header = npy_file(kGood, 1, 24);
    long_header[8] = char(0xFF), long_header[9] = char(0x7F);
    rejects(long_header, "past the end");
    std::string v2_long = npy_file(kGood, 2, 24);
    v2_long[8] = v2_long[9] = v2_long[10] = v2_long[11] = char(0xFF);  // 4 GiB header
    rejects(v2_long, "more than the 65536 bytes");
    std::string v3_past = npy_file(kGood, 3, 24);
    v3_past[8] = char(0xE8), v3_past[9] = char(0x03);  // 1000 bytes: past the end of the file
    rejects(v3_past, "past the end");
}

TEST_CASE("npy reader rejects dtypes other than float32, uint8 and bool, and Fortran order") {
    for (const char* descr : {"<f8", ">f4", "<i4", "<i8", "<u4", "<f2", "|O", "<c8", "|S4", "f4"})
        rejects(npy_file(npy_dict(descr, "(2, 3)"), 1, 48), "dtype '" + std::string(descr) + "'");
    rejects(npy_file(npy_dict("<f4", "(2, 3)", "True"), 1, 24), "Fortran");
    rejects(npy_file(npy_dict("|b1", "(2,)"), 1, 0) + "\x01\x07", "bool");
}

TEST_CASE("npy reader rejects shapes that overflow or claim more bytes than the file holds") {
    rejects(npy_file(npy_dict("<f4", "(4294967296, 4294967296)"), 1, 8), "too large");
    rejects(npy_file(npy_dict("<f4", "(1048576, 1048576, 1048576)"), 1, 8), "too large");
    rejects(npy_file(npy_dict("<f4", "(99999999999999999999,)"), 1, 8), "too large");
    rejects(npy_file(npy_dict("<f4", "(1000000000,)"), 1, 8), "needs 4000000000 data bytes");
    rejects(npy_file(kGood, 1, 20), "data bytes");  // short file
    rejects(npy_file(kGood, 1, 28), "data bytes");  // trailing bytes
    rejects(npy_file(npy_dict("<f4", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), 1, 4), "more than 8");
}

TEST_CASE("npy reader rejects malformed header dicts") {
    rejects(npy_file(npy_dict("<f4", "(2, -3)"), 1, 24), "shape");
    rejects(npy_file(npy_dict("<f4", "(2, 3.0)"), 1, 24), "shape");
    rejects(npy_file(npy_dict("<f4", "[2, 3]"), 1, 24), "expected '('");
    rejects(npy_file("{'descr': '<f4', 'shape': (2, 3), }", 1, 24), "lacks");
    rejects(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 1, 24),
            "key");
    rejects(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 1, 24), "shape");
    rejects(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'descr': '<f8'}", 1,
                     24),
            "twice");
    rejects(npy_file("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }", 1, 24),
            "header");
    rejects(npy_file("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", 1, 24),
            "True or False");
    rejects(npy_file("'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", 1, 24),
            "expected '{'");
    rejects(npy_file(kGood + " junk", 1, 24), "trailing");
    std::string with_nul = "{'descr': '<f4'";
    with_nul += '\0';
    rejects(npy_file(with_nul + ", 'fortran_order': False, 'shape': (2, 3), }", 1, 24), "header");
}

TEST_CASE("npy load checks the file before reading it") {
    TempDir tmp;
    const fs::path dir = tmp.path / "a_directory.npy";
    fs::create_directories(dir);
    CHECK_THROWS_WITH(npy::load(dir.string()), Catch::Contains("not a regular file"));
    CHECK_THROWS_WITH(npy::load((tmp.path / "missing.npy").string()),
                      Catch::Contains("cannot open"));
    const fs::path fifo = tmp.path / "fifo.npy";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK_THROWS_WITH(npy::load(fifo.string()), Catch::Contains("not a regular file"));  // no hang
    const fs::path empty = tmp.path / "empty.npy";
    test::write_file(empty, "");
    CHECK_THROWS_WITH(npy::load(empty.string()), Catch::Contains("magic"));
    // A 200-byte file whose header claims 2^38 floats (1 TiB): refused from the header and the
    // file size alone. (Under AddressSanitizer, an attempt to allocate it would abort the test.)
    const fs::path liar = tmp.path / "liar.npy";
    test::write_file(liar, npy_file(npy_dict("<f4", "(262144, 1048576)"), 1, 64));
    CHECK_THROWS_WITH(npy::load(liar.string()), Catch::Contains("needs 1099511627776 data bytes"));
    // And what is well-formed loads, float32 and masks.
    const std::vector<float> values = {0.5f, -1.0f, 2.0f};
    const fs::path good = tmp.path / "good.npy";
    test::write_file(good, npy::serialize_float32({3, 1}, values.data()));
    CHECK(npy::load_float32(good.string(), "--q").floats == values);
    const fs::path mask = tmp.path / "mask.npy";
    test::write_file(mask, npy_file(npy_dict("|b1", "(1, 2)"), 1, 0) + std::string("\x01\x00", 2));
    CHECK(npy::load(mask.string()).bytes == std::vector<std::uint8_t>{1, 0});
    CHECK_THROWS_WITH(npy::load_float32(mask.string(), "--q"), Catch::Contains("--q"));
}
