#!/usr/bin/env bash
# GPU: what an operator does to a cuda broker, on the real device. A load
# cancelled while it copies gives its device memory back; `load --no-wait`
# returns at once and the model becomes ready; SIGTERM during a large
# preload stops it promptly with exit 0, no socket and no device memory
# left; SIGHUP applies a changed limit; /healthz answers; a Python lease of
# every dtype torch has (BOOL included) gives views equal to the
# checkpoint's tensors, and a failure part-way leaves no view behind.
#
#   tests/gpu/operator.sh OUT      writes OUT/operator.json (about 90 s)
#
# Environment: as tests/gpu/lib.sh; WB_OP_GIB (the large checkpoint, default 32).
set -uo pipefail
OUT=${1:?usage: tests/gpu/operator.sh OUT}
LOG_NAME=operator.log
# shellcheck source=tests/gpu/lib.sh
. "$(dirname "$0")/lib.sh"
need_bins "$WBROKERD" "$WBCTL"
GIB=${WB_OP_GIB:-32}
RES=$OUT/operator.jsonl
: >"$RES"
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export WB_CLIENT_LIBRARY=$LIB

# A large checkpoint of 1 GiB tensors in memory (tmpfs), so that the load is
# bound by the copy to the device, not by a disk.
BIG=/dev/shm/wb_operator_big.safetensors
python3 - "$BIG" "$GIB" <<'PY' || { say "cannot write $BIG"; exit 2; }
import json, os, struct, sys
path, gib = sys.argv[1], int(sys.argv[2])
n = 1 << 30
hdr = {"t%03d" % i: {"dtype": "U8", "shape": [n], "data_offsets": [i * n, (i + 1) * n]}
       for i in range(gib)}
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    chunk = bytes(range(256)) * (n // 256)
    for i in range(gib):
        f.write(chunk)
PY
say "checkpoint: $GIB GiB in $BIG"
SMALL=$WORK/operator_small.safetensors
python3 - "$SMALL" <<'PY' || { say "cannot write $SMALL"; exit 2; }
import sys, torch
from safetensors.torch import save_file
save_file({"w%d" % i: torch.randn(1024, 1024) for i in range(4)}, sys.argv[1])
PY
model_field() { ctl models --json | python3 -c "import json,sys; print(next((str(m.get('$2', '')) for m in json.load(sys.stdin) if m['name'] == '$1'), 'absent'))"; }
model_is() { [ "$(model_field "$1" state)" = "$2" ]; }

# 1. Cancel while copying: device memory back to what it was before.
CONF=$WORK/operator.conf
printf '[broker]\nmax-models = 2\n' >"$CONF"
PORT=$((20000 + RANDOM % 20000))
start_broker "$WORK/operator.sock" "$OUT/broker_cancel.log" --config "$CONF" \
  --metrics "127.0.0.1:$PORT" || exit 1
sleep 1
base=$(mem_used)
t0=$(now_ms)
ctl load --no-wait big "$BIG" >"$WORK/nowait.out" 2>&1
nowait_rc=$?
nowait_ms=$(($(now_ms) - t0))
say "load --no-wait: rc=$nowait_rc in $nowait_ms ms: $(head -n 2 "$WORK/nowait.out" | tail -n 1)"
# Cancel once a quarter has landed.
wait_for 120 python3 -c "
import json, subprocess, sys
d = json.loads(subprocess.run(['$WBCTL', '--socket', '$SOCK', 'models', '--json'], capture_output=True).stdout)
m = next(m for m in d if m['name'] == 'big')
sys.exit(0 if m.get('loaded_bytes', 0) * 4 >= m.get('bytes', 1) else 1)"
mid=$(mem_used)
ctl models --json >"$WORK/mid.json"
t0=$(now_ms)
ctl cancel big >"$WORK/cancel.out" 2>&1
cancel_rc=$?
cancel_ms=$(($(now_ms) - t0))
wait_for 30 grep -q "event=model_load_stopped" "$OUT/broker_cancel.log"
stopped_ms=$(($(now_ms) - t0))
sleep 1
after=$(mem_used)
state=$(model_field big state)
say "cancel: rc=$cancel_rc in $cancel_ms ms ($(cat "$WORK/cancel.out")), loader let go after $stopped_ms ms; device used: before $base, mid-load $mid, after $after; model: $state"
record "{\"step\":\"cancel\",\"gib\":$GIB,\"nowait_rc\":$nowait_rc,\"nowait_ms\":$nowait_ms,\"cancel_rc\":$cancel_rc,\"cancel_ms\":$cancel_ms,\"stopped_ms\":$stopped_ms,\"used_before\":$base,\"used_mid\":$mid,\"used_after\":$after,\"model_after\":\"$state\"}"
[ "$cancel_rc" = 0 ] || fail "wbctl cancel exited $cancel_rc"
[ "$state" = absent ] || fail "the cancelled model is still listed ($state)"
[ "$mid" -gt $((base + (1 << 30))) ] || fail "the load had not allocated device memory when cancelled ($mid vs $base)"
[ "$after" -le $((base + (64 << 20))) ] || fail "device memory not given back: $after vs $base before the load"

# 2. --no-wait, then ready; SIGHUP raises max-models; /healthz.
ctl load --no-wait s1 "$SMALL" >/dev/null 2>&1 || fail "load --no-wait s1 failed"
wait_for 60 model_is s1 ready
s1=$(model_field s1 state)
ctl load s2 "$SMALL" >/dev/null 2>&1 || fail "load s2 failed"
ctl load s3 "$SMALL" >"$WORK/s3_refused.out" 2>&1
refused_rc=$?
printf '[broker]\nmax-models = 4\n' >"$CONF"
kill -HUP "$BROKER"
wait_for 10 grep -q "event=config_reload" "$OUT/broker_cancel.log"
ctl load s3 "$SMALL" >/dev/null 2>&1
after_reload_rc=$?
reload_line=$(grep -o "event=config_reload.*" "$OUT/broker_cancel.log" | head -n 1)
health=$(python3 -c "import urllib.request; r = urllib.request.urlopen('http://127.0.0.1:$PORT/healthz', timeout=5); print(r.status, r.read().decode().strip())" 2>&1)
say "s1 after --no-wait: $s1; s3 refused rc=$refused_rc, after SIGHUP rc=$after_reload_rc; $reload_line; /healthz: $health"
record "{\"step\":\"reload\",\"s1_state\":\"$s1\",\"refused_rc\":$refused_rc,\"after_reload_rc\":$after_reload_rc,\"healthz\":\"$health\"}"
[ "$s1" = ready ] || fail "the --no-wait load did not become ready ($s1)"
[ "$refused_rc" = 1 ] || fail "a third model over max-models 2 was not refused (rc $refused_rc)"
[ "$after_reload_rc" = 0 ] || fail "after SIGHUP with max-models 4 the load failed (rc $after_reload_rc)"
[ "$health" = "200 ok" ] || fail "/healthz said: $health"

# 3. Python views of every dtype, on cuda lease memory.
ctl load dtypes "$ROOT/tests/data/official/all_dtypes.safetensors" >/dev/null 2>&1 ||
  fail "cannot load all_dtypes"
python3 - "$SOCK" "$ROOT/tests/data/official/all_dtypes.safetensors" >"$WORK/dtypes.json" 2>"$OUT/dtypes.err" <<'PY'
import gc, json, sys
import torch
from safetensors import safe_open
import weightbroker
sock, path = sys.argv[1], sys.argv[2]
r = {"torch": torch.__version__}
c = weightbroker.Client(sock)
with c.lease("dtypes") as l:
    names = [t.name for t in l.info()]
    ok, unread, err = [], [], None
    try:
        views = l.tensors()
    except TypeError as e:  # a dtype this torch lacks: every view undone
        err = str(e)
        views = {}
        for n in names:
            try:
                views.update(l.tensors([n]))
            except TypeError:
                pass
    r["error"] = err
    gc.collect()

    def compare():  # its locals (each view, each expected tensor) end with it
        with safe_open(path, "pt") as f:
            for n, v in views.items():
                try:
                    want = f.get_tensor(n)
                except Exception:  # a dtype this safetensors cannot read back
                    unread.append(n)
                    continue
                if v.device.type == "cuda" and v.dtype == want.dtype and torch.equal(
                        v.cpu().reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
                    ok.append(n)
    compare()
    r["checked"] = len(views)
    r["equal"] = len(ok)
    r["unreadable"] = unread
    r["bool_equal"] = any(n for n in ok if "bool" in n)
    del views
    gc.collect()
    r["views_after"] = l.views
print(json.dumps(r))
PY
say "python dtypes on cuda: $(cat "$WORK/dtypes.json") $(tail -n 2 "$OUT/dtypes.err")"
record "{\"step\":\"python_dtypes\",\"result\":$(cat "$WORK/dtypes.json" 2>/dev/null || echo null)}"
py "d['equal'] + len(d['unreadable']) == d['checked'] and d['checked'] > 0 and d['bool_equal'] and d['views_after'] == 0" \
  <"$WORK/dtypes.json" 2>/dev/null | grep -q True || fail "python views on cuda: $(cat "$WORK/dtypes.json")"
stop_broker
term_rc=$?
[ "$term_rc" = 0 ] || fail "the broker exited $term_rc on SIGTERM"

# 4. SIGTERM during a large preload.
sleep 1
idle=$(mem_used)
rm -f "$WORK/pre.sock"
"${ORPHAN_KILL[@]}" "$WBROKERD" --backend cuda --device 0 --socket "$WORK/pre.sock" \
  --model "big=$BIG" >"$OUT/broker_preload.log" 2>&1 &
BROKER=$!
PIDS+=("$BROKER")
wait_for 60 grep -q "event=model_load_start" "$OUT/broker_preload.log"
sleep 0.5
pre_mid=$(mem_used)
t0=$(now_ms)
kill -TERM "$BROKER"
wait_exit 60 "$BROKER"
pre_rc=$?
pre_ms=$(($(now_ms) - t0))
sleep 1
pre_after=$(mem_used)
sock_left=$([ -e "$WORK/pre.sock" ] && echo yes || echo no)
say "SIGTERM during the preload: rc=$pre_rc after $pre_ms ms, socket left: $sock_left; device used idle $idle, mid $pre_mid, after $pre_after; $(grep -o 'event=stop.*' "$OUT/broker_preload.log" | head -n 1)"
record "{\"step\":\"sigterm_preload\",\"rc\":$pre_rc,\"exit_ms\":$pre_ms,\"socket_left\":\"$sock_left\",\"used_idle\":$idle,\"used_mid\":$pre_mid,\"used_after\":$pre_after}"
[ "$pre_rc" = 0 ] || fail "SIGTERM during the preload: exit $pre_rc"
[ "$pre_ms" -lt 5000 ] || fail "SIGTERM during the preload took $pre_ms ms"
[ "$sock_left" = no ] || fail "the socket was left behind"
rm -f "$BIG"

python3 - "$RES" "$OUT/operator.json" "${#FAILS[@]}" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
json.dump({"steps": steps, "pass": sys.argv[3] == "0"}, open(sys.argv[2], "w"), indent=1)
PY
[ ${#FAILS[@]} -eq 0 ] && { say "operator: PASS"; exit 0; }
say "operator: FAIL (${FAILS[*]})"
exit 1
