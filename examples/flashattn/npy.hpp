// examples/flashattn/npy.hpp — a strict reader and an atomic writer for NumPy .npy files.
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

// Writes files so that either all of them appear complete or none changes: every file is first
// written to a temporary file in its target directory, and renamed over its target only after
// all temporary files are written. On any failure the temporary files are removed.
//
// Before writing anything, commit() refuses targets that are empty paths, existing directories
// or devices, or the same file named twice (std::invalid_argument), so that the renames, which
// run one after another, cannot fail half-way for any reason short of the directory changing
// under us.
class AtomicWriter {
public:
    void add(const std::string& path, std::string contents);
    void commit();  // throws std::runtime_error naming the path that failed

    // Checks, before any work is done, that commit() could write each path: not a directory or a
    // device, no path given twice, and a temporary file can be created beside it (created and
    // removed at once; the path itself is not touched). Throws std::invalid_argument naming the
    // path and the reason.
    static void probe(const std::vector<std::string>& paths);

private:
    void check_targets() const;

    std::vector<std::pair<std::string, std::string>> files_;
};

}  // namespace flashattn::npy
