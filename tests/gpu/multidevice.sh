#!/usr/bin/env bash
# Several devices per broker, on the GPU test machine: models placed on
# devices, leases by device, per-device listing and metrics, refusals.
#
#   tests/gpu/multidevice.sh OUT
#
# On any number of GPUs (one is enough):
#  1. compile the small fp32 family (examples/compile_models.py --family fp32)
#     and write a 1 GiB checkpoint for load timings;
#  2. start one cuda broker with models placed @0 (fp32_base0, big) and @all
#     (fp32_base, fp32_head_a, fp32_head_b); check that wbctl models --json
#     lists one ready copy per device with the broker's UUIDs, that the table
#     has one row per device, and that the metrics carry the device label;
#  3. run wb-aoti-worker on (fp32_base0, fp32_head_a) and on (fp32_base,
#     fp32_head_b) and compare their outputs with eager PyTorch;
#  4. refusals: a lease for a device this process lacks (wb-demo-worker
#     --device N, N = the device count), for an unknown UUID, a load placed
#     on a device the broker does not see (wbctl load ...@N);
# and with two GPUs or more (guarded by the device count; NOT run on a
# one-GPU machine):
#  5. one worker per device, each under its own CUDA_VISIBLE_DEVICES (by
#     UUID), every lease on its own device's copy, outputs checked; device
#     memory per GPU (NVML) before the broker, after the loads, with workers;
#  6. a worker that sees only device 1 asking for fp32_base0 (placed @0):
#     refused by the broker, and with --allow-peer refused by the client
#     (it cannot see device 0);
#  7. load throughput of a WB_MD_LOAD_GIB (8) GiB checkpoint from the page
#     cache to device 0, then to devices 0 and 1 at once (the file read once,
#     copied to each), WB_MD_LOAD_REPS (3) times each, alternated, as
#     "multi_device" (medians, and every figure) in OUT/multidevice.json.
#
# The features part is its own script, tests/gpu/multidevice_features.sh:
# a rollout and rollback followed by a worker per device, a publish into a
# model on both devices (copy GB/s per device, peer or staged), shared
# tensors per device and the memory budget per device, each also run @0
# alone (the parts that need two GPUs are skipped on one, with the reason).
#
# Writes OUT/multidevice.json, logs, and prints a short table last. Budget:
# WB_GPU_BUDGET_S (default 240 s); optional steps are skipped past it.
# Environment as tests/gpu/run.sh: WB_GPU_BIN, WB_GPU_LIB, WB_GPU_WORK.
set -uo pipefail

OUT=${1:?usage: tests/gpu/multidevice.sh OUT}
LOG_NAME=multidevice.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
WORK=$WORK/multidevice
BUDGET=${WB_GPU_BUDGET_S:-240}
LOAD_GIB=${WB_MD_LOAD_GIB:-8}
LOAD_REPS=${WB_MD_LOAD_REPS:-3}
SOCK=$WORK/broker.sock
RES=$OUT/results.jsonl
mkdir -p "$WORK"
: >"$RES"
NOT_RUN=()

pass() { say "ok: $*"; }

need_bins "$WBROKERD" "$WBCTL" "$WORKER" "$DEMO"
NGPU=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | grep -c '^GPU-')
[ "$NGPU" -ge 1 ] || { say "no GPU visible"; exit 2; }
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv,noheader | tee -a "$LOG" >&2
say "$NGPU GPU(s); torch $(python3 -c 'import torch; print(torch.__version__)')"
METRICS=0
"$WBROKERD" --version | grep -q '+metrics' && METRICS=1

# ---- 1. models ----------------------------------------------------------------
if [ ! -s "$WORK/fp32_a.pt2" ] || [ ! -s "$WORK/fp32_b.pt2" ]; then
  say "compiling the fp32 family"
  python3 "$ROOT/examples/compile_models.py" "$WORK" --family fp32 >"$OUT/compile.log" 2>&1 ||
    { say "compile failed"; tail -n 30 "$OUT/compile.log" >&2; exit 1; }
fi
python3 - "$WORK/big.safetensors" <<'PY' || { say "cannot write the 1 GiB checkpoint"; exit 1; }
# 8 tensors of 128 MiB, any bytes: the load's speed is what is measured.
import json, os, struct, sys
path, n, size = sys.argv[1], 8, 128 << 20
if os.path.exists(path) and os.path.getsize(path) > n * size:
    sys.exit(0)
hdr = {f"w{i}": {"dtype": "U8", "shape": [size], "data_offsets": [i * size, (i + 1) * size]}
       for i in range(n)}
raw = json.dumps(hdr).encode()
raw += b" " * (-len(raw) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    for i in range(n):
        f.write(bytes((i * 37 + k) & 0xFF for k in range(256)) * (size // 256))
PY
if [ "$NGPU" -ge 2 ]; then
  python3 - "$WORK/load.safetensors" "$LOAD_GIB" <<'PY' || { say "cannot write the ${LOAD_GIB} GiB checkpoint"; exit 1; }
# LOAD_GIB GiB in tensors of 128 MiB, for the load timings (step 7).
import json, os, struct, sys
path, size = sys.argv[1], 128 << 20
n = int(sys.argv[2]) * 8
hdr = {f"w{i}": {"dtype": "U8", "shape": [size], "data_offsets": [i * size, (i + 1) * size]}
       for i in range(n)}
raw = json.dumps(hdr).encode()
raw += b" " * (-len(raw) % 8)
if os.path.exists(path) and os.path.getsize(path) == 8 + len(raw) + n * size:
    sys.exit(0)
block = bytes(range(256)) * (size // 256)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    for i in range(n):
        f.write(block)
PY
  cat "$WORK/load.safetensors" >/dev/null # from the page cache, as bench/RESULTS.md's loads
fi
say "models ready"

# ---- 2. one broker, copies per device ------------------------------------------
declare -a MEM0
for ((i = 0; i < NGPU; i++)); do MEM0[i]=$(mem_used "$i"); done
PORT=$((20000 + RANDOM % 20000))
MARGS=()
[ "$METRICS" = 1 ] && MARGS=(--metrics "127.0.0.1:$PORT")
start_broker "$SOCK" "$OUT/broker.log" "${MARGS[@]}" \
  --model "fp32_base0=$WORK/fp32_base.safetensors@0" \
  --model "fp32_base=$WORK/fp32_base.safetensors@all" \
  --model "fp32_head_a=$WORK/fp32_head_a.safetensors@all" \
  --model "fp32_head_b=$WORK/fp32_head_b.safetensors@all" \
  --model "big=$WORK/big.safetensors@0" || exit 1
ctl models --json >"$OUT/models.json"
ctl models >"$OUT/models.txt"
cat "$OUT/models.txt" >>"$LOG"
# The broker's devices, as it logged them: "device=N uuid=GPU-...".
mapfile -t UUIDS < <(grep -o 'event=device device=[0-9]* uuid=[^ ]*' "$OUT/broker.log" |
  sed 's/.*uuid=//')
[ "${#UUIDS[@]}" = "$NGPU" ] || fail "the broker logged ${#UUIDS[@]} devices, nvidia-smi lists $NGPU"
UUID_JSON=$(printf '%s\n' "${UUIDS[@]}" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().split()))')
record "{\"gpus\": $NGPU, \"uuids\": $UUID_JSON}"

# Per-device state: @all has one ready copy per device with its UUID, @0 one.
check=$(python3 -c "
import json, sys
d = json.load(sys.stdin)
u = $UUID_JSON
m = {x['name']: x for x in d}
ok = all([(c['device'], c['uuid'], c['state']) for c in m[n]['copies']] ==
         [(i, u[i], 'ready') for i in range(len(u))] for n in ('fp32_base', 'fp32_head_a', 'fp32_head_b'))
ok = ok and [(c['device'], c['uuid'], c['state']) for c in m['fp32_base0']['copies']] == [(0, u[0], 'ready')]
ok = ok and all(c['slab_bytes'] >= m[n]['bytes'] for n in m for c in m[n]['copies'])
print(ok)" <"$OUT/models.json")
if [ "$check" = True ]; then
  pass "wbctl models: one ready copy per placed device, with the broker's UUIDs"
else
  fail "wbctl models --json copies are wrong: $(py "[(x['name'], x['copies']) for x in d]" <"$OUT/models.json")"
fi
rows=$(grep -c '^fp32_head_a ' "$OUT/models.txt")
if [ "$rows" = "$NGPU" ]; then
  pass "wbctl models: $rows row(s) for fp32_head_a"
else
  fail "wbctl models shows $rows rows for fp32_head_a, not $NGPU"
fi
# One line per record: the listing is pretty-printed.
record "{\"models\": $(python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' <"$OUT/models.json")}"

if [ "$METRICS" = 1 ]; then
  python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' \
    "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics.txt" || fail "GET /metrics failed"
  for ((i = 0; i < NGPU; i++)); do
    want="wb_model_copies{model=\"fp32_head_a\",device=\"$i\",uuid=\"${UUIDS[i]}\",state=\"ready\"} 1"
    grep -qxF "$want" "$OUT/metrics.txt" || fail "metrics lack: $want"
    grep -q "^wb_model_bytes{model=\"fp32_head_a\",device=\"$i\",backend=\"cuda\"} " "$OUT/metrics.txt" ||
      fail "metrics lack wb_model_bytes of fp32_head_a on device $i"
  done
  pass "metrics: wb_model_copies and wb_model_bytes with the device label"
else
  NOT_RUN+=("metrics: this wbrokerd was built without libmicrohttpd")
fi
declare -a MEM1
for ((i = 0; i < NGPU; i++)); do MEM1[i]=$(mem_used "$i"); done

# ---- 3. AOTI workers on the copies ------------------------------------------------
# run_worker NAME BASE VARIANT [ENV...]: one run, 3 iterations, output checked.
run_worker() {
  local name=$1 base=$2 v=$3
  shift 3
  env "$@" "$WORKER" --socket "$SOCK" --device cuda:0 --torch-lib "$TORCH_LIB" \
    --model "$base" --model "fp32_head_$v" --aoti "$WORK/fp32_$v.pt2" \
    --input "$WORK/fp32_input.safetensors" --output "$WORK/out_$name.safetensors" \
    --iterations 3 >"$OUT/$name.out" 2>"$OUT/$name.err"
  local rc=$?
  [ "$rc" = 0 ] || { fail "worker $name exited with $rc: $(tail -n 3 "$OUT/$name.err")"; return 1; }
  python3 "$GPU_TESTS/check_outputs.py" 1e-3 "$WORK/fp32_${v}_ref.safetensors" \
    "$WORK/out_$name.safetensors" >"$OUT/acc_$name.json" ||
    { fail "worker $name outputs differ from eager: $(cat "$OUT/acc_$name.json")"; return 1; }
  local res
  res=$(grep '^result ' "$OUT/$name.out" | tail -n 1 | cut -d' ' -f2-)
  record "{\"acc_$name\": $(cat "$OUT/acc_$name.json"), \"result_$name\": ${res:-null}}"
  pass "worker $name ($base + fp32_head_$v): outputs match eager ($(py "d['max_rel_err']" <"$OUT/acc_$name.json"))"
}
run_worker at0 fp32_base0 a
run_worker atall fp32_base b

# ---- 4. refusals ------------------------------------------------------------------
"$DEMO" --socket "$SOCK" --model fp32_head_a --device "$NGPU" --hold 0 >"$OUT/nodev.out" 2>"$OUT/nodev.err"
rc=$?
if [ "$rc" = 1 ] && grep -qF "this process has no CUDA device $NGPU; it sees: 0=${UUIDS[0]}" "$OUT/nodev.err"; then
  pass "a lease for device $NGPU is refused: $(cat "$OUT/nodev.err")"
else
  fail "a lease for device $NGPU: exit $rc, $(cat "$OUT/nodev.err")"
fi
BOGUS=GPU-00000000-1111-2222-3333-444444444444
"$DEMO" --socket "$SOCK" --model fp32_head_a --device "$BOGUS" --hold 0 >"$OUT/bogus.out" 2>"$OUT/bogus.err"
rc=$?
if [ "$rc" = 1 ] && grep -qF "model 'fp32_head_a' has no ready copy on device $BOGUS; its copies: 0=${UUIDS[0]} ready" "$OUT/bogus.err"; then
  pass "a lease for an unknown UUID is refused: $(cat "$OUT/bogus.err")"
else
  fail "a lease for an unknown UUID: exit $rc, $(cat "$OUT/bogus.err")"
fi
if "$DEMO" --socket "$SOCK" --model fp32_head_a --hold 0 >"$OUT/default.out" 2>"$OUT/default.err" &&
  grep -q "model fp32_head_a device 0" "$OUT/default.out" && grep -q "^verified" "$OUT/default.out"; then
  pass "a lease on the current device: $(head -n 2 "$OUT/default.out" | tr '\n' ' ')"
else
  fail "a lease on the current device: $(cat "$OUT/default.out" "$OUT/default.err")"
fi
ctl load nowhere "$WORK/fp32_head_a.safetensors@$NGPU" >"$OUT/loadnowhere.out" 2>"$OUT/loadnowhere.err"
rc=$?
if [ "$rc" = 1 ] && grep -qF "placement names device $NGPU, which this broker does not see (it sees: 0=${UUIDS[0]}" "$OUT/loadnowhere.err"; then
  pass "a load placed on device $NGPU is refused: $(cat "$OUT/loadnowhere.err")"
else
  fail "a load placed on device $NGPU: exit $rc, $(cat "$OUT/loadnowhere.err")"
fi

# ---- 5-7. two devices or more ---------------------------------------------------------
big_seconds() { ctl models --json | py "[m['load_seconds'] for m in d if m['name'] == '$1'][0]"; }
BIG_BYTES=$(ctl models --json | py "[m['bytes'] for m in d if m['name'] == 'big'][0]")
ONE_S=$(big_seconds big)
record "{\"single_device\": {\"bytes\": $BIG_BYTES, \"seconds\": $ONE_S}}"
say "1 GiB to device 0 through the fan-out: ${ONE_S}s"
if [ "$NGPU" -ge 2 ]; then
  # 5. a worker per device, each seeing only its own GPU.
  declare -A WP
  for ((i = 0; i < 2; i++)); do
    CUDA_VISIBLE_DEVICES=${UUIDS[i]} "$WORKER" --socket "$SOCK" --device cuda:0 --torch-lib "$TORCH_LIB" \
      --model fp32_base --model fp32_head_a --aoti "$WORK/fp32_a.pt2" \
      --input "$WORK/fp32_input.safetensors" --output "$WORK/out_dev$i.safetensors" \
      --iterations 3 --serve >"$OUT/dev$i.out" 2>"$OUT/dev$i.err" &
    WP[$i]=$!
    PIDS+=("$!")
  done
  for ((i = 0; i < 2; i++)); do
    wait_for 120 grep -q '^ready' "$OUT/dev$i.out" || fail "worker on device $i not ready: $(tail -n 3 "$OUT/dev$i.err")"
  done
  ctl leases --json >"$OUT/leases_two.json"
  for ((i = 0; i < 2; i++)); do
    got=$(py "sorted(set((l['device'], l['device_uuid']) for l in d if l['pid'] == ${WP[$i]}))" <"$OUT/leases_two.json")
    if [ "$got" = "[($i, '${UUIDS[i]}')]" ]; then
      pass "the worker under CUDA_VISIBLE_DEVICES=${UUIDS[i]} leases device $i's copies"
    else
      fail "the worker on device $i holds leases on $got"
    fi
  done
  declare -a MEM2
  for ((i = 0; i < NGPU; i++)); do MEM2[i]=$(mem_used "$i"); done
  for ((i = 0; i < 2; i++)); do
    kill -TERM "${WP[$i]}"
    wait "${WP[$i]}" || fail "worker on device $i exited with $?"
    python3 "$GPU_TESTS/check_outputs.py" 1e-3 "$WORK/fp32_a_ref.safetensors" \
      "$WORK/out_dev$i.safetensors" >"$OUT/acc_dev$i.json" ||
      fail "worker on device $i: outputs differ: $(cat "$OUT/acc_dev$i.json")"
    record "{\"acc_dev$i\": $(cat "$OUT/acc_dev$i.json")}"
  done
  mem=$(python3 -c 'import json,sys; a=sys.argv[1:]; n=len(a)//3
print(json.dumps([{"gpu": i, "idle": int(a[i]), "broker": int(a[n+i]), "workers": int(a[2*n+i])} for i in range(n)]))' \
    "${MEM0[@]}" "${MEM1[@]}" "${MEM2[@]}")
  record "{\"mem_per_gpu\": $mem}"
  say "device memory per GPU: $mem"

  # 6. a model placed on device 0 only, from a process that sees device 1.
  CUDA_VISIBLE_DEVICES=${UUIDS[1]} "$DEMO" --socket "$SOCK" --model fp32_base0 --hold 0 \
    >"$OUT/only1.out" 2>"$OUT/only1.err"
  rc=$?
  if [ "$rc" = 1 ] && grep -qF "model 'fp32_base0' has no ready copy on device ${UUIDS[1]}" "$OUT/only1.err"; then
    pass "no copy on the worker's device: $(cat "$OUT/only1.err")"
  else
    fail "fp32_base0 from device 1: exit $rc, $(cat "$OUT/only1.err")"
  fi
  CUDA_VISIBLE_DEVICES=${UUIDS[1]} "$DEMO" --socket "$SOCK" --model fp32_base0 --allow-peer --hold 0 \
    >"$OUT/peer.out" 2>"$OUT/peer.err"
  rc=$?
  if [ "$rc" = 1 ] && grep -qF "device ${UUIDS[0]} (the broker's device 0) is not visible in this process" "$OUT/peer.err"; then
    pass "peer access to a device this process cannot see: $(cat "$OUT/peer.err")"
  else
    fail "fp32_base0 with --allow-peer from device 1: exit $rc, $(cat "$OUT/peer.err")"
  fi
  # Seeing both devices, asking for device 1 with peer access: device 0's copy.
  if "$DEMO" --socket "$SOCK" --model fp32_base0 --device 1 --allow-peer --hold 0 \
    >"$OUT/peer2.out" 2>"$OUT/peer2.err" && grep -q "model fp32_base0 device 0" "$OUT/peer2.out" &&
    grep -q "^verified" "$OUT/peer2.out"; then
    pass "device 1 with --allow-peer gets device 0's copy: $(head -n 2 "$OUT/peer2.out" | tr '\n' ' ')"
  else
    fail "fp32_base0 on device 1 with --allow-peer: $(cat "$OUT/peer2.out" "$OUT/peer2.err")"
  fi

  # 7. load throughput: LOAD_GIB GiB to device 0, then to devices 0 and 1 at
  # once (one staging read fanned out), each loaded alone, then unloaded.
  if ! over_budget; then
    gone() { ! ctl models --json | grep -q "\"name\": *\"$1\""; }
    load_timed() { # load_timed NAME PLACEMENT: the model's row into OUT/NAME.row
      ctl load "$1" "$WORK/load.safetensors@$2" >"$OUT/load_$1.txt" 2>&1 ||
        { fail "wbctl load $1 @$2: $(cat "$OUT/load_$1.txt")"; return 1; }
      ctl models --json | py "[m for m in d if m['name'] == '$1'][0]" >"$OUT/$1.row"
      ctl unload "$1" >>"$OUT/load_$1.txt" 2>&1
      wait_for 60 gone "$1" || fail "$1 still listed 60 s after its unload"
    }
    ok=1
    for ((r = 1; r <= LOAD_REPS; r++)); do # alternated: one device, then two
      if ! load_timed "load1_$r" 0 || ! load_timed "load2_$r" 0,1; then
        ok=0
        break
      fi
    done
    if [ "$ok" = 1 ]; then
      cat "$OUT"/load1_*.row "$OUT"/load2_*.row >>"$LOG"
      md=$(python3 - "$OUT" "$LOAD_REPS" <<'PY'
import ast, json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
rows = {k: [ast.literal_eval(open(f"{out}/load{k}_{r}.row").read()) for r in range(1, reps + 1)]
        for k in (1, 2)}
b = rows[1][0]["bytes"]
t1 = [x["load_seconds"] for x in rows[1]]
t2 = [x["load_seconds"] for x in rows[2]]
m1, m2 = statistics.median(t1), statistics.median(t2)
print(json.dumps({"devices": 2, "bytes": b, "tensors": rows[1][0].get("tensors"), "reps": reps,
  "order": "alternated: one device, then two, each rep",
  "seconds_one_device": m1, "seconds_two_devices": m2,
  "seconds_one_device_all": t1, "seconds_two_devices_all": t2,
  "gbps_one_device": b / m1 / 1e9, "gbps_per_device_two": b / m2 / 1e9, "gbps_aggregate_two": 2 * b / m2 / 1e9,
  "two_over_one_per_device": m1 / m2,
  "read_gbps_one": [x["load_stages"]["read"]["gbps"] for x in rows[1]],
  "read_gbps_two": [x["load_stages"]["read"]["gbps"] for x in rows[2]],
  "copy_seconds_one": [[c.get("copy_seconds") for c in x["copies"]] for x in rows[1]],
  "copy_seconds_two": [[c.get("copy_seconds") for c in x["copies"]] for x in rows[2]],
  "states_two": sorted({c["state"] for x in rows[2] for c in x["copies"]}),
  "copies_two": sorted({len(x["copies"]) for x in rows[2]})}))
PY
      )
      record "{\"multi_device\": $md}"
      say "multi_device: $md"
      py "d['states_two'] == ['ready'] and d['copies_two'] == [2]" <<<"$md" | grep -q True ||
        fail "load2 copies: $md"
    fi
  else
    NOT_RUN+=("the two-device load timing: over the ${BUDGET}s budget")
  fi
else
  NOT_RUN+=("two GPUs: workers per device under CUDA_VISIBLE_DEVICES, device memory per GPU, a model on device 0 from a process on device 1 (with and without --allow-peer), load throughput to two devices (multi_device): this machine has $NGPU GPU")
fi

stop_broker
rc=$?
[ "$rc" = 0 ] || fail "the broker exited with $rc after SIGTERM"
grep -E 'event=(device|backend|model_ready|placement)' "$OUT/broker.log" >>"$LOG"

# ---- results ---------------------------------------------------------------------------
python3 - "$RES" "$OUT/multidevice.json" "${#FAILS[@]}" "${NOT_RUN[@]}" <<'PY'
import json, sys
res, out, fails, not_run = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
d = {}
for line in open(res):
    d.update(json.loads(line))
d["failures"] = fails
d["not_run"] = not_run
json.dump(d, open(out, "w"), indent=1)
print("%-28s %s" % ("GPUs", d.get("gpus")))
for k in sorted(d):
    if k.startswith("acc_"):
        print("%-28s max_rel_err %.3g" % (k, d[k]["max_rel_err"]))
s = d.get("single_device")
if s:
    print("%-28s %.2f GB/s (%d bytes, %.3f s)" % ("load, one device", s["bytes"] / s["seconds"] / 1e9, s["bytes"], s["seconds"]))
m = d.get("multi_device")
if m:
    print("%-28s %.2f GB/s per device, %.2f aggregate" % ("load, two devices", m["gbps_per_device_two"], m["gbps_aggregate_two"]))
for g in d.get("mem_per_gpu", []):
    print("%-28s idle %d, broker +%d, workers +%d MiB" % ("GPU %d memory" % g["gpu"], g["idle"] >> 20, (g["broker"] - g["idle"]) >> 20, (g["workers"] - g["broker"]) >> 20))
for n in not_run:
    print("not run: " + n)
print("%-28s %s" % ("result", "PASS" if fails == 0 else "FAIL (%d)" % fails))
PY
finish
