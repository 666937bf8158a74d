#!/usr/bin/env bash
# On the GPU machine: checks that wbrokerd --backend cuda loads and serves
# (every byte of every model compared through a CUDA IPC handle opened in a
# second process), with its default loader and again with the other read
# source and a huge-page ring, shows wbctl's view and progress bar, then runs
# the load benchmark (bench/load.c): every loader variant (median of --runs
# loads, each verified), the pinned peak and page cache -> user memory, in
# one run. Writes logs and OUTDIR/load.json, and prints a ratio table last.
#
# usage: bench/gpu/load_bench.sh BINDIR OUTDIR [bench options...]
# Without bench options: --runs 5 --sweep --cold. BINDIR holds wbrokerd, wbctl,
# wb_cuda_check and wb_bench_load, built on a development machine with CUDA;
# the runtime libraries they need are in LD_LIBRARY_PATH (left as it is;
# torch is not needed). The log is OUTDIR/check.txt.
# Environment: WB_BENCH_DIR (scratch, default /tmp/wb-gpu-load; the 8 GiB
# checkpoint is written there once and reused while it is there),
# WB_BENCH_GIB (8), WB_BENCH_BUDGET_S (the benchmark's limit, 300 s).
# Expected to take 3 to 5 minutes on the H200 host.
set -uo pipefail
BINDIR=${1:?usage: load_bench.sh BINDIR OUTDIR [bench options]}
OUT=${2:?usage: load_bench.sh BINDIR OUTDIR [bench options]}
shift 2
if [ "$#" = 0 ]; then
  set -- --runs 5 --sweep --cold
fi
WB_GPU_BIN=$BINDIR
WB_GPU_WORK=${WB_BENCH_DIR:-/tmp/wb-gpu-load}
LOG_NAME=check.txt
GPU_TORCH=0
GPU_LD_PATH=0
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/../../tests/gpu/lib.sh"
BIG=$WORK/load.safetensors
BUDGET=${WB_BENCH_BUDGET_S:-300}
# The broker's own defaults: device, heartbeats and stale window.
BROKER_ARGS=(--backend cuda)
need_bins "$WBROKERD" "$WBCTL" "$BIN/wb_cuda_check" "$BIN/wb_bench_load"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
"$BIN/wb_bench_load" --file "$BIG" --gib "${WB_BENCH_GIB:-8}" --write-only | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || fail "writing the checkpoint"
say "checkpoint ready"

# 1. The broker on the cuda backend, with the official fixtures and the big
# file: first with its defaults, then with the other loader options.
D=$ROOT/tests/data/official
broker_check() { # TAG [wbrokerd options...]
  local tag=$1 rc m
  shift
  # wb_cuda_check reads the slab through its CUDA IPC handle: the legacy
  # transport (the default, cuda-vmm, passes descriptors instead).
  start_broker "$WORK/broker.sock" "$OUT/broker_$tag.log" --cuda-slab ipc "$@" \
    --model gpt2="$D/gpt2/model.safetensors" --model sharded="$D/gpt2_sharded" \
    --model dtypes="$D/all_dtypes.safetensors" --model big="$BIG" || return
  for m in gpt2:"$D/gpt2/model.safetensors" sharded:"$D/gpt2_sharded" \
    dtypes:"$D/all_dtypes.safetensors" big:"$BIG"; do
    timeout 120 "$BIN/wb_cuda_check" "$SOCK" "${m%%:*}" "${m#*:}" 2>&1 | tail -5 |
      sed "s/^/[$tag] /" | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" = 0 ] || fail "[$tag] wb_cuda_check ${m%%:*}"
  done
  if [ "$tag" = default ]; then
    # A load through wbctl on a terminal: the progress bar.
    script -qec "$WBCTL --socket $SOCK load big2 $BIG" /dev/null >"$OUT/wbctl_load_tty.txt" 2>&1 ||
      fail "wbctl load big2"
    tr '\r' '\n' <"$OUT/wbctl_load_tty.txt" | tail -6 | tee -a "$LOG"
    ctl models --json >"$OUT/models.json" || fail "wbctl models"
    ctl stats >>"$LOG" || fail "wbctl stats"
    ctl models | tee -a "$LOG"
  fi
  stop_broker
  rc=$?
  [ "$rc" = 0 ] || fail "[$tag] wbrokerd exited with $rc after SIGTERM"
  grep -E "event=(backend|load_stage|model_ready)" "$OUT/broker_$tag.log" | grep -E "backend|model=big" |
    sed "s/^/[$tag] /" | tee -a "$LOG"
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
[ "$rc" = 0 ] || fail "wb_bench_load exited with $rc$([ "$rc" = 124 ] && echo " (over ${BUDGET}s)")"
rm -f "$BIG" "$BIG.cold"

# 3. The table: each variant against the pinned peak and page cache -> user.
if [ -s "$OUT/load.json" ]; then
  python3 - "$OUT/load.json" <<'PY' | tee -a "$LOG" || fail "reading load.json"
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
  fail "no load.json"
fi
say "load_bench: $([ "${#FAILS[@]}" = 0 ] && echo PASS || echo FAIL)"
finish
