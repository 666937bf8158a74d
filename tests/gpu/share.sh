#!/usr/bin/env bash
# Shared tensors on the GPU (cuda-vmm): a checkpoint A and a variant B that
# changes 2 of its 8 tensors. Runs on the GPU test machine (prebuilt
# binaries, as tests/gpu/run.sh).
#
#   tests/gpu/share.sh OUT
#
# Steps: a cuda broker (cuda-vmm slabs) loads A, then B; B's shared bytes
# (wbctl models) and the device memory each load added (NVML); every byte
# of B read back through the public API (wb_vmm_check verify: its lease
# maps B's own slab and A's) against B's file; A unloaded, B read back again
# (the shared bytes stay); B unloaded, the memory given back; the same
# load of B into a broker with --no-share-tensors for the memory it takes
# then. Writes OUT/share.json and the logs.
#
# Environment: as tests/gpu/lib.sh; WB_SHARE_MIB (tensor size, 256).
set -uo pipefail

OUT=${1:?usage: tests/gpu/share.sh OUT}
LOG_NAME=share.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
MIB=${WB_SHARE_MIB:-256}
VMM=$BIN/wb_vmm_check
need_bins "$WBROKERD" "$WBCTL" "$VMM"
gpu_json "$OUT/gpu.json"
D=$WORK/share
mkdir -p "$D"
python3 - "$D" "$MIB" <<'PY' || { fail "could not write the checkpoints"; finish; exit 1; }
import sys, torch
from safetensors.torch import save_file
d, mib = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(7)
n = mib * 2**20 // 2
a = {f"layer{i}.weight": torch.randn(n, generator=g).to(torch.bfloat16) for i in range(8)}
b = dict(a)
for i in (5, 7):  # the fine-tune changed these
    b[f"layer{i}.weight"] = torch.randn(n, generator=g).to(torch.bfloat16)
save_file(a, f"{d}/a.safetensors")
save_file(b, f"{d}/b.safetensors")
PY
BROKER_ARGS=(--backend cuda --device 0 --cuda-slab vmm --no-slab-pool)
M0=$(mem_used)
start_broker "$WORK/share.sock" "$OUT/broker.log" || { finish; exit 1; }
ctl load a "$D/a.safetensors" >/dev/null || fail "load a failed"
M1=$(mem_used)
ctl load b "$D/b.safetensors" >/dev/null || fail "load b failed"
M2=$(mem_used)
ctl models --json >"$OUT/models.json"
ctl stats --json >"$OUT/stats.json"
"$VMM" verify "$SOCK" b "$D/b.safetensors" >"$OUT/verify_b.txt" 2>&1 || fail "b's bytes: $(tail -n 3 "$OUT/verify_b.txt")"
ctl unload a >/dev/null || fail "unload a failed"
M3=$(mem_used)
"$VMM" verify "$SOCK" b "$D/b.safetensors" >"$OUT/verify_b_alone.txt" 2>&1 ||
  fail "b's bytes once a went: $(tail -n 3 "$OUT/verify_b_alone.txt")"
ctl stats --json >"$OUT/stats_alone.json"
ctl unload b >/dev/null || fail "unload b failed"
sleep 1
M4=$(mem_used)
stop_broker
# The same load without sharing, for the memory it takes.
BROKER_ARGS+=(--no-share-tensors)
start_broker "$WORK/share.sock" "$OUT/broker_noshare.log" || { finish; exit 1; }
ctl load a "$D/a.safetensors" >/dev/null || fail "load a (no sharing) failed"
N1=$(mem_used)
ctl load b "$D/b.safetensors" >/dev/null || fail "load b (no sharing) failed"
N2=$(mem_used)
stop_broker
python3 - "$OUT" "$M0" "$M1" "$M2" "$M3" "$M4" "$N1" "$N2" <<'PY' ||
import json, sys
out = sys.argv[1]
m0, m1, m2, m3, m4, n1, n2 = (int(x) for x in sys.argv[2:])
models = {m["name"]: m for m in json.load(open(f"{out}/models.json"))}
st = json.load(open(f"{out}/stats.json"))
alone = json.load(open(f"{out}/stats_alone.json"))
b = models["b"]
res = {
    "tensor_bytes_each": models["a"]["bytes"],
    "b": {k: b[k] for k in ("bytes", "shared_bytes", "unique_bytes", "shared_tensors", "share")},
    "stats": {k: st[k] for k in ("logical_bytes", "unique_bytes", "shared_tensors_total",
                                 "shared_bytes_total", "share_mismatches")},
    "stats_after_a_unloaded": {k: alone[k] for k in ("logical_bytes", "unique_bytes")},
    "device_bytes": {"load_a": m1 - m0, "load_b_shared": m2 - m1,
                     "after_a_unloaded": m3 - m0, "after_b_unloaded": m4 - m0,
                     "load_b_no_sharing": n2 - n1},
}
ok = (b["shared_tensors"] == 6 and b["shared_bytes"] == 6 * b["bytes"] // 8
      and st["unique_bytes"] == models["a"]["bytes"] + b["unique_bytes"]
      # A's slab stays whole while B uses part of it: resident once.
      and alone["unique_bytes"] == models["a"]["bytes"] + b["unique_bytes"]
      and res["device_bytes"]["load_b_shared"] < res["device_bytes"]["load_b_no_sharing"] / 2)
res["ok"] = ok
json.dump(res, open(f"{out}/share.json", "w"), indent=1)
print(json.dumps(res))
sys.exit(0 if ok else 1)
PY
  fail "the figures are off: $(cat "$OUT/share.json")"
say "share: $(tr -d '\n ' <"$OUT/share.json")"
finish
