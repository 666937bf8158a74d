#!/usr/bin/env bash
# bench/RESULTS.md and bench/results/ agree: every result file outside
# results/archive/ is linked from RESULTS.md, and RESULTS.md links nothing
# archived; every file in results/archive/ has its line in the archive's
# README.md (a row linking it and the file that replaced it); every file
# and heading that RESULTS.md, HISTORY.md and the archive's README link to
# exists. Needs no build: it reads the tree.
#
#   tests/integration/test_bench_refs.sh [BENCH_DIR]   (default: bench/)
set -uo pipefail

bench=${1:-$(cd "$(dirname "$0")/../../bench" && pwd)}
python3 - "$bench" <<'PY'
import os
import re
import sys

bench = os.path.abspath(sys.argv[1])
results = os.path.join(bench, "results")
archive = os.path.join(results, "archive")
docs = {
    "RESULTS.md": os.path.join(bench, "RESULTS.md"),
    "HISTORY.md": os.path.join(bench, "HISTORY.md"),
    "results/archive/README.md": os.path.join(archive, "README.md"),
}
problems = []
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    # GitHub's anchors: lower case, punctuation but '-' and '_' dropped,
    # spaces to '-'.
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.*)", line)
        if m:
            a = slug(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


# links[doc] = [(line number, target as written, absolute path or None)]
links = {}
for name, path in docs.items():
    if not os.path.isfile(path):
        problems.append(f"{name}: missing")
        continue
    here = os.path.dirname(path)
    found = []
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(here, file)) if file else path
            found.append((no, target, dest, frag))
            if not os.path.exists(dest):
                problems.append(f"{name}:{no}: links {target}, which does not exist")
            elif frag and dest.endswith(".md") and frag not in anchors(dest):
                problems.append(f"{name}:{no}: links {target}, no such heading")
    links[name] = found


def files(d):
    return sorted(f for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))


current = files(results)
linked = {dest for _, _, dest, _ in links.get("RESULTS.md", [])}
for f in current:
    if os.path.join(results, f) not in linked:
        problems.append(f"bench/results/{f}: not linked from RESULTS.md "
                        "(link it from its section, or move it to results/archive/ with its line)")
for no, target, dest, _ in links.get("RESULTS.md", []):
    if dest.startswith(archive + os.sep) and not dest.endswith("README.md"):
        problems.append(f"RESULTS.md:{no}: links {target}, an archived file")

archived = [f for f in files(archive) if f != "README.md"] if os.path.isdir(archive) else []
rows = {}
readme = docs["results/archive/README.md"]
if os.path.isfile(readme):
    for line in open(readme, encoding="utf-8"):
        if not line.startswith("|"):
            continue
        targets = [os.path.normpath(os.path.join(archive, t.partition("#")[0]))
                   for t in LINK.findall(line)]
        if targets and os.path.dirname(targets[0]) == archive:
            rows[os.path.basename(targets[0])] = (targets[1:], line)
for f in archived:
    if f not in rows:
        problems.append(f"bench/results/archive/{f}: no line in results/archive/README.md")
        continue
    others, line = rows[f]
    if not any(os.path.dirname(t) == results and os.path.isfile(t) for t in others):
        problems.append(f"bench/results/archive/{f}: its line names no current file that replaced it")
    if len([c for c in line.split("|") if c.strip()]) < 3:
        problems.append(f"bench/results/archive/{f}: its line says not why")
for f in rows:
    if f not in archived:
        problems.append(f"results/archive/README.md: a line for {f}, which is not in the archive")

for p in problems:
    print("FAIL: " + p)
if problems:
    sys.exit(1)
print(f"ok: {len(current)} result files linked from RESULTS.md, {len(archived)} archived, "
      f"{sum(len(v) for v in links.values())} links checked")
PY
