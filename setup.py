"""setup.py — the compiled half of `pip install --no-build-isolation .` (pyproject.toml has the rest).

The extension flashattn._flashattn is the CMake target `_flashattn` (examples/python/CMakeLists.txt):
this runs the project's own CMake build, Release, for that target alone (and `_torch_ops`, the
operators' CUDA kernels in C++, where CMake found PyTorch with CUDA), with the interpreter pip
runs, and copies the modules into the package. The CUDA backends are built when CMake finds nvcc
(on PATH, or /usr/local/cuda/bin/nvcc) unless FLASHATTN_ENABLE_CUDA=0. CMAKE_ARGS adds options
(for example "-DCMAKE_CUDA_ARCHITECTURES=90a" or "-DFLASHATTN_NATIVE=OFF" for a module that runs
on other CPUs than this one); CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs (default: all
cores). The CMake build folder stays under build/ between installs, so a second install rebuilds
only what changed.
"""
import os
import shlex
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = Path(self.build_temp).resolve() / "cmake"
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     "-DBUILD_TESTING=OFF", "-DFLASHATTN_PYTHON=ON",
                     f"-DPython3_EXECUTABLE={sys.executable}"]
        if os.environ.get("FLASHATTN_ENABLE_CUDA", "").strip().lower() in ("0", "off", "no",
                                                                           "false"):
            configure.append("-DFLASHATTN_ENABLE_CUDA=OFF")
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(configure, check=True)
        # flashattn._torch_ops too where CMake configured it (PyTorch with CUDA found; it says so
        # in CMakeCache.txt): the operators' CUDA kernels in C++, an optional module.
        cache = (build / "CMakeCache.txt").read_text()
        targets = ["_flashattn"] + (["_torch_ops"] if "FLASHATTN_TORCH_OPS_BUILT:INTERNAL=ON"
                                    in cache else [])
        subprocess.run(["cmake", "--build", str(build), "--target", *targets, "--parallel",
                        jobs], check=True)
        destination = Path(self.get_ext_fullpath(ext.name)).parent
        destination.mkdir(parents=True, exist_ok=True)
        for name in targets:
            built = sorted((build / "python" / "flashattn").glob(name + "*.so"))
            if len(built) != 1:
                raise RuntimeError(f"expected one compiled module {name}*.so in "
                                   f"{build / 'python' / 'flashattn'}, found {built} (did CMake "
                                   f"find python3-dev and pybind11-dev? see its messages above)")
            target = (Path(self.get_ext_fullpath(ext.name)) if name == "_flashattn"
                      else destination / built[0].name)
            self.copy_file(str(built[0]), str(target))


setup(ext_modules=[Extension("flashattn._flashattn", sources=[])],
      cmdclass={"build_ext": CMakeBuild})
