#!/usr/bin/env bash
# A stopped worker (SIGSTOP) misses its heartbeats: its lease turns stale
# but is never freed, since the process may still use the memory. When the
# worker runs again its heartbeats make the lease active again.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 4 >/dev/null
start_broker_with_demo "$WB_TMP/demo.safetensors"

start_worker w --model demo
w=$LAST_PID
start_worker bystander --model demo
bystander=$LAST_PID
wait_for lease_state_is "$w" active || fail "the lease is not active"
id=$(lease_field "$w" id)

kill -STOP "$w"
# The stale window is 600 ms.
wait_for lease_state_is "$w" stale || fail "the lease of the stopped worker did not turn stale"
grep -q "event=lease_stale" "$BROKER_LOG" || fail "no event=lease_stale in the broker log"
# Several windows later it is still there, still stale, with the same id.
for _ in 1 2 3 4 5 6; do
  sleep 0.5
  [ "$(lease_field "$w" state)" = stale ] || fail "the stale lease changed state or vanished"
  [ "$(lease_field "$w" id)" = "$id" ] || fail "the stale lease changed id"
done
[ "$(stat_field leases_reclaimed)" = 0 ] || fail "a stale lease was reclaimed"
wait_for stat_is leases_stale 1 || fail "stats leases_stale is not 1"
ctl leases | grep -q " stale " || fail "the plain table does not show the stale lease"
# The worker that kept beating is unaffected.
wait_for lease_state_is "$bystander" active || fail "the bystander's lease is not active"

kill -CONT "$w"
wait_for lease_state_is "$w" active || fail "the lease did not become active after SIGCONT"
[ "$(lease_field "$w" id)" = "$id" ] || fail "the lease changed id after SIGCONT"
grep -q "event=lease_active" "$BROKER_LOG" || fail "no event=lease_active in the broker log"

kill -TERM "$w"
wait_exit "$w"
[ "$EXIT_RC" = 0 ] || fail "the worker exited with $EXIT_RC after SIGTERM"
output_has w "released" || fail "the worker did not release its lease"
wait_for no_lease "$w" || fail "the lease is still listed after release"
[ "$(stat_field leases_released)" = 1 ] || fail "stats leases_released is not 1"

kill -TERM "$bystander"
wait_exit "$bystander"
[ "$EXIT_RC" = 0 ] || fail "the bystander exited with $EXIT_RC"
stop_broker
