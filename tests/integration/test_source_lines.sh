#!/usr/bin/env bash
# Every C source and header in broker/, client/ and common/ has at most 800
# lines: a file that grows past it holds more than one concern and is split
# into the files its sections name (STYLE: one concern a file). Needs no
# build: it reads the tree.
#
#   tests/integration/test_source_lines.sh [SOURCE_DIR]   (default: $WB_SOURCE_DIR, else the tree)
set -uo pipefail

MAX_LINES=800
src=${1:-${WB_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}}
n=0
over=()
for f in "$src"/broker/*.[ch] "$src"/client/*.[ch] "$src"/common/*.[ch]; do
  [ -f "$f" ] || continue
  n=$((n + 1))
  lines=$(wc -l <"$f")
  if [ "$lines" -gt "$MAX_LINES" ]; then
    over+=("${f#"$src"/} ($lines lines)")
  fi
done
if [ "$n" -eq 0 ]; then
  echo "test_source_lines: FAIL: no C files under $src/broker, client or common" >&2
  exit 1
fi
if [ "${#over[@]}" -gt 0 ]; then
  echo "test_source_lines: FAIL: more than $MAX_LINES lines: ${over[*]}" >&2
  exit 1
fi
echo "test_source_lines: PASS ($n files, at most $MAX_LINES lines each)" >&2
exit 0
