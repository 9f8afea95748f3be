#!/usr/bin/env python3
"""tests/test_fa3_ptxas_check.py — cuda/tools/fa3_ptxas_check.py on stand-in ptxas output.

    test_fa3_ptxas_check.py [--root DIR]

Checks that each kernel of a ptxas -v log gets its row (registers, stack, spill stores and loads
as ptxas printed them), that a "wgmma ... serialized" note marks its kernel SERIALIZED and makes
the exit status 1 wherever the note stands in the log, that a log with no kernel fails; that with a
stand-in nvcc (a script that writes what ptxas would) each source is compiled with -arch=sm_90a and
-Xptxas -v, its log and the table are written to --out, a source that does not compile is named
and fails the run; and that each bad argument gives `error:` and exit status 2 before anything
runs. Standard library only (CI runs it with Debian's python3).
"""
import argparse
import os
import stat
import subprocess
import sys
import tempfile

A = "_ZN9flashattn3fa318fa3_forward_kernelINS0_7Fa3TileI6__halfLi64ELi128ELi2ELb1ELi2EEELb0ELb0EEEvNS0_9Fa3ParamsE"
B = "_ZN9flashattn3fa319fa3_backward_kernelINS0_15Fa3BackwardTileI6__halfLi128ELi64ELi2ELb1ELb1EEELb0ELb0EEEvNS0_17Fa3BackwardParamsE"


def entry(name, regs, stack, stores, loads):
    return (f"ptxas info    : Compiling entry function '{name}' for 'sm_90a'\n"
            f"ptxas info    : Function properties for {name}\n"
            f"    {stack} bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads\n"
            f"ptxas info    : Used {regs} registers, used 5 barriers, {stack} bytes cumulative stack size\n")


def serialized(name):
    return ("ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are "
            "serialized due to program dependence on compiler-inserted WG.DP in divergent path in "
            f"the function '{name}'\n")


def run(root, args):
    tool = os.path.join(root, "cuda", "tools", "fa3_ptxas_check.py")
    return subprocess.run([sys.executable, tool] + args, capture_output=True, text=True, timeout=120)


def check(condition, what, out=None):
    if not condition:
        detail = f"\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}" if out is not None else ""
        raise SystemExit(f"FAILED: {what}{detail}")


def rows(out):
    return [l for l in out.stdout.splitlines() if l.startswith("| ") and "`" in l]


def write(path, text):
    with open(path, "w") as fh:
        fh.write(text)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    root = os.path.abspath(ap.parse_args().root)
    with tempfile.TemporaryDirectory() as tmp:
        # A clean log: one row per kernel, ptxas's own numbers, exit status 0.
        clean = write(os.path.join(tmp, "clean.log"),
                      entry(A, 168, 16, 0, 0) + entry(B, 168, 208, 1560, 1960))
        out = run(root, ["--log", clean])
        check(out.returncode == 0, "a clean log: exit status 0", out)
        r = rows(out)
        check(len(r) == 2, "a clean log: a row per kernel", out)
        check("| 168 | 16 | 0 | 0 | ok |" in r[0], "the forward kernel's numbers", out)
        check("| 168 | 208 | 1560 | 1960 | ok |" in r[1], "the backward kernel's numbers", out)

        # The serialization note before its kernel's entry, and after it: the kernel is marked,
        # the other is not, and the run fails naming it.
        for order, text in (("before", serialized(B) + entry(A, 168, 16, 0, 0) + entry(B, 168, 8, 4, 4)),
                            ("after", entry(A, 168, 16, 0, 0) + entry(B, 168, 8, 4, 4) + serialized(B))):
            log = write(os.path.join(tmp, f"serialized_{order}.log"), text)
            out = run(root, ["--log", log])
            r = rows(out)
            check(out.returncode == 1, f"a note {order} its entry: exit status 1", out)
            check(len(r) == 2 and r[0].endswith("| ok |") and r[1].endswith("| SERIALIZED |"),
                  f"a note {order} its entry: only its kernel is marked", out)
            check("FAILED: ptxas serialized the wgmmas of" in out.stderr and
                  "fa3_backward_kernel" in out.stderr, f"a note {order}: the kernel is named", out)

        # No kernel at all: a failure, not a pass.
        empty = write(os.path.join(tmp, "empty.log"), "nothing here\n")
        out = run(root, ["--log", empty])
        check(out.returncode == 1 and "no kernel found" in out.stderr, "an empty log fails", out)

        # A stand-in nvcc: writes ptxas's lines for each source (a serialized kernel in the
        # backward) and the cubin, and records its arguments.
        calls = os.path.join(tmp, "calls.txt")
        fake = write(os.path.join(tmp, "nvcc"), f"""#!{sys.executable}
import sys
args = sys.argv[1:]
with open({calls!r}, "a") as fh:
    fh.write(" ".join(args) + "\\n")
src = args[-1]
open(args[args.index("-o") + 1], "w").close()
if "FAIL" in __import__("os").environ and src.endswith("backend.cu"):
    print("error: something does not compile")
    sys.exit(2)
if src.endswith("backward.cu"):
    print({serialized(B) + entry(B, 168, 8, 4, 4)!r}, end="")
else:
    print({entry(A, 168, 16, 0, 0)!r}, end="")
""")
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IXUSR)
        out_dir = os.path.join(tmp, "out")
        out = run(root, ["--nvcc", fake, "--out", out_dir, "--jobs", "1"])
        check(out.returncode == 1, "stand-in nvcc, a serialized kernel: exit status 1", out)
        with open(calls) as fh:
            lines = fh.read().splitlines()
        check(len(lines) == 2 and all("-arch=sm_90a" in l and "-Xptxas -v" in l for l in lines),
              "each source compiled once for sm_90a with -Xptxas -v", out)
        check(any(l.endswith("cuda/fa3/backend.cu") for l in lines) and
              any(l.endswith("cuda/fa3/backward.cu") for l in lines), "both sources compiled", out)
        logs = sorted(f for f in os.listdir(out_dir) if f.endswith(".log"))
        check(logs == ["cuda_fa3_backend.log", "cuda_fa3_backward.log"], "a log per source", out)
        check(os.path.isfile(os.path.join(out_dir, "table.md")), "the table is written", out)
        check(len(rows(out)) == 2, "stand-in nvcc: a row per kernel", out)

        # A source that does not compile: named, exit status 1.
        out = subprocess.run([sys.executable, os.path.join(root, "cuda", "tools", "fa3_ptxas_check.py"),
                              "--nvcc", fake, "--out", out_dir], capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, FAIL="1"))
        check(out.returncode == 1 and "cuda/fa3/backend.cu did not compile" in out.stderr and
              "something does not compile" in out.stderr, "a failed compile is named", out)

        # Bad arguments: error: and exit status 2, nothing run or written.
        os.remove(calls)
        untouched = os.path.join(tmp, "untouched")
        for args, text in ((["--jobs", "0", "--nvcc", fake, "--out", untouched], "--jobs = 0"),
                           (["--nvcc", os.path.join(tmp, "no-nvcc"), "--out", untouched], "is not an executable"),
                           (["--log", os.path.join(tmp, "no.log")], "no such file"),
                           (["--root", tmp, "--nvcc", fake, "--out", untouched], "not a flashattn checkout")):
            out = run(root, args)
            check(out.returncode == 2 and "error: " in out.stderr and text in out.stderr,
                  f"{args}: error: {text!r}, exit status 2", out)
            check(not os.path.exists(calls) and not os.path.exists(untouched),
                  f"{args}: nothing ran or was written", out)
    print("fa3_ptxas_check: all checks passed")


if __name__ == "__main__":
    main()
