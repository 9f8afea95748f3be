// tests/catch.hpp — one include for Catch2 2.x (Debian 12) and 3.x (Ubuntu 24.04, the GPU machine).
#pragma once

#if __has_include(<catch2/catch_test_macros.hpp>)
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/generators/catch_generators_range.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
using Catch::Approx;
namespace Catch {  // Catch2 2.x spelling, used by our tests
inline Matchers::StringContainsMatcher Contains(const std::string& s) {
    return Matchers::ContainsSubstring(s);
}
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
