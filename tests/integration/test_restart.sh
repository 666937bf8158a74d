#!/usr/bin/env bash
# The broker dies (SIGKILL) while a worker holds a lease: the worker's mapping
# stays valid and it keeps verifying; a new broker started on the same socket
# cleans up what the dead one left, and the worker, finding its lease unknown,
# acquires a new one. A broker stopped with SIGTERM while a lease is held
# exits 0 and the worker ends cleanly without it.
source "$(dirname "$0")/lib.sh"
# Named slabs in /dev/shm: what this test looks at.
HOST_SLAB=shm

# Short request timeouts so a worker notices the dead broker quickly.
export WB_TIMEOUT_MS=1000

make_model "$WB_TMP/demo.safetensors" 4 8 >/dev/null
start_broker_with_demo "$WB_TMP/demo.safetensors"
old=$BROKER_PID

start_worker w --model demo --reacquire --verify-every 100
w=$LAST_PID
first_id=$(lease_field "$w" id)
[ "${#first_id}" = 32 ] || fail "the worker holds no lease"
# The worker maps the slab and the model's shared tensor table.
[ "$(shm_mapped "$w" "$old")" = 2 ] || fail "the worker does not map the slab and the shared table"

kill -KILL "$old"
wait "$old" 2>/dev/null
[ -S "$SOCK" ] || fail "expected the killed broker to leave its socket behind"
# The dead broker's slab is normally still there, but any broker starting
# meanwhile (tests run in parallel) removes it: only its absence after the
# restart is asserted. test_shm covers the cleanup itself.
# The worker keeps running and verifying over its mapping, for many rounds.
sleep 1.5
alive "$w" || fail "the worker died with the broker"
grep -q "verify failed" "$WB_TMP/w.out" && fail "verification failed after the broker died"

start_broker_with_demo "$WB_TMP/demo.safetensors"
[ "$BROKER_PID" != "$old" ] || fail "the broker did not restart"
[ "$(shm_count "$old")" = 0 ] || fail "the new broker did not remove the dead broker's slabs"

wait_for output_has w "reacquired lease " || fail "the worker did not reacquire a lease"
new_id=$(sed -n 's/^reacquired lease \([0-9a-f]*\)$/\1/p' "$WB_TMP/w.out" | tail -n 1)
[ "${#new_id}" = 32 ] || fail "no lease id in the worker's output"
[ "$new_id" != "$first_id" ] || fail "the new lease has the old id"
[ "$(lease_field "$w" id)" = "$new_id" ] || fail "the new broker does not list lease $new_id"
[ "$(lease_count "$w")" = 1 ] || fail "the worker holds more than one lease"
ctl leases | grep -q "^${new_id:0:8} " || fail "the plain table does not show ${new_id:0:8}"
sleep 0.5
grep -q "verify failed" "$WB_TMP/w.out" && fail "verification failed after the restart"
alive "$w" || fail "the worker died after reacquiring"

kill -TERM "$w"
wait_exit "$w"
[ "$EXIT_RC" = 0 ] || fail "the worker exited with $EXIT_RC"
output_has w "released" || fail "the worker did not release"
wait_for no_lease "$w" || fail "the reacquired lease is still listed"

# SIGTERM with a lease held: the broker exits 0, unlinks its slab (the
# worker keeps its mapping) and the worker ends without it.
start_worker w2 --model demo --verify-every 100
w2=$LAST_PID
kill -TERM "$BROKER_PID"
wait_exit "$BROKER_PID"
[ "$EXIT_RC" = 0 ] || fail "the broker exited with $EXIT_RC after SIGTERM with a lease held"
grep -q "event=stop.*leases_held=1" "$BROKER_LOG" || fail "the broker did not log event=stop leases_held=1"
[ "$(shm_count "$BROKER_PID")" = 0 ] || fail "the stopped broker left its slab or table"
# Unlinked, the table stays mapped in the worker, which goes on verifying.
[ "$(shm_mapped "$w2" "$BROKER_PID")" = 2 ] || fail "the worker lost a mapping when the broker stopped"
[ ! -e "$SOCK" ] || fail "the stopped broker left its socket"
sleep 0.5
alive "$w2" || fail "the worker died when the broker stopped"
grep -q "verify failed" "$WB_TMP/w2.out" && fail "verification failed after the broker stopped"
kill -TERM "$w2"
wait_exit "$w2"
[ "$EXIT_RC" = 0 ] || fail "the worker exited with $EXIT_RC without a broker"
output_has w2 "released (broker gone)" || fail "the worker did not say the broker was gone"
