// tests/catch_main.cpp — Catch2 2.x needs one translation unit to define main().
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
