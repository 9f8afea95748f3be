#!/usr/bin/env python3
"""cuda/tools/margins_table.py — the worst error/bound per backend from FLASHATTN_TEST_MARGINS output.

Reads the `margin <backend> <problem> O <err/bound> LSE <err/bound>` lines that tests/helpers.hpp
prints (other lines are ignored) and prints, per backend and range of head dims, how many checks
there were, the worst O and LSE margins (1.0 = at the 2x rule's bound; NaN counts as worst) and
the problem of the worst O. The ranges follow cuda-fa2's kernel choice: tensor cores for
16 <= d <= 128, FFMA otherwise. Used by cuda/tools/fa2_margins.sh.

Usage: python3 cuda/tools/margins_table.py LOG [LOG...]
"""
import math
import re
import sys

LINE = re.compile(r"^margin (\S+) (.*) O (\S+) LSE (\S+)$")


def dims_range(problem):
    d = int(re.search(r"\bd=(\d+)", problem).group(1))
    return "d < 16" if d < 16 else ("d <= 128" if d <= 128 else "d > 128")


def main(paths):
    worst = {}
    for path in paths:
        for line in open(path):
            m = LINE.match(line.strip())
            if not m:
                continue
            backend, problem = m.group(1), m.group(2)
            w = worst.setdefault((backend, dims_range(problem)),
                                 {"O": (0.0, ""), "LSE": (0.0, ""), "checks": 0})
            w["checks"] += 1
            for key, text in (("O", m.group(3)), ("LSE", m.group(4))):
                value, current = float(text), w[key][0]
                if math.isnan(value) or (not math.isnan(current) and value > current):
                    w[key] = (value, problem)  # a NaN margin is the worst and stays so
    print(f"{'backend':<14} {'dims':<9} {'checks':>6} {'worst O':>8} {'worst LSE':>9}  where (O)")
    for (backend, dims), w in sorted(worst.items()):
        print(f"{backend:<14} {dims:<9} {w['checks']:>6} {w['O'][0]:>8.3f} {w['LSE'][0]:>9.3f}  "
              f"{w['O'][1]}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python3 cuda/tools/margins_table.py LOG [LOG...]")
    main(sys.argv[1:])
