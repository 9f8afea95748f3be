#!/usr/bin/env python3
"""cuda/tools/ab_env.py — one training call of flashattn.attention (forward and backward through
autograd, as a PyTorch user runs it), or with `--pass forward` one forward call without
autograd, timed on one build under two or more environments, in alternating processes, so that a
switch read from the environment (FLASHATTN_DEPENDENT_LAUNCH, FLASHATTN_VARIANT, ...) is measured
with and without it on one machine, in one run.

    PYTHONPATH=build/gpu/python python3 cuda/tools/ab_env.py --rounds 3 \\
        off=FLASHATTN_DEPENDENT_LAUNCH=0 on= -- bf16,16,12,1024,64,c f16,16,16,1024,128

A setting is label=VAR=VALUE[,VAR=VALUE...] (label= for the environment as it is; the variables
named by any setting are removed from the others). A point is dtype,B,H,N,d with ",c" for causal
(N_q = N_kv = N; dtype f32, f16 or bf16). Each round runs every point under every setting in turn,
each in a fresh process: 20 calls to warm up, then `--reps` timings of `--calls` calls between two
CUDA events, whose median is the process's µs per call. Then a Markdown table: per point, each
setting's median over the rounds (and the rounds' min-max), and each one's time over the first
setting's (< 1: faster).

Where the host takes longer to queue a call than the GPU to run it, the times measure the host
and move by tens of percent from process to process: choose shapes large enough that the GPU
sets the pace (at d = 64, N = 1024, bf16 on an H200: B·H ≥ 192). Bad arguments: `error:` and
exit status 2, before anything runs.
"""
import argparse
import os
import statistics
import subprocess
import sys

from ab_builds import Point  # the same points as the A/B of two builds

TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}

# The child: one point under the environment it was started with; prints µs per call.
CHILD = r"""
import sys, torch, flashattn
dtype, B, H, N, d, causal, calls, reps, which = sys.argv[1:]
dtype = getattr(torch, dtype)
B, H, N, d, calls, reps = int(B), int(H), int(N), int(d), int(calls), int(reps)
causal = causal == "1"
training = which == "training"
q, k, v = (torch.randn(B, H, N, d, device="cuda", dtype=dtype, requires_grad=training)
           for _ in range(3))
do = torch.randn(B, H, N, d, device="cuda", dtype=dtype)

def call():
    if training:
        q.grad = k.grad = v.grad = None
        flashattn.attention(q, k, v, causal=causal).backward(do)
    else:
        flashattn.attention(q, k, v, causal=causal)

for _ in range(20):
    call()
torch.cuda.synchronize()
times = []
for _ in range(reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end) * 1000.0 / calls)
print(sorted(times)[len(times) // 2])
"""


class Setting:
    """label=VAR=VALUE[,VAR=VALUE...], or label= for no change."""

    def __init__(self, text):
        label, sep, rest = text.partition("=")
        if not sep or not label:
            raise ValueError(f"setting '{text}': expected label=VAR=VALUE[,...] or label=")
        self.label = label
        self.vars = {}
        for item in filter(None, rest.split(",")):
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise ValueError(f"setting '{text}': '{item}' is not VAR=VALUE")
            self.vars[name] = value

    def environment(self, named):
        """The process's environment under this setting: every variable that any setting names
        (`named`) removed, then this setting's own set."""
        env = dict(os.environ)
        for name in named:
            env.pop(name, None)
        env.update(self.vars)
        return env


def parse_settings(texts):
    """The settings, each label used once, and the variables any of them names."""
    settings = [Setting(t) for t in texts]
    if len({s.label for s in settings}) != len(settings):
        raise ValueError("each setting needs its own label")
    return settings, {name for s in settings for name in s.vars}


def parse_point(text):
    """A point of ab_builds.py (dtype,B,H,N,d[,c])."""
    return Point(text)  # its dtypes are TORCH_DTYPES' keys


def run_point(python, point, setting, named, calls, reps, which="training"):
    env = setting.environment(named)
    args = [python, "-c", CHILD, TORCH_DTYPES[point.dtype], str(point.B), str(point.H), str(point.N),
            str(point.d), "1" if point.causal else "0", str(calls), str(reps), which]
    out = subprocess.run(args, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{point.text} under {setting.label}: {out.stderr.strip()[-1500:]}")
    try:
        return float(out.stdout.split()[-1])
    except (IndexError, ValueError):
        raise RuntimeError(f"{point.text} under {setting.label}: no time in its output "
                           f"{out.stdout.strip()[-200:]!r}") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--rounds", type=int, default=3, help="turns of every setting at every point")
    ap.add_argument("--calls", type=int, default=30, help="calls per timing")
    ap.add_argument("--reps", type=int, default=7, help="timings per process (their median)")
    ap.add_argument("--pass", dest="which", choices=("training", "forward"), default="training",
                    help="what a call is: forward and backward through autograd (training), or "
                    "the forward alone, without autograd (forward)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter each process runs (default: this one)")
    ap.add_argument("settings", nargs="+", help="label=VAR=VALUE[,...] or label=; then --, then "
                    "the points")
    argv = sys.argv[1:]
    at = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:at])
    setting_texts, point_texts = a.settings, argv[at + 1:]
    try:
        if "--" not in argv:
            raise ValueError("separate the settings from the points with --, then give the points")
        if a.rounds < 1 or a.calls < 1 or a.reps < 1:
            raise ValueError("--rounds, --calls and --reps must be at least 1")
        settings, named = parse_settings(setting_texts)
        points = [parse_point(t) for t in point_texts]
        if len(settings) < 2:
            raise ValueError("give at least two settings (label=VAR=VALUE or label=)")
        if not points:
            raise ValueError("give the points after --")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    rows = []
    failed = False
    for point in points:
        times = {s.label: [] for s in settings}
        for r in range(a.rounds):
            for s in settings:
                try:
                    us = run_point(a.python, point, s, named, a.calls, a.reps, a.which)
                except RuntimeError as e:
                    print(f"failed: {e}", file=sys.stderr)
                    failed = True
                    break
                times[s.label].append(us)
                print(f"round {r + 1}/{a.rounds} {s.label:>8}  {point.text}  {us:.1f} us",
                      flush=True)
        if all(len(t) == a.rounds for t in times.values()):
            rows.append((point, times))

    first = settings[0].label
    what = "forward + backward" if a.which == "training" else "forward"
    print(f"\nflashattn.attention {what}: median over {a.rounds} round(s) of each "
          f"process's median µs per call (--calls {a.calls}, --reps {a.reps}); spread = the "
          f"rounds' min-max; ratio < 1: faster than {first}")
    print("| point | " + " | ".join(f"{s.label} µs (spread)" for s in settings) + " | " +
          " | ".join(f"{s.label} / {first}" for s in settings[1:]) + " |")
    print("|---|" + "---|" * (2 * len(settings) - 1))
    for point, times in rows:
        med = {k: statistics.median(v) for k, v in times.items()}
        cells = [f"{med[s.label]:.1f} ({min(times[s.label]):.1f}-{max(times[s.label]):.1f})"
                 for s in settings]
        ratios = [f"{med[s.label] / med[first]:.3f}" for s in settings[1:]]
        print(f"| {point.text} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
