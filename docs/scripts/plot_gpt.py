#!/usr/bin/env python3
"""docs/scripts/plot_gpt.py — the two loss curves of examples/python/gpt.py, overlaid.

Usage: python3 docs/scripts/plot_gpt.py GPT.csv OUT.png [TITLE]
Input: the CSV of `gpt.py --csv` (step, loss_flashattn, loss_sdpa, and loss_sdpa_math with
--noise: then PyTorch's MATH run is drawn too, and the lower panel shows both differences from
SDPA's). Needs matplotlib (Debian: python3-matplotlib).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: plot_gpt.py GPT.csv OUT.png [TITLE]")
    with open(sys.argv[1]) as f:
        rows = list(csv.DictReader(f))
    step = [int(r["step"]) for r in rows]
    ours = [float(r["loss_flashattn"]) for r in rows]
    theirs = [float(r["loss_sdpa"]) for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    top.plot(step, theirs, label="PyTorch scaled_dot_product_attention", linewidth=2.5, alpha=0.6)
    top.plot(step, ours, label="flashattn.attention (our forward and backward)", linewidth=1)
    noise = [float(r["loss_sdpa_math"]) for r in rows] if "loss_sdpa_math" in rows[0] else None
    if noise:
        top.plot(step, noise, label="PyTorch SDPA, MATH backend (the yardstick)", linewidth=1,
                 linestyle="--")
    top.set_ylabel("training loss (cross-entropy)")
    top.legend()
    top.set_title(sys.argv[3] if len(sys.argv) == 4 else "char-level GPT, same seed and batches")
    bottom.plot(step, [a - b for a, b in zip(ours, theirs)], color="black", linewidth=0.8,
                label="flashattn - sdpa")
    if noise:
        bottom.plot(step, [a - b for a, b in zip(noise, theirs)], color="tab:red", linewidth=0.8,
                    linestyle="--", label="sdpa MATH - sdpa")
        bottom.legend(fontsize=7)
    bottom.set_ylabel("difference")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
