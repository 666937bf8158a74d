#!/usr/bin/env bash
# A model that cannot be loaded at start does not stop the broker: it serves
# the others and lists that one as failed with its error; a lease of it is
# refused with that error; `wbctl unload` removes the record and `wbctl
# load` of its name replaces it. With --require-all-models (or its
# configuration key) the broker exits as it always did.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 7 >/dev/null || fail "cannot write the test model"
LOST=$WB_TMP/absent.safetensors
WHY="no such file: $LOST"
HOST_SLAB=shm

start_broker --model "demo=$WB_TMP/demo.safetensors" --model "lost=$LOST"
wait_for model_ready demo || fail "demo did not become ready beside a failed preload"
[ "$(model_state lost)" = failed ] || fail "lost is $(model_state lost), not failed"
[ "$(ctl models --json | json "next(m['error'] for m in d if m['name'] == 'lost')")" = "$WHY" ] ||
  fail "the failed model's error: $(ctl models --json)"
ctl models >"$WB_TMP/models.out" || fail "wbctl models failed"
grep -q "^lost  *1  *failed  *host " "$WB_TMP/models.out" || fail "wbctl models: $(cat "$WB_TMP/models.out")"
grep -qxF "lost failed to load: $WHY" "$WB_TMP/models.out" ||
  fail "wbctl models does not say why: $(cat "$WB_TMP/models.out")"
grep -qF "event=preload_failed model=lost error=\"$WHY\" listed=failed" "$BROKER_LOG" ||
  fail "no preload_failed line: $(grep -E 'preload|model_load' "$BROKER_LOG")"
[ "$(ctl stats --json | json "(d['models'], d['loads_total'], d['loads_failed'], d['loads_in_progress'])")" = "(2, 2, 1, 0)" ] ||
  fail "stats with a failed model: $(ctl stats --json)"

# Serving: the good model leases, the failed one refuses with its error.
start_worker w1 --model demo
"$TESTCLIENT" --socket "$SOCK" acquire-n lost 1 >"$WB_TMP/acq.out" 2>"$WB_TMP/acq.err"
rc=$?
[ "$rc" = 1 ] || fail "an acquire of the failed model exited $rc, not 1"
grep -qxF "error=acquire 'lost': model 'lost' failed to load: $WHY (an administrator may load it again or unload it) (WB_ESTATE)" \
  "$WB_TMP/acq.out" || fail "the failed model's acquire: $(cat "$WB_TMP/acq.out" "$WB_TMP/acq.err")"

# The load of its name is the retry: a failure keeps the record (with the
# new error), a success replaces it.
ctl load lost "$WB_TMP/still-absent.safetensors" >/dev/null 2>"$WB_TMP/retry.err"
[ $? = 1 ] || fail "a failing retry did not exit 1"
[ "$(ctl models --json | json "[(m['state'], m['error']) for m in d if m['name'] == 'lost'] == [('failed', 'no such file: $WB_TMP/still-absent.safetensors')]")" = True ] ||
  fail "after a failing retry: $(ctl models --json)"
ctl load lost "$WB_TMP/demo.safetensors" >"$WB_TMP/retry.out" 2>"$WB_TMP/retry.err" ||
  fail "the retry failed: $(cat "$WB_TMP/retry.err")"
model_ready lost || fail "lost is $(model_state lost) after the retry"
[ "$(ctl models --json | json "len([m for m in d if m['name'] == 'lost'])")" = 1 ] || fail "lost is listed twice"
start_worker w2 --model lost

# An unload removes a failed record.
stop_broker
start_broker --model "demo=$WB_TMP/demo.safetensors" --model "lost=$LOST"
wait_for model_ready demo || fail "demo did not become ready"
ctl unload lost >"$WB_TMP/unload.out" 2>"$WB_TMP/unload.err" || fail "unload of the failed record: $(cat "$WB_TMP/unload.err")"
[ "$(cat "$WB_TMP/unload.out")" = freed ] || fail "unload of the failed record printed $(cat "$WB_TMP/unload.out")"
model_absent lost || fail "lost is still listed after its unload"
"$TESTCLIENT" --socket "$SOCK" acquire-n lost 1 >"$WB_TMP/acq.out" 2>&1
grep -qF "no model named 'lost'" "$WB_TMP/acq.out" || fail "after the unload: $(cat "$WB_TMP/acq.out")"
stop_broker

# Every preload failed: the broker still serves (and lists them).
start_broker --model "lost=$LOST"
[ "$(model_state lost)" = failed ] || fail "a lone failed preload is $(model_state lost)"
stop_broker

# --require-all-models: today's exit and message, on the command line and
# from the configuration file's key (the message names the path line).
"$WBROKERD" --backend host --socket "$SOCK" --require-all-models --model "demo=$WB_TMP/demo.safetensors" \
  --model "lost=$LOST" >"$WB_TMP/all.out" 2>"$WB_TMP/all.err"
rc=$?
[ "$rc" = 1 ] || fail "--require-all-models with a missing model exited $rc, not 1"
tail -n 1 "$WB_TMP/all.err" | grep -qxF "wbrokerd: cannot load model 'lost': $WHY" ||
  fail "--require-all-models said: $(tail -n 1 "$WB_TMP/all.err")"
[ ! -e "$SOCK" ] || fail "the broker that could not start left its socket"
cat >"$WB_TMP/broker.conf" <<EOF
[broker]
backend = host
require_all_models = true

[model lost]
path = $LOST
EOF
"$WBROKERD" --config "$WB_TMP/broker.conf" --socket "$SOCK" >"$WB_TMP/conf.out" 2>"$WB_TMP/conf.err"
rc=$?
[ "$rc" = 1 ] || fail "require_all_models = true with a missing model exited $rc, not 1"
tail -n 1 "$WB_TMP/conf.err" | grep -qxF "wbrokerd: $WB_TMP/broker.conf:6: cannot load model 'lost': $WHY" ||
  fail "require_all_models = true said: $(tail -n 1 "$WB_TMP/conf.err")"
"$WBROKERD" --help >"$WB_TMP/help.out" || fail "--help failed"
grep -q -- "--require-all-models" "$WB_TMP/help.out" || fail "--help does not name --require-all-models"
