// tests/npy_files.hpp — hand-made .npy files for the reader and command-line tests: any header
// dict, any format version, any payload length, so a test can say exactly how a file is broken.
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace flashattn::test {

// A .npy file with this header dict, padded as numpy pads it, then `payload` zero bytes.
inline std::string npy_file(const std::string& dict, int major = 1, std::size_t payload = 0) {
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

// The header dict numpy writes for a C-order array of this dtype and shape, e.g. "(2, 3)".
inline std::string npy_dict(const std::string& descr, const std::string& shape,
                            const std::string& fortran = "False") {
    return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace flashattn::test
