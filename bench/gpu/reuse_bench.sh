#!/usr/bin/env bash
# On the GPU machine: the reuse study of the load benchmark (bench/load.c,
# --reuse; the study itself is bench/load_reuse.c): why loads into device
# memory that the previous load freed run slower than loads into memory no
# load used. Writes OUT/load_reuse.json and OUT/reuse.txt (the console) and
# prints each variant against the reference peak last.
#
# usage: bench/gpu/reuse_bench.sh BINDIR OUT [wb_bench_load options...]
# BINDIR holds wb_bench_load, built on a development machine with CUDA; the
# runtime libraries it needs are in LD_LIBRARY_PATH (left as it is). The
# options go after the script's own (--reuse --cycles 6 on an 8 GiB
# checkpoint), so that a later --cycles or --gib wins.
# Environment: WB_BENCH_DIR (scratch, default /tmp/wb-gpu-load: the
# checkpoint is written there once and kept, as load_bench.sh does),
# WB_BENCH_GIB (8), WB_BENCH_BUDGET_S (the benchmark's limit, 300 s).
# Expected to take 1 to 3 minutes on the H200 host.
set -u
BINDIR=${1:?usage: reuse_bench.sh BINDIR OUT [wb_bench_load options]}
OUT=${2:?usage: reuse_bench.sh BINDIR OUT [wb_bench_load options]}
shift 2
BENCH=$BINDIR/wb_bench_load
if [ ! -x "$BENCH" ]; then
  echo "reuse_bench.sh: no executable $BENCH (build the wb_bench_load target with CUDA)" >&2
  exit 2
fi
WORK=${WB_BENCH_DIR:-/tmp/wb-gpu-load}
GIB=${WB_BENCH_GIB:-8}
BUDGET=${WB_BENCH_BUDGET_S:-300}
BIG=$WORK/load.safetensors
mkdir -p "$OUT" "$WORK" || exit 2

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# The checkpoint of the other load figures (the benchmark's own mix of
# tensor sizes), kept for later runs.
"$BENCH" --file "$BIG" --gib "$GIB" --write-only || {
  echo "reuse_bench.sh: writing the checkpoint $BIG failed" >&2
  exit 1
}
timeout -k 10 "$BUDGET" "$BENCH" --file "$BIG" --gib "$GIB" --reuse --cycles 6 \
  --out "$OUT/load_reuse.json" "$@" 2>&1 | tee "$OUT/reuse.txt"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
  echo "reuse_bench.sh: wb_bench_load --reuse exited with $rc$([ "$rc" = 124 ] && echo " (over ${BUDGET}s)")" >&2
  [ -s "$OUT/load_reuse.json" ] || exit "$rc"
fi
if [ ! -s "$OUT/load_reuse.json" ]; then
  echo "reuse_bench.sh: no $OUT/load_reuse.json" >&2
  exit 1
fi

python3 - "$OUT/load_reuse.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))["reused_memory"]
p = r["reference_peak"]
print(f"reference: {p['variant']} {p['gbps']:.2f} GB/s ({p['destination']})")
print(f"{'variant':<28} {'GB/s':>7} {'/peak':>6} {'from 1':>7} {'alloc s':>8} {'free s':>8}  per cycle")
for name, v in r["variants"].items():
    if not v.get("gbps"):
        print(f"{name:<28} not run {v.get('error', '')}")
        continue
    med = lambda k: sorted(v[k])[len(v[k]) // 2] if v.get(k) else 0
    print(f"{name:<28} {v['median_gbps']:7.2f} {v['over_reference_peak']:6.3f} "
          f"{v['median_gbps_from_cycle_1']:7.2f} {med('alloc_seconds'):8.4f} {med('free_seconds'):8.4f}  "
          + " ".join(f"{x:.1f}" for x in v["gbps"])
          + ("" if v.get("verified") else "  MISMATCH"))
for k, x in r.get("ratios", {}).items():
    print(f"{k}: {x:.3f}")
for g in r["groups"]:
    if "skipped" in g:
        print(f"group {g['name']} skipped: {g['skipped']}")
print(f"verified: {r['verified']}, complete: {r['complete']}")
PY
exit "$rc"
