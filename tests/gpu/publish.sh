#!/usr/bin/env bash
# Publishing from a live process on the GPU: a trainer's updates in every
# serving worker from one copy. Runs on the GPU test machine (prebuilt
# binaries, as tests/gpu/run.sh).
#
#   tests/gpu/publish.sh OUT
#
# Steps: the bf16 family of examples/compile_models.py (a backbone of
# WB_PUBLISH_GIB GiB, variant a); a cuda broker with the base and the head;
# WB_PUBLISH_WORKERS AOTI workers (wb-aoti-worker --serve --follow) serving
# in a loop; the trainer (tests/gpu/publish_trainer.py) holds the base's
# tensors in its own device memory and publishes WB_PUBLISH_UPDATES updates
# (weightbroker.Client.publish), each one every backbone weight changed in
# place, with the eager output of each version saved as its reference and a
# plain device-to-device copy of the same bytes timed beside it, in the
# trainer and in a second process whose context is idle between updates, as
# the broker's is. Then the
# baseline: as many processes as workers each receive the trainer's tensors
# as CUDA IPC handles and copy them into their own copy of the weights.
#
# Checked: every version's first output of every worker against eager
# PyTorch's for that version (relative error), every later output of a
# version bit for bit against its first (a mixed run would differ); each
# worker saw every version; one copy per live version (NVML after the last
# update drained, less the slab the broker's pool keeps for the next
# publish, against before the first; and again once the pool gave it back);
# the trainer's handles closed by the broker once it exited. Reported against targets: the
# broker's copy GB/s against the plain copy's (>= 0.8 x), the time from the
# publish call to the last worker swapped (<= the copy + 10 ms), and the
# baseline's time and memory. Writes OUT/publish.json and the logs.
#
# Environment: as tests/gpu/lib.sh; WB_PUBLISH_GIB (4), WB_PUBLISH_WORKERS
# (8), WB_PUBLISH_UPDATES (20), WB_PUBLISH_BROKER_ARGS (more wbrokerd
# options, split on spaces: e.g. "--publish-streams 1 --no-slab-pool"); the
# models in WB_GPU_WORK/roll (shared with tests/gpu/rollout.sh).
set -uo pipefail

OUT=${1:?usage: tests/gpu/publish.sh OUT}
LOG_NAME=publish.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
GIB=${WB_PUBLISH_GIB:-4}
N=${WB_PUBLISH_WORKERS:-8}
UPDATES=${WB_PUBLISH_UPDATES:-20}
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export WB_CLIENT_LIBRARY=$LIB
need_bins "$WBROKERD" "$WBCTL" "$WORKER"
with_slab_pool
gpu_json "$OUT/gpu.json"

D=$WORK/roll
models "$D" "$GIB" "" --variants a || { finish; exit 1; }
M0=$(mem_used)
# The slab pool keeps a drained version's slab for the next publish; for 5
# s here, so that the memory can be seen given back.
read -r -a EXTRA <<<"${WB_PUBLISH_BROKER_ARGS:-}"
start_broker "$WORK/pub.sock" "$OUT/broker.log" --model "base=$D/bf16_base.safetensors" \
  --model "head=$D/bf16_head_a.safetensors" --slab-pool-seconds 5 "${EXTRA[@]}" ||
  { finish; exit 1; }

start_followers "$N" "$D" || { finish; exit 1; }

rm -f "$WORK/pub.go" "$WORK/pub.start"
"${ORPHAN_KILL[@]}" python3 "$GPU_TESTS/publish_trainer.py" --socket "$SOCK" --dir "$D" --model base \
  --updates "$UPDATES" --out "$OUT/trainer.json" --refs "$OUT/refs" --baseline-workers "$N" \
  --go-baseline "$WORK/pub.go" --go-updates "$WORK/pub.start" >"$OUT/trainer.log" 2>&1 &
TRAINER=$!
PIDS+=("$TRAINER")
wait_for 120 has_line "$OUT/trainer.log" "^ready" ||
  { fail "trainer not ready: $(tail -n 5 "$OUT/trainer.log")"; finish; exit 1; }
sleep 1
MPRE=$(mem_used)
say "device memory before the first update (the broker's copy, $N workers, the trainer's): $MPRE"
# Measured before the trainer starts: a version drained meanwhile would be
# counted in the pool.
touch "$WORK/pub.start"
# A trainer that died will never say it: no need to wait out the limit.
said_or_gone() { has_line "$OUT/trainer.log" "$1" || ! kill -0 "$TRAINER" 2>/dev/null; }
wait_for 300 said_or_gone "^published all"
has_line "$OUT/trainer.log" "^published all" ||
  fail "the trainer did not finish its updates: $(tail -n 5 "$OUT/trainer.log")"
last_only() {
  ctl models --json | python3 -c "
import json, sys
m = [m for m in json.load(sys.stdin) if m['name'] == 'base'][0]
sys.exit(not len(m.get('versions', [m])) == 1)"
}
wait_for 30 last_only || fail "old versions still listed: $(ctl models)"
sleep 1
MPOST=$(mem_used)
ctl models --json >"$OUT/models.json"
ctl stats --json >"$OUT/stats.json"
POOL=$(py 'd.get("slab_pool_bytes", 0)' <"$OUT/stats.json")
say "after the last update drained: $MPOST (the slab pool keeps $POOL bytes)"
pool_empty() { [ "$(ctl stats --json | py 'd.get("slab_pool_bytes", 0)')" = 0 ]; }
wait_for 30 pool_empty || fail "the slab pool did not give its slabs back: $(ctl stats --json | py 'd.get("slab_pool_bytes")')"
sleep 1
MTRIM=$(mem_used)
say "after the pool gave them back: $MTRIM"
touch "$WORK/pub.go"
wait_for 240 said_or_gone "^done"
has_line "$OUT/trainer.log" "^done" || fail "the baseline did not end: $(tail -n 5 "$OUT/trainer.log")"
wait_exit 60 "$TRAINER" || fail "the trainer exited $?: $(tail -n 5 "$OUT/trainer.log")"
# The producer's handles the broker kept open between commits are closed
# when it goes (an importer keeps an allocation alive).
wait_for 20 has_line "$OUT/broker.log" "event=publish_sources_closed" ||
  fail "the trainer's CUDA IPC handles were not closed after it exited"

stop_followers
stop_broker
grep -h 'event=publish' "$OUT/broker.log" >"$OUT/publish_events.log"
python3 "$GPU_TESTS/publish_report.py" "$OUT" "$N" "$M0" "$MPRE" "$MPOST" "${WRC[*]}" "$POOL" "$MTRIM" \
  >"$OUT/publish.json" || fail "publish checks: see publish.json"
say "publish: $(python3 -c "import json; d=json.load(open('$OUT/publish.json')); print({k: d.get(k) for k in ('versions','runs','failed','mixed','ok','targets_met','summary')})" 2>&1)"
finish
