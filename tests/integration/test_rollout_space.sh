#!/usr/bin/env bash
# A rollout that cannot fit beside the current version is refused before
# any slab is allocated, with the bytes it needs and the bytes free: a
# sparse checkpoint whose header declares a 2^40-byte tensor, far more than
# /dev/shm (named slabs) or the memory available (memfds) holds. The
# current version keeps serving; a plain load is refused the same way,
# worded as a load.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/v1.safetensors" 4 1 >/dev/null
"$PYTHON" - "$WB_TMP/huge.safetensors" <<'PY'
import json, os, struct, sys
n = 1 << 40
h = json.dumps({"huge": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + n)  # sparse: no block is written
PY
[ "$(stat -c %s "$WB_TMP/huge.safetensors")" -gt 1099511627776 ] || skip "no sparse file of 1 TiB here"

for slab in shm memfd; do
  HOST_SLAB=$slab
  start_broker_with_demo "$WB_TMP/v1.safetensors"
  start_worker w --model demo --verify-every 50
  w=$LAST_PID
  ctl rollout demo "$WB_TMP/huge.safetensors" >"$WB_TMP/huge.out" 2>&1
  rc=$?
  [ "$rc" = 1 ] || fail "$slab: the rollout that cannot fit exited $rc: $(cat "$WB_TMP/huge.out")"
  where="host shared memory (/dev/shm)"
  [ $slab = memfd ] && where="host memory (MemAvailable)"
  grep -Eq "^wbctl: rollout: rollout of 'demo' \(version 2\) does not fit beside version 1 in $(sed 's/[()]/\\&/g' <<<"$where"): needs 1099\.51 GB \(1099511627776 bytes\), [0-9]+\.[0-9]{2} GB \([0-9]+ bytes\) free$" "$WB_TMP/huge.out" ||
    fail "$slab: the refusal says: $(cat "$WB_TMP/huge.out")"
  # Refused before any slab: no allocation was tried, nothing was read.
  grep -q "event=model_rollout_failed model=demo version=2 current=1 status=WB_ENOMEM" "$BROKER_LOG" ||
    fail "$slab: no rollout_failed line"
  grep -q "event=load_stage model=demo stage=total" <(grep -A100 model_rollout_start "$BROKER_LOG") &&
    fail "$slab: the refused rollout read its file"
  [ "$(ctl models --json | json "[(v['version'], v['state']) for m in d for v in m['versions']]")" = '[[1, "current"], [2, "failed"]]' ] ||
    fail "$slab: versions after the refusal: $(ctl models --json)"
  # The current version serves: the holder verifies, a new lease is on it.
  start_worker n --model demo --hold 0
  wait_exit "$LAST_PID"
  [ "$EXIT_RC" = 0 ] || fail "$slab: a new lease on the current version failed"
  alive "$w" || fail "$slab: the holder died"
  grep -q "verify failed" "$WB_TMP/w.out" && fail "$slab: the holder's bytes changed"
  # A load is refused the same way before anything is allocated.
  ctl load big "$WB_TMP/huge.safetensors" >"$WB_TMP/load.out" 2>&1 && fail "$slab: the huge load was granted"
  grep -Eq "^wbctl: load: load of 'big' does not fit in " "$WB_TMP/load.out" ||
    fail "$slab: the load's refusal: $(cat "$WB_TMP/load.out")"
  kill -TERM "$w"
  wait_exit "$w"
  [ "$EXIT_RC" = 0 ] || fail "$slab: the holder exited $EXIT_RC"
  stop_broker
done
