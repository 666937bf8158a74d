#!/usr/bin/env bash
# GPU: the broker (cuda backend) is killed with SIGKILL while workers hold
# leases on a model in device memory. The workers keep re-verifying every
# tensor's XXH3 over their imported CUDA IPC mappings; a new broker started on
# the same socket loads the model again, and the workers reacquire a lease
# from it, release at the end of their hold and exit 0 (every verification
# passed). Runs on the GPU test machine with prebuilt binaries.
#
#   tests/gpu/broker_crash.sh OUT
#
# Environment: WB_GPU_BIN, WB_GPU_LIB (default .device/lead/{bin,lib}),
# WB_GPU_WORK (scratch, default /tmp/wbcrash). Writes OUT/crash.json and logs.
set -uo pipefail

OUT=${1:?usage: tests/gpu/broker_crash.sh OUT}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WB_GPU_BIN=${WB_GPU_BIN:-$ROOT/.device/lead/bin}
WB_GPU_LIB=${WB_GPU_LIB:-$ROOT/.device/lead/lib}
WB_GPU_WORK=${WB_GPU_WORK:-/tmp/wbcrash}
LOG_NAME=crash.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$ROOT/.device/ao/fallback
export WB_TIMEOUT_MS=1000
SOCK=$WORK/broker.sock
WORKERS=3
# Short heartbeats and stale window: the workers notice the dead broker soon.
BROKER_ARGS=(--backend cuda --heartbeat-ms 100 --stale-ms 1000)
need_bins "$WBROKERD" "$WBCTL" "$DEMO"

all_have() {
  local i
  for i in $(seq 1 "$WORKERS"); do grep -q "$1" "$OUT/w$i.out" || return 1; done
}

say "writing a 1 GiB bf16 checkpoint with safetensors"
python3 - "$WORK/model.safetensors" <<'PY' || fail "could not write the checkpoint"
import sys, torch
from safetensors.torch import save_file
g = torch.Generator().manual_seed(7)
t = {f"layer{i}.weight": torch.randn(4096, 8192, generator=g).to(torch.bfloat16) for i in range(16)}
t["scalar"] = torch.tensor(3.0)
save_file(t, sys.argv[1], metadata={"format": "pt"})
PY

start_broker "$SOCK" "$OUT/broker1.log" --model "crash=$WORK/model.safetensors"
say "broker 1 (pid $BROKER) ready"
for i in $(seq 1 "$WORKERS"); do
  "$DEMO" --socket "$SOCK" --model crash --reacquire --verify-every 200 \
    --hold 12 >"$OUT/w$i.out" 2>&1 &
  W[i]=$!
  PIDS+=("${W[i]}")
done
wait_for 60 all_have "^verified 17 tensors" || fail "the workers did not verify their leases"
say "workers verified their leases; killing the broker with SIGKILL"
kill -KILL "$BROKER"
wait "$BROKER" 2>/dev/null
sleep 3
for i in $(seq 1 "$WORKERS"); do
  kill -0 "${W[i]}" 2>/dev/null || fail "worker $i died with the broker"
done
grep -l "verify failed" "$OUT"/w*.out && fail "a verification failed after the broker died"

start_broker "$SOCK" "$OUT/broker2.log" --model "crash=$WORK/model.safetensors"
say "broker 2 (pid $BROKER) ready"
wait_for 30 all_have "^reacquired lease " || fail "the workers did not reacquire"
leases=$(ctl leases --json | grep -c '"id"')
[ "$leases" = "$WORKERS" ] || fail "broker 2 lists $leases leases, expected $WORKERS"
rcs=()
for i in $(seq 1 "$WORKERS"); do
  wait "${W[i]}"
  rcs+=("$?")
done
say "worker exit codes: ${rcs[*]}"
for rc in "${rcs[@]}"; do [ "$rc" = 0 ] || fail "a worker exited with $rc"; done
wait_for 10 sh -c "! '$WBCTL' --socket '$SOCK' leases --json | grep -q '\"id\"'" ||
  fail "leases remain after the workers ended"
verifs=$(cat "$OUT"/w*.out | sed -n 's/^verifications passed: \([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
stop_broker
brc=$?
[ "$brc" = 0 ] || fail "broker 2 exited with $brc on SIGTERM"

python3 - "$OUT/crash.json" "$WORKERS" "${verifs:-0}" "${#FAILS[@]}" <<'PY'
import json, sys, datetime, subprocess
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": gpu, "backend": "cuda", "model_bytes": 16 * 4096 * 8192 * 2 + 4,
           "workers": int(sys.argv[2]), "broker_kills": 1,
           "verifications_passed": int(sys.argv[3]), "failures": int(sys.argv[4])},
          open(sys.argv[1], "w"), indent=1)
PY
say "verifications passed in all workers: ${verifs:-0}"
if [ ${#FAILS[@]} -eq 0 ]; then
  say "broker crash (cuda): PASS"
else
  say "broker crash (cuda): FAIL (${#FAILS[@]})"
  exit 1
fi
