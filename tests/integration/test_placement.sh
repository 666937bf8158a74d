#!/usr/bin/env bash
# Placements on a CPU machine: --model NAME=PATH@DEVICES and a config file's
# `devices =` are parsed and checked before anything starts (a bad one is
# refused naming the text and position); the host backend keeps one copy in
# host memory whatever the placement says, logs that it ignored it, and
# serves workers; wbctl load PATH@DEVICES likewise. The cuda side of
# placements (copies per device, leases by device) runs on a GPU:
# tests/gpu/multidevice.sh.
source "$(dirname "$0")/lib.sh"

BYTES=$(make_model "$WB_TMP/demo.safetensors" 5 3)

# A bad placement on the command line: exit 2, the text and the position.
"$WBROKERD" --backend host --socket "$SOCK" --model "demo=$WB_TMP/demo.safetensors@0,x" \
  >"$WB_TMP/bad.out" 2>"$WB_TMP/bad.err"
rc=$?
[ "$rc" = 2 ] || fail "a bad placement exited $rc, not 2: $(cat "$WB_TMP/bad.err")"
grep -qF "wbrokerd: --model: model 'demo': placement '0,x': position 3: 'x' is not a device ordinal" \
  "$WB_TMP/bad.err" || fail "the bad placement's message: $(cat "$WB_TMP/bad.err")"

# In a configuration file: file and line.
printf '[model demo]\npath = %s\ndevices = 0,,1\n' "$WB_TMP/demo.safetensors" >"$WB_TMP/bad.conf"
"$WBROKERD" --config "$WB_TMP/bad.conf" --check-config >"$WB_TMP/badconf.out" 2>"$WB_TMP/badconf.err"
rc=$?
[ "$rc" = 78 ] || fail "a bad devices = exited $rc, not 78: $(cat "$WB_TMP/badconf.err")"
grep -qF "$WB_TMP/bad.conf:3: model 'demo': placement '0,,1': position 3: an empty item" \
  "$WB_TMP/badconf.err" || fail "the config's message: $(cat "$WB_TMP/badconf.err")"
printf '[model demo]\npath = %s\ndevices = all\n' "$WB_TMP/demo.safetensors" >"$WB_TMP/all.conf"
"$WBROKERD" --config "$WB_TMP/all.conf" --check-config >"$WB_TMP/all.out" 2>"$WB_TMP/all.err" ||
  fail "devices = all was refused: $(cat "$WB_TMP/all.err")"
grep -qx "model: demo path=$WB_TMP/demo.safetensors devices=all (file)" "$WB_TMP/all.out" ||
  fail "--check-config does not show the placement: $(cat "$WB_TMP/all.out")"

# The host backend: one copy in host memory, the placement ignored and said so.
start_broker --model "demo=$WB_TMP/demo.safetensors@0,1"
wait_for model_ready demo || fail "model demo did not become ready"
grep -q 'event=placement_ignored model=demo placement=0,1 reason="the host backend keeps one copy in host memory"' \
  "$BROKER_LOG" || fail "no placement_ignored line: $(grep -v debug "$BROKER_LOG" | tail -5)"
copies=$(ctl models --json | json "[(c['device'], c['uuid'], c['state']) for c in d[0]['copies']]")
[ "$copies" = '[[-1, "", "ready"]]' ] || fail "host copies: $copies"
[ "$(ctl models --json | json "d[0]['bytes']")" = "$BYTES" ] || fail "model bytes differ"
start_worker w1 --model demo
dev=$(lease_field "$LAST_PID" device)
[ "$dev" = -1 ] || fail "the host lease's device is $dev, not -1"

# A worker that names a device: host memory serves every device.
start_worker w2 --model demo --device 3
output_has w2 "model demo device -1" || fail "w2: $(cat "$WB_TMP/w2.out")"
"$WORKER" --socket "$SOCK" --model demo --device GPU-1 >"$WB_TMP/w3.out" 2>"$WB_TMP/w3.err"
rc=$?
[ "$rc" = 1 ] || fail "a malformed device UUID exited $rc, not 1"
grep -qF "'GPU-1' is not a device UUID" "$WB_TMP/w3.err" || fail "w3: $(cat "$WB_TMP/w3.err")"
"$WORKER" --socket "$SOCK" --model demo --device x >"$WB_TMP/w4.out" 2>"$WB_TMP/w4.err"
[ "$?" = 2 ] || fail "--device x was not a usage error"

# wbctl load PATH@DEVICES: checked by wbctl, ignored by the host backend.
ctl load d2 "$WB_TMP/demo.safetensors@0,,1" >"$WB_TMP/l1.out" 2>"$WB_TMP/l1.err"
rc=$?
[ "$rc" = 2 ] || fail "wbctl load with a bad placement exited $rc, not 2"
grep -qF "wbctl load: placement '0,,1': position 3: an empty item" "$WB_TMP/l1.err" ||
  fail "wbctl's placement message: $(cat "$WB_TMP/l1.err")"
ctl load d2 "$WB_TMP/demo.safetensors@all" >"$WB_TMP/l2.out" 2>"$WB_TMP/l2.err" ||
  fail "wbctl load @all failed: $(cat "$WB_TMP/l2.err")"
[ "$(ctl models --json | json "[m['path'] for m in d if m['name'] == 'd2'][0]")" = "$WB_TMP/demo.safetensors" ] ||
  fail "the placement was not cut off the path"
grep -q 'event=placement_ignored model=d2 placement=all' "$BROKER_LOG" ||
  fail "no placement_ignored line for d2"
# The table shows a host model in one row, as before.
ctl models >"$WB_TMP/models.txt" || fail "wbctl models failed"
[ "$(grep -c '^d2 ' "$WB_TMP/models.txt")" = 1 ] || fail "d2 rows: $(cat "$WB_TMP/models.txt")"
stop_broker
log "ok"
