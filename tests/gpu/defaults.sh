#!/usr/bin/env bash
# GPU: what a user gets without asking. A cuda broker started with no
# transport option uses read-only cuda-vmm slabs where the device supports
# them (--check-config says so, the log names the transport), and a worker's
# lease is listed ACCESS ro; `--cuda-slab ipc` still gives legacy IPC (rw).
#
#   tests/gpu/defaults.sh OUT      writes OUT/defaults.json (about 20 s)
#
# Environment: as tests/gpu/lib.sh.
set -uo pipefail
OUT=${1:?usage: tests/gpu/defaults.sh OUT}
LOG_NAME=defaults.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
need_bins "$WBROKERD" "$WBCTL" "$DEMO"

CK=$WORK/defaults.safetensors
python3 - "$CK" <<'PY' || { say "cannot write $CK"; exit 2; }
import sys, torch
from safetensors.torch import save_file
save_file({"w%d" % i: torch.randn(1024, 1024) for i in range(4)}, sys.argv[1])
PY

"$WBROKERD" --check-config --backend cuda >"$OUT/check_config.txt" 2>&1
say "check-config: $(grep -E '^(backend|access):' "$OUT/check_config.txt" | tr '\n' ' ')"

lease_json() { # lease_json SLAB_ARGS...: a broker, a worker holding a lease, its lease listed
  local name=$1
  shift
  start_broker "$WORK/defaults_$name.sock" "$OUT/broker_$name.log" --model "d=$CK" "$@" || return 1
  "$DEMO" --socket "$SOCK" --model d --hold 20 >"$WORK/demo_$name.out" 2>&1 &
  local w=$!
  PIDS+=("$w")
  wait_for 30 grep -q "verified" "$WORK/demo_$name.out" ||
    { fail "$name: the worker did not verify: $(tail -n 3 "$WORK/demo_$name.out")"; return 1; }
  ctl leases --json >"$WORK/leases_$name.json"
  kill -TERM "$w"
  wait_exit 20 "$w"
  stop_broker
  say "$name: $(grep -o 'cuda_slab=[a-z-]* access=[a-z]*' "$OUT/broker_$name.log" | head -n 1); lease $(py "d[0]['transport'] + ' ' + d[0]['access']" <"$WORK/leases_$name.json")"
}

lease_json default
lease_json ipc --cuda-slab ipc

python3 - "$OUT" "$WORK" <<'PY'
import json, re, sys
out, work = sys.argv[1], sys.argv[2]
def lease(name):
    try:
        d = json.load(open("%s/leases_%s.json" % (work, name)))
        return {"transport": d[0]["transport"], "access": d[0]["access"]}
    except Exception as e:
        return {"error": str(e)}
def logged(name):
    t = open("%s/broker_%s.log" % (out, name)).read()
    m = re.search(r"cuda_slab=(\S+) access=(\S+)", t)
    return {"cuda_slab": m.group(1), "access": m.group(2)} if m else None
cc = open(out + "/check_config.txt").read()
r = {
    "check_config": [l for l in cc.splitlines() if l.startswith(("backend:", "access:"))],
    "default": {"broker": logged("default"), "lease": lease("default")},
    "ipc": {"broker": logged("ipc"), "lease": lease("ipc")},
}
r["pass"] = (r["default"]["lease"].get("access") == "ro" and
             r["default"]["lease"].get("transport") == "cuda-vmm" and
             r["ipc"]["lease"].get("access") == "rw")
json.dump(r, open(out + "/defaults.json", "w"), indent=1)
print(json.dumps(r, indent=1))
sys.exit(0 if r["pass"] else 1)
PY
rc=$?
[ ${#FAILS[@]} -eq 0 ] && [ "$rc" = 0 ] && { say "defaults: PASS"; exit 0; }
say "defaults: FAIL"
exit 1
