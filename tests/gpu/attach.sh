#!/usr/bin/env bash
# Process start -> first inference through the broker, against a process
# that loads its own weights, by model size and by tensor count, on the GPU
# test machine (prebuilt binaries, as tests/gpu/run.sh).
#
#   tests/gpu/attach.sh OUT
#
# By size (WB_ATTACH_GIBS, "0.1 1 8", empty for none: the bf16 backbone of
# examples/compile_models.py, variant a; 0.1 gives its smallest, one
# 8192 x 8192 layer, 128 MiB): WB_ATTACH_RUNS (3) fresh wb-aoti-worker
# processes each way, one at a time:
#   broker     leases from a cuda broker (--model base --model head)
#   safetensors  its own copy of the same files (--local-weights)
#   embedded   a library with its constants inside (--own-constants; compiled
#              up to WB_ATTACH_EMBEDDED_MAX_GIB, 1: larger ones take longer
#              to compile than this budget allows)
#   broker_eager the broker way under CUDA_MODULE_LOADING=EAGER
# The broker ways run 3 inferences, the others 1. The worker reports its own
# steps (ms): cuda_init (cudaSetDevice + cudaFree), torch_load (libtorch
# dlopen'd, as in a serving process), connect, lease_and_open, load_local,
# container (library_load of it: the .pt2 unpacked and the .so dlopen'd),
# first_run, median_run (first_run - median_run: the first inference's own
# start-up). to_first_output_ms is
# their sum; floor_ms = cuda_init + torch_load + library_load, the part every
# way pays; beyond_floor_ms = to_first_output_ms - floor_ms (target for the
# broker: <= 20 ms); wall_ms is the process from fork to exit, timed here.
#
# By tensor count (WB_ATTACH_COUNTS, "100 10000 100000"; WB_ATTACH_COUNT_BYTES,
# 1e8 bytes in all): no AOTI model is compiled with that many constants
# (compiling takes far too long); bench/attach.c measures the part of the
# attach that grows with the tensors: context, connect, acquire (the lease
# and its table, the slab opened) and every tensor looked up by name
# (--lookup), against --local (the same file read and copied per tensor).
#
# ~64 GB is not measured: the machine's 64 GiB disk cannot hold the
# checkpoint and the compiled model (the sizes reached are in attach.json).
#
# Writes OUT/attach.json and logs; prints a table last. About 4-5 minutes
# (compiling ~2-3 of them, the 8 GiB model the longest).
set -uo pipefail

OUT=${1:?usage: tests/gpu/attach.sh OUT}
# shellcheck source=tests/gpu/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"
read -r -a GIBS <<<"${WB_ATTACH_GIBS-0.1 1 8}"
read -r -a COUNTS <<<"${WB_ATTACH_COUNTS:-100 10000 100000}"
COUNT_BYTES=${WB_ATTACH_COUNT_BYTES:-1e8}
RUNS=${WB_ATTACH_RUNS:-3}
EMB_MAX=${WB_ATTACH_EMBEDDED_MAX_GIB:-1}
RES=$OUT/runs.jsonl
: >"$RES"

need_bins "$WBROKERD" "$WBCTL" "$WORKER"
python3 "$ROOT/tests/gpu/gpumem.py" >"$OUT/gpu.json" || { say "no GPU visible"; exit 2; }

# ---- compile every size at once (and write the tensor-count files) ---------
declare -A CPID
for g in "${GIBS[@]}"; do
  emb=
  python3 -c "import sys; sys.exit(not float('$g') <= float('$EMB_MAX'))" && emb=embedded
  models "$WORK/models_${g}gib" "$g" $emb >"$OUT/models_$g.log" 2>&1 &
  CPID[$g]=$!
  PIDS+=("$!")
done
for k in "${COUNTS[@]}"; do
  python3 "$ROOT/tests/gpu/make_checkpoint.py" "$WORK/attach_n$k.safetensors" \
    --bytes "$COUNT_BYTES" --tensors "$k" >>"$OUT/checkpoints.log" 2>&1 ||
    fail "cannot write the $k-tensor checkpoint: $(tail -n 2 "$OUT/checkpoints.log")"
done
for g in "${GIBS[@]}"; do
  wait "${CPID[$g]}" || fail "models of $g GiB: $(tail -n 3 "$OUT/models_$g.log")"
  cat "$OUT/models_$g.log" >>"$LOG"
done

# run_worker KIND SIZE DIR RUN ARGS...: one fresh worker to its first output;
# appends its result and the wall time to runs.jsonl.
run_worker() {
  local kind=$1 size=$2 dir=$3 run=$4 t0 t1 rc
  shift 4
  t0=$(date +%s%N)
  env ${WORKER_ENV:+"$WORKER_ENV"} "$WORKER" --device cuda:0 --torch-lib "$TORCH_LIB" --input "$dir/bf16_input.safetensors" \
    "$@" >"$OUT/${kind}_${size}_$run.out" 2>"$OUT/${kind}_${size}_$run.err"
  rc=$?
  t1=$(date +%s%N)
  if [ "$rc" != 0 ]; then
    fail "$kind at $size GiB, run $run: exit $rc: $(tail -n 3 "$OUT/${kind}_${size}_$run.err")"
    return 1
  fi
  printf '{"what": "size", "kind": "%s", "gib": %s, "run": %d, "wall_ms": %.1f, "result": %s}\n' \
    "$kind" "$size" "$run" "$(((t1 - t0) / 1000))e-3" \
    "$(grep '^result ' "$OUT/${kind}_${size}_$run.out" | tail -n 1 | cut -d' ' -f2-)" >>"$RES"
}

# ---- by size ----------------------------------------------------------------
for g in "${GIBS[@]}"; do
  d=$WORK/models_${g}gib
  [ -f "$d/.gib" ] || { say "no models of $g GiB: skipped"; continue; }
  cat "$d"/bf16_base.safetensors "$d"/bf16_head_a.safetensors >/dev/null # page cache
  start_broker "$WORK/attach.sock" "$OUT/broker_$g.log" \
    --model "bf16_base=$d/bf16_base.safetensors" --model "bf16_head_a=$d/bf16_head_a.safetensors" ||
    continue
  for ((r = 1; r <= RUNS; r++)); do
    run_worker broker "$g" "$d" "$r" --socket "$SOCK" --model bf16_base --model bf16_head_a \
      --aoti "$d/bf16_a.pt2" --iterations 3
    # The same with every CUDA module loaded when it is registered: how much
    # of the first run is lazy loading (CUDA_MODULE_LOADING, CUDA 11.7+).
    WORKER_ENV=CUDA_MODULE_LOADING=EAGER run_worker broker_eager "$g" "$d" "$r" --socket "$SOCK" \
      --model bf16_base --model bf16_head_a --aoti "$d/bf16_a.pt2" --iterations 3
    run_worker safetensors "$g" "$d" "$r" --local-weights "$d/bf16_base.safetensors" \
      --local-weights "$d/bf16_head_a.safetensors" --aoti "$d/bf16_a.pt2"
    if [ -f "$d/bf16_a_embedded.pt2" ]; then
      run_worker embedded "$g" "$d" "$r" --own-constants --aoti "$d/bf16_a_embedded.pt2"
    fi
  done
  stop_broker
  say "size $g GiB: done"
done

# ---- by tensor count ----------------------------------------------------------
if [ -x "$PROBE" ]; then
  MODELS=()
  for k in "${COUNTS[@]}"; do
    [ -f "$WORK/attach_n$k.safetensors" ] && MODELS+=(--model "n$k=$WORK/attach_n$k.safetensors")
  done
  if start_broker "$WORK/attach.sock" "$OUT/broker_counts.log" "${MODELS[@]}"; then
    for k in "${COUNTS[@]}"; do
      for ((r = 1; r <= RUNS; r++)); do
        for mode in acquire lookup local; do
          args=(--socket "$SOCK" --model "n$k")
          [ "$mode" = lookup ] && args+=(--lookup)
          [ "$mode" = local ] && args=(--local "$WORK/attach_n$k.safetensors")
          t0=$(date +%s%N)
          if j=$("$PROBE" "${args[@]}" 2>>"$OUT/probe.err"); then
            t1=$(date +%s%N)
            printf '{"what": "count", "kind": "%s", "tensors": %s, "run": %d, "wall_ms": %s, "result": %s}\n' \
              "$mode" "$k" "$r" "$(((t1 - t0) / 1000))e-3" "$j" >>"$RES"
          else
            fail "probe $mode at $k tensors: $(tail -n 2 "$OUT/probe.err")"
          fi
        done
      done
    done
    stop_broker
  fi
else
  say "no $PROBE: the tensor-count part is not measured"
fi

python3 "$ROOT/tests/gpu/attach_summary.py" "$RES" "$OUT/attach.json" --gpu "$OUT/gpu.json" |
  tee -a "$LOG" || fail "summary"
for f in "${FAILS[@]}"; do echo "failed: $f" | tee -a "$LOG"; done
[ "${#FAILS[@]}" = 0 ]
