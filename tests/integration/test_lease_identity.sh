#!/usr/bin/env bash
# A lease belongs to the process that acquired it (pid, uid and the process
# itself), with real processes of another uid (nobody, 65534, through
# setpriv):
# * a process that acquired a lease as root and then exec'd a program as
#   nobody (same pid, same process) may not release it;
# * after the holder dies, a new process of another uid given the dead
#   holder's pid (forced through /proc/sys/kernel/ns_last_pid) may not
#   release it: the dead process's lease is reclaimed, never released;
# * non-administrators see other processes' lease ids as 8 hex digits.
source "$(dirname "$0")/lib.sh"
# Named slabs in /dev/shm: what this test looks at.
HOST_SLAB=shm

need_nobody
[ -w /proc/sys/kernel/ns_last_pid ] || skip "/proc/sys/kernel/ns_last_pid is not writable"
"${NOBODY[@]}" "$TESTCLIENT" --socket "$SOCK" 2>/dev/null
[ $? = 2 ] || skip "uid 65534 cannot run $TESTCLIENT (is the build directory reachable for it?)"

make_model "$WB_TMP/demo.safetensors" 3 7 >/dev/null
chmod 0711 "$WB_TMP"
RUN=$WB_TMP/run
mkdir "$RUN"
chgrp 65534 "$RUN"
chmod 2750 "$RUN"
SOCK=$RUN/broker.sock
export WB_SOCKET=$SOCK
start_broker --model "demo=$WB_TMP/demo.safetensors" --allow-uid 65534
wait_for model_ready demo || fail "model demo did not become ready"

# --- Same process, another uid after an exec.
spawn execd "$TESTCLIENT" --socket "$SOCK" acquire-exec demo \
  "${NOBODY[@]}" "$TESTCLIENT" --socket "$SOCK" release "{}"
execd=$LAST_PID
wait_exit "$execd"
id=$(head -n 1 "$WB_TMP/execd.out")
[ "${#id}" = 32 ] || fail "no lease id from the exec'ing client: $(cat "$WB_TMP/execd.out")"
[ "$EXIT_RC" = 1 ] || fail "the release after exec as nobody exited with $EXIT_RC, expected 1 (refused): $(cat "$WB_TMP/execd.out" "$WB_TMP/execd.err")"
grep -qF "lease ${id:0:8} belongs to pid $execd (uid 0)" "$WB_TMP/execd.err" ||
  fail "unclear refusal: $(cat "$WB_TMP/execd.err")"
[ "$(stat_field leases_released)" = 0 ] || fail "the lease was released by uid 65534"
# The process is gone now: its lease is reclaimed, not released.
wait_for stat_is leases_reclaimed 1 || fail "the exec'd process's lease was not reclaimed"

# --- A dead holder's pid reused by a process of another uid.
spawn holder "$TESTCLIENT" --socket "$SOCK" acquire demo
holder=$LAST_PID
wait_for grep -qE '^[0-9a-f]{32}$' "$WB_TMP/holder.out" || fail "the holder did not get a lease"
id=$(head -n 1 "$WB_TMP/holder.out")
# What nobody sees of root's lease: 8 hex digits; root sees all 32.
"${NOBODY[@]}" "$WBCTL" --socket "$SOCK" leases --json >"$WB_TMP/nobody.json" ||
  fail "nobody's wbctl leases failed"
[ "$(json "[l['id'] for l in d]" <"$WB_TMP/nobody.json")" = "[\"${id:0:8}\"]" ] ||
  fail "nobody sees: $(cat "$WB_TMP/nobody.json")"
[ "$(lease_field "$holder" id)" = "$id" ] || fail "root does not see the whole id"

kill -KILL "$holder"
wait "$holder" 2>/dev/null
got=
for attempt in $(seq 1 50); do
  echo $((holder - 1)) >/proc/sys/kernel/ns_last_pid
  "${NOBODY[@]}" "$TESTCLIENT" --socket "$SOCK" release "$id" >"$WB_TMP/reuse.out" 2>"$WB_TMP/reuse.err" &
  pid=$!
  wait "$pid"
  rc=$?
  if [ "$pid" = "$holder" ]; then
    got=1
    break
  fi
done
[ -n "$got" ] || skip "could not start a process with pid $holder in 50 attempts"
[ "$rc" = 1 ] || fail "the release from the reused pid exited with $rc, expected 1: $(cat "$WB_TMP/reuse.out" "$WB_TMP/reuse.err")"
grep -qF "no lease ${id:0:8}" "$WB_TMP/reuse.err" || fail "unclear refusal: $(cat "$WB_TMP/reuse.err")"
[ "$(stat_field leases_released)" = 0 ] || fail "the dead holder's lease was released"
[ "$(stat_field leases_reclaimed)" = 2 ] || fail "the dead holder's lease was not reclaimed"
wait_for all_active 0 || fail "leases remain: $(ctl leases --json)"
stop_broker
