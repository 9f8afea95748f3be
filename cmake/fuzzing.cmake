# cmake/fuzzing.cmake — FLASHATTN_FUZZ=ON: libFuzzer harnesses (tests/fuzz) with the whole CPU
# build instrumented for coverage, AddressSanitizer and UndefinedBehaviorSanitizer. Clang only
# (Debian: clang, libclang-rt-14-dev, libomp-dev; see cmake/install-deps.sh --dev).
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "FLASHATTN_FUZZ needs clang++ for libFuzzer (found ${CMAKE_CXX_COMPILER_ID}): "
                      "use the 'fuzz' preset or -DCMAKE_CXX_COMPILER=clang++")
endif()
# Every C++ object gets coverage instrumentation (fuzzer-no-link) so libFuzzer sees inside the
# library; only the harnesses link libFuzzer's main (tests/fuzz/CMakeLists.txt).
add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=undefined;-fno-omit-frame-pointer>")
add_link_options(-fsanitize=address,undefined)
