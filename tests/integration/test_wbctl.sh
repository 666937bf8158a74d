#!/usr/bin/env bash
# wbctl's broker commands: exit codes (0 ok, 1 refused, 2 misuse with one
# "Try" line, 69 no broker, 77 permission denied on the socket), help,
# --version, "did you mean", $WB_TIMEOUT_MS, loading and unloading, the JSON
# shapes scripts rely on (raw numbers, reals without float noise), the
# tables (sizes in IEC units, a default that fits 100 columns, -o wide with
# every column, as the man page shows them), model filters, global options
# before or after the command, and the bash and zsh completion.
source "$(dirname "$0")/lib.sh"

: "${WB_SOURCE_DIR:=$(cd "$(dirname "$0")/../.." && pwd)}"
MAN1=$WB_SOURCE_DIR/docs/man/wbctl.1
COMPLETION=$WB_SOURCE_DIR/deploy/completion

# expect_rc WANT NAME CMD...: runs CMD with output in NAME.out/.err.
expect_rc() {
  local want=$1 name=$2
  shift 2
  "$@" >"$WB_TMP/$name.out" 2>"$WB_TMP/$name.err"
  local rc=$?
  [ "$rc" = "$want" ] || fail "$name: '$*' exited with $rc, expected $want"
}

err_has() {
  grep -qF -- "$2" "$WB_TMP/$1.err" || fail "$1: stderr lacks '$2': $(cat "$WB_TMP/$1.err")"
}

# err_is NAME TEXT: stderr is exactly TEXT.
err_is() {
  [ "$(cat "$WB_TMP/$1.err")" = "$2" ] || fail "$1: stderr is '$(cat "$WB_TMP/$1.err")', expected '$2'"
}

# misuse_ends NAME CMD: the message ends with "Try 'wbctl CMD --help'."
# (CMD empty: "Try 'wbctl --help'."), stdout is empty.
misuse_ends() {
  local want="Try 'wbctl ${2:+$2 }--help'."
  [ "$(tail -n 1 "$WB_TMP/$1.err")" = "$want" ] || fail "$1: the misuse does not end with $want: $(cat "$WB_TMP/$1.err")"
  [ "$(grep -c '^Try ' "$WB_TMP/$1.err")" = 1 ] || fail "$1: more than one Try line: $(cat "$WB_TMP/$1.err")"
  [ ! -s "$WB_TMP/$1.out" ] || fail "$1: misuse printed to stdout: $(cat "$WB_TMP/$1.out")"
}

# header_of FILE: the first line with its runs of spaces made one.
header_of() {
  head -n 1 "$1" | tr -s ' '
}

# man_header CMD [-o wide]: the header of the sample table under the line
# "$ wbctl CMD [-o wide]" in wbctl(1), runs of spaces made one.
man_header() {
  "$PYTHON" - "$MAN1" "$*" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
want = "$ wbctl " + sys.argv[2]
for i, l in enumerate(lines):
    if l.replace("\\-", "-") == want:
        print(re.sub(" +", " ", lines[i + 1].replace("\\-", "-")))
        break
PY
}

# wide_lines FILE: how many lines of FILE are over 100 characters.
wide_lines() {
  awk 'length > 100' "$1" | wc -l
}

# No broker: a clear one-line reason naming the socket, quickly.
start=$SECONDS
expect_rc 69 nobroker "$WBCTL" --socket "$WB_TMP/none.sock" models
[ $((SECONDS - start)) -le 3 ] || fail "wbctl took $((SECONDS - start))s to notice there is no broker"
err_has nobroker "$WB_TMP/none.sock"
[ "$(wc -l <"$WB_TMP/nobroker.err")" = 1 ] || fail "the no-broker message is not one line"
[ ! -s "$WB_TMP/nobroker.out" ] || fail "wbctl printed to stdout without a broker"
expect_rc 69 nobroker_env "$WBCTL" leases --json
err_has nobroker_env "$SOCK"

# A socket file nobody listens on (what a killed broker leaves): refused at
# once, not after the request timeout.
"$PYTHON" -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$WB_TMP/dead.sock" ||
  fail "cannot make a dead socket"
start=$SECONDS
expect_rc 69 deadsock "$WBCTL" --socket "$WB_TMP/dead.sock" --timeout-ms 20000 stats
[ $((SECONDS - start)) -le 3 ] || fail "wbctl took $((SECONDS - start))s to notice a dead socket"
err_has deadsock "no broker listening at $WB_TMP/dead.sock"

# A listener that never answers (as a stopped broker): exit 69 after the
# timeout.
"$PYTHON" -c 'import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8); time.sleep(60)' "$WB_TMP/mute.sock" &
mute=$!
STARTED_PIDS+=("$mute")
wait_for test -S "$WB_TMP/mute.sock" || fail "the mute listener did not start"
expect_rc 69 mute "$WBCTL" --socket "$WB_TMP/mute.sock" --timeout-ms 300 models
err_has mute "within 300 ms"
kill "$mute"

# Misuse: exit 2 with the problem named on stderr, then one line saying
# where help is; nothing on stdout.
expect_rc 2 noargs "$WBCTL"
err_has noargs "wbctl: missing command (one of: models, leases, containers,"
misuse_ends noargs ""
expect_rc 2 badcmd "$WBCTL" frobnicate
err_is badcmd "wbctl: unknown command 'frobnicate'
Try 'wbctl --help'."
# A mistyped command: the nearest one, or the one it begins.
expect_rc 2 typo "$WBCTL" leaes
err_is typo "wbctl: unknown command 'leaes'; did you mean 'leases'?
Try 'wbctl --help'."
expect_rc 2 typo2 "$WBCTL" --socket "$WB_TMP/none.sock" unlaod demo
err_has typo2 "unknown command 'unlaod'; did you mean 'unload'?"
expect_rc 2 prefix "$WBCTL" cont
err_has prefix "unknown command 'cont'; did you mean 'containers'?"
expect_rc 2 badopt "$WBCTL" models --bogus
err_is badopt "wbctl models: unknown option '--bogus'
Try 'wbctl models --help'."
expect_rc 2 badglobal "$WBCTL" --bogus models
err_is badglobal "wbctl: unknown option '--bogus'
Try 'wbctl --help'."
expect_rc 2 extra "$WBCTL" models a b
err_has extra "wbctl models: unexpected argument 'b'"
misuse_ends extra models
expect_rc 2 missing "$WBCTL" load onlyname
err_has missing "wbctl load: missing argument PATH"
misuse_ends missing load
expect_rc 2 missing2 "$WBCTL" unload
err_has missing2 "missing argument NAME"
misuse_ends missing2 unload
expect_rc 2 toomany "$WBCTL" unload a b
err_has toomany "'b'"
expect_rc 2 badtimeout "$WBCTL" --timeout-ms soon models
err_has badtimeout "--timeout-ms: expected milliseconds from 1 to 86400000, got 'soon'"
misuse_ends badtimeout ""
expect_rc 2 badtimeout2 "$WBCTL" models --timeout-ms 0
misuse_ends badtimeout2 models
expect_rc 2 noarg "$WBCTL" leases --socket
err_has noarg "wbctl leases: option '--socket' needs an argument"
expect_rc 2 badoutput "$WBCTL" leases -o yaml
err_has badoutput "wbctl leases: -o: expected 'wide' or 'json', got 'yaml'"
# Conflicting output options are refused by name, wherever they are.
expect_rc 2 conflict "$WBCTL" --json leases -o wide
err_is conflict "wbctl leases: --json and -o wide conflict
Try 'wbctl leases --help'."
expect_rc 2 conflict2 "$WBCTL" -o wide --output json models
err_has conflict2 "wbctl: -o wide and -o json conflict"
expect_rc 2 nowide "$WBCTL" stats -o wide
err_has nowide "wbctl stats: -o wide: only models, leases and containers have more columns"
expect_rc 2 twomodels "$WBCTL" leases a --model b
err_has twomodels "wbctl leases: MODEL 'a' and --model 'b' conflict"
expect_rc 2 nomodelopt "$WBCTL" stats --model a
err_has nomodelopt "wbctl stats: unknown option '--model'"
# inspect's misuse reads the same.
expect_rc 2 inspect_none "$WBCTL" inspect
err_is inspect_none "wbctl inspect: missing argument PATH
Try 'wbctl inspect --help'."

# $WB_TIMEOUT_MS that is not a timeout is misuse, named, unless
# --timeout-ms overrides it; commands that need no broker do not read it.
for bad in abc 0 -1 99999999999 12ms " 5"; do
  WB_TIMEOUT_MS=$bad expect_rc 2 envtimeout "$WBCTL" --socket "$WB_TMP/none.sock" models
  err_is envtimeout "wbctl: WB_TIMEOUT_MS: expected milliseconds from 1 to 86400000, got '$bad' (unset it, or give --timeout-ms)
Try 'wbctl --help'."
done
WB_TIMEOUT_MS=abc expect_rc 2 envtimeout_load "$WBCTL" --socket "$WB_TMP/none.sock" load x "$WB_TMP/x.safetensors"
err_has envtimeout_load "WB_TIMEOUT_MS"
WB_TIMEOUT_MS=abc expect_rc 69 envtimeout_override "$WBCTL" --socket "$WB_TMP/none.sock" models --timeout-ms 500
WB_TIMEOUT_MS=abc expect_rc 0 envtimeout_help "$WBCTL" models --help
WB_TIMEOUT_MS='' expect_rc 69 envtimeout_empty "$WBCTL" --socket "$WB_TMP/none.sock" models

# Help: stdout, exit 0, without a broker.
expect_rc 0 help "$WBCTL" --help
grep -q "leases" "$WB_TMP/help.out" || fail "wbctl --help does not list leases"
grep -q "^Exit codes: 0 ok, 1 refused by the broker, 2 misuse" "$WB_TMP/help.out" ||
  fail "wbctl --help lists no exit codes: $(cat "$WB_TMP/help.out")"
for code in 65 66 69 74 75 77; do
  grep -A4 "^Exit codes" "$WB_TMP/help.out" | grep -qw "$code" || fail "wbctl --help does not name exit code $code"
done
for cmd in models leases containers load unload cancel stats inspect version; do
  expect_rc 0 "help_$cmd" "$WBCTL" "$cmd" --help
  grep -q "usage: wbctl .*$cmd" "$WB_TMP/help_$cmd.out" || fail "wbctl $cmd --help shows no usage"
  [ ! -s "$WB_TMP/help_$cmd.err" ] || fail "wbctl $cmd --help wrote to stderr"
done
for cmd in models leases containers; do
  grep -q -- "-o wide" "$WB_TMP/help_$cmd.out" || fail "wbctl $cmd --help does not describe -o wide"
  grep -q -- "MODEL, --model MODEL" "$WB_TMP/help_$cmd.out" || fail "wbctl $cmd --help does not describe MODEL"
done

# --version: the block every program prints; `wbctl version` says the same,
# and --json the same facts.
expect_rc 0 version "$WBCTL" --version
grep -qE '^wbctl [0-9]+\.[0-9]+\.[0-9]+ \(git [0-9a-f]+(-dirty)?|unknown, protocol [0-9]+\)$' <(head -n 1 "$WB_TMP/version.out") ||
  fail "wbctl --version: $(cat "$WB_TMP/version.out")"
grep -qx "backends: host.*" "$WB_TMP/version.out" || fail "wbctl --version names no backends: $(cat "$WB_TMP/version.out")"
[ "$(head -n 1 "$WB_TMP/version.out" | cut -d' ' -f2-)" = "$("$WBROKERD" --version | head -n 1 | cut -d' ' -f2-)" ] ||
  fail "wbctl and wbrokerd disagree on the version: $(head -n 1 "$WB_TMP/version.out") / $("$WBROKERD" --version | head -n 1)"
expect_rc 0 version2 "$WBCTL" version
cmp -s "$WB_TMP/version.out" "$WB_TMP/version2.out" || fail "wbctl version differs from --version: $(cat "$WB_TMP/version2.out")"
expect_rc 0 versionjson "$WBCTL" --json version
[ "$(json "d['program'], d['protocol'] > 0, 'host' in d['backends'], d['version'] in '$(head -n 1 "$WB_TMP/version.out")'" <"$WB_TMP/versionjson.out")" = "('wbctl', True, True, True)" ] ||
  fail "wbctl version --json: $(cat "$WB_TMP/versionjson.out")"

make_model "$WB_TMP/demo.safetensors" 3 9 >/dev/null
bytes=$(make_model "$WB_TMP/second.safetensors" 6 10)
# A model of 3 MiB: its size reads "3.0 MiB" in the tables.
"$PYTHON" - "$WB_TMP/big.safetensors" <<'PY'
import json, struct, sys
n = 3 << 20
h = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(n))
PY
start_broker --model "demo=$WB_TMP/demo.safetensors" --model "big=$WB_TMP/big.safetensors"
wait_for model_ready demo || fail "model demo did not become ready"
wait_for model_ready big || fail "model big did not become ready"

# A malformed file: refused with the reader's message naming the file.
printf '\xff\xff\xff\xff\xff\xff\xff\x7fgarbage' >"$WB_TMP/broken.safetensors"
expect_rc 1 badload "$WBCTL" --socket "$SOCK" load broken "$WB_TMP/broken.safetensors"
err_has badload "wbctl: load: "
err_has badload "broken.safetensors"
[ "$(model_state broken)" = absent ] || fail "a failed load left model 'broken' listed"
expect_rc 1 nofile "$WBCTL" --socket "$SOCK" load nofile "$WB_TMP/nonexistent.safetensors"
err_has nofile "nonexistent.safetensors"

# The broker's message quotes the checkpoint: a tensor name with terminal
# escapes (line erase, cursor up), a forged line, bidi controls and
# zero-width characters reaches the terminal escaped, on one line.
"$PYTHON" - "$WB_TMP/hostile.safetensors" <<'PY'
import json, struct, sys
name = "w\x1b[2K\x1b[1A\rFORGED\n\u202eexe.txt\u200b\u2066x\u2069\ufeff\u2028"
h = json.dumps({name: {"dtype": "XX", "shape": [1], "data_offsets": [0, 4]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(4))
PY
expect_rc 1 hostile "$WBCTL" --socket "$SOCK" load hostile "$WB_TMP/hostile.safetensors"
[ "$(wc -l <"$WB_TMP/hostile.err")" = 1 ] || fail "hostile: the refusal is not one line: $(cat "$WB_TMP/hostile.err")"
if LC_ALL=C grep -q $'[\x01-\x09\x0b-\x1f\x7f]\|\xe2\x80[\x8b-\x8f\xa8-\xae]\|\xe2\x81[\xa0\xa6-\xa9]\|\xef\xbb\xbf' "$WB_TMP/hostile.err"; then
  fail "hostile: control or format characters printed: $(od -c "$WB_TMP/hostile.err" | head -n 5)"
fi
err_has hostile "tensor 'w\x1b[2K\x1b[1A\x0dFORGED\x0a\u{202e}exe.txt\u{200b}\u{2066}x\u{2069}\u{feff}\u{2028}': unknown dtype 'XX'"
# A path that is not UTF-8 cannot travel in a LoadRequest (its strings are
# UTF-8): refused by the broker's decoder, naming the byte.
cp "$WB_TMP/demo.safetensors" "$WB_TMP/"$'odd\xff.safetensors'
expect_rc 1 oddpath "$WBCTL" --socket "$SOCK" load odd "$WB_TMP/"$'odd\xff.safetensors'
err_has oddpath "load.path is not valid UTF-8 (byte $((${#WB_TMP} + 4)))"

# A relative path is made absolute before it is sent.
(cd "$WB_TMP" && "$WBCTL" --socket "$SOCK" load second second.safetensors) \
  >"$WB_TMP/load.out" 2>"$WB_TMP/load.err" || fail "wbctl load second failed: $(cat "$WB_TMP/load.err")"
grep -q "^second  *1  *current  *host " "$WB_TMP/load.out" || fail "load printed: $(cat "$WB_TMP/load.out")"
models=$(ctl models --json)
got=$(json "[(m['state'], m['backend'], m['device'], m['tensors'], m['bytes'], m['path'], m['leases']) for m in d if m['name'] == 'second']" <<<"$models")
want="[[\"ready\", \"host\", -1, 6, $bytes, \"$(realpath "$WB_TMP")/second.safetensors\", 0]]"
[ "$got" = "$want" ] || fail "model second: got $got, want $want"
[ "$(json "all(m['slab_bytes'] >= m['bytes'] and m['load_seconds'] >= 0 for m in d)" <<<"$models")" = True ] ||
  fail "slab_bytes or load_seconds are inconsistent: $models"
for key in name path state backend device tensors bytes slab_bytes leases load_seconds load_gbps; do
  [ "$(json "all('$key' in m for m in d)" <<<"$models")" = True ] || fail "models --json lacks '$key'"
done
ctl models | head -n 1 | grep -q "^NAME  *VERSION  *STATE  *BACKEND  *DEVICE  *TENSORS  *SIZE  *SHARED  *LEASES  *SLAB  *ACCESS$" ||
  fail "unexpected models header: $(ctl models | head -n 1)"
ctl models -o wide | head -n 1 | grep -q "^NAME  *VERSION  *STATE  *TIER  *BACKEND  *DEVICE  *TENSORS  *SIZE  *SHARED  *LEASES  *LOAD_S  *RATE  *SLAB  *ACCESS  *CHECKSUMS  *SOURCE$" ||
  fail "unexpected models -o wide header: $(ctl models -o wide | head -n 1)"
expect_rc 0 loadjson "$WBCTL" --socket "$SOCK" load --json third "$WB_TMP/second.safetensors"
[ "$(json "d['name'], d['state'], d['tensors']" <"$WB_TMP/loadjson.out")" = "('third', 'ready', 6)" ] ||
  fail "load --json printed: $(cat "$WB_TMP/loadjson.out")"

# Refusals: exit 1 with the broker's message.
expect_rc 1 dup "$WBCTL" --socket "$SOCK" load second "$WB_TMP/second.safetensors"
err_has dup "wbctl: load: "
expect_rc 1 unknown "$WBCTL" --socket "$SOCK" unload nosuch
err_is unknown "wbctl: unload: no model named 'nosuch'"
# A request typed wrong is misuse, whoever finds it: a model name the
# broker refuses as invalid (WB_EINVAL), a placement wbctl cannot parse.
expect_rc 2 badname "$WBCTL" --socket "$SOCK" load --no-wait "bad name!" "$WB_TMP/second.safetensors"
err_has badname "wbctl: load: model name \"bad name!\" is not 1 to"
misuse_ends badname load
# The same refusal of a load that waits for its reply.
expect_rc 2 badname_wait "$WBCTL" --socket "$SOCK" load "bad name!" "$WB_TMP/second.safetensors"
err_has badname_wait "wbctl: load: model name \"bad name!\" is not 1 to"
expect_rc 2 badplace "$WBCTL" --socket "$SOCK" load place "$WB_TMP/second.safetensors@0,,1"
err_has badplace "wbctl load: placement '0,,1': position 3: an empty item"
misuse_ends badplace load
[ "$(model_state place)" = absent ] || fail "a refused placement left model 'place' listed"

# Output that cannot be written (a full disk), JSON or a table: exit 1 and
# why, not a silent 0.
for cmd in "leases --json" "stats --json" "leases" "models" "stats"; do
  # shellcheck disable=SC2086 # the command's words
  "$WBCTL" --socket "$SOCK" $cmd >/dev/full 2>"$WB_TMP/full.err"
  rc=$?
  [ "$rc" = 1 ] || fail "wbctl $cmd >/dev/full exited with $rc, expected 1"
  grep -qF "wbctl: writing the output: No space left on device" "$WB_TMP/full.err" ||
    fail "wbctl $cmd >/dev/full: $(cat "$WB_TMP/full.err")"
done

# Stats: every field, consistent with what happened.
stats=$(ctl stats --json) || fail "wbctl stats --json failed"
for key in uptime_seconds requests_total requests_failed malformed_messages leases_granted \
  leases_released leases_reclaimed leases_active leases_stale models model_bytes loads_total \
  loads_failed load_bytes_total load_seconds_total peers; do
  [ "$(json "'$key' in d" <<<"$stats")" = True ] || fail "stats --json lacks '$key'"
done
granted=$(json "d['leases_granted']" <<<"$stats")
[ "$(json "d['models']" <<<"$stats")" = 4 ] || fail "stats: models is not 4: $stats"
[ "$(json "d['loads_failed'] >= 1 and d['requests_failed'] >= 5" <<<"$stats")" = True ] ||
  fail "stats do not count the failed loads and refusals: $stats"
for i in 1 2; do
  spawn "brief$i" "$WORKER" --socket "$SOCK" --model second --hold 0
  pid=$LAST_PID
  wait_exit "$pid"
  [ "$EXIT_RC" = 0 ] || fail "worker brief$i exited with $EXIT_RC"
  output_has "brief$i" "verified 6 tensors" || fail "worker brief$i did not verify"
done
stats=$(ctl stats --json)
[ "$(json "d['leases_granted']" <<<"$stats")" = $((granted + 2)) ] || fail "leases_granted did not grow by 2: $stats"
[ "$(json "d['leases_released']" <<<"$stats")" = 2 ] || fail "leases_released is not 2: $stats"
[ "$(json "d['leases_active'] + d['leases_stale'] + d['peers']" <<<"$stats")" = 0 ] ||
  fail "leases remain counted: $stats"
ctl stats | grep -q "^leases_granted: $((granted + 2))$" || fail "plain stats: $(ctl stats)"
ctl stats | grep -qE "^model_bytes: [0-9.]+ (KiB|MiB)$" || fail "plain stats: model_bytes: $(ctl stats | grep model_bytes)"

# Sizes for people in IEC units, in the tables and the stage line; raw
# integers in --json.
ctl models >"$WB_TMP/models.tab" || fail "wbctl models failed"
grep -qE "^big  +1  +current  +host  +-1  +1  +3\.0 MiB  +-  +0  " "$WB_TMP/models.tab" || fail "big's size: $(cat "$WB_TMP/models.tab")"
grep -qE "^demo  +1  +current  +host  +-1  +3  +[0-9]+ B  " "$WB_TMP/models.tab" || fail "demo's size: $(cat "$WB_TMP/models.tab")"
[ "$(ctl models --json | json "[(m['bytes'], type(m['bytes']).__name__) for m in d if m['name'] == 'big']")" = '[[3145728, "int"]]' ] ||
  fail "models --json: big's bytes: $(ctl models --json | json "[m['bytes'] for m in d]")"
ctl models -o wide | grep -qE "^big .* [0-9.]+ (B|KiB|MiB|GiB|TiB)/s  " || fail "models -o wide: no rate in GiB/s units: $(ctl models -o wide)"
grep -qE "(GB/s|[0-9] bytes)" "$WB_TMP/models.tab" && fail "decimal units in models: $(cat "$WB_TMP/models.tab")"
expect_rc 0 loadbig "$WBCTL" --socket "$SOCK" load big2 "$WB_TMP/big.safetensors"
grep -qE "^load: [a-z-]+, [0-9]+ threads?.*; read [0-9.]+ (B|KiB|MiB|GiB)/s, hash [0-9.]+ (B|KiB|MiB|GiB)/s" "$WB_TMP/loadbig.out" ||
  fail "the stage line: $(cat "$WB_TMP/loadbig.out")"
grep -q "GB/s" "$WB_TMP/loadbig.out" && fail "the stage line mixes in GB/s: $(cat "$WB_TMP/loadbig.out")"
expect_rc 0 unloadbig2 "$WBCTL" --socket "$SOCK" unload big2

# Workers on two models: the tables' default fits 100 columns, -o wide has
# every column, and the headers are those the man page shows.
start_worker wbig --model big --hold 60
WBIG=$LAST_PID
start_worker wdemo --model demo --hold 60
WDEMO=$LAST_PID
wait_for all_active 2 || fail "the two leases are not active: $(ctl leases)"
ctl leases >"$WB_TMP/leases.tab" || fail "wbctl leases failed"
ctl leases -o wide >"$WB_TMP/leases_wide.tab" || fail "wbctl leases -o wide failed"
[ "$(header_of "$WB_TMP/leases.tab")" = "ID MODEL VERSION PID PROCESS STATE CONTAINERS SHARED AGE" ] ||
  fail "leases header: $(head -n 1 "$WB_TMP/leases.tab")"
[ "$(header_of "$WB_TMP/leases_wide.tab")" = "ID MODEL VERSION PID PROCESS UID GID STATE CONTAINERS SHARED SLABS SIZE AGE HEARTBEAT BACKEND SLAB ACCESS" ] ||
  fail "leases -o wide header: $(head -n 1 "$WB_TMP/leases_wide.tab")"
grep -qE "^[0-9a-f]{8}  +big  +1  +$WBIG  +wb-demo-worker  +active  +0  +0 \(0 B\)  +[0-9]+s$" "$WB_TMP/leases.tab" ||
  fail "big's lease: $(cat "$WB_TMP/leases.tab")"
grep -qE "^[0-9a-f]{8}  +big  +1  +$WBIG  +wb-demo-worker  +0  +0  +active  +0  +0 \(0 B\)  +1  +3\.0 MiB  +[0-9]+s  +[0-9.]+s ago  +host  +(memfd|shm)  +ro$" "$WB_TMP/leases_wide.tab" ||
  fail "big's lease, wide: $(cat "$WB_TMP/leases_wide.tab")"
[ "$(ctl leases --json | json "sorted((l['model'], l['bytes']) for l in d)")" = "[[\"big\", 3145728], [\"demo\", $(ctl models --json | json "next(m['bytes'] for m in d if m['name'] == 'demo')")]]" ] ||
  fail "leases --json bytes: $(ctl leases --json | json "[(l['model'], l['bytes']) for l in d]")"

# Containers on both models (records a client reports in its heartbeat:
# 16 on each lease, with 1000-byte package paths).
spawn cdemo "$TESTCLIENT" --socket "$SOCK" forge demo full
CDEMO=$LAST_PID
spawn cbig "$TESTCLIENT" --socket "$SOCK" forge big full
CBIG=$LAST_PID
wait_for output_has cdemo "heartbeat status=0" || fail "cdemo: $(cat "$WB_TMP/cdemo.out")"
wait_for output_has cbig "heartbeat status=0" || fail "cbig: $(cat "$WB_TMP/cbig.out")"
ctl containers >"$WB_TMP/containers.tab" || fail "wbctl containers failed"
ctl containers -o wide >"$WB_TMP/containers_wide.tab" || fail "wbctl containers -o wide failed"
[ "$(header_of "$WB_TMP/containers.tab")" = "PID PROCESS ID MODELS VERSION SHARED FOLDED AGE" ] ||
  fail "containers header: $(head -n 1 "$WB_TMP/containers.tab")"
[ "$(header_of "$WB_TMP/containers_wide.tab")" = "PID PROCESS ID API PINNED MODELS VERSION SHARED FOLDED BOUND(L/A/C/P/F/U) SWAPS LAST_SWAP AGE PATH" ] ||
  fail "containers -o wide header: $(head -n 1 "$WB_TMP/containers_wide.tab")"
[ "$(wc -l <"$WB_TMP/containers.tab")" = 33 ] || fail "containers: $(wc -l <"$WB_TMP/containers.tab") lines, expected 33"
grep -qE "^[0-9]+  +wbtest_client  +16  +big  +1  +64 B  +0 B  +(-|[0-9hms]+)$" "$WB_TMP/containers.tab" ||
  fail "a container of big: $(grep big "$WB_TMP/containers.tab" | head -n 2)"
grep -qE "  CreateWithDevice  +off  +big  +1  +64 B  +0 B  +[0-9]+/[0-9]+/[0-9]+/[0-9]+/[0-9]+/[0-9]+  +0  +-  +(-|[0-9hms]+)  +/p{999}$" "$WB_TMP/containers_wide.tab" ||
  fail "a container of big, wide: $(grep big "$WB_TMP/containers_wide.tab" | head -n 1 | cut -c 1-200)"
ctl leases >"$WB_TMP/leases.tab"
ctl leases -o wide >"$WB_TMP/leases_wide.tab"
grep -qE "^[0-9a-f]{8}  +big  +1  +[0-9]+  +wbtest_client  +active  +16  +16 \(1\.0 KiB\)  +[0-9]+s$" "$WB_TMP/leases.tab" ||
  fail "the lease with containers: $(cat "$WB_TMP/leases.tab")"
ctl models >"$WB_TMP/models.tab"
ctl models -o wide >"$WB_TMP/models_wide.tab"
for t in leases containers models; do
  [ "$(wide_lines "$WB_TMP/$t.tab")" = 0 ] ||
    fail "wbctl $t is wider than 100 columns: $(awk 'length > 100' "$WB_TMP/$t.tab" | head -n 2)"
  [ "$(header_of "$WB_TMP/$t.tab")" = "$(man_header "$t")" ] ||
    fail "wbctl.1 shows the $t header as '$(man_header "$t")', wbctl prints '$(header_of "$WB_TMP/$t.tab")'"
  [ "$(header_of "$WB_TMP/${t}_wide.tab")" = "$(man_header "$t" -o wide)" ] ||
    fail "wbctl.1 shows the $t -o wide header as '$(man_header "$t" -o wide)', wbctl prints '$(header_of "$WB_TMP/${t}_wide.tab")'"
  [ "$(wc -l <"$WB_TMP/$t.tab")" = "$(wc -l <"$WB_TMP/${t}_wide.tab")" ] || fail "wbctl $t -o wide has other rows"
done
[ "$(wide_lines "$WB_TMP/containers_wide.tab")" = 33 ] || fail "containers -o wide does not show the long paths: $(wide_lines "$WB_TMP/containers_wide.tab") long lines"
[ "$(wide_lines "$WB_TMP/leases_wide.tab")" -ge 1 ] || fail "leases -o wide is no wider: $(cat "$WB_TMP/leases_wide.tab")"

# Filters: one model's rows only, as MODEL or --model, in tables and JSON.
ctl leases big >"$WB_TMP/f1.tab" || fail "wbctl leases big failed"
[ "$(tail -n +2 "$WB_TMP/f1.tab" | awk '{print $2}' | sort | uniq -c | tr -s ' ')" = " 2 big" ] ||
  fail "leases big: $(cat "$WB_TMP/f1.tab")"
[ "$(ctl leases --model demo --json | json "sorted(set(l['model'] for l in d)), len(d)")" = "(['demo'], 2)" ] ||
  fail "leases --model demo --json: $(ctl leases --model demo --json | json "[l['model'] for l in d]")"
[ "$(ctl containers --model big | tail -n +2 | awk '{print $4}' | sort -u)" = big ] ||
  fail "containers --model big: $(ctl containers --model big)"
[ "$(ctl containers big | wc -l)" = 17 ] || fail "containers big: $(ctl containers big | wc -l) lines"
[ "$(ctl containers --json demo | json "len(d), all(c['leases'][0]['model'] == 'demo' for c in d)")" = "(16, True)" ] ||
  fail "containers --json demo: $(ctl containers --json demo | json "[c['leases'] for c in d]")"
[ "$(ctl models big | tail -n +2 | awk '{print $1}')" = big ] || fail "models big: $(ctl models big)"
[ "$(ctl models --json --model demo | json "[m['name'] for m in d]")" = '["demo"]' ] || fail "models --model demo"
[ "$(ctl leases nosuch | wc -l)" = 1 ] || fail "leases of a model nobody leases: $(ctl leases nosuch)"
[ "$(ctl models --json nosuch)" = "[]" ] || fail "models nosuch --json: $(ctl models --json nosuch)"

# Global options before or after the command (and its arguments).
ids() { json "sorted(l['id'] for l in d)"; }
want=$(ctl leases --json | ids)
[ "$(WB_SOCKET=$WB_TMP/none.sock "$WBCTL" --json leases --socket "$SOCK" | ids)" = "$want" ] || fail "--json before, --socket after"
[ "$(WB_SOCKET=$WB_TMP/none.sock "$WBCTL" leases --timeout-ms 4000 --socket "$SOCK" --json | ids)" = "$want" ] ||
  fail "--timeout-ms and --socket after the command"
[ "$(WB_SOCKET=$WB_TMP/none.sock "$WBCTL" --socket "$SOCK" --timeout-ms 4000 -o json leases | ids)" = "$want" ] ||
  fail "everything before the command"
[ "$(WB_SOCKET=$WB_TMP/none.sock "$WBCTL" leases big --socket "$SOCK" -o wide | header_of /dev/stdin)" = \
  "$(header_of "$WB_TMP/leases_wide.tab")" ] || fail "-o wide after the filter"
[ "$(WB_SOCKET=$WB_TMP/none.sock "$WBCTL" --output wide models --socket "$SOCK" | header_of /dev/stdin)" = \
  "$(header_of "$WB_TMP/models_wide.tab")" ] || fail "--output wide before the command"
expect_rc 0 afterload "$WBCTL" load third2 "$WB_TMP/second.safetensors" --socket "$SOCK" --json
[ "$(json "d['name']" <"$WB_TMP/afterload.out")" = third2 ] || fail "load with --socket and --json after: $(cat "$WB_TMP/afterload.out")"
expect_rc 0 afterunload "$WBCTL" --json unload third2 --socket "$SOCK"
[ "$(json "d['state']" <"$WB_TMP/afterunload.out")" = freed ] || fail "unload with --json before"
WB_TIMEOUT_MS=abc expect_rc 0 afterenv "$WBCTL" stats --socket "$SOCK" --timeout-ms 3000
# Reals in --json print without float noise: each is the shortest text of
# its value, seconds to the microsecond, times to the millisecond.
for cmd in stats models leases; do
  ctl "$cmd" --json >"$WB_TMP/reals.json" || fail "wbctl $cmd --json failed"
  "$PYTHON" - "$WB_TMP/reals.json" <<'PY' || fail "wbctl $cmd --json: float noise: $(cat "$WB_TMP/reals.out")"
import decimal, json, sys
reals = []
json.load(open(sys.argv[1]), parse_float=lambda t: reals.append(t) or float(t))
# The text is the shortest that reads back as its value (Python's repr), and
# has at most 6 decimals.
D = decimal.Decimal
bad = [t for t in reals if D(t) != D(repr(float(t))) or D(t).as_tuple().exponent < -6]
open(sys.argv[1].replace(".json", ".out"), "w").write(" ".join(bad) + "\n")
sys.exit(1 if bad or not reals else 0)
PY
done
ctl stats --json | grep -qE '"uptime_seconds": [0-9]+(\.[0-9]{1,6})?,' || fail "uptime_seconds: $(ctl stats --json | grep uptime)"

kill -TERM "$WBIG" "$WDEMO" "$CDEMO" "$CBIG"
for pid in "$WBIG" "$WDEMO" "$CDEMO" "$CBIG"; do
  wait_exit "$pid"
done
wait_for all_active 0 || fail "leases remain: $(ctl leases)"

# A socket this process may not open: permission denied, not "no broker",
# with the mode and owner of what is in the way and who this process is.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null &&
  setpriv --reuid 65534 --regid 65534 --clear-groups "$WBCTL" --help >/dev/null 2>&1; then
  NOBODY=(setpriv --reuid 65534 --regid 65534 --clear-groups)
  chmod 0700 "$WB_TMP"
  expect_rc 77 eaccesdir "${NOBODY[@]}" "$WBCTL" --socket "$SOCK" models
  err_is eaccesdir "wbctl: cannot connect to $SOCK: permission denied: the directory $WB_TMP is 0700 root:root and this process is uid 65534 gid 65534 (no supplementary groups)"
  chmod 0711 "$WB_TMP"
  mode=$(stat -c %a "$SOCK")
  expect_rc 77 eacces "${NOBODY[@]}" "$WBCTL" --socket "$SOCK" leases --json
  err_is eacces "wbctl: cannot connect to $SOCK: permission denied: the socket is 0$mode root:root and this process is uid 65534 gid 65534 (no supplementary groups)"
  expect_rc 77 eacces_groups setpriv --reuid 65534 --regid 65534 --groups 65534,4 "$WBCTL" --socket "$SOCK" stats
  err_has eacces_groups "this process is uid 65534 gid 65534 (groups 4 65534)"
  # A socket that is missing is still "no broker" (69), for nobody too.
  expect_rc 69 nobody_missing "${NOBODY[@]}" "$WBCTL" --socket "$WB_TMP/none.sock" models
  err_has nobody_missing "no broker socket at $WB_TMP/none.sock: No such file or directory"
  chmod 0700 "$WB_TMP"
else
  log "SKIP the permission-denied checks: they need root, setpriv and a wbctl that uid 65534 can run"
fi

# Unload prints the resulting state.
expect_rc 0 unload "$WBCTL" --socket "$SOCK" unload second
[ "$(cat "$WB_TMP/unload.out")" = freed ] || fail "unload printed: $(cat "$WB_TMP/unload.out")"
expect_rc 0 unloadjson "$WBCTL" --socket "$SOCK" unload --json third
[ "$(json "d['name'], d['state']" <"$WB_TMP/unloadjson.out")" = "('third', 'freed')" ] ||
  fail "unload --json printed: $(cat "$WB_TMP/unloadjson.out")"
stop_broker

# Completion. bash: the function the script registers, called as readline
# would, offers the commands, their options and the broker's models.
complete_words() {
  bash -c 'source "$1"; shift; fn=$1; shift
COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); "$fn"; printf "%s\n" "${COMPREPLY[@]}"' \
    _ "$@" | sort | tr '\n' ' ' | sed 's/ $//'
}
[ "$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" lea)" = leases ] ||
  fail "bash completion of 'wbctl lea': '$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" lea)'"
[ "$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" --json "")" = "cancel containers inspect leases load models rollback rollout sleep stats unload version wake" ] ||
  fail "bash completion of the commands: '$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" --json "")'"
[ "$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" leases --o)" = --output ] ||
  fail "bash completion of 'wbctl leases --o'"
[ "$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" containers --m)" = --model ] ||
  fail "bash completion of 'wbctl containers --m'"
[ "$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" models -o "")" = "json wide" ] ||
  fail "bash completion of '-o'"
start_broker_with_demo "$WB_TMP/demo.safetensors"
[ "$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" --socket "$SOCK" leases "")" = demo ] ||
  fail "bash completion of a model: '$(complete_words "$COMPLETION/wbctl.bash" _wbctl "$WBCTL" --socket "$SOCK" leases "")'"
stop_broker
[ "$(complete_words "$COMPLETION/wbrokerd.bash" _wbrokerd "$WBROKERD" --backend "")" = "auto cuda host" ] ||
  fail "bash completion of 'wbrokerd --backend'"
[ "$(complete_words "$COMPLETION/wbrokerd.bash" _wbrokerd "$WBROKERD" --max-queued-r)" = --max-queued-replies ] ||
  fail "bash completion of 'wbrokerd --max-queued-r'"
for f in wbctl.bash wbrokerd.bash; do
  bash -n "$COMPLETION/$f" || fail "the bash completion $f does not parse"
done
# zsh: the scripts parse, and compinit registers them for their programs.
if command -v zsh >/dev/null; then
  for f in _wbctl _wbrokerd; do
    zsh -n "$COMPLETION/$f" || fail "zsh -n $f failed"
  done
  got=$(cd "$WB_TMP" && HOME=$WB_TMP zsh -fc "fpath=($COMPLETION \$fpath); autoload -U compinit; compinit -u -d $WB_TMP/zcompdump; print -r -- \${_comps[wbctl]} \${_comps[wbrokerd]}")
  [ "$got" = "_wbctl _wbrokerd" ] || fail "zsh's compinit does not register the completion: '$got'"
else
  log "SKIP the zsh completion checks: zsh is not installed (scripts/setup.sh installs it)"
fi
