#!/usr/bin/env python3
"""tests/test_gpt_runs.py — cuda/tools/gpt_runs.py on the CPU, with a stand-in for the Python
process that runs examples/python/gpt.py (the real one needs PyTorch, and a GPU for its preset).

    test_gpt_runs.py [--root DIR]

The stand-in prints gpt.py's summary lines with the tokens/s, loss difference and exit status its
environment asks for (GR_OURS, GR_THEIRS, GR_LOSS, GR_STATUS; GR_CRASH makes it fail as a crashed
run would) and logs the order it ran in. Checks that whole runs alternate between the settings;
that gpt.py's arguments reach every run; that each run sees its own setting's variables and none
of another setting's; that the table has each setting's runs' ratios, median, tokens/s and the
ratio to the first setting; that a run whose loss check failed, or that crashed, makes the exit
status 1 while the other runs still run; and that each bad argument gives `error:` and exit
status 2 before anything runs. Standard library only (CI runs it with Debian's python3).
"""
import argparse
import os
import subprocess
import sys
import tempfile

from test_ab_builds import check, check_refused  # FAILED: with the tool's output

STAND_IN = r'''#!/bin/sh
# $1 is gpt.py's path; the rest are its arguments.
shift
echo "${GR_LABEL:-none} $* GR_ONLY=${GR_ONLY:-unset}" >> "$GR_LOG"
if [ "${GR_CRASH:-}" = "1" ]; then echo "RuntimeError: CUDA error: an illegal memory access" >&2; exit 3; fi
echo "text: 1000 characters, vocabulary 50; model: 2 layers"
echo "flashattn:   ${GR_OURS:-100000} tokens/s, peak memory      10 MiB, final train loss 2.5000, val loss 2.6000"
echo "sdpa:        ${GR_THEIRS:-100000} tokens/s, peak memory      10 MiB, final train loss 2.5000, val loss 2.6000"
echo "flashattn / sdpa: 1.00x tokens/s (steps 10..209)"
echo "interleaved: 20 rounds of 10 steps each; the rounds' ratios median ${GR_ROUNDS:-0.97}, lowest 0.80, highest 1.10"
echo "largest |loss difference| over 210 steps: ${GR_LOSS:-1.00e-02}"
exit ${GR_STATUS:-0}
'''


def run(root, args, env):
    tool = os.path.join(root, "cuda", "tools", "gpt_runs.py")
    return subprocess.run([sys.executable, tool] + args, capture_output=True, text=True,
                          timeout=120, env=env)


def table_row(out, label):
    rows = [l for l in out.stdout.splitlines() if l.startswith(f"| {label} |")]
    return rows[0].split(" | ") if rows else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    a = ap.parse_args()
    gpt_args = ["--preset", "gpu", "--steps", "7"]

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "order.log")
        stand_in = os.path.join(tmp, "python")
        with open(stand_in, "w") as f:
            f.write(STAND_IN)
        os.chmod(stand_in, 0o755)
        env = dict(os.environ, GR_LOG=log, GR_ONLY="from the caller")

        # Two settings, three runs each: whole runs alternate, each with only its variables.
        out = run(a.root, ["--python", stand_in, "--runs", "3", "base=GR_LABEL=base",
                           "new=GR_LABEL=new,GR_OURS=95000,GR_ONLY=new,GR_LOSS=2.5e-02",
                           "--"] + gpt_args, env)
        check(out.returncode == 0, "two good settings exit 0", out)
        lines = open(log).read().split("\n")[:-1]
        check([l.split()[0] for l in lines] == ["base", "new"] * 3,
              f"whole runs alternate between the settings: {lines}", out)
        check(all(" ".join(gpt_args) in l for l in lines), "gpt.py's arguments reach every run",
              out)
        only = {l.split()[0]: l.split("GR_ONLY=")[1] for l in lines}
        check(only == {"base": "unset", "new": "new"},
              f"a variable one setting names is removed from the others: {only}", out)
        base, new = table_row(out, "base"), table_row(out, "new")
        check(base is not None and new is not None, "a table row per setting", out)
        check(base[1] == "1.000, 1.000, 1.000" and base[2] == "1.000 (1.000–1.000)",
              f"base's runs' ratios and their median: {base}", out)
        check(new[1] == "0.950, 0.950, 0.950" and new[4] == "95,000" and new[5] == "100,000",
              f"new's ratios (95,000 / 100,000) and tokens/s: {new}", out)
        check(new[3] == "0.97 (0.97–0.97)", f"the runs' interleaved medians: {new}", out)
        check(new[6] == "2.50e-02" and new[7] == "3 of 3", f"loss difference and checks: {new}",
              out)
        check(new[8].rstrip(" |") == "0.950" and base[8].rstrip(" |") == "1.000",
              "each setting's median ratio over the first's", out)

        # A run whose loss check failed (gpt.py's exit status 1): said, counted, exit status 1.
        os.remove(log)
        out = run(a.root, ["--python", stand_in, "--runs", "2", "a=GR_LABEL=a",
                           "b=GR_LABEL=b,GR_STATUS=1"] + ["--"] + gpt_args, env)
        check(out.returncode == 1, "a failed loss check makes the exit status 1", out)
        check("(loss check failed)" in out.stdout and table_row(out, "b")[7] == "0 of 2",
              "the failed loss checks are shown and counted", out)
        check(table_row(out, "a")[7] == "2 of 2", "the other setting's checks passed", out)

        # A crashed run: named with its setting and error, the others still run, exit status 1.
        os.remove(log)
        out = run(a.root, ["--python", stand_in, "--runs", "2", "a=GR_LABEL=a",
                           "b=GR_LABEL=b,GR_CRASH=1", "--"] + gpt_args, env)
        check(out.returncode == 1, "a crashed run makes the exit status 1", out)
        check("under b: exit status 3" in out.stderr and "illegal memory access" in out.stderr,
              "the failure names the setting, the status and the run's error", out)
        check(len(open(log).read().split("\n")[:-1]) == 4, "every run was still started", out)
        check(table_row(out, "b")[1] == "(no run finished)" and
              table_row(out, "a")[1] == "1.000, 1.000", "the table says what finished", out)

        # One setting: the runs of one environment, no comparison needed.
        os.remove(log)
        out = run(a.root, ["--python", stand_in, "--runs", "2", "only=", "--"] + gpt_args, env)
        check(out.returncode == 0 and table_row(out, "only")[1] == "1.000, 1.000",
              "one setting runs alone", out)

        # Bad arguments: error: and exit 2, nothing run.
        os.remove(log)
        bad = [
            (["a=", "b=X=1"] + gpt_args, "with --"),
            (["--runs", "0", "a=", "--"] + gpt_args, "at least 1"),
            (["a=", "a=X=1", "--"] + gpt_args, "its own label"),
            (["a=", "=X=1", "--"] + gpt_args, "expected label="),
            (["a=", "b", "--"] + gpt_args, "expected label="),
            (["a=", "b=X", "--"] + gpt_args, "is not VAR=VALUE"),
        ]
        for args, text in bad:
            out = run(a.root, ["--python", stand_in] + args, env)
            check_refused(out, args, text, os.path.exists(log))
    print("gpt_runs: 2 settings x 3 runs, a failed loss check, a crashed run, one setting, "
          "6 bad calls: all as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
