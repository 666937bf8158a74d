#!/usr/bin/env bash
# On the GPU machine: checks that wbrokerd --backend cuda loads and serves
# (every byte of every model compared through a CUDA IPC handle opened in a
# second process), shows wbctl's view and progress bar, then runs the load
# benchmark (bench/load.c). Writes logs and bench JSON to OUTDIR.
#
# usage: tests/gpu/load_bench.sh BINDIR OUTDIR [bench options...]
# BINDIR holds wbrokerd, wbctl, wb_cuda_check and wb_bench_load, built on a
# development machine with CUDA; the runtime libraries they need are in
# LD_LIBRARY_PATH.
set -uo pipefail
BIN=${1:?usage: load_bench.sh BINDIR OUTDIR [bench options]}
OUT=${2:?usage: load_bench.sh BINDIR OUTDIR [bench options]}
shift 2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WB_BENCH_DIR:-/tmp/wb-gpu-load}
SOCK=$WORK/broker.sock
BIG=$WORK/load.safetensors
mkdir -p "$WORK" "$OUT"
status=0
say() { printf '%s\n' "$*" | tee -a "$OUT/check.txt"; }
failed() { say "FAIL: $*"; status=1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/check.txt"
"$BIN/wb_bench_load" --file "$BIG" --gib "${WB_BENCH_GIB:-8}" --write-only | tee -a "$OUT/check.txt"

# 1. The broker on the cuda backend, with the official fixtures and the big file.
D=$SRC/tests/data/official
"$BIN/wbrokerd" --backend cuda --socket "$SOCK" \
  --model gpt2="$D/gpt2/model.safetensors" --model sharded="$D/gpt2_sharded" \
  --model dtypes="$D/all_dtypes.safetensors" --model big="$BIG" >"$OUT/broker.log" 2>&1 &
BROKER=$!
for _ in $(seq 1 600); do
  [ -S "$SOCK" ] && "$BIN/wbctl" --socket "$SOCK" stats >/dev/null 2>&1 && break
  kill -0 "$BROKER" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$BROKER" 2>/dev/null || failed "wbrokerd --backend cuda exited: $(tail -3 "$OUT/broker.log")"
for m in gpt2:"$D/gpt2/model.safetensors" sharded:"$D/gpt2_sharded" \
  dtypes:"$D/all_dtypes.safetensors" big:"$BIG"; do
  "$BIN/wb_cuda_check" "$SOCK" "${m%%:*}" "${m#*:}" 2>&1 | tail -5 | tee -a "$OUT/check.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || failed "wb_cuda_check ${m%%:*}"
done
# A load through wbctl on a terminal: the progress bar.
script -qec "$BIN/wbctl --socket $SOCK load big2 $BIG" /dev/null >"$OUT/wbctl_load_tty.txt" 2>&1 ||
  failed "wbctl load big2"
tr '\r' '\n' <"$OUT/wbctl_load_tty.txt" | tail -6 | tee -a "$OUT/check.txt"
"$BIN/wbctl" --socket "$SOCK" models --json >"$OUT/models.json" || failed "wbctl models"
"$BIN/wbctl" --socket "$SOCK" stats >>"$OUT/check.txt" || failed "wbctl stats"
"$BIN/wbctl" --socket "$SOCK" models | tee -a "$OUT/check.txt"
kill -TERM "$BROKER"
wait "$BROKER"
rc=$?
[ "$rc" = 0 ] || failed "wbrokerd exited with $rc after SIGTERM"
grep -E "event=(backend|load_stage|model_ready)" "$OUT/broker.log" | grep -E "backend|model=big" |
  tee -a "$OUT/check.txt"

# 2. The benchmark.
"$BIN/wb_bench_load" --file "$BIG" --gib "${WB_BENCH_GIB:-8}" --out "$OUT/load.json" "$@" 2>&1 |
  tee "$OUT/bench.txt"
[ "${PIPESTATUS[0]}" = 0 ] || failed "wb_bench_load"
rm -f "$BIG" "$BIG.cold"
say "load_bench: $([ "$status" = 0 ] && echo PASS || echo FAIL)"
exit "$status"
