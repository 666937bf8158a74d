#!/usr/bin/env bash
# Publishing through libwbclient while workers follow, end to end on the
# host backend: examples/wb-publish publishes a safetensors file's tensors
# from its own memory (wb_publish_begin/tensor/commit: host bytes in a
# sealed memfd on the descriptor channel) as new versions of model `base`,
# and two wb-aoti-worker --serve --follow processes on a FAKE AOTI library
# (tests/fake_aoti: y = x * w + b on the CPU, not PyTorch) swap each one in.
# Every version's weight is filled with its number and the input is ones,
# so every output says which weights produced it. Then a partial publish
# (the weight only: the bias is kept from the current version), a publish
# that names a tensor the model lacks (refused, nothing changes), and a
# producer's table of the wrong shape.
source "$(dirname "$0")/lib.sh"

AOTI_WORKER=$WB_BIN_DIR/examples/wb-aoti-worker
PUBLISH=$WB_BIN_DIR/examples/wb-publish
FAKE_DIR=$WB_BIN_DIR/tests/fake_aoti
for f in "$AOTI_WORKER" "$PUBLISH" "$FAKE_DIR/fake_aoti_v211.so"; do
  [ -e "$f" ] || fail "missing $f (build every target first)"
done

"$PYTHON" - "$WB_TMP" "$FAKE_DIR" <<'PY' || fail "cannot write the test files"
import os, sys
sys.path.insert(0, os.environ["WB_TEST_PY"])
from fake_files import fake_package, st
tmp, fake = sys.argv[1], sys.argv[2]
for v in (1, 2):
    st("%s/base_v%d.safetensors" % (tmp, v), [("model.weight", [float(v)] * 4),
                                              ("model.bias", [0.0] * 4)])
st(tmp + "/weight_v3.safetensors", [("model.weight", [3.0] * 4)])
st(tmp + "/stranger.safetensors", [("model.wieght", [9.0] * 4)])
st(tmp + "/short.safetensors", [("model.weight", [9.0] * 2)])
st(tmp + "/input.safetensors", [("input0", [1.0] * 4)])
spec = "elements 4\nrun_delay_us 5000\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
fake_package(tmp + "/variant.pt2", fake + "/fake_aoti_v211.so", spec)
PY

start_broker --model "base=$WB_TMP/base_v1.safetensors"
wait_for model_ready base || fail "base did not become ready"
for w in w1 w2; do
  mkdir -p "$WB_TMP/$w"
  spawn "$w" "$AOTI_WORKER" --socket "$SOCK" --model base --aoti "$WB_TMP/variant.pt2" \
    --input "$WB_TMP/input.safetensors" --serve --follow --version-outputs "$WB_TMP/$w"
  eval "$w=$LAST_PID"
  wait_for output_has "$w" "ready" || fail "worker $w did not get ready"
done
on() {
  [ "$(ctl leases --json | json "sorted(set(l['version'] for l in d if l['model'] == 'base'))")" = "[$1]" ]
}

"$PUBLISH" --socket "$SOCK" --model base "$WB_TMP/base_v2.safetensors" >"$WB_TMP/p2.out" 2>&1 ||
  fail "wb-publish: $(cat "$WB_TMP/p2.out")"
grep -q "^published base version 2 " "$WB_TMP/p2.out" || fail "wb-publish said: $(cat "$WB_TMP/p2.out")"
wait_for on 2 || fail "the workers did not swap to version 2: $(ctl leases)"
ctl models -o wide >"$WB_TMP/models.out"
grep -q "published by pid" "$WB_TMP/models.out" || fail "no source shown: $(cat "$WB_TMP/models.out")"

"$PUBLISH" --socket "$SOCK" --model base --partial "$WB_TMP/weight_v3.safetensors" >"$WB_TMP/p3.out" 2>&1 ||
  fail "wb-publish --partial: $(cat "$WB_TMP/p3.out")"
wait_for on 3 || fail "the workers did not swap to version 3: $(ctl leases)"

# Refusals change nothing.
"$PUBLISH" --socket "$SOCK" --model base --partial "$WB_TMP/stranger.safetensors" >"$WB_TMP/p4.out" 2>&1 &&
  fail "a tensor the model lacks was published: $(cat "$WB_TMP/p4.out")"
grep -q "model.wieght" "$WB_TMP/p4.out" && grep -q "model.weight" "$WB_TMP/p4.out" ||
  fail "the refusal does not name the tensor and the nearest one: $(cat "$WB_TMP/p4.out")"
"$PUBLISH" --socket "$SOCK" --model base --partial "$WB_TMP/short.safetensors" >"$WB_TMP/p5.out" 2>&1 &&
  fail "a tensor of the wrong shape was published: $(cat "$WB_TMP/p5.out")"
grep -q "model.weight" "$WB_TMP/p5.out" || fail "the shape refusal does not name the tensor: $(cat "$WB_TMP/p5.out")"
[ "$(ctl models --json | json "[v['version'] for m in d if m['name'] == 'base' for v in m['versions']]")" = "[3]" ] ||
  fail "a refused publish left a version: $(ctl models)"
on 3 || fail "a refused publish moved the workers: $(ctl leases)"

kill -TERM "$w1" "$w2"
for p in $w1 $w2; do
  wait_exit "$p"
  [ "$EXIT_RC" = 0 ] || fail "worker $p exited $EXIT_RC (3: an output changed within a version)"
done
"$PYTHON" - "$WB_TMP" <<'PY' || fail "outputs do not match their versions"
import json, os, sys
sys.path.insert(0, os.environ["WB_TEST_PY"])
from fake_files import output0
tmp = sys.argv[1]
for d in ("w1", "w2"):
    res = [l for l in open(os.path.join(tmp, d + ".out")) if l.startswith("result ")]
    r = json.loads(res[-1][len("result "):])
    assert sorted(v["version"] for v in r["versions"]) == [1, 2, 3], r["versions"]
    assert all(v["changed"] == 0 and v["runs"] > 0 for v in r["versions"]), r["versions"]
    for v in (1, 2, 3):
        y = output0(os.path.join(tmp, d, "output_v%d.safetensors" % v))
        assert y == (float(v),) * 4, (d, v, y)
PY
