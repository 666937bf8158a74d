#!/usr/bin/env bash
# A partial publish on the GPU (cuda-vmm): the tensors it does not name are
# kept by borrowing the current version's bytes, not copied. Runs on the GPU
# test machine (prebuilt binaries, as tests/gpu/run.sh).
#
#   tests/gpu/publish_partial.sh OUT
#
# A checkpoint W of 4 bf16 tensors (WB_PP_MIB each, 64) is loaded; a
# producer (wb-publish --partial --device cuda:0) publishes 2 of them
# changed; the new version must list 2 shared tensors (the kept ones), its
# device memory must grow by about the 2 published tensors only, and every
# byte of it must read back (wb_vmm_check verify) equal to W with the 2
# changed. Writes OUT/publish_partial.json.
set -uo pipefail

OUT=${1:?usage: tests/gpu/publish_partial.sh OUT}
LOG_NAME=publish_partial.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
MIB=${WB_PP_MIB:-64}
VMM=$BIN/wb_vmm_check
PUB=$BIN/wb-publish
need_bins "$WBROKERD" "$WBCTL" "$VMM" "$PUB"
gpu_json "$OUT/gpu.json"
D=$WORK/publish_partial
mkdir -p "$D"
python3 - "$D" "$MIB" <<'PY' || { fail "could not write the checkpoints"; finish; exit 1; }
import sys, torch
from safetensors.torch import save_file
d, mib = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(11)
n = mib * 2**20 // 2
w = {f"layer{i}.weight": torch.randn(n, generator=g).to(torch.bfloat16) for i in range(4)}
sub = {k: torch.randn(n, generator=g).to(torch.bfloat16) for k in ("layer1.weight", "layer3.weight")}
save_file(w, f"{d}/w.safetensors")
save_file(sub, f"{d}/sub.safetensors")
save_file(dict(w, **sub), f"{d}/expected.safetensors")
PY
BROKER_ARGS=(--backend cuda --device 0 --cuda-slab vmm --no-slab-pool)
start_broker "$WORK/pp.sock" "$OUT/broker.log" || { finish; exit 1; }
ctl load w "$D/w.safetensors" >/dev/null || fail "load w failed"
M1=$(mem_used)
"$PUB" --socket "$SOCK" --model w --partial --device cuda:0 "$D/sub.safetensors" >"$OUT/publish.txt" 2>&1 ||
  fail "the partial publish failed: $(tail -n 3 "$OUT/publish.txt")"
ready() { ctl models --json | py "[m['checksums'] for m in d if m['name'] == 'w' and m['current']][0] == 'ready'" | grep -q True; }
wait_for 30 ready || fail "the new version's checksums never came"
M2=$(mem_used)
ctl models --json >"$OUT/models.json"
"$VMM" verify "$SOCK" w "$D/expected.safetensors" >"$OUT/verify.txt" 2>&1 ||
  fail "the new version's bytes: $(tail -n 3 "$OUT/verify.txt")"
grep "event=publish_commit" "$OUT/broker.log" | tail -n 1 >"$OUT/commit.txt"
stop_broker
python3 - "$OUT" "$M1" "$M2" "$MIB" <<'PY' || fail "the figures are off: $(cat "$OUT/publish_partial.json")"
import json, sys
out, m1, m2, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cur = [m for m in json.load(open(f"{out}/models.json")) if m["name"] == "w" and m["current"]][0]
commit = open(f"{out}/commit.txt").read().strip()
verify = open(f"{out}/verify.txt").read().strip().splitlines()
tensor = mib * 2**20
res = {"version": cur["version"], "shared_tensors": cur["shared_tensors"],
       "shared_bytes": cur["shared_bytes"], "unique_bytes": cur["unique_bytes"],
       "slab_bytes": cur["slab_bytes"], "device_bytes_added": m2 - m1,
       "published_bytes": 2 * tensor, "commit": commit, "verify": verify[-1] if verify else ""}
res["ok"] = (cur["version"] == 2 and cur["shared_tensors"] == 2 and cur["shared_bytes"] == 2 * tensor
             and m2 - m1 < 3 * tensor and "0 problems" in res["verify"])
json.dump(res, open(f"{out}/publish_partial.json", "w"), indent=1)
print(json.dumps(res))
sys.exit(0 if res["ok"] else 1)
PY
say "publish_partial: $(tr -d '\n ' <"$OUT/publish_partial.json")"
finish
