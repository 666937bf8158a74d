#!/usr/bin/env bash
# On the GPU machine: wbrokerd's own loads from the page cache, by the
# checkpoint's layout (few large tensors, many small ones), into fresh
# device memory (each layout's first load) and into reused memory (CYCLES
# unload + load cycles, the slab pool on, as brokers run), against the
# pinned peak measured in the same run (wb_bench_load's pinned_peak: one
# cudaMemcpyAsync from pinned memory). Each load's GB/s is the broker's own
# (wbctl load --json: load_gbps, tensor bytes over the whole load), with its
# stages (read, hash, copy, wait) from the same reply. Every load is
# checked by the broker (each tensor's XXH3 computed while reading).
#
#   bench/gpu/load_layouts.sh OUT [CYCLES]
#
# Writes OUT/load_layouts.json and OUT/load_layouts.log.
# Environment: as tests/gpu/lib.sh; WB_BENCH_DIR (checkpoints, default
# /tmp/wb-gpu-load; the 8 GiB file of bench/gpu/load_bench.sh is one of the
# layouts), WB_LAYOUTS (GIB:TENSORS ..., default "1:4 1:64 1:512 4:4 4:256";
# the 8 GiB file of 152 tensors is always run), WB_LAYOUTS_ARGS (extra
# wbrokerd options), WB_LAYOUTS_OTHER_BIN and WB_LAYOUTS_OTHER_ARGS (a
# second broker: another build's directory with wbrokerd and wbctl, or
# this one, and its options instead of WB_LAYOUTS_ARGS; each layout is
# then loaded by both brokers in turn, tagged "this" and "other").
set -uo pipefail
OUT=${1:?usage: bench/gpu/load_layouts.sh OUT [CYCLES]}
CYCLES=${2:-5}
LOG_NAME=load_layouts.log
GPU_TORCH=0
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/../../tests/gpu/lib.sh"
need_bins "$WBROKERD" "$WBCTL" "$BIN/wb_bench_load"
with_slab_pool
DIR=${WB_BENCH_DIR:-/tmp/wb-gpu-load}
OTHER=${WB_LAYOUTS_OTHER_BIN:-}
[ -z "$OTHER" ] && [ -n "${WB_LAYOUTS_OTHER_ARGS+x}" ] && OTHER=$BIN
read -r -a THIS_ARGS <<<"${WB_LAYOUTS_ARGS:-}"
read -r -a OTHER_ARGS <<<"${WB_LAYOUTS_OTHER_ARGS-${WB_LAYOUTS_ARGS:-}}"
mkdir -p "$DIR"
BIG=$DIR/load.safetensors
"$BIN/wb_bench_load" --file "$BIG" --gib 8 --write-only >"$OUT/write.log" 2>&1 ||
  { fail "writing $BIG: $(tail -n 3 "$OUT/write.log")"; finish; exit 1; }
FILES=("8:152:$BIG")
for l in ${WB_LAYOUTS:-1:4 1:64 1:512 4:4 4:256}; do
  g=${l%%:*} n=${l#*:}
  f=$DIR/layout_${g}g_${n}.safetensors
  python3 "$GPU_BENCH/make_checkpoint.py" "$f" --bytes "$((g << 30))" --tensors "$n" \
    >>"$OUT/write.log" 2>&1 || { fail "writing $f"; continue; }
  FILES+=("$g:$n:$f")
done
for e in "${FILES[@]}"; do cat "${e#*:*:}" >/dev/null; done
"$BIN/wb_bench_load" --file "$BIG" --variants default --runs 1 --out "$OUT/peak.json" \
  >"$OUT/peak.log" 2>&1 || fail "the pinned peak: $(tail -n 3 "$OUT/peak.log")"
say "checkpoints ready: ${#FILES[@]} layouts"

RES=$OUT/loads.jsonl
: >"$RES"
# one TAG BINDIR GIB TENSORS FILE [OPTIONS...]: a broker of BINDIR with
# OPTIONS, a first load, CYCLES unload + load cycles; one record per load.
one() {
  local tag=$1 bindir=$2 g=$3 n=$4 f=$5 i
  shift 5
  local WBROKERD=$bindir/wbrokerd WBCTL=$bindir/wbctl
  start_broker "$WORK/layouts.sock" "$OUT/broker_${tag}_${g}g_$n.log" "$@" || return
  for i in $(seq 0 "$CYCLES"); do
    if [ "$i" -gt 0 ]; then ctl unload m >/dev/null 2>&1 || fail "$tag ${g}g/$n: unload $i"; fi
    ctl load --json m "$f" >"$OUT/load.json" 2>&1 ||
      { fail "$tag ${g}g/$n: load $i: $(tail -n 3 "$OUT/load.json")"; break; }
    python3 - "$tag" "$g" "$n" "$i" "$OUT/load.json" >>"$RES" <<'PY' ||
import json, sys
tag, g, n, i, lj = sys.argv[1:]
m = json.load(open(lj))
keys = ("state", "bytes", "load_seconds", "load_gbps", "read_threads", "wait_seconds",
        "open_seconds", "alloc_seconds", "first_copy_seconds", "seal_seconds")
st = {f"{k}_{f}": v.get(f) for k, v in m.get("load_stages", {}).items()
      for f in ("seconds", "gbps")}
print(json.dumps({"build": tag, "gib": int(g), "tensors": int(n), "load": int(i),
                  "reused": int(i) > 0, **{k: m.get(k) for k in keys}, **st}))
PY
      fail "$tag ${g}g/$n: record $i"
  done
  ctl stats --json >"$OUT/stats_${tag}_${g}g_$n.json" 2>/dev/null
  stop_broker || fail "$tag ${g}g/$n: the broker exited with $?"
}
for e in "${FILES[@]}"; do
  g=${e%%:*} rest=${e#*:}
  n=${rest%%:*} f=${rest#*:}
  one this "$BIN" "$g" "$n" "$f" "${THIS_ARGS[@]}"
  [ -n "$OTHER" ] && one other "$OTHER" "$g" "$n" "$f" "${OTHER_ARGS[@]}"
  say "layout ${g} GiB / $n tensors done"
done

python3 - "$OUT" "${THIS_ARGS[*]}" "${OTHER:+${OTHER_ARGS[*]}}" "${OTHER:+$([ "$OTHER" = "$BIN" ] && echo same || echo another)}" <<'PY' >"$OUT/load_layouts.json" || fail "the report"
import json, statistics, sys
out, this_args, other_args, other_build = sys.argv[1:5]
peak = json.load(open(f"{out}/peak.json"))["gbps"]["pinned_peak"]
rows = [json.loads(l) for l in open(f"{out}/loads.jsonl") if l.strip()]
builds = {"this": {"options": this_args}}
if other_build:
    builds["other"] = {"options": other_args, "build": other_build}
res = {"pinned_peak_gbps": peak, "brokers": builds, "loads": rows, "layouts": []}
seen = []
for r in rows:
    k = (r["build"], r["gib"], r["tensors"])
    if k not in seen:
        seen.append(k)
for b, g, n in seen:
    rs = [r for r in rows if (r["build"], r["gib"], r["tensors"]) == (b, g, n)]
    first = [r["load_gbps"] for r in rs if not r["reused"] and r["load_gbps"]]
    reused = [r["load_gbps"] for r in rs if r["reused"] and r["load_gbps"]]
    copy = [r["copy_gbps"] for r in rs if r.get("copy_gbps")]
    wait = [r["wait_seconds"] for r in rs if r.get("wait_seconds") is not None]
    res["layouts"].append({
        "build": b, "gib": g, "tensors": n,
        "first_gbps": first[0] if first else None,
        "first_over_peak": round(first[0] / peak, 3) if first else None,
        "reused_gbps": reused,
        "reused_median_over_peak": round(statistics.median(reused) / peak, 3) if reused else None,
        "reused_min_over_peak": round(min(reused) / peak, 3) if reused else None,
        "copy_stage_median_gbps": round(statistics.median(copy), 2) if copy else None,
        "readers_wait_median_seconds": round(statistics.median(wait), 4) if wait else None})
print(json.dumps(res, indent=1))
PY
python3 - "$OUT/load_layouts.json" <<'PY' | tee -a "$LOG"
import json, sys
d = json.load(open(sys.argv[1]))
print(f"pinned peak {d['pinned_peak_gbps']:.2f} GB/s")
print("build  GiB tensors  first  reused(median, min)  copy stage GB/s")
for r in d["layouts"]:
    print(f"{r['build']:6} {r['gib']:3} {r['tensors']:7}  {r['first_over_peak']}  "
          f"{r['reused_median_over_peak']}, {r['reused_min_over_peak']}  {r['copy_stage_median_gbps']}")
PY
finish
