#!/usr/bin/env bash
# --log-format json: every line the broker prints in a short but eventful run
# (preload, leases, a failed load, a drain, a reclaim, stop) is one JSON
# object with ts, level, prog and event, values quoted in the text format
# come out unquoted (the socket path has a space in it), and a broker that
# cannot start says why in JSON too. The default stays key=value text.
source "$(dirname "$0")/lib.sh"

mkdir -p "$WB_TMP/dir with space" || fail "cannot make the socket directory"
SOCK="$WB_TMP/dir with space/broker.sock"
export WB_SOCKET=$SOCK

make_model "$WB_TMP/demo.safetensors" 5 3 >/dev/null
# Debug level: per-lease lines (lease_grant, lease_release) are debug.
start_broker --log-format json --log-level debug --model "demo=$WB_TMP/demo.safetensors"
wait_for model_ready demo || fail "model demo did not become ready"
start_worker w1 --model demo
w1=$LAST_PID
start_worker w2 --model demo
w2=$LAST_PID
ctl load broken "$WB_TMP/absent.safetensors" >/dev/null 2>&1 && fail "loading a missing file succeeded"
ctl unload demo >/dev/null || fail "unload failed"
kill -TERM "$w1"
wait_exit "$w1"
kill -KILL "$w2"
wait_exit "$w2"
wait_for model_absent demo || fail "the drained model was not freed"
stop_broker

# Every line is a JSON object with the fixed fields; collect the events.
"$PYTHON" - "$BROKER_LOG" "$SOCK" >"$WB_TMP/events.out" 2>"$WB_TMP/check.err" <<'PY' ||
import json, sys
path, sock = sys.argv[1], sys.argv[2]
events = []
with open(path, "rb") as f:
    raw = f.read()
lines = raw.split(b"\n")
assert lines[-1] == b"", "the log does not end with a newline"
for n, line in enumerate(lines[:-1], 1):
    try:
        d = json.loads(line.decode("utf-8"))
    except Exception as e:
        sys.exit("line %d is not JSON (%s): %r" % (n, e, line))
    if not isinstance(d, dict):
        sys.exit("line %d is not an object: %r" % (n, line))
    for key in ("ts", "level", "prog", "event"):
        if not isinstance(d.get(key), str):
            sys.exit("line %d has no string %s: %r" % (n, key, line))
    if d["prog"] != "wbrokerd" or d["level"] not in ("debug", "info", "warn", "error"):
        sys.exit("line %d: prog/level: %r" % (n, line))
    for k, v in d.items():
        if not isinstance(v, str):
            sys.exit("line %d: field %s is not a string: %r" % (n, k, line))
    events.append(d)
listen = [e for e in events if e["event"] == "listen"]
if len(listen) != 1 or listen[0]["socket"] != sock:
    sys.exit("the listen line does not name the socket %r: %r" % (sock, listen))
failed = [e for e in events if e["event"] in ("model_load_failed", "load_path_refused")]
if not failed or "absent.safetensors" not in failed[0].get("error", ""):
    sys.exit("the failed load's error is missing or mangled: %r" % failed)
print(len(events))
print(" ".join(sorted(set(e["event"] for e in events))))
PY
  fail "$(cat "$WB_TMP/check.err")"
count=$(head -n 1 "$WB_TMP/events.out")
events=$(tail -n 1 "$WB_TMP/events.out")
for ev in listen model_ready lease_grant lease_release model_draining lease_reclaim model_freed stop; do
  [[ " $events " == *" $ev "* ]] || fail "no $ev event in the JSON log (events: $events)"
done
log "$count JSON lines, events: $events"

# A broker that cannot start says why, as JSON, and exits 1 (a missing
# model stops it only when every model is required).
"$WBROKERD" --log-format json --backend host --socket "$WB_TMP/other.sock" --require-all-models \
  --model "x=$WB_TMP/absent.safetensors" >"$WB_TMP/fatal.out" 2>"$WB_TMP/fatal.err"
rc=$?
[ "$rc" = 1 ] || fail "a broker with a missing model exited $rc, not 1"
[ ! -s "$WB_TMP/fatal.out" ] || fail "the broker printed on stdout"
"$PYTHON" -c '
import json, sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
objs = [json.loads(l) for l in lines]
last = objs[-1]
assert last["event"] == "fatal" and last["level"] == "error", last
assert "absent.safetensors" in last["error"], last
' "$WB_TMP/fatal.err" || fail "the start failure is not all JSON: $(cat "$WB_TMP/fatal.err")"

# Without the option the log stays text.
"$WBROKERD" --backend host --socket "$WB_TMP/other.sock" --require-all-models \
  --model "x=$WB_TMP/absent.safetensors" >/dev/null 2>"$WB_TMP/text.err"
head -n 1 "$WB_TMP/text.err" | grep -q '^ts=.* level=info prog=wbrokerd event=' ||
  fail "the default log is not key=value text: $(head -n 1 "$WB_TMP/text.err")"
tail -n 1 "$WB_TMP/text.err" | grep -q "^wbrokerd: cannot load model 'x': " ||
  fail "the text-format start failure is not a plain line: $(tail -n 1 "$WB_TMP/text.err")"
