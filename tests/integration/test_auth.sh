#!/usr/bin/env bash
# Authorisation with real processes of another uid (nobody, 65534, switched
# to with setpriv):
# * the socket's directory is set-group-ID to nobody's group, so the socket
#   (0660) and the slabs (0640) the broker makes get that group: the
#   deployment docs/security.md describes ("Who may connect");
# * by default only root and the broker's own user are served: nobody is
#   refused with WB_EPERM and a message naming the allowed ids, and the
#   broker logs it;
# * --allow-uid (by name or number) and --allow-gid let nobody lease, map
#   and verify, but not load or unload, nor release another process's lease;
#   --admin-uid lets it load and unload;
# * --allow-gid and --admin-gid match supplementary groups too (setpriv
#   --groups): a member reaches the socket and the slabs through the group
#   and leases, on named slabs and memfds; one in no listed group is refused
#   with a message naming the gid and the groups matched; where the groups
#   cannot be read (a hidden pid, a /proc of another pid namespace) the
#   refusal says the primary gid alone was matched, and why;
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

# --- Allowed by a supplementary group, as file permissions allow: workers
# whose primary group is nogroup and who are in group 4242 (setpriv
# --groups, as `usermod -aG` makes them) reach the socket and the slabs
# (set-group-ID directory: group 4242) through that group. --allow-gid 4243
# lets those also in 4243 lease and map, on named slabs and on memfds
# (through the descriptor channel); one in 4242 only is refused with a
# message naming what was matched; --admin-gid 4244 lets a member load.
RUN=$WB_TMP/grp
mkdir "$RUN"
chgrp 4242 "$RUN"
chmod 2750 "$RUN"
SOCK=$RUN/broker.sock
export WB_SOCKET=$SOCK
# in_groups NAME GROUPS CMD...: as_nobody, in the supplementary GROUPS.
in_groups() {
  local name=$1 groups=$2
  shift 2
  setpriv --reuid 65534 --regid 65534 --groups "$groups" "$@" >"$WB_TMP/$name.out" 2>"$WB_TMP/$name.err"
  EXIT_RC=$?
}
broker_with_demo --allow-gid 4243 --admin-gid 4244
grep -q 'event=access clients="uid 0; gid 4243, 4244" admins="uid 0; gid 4244" slab_group=4242' "$BROKER_LOG" ||
  fail "the broker did not log its access lists: $(grep event=access "$BROKER_LOG")"
[ "$(stat -c %g:%a "$SOCK")" = 4242:660 ] || fail "socket is $(stat -c %g:%a "$SOCK"), expected 4242:660"
for slab in /dev/shm/wb-"$BROKER_PID"-*; do
  [ "$(stat -c %g:%a "$slab")" = 4242:640 ] || fail "$slab is $(stat -c %g:%a "$slab"), expected 4242:640"
done
in_groups outsider 4242 "$WORKER" --model demo --hold 0
[ "$EXIT_RC" = 1 ] || fail "a worker in group 4242 only exited with $EXIT_RC, expected 1 (refused)"
err_has outsider "uid 65534 is not allowed to lease models (allowed: uid 0; gid 4243, 4244); matched against gid 65534 and supplementary group 4242" ||
  fail "unclear refusal: $(cat "$WB_TMP/outsider.err")"
grep -q 'event=peer_refused reason=not_allowed uid=65534 .*matched against gid 65534 and supplementary group 4242' "$BROKER_LOG" ||
  fail "the broker did not log what it matched"
setpriv --reuid 65534 --regid 65534 --groups 4242,4243 "$WORKER" --socket "$SOCK" --model demo --verify-every 50 \
  >"$WB_TMP/member.out" 2>"$WB_TMP/member.err" &
member=$!
STARTED_PIDS+=("$member")
wait_for output_has member "verified 4 tensors" || fail "a worker in group 4243 did not verify its lease"
[ "$(shm_mapped "$member" "$BROKER_PID")" = 2 ] || fail "the member does not map the slab and the shared table"
[ "$(lease_field "$member" uid)" = 65534 ] || fail "the member's lease is not listed with uid 65534"
in_groups memberload 4242,4243 "$WBCTL" --socket "$SOCK" load extra "$WB_TMP/extra.safetensors"
[ "$EXIT_RC" = 1 ] || fail "a client's load exited with $EXIT_RC"
err_has memberload "uid 65534 may not load models; matched against gid 65534 and supplementary groups 4242, 4243" ||
  fail "admin refusal: $(cat "$WB_TMP/memberload.err")"
grep -q "event=peer_refused reason=not_admin op=load uid=65534 gid=65534 groups=4242,4243 " "$BROKER_LOG" ||
  fail "the admin refusal was not logged with the groups"
in_groups adminload 4242,4244 "$WBCTL" --socket "$SOCK" load extra "$WB_TMP/extra.safetensors"
[ "$EXIT_RC" = 0 ] || fail "a member of --admin-gid could not load: $(cat "$WB_TMP/adminload.err")"
in_groups adminunload 4242,4244 "$WBCTL" --socket "$SOCK" unload extra
[ "$EXIT_RC" = 0 ] || fail "a member of --admin-gid could not unload: $(cat "$WB_TMP/adminunload.err")"
kill -TERM "$member"
wait_exit "$member"
[ "$EXIT_RC" = 0 ] || fail "the member's worker exited with $EXIT_RC"
stop_broker
HOST_SLAB=memfd broker_with_demo --allow-gid 4243
in_groups memfd 4242,4243 "$WORKER" --model demo --hold 0
[ "$EXIT_RC" = 0 ] || fail "a member could not lease a memfd slab: $(cat "$WB_TMP/memfd.err")"
output_has memfd "verified 4 tensors" || fail "the member did not verify the memfd slab"
in_groups memfdout 4242 "$WORKER" --model demo --hold 0
[ "$EXIT_RC" = 1 ] || fail "a worker in group 4242 only exited with $EXIT_RC on memfd"
err_has memfdout "matched against gid 65534 and supplementary group 4242" ||
  fail "unclear refusal: $(cat "$WB_TMP/memfdout.err")"
stop_broker

# --- Where the groups cannot be read, the primary gid alone is matched,
# and the refusal says why: a broker in a pid namespace of its own (with a
# private /dev/shm) sees this test's processes as pid 0; its /proc is the
# host's, where a process of the broker's namespace has another pid.
if unshare --pid --fork --mount true 2>/dev/null && command -v nsenter >/dev/null; then
  unshare --pid --fork --mount --kill-child \
    sh -c 'mount -t tmpfs -o size=16m,mode=1777 tmpfs /dev/shm && exec "$@"' sh \
    "$WBROKERD" --backend host --socket "$SOCK" --allow-gid 4243 >"$WB_TMP/ns.log" 2>&1 &
  ns=$!
  STARTED_PIDS+=("$ns")
  wait_for grep -q "event=listen " "$WB_TMP/ns.log" || fail "the broker in its pid namespace did not start"
  read -r nspid _ <"/proc/$ns/task/$ns/children"
  in_groups hidden 4242,4243 "$WORKER" --model demo --hold 0
  [ "$EXIT_RC" = 1 ] || fail "a hidden worker exited with $EXIT_RC, expected 1 (refused)"
  err_has hidden "uid 65534 is not allowed to lease models (allowed: uid 0; gid 4243); matched against gid 65534 only; supplementary groups could not be read because the peer's pid is not visible from the broker (another pid namespace)" ||
    fail "unclear refusal of a hidden pid: $(cat "$WB_TMP/hidden.err")"
  nsenter --target "$nspid" --pid setpriv --reuid 65534 --regid 65534 --groups 4242,4243 \
    "$WORKER" --model demo --hold 0 >"$WB_TMP/otherproc.out" 2>"$WB_TMP/otherproc.err"
  EXIT_RC=$?
  [ "$EXIT_RC" = 1 ] || fail "a worker of the broker's namespace exited with $EXIT_RC, expected 1 (refused)"
  grep -qE "matched against gid 65534 only; supplementary groups could not be read because the broker's /proc does not show the process that connected as pid [0-9]+ \(a /proc of another pid namespace\)" "$WB_TMP/otherproc.err" ||
    fail "unclear refusal through another namespace's /proc: $(cat "$WB_TMP/otherproc.err")"
  kill -TERM "$nspid"
  wait_exit "$ns"
  [ ! -e "$SOCK" ] || fail "the broker in its pid namespace left its socket behind"
else
  log "pid namespaces are not available: the hidden-pid refusals are not checked"
fi

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
err_has eacces "cannot connect to $SOCK: permission denied: the socket is 0660 root:root and this process is uid 65534 gid 65534 (no supplementary groups)" ||
  fail "EACCES: $(cat "$WB_TMP/eacces.err")"
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
