#!/usr/bin/env bash
# The documents' links hold: every relative markdown link in README.md,
# CONTRIBUTING.md, docs/*.md, python/README.md and examples/README.md names a
# file or folder that exists, and every anchor (#heading) a heading of the
# page it points into, as GitHub makes anchors; the README stays a front
# page of at most 250 lines; and its test command is the one .ci/run runs.
# Needs no build: it reads the tree.
#
#   tests/integration/test_doc_links.sh [SOURCE_DIR]   (default: WB_SOURCE_DIR, else the tree)
set -uo pipefail

src=${1:-${WB_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}}
python3 - "$src" <<'PY'
import glob
import os
import re
import sys

src = os.path.abspath(sys.argv[1])
README_MAX_LINES = 250
pages = ["README.md", "CONTRIBUTING.md", "python/README.md", "examples/README.md"]
pages += sorted(os.path.relpath(p, src) for p in glob.glob(os.path.join(src, "docs", "*.md")))
problems = []
# [text](target): the text may hold code spans (replaced below) but no brackets.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")


def slug(heading):
    # GitHub's anchors: lower case, punctuation other than '-' and '_'
    # dropped (code spans keep their text), spaces to '-'.
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def blocks(path):
    """Each paragraph outside fenced code as (text, [(offset, line number)]):
    its lines joined, so that a link broken over two lines is one, with code
    spans made plain words so that a bracket inside one is no link."""
    out, cur, in_code = [], [], False

    def flush():
        if cur:
            text, starts, at = "", [], 0
            for no, line in cur:
                starts.append((at, no))
                text += line + " "
                at = len(text)
            out.append((text, starts))
        cur.clear()

    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            flush()
            continue
        if in_code or not line.strip():
            flush()
            continue
        cur.append((no, CODE_SPAN.sub("code", line.strip())))
    flush()
    return out


def code_lines(path):
    """(line number, line) of every line inside fenced code."""
    out, in_code = [], False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif in_code:
            out.append((no, line.rstrip("\n")))
    return out


def line_of(starts, offset):
    no = starts[0][1]
    for at, n in starts:
        if at > offset:
            break
        no = n
    return no


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found, in_code = {}, set(), False
        for line in open(path, encoding="utf-8"):
            if line.lstrip().startswith("```"):
                in_code = not in_code
            m = None if in_code else re.match(r"#{1,6} (.*)", line)
            if m:
                a = slug(m.group(1))
                n = seen.get(a, 0)
                seen[a] = n + 1
                found.add(a if n == 0 else f"{a}-{n}")
        _anchors[path] = found
    return _anchors[path]


checked = 0
for page in pages:
    path = os.path.join(src, page)
    if not os.path.isfile(path):
        if page in ("README.md", "CONTRIBUTING.md"):
            problems.append(f"{page}: missing")
        continue
    here = os.path.dirname(path)
    for text, starts in blocks(path):
        for m in LINK.finditer(text):
            target, no = m.group(1), line_of(starts, m.start())
            if re.match(r"[a-z][a-z0-9+.-]*:", target):
                continue  # a URL or mailto:
            checked += 1
            file, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(here, file)) if file else path
            if not os.path.exists(dest):
                problems.append(f"{page}:{no}: links {target}, which does not exist")
            elif frag and not dest.endswith(".md"):
                problems.append(f"{page}:{no}: links {target}, an anchor in a file that has no headings")
            elif frag and frag not in anchors(dest):
                problems.append(f"{page}:{no}: links {target}, and {os.path.relpath(dest, src)} has no such heading")

readme = os.path.join(src, "README.md")
if os.path.isfile(readme):
    n = sum(1 for _ in open(readme, encoding="utf-8"))
    if n > README_MAX_LINES:
        problems.append(f"README.md: {n} lines, more than {README_MAX_LINES}: move the detail into a guide in docs/")

# The quick start's test command is the one CI runs (.ci/run).
ci = os.path.join(src, ".ci", "run")
if os.path.isfile(readme) and os.path.isfile(ci):
    commands = [line.split("#")[0].strip() for _, line in code_lines(readme)
                if "test suite" in line and line.startswith("scripts/")]
    ci_text = open(ci, encoding="utf-8").read()
    if len(commands) != 1:
        problems.append(f"README.md: {len(commands)} test commands in its code blocks, not one")
    elif not re.search(r"^exec bash " + re.escape(commands[0]) + r"\s*$", ci_text, re.M):
        problems.append(f".ci/run does not run the README's test command '{commands[0]}'")

for p in problems:
    print(f"test_doc_links: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
if checked == 0:
    print("test_doc_links: no links found; is this the source tree?", file=sys.stderr)
    sys.exit(1)
print(f"test_doc_links: {checked} links in {len(pages)} pages resolve")
PY
