#!/usr/bin/env bash
# Unloading a model that is leased drains it: it stays listed as draining,
# new leases are refused, and it is freed when its last lease ends. An idle
# model is freed at once.
source "$(dirname "$0")/lib.sh"
# Named slabs in /dev/shm: what this test looks at.
HOST_SLAB=shm

make_model "$WB_TMP/demo.safetensors" 3 5 >/dev/null
make_model "$WB_TMP/idle.safetensors" 2 6 >/dev/null
start_broker_with_demo "$WB_TMP/demo.safetensors"

start_worker holder --model demo
holder=$LAST_PID
# The model's slab and its shared tensor table, both mapped by the holder.
[ "$(shm_count "$BROKER_PID")" = 2 ] || fail "expected the slab and the table in /dev/shm: $(ls /dev/shm/wb-"$BROKER_PID"-*)"
[ "$(shm_mapped "$holder" "$BROKER_PID")" = 2 ] || fail "the holder does not map the slab and the shared table"

out=$(ctl unload demo) || fail "wbctl unload demo failed"
[ "$out" = "draining (1 lease)" ] || fail "unload printed '$out'"
grep -q "event=model_draining" "$BROKER_LOG" || fail "no event=model_draining in the log"
[ "$(model_state demo)" = draining ] || fail "model demo is not draining"
ctl models | grep -q "^demo  *1  *draining " || fail "the plain models table does not show draining"
# Unloading again is harmless.
out=$(ctl unload demo) || fail "a second unload of a draining model failed"
[ "$out" = "draining (1 lease)" ] || fail "second unload printed '$out'"

# A new worker is refused and says why.
spawn late "$WORKER" --socket "$SOCK" --model demo --hold 0
late=$LAST_PID
wait_exit "$late"
[ "$EXIT_RC" != 0 ] || fail "a worker acquired a lease on a draining model"
grep -q "draining" "$WB_TMP/late.err" || fail "the refusal does not mention draining: $(cat "$WB_TMP/late.err")"
[ "$(lease_count "$late")" = 0 ] || fail "the refused worker holds a lease"
# The holder's mapping is untouched by the drain.
output_has holder "verified 3 tensors" || fail "the holder did not verify"
alive "$holder" || fail "the holder died during the drain"

kill -TERM "$holder"
wait_exit "$holder"
[ "$EXIT_RC" = 0 ] || fail "the holder exited with $EXIT_RC"
wait_for model_absent demo || fail "model demo is still listed after its last lease ended"
grep -q "event=model_freed" "$BROKER_LOG" || fail "no event=model_freed in the log"
[ "$(shm_count "$BROKER_PID")" = 0 ] || fail "the drained model's slab or table is still in /dev/shm"

# An idle model is freed at once.
ctl load idle "$WB_TMP/idle.safetensors" >/dev/null || fail "wbctl load idle failed"
[ "$(model_state idle)" = ready ] || fail "model idle is not ready"
out=$(ctl unload idle) || fail "wbctl unload idle failed"
[ "$out" = freed ] || fail "unload of an idle model printed '$out'"
[ "$(model_state idle)" = absent ] || fail "model idle is still listed"
[ "$(ctl models --json)" = "[]" ] || fail "models remain: $(ctl models --json)"
stop_broker
