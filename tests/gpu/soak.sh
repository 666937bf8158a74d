#!/usr/bin/env bash
# GPU soak: real wb-aoti-worker processes attach to leases, serve and are
# SIGKILLed at random for WB_SOAK_SECONDS on each slab kind of the cuda
# backend: legacy CUDA IPC (--cuda-slab ipc) and read-only cuda-vmm
# (--cuda-slab vmm). Runs on the GPU test machine with the prebuilt binaries
# of run.sh; builds nothing.
#
#   tests/gpu/soak.sh OUT
#
# The model is the fp32 family of examples/compile_models.py (compiled into
# WB_GPU_WORK unless it is there already; variant b folds a constant at run
# time). For each slab kind a broker loads fp32_base and both heads with
# --log-level debug (its hello and lease_grant lines tell when a worker
# attaches); NVML's used memory then is what the broker alone holds. A
# warm-up round of WB_SOAK_WORKERS workers serves and stops cleanly; the
# broker's VmRSS and open descriptors are read after it. Then WB_SOAK_WORKERS
# slots are kept busy for WB_SOAK_SECONDS, each new worker (variant a or b,
# --iterations WB_SOAK_ITERATIONS --serve --verify) with a fate drawn from
# the seed (FATES in tests/gpu/soak.py): serve a while and stop on SIGTERM
# (exit 0; every served run bitwise equal to its first, or exit 3); SIGKILL
# from the log watcher at its hello or at the grant of its first or second
# lease, before its container is ready (while it attaches); SIGKILL while
# it serves, while it exits, or at a random moment after its start. A
# worker's output file (its first run) is complete once it printed "ready";
# every such output, killed workers' included, is compared with eager
# PyTorch (check_outputs.py, relative error at most WB_SOAK_TOLERANCE);
# workers killed before "ready" leave a partial output or none, ignored.
# After the last worker: no lease left (wbctl leases --json empty, granted =
# released + reclaimed), device memory back to the broker alone's (NVML,
# within WB_SOAK_MEM_TOL_MIB, far below one worker's CUDA context) with no
# more GPU processes, the broker's VmRSS within WB_SOAK_RSS_TOL_KIB and its
# descriptors within WB_SOAK_FD_TOL of their counts after the warm-up; then
# the broker stops on SIGTERM with no lease held. A slab kind fails when any
# of this fails, when a worker fails or misses a deadline (90 s to "ready",
# 30 s to exit after SIGTERM), or when no worker was killed while attaching
# or while serving. Every wait has a deadline; every process started is
# killed on exit.
#
# Results: OUT/soak.json (per slab kind: the counts, the before/after
# figures, pass and the reasons of a failure), OUT/soak.log, OUT/KIND/ (the
# broker's log, workers.jsonl with one line of facts per worker, the
# checks' JSON, failed/ with the logs of workers that failed); a table last.
# Exit 0 when every slab kind passed, 1 otherwise, 2 when the machine lacks
# what it needs or on misuse.
#
# Environment: WB_SOAK_SECONDS (per slab kind, default 120), WB_SOAK_WORKERS
# (6), WB_SOAK_SEED (20261201, printed), WB_SOAK_SLABS ("ipc vmm"),
# WB_SOAK_ITERATIONS (3), WB_SOAK_TOLERANCE (1e-3), WB_SOAK_MEM_TOL_MIB (16),
# WB_SOAK_RSS_TOL_KIB (4096), WB_SOAK_FD_TOL (2), and tests/gpu/lib.sh's
# WB_GPU_BIN, WB_GPU_LIB, WB_GPU_WORK. With the defaults it takes about
# 6 minutes, the first compile (about 80-100 s) included.
set -uo pipefail

OUT=${1:?usage: tests/gpu/soak.sh OUT}
LOG_NAME=soak.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
SECS=${WB_SOAK_SECONDS:-120}
NW=${WB_SOAK_WORKERS:-6}
SEED=${WB_SOAK_SEED:-20261201}
SLABS=${WB_SOAK_SLABS:-ipc vmm}
ITER=${WB_SOAK_ITERATIONS:-3}
TOL=${WB_SOAK_TOLERANCE:-1e-3}
MEM_TOL=${WB_SOAK_MEM_TOL_MIB:-16}
RSS_TOL=${WB_SOAK_RSS_TOL_KIB:-4096}
FD_TOL=${WB_SOAK_FD_TOL:-2}
SOAK_PY=$GPU_TESTS/soak.py
READY_MS=90000 # spawn to "ready"
TERM_MS=30000  # SIGTERM to exit
DRAIN_MS=120000
RUN_FAILS=()
RAN=()
# The shell reports every worker killed by a signal on its stderr; the
# loops send that to OUT/KIND/shell.log, and say writes to the real stderr
# (fd 3) instead.
exec 3>&2
say() { printf '[%4ds] %s\n' "$SECONDS" "$*" | tee -a "$LOG" >&3; }

whole() {
  [[ $2 =~ ^[0-9]+$ ]] || { say "$1 must be a whole number, not '$2'"; exit 2; }
}
whole WB_SOAK_SECONDS "$SECS"
whole WB_SOAK_WORKERS "$NW"
whole WB_SOAK_SEED "$SEED"
whole WB_SOAK_ITERATIONS "$ITER"
whole WB_SOAK_MEM_TOL_MIB "$MEM_TOL"
whole WB_SOAK_RSS_TOL_KIB "$RSS_TOL"
whole WB_SOAK_FD_TOL "$FD_TOL"
# Base 10 in arithmetic, whatever leading zeros they have.
SECS=$((10#$SECS)) NW=$((10#$NW)) ITER=$((10#$ITER))
MEM_TOL=$((10#$MEM_TOL)) RSS_TOL=$((10#$RSS_TOL)) FD_TOL=$((10#$FD_TOL))
if [ "$NW" -lt 1 ] || [ "$ITER" -lt 1 ]; then
  say "WB_SOAK_WORKERS and WB_SOAK_ITERATIONS must be at least 1"
  exit 2
fi
[[ $TOL =~ ^[0-9]+(\.[0-9]+)?([eE]-?[0-9]+)?$ ]] || { say "WB_SOAK_TOLERANCE must be a number, not '$TOL'"; exit 2; }
for k in $SLABS; do
  case $k in ipc | vmm) ;; *) say "WB_SOAK_SLABS: '$k' is neither ipc nor vmm"; exit 2 ;; esac
done

# The live workers by slot (0: none); only these and PIDS are killed on
# exit, and a pid leaves both once reaped, so no pid the system may have
# given to someone else since is ever signalled.
SLOT_PID=()
for ((s = 0; s < NW; s++)); do SLOT_PID[s]=0; done
# shellcheck disable=SC2317 # called by lib.sh's EXIT trap
cleanup() {
  local p
  for p in "${SLOT_PID[@]}" "${PIDS[@]}"; do [ "$p" != 0 ] && kill -KILL "$p" 2>/dev/null; done
  for p in "${SLOT_PID[@]}" "${PIDS[@]}"; do [ "$p" != 0 ] && wait_exit 10 "$p"; done
}
trap 'exit 130' INT
trap 'exit 143' TERM
forget() {
  local p keep=()
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}
rfail() {
  fail "$*"
  RUN_FAILS+=("$*")
}
kfail() {
  fail "$KIND: $*"
  printf '%s\n' "$*" >>"$KDIR/problems.txt"
}
now() { NOW=$((${EPOCHREALTIME//[!0-9]/} / 1000)); }
# jn VALUE: VALUE when it is an integer, else null (JSON).
jn() { if [[ ${1:-} =~ ^-?[0-9]+$ ]]; then printf '%s' "$1"; else printf null; fi; }

# gpu_sample: MEM_MIB (NVML's used memory) and GPU_PROCS (its compute
# processes); both empty when gpumem.py fails.
gpu_sample() {
  local s
  MEM_MIB='' GPU_PROCS=''
  s=$(python3 "$GPU_TESTS/gpumem.py" | py "'%d %d' % (d['used'] >> 20, len(d['procs']))") || return 1
  read -r MEM_MIB GPU_PROCS <<<"$s"
}
# mem_settle SECS [MAX_MIB MAX_PROCS]: samples until used memory and the
# GPU processes are at most MAX_MIB and MAX_PROCS (without them: until two
# samples 0.5 s apart agree), for at most SECS.
mem_settle() {
  local until=$((SECONDS + $1)) max=${2:-} procs=${3:-} last=
  while :; do
    if gpu_sample; then
      if [ -n "$max" ]; then
        [ "$MEM_MIB" -le "$max" ] && [ "$GPU_PROCS" -le "$procs" ] && return 0
      else
        [ "$MEM_MIB" = "$last" ] && return 0
        last=$MEM_MIB
      fi
    fi
    [ "$SECONDS" -ge "$until" ] && return 1
    sleep 0.5
  done
}
# rss_now PID / fd_count PID: RSS (VmRSS, KiB) and FDS (entries of
# /proc/PID/fd), empty when unreadable; no process is forked.
rss_now() {
  local k v _
  RSS=
  [ -r "/proc/$1/status" ] || return 1
  while read -r k v _; do [ "$k" = VmRSS: ] && RSS=$v; done <"/proc/$1/status"
  [ -n "$RSS" ]
}
fd_count() {
  local f=("/proc/$1/fd/"*)
  FDS=
  [ -e "${f[0]}" ] && FDS=${#f[@]}
}
# fds_least PID: the least of five counts 0.2 s apart (a wbctl connection
# that just ended may still be open), in FDS.
fds_least() {
  local n best=
  for n in 1 2 3 4 5; do
    fd_count "$1"
    [ -n "$FDS" ] && { [ -z "$best" ] || [ "$FDS" -lt "$best" ]; } && best=$FDS
    sleep 0.2
  done
  FDS=$best
}
# shellcheck disable=SC2317 # called through wait_for
no_leases() { [ "$(ctl leases --json | py 'len(d)')" = 0 ]; }

# ---- workers -------------------------------------------------------------------
# Per slot: record index, variant, fate, trigger, delays (ms),
# start, "ready", SIGTERM and SIGKILL times (ms, 0: not yet), the pending
# action (none, term, kill) and when, the deadline missed ("" if none).
S_I=() S_V=() S_FATE=() S_TRIG=() S_D1=() S_D2=() S_T0=() S_READY=() S_TERMAT=() S_KILLAT=()
S_ACT=() S_AT=() S_STUCK=()
saw_ready() {
  local l
  while IFS= read -r l; do [ "$l" = ready ] && return 0; done 2>/dev/null <"$1"
  return 1
}

# spawn SLOT: the next worker of the plan (warm-up: serves, then SIGTERM).
spawn() {
  local s=$1 i=$NEXT v fate trig d1 d2 w
  NEXT=$((NEXT + 1))
  if [ "$PHASE" = warmup ]; then
    fate=complete trig=- d1=0 d2=0 v=a
    [ $((s % 2)) = 1 ] && v=b
  else
    read -r v fate trig d1 d2 <<<"${PLAN[PLAN_I % ${#PLAN[@]}]}"
    PLAN_I=$((PLAN_I + 1))
  fi
  w=$KW/w$i
  TMPDIR=$KW/tmp "${ORPHAN_KILL[@]}" "$WORKER" --socket "$SOCK" --device cuda:0 --torch-lib "$TORCH_LIB" \
    --model fp32_base --model "fp32_head_$v" --aoti "$WORK/fp32_$v.pt2" \
    --input "$WORK/fp32_input.safetensors" --output "$w.safetensors" \
    --iterations "$ITER" --serve --verify >"$w.out" 2>"$w.err" &
  SLOT_PID[s]=$!
  # Armed long before its hello: the worker makes its CUDA context first.
  [ "$fate" = attach ] && : >"$ARM/$!.$trig"
  S_I[s]=$i S_V[s]=$v S_FATE[s]=$fate S_TRIG[s]=$trig S_D1[s]=$d1 S_D2[s]=$d2 S_T0[s]=$NOW
  S_READY[s]=0 S_TERMAT[s]=0 S_KILLAT[s]=0 S_ACT[s]=none S_AT[s]=0 S_STUCK[s]=
  if [ "$fate" = early ]; then
    S_ACT[s]="kill"
    S_AT[s]=$((NOW + d1))
  fi
}

sigkill() {
  kill -KILL "${SLOT_PID[$1]}" 2>/dev/null
  S_KILLAT[$1]=$NOW
}

# reap SLOT: the worker has exited; records its facts (soak.py: workers.jsonl).
reap() {
  local s=$1 pid=${SLOT_PID[$1]} i=${S_I[$1]} rc l stage=start ready=0 result='' fired=- out=null w
  local killed=1 termed=1
  w=$KW/w$i
  wait "$pid"
  rc=$?
  while IFS= read -r l || [ -n "$l" ]; do
    case $l in
    "attach "*) [ "$stage" = start ] && stage=attached ;;
    ready) stage=ready ready=1 ;;
    "result "*) stage=result result=${l#result } ;;
    esac
  done 2>/dev/null <"$w.out"
  [ -e "$ARM/$pid.fired" ] && read -r fired <"$ARM/$pid.fired"
  rm -f "$ARM/$pid".*
  if [ "$ready" = 1 ]; then
    out="\"$w.safetensors\""
    if [ "${S_V[s]}" = a ]; then OUTS_A+=("$w.safetensors"); else OUTS_B+=("$w.safetensors"); fi
  else
    rm -f "$w.safetensors" # partial or absent
  fi
  [ "${S_KILLAT[s]}" = 0 ] && killed=0
  [ "${S_TERMAT[s]}" = 0 ] && termed=0
  result=${result//\\/\\\\}
  result=${result//\"/\\\"}
  printf '{"phase":"%s","i":%d,"pid":%d,"variant":"%s","fate":"%s","trigger":"%s","fired":"%s","sigkill":%d,"sigterm":%d,"rc":%d,"stage":"%s","stuck":"%s","output":%s,"result":"%s"}\n' \
    "$PHASE" "$i" "$pid" "${S_V[s]}" "${S_FATE[s]}" "${S_TRIG[s]}" "$fired" \
    "$killed" "$termed" "$rc" "$stage" "${S_STUCK[s]}" "$out" "$result" >>"$KDIR/workers.jsonl"
  SLOT_PID[s]=0
  [ "$rc" = 0 ] && [ "$PHASE" = warmup ] && WARM_OK=$((WARM_OK + 1))
  if [ -n "${S_STUCK[s]}" ] ||
    { [ "$rc" != 0 ] && ! { [ "$rc" = 137 ] && { [ "${S_KILLAT[s]}" != 0 ] || [ "$fired" != - ]; }; }; }; then
    cp "$w.out" "$w.err" "$KDIR/failed/" 2>/dev/null
    BAD=$((BAD + 1))
    [ "$BAD" -le 10 ] && say "$KIND: worker $i (pid $pid, ${S_FATE[s]}) exited with $rc${S_STUCK[s]:+, did not ${S_STUCK[s]}}: $(tail -n 2 "$w.err" | tr '\n' ' ')"
  fi
}

# step SLOT: reaps, notices "ready", acts when due, enforces the deadlines.
step() {
  local s=$1
  if ! kill -0 "${SLOT_PID[s]}" 2>/dev/null; then
    reap "$s"
    return
  fi
  if [ "${S_READY[s]}" = 0 ] && saw_ready "$KW/w${S_I[s]}.out"; then
    S_READY[s]=$NOW
    case ${S_FATE[s]} in
    complete | exit) S_ACT[s]="term" S_AT[s]=$((NOW + S_D1[s])) ;;
    serve) S_ACT[s]="kill" S_AT[s]=$((NOW + S_D1[s])) ;;
    attach) S_ACT[s]="kill" S_AT[s]=$NOW ;; # its trigger came too late
    esac
  fi
  # Draining: whoever serves stops now, as its fate says.
  if [ "$DRAIN" = 1 ] && [ "${S_READY[s]}" != 0 ] && [ "${S_TERMAT[s]}" = 0 ] &&
    [ "${S_AT[s]}" -gt "$NOW" ]; then
    S_AT[s]=$NOW
  fi
  if [ "${S_ACT[s]}" != none ] && [ "$NOW" -ge "${S_AT[s]}" ]; then
    case ${S_ACT[s]} in
    term)
      kill -TERM "${SLOT_PID[s]}" 2>/dev/null
      S_TERMAT[s]=$NOW S_ACT[s]=none
      [ "${S_FATE[s]}" = exit ] && S_ACT[s]="kill" S_AT[s]=$((NOW + S_D2[s]))
      ;;
    kill)
      sigkill "$s"
      S_ACT[s]=none
      ;;
    esac
  fi
  if [ -z "${S_STUCK[s]}" ] && [ "${S_KILLAT[s]}" = 0 ]; then
    if [ "${S_READY[s]}" = 0 ] && [ $((NOW - S_T0[s])) -ge "$READY_MS" ]; then
      S_STUCK[s]="print ready within $((READY_MS / 1000)) s"
    elif [ "${S_TERMAT[s]}" != 0 ] && [ $((NOW - S_TERMAT[s])) -ge "$TERM_MS" ]; then
      S_STUCK[s]="exit within $((TERM_MS / 1000)) s of SIGTERM"
    fi
    if [ -n "${S_STUCK[s]}" ]; then
      sigkill "$s"
      S_ACT[s]=none
    fi
  fi
}

# kill_all WHY: SIGKILLs every live worker (marked as having missed WHY when
# given) and reaps them, for at most 20 s.
kill_all() {
  local s live until=$((SECONDS + 20))
  now
  for ((s = 0; s < NW; s++)); do
    [ "${SLOT_PID[s]}" = 0 ] && continue
    [ -n "$1" ] && S_STUCK[s]=$1
    sigkill "$s"
  done
  while :; do
    live=0
    for ((s = 0; s < NW; s++)); do
      [ "${SLOT_PID[s]}" = 0 ] && continue
      if kill -0 "${SLOT_PID[s]}" 2>/dev/null; then live=$((live + 1)); else reap "$s"; fi
    done
    [ "$live" = 0 ] && return 0
    [ "$SECONDS" -ge "$until" ] && { kfail "$live workers did not die within 20 s of SIGKILL"; return 1; }
    sleep 0.05
  done
}

# run_loop SPAWN_UNTIL_MS HARD_MS: keeps the slots busy until SPAWN_UNTIL_MS,
# then lets the live workers meet their fates; whatever is left at HARD_MS
# is killed. Samples the broker's RSS every second (RSS_MAX). Returns 1
# when the broker died or the hard deadline was reached.
run_loop() {
  local until=$1 hard=$2 s live next_rss=0
  DRAIN=0
  while :; do
    now
    [ "$NOW" -ge "$until" ] && DRAIN=1
    live=0
    for ((s = 0; s < NW; s++)); do
      [ "${SLOT_PID[s]}" != 0 ] && step "$s"
      [ "${SLOT_PID[s]}" = 0 ] && [ "$DRAIN" = 0 ] && spawn "$s"
      [ "${SLOT_PID[s]}" != 0 ] && live=$((live + 1))
    done
    [ "$live" = 0 ] && [ "$DRAIN" = 1 ] && return 0
    if ! kill -0 "$BROKER" 2>/dev/null; then
      kfail "the broker died; its last line: $(tail -n 1 "$KDIR/broker.log")"
      kill_all ""
      return 1
    fi
    if [ "$NOW" -ge "$hard" ]; then
      kfail "$live workers were still running at the deadline"
      kill_all "finish before the deadline"
      return 1
    fi
    if [ "$NOW" -ge "$next_rss" ]; then
      rss_now "$BROKER" && [ "$RSS" -gt "$RSS_MAX" ] && RSS_MAX=$RSS
      next_rss=$((NOW + 1000))
    fi
    sleep 0.025
  done
}

# ---- one slab kind -----------------------------------------------------------------
soak_kind() {
  KIND=$1
  KDIR=$OUT/$KIND
  KW=$WORK/soak/$KIND
  ARM=$KW/arm
  rm -rf "$KDIR" "$KW"
  mkdir -p "$KDIR/failed" "$KW/tmp" "$ARM"
  : >"$KDIR/workers.jsonl"
  : >"$KDIR/problems.txt"
  RAN+=("$KIND")
  NEXT=0 PLAN_I=0 BAD=0 WARM_OK=0 RSS_MAX=0 OUTS_A=() OUTS_B=()
  local sock=$WORK/soak_$KIND.sock mem0='' procs0='' mem1='' procs1=''
  local rss0='' rss1='' fds0='' fds1='' t0='' t1=''
  local leases_left='' stats=null stop_clean=false tmp_left='' watch rc p s checks=()
  rm -f "$sock" "$sock.fd"
  if ! start_broker "$sock" "$KDIR/broker.log" --cuda-slab "$KIND" --log-level debug \
    --model "fp32_base=$WORK/fp32_base.safetensors" --model "fp32_head_a=$WORK/fp32_head_a.safetensors" \
    --model "fp32_head_b=$WORK/fp32_head_b.safetensors"; then
    kfail "the broker did not load the models: $(tail -n 3 "$KDIR/broker.log" | tr '\n' ' ')"
    kill -KILL "$BROKER" 2>/dev/null
    wait_exit 10 "$BROKER"
    forget "$BROKER"
    write_facts
    return
  fi
  mem_settle 10
  mem0=$MEM_MIB procs0=$GPU_PROCS
  say "$KIND: broker $BROKER ready; device memory with the broker alone: ${mem0:-?} MiB, ${procs0:-?} GPU processes"
  python3 "$SOAK_PY" watch "$KDIR/broker.log" "$ARM" &
  watch=$!
  PIDS+=("$watch")

  PHASE=warmup
  now
  for ((s = 0; s < NW; s++)); do spawn "$s"; done
  run_loop 0 $((NOW + READY_MS + TERM_MS)) 2>>"$KDIR/shell.log"
  say "$KIND: warm-up: $WARM_OK of $NW workers served and stopped cleanly"
  if [ "$WARM_OK" = 0 ]; then
    kfail "no warm-up worker served; the soak was not run"
  else
    wait_for 20 no_leases || kfail "leases left after the warm-up: $(ctl leases)"
    rss_now "$BROKER"
    rss0=$RSS
    fds_least "$BROKER"
    fds0=$FDS
    say "$KIND: broker RSS ${rss0:-?} KiB, ${fds0:-?} descriptors; soaking for $SECS s with $NW workers"

    PHASE=soak BAD=0
    now
    t0=$NOW
    run_loop $((t0 + SECS * 1000)) $((t0 + SECS * 1000 + DRAIN_MS)) 2>>"$KDIR/shell.log"
    now
    t1=$NOW
    say "$KIND: $((NEXT - NW)) workers in $(((t1 - t0) / 1000)) s ($BAD unexpected)"
  fi
  : >"$ARM/stop"
  wait_exit 5 "$watch"
  forget "$watch"

  if kill -0 "$BROKER" 2>/dev/null; then
    wait_for 20 no_leases
    ctl leases --json >"$KDIR/leases_end.json"
    leases_left=$(py 'len(d)' <"$KDIR/leases_end.json")
    ctl stats --json >"$KDIR/stats_end.json" && stats=$(cat "$KDIR/stats_end.json")
    local until=$((SECONDS + 15))
    while fd_count "$BROKER"; [ -z "$FDS" ] || [ -z "$fds0" ] || [ "$FDS" -gt $((fds0 + FD_TOL)) ]; do
      [ "$SECONDS" -ge "$until" ] && break
      sleep 0.2
    done
    fds1=$FDS
    rss_now "$BROKER"
    rss1=$RSS
    mem_settle 30 $((${mem0:-0} + MEM_TOL)) "${procs0:-0}"
    mem1=$MEM_MIB procs1=$GPU_PROCS
    say "$KIND: after: leases ${leases_left:-?}, device memory ${mem1:-?} MiB (${mem0:-?} before)," \
      "GPU processes ${procs1:-?} (${procs0:-?}), RSS ${rss1:-?} KiB (${rss0:-?}, at most $RSS_MAX)," \
      "descriptors ${fds1:-?} (${fds0:-?})"
  fi

  # Against eager PyTorch, both variants at once.
  if [ "${#OUTS_A[@]}" -gt 0 ]; then
    python3 "$GPU_TESTS/check_outputs.py" "$TOL" "$WORK/fp32_a_ref.safetensors" "${OUTS_A[@]}" \
      >"$KDIR/acc_a.json" 2>"$KDIR/acc_a.err" &
    checks+=("$!")
    PIDS+=("$!")
  fi
  if [ "${#OUTS_B[@]}" -gt 0 ]; then
    python3 "$GPU_TESTS/check_outputs.py" "$TOL" "$WORK/fp32_b_ref.safetensors" "${OUTS_B[@]}" \
      >"$KDIR/acc_b.json" 2>"$KDIR/acc_b.err" &
    checks+=("$!")
    PIDS+=("$!")
  fi
  for p in "${checks[@]}"; do
    wait_exit 180 "$p"
    [ $? = 124 ] && kfail "the comparison with eager PyTorch took more than 180 s"
    forget "$p"
  done
  for p in a b; do
    [ -s "$KDIR/acc_$p.json" ] && say "$KIND: variant $p against eager: $(py "'%d outputs, max_rel_err %g' % (len(d['files']), d['max_rel_err'])" <"$KDIR/acc_$p.json")"
  done

  stop_broker
  rc=$?
  forget "$BROKER"
  if [ "$rc" = 0 ] && grep -q "event=stop leases_held=0 " "$KDIR/broker.log"; then
    stop_clean=true
  fi
  say "$KIND: the broker stopped with status $rc"
  local left=("$KW"/tmp/wb-aoti-*)
  tmp_left=0
  [ -e "${left[0]}" ] && tmp_left=${#left[@]}
  rm -rf "$KW/tmp"
  FACTS="{\"seconds\": $SECS, \"soak_seconds\": $(jn "$(((${t1:-0} - ${t0:-0}) / 1000))"),
 \"workers\": $NW, \"iterations\": $ITER, \"tolerance\": $TOL, \"broker_pid\": $(jn "$BROKER"),
 \"mem_mib\": {\"before\": $(jn "$mem0"), \"after\": $(jn "$mem1"), \"tolerance\": $MEM_TOL},
 \"gpu_procs\": {\"before\": $(jn "$procs0"), \"after\": $(jn "$procs1")},
 \"rss_kib\": {\"before\": $(jn "$rss0"), \"after\": $(jn "$rss1"), \"max\": $(jn "$RSS_MAX"), \"tolerance\": $RSS_TOL},
 \"fds\": {\"before\": $(jn "$fds0"), \"after\": $(jn "$fds1"), \"tolerance\": $FD_TOL},
 \"leases_left\": $(jn "$leases_left"), \"stats\": $stats, \"broker_stop_clean\": $stop_clean,
 \"tmp_left\": $(jn "$tmp_left")}"
  write_facts
}
FACTS=
write_facts() {
  [ -n "$FACTS" ] || FACTS="{\"seconds\": $SECS, \"workers\": $NW, \"iterations\": $ITER, \"tolerance\": $TOL}"
  printf '%s\n' "$FACTS" >"$KDIR/facts.json"
  FACTS=
}

# finish: OUT/run.json, then soak.py's judgement and table; its status.
finish() {
  python3 - "$OUT/run.json" "$SECS" "$NW" "$ITER" "$TOL" "$SLABS" "${GPU_NAME:-}" "${IDLE0:-}" \
    "${IDLE1:-}" "$MEM_TOL" "${RUN_FAILS[@]}" <<'PY'
import json, sys
a = sys.argv
num = lambda s: int(s) if s.isdigit() else None
json.dump({"seconds_per_slab": int(a[2]), "workers": int(a[3]), "iterations": int(a[4]),
           "tolerance": float(a[5]), "slabs": a[6].split(), "gpu": a[7],
           "device_mem_idle_mib": {"start": num(a[8]), "end": num(a[9]), "tolerance": int(a[10])},
           "failures": a[11:]}, open(a[1], "w"), indent=1)
PY
  python3 "$SOAK_PY" summary "$OUT" "$SEED" "${RAN[@]}" | tee -a "$LOG"
  exit "${PIPESTATUS[0]}"
}

# ---- the run ---------------------------------------------------------------------------
need_bins "$WBROKERD" "$WBCTL" "$WORKER"
gpu_sample || { say "no GPU visible (tests/gpu/gpumem.py failed)"; exit 2; }
GPU_NAME=$(python3 "$GPU_TESTS/gpumem.py" | py "d['name']")
mem_settle 10
IDLE0=$MEM_MIB IDLE_PROCS=$GPU_PROCS
say "seed $SEED; $NW workers, $SECS s per slab kind ($SLABS); gpu: $GPU_NAME, idle device memory $IDLE0 MiB"
python3 "$SOAK_PY" plan "$SEED" 4096 >"$OUT/plan.txt" || { say "soak.py plan failed"; exit 2; }
mapfile -t PLAN <"$OUT/plan.txt"

if [ -s "$WORK/fp32_a.pt2" ] && [ -s "$WORK/fp32_b.pt2" ] && [ -s "$WORK/fp32_a_ref.safetensors" ] &&
  [ -s "$WORK/fp32_b_ref.safetensors" ] && [ -s "$WORK/fp32_input.safetensors" ]; then
  say "reusing the compiled fp32 family in $WORK"
else
  say "compiling the fp32 family into $WORK"
  python3 "$ROOT/examples/compile_models.py" "$WORK" --family fp32 >"$OUT/compile_fp32.log" 2>&1 &
  cpid=$!
  PIDS+=("$cpid")
  wait_exit 600 "$cpid"
  rc=$?
  forget "$cpid"
  if [ "$rc" != 0 ]; then
    rfail "the fp32 compile failed (exit $rc): $(tail -n 5 "$OUT/compile_fp32.log" | tr '\n' ' ')"
    finish
  fi
  say "compiled: $(grep -c '^compiled' "$OUT/compile_fp32.log") packages"
fi

for k in $SLABS; do soak_kind "$k"; done
mem_settle 30 $((${IDLE0:-0} + MEM_TOL)) "${IDLE_PROCS:-0}" ||
  rfail "the GPU did not come back to idle after the last broker: ${MEM_MIB:-?} MiB and ${GPU_PROCS:-?}" \
    "processes, $IDLE0 MiB and $IDLE_PROCS at the start"
IDLE1=$MEM_MIB
finish
