#!/usr/bin/env bash
# --log-format json: every line the broker prints in a short but eventful run
# (preload, leases, a failed load, a drain, a reclaim, stop) is one JSON
# object with ts, level, prog and event; a field's JSON type is its
# format's (model_ready's bytes and tensors are integers, its seconds a
# real, a lease id a string even when all digits) and stays the same on
# every line; values quoted in the text format come out unquoted (the
# socket path has a space in it), and a broker that cannot start says why
# in JSON too. The default stays key=value text.
source "$(dirname "$0")/lib.sh"

mkdir -p "$WB_TMP/dir with space" || fail "cannot make the socket directory"
SOCK="$WB_TMP/dir with space/broker.sock"
export WB_SOCKET=$SOCK

demo_bytes=$(make_model "$WB_TMP/demo.safetensors" 5 3)
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
"$PYTHON" - "$BROKER_LOG" "$SOCK" "$demo_bytes" >"$WB_TMP/events.out" 2>"$WB_TMP/check.err" <<'PY' ||
import json, sys
path, sock, demo_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
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
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            sys.exit("line %d: field %s is neither a string nor a number: %r" % (n, k, line))
    events.append(d)
# A key has one type on every line (pid excepted: a string where it may
# name a session, conn:N).
types = {}
for d in events:
    for k, v in d.items():
        t = type(v).__name__
        if k != "pid" and types.setdefault(k, (t, d["event"]))[0] != t:
            sys.exit("field %s is a %s on %s, a %s on %s" % (k, t, d["event"], *types[k]))
ready = [e for e in events if e["event"] == "model_ready"]
if len(ready) != 1:
    sys.exit("not one model_ready line: %r" % ready)
r = ready[0]
if type(r["bytes"]) is not int or r["bytes"] != demo_bytes:
    sys.exit("model_ready's bytes is not the number %d: %r" % (demo_bytes, r))
if type(r["tensors"]) is not int or r["tensors"] != 5:
    sys.exit("model_ready's tensors is not the number 5: %r" % r)
if type(r["seconds"]) is not float or type(r["read_threads"]) is not int:
    sys.exit("model_ready's seconds is not a real or read_threads not an integer: %r" % r)
if type(r["model"]) is not str or r["model"] != "demo" or type(r["backend"]) is not str:
    sys.exit("model_ready's model or backend is not a string: %r" % r)
grants = [e for e in events if e["event"] == "lease_grant"]
if not grants or not all(type(g["lease"]) is str and len(g["lease"]) == 8 and
                         type(g["uid"]) is int for g in grants):
    sys.exit("lease_grant's lease is not an 8-digit string or its uid not a number: %r" % grants)
listen = [e for e in events if e["event"] == "listen"]
if len(listen) != 1 or listen[0]["socket"] != sock:
    sys.exit("the listen line does not name the socket %r: %r" % (sock, listen))
if type(listen[0]["pid"]) is not int or type(listen[0]["heartbeat_ms"]) is not int:
    sys.exit("the listen line's pid or heartbeat_ms is not a number: %r" % listen)
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
