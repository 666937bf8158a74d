#!/usr/bin/env bash
# A worker killed with SIGKILL never releases its lease: the broker learns of
# the death through the process's pidfd and reclaims the lease at once,
# without waiting for heartbeats to go stale, and touches no other lease.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 4 3 >/dev/null
start_broker_with_demo "$WB_TMP/demo.safetensors"

start_worker victim --model demo
victim=$LAST_PID
start_worker other1 --model demo
other1=$LAST_PID
start_worker other2 --model demo
other2=$LAST_PID
[ "$(ctl leases --json | json 'len(d)')" = 3 ] || fail "expected 3 leases"
[ "$(stat_field leases_reclaimed)" = 0 ] || fail "leases_reclaimed is not 0 at the start"

now_ms() { echo $(($(date +%s%N) / 1000000)); }

kill -KILL "$victim"
start=$(now_ms)
# Missed heartbeats alone would only make the lease stale, never free it:
# its disappearance within 2 s proves the broker watched the pidfd.
while [ "$(lease_count "$victim")" != 0 ]; do
  elapsed=$(($(now_ms) - start))
  [ "$elapsed" -lt 2000 ] || fail "the lease of the killed worker is still listed after ${elapsed} ms"
  sleep 0.05
done
log "lease reclaimed $(($(now_ms) - start)) ms after SIGKILL"
wait "$victim" 2>/dev/null

[ "$(stat_field leases_reclaimed)" = 1 ] || fail "leases_reclaimed is not 1"
grep -q "event=lease_reclaim" "$BROKER_LOG" || fail "no event=lease_reclaim in the broker log"
leases=$(ctl leases --json)
[ "$(json "sorted(l['pid'] for l in d) == sorted([$other1, $other2])" <<<"$leases")" = True ] ||
  fail "the other workers' leases should remain: $leases"
wait_for all_active 2 || fail "the remaining leases should be active: $(ctl leases --json)"

for pid in "$other1" "$other2"; do
  kill -TERM "$pid"
  wait_exit "$pid"
  [ "$EXIT_RC" = 0 ] || fail "worker $pid exited with $EXIT_RC"
done
[ "$(stat_field leases_reclaimed)" = 1 ] || fail "a clean release was counted as reclaimed"
stop_broker
