#!/usr/bin/env bash
# A process may release only its own leases: another process that knows a
# lease id (here from `wbctl leases`) is refused with a message naming the
# owner, and the lease stays exactly as it was.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 7 >/dev/null
start_broker_with_demo "$WB_TMP/demo.safetensors"

start_worker owner --model demo
owner=$LAST_PID
id=$(lease_field "$owner" id)
[ "${#id}" = 32 ] || fail "no lease id for the owner: '$id'"

"$TESTCLIENT" --socket "$SOCK" release "$id" >"$WB_TMP/thief.out" 2>"$WB_TMP/thief.err"
rc=$?
[ "$rc" = 1 ] || fail "a foreign release exited with $rc, expected 1 (refused)"
grep -q "belongs to pid $owner" "$WB_TMP/thief.err" ||
  fail "the refusal does not name the owner pid $owner: $(cat "$WB_TMP/thief.err")"
grep -q "lease ${id:0:8}" "$WB_TMP/thief.err" ||
  fail "the refusal does not name the lease: $(cat "$WB_TMP/thief.err")"

[ "$(lease_count "$owner")" = 1 ] || fail "the owner's lease is gone"
[ "$(lease_field "$owner" id)" = "$id" ] || fail "the owner's lease changed"
wait_for lease_state_is "$owner" active || fail "the owner's lease is not active"
[ "$(stat_field leases_released)" = 0 ] || fail "the foreign release was counted"

# A holder of its own lease (the test client) is refused the owner's too,
# and an unknown id is reported as such.
spawn second "$TESTCLIENT" --socket "$SOCK" acquire demo
second=$LAST_PID
wait_for grep -qE '^[0-9a-f]{32}$' "$WB_TMP/second.out" || fail "the test client did not get a lease"
"$TESTCLIENT" --socket "$SOCK" release "$id" 2>"$WB_TMP/thief2.err"
[ $? = 1 ] || fail "a second foreign release was not refused"
grep -q "belongs to pid $owner" "$WB_TMP/thief2.err" || fail "second refusal: $(cat "$WB_TMP/thief2.err")"
"$TESTCLIENT" --socket "$SOCK" release 00000000000000000000000000000000 2>"$WB_TMP/unknown.err"
[ $? = 1 ] || fail "releasing an unknown lease was not refused"

# The owner releases its own lease normally.
kill -TERM "$owner"
wait_exit "$owner"
[ "$EXIT_RC" = 0 ] || fail "the owner exited with $EXIT_RC"
output_has owner "released" || fail "the owner did not release"
wait_for no_lease "$owner" || fail "the owner's lease is still listed"
kill -TERM "$second"
wait_exit "$second"
[ "$EXIT_RC" = 0 ] || fail "the test client exited with $EXIT_RC"
output_has second "released" || fail "the test client did not release"
[ "$(stat_field leases_released)" = 2 ] || fail "stats leases_released is not 2"
stop_broker
