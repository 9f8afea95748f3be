#!/usr/bin/env python3
"""cuda/tools/fa3_ptxas_check.py — cuda-fa3's kernels compiled for sm_90a on a machine without a GPU,
and what ptxas says about each: registers, stack, spills, and whether it serialized the wgmmas.

A build for the usual architectures (80, 90) compiles cuda-fa3's kernels empty (their bodies need
sm_90a's wgmma and setmaxnreg: cuda/CMakeLists.txt), so without this check a kernel that no longer
compiles, or one that ptxas has quietly slowed down, is first seen on a Hopper machine. The
slowdown to look for: where a wgmma's accumulators are issued in one branch and waited for in
another, ptxas serializes every wgmma of the kernel and says so only as an "info" line (C7515,
C7518, ...: "wgmma.mma_async instructions are serialized"); a d = 128 backward built that way ran
22-75% slower (docs/cuda_fa3.md, "the next step's scores issued early").

    python3 cuda/tools/fa3_ptxas_check.py [--nvcc PATH] [--jobs 2] [--out DIR]
    python3 cuda/tools/fa3_ptxas_check.py --log FILE [FILE ...]    (read ptxas -v logs only)

Compiles cuda/fa3/backend.cu (the forward) and cuda/fa3/backward.cu with `nvcc -cubin
-arch=sm_90a -O3 -Xptxas -v` (about six minutes each on one core; --jobs at a time), writes each
log and the table to --out (default build/fa3_ptxas), and prints a Markdown table: one row per
kernel (demangled where c++filt is found), its registers per thread, stack frame, spill stores and
spill loads, and "SERIALIZED" where ptxas serialized its wgmmas. Exit status: 0; 1 if a file did
not compile or any kernel is serialized (each named); 2 for bad arguments (`error:`), before
anything runs. Spills are reported, not judged: the producer warpgroup's 24 registers spill by
design (docs/cuda_fa3.md). Standard library only.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

SOURCES = ("cuda/fa3/backend.cu", "cuda/fa3/backward.cu")
ENTRY = re.compile(r"Compiling entry function '([^']+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SERIALIZED = re.compile(r"wgmma\S* instructions are serialized.*function '([^']+)'")


class Kernel:
    def __init__(self, name, source):
        self.name, self.source = name, source
        self.registers = self.stack = self.spill_stores = self.spill_loads = None
        self.serialized = False


def parse(text, source):
    """The kernels of one ptxas -v log, in its order; serialization notes name their kernel,
    which may come before or after its entry line."""
    kernels, current, serialized = {}, None, set()
    for line in text.splitlines():
        m = SERIALIZED.search(line)
        if m:
            serialized.add(m.group(1))
            continue
        m = ENTRY.search(line)
        if m:
            current = kernels.setdefault(m.group(1), Kernel(m.group(1), source))
            continue
        if current is None:
            continue
        m = FRAME.search(line)
        if m:
            current.stack, current.spill_stores, current.spill_loads = (int(g) for g in m.groups())
        m = USED.search(line)
        if m:
            current.registers = int(m.group(1))
    for name in serialized:
        kernels.setdefault(name, Kernel(name, source)).serialized = True
    return list(kernels.values())


def demangle(names):
    """c++filt's readable names, shortened; the mangled ones where c++filt is missing."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return dict(zip(names, names))
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    readable = out.stdout.splitlines() if out.returncode == 0 else names
    if len(readable) != len(names):
        readable = names
    short = []
    for r in readable:
        r = re.sub(r"^void ", "", r)
        r = re.sub(r"\(flashattn::[A-Za-z0-9_:]+\)$", "", r)
        short.append(r.replace("flashattn::", "").replace("__nv_bfloat16", "bf16")
                     .replace("__half", "f16"))
    return dict(zip(names, short))


def table(kernels):
    names = demangle([k.name for k in kernels])
    cell = lambda v: "?" if v is None else str(v)
    rows = ["| file | kernel | registers | stack bytes | spill stores | spill loads | wgmma |",
            "|---|---|---:|---:|---:|---:|---|"]
    for k in kernels:
        rows.append(f"| {os.path.basename(k.source)} | `{names[k.name]}` | {cell(k.registers)} | "
                    f"{cell(k.stack)} | {cell(k.spill_stores)} | {cell(k.spill_loads)} | "
                    f"{'SERIALIZED' if k.serialized else 'ok'} |")
    return "\n".join(rows)


def compile_all(root, nvcc, jobs, out_dir):
    """nvcc on each source, `jobs` at a time, with a line each minute while they run. Returns
    (kernels, failures)."""
    flags = ["-std=c++17", "-O3", "-arch=sm_90a", "-cubin", "--expt-relaxed-constexpr",
             "-DFLASHATTN_HAVE_SM90A", "-I", root, "-Xptxas", "-v"]
    pending, running, kernels, failures = list(SOURCES), [], [], []
    start = last_note = time.monotonic()
    while pending or running:
        while pending and len(running) < jobs:
            src = pending.pop(0)
            stem = os.path.splitext(src.replace("/", "_"))[0]
            log = open(os.path.join(out_dir, stem + ".log"), "w+")
            cmd = [nvcc] + flags + ["-o", os.path.join(out_dir, stem + ".cubin"),
                                    os.path.join(root, src)]
            print(f"compiling {src} for sm_90a", flush=True)
            running.append((src, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
        time.sleep(1)
        for item in list(running):
            src, log, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            log.seek(0)
            text = log.read()
            log.close()
            print(f"{src}: {'done' if proc.returncode == 0 else 'FAILED'} after "
                  f"{time.monotonic() - start:.0f} s", flush=True)
            if proc.returncode != 0:
                failures.append(f"{src} did not compile (nvcc exit status {proc.returncode}):\n"
                                + "\n".join(text.splitlines()[-20:]))
            kernels += parse(text, src)
        if running and time.monotonic() - last_note >= 60:
            last_note = time.monotonic()
            print(f"  ... {', '.join(s for s, _, _ in running)} still compiling "
                  f"({last_note - start:.0f} s)", flush=True)
    return kernels, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvcc", help="nvcc to run (default: nvcc on PATH, then /usr/local/cuda/bin)")
    ap.add_argument("--jobs", type=int, default=2, help="files compiled at a time (default 2)")
    ap.add_argument("--out", default="build/fa3_ptxas", help="logs, cubins and table.md go here")
    ap.add_argument("--log", nargs="+", metavar="FILE",
                    help="read these ptxas -v logs instead of compiling")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", ".."), help=argparse.SUPPRESS)
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    if a.jobs < 1:
        ap.error(f"--jobs = {a.jobs}: must be at least 1")
    if a.log:
        missing = [f for f in a.log if not os.path.isfile(f)]
        if missing:
            ap.error(f"--log: no such file: {', '.join(missing)}")
        kernels, failures = [], []
        for f in a.log:
            with open(f) as fh:
                kernels += parse(fh.read(), f)
    else:
        nvcc = a.nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not (os.path.isfile(nvcc) and os.access(nvcc, os.X_OK)):
            ap.error(f"--nvcc: {nvcc} is not an executable file")
        missing = [s for s in SOURCES if not os.path.isfile(os.path.join(root, s))]
        if missing:
            ap.error(f"not a flashattn checkout ({root}): {', '.join(missing)} missing")
        os.makedirs(a.out, exist_ok=True)
        kernels, failures = compile_all(root, nvcc, a.jobs, a.out)
    text = table(kernels)
    print(text)
    if not a.log:
        with open(os.path.join(a.out, "table.md"), "w") as fh:
            fh.write(text + "\n")
    serialized = [k for k in kernels if k.serialized]
    for k in serialized:
        failures.append(f"ptxas serialized the wgmmas of {demangle([k.name])[k.name]} "
                        f"({k.source}): a product issued in one branch and waited for in another?")
    if not kernels and not failures:
        failures.append("no kernel found in the ptxas output")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    print(f"{len(kernels)} kernels, {len(serialized)} with serialized wgmmas, "
          f"{sum(1 for k in kernels if k.spill_stores)} with spill stores", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
