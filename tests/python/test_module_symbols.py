"""The compiled module exports nothing of the static libraries linked into it.

A module that exports its static copy of the library (and, where the toolchain links it
statically, of libstdc++) can have some of its own references bound to another copy already in
the process: on a machine whose g++ links libstdc++ statically, NumPy's libstdc++.so got half of
the module's locale calls, and formatting a number in an error message crashed the interpreter.
examples/python/CMakeLists.txt links with --exclude-libs,ALL; this checks the result.
"""
import shutil
import subprocess
import sys

import pytest

import flashattn


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF symbol tables: Linux only")
@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_module_exports_none_of_the_library():
    module = flashattn._C.__file__
    listed = subprocess.run(["nm", "-D", "--defined-only", module], check=True,
                            capture_output=True, text=True).stdout
    names = [line.split()[-1] for line in listed.splitlines() if line.strip()]
    assert "PyInit__flashattn" in names
    library = [n for n in names if n.startswith("_ZN9flashattn")]
    assert library == [], f"{module} exports {len(library)} library symbols, e.g. {library[:3]}"
