#!/usr/bin/env bash
# Device memory with sharing against each worker loading its own weights,
# for N = 1, 2, 4, 8 workers of one variant, on the GPU test machine
# (prebuilt binaries, as tests/gpu/run.sh).
#
#   bench/gpu/memory.sh OUT
#
# The model: the bf16 family of examples/compile_models.py with a backbone
# of WB_MEMORY_GIB GiB (2), variant a. Sharing: a cuda broker holds the base
# and the head; N wb-aoti-worker processes serve on leases. Own: the broker
# stopped, N workers each with --local-weights (their own copy of the same
# safetensors files). Each point is NVML's used device memory (gpumem.py:
# no CUDA context of its own) once all N serve, minus the idle figure taken
# with nothing running; the workers are stopped between points.
#
# Writes OUT/memory.json: {"model_bytes", "idle", "points": [{"n", "sharing",
# "own", "broker"}], ...} in bytes above idle ("broker": the broker alone,
# before its workers), and per-worker figures; prints a table last. About
# 2-3 minutes (compiling ~50 s unless WB_GPU_WORK already holds the models).
#
# Environment: as tests/gpu/lib.sh; WB_MEMORY_GIB, WB_MEMORY_NS ("1 2 4 8").
set -uo pipefail

OUT=${1:?usage: bench/gpu/memory.sh OUT}
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/../../tests/gpu/lib.sh"
GIB=${WB_MEMORY_GIB:-2}
read -r -a NS <<<"${WB_MEMORY_NS:-1 2 4 8}"
MD=$WORK/models_${GIB}gib # shared with stall.sh when the sizes agree
RES=$OUT/points.jsonl
: >"$RES"

need_bins "$WBROKERD" "$WBCTL" "$WORKER"
gpu_json "$OUT/gpu.json"
models "$MD" "$GIB" || exit 1
cat "$MD"/bf16_base.safetensors "$MD"/bf16_head_a.safetensors >/dev/null # page cache

# serve N MODE: N workers (MODE leased or own) until all say ready; sets MEM
# to the used bytes then; stops them. Fails when a worker did.
serve() {
  local n=$1 mode=$2 i p rc=0
  local ps=()
  for ((i = 0; i < n; i++)); do
    local src=(--socket "$SOCK" --model bf16_base --model bf16_head_a)
    [ "$mode" = own ] && src=(--local-weights "$MD/bf16_base.safetensors"
      --local-weights "$MD/bf16_head_a.safetensors")
    "$WORKER" "${src[@]}" --device cuda:0 --torch-lib "$TORCH_LIB" --aoti "$MD/bf16_a.pt2" \
      --input "$MD/bf16_input.safetensors" --serve \
      >"$OUT/${mode}_${n}_$i.out" 2>"$OUT/${mode}_${n}_$i.err" &
    ps+=("$!")
    PIDS+=("$!")
  done
  for ((i = 0; i < n; i++)); do
    wait_for 180 has_line "$OUT/${mode}_${n}_$i.out" "^ready" ||
      { fail "$mode worker $i of $n not ready: $(tail -n 3 "$OUT/${mode}_${n}_$i.err")"; rc=1; }
  done
  sleep 1
  MEM=$(mem_used)
  for p in "${ps[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${ps[@]}"; do wait "$p" || { fail "$mode worker $p (n=$n) exited with $?"; rc=1; }; done
  sleep 1
  return "$rc"
}

sleep 1
IDLE=$(mem_used)
say "idle device memory used: $IDLE"
start_broker "$WORK/memory.sock" "$OUT/broker.log" \
  --model "bf16_base=$MD/bf16_base.safetensors" --model "bf16_head_a=$MD/bf16_head_a.safetensors" ||
  exit 1
sleep 1
B=$(mem_used)
say "broker with the model: +$((B - IDLE))"
for n in "${NS[@]}"; do
  serve "$n" leased || continue
  say "sharing, $n workers: +$((MEM - IDLE))"
  printf '{"n": %d, "mode": "sharing", "used": %d}\n' "$n" "$MEM" >>"$RES"
done
stop_broker
sleep 1
IDLE2=$(mem_used)
say "idle again after the broker: $IDLE2"
for n in "${NS[@]}"; do
  serve "$n" own || continue
  say "own copies, $n workers: +$((MEM - IDLE2))"
  printf '{"n": %d, "mode": "own", "used": %d}\n' "$n" "$MEM" >>"$RES"
done

python3 - "$RES" "$OUT/memory.json" "$IDLE" "$IDLE2" "$B" "$MD/manifest_bf16.json" \
  "$OUT/gpu.json" <<'EOF' | tee -a "$LOG" || fail "summary"
import json, sys
res, out, idle, idle2, broker, manifest, gpu = sys.argv[1:]
idle, idle2, broker = int(idle), int(idle2), int(broker)
rows = [json.loads(l) for l in open(res) if l.strip()]
man = json.load(open(manifest))["bf16"]
pts = {}
for r in rows:
    p = pts.setdefault(r["n"], {"n": r["n"]})
    p[r["mode"]] = r["used"] - (idle if r["mode"] == "sharing" else idle2)
for p in pts.values():
    p["broker"] = broker - idle
    if "sharing" in p:
        p["sharing_per_worker"] = round((p["sharing"] - p["broker"]) / p["n"])
    if "own" in p:
        p["own_per_worker"] = round(p["own"] / p["n"])
    if "sharing" in p and "own" in p:
        p["own_over_sharing"] = round(p["own"] / p["sharing"], 3)
d = {"model": "bf16 variant a (examples/compile_models.py)", "base_bytes": man["base_bytes"],
     "idle": idle, "idle_after_broker": idle2, "units": "bytes above idle (NVML used)",
     "points": [pts[n] for n in sorted(pts)], "gpu": json.load(open(gpu))}
json.dump(d, open(out, "w"), indent=1)
G = 1 << 30
print(f"{'N':>3} {'sharing GiB':>12} {'own GiB':>9} {'own/sharing':>11}")
for p in d["points"]:
    s, o = p.get("sharing"), p.get("own")
    print(f"{p['n']:3d} {s / G if s is not None else float('nan'):12.2f} "
          f"{o / G if o is not None else float('nan'):9.2f} {p.get('own_over_sharing', float('nan')):11}")
EOF
finish
