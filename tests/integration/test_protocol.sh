#!/usr/bin/env bash
# Protocol robustness against a live broker holding a lease for a worker:
# truncated requests, a wrong or missing version, the wrong number of frames,
# an empty frame, a message beyond the size limit (libzmq drops that peer),
# random frames, requests with absurd fields (repeated fields over their
# limits, among them 1 MiB of empty container records refused before they
# are decoded, floods of unknown fields, strings that are not UTF-8, empty
# and overlong names, short lease ids, unknown body numbers, wrong wire
# types, impossible lengths), and bytes that are not ZeroMQ at
# all. Each single-frame message gets an error reply naming the problem, or
# (multi-frame, oversized, non-ZMTP) is dropped, with a log line where the
# broker sees it; after each the broker answers the next valid request, and
# the worker's lease never suffers.
source "$(dirname "$0")/lib.sh"

make_model "$WB_TMP/demo.safetensors" 3 17 >/dev/null
start_broker_with_demo "$WB_TMP/demo.safetensors"
start_worker w --model demo --verify-every 100
w=$LAST_PID

# send NAME SUBCOMMAND ARGS...: the test client's answer in NAME.out, its
# exit status in RC.
send() {
  local name=$1
  shift
  "$TESTCLIENT" --socket "$SOCK" --wait "${WAIT_MS:-5000}" "$@" >"$WB_TMP/$name.out" 2>"$WB_TMP/$name.err"
  RC=$?
}

# answered NAME STATUS ID TEXT: the reply had that status and id, and its
# message contains TEXT.
answered() {
  grep -qx "status=$2 id=$3" "$WB_TMP/$1.out" ||
    fail "$1: expected status=$2 id=$3, got: $(cat "$WB_TMP/$1.out" "$WB_TMP/$1.err")"
  cat "$WB_TMP/$1.out" "$WB_TMP/$1.err" | grep -qF -- "$4" ||
    fail "$1: the message does not say '$4': $(cat "$WB_TMP/$1.out")"
  [ "$RC" = 1 ] || fail "$1: the test client exited with $RC"
}

# serving: a valid stats request is answered with status 0.
serving() {
  send ok file "$WB_TMP/stats.bin"
  grep -qx "status=0 id=99" "$WB_TMP/ok.out" || fail "after $1 the broker did not answer: $(cat "$WB_TMP/ok.out" "$WB_TMP/ok.err")"
  alive "$BROKER_PID" || fail "the broker died after $1"
}

# Builds the request files with plain protobuf encoding.
"$PYTHON" - "$WB_TMP" <<'PY'
import os, sys
out = sys.argv[1]
def varint(n):
    b = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            b.append(byte | 0x80)
        else:
            b.append(byte)
            return bytes(b)
def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload
def req(rid, body=b"", version=1):
    return field(1, 0, version) + field(2, 0, rid) + body
def write(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
acquire = lambda rid, model: req(rid, field(11, 2, field(1, 2, model)))
write("stats.bin", req(99, field(18, 2, b"")))
full = acquire(42, b"demo")
write("trunc1.bin", full[:-1])                 # the model name cut short
write("trunc2.bin", full[:5])                  # the acquire body's length runs past the end
write("version0.bin", req(43, field(18, 2, b""), version=0))
beat = field(1, 2, field(1, 2, b"\x01" * 16))
write("beats.bin", req(44, field(13, 2, beat * 5000)))
write("empty_name.bin", acquire(45, b""))
write("long_name.bin", acquire(46, b"m" * 300))
write("ctrl_name.bin", acquire(47, b"de\x01mo"))
write("short_id.bin", req(48, field(12, 2, field(1, 2, b"\x01\x02\x03"))))
write("unknown_body.bin", req(49, field(77, 2, b"")))
write("wire_type.bin", field(1, 0, 1) + field(2, 2, b"\x05") + field(18, 2, b""))
write("huge_len.bin", req(50) + varint((11 << 3) | 2) + varint(1 << 62))
write("two_bodies.bin", req(51, field(18, 2, b"") + field(14, 2, b"")))
records = field(40, 2, field(40, 0, 1) + field(41, 2, b"aoti")) * 300
write("records.bin", req(52, field(13, 2, field(1, 2, field(1, 2, b"\x02" * 16) + records))))
write("empty_unload.bin", req(53, field(17, 2, field(1, 2, b""))))
write("empty_path.bin", req(54, field(16, 2, field(1, 2, b"x") + field(2, 2, b""))))
# 1 MiB, the request limit: one lease of 349,514 empty records (3 bytes each).
lease = field(1, 2, b"\x01" * 16) + field(2, 0, 300) + field(40, 2, b"") * 349514
flood = req(300, field(13, 2, field(1, 2, lease)))
assert len(flood) == 1 << 20, len(flood)
write("flood.bin", flood)
record = field(40, 0, 1) + field(41, 2, b"aoti") + field(47, 2, b"/m/\xff.pt2")
write("not_utf8.bin", req(56, field(13, 2, field(1, 2, field(1, 2, b"\x02" * 16) + field(2, 0, 1) +
                                                   field(40, 2, record)))))
write("unknown_flood.bin", req(57, field(18, 2, b"") + field(3, 0, 0) * 200000))
PY

serving "nothing"

# --- Truncated requests: the id is echoed when it could be read.
send t1 file "$WB_TMP/trunc1.bin"
answered t1 -6 42 "does not decode as wbproto.Request"
send t2 file "$WB_TMP/trunc2.bin"
answered t2 -6 42 "does not decode as wbproto.Request"
serving "truncated requests"

# --- Versions.
send v0 file "$WB_TMP/version0.bin"
answered v0 -15 43 "protocol version 0, this broker speaks 1"
send v2 raw 08021007920100
answered v2 -15 7 "protocol version 2"
serving "wrong versions"

# --- Frame counts: dropped with a log line, no reply.
WAIT_MS=1000 send f2 frames 0801 1001
[ "$RC" = 4 ] || fail "a two-frame message was answered: $(cat "$WB_TMP/f2.out")"
WAIT_MS=1000 send f3 frames 08 01 10
[ "$RC" = 4 ] || fail "a three-frame message was answered: $(cat "$WB_TMP/f3.out")"
wait_for grep -q "event=bad_message reason=frame_count frames=2" "$BROKER_LOG" || fail "no log line for 2 frames"
wait_for grep -q "event=bad_message reason=frame_count frames=3" "$BROKER_LOG" || fail "no log line for 3 frames"
send empty frames ""
answered empty -6 0 "empty request (0 bytes)"
serving "wrong frame counts"

# --- Beyond ZMQ_MAXMSGSIZE (WB_MAX_MESSAGE, 64 MiB): libzmq drops the
# connection before the broker sees anything; the broker serves on.
WAIT_MS=1000 send big big 67108865
[ "$RC" = 4 ] || fail "an oversized message was answered: $(cat "$WB_TMP/big.out")"
serving "an oversized message"

# --- Absurd fields.
send beats file "$WB_TMP/beats.bin"
answered beats -6 44 "heartbeat has 5000 leases, at most 4096"
send records file "$WB_TMP/records.bin"
answered records -6 52 "has 300 container records, at most 16"
send flood file "$WB_TMP/flood.bin"
answered flood -6 300 "heartbeat.leases[0].container_records has 349514 container records, at most 16"
send nu file "$WB_TMP/not_utf8.bin"
answered nu -6 56 "heartbeat.leases[0].container_records[0].model_path is not valid UTF-8 (byte 3)"
send uf file "$WB_TMP/unknown_flood.bin"
answered uf -6 57 "request has 200003 fields on the wire, at most 83"
send en file "$WB_TMP/empty_name.bin"
answered en -6 45 "acquire.model is empty"
send ln file "$WB_TMP/long_name.bin"
answered ln -6 46 "acquire.model has 300 bytes, at most 255"
send cn file "$WB_TMP/ctrl_name.bin"
answered cn -6 47 "acquire.model has a control character (0x01) at byte 2"
send sid file "$WB_TMP/short_id.bin"
answered sid -6 48 "release.lease_id has 3 bytes, expected 16"
# Requests carry no enum fields; a body number no broker knows is their
# unknown-enum case: it is no body at all.
send ub file "$WB_TMP/unknown_body.bin"
answered ub -6 49 "request has no body"
send wt file "$WB_TMP/wire_type.bin"
answered wt -6 0 "does not decode as wbproto.Request"
send hl file "$WB_TMP/huge_len.bin"
answered hl -6 50 "does not decode as wbproto.Request"
send eu file "$WB_TMP/empty_unload.bin"
answered eu -6 53 "unload.name is empty"
send ep file "$WB_TMP/empty_path.bin"
answered ep -6 54 "load.path is empty"
# Two bodies of one oneof: protobuf keeps the last; a valid request.
send tb file "$WB_TMP/two_bodies.bin"
grep -qx "status=0 id=51" "$WB_TMP/tb.out" || fail "two bodies: $(cat "$WB_TMP/tb.out")"
serving "absurd fields"

# --- Random frames: every one is answered.
send rnd random 400 7 600
[ "$RC" = 0 ] || fail "random frames: $(cat "$WB_TMP/rnd.out" "$WB_TMP/rnd.err")"
grep -qx "sent=400 replies=400" "$WB_TMP/rnd.out" || fail "random frames: $(cat "$WB_TMP/rnd.out")"
serving "random frames"

# --- Not ZeroMQ at all: random bytes, a greeting cut short, and 64
# connections that never finish their handshake, held open while a valid
# request is served.
"$PYTHON" - "$SOCK" "$TESTCLIENT" <<'PY' || fail "raw connections: see above"
import os, random, socket, subprocess, sys
path, client = sys.argv[1], sys.argv[2]
rng = random.Random(5)
for i in range(20):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    try:
        s.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096))))
    except OSError:
        pass  # the broker may close it before everything is written
    s.close()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(path)
s.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f\x03")  # a ZMTP greeting, cut short
idle = []
for i in range(64):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(path)
    idle.append(c)
r = subprocess.run([client, "--socket", path, "--wait", "5000", "raw", "08011064920100"],
                   capture_output=True, text=True)
if "status=0 id=100" not in r.stdout:
    print("not served while 64 connections idled: " + r.stdout + r.stderr, file=sys.stderr)
    sys.exit(1)
for c in idle:
    c.close()
s.close()
PY
serving "non-ZMTP connections"

# The lease never suffered, and the counter counts what the broker saw.
[ "$(stat_field malformed_messages)" -ge 400 ] || fail "malformed_messages = $(stat_field malformed_messages)"
wait_for lease_state_is "$w" active || fail "the worker's lease is not active"
kill -TERM "$w"
wait_exit "$w"
[ "$EXIT_RC" = 0 ] || fail "the worker exited with $EXIT_RC"
grep -q "verify failed" "$WB_TMP/w.out" && fail "a verification failed"
stop_broker
