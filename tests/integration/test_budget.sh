#!/usr/bin/env bash
# The device memory budget with a host tier (--device-memory-budget,
# --host-memory-budget: broker/tier.h), on the host backend (the "device" is
# host memory, slot -1), with checkpoints of one slab of SLAB bytes each and
# a device budget of exactly two of them:
# * a load over the budget moves the least recently used model with no
#   lease (its last acquire or release, else its load) to the host tier; a
#   load larger than the whole budget is refused and moves nothing;
# * an acquire of a model in the host tier restores it (its tensors verify;
#   wbctl models and stats count the restore), making room the same way;
# * a leased model is never moved, not even the least recently used; with
#   every model leased a load is refused, naming them;
# * wbctl sleep and wake move a model on demand; a leased one is refused;
# * with a host budget of one model, a second move evicts the older host
#   copy: that model reloads from its file and verifies; a file changed
#   since its load is refused naming the tensor, and the model stays
#   evicted until the file is as it was;
# * an unload of a model in the host tier frees its host copy;
# * a broker killed during a restore (WB_TEST_TIER_DELAY_MS): the waiting
#   client gets an error saying so at once (not at its timeout), neither a
#   hang nor a lease, and a new broker on the socket starts cleanly, loads
#   the models again and leaves none of the dead one's slabs in /dev/shm.
source "$(dirname "$0")/lib.sh"
# Named slabs in /dev/shm: a killed broker's must not stay.
HOST_SLAB=shm

# The checkpoints a..e: 4 tensors of distinct dtypes and shapes, 1.125 MiB
# in all, their bytes different in every model (no tensor is shared); big:
# one tensor of 3 MiB, more than the device budget. Prints a..e's bytes.
SLAB=$("$PYTHON" - "$WB_TMP" <<'PY'
import hashlib, json, struct, sys
out = sys.argv[1]
ARCH = [("embed.weight", "F32", [256, 256], 4), ("layers.0.mlp.up", "F16", [512, 512], 2),
        ("layers.0.norm", "U8", [256, 1024], 1), ("lm_head.weight", "BF16", [256, 256], 2)]

def write(path, tensors):
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open("%s/%s.safetensors" % (out, path), "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)
    return len(data)

for seed, name in enumerate("abcde"):
    total = write(name, [(t, dtype, shape, hashlib.shake_256(b"%d %s" % (seed, t.encode()))
                          .digest(size * shape[0] * shape[1]))
                         for t, dtype, shape, size in ARCH])
write("big", [("w", "U8", [3 << 20], bytes(3 << 20))])
print(total)
PY
)
[ "$SLAB" = 1179648 ] || fail "the checkpoints were not written (${SLAB:-nothing})"
cp "$WB_TMP/b.safetensors" "$WB_TMP/b.orig"

# worker NAME ARGS...: wb-demo-worker on the test's broker, both its streams
# in $WB_TMP/NAME.out; returns its exit status. Its acquire of a model that
# is not on its device is answered WB_EBUSY until the model is back, and
# libwbclient asks again within its timeout.
worker() {
  local name=$1
  shift
  "$WORKER" --socket "$SOCK" "$@" >"$WB_TMP/$name.out" 2>&1
}

# model_field NAME KEY: the KEY of model NAME in wbctl models --json
# ('absent' when it is not listed).
model_field() {
  ctl models --json | json "next((m['$2'] for m in d if m['name'] == '$1'), 'absent')"
}

# tiers: "NAME:TIER ..." of every model, by name.
tiers() {
  ctl models --json | json "' '.join('%s:%s' % (m['name'], m['tier']) for m in sorted(d, key=lambda m: m['name']))"
}

tiers_are() {
  [ "$(tiers)" = "$1" ]
}

# expect_tier NAME TIER [WHEN]: the model's tier, its state and bytes with
# it: on its device its slab (and maybe the host copy a restore keeps), in
# the host tier its host copy and no slab, evicted neither.
expect_tier() {
  local got
  got=$(ctl models --json |
    json "[[m['tier'], m['state'], m['slab_bytes'], m['host_bytes']] for m in d if m['name'] == '$1']")
  case $2 in
  device) [ "$got" = "[[\"device\", \"ready\", $SLAB, 0]]" ] ||
    [ "$got" = "[[\"device\", \"ready\", $SLAB, $SLAB]]" ] ;;
  host) [ "$got" = "[[\"host\", \"host\", 0, $SLAB]]" ] ;;
  evicted) [ "$got" = "[[\"evicted\", \"evicted\", 0, 0]]" ] ;;
  *) false ;;
  esac || fail "${3:+$3: }model $1: [tier, state, slab_bytes, host_bytes] is $got, expected $2"
}

# expect_tiers WHEN NAME:TIER...: expect_tier for each, and no other model.
expect_tiers() {
  local when=$1 nt
  shift
  for nt in "$@"; do
    expect_tier "${nt%%:*}" "${nt#*:}" "$when"
  done
  [ "$(tiers)" = "$*" ] || fail "$when: the models are $(tiers), expected $*"
}

# expect_stats WHEN KEY=VALUE...: fields of wbctl stats --json.
expect_stats() {
  local when=$1 keys got
  shift
  keys=$(printf "'%s'," "${@%%=*}")
  got=$(ctl stats --json | json "' '.join('%s=%s' % (k, d[k]) for k in [$keys])")
  [ "$got" = "$*" ] || fail "$when: stats say $got, expected $*"
}

# log_has TEXT: a line of the broker's log has TEXT.
log_has() {
  grep -qF -- "$1" "$BROKER_LOG"
}

# load NAME: wbctl load of $WB_TMP/NAME.safetensors; it waits until the
# model is ready, any moves to make its room done.
load() {
  ctl load "$1" "$WB_TMP/$1.safetensors" >"$WB_TMP/load.out" 2>&1 ||
    fail "wbctl load $1 failed: $(cat "$WB_TMP/load.out")"
  expect_tier "$1" device "after its load"
}

# load_refused NAME: the load of NAME is refused for the budget; its
# message is in $WB_TMP/refused.out and the model is not listed.
load_refused() {
  local rc
  ctl load "$1" "$WB_TMP/$1.safetensors" >"$WB_TMP/refused.out" 2>&1
  rc=$?
  [ "$rc" = 1 ] || fail "the load of $1 over the budget exited $rc: $(cat "$WB_TMP/refused.out")"
  grep -qF "wbctl: load: load of '$1' does not fit the memory budget of host memory: " \
    "$WB_TMP/refused.out" || fail "the refusal of $1 says: $(cat "$WB_TMP/refused.out")"
  model_absent "$1" || fail "the refused model $1 is listed: $(ctl models --json)"
}

# acquire_verified NAME: a worker leases model NAME (brought back to its
# device first when it is not there), verifies every tensor against the
# broker's checksums and releases it; the model is then on its device.
acquire_verified() {
  worker acquire --model "$1" --hold 0 ||
    fail "a worker could not lease model $1: $(cat "$WB_TMP/acquire.out")"
  grep -qx "verified 4 tensors" "$WB_TMP/acquire.out" ||
    fail "the worker of model $1 says: $(cat "$WB_TMP/acquire.out")"
  expect_tier "$1" device "after an acquire"
}

# acquire_refused NAME: a worker cannot lease model NAME (exit 1); what it
# says is in $WB_TMP/acquire.out.
acquire_refused() {
  worker acquire --model "$1" --hold 0
  local rc=$?
  [ "$rc" = 1 ] || fail "a worker of model $1 exited $rc: $(cat "$WB_TMP/acquire.out")"
  grep -q "^lease " "$WB_TMP/acquire.out" && fail "a worker got a lease on model $1"
}

# stop_holder PID: a worker holding a lease ends it (SIGTERM) with every
# verification passed.
stop_holder() {
  kill -TERM "$1"
  wait_exit "$1"
  [ "$EXIT_RC" = 0 ] || fail "the worker $1 holding a lease exited $EXIT_RC"
  wait_for no_lease "$1" || fail "the lease of worker $1 stayed: $(ctl leases --json)"
}

BUDGET=$((2 * SLAB))

# --- LRU: b, loaded after a but not used since, is the one moved.
start_broker --device-memory-budget "$((BUDGET / 1024))k"
log_has "event=memory_budget device_budgets=-1:$BUDGET host_budget=0 " ||
  fail "no memory_budget line for ${BUDGET} bytes: $(grep memory_budget "$BROKER_LOG")"
expect_stats "at the start" "device_memory_budget=$BUDGET" host_memory_budget=0 host_tier_bytes=0 \
  moved_to_host=0 evicted=0 restores=0 reloads=0 restore_failures=0
load a
load b
acquire_verified a
load c
expect_tiers "c loaded" a:device b:host c:device
log_has "event=model_tier model=b version=1 tier=moving reason=budget " || fail "no line for b's move"
log_has "event=model_tier model=b version=1 tier=host " || fail "no line for b in the host tier"
log_has "event=model_tier model=a " && fail "a, used after b, was moved: $(grep model_tier "$BROKER_LOG")"
expect_stats "b moved" "host_tier_bytes=$SLAB" moved_to_host=1 evicted=0 restores=0
ctl models >"$WB_TMP/models.out"
grep -Eq "^b +1 +host +host " "$WB_TMP/models.out" || fail "b's row: $(cat "$WB_TMP/models.out")"

# A load larger than the whole budget is refused, and moves nothing.
load_refused big
grep -qF "more than the whole budget" "$WB_TMP/refused.out" ||
  fail "the refusal of big does not say it exceeds the whole budget: $(cat "$WB_TMP/refused.out")"
expect_tiers "big refused" a:device b:host c:device
expect_stats "big refused" moved_to_host=1

# --- Restore on acquire: b comes back verified; a, now the least recently
# used (its release came before c's load), makes room.
acquire_verified b
expect_tiers "b restored" a:host b:device c:device
got=$(ctl models --json | json "[[m['restores'], m['last_restore_seconds'] > 0, m['last_restore_gbps'] > 0,
  m['last_restore_at'] > 0, m['last_used_at'] >= m['last_restore_at']] for m in d if m['name'] == 'b']")
[ "$got" = "[[1, true, true, true, true]]" ] ||
  fail "b's [restores, last_restore_seconds > 0, last_restore_gbps > 0, last_restore_at > 0," \
    "last_used_at >= last_restore_at] is $got"
[ "$(model_field c restores)" = 0 ] || fail "c, never moved, counts $(model_field c restores) restores"
log_has "event=model_tier model=b version=1 tier=restoring " || fail "no line for b's restore"
log_has "event=model_tier model=b version=1 tier=device from=host " || fail "no line for b restored"
expect_stats "b restored" moved_to_host=2 restores=1 reloads=0 restore_failures=0

# --- A leased model is never moved: c, leased before b is used again, is
# the least recently used, and b moves for a's restore instead.
start_worker holder_c --model c --hold 30
holder_c=$LAST_PID
acquire_verified b
acquire_verified a
expect_tiers "a restored beside the leased c" a:device b:host c:device
log_has "event=model_tier model=c " && fail "the leased c was moved: $(grep model_tier "$BROKER_LOG")"
[ "$(model_field c leases)" = 1 ] || fail "c lists $(model_field c leases) leases, not its holder's"
# Nothing can move with a and c leased: a load is refused, naming them.
start_worker holder_a --model a --hold 30
holder_a=$LAST_PID
load_refused d
for want in "nothing more can be moved" "'a' v1 (leased)" "'c' v1 (leased)"; do
  grep -qF "$want" "$WB_TMP/refused.out" ||
    fail "the refusal of d with every model leased lacks \"$want\": $(cat "$WB_TMP/refused.out")"
done
expect_tiers "d refused" a:device b:host c:device
# wbctl sleep refuses a leased model.
ctl sleep c >"$WB_TMP/sleep.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "wbctl sleep of the leased c exited $rc: $(cat "$WB_TMP/sleep.out")"
grep -qF "wbctl: sleep: model 'c' version 1 cannot be moved: leased" "$WB_TMP/sleep.out" ||
  fail "the sleep of the leased c says: $(cat "$WB_TMP/sleep.out")"
expect_tier c device "after a refused sleep"
stop_holder "$holder_c"
stop_holder "$holder_a"
expect_stats "the holders gone" moved_to_host=3 restores=2

# --- wbctl sleep and wake.
ctl sleep c >"$WB_TMP/sleep.out" 2>&1 || fail "wbctl sleep c failed: $(cat "$WB_TMP/sleep.out")"
grep -qx "model 'c' version 1: host (host copy 1.1 MiB)" "$WB_TMP/sleep.out" ||
  fail "wbctl sleep c says: $(cat "$WB_TMP/sleep.out")"
ctl sleep --json a >"$WB_TMP/sleep.out" 2>&1 || fail "wbctl sleep a failed: $(cat "$WB_TMP/sleep.out")"
got=$(json "[d['name'], d['tier'], d['state'], d['slab_bytes'], d['host_bytes']]" <"$WB_TMP/sleep.out")
[ "$got" = "[\"a\", \"host\", \"host\", 0, $SLAB]" ] || fail "wbctl sleep --json a printed $got"
expect_tiers "a and c asleep" a:host b:host c:host
expect_stats "a and c asleep" "host_tier_bytes=$((3 * SLAB))" moved_to_host=5
ctl wake c >"$WB_TMP/wake.out" 2>&1 || fail "wbctl wake c failed: $(cat "$WB_TMP/wake.out")"
grep -Eq "^model 'c' version 1: device \(restored in [0-9.]+ s, " "$WB_TMP/wake.out" ||
  fail "wbctl wake c says: $(cat "$WB_TMP/wake.out")"
ctl wake --json b >"$WB_TMP/wake.out" 2>&1 || fail "wbctl wake b failed: $(cat "$WB_TMP/wake.out")"
got=$(json "[d['name'], d['tier'], d['state'], d['slab_bytes'], d['restores']]" <"$WB_TMP/wake.out")
[ "$got" = "[\"b\", \"device\", \"ready\", $SLAB, 2]" ] || fail "wbctl wake --json b printed $got"
expect_tiers "b and c awake" a:host b:device c:device
acquire_verified c
acquire_verified b
expect_tiers "b and c used" a:host b:device c:device
expect_stats "b and c awake" moved_to_host=5 restores=4 evicted=0 reloads=0 restore_failures=0

# --- An unload of a model in the host tier frees its host copy; b and c
# keep theirs from their restores until their unloads.
kept=$(ctl models --json | json "sum(m['host_bytes'] for m in d if m['name'] != 'a')")
ctl unload a >/dev/null || fail "wbctl unload a failed"
wait_for model_absent a || fail "a is still listed after its unload: $(ctl models --json)"
expect_stats "a unloaded" "host_tier_bytes=$kept" "model_bytes=$((2 * SLAB))"
for m in b c; do
  ctl unload "$m" >/dev/null || fail "wbctl unload $m failed"
  wait_for model_absent "$m" || fail "$m is still listed after its unload: $(ctl models --json)"
done
expect_stats "every model unloaded" host_tier_bytes=0 model_bytes=0
stop_broker

# --- A host budget of one model: the older host copy is evicted, and an
# evicted model reloads from its file.
start_broker --device-memory-budget "$BUDGET" --host-memory-budget "$SLAB"
log_has "event=memory_budget device_budgets=-1:$BUDGET host_budget=$SLAB " ||
  fail "no memory_budget line for a host budget of $SLAB bytes: $(grep memory_budget "$BROKER_LOG")"
load a
load b
load c
load d
expect_tiers "d loaded" a:evicted b:host c:device d:device
log_has "event=model_tier model=a version=1 tier=evicted " || fail "no line for a's eviction"
expect_stats "a evicted" "host_memory_budget=$SLAB" "host_tier_bytes=$SLAB" moved_to_host=2 evicted=1 \
  reloads=0
acquire_verified a
log_has "event=model_tier model=a version=1 tier=reloading " || fail "no line for a's reload"
[ "$(model_field a restores)" = 1 ] || fail "a counts $(model_field a restores) restores after its reload"
# Its room: c moved (the least recently used), and b's host copy, older
# than c's, evicted.
expect_tiers "a reloaded" a:device b:evicted c:host d:device
expect_stats "a reloaded" "host_tier_bytes=$SLAB" moved_to_host=3 evicted=2 restores=0 reloads=1 \
  restore_failures=0

# --- A file changed since its load: b's reload is refused, naming the
# tensor, and b stays evicted.
"$PYTHON" - "$WB_TMP/b.safetensors" layers.0.norm <<'PY'
import json, struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    at = 8 + n + json.loads(f.read(n))[sys.argv[2]]["data_offsets"][0] + 1000
    f.seek(at)
    b = f.read(1)
    f.seek(at)
    f.write(bytes([b[0] ^ 0x5A]))
PY
acquire_refused b
for want in "model 'b' could not be brought back to its device" \
  "tensor 'layers.0.norm' changed in its files since it was loaded"; do
  grep -qF "$want" "$WB_TMP/acquire.out" ||
    fail "the refused reload of b does not say \"$want\": $(cat "$WB_TMP/acquire.out")"
done
expect_tier b evicted "after its refused reload"
expect_stats "b refused" reloads=1 restore_failures=1
# The file as it was: b reloads.
cp "$WB_TMP/b.orig" "$WB_TMP/b.safetensors"
acquire_verified b
expect_stats "b reloaded" reloads=2 restore_failures=1
stop_broker

# --- Every move and restore waits 1.5 s (WB_TEST_TIER_DELAY_MS).
export WB_TEST_TIER_DELAY_MS=1500
start_broker --device-memory-budget "$BUDGET"
unset WB_TEST_TIER_DELAY_MS
load a
load b
load c
expect_tiers "c loaded, slowly" a:host b:device c:device
# An unload of the one model in the host tier leaves it empty.
expect_stats "a in the host tier" "host_tier_bytes=$SLAB" moved_to_host=1
ctl unload a >/dev/null || fail "wbctl unload a failed"
wait_for model_absent a || fail "a is still listed after its unload: $(ctl models --json)"
expect_stats "a unloaded" host_tier_bytes=0 "model_bytes=$((2 * SLAB))"
load a
expect_tiers "a loaded again" a:device b:host c:device

# The broker is killed while it restores b for a client (c moved first).
spawn restorer "$WORKER" --socket "$SOCK" --model b --hold 0
restorer=$LAST_PID
wait_for tiers_are "a:device b:restoring c:host" ||
  fail "b's restore did not start after c's move: $(tiers)"
alive "$restorer" || fail "the client stopped waiting for b's restore"
old=$BROKER_PID
killed_at=$(date +%s%N)
kill -KILL "$old"
wait "$old" 2>/dev/null
# Its acquire ends in an error that says no broker listens any more: seen
# while it waits for an answer (libwbclient watches the connection every
# WB_RPC_WATCH_MS) or when it connects again for its next attempt, well
# before its timeout (WB_TIMEOUT_MS, 5 s) runs out.
wait_exit "$restorer"
waited_ms=$((($(date +%s%N) - killed_at) / 1000000))
[ "$EXIT_RC" = 1 ] || fail "the client waiting for b's restore exited $EXIT_RC"
grep -q "^lease \|^verified " "$WB_TMP/restorer.out" && fail "the client got a lease from the killed broker"
grep -Eq "wb-demo-worker: acquire 'b': (the broker went away before it answered: )?no broker listening at " \
  "$WB_TMP/restorer.err" ||
  fail "the client waiting for b's restore says: $(cat "$WB_TMP/restorer.err")"
[ "$waited_ms" -lt 3000 ] ||
  fail "the client learnt of the broker's death $waited_ms ms after it"
[ -S "$SOCK" ] || fail "expected the killed broker to leave its socket behind"

# A new broker on the socket starts cleanly and loads the models again.
start_broker --device-memory-budget "$BUDGET"
log_has "event=stale_socket_removed" || fail "the new broker did not remove the stale socket"
# Any broker starting removes every dead broker's slabs; with tests running
# in parallel another test's broker may be the one that does it, so only the
# outcome is checked here.
log_has "event=shm_cleanup removed=" || fail "the new broker did not clean up /dev/shm"
[ "$(shm_count "$old")" = 0 ] || fail "the killed broker left $(ls /dev/shm/wb-"$old"-*) behind"
load a
load b
load c
expect_tiers "the models loaded again" a:host b:device c:device
acquire_verified a
acquire_verified b
acquire_verified c
expect_stats "after the restart" moved_to_host=4 restores=3 evicted=0 restore_failures=0
stop_broker
