#!/usr/bin/env python3
"""cuda/tools/gpt_runs.py — examples/python/gpt.py run several times over, whole runs alternating
between one or more environments (a build's package through PYTHONPATH, a switch such as
FLASHATTN_DEPENDENT_LAUNCH), so that the training ratio flashattn / SDPA of one setting, or its
change between two, is read from several runs rather than one.

    python3 cuda/tools/gpt_runs.py --runs 4 \\
        base=PYTHONPATH=$PWD/build/base/python new=PYTHONPATH=$PWD/build/gpu/python \\
        -- --preset gpu --steps 210

Settings are ab_env.py's: label=VAR=VALUE[,VAR=VALUE...], or label= for the environment as it
is; a variable named by any setting is removed from the others. Everything after -- goes to
gpt.py. Each of the --runs rounds runs gpt.py once under every setting, in turn, each in a fresh
process. A gpt.py run already interleaves its two models (--interleave), so a host that drifts
within a run slows both alike; what it cannot remove is the drift from one run to the next
(SDPA's own model moved by up to a third between two runs on one host, docs/python.md), which is
what the rounds here measure.

Printed per run: both models' tokens/s, the ratio, the median of the run's interleaved rounds and
the largest loss difference. Then a Markdown table per setting: the runs' ratios, their median and
range, each model's median tokens/s, the largest loss difference over the runs, how many runs
passed gpt.py's own loss check, and each setting's median ratio over the first setting's.

Exit status: 0 when every run ran and passed gpt.py's loss check; 1 when one failed (the others
still run) or its loss check did not pass (gpt.py's exit status 1); 2 for bad arguments
(`error:`), before anything runs.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from ab_env import parse_settings  # label=VAR=VALUE[,...]

GPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python",
                   "gpt.py")

# The lines of gpt.py's summary that a run is read from.
PATTERNS = {
    "ours": re.compile(r"^flashattn:\s+([0-9.]+) tokens/s", re.M),
    "theirs": re.compile(r"^sdpa:\s+([0-9.]+) tokens/s", re.M),
    "rounds": re.compile(r"^interleaved: .*rounds' ratios median ([0-9.]+)", re.M),
    "loss": re.compile(r"^largest \|loss difference\| over \d+ steps: ([0-9.eE+-]+)", re.M),
}


class Run:
    """One gpt.py run's numbers (rounds: None where it did not interleave)."""

    def __init__(self, text, status):
        found = {k: p.search(text) for k, p in PATTERNS.items()}
        missing = [k for k in ("ours", "theirs", "loss") if not found[k]]
        if missing or status not in (0, 1):
            raise ValueError(f"exit status {status}; " +
                             (f"no {', '.join(missing)} line in its output" if missing else
                              "not gpt.py's 0 or 1"))
        self.ours = float(found["ours"].group(1))
        self.theirs = float(found["theirs"].group(1))
        self.ratio = self.ours / self.theirs
        self.rounds = float(found["rounds"].group(1)) if found["rounds"] else None
        self.loss = float(found["loss"].group(1))
        self.loss_ok = status == 0


def run_once(python, gpt_args, setting, named):
    out = subprocess.run([python, GPT] + gpt_args, env=setting.environment(named),
                         capture_output=True, text=True)
    try:
        return Run(out.stdout, out.returncode)
    except ValueError as e:
        raise RuntimeError(f"under {setting.label}: {e}: {out.stderr.strip()[-1500:]}") from None


def describe(values, digits):
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("--runs", type=int, default=3, help="runs of gpt.py per setting (rounds)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter each run uses (default: this one)")
    ap.add_argument("settings", nargs="+", help="label=VAR=VALUE[,...] or label=; then --, then "
                    "gpt.py's arguments")
    argv = sys.argv[1:]
    if "--" not in argv and not {"-h", "--help"} & set(argv):
        # (before argparse, which would take gpt.py's options for unknown ones of its own)
        print("error: separate the settings from gpt.py's arguments with --", file=sys.stderr)
        return 2
    at = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:at])
    gpt_args = argv[at + 1:]
    try:
        if a.runs < 1:
            raise ValueError("--runs must be at least 1")
        settings, named = parse_settings(a.settings)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    runs = {s.label: [] for s in settings}
    failed = False
    for r in range(a.runs):
        for s in settings:
            try:
                run = run_once(a.python, gpt_args, s, named)
            except RuntimeError as e:
                print(f"failed: run {r + 1}/{a.runs} {e}", file=sys.stderr)
                failed = True
                continue
            runs[s.label].append(run)
            rounds = "-" if run.rounds is None else f"{run.rounds:.2f}"
            print(f"run {r + 1}/{a.runs} {s.label:>8}: flashattn {run.ours:,.0f} tokens/s, SDPA "
                  f"{run.theirs:,.0f}, ratio {run.ratio:.3f} (rounds' median {rounds}), largest "
                  f"loss difference {run.loss:.2e}{'' if run.loss_ok else ' (loss check failed)'}",
                  flush=True)

    first = settings[0].label
    print(f"\ngpt.py {' '.join(gpt_args)}: {a.runs} run(s) per setting, alternating; ratio = "
          f"flashattn / SDPA tokens/s within a run; median (min–max) over the runs")
    print("| setting | runs' ratios | ratio | rounds' medians | flashattn tokens/s | "
          f"SDPA tokens/s | largest loss difference | loss check passed | ratio / {first}'s |")
    print("|---|---|---|---|---:|---:|---:|---|---:|")
    base = statistics.median(r.ratio for r in runs[first]) if runs[first] else None
    for s in settings:
        got = runs[s.label]
        if not got:
            print(f"| {s.label} | (no run finished) | | | | | | | |")
            continue
        ratios = [r.ratio for r in got]
        rounds = [r.rounds for r in got if r.rounds is not None]
        relative = f"{statistics.median(ratios) / base:.3f}" if base else "-"
        print(f"| {s.label} | {', '.join(f'{x:.3f}' for x in ratios)} | {describe(ratios, 3)} | "
              f"{describe(rounds, 2) if rounds else '-'} | "
              f"{statistics.median(r.ours for r in got):,.0f} | "
              f"{statistics.median(r.theirs for r in got):,.0f} | "
              f"{max(r.loss for r in got):.2e} | {sum(r.loss_ok for r in got)} of {len(got)} | "
              f"{relative} |")
    loss_failed = any(not r.loss_ok for got in runs.values() for r in got)
    return 1 if failed or loss_failed else 0


if __name__ == "__main__":
    sys.exit(main())
