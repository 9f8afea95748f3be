#!/usr/bin/env python3
"""docs/scripts/ring_model.py — the scaling model of ring attention (docs/ring_attention.md).

    python3 docs/scripts/ring_model.py [--plot docs/images/ring_scaling.png]

One ring step on one device computes a (N_local x N_local) block and, at the same time, passes a
K/V block to the next device:
    compute  t_c = 4 B H N_local^2 d / F              (two matmuls, 2 FLOPs per multiply-add)
    transfer t_x = 2 B H_kv N_local d bytes / BW       (K and V)
The transfer hides behind the compute when t_c >= t_x, i.e. N_local >= bytes F H_kv / (2 BW H),
whatever B and d. A forward of W steps takes about W (max(t_c, t_x) + latency); the ideal is
W t_c, so the efficiency is t_c / (max(t_c, t_x) + latency). Prints the crossover N_local per
link and the efficiency for 2..64 devices at a few whole-sequence lengths; with matplotlib,
draws the curves. All rates are assumptions stated below, not measurements.
"""
import argparse

# Assumed rates (per device, per direction). H100 SXM: ~989 TFLOP/s dense bf16 peak; ~700 is what
# a good attention kernel reaches. Links: NVLink 4 450 GB/s per direction per GPU; PCIe 5.0 x16
# 64 GB/s per direction (assume 50 achieved); InfiniBand NDR 400 Gb/s = 50 GB/s per GPU (assume
# 45 achieved). Per-step latency: what a point-to-point exchange costs even when tiny.
FLOPS = 700e12
LINKS = {  # name: (bytes/s, seconds of latency per step)
    "NVLink (450 GB/s)": (450e9, 10e-6),
    "PCIe 5.0 x16 (50 GB/s)": (50e9, 15e-6),
    "InfiniBand NDR (45 GB/s)": (45e9, 20e-6),
}
BYTES = 2  # bf16
B, H, D = 1, 32, 128  # one sequence, 32 query heads of 128 (a 4096-wide model)
DEVICES = [2, 4, 8, 16, 32, 64]
SEQUENCES = [32 * 1024, 128 * 1024, 1024 * 1024]


def step_times(n_local, h_kv, bw, flops=FLOPS):
    t_c = 4 * B * H * n_local ** 2 * D / flops
    t_x = 2 * B * h_kv * n_local * D * BYTES / bw
    return t_c, t_x


def efficiency(n_local, h_kv, bw, latency):
    t_c, t_x = step_times(n_local, h_kv, bw)
    return t_c / (max(t_c, t_x) + latency)


def crossover(h_kv, bw):
    return BYTES * FLOPS * h_kv / (2 * bw * H)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--plot", help="write the efficiency curves (PNG) here")
    args = p.parse_args()
    print(f"Assumed: F = {FLOPS / 1e12:.0f} TFLOP/s (bf16 dense), {BYTES} bytes per element, "
          f"B = {B}, H = {H}, d = {D}\n")
    print("| link | N_local where transfer = compute, H_kv = H (MHA) | H_kv = H/4 (GQA) |")
    print("|---|---|---|")
    for name, (bw, _) in LINKS.items():
        print(f"| {name} | {crossover(H, bw):,.0f} | {crossover(H // 4, bw):,.0f} |")
    print("\nEfficiency t_c / (max(t_c, t_x) + latency), H_kv = H (MHA), per whole sequence n:\n")
    header = " | ".join(f"W = {w}" for w in DEVICES)
    print(f"| n | link | {header} |")
    print("|---|---|" + "---|" * len(DEVICES))
    for n in SEQUENCES:
        for name, (bw, latency) in LINKS.items():
            row = " | ".join(f"{efficiency(n / w, H, bw, latency):.2f}" for w in DEVICES)
            print(f"| {n // 1024}k | {name} | {row} |")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(SEQUENCES), figsize=(12, 3.6), sharey=True)
        for ax, n in zip(axes, SEQUENCES):
            for name, (bw, latency) in LINKS.items():
                ax.plot(DEVICES, [efficiency(n / w, H, bw, latency) for w in DEVICES], "o-",
                        label=name)
            ax.set_xscale("log", base=2)
            ax.set_xticks(DEVICES, [str(w) for w in DEVICES])
            ax.set_title(f"n = {n // 1024}k tokens")
            ax.set_xlabel("devices W")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("efficiency (model)")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"Ring attention forward, model: H = {H}, d = {D}, bf16, "
                     f"{FLOPS / 1e12:.0f} TFLOP/s per device")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"\nwrote {args.plot}")


if __name__ == "__main__":
    main()
