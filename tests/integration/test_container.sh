#!/usr/bin/env bash
# Containers on shared leases, end to end on the host backend: two
# wb-aoti-worker processes serve two variants (a shared base model plus a
# head each) packaged as .pt2 archives around a FAKE AOTI model library
# (tests/fake_aoti: y = x * w + b on the CPU, not PyTorch). The broker learns
# each container's record through heartbeats and lists it in `wbctl
# containers` and `wbctl leases`; a killed worker's leases and containers
# disappear while the other keeps serving.
source "$(dirname "$0")/lib.sh"

AOTI_WORKER=$WB_BIN_DIR/examples/wb-aoti-worker
FAKE_DIR=$WB_BIN_DIR/tests/fake_aoti
for f in "$AOTI_WORKER" "$FAKE_DIR/fake_aoti_v211.so" "$FAKE_DIR/fake_aoti_v214.so"; do
  [ -e "$f" ] || fail "missing $f (build every target first)"
done

# Weights, input and the two packages (the fake library and its spec in the
# layout of a real .pt2: <name>/data/aotinductor/model/).
"$PYTHON" - "$WB_TMP" "$FAKE_DIR" <<'PY' || fail "cannot write the test files"
import os, sys
sys.path.insert(0, os.environ["WB_TEST_PY"])
from fake_files import fake_package, st
tmp, fake = sys.argv[1], sys.argv[2]
st(tmp + "/base.safetensors", [("model.weight", [1, 2, 3, 4])])
st(tmp + "/head_a.safetensors", [("model.bias", [10, 20, 30, 40])])
st(tmp + "/head_b.safetensors", [("model.bias", [-1, -2, -3, -4])])
st(tmp + "/input.safetensors", [("input0", [1, 1, 2, 2])])
spec = "elements 4\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
folded = spec + "folded _FOLDED_CONST_w2 16\n"
for flavour, s in (("v211", folded), ("v214", spec)):
    fake_package("%s/variant_%s.pt2" % (tmp, flavour), "%s/fake_aoti_%s.so" % (fake, flavour), s)
PY

start_broker --model "base=$WB_TMP/base.safetensors" --model "head_a=$WB_TMP/head_a.safetensors" \
  --model "head_b=$WB_TMP/head_b.safetensors"
for m in base head_a head_b; do
  wait_for model_ready "$m" || fail "model $m did not become ready"
done

# start_aoti NAME ARGS...: a worker that serves until SIGTERM; waits for
# "ready" (its container is built and has run once).
start_aoti() {
  local name=$1
  shift
  spawn "$name" "$AOTI_WORKER" --socket "$SOCK" --input "$WB_TMP/input.safetensors" \
    --output "$WB_TMP/$name.safetensors" --serve "$@"
  local pid=$LAST_PID
  wait_for output_has "$name" "ready" || fail "worker $name did not get ready"
  LAST_PID=$pid
}

start_aoti wa --model base --model head_a --aoti "$WB_TMP/variant_v211.pt2" --verify
wa=$LAST_PID
start_aoti wb --model base --model head_b --aoti "$WB_TMP/variant_v214.pt2"
wb=$LAST_PID
output_has wa "verified base (1 tensors)" || fail "worker wa did not verify its base lease"
output_has wa "api=CreateWithDevice+UpdateUserManagedConstantBufferPairs" ||
  fail "worker wa should have used the 2.11-style entry points"
output_has wb "api=CreateWithExternalConstants" ||
  fail "worker wb should have used CreateWithExternalConstants"

# Each variant's output: y = x * w + b (the folded copy gives the same).
check_output() {
  "$PYTHON" - "$1" "$2" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["WB_TEST_PY"])
from fake_files import output0
y = list(output0(sys.argv[1]))
want = json.loads(sys.argv[2])
sys.exit(0 if y == want else "output %s, want %s" % (y, want))
PY
}
check_output "$WB_TMP/wa.safetensors" "[11, 22, 36, 48]" || fail "variant a computed wrong outputs"
check_output "$WB_TMP/wb.safetensors" "[0, 0, 3, 4]" || fail "variant b computed wrong outputs"

# The records reach the broker with the heartbeats.
two_containers() {
  [ "$(ctl containers --json | json 'len(d)')" = 2 ]
}
wait_for two_containers || fail "wbctl containers should list 2: $(ctl containers --json)"
containers=$(ctl containers --json)
check() {
  [ "$(json "$1" <<<"$containers")" = True ] || fail "$2: $containers"
}
check "sorted(c['pid'] for c in d) == sorted([$wa, $wb])" "one container per worker"
check "next(c for c in d if c['pid'] == $wa)['aoti_api'] == 'CreateWithDevice+UpdateUserManagedConstantBufferPairs'" \
  "the api of worker a"
check "next(c for c in d if c['pid'] == $wb)['aoti_api'] == 'CreateWithExternalConstants'" \
  "the api of worker b"
check "[c['pinned_async_copy'] for c in sorted(d, key=lambda c: c['pid'] != $wa)] == [False, True]" \
  "pinned async copy is on only where the library has it"
check "next(c for c in d if c['pid'] == $wa)['folded_bytes'] == 16 and next(c for c in d if c['pid'] == $wb)['folded_bytes'] == 0" \
  "folded bytes"
check "all(sorted((l['model'], l['bound_bytes'], l['bound_tensors']) for l in c['leases'])[0] == ('base', 16, 1) and len(c['leases']) == 2 for c in d)" \
  "each container binds 16 bytes of base and 16 of its head"
check "all(c['model_path'].endswith('.pt2') and c['created_at'] > 1.6e9 for c in d)" \
  "model path and creation time"

leases=$(ctl leases --json)
[ "$(json "all(len(l['container_records']) == 1 and l['shared_bytes'] == 16 and l['shared_buffers'] == 1 and l['containers'] == 1 for l in d) and len(d) == 4" <<<"$leases")" = True ] ||
  fail "each of the 4 leases should carry one container record of 16 bytes: $leases"
ctl containers -o wide | grep -q "CreateWithExternalConstants" || fail "the wide containers table lacks the api"
ctl leases | head -n 1 | grep -q "SHARED" || fail "the leases table has no SHARED column"

# A killed worker: its leases are reclaimed and its container disappears;
# the other keeps serving.
kill -KILL "$wa"
wait_for no_lease "$wa" || fail "the leases of the killed worker remain"
wait "$wa" 2>/dev/null
one_container() {
  [ "$(ctl containers --json | json "[c['pid'] for c in d]")" = "[$wb]" ]
}
wait_for one_container || fail "only worker b's container should remain: $(ctl containers --json)"
alive "$wb" || fail "worker b died"

kill -TERM "$wb"
wait_exit "$wb"
[ "$EXIT_RC" = 0 ] || fail "worker b exited with $EXIT_RC"
output_has wb "mismatches=0" || fail "worker b's outputs changed while serving"
grep -q '"ok":true' "$WB_TMP/wb.out" || fail "worker b did not report success"
wait_for no_lease "$wb" || fail "worker b's leases should be released"
[ "$(ctl containers --json | json 'len(d)')" = 0 ] || fail "no container should remain"
stop_broker

# Without a broker: --local-weights reads the same files into one allocation
# of the worker's own, --uninit-weights binds the same tensors (from the
# files' headers only) to such an allocation left uninitialised.
# run_worker NAME ARGS...: one worker to its end; its status in EXIT_RC.
run_worker() {
  local name=$1
  shift
  spawn "$name" "$AOTI_WORKER" --input "$WB_TMP/input.safetensors" "$@"
  wait_exit "$LAST_PID"
}
result() {
  grep '^result ' "$WB_TMP/$1.out" | cut -d' ' -f2- | json "$2"
}
run_worker local --local-weights "$WB_TMP/base.safetensors" \
  --local-weights "$WB_TMP/head_a.safetensors" --aoti "$WB_TMP/variant_v214.pt2" \
  --output "$WB_TMP/local.safetensors"
[ "$EXIT_RC" = 0 ] || fail "the --local-weights worker exited with $EXIT_RC: $(cat "$WB_TMP/local.err")"
check_output "$WB_TMP/local.safetensors" "[11, 22, 36, 48]" ||
  fail "the --local-weights worker computed wrong outputs"
# Two tensors of 16 bytes, each at a 256-byte boundary of one allocation.
[ "$(result local "(d['mode'], d['caller_constants'], d['caller_bytes'], d['local_bytes'], d['ms']['alloc_local'])")" = \
  "('local_weights', 2, 32, 512, 0.0)" ] || fail "the --local-weights result: $(cat "$WB_TMP/local.out")"

run_worker uninit --uninit-weights "$WB_TMP/base.safetensors" \
  --uninit-weights "$WB_TMP/head_a.safetensors" --aoti "$WB_TMP/variant_v214.pt2" \
  --iterations 3 --output "$WB_TMP/uninit.safetensors"
[ "$EXIT_RC" = 0 ] || fail "the --uninit-weights worker exited with $EXIT_RC: $(cat "$WB_TMP/uninit.err")"
[ "$(result uninit "(d['ok'], d['mode'], d['caller_constants'], d['caller_bytes'], d['local_bytes'], d['ms']['load_local'], d['ms']['alloc_local'] > 0, d['ms']['median_run'] > 0)")" = \
  "(True, 'uninit_weights', 2, 32, 512, 0.0, True, True)" ] ||
  fail "the --uninit-weights result: $(cat "$WB_TMP/uninit.out")"
"$PYTHON" -c 'import json, struct, sys
raw = open(sys.argv[1], "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
sys.exit(0 if h["output0"]["shape"] == [4] else "output0: %s" % h["output0"])' "$WB_TMP/uninit.safetensors" ||
  fail "the --uninit-weights worker wrote no 4-element output"

run_worker both --local-weights "$WB_TMP/base.safetensors" \
  --uninit-weights "$WB_TMP/head_a.safetensors" --aoti "$WB_TMP/variant_v214.pt2"
[ "$EXIT_RC" = 2 ] || fail "--local-weights with --uninit-weights should exit 2, not $EXIT_RC"
grep -q "exactly one of --model, --local-weights, --uninit-weights, --own-constants" "$WB_TMP/both.err" ||
  fail "--local-weights with --uninit-weights: $(cat "$WB_TMP/both.err")"

printf 'not a checkpoint' >"$WB_TMP/bad.safetensors"
run_worker bad --uninit-weights "$WB_TMP/bad.safetensors" --aoti "$WB_TMP/variant_v214.pt2"
[ "$EXIT_RC" = 1 ] || fail "--uninit-weights of a bad file should exit 1, not $EXIT_RC"
grep -q "^wb-aoti-worker: $WB_TMP/bad.safetensors: " "$WB_TMP/bad.err" ||
  fail "--uninit-weights of a bad file: $(cat "$WB_TMP/bad.err")"
