#!/usr/bin/env python3
"""cuda/tools/power_probe.py — what a long run of calls does to the clock: cuda-fa3's forward and
cuDNN's (PyTorch SDPA), each called back to back for a few seconds after an idle second, taking
turns, with nvidia-smi sampling the SM clock, the power and the throttle reasons beside them.

For each contender and round it prints the first three timings (10 calls between two CUDA events,
ms per call), the median of the second half and the TFLOP/s it implies, then the mean clock and
power over that second half and the throttle reasons seen (0x4: the software power cap). Why:
docs/cuda_fa3.md, "Timing under the power limit".

    PYTHONPATH=build/gpu/python python3 cuda/tools/power_probe.py [--seconds 2] [--rounds 2]
"""
import argparse
import datetime
import statistics
import subprocess
import sys
import tempfile
import time

# (B, H, N, d, causal): two long non-causal shapes and GPT-sized short causal work, fp16.
SHAPES = [(2, 8, 8192, 256, False), (2, 16, 8192, 128, False), (16, 32, 1024, 64, True)]
CHUNK = 10  # calls between two CUDA events


def sustained(torch, fn, seconds):
    """[(wall time, ms per call)] of fn called back to back for `seconds`."""
    out = []
    t_end = time.time() + seconds
    while time.time() < t_end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CHUNK):
            fn()
        stop.record()
        stop.synchronize()
        out.append((time.time(), start.elapsed_time(stop) / CHUNK))
    return out


def smi_samples(path):
    """[(wall time, MHz, W, reasons)] from nvidia-smi's CSV log."""
    rows = []
    for line in open(path):
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f")  # local time
            rows.append((t.timestamp(),
                         float(f[1].split()[0]), float(f[2].split()[0]), f[3]))
        except (ValueError, IndexError):
            continue  # a header or a cut line
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="how long each contender runs")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.seconds <= 0 or args.rounds < 1:
        ap.error("--seconds must be positive and --rounds at least 1")

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import flashattn

    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}; {datetime.date.today()}")
    log = tempfile.NamedTemporaryFile(suffix=".csv", delete=False).name
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,"
                            "clocks_throttle_reasons.active", "--format=csv,noheader", "-lms", "100"],
                           stdout=open(log, "w"), stderr=subprocess.DEVNULL)
    windows = []
    try:
        for b, h, n, d, causal in SHAPES:
            q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
            flops = 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)
            ours = lambda: flashattn.attention(q, k, v, causal=causal, backend="cuda-fa3")
            sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            for rnd in range(args.rounds):
                for name, fn in (("cuda-fa3", ours), ("cudnn", sdpa)):
                    time.sleep(1.0)
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        series = sustained(torch, fn, args.seconds)
                    ms = [m for _, m in series]
                    late = statistics.median(ms[len(ms) // 2:])
                    label = f"B {b} H {h} N {n} d {d}{' causal' if causal else ''}, round {rnd}, {name}"
                    windows.append((label, series[len(series) // 2][0], series[-1][0]))
                    print(f"{label}: first {' '.join(f'{m:.3f}' for m in ms[:3])} ms, second half "
                          f"{late:.3f} ms ({flops / late / 1e9:.0f} TFLOP/s)", flush=True)
            del q, k, v
    finally:
        smi.terminate()
        smi.wait()
    samples = smi_samples(log)
    print("\n# over each second half: mean SM clock, mean power, throttle reasons")
    for label, begin, end in windows:
        sel = [s for s in samples if begin <= s[0] <= end]
        if sel:
            print(f"{label}: {statistics.mean(s[1] for s in sel):.0f} MHz, "
                  f"{statistics.mean(s[2] for s in sel):.0f} W, "
                  f"{','.join(sorted(set(s[3] for s in sel)))} ({len(sel)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
