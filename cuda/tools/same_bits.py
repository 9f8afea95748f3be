#!/usr/bin/env python3
"""cuda/tools/same_bits.py — two builds of `flashattn`, the same inputs, the same output bytes?

Runs `flashattn run` of a baseline build and of a new one on the same random inputs, for every
CUDA backend the new build lists, forward and (where there is one) backward, over a few odd
problems (ragged N, causal with N_q != N_kv, GQA, a block mask, a negative scale), and compares
every output file byte for byte. cuda-tc's backward adds dQ with atomics, whose order changes
from run to run, so every run sets FLASHATTN_DETERMINISTIC=1 (the fixed dQ order). A variant
can be named per backend with --variants (FLASHATTN_VARIANT's syntax), repeatable.

Usage: same_bits.py --new BUILD/bin/flashattn --base BASE/bin/flashattn --work DIR
Prints one line per (backend, problem, dtype): "same" or which outputs differ; exit 1 on any
difference or failure. Needs NumPy.
"""
import argparse
import os
import subprocess
import sys

import numpy as np

# (name, B, H, H_kv, N_q, N_kv, d, options)
PROBLEMS = [
    ("ragged", 2, 4, 4, 203, 203, 64, []),
    ("causal-nq<nkv", 1, 4, 2, 113, 301, 128, ["--causal"]),
    ("gqa-scale", 2, 8, 2, 257, 129, 64, ["--scale", "-0.3"]),
    ("block-mask", 1, 2, 1, 300, 260, 128, ["--block-mask", "{mask}", "--mask-block-q", "64",
                                            "--mask-block-kv", "64"]),
]
DTYPES = {"cuda-tc": ["f16", "bf16"], "cuda-fa3": ["f16", "bf16"]}


def run(binary, args, env):
    r = subprocess.run([binary, "run"] + args, capture_output=True, text=True, env=env)
    return r.returncode, r.stderr.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--backends", help="comma-separated (default: every CUDA backend listed)")
    ap.add_argument("--variants", action="append", default=[],
                    help="FLASHATTN_VARIANT value to add a run for (e.g. cuda-fa2=ffma)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    listed = subprocess.run([args.new, "backends", "--verbose"], capture_output=True,
                            text=True).stdout
    has_backward = {line.split()[0]: "backward: yes" in line for line in listed.splitlines()}
    backends = (args.backends.split(",") if args.backends
                else [b for b in has_backward if b.startswith("cuda-")])
    rng = np.random.default_rng(20261125)
    failures = 0
    for name, B, H, Hkv, Nq, Nkv, d, options in PROBLEMS:
        files = {}
        for key, shape in (("q", (B, H, Nq, d)), ("k", (B, Hkv, Nkv, d)),
                           ("v", (B, Hkv, Nkv, d)), ("dout", (B, H, Nq, d))):
            files[key] = os.path.join(args.work, f"{name}_{key}.npy")
            np.save(files[key], rng.standard_normal(shape).astype(np.float32))
        mask = os.path.join(args.work, f"{name}_mask.npy")
        np.save(mask, (rng.random((-(-Nq // 64), -(-Nkv // 64))) < 0.6).astype(np.uint8))
        options = [o.replace("{mask}", mask) for o in options]
        for backend in backends:
            for dtype in DTYPES.get(backend, ["f32"]):
                for variant in [None] + [v for v in args.variants if v.startswith(backend + "=")]:
                    env = dict(os.environ, FLASHATTN_DETERMINISTIC="1")
                    if variant:
                        env["FLASHATTN_VARIANT"] = variant
                    label = f"{backend} {name} {dtype}" + (f" [{variant}]" if variant else "")
                    outputs = ["out", "lse"] + (["dq", "dk", "dv"] if has_backward[backend] else [])
                    results = {}
                    for build, binary in (("base", args.base), ("new", args.new)):
                        paths = {o: os.path.join(args.work, f"{build}_{o}.npy") for o in outputs}
                        for p in paths.values():
                            if os.path.exists(p):
                                os.remove(p)
                        cmd = ["--backend", backend, "--q", files["q"], "--k", files["k"],
                               "--v", files["v"], "--dtype", dtype] + options
                        cmd += [arg for o in outputs for arg in (f"--{o}", paths[o])]
                        if has_backward[backend]:
                            cmd += ["--dout", files["dout"]]
                        results[build] = run(binary, cmd, env) + (paths,)
                    (rc_b, err_b, paths_b), (rc_n, err_n, paths_n) = results["base"], results["new"]
                    if rc_b != 0 or rc_n != 0:
                        same = rc_b == rc_n and err_b == err_n
                        print(f"{label}: {'same refusal' if same else 'DIFFERENT exit'} "
                              f"(base {rc_b}: {err_b[:100]} | new {rc_n}: {err_n[:100]})")
                        failures += not same
                        continue
                    differ = [o for o in outputs
                              if open(paths_b[o], "rb").read() != open(paths_n[o], "rb").read()]
                    print(f"{label}: " + ("same" if not differ else "DIFFER in " + ", ".join(differ)))
                    failures += bool(differ)
    print(f"same_bits: {failures} difference(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
