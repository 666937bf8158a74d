#!/usr/bin/env bash
# Many variants of one model on one GPU: fine-tunes that share their
# unchanged tensors, and more variants than the device memory budget holds.
# Runs on the GPU test machine (prebuilt binaries, as tests/gpu/run.sh).
#
#   tests/gpu/variants.sh OUT
#
# 1. finetunes  tests/gpu/variants.py finetunes: a small bf16 transformer
#               (34 tensors, about 219 MiB) compiled once with AOTInductor
#               for leased weights (compile_models.py's compile_variant) and
#               8 fine-tunes of it, each changing a different 8 of the 34
#               tensors (about a quarter of the bytes). A cuda broker
#               (cuda-vmm slabs) loads ft0..ft7 one after the other
#               (tensors equal to resident ones are shared);
#               device memory (NVML) with the 8 loaded against the sum of
#               their sizes, wbctl's logical and unique bytes; one
#               wb-aoti-worker per fine-tune on its lease, its output
#               compared with eager PyTorch's for that fine-tune's weights
#               (relative error at most TOL, and nearest its own reference).
# 2. cycles     a ~1 GiB checkpoint of random bf16; the pinned host-to-device
#               peak (torch, best of 5); a broker with its slab pool loads it
#               once (fresh memory), then N x wbctl sleep + wake (each
#               restore's GB/s, and from the broker's log its copy's time
#               and the rest: "restore_splits") and N x unload + load from
#               the page cache (each load's GB/s, into the pooled slab):
#               "reused_memory". "link": N copies of the variant's size by
#               torch before the cycles and N after the budget, every one's
#               GB/s (the link's own spread in the same sitting).
# 3. budget     a broker with --device-memory-budget 5 x the variant's slab
#               plus 64 MiB and --host-memory-budget 10 x its slab loads it 20
#               times (v00..v19, --no-share): 5 stay resident, 10 go to the
#               host tier, 5 are evicted. Then acquire latency through
#               python/weightbroker (variants.py acquire) of a resident, a
#               host-tier and an evicted variant, WB_VARIANTS_SAMPLES rounds,
#               each picked by its tier right before its sample, with each
#               restore's and reload's GB/s against the pinned peak.
#
# variants.py report writes OUT/variants.json: "ok" (every output matches,
# unique bytes below half the logical, no restore failure, every acquire
# granted without WB_EBUSY), every figure, "restore_target_met" and
# "load_target_met" (>= 0.95 of the pinned peak; reported, not part of ok).
# The cycles run before the budget: the budget is computed from the slab the
# first load made. Also in OUT: each part's wbctl listings and stats, the
# broker and worker logs, acquire.json (every sample), variants.log. About
# 3 minutes (the compile, about 1 minute, is reused by a later run in the
# same WB_GPU_WORK).
#
# Environment: as tests/gpu/lib.sh; WB_VARIANTS_GIB (the variant's size,
# 1), WB_VARIANTS_LAYOUT (its tensors: llama, shaped as a served model, or
# four, four tensors of a quarter each; see variants.py variant),
# WB_VARIANTS_SAMPLES (acquire rounds, 3), WB_VARIANTS_CYCLES (the
# cycles' N, 5), WB_VARIANTS_BUDGET_S (the
# seconds every wait is cut to, 330).
set -uo pipefail

OUT=${1:?usage: tests/gpu/variants.sh OUT}
# (LOG_NAME, BUDGET and BROKER_ARGS are read by lib.sh's functions.)
# shellcheck disable=SC2034
LOG_NAME=variants.log
# shellcheck source=tests/gpu/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"
# shellcheck disable=SC2034
BUDGET=${WB_VARIANTS_BUDGET_S:-330}
VGIB=${WB_VARIANTS_GIB:-1}
VLAYOUT=${WB_VARIANTS_LAYOUT:-llama}
NS=${WB_VARIANTS_SAMPLES:-3}
NCYC=${WB_VARIANTS_CYCLES:-5}
TOL=0.02
MIB=$((1 << 20))
RES=$OUT/variants.jsonl
: >"$RES"
VPY=$GPU_TESTS/variants.py
# The package from this tree, over the staged libwbclient; the workers and
# the Python client wait for restores and reloads.
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export WB_CLIENT_LIBRARY=$LIB
export WB_TIMEOUT_MS=${WB_TIMEOUT_MS:-60000}

need_bins "$WBROKERD" "$WBCTL" "$WORKER"
[ -e "$LIB/libwbclient.so.0" ] || [ -e "$LIB/libwbclient.so" ] || { say "no libwbclient.so in $LIB"; exit 2; }
python3 -c 'import weightbroker, torch; assert torch.cuda.is_available()' 2>>"$LOG" ||
  { say "python3 cannot import weightbroker and torch with CUDA (see $LOG)"; exit 2; }
gpu_json "$OUT/gpu.json"
say "gpu: $(cat "$OUT/gpu.json")"
say "torch: $(python3 -c 'import torch; print(torch.__version__)')"
D=$WORK/variants
mkdir -p "$D"
VMM_ARGS=(--backend cuda --device 0 --cuda-slab vmm --heartbeat-ms 200 --stale-ms 3000)

# pfail MSG: a failure of the run, also in the report.
pfail() {
  fail "$1"
  record "$(python3 -c 'import json, sys; print(json.dumps({"failure": sys.argv[1]}))' "$1")"
}
# model_field NAME KEY < MODELS_JSON: that model's field.
model_field() { py "next((m['$2'] for m in d if m['name'] == '$1'), '')"; }

# ---- 1. fine-tunes ------------------------------------------------------------
if [ "${WB_VARIANTS_SKIP_FINETUNES:-0}" = 1 ]; then
  pfail "finetunes: skipped (WB_VARIANTS_SKIP_FINETUNES=1)"
else
say "finetunes: building the base, 8 fine-tunes and the AOTI package"
if timeout -k 10 "$(within 240)" python3 "$VPY" finetunes "$D/ft" >"$OUT/finetunes.json" \
  2>"$OUT/finetunes.err"; then
  say "finetunes: $(py "'%d tensors, %d bytes each, compile %s s (reused: %s)' % (d['tensors'], d['model_bytes'], d['compile_seconds'], d['reused'])" <"$OUT/finetunes.json")"
  sleep 1
  M0=$(mem_used)
  # shellcheck disable=SC2034
  BROKER_ARGS=("${VMM_ARGS[@]}" --no-slab-pool)
  if start_broker "$WORK/variants_ft.sock" "$OUT/broker_ft.log"; then
    sleep 0.5
    MB=$(mem_used)
    for i in 0 1 2 3 4 5 6 7; do
      ctl load "ft$i" "$D/ft/ft$i.safetensors" >>"$LOG" 2>&1 || pfail "finetunes: load ft$i failed"
    done
    sleep 0.5
    M1=$(mem_used)
    python3 "$GPU_TESTS/gpumem.py" >"$OUT/ft_gpu_loaded.json" # per process, where NVML lists them
    ctl models --json >"$OUT/ft_models.json"
    ctl stats --json >"$OUT/ft_stats.json"
    ctl models >>"$LOG"
    record "{\"ft_mem\": {\"idle\": $M0, \"broker\": $MB, \"loaded\": $M1}}"
    say "finetunes: device memory idle $M0, broker $MB, 8 loaded $M1 (+$((M1 - MB))); $(py "'logical %d unique %d' % (d['logical_bytes'], d['unique_bytes'])" <"$OUT/ft_stats.json")"
    # One worker per fine-tune, all at once, each on its own lease.
    WP=()
    for i in 0 1 2 3 4 5 6 7; do
      rm -f "$WORK/out_ft$i.safetensors"
      "${ORPHAN_KILL[@]}" "$WORKER" --socket "$SOCK" --device cuda:0 --torch-lib "$TORCH_LIB" \
        --model "ft$i" --aoti "$D/ft/model.pt2" --input "$D/ft/input.safetensors" \
        --output "$WORK/out_ft$i.safetensors" --iterations 2 \
        >"$OUT/worker_ft$i.out" 2>"$OUT/worker_ft$i.err" &
      WP+=($!)
      PIDS+=($!)
    done
    for i in 0 1 2 3 4 5 6 7; do
      wait_exit "$(within 180)" "${WP[$i]}"
      rc=$?
      record "{\"ft_worker\": {\"name\": \"ft$i\", \"rc\": $rc}}"
      [ "$rc" = 0 ] || pfail "finetunes: the worker on ft$i exited with $rc: $(tail -n 3 "$OUT/worker_ft$i.err")"
    done
    outs=()
    for i in 0 1 2 3 4 5 6 7; do outs+=("$WORK/out_ft$i.safetensors"); done
    python3 "$VPY" compare "$TOL" "$D/ft" "${outs[@]}" >"$OUT/ft_outputs.json" 2>>"$LOG" ||
      say "finetunes: outputs off their references: $(cat "$OUT/ft_outputs.json")"
    say "finetunes: $(py "'max rel err %s, nearest %s' % (d['max_rel_err'], d['nearest'])" <"$OUT/ft_outputs.json" 2>&1)"
    stop_broker || pfail "finetunes: the broker exited with $?"
  fi
else
  pfail "variants.py finetunes: $(tail -n 5 "$OUT/finetunes.err")"
fi
fi

# ---- 2. cycles into reused memory -------------------------------------------------
say "cycles: a ${VGIB} GiB checkpoint ($VLAYOUT layout) and the pinned host-to-device peak"
F=$D/variant-$VLAYOUT.safetensors
timeout -k 10 "$(within 120)" python3 "$VPY" variant "$F" "$VGIB" --layout "$VLAYOUT" \
  >"$OUT/variant_file.json" \
  2>>"$LOG" || pfail "variants.py variant failed (see $LOG)"
# In the page cache: every load below reads from memory.
[ -s "$F" ] && cat "$F" >/dev/null
timeout -k 10 "$(within 120)" python3 "$VPY" peak >"$OUT/pinned_peak.json" 2>>"$LOG" ||
  pfail "variants.py peak failed (see $LOG)"
say "pinned peak: $(cat "$OUT/pinned_peak.json")"
# link BEFORE|AFTER: torch's copies of the variant's size, every run kept
# (the link's own spread in this sitting, beside the restores').
link() {
  [ -s "$F" ] || return 0
  timeout -k 10 "$(within 120)" python3 "$VPY" peak --bytes "$(stat -c %s "$F")" \
    --runs "$NCYC" >"$OUT/link_$1.json" 2>>"$LOG" || pfail "variants.py peak ($1) failed"
  say "link ($1): $(py "d['runs_gbps']" <"$OUT/link_$1.json" 2>&1)"
}
link before
SLAB=0
# shellcheck disable=SC2034
BROKER_ARGS=("${VMM_ARGS[@]}" --no-slab-pool)
with_slab_pool # the freed slab waits for the next restore or load of its size
if [ -s "$F" ] && start_broker "$WORK/variants_cycle.sock" "$OUT/broker_cycle.log"; then
  if ctl load --no-share v "$F" >>"$LOG" 2>&1; then
    ctl models --json >"$OUT/cycle_first.json"
    ctl stats --json >"$OUT/cycle_stats_first.json"
    SLAB=$(model_field v slab_bytes <"$OUT/cycle_first.json")
    say "cycles: first load $(model_field v load_gbps <"$OUT/cycle_first.json") GB/s, slab $SLAB bytes"
    for i in $(seq 1 "$NCYC"); do
      ctl sleep v >>"$LOG" 2>&1 || pfail "cycles: sleep $i failed: $(ctl models v)"
      ctl wake v >>"$LOG" 2>&1 || pfail "cycles: wake $i failed: $(ctl models v)"
      ctl models --json >"$OUT/cycle_wake_$i.json"
    done
    say "cycles: restores $(python3 -c 'import json, sys
print([next(m["last_restore_gbps"] for m in json.load(open(f)) if m["name"] == "v") for f in sys.argv[1:]])' $(seq -f "$OUT/cycle_wake_%g.json" 1 "$NCYC") 2>&1) GB/s"
    for i in $(seq 1 "$NCYC"); do
      ctl unload v >>"$LOG" 2>&1 || pfail "cycles: unload $i failed"
      ctl load --no-share v "$F" >>"$LOG" 2>&1 || pfail "cycles: load $i failed"
      ctl models --json >"$OUT/cycle_load_$i.json"
    done
    ctl stats --json >"$OUT/cycle_stats.json"
    say "cycles: page-cache loads $(python3 -c 'import json, sys
print([next(m["load_gbps"] for m in json.load(open(f)) if m["name"] == "v") for f in sys.argv[1:]])' $(seq -f "$OUT/cycle_load_%g.json" 1 "$NCYC") 2>&1) GB/s"
  else
    pfail "cycles: the first load failed: $(tail -n 3 "$LOG")"
  fi
  stop_broker || pfail "cycles: the broker exited with $?"
fi

# ---- 3. 20 variants under a budget of a quarter -------------------------------
if [ "${SLAB:-0}" -gt 0 ] 2>/dev/null; then
  DEVB=$((5 * SLAB + 64 * MIB))
  HOSTB=$((10 * SLAB))
  VBYTES=$(model_field v bytes <"$OUT/cycle_first.json")
  record "{\"budget\": {\"bytes\": $VBYTES, \"slab\": $SLAB, \"device\": $DEVB, \"host\": $HOSTB}}"
  say "budget: device $DEVB bytes, host $HOSTB bytes (slab $SLAB)"
  # The broker's default keeps freed slabs for the next slab of their size
  # (a move's for the restore after it); WB_VARIANTS_BUDGET_POOL=0 frees them.
  # shellcheck disable=SC2034
  BROKER_ARGS=("${VMM_ARGS[@]}" --no-slab-pool)
  [ "${WB_VARIANTS_BUDGET_POOL:-1}" = 1 ] && with_slab_pool
  record "{\"budget_slab_pool\": ${WB_VARIANTS_BUDGET_POOL:-1}}"
  if start_broker "$WORK/variants_budget.sock" "$OUT/broker_budget.log" \
    --device-memory-budget "$DEVB" --host-memory-budget "$HOSTB"; then
    for i in $(seq -w 0 19); do
      ctl load --no-share "v$i" "$F" >>"$LOG" 2>&1 || pfail "budget: load v$i failed: $(tail -n 2 "$LOG")"
    done
    # The last moves end before the tiers are counted.
    settled() { ctl models --json | py "all(m['tier'] in ('device', 'host', 'evicted') for m in d)" | grep -q True; }
    wait_for "$(within 60)" settled || pfail "budget: models still moving after the loads: $(ctl models)"
    ctl models --json >"$OUT/budget_models_loaded.json"
    ctl stats --json >"$OUT/budget_stats_loaded.json"
    ctl models >>"$LOG"
    say "budget: tiers after 20 loads: $(py "sorted({t: sum(m['tier'] == t for m in d) for t in set(m['tier'] for m in d)}.items())" <"$OUT/budget_models_loaded.json")"
    timeout -k 10 "$(within 240)" python3 "$VPY" acquire --socket "$SOCK" --wbctl "$WBCTL" \
      --samples "$NS" --timeout-ms "$WB_TIMEOUT_MS" >"$OUT/acquire.json" 2>>"$LOG" ||
      say "budget: acquire reported failures (see acquire.json)"
    ctl models --json >"$OUT/budget_models.json"
    ctl stats --json >"$OUT/budget_stats.json"
    grep -h 'event=model_tier' "$OUT/broker_budget.log" | tail -n 80 >>"$LOG"
    stop_broker || pfail "budget: the broker exited with $?"
  fi
else
  pfail "budget: not run: no slab size from the cycles' first load"
fi

link after

# ---- report ------------------------------------------------------------------------
python3 "$VPY" report "$OUT" "$TOL" | tee -a "$LOG" >&2 || fail "the variants' checks failed: see variants.json"
say "variants: $(py "'ok %s restore_target_met %s load_target_met %s' % (d['ok'], d['restore_target_met'], d['load_target_met'])" <"$OUT/variants.json" 2>&1)"
finish
