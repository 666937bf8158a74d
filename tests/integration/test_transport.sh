#!/usr/bin/env bash
# The transport against hostile peers (tests/integration/zmtp_peer.py speaks
# ZMTP on raw sockets): an unfinished multipart message, unfinished
# messages spread over many connections, more idle connections than the
# descriptor limit allows, one process holding many connections, connections
# that never complete the handshake, and peers that send requests and never
# read the replies (bounded by count and by bytes). Each time the broker's memory stays bounded (VmRSS measured),
# the violator is disconnected and counted, and a normal client is served.
source "$(dirname "$0")/lib.sh"

PEER=("$PYTHON" "$(dirname "$0")/zmtp_peer.py")
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
fds() { ls "/proc/$1/fd" | wc -l; }
served() { ctl stats >/dev/null || fail "a normal client was not served after $1"; }

make_model "$WB_TMP/demo.safetensors" 3 4 >/dev/null

# --- 1. One unfinished message: 30 frames of 10 MiB with MORE set. libzmq's
# ROUTER buffered every frame until the message ended; the codec stops at
# the request limit (1 MiB by default).
start_broker --model "demo=$WB_TMP/demo.safetensors"
before=$(rss_kib "$BROKER_PID")
"${PEER[@]}" partial "$SOCK" $((10 << 20)) 30 >"$WB_TMP/partial.out" 2>&1 ||
  fail "the partial-message peer failed: $(cat "$WB_TMP/partial.out")"
after=$(rss_kib "$BROKER_PID")
log "unfinished message: RSS ${before} KiB -> ${after} KiB ($(cat "$WB_TMP/partial.out"))"
grep -q "closed=1" "$WB_TMP/partial.out" || fail "the broker kept the connection: $(cat "$WB_TMP/partial.out")"
[ $((after - before)) -lt 32768 ] || fail "the broker's RSS grew from $before to $after KiB"
wait_for grep -q "event=peer_disconnected reason=limit .*request limit" "$BROKER_LOG" ||
  fail "no peer_disconnected line for the unfinished message"
[ "$(stat_field peers_disconnected)" -ge 1 ] || fail "peers_disconnected: $(ctl stats --json)"
served "the unfinished message"
# Small frames with MORE set: the fifth frame header ends the connection.
"${PEER[@]}" partial "$SOCK" 1024 100 >"$WB_TMP/frames.out" 2>&1 ||
  fail "the many-frames peer failed: $(cat "$WB_TMP/frames.out")"
grep -q "closed=1" "$WB_TMP/frames.out" || fail "the broker kept the connection: $(cat "$WB_TMP/frames.out")"
wait_for grep -q "event=peer_disconnected reason=limit .*more than 4 frames" "$BROKER_LOG" ||
  fail "no peer_disconnected line for too many frames"
served "too many frames"
stop_broker

# --- 2. Unfinished messages over many connections: the aggregate bound.
start_broker --max-request-bytes 1048576 --max-buffered-bytes 4194304
"${PEER[@]}" spread "$SOCK" 8 $((900 << 10)) >"$WB_TMP/spread.out" 2>&1 ||
  fail "the spread peer failed: $(cat "$WB_TMP/spread.out")"
n=$(sed -n 's/^closed=//p' "$WB_TMP/spread.out")
# 4 MiB hold at most four 900 KiB messages (each buffer rounds up to 1 MiB).
[ -n "$n" ] && [ "$n" -ge 4 ] && [ "$n" -le 7 ] || fail "aggregate bound: $(cat "$WB_TMP/spread.out")"
grep -q "event=peer_disconnected reason=max_buffered" "$BROKER_LOG" || fail "no max_buffered line"
served "unfinished messages on many connections"
stop_broker

# --- 3. More connections than descriptors: the broker under a hard limit
# of 128 (so raising the soft limit cannot help) caps its peers at
# (128 - 64) / 4 = 16 and closes the rest at once; libzmq never meets
# EMFILE on accept (which aborts libzmq 4.3).
cat >"$WB_TMP/lowfd.sh" <<SH
#!/usr/bin/env bash
ulimit -n 128 || exit 99
exec "$WBROKERD" "\$@"
SH
chmod +x "$WB_TMP/lowfd.sh"
REAL_WBROKERD=$WBROKERD
WBROKERD=$WB_TMP/lowfd.sh
start_broker
WBROKERD=$REAL_WBROKERD
grep -q "event=fd_limit soft=128 hard=128" "$BROKER_LOG" || fail "no fd_limit line: $(head "$BROKER_LOG")"
grep -q "max_peers=16 " "$BROKER_LOG" || fail "max_peers is not derived from the limit"
fd_before=$(fds "$BROKER_PID")
rss_before=$(rss_kib "$BROKER_PID")
(ulimit -n 4096 && "${PEER[@]}" idle "$SOCK" 300 2) >"$WB_TMP/idle.out" 2>&1 ||
  fail "the idle peer failed: $(cat "$WB_TMP/idle.out")"
alive "$BROKER_PID" || fail "the broker died under 300 connections"
fd_after=$(fds "$BROKER_PID")
log "300 idle connections: $(cat "$WB_TMP/idle.out"); fds $fd_before -> $fd_after; RSS $rss_before -> $(rss_kib "$BROKER_PID") KiB"
grep -q "opened=300 " "$WB_TMP/idle.out" || fail "not every connection was accepted: $(cat "$WB_TMP/idle.out")"
c=$(sed -n 's/.*closed=//p' "$WB_TMP/idle.out")
[ "$c" -ge 284 ] || fail "the broker kept more than 16 of 300 connections: $(cat "$WB_TMP/idle.out")"
grep -q "event=peer_refused reason=max_peers .*max_peers=16" "$BROKER_LOG" || fail "no peer_refused line"
served "300 connections"
[ "$(stat_field peers_refused)" -ge 284 ] || fail "peers_refused: $(ctl stats --json)"
stop_broker

# The same with --max-peers set too high for the limit: accept meets
# EMFILE, and the spare descriptor lets the broker close the connection and
# go on (the per-process cap lifted, since one process connects).
WBROKERD=$WB_TMP/lowfd.sh
start_broker --max-peers 200 --max-peers-per-process 1000
WBROKERD=$REAL_WBROKERD
grep -q "leaves too few of 128 descriptors" "$BROKER_LOG" || fail "no warning for --max-peers 200"
(ulimit -n 4096 && "${PEER[@]}" idle "$SOCK" 300 2) >"$WB_TMP/idle2.out" 2>&1 ||
  fail "the idle peer failed: $(cat "$WB_TMP/idle2.out")"
alive "$BROKER_PID" || fail "the broker died out of descriptors"
log "300 idle connections, --max-peers 200: $(cat "$WB_TMP/idle2.out")"
grep -q "event=peer_refused reason=out_of_descriptors" "$BROKER_LOG" || fail "no out_of_descriptors line"
served "running out of descriptors"
stop_broker

# --- 4. A peer that sends 600 requests with large replies and reads none.
# Each acquire reply lists 3000 tensors (about 150 KB): 600 of them queued
# would be about 90 MB; the send high-water mark keeps --max-queued-replies.
"$PYTHON" - "$WB_TMP/wide.safetensors" <<'PY'
import json, struct, sys
n = 3000
header = {("tensor.%05d.with.a.longish.name" % i): {"dtype": "U8", "shape": [4], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
raw = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw + bytes(4 * n))
PY
start_broker --model "wide=$WB_TMP/wide.safetensors" --max-leases-per-client 100000
wait_for model_ready wide || fail "model wide did not become ready"
before=$(rss_kib "$BROKER_PID")
spawn noread "${PEER[@]}" noread "$SOCK" wide 600 3
noread=$LAST_PID
wait_for output_has noread "sent=" || fail "the non-reading peer did not send"
sleep 0.5
mid=$(rss_kib "$BROKER_PID")
served "a peer that does not read"
wait_exit "$noread"
after=$(rss_kib "$BROKER_PID")
log "non-reading peer: $(cat "$WB_TMP/noread.out"); RSS $before -> $mid (while it held) -> $after KiB"
[ $((mid - before)) -lt 32768 ] || fail "the broker's RSS grew from $before to $mid KiB"
[ "$(stat_field replies_dropped)" -ge 1 ] || fail "replies_dropped: $(ctl stats --json)"
grep -q "event=peer_disconnected reason=slow_reader" "$BROKER_LOG" || fail "no slow_reader line"
stop_broker

# --- 5. Queued reply bytes: with the count bound out of the way, 600
# replies of about 150 KB for a peer that reads none stop at
# --max-queued-bytes for the peer, and at --max-queued-bytes-total for all.
for bound in "--max-queued-bytes 1048576" "--max-queued-bytes-total 2097152"; do
  # shellcheck disable=SC2086
  start_broker --model "wide=$WB_TMP/wide.safetensors" --max-leases-per-client 100000 \
    --max-queued-replies 100000 $bound
  wait_for model_ready wide || fail "model wide did not become ready"
  before=$(rss_kib "$BROKER_PID")
  fd_before=$(fds "$BROKER_PID")
  spawn noread "${PEER[@]}" noread "$SOCK" wide 600 3
  noread=$LAST_PID
  wait_for output_has noread "sent=" || fail "the non-reading peer did not send"
  sleep 0.5
  mid=$(rss_kib "$BROKER_PID")
  served "a peer that does not read ($bound)"
  wait_exit "$noread"
  log "non-reading peer, ${bound}: $(cat "$WB_TMP/noread.out"); RSS $before -> $mid -> $(rss_kib "$BROKER_PID") KiB; fds $fd_before -> $(fds "$BROKER_PID")"
  [ $((mid - before)) -lt 16384 ] || fail "$bound: the broker's RSS grew from $before to $mid KiB"
  grep -q "event=peer_disconnected reason=slow_reader .*(${bound%% *})" "$BROKER_LOG" ||
    fail "no slow_reader line naming ${bound%% *}: $(grep slow_reader "$BROKER_LOG")"
  [ "$(stat_field replies_dropped)" -ge 1 ] || fail "replies_dropped: $(ctl stats --json)"
  stop_broker
done

# --- 5b. The total bound spares each peer's first reply: eight clients that
# acquire a model of 30000 tensors at once (replies of about 1.5 MB, more
# than the kernel's socket buffer takes, so they queue) are all served under
# a 1 MiB total, which their first replies pass together.
"$PYTHON" - "$WB_TMP/wider.safetensors" <<'PY'
import json, struct, sys
n = 30000
header = {("tensor.%05d.with.a.longish.name" % i): {"dtype": "U8", "shape": [4], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
raw = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw + bytes(4 * n))
PY
start_broker --model "wider=$WB_TMP/wider.safetensors" --max-queued-bytes-total 1048576
wait_for model_ready wider || fail "model wider did not become ready"
burst=()
for i in 1 2 3 4 5 6 7 8; do
  spawn "burst$i" "$TESTCLIENT" --socket "$SOCK" acquire-n wider 5
  burst+=("$LAST_PID")
done
for i in 1 2 3 4 5 6 7 8; do
  wait_exit "${burst[$((i - 1))]}"
  grep -q "acquired 5" "$WB_TMP/burst$i.out" ||
    fail "client $i of a burst was not served under the total bound: $(cat "$WB_TMP/burst$i.out" "$WB_TMP/burst$i.err")"
done
if grep -q "reason=slow_reader" "$BROKER_LOG"; then
  fail "an honest client was cut off: $(grep slow_reader "$BROKER_LOG")"
fi
log "a burst of 8 clients acquiring 30000-tensor leases under a 1 MiB total: all served"
stop_broker

# --- 6. One process cannot take the peer table, and connections that never
# finish the handshake are closed after its deadline (defaults: 16
# connections a process, 2000 ms); a normal client is served throughout.
start_broker --max-peers 64
grep -q "max_peers_per_process=16 max_peers_per_uid=32 max_sessions_per_uid=64 handshake_timeout_ms=2000" "$BROKER_LOG" ||
  fail "the defaults are not logged: $(grep event=listen "$BROKER_LOG")"
fd_before=$(fds "$BROKER_PID")
rss_before=$(rss_kib "$BROKER_PID")
spawn greedy "${PEER[@]}" hold "$SOCK" 40 1 4
greedy=$LAST_PID
wait_for output_has greedy "opened=" || fail "the greedy peer did not connect"
spawn silent "${PEER[@]}" hold "$SOCK" 10 0 3
silent=$LAST_PID
wait_for output_has silent "opened=" || fail "the silent peer did not connect"
served "one process holding 16 connections"
held_fds=$(fds "$BROKER_PID")
wait_exit "$silent"
served "connections that never finished the handshake"
wait_exit "$greedy"
log "one process, 40 connections: $(tr '\n' ' ' <"$WB_TMP/greedy.out"); another, 10 silent: $(tr '\n' ' ' <"$WB_TMP/silent.out"); fds $fd_before -> $held_fds (held) -> $(fds "$BROKER_PID"); RSS $rss_before -> $(rss_kib "$BROKER_PID") KiB"
grep -qx "opened=40 refused=24" "$WB_TMP/greedy.out" || fail "per-process cap: $(cat "$WB_TMP/greedy.out")"
grep -qx "kept=16 closed=0" "$WB_TMP/greedy.out" || fail "handshaken connections were closed: $(cat "$WB_TMP/greedy.out")"
grep -qx "opened=10 refused=0" "$WB_TMP/silent.out" || fail "silent connections refused at once: $(cat "$WB_TMP/silent.out")"
grep -qx "kept=10 closed=10" "$WB_TMP/silent.out" || fail "handshake deadline: $(cat "$WB_TMP/silent.out")"
grep -q "event=peer_refused reason=max_peers_per_process pid=$greedy .*max_peers_per_process=16" "$BROKER_LOG" ||
  fail "no max_peers_per_process line: $(grep peer_refused "$BROKER_LOG")"
grep -q "event=peer_disconnected reason=handshake_timeout pid=$silent .*handshake_timeout_ms=2000" "$BROKER_LOG" ||
  fail "no handshake_timeout line: $(grep peer_disconnected "$BROKER_LOG")"
[ "$(stat_field peers_refused)" -ge 24 ] || fail "peers_refused: $(ctl stats --json)"
[ "$(stat_field peers_disconnected)" -ge 10 ] || fail "peers_disconnected: $(ctl stats --json)"
[ "$(fds "$BROKER_PID")" -le $((fd_before + 1)) ] || fail "descriptors remain: $(fds "$BROKER_PID") (from $fd_before)"
stop_broker
log "ok"
