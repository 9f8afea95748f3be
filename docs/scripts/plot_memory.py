#!/usr/bin/env python3
"""docs/scripts/plot_memory.py — GPU memory of one attention forward + backward, standard vs flash.

Usage: python3 docs/scripts/plot_memory.py MEMORY.jsonl OUT.png
Input: the JSON rows of `flashattn bench --pass both --repeat 1 --warmup 0 --json` for
cuda-standard and cuda-fa2 (fp32) and cuda-tc (--dtype f16) at one (B, H, d) and several N (the
command is in docs/cuda_backward.md). Each row's extra_bytes is the working memory the backend
allocated beyond its inputs and outputs (DeviceWorkspace, counted as it allocates).

Peak memory of the backward, plotted = the arrays it holds + its working memory:
  inputs and outputs, as the backend holds them: Q, K, V, dO (4 B H N d values of 4 bytes, or 2
  for cuda-tc's 16-bit copies), O, dQ, dK, dV (4 B H N d floats) and LSE (B H N floats);
  + extra_bytes of the backward (cuda-standard: P and dP, 2 B H N^2 floats; the flash forms: D,
  B H N floats). The forward's own working memory (cuda-standard's S/P) is freed before.
Needs matplotlib (Debian: python3-matplotlib).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"cuda-standard": "cuda-standard (P, dP in HBM; fp32)",
          "cuda-fa2": "cuda-fa2 (flash, fp32)", "cuda-tc": "cuda-tc (flash, fp16 inputs)"}


def held_bytes(row):
    B, H, N, d = row["batch"], row["heads"], row["seq_q"], row["dim"]
    input_bytes = 2 if row["dtype"] in ("f16", "bf16") else 4
    return 4 * B * H * N * d * input_bytes + 4 * B * H * N * d * 4 + B * H * N * 4


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_memory.py MEMORY.jsonl OUT.png")
    series = {}
    for line in open(sys.argv[1]):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("pass") != "backward":
            continue
        series.setdefault(r["backend"], []).append((r["seq_q"], held_bytes(r) + r["extra_bytes"]))
    first = next(json.loads(l) for l in open(sys.argv[1]) if l.startswith("{"))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        points.sort()
        ax.plot([n for n, _ in points], [b / 2**30 for _, b in points], marker="o",
                label=LABELS.get(name, name))
        for n, b in points[-1:]:
            ax.annotate(f"{b / 2**30:.2f} GiB", (n, b / 2**30), textcoords="offset points",
                        xytext=(-10, 6), ha="right", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("peak GPU memory of the backward (GiB)")
    ax.set_title(f"attention backward, B = {first['batch']}, H = {first['heads']}, "
                 f"d = {first['dim']}: {first['device_name']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    for name, points in series.items():
        print(name, " ".join(f"N={n}:{b / 2**30:.3f}GiB" for n, b in sorted(points)))


if __name__ == "__main__":
    main()
