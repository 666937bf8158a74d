#!/usr/bin/env bash
# Slabs as sealed memfds handed out on the descriptor channel
# (--host-slab memfd), with real processes:
# * the broker binds <socket>.fd (0660) beside its socket and creates no
#   /dev/shm name; a worker leases, maps the memfd it receives read-only
#   and verifies every tensor; wbctl shows the transport and access mode;
# * the descriptor a client gets is sealed (write, grow, shrink, seal);
# * a wrong lease id, another process's lease (same uid, and another uid
#   through setpriv), bytes of the wrong shape and a silent connection are
#   refused with a reason or closed;
# * a process that closes its channel (exec closes it: close-on-exec) while
#   it still lives loses the leases fetched through it: the broker reclaims
#   them on the channel's EOF, not on the pidfd (the process is alive);
# * a client killed with SIGKILL gives its lease back, at whatever step of
#   its start it was killed; a broker killed with SIGKILL leaves the
#   worker's mapping readable and nothing in /dev/shm.
source "$(dirname "$0")/lib.sh"

PROBE=("$PYTHON" "$(dirname "$0")/fdchan_probe.py")
FDSOCK=$SOCK.fd
export WB_TIMEOUT_MS=3000
make_model "$WB_TMP/demo.safetensors" 5 9 >/dev/null

start_broker --host-slab memfd --handshake-timeout-ms 400 --model "demo=$WB_TMP/demo.safetensors"
wait_for model_ready demo || fail "model demo did not become ready"
[ -S "$FDSOCK" ] || fail "no descriptor channel at $FDSOCK"
[ "$(stat -c %a "$FDSOCK")" = 660 ] || fail "$FDSOCK has mode $(stat -c %a "$FDSOCK"), expected 660"
grep -q "event=backend .*host_slab=memfd" "$BROKER_LOG" || fail "the broker did not log host_slab=memfd"
[ "$(shm_count "$BROKER_PID")" = 0 ] || fail "a memfd broker made /dev/shm names: $(ls /dev/shm/wb-"$BROKER_PID"-*)"
[ "$(ctl models --json | json "d[0]['transport'] + ' ' + d[0]['access']")" = "memfd ro" ] ||
  fail "wbctl models --json: $(ctl models --json)"

# --- A worker maps the memfd read-only and verifies every tensor.
start_worker w1 --model demo
W1=$LAST_PID
grep -q "memfd:wb-slab" "/proc/$W1/maps" || fail "the worker maps no memfd: $(cat /proc/$W1/maps)"
perms=$(grep "memfd:wb-slab" "/proc/$W1/maps" | awk '{print $2}' | sort -u)
[ "$perms" = r--s ] || fail "the worker's memfd mapping is '$perms', expected r--s"
[ "$(lease_field "$W1" transport) $(lease_field "$W1" access)" = "memfd ro" ] ||
  fail "wbctl leases --json: $(ctl leases --json)"
ctl leases -o wide >"$WB_TMP/leases.out" || fail "wbctl leases -o wide failed"
grep -qE "demo .*memfd +ro" "$WB_TMP/leases.out" || fail "wbctl leases -o wide: $(cat "$WB_TMP/leases.out")"
ctl models >"$WB_TMP/models.out" || fail "wbctl models failed"
grep -qE "demo .*memfd +ro" "$WB_TMP/models.out" || fail "wbctl models: $(cat "$WB_TMP/models.out")"

# --- Refusals. A lease of this process's own: the test client holds it.
spawn holder "$TESTCLIENT" --socket "$SOCK" acquire demo
HOLDER=$LAST_PID
wait_for test -s "$WB_TMP/holder.out" || fail "the test client printed no lease id"
ID=$(head -n1 "$WB_TMP/holder.out")
[ ${#ID} = 32 ] || fail "lease id '$ID' is not 32 hex digits"

"${PROBE[@]}" "$FDSOCK" 00112233445566778899aabbccddeeff >"$WB_TMP/p1.out" || fail "probe failed"
grep -qx "status=-4 fds=0 announced=0 magic=WBF1" "$WB_TMP/p1.out" || fail "unknown id: $(cat "$WB_TMP/p1.out")"
grep -qx "error=no lease 00112233" "$WB_TMP/p1.out" || fail "unknown id: $(cat "$WB_TMP/p1.out")"

# Another process of the same uid presents the holder's id.
"${PROBE[@]}" "$FDSOCK" "$ID" >"$WB_TMP/p2.out" || fail "probe failed"
grep -qx "status=-8 fds=0 announced=0 magic=WBF1" "$WB_TMP/p2.out" || fail "stolen id: $(cat "$WB_TMP/p2.out")"
grep -q "^error=lease ${ID:0:8} belongs to pid $HOLDER (uid 0), not to this connection's pid [0-9]* (uid 0)$" \
  "$WB_TMP/p2.out" || fail "stolen id: $(cat "$WB_TMP/p2.out")"
grep -q "event=peer_refused reason=fd_channel" "$BROKER_LOG" || fail "the broker did not log the refusal"

# Bytes of the wrong shape: answered, then the connection is closed.
"${PROBE[@]}" "$FDSOCK" raw "$(printf 'ABCD%.0s' $(seq 10))" >"$WB_TMP/p3.out" || fail "probe failed"
grep -qx "status=-6 fds=0 announced=0 magic=WBF1" "$WB_TMP/p3.out" || fail "garbage: $(cat "$WB_TMP/p3.out")"
grep -qx 'error=descriptor request does not start with "WBF1", "WBS1" or "WBP1"' "$WB_TMP/p3.out" || fail "garbage: $(cat "$WB_TMP/p3.out")"
grep -qx "closed" "$WB_TMP/p3.out" || fail "the broker kept a connection that sent garbage"
# A connection that never asks is closed after --handshake-timeout-ms.
"${PROBE[@]}" "$FDSOCK" idle >"$WB_TMP/p4.out" || fail "probe failed"
grep -q "^closed after" "$WB_TMP/p4.out" || fail "silent connection: $(cat "$WB_TMP/p4.out")"
# The broker still serves.
"${PROBE[@]}" "$FDSOCK" 00112233445566778899aabbccddeeff >"$WB_TMP/p1b.out" || fail "probe failed"
grep -qx "status=-4 fds=0 announced=0 magic=WBF1" "$WB_TMP/p1b.out" || fail "the broker stopped answering: $(cat "$WB_TMP/p1b.out")"

# --- What the worker mapped is sealed (write, grow, shrink, seal), and the
# worker closed the descriptor once it had mapped it. The seals are read
# through /proc/PID/map_files.
fdpath=$(for f in /proc/"$W1"/fd/*; do
  [ "$(readlink "$f")" = "/memfd:wb-slab (deleted)" ] && echo "$f"
done | head -n1)
[ -z "$fdpath" ] || fail "the worker kept the memfd descriptor open after mapping it ($fdpath)"
"$PYTHON" - "/proc/$W1/map_files" "$WB_TMP/seal.out" <<'PY' || fail "seal check: $(cat "$WB_TMP/seal.out")"
import fcntl, os, sys
d, out = sys.argv[1], sys.argv[2]
F_GET_SEALS = 1034
with open(out, "w") as o:
    for name in os.listdir(d):
        if "memfd:wb-slab" not in os.readlink(os.path.join(d, name)):
            continue
        fd = os.open(os.path.join(d, name), os.O_RDONLY)
        seals = fcntl.fcntl(fd, F_GET_SEALS)
        o.write("seals %x\n" % seals)
        os.close(fd)
        sys.exit(0 if seals & 0xf == 0xf else 1)
    o.write("no memfd mapping\n")
    sys.exit(1)
PY
grep -qx "seals f" "$WB_TMP/seal.out" || fail "seals: $(cat "$WB_TMP/seal.out")"

# --- Another uid presents the holder's id (needs root for setpriv; the
# test opens the channel's socket to it, as a shared group would).
AS_ROOT=0
[ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && AS_ROOT=1
if [ "$AS_ROOT" = 1 ]; then
  chmod 0711 "$WB_TMP"
  chmod 0666 "$FDSOCK"
  setpriv --reuid 65534 --regid 65534 --clear-groups "${PROBE[@]}" "$FDSOCK" "$ID" \
    >"$WB_TMP/p5.out" 2>&1 || fail "probe as uid 65534 failed: $(cat "$WB_TMP/p5.out")"
  chmod 0660 "$FDSOCK"
  # Not on the client list: refused before the lease is even looked up.
  grep -qx "status=-8 fds=0 announced=0 magic=WBF1" "$WB_TMP/p5.out" || fail "uid 65534: $(cat "$WB_TMP/p5.out")"
  grep -qx "error=uid 65534 is not allowed to lease models (allowed: uid 0)" "$WB_TMP/p5.out" ||
    fail "uid 65534: $(cat "$WB_TMP/p5.out")"
else
  log "note: not root, the other-uid refusal is left out"
fi

# --- Liveness by connection: exec closes the channel (close-on-exec); the
# process lives on as sleep, with the same pid, and its lease is reclaimed
# on the channel's EOF.
spawn execer "$TESTCLIENT" --socket "$SOCK" acquire-exec demo sleep 60
EXECER=$LAST_PID
wait_for grep -q "reason=descriptor_channel_closed .* pid=$EXECER" "$BROKER_LOG" ||
  fail "the lease of $EXECER was not reclaimed when its channel closed"
alive "$EXECER" || fail "process $EXECER should still be running"
[ "$(lease_count "$EXECER")" = 0 ] || fail "process $EXECER still holds a lease"

# --- A client killed with SIGKILL gives its lease back.
kill -KILL "$HOLDER"
wait_for no_lease "$HOLDER" || fail "the killed holder's lease was not reclaimed"

# --- Workers killed with SIGKILL at every point of their start (connect,
# hello, acquire, fetch, map, verify, hold): whatever step each reached,
# the broker ends with no lease of theirs and no channel connection left
# open (its descriptor count comes back to where it was).
leases_total() { ctl leases --json | json "len(d)"; }
fds_of_broker() { ls "/proc/$BROKER_PID/fd" | wc -l; }
base_leases=$(leases_total)
base_fds=$(fds_of_broker)
for delay in 0 0.002 0.005 0.01 0.02 0.03 0.05 0.08 0.12 0.2; do
  spawn "k$delay" "$WORKER" --socket "$SOCK" --model demo
  sleep "$delay"
  kill -KILL "$LAST_PID"
  wait "$LAST_PID" 2>/dev/null
done
wait_for test "$(leases_total)" = "$base_leases" ||
  fail "killed workers left leases: $(ctl leases --json)"
wait_for test "$(fds_of_broker)" -le "$base_fds" ||
  fail "the broker holds $(fds_of_broker) descriptors, $base_fds before the killed workers"

# --- The broker killed with SIGKILL: the worker's mapping stays readable
# (it re-verifies every 50 ms, every tensor against its checksum, and exits
# 0 only if they all matched), and no name is left in /dev/shm.
kill -TERM "$W1"
wait_exit "$W1"
[ "$EXIT_RC" = 0 ] || fail "worker w1 exited with $EXIT_RC"
spawn w2 "$WORKER" --socket "$SOCK" --model demo --verify-every 50
W2=$LAST_PID
wait_for output_has w2 "verified " || fail "worker w2 did not verify its lease"
kill -KILL "$BROKER_PID"
wait "$BROKER_PID" 2>/dev/null
wait_for output_has w2 "broker connection lost" || fail "worker w2 did not notice the broker's death"
sleep 0.5
kill -TERM "$W2"
wait_exit "$W2"
[ "$EXIT_RC" = 0 ] || fail "worker w2 exited with $EXIT_RC after the broker died: $(cat "$WB_TMP/w2.err")"
n=$(sed -n 's/^verifications passed: //p' "$WB_TMP/w2.out")
[ "${n:-0}" -ge 5 ] || fail "worker w2 verified $n times, expected at least 5 (every 50 ms, 0.5 s after the broker died)"
[ "$(shm_count "$BROKER_PID")" = 0 ] || fail "the killed broker left /dev/shm names"
ls /dev/shm | grep -q "^wb-$BROKER_PID-" && fail "/dev/shm holds names of broker $BROKER_PID"

# --- A fresh broker on the same socket: the channel path is taken over
# (the killed broker's socket file is stale) and a new worker works.
start_broker --host-slab memfd --allow-uid 0,65534 --model "demo=$WB_TMP/demo.safetensors"
wait_for model_ready demo || fail "model demo did not become ready after the restart"
start_worker w3 --model demo --hold 0
wait_exit "$LAST_PID"
[ "$EXIT_RC" = 0 ] || fail "worker w3 exited with $EXIT_RC"
# uid 65534 may lease now, but not take root's lease by its id.
if [ "$AS_ROOT" = 1 ]; then
  spawn holder2 "$TESTCLIENT" --socket "$SOCK" acquire demo
  HOLDER2=$LAST_PID
  wait_for test -s "$WB_TMP/holder2.out" || fail "the test client printed no lease id"
  ID2=$(head -n1 "$WB_TMP/holder2.out")
  chmod 0666 "$FDSOCK"
  setpriv --reuid 65534 --regid 65534 --clear-groups "${PROBE[@]}" "$FDSOCK" "$ID2" \
    >"$WB_TMP/p6.out" 2>&1 || fail "probe as uid 65534 failed: $(cat "$WB_TMP/p6.out")"
  grep -qx "status=-8 fds=0 announced=0 magic=WBF1" "$WB_TMP/p6.out" || fail "uid 65534: $(cat "$WB_TMP/p6.out")"
  grep -q "^error=lease ${ID2:0:8} belongs to pid $HOLDER2 (uid 0), not to this connection's pid [0-9]* (uid 65534)$" \
    "$WB_TMP/p6.out" || fail "uid 65534: $(cat "$WB_TMP/p6.out")"
  kill -TERM "$HOLDER2"
  wait_exit "$HOLDER2"
fi
stop_broker
[ ! -e "$FDSOCK" ] || fail "the broker left $FDSOCK behind"
