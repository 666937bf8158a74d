#!/usr/bin/env bash
# Four demo workers on two models share the broker's slabs: each verifies
# every tensor, the broker lists exactly their leases with the right owner,
# model and process name, and a worker told to stop releases its lease.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 1 >/dev/null
make_model "$WB_TMP/other.safetensors" 5 2 >/dev/null
start_broker_with_demo "$WB_TMP/demo.safetensors"
ctl load other "$WB_TMP/other.safetensors" >"$WB_TMP/load.out" ||
  fail "wbctl load other failed"

declare -A model_of name_of
pids=()
for i in 1 2 3 4; do
  model=demo
  [ "$i" = 4 ] && model=other
  start_worker "w$i" --model "$model"
  pids+=("$LAST_PID")
  model_of[$LAST_PID]=$model
  name_of[$LAST_PID]=w$i
done

output_has w1 "verified 3 tensors" || fail "w1 did not verify 3 tensors"
output_has w2 "verified 3 tensors" || fail "w2 did not verify 3 tensors"
output_has w3 "verified 3 tensors" || fail "w3 did not verify 3 tensors"
output_has w4 "verified 5 tensors" || fail "w4 did not verify 5 tensors"

wait_for all_active 4 || fail "expected 4 active leases: $(ctl leases --json)"
leases=$(ctl leases --json) || fail "wbctl leases --json failed"
[ "$(json 'len(d)' <<<"$leases")" = 4 ] || fail "expected 4 leases, got: $leases"
for pid in "${pids[@]}"; do
  got=$(json "[(l['model'], l['process'], len(l['id'])) for l in d if l['pid'] == $pid]" <<<"$leases")
  want="[[\"${model_of[$pid]}\", \"wb-demo-worker\", 32]]"
  [ "$got" = "$want" ] || fail "lease of pid $pid: got $got, want $want"
  # The id the worker printed is the one the broker lists.
  id=$(json "next(l['id'] for l in d if l['pid'] == $pid)" <<<"$leases")
  output_has "${name_of[$pid]}" "lease $id " ||
    fail "pid $pid: lease id $id is not the one the worker printed"
done

# The plain table names the same leases.
ctl leases >"$WB_TMP/table.out" || fail "wbctl leases failed"
head -n 1 "$WB_TMP/table.out" | grep -q "^ID  *MODEL  *VERSION  *PID  *PROCESS  *STATE  *CONTAINERS  *SHARED  *AGE$" ||
  fail "unexpected table header: $(head -n 1 "$WB_TMP/table.out")"
[ "$(grep -c wb-demo-worker "$WB_TMP/table.out")" = 4 ] || fail "the table does not list 4 workers"
ctl leases -o wide >"$WB_TMP/wide.out" || fail "wbctl leases -o wide failed"
head -n 1 "$WB_TMP/wide.out" | grep -q "^ID  *MODEL  *VERSION  *PID  *PROCESS  *UID  *GID  *STATE  *CONTAINERS  *SHARED  *SLABS  *SIZE  *AGE  *HEARTBEAT  *BACKEND  *SLAB  *ACCESS$" ||
  fail "unexpected wide table header: $(head -n 1 "$WB_TMP/wide.out")"
[ "$(grep -c wb-demo-worker "$WB_TMP/wide.out")" = 4 ] || fail "the wide table does not list 4 workers"

# The models list counts the leases.
[ "$(ctl models --json | json "[m['leases'] for m in d if m['name'] == 'demo']")" = "[3]" ] ||
  fail "model demo does not count 3 leases"

w1=${pids[0]}
kill -TERM "$w1"
wait_exit "$w1"
[ "$EXIT_RC" = 0 ] || fail "w1 exited with $EXIT_RC after SIGTERM"
output_has w1 "released" || fail "w1 did not print released"
wait_for no_lease "$w1" || fail "the lease of w1 is still listed"
[ "$(ctl leases --json | json 'len(d)')" = 3 ] || fail "the other three leases should remain"

for pid in "${pids[@]:1}"; do
  kill -TERM "$pid"
  wait_exit "$pid"
  [ "$EXIT_RC" = 0 ] || fail "worker $pid exited with $EXIT_RC"
done
[ "$(ctl leases --json | json 'len(d)')" = 0 ] || fail "leases remain after every worker stopped"
stop_broker
