#!/usr/bin/env bash
# Versions of a model (wbctl rollout, rollback):
# * a rollout loads version 2 beside version 1 and makes it current; new
#   leases get it, a lease on version 1 keeps it (wbctl leases shows the
#   version), version 1 drains and is freed (its slab gone from /dev/shm)
#   at its last release;
# * a rollback makes the draining version current again while it exists,
#   and is refused once it is gone;
# * --max-versions: a third version beside two is refused, naming them;
# * a failed rollout (a missing file, a tensor past the end of its file)
#   leaves the current version serving and is listed as failed;
# * a load of an existing name points to rollout; an unload ends every
#   version.
source "$(dirname "$0")/lib.sh"
HOST_SLAB=shm

make_model "$WB_TMP/v1.safetensors" 5 1 >/dev/null
make_model "$WB_TMP/v2.safetensors" 5 2 >/dev/null
make_model "$WB_TMP/v3.safetensors" 5 3 >/dev/null
start_broker_with_demo "$WB_TMP/v1.safetensors"

versions() { # versions NAME: "VERSION:STATE:LEASES ..." from wbctl models --json
  ctl models --json | json "' '.join('%d:%s:%d' % (v['version'], v['state'], v['leases']) for m in d if m['name'] == '$1' for v in m['versions'])"
}
slabs() { ls /dev/shm/wb-"$BROKER_PID"-* 2>/dev/null | wc -l; }

[ "$(versions demo)" = "1:current:0" ] || fail "after the load: $(versions demo)"
shm_before=$(slabs)

# A worker holds version 1.
start_worker w1 --model demo
w1=$LAST_PID
[ "$(lease_field "$w1" version)" = 1 ] || fail "the lease of w1 is not on version 1: $(ctl leases --json)"

ctl rollout demo "$WB_TMP/v2.safetensors" >"$WB_TMP/rollout.out" 2>&1 || fail "rollout: $(cat "$WB_TMP/rollout.out")"
grep -q "^rollout: version 2 is current, version 1 drains (freed at its last lease)$" "$WB_TMP/rollout.out" ||
  fail "rollout printed: $(cat "$WB_TMP/rollout.out")"
grep -Eq "^demo +2 +current +host " "$WB_TMP/rollout.out" || fail "rollout's table: $(cat "$WB_TMP/rollout.out")"
[ "$(versions demo)" = "1:draining:1 2:current:0" ] || fail "after the rollout: $(versions demo)"
ctl models >"$WB_TMP/models.out"
grep -Eq "^NAME +VERSION +STATE +BACKEND " "$WB_TMP/models.out" || fail "models header: $(cat "$WB_TMP/models.out")"
grep -Eq "^demo +1 +draining +host .* 1 +shm " "$WB_TMP/models.out" || fail "models v1 row: $(cat "$WB_TMP/models.out")"
grep -Eq "^demo +2 +current +host " "$WB_TMP/models.out" || fail "models v2 row: $(cat "$WB_TMP/models.out")"
[ "$(ctl models --json | json "[(m['version'], m['state'], m['current']) for m in d]")" = '[[2, "ready", true]]' ] ||
  fail "the name's top-level fields are not its current version's: $(ctl models --json)"
grep -q "event=model_rollout_start model=demo version=2 current=1 " "$BROKER_LOG" || fail "no rollout_start line"
grep -q "event=model_version_ready model=demo version=2 previous=1 " "$BROKER_LOG" || fail "no version_ready line"
grep -q "event=model_version_current model=demo version=2 previous=1$" "$BROKER_LOG" || fail "no version_current line"
grep -q "event=model_version_draining model=demo version=1 leases=1 current=2$" "$BROKER_LOG" || fail "no draining line"

# New leases get version 2; w1 keeps version 1 and its bytes.
start_worker w2 --model demo
w2=$LAST_PID
[ "$(lease_field "$w2" version)" = 2 ] || fail "a new lease is not on version 2"
[ "$(lease_field "$w1" version)" = 1 ] || fail "w1's lease changed version"
ctl leases >"$WB_TMP/leases.out"
grep -Eq "^ID +MODEL +VERSION +PID " "$WB_TMP/leases.out" || fail "leases header: $(head -1 "$WB_TMP/leases.out")"
grep -Eq "^[0-9a-f]{8} +demo +1 +$w1 " "$WB_TMP/leases.out" || fail "w1's row: $(cat "$WB_TMP/leases.out")"
[ "$(stat_field versions_draining)" = 1 ] || fail "versions_draining is $(stat_field versions_draining)"

# A rollback while version 1 exists: 1 is current again, 2 drains.
ctl rollback demo >"$WB_TMP/rollback.out" 2>&1 || fail "rollback: $(cat "$WB_TMP/rollback.out")"
grep -q "^rollback: version 1 is current, version 2 drains" "$WB_TMP/rollback.out" ||
  fail "rollback printed: $(cat "$WB_TMP/rollback.out")"
[ "$(versions demo)" = "1:current:1 2:draining:1" ] || fail "after the rollback: $(versions demo)"
grep -q "event=model_rollback model=demo version=1 previous=2 " "$BROKER_LOG" || fail "no rollback line"
# And forward again: version 2 is the newer, so a rollout makes version 3.
kill -TERM "$w2"
wait_exit "$w2"
wait_for no_lease "$w2" || fail "w2's lease stayed"
# Version 2 drained and was freed at its last release.
[ "$(versions demo)" = "1:current:1" ] || fail "version 2 was not freed: $(versions demo)"
grep -q "event=model_version_freed model=demo version=2 current=1 " "$BROKER_LOG" || fail "no version_freed line"
ctl rollback demo >"$WB_TMP/rb2.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "a rollback with no earlier version exited $rc"
[ "$(cat "$WB_TMP/rb2.out")" = "wbctl: rollback: model 'demo' has no version before version 1 left to roll back to: a version that is no longer current lives only while leases hold it" ] ||
  fail "rollback refusal: $(cat "$WB_TMP/rb2.out")"

ctl rollout demo "$WB_TMP/v3.safetensors" >/dev/null 2>&1 || fail "the rollout of version 3 failed"
[ "$(versions demo)" = "1:draining:1 3:current:0" ] || fail "numbering: $(versions demo)"

# --max-versions (2): a third version beside 1 (draining) and 3 is refused.
ctl rollout demo "$WB_TMP/v2.safetensors" >"$WB_TMP/max.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "a rollout over --max-versions exited $rc"
[ "$(cat "$WB_TMP/max.out")" = "wbctl: rollout: model 'demo' already has 2 versions, the limit (--max-versions 2): version 1 draining (1 lease), version 3 current (0 leases); a version that is no longer current is freed at its last lease (\`wbctl leases demo\` shows them)" ] ||
  fail "max-versions refusal: $(cat "$WB_TMP/max.out")"

# Version 1 is freed at w1's release: its slab leaves /dev/shm.
kill -TERM "$w1"
wait_exit "$w1"
[ "$EXIT_RC" = 0 ] || fail "w1 exited $EXIT_RC (a verification failed?)"
wait_for no_lease "$w1" || fail "w1's lease stayed"
[ "$(versions demo)" = "3:current:0" ] || fail "version 1 was not freed: $(versions demo)"
[ "$(slabs)" = "$shm_before" ] || fail "slabs in /dev/shm: $(slabs), $shm_before with one version"

# A failed rollout leaves the current version serving, listed as failed.
ctl rollout demo "$WB_TMP/missing.safetensors" >"$WB_TMP/bad.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "a rollout of a missing file exited $rc"
grep -q "no such file" "$WB_TMP/bad.out" || fail "missing file: $(cat "$WB_TMP/bad.out")"
"$PYTHON" - "$WB_TMP/short.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "late": {"dtype": "F32", "shape": [64], "data_offsets": [16, 272]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"\0" * 16)
PY
ctl rollout demo "$WB_TMP/short.safetensors" >"$WB_TMP/short.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "a rollout of a short file exited $rc"
grep -q "late" "$WB_TMP/short.out" || fail "the error does not name the tensor: $(cat "$WB_TMP/short.out")"
[ "$(versions demo)" = "3:current:0 5:failed:0" ] || fail "after the failed rollouts: $(versions demo)"
ctl models >"$WB_TMP/failed.out"
grep -Eq "^demo +5 +failed " "$WB_TMP/failed.out" || fail "the failed version's row: $(cat "$WB_TMP/failed.out")"
grep -q "^demo failed to load: " "$WB_TMP/failed.out" || fail "no failure line: $(cat "$WB_TMP/failed.out")"
start_worker w3 --model demo --hold 0
wait_exit "$LAST_PID"
[ "$EXIT_RC" = 0 ] || fail "the current version does not serve after a failed rollout"
[ "$(stat_field rollouts_total)" = 2 ] || fail "rollouts_total: $(stat_field rollouts_total)"
[ "$(stat_field rollouts_failed)" = 3 ] || fail "rollouts_failed: $(stat_field rollouts_failed)"
[ "$(stat_field rollbacks_total)" = 1 ] || fail "rollbacks_total: $(stat_field rollbacks_total)"

# A load of the name is refused and points to rollout; a rollout of a
# name that does not exist is refused.
ctl load demo "$WB_TMP/v1.safetensors" >"$WB_TMP/load.out" 2>&1 && fail "a load of an existing name was granted"
grep -qF "a model named 'demo' already exists (version 3 is current); \`wbctl rollout demo PATH\` loads a new version of it" "$WB_TMP/load.out" ||
  fail "load refusal: $(cat "$WB_TMP/load.out")"
ctl rollout nothere "$WB_TMP/v1.safetensors" >"$WB_TMP/none.out" 2>&1 && fail "a rollout of no model was granted"
grep -qF "no model named 'nothere': a rollout needs a current version" "$WB_TMP/none.out" ||
  fail "rollout of no model: $(cat "$WB_TMP/none.out")"

# An unload ends every version (the failed record too).
ctl unload demo >/dev/null || fail "unload failed"
model_absent demo || fail "demo is still listed: $(ctl models --json)"
stop_broker
