#!/usr/bin/env bash
# The configuration file: the shipped example passes --check-config; typos,
# bad values and unknown sections stop the broker with exit status 78 and
# FILE:LINE in the message (wrong flags stay exit status 2); flags override
# the file while the file's other settings and models take effect; and every
# long option of wbrokerd is a configuration key, in --help and in the man
# page (the option table is read from broker/options.c, so a new option that is
# not documented fails here); --backend cuda without the NVIDIA driver says so.
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

# The example configuration is valid as shipped.
check_config "$EXAMPLE"
[ "$EXIT_RC" = 0 ] || fail "--check-config of deploy/wbroker.conf exited $EXIT_RC: $(cat "$WB_TMP/check.err")"
grep -qx "valid" "$WB_TMP/check.out" || fail "--check-config did not say valid"
grep -qx "socket: /run/wbroker/broker.sock" "$WB_TMP/check.out" || fail "unexpected socket: $(cat "$WB_TMP/check.out")"
grep -qx "model: base path=/var/lib/wbroker/models/base/model.safetensors devices=all (file)" "$WB_TMP/check.out" ||
  fail "the example's model base is not listed: $(cat "$WB_TMP/check.out")"
grep -qx "metrics: 127.0.0.1:9464" "$WB_TMP/check.out" || fail "the example's metrics address is not listed"
[ ! -s "$WB_TMP/check.err" ] || fail "--check-config printed on stderr: $(cat "$WB_TMP/check.err")"

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
[ "$(json "d['heartbeat_ms'], d['stale_ms'], d['socket']" <<<"$listen")" = "('100', '600', '$SOCK')" ] ||
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
grep -qx "backend: auto cuda-slab=vmm host-slab=memfd" "$WB_TMP/check.out" ||
  fail "--check-config does not show the slab transports: $(cat "$WB_TMP/check.out")"
check_config "$WB_TMP/vmm.conf" --socket "$WB_TMP/k.sock" --cuda-slab ipc
grep -qx "backend: auto cuda-slab=ipc host-slab=memfd" "$WB_TMP/check.out" ||
  fail "--cuda-slab ipc did not override the file: $(cat "$WB_TMP/check.out")"
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
