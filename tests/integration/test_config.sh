#!/usr/bin/env bash
# The configuration file: the shipped example passes --check-config once its
# models' paths exist (and names each missing one by line and model before);
# typos, bad values and unknown sections stop the broker with exit status 78
# and FILE:LINE in the message (wrong flags stay exit status 2, followed by
# "Try 'wbrokerd --help'."; every message starts with "wbrokerd:", also for
# an option getopt does not know); '#' and ';' comments, whole-line and
# after a value, while a '#' inside a value stays; stale-ms below twice
# heartbeat-ms is refused naming both; flags override the file while the
# file's other settings and models take effect; every long option of
# wbrokerd is a configuration key, in --help and in the man page (the option
# table is read from broker/options.c, so a new option that is not
# documented fails here); --backend cuda without the NVIDIA driver says so.
source "$(dirname "$0")/lib.sh"

: "${WB_SOURCE_DIR:?WB_SOURCE_DIR must name the source tree}"
OPTIONS_C=$WB_SOURCE_DIR/broker/options.c
MAN8=$WB_SOURCE_DIR/docs/man/wbrokerd.8
EXAMPLE=$WB_SOURCE_DIR/deploy/wbroker.conf

# check_config FILE [ARGS...]: runs --check-config; output in check.out and
# check.err, status in EXIT_RC.
check_config() {
  local file=$1
  shift
  "$WBROKERD" --config "$file" --check-config "$@" >"$WB_TMP/check.out" 2>"$WB_TMP/check.err"
  EXIT_RC=$?
}

# The example configuration names the node's model paths: here, where they
# do not exist, --check-config names each model by its path's line.
check_config "$EXAMPLE"
[ "$EXIT_RC" = 78 ] || fail "--check-config of deploy/wbroker.conf without its models exited $EXIT_RC"
base_line=$(grep -n '^path = /var/lib/wbroker/models/base/model.safetensors' "$EXAMPLE" | cut -d: -f1)
instruct_line=$(grep -n '^path = /var/lib/wbroker/models/base-instruct$' "$EXAMPLE" | cut -d: -f1)
[ "$(cat "$WB_TMP/check.err")" = "wbrokerd: $EXAMPLE:$base_line: model 'base': no such file: /var/lib/wbroker/models/base/model.safetensors
wbrokerd: $EXAMPLE:$instruct_line: model 'base-instruct': no such file: /var/lib/wbroker/models/base-instruct" ] ||
  fail "the missing models are not named: $(cat "$WB_TMP/check.err")"
[ ! -s "$WB_TMP/check.out" ] || fail "a failed check printed on stdout: $(cat "$WB_TMP/check.out")"
# With checkpoints where it says, the example is valid as shipped: a file,
# and a directory holding model.safetensors.
mkdir -p "$WB_TMP/models/base" "$WB_TMP/models/base-instruct"
make_model "$WB_TMP/models/base/model.safetensors" 2 1 >/dev/null
make_model "$WB_TMP/models/base-instruct/model.safetensors" 2 2 >/dev/null
sed "s#/var/lib/wbroker/models/#$WB_TMP/models/#" "$EXAMPLE" >"$WB_TMP/example.conf"
check_config "$WB_TMP/example.conf"
[ "$EXIT_RC" = 0 ] || fail "--check-config of deploy/wbroker.conf exited $EXIT_RC: $(cat "$WB_TMP/check.err")"
grep -qx "valid" "$WB_TMP/check.out" || fail "--check-config did not say valid"
grep -qx "socket: /run/wbroker/broker.sock" "$WB_TMP/check.out" || fail "unexpected socket: $(cat "$WB_TMP/check.out")"
grep -qx "model: base path=$WB_TMP/models/base/model.safetensors devices=all (file)" "$WB_TMP/check.out" ||
  fail "the example's model base is not listed: $(cat "$WB_TMP/check.out")"
grep -qx "metrics: 127.0.0.1:9464" "$WB_TMP/check.out" || fail "the example's metrics address is not listed"
[ ! -s "$WB_TMP/check.err" ] || fail "--check-config printed on stderr: $(cat "$WB_TMP/check.err")"
# A directory without a checkpoint, and a model given as a flag.
rm "$WB_TMP/models/base-instruct/model.safetensors"
check_config "$WB_TMP/example.conf" --model "flag=$WB_TMP/absent.safetensors"
[ "$EXIT_RC" = 78 ] || fail "an empty model directory gave exit status $EXIT_RC"
[ "$(cat "$WB_TMP/check.err")" = "wbrokerd: $WB_TMP/example.conf:$instruct_line: model 'base-instruct': $WB_TMP/models/base-instruct: directory holds neither model.safetensors.index.json nor model.safetensors
wbrokerd: --model flag: no such file: $WB_TMP/absent.safetensors
Try 'wbrokerd --help'." ] || fail "unexpected messages: $(cat "$WB_TMP/check.err")"
make_model "$WB_TMP/models/base-instruct/model.safetensors" 2 2 >/dev/null
"$WBROKERD" --socket "$WB_TMP/k.sock" --model "flag=$WB_TMP/absent.safetensors" --check-config \
  >"$WB_TMP/check.out" 2>"$WB_TMP/check.err"
rc=$?
[ "$rc" = 2 ] || fail "a missing --model path gave exit status $rc, not 2"

# Comments: whole lines, after a section header or a value ('#' or ';'
# after a space or tab); a '#' inside a value is part of it.
cat >"$WB_TMP/comments.conf" <<EOF
# whole line
   ; indented
[broker]   # why
socket = $WB_TMP/run#1.sock  # a '#' in the path stays
backend = host	# after a tab
max-models = 3 ; the other prefix
log-level = warn#not a comment
EOF
check_config "$WB_TMP/comments.conf"
[ "$EXIT_RC" = 78 ] || fail "'warn#not a comment' was accepted: $(cat "$WB_TMP/check.out")"
grep -qF "comments.conf:7: log-level: 'warn#not a comment' is not one of debug, info, warn, error" "$WB_TMP/check.err" ||
  fail "unexpected message: $(cat "$WB_TMP/check.err")"
sed -i 's/^log-level = warn#not a comment$/log-level = warn # a comment/' "$WB_TMP/comments.conf"
check_config "$WB_TMP/comments.conf"
[ "$EXIT_RC" = 0 ] || fail "comments: exit status $EXIT_RC: $(cat "$WB_TMP/check.err")"
grep -qx "socket: $WB_TMP/run#1.sock" "$WB_TMP/check.out" || fail "the socket with a '#': $(cat "$WB_TMP/check.out")"
grep -qx "backend: host cuda-slab=vmm host-slab=memfd slab-pool=30s" "$WB_TMP/check.out" || fail "comments: $(cat "$WB_TMP/check.out")"

# Liveness: stale-ms below twice heartbeat-ms is refused, naming both.
"$WBROKERD" --socket "$WB_TMP/k.sock" --stale-ms 500 --heartbeat-ms 1000 --check-config \
  >"$WB_TMP/check.out" 2>"$WB_TMP/check.err"
rc=$?
[ "$rc" = 2 ] || fail "--stale-ms 500 --heartbeat-ms 1000 gave exit status $rc, not 2"
[ "$(cat "$WB_TMP/check.err")" = "wbrokerd: --stale-ms 500 is less than 2 times --heartbeat-ms 1000: a healthy worker's lease would turn stale between its heartbeats (stale-ms must be at least 2 x heartbeat-ms, 2000 here)
Try 'wbrokerd --help'." ] || fail "unexpected message: $(cat "$WB_TMP/check.err")"
printf '[broker]\nsocket = %s\nheartbeat-ms = 1000\nstale-ms = 1500\n' "$WB_TMP/k.sock" >"$WB_TMP/stale.conf"
check_config "$WB_TMP/stale.conf"
[ "$EXIT_RC" = 78 ] || fail "stale-ms = 1500 with heartbeat-ms = 1000 gave exit status $EXIT_RC, not 78"
[ "$(cat "$WB_TMP/check.err")" = "wbrokerd: $WB_TMP/stale.conf:4: stale-ms 1500 is less than 2 times heartbeat-ms 1000 (line 3): a healthy worker's lease would turn stale between its heartbeats (stale-ms must be at least 2 x heartbeat-ms, 2000 here)" ] ||
  fail "unexpected message: $(cat "$WB_TMP/check.err")"
# The broker does not start with it either.
"$WBROKERD" --config "$WB_TMP/stale.conf" --backend host >"$WB_TMP/stale.log" 2>&1
rc=$?
[ "$rc" = 78 ] || fail "the broker started with stale-ms = 1500 (status $rc)"
check_config "$WB_TMP/stale.conf" --stale-ms 2000
[ "$EXIT_RC" = 0 ] || fail "--stale-ms 2000 over the file was refused: $(cat "$WB_TMP/check.err")"

# Misuse: "wbrokerd:" (not the program's path), the message, the hint, 2.
for args in "--bogus|unknown option '--bogus'" "--socket|option '--socket' needs a value" \
  "--help=now|option '--help' takes no value" "--max-queued|option '--max-queued' is ambiguous: it could be --max-queued-replies, --max-queued-bytes, --max-queued-bytes-total" \
  "-x|unknown option '-x'" "stray|unexpected argument 'stray'"; do
  "$WBROKERD" "${args%%|*}" >"$WB_TMP/misuse.out" 2>"$WB_TMP/misuse.err"
  rc=$?
  [ "$rc" = 2 ] || fail "${args%%|*}: exit status $rc, not 2"
  [ "$(cat "$WB_TMP/misuse.err")" = "wbrokerd: ${args#*|}
Try 'wbrokerd --help'." ] || fail "${args%%|*}: unexpected message: $(cat "$WB_TMP/misuse.err")"
  [ ! -s "$WB_TMP/misuse.out" ] || fail "${args%%|*}: printed on stdout"
done

# A typo: exit status 78, file and line, a hint.
cat >"$WB_TMP/typo.conf" <<'EOF'
# comment
[broker]
socket = /tmp/x.sock

sokcet = /tmp/y.sock
EOF
check_config "$WB_TMP/typo.conf"
[ "$EXIT_RC" = 78 ] || fail "an unknown key gave exit status $EXIT_RC, not 78"
want="wbrokerd: $WB_TMP/typo.conf:5: unknown key 'sokcet' in [broker] (did you mean 'socket'?)"
[ "$(cat "$WB_TMP/check.err")" = "$want" ] || fail "unexpected message: $(cat "$WB_TMP/check.err")"
[ ! -s "$WB_TMP/check.out" ] || fail "a failed check printed on stdout"

# A bad value is found by the option parser and still named by line.
printf '[broker]\nsocket = /tmp/x.sock\nheartbeat_ms = often\n' >"$WB_TMP/value.conf"
check_config "$WB_TMP/value.conf"
[ "$EXIT_RC" = 78 ] || fail "a bad value gave exit status $EXIT_RC, not 78"
grep -qF "wbrokerd: $WB_TMP/value.conf:3: heartbeat-ms: 'often' is not a positive number" "$WB_TMP/check.err" ||
  fail "unexpected message: $(cat "$WB_TMP/check.err")"
printf '[broker]\nbackend = tpu\n' >"$WB_TMP/backend.conf"
check_config "$WB_TMP/backend.conf"
[ "$EXIT_RC" = 78 ] || fail "a bad backend gave exit status $EXIT_RC, not 78"
grep -qF "$WB_TMP/backend.conf:2: backend: 'tpu'" "$WB_TMP/check.err" || fail "unexpected message: $(cat "$WB_TMP/check.err")"

# Unknown sections (even empty ones) and models without a path.
printf '[broker]\n\n[models]\n' >"$WB_TMP/section.conf"
check_config "$WB_TMP/section.conf"
[ "$EXIT_RC" = 78 ] || fail "an unknown section gave exit status $EXIT_RC"
grep -qF "$WB_TMP/section.conf:3: unknown section [models]; expected [broker] or [model NAME]" "$WB_TMP/check.err" ||
  fail "unexpected message: $(cat "$WB_TMP/check.err")"
printf '[model a]\ndevice = 0\n' >"$WB_TMP/nopath.conf"
check_config "$WB_TMP/nopath.conf"
[ "$EXIT_RC" = 78 ] || fail "a model without path gave exit status $EXIT_RC"
grep -qF "$WB_TMP/nopath.conf:1: [model a] has no 'path'" "$WB_TMP/check.err" || fail "unexpected message: $(cat "$WB_TMP/check.err")"

# A missing file is a configuration error too.
check_config "$WB_TMP/absent.conf"
[ "$EXIT_RC" = 78 ] || fail "a missing file gave exit status $EXIT_RC"
grep -qF "$WB_TMP/absent.conf: cannot open the configuration file: No such file or directory" "$WB_TMP/check.err" ||
  fail "unexpected message: $(cat "$WB_TMP/check.err")"

# The same mistake as a flag is a usage error (2), not a configuration one.
check_config "$EXAMPLE" --heartbeat-ms often
[ "$EXIT_RC" = 2 ] || fail "a bad flag gave exit status $EXIT_RC, not 2"
grep -qF "wbrokerd: --heartbeat-ms: 'often'" "$WB_TMP/check.err" || fail "unexpected message: $(cat "$WB_TMP/check.err")"

# --help and --version work whatever the file holds.
"$WBROKERD" --config "$WB_TMP/typo.conf" --help >"$WB_TMP/help.out" 2>&1 || fail "--help with a broken file failed"
grep -q "^usage: wbrokerd" "$WB_TMP/help.out" || fail "--help printed no usage"

# Flags win over the file; the file's other settings and models apply.
make_model "$WB_TMP/demo.safetensors" 4 7 >/dev/null
make_model "$WB_TMP/other.safetensors" 2 9 >/dev/null
cat >"$WB_TMP/broker.conf" <<EOF
[broker]
socket = $WB_TMP/from-file.sock
heartbeat-ms = 150
stale-ms = 900
log-format = json

[model demo]
path = $WB_TMP/demo.safetensors

[model second]
path = $WB_TMP/other.safetensors
EOF
# A model on the command line replaces the file's model of the same name.
check_config "$WB_TMP/broker.conf" --model "second=$WB_TMP/demo.safetensors" --socket "$SOCK"
[ "$EXIT_RC" = 0 ] || fail "--check-config with overrides exited $EXIT_RC: $(cat "$WB_TMP/check.err")"
grep -qx "socket: $SOCK" "$WB_TMP/check.out" || fail "--socket did not override the file"
grep -qx "model: demo path=$WB_TMP/demo.safetensors (file)" "$WB_TMP/check.out" || fail "the file's model demo is missing"
grep -qx "model: second path=$WB_TMP/demo.safetensors (command line)" "$WB_TMP/check.out" ||
  fail "--model did not replace the file's model: $(cat "$WB_TMP/check.out")"
[ "$(grep -c '^model: ' "$WB_TMP/check.out")" = 2 ] || fail "expected two models"
# The same model twice on the command line is still a mistake.
check_config "$WB_TMP/broker.conf" --model "x=/a" --model "x=/b"
[ "$EXIT_RC" = 2 ] || fail "a model given twice on the command line gave $EXIT_RC"

start_broker --config "$WB_TMP/broker.conf"
wait_for model_ready demo || fail "the file's model demo did not become ready"
wait_for model_ready second || fail "the file's model second did not become ready"
[ ! -e "$WB_TMP/from-file.sock" ] || fail "the broker used the file's socket despite --socket"
# start_broker passes --heartbeat-ms 100 --stale-ms 600; the file's JSON log
# format, which no flag overrides, is in effect.
listen=$(grep '"event":"listen"' "$BROKER_LOG") || fail "no JSON listen line: the file's log-format was ignored"
[ "$(json "d['heartbeat_ms'], d['stale_ms'], d['socket']" <<<"$listen")" = "(100, 600, '$SOCK')" ] ||
  fail "flags did not override the file: $listen"
stop_broker

# Every long option is a configuration key, and is documented.
mapfile -t options < <(grep -oE '\{"[a-z0-9-]+", *(required|no|optional)_argument' "$OPTIONS_C" |
  sed -E 's/\{"([a-z0-9-]+)", *([a-z]+)_argument/\1 \2/')
[ "${#options[@]}" -ge 15 ] || fail "found only ${#options[@]} options in $OPTIONS_C"
"$WBROKERD" --help >"$WB_TMP/help.out" || fail "--help failed"
checked=0
for entry in "${options[@]}"; do
  name=${entry% *}
  kind=${entry#* }
  grep -qE -- "--$name([ =\[]|$)" "$WB_TMP/help.out" || fail "--help does not mention --$name"
  grep -qF -- "$(printf '%s' "--$name" | sed 's/-/\\-/g')" "$MAN8" || fail "wbrokerd.8 does not document --$name"
  case $name in
    config | check-config | help | version) continue ;;
    model)
      printf '[model m]\npath = /p\n' >"$WB_TMP/key.conf"
      ;;
    *)
      value='%%not-a-value%%'
      [ "$kind" = no ] && value=true
      printf '[broker]\n%s = %s\n' "$name" "$value" >"$WB_TMP/key.conf"
      ;;
  esac
  check_config "$WB_TMP/key.conf" --socket "$WB_TMP/k.sock"
  ! grep -q "unknown key" "$WB_TMP/check.err" || fail "--$name is not a configuration key: $(cat "$WB_TMP/check.err")"
  if [ "$EXIT_RC" != 0 ]; then
    [ "$EXIT_RC" = 78 ] || fail "key $name: exit status $EXIT_RC, not 0 or 78: $(cat "$WB_TMP/check.err")"
    grep -qF "$WB_TMP/key.conf:2: " "$WB_TMP/check.err" || fail "key $name: the error names no line: $(cat "$WB_TMP/check.err")"
  fi
  checked=$((checked + 1))
done
log "checked ${checked} configuration keys against ${#options[@]} options"

# The cuda slab transport: a configuration key like --host-slab; a bad value
# is refused naming it; --backend cuda with vmm slabs stops at start with the
# reason on a machine without a usable GPU (or a build without CUDA), and
# auto falls back to the host backend saying why.
printf '[broker]\ncuda-slab = vmm\nhost-slab = memfd\n' >"$WB_TMP/vmm.conf"
check_config "$WB_TMP/vmm.conf" --socket "$WB_TMP/k.sock"
[ "$EXIT_RC" = 0 ] || fail "cuda-slab = vmm: exit status $EXIT_RC: $(cat "$WB_TMP/check.err")"
grep -qx "backend: auto cuda-slab=vmm host-slab=memfd slab-pool=30s" "$WB_TMP/check.out" ||
  fail "--check-config does not show the slab transports: $(cat "$WB_TMP/check.out")"
check_config "$WB_TMP/vmm.conf" --socket "$WB_TMP/k.sock" --cuda-slab ipc
grep -qx "backend: auto cuda-slab=ipc host-slab=memfd slab-pool=off" "$WB_TMP/check.out" ||
  fail "--cuda-slab ipc did not override the file: $(cat "$WB_TMP/check.out")"
# The pool of freed cuda-vmm slabs: its keys, the command line winning, a
# value out of range refused naming the line.
printf '[broker]\nslab-pool-seconds = 5\n' >"$WB_TMP/pool.conf"
check_config "$WB_TMP/pool.conf" --socket "$WB_TMP/k.sock"
grep -qx "backend: auto cuda-slab=vmm host-slab=memfd slab-pool=5s" "$WB_TMP/check.out" ||
  fail "slab-pool-seconds = 5: $(cat "$WB_TMP/check.out")"
check_config "$WB_TMP/pool.conf" --socket "$WB_TMP/k.sock" --no-slab-pool
grep -qx "backend: auto cuda-slab=vmm host-slab=memfd slab-pool=off" "$WB_TMP/check.out" ||
  fail "--no-slab-pool: $(cat "$WB_TMP/check.out")"
printf '[broker]\nslab-pool-seconds = 0\n' >"$WB_TMP/pool_bad.conf"
check_config "$WB_TMP/pool_bad.conf" --socket "$WB_TMP/k.sock"
[ "$EXIT_RC" = 78 ] || fail "slab-pool-seconds = 0: exit status $EXIT_RC, not 78"
grep -qF "$WB_TMP/pool_bad.conf:2: slab-pool-seconds: '0' is not a number of seconds from 1 to 3600" "$WB_TMP/check.err" ||
  fail "slab-pool-seconds = 0: $(cat "$WB_TMP/check.err")"
printf '[broker]\ncuda-slab = fast\n' >"$WB_TMP/vmm_bad.conf"
check_config "$WB_TMP/vmm_bad.conf" --socket "$WB_TMP/k.sock"
[ "$EXIT_RC" = 78 ] || fail "cuda-slab = fast: exit status $EXIT_RC, not 78"
if ! grep -qF "$WB_TMP/vmm_bad.conf:2: cuda-slab: 'fast' is not one of ipc, vmm" "$WB_TMP/check.err"; then
  fail "cuda-slab = fast: $(cat "$WB_TMP/check.err")"
fi
"$WBROKERD" --cuda-slab fast --check-config >"$WB_TMP/check.out" 2>"$WB_TMP/check.err"
rc=$?
[ "$rc" = 2 ] || fail "--cuda-slab fast: exit status $rc, not 2"
grep -qF -- "--cuda-slab: 'fast' is not one of ipc, vmm" "$WB_TMP/check.err" || fail "--cuda-slab fast: $(cat "$WB_TMP/check.err")"

"$WBROKERD" --backend cuda --cuda-slab vmm --socket "$WB_TMP/vmm.sock" >"$WB_TMP/vmm.log" 2>&1 &
vpid=$!
for _ in $(seq 1 100); do kill -0 "$vpid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$vpid" 2>/dev/null; then
  kill -KILL "$vpid"
  fail "--backend cuda --cuda-slab vmm started without a usable GPU"
else
  wait "$vpid"
  rc=$?
  [ "$rc" != 0 ] || fail "--backend cuda --cuda-slab vmm exited 0 without a GPU"
  grep -qE "no usable GPU|this build has no cuda backend|the cuda backend needs (the|a newer) NVIDIA driver" "$WB_TMP/vmm.log" ||
    fail "--backend cuda --cuda-slab vmm gave no reason: $(cat "$WB_TMP/vmm.log")"
fi
start_broker --backend auto --cuda-slab vmm
grep -q "event=backend .*backend=host requested=auto" "$BROKER_LOG" ||
  fail "auto with --cuda-slab vmm did not fall back to host: $(grep backend "$BROKER_LOG")"
stop_broker

# Without the NVIDIA driver, --backend cuda says that it needs it (the CUDA
# runtime alone calls the driver "insufficient"), and auto falls back to
# host saying why.
if ! "$WBROKERD" --version | grep -q "^backends: .*cuda"; then
  log "the cuda-without-driver message is not checked: this build has no cuda backend"
elif [ -e /proc/driver/nvidia/version ] || "$PYTHON" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
  log "the cuda-without-driver message is not checked: an NVIDIA driver is present here"
else
  "$WBROKERD" --backend cuda --socket "$WB_TMP/cuda.sock" >"$WB_TMP/cuda.out" 2>"$WB_TMP/cuda.err"
  rc=$?
  [ "$rc" = 1 ] || fail "--backend cuda without a driver: exit status $rc, not 1"
  grep -qx "wbrokerd: the cuda backend needs the NVIDIA driver: its library libcuda.so.1 cannot be loaded (.*); install the driver, or use --backend host" "$WB_TMP/cuda.err" ||
    fail "--backend cuda without a driver: $(cat "$WB_TMP/cuda.err")"
  grep -q "insufficient" "$WB_TMP/cuda.err" && fail "the message still calls the driver insufficient: $(cat "$WB_TMP/cuda.err")"
  start_broker --backend auto
  grep -q 'event=backend backend=host requested=auto reason="the cuda backend needs the NVIDIA driver: ' "$BROKER_LOG" ||
    fail "auto without a driver: $(grep event=backend "$BROKER_LOG")"
  stop_broker
fi
