# shellcheck shell=bash disable=SC2034
# (SC2034: the variables set here are for the scripts that source it.)
# The preamble of every GPU script, the correctness scripts of tests/gpu/ and
# the benchmarks of bench/gpu/ alike (sourced after OUT is set): paths of the
# binaries and libraries, OUT and the log, logging and failures, waiting,
# the broker, the budget, the test models.
#
# A script may set before sourcing it:
#   LOG_NAME      the log's file name in OUT (default run.log)
#   WB_GPU_BIN, WB_GPU_LIB, WB_GPU_WORK  defaults of its own (see below)
#   GPU_TORCH=0   torch is not needed: TORCH_LIB is left empty
#   GPU_LD_PATH=0 LD_LIBRARY_PATH is left as the caller set it
# and after: RES (a JSON-lines file that record() appends to), BUDGET (the
# seconds after which optional steps are skipped: over_budget, budget_left,
# within), BROKER_ARGS (start_broker's options before the script's own).
#
# Environment: WB_GPU_BIN, WB_GPU_LIB (default .device/ao/{bin,lib}),
# WB_GPU_WORK (scratch, default /tmp/wbgpu).

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
GPU_TESTS=$ROOT/tests/gpu
GPU_BENCH=$ROOT/bench/gpu
BIN=${WB_GPU_BIN:-$ROOT/.device/ao/bin}
LIB=${WB_GPU_LIB:-$ROOT/.device/ao/lib}
WORK=${WB_GPU_WORK:-/tmp/wbgpu}
LOG=$OUT/${LOG_NAME:-run.log}
mkdir -p "$WORK"
: >"$LOG"
export PYTHONUNBUFFERED=1
TORCH_LIB=
if [ "${GPU_TORCH:-1}" != 0 ]; then
  TORCH_LIB=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') ||
    { echo "no torch in python3" >&2; exit 2; }
fi
# fallback/ holds Debian builds of libraries a machine may lack; the
# system's own come first.
if [ "${GPU_LD_PATH:-1}" != 0 ]; then
  export LD_LIBRARY_PATH=$LIB:$ROOT/.device/lib${TORCH_LIB:+:$TORCH_LIB}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}:$LIB/../fallback
fi
WBROKERD=$BIN/wbrokerd
WBCTL=$BIN/wbctl
WORKER=$BIN/wb-aoti-worker
DEMO=$BIN/wb-demo-worker
PROBE=$BIN/wb_bench_attach
PIDS=()
FAILS=()
BUDGET=
# --no-slab-pool: the scripts' memory checks count what the broker holds, and
# a kept slab would stay for its 30 s; with_slab_pool (publish.sh,
# bench/gpu/pool_bench.sh) gives the broker its pool back.
BROKER_ARGS=(--backend cuda --device 0 --heartbeat-ms 200 --stale-ms 3000 --no-slab-pool)
with_slab_pool() {
  local a kept=()
  for a in "${BROKER_ARGS[@]}"; do [ "$a" = --no-slab-pool ] || kept+=("$a"); done
  BROKER_ARGS=("${kept[@]}")
}
# A prefix for long-lived children: with it the kernel SIGKILLs them when
# this script dies, even of a SIGKILL that runs no trap (setpriv, where it
# has --pdeathsig).
ORPHAN_KILL=()
setpriv --help 2>/dev/null | grep -q -- --pdeathsig && ORPHAN_KILL=(setpriv --pdeathsig KILL --)

say() { printf '[%4ds] %s\n' "$SECONDS" "$*" | tee -a "$LOG" >&2; }
fail() {
  say "FAIL: $*"
  FAILS+=("$*")
}
# finish: every failure into the log, last; the script's status (0: none).
finish() {
  local f
  for f in "${FAILS[@]}"; do echo "failed: $f" | tee -a "$LOG"; done
  [ "${#FAILS[@]}" = 0 ]
}
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
# wait_for SECS CMD...: polls CMD every 0.05 s.
wait_for() {
  local until=$((SECONDS + $1))
  shift
  while ! "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -ge "$until" ] && return 1
    sleep 0.05
  done
}
has_line() { grep -q -- "$2" "$1"; }
record() { printf '%s\n' "$1" >>"${RES:?record needs RES}"; }
# py EXPR < JSON: evaluates EXPR with the document bound to d.
py() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
count_lines() { grep -c -- "$2" "$1" 2>/dev/null || true; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# gpu_json FILE: NVML's view of GPU 0 (gpumem.py) into FILE; exits 2 when
# no GPU is visible.
gpu_json() { python3 "$GPU_TESTS/gpumem.py" >"$1" || { say "no GPU visible"; exit 2; }; }
# mem_used [GPU]: NVML's used bytes of a GPU (default 0).
# shellcheck disable=SC2120
mem_used() { python3 "$GPU_TESTS/gpumem.py" ${1:+"$1"} | py "d['used']"; }
ctl() { "$WBCTL" --socket "$SOCK" "$@"; }

# The budget (BUDGET seconds since the script started; none when empty).
over_budget() { [ -n "$BUDGET" ] && [ "$SECONDS" -ge "$BUDGET" ]; }
# budget_left: seconds of the budget left, at least 5.
budget_left() {
  local l=$((BUDGET - SECONDS))
  [ "$l" -lt 5 ] && l=5
  echo "$l"
}
# within SECS: SECS, or what is left of the budget when that is less.
within() {
  local l
  l=$(budget_left)
  [ "$1" -lt "$l" ] && l=$1
  echo "$l"
}

# need_bins BIN...: every one executable and its libraries found.
need_bins() {
  local b
  for b in "$@"; do
    [ -x "$b" ] || { say "missing $b"; exit 2; }
    if ldd "$b" | grep -q "not found"; then
      say "$(basename "$b") lacks: $(ldd "$b" | grep "not found" | tr -s ' \t\n' ' ')"
      exit 2
    fi
  done
}

# start_broker SOCK LOGFILE [--model NAME=PATH ...] [other wbrokerd options]:
# a broker with BROKER_ARGS (a cuda one on device 0 unless the script says
# otherwise) and these options; waits until every model given is ready (up
# to 180 s). Sets BROKER and SOCK.
start_broker() {
  SOCK=$1
  local blog=$2 n=0 a
  shift 2
  for a in "$@"; do [ "$a" = --model ] && n=$((n + 1)); done
  BROKER_MODELS=$n
  rm -f "$SOCK" "$SOCK.fd"
  "${ORPHAN_KILL[@]}" "$WBROKERD" "${BROKER_ARGS[@]}" --socket "$SOCK" "$@" >"$blog" 2>&1 &
  BROKER=$!
  PIDS+=("$BROKER")
  wait_for 180 broker_ready_or_gone
  broker_ready || {
    fail "the broker ($(basename "$blog")) did not load its $n models: $(tail -n 5 "$blog")"
    return 1
  }
}

broker_ready() {
  [ "$(ctl models --json | python3 -c 'import json,sys; print(sum(m["state"] == "ready" for m in json.load(sys.stdin)))')" = "$BROKER_MODELS" ]
}
# A broker that exited will never be ready: no need to wait out the limit.
broker_ready_or_gone() { broker_ready || ! kill -0 "$BROKER" 2>/dev/null; }

# wait_exit SECS PID: waits for PID, a child of this shell, to exit and
# returns its status; after SECS it is killed (SIGKILL) and 124 returned.
wait_exit() {
  local until=$((SECONDS + $1))
  while kill -0 "$2" 2>/dev/null; do
    if [ "$SECONDS" -ge "$until" ]; then
      kill -KILL "$2" 2>/dev/null
      wait "$2" 2>/dev/null
      return 124
    fi
    sleep 0.05
  done
  wait "$2" 2>/dev/null
}

# stop_broker: SIGTERM, then SIGKILL if it has not exited within 60 s; the
# broker's exit status (124 when it had to be killed).
stop_broker() {
  kill -TERM "$BROKER" 2>/dev/null
  wait_exit 60 "$BROKER"
}

# models DIR GIB [embedded|""] [ARGS...]: the bf16 family of
# examples/compile_models.py (a backbone of GIB GiB, heads a and b) in DIR,
# compiled unless DIR already holds it for that size and ARGS; with
# `embedded`, also variant a with its constants in the .so
# (bf16_a_embedded.pt2), in a second process at the same time; its failure
# is reported (fail) but not fatal: callers check the file. ARGS go to
# compile_models.py (e.g. --dim 32768 --variants a). Logs into
# OUT/compile_<dir>.log.
models() {
  local dir=$1 gib=$2 emb=${3:-} tag pid epid='' key
  shift 2
  [ $# -gt 0 ] && shift
  key="$gib${*:+ $*}"
  tag=$(basename "$dir")
  mkdir -p "$dir"
  if [ -f "$dir/bf16_a.pt2" ] && [ "$(cat "$dir/.gib" 2>/dev/null)" = "$key" ] &&
    { [ -z "$emb" ] || [ -f "$dir/bf16_a_embedded.pt2" ]; }; then
    say "models in $dir (${gib} GiB) already compiled"
    return 0
  fi
  rm -f "$dir/.gib"
  python3 "$ROOT/examples/compile_models.py" "$dir" --family bf16 --backbone-gib "$gib" "$@" \
    >"$OUT/compile_$tag.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  if [ -n "$emb" ]; then
    python3 "$ROOT/examples/compile_models.py" "$dir" --family bf16 --only-embedded \
      --backbone-gib "$gib" "$@" >"$OUT/compile_${tag}_embedded.log" 2>&1 &
    epid=$!
    PIDS+=("$epid")
  fi
  wait "$pid" || { fail "compile of $dir failed: $(tail -n 5 "$OUT/compile_$tag.log")"; return 1; }
  echo "$key" >"$dir/.gib"
  say "compiled the ${gib} GiB models in $dir"
  if [ -n "$epid" ]; then
    # Without it only the conditions that need it are left out.
    if ! wait "$epid"; then
      rm -f "$dir/bf16_a_embedded.pt2"
      fail "embedded compile of $dir failed: $(tail -n 5 "$OUT/compile_${tag}_embedded.log")"
    fi
  fi
  return 0
}

# A process that only makes a CUDA context, the way the workers do
# (cudaSetDevice + cudaFree(NULL)): wb_bench_attach --context-only, or,
# when that binary was not shipped, the same two calls through ctypes (or
# torch.cuda.init() where no libcudart can be loaded; it says which on
# stdout).
ctx_only() {
  if [ -x "$PROBE" ]; then
    "$PROBE" --context-only
  else
    python3 -c 'import ctypes, sys
rt = None
for n in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
    try:
        rt = ctypes.CDLL(n)
        break
    except OSError:
        pass
if rt is None:
    import torch
    torch.cuda.init()
    print("torch.cuda.init()")
    sys.exit(0)
print("ctypes libcudart")
sys.exit(rt.cudaSetDevice(0) != 0 or rt.cudaFree(None) != 0)'
  fi
}
FLOOR_IMPL=$([ -x "$PROBE" ] && echo "wb_bench_attach --context-only" ||
  echo "python3: cudaSetDevice + cudaFree(NULL) through ctypes, else torch.cuda.init() (see proc_floor_ctx_*.log)")

# start_followers N DIR [DEVICES]: N wb-aoti-workers serving variant a of
# the bf16 family in DIR (models base and head) in a loop and following its
# versions, each writing its first output of every version to OUT/w<i>;
# worker i on cuda:D, D the devices of the comma-separated DEVICES in turn
# (default 0: all on cuda:0); waits until all are serving (180 s). Sets
# WPIDS.
start_followers() {
  local n=$1 dir=$2 i devs
  IFS=, read -r -a devs <<<"${3:-0}"
  WPIDS=()
  for i in $(seq 1 "$n"); do
    mkdir -p "$OUT/w$i"
    "${ORPHAN_KILL[@]}" "$WORKER" --socket "$SOCK" --model base --model head --aoti "$dir/bf16_a.pt2" \
      --device "cuda:${devs[(i - 1) % ${#devs[@]}]}" --torch-lib "$TORCH_LIB" \
      --input "$dir/bf16_input.safetensors" --iterations 20 \
      --serve --follow --version-outputs "$OUT/w$i" >"$OUT/worker_$i.log" 2>&1 &
    WPIDS+=($!)
    PIDS+=($!)
  done
  FOLLOWERS=$n
  wait_for 180 followers_ready || {
    fail "workers not serving: $(tail -n 3 "$OUT/worker_1.log")"
    return 1
  }
  say "$n workers serving"
}
followers_ready() {
  local i
  for i in $(seq 1 "$FOLLOWERS"); do has_line "$OUT/worker_$i.log" "^ready" || return 1; done
}

# stop_followers: SIGTERM to the workers of start_followers; their exit
# statuses in WRC, each one's result line in OUT/w<i>/result.json.
stop_followers() {
  local p i
  for p in "${WPIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  WRC=()
  for p in "${WPIDS[@]}"; do
    wait_exit 60 "$p"
    WRC+=($?)
  done
  for i in $(seq 1 "$FOLLOWERS"); do
    grep '^result ' "$OUT/worker_$i.log" | tail -n 1 | cut -d' ' -f2- >"$OUT/w$i/result.json"
  done
}
