#!/usr/bin/env bash
# Real models on the GPU test machine: Hugging Face causal LMs built from
# their configs (random weights), saved with save_pretrained, compiled with
# examples/wb_compile.py (tests/gpu/real_models.py), served by a cuda broker
# to two workers per model at once, outputs compared with eager PyTorch; the
# gpt2 model compiled for the CPU is served by a host-backend broker. Builds
# nothing: binaries come prebuilt.
#
#   tests/gpu/real_models.sh OUT
#
# Environment: WB_GPU_BIN, WB_GPU_LIB (default bin/ and lib/ above tests/
# when staged with the binaries, else .device/models/{bin,lib}),
# WB_GPU_WORK (scratch, default /tmp/wbreal), WB_REAL_ONLY (comma-separated
# case names of tests/gpu/real_models.py: only those). Results: OUT/real_models.json,
# OUT/logs.tar.gz.
set -uo pipefail
OUT=${1:?usage: tests/gpu/real_models.sh OUT}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
STAGE=$ROOT
[ -x "$STAGE/bin/wbrokerd" ] || STAGE=$ROOT/.device/models
BIN=${WB_GPU_BIN:-$STAGE/bin}
LIB=${WB_GPU_LIB:-$STAGE/lib}
WORK=${WB_GPU_WORK:-/tmp/wbreal}
LOGS=$WORK/logs
mkdir -p "$WORK" "$LOGS"
export PYTHONUNBUFFERED=1
TORCH_LIB=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
# The Debian runtime libraries: .device/lib of the working tree.
export LD_LIBRARY_PATH=$LIB:$ROOT/.device/lib:$ROOT/../lib:$TORCH_LIB:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap 'cleanup; tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs 2>/dev/null' EXIT
say() { printf '[%4ds] %s\n' "$SECONDS" "$*" | tee -a "$LOGS/run.log" >&2; }
wait_for() {
  local until=$((SECONDS + $1)); shift
  while ! "$@" >/dev/null 2>&1; do [ "$SECONDS" -ge "$until" ] && return 1; sleep 0.2; done
}

for b in wbrokerd wbctl wb-aoti-worker; do
  [ -x "$BIN/$b" ] || { say "missing $BIN/$b"; exit 2; }
done
if [ -s "$WORK/cases.json" ]; then
  say "reusing the models compiled in $WORK"
elif say "compiling the real models" &&
  ! python3 "$HERE/real_models.py" "$WORK" --only "${WB_REAL_ONLY:-}" >"$LOGS/compile.log" 2>&1; then
  say "compile failed: $(tail -n 20 "$LOGS/compile.log")"
  exit 1
fi
say "compiled: $(grep -c '^compiled' "$LOGS/compile.log") packages"

# run_cases BACKEND SOCK DEVFILTER: a broker for every checkpoint the cases
# of that device need, two serving workers per case, wbctl and NVML while
# they serve, then SIGTERM; results into $LOGS/<case>_<i>.out.
run_cases() {
  local backend=$1 sock=$2 devf=$3
  local args
  args=$(python3 - "$WORK/cases.json" "$devf" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
seen = {}
for c in d["cases"]:
    if (c["device"] == "cpu") == (sys.argv[2] == "cpu"):
        for n, p in c["checkpoints"]:
            seen[n] = p
print(" ".join(f"--model {n}={p}" for n, p in seen.items()))
PY
)
  local nmodels
  nmodels=$(wc -w <<<"$args"); nmodels=$((nmodels / 2))
  local bargs=(--backend "$backend" --socket "$sock" --heartbeat-ms 200)
  [ "$backend" = cuda ] && bargs+=(--device 0)
  # shellcheck disable=SC2086
  "$BIN/wbrokerd" "${bargs[@]}" $args >"$LOGS/broker_$backend.log" 2>&1 &
  local broker=$!
  PIDS+=("$broker")
  sleep 1
  if ! kill -0 "$broker" 2>/dev/null; then
    say "the $backend broker exited: $(tail -n 5 "$LOGS/broker_$backend.log")"
    return 1
  fi
  ready() { kill -0 "$broker" && [ "$("$BIN/wbctl" --socket "$sock" models --json | python3 -c "import json,sys; print(sum(m['state']=='ready' for m in json.load(sys.stdin)))")" = "$nmodels" ]; }
  if ! wait_for 60 ready; then
    say "the $backend broker did not load $nmodels models: $(tail -n 5 "$LOGS/broker_$backend.log")"
    return 1
  fi
  "$BIN/wbctl" --socket "$sock" models --json >"$LOGS/models_$backend.json"
  python3 "$ROOT/tests/gpu/gpumem.py" >"$LOGS/mem_before_$backend.json" 2>/dev/null
  local names
  names=$(python3 -c "import json; print(' '.join(c['name'] for c in json.load(open('$WORK/cases.json'))['cases'] if (c['device']=='cpu') == ('$devf'=='cpu')))")
  local wp=()
  for name in $names; do
    local wargs
    wargs=$(python3 -c "
import json
c = [c for c in json.load(open('$WORK/cases.json'))['cases'] if c['name'] == '$name'][0]
a = [f'--model {n}' for n, _ in c['checkpoints']] + c['opts']
if c['device'] != 'cpu': a.append('--device cuda:0')
print(' '.join(a))")
    for i in 1 2; do
      # shellcheck disable=SC2086
      "$BIN/wb-aoti-worker" --socket "$sock" --torch-lib "$TORCH_LIB" $wargs \
        --aoti "$WORK/$name.pt2" --input "$WORK/${name}_in.safetensors" \
        --output "$WORK/out_${name}_$i.safetensors" --iterations 3 --serve \
        >"$LOGS/${name}_$i.out" 2>"$LOGS/${name}_$i.err" &
      wp+=($!)
      PIDS+=($!)
    done
  done
  local w
  # Ready, or gone (a worker that failed does not hold the others up).
  allready() {
    local k=0 f
    for f in "$@"; do
      grep -q '^ready' "$f" || ! kill -0 "${wp[$k]}" 2>/dev/null || return 1
      k=$((k + 1))
    done
  }
  local outs=()
  for name in $names; do outs+=("$LOGS/${name}_1.out" "$LOGS/${name}_2.out"); done
  wait_for 90 allready "${outs[@]}" || say "not every $backend worker became ready"
  sleep 1
  python3 "$ROOT/tests/gpu/gpumem.py" >"$LOGS/mem_serving_$backend.json" 2>/dev/null
  "$BIN/wbctl" --socket "$sock" containers --json >"$LOGS/containers_$backend.json"
  "$BIN/wbctl" --socket "$sock" containers >"$LOGS/containers_$backend.txt"
  for w in "${wp[@]}"; do kill -TERM "$w" 2>/dev/null; done
  for w in "${wp[@]}"; do wait "$w"; done
  kill -TERM "$broker"; wait "$broker"
}

run_cases cuda "$WORK/cuda.sock" cuda
say "cuda cases done"
if grep -q '"device": "cpu"' "$WORK/cases.json"; then run_cases host "$WORK/host.sock" cpu; fi
say "cpu cases done"

python3 - "$WORK" "$OUT/real_models.json" <<'PY' | tee -a "$LOGS/run.log"
import json, os, sys
import torch
from safetensors.torch import load_file
work, out = sys.argv[1], sys.argv[2]
d = json.load(open(os.path.join(work, "cases.json")))
logs = os.path.join(work, "logs")
res = {"torch": d["torch"], "facts": d["facts"], "cases": [], "ok": True}
for c in d["cases"]:
    ref = load_file(c["ref"])["output0"].double()
    r = {"name": c["name"], "dtype": c["dtype"], "device": c["device"], "wrapped": c["wrapped"],
         "tolerance": c["tolerance"], "compile": c["compile"], "workers": []}
    for i in (1, 2):
        w = {}
        try:
            lines = [l for l in open(os.path.join(logs, f"{c['name']}_{i}.out")) if l.startswith("result ")]
            w = json.loads(lines[-1][7:]) if lines else {"ok": False}
        except OSError:
            w = {"ok": False}
        try:
            y = load_file(os.path.join(work, f"out_{c['name']}_{i}.safetensors"))["output0"].double()
            w["rel_l2"] = float((y - ref).norm() / ref.norm()) if y.shape == ref.shape else None
        except Exception as e:
            w["rel_l2"] = None
            w["error"] = str(e)[:200]
            try:
                w["stderr"] = open(os.path.join(logs, f"{c['name']}_{i}.err")).read()[-600:]
            except OSError:
                pass
        w["pass"] = bool(w.get("rel_l2") is not None and w["rel_l2"] <= c["tolerance"] and w.get("mismatches", 1) == 0)
        r["workers"].append(w)
    r["pass"] = all(w["pass"] for w in r["workers"])
    res["ok"] &= r["pass"]
    res["cases"].append(r)
for b in ("cuda", "host"):
    for k in ("models", "containers", "mem_before", "mem_serving"):
        try:
            res[f"{k}_{b}"] = json.load(open(os.path.join(logs, f"{k}_{b}.json")))
        except Exception:
            pass
json.dump(res, open(out, "w"), indent=1)
print(f"{'case':22} {'dev':5} {'dtype':5} {'rel_l2 (2 workers)':26} leased aliased package unbound bound_bytes pass")
for r in res["cases"]:
    w = r["workers"]
    e = " ".join(f"{x.get('rel_l2'):.2e}" if x.get("rel_l2") is not None else "none" for x in w)
    a = w[0]
    print(f"{r['name']:22} {r['device']:5} {r['dtype']:5} {e:26} {a.get('leased_constants')} {a.get('aliased_constants')} {a.get('package_constants')} {a.get('unbound_constants')} {a.get('bound_bytes')} {r['pass']}")
print("ALL PASS" if res["ok"] else "SOME FAILED")
PY
