#!/usr/bin/env python3
"""tests/test_ab_env.py — cuda/tools/ab_env.py on the CPU, with a stand-in for the Python process
that times a call (the real one needs a GPU and PyTorch).

    test_ab_env.py [--root DIR]

The stand-in prints, as its µs per call, the value of AB_US (1.5 when unset) and logs the order
it ran in. Checks that the settings run alternately within each point and round; that each
process sees its own setting's variables and none of another setting's (a variable named only
by one setting is removed from the others); that the table has a row per point with each
setting's median and the ratio to the first; that a failing or silent process is named, the
other points still run and the exit status is 1; and that each bad argument gives `error:` and
exit status 2 before anything runs. Standard library only (CI runs it with Debian's python3).
"""
import argparse
import os
import subprocess
import sys
import tempfile

from test_ab_builds import check, check_refused  # FAILED: with the tool's output


def run(root, args, env=None):
    tool = os.path.join(root, "cuda", "tools", "ab_env.py")
    return subprocess.run([sys.executable, tool] + args, capture_output=True, text=True,
                          timeout=120, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    a = ap.parse_args()
    points = ["bf16,3,5,37,24,c", "f16,2,2,50,16"]  # no length a multiple of a block size

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "order.log")
        # Called as `python -c CHILD dtype B H N d causal calls reps`: logs its setting and point.
        stand_in = os.path.join(tmp, "python")
        with open(stand_in, "w") as f:
            f.write('#!/bin/sh\n'
                    'echo "${AB_LABEL:-none} $3,$4,$5,$6,$7,$8,$9,${10},${11} AB_ONLY=${AB_ONLY:-unset}" >> '
                    f'"{log}"\n'
                    'if [ "${AB_FAIL:-}" = "$4" ]; then echo "CUDA error: out of memory" >&2; '
                    'exit 1; fi\n'
                    'if [ "${AB_SILENT:-}" = "1" ]; then exit 0; fi\n'
                    'echo "${AB_US:-1.5}"\n')
        os.chmod(stand_in, 0o755)
        env = dict(os.environ, AB_ONLY="from the caller")

        # Two settings, two rounds: every point under every setting, alternately.
        out = run(a.root, ["--python", stand_in, "--rounds", "2",
                           "base=AB_LABEL=base", "fast=AB_LABEL=fast,AB_US=1.2,AB_ONLY=fast",
                           "--"] + points, env)
        check(out.returncode == 0, "two good settings exit 0", out)
        lines = open(log).read().split("\n")[:-1]
        order = [(l.split()[0], l.split()[1].split(",")[1]) for l in lines]
        expected = [(s, p.split(",")[1]) for p in points for _ in range(2)
                    for s in ("base", "fast")]
        check(order == expected, f"settings alternate within each point and round: {order}", out)
        only = {l.split()[0]: l.split("AB_ONLY=")[1] for l in lines}
        check(only == {"base": "unset", "fast": "fast"},
              f"a variable one setting names is removed from the others: {only}", out)
        check(all(l.split()[1].endswith(",30,7,training") for l in lines),
              "each process gets --calls 30, --reps 7 and a training call by default", out)
        check(all(l.split()[1].split(",")[5] == ("1" if p.endswith(",c") else "0")
                  for l, p in zip(lines, [p for p in points for _ in range(4)])),
              "causal points are passed as causal", out)
        rows = [line for line in out.stdout.splitlines() if line.startswith("| ")
                and "," in line.split(" | ")[0]]
        check([row.split(" | ")[0][2:] for row in rows] == points, "a table row per point", out)
        check(all(row.split(" | ")[1].startswith("1.5 (1.5-1.5)") and
                  row.split(" | ")[2].startswith("1.2 (1.2-1.2)") and
                  row.rstrip(" |").endswith("0.800") for row in rows),
              "each row: the settings' medians and spreads, and 1.2 / 1.5", out)

        # --pass forward reaches every process, and the table says what was timed.
        os.remove(log)
        out = run(a.root, ["--python", stand_in, "--rounds", "1", "--pass", "forward", "a=",
                           "b=X=1", "--", points[1]], env)
        check(out.returncode == 0 and all(l.split()[1].endswith(",forward") for l in
                                          open(log).read().split("\n")[:-1]),
              "--pass forward: each process times a forward call", out)
        check("flashattn.attention forward:" in out.stdout, "the table says forward", out)

        # A process that fails or prints no time: named, the other points still run, exit 1.
        os.remove(log)
        out = run(a.root, ["--python", stand_in, "--rounds", "1", "a=AB_LABEL=a",
                           "b=AB_LABEL=b,AB_FAIL=3", "--"] + points, env)
        check(out.returncode == 1, "a failing process makes the exit status 1", out)
        check(f"{points[0]} under b: CUDA error: out of memory" in out.stderr,
              "the failure names point, setting and the process's error", out)
        check(any(l.startswith("| " + points[1]) for l in out.stdout.splitlines()),
              "the other point still ran and has its row", out)
        out = run(a.root, ["--python", stand_in, "--rounds", "1", "a=", "b=AB_SILENT=1", "--",
                           points[1]], env)
        check(out.returncode == 1 and "no time in its output" in out.stderr,
              "a process that prints no time is a failure", out)

        # Bad arguments: error: and exit 2, nothing run.
        os.remove(log)
        bad = [
            (["a=", "b=X=1", points[0]], "separate the settings from the points with --"),
            (["a=", "b=X=1", "--"], "give the points after --"),
            (["a=", "--", points[0]], "at least two settings"),
            (["a=", "a=X=1", "--", points[0]], "its own label"),
            (["a=", "=X=1", "--", points[0]], "expected label="),
            (["a=", "b", "--", points[0]], "expected label="),
            (["a=", "b=X", "--", points[0]], "is not VAR=VALUE"),
            (["a=", "b=X=1", "--", "f64,1,2,64,16"], "is not one of f32, f16, bf16"),
            (["a=", "b=X=1", "--", "bf16,1,2,64"], "expected dtype,B,H,N,d"),
            (["a=", "b=X=1", "--", "bf16,1,two,64,16"], "must be integers"),
            (["a=", "b=X=1", "--", "bf16,1,2,0,16"], "at least 1"),
            (["--rounds", "0", "a=", "b=X=1", "--", points[0]], "at least 1"),
            (["--pass", "backward", "a=", "b=X=1", "--", points[0]], "invalid choice"),
        ]
        for args, text in bad:
            out = run(a.root, ["--python", stand_in] + args, env)
            check_refused(out, args, text, os.path.exists(log))
    print("ab_env: 2 settings x 2 points x 2 rounds, a forward pass, a failing and a silent "
          "process, 13 bad calls: all as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
