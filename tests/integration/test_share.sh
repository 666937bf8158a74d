#!/usr/bin/env bash
# Tensors shared across models (broker/share.h), on both host slab kinds
# (sealed memfds and named shm objects):
# * a checkpoint B equal to a resident A in 4 of its 6 tensors borrows those
#   4 from A's slab (its lease lists that slab as a second one) and loads
#   the other 2; wbctl models and stats count the bytes (shared, unique,
#   logical);
# * clients read B's bytes equal to its file, and its checksums verify;
# * an unload of A keeps the shared bytes resident for B (orphaned): B still
#   serves the same bytes, and its unload frees them;
# * a crafted digest collision (WB_TEST_SHARE_IGNORE_DIGEST=1): tensors of
#   the same dtype and shape but other bytes are compared byte for byte,
#   loaded rather than shared, counted and logged as share_mismatch;
# * a published version lends its tensors (once its checksums are known);
# * wbctl load --no-share (neither borrows nor lends) and wbrokerd
#   --no-share-tensors (nothing shared).
source "$(dirname "$0")/lib.sh"

# The checkpoints: 6 tensors of distinct dtypes and shapes, a few hundred KiB
# each. B is A but for layers.0.attn.q and layers.0.norm, and lays its data
# out in another order (other file offsets). C and D are equal in
# embed.weight only: two other tensors are wholly different, three differ
# from C's in one byte (the first, one in the middle, the last). Prints
# A.bytes, B.bytes, the bytes of the 4 tensors B shares, C.bytes, D.bytes and
# the bytes of embed.weight.
read -r A_BYTES B_BYTES AB_SHARED C_BYTES D_BYTES CD_SHARED < <("$PYTHON" - "$WB_TMP" <<'PY'
import hashlib, json, struct, sys
out = sys.argv[1]
ARCH = [("embed.weight", "F32", [256, 256], 4), ("layers.0.attn.q", "F16", [384, 256], 2),
        ("layers.0.attn.k", "BF16", [256, 512], 2), ("layers.0.mlp.up", "U8", [300, 1000], 1),
        ("layers.0.norm", "I64", [128, 256], 8), ("lm_head.weight", "F32", [200, 500], 4)]
SIZE = {name: size * shape[0] * shape[1] for name, _, shape, size in ARCH}

def blob(name, seed):
    return hashlib.shake_256(b"%d %s" % (seed, name.encode())).digest(SIZE[name])

def flip(raw, at):
    b = bytearray(raw)
    b[at] ^= 0x5A
    return bytes(b)

def write(path, blobs, order, meta):
    header, data = {"__metadata__": {"format": "pt", "variant": meta}}, b""
    for name, dtype, shape, _ in (ARCH[i] for i in order):
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blobs[name])]}
        data += blobs[name]
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open("%s/%s.safetensors" % (out, path), "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)

a = {name: blob(name, 1) for name in SIZE}
b = dict(a, **{"layers.0.attn.q": blob("layers.0.attn.q", 2),
               "layers.0.norm": blob("layers.0.norm", 2)})
c = {name: blob(name, 3) for name in SIZE}
d = {"embed.weight": c["embed.weight"],
     "layers.0.attn.q": blob("layers.0.attn.q", 4),
     "layers.0.attn.k": flip(c["layers.0.attn.k"], 0),
     "layers.0.mlp.up": flip(c["layers.0.mlp.up"], SIZE["layers.0.mlp.up"] // 2),
     "layers.0.norm": flip(c["layers.0.norm"], SIZE["layers.0.norm"] - 1),
     "lm_head.weight": blob("lm_head.weight", 4)}
write("A", a, range(6), "a")
write("B", b, [5, 3, 1, 4, 0, 2], "b")
write("C", c, range(6), "c")
write("D", d, range(6), "d")
total = sum(SIZE.values())
print(total, total, sum(SIZE[n] for n in SIZE if a[n] == b[n]), total, total,
      SIZE["embed.weight"])
PY
)
[ -n "$CD_SHARED" ] || fail "the checkpoints were not written"
[ "$AB_SHARED" = $((262144 + 262144 + 300000 + 400000)) ] ||
  fail "A and B have $AB_SHARED bytes in common, not their 4 equal tensors'"

# load NAME FILE [--no-share]: wbctl load (it waits until the model is ready).
load() {
  ctl load ${3:+"$3"} "$1" "$WB_TMP/$2.safetensors" >"$WB_TMP/load.out" 2>&1 ||
    fail "wbctl load ${3:+$3 }$1 $2 failed: $(cat "$WB_TMP/load.out")"
  [ "$(model_state "$1")" = ready ] || fail "model $1 is $(model_state "$1") after its load"
}

unload() {
  ctl unload "$1" >"$WB_TMP/unload.out" 2>&1 ||
    fail "wbctl unload $1 failed: $(cat "$WB_TMP/unload.out")"
  wait_for model_absent "$1" || fail "model $1 is still listed after its unload: $(ctl models --json)"
}

# expect_shared NAME TENSORS BYTES SHARE: the model's sharing as wbctl models
# --json says (bytes less shared bytes is its unique_bytes).
expect_shared() {
  local got want
  got=$(ctl models --json | json "[[m['shared_tensors'], m['shared_bytes'], m['bytes'] - m['unique_bytes'],
    m['share']] for m in d if m['name'] == '$1']")
  want="[[$2, $3, $3, $4]]"
  [ "$got" = "$want" ] ||
    fail "model $1: [shared_tensors, shared_bytes, bytes - unique_bytes, share] is $got, expected $want"
}

# expect_stats LOGICAL UNIQUE: the broker's logical_bytes and unique_bytes.
expect_stats() {
  local got
  got=$(ctl stats --json | json "[d['logical_bytes'], d['unique_bytes']]")
  [ "$got" = "[$1, $2]" ] || fail "stats [logical_bytes, unique_bytes] is $got, expected [$1, $2] ($3)"
}

# reads_back MODEL FILE SLABS: a client leases MODEL (its lease lists SLABS
# slabs) and reads every tensor through its mapping equal to FILE's bytes;
# then a demo worker verifies every tensor against the broker's checksums.
reads_back() {
  local model=$1 file=$WB_TMP/$2.safetensors dump=$WB_TMP/dump.txt pid slabs
  # Not NAME.out: fail() would print these long lines.
  rm -f "$dump"
  "$TESTCLIENT" --socket "$SOCK" acquire-dump "$model" >"$dump" 2>"$WB_TMP/dump.err" &
  pid=$!
  STARTED_PIDS+=("$pid")
  wait_for grep -qx end "$dump" ||
    fail "the client did not read model $model: $(head -c 300 "$dump") $(cat "$WB_TMP/dump.err")"
  slabs=$(lease_field "$pid" slabs)
  kill -TERM "$pid"
  wait_exit "$pid"
  [ "$EXIT_RC" = 0 ] || fail "the client of model $model exited $EXIT_RC: $(cat "$WB_TMP/dump.err")"
  [ "$slabs" = "$3" ] || fail "the lease on model $model lists $slabs slabs, expected $3"
  "$PYTHON" - "$file" "$dump" <<'PY' || fail "a client of model $model reads other bytes than $file"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
want = {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]].hex()
        for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
lines = open(sys.argv[2]).read().split("\n")[1:]
got = dict(l.split(" ", 1) for l in lines if l and l != "end")
for k in sorted(set(want) | set(got)):
    if got.get(k) != want.get(k):
        print("tensor %s: read %s..., the file has %s..." % (k, (got.get(k) or "nothing")[:32],
                                                         (want.get(k) or "nothing")[:32]),
              file=sys.stderr)
sys.exit(got != want)
PY
  "$WORKER" --socket "$SOCK" --model "$model" --hold 0 >"$WB_TMP/verify.txt" 2>&1 ||
    fail "a worker did not verify model $model: $(cat "$WB_TMP/verify.txt")"
  grep -qx "verified 6 tensors" "$WB_TMP/verify.txt" ||
    fail "the worker of model $model: $(cat "$WB_TMP/verify.txt")"
}

# memfd_slabs: how many memfd slabs the broker holds open.
memfd_slabs() {
  find "/proc/$BROKER_PID/fd" -lname "/memfd:wb-slab*" 2>/dev/null | wc -l
}

# --- A and B on each host slab kind.
for HOST_SLAB in memfd shm; do
  log "host slabs: $HOST_SLAB"
  start_broker
  load a A
  expect_shared a 0 0 true
  expect_stats "$A_BYTES" "$A_BYTES" "$HOST_SLAB, A alone"
  load b B
  expect_shared b 4 "$AB_SHARED" true
  expect_shared a 0 0 true
  expect_stats $((A_BYTES + B_BYTES)) $((A_BYTES + B_BYTES - AB_SHARED)) "$HOST_SLAB, A and B"
  got=$(ctl stats --json | json "[d['shared_tensors_total'], d['shared_bytes_total'], d['share_mismatches']]")
  [ "$got" = "[4, $AB_SHARED, 0]" ] ||
    fail "$HOST_SLAB: stats [shared_tensors_total, shared_bytes_total, share_mismatches] is $got"
  ctl models >"$WB_TMP/models.txt"
  grep -Eq "^NAME .* SHARED " "$WB_TMP/models.txt" || fail "no SHARED column: $(cat "$WB_TMP/models.txt")"
  grep -Eq "^a +1 +current +host .* - +0 " "$WB_TMP/models.txt" ||
    fail "a's row does not show - shared: $(cat "$WB_TMP/models.txt")"
  grep -Eq "^b +1 +current +host .* 1\.2 MiB +0 " "$WB_TMP/models.txt" ||
    fail "b's row does not show its shared bytes: $(cat "$WB_TMP/models.txt")"
  reads_back b B 2
  reads_back a A 1
  [ "$HOST_SLAB" = shm ] || [ "$(memfd_slabs)" = 2 ] ||
    fail "the broker holds $(memfd_slabs) memfd slabs for a and b"

  # A goes, B stays and keeps the bytes it borrowed: a worker that holds a
  # lease on B meanwhile keeps verifying it, and new leases read the same.
  start_worker holder --model b --verify-every 20
  holder=$LAST_PID
  unload a
  model_ready b || fail "$HOST_SLAB: b is $(model_state b) after the unload of a"
  expect_shared b 4 "$AB_SHARED" true
  reads_back b B 2
  [ "$HOST_SLAB" = shm ] || [ "$(memfd_slabs)" = 2 ] ||
    fail "the broker holds $(memfd_slabs) memfd slabs for b (its own and a's)"
  kill -TERM "$holder"
  wait_exit "$holder"
  [ "$EXIT_RC" = 0 ] ||
    fail "the worker holding b across the unload of a exited $EXIT_RC: $(cat "$WB_TMP/holder.out")"
  wait_for no_lease "$holder" || fail "the holder's lease stayed"
  # A's slab stays whole for B (orphaned): its 2 tensors B does not share
  # stay resident with the 4 it does, and unique_bytes counts what the slabs
  # hold (wb.proto, StatsReply).
  expect_stats "$B_BYTES" $((B_BYTES - AB_SHARED + A_BYTES)) "$HOST_SLAB, B alone, A's slab orphaned"
  unload b
  expect_stats 0 0 "$HOST_SLAB, nothing loaded"
  [ "$(memfd_slabs)" = 0 ] || fail "$HOST_SLAB: the broker holds $(memfd_slabs) memfd slabs with no model"
  [ "$(shm_count "$BROKER_PID")" = 0 ] ||
    fail "$HOST_SLAB: objects left in /dev/shm with no model: $(ls /dev/shm/wb-"$BROKER_PID"-*)"
  stop_broker
done
HOST_SLAB=

# --- A crafted collision: every tensor of D has a candidate in C; only
# embed.weight is equal.
export WB_TEST_SHARE_IGNORE_DIGEST=1
start_broker
unset WB_TEST_SHARE_IGNORE_DIGEST
load c C
load d D
expect_shared d 1 "$CD_SHARED" true
expect_stats $((C_BYTES + D_BYTES)) $((C_BYTES + D_BYTES - CD_SHARED)) "collision, C and D"
got=$(ctl stats --json | json "[d['shared_tensors_total'], d['shared_bytes_total'], d['share_mismatches']]")
[ "$got" = "[1, $CD_SHARED, 5]" ] ||
  fail "collision: stats [shared_tensors_total, shared_bytes_total, share_mismatches] is $got," \
    "expected [1, $CD_SHARED, 5]"
for t in layers.0.attn.q layers.0.attn.k layers.0.mlp.up layers.0.norm lm_head.weight; do
  grep -qF "event=share_mismatch file=$WB_TMP/D.safetensors tensor=$t digest=" "$BROKER_LOG" ||
    fail "no share_mismatch line for $t: $(grep share_mismatch "$BROKER_LOG")"
done
[ "$(grep -c "event=share_mismatch" "$BROKER_LOG")" = 5 ] ||
  fail "share_mismatch lines: $(grep share_mismatch "$BROKER_LOG")"
grep -qF "tensor=embed.weight " "$BROKER_LOG" && fail "the equal tensor was logged as a mismatch"
reads_back d D 2
reads_back c C 1
stop_broker

# --- A published version lends its tensors once the broker has their
# checksums: B borrows A's 4 equal tensors from model p, published (from
# this process's memory, wb-publish) with A's bytes.
start_broker
"$WB_BIN_DIR/examples/wb-publish" --socket "$SOCK" --model p "$WB_TMP/A.safetensors" \
  >"$WB_TMP/publish.out" 2>&1 || fail "wb-publish failed: $(cat "$WB_TMP/publish.out")"
p_checksums() { [ "$(ctl models --json | json "[m['checksums'] for m in d if m['name'] == 'p'][0]")" = ready ]; }
wait_for p_checksums || fail "p's checksums never came: $(ctl models -o wide)"
expect_shared p 0 0 true
load b B
expect_shared b 4 "$AB_SHARED" true
reads_back b B 2
unload p
reads_back b B 2
stop_broker

# --- wbctl load --no-share: the model neither borrows nor lends.
start_broker
load a A --no-share
expect_shared a 0 0 false
load b B
expect_shared b 0 0 true
load b2 B --no-share
expect_shared b2 0 0 false
# b lends (a control): a copy of it borrows every tensor, and still has a
# slab of its own.
load b3 B
expect_shared b3 6 "$B_BYTES" true
expect_stats $((A_BYTES + 3 * B_BYTES)) $((A_BYTES + 2 * B_BYTES)) "no-share"
reads_back b2 B 1
reads_back b3 B 2
stop_broker

# --- wbrokerd --no-share-tensors: nothing is shared.
start_broker --no-share-tensors
load a A
load b B
load b2 B
expect_shared a 0 0 false
expect_shared b 0 0 false
expect_shared b2 0 0 false
expect_stats $((A_BYTES + 2 * B_BYTES)) $((A_BYTES + 2 * B_BYTES)) "--no-share-tensors"
[ "$(stat_field shared_tensors_total)" = 0 ] ||
  fail "--no-share-tensors: shared_tensors_total is $(stat_field shared_tensors_total)"
reads_back b B 1
stop_broker
