#!/bin/sh
# cuda/tools/pack_deps.sh — copies the Debian 12 packages the build finds with find_package (Eigen,
# Catch2 2.x with its static libraries, CLI11, nlohmann-json) under one prefix, for a GPU machine
# that has no package registry (its own Catch2 is 3.x). Debian's CMake package files are
# relocatable, so pointing CMAKE_PREFIX_PATH at the prefix is enough:
#   sh cuda/tools/pack_deps.sh .carry/deps          # here (after sh cmake/install-deps.sh)
#   bash cuda/tools/gpu_check.sh .carry/deps        # there (.carry is git-ignored: carry it along)
set -eu
PREFIX=${1:?usage: cuda/tools/pack_deps.sh PREFIX}
for f in /usr/include/eigen3 /usr/share/eigen3/cmake /usr/include/catch2 /usr/lib/cmake/Catch2 \
         /usr/lib/libCatch2WithMain.a /usr/include/CLI /usr/share/cmake/CLI11 \
         /usr/include/nlohmann /usr/share/cmake/nlohmann_json; do
    [ -e "$f" ] || { echo "error: $f is missing: run sh cmake/install-deps.sh first" >&2; exit 2; }
done
mkdir -p "$PREFIX/include" "$PREFIX/share/eigen3" "$PREFIX/share/cmake" "$PREFIX/lib/cmake"
cp -r /usr/include/eigen3 /usr/include/catch2 /usr/include/CLI /usr/include/nlohmann \
      "$PREFIX/include/"
cp -r /usr/share/eigen3/cmake "$PREFIX/share/eigen3/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$PREFIX/share/cmake/"
cp -r /usr/lib/cmake/Catch2 "$PREFIX/lib/cmake/"
cp /usr/lib/libCatch2*.a "$PREFIX/lib/"
echo "packed into $PREFIX ($(du -sh "$PREFIX" | cut -f1))"
