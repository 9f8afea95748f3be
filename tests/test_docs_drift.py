#!/usr/bin/env python3
"""tests/test_docs_drift.py — keeps the docs' links to code lines true as the code moves.

The walkthroughs link paper lines to code lines, e.g. [Alg1 L9](../cpu/scalar.cpp#L97). A line
inserted above line 97 would silently make that link point at the wrong statement; this check
makes it fail instead. Rules:

  1. Every markdown link `file#L<n>` in docs/**/*.md and README.md points at an existing file and
     line, and its text names what is on that line: each tag `AlgN Lk` or `FA2-Alg2 Lk` in the link
     text must be on the line (as a tag, so `Alg1 L1` does not match `Alg1 L10` and `Alg2 L5` does
     not match `FA2-Alg2 L5`), and so must each `code span`.
     A line link whose text names nothing is an error: nothing could be checked.
  2. Every `Alg1 Lk` tag in cpu/scalar.cpp is linked from docs/algorithm1_walkthrough.md, every
     `Alg4 Lk` tag in cpu/scalar_backward.cpp from docs/algorithm4_walkthrough.md, every
     `FA2-Alg2 Lk` tag in cpu/omp_backward.cpp from docs/fa2_backward_walkthrough.md; every line
     of the paper's algorithm has a tag; a tag stands on the statement that does its line (on the
     code line itself, or on a comment line directly above code, never above another comment); and
     in scalar.cpp and scalar_backward.cpp the tags stand in the order of the paper's lines (omp's
     loop body is a function its callers' loops run, so there the walkthrough gives the order).
  3. Every reference a reader might follow exists: relative markdown links in README.md and docs/,
     and paths such as `cuda/host/prepared.hpp` or `docs/design.md` named in the docs and in the
     comments of the sources (a reference to a file the tree does not contain is an error), and
     nothing cites notes kept outside the repository (the team's design notes, the source notes).

Usage:
  test_docs_drift.py [--root DIR]              check (exit 1 on any problem)
  test_docs_drift.py [--root DIR] --self-test  show that the check catches a line inserted above
                                               a tag (exit 1 if it does not)
  test_docs_drift.py [--root DIR] --fix        rewrite the line numbers of drifted links: to the
                                               one line with the named tag, or to the nearest
                                               non-comment line with the named `code`

Standard library only (CI runs it with Debian's python3).
"""
import argparse
import os
import re
import sys

LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+?)#L(\d+)\)")
TAG = re.compile(r"(?<![\w-])((?:FA2-)?Alg\d+) L(\d+)(?!\d)")
CODE = re.compile(r"`([^`]+)`")
SCALAR = "cpu/scalar.cpp"
WALKTHROUGH = "docs/algorithm1_walkthrough.md"
# (tag family, the form whose tags it carries, the walkthrough that must link every tag, the
# number of lines of the paper's algorithm, whether the tags must stand in the paper's order)
TAGGED = [("Alg1", SCALAR, WALKTHROUGH, 16, True),
          ("Alg4", "cpu/scalar_backward.cpp", "docs/algorithm4_walkthrough.md", 26, True),
          ("FA2-Alg2", "cpu/omp_backward.cpp", "docs/fa2_backward_walkthrough.md", 20, False)]


class Tree:
    """Files under root, read as lists of lines; `overlay` replaces some (for the self-test)."""

    def __init__(self, root, overlay=None):
        self.root = os.path.abspath(root)
        self.overlay = overlay or {}

    def lines(self, rel):
        if rel in self.overlay:
            return self.overlay[rel]
        with open(os.path.join(self.root, rel), encoding="utf-8") as f:
            return f.read().split("\n")

    def exists(self, rel):
        return rel in self.overlay or os.path.isfile(os.path.join(self.root, rel))

    def markdown_files(self):
        found = []
        if os.path.isfile(os.path.join(self.root, "README.md")):
            found.append("README.md")
        for folder, _, files in os.walk(os.path.join(self.root, "docs")):
            for name in sorted(files):
                if name.endswith(".md"):
                    found.append(os.path.relpath(os.path.join(folder, name), self.root))
        return sorted(found)


def tag_pattern(family, line):
    return re.compile(r"(?<![\w-])%s L%s(?!\d)" % (re.escape(family), line))


def is_code(line):
    """A line that does something: not blank and not only a comment."""
    text = line.strip()
    return bool(text) and not text.startswith(("//", "/*", "*"))


def names_in(text):
    """What a link's text promises is on the target line: its tags and code spans."""
    tags = [tag_pattern(a, l) for a, l in TAG.findall(text)]
    spans = CODE.findall(text)
    # A code span that is itself a tag is checked as a tag only.
    spans = [s for s in spans if not TAG.fullmatch(s.strip())]
    return tags, spans


def line_has(line, tags, spans):
    return all(t.search(line) for t in tags) and all(s in line for s in spans)


def links(tree, md):
    """(line number in md, link text, target file relative to root, target line) per line link."""
    base = os.path.dirname(md)
    for number, text in enumerate(tree.lines(md), start=1):
        for m in LINK.finditer(text):
            target = os.path.normpath(os.path.join(base, m.group(2)))
            yield number, m.group(1), target, int(m.group(3)), m


def check(tree):
    errors = []
    linked = set()  # (source, line) pairs linked from their walkthrough
    for md in tree.markdown_files():
        for number, text, target, line, _ in links(tree, md):
            where = "%s:%d: link [%s](...%s#L%d)" % (md, number, text, target, line)
            if target.startswith(".."):
                errors.append(where + ": points outside the repository")
                continue
            if not tree.exists(target):
                errors.append(where + ": no such file")
                continue
            lines = tree.lines(target)
            if not 1 <= line <= len(lines):
                errors.append(where + ": %s has %d lines" % (target, len(lines)))
                continue
            tags, spans = names_in(text)
            if not tags and not spans:
                errors.append(where + ": the link text names no tag (AlgN Lk) or `code` to check")
                continue
            if not line_has(lines[line - 1], tags, spans):
                errors.append(where + ": line %d is now %r" % (line, lines[line - 1].strip()))
                continue
            if any(target == src and md == doc for _, src, doc, _, _ in TAGGED):
                linked.add((target, line))

    # Rule 2: every tag of a tagged form is in its walkthrough, on a statement, every paper line
    # has one, and (where asked) they stand in paper order.
    for family, source, walkthrough, paper_lines, ordered in TAGGED:
        if not tree.exists(source):
            continue
        previous = 0
        seen = set()
        lines = tree.lines(source)
        for number, text in enumerate(lines, start=1):
            for tag_family, paper_line in TAG.findall(text):
                if tag_family != family:
                    continue
                where = "%s:%d: tag %s L%s" % (source, number, family, paper_line)
                seen.add(int(paper_line))
                if (source, number) not in linked:
                    errors.append(where + ": not linked from " + walkthrough)
                if not is_code(text) and not (number < len(lines) and is_code(lines[number])):
                    errors.append(where + ": a comment line not followed by code (put the tag "
                                  "on the statement that does the line, or directly above it)")
                if ordered and int(paper_line) < previous:
                    errors.append(where + ": out of order (after %s L%d)" % (family, previous))
                previous = max(previous, int(paper_line))
        missing = sorted(set(range(1, paper_lines + 1)) - seen)
        if missing:
            errors.append("%s: no tag for %s" % (source, ", ".join("%s L%d" % (family, n)
                                                                   for n in missing)))
    return errors


PATH_REF = re.compile(
    r"(?<![\w./-])((?:common|cpu|cuda|docs|tests|examples|cmake)/[\w./-]*(?:\{[\w.,]+\})?[\w./-]*)")
MD_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
OUTSIDE_NOTES = "DESIGN" + ".md"  # the self-test's example of a name the check must catch
OUTSIDE = re.compile(r"\bDESIGN\.md\b|\bthe seeds\b|\bseeds'|\b00\d_[0-9a-f]{16}\.txt\b")
SOURCE_DIRS = ("common", "cpu", "cuda", "examples", "tests", "cmake", "docs")
SOURCE_EXT = (".hpp", ".cpp", ".cu", ".cuh", ".py", ".sh", ".txt", ".md", ".in", ".cmake")


def expand(ref):
    """cuda/tc/forward.{hpp,cu} -> both files; other references as they are."""
    m = re.match(r"(.*)\{([^}]*)\}(.*)", ref)
    if not m:
        return [ref]
    return [m.group(1) + part + m.group(3) for part in m.group(2).split(",")]


def reference_sources(tree):
    """Files whose comments and prose may name other files: README, docs, and the sources."""
    found = ["README.md", "CMakeLists.txt"] if tree.exists("README.md") else []
    for top in SOURCE_DIRS:
        for folder, dirs, files in os.walk(os.path.join(tree.root, top)):
            dirs[:] = [d for d in dirs if d not in ("corpus", "data", "images")]
            for name in sorted(files):
                if name.endswith(SOURCE_EXT) or name == "CMakeLists.txt":
                    found.append(os.path.relpath(os.path.join(folder, name), tree.root))
    return found


# These two name files that do not exist on purpose (their self-tests).
CHECKERS = ("tests/test_docs_drift.py", "tests/test_layering.py")


def check_references(tree):
    errors = []
    for rel in reference_sources(tree):
        if rel in CHECKERS:
            continue
        is_md = rel.endswith(".md")
        base = os.path.dirname(rel)
        for number, text in enumerate(tree.lines(rel), start=1):
            where = "%s:%d" % (rel, number)
            if OUTSIDE.search(text):
                errors.append(where + ": cites notes outside the repository: %r"
                              % OUTSIDE.search(text).group(0))
            candidates = []
            if is_md:
                for m in MD_LINK.finditer(text):
                    target = m.group(1)
                    if "://" in target or target.startswith("mailto:"):
                        continue
                    candidates.append(os.path.normpath(os.path.join(base, target)))
            for m in PATH_REF.finditer(text):
                ref = m.group(1).rstrip(".,-/")
                if any(c in ref for c in "*<>") or ref.endswith("/"):
                    continue
                candidates.extend(expand(ref))
            for target in candidates:
                if tree.exists(target) or os.path.isdir(os.path.join(tree.root, target)):
                    continue
                if "." not in os.path.basename(target):
                    continue  # a folder-like or program name (`tests/fuzz`, `cuda/tools`)
                errors.append(where + ": refers to %s, which is not in the tree" % target)
    return errors


def self_test(tree):
    """Insert a line above the first linked tag of the scalar form: the check must notice."""
    if check(tree):
        print("self-test: the tree does not pass the check to begin with")
        return 1
    lines = tree.lines(SCALAR)
    first_tag = next(n for n, text in enumerate(lines) if TAG.search(text))
    shifted = lines[:first_tag] + ["// a comment someone added"] + lines[first_tag:]
    errors = check(Tree(tree.root, {SCALAR: shifted}))
    if not any("is now" in e for e in errors):
        print("self-test FAILED: a line inserted above %s:%d went unnoticed" % (SCALAR, first_tag + 1))
        return 1
    print("self-test: a line inserted above %s:%d is caught (%d problems), e.g.\n  %s"
          % (SCALAR, first_tag + 1, len(errors), errors[0]))
    # A comment slipped between a tag comment and its statement leaves the tag on no code.
    tag_comment = next(n for n, text in enumerate(lines)
                       if TAG.search(text) and not is_code(text))
    parted = lines[:tag_comment + 1] + ["// a comment someone added"] + lines[tag_comment + 1:]
    errors = check(Tree(tree.root, {SCALAR: parted}))
    if not any("not followed by code" in e for e in errors):
        print("self-test FAILED: a comment between %s:%d and its code went unnoticed"
              % (SCALAR, tag_comment + 1))
        return 1
    print("self-test: a comment between a tag and its code is caught, e.g.\n  %s"
          % next(e for e in errors if "not followed by code" in e))
    missing = check_references(Tree(tree.root, {"docs/design.md": tree.lines("docs/design.md") +
                                                ["See cuda/no_such_kernel.cu and " + OUTSIDE_NOTES + "."]}))
    if not (any("no_such_kernel.cu" in e for e in missing) and any("DESIGN" in e for e in missing)):
        print("self-test FAILED: a reference to a missing file (or to the notes outside) went unnoticed")
        return 1
    print("self-test: a reference to a missing file is caught, e.g.\n  %s" % missing[0])
    return 0


def fix(tree):
    """Moves each stale link to the code line that carries what its text names."""
    changed = 0
    for md in tree.markdown_files():
        lines = tree.lines(md)
        before = changed
        for number, text, target, line, m in reversed(list(links(tree, md))):
            if not tree.exists(target):
                continue
            code = tree.lines(target)
            tags, spans = names_in(text)
            if (not tags and not spans) or (1 <= line <= len(code) and line_has(code[line - 1], tags, spans)):
                continue
            hits = [n for n, c in enumerate(code, start=1)
                    if line_has(c, tags, spans) and (tags or not c.strip().startswith("//"))]
            if not hits or (tags and len(hits) > 1):
                print("%s:%d: cannot fix [%s]: %d candidate lines" % (md, number, text, len(hits)))
                continue
            # A name (code span) may recur: take the candidate nearest the old line.
            best = min(hits, key=lambda n: abs(n - line))
            old = lines[number - 1]
            lines[number - 1] = old[:m.start(3)] + str(best) + old[m.end(3):]
            print("%s:%d: [%s] L%d -> L%d%s" % (md, number, text, line, best,
                                                "" if len(hits) == 1 else
                                                " (nearest of %d lines with it: check)" % len(hits)))
            changed += 1
        if changed > before:
            with open(os.path.join(tree.root, md), "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
    return changed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--self-test", action="store_true")
    mode.add_argument("--fix", action="store_true")
    args = parser.parse_args()
    tree = Tree(args.root)
    if args.self_test:
        return self_test(tree)
    if args.fix:
        fix(tree)
    errors = check(tree) + check_references(tree)
    for e in errors:
        print(e)
    if errors:
        print("%d problem(s). After moving code, `python3 tests/test_docs_drift.py --fix` "
              "updates line numbers; review its diff." % len(errors))
        return 1
    print("docs drift: all line links and Alg1/Alg4/FA2-Alg2 tags agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
