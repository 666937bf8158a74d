#!/usr/bin/env bash
# Each configured limit, through the daemon's options, against real
# processes: the refusal is WB_ELIMIT with a message naming the limit and
# its value, nothing is left half-done, the broker keeps serving, and the
# limit_refusals counter counts. Bad option values are usage errors.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 4 >/dev/null
make_model "$WB_TMP/five.safetensors" 5 9 >/dev/null

# wide_model PATH N NAMELEN [FAKE_LEN]: N U8 tensors with NAMELEN-character
# names; FAKE_LEN, when given, replaces the header length field.
wide_model() {
  "$PYTHON" - "$@" <<'PY'
import json, struct, sys
path, n, namelen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
header = {}
for i in range(n):
    name = ("t%d_" % i).ljust(namelen, "x")
    header[name] = {"dtype": "U8", "shape": [4], "data_offsets": [4 * i, 4 * i + 4]}
raw = json.dumps(header).encode()
length = int(sys.argv[4]) if len(sys.argv) > 4 else len(raw)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", length) + raw + bytes(range(4)) * n)
PY
}

# ctl_refused NAME WANT ARGS...: wbctl ARGS must exit 1 with WANT on stderr.
ctl_refused() {
  local name=$1 want=$2
  shift 2
  ctl "$@" >"$WB_TMP/$name.out" 2>"$WB_TMP/$name.err"
  local rc=$?
  [ "$rc" = 1 ] || fail "$name: wbctl $* exited with $rc, expected 1: $(cat "$WB_TMP/$name.err")"
  grep -qF -- "$want" "$WB_TMP/$name.err" || fail "$name: expected '$want', got: $(cat "$WB_TMP/$name.err")"
}

start_broker --model "demo=$WB_TMP/demo.safetensors" --max-leases-per-client 3 --max-models 2 \
  --max-tensors 4 --max-message-bytes 8192 --max-header-bytes 2000
wait_for model_ready demo || fail "model demo did not become ready"
grep -q "event=limits max_leases_per_client=3 max_models=2 max_tensors=4 max_message_bytes=8192 max_header_bytes=2000" "$BROKER_LOG" ||
  fail "the broker did not log its limits"

# Leases per client: the fourth acquire of one process is refused.
"$TESTCLIENT" --socket "$SOCK" acquire-n demo 5 >"$WB_TMP/many.out" 2>"$WB_TMP/many.err"
[ $? = 1 ] || fail "acquire-n should stop at the limit"
grep -qx "acquired 3" "$WB_TMP/many.out" || fail "leases per client: $(cat "$WB_TMP/many.out")"
grep -Eq "^error=.*pid [0-9]+ already holds 3 leases, the limit \(--max-leases-per-client 3\) \(WB_ELIMIT\)$" "$WB_TMP/many.out" ||
  fail "leases per client message: $(cat "$WB_TMP/many.out")"
# Another process is not affected, and the first one's leases are gone.
start_worker w --model demo --hold 0
wait_exit "$LAST_PID"
[ "$EXIT_RC" = 0 ] || fail "another process could not acquire"
wait_for all_active 0 || fail "leases remain: $(ctl leases --json)"

# Tensors per model: a five-tensor checkpoint against --max-tensors 4.
ctl_refused tensors "model 'five' has 5 tensors, over the limit of 4 (--max-tensors)" \
  load five "$WB_TMP/five.safetensors"
model_absent five || fail "the refused model is listed"

# Message size: a lease of 12 tensors with 700-character names would not
# fit in 8192 bytes... but its header does not fit 2000 bytes either, so
# first the header limit, then (with short enough headers) the lease size.
wide_model "$WB_TMP/wide.safetensors" 12 700
ctl_refused header "$WB_TMP/wide.safetensors: the safetensors header is" load wide "$WB_TMP/wide.safetensors"
grep -qF "over the limit of 2000 (--max-header-bytes)" "$WB_TMP/header.err" || fail "header: $(cat "$WB_TMP/header.err")"
stop_broker

start_broker --model "demo=$WB_TMP/demo.safetensors" --max-models 2 --max-message-bytes 8192
wait_for model_ready demo || fail "model demo did not become ready"
ctl_refused message "bytes, over the 8192-byte message limit (--max-message-bytes)" \
  load wide "$WB_TMP/wide.safetensors"
grep -qF "a lease of model 'wide' would take" "$WB_TMP/message.err" || fail "message: $(cat "$WB_TMP/message.err")"
model_absent wide || fail "the refused model is listed"
# An incoming message over the limit (the request limit is never above the
# message limit): the broker drops the sender's connection on the frame
# header, and serves the next client.
"$TESTCLIENT" --socket "$SOCK" --wait 1000 big 9000 >"$WB_TMP/big.out" 2>&1
[ $? = 4 ] || fail "an oversized message got an answer: $(cat "$WB_TMP/big.out")"
wait_for grep -q "event=peer_disconnected reason=limit .*over the 8192-byte request limit" "$BROKER_LOG" ||
  fail "no peer_disconnected line for the oversized message"
"$TESTCLIENT" --socket "$SOCK" big 100 ff >"$WB_TMP/small.out" 2>&1
grep -q "^status=-6 " "$WB_TMP/small.out" || fail "the next client was not answered: $(cat "$WB_TMP/small.out")"

# Models: the third is refused until one is unloaded.
ctl load five "$WB_TMP/five.safetensors" >/dev/null 2>&1 || fail "the second model did not load"
ctl_refused models "the broker already holds 2 models, the limit (--max-models 2); unload one first" \
  load again "$WB_TMP/demo.safetensors"
ctl unload five >/dev/null 2>&1 || fail "unload five failed"
wait_for model_absent five || fail "five was not freed"
ctl load again "$WB_TMP/demo.safetensors" >/dev/null 2>&1 || fail "a model could not load below the limit"
[ "$(stat_field limit_refusals)" -ge 2 ] || fail "limit_refusals does not count: $(ctl stats --json)"
stop_broker

# The default header limit is the safetensors one, 100,000,000 bytes:
# judged from the length field alone.
wide_model "$WB_TMP/huge.safetensors" 1 4 100000001
start_broker
ctl_refused huge "$WB_TMP/huge.safetensors: the safetensors header is 100000001 bytes, over the limit of 100000000 (--max-header-bytes)" \
  load huge "$WB_TMP/huge.safetensors"
alive "$BROKER_PID" || fail "the broker died"
stop_broker

# Bad values are usage errors that name the option.
for bad in "--max-message-bytes 100" "--max-message-bytes 67108865" "--max-models 0" \
  "--max-tensors -1" "--max-leases-per-client x" "--max-header-bytes 100000001" \
  "--max-shards 0" "--max-shards 1000001"; do
  # shellcheck disable=SC2086
  "$WBROKERD" --socket "$WB_TMP/unused.sock" $bad >"$WB_TMP/bad.out" 2>"$WB_TMP/bad.err"
  rc=$?
  [ "$rc" = 2 ] || fail "wbrokerd $bad exited with $rc, expected 2"
  grep -qF -- "${bad%% *}" "$WB_TMP/bad.err" || fail "wbrokerd $bad: $(cat "$WB_TMP/bad.err")"
done
