#!/bin/sh
# tests/python/gpu_checks.sh — the Python package's checks that need a GPU, in one command, ending
# with a short summary: the whole pytest suite (its CUDA tests run here, and test_torch_op.py needs
# PyTorch >= 2.4), the time-to-return of one call against SDPA, and on request the GPT benchmark
# and a pip install with CUDA.
#
# Usage, from the repository root on the GPU machine:
#   sh tests/python/gpu_checks.sh [BUILD_DIR] [--gpt] [--pip]
# BUILD_DIR (default build/gpu) is a CMake build with CUDA whose python/ folder holds the package.
# --gpt  also runs examples/python/gpt.py --preset gpu, eager and --compile (a few minutes);
# --pip  also installs the package with pip into a folder of its own (builds the CUDA
#        code again; CMAKE_ARGS is passed on, e.g. "-DCMAKE_CUDA_ARCHITECTURES=90a
#        -DCMAKE_PREFIX_PATH=/path/to/deps") and imports it from /tmp.
# PYTHON names the interpreter (default python3, the one with PyTorch).
set -u
py=${PYTHON:-python3}
build=build/gpu
gpt=0
pip=0
for arg in "$@"; do
  case $arg in
    --gpt) gpt=1 ;;
    --pip) pip=1 ;;
    *) build=$arg ;;
  esac
done
out=$(mktemp -d)
export PYTHONPATH="$build/python"
# A build with the operators in C++ (flashattn._torch_ops) must register them: test_cpp_operators.py
# fails instead of skipping where the module is there.
if ls "$build"/python/flashattn/_torch_ops*.so > /dev/null 2>&1; then
  export FLASHATTN_EXPECT_TORCH_OPS=1
fi
if ! "$py" -c "import torch, flashattn; print('torch', torch.__version__, '|',
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU', '|',
', '.join(flashattn.backends()), '| operators in',
'C++' if flashattn._TORCH_OPS is not None else 'Python')" > "$out/env"; then
  echo "$py cannot import torch and flashattn (from $build/python)"
  exit 2
fi
cat "$out/env"

"$py" -m pytest -q -p no:cacheprovider -rfEs tests/python > "$out/pytest" 2>&1
pytest_status=$?
tail -n 40 "$out/pytest"

for options in "--dtype bfloat16" "--dtype bfloat16 --grad" "--dtype float32"; do
  # shellcheck disable=SC2086
  "$py" examples/python/overhead.py $options
done > "$out/overhead" 2>&1
cat "$out/overhead"

if [ $gpt = 1 ]; then
  "$py" examples/python/gpt.py --preset gpu > "$out/gpt" 2>&1
  "$py" examples/python/gpt.py --preset gpu --compile > "$out/gpt_compile" 2>&1
  tail -n 8 "$out/gpt" "$out/gpt_compile"
fi

if [ $pip = 1 ]; then
  # Into a folder of its own (--target), with the interpreter's own numpy and torch (--no-deps:
  # no package registry is needed), then imported from /tmp with only that folder on the path.
  rm -rf "$out/pip_target"
  "$py" -m pip install --no-build-isolation --no-deps --target "$out/pip_target" . \
      > "$out/pip" 2>&1 &&
    (cd /tmp && PYTHONPATH="$out/pip_target" "$py" -c \
      "import flashattn, torch; print('pip install:', flashattn.__file__, flashattn.backends(),
      '| operators in', 'C++' if flashattn._TORCH_OPS is not None else 'Python')") \
      > "$out/pip_import" 2>&1
  pip_status=$?
  tail -n 3 "$out/pip" "$out/pip_import"
fi

echo
echo "=== summary ($out holds the logs) ==="
cat "$out/env"
echo "pytest: $(tail -n 1 "$out/pytest") (exit $pytest_status)"
echo "skipped for a reason other than the hardware:"
grep '^SKIPPED' "$out/pytest" | grep -v 'no CUDA device' | sed 's/^/  /' | head -n 10
grep -E 'median|flashattn - sdpa' "$out/overhead" | sed 's/^/overhead: /'
if [ $gpt = 1 ]; then
  grep -h -A2 '^markdown row' "$out/gpt" "$out/gpt_compile" | grep '^| [0-9]' | sed 's/^/gpt: /'
fi
if [ $pip = 1 ]; then
  echo "pip install: exit $pip_status; $(tail -n 1 "$out/pip_import")"
fi
exit $pytest_status
