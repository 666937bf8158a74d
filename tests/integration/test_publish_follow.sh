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
import json, struct, sys, zipfile
tmp, fake = sys.argv[1], sys.argv[2]
def st(path, tensors):
    header, data = {}, b""
    for name, values in tensors:
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": [len(values)],
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)
for v in (1, 2):
    st("%s/base_v%d.safetensors" % (tmp, v), [("model.weight", [float(v)] * 4),
                                              ("model.bias", [0.0] * 4)])
st(tmp + "/weight_v3.safetensors", [("model.weight", [3.0] * 4)])
st(tmp + "/stranger.safetensors", [("model.wieght", [9.0] * 4)])
st(tmp + "/short.safetensors", [("model.weight", [9.0] * 2)])
st(tmp + "/input.safetensors", [("input0", [1.0] * 4)])
spec = "elements 4\nrun_delay_us 5000\nconst w model.weight 6 16\nconst b model.bias 6 16\n"
with zipfile.ZipFile(tmp + "/variant.pt2", "w") as z:
    z.write(fake + "/fake_aoti_v211.so", "variant/data/aotinductor/model/model.so")
    z.writestr("variant/data/aotinductor/model/fake_aoti_spec.txt", spec)
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
import glob, json, os, re, struct, sys
tmp = sys.argv[1]
for d in ("w1", "w2"):
    res = [l for l in open(os.path.join(tmp, d + ".out")) if l.startswith("result ")]
    r = json.loads(res[-1][len("result "):])
    assert sorted(v["version"] for v in r["versions"]) == [1, 2, 3], r["versions"]
    assert all(v["changed"] == 0 and v["runs"] > 0 for v in r["versions"]), r["versions"]
    for v in (1, 2, 3):
        raw = open(os.path.join(tmp, d, "output_v%d.safetensors" % v), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        a, b = json.loads(raw[8:8 + n])["output0"]["data_offsets"]
        y = struct.unpack("<4f", raw[8 + n + a:8 + n + b])
        assert y == (float(v),) * 4, (d, v, y)
PY
