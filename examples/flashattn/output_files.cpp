// examples/flashattn/output_files.cpp — see output_files.hpp.
#include "output_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>

namespace flashattn::cli {
namespace {

std::string errno_text() { return std::strerror(errno); }

[[noreturn]] void refuse(const FileArgument& f, const std::string& why) {
    throw std::invalid_argument(f.option + " '" + f.path + "': " + why);
}

// Which file a path names: an existing file by its device and inode; a name not created yet by
// its directory's device and inode and the name in it.
struct FileIdentity {
    dev_t device = 0;
    ino_t inode = 0;
    std::string name;  // empty for an existing file
    bool operator==(const FileIdentity& o) const {
        return device == o.device && inode == o.inode && name == o.name;
    }
};

// Where an output really goes.
struct OutputTarget {
    FileArgument argument;
    std::string directory;  // where the temporary file is made and renamed
    std::string name;       // the final name inside `directory`
    FileIdentity identity;
    std::optional<struct stat> replaced;  // the existing file it replaces, if any
};

OutputTarget resolve_output(const FileArgument& f) {
    if (f.path.empty()) refuse(f, "the path is empty");
    OutputTarget t{f, {}, {}, {}, {}};
    std::string path = f.path;
    // A symbolic link is written through, as cp does: the file it points to is the target. A
    // link to nothing is refused (creating its target would put a file where nobody looks).
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
        char* real = ::realpath(path.c_str(), nullptr);
        if (real == nullptr)
            refuse(f, "a symbolic link whose target cannot be reached (" + errno_text() + ")");
        path = real;
        std::free(real);
    }
    if (path.back() == '/') refuse(f, "names a directory (ends in '/')");
    const std::size_t slash = path.rfind('/');
    t.directory = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    t.name = slash == std::string::npos ? path : path.substr(slash + 1);
    if (t.name == "." || t.name == "..") refuse(f, "names a directory");

    struct stat dir {};
    if (::stat(t.directory.c_str(), &dir) != 0)
        refuse(f, "cannot be written: its directory " + t.directory + " cannot be used (" +
                      errno_text() + ")");
    if (!S_ISDIR(dir.st_mode)) refuse(f, "cannot be written: " + t.directory + " is not a directory");
    struct stat file {};
    if (::lstat(path.c_str(), &file) == 0) {
        if (!S_ISREG(file.st_mode))
            refuse(f, "exists and is not a regular file (a directory, device, FIFO, socket or "
                      "link changed under us is never replaced)");
        // A file without write permission says "keep me": replacing it by a rename would succeed
        // (the directory is writable) and lose it all the same.
        if (::access(path.c_str(), W_OK) != 0)
            refuse(f, "exists and is not writable (" + errno_text() + "); it is never replaced");
        t.identity = {file.st_dev, file.st_ino, ""};
        t.replaced = file;
    } else if (errno == ENOENT) {
        t.identity = {dir.st_dev, dir.st_ino, t.name};
    } else {
        refuse(f, "cannot be written (" + errno_text() + ")");  // e.g. a name over 255 bytes
    }
    return t;
}

// Resolves every output and refuses one that is the same file as an input or as another output.
std::vector<OutputTarget> resolve_outputs(const std::vector<FileArgument>& inputs,
                                          const std::vector<FileArgument>& outputs) {
    std::vector<std::pair<FileArgument, FileIdentity>> input_files;
    for (const FileArgument& in : inputs) {
        struct stat s {};
        if (!in.path.empty() && ::stat(in.path.c_str(), &s) == 0)
            input_files.push_back({in, {s.st_dev, s.st_ino, ""}});
    }
    std::vector<OutputTarget> targets;
    for (const FileArgument& out : outputs) {
        OutputTarget t = resolve_output(out);
        for (const auto& [in, identity] : input_files)
            if (identity == t.identity)
                throw std::invalid_argument(out.option + " '" + out.path + "' and " + in.option +
                                            " '" + in.path +
                                            "' are the same file: an output never replaces an input");
        for (const OutputTarget& other : targets)
            if (other.identity == t.identity)
                throw std::invalid_argument(out.option + " '" + out.path + "' and " +
                                            other.argument.option + " '" + other.argument.path +
                                            "' are the same file: each output needs its own file");
        targets.push_back(std::move(t));
    }
    return targets;
}

// A temporary file ".fa-XXXXXX" made beside an output, removed again unless renamed over it.
// The directory is opened once and the file created and renamed relative to it (openat,
// renameat): the temporary name's length then never depends on the directory's path, and the
// rename lands in the directory that was checked even if a path component is renamed meanwhile.
// (mkstemp takes a whole path, so it cannot work this way; the name rule is its own.)
class TemporaryFile {
public:
    explicit TemporaryFile(const OutputTarget& t) : target_(t) {
        dir_fd_ = ::open(t.directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd_ < 0) fail("cannot open its directory (" + errno_text() + ")");
        // Made owner-only: an output that replaces a 0600 file is never readable by others,
        // even for a moment; keep_permissions() gives it its final mode.
        static std::mt19937 random{std::random_device{}()};
        static const char letters[] =
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        for (int attempt = 0; attempt < 100 && fd_ < 0; ++attempt) {
            name_ = ".fa-";
            for (int i = 0; i < 6; ++i) name_ += letters[random() % (sizeof letters - 1)];
            fd_ = ::openat(dir_fd_, name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                           t.replaced ? 0600 : 0666);  // a new file: 0666 & ~umask
            if (fd_ < 0 && errno != EEXIST) break;
        }
        if (fd_ < 0) {
            const std::string why = errno_text();
            ::close(dir_fd_);
            fail("cannot create a file beside it (" + why + ")");
        }
    }
    TemporaryFile(const TemporaryFile&) = delete;
    TemporaryFile& operator=(const TemporaryFile&) = delete;
    ~TemporaryFile() {
        if (fd_ >= 0) ::close(fd_);
        if (!renamed_) ::unlinkat(dir_fd_, name_.c_str(), 0);
        ::close(dir_fd_);
    }

    void write_all(const std::string& contents) {
        std::size_t written = 0;
        while (written < contents.size()) {
            const ssize_t n = ::write(fd_, contents.data() + written, contents.size() - written);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail("writing it failed (" + errno_text() + ")");
            written += static_cast<std::size_t>(n);
        }
        if (target_.replaced) keep_permissions(*target_.replaced);
        if (::fsync(fd_) != 0) fail("writing it failed (" + errno_text() + ")");
        if (::close(fd_) != 0) fail("writing it failed (" + errno_text() + ")");
        fd_ = -1;
    }

    void rename_over_target() {
        if (::renameat(dir_fd_, name_.c_str(), dir_fd_, target_.name.c_str()) != 0)
            fail("cannot replace it (" + errno_text() + ")");
        renamed_ = true;
        ::fsync(dir_fd_);  // the rename itself on disk; a failure here loses nothing written
    }

private:
    // The file replaced keeps its permission bits (not setuid/setgid/sticky: these are data).
    // Its group is kept where this process may set it; where it may not, the new file's group is
    // another one, so its group bits are lowered to the others' bits: a 0640 file of a small
    // group must not become readable by everyone in this process's group.
    void keep_permissions(const struct stat& old) {
        mode_t mode = old.st_mode & 0777;
        if (::fchown(fd_, old.st_uid, old.st_gid) != 0 &&
            ::fchown(fd_, static_cast<uid_t>(-1), old.st_gid) != 0)
            mode = (mode & ~mode_t{070}) | (mode & (mode & 07) << 3);
        if (::fchmod(fd_, mode) != 0) fail("cannot set its permissions (" + errno_text() + ")");
    }

    [[noreturn]] void fail(const std::string& why) const {
        throw std::runtime_error(target_.argument.option + " '" + target_.argument.path +
                                 "': " + why);
    }

    const OutputTarget& target_;
    int dir_fd_ = -1, fd_ = -1;
    std::string name_;
    bool renamed_ = false;
};

}  // namespace

void check_outputs(const std::vector<FileArgument>& inputs,
                   const std::vector<FileArgument>& outputs) {
    for (const OutputTarget& t : resolve_outputs(inputs, outputs)) {
        try {
            TemporaryFile probe(t);  // created and removed: the directory takes new files
        } catch (const std::runtime_error& e) {
            throw std::invalid_argument(e.what());
        }
    }
}

void AtomicWriter::add(FileArgument output, std::string contents) {
    outputs_.push_back(std::move(output));
    contents_.push_back(std::move(contents));
}

void AtomicWriter::commit() {
    const std::vector<OutputTarget> targets = resolve_outputs(inputs_, outputs_);
    // Every temporary file written before any is renamed; leaving this scope early (a throw)
    // removes those not renamed yet.
    std::vector<std::unique_ptr<TemporaryFile>> temporaries;
    for (std::size_t i = 0; i < targets.size(); ++i) {
        temporaries.push_back(std::make_unique<TemporaryFile>(targets[i]));
        temporaries.back()->write_all(contents_[i]);
    }
    for (auto& t : temporaries) t->rename_over_target();
    outputs_.clear();
    contents_.clear();
}

}  // namespace flashattn::cli
