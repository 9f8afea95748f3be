// examples/flashattn/npy.cpp — see npy.hpp. Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#include "npy.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>

namespace flashattn::npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;
// More elements than any file we accept could hold; keeps shape products far from overflow.
constexpr std::int64_t kMaxElements = std::int64_t{1} << 40;
// The longest header we read (numpy's own reader refuses headers over 10000 bytes by default; a
// plain array's header is under 128 bytes).
constexpr std::size_t kMaxHeaderBytes = 65536;

[[noreturn]] void fail(const std::string& name, const std::string& why) {
    throw std::invalid_argument(name + ": not a valid .npy file for flashattn: " + why);
}

// A tiny cursor over the header's Python-literal dict: {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), }
class HeaderParser {
public:
    HeaderParser(std::string text, std::string name) : s_(std::move(text)), name_(std::move(name)) {}

    void parse(std::string& descr, bool& fortran, std::vector<std::int64_t>& shape) {
        bool have_descr = false, have_fortran = false, have_shape = false;
        expect('{');
        while (true) {
            skip_space();
            if (peek() == '}') { ++pos_; break; }
            const std::string key = quoted();
            expect(':');
            if ((key == "descr" && have_descr) || (key == "fortran_order" && have_fortran) ||
                (key == "shape" && have_shape))
                fail(name_, "header key '" + key + "' appears twice");
            if (key == "descr") {
                descr = quoted();
                have_descr = true;
            } else if (key == "fortran_order") {
                fortran = boolean();
                have_fortran = true;
            } else if (key == "shape") {
                shape = tuple();
                have_shape = true;
            } else {
                fail(name_, "unexpected header key '" + key + "'");
            }
            skip_space();
            if (peek() == ',') { ++pos_; continue; }
            expect('}');
            break;
        }
        skip_space();
        if (pos_ != s_.size()) fail(name_, "trailing characters after the header dict");
        if (!have_descr || !have_fortran || !have_shape)
            fail(name_, "header lacks one of 'descr', 'fortran_order', 'shape'");
    }

private:
    char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
    void skip_space() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
    }
    void expect(char c) {
        skip_space();
        if (peek() != c) fail(name_, std::string("malformed header, expected '") + c + "'");
        ++pos_;
    }
    std::string quoted() {
        skip_space();
        const char q = peek();
        if (q != '\'' && q != '"') fail(name_, "malformed header, expected a quoted string");
        const std::size_t end = s_.find(q, pos_ + 1);
        if (end == std::string::npos) fail(name_, "malformed header, unterminated string");
        std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
        pos_ = end + 1;
        return out;
    }
    bool boolean() {
        skip_space();
        if (s_.compare(pos_, 4, "True") == 0) { pos_ += 4; return true; }
        if (s_.compare(pos_, 5, "False") == 0) { pos_ += 5; return false; }
        fail(name_, "malformed header, fortran_order must be True or False");
    }
    std::vector<std::int64_t> tuple() {
        std::vector<std::int64_t> dims;
        expect('(');
        while (true) {
            skip_space();
            if (peek() == ')') { ++pos_; break; }
            if (peek() < '0' || peek() > '9') fail(name_, "malformed shape, expected a dimension");
            std::int64_t v = 0;
            while (peek() >= '0' && peek() <= '9') {
                v = v * 10 + (peek() - '0');
                if (v > kMaxElements) fail(name_, "a dimension of the shape is too large");
                ++pos_;
            }
            if (peek() == 'L') ++pos_;  // Python 2 long suffix
            dims.push_back(v);
            skip_space();
            if (peek() == ',') { ++pos_; continue; }
            if (peek() != ')') fail(name_, "malformed shape tuple");
        }
        if (dims.size() > 8) fail(name_, "more than 8 dimensions");
        return dims;
    }

    std::string s_;
    std::string name_;
    std::size_t pos_ = 0;
};

std::uint32_t read_le(const std::string& s, std::size_t at, std::size_t bytes) {
    std::uint32_t v = 0;
    for (std::size_t i = 0; i < bytes; ++i)
        v |= std::uint32_t(static_cast<unsigned char>(s[at + i])) << (8 * i);
    return v;
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

std::int64_t Array::size() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
}

namespace {

// What a .npy header says, checked against the size of the whole file.
struct Header {
    ElementType type = ElementType::float32;
    std::vector<std::int64_t> shape;
    std::size_t count = 0;        // elements
    std::size_t data_offset = 0;  // where the data starts
    std::size_t data_bytes = 0;   // how many bytes it takes; data_offset + data_bytes == file size
};

// `prefix` holds the first bytes of the file, at least min(file_size, 12 + kMaxHeaderBytes) of
// them, so the header can be checked before anything of the size it claims is allocated.
Header parse_header(const std::string& prefix, std::uint64_t file_size, const std::string& name) {
    if (prefix.size() < kMagicSize || prefix.compare(0, kMagicSize, kMagic, kMagicSize) != 0)
        fail(name, "missing the \\x93NUMPY magic string");
    if (prefix.size() < kMagicSize + 4) fail(name, "file ends inside the version and header length");
    const int major = static_cast<unsigned char>(prefix[6]);
    const int minor = static_cast<unsigned char>(prefix[7]);
    std::size_t header_len = 0, header_start = 0;
    if (major == 1 && minor == 0) {
        header_len = read_le(prefix, 8, 2);
        header_start = 10;
    } else if ((major == 2 || major == 3) && minor == 0) {
        if (prefix.size() < 12) fail(name, "file ends inside the header length");
        header_len = read_le(prefix, 8, 4);
        header_start = 12;
    } else {
        fail(name, "unsupported format version " + std::to_string(major) + "." +
                       std::to_string(minor));
    }
    if (header_len > kMaxHeaderBytes)
        fail(name, "header length " + std::to_string(header_len) + " is more than the " +
                       std::to_string(kMaxHeaderBytes) + " bytes flashattn accepts");
    if (header_len > file_size - header_start || header_len > prefix.size() - header_start)
        fail(name, "header length " + std::to_string(header_len) + " runs past the end of the file");

    std::string descr;
    bool fortran = false;
    Header h;
    HeaderParser(prefix.substr(header_start, header_len), name).parse(descr, fortran, h.shape);

    std::size_t item = 0;
    if (descr == "<f4") {
        h.type = ElementType::float32;
        item = 4;
    } else if (descr == "|u1" || descr == "<u1" || descr == ">u1") {
        h.type = ElementType::uint8;
        item = 1;
    } else if (descr == "|b1") {
        h.type = ElementType::boolean;
        item = 1;
    } else {
        fail(name, "dtype '" + descr +
                       "' is not supported (use little-endian float32 '<f4'; masks may be uint8 or bool)");
    }
    if (fortran) fail(name, "Fortran-order arrays are not supported (save in C order)");
    std::int64_t count = 1;
    for (std::int64_t d : h.shape) {
        if (d != 0 && count > kMaxElements / d)
            fail(name, "shape " + shape_string(h.shape) + " is too large");
        count *= d;
    }
    h.count = static_cast<std::size_t>(count);
    h.data_offset = header_start + header_len;
    h.data_bytes = h.count * item;
    const std::uint64_t available = file_size - h.data_offset;
    if (available != h.data_bytes)
        fail(name, "shape " + shape_string(h.shape) + " needs " + std::to_string(h.data_bytes) +
                       " data bytes but the file holds " + std::to_string(available));
    return h;
}

// numpy's bool is one byte, 0 or 1; anything else means the file is not what it says.
void check_bools(const Array& a, const std::string& name) {
    if (a.type != ElementType::boolean) return;
    for (std::uint8_t b : a.bytes)
        if (b > 1) fail(name, "bool array holds a byte other than 0 or 1");
}

}  // namespace

Array parse(const std::string& contents, const std::string& name) {
    const Header h = parse_header(contents, contents.size(), name);
    Array a;
    a.type = h.type;
    a.shape = h.shape;
    const char* data = contents.data() + h.data_offset;
    if (a.type == ElementType::float32) {
        a.floats.resize(h.count);
        if (h.count > 0)  // (an empty vector's data() may be null, which memcpy must not get)
            std::memcpy(a.floats.data(), data, h.data_bytes);  // host is little-endian, as '<f4'
    } else {
        a.bytes.assign(data, data + h.data_bytes);
    }
    check_bools(a, name);
    return a;
}

Array load(const std::string& path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0)
        throw std::invalid_argument(path + ": cannot open for reading (" + std::strerror(errno) + ")");
    if (!S_ISREG(info.st_mode)) throw std::invalid_argument(path + ": not a regular file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument(path + ": cannot open for reading (" + std::strerror(errno) + ")");
    const std::uint64_t size = static_cast<std::uint64_t>(info.st_size);
    // Header first: the data is allocated only once the header's shape matches the file size.
    std::string prefix(static_cast<std::size_t>(std::min<std::uint64_t>(size, 12 + kMaxHeaderBytes)), '\0');
    if (!in.read(prefix.data(), static_cast<std::streamsize>(prefix.size())))
        throw std::runtime_error(path + ": read failed");
    const Header h = parse_header(prefix, size, path);
    Array a;
    a.type = h.type;
    a.shape = h.shape;
    char* data = nullptr;
    if (a.type == ElementType::float32) {
        a.floats.resize(h.count);  // host is little-endian, as '<f4'
        data = reinterpret_cast<char*>(a.floats.data());
    } else {
        a.bytes.resize(h.count);
        data = reinterpret_cast<char*>(a.bytes.data());
    }
    in.seekg(static_cast<std::streamoff>(h.data_offset));
    if (h.data_bytes > 0 && !in.read(data, static_cast<std::streamsize>(h.data_bytes)))
        throw std::runtime_error(path + ": read failed (file changed while reading?)");
    check_bools(a, path);
    return a;
}

Array load_float32(const std::string& path, const std::string& what) {
    Array a = load(path);
    if (a.type != ElementType::float32)
        throw std::invalid_argument(what + " " + path + ": must hold float32 ('<f4') values");
    return a;
}

std::string serialize_float32(const std::vector<std::int64_t>& shape, const float* values) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_string(shape) + ", }";
    // Pad with spaces so that magic + version + length + header + '\n' is a multiple of 64.
    const std::size_t unpadded = kMagicSize + 2 + 2 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    std::string out(kMagic, kMagicSize);
    out += '\x01';
    out += '\x00';
    out += static_cast<char>(header.size() & 0xFF);
    out += static_cast<char>((header.size() >> 8) & 0xFF);
    out += header;
    std::int64_t count = 1;
    for (std::int64_t d : shape) count *= d;
    out.append(reinterpret_cast<const char*>(values), static_cast<std::size_t>(count) * 4);
    return out;
}

}  // namespace flashattn::npy
