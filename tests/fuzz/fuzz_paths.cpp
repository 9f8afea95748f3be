// tests/fuzz/fuzz_paths.cpp — libFuzzer harness for the output-file rules of `flashattn run`
// (examples/flashattn/output_files.hpp): an output never replaces an input, two outputs are never
// one file, and a refused call changes nothing.
//
// A small sandbox directory is rebuilt before every input: files, a hard link, symbolic links to
// a file, to a directory, to nothing and to themselves, a subdirectory, a directory named like a
// file. The fuzzer's bytes spell up to 4 input and 5 output paths from its names and ".", "..",
// "" (a doubled slash), relative or absolute, with or without a trailing slash. Then
//   * check_outputs() either passes or throws std::invalid_argument (anything else: a finding);
//   * a refusal that says two paths are "the same file" must be right (std::filesystem::equivalent,
//     or for names not created yet the same weakly_canonical path);
//   * a refusal changes nothing in the sandbox, and leaves no temporary file;
//   * after a pass, AtomicWriter::commit() writes each output its own contents: afterwards every
//     input reads as before and every output reads as its own contents (two outputs in one file,
//     or an output over an input, would show here), and no temporary file is left.
// A finding prints the case and aborts, so libFuzzer saves the input.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "output_files.hpp"

namespace fs = std::filesystem;
using flashattn::cli::AtomicWriter;
using flashattn::cli::FileArgument;

namespace {

// The sandbox, made once per process (mkdtemp).
const fs::path& sandbox() {
    static const fs::path root = [] {
        std::string tmpl = (fs::temp_directory_path() / "fuzz_paths_XXXXXX").string();
        if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
        return fs::path(tmpl);
    }();
    return root;
}

// The sandbox as a relative path from the working directory ("../../tmp/fuzz_paths_…"): relative
// spellings without a chdir, which would move libFuzzer's own relative paths (corpus, crash files).
const std::string& relative_sandbox() {
    static const std::string rel = sandbox().lexically_relative(fs::current_path()).string();
    return rel;
}

void write(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void rebuild_sandbox() {
    const fs::path& root = sandbox();
    for (const auto& entry : fs::directory_iterator(root)) fs::remove_all(entry.path());
    write(root / "a.npy", "A");
    write(root / "b.npy", "B");
    fs::create_directory(root / "sub");
    write(root / "sub" / "c.npy", "C");
    fs::create_directory(root / "dir.npy");
    fs::create_hard_link(root / "a.npy", root / "hard_a.npy");
    fs::create_symlink("a.npy", root / "sym_a.npy");
    fs::create_symlink("sub/c.npy", root / "sym_c.npy");
    fs::create_symlink("sym_a.npy", root / "sym_sym_a.npy");
    fs::create_symlink("sub", root / "sym_sub");
    fs::create_symlink("nothing.npy", root / "dangling.npy");
    fs::create_symlink("loop.npy", root / "loop.npy");
    ::chmod((root / "b.npy").c_str(), 0640);
}

// Everything in the sandbox: each entry's type, and its contents or link target.
std::map<std::string, std::string> snapshot() {
    std::map<std::string, std::string> s;
    for (const auto& e : fs::recursive_directory_iterator(sandbox())) {
        const fs::path rel = e.path().lexically_relative(sandbox());
        const fs::file_status st = e.symlink_status();
        std::string what = std::to_string(static_cast<int>(st.type())) + ":";
        if (fs::is_symlink(st))
            what += fs::read_symlink(e.path()).string();
        else if (fs::is_regular_file(st))
            what += read(e.path()) + ":" + std::to_string(static_cast<int>(st.permissions()));
        s[rel.string()] = what;
    }
    return s;
}

const char* const kNames[] = {"a.npy",    "b.npy",        "c.npy",         "sub",
                              "dir.npy",  "hard_a.npy",   "sym_a.npy",     "sym_c.npy",
                              "sym_sub",  "sym_sym_a.npy", "dangling.npy", "loop.npy",
                              "new.npy",  "new2.npy",     "nothing.npy",   ".",
                              "..",       ""};

std::string make_path(FuzzedDataProvider& fdp) {
    std::string path = (fdp.ConsumeBool() ? sandbox().string() : relative_sandbox()) + "/";
    const int parts = fdp.ConsumeIntegralInRange(1, 4);
    for (int i = 0; i < parts; ++i) {
        if (i) path += "/";
        path += kNames[fdp.ConsumeIntegralInRange<std::size_t>(0, std::size(kNames) - 1)];
    }
    if (fdp.ConsumeIntegralInRange(0, 7) == 0) path += "/";
    return path;
}

std::string describe(const std::vector<FileArgument>& in, const std::vector<FileArgument>& out) {
    std::string s;
    for (const FileArgument& f : in) s += " " + f.option + " '" + f.path + "'";
    for (const FileArgument& f : out) s += " " + f.option + " '" + f.path + "'";
    return s;
}

[[noreturn]] void finding(const std::string& what, const std::vector<FileArgument>& in,
                          const std::vector<FileArgument>& out) {
    std::fprintf(stderr, "fuzz_paths: %s\n  case:%s\n", what.c_str(), describe(in, out).c_str());
    std::abort();
}

// Whether two paths name one file, by std::filesystem's own means.
bool same_file(const std::string& x, const std::string& y) {
    std::error_code ec;
    if (fs::exists(x, ec) && fs::exists(y, ec)) return fs::equivalent(x, y, ec);
    const fs::path cx = fs::weakly_canonical(x, ec), cy = fs::weakly_canonical(y, ec);
    return !ec && cx == cy;
}

// A "same file" refusal names two options; they must name one file.
void check_same_file_claim(const std::string& message, const std::vector<FileArgument>& in,
                           const std::vector<FileArgument>& out) {
    if (message.find("same file") == std::string::npos) return;
    std::vector<const FileArgument*> named;
    for (const auto* list : {&out, &in})
        for (const FileArgument& f : *list)
            if (message.find(f.option + " '" + f.path + "'") != std::string::npos)
                named.push_back(&f);
    if (named.size() < 2 || !same_file(named[0]->path, named[1]->path))
        finding("refused as 'the same file' but they are not: " + message, in, out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider fdp(data, size);
    rebuild_sandbox();
    std::vector<FileArgument> inputs, outputs;
    const int n_in = fdp.ConsumeIntegralInRange(1, 4), n_out = fdp.ConsumeIntegralInRange(1, 5);
    for (int i = 0; i < n_in; ++i) inputs.push_back({"--in" + std::to_string(i), make_path(fdp)});
    for (int i = 0; i < n_out; ++i) outputs.push_back({"--out" + std::to_string(i), make_path(fdp)});

    std::map<std::string, std::string> input_bytes;  // the inputs that are readable files
    std::error_code ec;  // (a link in a loop has no status: not a readable input)
    for (const FileArgument& f : inputs)
        if (fs::is_regular_file(f.path, ec)) input_bytes[f.path] = read(f.path);
    const auto before = snapshot();

    try {
        flashattn::cli::check_outputs(inputs, outputs);
    } catch (const std::invalid_argument& e) {
        check_same_file_claim(e.what(), inputs, outputs);
        if (snapshot() != before) finding(std::string("a refusal changed the sandbox: ") + e.what(), inputs, outputs);
        return 0;
    } catch (const std::exception& e) {
        finding(std::string("check_outputs threw other than invalid_argument: ") + e.what(), inputs,
                outputs);
    }

    AtomicWriter writer(inputs);
    for (std::size_t i = 0; i < outputs.size(); ++i)
        writer.add(outputs[i], "output " + std::to_string(i));
    try {
        writer.commit();
    } catch (const std::exception& e) {
        finding(std::string("commit failed after check_outputs passed: ") + e.what(), inputs,
                outputs);
    }
    for (const auto& [path, bytes] : input_bytes)
        if (read(path) != bytes) finding("input " + path + " changed", inputs, outputs);
    for (std::size_t i = 0; i < outputs.size(); ++i)
        if (read(outputs[i].path) != "output " + std::to_string(i))
            finding("output " + outputs[i].path + " does not hold its own contents", inputs,
                    outputs);
    for (const auto& [name, what] : snapshot())
        if (fs::path(name).filename().string().rfind(".fa-", 0) == 0)
            finding("a temporary file was left: " + name, inputs, outputs);
    return 0;
}
