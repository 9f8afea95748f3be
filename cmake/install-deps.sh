#!/bin/sh
# Installs the Debian 12 packages flashattn builds with (uses sudo when not root).
# CUDA is optional: with nvcc installed (e.g. /usr/local/cuda) the CUDA backends are built too.
#   sh cmake/install-deps.sh          # what the build and the tests need
#   sh cmake/install-deps.sh --dev    # also clang, libFuzzer and clang's OpenMP: presets fuzz, asan
set -e
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PACKAGES="cmake g++ make libeigen3-dev catch2 libcli11-dev nlohmann-json3-dev python3-matplotlib
  python3-dev python3-numpy python3-pytest python3-torch pybind11-dev"
if [ "${1:-}" = "--dev" ]; then
  PACKAGES="$PACKAGES clang libclang-rt-14-dev libomp-dev"
fi
missing=""
for p in $PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "installing:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
