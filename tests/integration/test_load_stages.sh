#!/usr/bin/env bash
# The loader's settings and figures: wbrokerd's loader options (checked, and
# used), --backend auto falling back to host with its reason, one log line
# per load stage, the loading fields of `wbctl models --json` and `wbctl
# stats --json`, and wbctl load's progress bar, drawn on a terminal only.
source "$(dirname "$0")/lib.sh"

# Misuse of the loader options: exit 2, naming the option.
for bad in "--read-threads 0" "--read-threads 65" "--staging-mib 0" "--staging-mib 2000" \
  "--staging-buffers 1" "--load-method fast" "--copy-batch 0" "--copy-batch 17"; do
  # shellcheck disable=SC2086
  "$WBROKERD" --socket "$SOCK" $bad >"$WB_TMP/bad.out" 2>"$WB_TMP/bad.err"
  rc=$?
  [ "$rc" = 2 ] || fail "wbrokerd $bad exited with $rc, expected 2"
  grep -qF -- "${bad%% *}" "$WB_TMP/bad.err" || fail "wbrokerd $bad: $(cat "$WB_TMP/bad.err")"
done

# Without a usable GPU, --backend cuda is one line and exit 1. (On a machine
# with a GPU this check does not apply.)
if ! nvidia-smi -L >/dev/null 2>&1; then
  "$WBROKERD" --backend cuda --socket "$SOCK" >"$WB_TMP/cuda.out" 2>"$WB_TMP/cuda.err"
  rc=$?
  [ "$rc" = 1 ] || fail "wbrokerd --backend cuda without a GPU exited with $rc, expected 1"
  [ "$(wc -l <"$WB_TMP/cuda.err")" = 1 ] || fail "--backend cuda said: $(cat "$WB_TMP/cuda.err")"
  grep -qiE "GPU|cuda" "$WB_TMP/cuda.err" || fail "--backend cuda said: $(cat "$WB_TMP/cuda.err")"
  [ -e "$SOCK" ] && fail "--backend cuda without a GPU left a socket behind"
fi

make_model "$WB_TMP/m.safetensors" 40 3 >/dev/null || fail "cannot write the test model"

# --backend auto on this machine: host (or cuda with a GPU), one line that
# says which and why.
BROKER_LOG=$WB_TMP/auto.log
"$WBROKERD" --backend auto --socket "$SOCK" --read-threads 3 >"$BROKER_LOG" 2>&1 &
BROKER_PID=$!
STARTED_PIDS+=("$BROKER_PID")
BROKER_PIDS+=("$BROKER_PID")
wait_for ctl stats || fail "the broker did not answer"
[ "$(grep -c 'event=backend ' "$BROKER_LOG")" = 1 ] || fail "not one event=backend line"
grep -q 'event=backend backend=\(host\|cuda\) requested=auto reason=' "$BROKER_LOG" ||
  fail "the backend line lacks the choice and reason: $(grep event=backend "$BROKER_LOG")"
stop_broker

start_broker --read-threads 3
BROKER_LOG_FIRST=$BROKER_LOG

# Not a terminal: no progress output, the table and one stages line.
ctl load plain "$WB_TMP/m.safetensors" >"$WB_TMP/plain.out" 2>"$WB_TMP/plain.err" ||
  fail "wbctl load failed: $(cat "$WB_TMP/plain.err")"
grep -q "loading plain" "$WB_TMP/plain.out" "$WB_TMP/plain.err" &&
  fail "wbctl load drew a progress bar on a pipe"
grep -q $'\r' "$WB_TMP/plain.out" && fail "wbctl load wrote a carriage return on a pipe"
grep -q "^plain  *1  *current  *host " "$WB_TMP/plain.out" || fail "load printed: $(cat "$WB_TMP/plain.out")"
grep -qE "^load: direct, [1-3] threads?; read [0-9.]+ (B|KiB|MiB|GiB|TiB)/s, hash [0-9.]+ (B|KiB|MiB|GiB|TiB)/s$" "$WB_TMP/plain.out" ||
  fail "load printed no stages line: $(cat "$WB_TMP/plain.out")"

# One greppable line per stage in the broker's log.
for stage in read hash total; do
  grep -q "event=load_stage model=plain stage=$stage bytes=[0-9]* seconds=[0-9.]* gbps=[0-9.]*" \
    "$BROKER_LOG" || fail "no load_stage line for stage $stage: $(grep load_stage "$BROKER_LOG")"
done
grep -q "event=load_stage model=plain stage=copy" "$BROKER_LOG" &&
  fail "the host backend logged a copy stage"

# The loading fields of list_models and stats.
models=$(ctl models --json) || fail "wbctl models failed"
got=$(json "[(m['loaded_bytes'] == m['bytes'], m['load_mode'], m['read_threads'] <= 3,
  m['read_threads'] >= 1, sorted(m['load_stages'])) for m in d if m['name'] == 'plain'][0]" <<<"$models")
[ "$got" = "(True, 'direct', True, True, ['copy', 'hash', 'read'])" ] ||
  fail "models --json loading fields: $got from $models"
stats=$(ctl stats --json) || fail "wbctl stats failed"
[ "$(json "(d['read_threads'], d['loads_in_progress'], d['loading_bytes'], d['staging_bytes'])" \
  <<<"$stats")" = "(3, 0, 0, 0)" ] || fail "stats loading fields: $stats"

# A terminal: the progress bar is drawn on the same line, then cleared, and
# the table follows.
if command -v script >/dev/null 2>&1; then
  script -qec "$WBCTL --socket $SOCK load tty $WB_TMP/m.safetensors" /dev/null \
    >"$WB_TMP/tty.out" 2>&1 || fail "wbctl load on a terminal failed: $(cat "$WB_TMP/tty.out")"
  grep -aq "loading tty \[" "$WB_TMP/tty.out" || fail "no progress bar on a terminal: $(cat -v "$WB_TMP/tty.out")"
  grep -aq $'\r' "$WB_TMP/tty.out" || fail "the progress bar does not redraw with a carriage return"
  grep -aq "tty  *1  *current  *host " "$WB_TMP/tty.out" || fail "no table after the bar: $(cat -v "$WB_TMP/tty.out")"
else
  log "script(1) is missing: the terminal case is not checked"
fi

stop_broker
[ -n "$BROKER_LOG_FIRST" ] || fail "no broker log"
