#!/usr/bin/env bash
# Sharing is read-only unless asked otherwise: a broker started with no
# transport option says so in --check-config, hands out sealed memfds on the
# host backend (no /dev/shm name exists while a worker holds its lease, and
# the lease is listed ro), and --host-slab shm still gives named slabs.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 7 >/dev/null
"$WBROKERD" --check-config --socket "$SOCK" >"$WB_TMP/check.out" 2>"$WB_TMP/check.err" ||
  fail "--check-config failed: $(cat "$WB_TMP/check.err")"
grep -qx "backend: auto cuda-slab=vmm host-slab=memfd slab-pool=30s" "$WB_TMP/check.out" ||
  fail "the default transports: $(cat "$WB_TMP/check.out")"
grep -qx "access: cuda ro (cuda-vmm; cuda-ipc, rw, where the device lacks VMM descriptors), host ro (sealed memfd)" \
  "$WB_TMP/check.out" || fail "the default access: $(cat "$WB_TMP/check.out")"
"$WBROKERD" --check-config --socket "$SOCK" --cuda-slab ipc --host-slab shm >"$WB_TMP/check2.out" ||
  fail "--check-config with ipc and shm failed"
grep -qx "access: cuda rw (cuda-ipc), host ro mappings of named /dev/shm objects" "$WB_TMP/check2.out" ||
  fail "explicit ipc and shm: $(cat "$WB_TMP/check2.out")"

start_broker_with_demo "$WB_TMP/demo.safetensors"
[ -S "$SOCK.fd" ] || fail "the default broker has no descriptor channel"
start_worker w1 --model demo --hold 30
w1=$LAST_PID
[ "$(shm_count "$BROKER_PID")" = 0 ] || fail "a default broker made /dev/shm names: $(ls /dev/shm)"
[ "$(lease_field "$w1" transport)" = memfd ] || fail "lease transport: $(ctl leases --json)"
[ "$(lease_field "$w1" access)" = ro ] || fail "lease access: $(ctl leases --json)"
kill -TERM "$w1"
wait "$w1" 2>/dev/null
stop_broker

# Named slabs on request.
start_broker --model "demo=$WB_TMP/demo.safetensors" --host-slab shm
wait_for model_ready demo || fail "model demo did not become ready"
start_worker w2 --model demo --hold 30
w2=$LAST_PID
[ "$(shm_count "$BROKER_PID")" -ge 1 ] || fail "--host-slab shm made no /dev/shm slab"
[ "$(lease_field "$w2" transport)" = shm ] || fail "lease transport with shm: $(ctl leases --json)"
[ ! -e "$SOCK.fd" ] || fail "a broker with named slabs bound a descriptor channel"
kill -TERM "$w2"
wait "$w2" 2>/dev/null
stop_broker
