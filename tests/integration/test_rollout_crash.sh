#!/usr/bin/env bash
# The broker is killed with SIGKILL while a rollout loads version 2 beside
# version 1, which a worker holds and re-verifies every 50 ms: the worker
# keeps reading intact bytes while no broker runs, and a restarted broker
# serves what its configuration names (version 1 again: versions survive
# nothing across a restart).
source "$(dirname "$0")/lib.sh"
HOST_SLAB=shm
export WB_TIMEOUT_MS=1000

make_model "$WB_TMP/v1.safetensors" 6 7 >/dev/null
# Version 2: 4 GiB of zeros (a sparse file), slow enough to load with one
# reader that the broker dies while it loads.
"$PYTHON" - "$WB_TMP/v2.safetensors" <<'PY'
import json, struct, sys
n = 4 << 30
h = json.dumps({"big": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + n)
PY
start_broker --read-threads 1 --model "demo=$WB_TMP/v1.safetensors"
wait_for model_ready demo || fail "model demo did not become ready"
old=$BROKER_PID

start_worker w --model demo --verify-every 50 --reacquire
w=$LAST_PID
[ "$(lease_field "$w" version)" = 1 ] || fail "the worker's lease is not on version 1"

loading() {
  [ "$(ctl models --json | json "[v['state'] for m in d for v in m['versions']]")" = '["current", "loading"]' ]
}
ctl rollout --no-wait demo "$WB_TMP/v2.safetensors" >"$WB_TMP/rollout.out" 2>&1 ||
  fail "rollout: $(cat "$WB_TMP/rollout.out")"
wait_for loading || fail "version 2 is not loading: $(ctl models)"
kill -KILL "$old"
wait "$old" 2>/dev/null
grep -q "event=model_version_current model=demo version=2" "$WB_TMP/broker1.log" &&
  fail "the rollout ended before the broker was killed"

wait_for output_has w "broker connection lost" || fail "the worker did not notice the broker's death"
passed_at_kill=$(grep -c "" "$WB_TMP/w.out")
sleep 1
alive "$w" || fail "the worker died with the broker"
grep -q "verify failed" "$WB_TMP/w.out" && fail "a verification failed while no broker ran"

# A new broker loads what its command line names: version 1 of demo.
start_broker --model "demo=$WB_TMP/v1.safetensors"
wait_for model_ready demo || fail "the restarted broker did not load demo"
[ "$(ctl models --json | json "[(v['version'], v['state']) for m in d for v in m['versions']]")" = '[[1, "current"]]' ] ||
  fail "versions after the restart: $(ctl models --json)"
wait_for output_has w "reacquired lease " || fail "the worker did not reacquire"
wait_for lease_state_is "$w" active || fail "the new broker does not list the worker's lease"
[ "$(lease_field "$w" version)" = 1 ] || fail "the new lease is not on version 1"
sleep 0.3
grep -q "verify failed" "$WB_TMP/w.out" && fail "a verification failed after the restart"
kill -TERM "$w"
wait_exit "$w"
[ "$EXIT_RC" = 0 ] || fail "the worker exited $EXIT_RC: $(tail -n 3 "$WB_TMP/w.out")"
[ "$passed_at_kill" -gt 0 ] || fail "the worker printed nothing"
stop_broker
