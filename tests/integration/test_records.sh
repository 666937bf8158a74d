#!/usr/bin/env bash
# Container records from hostile clients, with real processes:
# * records that repeat a container id, or outnumber the lease's containers,
#   are refused with WB_EPROTO naming the field and the lease, and the
#   listings keep working (they used to overflow a heap array);
# * records at their bounds from several clients, against a smaller message
#   limit, still list in full: the listings come in pages that fit;
# * a process name and a model path full of terminal controls and format
#   characters come out of wbctl's tables escaped, and --json keeps them
#   exact;
# * a model path that is not UTF-8 is refused, naming the field, and
#   strings the broker took from elsewhere (a process name from /proc, a
#   preloaded model's path) go out as UTF-8, so that every listing still
#   decodes.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 7 >/dev/null
ODD=$WB_TMP/$'odd\xff\xfe.safetensors'
cp "$WB_TMP/demo.safetensors" "$ODD"
start_broker --model "demo=$WB_TMP/demo.safetensors" --model "odd=$ODD" --max-message-bytes 65536
wait_for model_ready demo || fail "model demo did not become ready"
wait_for model_ready odd || fail "model odd did not become ready"
[ "$(ctl models --json | json "next(m['path'] for m in d if m['name'] == 'odd') == '$WB_TMP/odd\ufffd\ufffd.safetensors'")" = True ] ||
  fail "the path that is not UTF-8 is not sent as U+FFFD: $(ctl models --json | json "[m['path'] for m in d]")"

# forge NAME KIND [ARGS...]: a client that sends forged records; waits for
# its heartbeat's answer.
forge() {
  local name=$1 kind=$2
  shift 2
  spawn "$name" "$TESTCLIENT" --socket "$SOCK" "$@" forge demo "$kind"
  wait_for output_has "$name" "heartbeat status=" || fail "$name: no heartbeat answer"
}

forge dup dup
id=$(head -n 1 "$WB_TMP/dup.out")
[ "${#id}" = 32 ] || fail "dup: no lease id: $(cat "$WB_TMP/dup.out")"
output_has dup "heartbeat status=-" || fail "dup: the heartbeat was accepted"
output_has dup "heartbeat.leases[0].container_records[2].container_id 1 repeats records[0] on lease ${id:0:8}" ||
  fail "dup: unclear refusal: $(cat "$WB_TMP/dup.out")"
forge over over
id2=$(head -n 1 "$WB_TMP/over.out")
output_has over "heartbeat.leases[0].container_records has 3 records but the lease ${id2:0:8} reports 1 containers" ||
  fail "over: unclear refusal: $(cat "$WB_TMP/over.out")"
grep -q "event=bad_heartbeat pid=[0-9]* uid=[0-9]* lease=${id:0:8}" "$BROKER_LOG" ||
  fail "the broker did not log the bad heartbeat"
ctl containers >"$WB_TMP/c1.out" 2>"$WB_TMP/c1.err" || fail "wbctl containers failed"
[ "$(wc -l <"$WB_TMP/c1.out")" = 1 ] || fail "refused records are listed: $(cat "$WB_TMP/c1.out")"
ctl containers >/dev/null 2>&1 || fail "wbctl containers failed the second time"
alive "$BROKER_PID" || fail "the broker died listing containers"

# Six clients with 16 records of 1000-byte paths each: over one
# 65536-byte message, listed in full anyway.
for i in 1 2 3 4 5 6; do
  forge "full$i" full
  output_has "full$i" "heartbeat status=0" || fail "full$i: $(cat "$WB_TMP/full$i.out")"
done
ctl leases >"$WB_TMP/leases.out" 2>"$WB_TMP/leases.err" ||
  fail "wbctl leases failed: $(cat "$WB_TMP/leases.err")"
[ "$(wc -l <"$WB_TMP/leases.out")" = 9 ] || fail "wbctl leases: expected 8 leases: $(cat "$WB_TMP/leases.out")"
[ "$(ctl leases --json | json 'len(d)')" = 8 ] || fail "wbctl leases --json does not list 8 leases"
[ "$(ctl leases --json | json 'sum(l["container_records_total"] for l in d)')" = 96 ] ||
  fail "the leases do not hold 96 records in all"
ctl containers >"$WB_TMP/cont.out" 2>"$WB_TMP/cont.err" ||
  fail "wbctl containers failed: $(cat "$WB_TMP/cont.err")"
[ "$(ctl containers --json | json 'len(d)')" = 96 ] || fail "wbctl containers --json does not list 96 containers"
[ "$(stat_field limit_refusals)" = 0 ] || fail "a listing was refused for its size"

# A model path that is not UTF-8: refused whole, naming the field.
forge bad badutf8
output_has bad "heartbeat status=-6" || fail "badutf8: the heartbeat was accepted: $(cat "$WB_TMP/bad.out")"
output_has bad "heartbeat.leases[0].container_records[0].model_path is not valid UTF-8 (byte 12)" ||
  fail "badutf8: unclear refusal: $(cat "$WB_TMP/bad.out")"

# Terminal controls in a process name and a model path; a process name
# that is not UTF-8.
COMM=$'\e[31mX\nFORGED\a'
forge evil escape --comm "$COMM"
output_has evil "heartbeat status=0" || fail "evil: $(cat "$WB_TMP/evil.out")"
evil=$LAST_PID
forge odd dup --comm $'odd\xff\xfename'
odd=$LAST_PID
for what in leases containers leases_wide containers_wide; do
  # "leases_wide" is `wbctl leases -o wide`.
  args=("${what%_wide}")
  [ "$what" = "${what%_wide}" ] || args+=(-o wide)
  ctl "${args[@]}" >"$WB_TMP/$what.tab" 2>&1 || fail "wbctl ${args[*]} failed"
  if LC_ALL=C grep -q $'[\x01-\x09\x0b-\x1f\x7f]' "$WB_TMP/$what.tab"; then
    fail "wbctl $what printed control bytes: $(od -c "$WB_TMP/$what.tab" | grep -F '033' | head -n 3)"
  fi
  if LC_ALL=C grep -q $'\xc2\x9b\|\x9b' "$WB_TMP/$what.tab"; then
    fail "wbctl $what printed a C1 control"
  fi
  if LC_ALL=C grep -q $'\xe2\x80[\x8b-\x8f\xa8-\xae]\|\xe2\x81[\xa0\xa6-\xa9]' "$WB_TMP/$what.tab"; then
    fail "wbctl $what printed a bidi or zero-width character"
  fi
  grep -qF '\x1b[31mX\x0aFORGED\x07' "$WB_TMP/$what.tab" || fail "wbctl $what: the process name is not shown escaped"
  grep -q '^FORGED' "$WB_TMP/$what.tab" && fail "wbctl $what: a forged line"
done
grep -qF '/m/\x1b]0;owned\x07\x1b[31mred\x0aFORGED LINE\x0d\xc2\x9b\u{202e}exe.\u{200b}pt2' "$WB_TMP/containers_wide.tab" ||
  fail "wbctl containers -o wide: the model path is not shown escaped: $(grep -a owned "$WB_TMP/containers_wide.tab")"
grep -q $'^[0-9a-f]\{8\}  *demo  *1  *[0-9]*  *odd\xef\xbf\xbd\xef\xbf\xbdname  ' "$WB_TMP/leases.tab" ||
  fail "wbctl leases: the process name that is not UTF-8: $(grep -a odd "$WB_TMP/leases.tab")"
[ "$(wc -l <"$WB_TMP/leases.tab")" = 12 ] || fail "wbctl leases: $(wc -l <"$WB_TMP/leases.tab") lines, expected 12"
[ "$(ctl leases --json | json "next(l['process'] for l in d if l['pid'] == $evil) == '\x1b[31mX\nFORGED\x07'")" = True ] ||
  fail "wbctl leases --json does not keep the process name exact"
[ "$(ctl leases --json | json "next(l['process'] for l in d if l['pid'] == $odd) == 'odd\ufffd\ufffdname'")" = True ] ||
  fail "wbctl leases --json: the process name that is not UTF-8 is not U+FFFD"
[ "$(ctl containers --json | json "next(c['model_path'] for c in d if c['pid'] == $evil) == '/m/\x1b]0;owned\x07\x1b[31mred\nFORGED LINE\r\x9b\u202eexe.\u200bpt2'")" = True ] ||
  fail "wbctl containers --json: $(ctl containers --json | json "[c['model_path'] for c in d if c['pid'] == $evil]")"
stop_broker
