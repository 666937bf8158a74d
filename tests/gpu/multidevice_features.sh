#!/usr/bin/env bash
# The features part of tests/gpu/multidevice.sh: a model's rollout and
# rollback, a publish, shared tensors and the device memory budget, each on
# one device (the parts KEY@0, always run) and on two (KEY@0,1, run with
# two GPUs or more; on one GPU skipped with the reason "needs 2 GPUs, this
# machine has 1"). Runs on the GPU test machine (prebuilt binaries, as
# tests/gpu/run.sh).
#
#   tests/gpu/multidevice_features.sh OUT
#
# Models: the bf16 family of examples/compile_models.py (variant a, a
# backbone of WB_MDF_GIB GiB) compiled by lib.sh's `models` into
# WB_GPU_WORK/mdf/roll, and its second version by tests/gpu/rollout_models.py
# (bf16_base_v2: every backbone weight's rows rolled by one, and eager
# PyTorch's outputs of both versions); checkpoints A and B as
# tests/gpu/share.sh's (8 bf16 tensors of WB_MDF_SHARE_MIB MiB; B changes 2
# of them), written by multidevice_features.py checkpoints. P below is the
# part's placement: 0, or 0,1.
#
# rollout@P  a broker with base and head placed @P; one wb-aoti-worker per
#            device of P (--device cuda:N --serve --follow: lib.sh's
#            start_followers), each one's leases checked to be on its own
#            device; a holder (wb-demo-worker) per device keeps version 1
#            alive for the rollback (a version no lease holds is freed);
#            wbctl rollout base <bf16_base_v2>: every worker on version 2;
#            wbctl rollback base: every worker back on version 1, version 2
#            freed. Per device: every worker's first output of each version
#            against eager PyTorch's for that version (check_outputs.py,
#            relative error <= 0.02), every later output of a version bit
#            for bit against its first (the worker counts those that differ:
#            a mixed run); runs, failed and mixed (both 0), swaps [2, 1].
# publish@P  a broker with base placed @P; tests/gpu/publish_trainer.py (as
#            tests/gpu/publish.sh runs it) on device 0 publishes one update
#            (every backbone weight rolled by one: the bytes of
#            bf16_base_v2). From the broker's event=publish_commit line:
#            bytes and device_gpu_seconds (DEVICE:GPU_SECONDS for each
#            device's copies), so GB/s per device, beside the trainer's plain
#            device-to-device copy. Device 1's copy is cudaMemcpyPeerAsync
#            from device 0's memory (broker/publish_cuda.c), and the broker
#            logs no path: it is reported "peer" when torch says device 1
#            can access device 0 and the copy ran at WB_MDF_PEER_GBPS or
#            more (beyond what a copy staged through host memory reaches),
#            "staged" when it cannot, else "undetermined". The published
#            bytes read back on each device (wb_vmm_check verify under
#            CUDA_VISIBLE_DEVICES=<its UUID>) against bf16_base_v2.
# share@P    a broker loads A@P, then B@P: B's shared tensors and bytes (6
#            of 8), per device B's own slab (its unique bytes there) and the
#            device memory (NVML) each load added (B's below half A's); B
#            read back on each device against its file (wb_vmm_check).
# budget@P   a broker with --device-memory-budget 2.5 x A's bytes (two
#            slabs fit on each device, three do not): m0a, m0b loaded
#            --no-share @0 and, in budget@0,1, m1a, m1b @1; a third load, m0c
#            @0, moves m0a (the least recently used) to the host tier and
#            leaves m0b, m0c and every device-1 model on its device (tiers
#            and copies from wbctl models --json); wb-demo-worker --model
#            m0a --hold 0 (it verifies every tensor) restores it; in
#            budget@0,1 m1a is then acquired on device 1, moving nothing.
#
# Writes OUT/multidevice_features.json: "ok", "gpus", and per part its
# figures (with "ok") or {"skipped": REASON}; each part's files in
# OUT/<part>/ (rollout_0, rollout_0_1, ...). Exit 0 when every part run
# passed. Sized to stay under 3 minutes on one GPU; the compile is reused
# by a later run in the same WB_GPU_WORK.
#
# Environment: as tests/gpu/lib.sh; WB_MDF_GIB (0.5), WB_MDF_SHARE_MIB (64),
# WB_MDF_PEER_GBPS (100).
set -uo pipefail

OUT=${1:?usage: tests/gpu/multidevice_features.sh OUT}
LOG_NAME=multidevice_features.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
# CUDA ordinals in NVML's order: the broker's device N is gpumem.py's N.
export CUDA_DEVICE_ORDER=PCI_BUS_ID
TOP=$OUT
GIB=${WB_MDF_GIB:-0.5}
SMIB=${WB_MDF_SHARE_MIB:-64}
PEER_GBPS=${WB_MDF_PEER_GBPS:-100}
TOL=0.02
RES=$OUT/multidevice_features.jsonl
: >"$RES"
MPY=$GPU_TESTS/multidevice_features.py
VMM=$BIN/wb_vmm_check
# The package from this tree, over the staged libwbclient (the trainer);
# the workers and clients wait for restores.
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export WB_CLIENT_LIBRARY=$LIB
export WB_TIMEOUT_MS=${WB_TIMEOUT_MS:-60000}
BROKER_ARGS+=(--cuda-slab vmm)
SOCK_PATH=$WORK/mdf.sock

need_bins "$WBROKERD" "$WBCTL" "$WORKER" "$DEMO" "$VMM"
python3 -c 'import weightbroker, torch; assert torch.cuda.is_available()' 2>>"$LOG" ||
  { say "python3 cannot import weightbroker and torch with CUDA (see $LOG)"; exit 2; }
# As tests/gpu/multidevice.sh counts them, at most those CUDA_VISIBLE_DEVICES names.
NGPU=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | grep -c '^GPU-')
if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
  NVIS=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
  if [ "$NVIS" -lt "$NGPU" ]; then NGPU=$NVIS; fi
fi
if [ "$NGPU" -lt 1 ]; then
  say "no GPU visible"
  exit 2
fi
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv,noheader | tee -a "$LOG" >&2
say "$NGPU GPU(s); torch $(python3 -c 'import torch; print(torch.__version__)')"
[ "$NGPU" -ge 2 ] && nvidia-smi topo -m >"$OUT/topo.txt" 2>&1

PART=
KEYS=()
# fail MSG: lib.sh's, and the failure also in the report, under the part
# running (of the run, outside one): the report's "ok" and the exit status
# count the same failures.
fail() {
  say "FAIL: ${PART:+$PART: }$*"
  FAILS+=("${PART:+$PART: }$*")
  record "$(python3 -c 'import json, sys
r = {"failure": sys.argv[2]}
if sys.argv[1]:
    r["part"] = sys.argv[1]
print(json.dumps(r))' "$PART" "$*")"
}
# part_result FILE: the part's figures (one JSON line) into the record.
part_result() {
  if python3 -c 'import json, sys; json.loads(open(sys.argv[1]).read())' "$1" 2>/dev/null; then
    record "{\"part\": \"$PART\", \"result\": $(cat "$1")}"
  else
    fail "its check printed no figures: $(tail -c 300 "$1" 2>/dev/null)"
  fi
}
# uuids_of LOG: UUIDS[N], device N's UUID, as the broker logged them.
uuids_of() {
  mapfile -t UUIDS < <(grep -o 'event=device device=[0-9]* uuid=[^ ]*' "$1" | sed 's/.*uuid=//')
}
# model_json NAME EXPR: EXPR of the listing's entry m of model NAME.
model_json() { ctl models --json | py "next(($2 for m in d if m['name'] == '$1'), None)"; }
# settled: no model on its way between tiers.
settled() {
  ctl models --json | py "all(m['tier'] in ('device', 'host', 'evicted') for m in d)" | grep -q True
}
# workers_on V: every worker of start_followers holds base at version V.
workers_on() { ctl leases --json | python3 "$MPY" on-version base "$1" "${WPIDS[@]}"; }
# only_version V: V is the one version of base listed.
only_version() {
  ctl models --json |
    py "[v['version'] for v in next(m for m in d if m['name'] == 'base').get('versions', [])] == [$1]" |
    grep -q True
}
# checked: the current version of base has its checksums.
checked() { [ "$(model_json base "m['checksums']")" = ready ]; }
HOLDERS=()

# run_part KEY FUNCTION DEVICE...: the part in OUT/<KEY with _ for @ and ,>;
# whatever it left running is stopped after it.
run_part() {
  local key=$1 fn=$2 p
  shift 2
  PART=$key
  KEYS+=("$key")
  say "---- $key"
  WPIDS=()
  HOLDERS=()
  BROKER=
  "$fn" "$@"
  for p in "${WPIDS[@]}" "${HOLDERS[@]}"; do
    kill -KILL "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
  if [ -n "$BROKER" ] && kill -0 "$BROKER" 2>/dev/null; then
    stop_broker || fail "the broker exited with $? after SIGTERM"
  fi
  PART=
}
# skip_part KEY REASON
skip_part() {
  KEYS+=("$1")
  say "---- $1: skipped ($2)"
  record "{\"part\": \"$1\", \"skipped\": \"$2\"}"
}
part_dir() {
  local d=$TOP/${PART//[@,]/_}
  rm -rf "$d"
  mkdir -p "$d"
  echo "$d"
}

# ---- models --------------------------------------------------------------------
D=$WORK/mdf/roll
S=$WORK/mdf/share
MODELS_OK=1
if models "$D" "$GIB" "" --variants a; then
  if [ ! -f "$D/bf16_base_v2.safetensors" ] || [ ! -f "$D/bf16_a_ref_v2.safetensors" ] ||
    [ "$D/bf16_base.safetensors" -nt "$D/bf16_base_v2.safetensors" ]; then
    python3 "$GPU_TESTS/rollout_models.py" "$D" >"$OUT/rollout_models.json" 2>"$OUT/rollout_models.err" ||
      { fail "rollout_models.py: $(tail -n 3 "$OUT/rollout_models.err") $(cat "$OUT/rollout_models.json")"; MODELS_OK=0; }
  fi
else
  fail "the bf16 family did not compile"
  MODELS_OK=0
fi
CK_OK=1
python3 "$MPY" checkpoints "$S" "$SMIB" >"$OUT/checkpoints.json" 2>>"$LOG" ||
  { fail "could not write checkpoints A and B (see $LOG)"; CK_OK=0; }
A=$S/a.safetensors
B=$S/b.safetensors
A_BYTES=$((8 * SMIB << 20))
record "{\"info\": {\"models\": {\"bf16_backbone_gib\": $GIB, \"share_tensor_mib\": $SMIB}}}"
say "models ready (compiled: $MODELS_OK, checkpoints: $CK_OK)"

# ---- rollout and rollback ---------------------------------------------------------
part_rollout() {
  local OUT devs=("$@") P d p rc
  OUT=$(part_dir)
  P=$(IFS=,; echo "${devs[*]}")
  [ "$MODELS_OK" = 1 ] || { fail "no models"; return; }
  start_broker "$SOCK_PATH" "$OUT/broker.log" --model "base=$D/bf16_base.safetensors@$P" \
    --model "head=$D/bf16_head_a.safetensors@$P" || return
  start_followers "${#devs[@]}" "$D" "$P" || return
  ctl leases --json >"$OUT/leases_serving.json"
  python3 "$MPY" lease-devices "$P" "${WPIDS[@]}" <"$OUT/leases_serving.json" >"$OUT/lease_devices.json" ||
    fail "a worker's leases are not on its device: $(cat "$OUT/lease_devices.json")"
  for d in "${devs[@]}"; do
    "${ORPHAN_KILL[@]}" "$DEMO" --socket "$SOCK" --model base --device "$d" >"$OUT/holder_$d.log" 2>&1 &
    HOLDERS+=($!)
    PIDS+=($!)
  done
  for d in "${devs[@]}"; do
    wait_for 60 has_line "$OUT/holder_$d.log" "^verified" ||
      fail "the holder on device $d has no lease: $(tail -n 3 "$OUT/holder_$d.log")"
  done
  wait_for 30 workers_on 1 || fail "the workers are not on version 1: $(ctl leases)"
  sleep 1
  ctl rollout base "$D/bf16_base_v2.safetensors" --json >"$OUT/rollout_v2.json" 2>"$OUT/rollout_v2.err" ||
    fail "rollout to version 2: $(cat "$OUT/rollout_v2.err")"
  wait_for 30 workers_on 2 || fail "not every worker swapped to version 2: $(ctl leases)"
  sleep 1
  ctl models --json >"$OUT/models_v2.json"
  ctl rollback base --json >"$OUT/rollback.json" 2>"$OUT/rollback.err" ||
    fail "rollback: $(cat "$OUT/rollback.err")"
  wait_for 30 workers_on 1 || fail "not every worker swapped back to version 1: $(ctl leases)"
  sleep 1
  for p in "${HOLDERS[@]}"; do
    kill -TERM "$p" 2>/dev/null
    wait_exit 20 "$p"
    rc=$?
    [ "$rc" = 0 ] || fail "a holder exited with $rc"
  done
  HOLDERS=()
  wait_for 30 only_version 1 || fail "version 2 was not freed after the rollback: $(ctl models)"
  ctl models --json >"$OUT/models.json"
  stop_followers
  WPIDS=()
  stop_broker || fail "the broker exited with $? after SIGTERM"
  grep -h 'event=model_version\|event=model_rollout\|event=model_rollback\|event=container_swapped' \
    "$OUT/broker.log" | head -n 40 >>"$LOG"
  python3 "$MPY" rollout "$OUT" "$TOL" "$D" "$P" "${WRC[*]}" >"$OUT/result.json" 2>>"$LOG" ||
    say "rollout checks failed: $(cat "$OUT/result.json")"
  part_result "$OUT/result.json"
}

# ---- publish -------------------------------------------------------------------------
part_publish() {
  local OUT devs=("$@") P d verify=()
  OUT=$(part_dir)
  P=$(IFS=,; echo "${devs[*]}")
  [ "$MODELS_OK" = 1 ] || { fail "no models"; return; }
  start_broker "$SOCK_PATH" "$OUT/broker.log" --model "base=$D/bf16_base.safetensors@$P" || return
  uuids_of "$OUT/broker.log"
  if [ "${#devs[@]}" -gt 1 ]; then
    python3 "$MPY" peer "$P" >"$OUT/peer.json" 2>>"$LOG" || fail "the peer access query failed (see $LOG)"
  fi
  timeout -k 10 180 "${ORPHAN_KILL[@]}" python3 "$GPU_TESTS/publish_trainer.py" --socket "$SOCK" \
    --dir "$D" --model base --updates 1 --out "$OUT/trainer.json" --refs "$OUT/refs" \
    --baseline-workers 0 >"$OUT/trainer.log" 2>&1 ||
    fail "the trainer exited with $?: $(tail -n 5 "$OUT/trainer.log")"
  wait_for 60 checked || fail "the published version's checksums are not ready: $(ctl models)"
  for d in "${devs[@]}"; do
    CUDA_VISIBLE_DEVICES=${UUIDS[d]:-none} "$VMM" verify "$SOCK" base "$D/bf16_base_v2.safetensors" \
      >"$OUT/verify_$d.txt" 2>&1
    verify+=("$d:$?")
  done
  ctl models --json >"$OUT/models.json"
  stop_broker || fail "the broker exited with $? after SIGTERM"
  grep -h 'event=publish' "$OUT/broker.log" >"$OUT/publish_events.log"
  python3 "$MPY" publish "$OUT" "$P" "$PEER_GBPS" "${verify[@]}" >"$OUT/result.json" 2>>"$LOG" ||
    say "publish checks failed: $(cat "$OUT/result.json")"
  part_result "$OUT/result.json"
}

# ---- shared tensors -----------------------------------------------------------------
part_share() {
  local OUT devs=("$@") P d verify=()
  OUT=$(part_dir)
  P=$(IFS=,; echo "${devs[*]}")
  [ "$CK_OK" = 1 ] || { fail "no checkpoints"; return; }
  mem() { # mem STAGE: each device's used bytes (NVML)
    sleep 0.5
    for d in "${devs[@]}"; do echo "$1 $d $(mem_used "$d")" >>"$OUT/mem.txt"; done
  }
  mem idle
  start_broker "$SOCK_PATH" "$OUT/broker.log" || return
  uuids_of "$OUT/broker.log"
  mem broker
  ctl load a "$A@$P" >>"$LOG" 2>&1 || fail "load a@$P failed"
  mem a
  ctl load b "$B@$P" >>"$LOG" 2>&1 || fail "load b@$P failed"
  mem b
  ctl models --json >"$OUT/models.json"
  ctl stats --json >"$OUT/stats.json"
  ctl models >>"$LOG"
  for d in "${devs[@]}"; do
    CUDA_VISIBLE_DEVICES=${UUIDS[d]:-none} "$VMM" verify "$SOCK" b "$B" >"$OUT/verify_$d.txt" 2>&1
    verify+=("$d:$?")
  done
  stop_broker || fail "the broker exited with $? after SIGTERM"
  python3 "$MPY" share "$OUT" "$P" "${verify[@]}" >"$OUT/result.json" 2>>"$LOG" ||
    say "share checks failed: $(cat "$OUT/result.json")"
  part_result "$OUT/result.json"
}

# ---- the memory budget ---------------------------------------------------------------
part_budget() {
  local OUT devs=("$@") P acq=() bb=$((A_BYTES * 5 / 2))
  OUT=$(part_dir)
  P=$(IFS=,; echo "${devs[*]}")
  [ "$CK_OK" = 1 ] || { fail "no checkpoints"; return; }
  start_broker "$SOCK_PATH" "$OUT/broker.log" --device-memory-budget "$bb" || return
  load_on() { ctl load --no-share "$1" "$A@$2" >>"$LOG" 2>&1 || fail "load $1@$2 failed: $(tail -n 2 "$LOG")"; }
  load_on m0a 0
  load_on m0b 0
  if [ "${#devs[@]}" -gt 1 ]; then
    load_on m1a 1
    load_on m1b 1
  fi
  wait_for 60 settled || fail "models still moving after the loads: $(ctl models)"
  ctl models --json >"$OUT/loaded.json"
  load_on m0c 0
  wait_for 60 settled || fail "models still moving after the third load: $(ctl models)"
  ctl models --json >"$OUT/third.json"
  ctl models >>"$LOG"
  "$DEMO" --socket "$SOCK" --model m0a --hold 0 >"$OUT/acquire_m0a.out" 2>&1
  acq+=("m0a:$?")
  wait_for 60 settled || fail "models still moving after the acquire: $(ctl models)"
  ctl models --json >"$OUT/acquired.json"
  if [ "${#devs[@]}" -gt 1 ]; then
    "$DEMO" --socket "$SOCK" --model m1a --device 1 --hold 0 >"$OUT/acquire_m1a.out" 2>&1
    acq+=("m1a:$?")
    wait_for 60 settled || fail "models still moving after the acquire on device 1: $(ctl models)"
    ctl models --json >"$OUT/acquired_1.json"
  fi
  ctl models >>"$LOG"
  ctl stats --json >"$OUT/stats.json"
  stop_broker || fail "the broker exited with $? after SIGTERM"
  grep -h 'event=model_tier\|event=memory_budget' "$OUT/broker.log" >"$OUT/tier_events.log"
  python3 "$MPY" budget "$OUT" "$P" "$bb" "${acq[@]}" >"$OUT/result.json" 2>>"$LOG" ||
    say "budget checks failed: $(cat "$OUT/result.json")"
  part_result "$OUT/result.json"
}

# ---- the parts -------------------------------------------------------------------------
TWO="needs 2 GPUs, this machine has $NGPU"
for f in rollout publish share budget; do
  run_part "$f@0" "part_$f" 0
  if [ "$NGPU" -ge 2 ]; then
    run_part "$f@0,1" "part_$f" 0 1
  else
    skip_part "$f@0,1" "$TWO"
  fi
done

# ---- results ----------------------------------------------------------------------------
python3 "$MPY" report "$RES" "$TOP" "$NGPU" "${KEYS[@]}" | tee -a "$LOG" >&2
rc=${PIPESTATUS[0]}
finish
# The report's verdict is the status: it counts every failure.
[ "$rc" = 0 ]
