#!/usr/bin/env bash
# What the documents say about the programs is what the programs do: every
# exit code of wbctl (its enum, `wbctl --help`, wbctl(1), the README, and any
# guide that lists them too) and of wbrokerd (wbrokerd(8) against the
# statuses it really exits with), the sample table headers of the README and
# the guides against the tables a running broker prints (default and -o
# wide), and the socket fallback named wherever the resolution order is
# written. The man pages' option lists and METRICS are checked by
# test_config.sh and test_metrics.sh, the documents' links by
# test_doc_links.sh.
source "$(dirname "$0")/lib.sh"
SRC=${WB_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
README=$SRC/README.md
WBCTL_MAN=$SRC/docs/man/wbctl.1
WBROKERD_MAN=$SRC/docs/man/wbrokerd.8
[ -f "$README" ] && [ -f "$WBCTL_MAN" ] && [ -f "$WBROKERD_MAN" ] || fail "no sources in $SRC"
# The guides beside the README: CONTRIBUTING.md and docs/*.md.
GUIDES=("$SRC/CONTRIBUTING.md" "$SRC"/docs/*.md)

# sorted_set: the numbers on stdin, one per line, sorted and unique.
sorted_set() { grep -oE '[0-9]+' | sort -n -u | tr '\n' ' '; }
# man_exit_codes MANPAGE: the `.B N` items of its EXIT STATUS section.
man_exit_codes() {
  sed -n '/^\.SH EXIT STATUS/,/^\.SH /p' "$1" | grep -E '^\.B [0-9]+$' | sorted_set
}

# wbctl: the enum is what the program can return.
enum=$(sed -n '/WBCTL_EXIT_OK/,/}/p' "$SRC/tools/wbctl/wbctl.h" | grep -oE '= [0-9]+' | sorted_set)
[ -n "$enum" ] || fail "no exit codes in tools/wbctl/wbctl.h"
help=$("$WBCTL" --help | sed -n '/^Exit codes:/,$p' | sorted_set)
man=$(man_exit_codes "$WBCTL_MAN")
# exit_codes_paragraph FILE: the numbers of its "`wbctl` exit codes:" paragraph.
exit_codes_paragraph() { sed -n '/^`wbctl` exit codes:/,/^$/p' "$1" | sorted_set; }
readme=$(exit_codes_paragraph "$README")
[ "$help" = "$enum" ] || fail "wbctl --help lists exit codes '$help', the program has '$enum'"
[ "$man" = "$enum" ] || fail "wbctl(1) EXIT STATUS lists '$man', the program has '$enum'"
[ "$readme" = "$enum" ] || fail "the README lists wbctl exit codes '$readme', the program has '$enum'"
for f in "${GUIDES[@]}"; do
  [ -f "$f" ] && grep -q '^`wbctl` exit codes:' "$f" || continue
  listed=$(exit_codes_paragraph "$f")
  [ "$listed" = "$enum" ] || fail "$(basename "$f") lists wbctl exit codes '$listed', the program has '$enum'"
done

# Literal exit statuses in wbctl's sources are the enum's.
if grep -rnE 'return [0-9]{2,3};|exit\([0-9]{2,3}\)' "$SRC/tools/wbctl/"*.c; then
  fail "wbctl returns a literal exit status instead of a WBCTL_EXIT_ name"
fi

# wbrokerd: each status the man page lists, produced for real.
seen=""
"$WBROKERD" --check-config --backend host --socket "$SOCK" >/dev/null 2>&1
seen="$seen $?"
"$WBROKERD" --no-such-option >/dev/null 2>&1
seen="$seen $?"
printf '[broker]\nsokcet = x\n' >"$WB_TMP/bad.conf"
"$WBROKERD" --config "$WB_TMP/bad.conf" >/dev/null 2>&1
seen="$seen $?"
# A socket that cannot be made: its directory is a file.
: >"$WB_TMP/afile"
"$WBROKERD" --backend host --socket "$WB_TMP/afile/broker.sock" >/dev/null 2>&1
seen="$seen $?"
# The clean stop of a running broker.
start_broker
stop_broker
seen="$seen $EXIT_RC"
seen=$(echo "$seen" | sorted_set)
man=$(man_exit_codes "$WBROKERD_MAN")
[ "$seen" = "$man" ] || fail "wbrokerd exited with '$seen'; wbrokerd(8) EXIT STATUS lists '$man'"

# The sample tables of the README and the guides: each header is the
# program's, default or wide.
make_model "$WB_TMP/demo.safetensors" 3 7 >/dev/null || fail "cannot write the test model"
start_broker_with_demo "$WB_TMP/demo.safetensors"
start_worker w1 --model demo --hold 30
headers() { # headers ARGS...: the header line of `wbctl ARGS`, columns one space apart
  ctl "$@" | head -n 1 | tr -s ' '
}
declare -A actual
for cmd in leases models containers; do
  actual["$(headers "$cmd")"]="$cmd"
  actual["$(headers "$cmd" -o wide)"]="$cmd -o wide"
done
# Header lines in a document's code blocks: upper-case words, two or more,
# starting with one of the tables' first columns.
sample_headers() { awk '/^```/{inb=!inb; next} inb && /^(ID|NAME|PID) +[A-Z_\/()]+( +[A-Z_\/()]+)+ *$/' "$1"; }
for f in "$README" "${GUIDES[@]}"; do
  [ -f "$f" ] || continue
  n=0
  while IFS= read -r line; do
    h=$(printf '%s' "$line" | tr -s ' ')
    n=$((n + 1))
    [ -n "${actual[$h]:-}" ] || fail "$(basename "$f") shows a table header the programs do not print: '$h' (they print: $(printf "'%s' " "${!actual[@]}"))"
  done < <(sample_headers "$f")
  [ "$f" != "$README" ] || [ "$n" -ge 2 ] || fail "found only $n sample table headers in the README"
done

# The socket's resolution order, wherever it is written, ends with the
# fallback the code uses.
grep -q '/tmp/wbroker-%u/broker.sock' "$SRC/common/paths.c" || fail "common/paths.c has another fallback"
for f in "$README" "${GUIDES[@]}" "$SRC/examples/README.md" "$WBCTL_MAN" "$WBROKERD_MAN" \
  "$SRC/include/wb/client.h" "$SRC/python/weightbroker/client.py"; do
  [ -f "$f" ] || continue
  if grep -q 'XDG_RUNTIME_DIR/wbroker/broker.sock' "$f" && ! grep -qE '/tmp/wbroker(\\)?-UID/broker.sock' "$f"; then
    fail "$(basename "$f") gives the socket's resolution order without /tmp/wbroker-UID/broker.sock"
  fi
done
"$WBCTL" --help | grep -q '/tmp/wbroker-UID/broker.sock' || fail "wbctl --help does not name the /tmp fallback"

