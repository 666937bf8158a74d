#!/usr/bin/env bash
# Authorisation with real processes of another uid (nobody, 65534, switched
# to with setpriv):
# * the socket's directory is set-group-ID to nobody's group, so the socket
#   (0660) and the slabs (0640) the broker makes get that group: the
#   deployment the README describes;
# * by default only root and the broker's own user are served: nobody is
#   refused with WB_EPERM and a message naming the allowed ids, and the
#   broker logs it;
# * --allow-uid (by name or number) and --allow-gid let nobody lease, map
#   and verify, but not load or unload, nor release another process's lease;
#   --admin-uid lets it load and unload;
# * a client that may not reach the socket (EACCES), or finds none, says so
#   at once;
# * a socket directory the broker creates is 0750, the socket 0660.
source "$(dirname "$0")/lib.sh"
# Named slabs in /dev/shm: what this test looks at.
HOST_SLAB=shm

need_nobody
"${NOBODY[@]}" "$WORKER" --help >/dev/null 2>&1 ||
  skip "uid 65534 cannot run $WORKER (is the build directory reachable for it?)"

export WB_TIMEOUT_MS=3000
make_model "$WB_TMP/demo.safetensors" 4 5 >/dev/null
make_model "$WB_TMP/extra.safetensors" 2 6 >/dev/null
chmod 0711 "$WB_TMP"
RUN=$WB_TMP/run
mkdir "$RUN"
chgrp 65534 "$RUN"
chmod 2750 "$RUN"
SOCK=$RUN/broker.sock
export WB_SOCKET=$SOCK

# as_nobody NAME CMD...: runs CMD as uid 65534; output in NAME.out/.err,
# status in EXIT_RC, seconds taken in TOOK.
as_nobody() {
  local name=$1 t0
  shift
  t0=$(date +%s%N)
  "${NOBODY[@]}" "$@" >"$WB_TMP/$name.out" 2>"$WB_TMP/$name.err"
  EXIT_RC=$?
  TOOK=$((($(date +%s%N) - t0) / 1000000))
}

err_has() {
  grep -qF -- "$2" "$WB_TMP/$1.err"
}

# broker_with_demo ARGS...: a broker serving model "demo", with ARGS.
broker_with_demo() {
  start_broker --model "demo=$WB_TMP/demo.safetensors" "$@"
  wait_for model_ready demo || fail "model demo did not become ready"
}

# --- The default: root and the broker's own user only.
start_broker_with_demo "$WB_TMP/demo.safetensors"
[ "$(stat -c %G:%a "$SOCK")" = nogroup:660 ] || fail "socket is $(stat -c %G:%a "$SOCK"), expected nogroup:660"
as_nobody refused "$WORKER" --model demo --hold 0
[ "$EXIT_RC" = 1 ] || fail "nobody's worker exited with $EXIT_RC, expected 1 (refused)"
err_has refused "uid 65534 is not allowed to lease models (allowed: uid 0)" ||
  fail "unclear refusal: $(cat "$WB_TMP/refused.err")"
grep -q "event=peer_refused reason=not_allowed uid=65534 " "$BROKER_LOG" ||
  fail "the broker did not log the refusal"
as_nobody ctlrefused "$WBCTL" --socket "$SOCK" models
[ "$EXIT_RC" = 1 ] || fail "nobody's wbctl models exited with $EXIT_RC, expected 1"
err_has ctlrefused "uid 65534 is not allowed to lease models" || fail "wbctl: $(cat "$WB_TMP/ctlrefused.err")"
[ "$(stat_field requests_refused)" -ge 2 ] || fail "requests_refused does not count the refusals"
stop_broker

# --- Allowed by name: leases, maps (the slab is in nobody's group) and
# verifies; may not load, unload or release another process's lease.
broker_with_demo --allow-uid nobody
grep -q 'event=access clients="uid 0, 65534" admins="uid 0" slab_group=65534' "$BROKER_LOG" ||
  fail "the broker did not log its access lists: $(grep event=access "$BROKER_LOG")"
# The slab and the model's shared tensor table alike.
[ "$(shm_count "$BROKER_PID")" = 2 ] || fail "expected the slab and the table: $(ls /dev/shm/wb-"$BROKER_PID"-*)"
for slab in /dev/shm/wb-"$BROKER_PID"-*; do
  [ "$(stat -c %G:%a "$slab")" = nogroup:640 ] || fail "$slab is $(stat -c %G:%a "$slab"), expected nogroup:640"
done
"${NOBODY[@]}" "$WORKER" --socket "$SOCK" --model demo --verify-every 50 >"$WB_TMP/nb.out" 2>"$WB_TMP/nb.err" &
nb=$!
STARTED_PIDS+=("$nb")
wait_for output_has nb "verified 4 tensors" || fail "nobody's worker did not verify its lease"
[ "$(shm_mapped "$nb" "$BROKER_PID")" = 2 ] || fail "nobody's worker does not map the slab and the shared table"
[ "$(lease_field "$nb" uid)" = 65534 ] || fail "the lease is not listed with uid 65534"
start_worker rootw --model demo
rootw=$LAST_PID
root_lease=$(lease_field "$rootw" id)
as_nobody foreign "$TESTCLIENT" --socket "$SOCK" release "$root_lease"
[ "$EXIT_RC" = 1 ] || fail "nobody releasing root's lease exited with $EXIT_RC"
err_has foreign "lease ${root_lease:0:8} belongs to pid $rootw" || fail "foreign release: $(cat "$WB_TMP/foreign.err")"
as_nobody load "$WBCTL" --socket "$SOCK" load extra "$WB_TMP/extra.safetensors"
[ "$EXIT_RC" = 1 ] || fail "nobody's load exited with $EXIT_RC"
err_has load "uid 65534 may not load models" || fail "load refusal: $(cat "$WB_TMP/load.err")"
as_nobody unload "$WBCTL" --socket "$SOCK" unload demo
[ "$EXIT_RC" = 1 ] || fail "nobody's unload exited with $EXIT_RC"
err_has unload "uid 65534 may not unload models" || fail "unload refusal: $(cat "$WB_TMP/unload.err")"
grep -q "event=peer_refused reason=not_admin op=load uid=65534" "$BROKER_LOG" || fail "the admin refusal was not logged"
kill -TERM "$nb"
wait_exit "$nb"
[ "$EXIT_RC" = 0 ] || fail "nobody's worker exited with $EXIT_RC"
output_has nb "released" || fail "nobody's worker did not release"
kill -TERM "$rootw"
wait_exit "$rootw"
stop_broker

# --- Allowed by primary group, and an administrator by uid.
broker_with_demo --allow-gid nogroup --admin-uid 65534
as_nobody gw "$WORKER" --model demo --hold 0
[ "$EXIT_RC" = 0 ] || fail "a worker of group nogroup was refused: $(cat "$WB_TMP/gw.err")"
as_nobody adminload "$WBCTL" --socket "$SOCK" load extra "$WB_TMP/extra.safetensors"
[ "$EXIT_RC" = 0 ] || fail "an --admin-uid could not load: $(cat "$WB_TMP/adminload.err")"
as_nobody adminunload "$WBCTL" --socket "$SOCK" unload extra
[ "$EXIT_RC" = 0 ] || fail "an --admin-uid could not unload: $(cat "$WB_TMP/adminunload.err")"
stop_broker

# --- Unknown names are refused at startup, by name.
"$WBROKERD" --socket "$SOCK" --allow-uid no-such-user-wbtest >"$WB_TMP/badname.out" 2>"$WB_TMP/badname.err"
[ $? = 2 ] || fail "an unknown user name did not make wbrokerd exit 2"
err_has badname "--allow-uid: no user named 'no-such-user-wbtest'" || fail "$(cat "$WB_TMP/badname.err")"

# --- A socket nobody may open (0660, root's group): refused at once.
mkdir -m 0711 "$WB_TMP/private"
SOCK=$WB_TMP/private/broker.sock
export WB_SOCKET=$SOCK
broker_with_demo --allow-uid 65534
[ "$(stat -c %U:%G:%a "$SOCK")" = root:root:660 ] || fail "socket is $(stat -c %U:%G:%a "$SOCK")"
as_nobody eacces "$WORKER" --socket "$SOCK" --model demo --hold 0
[ "$EXIT_RC" = 1 ] || fail "a worker that may not open the socket exited with $EXIT_RC"
err_has eacces "no broker socket at $SOCK: Permission denied" || fail "EACCES: $(cat "$WB_TMP/eacces.err")"
[ "$TOOK" -lt 5000 ] || fail "the EACCES refusal took ${TOOK} ms"
as_nobody missing "$WORKER" --socket "$WB_TMP/private/none.sock" --model demo --hold 0
[ "$EXIT_RC" = 1 ] || fail "a worker without a socket exited with $EXIT_RC"
err_has missing "no broker socket at $WB_TMP/private/none.sock: No such file or directory" ||
  fail "missing socket: $(cat "$WB_TMP/missing.err")"
[ "$TOOK" -lt 5000 ] || fail "the missing-socket refusal took ${TOOK} ms"
stop_broker

# --- A directory the broker makes is 0750 (whatever the umask), the
# socket 0660.
SOCK=$WB_TMP/made/here/broker.sock
export WB_SOCKET=$SOCK
old_umask=$(umask)
umask 0
start_broker
umask "$old_umask"
[ "$(stat -c %a "$WB_TMP/made")" = 750 ] || fail "made dir is $(stat -c %a "$WB_TMP/made")"
[ "$(stat -c %a "$WB_TMP/made/here")" = 750 ] || fail "made/here is $(stat -c %a "$WB_TMP/made/here")"
[ "$(stat -c %a "$SOCK")" = 660 ] || fail "socket is $(stat -c %a "$SOCK")"
stop_broker
