#!/usr/bin/env bash
# Soak: 32 worker processes acquire, verify (checksums and every byte
# against the file), hold and release at random, some leave while holding,
# and they are killed with SIGKILL at random moments (every other kill aimed
# at one inside wb_lease_acquire), while malformed and oversized messages
# arrive, for WB_SOAK_SECONDS (default 30). wbsoak checks that no lease is
# left, that granted = released + reclaimed, that every verification passed,
# that the broker never died, that its descriptors came back to where they
# started and that its RSS did not grow after warm-up by more than 1 MiB
# (see wbsoak.c and docs/security.md). Then the broker stops
# cleanly and leaves no shared-memory object behind. WB_SOAK_JSON=PATH keeps
# the counts.
source "$(dirname "$0")/lib.sh"

SOAK=$WB_BIN_DIR/tests/wbsoak
[ -x "$SOAK" ] || fail "missing executable $SOAK"
seconds=${WB_SOAK_SECONDS:-30}
tolerance=1024
if [ "${WB_SANITIZED:-0}" = 1 ]; then
  small_quarantine
  tolerance=4096
fi

make_model "$WB_TMP/soak.safetensors" 16 3 >/dev/null
start_broker --model "soak=$WB_TMP/soak.safetensors" --max-message-bytes 1048576
wait_for model_ready soak || fail "model soak did not become ready"
broker=$BROKER_PID

"$SOAK" --socket "$SOCK" --model soak --model-file "$WB_TMP/soak.safetensors" \
  --broker-pid "$broker" --workers 32 --duration "$seconds" --warmup 10 --kill-rate 8 \
  --junk-rate 5 --oversize 1048577 --rss-tolerance-kib "$tolerance" \
  --json "$WB_TMP/soak.json" >"$WB_TMP/soak.out" 2>"$WB_TMP/soak.err"
rc=$?
cat "$WB_TMP/soak.out" >&2
[ "$rc" = 0 ] || fail "wbsoak found problems (exit $rc): $(cat "$WB_TMP/soak.err")"
alive "$broker" || fail "the broker died"

# A clean stop leaves nothing: stop_broker checks /dev/shm/wb-<pid>-* and
# the socket.
stop_broker
grep -q "event=stop leases_held=0 " "$BROKER_LOG" || fail "the broker stopped with leases held"
"$PYTHON" - "$WB_TMP/soak.json" "$broker" <<'PY' || fail "cannot complete the JSON"
import glob, json, sys
path, pid = sys.argv[1], sys.argv[2]
d = json.load(open(path))
d["shm_objects_left_after_stop"] = len(glob.glob("/dev/shm/wb-%s-*" % pid))
d["broker_exit_status"] = 0
json.dump(d, open(path, "w"), indent=2, sort_keys=True)
PY
if [ -n "${WB_SOAK_JSON:-}" ]; then
  cp "$WB_TMP/soak.json" "$WB_SOAK_JSON" || fail "cannot write $WB_SOAK_JSON"
fi
