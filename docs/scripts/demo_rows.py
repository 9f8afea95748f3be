#!/usr/bin/env python3
"""docs/scripts/demo_rows.py — CPU timing rows from `flashattn demo`, in `bench --json`'s format.

A stop-gap that made the first CPU table (now in docs/results_archive.md) before `flashattn bench`
existed: for each N it runs `flashattn demo` --repeat times, reads the table it prints, and writes
one JSON line per (backend, N) with the median of the repeats. Each demo run times one execute() per backend without warm-up, and
prints working memory rounded to 4 digits; `bench` measures properly and has replaced it.

    python3 docs/scripts/demo_rows.py build/release/bin/flashattn --seq 256 512 1024 > rows.jsonl

Standard library only.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def parse_table(text):
    """Rows of the demo table as dicts keyed by its header."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("backend "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows = []
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("FLOPs"):
            break
        rows.append(dict(zip(header, re.split(r"\s{2,}", line.strip()))))
    return rows


def to_bytes(text):
    value, unit = text.split()
    return int(round(float(value) * UNITS[unit]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("flashattn", help="path of the flashattn executable")
    parser.add_argument("--seq", type=int, nargs="+", required=True)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS for the runs")
    args = parser.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    # Round-robin over N, so that a burst of load from other processes spreads over all sizes
    # instead of spoiling one of them.
    times, last = {}, {}
    for _ in range(args.repeat):
        for n in args.seq:
            out = subprocess.run([args.flashattn, "demo", "--heads", str(args.heads), "--seq", str(n),
                                  "--dim", str(args.dim)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            for row in parse_table(out):
                if row["check"] != "ok":
                    sys.exit("N=%d: %s failed the accuracy check:\n%s" % (n, row["backend"], out))
                times.setdefault((n, row["backend"]), []).append(float(row["time ms"]))
                last[(n, row["backend"])] = row
    for (n, backend), ms in times.items():
        row = last[(n, backend)]
        median = statistics.median(ms)
        print(json.dumps({
            "backend": backend, "device": row["device"], "dtype": row["dtype"],
            "batch": 1, "heads": args.heads, "heads_kv": args.heads, "seq_q": n, "seq_kv": n,
            "dim": args.dim, "causal": False, "threads": args.threads,
            "median_ms": median, "min_ms": min(ms), "max_ms": max(ms),
            "gflops": 4.0 * args.heads * n * n * args.dim / median / 1e6,
            "extra_bytes": to_bytes(row["working mem"]),
            "source": "flashattn demo, %d runs, one execute() each, no warm-up" % args.repeat,
        }), flush=True)


if __name__ == "__main__":
    main()
