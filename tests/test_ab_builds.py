#!/usr/bin/env python3
"""tests/test_ab_builds.py — cuda/tools/ab_builds.py against a real `flashattn` CLI on the CPU.

    test_ab_builds.py --bin path/to/flashattn [--root DIR]

Checks that two builds (the same binary under two labels) are run alternately on odd points, that
the table has a row per point and the JSON a record per round, point and build with bench's own
median; that a build whose bench fails is named with its reason, reads "failed" in its cells while
the others' times still show, and makes the exit status 1; that label=path@VARIANT runs that
build, and only it, with FLASHATTN_VARIANT=VARIANT; and that each bad argument gives `error:` and
exit status 2 before anything runs (no JSON written).
Standard library only (CI runs it with Debian's python3).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(root, args):
    tool = os.path.join(root, "cuda", "tools", "ab_builds.py")
    return subprocess.run([sys.executable, tool] + args, capture_output=True, text=True,
                          timeout=300)


def check(condition, what, out=None):
    if not condition:
        detail = f"\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}" if out is not None else ""
        raise SystemExit(f"FAILED: {what}{detail}")


def check_refused(out, args, text, ran):
    """A bad call of a tool: exit status 2, `error:` saying `text`, and (`ran` False) nothing run."""
    check(out.returncode == 2, f"{args}: exit status 2", out)
    check("error: " in out.stderr and text in out.stderr, f"{args}: says {text!r}", out)
    check(not ran, f"{args}: nothing ran", out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the flashattn CLI")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    a = ap.parse_args()
    points = ["f32,1,3,37,24", "f32,2,2,50,16,c"]  # no length a multiple of a block size

    with tempfile.TemporaryDirectory() as tmp:
        # Two builds, two rounds: every point on every build, alternately.
        js = os.path.join(tmp, "ab.jsonl")
        out = run(a.root, ["--backend", "omp", "--rounds", "2", "--repeat", "2", "--json", js,
                           f"old={a.bin}", f"new={a.bin}", "--"] + points)
        check(out.returncode == 0, "two good builds exit 0", out)
        records = [json.loads(line) for line in open(js)]
        check(len(records) == 2 * len(points) * 2, "one record per round, point and build", out)
        order = [(r["round"], r["point"], r["build"]) for r in records]
        check(order == [(rd, p, b) for rd in (1, 2) for p in points for b in ("old", "new")],
              f"builds alternate within each point, rounds in order: {order}", out)
        check(all(r["median_ms"] > 0 and r["backend"] == "omp" and r["pass"] == "forward"
                  for r in records), "each record holds bench's positive median", out)
        rows = [line for line in out.stdout.splitlines() if line.startswith("| f32,")]
        check([row.split(" | ")[0][2:] for row in rows] == points, "a table row per point", out)
        check(all(len(row.strip("|").split("|")) == 4 for row in rows),
              "each row: point, two builds' medians, one ratio", out)

        # A build whose bench fails: named with its reason, exit status 1, the others still run.
        broken = os.path.join(tmp, "broken")
        with open(broken, "w") as f:
            f.write("#!/bin/sh\necho 'error: this build cannot run' >&2\nexit 2\n")
        os.chmod(broken, 0o755)
        out = run(a.root, ["--backend", "omp", "--rounds", "1", "--repeat", "2",
                           f"good={a.bin}", f"broken={broken}", "--", points[0]])
        check(out.returncode == 1, "a failing build makes the exit status 1", out)
        check("broken f32,1,3,37,24: error: this build cannot run" in out.stderr,
              "the failure names build, point and bench's reason", out)
        check("good  f32,1,3,37,24" in out.stdout, "the good build still ran", out)
        row = [line for line in out.stdout.splitlines() if line.startswith("| f32,1,3,37,24 ")]
        cells = row[0].strip("|").split("|") if row else []
        check(len(cells) == 4 and "(" in cells[1] and cells[2].strip() == "failed" and
              cells[3].strip() == "failed",
              "the point keeps its row: the good build's median, the broken one's cells failed",
              out)

        # label=path@VARIANT: that build runs with FLASHATTN_VARIANT=VARIANT, the others without
        # it. A stand-in for bench reports the variable it was given as its median.
        echo = os.path.join(tmp, "echo_variant")
        with open(echo, "w") as f:
            f.write('#!/bin/sh\nv=${FLASHATTN_VARIANT:-omp=0.125}\n'
                    'echo "{\\"backend\\": \\"omp\\", \\"pass\\": \\"forward\\", '
                    '\\"median_ms\\": ${v#omp=}}"\n')
        os.chmod(echo, 0o755)
        js = os.path.join(tmp, "variant.jsonl")
        env_before = os.environ.pop("FLASHATTN_VARIANT", None)
        out = run(a.root, ["--backend", "omp", "--rounds", "1", "--json", js, f"plain={echo}",
                           f"quarter={echo}@omp=0.25", f"half={echo}@omp=0.5", "--", points[0]])
        if env_before is not None:
            os.environ["FLASHATTN_VARIANT"] = env_before
        check(out.returncode == 0, "builds with variants exit 0", out)
        medians = {r["build"]: r["median_ms"] for r in map(json.loads, open(js))}
        check(medians == {"plain": 0.125, "quarter": 0.25, "half": 0.5},
              f"each build ran with its own FLASHATTN_VARIANT: {medians}", out)

        # Bad arguments: error: and exit 2, nothing run.
        not_exec = os.path.join(tmp, "not_executable")
        open(not_exec, "w").close()
        bad = [
            (["--backend", "omp", f"a={a.bin}", f"b={a.bin}", points[0]], "separate the builds"),
            (["--backend", "omp", f"a={a.bin}", "--", points[0]], "at least two builds"),
            (["--backend", "omp", f"a={a.bin}", f"a={a.bin}", "--", points[0]], "given twice"),
            (["--backend", "omp", f"a={a.bin}", f"{a.bin}", "--", points[0]], "label=path"),
            (["--backend", "omp", f"a={a.bin}", f"b={a.bin}@", "--", points[0]], "nothing after @"),
            (["--backend", "omp", f"a={a.bin}", f"b={not_exec}", "--", points[0]],
             "not an executable file"),
            (["--backend", "omp", f"a={a.bin}", f"b={a.bin}", "--", "f32,1,2,64"],
             "expected dtype,B,H,N,d"),
            (["--backend", "omp", f"a={a.bin}", f"b={a.bin}", "--", "f8,1,2,64,16"],
             "dtype 'f8'"),
            (["--backend", "omp", f"a={a.bin}", f"b={a.bin}", "--", "f32,1,two,64,16"],
             "must be integers"),
            (["--backend", "omp", f"a={a.bin}", f"b={a.bin}", "--", "f32,1,2,0,16"],
             "at least 1"),
            (["--backend", "omp", f"a={a.bin}", f"b={a.bin}", "--"], "at least one point"),
            (["--backend", "omp", "--rounds", "0", f"a={a.bin}", f"b={a.bin}", "--", points[0]],
             "--rounds and --repeat"),
        ]
        for args, text in bad:
            js = os.path.join(tmp, "bad.jsonl")
            out = run(a.root, ["--json", js] + args)
            check_refused(out, args, text, os.path.exists(js) or "round" in out.stdout)
    print("ab_builds: 2 builds x 2 points x 2 rounds, a failing build, builds with variants, 12 "
          "bad calls: all as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
