#!/usr/bin/env python3
"""cuda/tools/ab_builds.py — the same benchmark points on two or more builds of `flashattn`, run
alternately, so that a change is measured against the build before it on one machine, in one
run (the A/B tables of docs/cuda_fa3.md and docs/decoding.md).

    python3 cuda/tools/ab_builds.py --backend cuda-fa3 [--pass forward] [--rounds 2] [--repeat 20]
        [--json FILE] [--bench-args "--heads-kv 8"]
        base=/tmp/base/build/bin/flashattn new=build/bin/flashattn -- \\
        f16,16,16,1024,128 bf16,8,12,1024,64,c

A build is label=path, or label=path@VARIANT to run that build with FLASHATTN_VARIANT=VARIANT
(cuda/host/variants.hpp), so that two tile shapes of one build compare the same way:
pp=build/gpu/bin/flashattn@cuda-fa3=d128-Bc128-pingpong b176=build/gpu/bin/flashattn@cuda-fa3=d128-Bc176.
A point is dtype,B,H,N,d with ",c" for causal (N_q = N_kv = N). Each round runs every point on
every build in turn (`flashattn bench --backends BACKEND --pass PASS --repeat R --json`), each
build's line printed as it comes. Then a Markdown table: per point, each build's median over the
rounds of bench's median ms, the spread of the rounds (min-max), and each build's time over the
first build's (< 1: faster). Two builds of one tree made side by side: `git archive` the commit
before the change into a folder, configure and build both with the same CMake options.

A point that fails on some build is reported (bench's error), and where a build failed at every
round the table reads "failed" in its cells (its ratio too; every ratio where the first build
failed) while the other builds' times show; the exit status is then 1. A variant named for one
head dim fails at the others' points: give such points a run of their own. Bad arguments: `error:`
and exit status 2, before anything runs.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

DTYPES = ("f32", "f16", "bf16")


class Point:
    """One benchmark point: dtype,B,H,N,d[,c]."""

    def __init__(self, text):
        fields = text.split(",")
        causal = len(fields) == 6 and fields[5] == "c"
        if len(fields) not in (5, 6) or (len(fields) == 6 and not causal):
            raise ValueError(f"point {text!r}: expected dtype,B,H,N,d or dtype,B,H,N,d,c")
        if fields[0] not in DTYPES:
            raise ValueError(f"point {text!r}: dtype {fields[0]!r} is not one of "
                             f"{', '.join(DTYPES)}")
        try:
            self.B, self.H, self.N, self.d = (int(f) for f in fields[1:5])
        except ValueError:
            raise ValueError(f"point {text!r}: B, H, N and d must be integers") from None
        if min(self.B, self.H, self.N, self.d) < 1:
            raise ValueError(f"point {text!r}: B, H, N and d must be at least 1")
        self.text, self.dtype, self.causal = text, fields[0], causal

    def bench_args(self):
        return (["--dtype", self.dtype, "--batch", str(self.B), "--heads", str(self.H),
                 "--seq", str(self.N), "--dim", str(self.d)] +
                (["--causal"] if self.causal else []))


def parse_builds(specs):
    """label=path[@VARIANT] specs as (label, path, variant or None); labels unique, each path an
    executable file."""
    builds = []
    for spec in specs:
        label, sep, rest = spec.partition("=")
        path, at, variant = rest.partition("@")
        if not sep or not label or not path:
            raise ValueError(f"build {spec!r}: expected label=path/to/flashattn[@VARIANT]")
        if at and not variant:
            raise ValueError(f"build {label!r}: nothing after @ (a FLASHATTN_VARIANT value, "
                             f"e.g. cuda-fa3=d128-Bc128)")
        if label in (b[0] for b in builds):
            raise ValueError(f"build label {label!r} is given twice")
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ValueError(f"build {label!r}: {path} is not an executable file")
        builds.append((label, path, variant or None))
    if len(builds) < 2:
        raise ValueError("give at least two builds (label=path ...) to compare")
    return builds


def run_point(binary, variant, backend, pass_, repeat, point, extra):
    """bench's median ms for the backend at the point, or the reason it failed."""
    cmd = ([binary, "bench", "--backends", backend, "--pass", pass_, "--repeat", str(repeat),
            "--json"] + point.bench_args() + extra)
    env = dict(os.environ, FLASHATTN_VARIANT=variant) if variant else None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    except subprocess.TimeoutExpired:
        return None, "bench ran past 600 s"
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("backend") == backend and row.get("pass", pass_) == pass_:
                return float(row["median_ms"]), None
    reason = (out.stderr.strip() or out.stdout.strip() or f"exit status {out.returncode}")
    return None, reason.splitlines()[-1]


def table(points, builds, times):
    labels = [label for label, _, _ in builds]
    head = ["point"] + [f"{l} ms (spread)" for l in labels] + [f"{l} / {labels[0]}"
                                                              for l in labels[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in points:
        # A build that failed at every round of a point reads "failed" there, and so do its
        # ratio and, where the first build failed, every ratio: the others' times still show.
        runs = [times.get((p.text, l), []) for l in labels]
        if not any(runs):
            continue
        med = [statistics.median(r) if r else None for r in runs]
        cells = [p.text] + [f"{m:.4f} ({min(r):.4f}-{max(r):.4f})" if r else "failed"
                            for m, r in zip(med, runs)]
        cells += [f"{m / med[0]:.3f}" if m is not None and med[0] is not None else "failed"
                  for m in med[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("error: separate the builds from the points with --\n"
              "usage: ab_builds.py --backend NAME [options] label=bin[@VARIANT] ... -- POINT ...",
              file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(
        prog="ab_builds.py", description="Benchmark points on two or more flashattn builds, "
        "alternately; prints a table of medians and ratios to the first build.")
    ap.add_argument("--backend", required=True, help="the backend to time (e.g. cuda-fa3)")
    ap.add_argument("--pass", dest="pass_", default="forward", choices=("forward", "backward"))
    ap.add_argument("--rounds", type=int, default=2, help="times every point runs on every build")
    ap.add_argument("--repeat", type=int, default=20, help="bench's --repeat per run")
    ap.add_argument("--bench-args", default="", help="more bench options for every run, quoted")
    ap.add_argument("--json", help="write every measurement here (one JSON object per line)")
    ap.add_argument("builds", nargs="+", metavar="label=path[@VARIANT]")
    try:
        args = ap.parse_args(argv[:cut])
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        if args.rounds < 1 or args.repeat < 1:
            raise ValueError("--rounds and --repeat must be at least 1")
        builds = parse_builds(args.builds)
        points = [Point(t) for t in argv[cut + 1:]]
        if not points:
            raise ValueError("give at least one point after --")
        extra = shlex.split(args.bench_args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    times, failed, records = {}, [], []
    for r in range(args.rounds):
        for p in points:
            for label, binary, variant in builds:
                ms, reason = run_point(binary, variant, args.backend, args.pass_, args.repeat, p,
                                       extra)
                if ms is None:
                    failed.append(f"{label} {p.text}: {reason}")
                    print(f"round {r + 1}/{args.rounds}  {label:>8}  {p.text}  FAILED: {reason}",
                          flush=True)
                    continue
                times.setdefault((p.text, label), []).append(ms)
                records.append(dict(round=r + 1, build=label, point=p.text,
                                    backend=args.backend, median_ms=ms, **{"pass": args.pass_}))
                print(f"round {r + 1}/{args.rounds}  {label:>8}  {p.text}  {ms:.4f} ms",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            for rec in records:
                f.write(json.dumps(rec) + "\n")
    print()
    print(f"{args.backend}, {args.pass_}: median over {args.rounds} round(s) of bench's median "
          f"ms (--repeat {args.repeat}); spread = the rounds' min-max; ratio < 1: faster")
    print(table(points, builds, times))
    if failed:
        print("\nfailed:\n" + "\n".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
