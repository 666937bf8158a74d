#!/usr/bin/env bash
# Loads that are stopped, or not waited for: `wbctl cancel` and `wbctl
# unload` of a loading model stop its load (one queued behind another never
# starts), the waiting `wbctl load` is told who cancelled it, and nothing of
# the load is left (no model, no /dev/shm slab, consistent counters, a log
# line); a cancel of a ready model is refused; `load --no-wait` returns at
# once and the model becomes ready; a `load` that stops waiting (its
# --timeout-ms, Ctrl-C) says that the load goes on, with its own exit code,
# and the load does; a broker killed under a waiting `load` is told.
#
# The broker runs with a preloaded shim (libwbtest_slowread.so) that makes
# each read of tensor data sleep, so that a load of 32 MiB takes seconds;
# and with --no-share-tensors: the checkpoint is loaded again under other
# names, and a load whose tensors are all resident already reads nothing
# after comparing them.
source "$(dirname "$0")/lib.sh"

# 128 reads of 256 KiB at 30 ms each: about 4 s for the big checkpoint.
use_slow_broker 30000
HOST_SLAB=shm

# One U8 tensor of N bytes (zeros, a sparse file).
make_big() {
  "$PYTHON" - "$1" "$2" <<'PY'
import json, struct, sys
path, n = sys.argv[1], int(sys.argv[2])
raw = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    f.truncate(8 + len(raw) + n)
PY
}
BIG=$WB_TMP/big.safetensors
make_big "$BIG" $((32 << 20)) || fail "cannot write the big checkpoint"
SMALL=$WB_TMP/small.safetensors
make_model "$SMALL" 4 1 >/dev/null || fail "cannot write the small checkpoint"

is_loading() {
  [ "$(model_state "$1")" = loading ]
}

# A load waiting in the background: its wbctl in LAST_PID.
load_bg() {
  spawn "$1" "$WBCTL" --socket "$SOCK" load "$2" "$3"
}

start_broker --read-threads 1 --no-share-tensors
BPID=$BROKER_PID

# --- wbctl cancel stops a load in progress; the waiting load is told.
load_bg load1 big "$BIG"
load1=$LAST_PID
wait_for is_loading big || fail "big is not loading: $(ctl models)"
ctl cancel big >"$WB_TMP/cancel.out" 2>"$WB_TMP/cancel.err" ||
  fail "wbctl cancel failed: $(cat "$WB_TMP/cancel.err")"
[ "$(cat "$WB_TMP/cancel.out")" = "cancelled the load of big" ] ||
  fail "wbctl cancel printed: $(cat "$WB_TMP/cancel.out")"
wait_exit "$load1"
[ "$EXIT_RC" = 1 ] || fail "the cancelled load exited $EXIT_RC, not 1"
grep -Eq "^wbctl: load: the load of model 'big' was cancelled by pid [0-9]+ \(uid $(id -u)\)$" \
  "$WB_TMP/load1.err" || fail "the cancelled load said: $(cat "$WB_TMP/load1.err")"
model_absent big || fail "big is still listed: $(ctl models)"
[ "$(shm_count "$BPID")" = 0 ] || fail "the cancelled load left $(ls /dev/shm/wb-"$BPID"-*)"
[ "$(stat_field loads_cancelled)" = 1 ] || fail "loads_cancelled: $(ctl stats --json)"
[ "$(ctl stats --json | json "(d['loads_total'], d['loads_failed'], d['loads_in_progress'], d['models'])")" = "(0, 0, 0, 0)" ] ||
  fail "stats after the cancel: $(ctl stats --json)"
grep -Eq "event=model_load_cancelled model=big by=cancel pid=[0-9]+ uid=$(id -u) started=yes " "$BROKER_LOG" ||
  fail "no cancel line in the log: $(grep model_load "$BROKER_LOG")"
wait_for grep -q "event=model_load_stopped model=big" "$BROKER_LOG" || fail "the load never stopped"

# --- A load queued behind another is cancelled before it starts; the one
# reading is stopped by a plain unload.
load_bg load2 big2 "$BIG"
load2=$LAST_PID
wait_for is_loading big2 || fail "big2 is not loading"
load_bg load3 queued "$SMALL"
load3=$LAST_PID
wait_for is_loading queued || fail "queued is not listed as loading"
ctl cancel queued >"$WB_TMP/cancel.out" || fail "wbctl cancel queued failed"
wait_exit "$load3"
[ "$EXIT_RC" = 1 ] || fail "the queued load exited $EXIT_RC, not 1"
grep -q "the load of model 'queued' was cancelled by pid" "$WB_TMP/load3.err" ||
  fail "the queued load said: $(cat "$WB_TMP/load3.err")"
grep -Eq "event=model_load_cancelled model=queued by=cancel .* started=no " "$BROKER_LOG" ||
  fail "the queued load had started: $(grep model_load_cancelled "$BROKER_LOG")"
grep -q "event=load_path model=queued" "$BROKER_LOG" && fail "the queued load was opened"
is_loading big2 || fail "cancelling the queued load stopped big2 too"
ctl unload big2 >"$WB_TMP/unload.out" 2>"$WB_TMP/unload.err" ||
  fail "wbctl unload of a loading model failed: $(cat "$WB_TMP/unload.err")"
[ "$(cat "$WB_TMP/unload.out")" = "freed (its load was cancelled)" ] ||
  fail "wbctl unload printed: $(cat "$WB_TMP/unload.out")"
wait_exit "$load2"
[ "$EXIT_RC" = 1 ] || fail "the unloaded load exited $EXIT_RC, not 1"
grep -Eq "^wbctl: load: the load of model 'big2' was cancelled: pid [0-9]+ \(uid $(id -u)\) unloaded the model$" \
  "$WB_TMP/load2.err" || fail "the unloaded load said: $(cat "$WB_TMP/load2.err")"
model_absent big2 || fail "big2 is still listed"
model_absent queued || fail "queued is still listed"
[ "$(shm_count "$BPID")" = 0 ] || fail "the stopped loads left $(ls /dev/shm/wb-"$BPID"-*)"
[ "$(ctl stats --json | json "(d['loads_cancelled'], d['loads_total'], d['loads_in_progress'])")" = "(3, 0, 0)" ] ||
  fail "stats after three cancels: $(ctl stats --json)"
grep -q "event=model_load_cancelled model=big2 by=unload" "$BROKER_LOG" || fail "no unload cancel line"

# --- Only a load can be cancelled.
ctl load small "$SMALL" >/dev/null 2>&1 || fail "the small load failed"
ctl cancel small >"$WB_TMP/cancel.out" 2>"$WB_TMP/cancel.err"
rc=$?
[ "$rc" = 1 ] || fail "cancel of a ready model exited $rc, not 1"
[ "$(cat "$WB_TMP/cancel.err")" = "wbctl: cancel: model 'small' is ready, not loading: there is no load to cancel (unload it instead)" ] ||
  fail "cancel of a ready model said: $(cat "$WB_TMP/cancel.err")"
[ ! -s "$WB_TMP/cancel.out" ] || fail "a refused cancel printed $(cat "$WB_TMP/cancel.out")"
model_ready small || fail "the refused cancel touched small"
ctl cancel nothing 2>"$WB_TMP/cancel.err"
[ $? = 1 ] || fail "cancel of no model did not exit 1"
grep -qF "no model named 'nothing'" "$WB_TMP/cancel.err" || fail "cancel of no model: $(cat "$WB_TMP/cancel.err")"

# --- A load of a draining model's name says how to go on.
spawn holder "$TESTCLIENT" --socket "$SOCK" acquire small
holder=$LAST_PID
wait_for test -s "$WB_TMP/holder.out" || fail "the holder got no lease"
[ "$(ctl unload small)" = "draining (1 lease)" ] || fail "small does not drain"
ctl load small "$SMALL" >/dev/null 2>"$WB_TMP/drain.err"
[ $? = 1 ] || fail "a load over a draining model did not exit 1"
[ "$(cat "$WB_TMP/drain.err")" = "wbctl: load: a model named 'small' already exists and is draining: its name is free again when its last lease ends (1 left; \`wbctl leases small\` shows them); wait for that, or load this one under another name" ] ||
  fail "a load over a draining model said: $(cat "$WB_TMP/drain.err")"
kill -TERM "$holder"
wait_exit "$holder"
wait_for model_absent small || fail "small was not freed after its lease"
ctl load small "$SMALL" >/dev/null 2>&1 || fail "small could not be loaded again"

# --- load --no-wait returns at once, the model loading; it becomes ready.
t0=$(date +%s%N)
ctl load --no-wait nw "$BIG" >"$WB_TMP/nw.out" 2>"$WB_TMP/nw.err" ||
  fail "load --no-wait failed: $(cat "$WB_TMP/nw.err")"
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$ms" -lt 2000 ] || fail "load --no-wait took $ms ms"
# The state shows how far the load got once the loader knows its size
# ("loading 0%"), or not yet.
grep -Eq "^nw +1 +loading( [0-9]+%)? +host " "$WB_TMP/nw.out" ||
  fail "load --no-wait printed: $(cat "$WB_TMP/nw.out")"
grep -qF 'nw is loading in the broker: `wbctl models` shows how it goes, `wbctl cancel nw` stops it' \
  "$WB_TMP/nw.out" || fail "load --no-wait gave no hint: $(cat "$WB_TMP/nw.out")"
is_loading nw || fail "nw is not loading after load --no-wait: $(model_state nw)"
wait_for model_ready nw || fail "nw did not become ready: $(model_state nw)"
[ "$(ctl load --no-wait --json nw2 "$SMALL" | json "d['state']")" = loading ] ||
  fail "load --no-wait --json does not say loading"
wait_for model_ready nw2 || fail "nw2 did not become ready"

# --- load --timeout-ms: stops waiting, says so honestly (exit 75), and the
# load completes in the broker.
ctl --timeout-ms 300 load slow "$BIG" >"$WB_TMP/slow.out" 2>"$WB_TMP/slow.err"
rc=$?
[ "$rc" = 75 ] || fail "load --timeout-ms 300 exited $rc, not 75: $(cat "$WB_TMP/slow.err")"
[ "$(cat "$WB_TMP/slow.err")" = 'wbctl: load: stopped waiting after 0.3 s; the load of slow continues in the broker (see `wbctl models`; `wbctl cancel slow` stops it)' ] ||
  fail "load --timeout-ms said: $(cat "$WB_TMP/slow.err")"
is_loading slow || fail "slow is not loading after wbctl stopped waiting"
wait_for model_ready slow || fail "slow did not become ready"

# --- Ctrl-C during a waiting load: exit 130, the load goes on.
load_bg int int "$BIG"
intpid=$LAST_PID
wait_for is_loading int || fail "int is not loading"
sleep 0.3
kill -INT "$intpid"
wait_exit "$intpid"
[ "$EXIT_RC" = 130 ] || fail "the interrupted load exited $EXIT_RC, not 130"
[ "$(cat "$WB_TMP/int.err")" = 'wbctl: load: interrupted: the load of int continues in the broker; `wbctl cancel int` stops it' ] ||
  fail "the interrupted load said: $(cat "$WB_TMP/int.err")"
is_loading int || fail "int is not loading after the interrupt"
wait_for model_ready int || fail "int did not become ready"

# Five models: a slab and a shared table each, removed by a clean stop.
[ "$(shm_count "$BPID")" = 10 ] || fail "5 models should hold 10 shm objects: $(ls /dev/shm/wb-"$BPID"-*)"
[ "$(stat_field loads_total)" = 6 ] || fail "loads_total: $(ctl stats --json)"
stop_broker

# --- A broker that dies under a waiting load: the load says so (exit 69)
# within a few seconds, not after the load's time.
start_broker --read-threads 1 --no-share-tensors
load_bg dead big "$BIG"
deadpid=$LAST_PID
wait_for is_loading big || fail "big is not loading"
t0=$(date +%s%N)
kill -KILL "$BROKER_PID"
wait "$BROKER_PID" 2>/dev/null
wait_exit "$deadpid"
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$EXIT_RC" = 69 ] || fail "the load under a dead broker exited $EXIT_RC, not 69"
grep -q "^wbctl: load: the broker stopped answering while big was loading: " "$WB_TMP/dead.err" ||
  fail "the load under a dead broker said: $(cat "$WB_TMP/dead.err")"
[ "$ms" -lt 3000 ] || fail "the load took $ms ms to notice the broker's death"
