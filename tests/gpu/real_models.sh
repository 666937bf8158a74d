#!/usr/bin/env bash
# Real models on the GPU test machine (tests/gpu/real_models.py builds them):
# Hugging Face causal LMs built from their configs (random weights), saved
# with save_pretrained, compiled with weightbroker.compile (python/),
# served by a cuda broker to two workers per model at once, outputs compared
# with eager PyTorch; the gpt2 model compiled for the CPU is served by a
# host-backend broker. Then a tied Llama (wrapped), a BERT masked LM and a
# ResNet-18, each compiled twice: with torch's own API
# (aoti_compile_and_package(..., package_constants_in_so=False)), whose
# worker must refuse to create its container (WB_ENOTFOUND naming every
# buffer the library has no data for, no run) or, where the checkpoint
# holds every constant, serve; and with weightbroker.compile, served and
# compared with eager PyTorch. Builds nothing: binaries come prebuilt.
#
#   tests/gpu/real_models.sh OUT
#
# Bounded: nothing starts after WB_REAL_BUDGET_S seconds (default 480): no
# case is compiled after the budget less 150 s (they are reported skipped),
# the compile is killed at the budget less 100 s, and every wait (broker
# load, workers ready, exits) is cut to what is left. Every process started
# here dies with the script (SIGKILL on exit; setpriv --pdeathsig where it
# exists, also when the script itself is SIGKILLed).
#
# Environment: WB_GPU_BIN, WB_GPU_LIB (default bin/ and lib/ above tests/
# when staged with the binaries, else .device/models/{bin,lib}),
# WB_GPU_WORK (scratch, default /tmp/wbreal; compiled models there are
# reused when a complete earlier run made them for the same WB_REAL_ONLY),
# WB_REAL_ONLY (comma-separated case names of tests/gpu/real_models.py: only
# those), WB_REAL_BUDGET_S. Results: OUT/real_models.json (exit status 1
# unless every case passed), OUT/run.log, OUT/logs.tar.gz (compile log,
# broker and worker logs, wbctl and NVML records).
set -uo pipefail
OUT=${1:?usage: tests/gpu/real_models.sh OUT}
HERE=$(cd "$(dirname "$0")" && pwd)
STAGE=$(cd "$HERE/../.." && pwd)
[ -x "$STAGE/bin/wbrokerd" ] || STAGE=$STAGE/.device/models
WB_GPU_BIN=${WB_GPU_BIN:-$STAGE/bin}
WB_GPU_LIB=${WB_GPU_LIB:-$STAGE/lib}
WB_GPU_WORK=${WB_GPU_WORK:-/tmp/wbreal}
# Paths, say, wait_for, wait_exit, need_bins, PIDS and cleanup, ORPHAN_KILL,
# the budget's within, LD_LIBRARY_PATH (fallback/ beside lib/ last); the log
# is OUT/run.log.
# shellcheck source=tests/gpu/lib.sh
. "$HERE/lib.sh"
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$ROOT/../lib
BUDGET=${WB_REAL_BUDGET_S:-480}
LOGS=$WORK/logs
mkdir -p "$LOGS"
# weightbroker.compile, from this tree (as `pip install ./python` puts it).
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
trap 'cleanup; tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs 2>/dev/null' EXIT

need_bins "$WBROKERD" "$WBCTL" "$WORKER"
reusable() {
  python3 - "$WORK/cases.json" "${WB_REAL_ONLY:-}" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(1)
only = sorted(filter(None, sys.argv[2].split(",")))
sys.exit(0 if d.get("complete") and d.get("only", []) == only and not d.get("failed")
         and not d.get("skipped") else 1)
PY
}
if reusable; then
  say "reusing the models compiled in $WORK"
else
  rm -f "$WORK/cases.json"
  say "compiling the real models (no case begun after $((BUDGET - 150)) s, killed at $((BUDGET - 100)) s)"
  # timeout(1) signals the compile's whole process group (inductor's
  # compile workers too); the compile dies with timeout, also of a SIGKILL.
  limit=$((BUDGET - 100 - SECONDS))
  [ "$limit" -lt 30 ] && limit=30
  "${ORPHAN_KILL[@]}" timeout -k 10 "$limit" "${ORPHAN_KILL[@]}" \
    python3 "$HERE/real_models.py" "$WORK" --only "${WB_REAL_ONLY:-}" \
    --deadline-s "$((BUDGET - 150 - SECONDS))" >"$LOGS/compile.log" 2>&1 </dev/null &
  cpid=$!
  PIDS+=("$cpid")
  wait "$cpid"
  rc=$?
  if [ "$rc" != 0 ]; then
    say "the compile exited with $rc: $(tail -n 20 "$LOGS/compile.log")"
    # What was built before it stopped is still served and reported.
    [ -s "$WORK/cases.json" ] || exit 1
  fi
fi
say "$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("cases built: %d; failed: %s; skipped: %s; complete: %s" % (len(d["cases"]),
      [f["name"] for f in d["failed"]] or "none", d["skipped"] or "none", d["complete"]))' \
  "$WORK/cases.json")"
# Nothing of an earlier run may pass for this one's.
rm -f "$WORK"/out_*.safetensors
find "$LOGS" -type f ! -name compile.log -delete

# run_cases BACKEND SOCK DEVFILTER: a broker for every checkpoint the cases
# of that device need; two serving workers per case that must serve, one per
# case that must be refused; wbctl and NVML while they serve, then SIGTERM;
# results into $LOGS/<case>_<i>.{out,err,rc}.
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
  [ "$nmodels" -gt 0 ] || return 0
  local bargs=(--backend "$backend" --socket "$sock" --heartbeat-ms 200)
  [ "$backend" = cuda ] && bargs+=(--device 0)
  rm -f "$sock"
  # shellcheck disable=SC2086
  "${ORPHAN_KILL[@]}" "$WBROKERD" "${bargs[@]}" $args >"$LOGS/broker_$backend.log" 2>&1 &
  local broker=$!
  PIDS+=("$broker")
  ready() { kill -0 "$broker" && [ "$("$WBCTL" --socket "$sock" models --json | python3 -c "import json,sys; print(sum(m['state']=='ready' for m in json.load(sys.stdin)))")" = "$nmodels" ]; }
  gone() { ! kill -0 "$broker" 2>/dev/null; }
  ready_or_gone() { ready || gone; }
  wait_for "$(within 60)" ready_or_gone
  if ! ready; then
    say "the $backend broker did not load $nmodels models: $(tail -n 5 "$LOGS/broker_$backend.log")"
    kill -KILL "$broker" 2>/dev/null
    wait "$broker" 2>/dev/null
    return 1
  fi
  "$WBCTL" --socket "$sock" models --json >"$LOGS/models_$backend.json"
  python3 "$GPU_TESTS/gpumem.py" >"$LOGS/mem_before_$backend.json" 2>/dev/null
  # One line per worker to start: case name, index, worker options.
  local plan
  plan=$(python3 - "$WORK/cases.json" "$devf" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for c in d["cases"]:
    if (c["device"] == "cpu") != (sys.argv[2] == "cpu"):
        continue
    a = [f"--model {n}" for n, _ in c["checkpoints"]] + c["opts"]
    if c["device"] != "cpu":
        a.append("--device cuda:0")
    for i in range(1, 2 if c.get("expect") == "refused" else 3):
        print(c["name"], i, " ".join(a))
PY
)
  local wp=() wn=() outs=() name i wargs
  while read -r name i wargs; do
    [ -n "$name" ] || continue
    # shellcheck disable=SC2086
    "${ORPHAN_KILL[@]}" "$WORKER" --socket "$sock" --torch-lib "$TORCH_LIB" $wargs \
      --aoti "$WORK/$name.pt2" --input "$WORK/${name}_in.safetensors" \
      --output "$WORK/out_${name}_$i.safetensors" --iterations 3 --serve \
      >"$LOGS/${name}_$i.out" 2>"$LOGS/${name}_$i.err" </dev/null &
    wp+=($!)
    wn+=("${name}_$i")
    PIDS+=($!)
    outs+=("$LOGS/${name}_$i.out")
  done <<<"$plan"
  # Ready, or gone (a worker that failed, or was refused, holds no one up).
  allready() {
    local k=0 f
    for f in "$@"; do
      grep -q '^ready' "$f" || ! kill -0 "${wp[$k]}" 2>/dev/null || return 1
      k=$((k + 1))
    done
  }
  wait_for "$(within 90)" allready "${outs[@]}" || say "not every $backend worker became ready or exited"
  sleep 1
  python3 "$GPU_TESTS/gpumem.py" >"$LOGS/mem_serving_$backend.json" 2>/dev/null
  "$WBCTL" --socket "$sock" containers --json >"$LOGS/containers_$backend.json"
  "$WBCTL" --socket "$sock" containers >"$LOGS/containers_$backend.txt"
  # One deadline for all of them: they stop in parallel.
  local k until=$((SECONDS + $(within 30)))
  for k in "${!wp[@]}"; do kill -TERM "${wp[$k]}" 2>/dev/null; done
  for k in "${!wp[@]}"; do
    wait_exit "$((until - SECONDS))" "${wp[$k]}"
    echo $? >"$LOGS/${wn[$k]}.rc"
  done
  kill -TERM "$broker" 2>/dev/null
  wait_exit "$(within 30)" "$broker"
  echo $? >"$LOGS/broker_$backend.rc"
}

run_cases cuda "$WORK/cuda.sock" cuda
say "cuda cases done"
if grep -q '"device": "cpu"' "$WORK/cases.json"; then run_cases host "$WORK/host.sock" cpu; fi
say "cpu cases done"

python3 "$HERE/real_models_report.py" "$WORK" "$OUT/real_models.json" | tee -a "$LOG"
