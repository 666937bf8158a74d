#!/usr/bin/env bash
# On the GPU machine: checks that wbrokerd --backend cuda loads and serves
# (every byte of every model compared through a CUDA IPC handle opened in a
# second process), with its default loader and again with the other read
# source and a huge-page ring, shows wbctl's view and progress bar, then runs
# the load benchmark (bench/load.c): every loader variant (median of --runs
# loads, each verified), the pinned peak and page cache -> user memory, in
# one run. Writes logs and OUTDIR/load.json, and prints a ratio table last.
#
# usage: tests/gpu/load_bench.sh BINDIR OUTDIR [bench options...]
# Without bench options: --runs 5 --sweep --cold. BINDIR holds wbrokerd, wbctl,
# wb_cuda_check and wb_bench_load, built on a development machine with CUDA;
# the runtime libraries they need are in LD_LIBRARY_PATH.
# Environment: WB_BENCH_DIR (scratch, default /tmp/wb-gpu-load; the 8 GiB
# checkpoint is written there once and reused while it is there),
# WB_BENCH_GIB (8), WB_BENCH_BUDGET_S (the benchmark's limit, 300 s).
# Expected to take 3 to 5 minutes on the H200 host.
set -uo pipefail
BIN=${1:?usage: load_bench.sh BINDIR OUTDIR [bench options]}
OUT=${2:?usage: load_bench.sh BINDIR OUTDIR [bench options]}
shift 2
if [ "$#" = 0 ]; then
  set -- --runs 5 --sweep --cold
fi
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WB_BENCH_DIR:-/tmp/wb-gpu-load}
SOCK=$WORK/broker.sock
BIG=$WORK/load.safetensors
BUDGET=${WB_BENCH_BUDGET_S:-300}
mkdir -p "$WORK" "$OUT"
status=0
say() { printf '[%4ds] %s\n' "$SECONDS" "$*" | tee -a "$OUT/check.txt"; }
failed() {
  say "FAIL: $*"
  status=1
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/check.txt"
"$BIN/wb_bench_load" --file "$BIG" --gib "${WB_BENCH_GIB:-8}" --write-only | tee -a "$OUT/check.txt"
[ "${PIPESTATUS[0]}" = 0 ] || failed "writing the checkpoint"
say "checkpoint ready"

# 1. The broker on the cuda backend, with the official fixtures and the big
# file: first with its defaults, then with the other loader options.
D=$SRC/tests/data/official
broker_check() { # TAG [wbrokerd options...]
  local tag=$1 log="$OUT/broker_$1.log" broker rc
  shift
  rm -f "$SOCK"
  "$BIN/wbrokerd" --backend cuda --socket "$SOCK" "$@" \
    --model gpt2="$D/gpt2/model.safetensors" --model sharded="$D/gpt2_sharded" \
    --model dtypes="$D/all_dtypes.safetensors" --model big="$BIG" >"$log" 2>&1 &
  broker=$!
  for _ in $(seq 1 600); do
    [ -S "$SOCK" ] && "$BIN/wbctl" --socket "$SOCK" stats >/dev/null 2>&1 && break
    kill -0 "$broker" 2>/dev/null || break
    sleep 0.1
  done
  if ! kill -0 "$broker" 2>/dev/null; then
    failed "[$tag] wbrokerd --backend cuda $* exited: $(tail -3 "$log")"
    return
  fi
  for m in gpt2:"$D/gpt2/model.safetensors" sharded:"$D/gpt2_sharded" \
    dtypes:"$D/all_dtypes.safetensors" big:"$BIG"; do
    timeout 120 "$BIN/wb_cuda_check" "$SOCK" "${m%%:*}" "${m#*:}" 2>&1 | tail -5 |
      sed "s/^/[$tag] /" | tee -a "$OUT/check.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || failed "[$tag] wb_cuda_check ${m%%:*}"
  done
  if [ "$tag" = default ]; then
    # A load through wbctl on a terminal: the progress bar.
    script -qec "$BIN/wbctl --socket $SOCK load big2 $BIG" /dev/null >"$OUT/wbctl_load_tty.txt" 2>&1 ||
      failed "wbctl load big2"
    tr '\r' '\n' <"$OUT/wbctl_load_tty.txt" | tail -6 | tee -a "$OUT/check.txt"
    "$BIN/wbctl" --socket "$SOCK" models --json >"$OUT/models.json" || failed "wbctl models"
    "$BIN/wbctl" --socket "$SOCK" stats >>"$OUT/check.txt" || failed "wbctl stats"
    "$BIN/wbctl" --socket "$SOCK" models | tee -a "$OUT/check.txt"
  fi
  kill -TERM "$broker"
  wait "$broker"
  rc=$?
  [ "$rc" = 0 ] || failed "[$tag] wbrokerd exited with $rc after SIGTERM"
  grep -E "event=(backend|load_stage|model_ready)" "$log" | grep -E "backend|model=big" |
    sed "s/^/[$tag] /" | tee -a "$OUT/check.txt"
}
broker_check default
say "default broker checked"
broker_check mmapnt --read-source mmap-nt --staging-pages huge
broker_check mapped --load-method mapped --register-threads 4
say "broker variants checked"

# 2. The benchmark.
timeout -k 10 "$BUDGET" "$BIN/wb_bench_load" --file "$BIG" --gib "${WB_BENCH_GIB:-8}" \
  --out "$OUT/load.json" "$@" 2>&1 | tee "$OUT/bench.txt"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || failed "wb_bench_load exited with $rc$([ "$rc" = 124 ] && echo " (over ${BUDGET}s)")"
rm -f "$BIG" "$BIG.cold"

# 3. The table: each variant against the pinned peak and page cache -> user.
if [ -s "$OUT/load.json" ]; then
  python3 - "$OUT/load.json" <<'PY' | tee -a "$OUT/check.txt" || failed "reading load.json"
import json, sys
r = json.load(open(sys.argv[1]))
g = r["gbps"]
peak = g.get("pinned_peak")
cache = g.get("page_cache_read_16threads")
print(f"pinned peak {peak or 0:.2f} GB/s, page cache -> user (16 threads) {cache or 0:.2f} GB/s, "
      f"nt copy: {r.get('nt_copy')}")
print(f"{'variant':<14} {'GB/s':>7} {'/peak':>6} {'/cache':>6} {'verify':<8} pages / options")
for v in r.get("variants", []):
    gb = v.get("gbps")
    ver = v.get("verify", {})
    ok = ("ok" if ver.get("tensor_mismatches") == 0 and ver.get("xxh3_mismatches") == 0
          else "MISMATCH" if ver else "ERROR" if "error" in v else "not run")
    print(f"{v['name']:<14} {gb or 0:7.2f} {(gb or 0) / peak if peak else 0:6.3f} "
          f"{(gb or 0) / cache if cache else 0:6.3f} {ok:<8} "
          f"{v.get('staging_pages_got', '')} / {v.get('wbrokerd_options', '')}"
          + (f" / error: {v['error']}" if "error" in v else ""))
wb = g.get("wbrokerd")
print(f"gbps.wbrokerd (default) {wb or 0:.2f} = {(wb or 0) / peak if peak else 0:.3f} of the "
      f"pinned peak (target >= 0.95)")
c = r.get("cold")
if c and c.get("possible"):
    raw = max(c.get("raw_odirect_16threads_gbps", 0), c.get("raw_buffered_16threads_gbps", 0))
    print(f"cold, default ({c.get('read_source_used')} used): {c.get('wbrokerd_gbps', 0):.2f} GB/s"
          f" = {c.get('wbrokerd_over_raw', 0):.2f} x the disk's raw {raw:.2f} (target >= 0.90); "
          f"pread {c.get('wbrokerd_pread_gbps', 0):.2f}, mmap-nt {c.get('wbrokerd_mmap_nt_gbps', 0):.2f}")
b = r.get("best_variant")
if b:
    print(f"best: {b['name']} {b['gbps']:.2f} GB/s = {b['over_pinned_peak']:.3f} ({b['wbrokerd_options']})")
PY
else
  failed "no load.json"
fi
say "load_bench: $([ "$status" = 0 ] && echo PASS || echo FAIL)"
exit "$status"
