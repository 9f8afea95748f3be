// tests/test_npy.cpp — the .npy reader accepts what numpy writes and rejects everything else.
#include <cstring>

#include "catch.hpp"
#include "npy.hpp"

using namespace flashattn;

namespace {

std::string header_file(const std::string& dict, int major = 1, std::size_t payload = 0) {
    std::string h = dict;
    const std::size_t prefix = major == 1 ? 10 : 12;
    while ((prefix + h.size() + 1) % 64) h += ' ';
    h += '\n';
    std::string out = "\x93NUMPY";
    out += char(major);
    out += '\0';
    if (major == 1) {
        out += char(h.size() & 0xFF);
        out += char(h.size() >> 8);
    } else {
        for (int i = 0; i < 4; ++i) out += char((h.size() >> (8 * i)) & 0xFF);
    }
    return out + h + std::string(payload, '\0');
}

}  // namespace

TEST_CASE("npy round trip of float32 arrays, versions 1 to 3") {
    const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
    const std::string bytes = npy::serialize_float32({2, 3}, values.data());
    const npy::Array a = npy::parse(bytes, "x.npy");
    CHECK(a.shape == std::vector<std::int64_t>{2, 3});
    CHECK(a.floats == values);
    CHECK((bytes.size() - 24) % 64 == 0);  // header padded to a multiple of 64 bytes
    const npy::Array v2 = npy::parse(
        header_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 2, 24), "v2.npy");
    CHECK(v2.shape == std::vector<std::int64_t>{2, 3});
    const npy::Array mask =
        npy::parse(header_file("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", 1, 3), "m");
    CHECK(mask.type == npy::ElementType::boolean);
    CHECK(mask.bytes.size() == 3);
}

TEST_CASE("npy reader rejects malformed files with a clear error") {
    const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    const auto rejects = [](const std::string& bytes, const std::string& fragment) {
        INFO("expecting an error containing: " << fragment);
        CHECK_THROWS_WITH(npy::parse(bytes, "bad.npy"), Catch::Contains(fragment));
    };
    rejects("", "magic");
    rejects("NUMPY\x01\x00", "magic");
    rejects(std::string("\x93NUMPX\x01\x00\x10\x00", 10) + std::string(16, ' '), "magic");
    std::string v4 = header_file(good, 1, 24);
    v4[6] = 4;
    rejects(v4, "version");
    std::string long_header = header_file(good, 1, 24);
    long_header[8] = char(0xFF), long_header[9] = char(0x7F);
    rejects(long_header, "past the end");
    rejects(header_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 1, 48), "dtype");
    rejects(header_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 1, 24), "dtype");
    rejects(header_file("{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", 1, 24), "dtype");
    rejects(header_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 1, 24), "Fortran");
    rejects(header_file(good, 1, 20), "data bytes");   // short file
    rejects(header_file(good, 1, 28), "data bytes");   // trailing bytes
    rejects(header_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", 1, 8),
            "too large");
    rejects(header_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 1, 8),
            "too large");
    rejects(header_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", 1, 24), "shape");
    rejects(header_file("{'descr': '<f4', 'shape': (2, 3), }", 1, 24), "lacks");
    rejects(header_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 1, 24), "key");
    rejects(header_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 1, 24), "shape");
    rejects(header_file("{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", 1, 0) + "\x01\x07", "bool");
}
