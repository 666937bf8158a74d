#!/usr/bin/env bash
# The example programs' command lines, wb-aoti-worker, wb-demo-worker and
# wb-publish:
# --help (stdout, exit 0) describes every long option of the program's
# getopt table, with its argument, names no option the table lacks, and
# gives the exit codes; --version prints the project's version block, the
# same as wbrokerd's but for the name; misuse is named on stderr with the
# program's name (not its path) and exits 2. No broker is started.
source "$(dirname "$0")/lib.sh"

: "${WB_SOURCE_DIR:?WB_SOURCE_DIR must name the source tree}"

# long_options FILE: "NAME no|required" for each entry of the getopt table
# (static const struct option opts[]) in the C file.
long_options() {
  sed -n '/static const struct option opts\[\] = {/,/};/p' "$1" |
    sed -nE 's/^ *\{"([a-z][a-z-]*)", (no|required)_argument,.*/\1 \2/p'
}

"$WBROKERD" --version >"$WB_TMP/wbrokerd.version" 2>&1 || fail "wbrokerd --version failed"

# check PROGRAM [ARGS]: everything above for examples/PROGRAM.c and its
# binary; ARGS (default --model m) make a whole command line, which one
# more argument makes too long.
check() {
  local prog=$1 src=$WB_SOURCE_DIR/examples/$1.c bin=$WB_BIN_DIR/examples/$1
  local whole=${2:---model m}
  local out=$WB_TMP/$1 name arg rc
  [ -x "$bin" ] || fail "$bin was not built"
  long_options "$src" >"$out.opts"
  [ "$(wc -l <"$out.opts")" -ge 8 ] && grep -qx 'help no' "$out.opts" ||
    fail "found no getopt table in $src: $(cat "$out.opts")"

  "$bin" --help >"$out.help" 2>"$out.help.err"
  rc=$?
  [ "$rc" = 0 ] || fail "$prog --help exited $rc"
  [ -s "$out.help" ] && [ ! -s "$out.help.err" ] ||
    fail "$prog --help: expected the help on stdout only: $(cat "$out.help.err")"
  while read -r name arg; do
    # Described on a line of its own: "  --name ARG   what it does".
    grep -qE -- "^  (-[a-z], )?--$name( |$)" "$out.help" ||
      fail "$prog --help does not describe --$name"
    if [ "$arg" = required ]; then
      grep -qE -- "^  --$name [A-Z]" "$out.help" || fail "$prog --help does not name --$name's argument"
    else
      grep -qE -- "^  (-[a-z], )?--$name( [A-Z]|[^ a-z-])" "$out.help" &&
        fail "$prog --help gives --$name an argument it does not take"
    fi
  done <"$out.opts"
  for name in $(grep -oE -- '--[a-z][a-z-]+' "$out.help" | sort -u); do
    grep -q "^${name#--} " "$out.opts" || fail "$prog --help names $name, which it does not have"
  done
  # The exit codes, 0 to 3, in one sentence (it may span lines).
  tr '\n' ' ' <"$out.help" | grep -qE 'Exit status: 0 [^,]+, 1 [^,]+(\([^)]*\))?, 2 bad usage[^,]*, 3 [a-z]' ||
    fail "$prog --help does not give the exit codes: $(grep -A3 'Exit status' "$out.help")"

  "$bin" --version >"$out.version" 2>&1 || fail "$prog --version failed: $(cat "$out.version")"
  [ "$(wc -l <"$out.version")" = 2 ] || fail "$prog --version printed $(cat "$out.version")"
  [ "$(head -n 1 "$out.version")" = "$(head -n 1 "$WB_TMP/wbrokerd.version" | sed "s/^wbrokerd /$prog /")" ] ||
    fail "$prog --version: '$(head -n 1 "$out.version")', wbrokerd: '$(head -n 1 "$WB_TMP/wbrokerd.version")'"
  grep -qE "^$prog [0-9]+\.[0-9]+\.[0-9]+ \(git [^ ,]+, protocol [0-9]+\)$" "$out.version" ||
    fail "$prog --version: not the version block: $(cat "$out.version")"
  [ "$(sed -n 2p "$out.version")" = "$(sed -n 2p "$WB_TMP/wbrokerd.version")" ] ||
    fail "$prog --version's backends differ from wbrokerd's: $(cat "$out.version")"

  # misuse ARGS... then the expected first line of stderr.
  misuse() {
    local want=${*: -1}
    "$bin" "${@:1:$#-1}" >"$out.misuse.out" 2>"$out.misuse.err"
    rc=$?
    [ "$rc" = 2 ] || fail "$prog ${*:1:$#-1} exited $rc, not 2"
    [ ! -s "$out.misuse.out" ] || fail "$prog ${*:1:$#-1} wrote to stdout: $(cat "$out.misuse.out")"
    [ "$(head -n 1 "$out.misuse.err")" = "$want" ] ||
      fail "$prog ${*:1:$#-1}: stderr '$(head -n 1 "$out.misuse.err")', expected '$want'"
    [ "$(sed -n 2p "$out.misuse.err")" = "Try '$prog --help'." ] ||
      fail "$prog ${*:1:$#-1}: no pointer to --help: $(cat "$out.misuse.err")"
  }
  misuse --no-such-option "$prog: unrecognized option '--no-such-option'"
  misuse -x "$prog: unrecognized option '-x'"
  misuse --socket "$prog: option '--socket' needs an argument"
  # shellcheck disable=SC2086
  misuse $whole extra "$prog: unexpected argument 'extra'"
}

check wb-aoti-worker
check wb-demo-worker
check wb-publish "--model m f.safetensors"

# Their own checks, named the same way: ARGS... then the expected first
# line of stderr; exit status 2.
refused() {
  local bin=$1 want=${*: -1} rc
  "$bin" "${@:2:$#-2}" >/dev/null 2>"$WB_TMP/refused.err"
  rc=$?
  [ "$rc" = 2 ] && [ "$(head -n 1 "$WB_TMP/refused.err")" = "$want" ] ||
    fail "$(basename "$bin") ${*:2:$#-2}: exit $rc, stderr: $(cat "$WB_TMP/refused.err")"
}
AOTI=$WB_BIN_DIR/examples/wb-aoti-worker
refused "$AOTI" --aoti x --model m --iterations 0 \
  "wb-aoti-worker: --iterations: expected a number from 1 to 100000000, got '0'"
refused "$AOTI" --aoti x \
  "wb-aoti-worker: give --aoti and exactly one of --model, --local-weights, --uninit-weights, --own-constants"
refused "$AOTI" --aoti x --model m --serve "wb-aoti-worker: --serve needs --input"
# shellcheck disable=SC2046
refused "$AOTI" --aoti x $(for i in $(seq 17); do echo "--model m$i"; done) \
  "wb-aoti-worker: --model: at most 16 models"
refused "$WORKER" --model m --hold soon "wb-demo-worker: --hold: expected seconds, got 'soon'"
PUBLISH=$WB_BIN_DIR/examples/wb-publish
refused "$PUBLISH" --model m "wb-publish: no FILE.safetensors to publish"
refused "$PUBLISH" --model m --device gpu0 f "wb-publish: --device: expected cuda:N, got 'gpu0'"
true
