#!/usr/bin/env bash
# Process start -> first inference through the broker, against a process
# that loads its own weights, by model size and by tensor count, on the GPU
# test machine (prebuilt binaries, as tests/gpu/run.sh).
#
#   bench/gpu/attach.sh OUT
#
# By size (WB_ATTACH_GIBS, "0.1 1 8", empty for none: the bf16 backbone of
# examples/compile_models.py, variant a; 0.1 gives its smallest, one
# 8192 x 8192 layer, 128 MiB): WB_ATTACH_RUNS (3) fresh wb-aoti-worker
# processes each way, one at a time:
#   broker     leases from a cuda broker (--model base --model head)
#   safetensors  its own copy of the same files (--local-weights: one
#              allocation of device memory, filled through pinned chunks)
#   embedded   a library with its constants inside (--own-constants; compiled
#              up to WB_ATTACH_EMBEDDED_MAX_GIB, 1: larger ones take longer
#              to compile than this budget allows)
#   broker_eager the broker way under CUDA_MODULE_LOADING=EAGER
#   floor_run  the same tensors bound to device memory the worker allocates
#              and leaves uninitialised (--uninit-weights: no weights read,
#              copied or leased; the allocation is its own step,
#              alloc_local): the floor of the first output, the first
#              inference's own start-up included
# The broker ways and floor_run run 3 inferences, the others 1. The worker
# reports its own steps (ms): cuda_init (cudaSetDevice + cudaFree),
# torch_load (libtorch dlopen'd, as in a serving process), connect,
# lease_and_open, load_local, alloc_local, container (library_load of it:
# the .pt2 unpacked and the .so dlopen'd), first_run, median_run (first_run
# - median_run: the first inference's own start-up). to_first_output_ms is
# their sum; floor_ms = cuda_init + torch_load + library_load, the part every
# way pays; beyond_floor_ms = to_first_output_ms - floor_ms (target for the
# broker: <= 20 ms); for the broker, beyond_floor_run_ms =
# to_first_output_ms - (floor_run's to_first_output_ms - its alloc_local),
# medians of the same size (target <= 20 ms: met_vs_floor_run); wall_ms is
# the process from fork to exit, timed here.
#
# Sizes above 16 GiB (60 GiB = 64.4 GB, the ~64 GB case): the checkpoint and
# the compiled model are written to WB_ATTACH_BIG_DIR (/dev/shm/wbattach: a
# tmpfs, the machine's disk is too small; its free space is checked first)
# and removed at the end; the backbone has fewer, larger layers
# (WB_ATTACH_BIG_DIM, 32768: 2 GiB each, 30 layers for 60 GiB), only
# variant a is compiled, the weights are made on the GPU and written one
# tensor at a time (host memory never holds them besides the tmpfs), and
# WB_ATTACH_BIG_RUNS (2) runs are made each way. Every compile ends before
# the first broker starts, so the GPU holds at most the broker's copy and
# one worker's.
#
# By tensor count (WB_ATTACH_COUNTS, "100 10000 100000", empty for none;
# WB_ATTACH_COUNT_BYTES, 1e8 bytes in all): no AOTI model is compiled with
# that many constants (compiling takes far too long); bench/attach.c measures the part of the
# attach that grows with the tensors: context, connect, acquire (the lease
# and its table, the slab opened) and every tensor looked up by name
# (--lookup: one wb_lease_find per name; lookup_many: --lookup-many, every
# name in one wb_lease_find_many), against --local (the same file read and
# copied per tensor).
#
# Writes OUT/attach.json and logs; prints a table last. About 4-5 minutes
# with the defaults (compiling ~2-3 of them, the 8 GiB model the longest);
# WB_ATTACH_GIBS=60 alone about 3-5. Runs stop, failing, once the script has
# run WB_ATTACH_BUDGET_S (540) seconds.
set -uo pipefail

OUT=${1:?usage: bench/gpu/attach.sh OUT}
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/../../tests/gpu/lib.sh"
read -r -a GIBS <<<"${WB_ATTACH_GIBS-0.1 1 8}"
read -r -a COUNTS <<<"${WB_ATTACH_COUNTS-100 10000 100000}"
COUNT_BYTES=${WB_ATTACH_COUNT_BYTES:-1e8}
RUNS=${WB_ATTACH_RUNS:-3}
EMB_MAX=${WB_ATTACH_EMBEDDED_MAX_GIB:-1}
BIG_DIR=${WB_ATTACH_BIG_DIR:-/dev/shm/wbattach}
BIG_DIM=${WB_ATTACH_BIG_DIM:-32768}
BIG_RUNS=${WB_ATTACH_BIG_RUNS:-2}
BUDGET=${WB_ATTACH_BUDGET_S:-540}
RES=$OUT/runs.jsonl
: >"$RES"

need_bins "$WBROKERD" "$WBCTL" "$WORKER"
gpu_json "$OUT/gpu.json"

# is_big G: a size whose files go to BIG_DIR.
is_big() { python3 -c "import sys; sys.exit(not float('$1') > 16)"; }
model_dir() {
  if is_big "$1"; then echo "$BIG_DIR/models_${1}gib"; else echo "$WORK/models_${1}gib"; fi
}
# What was made in BIG_DIR goes at the end, also when the script fails (a
# tmpfs holds memory); BIG_DIR itself only when this run created it.
BIG_MADE=()
BIG_DIR_CREATED=
big_cleanup() {
  local d
  for d in "${BIG_MADE[@]}"; do rm -rf -- "$d"; done
  [ -n "$BIG_DIR_CREATED" ] && rmdir -- "$BIG_DIR" 2>/dev/null
  return 0
}
trap 'cleanup; big_cleanup' EXIT
trap 'exit 143' TERM INT

# ---- compile every size at once (and write the tensor-count files) ---------
declare -A CPID
for g in "${GIBS[@]}"; do
  emb=
  python3 -c "import sys; sys.exit(not float('$g') <= float('$EMB_MAX'))" && emb=embedded
  extra=()
  if is_big "$g"; then
    if [ ! -d "$BIG_DIR" ]; then
      mkdir -p "$BIG_DIR" || { fail "cannot create $BIG_DIR"; continue; }
      BIG_DIR_CREATED=1
    fi
    # The checkpoint, the head, the package and its unpacked copy, with 1 GiB
    # to spare; files of an earlier run of the same size count as free.
    need=$(python3 -c "print(int((float('$g') + 1) * (1 << 30)))")
    have=$(df -B1 --output=avail "$BIG_DIR" | tail -n 1 | tr -d ' ')
    held=$(du -sb "$(model_dir "$g")" 2>/dev/null | cut -f1)
    if [ "$((have + ${held:-0}))" -lt "$need" ]; then
      fail "$BIG_DIR has $((have + ${held:-0})) bytes free, the $g GiB model needs $need: skipped (a bigger tmpfs: mount -o remount,size=110g /dev/shm)"
      continue
    fi
    say "$g GiB: files in $(model_dir "$g") ($have bytes free there, $need needed)"
    BIG_MADE+=("$(model_dir "$g")")
    extra=(--dim "$BIG_DIM" --variants a)
  fi
  models "$(model_dir "$g")" "$g" "$emb" "${extra[@]}" >"$OUT/models_$g.log" 2>&1 &
  CPID[$g]=$!
  PIDS+=("$!")
done
for k in "${COUNTS[@]}"; do
  python3 "$GPU_BENCH/make_checkpoint.py" "$WORK/attach_n$k.safetensors" \
    --bytes "$COUNT_BYTES" --tensors "$k" >>"$OUT/checkpoints.log" 2>&1 ||
    fail "cannot write the $k-tensor checkpoint: $(tail -n 2 "$OUT/checkpoints.log")"
done
for g in "${GIBS[@]}"; do
  [ -n "${CPID[$g]:-}" ] || continue
  wait "${CPID[$g]}" || fail "models of $g GiB: $(tail -n 3 "$OUT/models_$g.log")"
  cat "$OUT/models_$g.log" >>"$LOG"
done
say "compiled: $(for g in "${GIBS[@]}"; do printf '%s GiB %s; ' "$g" "$(cat "$(model_dir "$g")/.gib" 2>/dev/null || echo none)"; done)"

# run_worker KIND SIZE DIR RUN ARGS...: one fresh worker to its first output;
# appends its result and the wall time to runs.jsonl.
run_worker() {
  local kind=$1 size=$2 dir=$3 run=$4 t0 t1 rc
  shift 4
  if over_budget; then
    fail "$kind at $size GiB, run $run: not run, the budget of $BUDGET s is spent"
    return 1
  fi
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
  d=$(model_dir "$g")
  [ -f "$d/.gib" ] || { say "no models of $g GiB: skipped"; continue; }
  n=$RUNS
  if is_big "$g"; then
    n=$BIG_RUNS # a tmpfs: nothing to bring into the page cache
  else
    cat "$d"/bf16_base.safetensors "$d"/bf16_head_a.safetensors >/dev/null # page cache
  fi
  start_broker "$WORK/attach.sock" "$OUT/broker_$g.log" \
    --model "bf16_base=$d/bf16_base.safetensors" --model "bf16_head_a=$d/bf16_head_a.safetensors" ||
    continue
  say "size $g GiB: broker ready after $SECONDS s"
  for ((r = 1; r <= n; r++)); do
    run_worker broker "$g" "$d" "$r" --socket "$SOCK" --model bf16_base --model bf16_head_a \
      --aoti "$d/bf16_a.pt2" --iterations 3
    # The same with every CUDA module loaded when it is registered: how much
    # of the first run is lazy loading (CUDA_MODULE_LOADING, CUDA 11.7+).
    WORKER_ENV=CUDA_MODULE_LOADING=EAGER run_worker broker_eager "$g" "$d" "$r" --socket "$SOCK" \
      --model bf16_base --model bf16_head_a --aoti "$d/bf16_a.pt2" --iterations 3
    # The floor: the same tensors, uninitialised memory of the worker's own.
    run_worker floor_run "$g" "$d" "$r" --uninit-weights "$d/bf16_base.safetensors" \
      --uninit-weights "$d/bf16_head_a.safetensors" --aoti "$d/bf16_a.pt2" --iterations 3
    run_worker safetensors "$g" "$d" "$r" --local-weights "$d/bf16_base.safetensors" \
      --local-weights "$d/bf16_head_a.safetensors" --aoti "$d/bf16_a.pt2"
    if [ -f "$d/bf16_a_embedded.pt2" ]; then
      run_worker embedded "$g" "$d" "$r" --own-constants --aoti "$d/bf16_a_embedded.pt2"
    fi
  done
  stop_broker
  say "size $g GiB: done"
  if is_big "$g"; then rm -rf -- "$d"; fi # the tmpfs's memory back now
done

# ---- by tensor count ----------------------------------------------------------
if [ "${#COUNTS[@]}" = 0 ]; then
  say "WB_ATTACH_COUNTS is empty: the tensor-count part is not measured"
elif [ -x "$PROBE" ]; then
  MODELS=()
  for k in "${COUNTS[@]}"; do
    [ -f "$WORK/attach_n$k.safetensors" ] && MODELS+=(--model "n$k=$WORK/attach_n$k.safetensors")
  done
  if start_broker "$WORK/attach.sock" "$OUT/broker_counts.log" "${MODELS[@]}"; then
    for k in "${COUNTS[@]}"; do
      for ((r = 1; r <= RUNS; r++)); do
        for mode in acquire lookup lookup_many local; do
          args=(--socket "$SOCK" --model "n$k")
          [ "$mode" = lookup ] && args+=(--lookup)
          [ "$mode" = lookup_many ] && args+=(--lookup-many)
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

python3 "$GPU_BENCH/attach_summary.py" "$RES" "$OUT/attach.json" --gpu "$OUT/gpu.json" |
  tee -a "$LOG" || fail "summary"
finish
