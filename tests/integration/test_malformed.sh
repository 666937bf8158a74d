#!/usr/bin/env bash
# Bytes that are not a valid request get an error reply (WB_EPROTO, or
# WB_EVERSION echoing the id when the version is wrong), and the broker keeps
# serving everyone else.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 11 >/dev/null
start_broker_with_demo "$WB_TMP/demo.safetensors"
start_worker w --model demo
w=$LAST_PID

raw() {
  "$TESTCLIENT" --socket "$SOCK" raw "$1" >"$WB_TMP/raw.out" 2>"$WB_TMP/raw.err"
  RAW_RC=$?
}

raw ffffffffffffffff
[ "$RAW_RC" = 1 ] || fail "garbage: the test client exited with $RAW_RC"
grep -q "^status=-6 id=0$" "$WB_TMP/raw.out" || fail "garbage: $(cat "$WB_TMP/raw.out" "$WB_TMP/raw.err")"

# version 2, id 7, an empty stats body
raw 08021007920100
[ "$RAW_RC" = 1 ] || fail "wrong version: the test client exited with $RAW_RC"
grep -q "^status=-15 id=7$" "$WB_TMP/raw.out" || fail "wrong version: $(cat "$WB_TMP/raw.out" "$WB_TMP/raw.err")"

# version 1, id 8, no body at all
raw 08011008
grep -q "^status=-6 id=8$" "$WB_TMP/raw.out" || fail "no body: $(cat "$WB_TMP/raw.out" "$WB_TMP/raw.err")"

# A well-formed stats request in raw bytes is answered normally.
raw 08011009920100
[ "$RAW_RC" = 0 ] || fail "a valid raw request was refused: $(cat "$WB_TMP/raw.err")"
grep -q "^status=0 id=9$" "$WB_TMP/raw.out" || fail "valid request: $(cat "$WB_TMP/raw.out")"

[ "$(stat_field malformed_messages)" -ge 2 ] || fail "malformed_messages does not count the bad requests"
grep -q "event=bad_message" "$BROKER_LOG" || fail "no event=bad_message in the broker log"
alive "$BROKER_PID" || fail "the broker died"
wait_for lease_state_is "$w" active || fail "the worker's lease suffered"
kill -TERM "$w"
wait_exit "$w"
[ "$EXIT_RC" = 0 ] || fail "the worker exited with $EXIT_RC"
stop_broker
