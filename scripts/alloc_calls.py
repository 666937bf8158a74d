#!/usr/bin/env python3
"""Production code allocates only through common/alloc.h (wb__malloc and
friends), so that tests can fail any allocation.

  scripts/alloc_calls.py [ROOT]    lists every direct malloc, calloc, realloc,
                                   strdup, strndup or vasprintf call in
                                   broker/, client/, common/ and tools/
                                   (comments and strings aside); exit 1 if any
  scripts/alloc_calls.py --fix [ROOT]  renames them to the wb__ functions and
                                   adds #include "alloc.h" where it is missing

common/alloc.c, which calls libc, is the one file left out. free() is not
wrapped."""
import os
import re
import sys

FUNCS = ("malloc", "calloc", "realloc", "strdup", "strndup", "vasprintf")
DIRS = ("broker", "client", "common", "tools")
EXEMPT = {"common/alloc.c"}

# A comment, a string or character literal (kept as they are), or a call of
# one of FUNCS that is not a member (p->malloc, s.malloc) nor part of a
# longer name (wb__malloc, xmalloc).
TOKEN = re.compile(
    r'(/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')'
    r"|(?<![\w.>])(" + "|".join(FUNCS) + r")(?=\s*\()",
    re.S,
)


def sources(root):
    out = []
    for d in DIRS:
        for top, _, files in os.walk(os.path.join(root, d)):
            for name in files:
                rel = os.path.relpath(os.path.join(top, name), root)
                if name.endswith((".c", ".h")) and rel not in EXEMPT:
                    out.append(rel)
    return sorted(out)


def calls(text):
    """(line, name) of every direct call in text."""
    found = []
    for m in TOKEN.finditer(text):
        if m.group(2):
            found.append((text.count("\n", 0, m.start()) + 1, m.group(2)))
    return found


def rename(text):
    return TOKEN.sub(lambda m: m.group(1) or "wb__" + m.group(2), text)


INCLUDE = re.compile(r'#include "([^"]+)"$')


def add_include(path, lines):
    """Puts #include "alloc.h" among the file's quoted includes, in order:
    after the module's own header, in the block of the others (a block of
    its own when there is none)."""
    if any(l.strip() == '#include "alloc.h"' for l in lines):
        return lines
    own = os.path.splitext(os.path.basename(path))[0] + ".h"
    blocks = []  # [first, last] line indexes of runs of quoted includes
    for i, l in enumerate(lines):
        if INCLUDE.match(l):
            if blocks and blocks[-1][1] == i - 1:
                blocks[-1][1] = i
            else:
                blocks.append([i, i])
    new = '#include "alloc.h"'
    if not blocks:
        first = next((i for i, l in enumerate(lines) if l.startswith("#include")), None)
        at = 0 if first is None else first
        return lines[:at] + [new, ""] + lines[at:]
    first, last = blocks[0]
    # The module's own header, or a private one standing for it
    # (ops_impl.h), comes first, on its own or with the others after it.
    alone = first == last and last + 1 < len(lines) and lines[last + 1] == ""
    skip = 1 if alone or INCLUDE.match(lines[first]).group(1) == own else 0
    if skip and first == last:
        # Only the own header: the next block if it follows after one blank
        # line, else a block of its own.
        if len(blocks) > 1 and blocks[1][0] == last + 2 and lines[last + 1] == "":
            first, last = blocks[1]
            skip = 0
        else:
            return lines[: last + 1] + ["", new] + lines[last + 1:]
    at = last + 1
    for i in range(first + skip, last + 1):
        if INCLUDE.match(lines[i]).group(1).lower() > "alloc.h":
            at = i
            break
    return lines[:at] + [new] + lines[at:]


def main():
    fix = "--fix" in sys.argv[1:]
    args = [a for a in sys.argv[1:] if a != "--fix"]
    root = args[0] if args else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = 0
    for rel in sources(root):
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found = calls(text)
        if not found:
            continue
        if fix:
            lines = rename(text).split("\n")
            if rel not in ("common/alloc.h",):
                lines = add_include(rel, lines)
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
            print(f"{rel}: {len(found)} calls renamed")
        else:
            for line, name in found:
                print(f"{rel}:{line}: {name}() called directly; use wb__{name} (common/alloc.h)")
            bad += len(found)
    if bad:
        print(f"{bad} direct allocation calls; scripts/alloc_calls.py --fix renames them",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
