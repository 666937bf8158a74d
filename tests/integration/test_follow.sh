#!/usr/bin/env bash
# Workers that follow a model's versions, end to end on the host backend:
# two wb-aoti-worker --follow processes serve a FAKE AOTI model (tests/
# fake_aoti: y = x * w + b on the CPU, not PyTorch) on model "base"; a
# rollout makes version 2 current. One worker is killed in the middle of
# its swap (its runs last 200 ms, so the swap waits for one); the other
# swaps, serves version 2 with outputs that never change within a version,
# and reports its versions and swaps. The broker reclaims the killed
# worker's leases of both versions, and version 1 is freed at its last
# lease. Needs a broker with versions (RolloutRequest, SubscribeRequest):
# skipped against one that predates them.
source "$(dirname "$0")/lib.sh"

AOTI_WORKER=$WB_BIN_DIR/examples/wb-aoti-worker
FAKE_DIR=$WB_BIN_DIR/tests/fake_aoti
for f in "$AOTI_WORKER" "$FAKE_DIR/fake_aoti_v211.so"; do
  [ -e "$f" ] || fail "missing $f (build every target first)"
done
"$WBCTL" --help 2>/dev/null | grep -q "rollout" || skip "this wbctl has no rollout (a broker without versions)"

"$PYTHON" - "$WB_TMP" "$FAKE_DIR" <<'PY' || fail "cannot write the test files"
import os, sys
sys.path.insert(0, os.environ["WB_TEST_PY"])
from fake_files import fake_package, st
tmp, fake = sys.argv[1], sys.argv[2]
st(tmp + "/base1.safetensors", [("model.weight", [1, 1, 1, 1]), ("model.bias", [1, 1, 1, 1])])
st(tmp + "/base2.safetensors", [("model.weight", [2, 2, 2, 2]), ("model.bias", [2, 2, 2, 2])])
st(tmp + "/input.safetensors", [("input0", [1, 1, 1, 1])])
spec = "elements 4\nrun_delay_us 200000\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
fake_package(tmp + "/variant.pt2", fake + "/fake_aoti_v211.so", spec)
PY

start_broker --model "base=$WB_TMP/base1.safetensors"
wait_for model_ready base || fail "model base did not become ready"
mkdir "$WB_TMP/outputs"
for name in keep victim; do
  spawn "$name" "$AOTI_WORKER" --socket "$SOCK" --model base --aoti "$WB_TMP/variant.pt2" \
    --input "$WB_TMP/input.safetensors" --serve --follow --version-outputs "$WB_TMP/outputs"
  eval "$name=$LAST_PID"
  wait_for output_has "$name" "ready" || fail "worker $name did not get ready: $(cat "$WB_TMP/$name.err")"
done

ctl rollout base "$WB_TMP/base2.safetensors" >"$WB_TMP/rollout.out" 2>&1 ||
  fail "wbctl rollout failed: $(cat "$WB_TMP/rollout.out")"
# Killed while it holds both versions: its follower acquired version 2 and
# its update waits for the run in flight (200 ms) on version 1.
holds_both() {
  [ "$(lease_count "$victim")" = 2 ]
}
wait_for holds_both || fail "worker victim never held both versions: $(ctl leases --json)"
kill -KILL "$victim"
wait "$victim" 2>/dev/null
wait_for no_lease "$victim" || fail "the killed worker's leases remain: $(ctl leases --json)"

swapped() {
  grep -q "event=container_swapped" "$WB_TMP/keep.err"
}
wait_for swapped || fail "worker keep did not swap: $(cat "$WB_TMP/keep.err")"
# The follower says where the time went: the acquire, of which the slabs'
# descriptors and their mapping, and the update.
followed=$(grep -E -o 'event=container_followed .*version=2 acquire_ms=[0-9.]+ fetch_ms=[0-9.]+ map_ms=[0-9.]+ update_ms=[0-9.]+' "$WB_TMP/keep.err")
[ -n "$followed" ] || fail "no container_followed line for version 2: $(cat "$WB_TMP/keep.err")"
awk -v l="$followed" 'BEGIN {
  n = split(l, f, /[ =]/)
  for (i = 1; i < n; i++) v[f[i]] = f[i + 1]
  exit !(v["acquire_ms"] > 0 && v["acquire_ms"] + 0.001 >= v["fetch_ms"] + v["map_ms"] && v["update_ms"] > 0)
}' || fail "container_followed: the acquire does not hold its parts: $followed"
sleep 1 # runs on version 2
kill -TERM "$keep"
wait_exit "$keep"
[ "$EXIT_RC" = 0 ] || fail "worker keep exited with $EXIT_RC: $(cat "$WB_TMP/keep.err")"
result=$(grep '^result ' "$WB_TMP/keep.out" | cut -d' ' -f2-)
[ "$(json "[(v['version'], v['runs'] > 0, v['changed']) for v in d['versions']]" <<<"$result")" = \
  "[[1, true, 0], [2, true, 0]]" ] || fail "the versions served: $result"
[ "$(json "[(s['version'], s['swapped_at'] >= s['notice_at'] > 1.6e9, s['swap_ms'] > 0) for s in d['swaps']]" <<<"$result")" = \
  "[[2, true, true]]" ] || fail "the swaps: $result"
[ -s "$WB_TMP/outputs/output_v1.safetensors" ] && [ -s "$WB_TMP/outputs/output_v2.safetensors" ] ||
  fail "no per-version outputs: $(ls "$WB_TMP/outputs")"
wait_for no_lease "$keep" || fail "worker keep's leases should be released"
stop_broker
