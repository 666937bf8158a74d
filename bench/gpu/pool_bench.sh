#!/usr/bin/env bash
# On the GPU machine: wbrokerd's own loads of one checkpoint, load, unload
# and load again, with the slab pool (--slab-pool-seconds, the default) and
# without it (--no-slab-pool), against the pinned peak measured in the same
# run (wb_bench_load's pinned_peak: one cudaMemcpyAsync from pinned memory).
# Two brokers on two sockets, one after the other: CYCLES loads and unloads
# in the one without the pool, a pause, then CYCLES in the one with it. Not
# alternated: right after one broker frees its slab, the other's load runs
# slower (measured: the pool's loads then ran at 0.80 of the peak, the
# others' at 0.84), so each broker's loads follow only its own unloads. Each load's GB/s is the broker's own (wbctl load --json:
# load_gbps, tensor bytes over the whole load); each load is verified by
# the broker (every tensor's XXH3 against the one computed while reading
# the file). Writes OUT/pool.json and OUT/pool_bench.log.
#
#   bench/gpu/pool_bench.sh OUT [CYCLES]
#
# Environment: as tests/gpu/lib.sh; WB_BENCH_DIR (the checkpoint's
# directory, shared with bench/gpu/reuse_bench.sh: default /tmp/wb-gpu-load),
# WB_BENCH_GIB (8).
set -uo pipefail
OUT=${1:?usage: bench/gpu/pool_bench.sh OUT [CYCLES]}
CYCLES=${2:-5}
LOG_NAME=pool_bench.log
GPU_TORCH=0
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/../../tests/gpu/lib.sh"
need_bins "$WBROKERD" "$WBCTL" "$BIN/wb_bench_load"
with_slab_pool
DIR=${WB_BENCH_DIR:-/tmp/wb-gpu-load}
GIB=${WB_BENCH_GIB:-8}
F=$DIR/load.safetensors
mkdir -p "$DIR"
"$BIN/wb_bench_load" --file "$F" --gib "$GIB" --write-only >"$OUT/write.log" 2>&1 ||
  { fail "writing $F: $(tail -n 3 "$OUT/write.log")"; finish; exit 1; }
cat "$F" >/dev/null
"$BIN/wb_bench_load" --file "$F" --variants default --runs 1 --out "$OUT/peak.json" \
  >"$OUT/peak.log" 2>&1 || fail "the pinned peak: $(tail -n 3 "$OUT/peak.log")"

start_broker "$WORK/pool_on.sock" "$OUT/broker_pool.log" || { finish; exit 1; }
ON=$BROKER
SOCK_ON=$SOCK
start_broker "$WORK/pool_off.sock" "$OUT/broker_nopool.log" --no-slab-pool || { finish; exit 1; }
OFF=$BROKER
SOCK_OFF=$SOCK
cycle() {
  local sock=$1 tag=$2 i=$3
  "$WBCTL" --socket "$sock" load --json m "$F" >"$OUT/load_${tag}_$i.json" 2>&1 ||
    { fail "$tag load $i: $(tail -n 3 "$OUT/load_${tag}_$i.json")"; return 1; }
  "$WBCTL" --socket "$sock" unload m >/dev/null 2>&1 || fail "$tag unload $i"
}
for i in $(seq 1 "$CYCLES"); do cycle "$SOCK_OFF" no_pool "$i"; done
sleep 5
for i in $(seq 1 "$CYCLES"); do cycle "$SOCK_ON" pool "$i"; done
"$WBCTL" --socket "$SOCK_ON" stats --json >"$OUT/stats_pool.json"
"$WBCTL" --socket "$SOCK_OFF" stats --json >"$OUT/stats_nopool.json"
BROKER=$ON
stop_broker
BROKER=$OFF
stop_broker
python3 - "$OUT" "$CYCLES" <<'PY' >"$OUT/pool.json" || fail "the report"
import json, statistics, sys
out = sys.argv[1]
peak = json.load(open(f"{out}/peak.json"))["gbps"]["pinned_peak"]
res = {"pinned_peak_gbps": peak, "cycles": {}, "stats": {}}
for tag, st in (("pool", "stats_pool.json"), ("no_pool", "stats_nopool.json")):
    g = []
    for i in range(1, int(sys.argv[2]) + 1):
        try:
            g.append(json.load(open(f"{out}/load_{tag}_{i}.json")).get("load_gbps"))
        except (OSError, ValueError):
            g.append(None)
    s = json.load(open(f"{out}/{st}"))
    res["stats"][tag] = {k: s.get(k, 0) for k in ("slab_pool_bytes", "slab_pool_hits",
                                                   "slab_pool_misses")}
    res["cycles"][tag] = {"gbps": g, "over_peak": [round(x / peak, 3) for x in g if x],
                          "median_over_peak_from_2": round(statistics.median(g[1:]) / peak, 3)
                          if len(g) > 1 and all(g) else None}
res["target_0_95_reused"] = {t: (v["median_over_peak_from_2"] or 0) >= 0.95
                             for t, v in res["cycles"].items()}
print(json.dumps(res, indent=1))
PY
say "pool: $(python3 -c "import json; d=json.load(open('$OUT/pool.json')); print({t: v['over_peak'] for t, v in d['cycles'].items()}, d['stats'])" 2>&1)"
finish
