// examples/flashattn/npy.hpp — a strict reader and a writer for NumPy .npy files (the files
// themselves are written by output_files.hpp).
//
// Only what the command line needs, and nothing it does not: little-endian float32 ('<f4') for
// tensors, uint8 ('|u1') and bool ('|b1') for block masks, C order, format versions 1.0–3.0.
// Every malformed file is a std::invalid_argument naming the file and the problem, and the file's
// size is checked against the header's shape before anything is allocated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashattn::npy {

enum class ElementType { float32, uint8, boolean };

struct Array {
    ElementType type = ElementType::float32;
    std::vector<std::int64_t> shape;
    std::vector<float> floats;        // filled for float32
    std::vector<std::uint8_t> bytes;  // filled for uint8 and bool
    std::int64_t size() const;        // product of shape (1 for a scalar)
};

// Parses a whole .npy file held in memory; `name` is used in error messages.
Array parse(const std::string& contents, const std::string& name);
// Reads and parses a file. Throws std::invalid_argument (malformed) or std::runtime_error (I/O).
Array load(const std::string& path);
// Requires a float32 array; `what` names the option in error messages ("--q").
Array load_float32(const std::string& path, const std::string& what);

// The bytes of a version 1.0 .npy file holding float32 values of that shape.
std::string serialize_float32(const std::vector<std::int64_t>& shape, const float* values);

}  // namespace flashattn::npy
