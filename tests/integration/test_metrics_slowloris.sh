#!/usr/bin/env bash
# A slowloris against /metrics: 48 connections from one process on
# 127.0.0.1, each trickling a header byte every second (well inside the
# inactivity timeout) and reopened when closed, for 6 s. Scrapes with curl
# from the same address during the attack must be served within 3 s, no
# trickling connection may live past the request timeout (2 s, plus slack),
# and those left when the attack stops are closed by that timeout.
source "$(dirname "$0")/lib.sh"

command -v curl >/dev/null || fail "curl is needed (scripts/setup.sh installs it)"
if "$WBROKERD" --version | grep -q -- "-metrics"; then
  log "SKIPPED: this wbrokerd was built without libmicrohttpd (install libmicrohttpd-dev)"
  exit 77
fi

PORT=$("$PYTHON" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT/metrics
TIMEOUT_S=2
# How much later than the timeout a connection may be seen closed.
SLACK=1
if [ "${WB_SANITIZED:-0}" = 1 ]; then
  SLACK=2
fi

start_broker --metrics "127.0.0.1:$PORT"
curl -sf --max-time 5 -o /dev/null "$URL" || fail "the endpoint does not answer"

spawn attack "$PYTHON" "$(dirname "$0")/slowloris.py" "$PORT" 48 6 1 6
attack=$LAST_PID
wait_for output_has attack ready || fail "the attacker did not start"
sleep 1

# Three scrapes during the attack, from the attacker's own address.
for i in 1 2 3; do
  out=$(curl -s --max-time 3 -o "$WB_TMP/page.txt" -w '%{http_code} %{time_total}' "$URL")
  log "scrape $i during the attack: $out"
  [ "${out%% *}" = 200 ] || fail "scrape $i during the attack: '$out' (code and seconds)"
  grep -q '^# TYPE wb_leases gauge' "$WB_TMP/page.txt" || fail "scrape $i: not the metrics page"
  sleep 1
done

wait_exit "$attack"
[ "$EXIT_RC" = 0 ] || fail "the attacker exited with status $EXIT_RC"
result=$(tail -n 1 "$WB_TMP/attack.out")
log "attack: $result"
# Every trickling connection was closed, none lived past the timeout, and
# of those open when the attack stopped (when no newcomer could push them
# out), the last lived as long as the timeout.
echo "$result" | "$PYTHON" -c "import json, sys
d = json.load(sys.stdin)
t, slack = $TIMEOUT_S, $SLACK
ok = (d['open'] == 0 and d['opened'] >= 48 and d['closed'] == d['opened']
      and d['max_life'] <= t + slack and d['last'] and max(d['last']) >= t - 0.5)
sys.exit(0 if ok else 'not closed by the %d s timeout: %s' % (t, d))" || fail "trickling connections were not closed in time"

# The endpoint serves as before.
curl -sf --max-time 5 -o /dev/null "$URL" || fail "the endpoint stopped answering"
stop_broker

for reason in request_timeout crowded; do
  grep -q "event=metrics_connection_closed reason=$reason closed=" "$BROKER_LOG" ||
    fail "no metrics_connection_closed line for $reason"
done
# Every cut is logged, in lines at most once a second for each reason and
# a last one at the stop: the broker cut each connection the attacker saw
# closed (none was refused at accept).
"$PYTHON" - "$BROKER_LOG" "$result" <<'PY' || fail "the logged cuts do not add up"
import json, re, sys
log = open(sys.argv[1]).read()
d = json.loads(sys.argv[2])
cuts = sum(int(n) for n in re.findall(r"event=metrics_connection_closed reason=\S+ closed=(\d+)", log))
sys.exit(0 if cuts == d["closed"] else "logged %d cuts, the attacker saw %d" % (cuts, d["closed"]))
PY

true
