// tests/catch.hpp — one include for Catch2 2.x (Debian 12) and 3.x (Ubuntu 24.04, the GPU machine).
#pragma once

#include <cstdint>
#include <string>

// Which Catch2 to use is the one CMake found (FLASHATTN_CATCH2_MAJOR, set in tests/CMakeLists.txt),
// not whichever headers happen to exist: the GPU machine has Catch2 3.x headers in /usr/include
// while the build there uses the carried Debian Catch2 2.x package.
#if defined(FLASHATTN_CATCH2_MAJOR)
#define FLASHATTN_CATCH2_V3 (FLASHATTN_CATCH2_MAJOR >= 3)
#elif __has_include(<catch2/catch_test_macros.hpp>)
#define FLASHATTN_CATCH2_V3 1
#else
#define FLASHATTN_CATCH2_V3 0
#endif

#if FLASHATTN_CATCH2_V3
#include <catch2/catch_approx.hpp>
#include <catch2/catch_get_random_seed.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
using Catch::Approx;
namespace Catch {  // Catch2 2.x spelling, used by our tests
inline Matchers::StringContainsMatcher Contains(const std::string& s) {
    return Matchers::ContainsSubstring(s);
}
inline std::uint32_t rngSeed() { return getSeed(); }
using Matchers::StartsWith;
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
