#!/usr/bin/env bash
# The broker and its clients in pid namespaces that cannot see each other,
# as in Kubernetes pods without hostPID: SO_PEERCRED gives the broker pid 0
# for every client, so it knows them by their descriptor channel session
# (--host-slab memfd). The broker runs in a pid namespace of its own
# (`unshare --pid`, the broker's pod); wbctl runs in that namespace (as
# `kubectl exec` into the broker's pod would); clients run in pid
# namespaces of their own (worker pods) or in the test's (a namespace the
# broker's is not an ancestor of: hidden too).
# * a worker in its own namespace leases, maps and verifies; a client reads
#   every tensor through its mapping equal to the checkpoint's bytes;
#   wbctl leases shows the holder as conn:N; the memfd it maps refuses
#   writing and resizing; another hidden process presenting its lease id,
#   or an unknown id, on the channel is refused with the reason;
# * a worker killed with SIGKILL gives its lease back on its session's EOF
#   (reason=descriptor_channel_closed) within a bound; workers killed at
#   every point of their start leave no lease and no connection;
# * a client without a session token (one that predates sessions) is
#   refused with the reason; the same client where its pid is visible (in
#   the broker's namespace) still leases and fetches its descriptors;
# * a token presented by another uid, by a process whose pid is visible,
#   after its session ended, forged or of the wrong size is refused with
#   the reason;
# * the broker killed and restarted: a worker in its own namespace takes a
#   new session and a new lease from the new broker; killed at every point
#   of a hidden worker's start, the worker ends with a lease from the new
#   broker or exits saying why, and no lease is left behind;
# * a broker without a descriptor channel (/dev/shm names) refuses hidden
#   clients and says why.
source "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || skip "new pid namespaces (unshare --pid) need root"
if ! command -v unshare >/dev/null || ! command -v nsenter >/dev/null; then
  skip "unshare and nsenter (util-linux) are not installed"
fi
unshare --pid --fork --mount-proc true 2>/dev/null ||
  skip "this kernel or container does not allow new pid namespaces"
need_nobody

PROBE=("$PYTHON" "$(dirname "$0")/fdchan_probe.py")
FDSOCK=$SOCK.fd
# A pod: its own pid namespace and its own /dev/shm (a pod without hostIPC
# does not see the host's), so nothing a broker or client here does can
# depend on, or touch, the host's /dev/shm.
POD=(unshare --pid --fork --mount-proc --kill-child
  sh -c 'mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm && exec "$@"' sh)
export WB_TIMEOUT_MS=3000
RECLAIM_LIMIT_MS=2000
[ "${WB_SANITIZED:-0}" = 1 ] && RECLAIM_LIMIT_MS=6000
make_model "$WB_TMP/demo.safetensors" 5 9 >/dev/null

# The broker's pid as the test sees it; wbctl runs in its pid namespace,
# and its mount namespace (whose /proc is that pid namespace's: the
# sanitizers read /proc/self).
BROKER_NS=
ctl() {
  nsenter --target "$BROKER_PID" --pid --mount "$WBCTL" --socket "$SOCK" "$@"
  local rc=$?
  if [ "$rc" -ge 128 ]; then
    echo "wbctl $* died with status $rc" >>"$WB_TMP/crashes"
  fi
  return "$rc"
}

# child_of PID: the one child of PID (what unshare --fork started).
child_of() {
  local c
  c=$(cat /proc/"$1"/task/*/children 2>/dev/null | tr -s ' ' '\n' | head -n1)
  [ -n "$c" ] && echo "$c"
}

# start_ns_broker ARGS...: wbrokerd as PID 1 of a new pid namespace.
start_ns_broker() {
  BROKER_RUNS=$((BROKER_RUNS + 1))
  BROKER_LOG=$WB_TMP/broker$BROKER_RUNS.log
  "${POD[@]}" "$WBROKERD" --backend host --socket "$SOCK" --heartbeat-ms 100 --stale-ms 600 \
    --log-level debug "$@" >"$BROKER_LOG" 2>&1 &
  BROKER_NS=$!
  STARTED_PIDS+=("$BROKER_NS")
  wait_for child_of "$BROKER_NS" || fail "unshare started no broker"
  BROKER_PID=$(child_of "$BROKER_NS")
  BROKER_PIDS+=("$BROKER_PID")
  wait_for ctl stats || fail "the broker did not answer on $SOCK within ${WAIT_SECS}s"
}

# session_lease_count: leases whose holder is known by its session.
session_lease_count() {
  ctl leases --json | json "len([l for l in d if 'session' in l])"
}

start_ns_broker --host-slab memfd --model "demo=$WB_TMP/demo.safetensors" --allow-uid 65534
wait_for model_ready demo || fail "model demo did not become ready"

# --- A worker in a pid namespace of its own.
spawn w1 "${POD[@]}" "$WORKER" --socket "$SOCK" --model demo
W1NS=$LAST_PID
wait_for output_has w1 "verified " || fail "worker w1 (own pid namespace) did not verify its lease"
W1=$(child_of "$W1NS")
[ "$(session_lease_count)" = 1 ] || fail "no lease held by a session: $(ctl leases --json)"
read -r sess pid proc < <(ctl leases --json | json "' '.join(str(x) for x in (d[0]['session'], d[0]['pid'], d[0]['process']))")
[[ $sess =~ ^conn:[0-9]+$ ]] || fail "the holder is shown as '$sess', expected conn:N"
[ "$pid" = $((0x80000000 + ${sess#conn:})) ] || fail "session $sess has pid $pid in the JSON"
[ "$proc" = "?" ] || fail "a hidden holder's process name is '$proc' (the broker cannot read its /proc)"
ctl leases >"$WB_TMP/leases.out" || fail "wbctl leases failed"
grep -qE "^[0-9a-f]{8} +demo +1 +$sess +\? +active" "$WB_TMP/leases.out" ||
  fail "wbctl leases: $(cat "$WB_TMP/leases.out")"
ctl leases -o wide >"$WB_TMP/leases_wide.out" || fail "wbctl leases -o wide failed"
grep -qE "^[0-9a-f]{8} +demo +1 +$sess +\? +0 +0 +active" "$WB_TMP/leases_wide.out" ||
  fail "wbctl leases -o wide: $(cat "$WB_TMP/leases_wide.out")"
grep -q "event=peer_refused" "$BROKER_LOG" && fail "the broker refused a client: $(grep peer_refused "$BROKER_LOG")"

# --- A client in the test's own pid namespace (the broker's namespace is
# not its ancestor: hidden as well) reads every tensor equal to the file.
spawn dump "$TESTCLIENT" --socket "$SOCK" acquire-dump demo
DUMP=$LAST_PID
wait_for output_has dump "end" || fail "the dumping client did not finish: $(cat "$WB_TMP/dump.out")"
"$PYTHON" - "$WB_TMP/demo.safetensors" "$WB_TMP/dump.out" <<'PY' || fail "the tensors read differ from the checkpoint"
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
data = raw[8 + n:]
lines = open(sys.argv[2]).read().split("\n")[1:]
got = dict(l.split(" ", 1) if " " in l else (l, "") for l in lines if l and l != "end")
want = {k: data[v["data_offsets"][0]:v["data_offsets"][1]].hex()
        for k, v in hdr.items() if k != "__metadata__"}
if got != want:
    print("read %s, checkpoint %s" % (sorted(got), sorted(want)), file=sys.stderr)
    for k in want:
        if got.get(k) != want[k]:
            print("%s: read %s, file %s" % (k, got.get(k), want[k]), file=sys.stderr)
    sys.exit(1)
print("%d tensors equal" % len(want))
PY
[ "$(session_lease_count)" = 2 ] || fail "expected 2 session leases: $(ctl leases --json)"

# Another hidden process presents that lease's id on the channel: refused,
# naming both sessions.
DUMPID=$(head -n1 "$WB_TMP/dump.out")
"${POD[@]}" "${PROBE[@]}" "$FDSOCK" "$DUMPID" >"$WB_TMP/p1.out" || fail "probe failed"
grep -qx "status=-8 fds=0 announced=0 magic=WBF1" "$WB_TMP/p1.out" || fail "another session's lease: $(cat "$WB_TMP/p1.out")"
grep -qE "^error=lease ${DUMPID:0:8} belongs to pid conn:[0-9]+ \(uid 0\), not to this connection's pid conn:[0-9]+ \(uid 0\)$" \
  "$WB_TMP/p1.out" || fail "another session's lease: $(cat "$WB_TMP/p1.out")"
"${POD[@]}" "${PROBE[@]}" "$FDSOCK" 00112233445566778899aabbccddeeff >"$WB_TMP/p2.out" || fail "probe failed"
grep -qx "error=no lease 00112233" "$WB_TMP/p2.out" || fail "unknown lease id: $(cat "$WB_TMP/p2.out")"

# What the hidden worker maps is sealed: opened read-write through
# /proc/PID/map_files (root), it refuses writing, growing, shrinking and a
# writable shared mapping.
"$PYTHON" - "/proc/$W1/map_files" >"$WB_TMP/seal.out" 2>&1 <<'PY' || fail "seals: $(cat "$WB_TMP/seal.out")"
import errno, fcntl, mmap, os, sys
d = sys.argv[1]
names = [n for n in os.listdir(d) if "memfd:wb-slab" in os.readlink(os.path.join(d, n))]
if not names:
    sys.exit("the worker maps no memfd slab")
fd = os.open(os.path.join(d, names[0]), os.O_RDWR)
size = os.fstat(fd).st_size
print("seals %x" % fcntl.fcntl(fd, 1034))
def refused(what, fn):
    try:
        fn()
    except OSError as e:
        print("%s refused: %s" % (what, errno.errorcode[e.errno]))
        return
    sys.exit("%s was allowed" % what)
refused("write", lambda: os.pwrite(fd, b"x", 0))
refused("grow", lambda: os.ftruncate(fd, size + 4096))
refused("shrink", lambda: os.ftruncate(fd, 0))
refused("mmap write", lambda: mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
PY
for what in write grow shrink "mmap write"; do
  grep -qx "$what refused: EPERM" "$WB_TMP/seal.out" || fail "seals: $(cat "$WB_TMP/seal.out")"
done
grep -qx "seals f" "$WB_TMP/seal.out" || fail "seals: $(cat "$WB_TMP/seal.out")"
kill -TERM "$DUMP"
wait_exit "$DUMP"
[ "$EXIT_RC" = 0 ] || fail "the dumping client exited with $EXIT_RC: $(cat "$WB_TMP/dump.err")"

# --- SIGKILL: the session's EOF gives the lease back, at once.
t0=$(date +%s%N)
kill -KILL "$W1"
no_session_lease() { [ "$(session_lease_count)" = 0 ]; }
wait_for no_session_lease || fail "the killed worker's lease was not reclaimed"
ms=$((($(date +%s%N) - t0) / 1000000))
log "lease of a SIGKILLed worker in its own pid namespace reclaimed in ${ms} ms"
[ "$ms" -le "$RECLAIM_LIMIT_MS" ] || fail "the reclaim took ${ms} ms, more than ${RECLAIM_LIMIT_MS} ms"
grep -q "event=lease_reclaim reason=descriptor_channel_closed .* pid=$sess " "$BROKER_LOG" ||
  fail "the lease of $sess was not reclaimed on its channel's EOF"
wait "$W1NS" 2>/dev/null

# --- A client that predates sessions: refused while its pid is hidden...
spawn plain "${POD[@]}" "$TESTCLIENT" --socket "$SOCK" acquire-plain demo
wait_exit "$LAST_PID"
[ "$EXIT_RC" = 1 ] || fail "a hidden client without a session: exit $EXIT_RC, expected 1"
grep -qx "error=the peer's pid is not visible from the broker (uid 0, another pid namespace): its hello must carry the session token of the descriptor channel $FDSOCK" \
  "$WB_TMP/plain.out" || fail "hidden, no session: $(cat "$WB_TMP/plain.out")"
# ...served as before where the broker sees its pid (its pid namespace).
spawn plain2 nsenter --target "$BROKER_PID" --pid --mount "$TESTCLIENT" --socket "$SOCK" acquire-plain demo
PLAIN2NS=$LAST_PID
wait_for grep -q "^lease " "$WB_TMP/plain2.out" || fail "a visible client without a session: $(cat "$WB_TMP/plain2.out")"
grep -qE "^lease [0-9a-f]{32} fds=1$" "$WB_TMP/plain2.out" || fail "plain client: $(cat "$WB_TMP/plain2.out")"
[ "$(ctl leases --json | json "[type(l['pid']).__name__ + ('S' if 'session' in l else 'P') for l in d]")" = '["intP"]' ] ||
  fail "the visible client's lease is not held by its pid: $(ctl leases --json)"
PLAIN2=$(child_of "$PLAIN2NS")
kill -KILL "$PLAIN2"
no_leases() { [ "$(ctl leases --json | json "len(d)")" = 0 ]; }
wait_for no_leases || fail "the visible client's lease stayed after SIGKILL"

# --- Tokens: a live hidden session (the probe, uid 0, own namespace).
spawn sess "${POD[@]}" "${PROBE[@]}" "$FDSOCK" session
SESSNS=$LAST_PID
wait_for output_has sess "token=" || fail "the probe got no token: $(cat "$WB_TMP/sess.out")"
grep -qx "same" "$WB_TMP/sess.out" || fail "one connection gave two tokens: $(cat "$WB_TMP/sess.out")"
[ "$(grep -c "^status=0$" "$WB_TMP/sess.out")" = 2 ] || fail "session replies: $(cat "$WB_TMP/sess.out")"
TOKEN=$(sed -n 's/^token=//p' "$WB_TMP/sess.out")
[[ $TOKEN =~ ^[0-9a-f]{32}$ ]] || fail "token '$TOKEN' is not 32 hex digits"
grep -q "$TOKEN" "$BROKER_LOG" && fail "the broker logged a session token"

# The owner (same uid, hidden pid) may bind to it.
"${POD[@]}" "$TESTCLIENT" --socket "$SOCK" hello-token "$TOKEN" >"$WB_TMP/t0.out" ||
  fail "the token's uid was refused: $(cat "$WB_TMP/t0.out")"
grep -qE "^peer_pid=2147[0-9]+$" "$WB_TMP/t0.out" || fail "bound hello: $(cat "$WB_TMP/t0.out")"
PROBE_SESSION=conn:$(($(sed -n 's/^peer_pid=//p' "$WB_TMP/t0.out") - 0x80000000))

# Another uid, in a namespace of its own, presents it.
chmod 0711 "$WB_TMP"
chmod 0666 "$SOCK"
"${POD[@]}" "${NOBODY[@]}" "$TESTCLIENT" --socket "$SOCK" hello-token "$TOKEN" >"$WB_TMP/t1.out" 2>&1
rc=$?
chmod 0660 "$SOCK"
[ "$rc" = 1 ] || fail "a stolen token (uid 65534): exit $rc: $(cat "$WB_TMP/t1.out")"
grep -qx "status=-8" "$WB_TMP/t1.out" || fail "stolen token: $(cat "$WB_TMP/t1.out")"
grep -qE "^error=the session token belongs to uid 0 \(session conn:[0-9]+\), not to this connection's uid 65534$" \
  "$WB_TMP/t1.out" || fail "stolen token: $(cat "$WB_TMP/t1.out")"
grep -q "event=peer_refused reason=credentials uid=65534" "$BROKER_LOG" || fail "the broker did not log the refusal"

# A process whose pid the broker sees presents a hidden session's token.
nsenter --target "$BROKER_PID" --pid --mount "$TESTCLIENT" --socket "$SOCK" hello-token "$TOKEN" >"$WB_TMP/t2.out"
grep -qE "^error=the session token belongs to pid hidden \(another pid namespace\), not to this connection's pid [0-9]+$" \
  "$WB_TMP/t2.out" || fail "token of a hidden pid from a visible one: $(cat "$WB_TMP/t2.out")"

# Forged, of the wrong size, and the real one after its session ended.
NOSESSION="error=no session on the descriptor channel $FDSOCK has this token (its connection ended, or the token is forged)"
"${POD[@]}" "$TESTCLIENT" --socket "$SOCK" hello-token 00112233445566778899aabbccddeeff >"$WB_TMP/t3.out"
grep -qxF "$NOSESSION" "$WB_TMP/t3.out" || fail "forged token: $(cat "$WB_TMP/t3.out")"
"${POD[@]}" "$TESTCLIENT" --socket "$SOCK" hello-token 0011 >"$WB_TMP/t4.out"
grep -qx "status=-1" "$WB_TMP/t4.out" || fail "short token: $(cat "$WB_TMP/t4.out")"
grep -qx "error=the session token has 2 bytes, not 16" "$WB_TMP/t4.out" || fail "short token: $(cat "$WB_TMP/t4.out")"
kill -KILL "$SESSNS"
wait "$SESSNS" 2>/dev/null
wait_for grep -q "event=fd_channel_closed pid=$PROBE_SESSION uid=0 reason=eof" "$BROKER_LOG" ||
  fail "the broker did not see the probe's session end"
"${POD[@]}" "$TESTCLIENT" --socket "$SOCK" hello-token "$TOKEN" >"$WB_TMP/t5.out"
grep -qxF "$NOSESSION" "$WB_TMP/t5.out" || fail "token after its session ended: $(cat "$WB_TMP/t5.out")"

# --- Workers in their own namespaces killed at every point of their start:
# no lease and no connection is left (the broker's descriptor count comes
# back).
leases_total() { ctl leases --json | json "len(d)"; }
fds_of_broker() { ls "/proc/$BROKER_PID/fd" | wc -l; }
fds_back() { [ "$(fds_of_broker)" -le "$base_fds" ]; }
base_fds=$(fds_of_broker)
# Each worker leads its own process group (setsid): killing the group
# reaches the worker even when unshare had not yet set it to die with it.
leads_group() { [ "$(ps -o pgid= -p "$1" | tr -d ' ')" = "$1" ]; }
for delay in 0 0.005 0.01 0.02 0.04 0.08 0.12 0.2 0.3; do
  spawn "k$delay" setsid "${POD[@]}" "$WORKER" --socket "$SOCK" --model demo
  wait_for leads_group "$LAST_PID" || fail "worker k$delay did not start its process group"
  sleep "$delay"
  kill -KILL -- -"$LAST_PID"
  wait "$LAST_PID" 2>/dev/null
done
wait_for no_leases || fail "killed workers left leases: $(ctl leases --json)"
wait_for fds_back ||
  fail "the broker holds $(fds_of_broker) descriptors, $base_fds before the killed workers"

# --- The broker killed and started again while a worker in its own
# namespace holds a lease: the worker's mapping stays readable, and it
# takes a new session and a new lease from the new broker.
spawn w2 "${POD[@]}" "$WORKER" --socket "$SOCK" --model demo --reacquire --verify-every 50
W2NS=$LAST_PID
wait_for output_has w2 "verified " || fail "worker w2 did not verify its lease"
kill -KILL "$BROKER_PID"
wait "$BROKER_NS" 2>/dev/null
wait_for output_has w2 "broker connection lost" || fail "worker w2 did not notice the broker's death"
start_ns_broker --host-slab memfd --model "demo=$WB_TMP/demo.safetensors"
wait_for model_ready demo || fail "model demo did not become ready after the restart"
wait_for output_has w2 "reacquired lease" || fail "worker w2 took no lease from the new broker: $(cat "$WB_TMP/w2.out")"
[ "$(session_lease_count)" = 1 ] || fail "the new broker lists no session lease: $(ctl leases --json)"
kill -TERM "$(child_of "$W2NS")"
wait_exit "$W2NS"
[ "$EXIT_RC" = 0 ] || fail "worker w2 exited with $EXIT_RC: $(cat "$WB_TMP/w2.err")"
grep -q "^verification failed" "$WB_TMP/w2.out" && fail "worker w2 saw corrupted tensors"
wait_for no_leases || fail "worker w2's lease stayed after it exited"

# --- The broker killed with SIGKILL at every point of a hidden worker's
# start (connect, session, hello, acquire, fetch, map, hold) and started
# again: the worker either holds a verified lease from the new broker
# (taken with a new session) or has exited saying what failed; the new
# broker lists no other lease, and a worker that ends leaves none.
settled() {
  gone "$1" || { [ "$(session_lease_count)" = 1 ] && output_has "$2" "verified "; }
}
outcomes=()
for delay in 0 0.005 0.01 0.02 0.04 0.08 0.15; do
  spawn "b$delay" "${POD[@]}" "$WORKER" --socket "$SOCK" --model demo --reacquire
  WNS=$LAST_PID
  sleep "$delay"
  kill -KILL "$BROKER_PID"
  wait "$BROKER_NS" 2>/dev/null
  start_ns_broker --host-slab memfd --model "demo=$WB_TMP/demo.safetensors"
  wait_for model_ready demo || fail "model demo did not become ready after the restart"
  wait_for settled "$WNS" "b$delay" ||
    fail "after the broker was killed at ${delay}s: worker alive without a lease: $(ctl leases --json) $(cat "$WB_TMP/b$delay.out")"
  if gone "$WNS"; then
    wait "$WNS"
    rc=$?
    [ "$rc" = 1 ] || fail "worker b$delay exited with $rc: $(cat "$WB_TMP/b$delay.err")"
    grep -q "^wb-demo-worker: " "$WB_TMP/b$delay.err" || fail "worker b$delay exited without a reason"
    [ "$(leases_total)" = 0 ] || fail "a lease without a worker: $(ctl leases --json)"
    outcomes+=("$delay:exited")
    log "worker b$delay: $(head -n1 "$WB_TMP/b$delay.err")"
  else
    grep -q "^verification failed" "$WB_TMP/b$delay.out" && fail "worker b$delay saw corrupted tensors"
    [ "$(leases_total)" = 1 ] || fail "the new broker lists $(leases_total) leases"
    if output_has "b$delay" "reacquired lease"; then
      outcomes+=("$delay:reacquired")
    else
      outcomes+=("$delay:leased")
    fi
    kill -TERM "$(child_of "$WNS")"
    wait_exit "$WNS"
    [ "$EXIT_RC" = 0 ] || fail "worker b$delay exited with $EXIT_RC: $(cat "$WB_TMP/b$delay.err")"
    wait_for no_leases || fail "worker b$delay's lease stayed after it exited"
  fi
done
log "broker killed during a hidden worker's start, per delay: ${outcomes[*]}"

# --- Peers whose pid is hidden are known by their sessions alone: one uid
# holds at most --max-sessions-per-uid of them, and its sessions share one
# quota of leases (a process opening more sessions gets no more).
kill -TERM "$BROKER_PID"
wait "$BROKER_NS" 2>/dev/null
start_ns_broker --host-slab memfd --model "demo=$WB_TMP/demo.safetensors" \
  --max-sessions-per-uid 6 --max-leases-per-client 3
wait_for model_ready demo || fail "model demo did not become ready"
holders=()
for k in 1 2 3; do
  spawn q$k "${POD[@]}" "$TESTCLIENT" --socket "$SOCK" acquire demo
  holders+=("$LAST_PID")
  wait_for grep -qE '^[0-9a-f]{32}$' "$WB_TMP/q$k.out" || fail "hidden holder $k got no lease: $(cat "$WB_TMP/q$k.err")"
done
"${POD[@]}" "$TESTCLIENT" --socket "$SOCK" acquire demo >"$WB_TMP/q4.out" 2>"$WB_TMP/q4.err" &
q4=$!
wait_for gone "$q4" || fail "the fourth hidden holder did not end"
wait "$q4"
[ $? = 1 ] || fail "a fourth lease across hidden sessions was granted: $(cat "$WB_TMP/q4.out" "$WB_TMP/q4.err")"
grep -qF "the sessions of uid 0 (pid hidden) already hold 3 leases together, the limit (--max-leases-per-client 3)" \
  "$WB_TMP/q4.err" || fail "unclear quota refusal: $(cat "$WB_TMP/q4.err")"
[ "$(ctl leases --json | json 'len(d)')" = 3 ] || fail "leases: $(ctl leases --json)"
# Three sessions are the holders'; three more may be opened, no more.
"${POD[@]}" "${PROBE[@]}" "$FDSOCK" sessions 8 >"$WB_TMP/s8.out" || fail "session probe failed"
grep -qx "granted=3 refused=5" "$WB_TMP/s8.out" || fail "sessions per uid: $(cat "$WB_TMP/s8.out")"
grep -qF "uid 0 holds 6 sessions already, the most one uid whose pid is hidden may (--max-sessions-per-uid)" \
  "$WB_TMP/s8.out" || fail "unclear session refusal: $(cat "$WB_TMP/s8.out")"
kill -KILL "${holders[@]}" 2>/dev/null
wait_for all_active 0 || fail "the hidden holders' leases stayed: $(ctl leases --json)"

# --- A broker with /dev/shm names has no descriptor channel: a hidden
# client is refused, and told why.
kill -TERM "$BROKER_PID"
wait "$BROKER_NS" 2>/dev/null
[ ! -e "$FDSOCK" ] || fail "the broker left $FDSOCK behind"
start_ns_broker --host-slab shm --model "demo=$WB_TMP/demo.safetensors"
wait_for model_ready demo || fail "model demo did not become ready"
[ ! -e "$FDSOCK" ] || fail "a broker with /dev/shm names bound $FDSOCK"
spawn w3 "${POD[@]}" "$WORKER" --socket "$SOCK" --model demo
wait_exit "$LAST_PID"
[ "$EXIT_RC" != 0 ] || fail "a hidden worker was served without a descriptor channel"
grep -q "the peer's pid is not visible from the broker (uid 0, another pid namespace) and this broker has no descriptor channel to know it by (start it with --host-slab memfd)" \
  "$WB_TMP/w3.err" || fail "hidden worker, no channel: $(cat "$WB_TMP/w3.err")"
kill -TERM "$BROKER_PID"
wait "$BROKER_NS" 2>/dev/null
