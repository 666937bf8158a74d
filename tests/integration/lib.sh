# Shared setup for the integration tests, sourced by each test_*.sh.
#
# Every test gets a private directory, its own broker on the host backend
# (short heartbeat and stale windows so liveness is quick to observe), and
# functions that poll for a condition with a deadline instead of sleeping.
# Everything a test starts is killed on exit; a broker stopped cleanly must
# leave no shared memory object behind.
#
# Environment: WB_BIN_DIR (the build directory, required); WB_SANITIZED=1
# stretches the deadlines for the slower sanitizer build.

set -uo pipefail

: "${WB_BIN_DIR:?WB_BIN_DIR must name the build directory}"
WBROKERD=$WB_BIN_DIR/broker/wbrokerd
WBCTL=$WB_BIN_DIR/tools/wbctl/wbctl
WORKER=$WB_BIN_DIR/examples/wb-demo-worker
TESTCLIENT=$WB_BIN_DIR/tests/wbtest_client
TEST_NAME=$(basename "$0" .sh)

# Deadlines in seconds; the sanitizer build runs several times slower.
WAIT_SECS=10
if [ "${WB_SANITIZED:-0}" = 1 ]; then
  WAIT_SECS=30
fi

WB_TMP=$(mktemp -d /tmp/wbit.XXXXXX) || {
  echo "$TEST_NAME: cannot make a temporary directory" >&2
  exit 1
}
SOCK=$WB_TMP/broker.sock
BROKER_PID=
BROKER_LOG=
BROKER_RUNS=0
STARTED_PIDS=()
BROKER_PIDS=()
LAST_PID=
EXIT_RC=

# Clients must not find some other broker through the environment.
export WB_SOCKET=$SOCK
# The folder of the tests' Python helpers (fake_files.py), for their inline scripts.
WB_TEST_PY=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export WB_TEST_PY

log() { printf '%s: %s\n' "$TEST_NAME" "$*" >&2; }

# fail MSG: says why, shows the end of the broker's log and of every output
# file, and ends the test.
fail() {
  log "FAIL: $*"
  local f
  for f in "$WB_TMP"/*.log "$WB_TMP"/*.out "$WB_TMP"/*.err; do
    [ -s "$f" ] || continue
    printf -- '--- %s (last 30 lines)\n' "$(basename "$f")" >&2
    tail -n 30 "$f" >&2
  done
  exit 1
}

cleanup() {
  local rc=$? pid
  if [ -s "$WB_TMP/crashes" ]; then
    log "FAIL: $(cat "$WB_TMP/crashes")"
    rc=1
  fi
  # Only processes that are still this shell's children: one already waited
  # for has given up its pid, which another process may have now.
  for pid in "${STARTED_PIDS[@]}"; do
    # (status, not stat: a process may name itself with spaces or newlines)
    [ "$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)" = $$ ] || continue
    kill -KILL "$pid" 2>/dev/null
  done
  for pid in "${STARTED_PIDS[@]}"; do
    wait "$pid" 2>/dev/null
  done
  # Brokers killed on purpose leave their slabs; remove them here so tests
  # do not fill /dev/shm (a clean stop is checked in stop_broker).
  for pid in "${BROKER_PIDS[@]}"; do
    rm -f /dev/shm/wb-"$pid"-* 2>/dev/null
  done
  rm -rf "$WB_TMP"
  if [ "$rc" -eq 0 ]; then
    log "PASS"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

for bin in "$WBROKERD" "$WBCTL" "$WORKER" "$TESTCLIENT"; do
  [ -x "$bin" ] || fail "missing executable $bin (build every target first)"
done
# The interpreter itself, not a version manager's wrapper script: the tests
# run it hundreds of times.
PYTHON=$(python3 -c 'import sys; print(sys.executable)') || fail "python3 is needed"

# wait_for CMD...: runs CMD until it succeeds, for up to WAIT_SECS seconds.
wait_for() {
  local deadline=$((SECONDS + WAIT_SECS))
  while :; do
    "$@" >/dev/null 2>&1 && return 0
    [ "$SECONDS" -ge "$deadline" ] && return 1
    sleep 0.05
  done
}

# spawn NAME CMD...: starts CMD in the background with its output in
# $WB_TMP/NAME.out and NAME.err; its pid is in LAST_PID.
spawn() {
  local name=$1
  shift
  # The child truncates them only once it runs: a wait on a name used
  # before must not read the last run's lines.
  rm -f "$WB_TMP/$name.out" "$WB_TMP/$name.err"
  "$@" >"$WB_TMP/$name.out" 2>"$WB_TMP/$name.err" &
  LAST_PID=$!
  STARTED_PIDS+=("$LAST_PID")
}

# alive PID: true while the process runs (a stopped one counts, a zombie
# does not).
alive() {
  local st
  st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$st" ] && [ "$st" != Z ]
}

gone() {
  ! alive "$1"
}

# wait_exit PID: waits (with the deadline) for a process started here to
# end and puts its exit status in EXIT_RC. Must not run in a subshell.
wait_exit() {
  wait_for gone "$1" || fail "process $1 did not exit within ${WAIT_SECS}s"
  wait "$1"
  EXIT_RC=$?
}

# ctl ARGS...: wbctl on the test's broker. Most calls sit in pipelines or
# command substitutions whose status is lost, so a crash (or a sanitizer
# abort at exit) is recorded here and fails the test in cleanup.
ctl() {
  "$WBCTL" --socket "$SOCK" "$@"
  local rc=$?
  if [ "$rc" -ge 128 ]; then
    echo "wbctl $* died with status $rc" >>"$WB_TMP/crashes"
  fi
  return "$rc"
}

# json EXPR: evaluates a Python expression over the JSON document on stdin
# (bound to d) and prints the result.
json() {
  "$PYTHON" -c 'import json, sys
d = json.load(sys.stdin)
r = eval(sys.argv[1])
print(json.dumps(r) if isinstance(r, (dict, list)) else r)' "$1"
}

# make_model PATH N SEED: writes a safetensors file with N tensors (mixed
# dtypes, one scalar) whose bytes depend on SEED; prints the tensor bytes.
make_model() {
  "$PYTHON" - "$1" "$2" "$3" <<'PY'
import json, struct, sys
path, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dtypes = [("F32", 4), ("F16", 2), ("U8", 1), ("I64", 8), ("BF16", 2)]
header, data = {}, bytearray()
for i in range(n):
    dtype, size = dtypes[i % len(dtypes)]
    shape = [] if i == 2 else [i + 1, 3 + i % 4]
    count = 1
    for s in shape:
        count *= s
    nbytes = count * size
    blob = bytes((seed * 31 + i * 7 + k * 13) & 0xFF for k in range(nbytes))
    header["layer%d.weight" % i] = {"dtype": dtype, "shape": shape,
                                    "data_offsets": [len(data), len(data) + nbytes]}
    data += blob
header["__metadata__"] = {"format": "pt", "seed": str(seed)}
raw = json.dumps(header).encode()
raw += b" " * (-len(raw) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw + bytes(data))
print(len(data))
PY
}

# model_state NAME: prints the model's state as `wbctl models --json` says.
model_state() {
  ctl models --json | json "next((m['state'] for m in d if m['name'] == '$1'), 'absent')"
}

model_ready() {
  [ "$(model_state "$1")" = ready ]
}

model_absent() {
  [ "$(model_state "$1")" = absent ]
}

# lease_field PID KEY: the KEY of the lease held by PID ('none' without one).
lease_field() {
  ctl leases --json | json "next((l['$2'] for l in d if l['pid'] == $1), 'none')"
}

# lease_count PID: how many leases PID holds.
lease_count() {
  ctl leases --json | json "len([l for l in d if l['pid'] == $1])"
}

lease_state_is() {
  [ "$(lease_field "$1" state)" = "$2" ]
}

# all_active N: exactly N leases are listed and every one is active. Tests
# poll for it: on a loaded machine a heartbeat may come late enough for a
# lease to look stale for a moment.
all_active() {
  [ "$(ctl leases --json | json "len(d) == $1 and all(l['state'] == 'active' for l in d)")" = True ]
}

no_lease() {
  [ "$(lease_count "$1")" = 0 ]
}

# stat_field KEY: one field of `wbctl stats --json`.
stat_field() {
  ctl stats --json | json "d['$1']"
}

stat_is() {
  [ "$(stat_field "$1")" = "$2" ]
}

# output_has NAME TEXT: the process output NAME.out has a line with TEXT.
output_has() {
  grep -qF -- "$2" "$WB_TMP/$1.out"
}

# shm_mapped PID BROKER_PID: how many distinct shm objects of the broker
# process PID maps read-only (the slabs and the shared tensor tables).
shm_mapped() {
  grep " r--s " "/proc/$1/maps" 2>/dev/null | grep -o "/dev/shm/wb-$2-[0-9a-f]*" | sort -u | wc -l
}

shm_count() {
  local n=0 f
  for f in /dev/shm/wb-"$1"-*; do
    [ -e "$f" ] && n=$((n + 1))
  done
  echo "$n"
}

# small_quarantine: for a test that bounds a process's RSS under the
# sanitizers (WB_SANITIZED=1). ASan keeps freed memory in a quarantine
# (256 MiB by default) before reusing it, so RSS climbs by design; a small
# quarantine lets it settle. The leak checker at the broker's exit covers
# what RSS cannot see.
small_quarantine() {
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=4:thread_local_quarantine_size_kb=256"
}

# use_slow_broker US: brokers started from now on read through
# libwbtest_slowread.so, which makes each read of tensor data sleep US
# microseconds, so that a load of a few MiB takes seconds.
use_slow_broker() {
  local shim=$WB_BIN_DIR/tests/libwbtest_slowread.so
  [ -f "$shim" ] || fail "missing $shim (build every target first)"
  export WB_TEST_PREAD_DELAY_US=$1
  # ASan refuses to start with a library preloaded before its runtime
  # unless told not to check.
  cat >"$WB_TMP/slowbroker.sh" <<EOF
#!/bin/sh
export LD_PRELOAD="$shim\${LD_PRELOAD:+:\$LD_PRELOAD}"
export ASAN_OPTIONS="\${ASAN_OPTIONS:+\$ASAN_OPTIONS:}verify_asan_link_order=0"
exec "$WBROKERD" "\$@"
EOF
  chmod +x "$WB_TMP/slowbroker.sh"
  WBROKERD=$WB_TMP/slowbroker.sh
}

# start_broker ARGS...: starts wbrokerd on $SOCK with the test timings plus
# ARGS, and waits until it answers. A test about named /dev/shm slabs sets
# HOST_SLAB=shm first (the broker's default is sealed memfds).
start_broker() {
  BROKER_RUNS=$((BROKER_RUNS + 1))
  BROKER_LOG=$WB_TMP/broker$BROKER_RUNS.log
  "$WBROKERD" --backend host --socket "$SOCK" --heartbeat-ms 100 --stale-ms 600 \
    ${HOST_SLAB:+--host-slab "$HOST_SLAB"} "$@" \
    >"$BROKER_LOG" 2>&1 &
  BROKER_PID=$!
  STARTED_PIDS+=("$BROKER_PID")
  BROKER_PIDS+=("$BROKER_PID")
  wait_for ctl stats || fail "the broker did not answer on $SOCK within ${WAIT_SECS}s"
}

# start_broker_with_demo PATH: a broker serving model "demo" from PATH.
start_broker_with_demo() {
  start_broker --model "demo=$1"
  wait_for model_ready demo || fail "model demo did not become ready"
}

# stop_broker: SIGTERM, expect exit 0 and no shared memory left behind.
stop_broker() {
  local pid=$BROKER_PID
  kill -TERM "$pid" 2>/dev/null || fail "the broker $pid is not running"
  wait_exit "$pid"
  [ "$EXIT_RC" = 0 ] || fail "the broker exited with status $EXIT_RC after SIGTERM"
  [ "$(shm_count "$pid")" = 0 ] || fail "the broker left $(ls /dev/shm/wb-"$pid"-*) behind"
  [ ! -e "$SOCK" ] || fail "the broker left its socket $SOCK behind"
  BROKER_PID=
}

# start_worker NAME ARGS...: a demo worker on $SOCK; waits until it has
# verified its lease. Its pid is in LAST_PID.
start_worker() {
  local name=$1
  shift
  spawn "$name" "$WORKER" --socket "$SOCK" "$@"
  local pid=$LAST_PID
  wait_for output_has "$name" "verified " || fail "worker $name did not verify its lease"
  LAST_PID=$pid
}

# skip REASON: the test cannot run here; ctest reports it as skipped (77).
skip() {
  log "SKIP: $*"
  exit 77
}

# need_nobody: sets NOBODY, a command prefix that runs as uid and gid 65534
# without groups, or skips the test where it cannot: not root, or no
# setpriv. The caller then checks that uid 65534 can run what it needs.
need_nobody() {
  [ "$(id -u)" = 0 ] || skip "switching to another uid needs root"
  command -v setpriv >/dev/null || skip "setpriv (util-linux) is not installed"
  NOBODY=(setpriv --reuid 65534 --regid 65534 --clear-groups)
}
