#!/usr/bin/env bash
# GPU: Python workers. A Python process (tests/gpu/python_worker.py, over
# python/weightbroker) serves an AOTInductor package compiled here with
# package_constants_in_so=False on weights leased from a cuda broker, and a
# C worker (wb-aoti-worker) serves the same package from the same broker
# models at the same time. Checks: the Python worker's views are the leased
# memory, its output and the C worker's against eager PyTorch, no weight copy
# (torch.cuda.memory_allocated and NVML before/after, and NVML with the
# second worker), both containers listed by wbctl, clean exits.
#
#   tests/gpu/python_worker.sh OUT [BINDIR LIBDIR]
#
# BINDIR holds wbrokerd, wbctl and wb-aoti-worker, LIBDIR libwbclient.so
# (defaults: $WB_GPU_BIN, $WB_GPU_LIB, else .device/lead/{bin,lib}).
# Environment: WB_GPU_WORK (scratch, default /tmp/wbpy), WB_PY_BACKBONE_GIB
# (the shared backbone, default 2). Writes OUT/python_worker.json and logs.
set -uo pipefail

OUT=${1:?usage: tests/gpu/python_worker.sh OUT [BINDIR LIBDIR]}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WB_GPU_BIN=${2:-${WB_GPU_BIN:-$ROOT/.device/lead/bin}}
WB_GPU_LIB=${3:-${WB_GPU_LIB:-$ROOT/.device/lead/lib}}
WB_GPU_WORK=${WB_GPU_WORK:-/tmp/wbpy}
LOG_NAME=python_worker.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
GIB=${WB_PY_BACKBONE_GIB:-2}
# The package from this tree, over the staged libwbclient.
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export WB_CLIENT_LIBRARY=$LIB # the directory: libwbclient.so.0, else libwbclient.so

need_bins "$WBROKERD" "$WBCTL" "$WORKER"
[ -e "$LIB/libwbclient.so.0" ] || [ -e "$LIB/libwbclient.so" ] || { say "no libwbclient.so in $LIB"; exit 2; }
python3 -c 'import weightbroker, torch; assert torch.cuda.is_available()' 2>>"$LOG" ||
  { say "python3 cannot import weightbroker and torch with CUDA (see $LOG)"; exit 2; }

say "compiling the bf16 family (backbone $GIB GiB) with $(python3 -c 'import torch; print(torch.__version__)')"
python3 "$ROOT/examples/compile_models.py" "$WORK" --family bf16 --backbone-gib "$GIB" --dim 8192 \
  >>"$LOG" 2>&1 || { say "compile_models.py failed (see $LOG)"; exit 1; }

start_broker "$WORK/broker.sock" "$OUT/py_broker.log" \
  --model "pybase=$WORK/bf16_base.safetensors" --model "pyhead=$WORK/bf16_head_a.safetensors" || exit 1
mem_broker=$(mem_used)
say "broker ready; device memory used: $mem_broker"

python3 "$GPU_TESTS/python_worker.py" --socket "$SOCK" --base pybase --head pyhead \
  --pt2 "$WORK/bf16_a.pt2" --base-file "$WORK/bf16_base.safetensors" \
  --input "$WORK/bf16_input.safetensors" --ref "$WORK/bf16_a_ref.safetensors" \
  --output "$OUT/py_out.safetensors" --result "$OUT/py_worker.json" >"$OUT/py_worker.out" 2>&1 &
PY=$!
PIDS+=("$PY")
wait_for 180 has_line "$OUT/py_worker.out" "^ready" ||
  { say "the Python worker did not get ready ($(tail -n 20 "$OUT/py_worker.out"))"; exit 1; }
mem_py=$(mem_used)
say "Python worker $PY serving; device memory used: $mem_py"

"$BIN/wb-aoti-worker" --socket "$SOCK" --device cuda:0 --torch-lib "$TORCH_LIB" \
  --model pybase --model pyhead --aoti "$WORK/bf16_a.pt2" \
  --input "$WORK/bf16_input.safetensors" --output "$OUT/c_out.safetensors" --serve \
  >"$OUT/c_worker.out" 2>&1 &
CW=$!
PIDS+=("$CW")
wait_for 120 has_line "$OUT/c_worker.out" "^ready" ||
  fail "the C worker did not get ready ($(tail -n 5 "$OUT/c_worker.out"))"
mem_both=$(mem_used)
say "C worker $CW serving; device memory used: $mem_both"

ctl leases --json >"$OUT/py_leases.json"
ctl containers --json >"$OUT/py_containers.json"
python3 - "$OUT/py_leases.json" "$OUT/py_containers.json" "$PY" "$CW" >"$OUT/py_listing.txt" 2>&1 <<'PY' ||
import json, sys
leases, containers = (json.load(open(p)) for p in sys.argv[1:3])
py, cw = int(sys.argv[3]), int(sys.argv[4])
for pid in (py, cw):
    models = sorted(l["model"] for l in leases if l["pid"] == pid)
    assert models == ["pybase", "pyhead"], (pid, models)
pids = sorted(c["pid"] for c in containers)
assert pids == sorted([py, cw]), pids
print("leases and containers listed for both workers")
PY
  fail "wbctl does not list both workers: $(cat "$OUT/py_listing.txt")"

python3 "$GPU_TESTS/check_outputs.py" 0.02 "$WORK/bf16_a_ref.safetensors" \
  "$OUT/py_out.safetensors" "$OUT/c_out.safetensors" >"$OUT/py_outputs.json" ||
  fail "outputs differ from eager: $(cat "$OUT/py_outputs.json")"
same=$(python3 -c 'import sys, torch; from safetensors.torch import load_file as l
print(torch.equal(l(sys.argv[1])["output0"], l(sys.argv[2])["output0"]))' \
  "$OUT/py_out.safetensors" "$OUT/c_out.safetensors")
[ "$same" = True ] || fail "the Python and C workers' outputs differ"

kill -TERM "$PY" "$CW"
wait "$PY"
py_rc=$?
wait "$CW"
c_rc=$?
[ "$py_rc" = 0 ] || fail "the Python worker exited with $py_rc ($(tail -n 5 "$OUT/py_worker.out"))"
[ "$c_rc" = 0 ] || fail "the C worker exited with $c_rc"
wait_for 10 sh -c "! '$BIN/wbctl' --socket '$SOCK' leases --json | grep -q '\"id\"'" ||
  fail "leases remain after both workers ended"
stop_broker || fail "the broker exited with $? on SIGTERM"

python3 - "$OUT" "$mem_broker" "$mem_py" "$mem_both" "$same" "${#FAILS[@]}" <<'PY'
import datetime, json, os, sys
out = sys.argv[1]
mem_broker, mem_py, mem_both = (int(v) for v in sys.argv[2:5])
py = json.load(open(os.path.join(out, "py_worker.json")))
outputs = json.load(open(os.path.join(out, "py_outputs.json")))
w = py.get("weight_bytes", 0)
r = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
     "python_worker": py, "outputs_vs_eager": outputs,
     "python_equals_c": sys.argv[5] == "True", "weight_bytes": w,
     "device_used": {"broker_only": mem_broker, "with_python_worker": mem_py,
                     "with_both_workers": mem_both},
     "device_added": {"python_worker": mem_py - mem_broker, "c_worker": mem_both - mem_py},
     "failures_in_script": int(sys.argv[6])}
# Each worker adds its CUDA context and workspace, never the weights.
r["no_weight_copy"] = all(0 <= d < w // 2 for d in r["device_added"].values())
json.dump(r, open(os.path.join(out, "python_worker.json"), "w"), indent=1)
print(json.dumps({k: r[k] for k in ("weight_bytes", "device_added", "no_weight_copy",
                                     "python_equals_c")}))
sys.exit(0 if r["no_weight_copy"] else 1)
PY
[ $? = 0 ] || fail "a worker added device memory on the scale of the weights (see python_worker.json)"
[ -s "$OUT/py_worker.json" ] && grep -q '"failures": \[\]' "$OUT/py_worker.json" ||
  fail "the Python worker's checks failed: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["failures"])' "$OUT/py_worker.json" 2>&1)"
if [ ${#FAILS[@]} -eq 0 ]; then
  say "python worker (cuda): PASS"
else
  say "python worker (cuda): FAIL (${#FAILS[@]})"
  exit 1
fi
