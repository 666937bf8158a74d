#!/usr/bin/env bash
# GPU: the cuda-vmm slab transport (wbrokerd --backend cuda --cuda-slab vmm).
# Runs on the GPU test machine with prebuilt binaries; builds nothing.
#
#   tests/gpu/vmm.sh OUT
#
# Steps (each failure is listed at the end; exit 1 if any):
#  1. inputs: the fp32 test family (examples/compile_models.py), one U32
#     checkpoint each of 256 MiB, 1 GiB and 4 GiB, and a model whose forward
#     mutates a buffer (tests/gpu/vmm_models.py);
#  2. a vmm broker loads them; wbctl models/leases show cuda-vmm and ro;
#  3. wb_vmm_check verify: a lease is a read-only cuda-vmm mapping holding
#     the checkpoint's bytes (every tensor compared, and its XXH3);
#  4. acquire -> mapped -> release timings per slab size (vmm);
#  5. two fp32 variant-a workers and one variant-b worker (runtime constant
#     folding) serve on vmm leases; meanwhile a kernel store, a cudaMemcpy
#     and a cudaMemset into the mapping (one process each) must fail, and a
#     fresh process still reads the checkpoint's bytes; the serving workers
#     see no output change (wb-aoti-worker --serve counts mismatches against
#     its first output, bitwise);
#  6. the mutated-buffer model is refused on the vmm lease (WB_EPERM naming
#     the buffer) and runs with --copy-mutated;
#  7. the broker is SIGKILLed while the workers serve: they keep serving,
#     unchanged, and exit 0 on SIGTERM;
#  8. a legacy broker (--cuda-slab ipc): the same timings, the same workers;
#     their outputs must be bitwise equal to the vmm workers', and within
#     1e-3 (relative) of eager PyTorch's.
# Results: OUT/vmm.json, OUT/vmm.log and the processes' logs; a table last.
#
# Environment: WB_GPU_BIN (wbrokerd, wbctl, wb-aoti-worker, wb_vmm_check;
# default .device/ao/bin), WB_GPU_LIB (default .device/ao/lib), WB_GPU_WORK
# (scratch, default /tmp/wbgpu; compiled models are reused), WB_VMM_ROUNDS
# (timing rounds, 7), WB_GPU_BUDGET_S (seconds after which optional steps,
# 6 and the legacy timings, are skipped; 270).
set -uo pipefail

OUT=${1:?usage: tests/gpu/vmm.sh OUT}
LOG_NAME=vmm.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${WB_VMM_ROUNDS:-7}
BUDGET=${WB_GPU_BUDGET_S:-270}
VSOCK=$WORK/vmm.sock
ISOCK=$WORK/ipc.sock
RES=$OUT/vmm_results.jsonl
: >"$RES"

# serving_or_gone NAME PID: the worker printed "ready", or has exited.
serving_or_gone() { has_line "$OUT/$1.out" "^ready" || ! kill -0 "$2" 2>/dev/null; }

[ -x "$BIN/wb_vmm_check" ] || { say "missing $BIN/wb_vmm_check (build with CUDA: build/tests/wb_vmm_check)"; exit 2; }
need_bins "$WBROKERD" "$WBCTL" "$WORKER" "$BIN/wb_vmm_check"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1 ||
  { say "no GPU visible"; exit 2; }
say "gpu: $(cat "$OUT/gpu.txt")"

# ---- 1. inputs -------------------------------------------------------------------
if [ ! -s "$WORK/fp32_a.pt2" ] || [ ! -s "$WORK/fp32_b.pt2" ] || [ ! -s "$WORK/fp32_a_ref.safetensors" ]; then
  python3 "$ROOT/examples/compile_models.py" "$WORK" --family fp32 >"$OUT/compile_fp32.log" 2>&1 &
  cpid=$!
  PIDS+=("$cpid")
else
  cpid=
  say "reusing the compiled fp32 family in $WORK"
fi
python3 "$GPU_TESTS/vmm_models.py" mutated "$WORK" >"$OUT/compile_mut.log" 2>&1 &
mpid=$!
PIDS+=("$mpid")
python3 "$GPU_TESTS/vmm_models.py" slabs "$WORK" >"$OUT/slabs.log" 2>&1 ||
  { say "could not write the timing checkpoints: $(tail -n 3 "$OUT/slabs.log")"; exit 1; }
if [ -n "$cpid" ]; then
  wait "$cpid" || { say "fp32 compile failed: $(tail -n 20 "$OUT/compile_fp32.log")"; exit 1; }
fi
MUT=1
wait "$mpid" || {
  MUT=0
  fail "the mutated-buffer model did not compile: $(tail -n 5 "$OUT/compile_mut.log")"
}
say "inputs ready: $(cat "$OUT/slabs.log") $(tail -n 1 "$OUT/compile_mut.log")"

MODELS=(--model "fp32_base=$WORK/fp32_base.safetensors" --model "fp32_head_a=$WORK/fp32_head_a.safetensors"
  --model "fp32_head_b=$WORK/fp32_head_b.safetensors" --model "t256m=$WORK/t256m.safetensors"
  --model "t1g=$WORK/t1g.safetensors" --model "t4g=$WORK/t4g.safetensors")
if [ "$MUT" = 1 ]; then
  MODELS+=(--model "mut=$WORK/mut.safetensors")
fi

# slab_broker NAME SOCKET SLAB: a cuda broker of every model with
# --cuda-slab SLAB (start_broker: BROKER holds its pid).
slab_broker() {
  start_broker "$2" "$OUT/broker_$1.log" --cuda-slab "$3" "${MODELS[@]}" || return 1
  say "broker $1 (pid $BROKER, --cuda-slab $3) ready: $(grep -o 'event=backend.*' "$OUT/broker_$1.log" | head -n 1)"
}

# start_worker NAME SOCKET VARIANT ARGS...: an fp32 worker; LAST holds its pid.
start_worker() {
  local name=$1 sock=$2 v=$3
  shift 3
  "$BIN/wb-aoti-worker" --socket "$sock" --device cuda:0 --torch-lib "$TORCH_LIB" \
    --model fp32_base --model "fp32_head_$v" --aoti "$WORK/fp32_$v.pt2" \
    --input "$WORK/fp32_input.safetensors" --output "$WORK/out_$name.safetensors" \
    "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" &
  LAST=$!
  PIDS+=("$LAST")
}

# timings SOCKET LABEL: acquire -> mapped -> release per slab size.
timings() {
  if "$BIN/wb_vmm_check" time "$1" "$ROUNDS" t256m t1g t4g >"$OUT/time_$2.jsonl" 2>"$OUT/time_$2.err"; then
    while read -r line; do record "{\"import_$2\": $line}"; done <"$OUT/time_$2.jsonl"
    say "timings $2: $(tr '\n' ' ' <"$OUT/time_$2.jsonl")"
  else
    fail "timings on $2 failed: $(tail -n 3 "$OUT/time_$2.err")"
  fi
}

# ---- 2. the vmm broker -------------------------------------------------------------
VMM_OK=0
slab_broker vmm "$VSOCK" vmm && VMM_OK=1
if [ "$VMM_OK" = 1 ]; then
  "$BIN/wbctl" --socket "$VSOCK" models >>"$LOG"
  "$BIN/wbctl" --socket "$VSOCK" models --json >"$OUT/models_vmm.json"
  bad=$(py "[m['name'] for m in d if m.get('transport') != 'cuda-vmm' or m.get('access') != 'ro']" <"$OUT/models_vmm.json")
  [ "$bad" = "[]" ] || fail "models not shown as cuda-vmm/ro: $bad"
  [ -S "$VSOCK.fd" ] || fail "the vmm broker has no descriptor channel $VSOCK.fd"
  if grep -q "cuda_vmm_seal_failed" "$OUT/broker_vmm.log"; then
    fail "the broker could not make its own mapping read-only: $(grep -m1 cuda_vmm_seal_failed "$OUT/broker_vmm.log")"
  fi

  # ---- 3. bytes and mapping --------------------------------------------------------
  for m in fp32_base t256m; do
    "$BIN/wb_vmm_check" verify "$VSOCK" "$m" "$WORK/$m.safetensors" >"$OUT/verify_$m.out" 2>&1 ||
      fail "verify $m: $(tail -n 3 "$OUT/verify_$m.out")"
    say "verify $m: $(tr '\n' ';' <"$OUT/verify_$m.out")"
  done

  # ---- 4. vmm timings ----------------------------------------------------------------
  timings "$VSOCK" vmm

  # ---- 5. workers, and writes that must fail -------------------------------------------
  start_worker vmm_a1 "$VSOCK" a --iterations 3 --serve
  WA1=$LAST
  start_worker vmm_a2 "$VSOCK" a --iterations 3 --serve
  WA2=$LAST
  start_worker vmm_b1 "$VSOCK" b --iterations 3 --serve
  WB1=$LAST
  for n in vmm_a1:"$WA1" vmm_a2:"$WA2" vmm_b1:"$WB1"; do
    wait_for 120 serving_or_gone "${n%%:*}" "${n#*:}"
    has_line "$OUT/${n%%:*}.out" "^ready" || fail "worker ${n%%:*} not ready: $(tail -n 3 "$OUT/${n%%:*}.err")"
  done
  "$BIN/wbctl" --socket "$VSOCK" leases >>"$LOG"
  "$BIN/wbctl" --socket "$VSOCK" leases --json >"$OUT/leases_vmm.json"
  bad=$(py "[l['model'] for l in d if l.get('transport') != 'cuda-vmm' or l.get('access') != 'ro']" <"$OUT/leases_vmm.json")
  [ "$bad" = "[]" ] || fail "leases not shown as cuda-vmm/ro: $bad"
  for how in write-kernel write-memcpy write-memset; do
    "$BIN/wb_vmm_check" "$how" "$VSOCK" fp32_base >"$OUT/$how.out" 2>&1
    rc=$?
    say "$how: exit $rc: $(tr '\n' ';' <"$OUT/$how.out")"
    if [ "$rc" != 0 ] || ! grep -q "^write refused: " "$OUT/$how.out"; then
      fail "$how into the vmm mapping was not refused"
    fi
    record "{\"$how\": {\"exit\": $rc, \"refused\": $(grep -q '^write refused' "$OUT/$how.out" && echo true || echo false)}}"
  done
  "$BIN/wb_vmm_check" verify "$VSOCK" fp32_base "$WORK/fp32_base.safetensors" >"$OUT/verify_after_writes.out" 2>&1 ||
    fail "the bytes changed after the write attempts: $(tail -n 3 "$OUT/verify_after_writes.out")"
  for p in "$WA1" "$WA2" "$WB1"; do
    kill -0 "$p" 2>/dev/null || fail "worker $p died during the write attempts"
  done

  # ---- 6. a model that writes a constant ---------------------------------------------
  if [ "$MUT" = 1 ] && ! over_budget; then
    "$BIN/wb-aoti-worker" --socket "$VSOCK" --device cuda:0 --torch-lib "$TORCH_LIB" --model mut \
      --aoti "$WORK/mut.pt2" --input "$WORK/mut_input.safetensors" >"$OUT/mut_refused.out" 2>"$OUT/mut_refused.err"
    rc=$?
    say "mutated model on the vmm lease: exit $rc: $(tail -n 1 "$OUT/mut_refused.err")"
    if [ "$rc" = 0 ] || ! grep -q "WB_EPERM.*constant 'count' is written by the compiled graph" "$OUT/mut_refused.err"; then
      fail "the mutated buffer was not refused with WB_EPERM naming it"
    fi
    "$BIN/wb-aoti-worker" --socket "$VSOCK" --device cuda:0 --torch-lib "$TORCH_LIB" --model mut \
      --aoti "$WORK/mut.pt2" --input "$WORK/mut_input.safetensors" --copy-mutated \
      >"$OUT/mut_copy.out" 2>"$OUT/mut_copy.err"
    rc2=$?
    [ "$rc2" = 0 ] || fail "--copy-mutated did not run: $(tail -n 3 "$OUT/mut_copy.err")"
    record "{\"mutated\": {\"refused_exit\": $rc, \"copy_exit\": $rc2}}"
  fi

  # ---- 7. the broker dies under the workers ----------------------------------------------
  sleep 1
  kill -KILL "$BROKER"
  wait "$BROKER" 2>/dev/null
  say "vmm broker SIGKILLed; the workers keep serving for 3 s"
  sleep 3
  for n in vmm_a1:"$WA1" vmm_a2:"$WA2" vmm_b1:"$WB1"; do
    p=${n#*:}
    kill -0 "$p" 2>/dev/null || fail "worker ${n%%:*} died with the broker"
  done
  for n in vmm_a1:"$WA1" vmm_a2:"$WA2" vmm_b1:"$WB1"; do
    p=${n#*:}
    kill -TERM "$p" 2>/dev/null
    wait "$p"
    rc=$?
    served=$(grep '^served' "$OUT/${n%%:*}.out")
    say "worker ${n%%:*}: exit $rc, $served"
    [ "$rc" = 0 ] || fail "worker ${n%%:*} exited with $rc (3: its outputs changed while serving)"
    record "{\"${n%%:*}\": {\"exit\": $rc, \"served\": \"$served\"}}"
  done
fi

# ---- 8. legacy IPC: the same timings and workers -----------------------------------------
if slab_broker ipc "$ISOCK" ipc; then
  if ! over_budget; then timings "$ISOCK" ipc; else say "ipc timings skipped (budget)"; fi
  for n in ipc_a1:a ipc_a2:a ipc_b1:b; do
    start_worker "${n%%:*}" "$ISOCK" "${n#*:}" --iterations 3
    wait "$LAST" || fail "worker ${n%%:*} exited with $?: $(tail -n 3 "$OUT/${n%%:*}.err")"
  done
  stop_broker || fail "the ipc broker exited with $? on SIGTERM"
fi
if [ "$VMM_OK" = 1 ]; then
  python3 - "$WORK" >"$OUT/bitwise.json" <<'PY' || fail "vmm and ipc outputs differ: $(cat "$OUT/bitwise.json")"
import json, os, sys
import torch
from safetensors.torch import load_file
w = sys.argv[1]
res = {}
for v, names in (("a", ("vmm_a1", "vmm_a2", "ipc_a1", "ipc_a2")), ("b", ("vmm_b1", "ipc_b1"))):
    outs = {n: load_file(os.path.join(w, f"out_{n}.safetensors"))["output0"] for n in names}
    first = outs[names[0]]
    res[v] = {n: bool(torch.equal(first, t)) for n, t in outs.items()}
print(json.dumps(res))
sys.exit(0 if all(all(r.values()) for r in res.values()) else 1)
PY
  say "bitwise: $(cat "$OUT/bitwise.json")"
  record "{\"bitwise\": $(cat "$OUT/bitwise.json")}"
  for v in a b; do
    python3 "$GPU_TESTS/check_outputs.py" 1e-3 "$WORK/fp32_${v}_ref.safetensors" \
      "$WORK/out_vmm_${v}1.safetensors" >"$OUT/acc_$v.json" || fail "vmm $v against eager: $(cat "$OUT/acc_$v.json")"
    record "{\"acc_$v\": $(cat "$OUT/acc_$v.json")}"
    say "against eager ($v): $(cat "$OUT/acc_$v.json")"
  done
fi

# ---- results ------------------------------------------------------------------------------
python3 - "$RES" "$OUT/vmm.json" "${#FAILS[@]}" "$(cat "$OUT/gpu.txt")" <<'PY' | tee -a "$LOG"
import datetime, json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "gpu": sys.argv[4], "failures": int(sys.argv[3]), "import": {}, "checks": {}}
for r in rows:
    for k, v in r.items():
        if k.startswith("import_"):
            res["import"].setdefault(v["model"], {})[k[len("import_"):]] = v
        else:
            res["checks"][k] = v
json.dump(res, open(sys.argv[2], "w"), indent=1)
print(f"{'slab':>8} {'bytes':>12} {'vmm acquire ms':>15} {'ipc acquire ms':>15} {'vmm release ms':>15} {'ipc release ms':>15}")
for name, d in res["import"].items():
    vm, ip = d.get("vmm", {}), d.get("ipc", {})
    size = vm.get("slab_bytes", ip.get("slab_bytes", 0))
    f = lambda x, k: f"{x[k]:.3f}" if k in x else "-"
    print(f"{name:>8} {size:>12} {f(vm, 'acquire_ms_median'):>15} {f(ip, 'acquire_ms_median'):>15} "
          f"{f(vm, 'release_ms_median'):>15} {f(ip, 'release_ms_median'):>15}")
for k, v in res["checks"].items():
    print(f"{k}: {json.dumps(v)}")
print("failures:", res["failures"])
PY
finish
