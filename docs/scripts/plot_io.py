#!/usr/bin/env python3
"""docs/scripts/plot_io.py — the figure of docs/io_complexity.md: measured HBM accesses of
standard attention and FlashAttention against N and against M, log-log, with Theorem 2's
expressions (up to their constant factor) drawn through the middle measured point.

Input: the CSV that `04_io_counting --csv FILE` writes (columns sweep, N, M, d, standard_reads,
standard_writes, flash_reads, flash_writes). Needs matplotlib (Debian: python3-matplotlib).

    build/release/bin/04_io_counting --csv /tmp/io.csv
    python3 docs/scripts/plot_io.py /tmp/io.csv docs/images/io_complexity.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for key in r:
            if key != "sweep":
                r[key] = int(r[key])
        r["standard"] = r["standard_reads"] + r["standard_writes"]
        r["flash"] = r["flash_reads"] + r["flash_writes"]
    return rows


def panel(ax, rows, var, title):
    x = [r[var] for r in rows]
    anchor = rows[len(rows) // 2]  # the theory curves pass through the middle measurement

    def theory(r, kind):
        N, M, d = r["N"], r["M"], r["d"]
        return N * d + N * N if kind == "standard" else N * N * d * d / M

    for kind, label, color in (("standard", "standard (Algorithm 0)", "tab:red"),
                               ("flash", "FlashAttention (Algorithm 1)", "tab:blue")):
        ax.plot(x, [r[kind] for r in rows], "o-", color=color, label=label + ", measured")
        scale = anchor[kind] / theory(anchor, kind)
        expr = "Θ(Nd + N²)" if kind == "standard" else "Θ(N²d²/M)"
        ax.plot(x, [scale * theory(r, kind) for r in rows], "--", color=color, alpha=0.6,
                label="Theorem 2: " + expr)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(var + (" (sequence length)" if var == "N" else " (SRAM size, floats)"))
    ax.set_ylabel("HBM element accesses (reads + writes)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_io.py IO.csv OUT.png")
    rows = load(sys.argv[1])
    by_n = [r for r in rows if r["sweep"] == "N"]
    by_m = [r for r in rows if r["sweep"] == "M"]
    d = rows[0]["d"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    panel(left, by_n, "N", "vs N (d = %d, M = %d floats)" % (d, by_n[0]["M"]))
    panel(right, by_m, "M", "vs M (d = %d, N = %d)" % (d, by_m[0]["N"]))
    fig.suptitle("Theorem 2, measured: examples/04_io_counting")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
