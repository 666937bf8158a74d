#!/usr/bin/env bash
# Publishing from a live process on the host backend, with real processes:
# a raw peer (version_peer.py publish) begins a publish, sends its bytes as
# a memfd on the descriptor channel and commits; the broker copies them
# into the new version's slab and makes it current.
#
#   a full publish       the new version current, its bytes the producer's
#                        (read through a lease), checksums verified by a
#                        worker, `wbctl models` showing who published it
#   a partial publish    the tensors named change, the others kept
#   refusals             a wrong shape, a name not in the model (with the
#                        nearest name), a missing tensor, a non-publisher
#   an abort             the reserved version gone, the current untouched
#   a producer killed    after its begin and after its memfd: nothing of the
#                        publish left (no record, the broker's descriptors
#                        back to what they were), the current untouched
#   --publisher-uid      lets a non-administrator publish
#   workers following    a worker follows the model while updates arrive
source "$(dirname "$0")/lib.sh"

need_nobody
# Other uids run the peer too: a system python, the peer where they can
# read it, the socket where they can reach it (its directory's group,
# 65534, which the non-publisher uid 4242 has too).
PY=/usr/bin/python3
"${NOBODY[@]}" "$PY" -c "import sys" 2>/dev/null || skip "uid 65534 cannot run $PY"
chmod 0711 "$WB_TMP"
mkdir -m 0755 "$WB_TMP/py"
mkdir "$WB_TMP/run"
chgrp 65534 "$WB_TMP/run"
chmod 2750 "$WB_TMP/run"
cp "$(dirname "$0")"/zmtp_peer.py "$(dirname "$0")"/version_peer.py "$WB_TMP/py/"
chmod 0644 "$WB_TMP"/py/*.py
PEER=$WB_TMP/py/version_peer.py
SOCK=$WB_TMP/run/broker.sock
export WB_SOCKET=$SOCK
make_model "$WB_TMP/m.safetensors" 3 1 >/dev/null
"$PYTHON" - "$WB_TMP/w.safetensors" <<'PY' || fail "cannot write the test file"
import json, struct, sys
header, data = {}, b""
for name, n, v in (("a.weight", 4, 1.0), ("b.bias", 3, 2.0)):
    raw = struct.pack("<%df" % n, *([v] * n))
    header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY

start_broker --model "w=$WB_TMP/w.safetensors" --publisher-uid 65534 --allow-uid 65534,4242 \
  --max-versions 8
wait_for model_ready w || fail "w did not become ready"

publish() { "$PY" "$PEER" publish "$SOCK" "$@"; }
# dump NAME: the tensors of the current version as a lease reads them.
dump() {
  # The child truncates the file only once it runs: the last dump's "end"
  # must not be read as this one's.
  rm -f "$WB_TMP/dump.txt"
  "$TESTCLIENT" --socket "$SOCK" acquire-dump "$1" >"$WB_TMP/dump.txt" 2>&1 &
  local p=$!
  wait_for grep -qx end "$WB_TMP/dump.txt"
  kill -TERM "$p"
  wait "$p"
  sed -n '2,/^end$/p' "$WB_TMP/dump.txt"
}
F4=0000a0400000a0400000a0400000a040 # 5.0 x 4

# A full publish.
out=$(publish w a.weight:F32:4:5,b.bias:F32:3:6) || fail "publish failed: $out"
grep -q "commit status=0 version=2 previous=1 copied=28 kept=0" <<<"$out" || fail "commit: $out"
d=$(dump w)
grep -qx "a.weight $F4" <<<"$d" || fail "a.weight is not the producer's bytes: $d"
grep -qx "b.bias 0000c0400000c0400000c040" <<<"$d" || fail "b.bias: $d"
# The checksums come from the checker after the version is current.
checksums_ready() {
  [ "$(ctl models --json | json "[x['checksums'] for x in d if x['name'] == 'w' and x['current']][0]")" = ready ]
}
WAIT_SECS=10 wait_for checksums_ready || fail "the checksums of version 2 never came: $(ctl models -o wide)"
grep -q "event=publish_checksums model=w version=2 tensors=2 state=ready" "$BROKER_LOG" ||
  fail "no checksums event: $(grep publish_checksums "$BROKER_LOG")"
"$WORKER" --socket "$SOCK" --model w --hold 0 >"$WB_TMP/verify.out" 2>&1 ||
  fail "a worker did not verify the published version: $(cat "$WB_TMP/verify.out")"
m=$(ctl models --json)
[ "$(json "[[x['published_by_pid'] > 0, x['published_by_uid'], x['checksums']] for x in d if x['name'] == 'w' and x['current']][0]" <<<"$m")" = '[true, 0, "ready"]' ] ||
  fail "wbctl models does not show the publisher: $m"
ctl models -o wide | grep -q "published by pid" || fail "no SOURCE column: $(ctl models -o wide)"
[ "$(stat_field publishes_total)" = 1 ] || fail "publishes_total: $(stat_field publishes_total)"

# A partial publish: a.weight changes, b.bias is kept.
out=$(publish w a.weight:F32:4:9 partial) || fail "partial publish failed: $out"
grep -q "version=3 previous=2 copied=16 kept=12" <<<"$out" || fail "partial commit: $out"
d=$(dump w)
grep -qx "a.weight 00001041000010410000104100001041" <<<"$d" || fail "a.weight after partial: $d"
grep -qx "b.bias 0000c0400000c0400000c040" <<<"$d" || fail "b.bias not kept: $d"
# b.bias is kept by borrowing version 2's bytes (its checksums were known),
# not by a copy: the lease lists version 2's slab after version 3's own.
kept=$(ctl models --json | json "[[m['shared_tensors'], m['shared_bytes']] for m in d if m['name'] == 'w' and m['current']][0]")
[ "$kept" = "[1, 12]" ] || fail "partial publish: [shared_tensors, shared_bytes] is $kept, expected [1, 12]"

# Refusals, each naming the tensor.
out=$(publish w a.weight:F32:5:1,b.bias:F32:3:1) && fail "a wrong shape was accepted"
grep -q "tensor 'a.weight': shape \[5\] differs from version 3's \[4\]" <<<"$out" || fail "$out"
out=$(publish w a.weigth:F32:4:1 partial) && fail "an unknown name was accepted"
grep -q "a.weigth is not in model 'w'.*did you mean 'a.weight'" <<<"$out" || fail "$out"
out=$(publish w a.weight:F32:4:1) && fail "a missing tensor was accepted"
grep -q "1 missing, the first 'b.bias'" <<<"$out" || fail "$out"
out=$(setpriv --reuid 4242 --regid 65534 --clear-groups "$PY" "$PEER" publish "$SOCK" w \
  a.weight:F32:4:1 partial 2>&1) && fail "a non-publisher published"
grep -q "status=-" <<<"$out" && grep -q "publish" <<<"$out" || fail "non-publisher: $out"
grep -q "uid 4242" <<<"$out" || fail "the refusal does not name the uid: $out"

# --publisher-uid lets uid 65534 publish (not a new model: that is a load).
out=$("${NOBODY[@]}" "$PY" "$PEER" publish "$SOCK" w a.weight:F32:4:3 partial) ||
  fail "a listed publisher was refused: $out"
grep -q "version=4 previous=3" <<<"$out" || fail "$out"
out=$("${NOBODY[@]}" "$PY" "$PEER" publish "$SOCK" fresh x:F32:2:1) &&
  fail "a publisher made a new model"

fds() { ls "/proc/$BROKER_PID/fd" | wc -l; }
base_fds=$(fds)
cur_dump=$(dump w)

# An abort.
out=$(publish w a.weight:F32:4:7,b.bias:F32:3:7 abort) || fail "abort failed: $out"
grep -q "abort status=0" <<<"$out" || fail "$out"
[ "$(dump w)" = "$cur_dump" ] || fail "the abort changed the current version"

# A producer SIGKILLed after its begin, then after sending its memfd.
for when in hold-begin hold-fd; do
  spawn "prod-$when" "$PY" "$PEER" publish "$SOCK" w a.weight:F32:4:8,b.bias:F32:3:8 "$when"
  pid=$LAST_PID
  wait_for output_has "prod-$when" holding || fail "the producer ($when) did not get there"
  loading_versions() {
    ctl models --json | json "len([v for x in d if x['name'] == 'w' for v in x.get('versions', [x]) if v['state'] == 'loading'])"
  }
  [ "$(loading_versions)" = 1 ] ||
    fail "the reserved version is not listed loading: $(ctl models --json) $(cat "$WB_TMP/prod-$when.out")"
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  no_loading() { [ "$(loading_versions)" = 0 ]; }
  wait_for no_loading || fail "the reserved version outlived its producer ($when)"
  wait_for grep -q "event=publish_aborted.*reason=connection_closed" "$BROKER_LOG" ||
    fail "no publish_aborted"
  [ "$(dump w)" = "$cur_dump" ] || fail "the current version changed ($when)"
  fds_back() { [ "$(fds)" -le "$base_fds" ]; }
  wait_for fds_back || fail "the broker holds $(fds) descriptors, $base_fds before ($when)"
done
[ "$(stat_field publishes_failed)" -ge 3 ] || fail "publishes_failed: $(stat_field publishes_failed)"

# A worker holding a version (and verifying its bytes every 20 ms) while
# updates arrive: the version it holds never changes under it.
spawn follower "$WORKER" --socket "$SOCK" --model w --verify-every 20
sleep 0.3
out=$(publish w a.weight:F32:4:10 partial commits=5) || fail "repeated publishes failed: $out"
[ "$(grep -c "commit status=0" <<<"$out")" = 5 ] || fail "$out"
alive "$LAST_PID" || fail "the worker died while the model changed: $(cat "$WB_TMP/follower.err")"
kill -TERM "$LAST_PID"
wait_exit "$LAST_PID"
[ "$EXIT_RC" = 0 ] || fail "the worker exited $EXIT_RC: $(cat "$WB_TMP/follower.err")"

# A new model by an administrator.
out=$(publish fresh x:F32:2x2:3) || fail "a new model's publish failed: $out"
grep -q "version=1 previous=0 copied=16" <<<"$out" || fail "$out"
dump fresh | grep -qx "x 00004040000040400000404000004040" || fail "fresh: $(dump fresh)"
stop_broker
