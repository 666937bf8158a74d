#!/usr/bin/env bash
# Pid reuse through connections passed on to another process. A process of
# uid 65534 opens a ZMTP connection and two descriptor channel connections
# (it asks the first for its session, as libwbclient does), passes them to a
# child and exits; its pid is given (through /proc/sys/kernel/ns_last_pid)
# to a worker of uid 1000 that acquires a lease and fetches its descriptors
# (memfd slabs). Then the child, through the inherited connections:
# * closes the channel connection that holds the session: the victim's
#   lease stays (the connection's process has exited: it reclaims nothing);
# * asks the other channel connection for the victim's descriptors:
#   refused, and the connection closed;
# * sends acquires on the ZMTP connection: refused before decoding, and the
#   connection closed; nothing is granted under the victim's pid.
source "$(dirname "$0")/lib.sh"

need_nobody
[ -w /proc/sys/kernel/ns_last_pid ] || skip "/proc/sys/kernel/ns_last_pid is not writable"
VICTIM=(setpriv --reuid 1000 --regid 65534 --clear-groups)
"${VICTIM[@]}" "$WORKER" --help >/dev/null 2>&1 ||
  skip "uid 1000 cannot run $WORKER (is the build directory reachable for it?)"
PY=/usr/bin/python3
"${NOBODY[@]}" "$PY" -c "import sys" 2>/dev/null || skip "uid 65534 cannot run $PY"

make_model "$WB_TMP/demo.safetensors" 3 7 >/dev/null
chmod 0711 "$WB_TMP"
RUN=$WB_TMP/run
mkdir "$RUN"
chgrp 65534 "$RUN"
chmod 2750 "$RUN"
SOCK=$RUN/broker.sock
export WB_SOCKET=$SOCK
mkdir -m 0755 "$WB_TMP/py" # readable: python lists the directory to import
mkdir -m 0777 "$WB_TMP/x"  # where the attacker writes its pid, and is told to go
cp "$(dirname "$0")/pidreuse_peer.py" "$(dirname "$0")/zmtp_peer.py" "$WB_TMP/py/"
chmod 0644 "$WB_TMP"/py/*.py
start_broker --model "demo=$WB_TMP/demo.safetensors" --allow-uid 65534,1000 --host-slab memfd
wait_for model_ready demo || fail "model demo did not become ready"

spawn attacker "${NOBODY[@]}" "$PY" "$WB_TMP/py/pidreuse_peer.py" "$SOCK" demo "$WB_TMP/x/ppid" \
  "$WB_TMP/x/go"
attacker=$LAST_PID
wait_exit "$attacker" # the parent exits at once; its child holds the connections
[ "$EXIT_RC" = 0 ] || fail "the attacker's parent exited with $EXIT_RC: $(cat "$WB_TMP/attacker.err")"
ppid=$(cat "$WB_TMP/x/ppid")
[ "$ppid" = "$attacker" ] || fail "pid file says $ppid, the process was $attacker"

victim=
for attempt in $(seq 1 50); do
  echo $((attacker - 1)) >/proc/sys/kernel/ns_last_pid
  "${VICTIM[@]}" "$WORKER" --socket "$SOCK" --model demo --hold 60 \
    >"$WB_TMP/victim.out" 2>"$WB_TMP/victim.err" &
  pid=$!
  if [ "$pid" = "$attacker" ]; then
    victim=$pid
    STARTED_PIDS+=("$pid")
    break
  fi
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
done
[ -n "$victim" ] || skip "could not start a process with pid $attacker in 50 attempts"
wait_for output_has victim "verified" || fail "the victim did not get its lease: $(cat "$WB_TMP/victim.out" "$WB_TMP/victim.err")"
id=$(lease_field "$victim" id)
[ "${#id}" = 32 ] || fail "no lease of pid $victim: $(ctl leases --json)"
[ "$(lease_field "$victim" uid)" = 1000 ] || fail "the victim's lease is not uid 1000's"

echo "$id" >"$WB_TMP/x/go"
wait_for grep -qE '^(closed|acquire)' "$WB_TMP/attacker.out" ||
  fail "the attacker's child reported nothing: $(cat "$WB_TMP/attacker.out" "$WB_TMP/attacker.err")"
sleep 0.3
gone_msg="the process that opened this connection (pid $attacker) has exited"
grep -qF "fd status=-" "$WB_TMP/attacker.out" && grep -qF "$gone_msg" "$WB_TMP/attacker.out" ||
  fail "the inherited channel connection was not refused: $(cat "$WB_TMP/attacker.out")"
[ "$(grep -c '^acquire status=0 ' "$WB_TMP/attacker.out")" = 0 ] ||
  fail "acquires through the inherited connection were granted: $(cat "$WB_TMP/attacker.out")"
grep -qF "acquire status=-" "$WB_TMP/attacker.out" ||
  fail "no refusal on the inherited ZMTP connection: $(cat "$WB_TMP/attacker.out")"
tail -n 1 "$WB_TMP/attacker.out" | grep -qx closed ||
  fail "the broker kept the inherited ZMTP connection open: $(cat "$WB_TMP/attacker.out")"

# The victim's lease is untouched, and it is the only one.
[ "$(lease_field "$victim" id)" = "$id" ] || fail "the victim's lease is gone: $(ctl leases --json)"
[ "$(lease_count "$victim")" = 1 ] || fail "pid $victim holds other leases: $(ctl leases --json)"
[ "$(ctl leases --json | json 'len(d)')" = 1 ] || fail "other leases: $(ctl leases --json)"
[ "$(stat_field leases_reclaimed)" = 0 ] || fail "a lease was reclaimed: $(grep lease_reclaim "$BROKER_LOG")"
grep -q "reason=descriptor_channel_closed" "$BROKER_LOG" && fail "a descriptor_channel_closed reclaim"
alive "$victim" || fail "the victim died: $(cat "$WB_TMP/victim.err")"

# The victim goes on: its lease ends with it, reclaimed by its own pidfd.
kill -KILL "$victim"
wait "$victim" 2>/dev/null
wait_for all_active 0 || fail "the victim's lease was not reclaimed: $(ctl leases --json)"
stop_broker
