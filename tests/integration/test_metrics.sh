#!/usr/bin/env bash
# The Prometheus endpoint, scraped with curl on loopback (a free port picked
# here): the page has HELP and TYPE for every family, and its values agree
# with `wbctl stats --json`, `wbctl models --json` and `wbctl leases --json`
# as leases come, go stale and are reclaimed, loads fail, and requests are
# counted by operation and status; wb_build_info says what `wbrokerd
# --version` says; the process_* families have plausible values; the
# families and their labels are those the METRICS section of wbrokerd(8)
# lists, each with a sample once a model is loaded and leased. /healthz is
# 503 "starting: loading models" while a preload runs, then 200 "ok". A port
# already in use stops the broker with a message. Off unless --metrics is
# given.
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

scrape() {
  curl -sf --max-time 5 "$URL" >"$WB_TMP/metrics.txt"
}

# metrics_check EXPR: scrapes, and evaluates a Python expression over the
# page (m: {(name, labels): value}, types: {name: type}), d: the JSON of
# wbctl ARGS given after EXPR (or None).
metrics_check() {
  local expr=$1
  shift
  scrape || return 1
  local js=null
  if [ $# -gt 0 ]; then
    js=$(ctl "$@") || return 1
  fi
  "$PYTHON" - "$WB_TMP/metrics.txt" "$expr" "$js" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
m, types, helps = {}, {}, set()
for line in text.splitlines():
    if line.startswith("# HELP "):
        helps.add(line.split()[2])
    elif line.startswith("# TYPE "):
        _, _, name, kind = line.split()
        types[name] = kind
    else:
        g = re.fullmatch(r'([a-z_]+)(\{(.*)\})? (\S+)', line)
        if not g:
            sys.exit("bad line: %r" % line)
        labels = tuple(sorted(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', g.group(3) or "")))
        m[(g.group(1), labels)] = float(g.group(4))
d = json.loads(sys.argv[3])
ok = eval("(" + sys.argv[2] + ")")  # the expression may span lines
sys.exit(0 if ok is True else "not true: %s (%r)" % (sys.argv[2], ok))
PY
}

make_model "$WB_TMP/demo.safetensors" 6 5 >/dev/null
start_broker --metrics "127.0.0.1:$PORT" --model "demo=$WB_TMP/demo.safetensors"
wait_for model_ready demo || fail "model demo did not become ready"
grep -q "event=metrics_listen address=127.0.0.1:$PORT port=$PORT path=/metrics" "$BROKER_LOG" ||
  fail "no metrics_listen line for port $PORT"

# The response's type, and the families with their types.
curl -sf --max-time 5 -D "$WB_TMP/headers.txt" -o /dev/null "$URL" || fail "GET $URL failed"
grep -qi '^Content-Type: text/plain; version=0.0.4; charset=utf-8' "$WB_TMP/headers.txt" ||
  fail "wrong content type: $(cat "$WB_TMP/headers.txt")"
code=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/")
[ "$code" = 404 ] || fail "GET / answered $code, not 404"
metrics_check "types == {'wb_leases': 'gauge', 'wb_models': 'gauge', 'wb_model_bytes': 'gauge',
  'wb_model_copies': 'gauge', 'wb_model_copy_leases': 'gauge',
  'wb_loads_total': 'counter', 'wb_load_failures_total': 'counter', 'wb_load_seconds': 'gauge',
  'wb_load_bytes_per_second': 'gauge', 'wb_requests_total': 'counter',
  'wb_reclaims_total': 'counter', 'wb_replies_dropped_total': 'counter',
  'wb_malformed_messages_total': 'counter', 'wb_connections': 'gauge',
  'wb_peers_refused_total': 'counter', 'wb_peers_disconnected_total': 'counter',
  'wb_model_versions': 'gauge', 'wb_rollouts_total': 'counter',
  'wb_rollout_failures_total': 'counter', 'wb_rollbacks_total': 'counter',
  'wb_publishes_total': 'counter', 'wb_publish_failures_total': 'counter',
  'wb_publish_bytes_total': 'counter', 'wb_publish_copy_seconds_total': 'counter',
  'wb_versions_draining': 'gauge', 'wb_notices_sent_total': 'counter',
  'wb_notices_dropped_total': 'counter', 'wb_container_swap_seconds': 'histogram',
  'wb_slab_pool_bytes': 'gauge', 'wb_slab_pool_hits_total': 'counter',
  'wb_slab_pool_misses_total': 'counter',
  'wb_logical_bytes': 'gauge', 'wb_unique_bytes': 'gauge',
  'wb_host_tier_bytes': 'gauge', 'wb_models_moved_to_host_total': 'counter',
  'wb_models_evicted_total': 'counter', 'wb_restores_total': 'counter',
  'wb_reloads_total': 'counter', 'wb_restore_failures_total': 'counter',
  'wb_build_info': 'gauge', 'process_cpu_seconds_total': 'counter',
  'process_start_time_seconds': 'gauge', 'process_resident_memory_bytes': 'gauge',
  'process_virtual_memory_bytes': 'gauge', 'process_open_fds': 'gauge', 'process_max_fds': 'gauge'}
  and helps == set(types)" ||
  fail "families or types are wrong: $(grep '^#' "$WB_TMP/metrics.txt")"

# The build: what --version says ("wbrokerd 0.1.0 (git REV, protocol N)",
# "backends: ...").
version_line=$("$WBROKERD" --version | head -n 1)
[[ "$version_line" =~ ^wbrokerd\ ([^ ]+)\ \(git\ ([^,]+),\ protocol\ ([0-9]+)\)$ ]] ||
  fail "unexpected --version line: $version_line"
backends=$("$WBROKERD" --version | sed -n 's/^backends: //p')
metrics_check "[k for k in m if k[0] == 'wb_build_info'] == [('wb_build_info', (('backends', '$backends'),
  ('protocol', '${BASH_REMATCH[3]}'), ('revision', '${BASH_REMATCH[2]}'), ('version', '${BASH_REMATCH[1]}')))]
  and m[('wb_build_info', (('backends', '$backends'), ('protocol', '${BASH_REMATCH[3]}'),
  ('revision', '${BASH_REMATCH[2]}'), ('version', '${BASH_REMATCH[1]}')))] == 1" ||
  fail "wb_build_info does not say '$version_line', backends '$backends': $(grep wb_build_info "$WB_TMP/metrics.txt")"

# The process, as /proc says it: started within the last minute, resident
# memory, descriptors open (as many as /proc/PID/fd lists, give or take the
# broker's own turnover) and the soft limit of /proc/PID/limits.
now=$(date +%s)
max_fds=$(awk '/^Max open files/ {print $4}' "/proc/$BROKER_PID/limits")
open_fds=$(ls "/proc/$BROKER_PID/fd" | wc -l)
metrics_check "$now - 60 <= m[('process_start_time_seconds', ())] <= $now + 1
  and m[('process_resident_memory_bytes', ())] > 0
  and m[('process_virtual_memory_bytes', ())] >= m[('process_resident_memory_bytes', ())]
  and 0 < m[('process_open_fds', ())] and abs(m[('process_open_fds', ())] - $open_fds) <= 8
  and m[('process_max_fds', ())] == $max_fds
  and 0 <= m[('process_cpu_seconds_total', ())] < 60" ||
  fail "implausible process metrics (now $now, $open_fds fds, limit $max_fds): $(grep '^process_' "$WB_TMP/metrics.txt")"

# Ready: /healthz answers 200 "ok" (GET and HEAD).
health_code=$(curl -s --max-time 5 -o "$WB_TMP/health.out" -w '%{http_code}' "http://127.0.0.1:$PORT/healthz")
[ "$health_code" = 200 ] && [ "$(cat "$WB_TMP/health.out")" = ok ] ||
  fail "GET /healthz answered $health_code [$(cat "$WB_TMP/health.out")], not 200 ok"
health_code=$(curl -s --max-time 5 -I -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/healthz")
[ "$health_code" = 200 ] || fail "HEAD /healthz answered $health_code"

# Models: state counts, bytes, load time and speed as wbctl reports them
# (its JSON rounds seconds and GB/s to 6 decimals).
wait_for metrics_check "m[('wb_models', (('state', 'ready'),))] == len([x for x in d if x['state'] == 'ready']) == 1
  and m[('wb_models', (('state', 'loading'),))] == 0
  and m[('wb_model_bytes', (('backend', 'host'), ('device', '-1'), ('model', 'demo'), ('version', '1')))] == d[0]['bytes']
  and m[('wb_model_copies', (('device', '-1'), ('model', 'demo'), ('state', 'ready'), ('uuid', ''), ('version', '1')))] == 1
  and m[('wb_model_copy_leases', (('device', '-1'), ('model', 'demo'), ('version', '1')))] == d[0]['leases']
  and m[('wb_model_versions', (('model', 'demo'), ('state', 'current')))] == 1
  and abs(m[('wb_load_seconds', (('model', 'demo'), ('version', '1')))] - d[0]['load_seconds']) <= 1e-6
  and abs(m[('wb_load_bytes_per_second', (('model', 'demo'), ('version', '1')))] - d[0]['load_gbps'] * 1e9) <= 1e-6 * d[0]['load_gbps'] * 1e9 + 1000" \
  models --json || fail "model metrics disagree with wbctl models: $(cat "$WB_TMP/metrics.txt")"

# Two leases, one of them stale.
start_worker w1 --model demo
w1=$LAST_PID
start_worker w2 --model demo
w2=$LAST_PID
wait_for metrics_check "m[('wb_leases', (('state', 'active'),))] == 2 == len([l for l in d if l['state'] == 'active'])" \
  leases --json || fail "wb_leases active is not 2: $(grep wb_leases "$WB_TMP/metrics.txt")"

# The METRICS section of wbrokerd(8) lists every family the page has, with
# its labels, and nothing else; with a model loaded and leased, each has a
# sample.
MAN=${WB_SOURCE_DIR:-$(dirname "$0")/../..}/docs/man/wbrokerd.8
[ -r "$MAN" ] || fail "no man page at $MAN"
scrape || fail "GET $URL failed"
"$PYTHON" - "$MAN" "$WB_TMP/metrics.txt" >"$WB_TMP/docs.out" 2>&1 <<'PY' || fail "wbrokerd(8) and the page disagree: $(cat "$WB_TMP/docs.out")"
import re, sys
man = open(sys.argv[1]).read()
section = man.split("\n.SH METRICS\n", 1)[1].split("\n.SH ", 1)[0]
documented = {}
for name, labels in re.findall(r"^\.B ((?:wb|process)_[a-z_]+)(?:\{([a-z_,]*)\})?$", section, re.M):
    documented[name] = set(labels.split(",")) if labels else set()
page = open(sys.argv[2]).read()
families = set(re.findall(r"^# TYPE (\S+) ", page, re.M))
histograms = set(re.findall(r"^# TYPE (\S+) histogram$", page, re.M))
labels_seen = {}
for name, labels in re.findall(r"^([a-z_]+)(?:\{(.*)\})? \S+$", page, re.M):
    keys = frozenset(re.findall(r'([a-z_]+)="', labels or ""))
    # A histogram's samples: its buckets (labelled le), sum and count.
    for h in histograms:
        if name in (h + "_bucket", h + "_sum", h + "_count"):
            name, keys = h, keys - {"le"}
    labels_seen.setdefault(name, set()).add(keys)
errors = []
if families - set(documented):
    errors.append("not in the man page: %s" % sorted(families - set(documented)))
if set(documented) - families:
    errors.append("in the man page, not on the page: %s" % sorted(set(documented) - families))
for name in sorted(families & set(documented)):
    if name not in labels_seen:
        errors.append("%s has no sample" % name)
    elif labels_seen[name] != {frozenset(documented[name])}:
        errors.append("%s: labels %s on the page, %s in the man page" %
                      (name, sorted(map(sorted, labels_seen[name])), sorted(documented[name])))
if len(documented) < 20:
    errors.append("only %d families found in the man page: %s" % (len(documented), sorted(documented)))
print("\n".join(errors) or "%d families documented and emitted" % len(documented))
sys.exit(1 if errors else 0)
PY
log "$(cat "$WB_TMP/docs.out")"
# Prometheus' own linter, where it is installed (the HELP and TYPE lines of
# every family are checked above either way).
if command -v promtool >/dev/null; then
  promtool check metrics <"$WB_TMP/metrics.txt" >"$WB_TMP/promtool.out" 2>&1 ||
    fail "promtool check metrics: $(cat "$WB_TMP/promtool.out")"
else
  log "promtool is not installed: the page was not linted by it"
fi

kill -STOP "$w2"
wait_for metrics_check "m[('wb_leases', (('state', 'stale'),))] == 1 == len([l for l in d if l['state'] == 'stale'])
  and m[('wb_leases', (('state', 'active'),))] == 1" leases --json ||
  fail "wb_leases stale is not 1: $(grep wb_leases "$WB_TMP/metrics.txt")"
kill -CONT "$w2"

# A reclaim, and a failed load counted as a load and as a request.
kill -KILL "$w1"
wait_exit "$w1"
wait_for metrics_check "m[('wb_reclaims_total', ())] == d['leases_reclaimed'] == 1" stats --json ||
  fail "wb_reclaims_total disagrees with stats: $(grep wb_reclaims "$WB_TMP/metrics.txt")"
ctl load missing "$WB_TMP/absent.safetensors" >/dev/null 2>&1 && fail "loading a missing file succeeded"
wait_for metrics_check "m[('wb_loads_total', ())] == d['loads_total'] and m[('wb_load_failures_total', ())] == d['loads_failed']
  and d['loads_total'] >= 1" stats --json || fail "load counters disagree with stats"
metrics_check "sum(v for (n, l), v in m.items() if n == 'wb_requests_total' and ('op', 'load') in l) == 1
  and m[('wb_requests_total', (('op', 'acquire'), ('status', 'WB_OK')))] == 2
  and m[('wb_requests_total', (('op', 'hello'), ('status', 'WB_OK')))] >= 2
  and m[('wb_requests_total', (('op', 'heartbeat'), ('status', 'WB_OK')))] >= 1" ||
  fail "request counters are wrong: $(grep wb_requests_total "$WB_TMP/metrics.txt")"

# With no client left, the per-operation counts add up to the broker's
# request total (the stats request itself is counted once answered).
kill -TERM "$w2"
wait_exit "$w2"
wait_for no_lease "$w2" || fail "the lease of $w2 is still listed"
total=$(stat_field requests_total) || fail "wbctl stats failed"
wait_for metrics_check "sum(v for (n, l), v in m.items() if n == 'wb_requests_total') == $total + 1" ||
  fail "wb_requests_total does not add up to $total + 1: $(grep wb_requests_total "$WB_TMP/metrics.txt")"

# A second broker on the same port cannot start, and says why.
"$WBROKERD" --backend host --socket "$WB_TMP/second.sock" --metrics "127.0.0.1:$PORT" \
  >/dev/null 2>"$WB_TMP/second.err"
rc=$?
[ "$rc" = 1 ] || fail "a broker on a busy metrics port exited $rc, not 1"
grep -qF "wbrokerd: metrics: cannot listen on 127.0.0.1:$PORT: Address already in use" "$WB_TMP/second.err" ||
  fail "unexpected message: $(cat "$WB_TMP/second.err")"
# The first one still serves.
scrape || fail "the endpoint stopped answering"
stop_broker
curl -s --max-time 2 "$URL" >/dev/null && fail "the endpoint still answers after the broker stopped"

# The first scrape, as soon as the port answers and while a 512 MiB model is
# still loading before the loop starts, already has every metric family, the
# process ones with their samples; /healthz, polled from the moment the port
# answers, says 503 "starting: loading models" until the broker serves, then
# 200 "ok" (and never the other way round).
"$PYTHON" - "$WB_TMP/big.safetensors" <<'PY'
import json, struct, sys
n = 512 << 20
raw = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    f.truncate(8 + len(raw) + n)
PY
"$PYTHON" - "$PORT" "$((WAIT_SECS * 3))" >"$WB_TMP/healthz.out" 2>&1 <<'PY' &
import socket, sys, time
port, deadline = int(sys.argv[1]), time.time() + int(sys.argv[2])
seen = []
while time.time() < deadline:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        time.sleep(0.002)
        continue
    s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    said = "%s %s" % (head.split(b" ")[1].decode(), body.decode().strip())
    if not seen or seen[-1] != said:
        seen.append(said)
        print(said, flush=True)
    if said.startswith("200"):
        break
    time.sleep(0.005)
PY
poller=$!
STARTED_PIDS+=("$poller")
"$WBROKERD" --backend host --socket "$SOCK" --metrics "127.0.0.1:$PORT" \
  --model "big=$WB_TMP/big.safetensors" >"$WB_TMP/early.log" 2>&1 &
BROKER_PID=$!
STARTED_PIDS+=("$BROKER_PID")
wait_for curl -sf --max-time 1 -o "$WB_TMP/first.txt" "$URL" || fail "the endpoint never answered"
for family in wb_leases wb_models wb_requests_total wb_connections wb_peers_refused_total \
  wb_build_info; do
  grep -q "^# TYPE $family " "$WB_TMP/first.txt" ||
    fail "the first scrape lacks $family: [$(cat "$WB_TMP/first.txt")]"
done
for family in process_resident_memory_bytes process_open_fds process_start_time_seconds; do
  grep -q "^$family [0-9]" "$WB_TMP/first.txt" ||
    fail "the first scrape has no $family sample: [$(cat "$WB_TMP/first.txt")]"
done
wait_for model_ready big || fail "model big did not become ready"
wait_exit "$poller"
[ "$EXIT_RC" = 0 ] || fail "the /healthz poller failed: $(cat "$WB_TMP/healthz.out")"
[ "$(cat "$WB_TMP/healthz.out")" = "503 starting: loading models
200 ok" ] || fail "/healthz said [$(cat "$WB_TMP/healthz.out")] during and after the preload ($(grep -o 'event=model_ready.* seconds=[0-9.]*' "$WB_TMP/early.log"))"
stop_broker
rm -f "$WB_TMP/big.safetensors"

# Off by default.
start_broker
curl -s --max-time 2 "$URL" >/dev/null && fail "metrics are served without --metrics"
grep -q "event=metrics_listen" "$BROKER_LOG" && fail "a broker without --metrics logged metrics_listen"
stop_broker
true
