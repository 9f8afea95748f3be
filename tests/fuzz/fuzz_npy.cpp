// tests/fuzz/fuzz_npy.cpp — libFuzzer harness for the strict .npy reader (npy::parse).
//
// Any byte string must either parse into an array that is consistent with its own header, or be
// refused with std::invalid_argument. Anything else — another exception, a crash, an
// AddressSanitizer or UndefinedBehaviorSanitizer report, an allocation beyond libFuzzer's
// -rss_limit_mb — is a finding. Run: tests/fuzz/run_fuzzers.sh (or build/fuzz/bin/fuzz_npy DIR).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "npy.hpp"

namespace {

[[noreturn]] void finding(const char* what) {
    std::fprintf(stderr, "fuzz_npy: %s\n", what);
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace flashattn;
    const std::string contents(reinterpret_cast<const char*>(data), size);
    npy::Array a;
    try {
        a = npy::parse(contents, "fuzz.npy");
    } catch (const std::invalid_argument&) {
        return 0;  // refused, as a malformed file must be
    }
    // Accepted: the values must be exactly what the shape says, and a float32 array must come
    // back unchanged through the writer and the reader.
    const auto count = static_cast<std::size_t>(a.size());
    if (a.type == npy::ElementType::float32) {
        if (a.floats.size() != count || !a.bytes.empty())
            finding("float32 array of the wrong size");
        const npy::Array again =
            npy::parse(npy::serialize_float32(a.shape, a.floats.data()), "again");
        if (again.shape != a.shape || again.floats.size() != count ||
            (count > 0 &&
             std::memcmp(again.floats.data(), a.floats.data(), count * sizeof(float)) != 0))
            finding("float32 array changed through serialize_float32 and parse");
    } else {
        if (a.bytes.size() != count || !a.floats.empty()) finding("byte array of the wrong size");
        if (a.type == npy::ElementType::boolean)
            for (std::uint8_t b : a.bytes)
                if (b > 1) finding("bool array accepted with a byte other than 0 or 1");
    }
    return 0;
}
