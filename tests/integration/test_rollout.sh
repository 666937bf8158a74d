#!/usr/bin/env bash
# Live rollout end to end on the host backend, with real processes: three
# wb-aoti-worker processes follow model `base` (--serve --follow) through
# packages around a FAKE AOTI model library (tests/fake_aoti: y = x * w + b
# on the CPU, not PyTorch, whose runs hold a shared lock against the swap,
# as upstream's container does, and here take 20 ms each). Every version's
# weight is filled with its version number and the input is ones, so an
# output says which weights produced it: a run on a mix of versions, or on
# memory released too early, shows.
#
#   rollout to version 2    every worker swaps; version 1 drains and its
#                           slab is freed; every output of version v is v
#   rollout to version 3    with a holder on version 2; then rollback: the
#                           workers swap back to 2, 3 drains and is freed
#   rollout to version 4    the first file again: a version of its own
#   the broker killed       during a rollout's load: the workers keep serving
#                           the version they hold, outputs unchanged
source "$(dirname "$0")/lib.sh"

AOTI_WORKER=$WB_BIN_DIR/examples/wb-aoti-worker
FAKE_DIR=$WB_BIN_DIR/tests/fake_aoti
for f in "$AOTI_WORKER" "$FAKE_DIR/fake_aoti_v211.so"; do
  [ -e "$f" ] || fail "missing $f (build every target first)"
done
HOST_SLAB=shm
# Every read of tensor data sleeps 30 ms (libwbtest_slowread.so).
use_slow_broker 30000

"$PYTHON" - "$WB_TMP" "$FAKE_DIR" <<'PY' || fail "cannot write the test files"
import os, sys
sys.path.insert(0, os.environ["WB_TEST_PY"])
from fake_files import fake_package, st
tmp, fake = sys.argv[1], sys.argv[2]
for v in (1, 2, 3):
    st("%s/base_v%d.safetensors" % (tmp, v), [("model.weight", [float(v)] * 4)])
st(tmp + "/head.safetensors", [("model.bias", [0.0] * 4)])
st(tmp + "/input.safetensors", [("input0", [1.0] * 4)])
spec = "elements 4\nrun_delay_us 20000\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
fake_package(tmp + "/variant.pt2", fake + "/fake_aoti_v211.so", spec)
PY

start_broker --model "base=$WB_TMP/base_v1.safetensors" --model "head=$WB_TMP/head.safetensors"
wait_for model_ready base || fail "base did not become ready"
wait_for model_ready head || fail "head did not become ready"

# follower NAME: a worker following base; waits until it serves.
follower() {
  mkdir -p "$WB_TMP/$1"
  spawn "$1" "$AOTI_WORKER" --socket "$SOCK" --model base --model head --aoti "$WB_TMP/variant.pt2" \
    --input "$WB_TMP/input.safetensors" --serve --follow --version-outputs "$WB_TMP/$1"
  local pid=$LAST_PID
  wait_for output_has "$1" "ready" || fail "worker $1 did not get ready"
  LAST_PID=$pid
}
follower w1
w1=$LAST_PID
follower w2
w2=$LAST_PID
follower w3
w3=$LAST_PID

# versions_of PID: the versions of base the process leases, sorted.
versions_of() {
  ctl leases --json | json "sorted(l['version'] for l in d if l['pid'] == $1 and l['model'] == 'base')"
}
on() { [ "$(versions_of "$1")" = "[$2]" ]; }
all_on() {
  local p
  for p in $w1 $w2 $w3; do on "$p" "$1" || return 1; done
}
# base_versions: the versions of base the broker lists.
base_versions() {
  ctl models --json | json "[v['version'] for m in d if m['name'] == 'base' for v in m['versions']]"
}
versions_are() { [ "$(base_versions)" = "$1" ]; }

all_on 1 || fail "the workers do not lease version 1: $(ctl leases)"
slab1=$(shm_count "$BROKER_PID")

# ---- rollout to version 2 ---------------------------------------------------
ctl rollout base "$WB_TMP/base_v2.safetensors" --json >"$WB_TMP/r2.json" 2>"$WB_TMP/r2.err" ||
  fail "rollout failed: $(cat "$WB_TMP/r2.err")"
[ "$(json "[d['version'], d['previous_version']]" <"$WB_TMP/r2.json")" = "[2, 1]" ] ||
  fail "rollout reply: $(cat "$WB_TMP/r2.json")"
wait_for all_on 2 || fail "not every worker swapped to version 2: $(ctl leases)"
wait_for versions_are "[2]" || fail "version 1 did not drain: $(ctl models)"
[ "$(shm_count "$BROKER_PID")" = "$slab1" ] || fail "version 1's slab was not freed: $(ls /dev/shm)"
grep -q "event=model_version_freed.*version=1" "$BROKER_LOG" || fail "no model_version_freed for version 1"

# ---- rollout to 3 with a holder on 2, then rollback ------------------------------
spawn holder "$WORKER" --socket "$SOCK" --model base
holder=$LAST_PID
wait_for on "$holder" 2 || fail "the holder has no lease on version 2"
ctl rollout base "$WB_TMP/base_v3.safetensors" >"$WB_TMP/r3.out" 2>&1 || fail "rollout to 3: $(cat "$WB_TMP/r3.out")"
wait_for all_on 3 || fail "not every worker swapped to version 3: $(ctl leases)"
[ "$(base_versions)" = "[2, 3]" ] || fail "versions 2 (held) and 3 should be listed: $(ctl models)"
ctl models >"$WB_TMP/models.out"
grep -q "draining" "$WB_TMP/models.out" && grep -q "current" "$WB_TMP/models.out" ||
  fail "wbctl models shows no current and draining versions: $(cat "$WB_TMP/models.out")"
ctl rollback base >"$WB_TMP/rb.out" 2>&1 || fail "rollback: $(cat "$WB_TMP/rb.out")"
wait_for all_on 2 || fail "not every worker swapped back to version 2: $(ctl leases)"
wait_for versions_are "[2]" || fail "version 3 did not drain after the rollback: $(ctl models)"
kill -TERM "$holder"
wait_exit "$holder"

# ---- version 4: the file of version 1 again, a version of its own ----------------
ctl rollout base "$WB_TMP/base_v1.safetensors" >"$WB_TMP/r4.out" 2>&1 || fail "rollout to 4: $(cat "$WB_TMP/r4.out")"
wait_for all_on 4 || fail "not every worker swapped to version 4: $(ctl leases)"
wait_for versions_are "[4]" || fail "version 2 did not drain: $(ctl models)"

# ---- the broker killed during a rollout ----------------------------------------------
# The broker reads through libwbtest_slowread.so (each read of tensor data
# sleeps 30 ms): the 32 MiB checkpoint takes seconds to load.
"$PYTHON" - "$WB_TMP/big.safetensors" <<'PY'
import json, struct, sys
n = 32 << 20
raw = json.dumps({"model.weight": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    f.truncate(8 + len(raw) + n)
PY
ctl rollout base "$WB_TMP/big.safetensors" --no-wait >"$WB_TMP/r5.out" 2>&1 || fail "rollout --no-wait: $(cat "$WB_TMP/r5.out")"
[ "$(ctl models --json | json "[v['state'] for m in d if m['name'] == 'base' for v in m['versions']]")" = '["current", "loading"]' ] ||
  fail "version 5 should be loading beside 4: $(ctl models)"
kill -KILL "$BROKER_PID"
wait "$BROKER_PID" 2>/dev/null
sleep 1
alive "$w1" && alive "$w2" && alive "$w3" || fail "a worker died with the broker"
kill -TERM "$w1" "$w2" "$w3"
for p in $w1 $w2 $w3; do
  wait_exit "$p"
  [ "$EXIT_RC" = 0 ] || fail "worker $p exited $EXIT_RC (3: an output changed within a version)"
done

# Every output of version v is v (y = x * v + 0 with x = 1).
"$PYTHON" - "$WB_TMP" <<'PY' || fail "outputs do not match their versions"
import glob, json, os, re, sys
sys.path.insert(0, os.environ["WB_TEST_PY"])
from fake_files import output0
tmp = sys.argv[1]
seen = 0
for d in ("w1", "w2", "w3"):
    res = [l for l in open(os.path.join(tmp, d + ".out")) if l.startswith("result ")]
    r = json.loads(res[-1][len("result "):])
    vs = {v["version"]: v for v in r["versions"]}
    assert sorted(vs) == [1, 2, 3, 4], (d, sorted(vs))
    for v, e in vs.items():
        assert e["changed"] == 0 and e["runs"] > 0, (d, e)
    for f in glob.glob(os.path.join(tmp, d, "output_v*.safetensors")):
        v = int(re.search(r"_v(\d+)\.", f).group(1))
        y = output0(f)
        want = 1.0 if v == 4 else float(v)
        assert y == (want,) * 4, (f, y)
        seen += 1
assert seen == 12, seen
PY
