#!/usr/bin/env bash
# wbctl inspect against checkpoints written by safetensors and transformers
# (tests/data/official, with the manifest expected.json computed from their raw
# bytes), and its exit codes: 0 help, 2 misuse, 65 malformed, 66 missing.
set -euo pipefail

bin="${WB_BIN_DIR:?WB_BIN_DIR is not set}/tools/wbctl/wbctl"
data="${WB_TEST_DATA:?WB_TEST_DATA is not set}"
official="$data/official"
[ -x "$bin" ] || { echo "FAIL: $bin is missing"; exit 1; }
[ -f "$official/expected.json" ] || { echo "FAIL: $official/expected.json is missing"; exit 1; }
command -v python3 >/dev/null || { echo "FAIL: python3 is needed to compare JSON"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_exit CODE CMD...: runs CMD, keeps its output in $tmp/out and $tmp/err.
expect_exit() {
  local want=$1
  shift
  local got=0
  "$@" >"$tmp/out" 2>"$tmp/err" || got=$?
  if [ "$got" -ne "$want" ]; then
    fail "$* exited $got, expected $want; stderr: $(head -c 600 "$tmp/err")"
    return 1
  fi
}

# compare CHECKPOINT OPEN_PATH: `inspect --json OPEN_PATH` against the manifest.
compare() {
  local ck=$1 open=$2
  expect_exit 0 "$bin" inspect --json "$open" || return 0
  if ! python3 - "$official" "$ck" "$tmp/out" <<'EOF'; then
import json, sys
root, name, out = sys.argv[1:4]
expected = json.load(open(root + "/expected.json"))
ck = next(c for c in expected["checkpoints"] if c["path"] == name)
got = json.load(open(out))
assert list(got) == ["metadata", "tensors"], list(got)
assert got["metadata"] == ck["metadata"], (got["metadata"], ck["metadata"])
assert len(got["tensors"]) == len(ck["tensors"]), (len(got["tensors"]), len(ck["tensors"]))
for g, e in zip(got["tensors"], ck["tensors"]):
    assert list(g) == ["name", "dtype", "shape", "file", "offset", "nbytes"], list(g)
    want = dict(e, file=root + "/" + e["file"])
    assert g == {k: want[k] for k in g}, (g, want)
EOF
    fail "inspect --json $open differs from expected.json ($ck)"
  fi
}

compare all_dtypes.safetensors "$official/all_dtypes.safetensors"
compare gpt2 "$official/gpt2"
compare gpt2 "$official/gpt2/model.safetensors"
compare gpt2_sharded "$official/gpt2_sharded"
compare gpt2_sharded "$official/gpt2_sharded/model.safetensors.index.json"

# The plain table: a summary line, metadata, a header row and one row per tensor.
if expect_exit 0 "$bin" inspect "$official/gpt2_sharded"; then
  head -n 1 "$tmp/out" | grep -q "gpt2_sharded: 8 files, 28 tensors, 126464 bytes" ||
    fail "plain summary line: $(head -n 1 "$tmp/out")"
  grep -q '^metadata total_size = 126464$' "$tmp/out" || fail "plain output lacks total_size"
  grep -Eq '^NAME +DTYPE +SHAPE +FILE +OFFSET +NBYTES$' "$tmp/out" || fail "plain header row"
  grep -Eq '^transformer\.wte\.weight +F32 +\[128, 32\] +model-00001-of-00008\.safetensors +[0-9]+ +16384$' \
    "$tmp/out" || fail "plain row of transformer.wte.weight"
  [ "$(grep -c ' F32 ' "$tmp/out")" -eq 28 ] || fail "plain output should have 28 tensor rows"
fi
if expect_exit 0 "$bin" inspect "$official/all_dtypes.safetensors"; then
  grep -Eq '^scalar +F32 +\[\] +all_dtypes\.safetensors ' "$tmp/out" || fail "scalar shape []"
fi

# Malformed: a header whose tensor needs 24 bytes but spans 20.
python3 - "$tmp/bad.safetensors" <<'EOF'
import json, struct, sys
h = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(20))
EOF
if expect_exit 65 "$bin" inspect "$tmp/bad.safetensors"; then
  grep -q "^wbctl: inspect: $tmp/bad.safetensors: tensor 'w': .*size mismatch" "$tmp/err" ||
    fail "malformed message: $(cat "$tmp/err")"
  [ ! -s "$tmp/out" ] || fail "nothing should be printed on stdout for a malformed file"
fi
printf 'short' >"$tmp/short.safetensors"
expect_exit 65 "$bin" inspect --json "$tmp/short.safetensors" &&
  { grep -q "shorter than the 8-byte header length" "$tmp/err" || fail "short file message"; }

# Missing input.
if expect_exit 66 "$bin" inspect "$tmp/nope.safetensors"; then
  grep -q "^wbctl: inspect: no such file: $tmp/nope.safetensors" "$tmp/err" ||
    fail "missing message: $(cat "$tmp/err")"
fi
mkdir "$tmp/emptydir"
expect_exit 66 "$bin" inspect "$tmp/emptydir" || true

# Misuse and help.
expect_exit 2 "$bin" inspect && { grep -qx "Try 'wbctl inspect --help'." "$tmp/err" || fail "no pointer to the help on stderr"; }
expect_exit 2 "$bin" inspect a b || true
expect_exit 2 "$bin" inspect --frobnicate "$official/gpt2" || true
if expect_exit 0 "$bin" inspect --help; then
  grep -q "usage: wbctl inspect" "$tmp/out" || fail "--help prints usage on stdout"
  [ ! -s "$tmp/err" ] || fail "--help writes nothing on stderr"
fi

# examples/safetensors_writer.py (the streaming writer of the GPU scripts'
# checkpoints) writes the file safetensors wrote again, byte for byte, from
# its tensors given in pieces; a tensor whose pieces fall short fails and
# leaves no file behind.
if ! python3 - "$data/../../examples" "$official/all_dtypes.safetensors" "$tmp" >"$tmp/writer.out" 2>&1 <<'PY'; then
import json, os, struct, sys
sys.path.insert(0, sys.argv[1])
import safetensors_writer as w
raw = open(sys.argv[2], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
meta = h.pop("__metadata__", None)
names = sorted(h, key=lambda k: h[k]["data_offsets"])
ents = [(k, h[k]["dtype"], h[k]["shape"], h[k]["data_offsets"][1] - h[k]["data_offsets"][0])
        for k in names]
def chunks(i):
    a, b = h[names[i]]["data_offsets"]
    mid = (a + b) // 2
    return [raw[8 + n + a:8 + n + mid], memoryview(raw)[8 + n + mid:8 + n + b]]
out = os.path.join(sys.argv[3], "rewritten.safetensors")
size = w.write(out, ents, chunks, meta)
assert size == len(raw), (size, len(raw))
assert open(out, "rb").read() == raw, "not the same bytes"
short = os.path.join(sys.argv[3], "short_write.safetensors")
try:
    w.write(short, ents, lambda i: [b"x"])
    sys.exit("a short tensor was accepted")
except ValueError as e:
    assert "t_uint64" in str(e) and "1 bytes written, 48 declared" in str(e), e
assert not os.path.exists(short) and not os.path.exists(short + ".tmp"), "a file was left"
try:
    w.header([("x", "F32", [3], 8)])
    sys.exit("a wrong size was accepted")
except ValueError as e:
    assert "needs 12" in str(e), e
print("rewritten", len(ents), "tensors,", size, "bytes")
PY
  fail "safetensors_writer: $(cat "$tmp/writer.out")"
fi

if [ "$failures" -ne 0 ]; then
  echo "test_inspect: $failures failure(s)"
  exit 1
fi
echo "test_inspect: ok"
