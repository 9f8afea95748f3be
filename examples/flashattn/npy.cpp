// examples/flashattn/npy.cpp — see npy.hpp. Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
#include "npy.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace flashattn::npy {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;
// More elements than any file we accept could hold; keeps shape products far from overflow.
constexpr std::int64_t kMaxElements = std::int64_t{1} << 40;

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

Array parse(const std::string& contents, const std::string& name) {
    if (contents.size() < kMagicSize + 4 || contents.compare(0, kMagicSize, kMagic, kMagicSize) != 0)
        fail(name, "missing the \\x93NUMPY magic string");
    const int major = static_cast<unsigned char>(contents[6]);
    const int minor = static_cast<unsigned char>(contents[7]);
    std::size_t header_len = 0, header_start = 0;
    if (major == 1 && minor == 0) {
        header_len = read_le(contents, 8, 2);
        header_start = 10;
    } else if ((major == 2 || major == 3) && minor == 0) {
        if (contents.size() < 12) fail(name, "file ends inside the header length");
        header_len = read_le(contents, 8, 4);
        header_start = 12;
    } else {
        fail(name, "unsupported format version " + std::to_string(major) + "." +
                       std::to_string(minor));
    }
    if (header_len > contents.size() - header_start)
        fail(name, "header length " + std::to_string(header_len) + " runs past the end of the file");

    std::string descr;
    bool fortran = false;
    std::vector<std::int64_t> shape;
    HeaderParser(contents.substr(header_start, header_len), name).parse(descr, fortran, shape);

    Array a;
    std::size_t item = 0;
    if (descr == "<f4") {
        a.type = ElementType::float32;
        item = 4;
    } else if (descr == "|u1" || descr == "<u1" || descr == ">u1") {
        a.type = ElementType::uint8;
        item = 1;
    } else if (descr == "|b1") {
        a.type = ElementType::boolean;
        item = 1;
    } else {
        fail(name, "dtype '" + descr +
                       "' is not supported (use little-endian float32 '<f4'; masks may be uint8 or bool)");
    }
    if (fortran) fail(name, "Fortran-order arrays are not supported (save in C order)");
    a.shape = shape;
    std::int64_t count = 1;
    for (std::int64_t d : shape) {
        if (d != 0 && count > kMaxElements / d) fail(name, "shape " + shape_string(shape) + " is too large");
        count *= d;
    }
    const std::size_t data_start = header_start + header_len;
    const std::size_t available = contents.size() - data_start;
    const std::size_t needed = static_cast<std::size_t>(count) * item;
    if (available != needed)
        fail(name, "shape " + shape_string(shape) + " needs " + std::to_string(needed) +
                       " data bytes but the file holds " + std::to_string(available));
    if (a.type == ElementType::float32) {
        a.floats.resize(static_cast<std::size_t>(count));
        std::memcpy(a.floats.data(), contents.data() + data_start, needed);  // host is little-endian
    } else {
        a.bytes.assign(contents.begin() + static_cast<std::ptrdiff_t>(data_start), contents.end());
        if (a.type == ElementType::boolean)
            for (std::uint8_t b : a.bytes)
                if (b > 1) fail(name, "bool array holds a byte other than 0 or 1");
    }
    return a;
}

Array load(const std::string& path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0)
        throw std::invalid_argument(path + ": cannot open for reading (" + std::strerror(errno) + ")");
    if (!S_ISREG(info.st_mode)) throw std::invalid_argument(path + ": not a regular file");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::invalid_argument(path + ": cannot open for reading (" + std::strerror(errno) + ")");
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    if (size < 0) throw std::invalid_argument(path + ": cannot determine the file size");
    // The largest file we could accept: 2^40 float32 elements plus a header.
    if (size > (kMaxElements * 4 + (1 << 20)))
        throw std::invalid_argument(path + ": file is too large");
    in.seekg(0);
    std::string contents(static_cast<std::size_t>(size), '\0');
    if (!in.read(contents.data(), size)) throw std::runtime_error(path + ": read failed");
    return parse(contents, path);
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

void AtomicWriter::add(const std::string& path, std::string contents) {
    files_.emplace_back(path, std::move(contents));
}

void AtomicWriter::commit() {
    std::vector<std::string> temps;
    const auto cleanup = [&] {
        for (const std::string& t : temps) std::remove(t.c_str());
    };
    for (const auto& [path, contents] : files_) {
        std::string tmpl = path + ".tmp.XXXXXX";
        const int fd = mkstemp(tmpl.data());
        if (fd < 0) {
            const std::string why = std::strerror(errno);
            cleanup();
            throw std::runtime_error(path + ": cannot create the output file (" + why + ")");
        }
        temps.push_back(tmpl);
        const mode_t mask = ::umask(0);  // mkstemp creates 0600; give the usual 0666 & ~umask
        ::umask(mask);
        ::fchmod(fd, 0666 & ~mask);
        std::size_t written = 0;
        while (written < contents.size()) {
            const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
            if (n <= 0) break;
            written += static_cast<std::size_t>(n);
        }
        const bool ok = written == contents.size() && ::fsync(fd) == 0;
        ::close(fd);
        if (!ok) {
            cleanup();
            throw std::runtime_error(path + ": writing the output failed (disk full?)");
        }
    }
    for (std::size_t i = 0; i < files_.size(); ++i) {
        if (std::rename(temps[i].c_str(), files_[i].first.c_str()) != 0) {
            const std::string why = std::strerror(errno);
            cleanup();
            throw std::runtime_error(files_[i].first + ": cannot replace the output file (" + why + ")");
        }
    }
    files_.clear();
}

}  // namespace flashattn::npy
