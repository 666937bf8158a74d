#!/usr/bin/env bash
# Live rollout on the GPU: a new checkpoint into every serving worker, no
# request dropped or mixed. Runs on the GPU test machine (prebuilt binaries,
# as tests/gpu/run.sh).
#
#   tests/gpu/rollout.sh OUT
#
# Steps: the bf16 family of examples/compile_models.py (a backbone of
# WB_ROLLOUT_GIB GiB, variant a) and a second version of its base
# (tests/gpu/rollout_models.py: the same tensors with other values, and the
# eager outputs of both versions); a cuda broker with the base (version 1)
# and the head; WB_ROLLOUT_WORKERS AOTI workers (wb-aoti-worker --serve
# --follow) serving in a loop, and the stall victim (bench/gpu/
# stall_victim.py, non-blocking stream) beside them. Then:
#
#   1. baseline         the victim's iterations while the workers serve
#   2. broker_rollout   wbctl rollout base <v2>: every worker swaps to
#                       version 2, version 1 drains and is freed; device
#                       memory must be back to one copy
#   3. a holder (wb-demo-worker) leases version 2; wbctl rollout base <v1's
#      file> makes version 3; every worker swaps to it
#   4. broker_rollback  wbctl rollback base: version 2 (held) is current
#                       again, every worker swaps back to it, version 3
#                       drains and is freed; the holder ends; one copy again
#
# Every worker's output is compared: each version's first output with eager
# PyTorch's for that version's weights (check_outputs.py, relative error),
# and every later output of a version with its first, bit for bit (the
# worker counts those that differ: a run on a mix of versions would). The
# time from a version current (the rollout's reply, current_at) to the last
# worker swapped (its swapped_at) is compared with one run of a worker.
# Writes OUT/rollout.json, the logs, OUT/victim_series.json.gz.
#
# Environment: as tests/gpu/lib.sh; WB_ROLLOUT_GIB (4), WB_ROLLOUT_WORKERS (8),
# and the scratch models in WB_GPU_WORK/roll.
set -uo pipefail

OUT=${1:?usage: tests/gpu/rollout.sh OUT}
LOG_NAME=rollout.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
GIB=${WB_ROLLOUT_GIB:-4}
N=${WB_ROLLOUT_WORKERS:-8}
RES=$OUT/rollout.jsonl
: >"$RES"
TOL=0.02
need_bins "$WBROKERD" "$WBCTL" "$WORKER" "$DEMO"
gpu_json "$OUT/gpu.json"
say "torch: $(python3 -c 'import torch; print(torch.__version__)')"

D=$WORK/roll
models "$D" "$GIB" "" --variants a || { finish; exit 1; }
if [ ! -f "$D/bf16_a_ref_v2.safetensors" ] || [ ! -f "$D/bf16_base_v2.safetensors" ]; then
  python3 "$GPU_TESTS/rollout_models.py" "$D" >"$OUT/rollout_models.json" 2>"$OUT/rollout_models.err" ||
    { fail "rollout_models.py: $(tail -n 3 "$OUT/rollout_models.err") $(cat "$OUT/rollout_models.json")"; finish; exit 1; }
fi
say "versions: $(cat "$OUT/rollout_models.json" 2>/dev/null)"
sleep 1
M0=$(mem_used)
start_broker "$WORK/roll.sock" "$OUT/broker.log" --model "base=$D/bf16_base.safetensors" \
  --model "head=$D/bf16_head_a.safetensors" || { finish; exit 1; }
sleep 1
MB=$(mem_used)
say "device memory: idle $M0, with the broker's one copy $MB"

# The victim, beside the workers.
FIFO=$WORK/rollout.ctl
rm -f "$FIFO"
mkfifo "$FIFO"
exec 3<>"$FIFO"
python3 "$GPU_BENCH/stall_victim.py" --stream nonblocking --control "$FIFO" \
  --series "$OUT/victim_series.json.gz" --max-seconds 300 >"$OUT/victim.out" 2>"$OUT/victim.err" &
VICTIM=$!
PIDS+=("$VICTIM")
wait_for 120 has_line "$OUT/victim.out" "^ready" ||
  { fail "victim not ready: $(tail -n 3 "$OUT/victim.err")"; finish; exit 1; }

start_followers "$N" "$D" || { finish; exit 1; }
sleep 1
# One copy with the victim and every worker: what the drained states must
# come back to.
M1=$(mem_used)
say "device memory with the victim and $N workers on one copy: $M1"

# on_version V COUNT: COUNT leases of base pin version V and no other
# version of base is leased.
on_version() {
  ctl leases --json | python3 -c "
import json, sys
ls = [l for l in json.load(sys.stdin) if l['model'] == 'base']
sys.exit(not (sum(l.get('version') == $1 for l in ls) == $2 and all(l.get('version') == $1 for l in ls)))"
}
# freed_except V: the only version of base listed is V.
freed_except() {
  ctl models --json | python3 -c "
import json, sys
m = [m for m in json.load(sys.stdin) if m['name'] == 'base'][0]
sys.exit(not [v['version'] for v in m.get('versions', [m])] == [$1])"
}
mark() { echo "mark $1" >&3; }

sleep 2
mark baseline
sleep 6
mark -
sleep 0.5

# ---- rollout: version 2 ------------------------------------------------
mark broker_rollout
ctl rollout base "$D/bf16_base_v2.safetensors" --json >"$OUT/rollout_v2.json" 2>"$OUT/rollout_v2.err" ||
  fail "rollout to version 2: $(cat "$OUT/rollout_v2.err")"
wait_for 30 on_version 2 "$N" || fail "not every worker swapped to version 2: $(ctl leases)"
sleep 2
mark -
wait_for 30 freed_except 2 || fail "version 1 was not freed: $(ctl models)"
sleep 1
M2=$(mem_used)
say "after version 1 drained: $M2 (one copy: $M1)"

# ---- rollout of version 3 with a holder on version 2, then rollback ---------
"${ORPHAN_KILL[@]}" "$DEMO" --socket "$SOCK" --model base >"$OUT/holder.log" 2>&1 &
HOLDER=$!
PIDS+=("$HOLDER")
wait_for 30 on_version 2 $((N + 1)) || fail "the holder has no lease on version 2"
ctl rollout base "$D/bf16_base.safetensors" --json >"$OUT/rollout_v3.json" 2>"$OUT/rollout_v3.err" ||
  fail "rollout to version 3: $(cat "$OUT/rollout_v3.err")"
workers_on() {
  ctl leases --json | python3 -c "
import json, sys
ls = [l for l in json.load(sys.stdin) if l['model'] == 'base']
sys.exit(not sum(l.get('version') == $1 for l in ls) == $2)"
}
wait_for 30 workers_on 3 "$N" || fail "not every worker swapped to version 3: $(ctl leases)"
sleep 1
M3=$(mem_used)
sleep 1
mark broker_rollback
ctl rollback base --json >"$OUT/rollback.json" 2>"$OUT/rollback.err" ||
  fail "rollback: $(cat "$OUT/rollback.err")"
wait_for 30 on_version 2 $((N + 1)) || fail "not every worker swapped back to version 2: $(ctl leases)"
sleep 2
mark -
wait_for 30 freed_except 2 || fail "version 3 was not freed after the rollback: $(ctl models)"
kill -TERM "$HOLDER" 2>/dev/null
wait_exit 20 "$HOLDER"
sleep 1
M4=$(mem_used)
say "two copies while both were held: $M3; after the rollback and the holder: $M4"
ctl models --json >"$OUT/models.json"
ctl stats --json >"$OUT/stats.json"

# ---- stop, check ----------------------------------------------------------------
stop_followers
echo quit >&3
wait_exit 60 "$VICTIM"
exec 3>&-
rm -f "$FIFO"
python3 "$GPU_BENCH/stall_summary.py" "$OUT/stall.json" "$OUT/victim_series.json.gz" \
  --gpu "$OUT/gpu.json" >"$OUT/stall.txt" 2>&1 || fail "stall summary: $(tail -n 3 "$OUT/stall.txt")"
stop_broker
grep -h 'event=model_version\|event=model_rollout\|event=model_rollback\|event=container_swapped' \
  "$OUT/broker.log" | head -n 60 >>"$LOG"

python3 "$GPU_TESTS/rollout_report.py" "$OUT" "$N" "$D" "$TOL" "$M0" "$M1" "$M2" "$M3" "$M4" \
  "${WRC[*]}" >"$OUT/rollout.json" ||
  fail "rollout checks: see rollout.json"
say "rollout: $(python3 -c "import json; d=json.load(open('$OUT/rollout.json')); print({k: d[k] for k in ('runs','failed','mixed','ok','targets_met')}, d['swap'], d['memory'])" 2>&1)"
cat "$OUT/stall.txt" >>"$LOG"
finish
