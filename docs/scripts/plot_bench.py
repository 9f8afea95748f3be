#!/usr/bin/env python3
"""docs/scripts/plot_bench.py — runtime and working memory against sequence length, per backend,
log-log: the plots of docs/results.md, docs/results_cpu.md and docs/results_archive.md.

Input: a file of JSON lines as `flashattn bench --json` prints them, one measured row per line,
with at least the keys backend, seq_q, median_ms and extra_bytes (gflops, dtype, dim, heads,
batch, causal, threads are used when present). Lines that are not JSON objects are skipped, so
a captured terminal log works too. Output: one PNG with two panels.

    flashattn bench --backends standard,scalar,omp --batch 1 --heads 1 --seq N --dim 64 --json >> rows.jsonl
    python3 docs/scripts/plot_bench.py rows.jsonl docs/images/cpu_bench_epyc2.png --title "..."

Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REQUIRED = ("backend", "seq_q", "median_ms", "extra_bytes")
# Keys that must agree within one curve: a curve is one backend on one kind of problem.
SHAPE_KEYS = ("batch", "heads", "heads_kv", "dim", "causal", "dtype", "threads")


def load(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            missing = [k for k in REQUIRED if k not in row]
            if missing:
                sys.exit("%s:%d: row lacks %s" % (path, number, ", ".join(missing)))
            rows.append(row)
    if not rows:
        sys.exit("%s: no JSON rows" % path)
    return rows


def curves(rows):
    """Rows grouped by backend and problem kind; label -> rows sorted by seq_q."""
    groups = defaultdict(list)
    for r in rows:
        kind = tuple((k, r[k]) for k in SHAPE_KEYS if k in r)
        groups[(r["backend"], kind)].append(r)
    kinds = {kind for _, kind in groups}
    result = {}
    for (backend, kind), members in sorted(groups.items(), key=lambda g: (str(g[0][1]), g[0][0])):
        # Name the problem kind in the label only when the file mixes several kinds.
        label = backend if len(kinds) == 1 else backend + " (" + ", ".join(
            "%s=%s" % kv for kv in kind) + ")"
        result[label] = sorted(members, key=lambda r: r["seq_q"])
    return result


def describe(rows):
    first = rows[0]
    parts = ["%s=%s" % (k, first[k]) for k in SHAPE_KEYS if k in first and
             all(r.get(k) == first[k] for r in rows)]
    return ", ".join(parts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rows", help="JSON lines from `flashattn bench --json`")
    parser.add_argument("out", help="PNG to write")
    parser.add_argument("--title", default="", help="figure title (machine, date)")
    args = parser.parse_args()

    rows = load(args.rows)
    fig, (t_ax, m_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    for label, members in curves(rows).items():
        n = [r["seq_q"] for r in members]
        t_ax.plot(n, [r["median_ms"] for r in members], "o-", label=label)
        # A backend that reports 0 bytes (nothing beyond inputs and outputs) has no point on a
        # log axis; say so in the legend rather than drop it silently.
        mem = [(r["seq_q"], r["extra_bytes"]) for r in members if r["extra_bytes"] > 0]
        zero = len(mem) < len(members)
        m_ax.plot([x for x, _ in mem], [y / 2**20 for _, y in mem], "o-",
                  label=label + (" (0 B rows omitted)" if zero else ""))
    for ax, ylabel, title in ((t_ax, "time per call, median (ms)", "runtime"),
                              (m_ax, "working memory beyond inputs/outputs (MiB)",
                               "working memory (measured peak)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    common = describe(rows)
    fig.suptitle(args.title + ("\n" if args.title and common else "") + common, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
