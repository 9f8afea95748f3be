// examples/flashattn/output_files.hpp — how `flashattn run` writes its output files: all or
// nothing, never over one of its inputs, never two outputs into one file (docs/design.md,
// Output files).
//
//  - Same file: two paths name the same file when stat() gives the same device and inode, so
//    "x.npy", "./x.npy", "dir/../x.npy", a hard link and a symbolic link to x.npy are one file.
//    A name that does not exist yet is identified by its directory's device and inode and the
//    name in it, so "new.npy" and "./new.npy" are one file too.
//  - Atomic replace: each output is first written to a temporary file ".fa-XXXXXX" in the
//    directory of the file it replaces (10 characters, so it fits wherever the final name fits),
//    and renamed over it only once every output has been written.
//  - A replaced file keeps its permission bits (and its group, where this process may set it); a
//    new file gets 0666 & ~umask, as any program's would.
//  - An output that is a symbolic link is written through, as `cp` does: the link stays, and the
//    file it points to is replaced (the temporary file is made beside that file).
//  - Refused before any work, with std::invalid_argument naming the option and the path: an empty
//    path or one ending in '/', an existing directory, device, FIFO or socket, a symbolic link to
//    nothing, an existing file without write permission, a directory where no file can be
//    created, and an output that is the same file as an input or as another output.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace flashattn::cli {

// A file named on the command line: the option that named it, and the path as given.
struct FileArgument {
    std::string option;  // "--out"
    std::string path;
};

// Checks, before any work is done, that each output could be written and is a file of its own:
// not an input, not another output, and a temporary file can be created beside it (created and
// removed at once; the output itself is not touched). Inputs that do not exist are skipped (their
// reader reports them). Throws std::invalid_argument naming the options and paths.
void check_outputs(const std::vector<FileArgument>& inputs,
                   const std::vector<FileArgument>& outputs);

// Writes the outputs so that either all of them appear complete or none changes. commit() checks
// the outputs again as check_outputs() does (the files may have changed since), writes every
// temporary file, and only then renames them over their targets; on any failure the temporary
// files are removed. The renames run one after another, in one directory each, so once the
// checks have passed nothing short of the directories changing under us can stop them half-way.
class AtomicWriter {
public:
    explicit AtomicWriter(std::vector<FileArgument> inputs) : inputs_(std::move(inputs)) {}
    void add(FileArgument output, std::string contents);
    void commit();  // throws std::invalid_argument (a check) or std::runtime_error (I/O)

private:
    std::vector<FileArgument> inputs_;
    std::vector<FileArgument> outputs_;
    std::vector<std::string> contents_;
};

}  // namespace flashattn::cli
