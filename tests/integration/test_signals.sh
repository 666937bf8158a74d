#!/usr/bin/env bash
# Signals, on real brokers started as a shell's background jobs (which
# ignore SIGINT and SIGQUIT unless the broker takes them back):
# * SIGTERM, SIGINT, SIGQUIT, SIGXCPU and SIGPWR stop a broker that serves a
#   leased model: exit status 0, a line naming the signal, no socket and no
#   /dev/shm slab left;
# * SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGSTKFLT, SIGXFSZ
#   and real-time signals are logged and ignored: the broker still serves;
# * SIGHUP without --config is logged and changes nothing;
# * SIGHUP with --config: a raised --max-models lets a refused load through,
#   a new log level takes effect, an allow list lets uid 65534 in (as root),
#   each logged as changed; the command line still wins over the file; a
#   setting that cannot change live is logged "restart to apply" and left;
#   a file that is now wrong is logged with FILE:LINE and the running
#   settings keep working; systemd is told RELOADING=1 then READY=1;
# * SIGTERM during a slow preload cancels it and exits at once, cleanly;
#   a SIGHUP then waits until the broker serves.
source "$(dirname "$0")/lib.sh"
# Named slabs in /dev/shm, so that what a stop leaves behind can be seen.
HOST_SLAB=shm

make_model "$WB_TMP/demo.safetensors" 4 5 >/dev/null
make_model "$WB_TMP/extra.safetensors" 2 6 >/dev/null
make_model "$WB_TMP/third.safetensors" 2 7 >/dev/null

log_has() {
  grep -qE -- "$1" "$BROKER_LOG"
}

# --- Stop signals -------------------------------------------------------------
for sig in TERM INT QUIT XCPU PWR; do
  start_broker_with_demo "$WB_TMP/demo.safetensors"
  pid=$BROKER_PID
  start_worker "w$sig" --model demo
  worker=$LAST_PID
  [ "$(shm_count "$pid")" -ge 1 ] || fail "SIG$sig: the broker has no slab in /dev/shm to remove"
  kill -"$sig" "$pid"
  wait_exit "$pid"
  [ "$EXIT_RC" = 0 ] || fail "SIG$sig: the broker exited with status $EXIT_RC, not 0"
  log_has "event=signal signal=SIG$sig action=stop " || fail "SIG$sig: no event=signal line"
  log_has "event=stop leases_held=1 .* signal=SIG$sig$" ||
    fail "SIG$sig: no stop line naming the signal and the lease held: $(grep event=stop "$BROKER_LOG")"
  [ "$(shm_count "$pid")" = 0 ] || fail "SIG$sig: the broker left $(ls /dev/shm/wb-"$pid"-*) behind"
  [ ! -e "$SOCK" ] || fail "SIG$sig: the broker left its socket behind"
  kill -TERM "$worker" 2>/dev/null
  wait "$worker" 2>/dev/null
  BROKER_PID=
done
log "stop signals: TERM INT QUIT XCPU PWR"

# --- Ignored signals ----------------------------------------------------------
start_broker_with_demo "$WB_TMP/demo.safetensors"
ignored=(USR1 USR2 ALRM VTALRM PROF IO XFSZ RTMIN RTMIN+3 RTMAX)
kill -l STKFLT >/dev/null 2>&1 && ignored+=(STKFLT)
for sig in "${ignored[@]}"; do
  kill -"$sig" "$BROKER_PID" || fail "kill -$sig failed"
  wait_for log_has "event=signal signal=SIG${sig/+/\\+} action=ignored " ||
    fail "SIG$sig: no 'action=ignored' line"
  alive "$BROKER_PID" || fail "SIG$sig killed the broker"
done
ctl stats >/dev/null || fail "the broker does not answer after the ignored signals"
model_ready demo || fail "model demo is not ready after the ignored signals"
log "ignored: ${ignored[*]}"

# SIGHUP without --config: logged, nothing else.
kill -HUP "$BROKER_PID"
wait_for log_has 'event=config_reload result=skipped note="started without --config' ||
  fail "SIGHUP without --config was not logged"
alive "$BROKER_PID" || fail "SIGHUP killed the broker"
ctl stats >/dev/null || fail "the broker does not answer after SIGHUP"
stop_broker

# --- SIGHUP with --config -----------------------------------------------------
CONF=$WB_TMP/broker.conf
cat >"$CONF" <<EOF
[broker]
max-models = 1   # demo only, for now
log-level = info
heartbeat-ms = 100
EOF
reloads=0
# count_at_least N FILE PATTERN: FILE has N lines with PATTERN.
count_at_least() {
  [ "$(grep -c -- "$3" "$2")" -ge "$1" ]
}
# reload: SIGHUP, and the next config_reload line, in RELOAD_LINE.
reload() {
  reloads=$((reloads + 1))
  kill -HUP "$BROKER_PID"
  wait_for count_at_least "$reloads" "$BROKER_LOG" 'event=config_reload ' ||
    fail "no config_reload line after SIGHUP number $reloads"
  RELOAD_LINE=$(grep 'event=config_reload ' "$BROKER_LOG" | sed -n "${reloads}p")
}

notify_tested=0
if "$WBROKERD" --version | grep -q -- "+systemd"; then
  NOTIFY=$WB_TMP/notify.sock
  spawn notify "$PYTHON" -u -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
while True:
    print(s.recv(4096).decode().replace("\n", " "), flush=True)
' "$NOTIFY"
  wait_for test -S "$NOTIFY" || fail "the notification listener did not start"
  export NOTIFY_SOCKET=$NOTIFY
  notify_tested=1
fi
start_broker --config "$CONF" --model "demo=$WB_TMP/demo.safetensors"
unset NOTIFY_SOCKET
wait_for model_ready demo || fail "model demo did not become ready"
ctl load extra "$WB_TMP/extra.safetensors" >"$WB_TMP/load1.out" 2>"$WB_TMP/load1.err" &&
  fail "a second model was loaded with max-models = 1"
grep -qF "the limit (--max-models 1)" "$WB_TMP/load1.err" || fail "unexpected refusal: $(cat "$WB_TMP/load1.err")"
log_has "level=debug" && fail "debug lines before the log level was raised"

# Nothing changed yet.
reload
grep -qF "file=$CONF result=unchanged" <<<"$RELOAD_LINE" || fail "an unchanged file: $RELOAD_LINE"

# A limit and the log level change at once; the command line's
# --heartbeat-ms 100 (start_broker's) still wins over the file's new value.
cat >"$CONF" <<EOF
[broker]
max-models = 2   # room for extra
log-level = debug
heartbeat-ms = 250
EOF
reload
grep -qF 'level=info prog=wbrokerd event=config_reload' <<<"$RELOAD_LINE" || fail "not an info line: $RELOAD_LINE"
grep -qF "result=applied changed=\"max-models=2 log-level=debug\"" <<<"$RELOAD_LINE" ||
  fail "the reload line does not name the changes: $RELOAD_LINE"
grep -q "heartbeat" <<<"$RELOAD_LINE" && fail "the file's heartbeat-ms won over the command line: $RELOAD_LINE"
ctl load extra "$WB_TMP/extra.safetensors" >/dev/null 2>"$WB_TMP/load2.err" ||
  fail "the load is still refused after max-models = 2: $(cat "$WB_TMP/load2.err")"
wait_for model_ready extra || fail "model extra did not become ready"
ctl stats >/dev/null
wait_for log_has "level=debug prog=wbrokerd event=peer_connected " || fail "no debug line after log-level = debug"

# Settings that cannot change live are logged and left as they are.
cat >"$CONF" <<EOF
[broker]
max-models = 2
log-level = debug
max-peers = 100
read-threads = 1

[model later]
path = $WB_TMP/third.safetensors
EOF
reload
grep -qF 'level=warn prog=wbrokerd event=config_reload' <<<"$RELOAD_LINE" || fail "not a warn line: $RELOAD_LINE"
grep -qF "result=restart_needed not_applied=\"read-threads=1 max-peers=100 model.later=$WB_TMP/third.safetensors\" note=\"restart to apply\"" <<<"$RELOAD_LINE" ||
  fail "the settings that need a restart are not listed: $RELOAD_LINE"
model_absent later || fail "a model of the reloaded file was loaded"

# A file that is now wrong changes nothing: max-models stays 2.
cat >"$CONF" <<EOF
[broker]
max-models = 3
sokcet = /tmp/elsewhere.sock
EOF
reload
grep -qF "level=error prog=wbrokerd event=config_reload file=$CONF result=failed error=\"$CONF:3: unknown key 'sokcet' in [broker] (did you mean 'socket'?)\" note=\"the running settings are kept\"" <<<"$RELOAD_LINE" ||
  fail "the wrong file is not reported with its line: $RELOAD_LINE"
ctl load third "$WB_TMP/third.safetensors" >/dev/null 2>"$WB_TMP/load3.err" &&
  fail "a third model was loaded: the wrong file's max-models = 3 was applied"
grep -qF "the limit (--max-models 2)" "$WB_TMP/load3.err" || fail "unexpected refusal: $(cat "$WB_TMP/load3.err")"
printf '[broker]\nmax-models = 3\nmax-leases-per-client = 0\n' >"$CONF"
reload
grep -qF "result=failed error=\"$CONF:3: max-leases-per-client: '0' is not a positive number\"" <<<"$RELOAD_LINE" ||
  fail "a bad value is not reported with its line: $RELOAD_LINE"
ctl stats >/dev/null || fail "the broker does not answer after the failed reloads"

# Lowering the limit refuses the next load and keeps what is loaded.
printf '[broker]\nmax-models = 1\nlog-level = info\n' >"$CONF"
reload
grep -qF 'result=applied changed="max-models=1 log-level=info"' <<<"$RELOAD_LINE" || fail "lowering: $RELOAD_LINE"
model_ready extra || fail "lowering max-models unloaded a model"
ctl load third "$WB_TMP/third.safetensors" >/dev/null 2>&1 && fail "a load was granted over max-models = 1"

if [ "$notify_tested" = 1 ]; then
  wait_for count_at_least $((reloads + 1)) "$WB_TMP/notify.out" 'READY=1' ||
    fail "READY=1 was not sent after each reload: $(cat "$WB_TMP/notify.out")"
  "$PYTHON" - "$WB_TMP/notify.out" "$reloads" <<'PY' || fail "sd_notify around the reloads: $(cat "$WB_TMP/notify.out")"
import re, sys
lines = [l.strip() for l in open(sys.argv[1]) if l.strip()]
reloads = int(sys.argv[2])
assert lines[0].startswith("READY=1"), lines
rest = lines[1:]
assert len(rest) == 2 * reloads, lines
for i in range(reloads):
    assert re.match(r"RELOADING=1 MONOTONIC_USEC=[0-9]+ ", rest[2 * i]), rest[2 * i]
    assert rest[2 * i + 1].startswith("READY=1"), rest[2 * i + 1]
PY
else
  log "!!! sd_notify NOT tested: this wbrokerd was built without libsystemd"
fi
stop_broker

# Access lists, with a process of another uid (as root only).
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null &&
  setpriv --reuid 65534 --regid 65534 --clear-groups "$WBCTL" --help >/dev/null 2>&1; then
  NOBODY=(setpriv --reuid 65534 --regid 65534 --clear-groups)
  chmod 0711 "$WB_TMP"
  RUN=$WB_TMP/run
  mkdir "$RUN"
  chgrp 65534 "$RUN"
  chmod 2750 "$RUN"
  SOCK=$RUN/broker.sock
  export WB_SOCKET=$SOCK
  printf '[broker]\nadmin-uid = 0\n' >"$CONF"
  reloads=0
  start_broker --config "$CONF"
  "${NOBODY[@]}" "$WBCTL" --socket "$SOCK" stats >/dev/null 2>"$WB_TMP/nobody1.err" &&
    fail "uid 65534 was served before it was allowed"
  grep -qF "uid 65534 is not allowed" "$WB_TMP/nobody1.err" || fail "unexpected refusal: $(cat "$WB_TMP/nobody1.err")"
  printf '[broker]\nadmin-uid = 0\nallow-uid = nobody\n' >"$CONF"
  reload
  grep -qF 'result=applied changed="allow-uid=65534"' <<<"$RELOAD_LINE" || fail "allow-uid: $RELOAD_LINE"
  "${NOBODY[@]}" "$WBCTL" --socket "$SOCK" stats >/dev/null 2>"$WB_TMP/nobody2.err" ||
    fail "uid 65534 is refused after allow-uid = nobody: $(cat "$WB_TMP/nobody2.err")"
  printf '[broker]\nadmin-uid = 0\n' >"$CONF"
  reload
  grep -qF 'result=applied changed="allow-uid=none"' <<<"$RELOAD_LINE" || fail "allow-uid removed: $RELOAD_LINE"
  "${NOBODY[@]}" "$WBCTL" --socket "$SOCK" stats >/dev/null 2>&1 && fail "uid 65534 is still served"
  stop_broker
  SOCK=$WB_TMP/broker.sock
  export WB_SOCKET=$SOCK
  log "access lists reloaded"
else
  log "!!! the access-list reload is NOT tested: it needs root and setpriv"
fi

# --- Signals while the broker starts ------------------------------------------
# A sparse checkpoint in tmpfs: reading it costs no memory, and filling its
# slab takes seconds.
BIG=/dev/shm/wbit-signals-$$.safetensors
trap 'rc=$?; rm -f "$BIG"; (exit $rc); cleanup' EXIT
make_big() {
  "$PYTHON" - "$BIG" "$1" <<'PY'
import json, struct, sys
n = int(sys.argv[2]) << 20
raw = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
raw += b" " * (-len(raw) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw)
    f.truncate(8 + len(raw) + n)
PY
}
make_big 4096
BROKER_LOG=$WB_TMP/preload.log
"$WBROKERD" --backend host --host-slab shm --socket "$SOCK" --model "big=$BIG" \
  --model "demo=$WB_TMP/demo.safetensors" >"$BROKER_LOG" 2>&1 &
pid=$!
STARTED_PIDS+=("$pid")
BROKER_PIDS+=("$pid")
wait_for log_has "event=model_load_start model=big " || fail "the preload of big did not start"
t0=$(date +%s%N)
kill -TERM "$pid"
wait_exit "$pid"
took=$((($(date +%s%N) - t0) / 1000000))
[ "$EXIT_RC" = 0 ] || fail "SIGTERM during a preload: exit status $EXIT_RC"
log_has "event=signal signal=SIGTERM action=stop while=starting " || fail "no signal line while starting"
log_has 'event=model_load_failed model=big status=WB_ESTATE error="the load was cancelled' ||
  fail "the preload was not cancelled: $(grep big "$BROKER_LOG")"
log_has "event=stop signal=SIGTERM while=starting models=0" || fail "no stop line while starting"
log_has "event=model_ready" && fail "a model was loaded after SIGTERM"
log_has "event=listen" && fail "the broker went on to serve after SIGTERM"
[ "$(shm_count "$pid")" = 0 ] || fail "the cancelled preload left $(ls /dev/shm/wb-"$pid"-*) behind"
[ ! -e "$SOCK" ] || fail "a socket was left behind"
[ "$took" -lt $((WAIT_SECS * 500)) ] || fail "the broker took ${took} ms to stop during a preload"
log "SIGTERM during a 4 GiB preload: stopped in ${took} ms"

# A SIGHUP during the preloads is acted on once the broker serves.
make_big 256
printf '[broker]\nmax-models = 4\n' >"$CONF"
BROKER_LOG=$WB_TMP/preload_hup.log
"$WBROKERD" --backend host --host-slab shm --socket "$SOCK" --config "$CONF" \
  --model "big=$BIG" >"$BROKER_LOG" 2>&1 &
BROKER_PID=$!
STARTED_PIDS+=("$BROKER_PID")
BROKER_PIDS+=("$BROKER_PID")
wait_for log_has "event=model_load_start model=big " || fail "the preload of big did not start"
printf '[broker]\nmax-models = 5\n' >"$CONF"
kill -HUP "$BROKER_PID"
WAIT_SECS=$((WAIT_SECS * 3)) wait_for log_has "event=config_reload " || fail "no reload after the preload"
alive "$BROKER_PID" || fail "SIGHUP during a preload killed the broker"
listen_line=$(grep -n "event=listen" "$BROKER_LOG" | cut -d: -f1)
reload_line=$(grep -n "event=config_reload" "$BROKER_LOG" | cut -d: -f1)
[ -n "$listen_line" ] && [ "$reload_line" -gt "$listen_line" ] || fail "the reload came before the broker served"
grep -qF 'result=applied changed="max-models=5"' "$BROKER_LOG" || fail "the deferred reload: $(grep config_reload "$BROKER_LOG")"
model_ready big || fail "model big is not ready"
stop_broker
rm -f "$BIG"
true
