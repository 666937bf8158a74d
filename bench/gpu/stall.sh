#!/usr/bin/env bash
# How much other work on the GPU stalls a process that serves: the stall
# benchmark, on the GPU test machine (prebuilt binaries, as tests/gpu/run.sh).
#
#   bench/gpu/stall.sh OUT
#
# The victim (bench/gpu/stall_victim.py, torch) runs bf16 matmuls of about
# 1.5 ms an iteration, waits for its stream after each and records every
# iteration's wall time. It runs twice: on the legacy default stream and on
# a non-blocking stream. Each time, these conditions run one after another,
# each a few times, and the iterations that overlap one are its samples:
#
#   baseline                 nothing else
#   floor_ctx_1, floor_ctx_8 1 or 8 processes at once that only create a CUDA
#                            context (cudaSetDevice + cudaFree(NULL)) and exit
#   inproc_aoti_default      inside the victim, a second AOTI container of the
#                            same weights with its constants in the .so,
#                            created the default way (the library's
#                            CreateWithDevice: synchronous copies from
#                            pageable memory)
#   inproc_pinned_staging    inside the victim, the same weights' bytes through
#                            pinned staging buffers, 64 MiB chunks, on a
#                            low-priority non-blocking stream
#   broker_load_8gib         the broker (another process) loading an 8 GiB
#                            checkpoint (wbctl load), then unloading it
#   attach_1, attach_1_verify, attach_8, attach_8_verify
#                            1 or 8 wb-aoti-worker processes at once: context,
#                            lease, container, first inference, exit; _verify
#                            with wb_lease_verify of every leased tensor
#
# With WB_STALL_SET=vmm, the run is the descriptor-lease one instead: a
# second broker serves the same models with --cuda-slab vmm (read-only
# cuMem mappings passed as descriptors) and the conditions are baseline, the
# floors, attach_1 and attach_8 on the legacy broker for comparison, and
#   attach_vmm_1, attach_vmm_1_verify, attach_vmm_8, attach_vmm_8_verify
#                            the same attaches through the vmm broker;
# it writes OUT/stall_vmm.json and OUT/stall_vmm_series_*.json.gz.
# With WB_STALL_SET=load, only the broker's load: baseline, the floors and
# broker_load_8gib (no model is compiled; a broker without models loads the
# checkpoint), to check the loader's effect on a victim after a change to it;
# it writes OUT/stall_load.json and OUT/stall_load_series_*.json.gz.
#
# Writes OUT/stall.json (bench/gpu/stall_summary.py: p50/p99/max per
# condition and stream, p99_ratio against the baseline of the same stream,
# p99_ratio_to_floor for the attach and broker conditions against the floor
# with as many processes), OUT/stall_series_{legacy,nonblocking}.json.gz
# (every iteration, for bench/plot.py), logs; prints the table last.
#
# Environment: as tests/gpu/lib.sh; WB_STALL_GIB (the model, 2), WB_STALL_LOAD_GIB
# (the broker's load, 8), WB_STALL_REPS (repetitions of the single-process
# attaches, 5; the 8-process ones half as many, the floor's twice as many
# as the attaches of its process count), WB_STALL_BUDGET_S
# (330: later conditions get fewer repetitions once it is spent).
# About 4-5 minutes: compiling ~80 s, each stream mode ~70 s.
set -uo pipefail

OUT=${1:?usage: bench/gpu/stall.sh OUT}
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/../../tests/gpu/lib.sh"
GIB=${WB_STALL_GIB:-2}
LOAD_GIB=${WB_STALL_LOAD_GIB:-8}
REPS=${WB_STALL_REPS:-5}
BUDGET=${WB_STALL_BUDGET_S:-330}
SET=${WB_STALL_SET:-all}
case $SET in
  all) PREFIX=stall ;;
  vmm) PREFIX=stall_vmm ;;
  load) PREFIX=stall_load ;;
  *) echo "WB_STALL_SET: all, vmm or load, not '$SET'" >&2; exit 2 ;;
esac
MD=$WORK/models_${GIB}gib # shared with memory.sh when the sizes agree
BIG=$WORK/stall_load.safetensors
FIFO=$WORK/stall.ctl

need_bins "$WBROKERD" "$WBCTL" "$WORKER"
[ -x "$PROBE" ] || say "no $PROBE: the floor uses python ctypes instead"
gpu_json "$OUT/gpu.json"
say "gpu: $(cat "$OUT/gpu.json")"

# ---- models and the checkpoint the broker loads ------------------------------
MODELS=(--model "bf16_base=$MD/bf16_base.safetensors" --model "bf16_head_a=$MD/bf16_head_a.safetensors")
write_big() {
  python3 "$GPU_BENCH/make_checkpoint.py" "$BIG" --bytes "$((LOAD_GIB << 30))" --tensors 152 \
    >"$OUT/checkpoint.json" 2>&1
}
if [ "$SET" = load ]; then
  MODELS=()
  write_big || { say "cannot write $BIG: $(cat "$OUT/checkpoint.json")"; exit 1; }
  cat "$BIG" >/dev/null
elif [ "$SET" = all ]; then
  write_big &
  ckpid=$!
  PIDS+=("$ckpid")
  models "$MD" "$GIB" embedded || exit 1
  wait "$ckpid" || { say "cannot write $BIG: $(cat "$OUT/checkpoint.json")"; exit 1; }
  # Warm the page cache: the load is from memory, as in bench/RESULTS.md.
  cat "$BIG" "$MD/bf16_base.safetensors" "$MD"/bf16_a*.pt2 >/dev/null
else
  models "$MD" "$GIB" || exit 1
  cat "$MD/bf16_base.safetensors" "$MD"/bf16_a*.pt2 >/dev/null
  start_broker "$WORK/stall_vmm.sock" "$OUT/broker_vmm.log" --cuda-slab vmm "${MODELS[@]}" || exit 1
  VMM_SOCK=$SOCK VMM_BROKER=$BROKER
  say "vmm broker: $(ctl models | tr -s ' \n' ' ')"
fi

# The main broker uses the default transport (cuda-vmm where the device has
# it); the vmm set compares its vmm broker with a legacy IPC one.
LEGACY=()
[ "$SET" = vmm ] && LEGACY=(--cuda-slab ipc)
start_broker "$WORK/stall.sock" "$OUT/broker.log" "${LEGACY[@]}" "${MODELS[@]}" || exit 1
say "broker transport: $(grep -o 'cuda_slab=[a-z-]* access=[a-z]*' "$OUT/broker.log" | head -n 1)"

attach_one() { # attach_one OUTFILE [--verify]
  "$WORKER" --socket "${ATTACH_SOCK:-$SOCK}" --device cuda:0 --torch-lib "$TORCH_LIB" \
    --model bf16_base --model bf16_head_a --aoti "$MD/bf16_a.pt2" \
    --input "$MD/bf16_input.safetensors" --iterations 1 "${@:2}" >"$1" 2>&1
}

# procs N NAME CMD...: N copies of CMD at once, labelled NAME; fails loudly.
procs() {
  local n=$1 name=$2 i rc=0 p
  shift 2
  local ps=()
  echo "mark $name" >&3
  for ((i = 0; i < n; i++)); do
    "$@" "$OUT/proc_${name}_$i.log" &
    ps+=("$!")
  done
  for p in "${ps[@]}"; do wait "$p" || rc=$?; done
  echo "mark -" >&3
  [ "$rc" = 0 ] || fail "$name: a process exited with $rc: $(tail -n 3 "$OUT/proc_${name}_0.log")"
}
ctx_proc() { ctx_only >"$1" 2>&1; }
attach_proc() { attach_one "$1"; }
attach_verify_proc() { attach_one "$1" --verify; }
vmm_proc() { ATTACH_SOCK=$VMM_SOCK attach_one "$1"; }
vmm_verify_proc() { ATTACH_SOCK=$VMM_SOCK attach_one "$1" --verify; }

# inproc KIND PATH NAME: a load inside the victim; waits for its "done".
inproc() {
  local before
  before=$(count_lines "$VOUT" "^done $3 ")
  echo "$1 $2 $3" >&3
  wait_for 120 eval "[ \$(count_lines \"$VOUT\" \"^done $3 \") -gt $before ]" ||
    fail "$3: no 'done' from the victim within 120 s"
  grep "^done $3 " "$VOUT" | tail -n 1 | grep -q " ok$" ||
    fail "$3: $(grep "^done $3 " "$VOUT" | tail -n 1)"
}

no_model() { ! ctl models --json | grep -q "\"name\": *\"$1\""; }

reps() { # reps N: N, or 1 once the budget is spent
  if over_budget; then echo 1; else echo "$1"; fi
}

run_mode() {
  local mode=$1 r
  VOUT=$OUT/victim_$mode.out
  rm -f "$FIFO"
  mkfifo "$FIFO"
  exec 3<>"$FIFO"
  python3 "$GPU_BENCH/stall_victim.py" --stream "$mode" --control "$FIFO" \
    --series "$OUT/${PREFIX}_series_$mode.json.gz" --scratch "$WORK/stall_unpacked" \
    >"$VOUT" 2>"$OUT/victim_$mode.err" &
  local vpid=$!
  PIDS+=("$vpid")
  wait_for 120 has_line "$VOUT" "^ready" ||
    { fail "victim ($mode) not ready: $(tail -n 3 "$OUT/victim_$mode.err")"; exec 3>&-; return 1; }
  say "victim ($mode): $(grep '^ready' "$VOUT")"
  sleep 1
  echo "mark baseline" >&3
  sleep 4
  echo "mark -" >&3
  sleep 0.3
  # The floor's processes are short: twice the repetitions, for samples.
  for ((r = 0; r < $(reps $((2 * REPS))); r++)); do procs 1 floor_ctx_1 ctx_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$REPS"); r++)); do procs 8 floor_ctx_8 ctx_proc; sleep 0.3; done
  if [ "$SET" = vmm ]; then
    vmm_conditions
    return
  fi
  if [ "$SET" = load ]; then
    broker_loads
    end_mode
    return
  fi
  for ((r = 0; r < $(reps 2); r++)); do
    [ -f "$MD/bf16_a_embedded.pt2" ] || break
    inproc aoti "$MD/bf16_a_embedded.pt2" inproc_aoti_default
    sleep 0.5
  done
  for ((r = 0; r < $(reps 2); r++)); do
    inproc pinned "$MD/bf16_base.safetensors" inproc_pinned_staging
    sleep 0.5
  done
  broker_loads
  for ((r = 0; r < $(reps "$REPS"); r++)); do procs 1 attach_1 attach_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$REPS"); r++)); do procs 1 attach_1_verify attach_verify_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$(((REPS + 1) / 2))"); r++)); do procs 8 attach_8 attach_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$(((REPS + 1) / 2))"); r++)); do procs 8 attach_8_verify attach_verify_proc; sleep 0.3; done
  end_mode
}

# The broker (another process) loads the checkpoint, then unloads it.
broker_loads() {
  local r
  for ((r = 0; r < $(reps 2); r++)); do
    echo "mark broker_load_${LOAD_GIB}gib" >&3
    ctl load big "$BIG" >>"$OUT/load_$mode.log" 2>&1 || fail "wbctl load big: $(tail -n 2 "$OUT/load_$mode.log")"
    echo "mark -" >&3
    ctl unload big >>"$OUT/load_$mode.log" 2>&1
    wait_for 30 no_model big || fail "model big still there 30 s after its unload"
    sleep 0.5
  done
}

# The attaches of WB_STALL_SET=vmm, legacy ones first for comparison.
vmm_conditions() {
  local r
  for ((r = 0; r < $(reps "$REPS"); r++)); do procs 1 attach_1 attach_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$REPS"); r++)); do procs 1 attach_vmm_1 vmm_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$REPS"); r++)); do procs 1 attach_vmm_1_verify vmm_verify_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$(((REPS + 1) / 2))"); r++)); do procs 8 attach_8 attach_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$(((REPS + 1) / 2))"); r++)); do procs 8 attach_vmm_8 vmm_proc; sleep 0.3; done
  for ((r = 0; r < $(reps "$(((REPS + 1) / 2))"); r++)); do
    procs 8 attach_vmm_8_verify vmm_verify_proc
    sleep 0.3
  done
  end_mode
}

end_mode() {
  echo "quit" >&3
  wait "$vpid" || fail "victim ($mode) exited with $?: $(tail -n 3 "$OUT/victim_$mode.err")"
  exec 3>&-
  rm -f "$FIFO"
  grep -h '^done\|^wrote' "$VOUT" | tee -a "$LOG" >&2
}

for mode in legacy nonblocking; do
  run_mode "$mode"
  say "stream mode $mode done"
done
grep -h '^attach\|^verified' "$OUT"/proc_attach_1_verify_0.log >>"$LOG" 2>/dev/null
grep -h '^event=model_ready\|model_ready' "$OUT/broker.log" | tail -n 4 >>"$LOG"
stop_broker
if [ "$SET" = vmm ]; then
  grep -h '^attach\|^verified' "$OUT"/proc_attach_vmm_1_verify_0.log >>"$LOG" 2>/dev/null
  kill -TERM "$VMM_BROKER" 2>/dev/null
  wait "$VMM_BROKER" 2>/dev/null
fi
rm -rf "$BIG" "$WORK/stall_unpacked" # disk, quick to make again

python3 "$GPU_BENCH/stall_summary.py" "$OUT/$PREFIX.json" "$OUT"/"$PREFIX"_series_*.json.gz \
  --floor "$FLOOR_IMPL" --gpu "$OUT/gpu.json" | tee -a "$LOG" || fail "summary"
finish
