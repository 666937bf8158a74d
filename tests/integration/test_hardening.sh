#!/usr/bin/env bash
# What one local process could do to the broker, each against a real
# broker, with an allowed client served in between:
# * the descriptor channel kept busy by 200 connections with 100 requests
#   each in flight: `wbctl models` is answered in time all along;
# * 14 connections each send one complete 1 MiB message and idle under a
#   12 MiB --max-buffered-bytes: what they hold is given back, a new client
#   is served (it was locked out: the codec's buffers stayed charged);
# * a uid on no allow list: its connections are judged at accept, at most 4
#   are kept at once on each socket, each is answered once and closed (or
#   closed at the handshake deadline, after a ZMTP ERROR saying why), and
#   its requests are refused undecoded (a 1 MiB heartbeat of 349,525 empty
#   records costs no decoding);
# * the log: 3,000 malformed messages or refused requests write a few
#   lines, then a count of what was suppressed;
# * ZMTP: a PING and a request in one write, and the greeting, READY and a
#   request in one write, are answered at once; a libzmq DEALER with
#   ZMQ_HEARTBEAT_IVL gets its PONGs and every reply.
source "$(dirname "$0")/lib.sh"

need_nobody
PY=/usr/bin/python3
"${NOBODY[@]}" "$PY" -c "import sys" 2>/dev/null || skip "uid 65534 cannot run $PY"
LIMIT_MS=1000
[ "${WB_SANITIZED:-0}" = 1 ] && LIMIT_MS=3000

make_model "$WB_TMP/demo.safetensors" 3 7 >/dev/null
chmod 0711 "$WB_TMP"
mkdir -m 0755 "$WB_TMP/py"
cp "$(dirname "$0")"/zmtp_peer.py "$(dirname "$0")"/fdchan_probe.py "$WB_TMP/py/"
chmod 0644 "$WB_TMP"/py/*.py
ZPEER=("$PY" "$WB_TMP/py/zmtp_peer.py")
FPEER=("$PY" "$WB_TMP/py/fdchan_probe.py")
RUN=$WB_TMP/run
mkdir "$RUN"
chmod 0755 "$RUN"
SOCK=$RUN/broker.sock
export WB_SOCKET=$SOCK

fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
hwm_kib() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
# timed_models: one `wbctl models`, its time in ms on stdout; fails when it
# fails or takes longer than LIMIT_MS.
timed_models() {
  local t0 t1
  t0=$(date +%s%N)
  ctl models >/dev/null || return 1
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000))
  [ $(((t1 - t0) / 1000000)) -le "$LIMIT_MS" ]
}

start_broker --model "demo=$WB_TMP/demo.safetensors" --host-slab memfd --max-peers 256 \
  --max-buffered-bytes 12582912 --handshake-timeout-ms 1000
chmod 0666 "$SOCK" "$SOCK.fd" # uid 65534 may connect; the allow list judges it
wait_for model_ready demo || fail "model demo did not become ready"

# --- The descriptor channel cannot starve the event loop.
spawn flood "${FPEER[@]}" "$SOCK.fd" flood 200 100 6
sleep 1
worst=0
for k in $(seq 1 10); do
  ms=$(timed_models) || fail "wbctl models took ${ms:-?} ms (limit $LIMIT_MS) during the channel flood"
  [ "$ms" -gt "$worst" ] && worst=$ms
  sleep 0.2
done
wait_exit "$LAST_PID"
grep -qE '^replies=[1-9][0-9]* ' "$WB_TMP/flood.out" || fail "the flood got no replies: $(cat "$WB_TMP/flood.out")"
log "channel flood: $(cat "$WB_TMP/flood.out"); wbctl models at most $worst ms"

# --- Buffered bytes are charged while held, not after.
spawn complete "${ZPEER[@]}" complete "$SOCK" 14 1048576 3
sleep 1.5
ms=$(timed_models) || fail "a new client was locked out after 14 complete 1 MiB messages (${ms:-?} ms)"
wait_exit "$LAST_PID"
grep -qx "sent=14 closed=0" "$WB_TMP/complete.out" ||
  fail "the senders of complete messages were cut off: $(cat "$WB_TMP/complete.out")"
grep -q "reason=max_buffered" "$BROKER_LOG" && fail "complete messages counted as unfinished"

# --- A uid on no allow list.
fd_before=$(fds "$BROKER_PID")
rpids=()
for k in 1 2 3 4; do
  spawn refused$k "${NOBODY[@]}" "${ZPEER[@]}" hold "$SOCK" 16 1 3
  rpids+=("$LAST_PID")
done
spawn rchan "${NOBODY[@]}" "${FPEER[@]}" "$SOCK.fd" hold 200 3
rchan=$LAST_PID
sleep 1
ms=$(timed_models) || fail "wbctl models: ${ms:-?} ms while refused peers connect"
# At most 4 of the uid at once (each lives until its handshake deadline):
# the broker's connections, the asking wbctl's among them.
most=0
for k in 1 2 3 4 5; do
  n=$(stat_field connections)
  [ "$n" -gt "$most" ] && most=$n
  sleep 0.2
done
[ "$most" -le 5 ] || fail "the broker held $most connections while uid 65534 asked for 64 (at most 4 of it)"
spawn plain "$TESTCLIENT" --socket "$SOCK" acquire-plain demo
plain=$LAST_PID
wait_for output_has plain "fds=1" || fail "an allowed client's descriptor fetch failed: $(cat "$WB_TMP/plain.out" "$WB_TMP/plain.err")"
refused_at_once=0
for k in 1 2 3 4; do
  wait_exit "${rpids[k - 1]}"
  n=$(sed -n 's/^opened=16 refused=\([0-9]*\)$/\1/p' "$WB_TMP/refused$k.out")
  refused_at_once=$((refused_at_once + ${n:-0}))
done
[ "$refused_at_once" -ge 48 ] || fail "uid 65534's connections were not refused at accept: $(cat "$WB_TMP"/refused*.out)"
wait_exit "$rchan"
grep -qE '^opened=200 open=[0-4]$' "$WB_TMP/rchan.out" ||
  fail "uid 65534 kept channel connections: $(cat "$WB_TMP/rchan.out")"
kill -TERM "$plain"
wait "$plain" 2>/dev/null
wait_for all_active 0 || fail "leases remain: $(ctl leases --json)"
sleep 1.2 # the handshake deadline of the last refused ones
[ "$(fds "$BROKER_PID")" -le $((fd_before + 1)) ] || fail "descriptors remain: $(fds "$BROKER_PID") (from $fd_before)"
# Told why: a ZMTP ERROR before the close.
"${NOBODY[@]}" "${ZPEER[@]}" error "$SOCK" >"$WB_TMP/error.out"
grep -qF "error=uid 65534 is not allowed to lease models" "$WB_TMP/error.out" ||
  fail "no ZMTP ERROR with the reason: $(cat "$WB_TMP/error.out")"
# Its requests are refused undecoded: a 1 MiB heartbeat of empty records.
"$PY" - "$WB_TMP/hb.bin" <<'EOF'
import sys
def varint(v):
    out = b""
    while True:
        b, v = v & 0x7F, v >> 7
        out += bytes([b | 0x80]) if v else bytes([b])
        if not v:
            return out
recs = b"\xc2\x02\x00" * 349525  # container_records (field 40), empty
beat = b"\x0a" + varint(len(recs)) + recs  # LeaseBeat.container_records
hb = b"\x0a" + varint(len(beat)) + beat  # HeartbeatRequest.leases
req = b"\x08\x01\x10\x05" + b"\x6a" + varint(len(hb)) + hb  # Request.heartbeat
req = req[: 1048576 - 16]  # within --max-request-bytes
open(sys.argv[1], "wb").write(req)
EOF
chmod 0644 "$WB_TMP/hb.bin"
hwm0=$(hwm_kib "$BROKER_PID")
for k in 1 2 3 4 5 6 7 8; do
  "${NOBODY[@]}" "$TESTCLIENT" --socket "$SOCK" file "$WB_TMP/hb.bin" >"$WB_TMP/hb$k.out" 2>&1
done
grep -q "error=uid 65534 is not allowed to lease models" "$WB_TMP/hb1.out" ||
  fail "the big heartbeat was not refused: $(cat "$WB_TMP/hb1.out")"
grep "reason=not_allowed" "$BROKER_LOG" | grep -q "op=heartbeat" && fail "the refused heartbeat was decoded"
hwm1=$(hwm_kib "$BROKER_PID")
log "8 refused 1 MiB heartbeats: VmHWM $hwm0 -> $hwm1 KiB"
if [ "${WB_SANITIZED:-0}" != 1 ]; then
  [ $((hwm1 - hwm0)) -le 8192 ] || fail "refused heartbeats took the broker's peak RSS from $hwm0 to $hwm1 KiB"
fi

# --- The log stays small.
lines0=$(wc -l <"$BROKER_LOG")
t0=$SECONDS
"${ZPEER[@]}" malformed "$SOCK" 3000 >"$WB_TMP/malformed.out"
grep -qx "sent=3000" "$WB_TMP/malformed.out" || fail "malformed sender: $(cat "$WB_TMP/malformed.out")"
allowed=$((10 * ((SECONDS - t0) / 5 + 2)))
bad=$(sed -n "$((lines0 + 1)),\$p" "$BROKER_LOG" | grep -c "event=bad_message")
[ "$bad" -ge 1 ] && [ "$bad" -le "$allowed" ] || fail "3000 malformed messages wrote $bad bad_message lines (at most $allowed)"
sleep 5.2 # the next window: its first line says how many were held back
"${ZPEER[@]}" malformed "$SOCK" 1 >/dev/null
grep -qE "event=bad_message .* suppressed=[0-9]+" "$BROKER_LOG" || fail "no suppressed=N count in the log"
lines0=$(wc -l <"$BROKER_LOG")
t0=$SECONDS
for k in $(seq 1 300); do
  "${NOBODY[@]}" "$TESTCLIENT" --socket "$SOCK" --wait 500 big 10000 >/dev/null 2>&1
done
# 10 lines per 5 s window of the uid (a slow build spans more windows).
allowed=$((10 * ((SECONDS - t0) / 5 + 2)))
refusals=$(sed -n "$((lines0 + 1)),\$p" "$BROKER_LOG" | grep -c "event=peer_refused")
[ "$refusals" -le "$allowed" ] || fail "300 refused requests in $((SECONDS - t0)) s wrote $refusals peer_refused lines (at most $allowed)"

# --- ZMTP: input after a command is parsed at once; libzmq heartbeats.
"${ZPEER[@]}" pingreq "$SOCK" >"$WB_TMP/pingreq.out"
grep -qx "reply=1" "$WB_TMP/pingreq.out" || fail "a request written with a PING waited: $(cat "$WB_TMP/pingreq.out")"
"${ZPEER[@]}" allin "$SOCK" >"$WB_TMP/allin.out"
grep -qx "reply=1" "$WB_TMP/allin.out" || fail "a request written with the greeting and READY waited"
"$TESTCLIENT" --socket "$SOCK" --zmq-heartbeat-ms 20 stats-loop 40 30 >"$WB_TMP/hb.out" ||
  fail "requests under libzmq heartbeats: $(cat "$WB_TMP/hb.out")"
grep -qE "^sent=40 replies=40 " "$WB_TMP/hb.out" || fail "heartbeat loop: $(cat "$WB_TMP/hb.out")"
grep -q "reason=protocol" "$BROKER_LOG" && fail "a libzmq peer broke the protocol: $(grep reason=protocol "$BROKER_LOG")"
stop_broker
