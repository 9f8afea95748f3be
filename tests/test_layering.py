#!/usr/bin/env python3
"""tests/test_layering.py — the folders depend on one another in one direction only.

    common/   includes common/ only (the core and the interface every form implements)
    cpu/      includes common/ and cpu/
    cuda/     includes common/ and cuda/, and inside cuda/:
      a form's folder (standard, minimal, fa1, fa2, tc, fa3) includes only itself and the shared
      folders (host/ plumbing, stages/ device stages, ptx/ instruction wrappers);
      a shared folder includes only shared folders (it knows no form);
      cuda/backends.* (the registration of every form) may include any of them
    examples/, tests/   may include anything

so a CUDA file never reaches for a CPU header (or the reverse), and nothing in common/ knows
which forms exist: common/registry.cpp joins the forms' lists through functions declared in
common/registry.hpp. This check reads every `#include "dir/..."` of the project's sources and
fails, naming file and line, on an include that goes the wrong way or names a file that does not
exist.

Usage: test_layering.py [--root DIR] [--self-test]
Standard library only (CI runs it with Debian's python3).
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ALLOWED = {
    "common": {"common"},
    "cpu": {"common", "cpu"},
    "cuda": {"common", "cuda"},
}
SOURCES = (".hpp", ".cpp", ".cuh", ".cu", ".h")
CUDA_FORMS = {"standard", "minimal", "fa1", "fa2", "tc", "fa3"}
CUDA_SHARED = {"host", "stages", "ptx"}


def cuda_folder_problem(rel, target):
    """Why a cuda/ file may not include a cuda/ target (None when it may)."""
    parts, target_parts = rel.split("/"), target.split("/")
    if len(parts) < 3 or parts[1] == "tools" or len(target_parts) < 3:
        return None  # cuda/backends.*, the tools, or a file at cuda/'s top
    mine, theirs = parts[1], target_parts[1]
    if theirs in CUDA_SHARED or theirs == mine:
        return None
    if mine in CUDA_SHARED:
        return f"cuda/{mine}/ is shared by every form and must not include a form's file ({target})"
    return (f"cuda/{mine}/ is one form and includes only its own folder and the shared ones "
            f"({', '.join(sorted(CUDA_SHARED))}), not {target}")


def problems(root, overlay=None):
    """(file:line: message) for every include that breaks the layering."""
    overlay = overlay or {}
    found = []
    files = {}
    for top in ALLOWED:
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if name.endswith(SOURCES):
                    rel = os.path.relpath(os.path.join(folder, name), root)
                    with open(os.path.join(root, rel), encoding="utf-8") as f:
                        files[rel] = f.read().split("\n")
    files.update(overlay)
    for rel, lines in sorted(files.items()):
        layer = rel.split("/")[0]
        for number, line in enumerate(lines, 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = match.group(1)
            target_layer = target.split("/")[0] if "/" in target else None
            if target_layer is None:
                continue  # a sibling include ("npy.hpp"), resolved next to the file
            if target_layer not in ALLOWED[layer]:
                found.append(f"{rel}:{number}: {layer}/ must not include {target} "
                             f"({layer}/ may include {', '.join(sorted(ALLOWED[layer]))}/ only)")
            elif layer == "cuda" and target_layer == "cuda" and cuda_folder_problem(rel, target):
                found.append(f"{rel}:{number}: {cuda_folder_problem(rel, target)}")
            elif target not in files and not os.path.isfile(os.path.join(root, target)):
                found.append(f"{rel}:{number}: includes {target}, which does not exist")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--self-test", action="store_true",
                    help="show that a cuda/ file including a cpu/ header is caught")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    if args.self_test:
        bad = {"cuda/bad_example.cu": ['#include "cpu/workspace.hpp"'],
               "common/bad_example.hpp": ['#include "cuda/backends.hpp"'],
               "cuda/fa3/bad_example.cuh": ['#include "cuda/tc/kernel.cuh"'],
               "cuda/stages/bad_example.cuh": ['#include "cuda/fa2/kernel_tf32.cuh"']}
        caught = problems(root, bad)
        ok = all(any(p.startswith(name + ":1:") for p in caught) for name in bad)
        print("self-test: " + ("caught every wrong-way include" if ok else "MISSED one"))
        return 0 if ok else 1
    found = problems(root)
    for p in found:
        print(p)
    print(f"layering: {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
