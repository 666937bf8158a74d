#!/usr/bin/env bash
# The GPU suite of the cuda backend and the AOTI binding: runs on the GPU
# test machine, builds nothing (binaries come prebuilt in .device/), writes
# logs and results into OUT and prints a short table last.
#
#   tests/gpu/run.sh OUT
#
# Steps: compile the test models with the torch there (examples/
# compile_models.py: a bf16 family with a backbone of >= 4 GiB and two heads,
# an fp32 family whose variant b uses runtime constant folding); load bases
# and heads into a cuda broker as separate models; start four bf16 workers
# (two per variant) and one fp32 worker per variant; check every output
# against eager PyTorch; SIGKILL a worker while it serves and check its
# leases are reclaimed while the others keep serving; measure device memory
# (NVML, used bytes above the idle baseline) with sharing and with the same
# workers each loading their own copy; time the attach (connect -> lease ->
# handles open -> container ready) against loading a model library that
# embeds its constants; then the named steps, each its own script: real
# (tests/gpu/real_models.sh, Hugging Face checkpoints), variants
# (tests/gpu/variants.sh: fine-tunes sharing tensors, a device memory
# budget with its host tier) and features (tests/gpu/multidevice_features.sh:
# rollout and rollback, a publish, shared tensors and the budget on one
# device and, with two GPUs, across two). Results: OUT/share.json,
# OUT/run.log, OUT/real_models/, OUT/variants/, OUT/multidevice_features/.
#
# Environment: WB_GPU_BIN, WB_GPU_LIB (default .device/ao/{bin,lib}),
# WB_GPU_WORK (scratch, default /tmp/wbgpu), WB_BACKBONE_GIB (4.25),
# WB_GPU_BUDGET_S (seconds before optional steps are skipped, 330),
# WB_GPU_SKIP_REAL=1, WB_GPU_SKIP_VARIANTS=1 and WB_GPU_SKIP_FEATURES=1
# (leave that step out), WB_GPU_ONLY=real|variants|features (run that step
# alone, into OUT/real_models, OUT/variants or OUT/multidevice_features; its
# status is the run's).
set -uo pipefail

OUT=${1:?usage: tests/gpu/run.sh OUT}
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
GIB=${WB_BACKBONE_GIB:-4.25}
BUDGET=${WB_GPU_BUDGET_S:-330}
RES=$OUT/results.jsonl # one JSON object per line, merged at the end
: >"$RES"
result_of() { grep '^result ' "$1" | tail -n 1 | cut -d' ' -f2-; }

# The named steps that are scripts of their own (also run alone).
step_real() {
  WB_GPU_BIN=$BIN WB_GPU_LIB=$LIB WB_GPU_WORK=$WORK/real bash "$GPU_TESTS/real_models.sh" \
    "$OUT/real_models"
}
step_variants() {
  WB_GPU_BIN=$BIN WB_GPU_LIB=$LIB WB_GPU_WORK=$WORK/variants bash "$GPU_TESTS/variants.sh" \
    "$OUT/variants"
}
step_features() {
  WB_GPU_BIN=$BIN WB_GPU_LIB=$LIB WB_GPU_WORK=$WORK/features \
    bash "$GPU_TESTS/multidevice_features.sh" "$OUT/multidevice_features"
}
case ${WB_GPU_ONLY:-} in
  "") ;;
  real | variants | features)
    say "only the step ${WB_GPU_ONLY}"
    "step_$WB_GPU_ONLY"
    exit
    ;;
  *)
    say "WB_GPU_ONLY: no step '${WB_GPU_ONLY}' (real, variants, features)"
    exit 2
    ;;
esac

need_bins "$WBROKERD" "$WBCTL" "$WORKER"
gpu_json "$OUT/gpu.json"
say "gpu: $(cat "$OUT/gpu.json")"
say "torch: $(python3 -c 'import torch; print(torch.__version__)') libs: $TORCH_LIB"

# ---- 1. models -------------------------------------------------------------
say "compiling (backbone ${GIB} GiB) in three processes"
python3 "$ROOT/examples/compile_models.py" "$WORK" --family fp32 >"$OUT/compile_fp32.log" 2>&1 &
fpid=$!
python3 "$ROOT/examples/compile_models.py" "$WORK" --family bf16 --backbone-gib "$GIB" \
  >"$OUT/compile.log" 2>&1 &
cpid=$!
python3 "$ROOT/examples/compile_models.py" "$WORK" --family bf16 --only-embedded \
  --backbone-gib "$GIB" >"$OUT/compile_embedded.log" 2>&1 &
epid=$!
PIDS+=("$fpid" "$cpid" "$epid")
wait "$fpid" || { say "fp32 compile failed"; tail -n 30 "$OUT/compile_fp32.log" >&2; exit 1; }
wait "$cpid" || { say "bf16 compile failed"; tail -n 30 "$OUT/compile.log" >&2; exit 1; }
say "compiled the shared variants: $(cat "$OUT"/compile.log "$OUT"/compile_fp32.log | grep -c '^compiled') packages"
# The embedded compile must end before any memory is measured.
until=$((SECONDS + 60))
while kill -0 "$epid" 2>/dev/null && [ "$SECONDS" -lt "$until" ]; do sleep 1; done
EMBEDDED=0
if kill -0 "$epid" 2>/dev/null; then
  kill -KILL "$epid"
  say "the embedded compile took too long; the embedded baseline is skipped"
elif wait "$epid"; then
  EMBEDDED=1
  say "compiled the embedded baseline"
else
  say "the embedded compile failed (see compile_embedded.log)"
fi
ls -l "$WORK" >>"$LOG"
cp "$WORK"/manifest*.json "$OUT/" 2>/dev/null

# ---- 2. sharing ----------------------------------------------------------------
sleep 1
M0=$(mem_used)
say "idle device memory used: $M0"
MODELS=()
for m in bf16_base bf16_head_a bf16_head_b fp32_base fp32_head_a fp32_head_b; do
  MODELS+=(--model "$m=$WORK/$m.safetensors")
done
BROKER_OK=1
start_broker "$WORK/broker.sock" "$OUT/broker.log" "${MODELS[@]}" || BROKER_OK=0
if [ "$BROKER_OK" = 1 ]; then
  ctl models --json >"$OUT/models.json"
  record "{\"models\": $(cat "$OUT/models.json")}"
  sleep 0.5
  M1=$(mem_used)
  say "broker ready: device memory used $M1 (+$((M1 - M0)))"

  # start_worker NAME VARIANT ARGS...: bf16/fp32 workers on leases.
  start_worker() {
    local name=$1 fam=$2 v=$3
    shift 3
    "$WORKER" --socket "$SOCK" --device cuda:0 --torch-lib "$TORCH_LIB" \
      --model "${fam}_base" --model "${fam}_head_$v" --aoti "$WORK/${fam}_$v.pt2" \
      --input "$WORK/${fam}_input.safetensors" --output "$WORK/out_$name.safetensors" \
      "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" &
    LAST=$!
    PIDS+=("$LAST")
  }
  declare -A WPID
  for name in a1 a2 b1 b2; do
    extra=()
    [ "$name" = a1 ] && extra=(--verify) # the device checksum path, once
    start_worker "bf16_$name" bf16 "${name:0:1}" --iterations 3 --serve "${extra[@]}"
    WPID[$name]=$LAST
  done
  for name in a1 a2 b1 b2; do
    wait_for 120 has_line "$OUT/bf16_$name.out" "^ready" ||
      fail "bf16 worker $name not ready: $(tail -n 3 "$OUT/bf16_$name.err")"
  done
  sleep 1
  M2=$(mem_used)
  python3 "$GPU_TESTS/gpumem.py" >"$OUT/gpu_sharing.json"
  say "4 bf16 workers serving: device memory used $M2 (+$((M2 - M1)) over the broker)"
  ctl containers --json >"$OUT/containers.json"
  ctl leases --json >"$OUT/leases_sharing.json"
  ctl containers >>"$LOG"
  ctl leases >>"$LOG"
  record "{\"mem\": {\"idle\": $M0, \"broker\": $M1, \"sharing\": $M2}}"

  # fp32 accuracy, one worker per variant, while the bf16 workers serve.
  for v in a b; do
    start_worker "fp32_$v" fp32 "$v" --iterations 5
    wait "$LAST" || fail "fp32 worker $v exited with $?: $(tail -n 3 "$OUT/fp32_$v.err")"
    record "{\"fp32_$v\": $(result_of "$OUT/fp32_$v.out")}"
  done

  # SIGKILL one bf16 worker while it serves: its leases are reclaimed and
  # the others keep serving.
  victim=${WPID[a2]}
  kill -KILL "$victim"
  t0=$(date +%s%N)
  gone() { [ "$(ctl leases --json | py "len([l for l in d if l['pid'] == $victim])")" = 0 ]; }
  if wait_for 10 gone; then
    ms=$((($(date +%s%N) - t0) / 1000000))
    say "leases of the killed worker $victim reclaimed after ${ms} ms"
    record "{\"reclaim_ms\": $ms}"
  else
    fail "the killed worker's leases were not reclaimed"
  fi
  ctl leases --json >"$OUT/leases_after_kill.json"
  sleep 1
  for name in a1 b1 b2; do
    kill -0 "${WPID[$name]}" 2>/dev/null || fail "bf16 worker $name died after the kill"
  done
  for name in a1 b1 b2; do
    kill -TERM "${WPID[$name]}"
    wait "${WPID[$name]}"
    rc=$?
    [ "$rc" = 0 ] || fail "bf16 worker $name exited with $rc"
    record "{\"bf16_$name\": $(result_of "$OUT/bf16_$name.out")}"
    say "bf16 worker $name: $(grep '^served' "$OUT/bf16_$name.out")"
  done
  wait "$victim" 2>/dev/null

  # Accuracy against eager PyTorch.
  python3 "$GPU_TESTS/check_outputs.py" 1e-3 "$WORK/fp32_a_ref.safetensors" \
    "$WORK/out_fp32_a.safetensors" >"$OUT/acc_fp32_a.json" || fail "fp32 a: $(cat "$OUT/acc_fp32_a.json")"
  python3 "$GPU_TESTS/check_outputs.py" 1e-3 "$WORK/fp32_b_ref.safetensors" \
    "$WORK/out_fp32_b.safetensors" >"$OUT/acc_fp32_b.json" || fail "fp32 b: $(cat "$OUT/acc_fp32_b.json")"
  python3 "$GPU_TESTS/check_outputs.py" 1e-2 "$WORK/bf16_a_ref.safetensors" \
    "$WORK/out_bf16_a1.safetensors" "$WORK/out_bf16_a2.safetensors" >"$OUT/acc_bf16_a.json" ||
    fail "bf16 a: $(cat "$OUT/acc_bf16_a.json")"
  python3 "$GPU_TESTS/check_outputs.py" 1e-2 "$WORK/bf16_b_ref.safetensors" \
    "$WORK/out_bf16_b1.safetensors" "$WORK/out_bf16_b2.safetensors" >"$OUT/acc_bf16_b.json" ||
    fail "bf16 b: $(cat "$OUT/acc_bf16_b.json")"
  for f in fp32_a fp32_b bf16_a bf16_b; do
    record "{\"acc_$f\": $(cat "$OUT/acc_$f.json")}"
    say "accuracy $f: $(cat "$OUT/acc_$f.json")"
  done

  # Attach latency on leases: a fresh process each time.
  for i in 1 2 3; do
    start_worker "attach_shared_$i" bf16 a --iterations 1
    wait "$LAST" || fail "attach run $i failed: $(tail -n 3 "$OUT/attach_shared_$i.err")"
    record "{\"attach_shared\": $(result_of "$OUT/attach_shared_$i.out")}"
  done
  say "attach on leases: $(grep -h '^attach' "$OUT"/attach_shared_*.out | sed 's/ bound_bytes.*//' | tr '\n' ';')"
  say "$(grep -h '^verified' "$OUT/bf16_a1.out" | tr '\n' ';')"

  # A library that embeds its constants, bound to the leases anyway: the
  # binding must notice the private copy, swap in the shared tensors and
  # free it. Its memory is measured while it serves.
  if [ "$EMBEDDED" = 1 ]; then
    "$WORKER" --socket "$SOCK" --device cuda:0 --torch-lib "$TORCH_LIB" \
      --model bf16_base --model bf16_head_a --aoti "$WORK/bf16_a_embedded.pt2" \
      --input "$WORK/bf16_input.safetensors" --output "$WORK/out_embedded_leased.safetensors" \
      --iterations 3 --serve >"$OUT/embedded_leased.out" 2>"$OUT/embedded_leased.err" &
    epid=$!
    PIDS+=("$epid")
    if wait_for 120 has_line "$OUT/embedded_leased.out" "^ready"; then
      sleep 0.5
      python3 "$GPU_TESTS/gpumem.py" >"$OUT/gpu_embedded_leased.json"
      record "{\"embedded_leased_pid\": $epid}"
    else
      fail "embedded library on leases not ready: $(tail -n 3 "$OUT/embedded_leased.err")"
    fi
    kill -TERM "$epid"
    wait "$epid" || fail "embedded library on leases exited with $?"
    record "{\"embedded_leased\": $(result_of "$OUT/embedded_leased.out")}"
    grep -h "container_embedded" "$OUT/embedded_leased.err" | tee -a "$LOG" >&2
    python3 "$GPU_TESTS/check_outputs.py" 1e-2 "$WORK/bf16_a_ref.safetensors" \
      "$WORK/out_embedded_leased.safetensors" >"$OUT/acc_embedded_leased.json" ||
      fail "embedded on leases: $(cat "$OUT/acc_embedded_leased.json")"
    record "{\"acc_embedded_leased\": $(cat "$OUT/acc_embedded_leased.json")}"
  fi
  stop_broker
  say "broker stopped with status $?"
fi

# ---- 3. without sharing ------------------------------------------------------
sleep 1
M3=$(mem_used)
say "device memory used before the unshared run: $M3"
declare -A LPID
for name in a1 a2 b1 b2; do
  v=${name:0:1}
  "$WORKER" --device cuda:0 --torch-lib "$TORCH_LIB" \
    --local-weights "$WORK/bf16_base.safetensors" --local-weights "$WORK/bf16_head_$v.safetensors" \
    --aoti "$WORK/bf16_$v.pt2" --input "$WORK/bf16_input.safetensors" \
    --output "$WORK/out_local_$name.safetensors" --serve \
    >"$OUT/local_$name.out" 2>"$OUT/local_$name.err" &
  LPID[$name]=$!
  PIDS+=("$!")
done
for name in a1 a2 b1 b2; do
  wait_for 180 has_line "$OUT/local_$name.out" "^ready" ||
    fail "unshared worker $name not ready: $(tail -n 3 "$OUT/local_$name.err")"
done
sleep 1
M4=$(mem_used)
say "4 unshared workers: device memory used $M4 (+$((M4 - M3)))"
record "{\"mem_unshared\": {\"before\": $M3, \"workers\": $M4}}"
for name in a1 a2 b1 b2; do
  kill -TERM "${LPID[$name]}"
  wait "${LPID[$name]}" || fail "unshared worker $name exited with $?"
  record "{\"local_$name\": $(result_of "$OUT/local_$name.out")}"
done
python3 "$GPU_TESTS/check_outputs.py" 1e-2 "$WORK/bf16_a_ref.safetensors" \
  "$WORK/out_local_a1.safetensors" >"$OUT/acc_local_a.json" || fail "unshared a: $(cat "$OUT/acc_local_a.json")"
record "{\"acc_local_a\": $(cat "$OUT/acc_local_a.json")}"

# ---- 4. the embedded baseline ---------------------------------------------------
if [ "$EMBEDDED" = 1 ] && ! over_budget; then
  for i in 1 2; do
    AOTI_LOG_LOADING=1 "$WORKER" --device cuda:0 --torch-lib "$TORCH_LIB" --own-constants \
      --aoti "$WORK/bf16_a_embedded.pt2" --input "$WORK/bf16_input.safetensors" \
      --output "$WORK/out_embedded_$i.safetensors" --iterations 1 \
      >"$OUT/embedded_$i.out" 2>"$OUT/embedded_$i.err"
    rc=$?
    [ "$rc" = 0 ] || { fail "embedded run $i exited with $rc: $(tail -n 3 "$OUT/embedded_$i.err")"; break; }
    record "{\"attach_embedded\": $(result_of "$OUT/embedded_$i.out")}"
    over_budget && break
  done
  python3 "$GPU_TESTS/check_outputs.py" 1e-2 "$WORK/bf16_a_ref.safetensors" \
    "$WORK/out_embedded_1.safetensors" >"$OUT/acc_embedded.json" || fail "embedded: $(cat "$OUT/acc_embedded.json")"
  record "{\"acc_embedded\": $(cat "$OUT/acc_embedded.json")}"
  say "attach embedded: $(grep -h '^attach' "$OUT"/embedded_[0-9]*.out | sed 's/ bound_bytes.*//' | tr '\n' ';')"
else
  say "embedded baseline not run (compiled=$EMBEDDED, ${SECONDS}s of ${BUDGET}s used)"
fi

# ---- 5. real models (Hugging Face checkpoints) ---------------------------------
# Its own script, so that it can also run alone; WB_GPU_SKIP_REAL=1 skips it.
if [ "${WB_GPU_SKIP_REAL:-0}" != 1 ]; then
  cleanup
  PIDS=()
  step_real || fail "real models: see real_models/real_models.json"
fi

# ---- 6. variants (fine-tunes, the memory budget) --------------------------------
# Its own script, so that it can also run alone; WB_GPU_SKIP_VARIANTS=1 skips it.
if [ "${WB_GPU_SKIP_VARIANTS:-0}" != 1 ]; then
  cleanup
  PIDS=()
  step_variants || fail "variants: see variants/variants.json"
fi

# ---- 7. multi-device features (rollout, publish, sharing, budget) ---------------
# Its own script, so that it can also run alone; WB_GPU_SKIP_FEATURES=1 skips it.
# On one GPU its two-GPU parts are skipped, with the reason.
if [ "${WB_GPU_SKIP_FEATURES:-0}" != 1 ]; then
  cleanup
  PIDS=()
  step_features || fail "features: see multidevice_features/multidevice_features.json"
fi

# ---- 8. results ----------------------------------------------------------------
python3 "$GPU_TESTS/summarize.py" "$RES" "$OUT/gpu.json" "$OUT/share.json" \
  "${#FAILS[@]}" | tee -a "$LOG"
finish
