#!/usr/bin/env bash
# wbctl's broker commands: exit codes (0 ok, 1 refused, 2 misuse, 69 no
# broker), help, loading and unloading, and the JSON shapes scripts rely on.
source "$(dirname "$0")/lib.sh"

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

# Misuse: exit 2 with the problem named on stderr, nothing on stdout.
expect_rc 2 noargs "$WBCTL"
expect_rc 2 badcmd "$WBCTL" frobnicate
err_has badcmd "frobnicate"
expect_rc 2 badopt "$WBCTL" models --bogus
err_has badopt "--bogus"
expect_rc 2 extra "$WBCTL" models extra
err_has extra "'extra'"
expect_rc 2 missing "$WBCTL" load onlyname
err_has missing "missing argument PATH"
expect_rc 2 missing2 "$WBCTL" unload
err_has missing2 "missing argument NAME"
expect_rc 2 toomany "$WBCTL" unload a b
err_has toomany "'b'"
expect_rc 2 badtimeout "$WBCTL" --timeout-ms soon models
err_has badtimeout "--timeout-ms"
[ ! -s "$WB_TMP/badopt.out" ] || fail "misuse printed to stdout"

# Help: stdout, exit 0, without a broker.
expect_rc 0 help "$WBCTL" --help
grep -q "leases" "$WB_TMP/help.out" || fail "wbctl --help does not list leases"
for cmd in models leases load unload stats; do
  expect_rc 0 "help_$cmd" "$WBCTL" "$cmd" --help
  grep -q "usage: wbctl .*$cmd" "$WB_TMP/help_$cmd.out" || fail "wbctl $cmd --help shows no usage"
done

make_model "$WB_TMP/demo.safetensors" 3 9 >/dev/null
bytes=$(make_model "$WB_TMP/second.safetensors" 6 10)
start_broker_with_demo "$WB_TMP/demo.safetensors"

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
grep -q "^second  *ready  *host " "$WB_TMP/load.out" || fail "load printed: $(cat "$WB_TMP/load.out")"
models=$(ctl models --json)
got=$(json "[(m['state'], m['backend'], m['device'], m['tensors'], m['bytes'], m['path'], m['leases']) for m in d if m['name'] == 'second']" <<<"$models")
want="[[\"ready\", \"host\", -1, 6, $bytes, \"$(realpath "$WB_TMP")/second.safetensors\", 0]]"
[ "$got" = "$want" ] || fail "model second: got $got, want $want"
[ "$(json "all(m['slab_bytes'] >= m['bytes'] and m['load_seconds'] >= 0 for m in d)" <<<"$models")" = True ] ||
  fail "slab_bytes or load_seconds are inconsistent: $models"
for key in name path state backend device tensors bytes slab_bytes leases load_seconds load_gbps; do
  [ "$(json "all('$key' in m for m in d)" <<<"$models")" = True ] || fail "models --json lacks '$key'"
done
ctl models | head -n 1 | grep -q "^NAME  *STATE  *BACKEND  *DEVICE  *TENSORS  *BYTES  *LEASES  *LOAD_S  *GB/S  *SLAB  *ACCESS$" ||
  fail "unexpected models header: $(ctl models | head -n 1)"
expect_rc 0 loadjson "$WBCTL" --socket "$SOCK" load --json third "$WB_TMP/second.safetensors"
[ "$(json "d['name'], d['state'], d['tensors']" <"$WB_TMP/loadjson.out")" = "('third', 'ready', 6)" ] ||
  fail "load --json printed: $(cat "$WB_TMP/loadjson.out")"

# Refusals: exit 1 with the broker's message.
expect_rc 1 dup "$WBCTL" --socket "$SOCK" load second "$WB_TMP/second.safetensors"
err_has dup "wbctl: load: "
expect_rc 1 badname "$WBCTL" --socket "$SOCK" load "bad name!" "$WB_TMP/second.safetensors"
expect_rc 1 unknown "$WBCTL" --socket "$SOCK" unload nosuch
err_has unknown "wbctl: unload: "
err_has unknown "nosuch"

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
[ "$(json "d['models']" <<<"$stats")" = 3 ] || fail "stats: models is not 3: $stats"
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

# Unload prints the resulting state.
expect_rc 0 unload "$WBCTL" --socket "$SOCK" unload second
[ "$(cat "$WB_TMP/unload.out")" = freed ] || fail "unload printed: $(cat "$WB_TMP/unload.out")"
expect_rc 0 unloadjson "$WBCTL" --socket "$SOCK" unload --json third
[ "$(json "d['name'], d['state']" <"$WB_TMP/unloadjson.out")" = "('third', 'freed')" ] ||
  fail "unload --json printed: $(cat "$WB_TMP/unloadjson.out")"
stop_broker
