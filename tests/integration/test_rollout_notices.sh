#!/usr/bin/env bash
# Version notices (SubscribeRequest, VersionNotice), from raw ZMTP peers:
# * a subscribed connection is sent a notice (a Reply with id 0 and status
#   0) when a rollout or a rollback makes a version current, and its
#   heartbeat replies carry the current version;
# * a connection that never subscribed gets nothing it did not ask for;
# * a subscriber that never reads costs a bounded queue: through many
#   rollouts its notices are dropped (notices_dropped), it is not
#   disconnected, others are served promptly and the broker's memory stays
#   flat.
source "$(dirname "$0")/lib.sh"
PEER=$(dirname "$0")/version_peer.py

make_model "$WB_TMP/v1.safetensors" 4 1 >/dev/null
make_model "$WB_TMP/v2.safetensors" 4 2 >/dev/null
rss_tolerance=8192
if [ "${WB_SANITIZED:-0}" = 1 ]; then
  small_quarantine
  rss_tolerance=16384
fi
start_broker_with_demo "$WB_TMP/v1.safetensors"

spawn watch "$PYTHON" "$PEER" watch "$SOCK" demo 6
spawn plain "$PYTHON" "$PEER" plain "$SOCK" 4
plain=$LAST_PID
wait_for output_has watch "subscribed version=1" || fail "the subscriber did not subscribe: $(cat "$WB_TMP/watch.err")"
wait_for output_has watch "current model=demo version=1" || fail "no current version in heartbeat replies"

# A worker keeps version 1, so that the rollback has it to go back to.
start_worker w --model demo
w=$LAST_PID
ctl rollout demo "$WB_TMP/v2.safetensors" >/dev/null || fail "rollout failed"
wait_for output_has watch "notice model=demo version=2 previous=1 id=0 status=0" ||
  fail "no notice of version 2: $(cat "$WB_TMP/watch.out")"
wait_for output_has watch "current model=demo version=2" || fail "heartbeats do not say version 2"
ctl rollback demo >/dev/null || fail "rollback failed"
wait_for output_has watch "notice model=demo version=1 previous=2 id=0 status=0" ||
  fail "no notice of the rollback: $(cat "$WB_TMP/watch.out")"
[ "$(grep -c '^notice ' "$WB_TMP/watch.out")" = 2 ] || fail "notices: $(grep '^notice' "$WB_TMP/watch.out")"
[ "$(stat_field notices_sent)" = 2 ] || fail "notices_sent is $(stat_field notices_sent)"
wait_exit "$plain"
grep -qE "^unsolicited=0 heartbeats=[1-9]" "$WB_TMP/plain.out" || fail "the peer that never subscribed: $(cat "$WB_TMP/plain.out")"
kill -TERM "$w"
wait_exit "$w"
[ "$EXIT_RC" = 0 ] || fail "the worker on version 1 exited $EXIT_RC"

# A subscriber that never reads: 2000 rollouts (from a raw peer: a
# rollout of a small checkpoint takes a millisecond) while its notices pile
# up past what its socket holds.
kill -TERM "$(pgrep -f "version_peer.py watch $SOCK" | head -1)" 2>/dev/null
spawn noread "$PYTHON" "$PEER" noread "$SOCK" demo 120
noread=$LAST_PID
wait_for output_has noread "subscribed version=" || fail "the silent subscriber did not subscribe"
rss() { awk '/^VmRSS/ {print $2}' "/proc/$BROKER_PID/status"; }
"$PYTHON" "$PEER" rollouts "$SOCK" demo 200 "$WB_TMP/v1.safetensors" "$WB_TMP/v2.safetensors" \
  >"$WB_TMP/warm.out" 2>&1 || fail "rollouts: $(cat "$WB_TMP/warm.out")"
rss_before=$(rss)
spawn stats "$WB_BIN_DIR/tests/wbtest_client" --socket "$SOCK" stats-loop 100 20
stats=$LAST_PID
"$PYTHON" "$PEER" rollouts "$SOCK" demo 2000 "$WB_TMP/v1.safetensors" "$WB_TMP/v2.safetensors" \
  >"$WB_TMP/rollouts.out" 2>&1 || fail "rollouts: $(cat "$WB_TMP/rollouts.out")"
grep -q "^done=2000 failed=0 " "$WB_TMP/rollouts.out" || fail "rollouts: $(cat "$WB_TMP/rollouts.out")"
wait_exit "$stats"
rss_after=$(rss)
dropped=$(stat_field notices_dropped)
[ "$dropped" -ge 1000 ] || fail "only $dropped notices were dropped for the silent subscriber"
alive "$noread" || fail "the silent subscriber's process ended"
[ "$(stat_field peers_disconnected)" = 0 ] || fail "a peer was disconnected for a notice"
# Others were served promptly meanwhile.
grep -Eq "^sent=100 replies=100 max_ms=" "$WB_TMP/stats.out" || fail "stats loop: $(cat "$WB_TMP/stats.out")"
max_ms=$(sed -n 's/.*max_ms=\([0-9]*\).*/\1/p' "$WB_TMP/stats.out")
[ "$max_ms" -lt 1000 ] || fail "a stats request took $max_ms ms during the rollouts"
[ $((rss_after - rss_before)) -lt "$rss_tolerance" ] || fail "the broker grew from $rss_before to $rss_after KiB"
log "dropped=$dropped max_stats_ms=$max_ms rss_kib=$rss_before->$rss_after $(cat "$WB_TMP/rollouts.out")"
kill -TERM "$noread"
stop_broker
