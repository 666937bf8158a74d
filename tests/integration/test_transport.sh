#!/usr/bin/env bash
# The transport against hostile peers (tests/integration/zmtp_peer.py speaks
# ZMTP on raw sockets): an unfinished multipart message, unfinished
# messages spread over many connections, more idle connections than the
# descriptor limit allows, and a peer that sends requests and never reads
# the replies. Each time the broker's memory stays bounded (VmRSS measured),
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
# go on.
WBROKERD=$WB_TMP/lowfd.sh
start_broker --max-peers 200
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
log "ok"
