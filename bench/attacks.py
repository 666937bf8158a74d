#!/usr/bin/env python3
"""Denial-of-service attacks on a real broker, each bounded in count and
time, with what an allowed client sees meanwhile.

  bench/attacks.py --build BUILD_DIR --out OUT_JSON [--only 1,4,...]

Runs as root. For each attack a fresh wbrokerd from BUILD_DIR is started
(host backend, --host-slab memfd so that the descriptor channel exists, a
small checkpoint written here, --allow-uid that leaves uid 65534 out), so
that every attack starts from the same baseline. The attackers run as
separate processes, most as uid 65534 (setpriv), a refused uid; all traffic
goes to the broker's unix sockets or to 127.0.0.1. Measured per attack:

  * the allowed client: `wbctl models` as root, run again and again during
    the attack (median and max latency, failures and their exit codes);
    for the metrics attack, a curl scrape of /metrics;
  * the broker's VmRSS, VmHWM (peak), open descriptors, CPU seconds and the
    growth of its log: before the attack, and a few seconds after it ended;
  * what the attack itself got (replies, refusals, sessions, ...).

The verdict compares these with the thresholds below: "refused/bounded"
when every check passes, else the checks that failed ("locked out",
"stalled", "log flood", ...). The same script judges a fixed broker and a
vulnerable one.

One JSON object per attack goes into OUT_JSON (a list); a markdown table
goes to stdout.

The file also holds the attackers themselves (--attacker MODE ...), so
that one copy, readable by uid 65534, is all they need.
"""
import argparse
import datetime
import errno
import json
import os
import re
import selectors
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

# --- Thresholds of the verdict.
MAX_LATENCY_MS = 250  # the allowed client's calls during an attack ...
MAX_OUTLIER_MS = 500  # ... save one, which may reach this (a busy machine)
MAX_FAILURES = 0  # allowed-client calls that may fail during an attack
MAX_RSS_GROWTH_KB = 16 * 1024  # VmRSS after the attack over before it
MAX_PEAK_GROWTH_KB = 32 * 1024  # VmHWM over VmRSS before (attack 6)
MAX_FD_DRIFT = 2  # descriptors after the attack vs before
MAX_LOG_GROWTH = 1_000_000  # log bytes written during the attack and settling
MAX_CPU_S_8MB = 0.25  # broker CPU seconds to parse 8 MB of 7-byte frames
MAX_REPLY_WAIT_S = 1.0  # a complete request in a buffer is answered within this

SETTLE_S = 3.0  # after an attack ends, before "after" is measured
BASELINE_S = 1.0  # the allowed client alone, before the attack
PROBE_GAP_S = 0.05  # between two allowed-client calls
PROBE_TIMEOUT_MS = 3000  # wbctl --timeout-ms of the allowed client
NOBODY = 65534  # the refused uid the attackers run as
ADMIN_UID = 65533  # a non-root administrator (attack 11)
ALLOWED_UID = 4242  # on --allow-uid; neither 65534 nor 65533
ATTACKER_NICE = 10  # attackers yield the CPU to the broker and the probe
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

# ===================================================================
# On the wire: ZMTP 3.1 framing and hand-encoded protobuf (proto/wb.proto).


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_varint(field, v):
    return varint(field << 3) + varint(v)


def pb_bytes(field, b):
    return varint(field << 3 | 2) + varint(len(b)) + b


# Request body fields.
HELLO, ACQUIRE, HEARTBEAT, LIST_MODELS = 10, 11, 13, 15


def request(rid, body_field, body=b""):
    return pb_varint(1, 1) + pb_varint(2, rid) + pb_bytes(body_field, body)


def read_varint(b, i):
    shift = v = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def pb_fields(b):
    """Field number -> list of values (ints for varints, bytes otherwise)."""
    out, i = {}, 0
    while i < len(b):
        key, i = read_varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 2:
            n, i = read_varint(b, i)
            v = bytes(b[i : i + n])
            i += n
        elif wt == 1:
            v, i = bytes(b[i : i + 8]), i + 8
        elif wt == 5:
            v, i = bytes(b[i : i + 4]), i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(f, []).append(v)
    return out


def reply_status(body):
    """(status, error text) of an encoded Reply."""
    f = pb_fields(body)
    s = f.get(3, [0])[0]
    return (s >> 1) ^ -(s & 1), f.get(4, [b""])[0].decode(errors="replace")


def greeting():
    return b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32


def frame(body, more=False, command=False):
    flags = (1 if more else 0) | (4 if command else 0)
    if len(body) > 255:
        return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def ready():
    prop = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    prop += b"\x08Identity" + struct.pack(">I", 0)
    return frame(b"\x05READY" + prop, command=True)


PING = frame(b"\x04PING\x00\x00", command=True)
PONG = frame(b"\x04PONG", command=True)


def unix_connect(path, timeout=5.0):
    """A connected unix socket. A full listen backlog makes connect fail
    at once with EAGAIN (the broker has not accepted yet): retried."""
    end = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            s.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.005)
        except OSError:
            s.close()
            raise


class Zmtp:
    """A raw ZMTP peer on a blocking unix socket."""

    def __init__(self, path, timeout=5.0, handshake=True):
        self.s = unix_connect(path, timeout)
        self.buf = bytearray()
        if handshake:
            self.s.sendall(greeting() + ready())
            self.read_greeting()
            self.read_command()  # the broker's READY

    def fill(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError("the broker closed the connection")
            self.buf += chunk

    def read_greeting(self):
        self.fill(64)
        del self.buf[:64]

    def read_frame(self):
        self.fill(2)
        flags = self.buf[0]
        if flags & 2:
            self.fill(9)
            size, hl = struct.unpack(">Q", bytes(self.buf[1:9]))[0], 9
        else:
            size, hl = self.buf[1], 2
        self.fill(hl + size)
        body = bytes(self.buf[hl : hl + size])
        del self.buf[: hl + size]
        return flags, body

    def read_command(self):
        flags, body = self.read_frame()
        if not flags & 4:
            raise ValueError("expected a command frame")
        return body

    def read_message(self):
        """The first frame of the next message; commands (PONG) are
        skipped and counted in self.commands."""
        first = None
        while True:
            flags, body = self.read_frame()
            if flags & 4:
                self.commands = getattr(self, "commands", 0) + 1
                continue
            if first is None:
                first = body
            if not flags & 1:
                return first

    def call(self, body):
        self.s.sendall(frame(body))
        return self.read_message()

    def close(self):
        self.s.close()


def fd_request(lease_id):
    return b"WBF1" + lease_id


SESSION_REQUEST = b"WBS1" + bytes(16)


def fd_read_reply(s):
    """One descriptor-channel reply: (status, message, descriptors)."""
    msg, fds, _flags, _addr = socket.recv_fds(s, 16, 16)
    if not msg:
        raise EOFError("closed")
    while len(msg) < 16:
        more = s.recv(16 - len(msg))
        if not more:
            raise EOFError("closed")
        msg += more
    _magic, status, _n, mlen = struct.unpack("<4siII", msg[:16])
    text = b""
    while len(text) < mlen:
        more = s.recv(mlen - len(text))
        if not more:
            break
        text += more
    for fd in fds:
        os.close(fd)
    return status, text.decode(errors="replace"), len(fds)


def emit(d):
    print(json.dumps(d), flush=True)


def hold_until_released(max_s):
    """Holds until the harness closes our stdin (or max_s passes): the
    hold then ends right when the measurement does."""
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    end = time.monotonic() + max_s
    while time.monotonic() < end:
        if sel.select(timeout=max(0.0, end - time.monotonic())):
            if not os.read(sys.stdin.fileno(), 4096):
                return


# ===================================================================
# Attackers: each bounded in count and time; each prints one JSON line.


def att_fdflood(path, conns, outstanding, seconds):
    """conns descriptor-channel connections, each keeping `outstanding`
    20-byte requests unanswered, for `seconds`."""
    sel = selectors.DefaultSelector()
    socks, state = [], {}
    for _ in range(conns):
        try:
            s = unix_connect(path)
        except OSError:
            continue
        s.setblocking(False)
        req = fd_request(os.urandom(16))
        state[s] = {"in": bytearray(), "out": bytearray(req * outstanding), "req": req}
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        socks.append(s)
    sent = replies = closed = 0
    statuses = {}
    end = time.monotonic() + seconds
    while state and time.monotonic() < end:
        for key, ev in sel.select(timeout=0.2):
            s = key.fileobj
            st = state.get(s)
            if st is None:
                continue
            try:
                if ev & selectors.EVENT_READ:
                    chunk = s.recv(65536)
                    if not chunk:
                        raise ConnectionResetError()
                    st["in"] += chunk
                    buf = st["in"]
                    while len(buf) >= 16:
                        _m, status, _n, mlen = struct.unpack("<4siII", bytes(buf[:16]))
                        if len(buf) < 16 + mlen:
                            break
                        del buf[: 16 + mlen]
                        replies += 1
                        statuses[status] = statuses.get(status, 0) + 1
                        st["out"] += st["req"]
                if st["out"]:
                    n = s.send(st["out"])
                    sent += n // 20
                    del st["out"][:n]
                sel.modify(s, selectors.EVENT_READ | (selectors.EVENT_WRITE if st["out"] else 0))
            except BlockingIOError:
                pass
            except (ConnectionResetError, BrokenPipeError, OSError):
                closed += 1
                sel.unregister(s)
                del state[s]
                s.close()
    for s in list(state):
        s.close()
    emit({"connections": len(socks), "requests_sent": sent, "replies": replies,
          "statuses": {str(k): v for k, v in statuses.items()}, "closed_by_broker": closed})


def att_bigreq(path, conns, nbytes, hold):
    """conns handshaken connections, each sending one complete request of
    nbytes on the wire (frame header included), then idle for `hold`."""
    # A hello whose client string fills the frame: 9-byte header + payload.
    pad = nbytes - 9 - 16
    while True:
        body = request(1, HELLO, pb_bytes(1, b"x" * pad))
        if len(body) + 9 == nbytes:
            break
        pad += nbytes - 9 - len(body)
    msg = frame(body)
    assert len(msg) == nbytes
    peers, refused, replies, statuses = [], 0, 0, {}
    for _ in range(conns):
        try:
            z = Zmtp(path)
            z.s.sendall(msg)
            peers.append(z)
        except (OSError, EOFError):
            refused += 1
    for z in peers:
        try:
            st, _ = reply_status(z.read_message())
            replies += 1
            statuses[st] = statuses.get(st, 0) + 1
        except (OSError, EOFError):
            pass
    emit({"connections": len(peers), "refused": refused, "replies": replies,
          "statuses": {str(k): v for k, v in statuses.items()}, "request_bytes": nbytes})
    hold_until_released(hold)
    closed = sum(1 for z in peers if peer_closed(z.s))
    emit({"held": len(peers) - closed, "closed_by_broker": closed})


def peer_closed(s):
    s.setblocking(False)
    try:
        return s.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def att_fdslots(path, limit, hold):
    """One process opening descriptor-channel connections until the broker
    refuses one or `limit` are open; each asks once (a session request,
    refused for this uid) so that no handshake deadline applies; held."""
    socks, refused, answered = [], 0, 0
    t0 = time.monotonic()
    while len(socks) < limit and not refused and time.monotonic() - t0 < 20:
        batch = []
        for _ in range(min(256, limit - len(socks))):
            try:
                s = unix_connect(path)
            except OSError:
                refused += 1
                break
            try:
                s.sendall(SESSION_REQUEST)
            except OSError:
                refused += 1
                s.close()
                break
            batch.append(s)
        for s in batch:
            try:
                if s.recv(512):
                    answered += 1
                    socks.append(s)
                    continue
            except OSError:
                pass
            refused += 1
            s.close()
    emit({"opened": len(socks), "answered": answered, "refused": refused,
          "open_seconds": round(time.monotonic() - t0, 2)})
    hold_until_released(hold)
    closed = sum(1 for s in socks if peer_closed(s))
    emit({"held": len(socks) - closed, "closed_by_broker": closed})


def att_hold(path, conns, hold):
    """conns handshaken ZMTP connections that then send nothing."""
    peers, refused = [], 0
    for _ in range(conns):
        try:
            peers.append(Zmtp(path))
        except (OSError, EOFError):
            refused += 1
    emit({"opened": len(peers), "refused": refused})
    hold_until_released(hold)
    closed = sum(1 for z in peers if peer_closed(z.s))
    emit({"held": len(peers) - closed, "closed_by_broker": closed})


def heartbeat_records(nbytes):
    """A heartbeat Request of exactly nbytes (or just under) payload: one
    lease with as many empty ContainerRecords (3 bytes each) as fit."""
    rec = pb_bytes(40, b"")

    def build(n):
        beat = pb_bytes(1, os.urandom(16)) + pb_varint(2, 1) + rec * n
        return request(7, HEARTBEAT, pb_bytes(1, beat))

    n = (nbytes - 40) // len(rec)
    while len(build(n)) > nbytes:
        n -= 1
    while len(build(n + 1)) <= nbytes:
        n += 1
    return build(n), n


def att_records(path, conns, nbytes, seconds):
    """conns connections each sending the records heartbeat again and
    again (one outstanding) for `seconds`."""
    body, n = heartbeat_records(nbytes)
    msg = frame(body)
    counts = {"sent": 0, "replies": 0, "closed": 0}
    statuses = {}
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def run():
        try:
            z = Zmtp(path, timeout=seconds + 5)
        except (OSError, EOFError):
            with lock:
                counts["closed"] += 1
            return
        while time.monotonic() < end:
            try:
                z.s.sendall(msg)
                with lock:
                    counts["sent"] += 1
                st, _ = reply_status(z.read_message())
                with lock:
                    counts["replies"] += 1
                    statuses[st] = statuses.get(st, 0) + 1
            except (OSError, EOFError):
                with lock:
                    counts["closed"] += 1
                return
        z.close()

    threads = [threading.Thread(target=run) for _ in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    emit({"records_per_heartbeat": n, "heartbeat_bytes": len(body), "heartbeats_sent": counts["sent"],
          "replies": counts["replies"], "statuses": {str(k): v for k, v in statuses.items()},
          "connections_closed": counts["closed"]})


def att_refused(path, conns, total, seconds, outstanding):
    """`total` bytes of small, well-formed requests spread over `seconds`
    on `conns` connections, at most `outstanding` unanswered on each; the
    replies are read (a peer that does not read is disconnected)."""
    body = request(3, HELLO, pb_bytes(1, b"flood-" + b"x" * 80))
    msg = frame(body)
    sel = selectors.DefaultSelector()
    state = {}
    for _ in range(conns):
        try:
            z = Zmtp(path)
        except (OSError, EOFError):
            continue
        z.s.setblocking(False)
        state[z.s] = {"z": z, "out": bytearray(), "pending": 0}
        sel.register(z.s, selectors.EVENT_READ)
    sent_bytes = sent = replies = closed = 0
    t0 = time.monotonic()
    end = t0 + seconds
    while state and time.monotonic() < end:
        allowed = total * min(1.0, (time.monotonic() - t0) / seconds)
        for s, st in list(state.items()):
            while st["pending"] < outstanding and sent_bytes + len(msg) <= allowed:
                st["out"] += msg
                st["pending"] += 1
                sent_bytes += len(msg)
                sent += 1
            if st["out"]:
                try:
                    n = s.send(st["out"])
                    del st["out"][:n]
                except BlockingIOError:
                    pass
                except OSError:
                    closed += 1
                    sel.unregister(s)
                    del state[s]
        for key, _ev in sel.select(timeout=0.01):
            s = key.fileobj
            st = state.get(s)
            if st is None:
                continue
            z = st["z"]
            try:
                chunk = s.recv(262144)
                if not chunk:
                    raise ConnectionResetError()
                z.buf += chunk
                while True:
                    b = z.buf
                    if len(b) < 2:
                        break
                    hl, size = (9, struct.unpack(">Q", bytes(b[1:9]))[0]) if b[0] & 2 else (2, b[1])
                    if len(b) < hl or len(b) < hl + size:
                        break
                    del b[: hl + size]
                    replies += 1
                    st["pending"] -= 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
                sel.unregister(s)
                del state[s]
        if sent_bytes + len(msg) > total and all(st["pending"] == 0 for st in state.values()):
            break
    emit({"request_bytes": len(msg), "requests_sent": sent, "bytes_sent": sent_bytes, "replies": replies,
          "connections_closed": closed, "seconds": round(time.monotonic() - t0, 2)})


def att_blast(path, unit, total, seconds):
    """One handshaken connection sending `total` bytes made of `unit`
    repeated, without reading, within `seconds` (whatever the broker
    took by then)."""
    try:
        z = Zmtp(path)
    except (OSError, EOFError) as e:
        emit({"error": str(e)})
        return
    count = total // len(unit)
    data = unit * count
    view = memoryview(data)
    z.s.setblocking(False)
    off, t0, closed = 0, time.monotonic(), False
    end = t0 + seconds
    sel = selectors.DefaultSelector()
    sel.register(z.s, selectors.EVENT_WRITE)
    while off < len(data) and time.monotonic() < end:
        if not sel.select(timeout=0.1):
            continue
        try:
            off += z.s.send(view[off : off + 1048576])
        except BlockingIOError:
            pass
        except OSError:
            closed = True
            break
    t_sent = time.monotonic() - t0
    emit({"unit_bytes": len(unit), "units": count, "bytes_sent": off, "units_sent": off // len(unit),
          "seconds_to_send": round(t_sent, 2), "closed_by_broker": closed})
    z.close()


def att_slowloris(port, conns, gap, seconds):
    """conns HTTP connections to 127.0.0.1:port, each sending one byte of a
    request header every `gap` seconds for `seconds`."""
    header = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    socks, refused = [], 0
    for _ in range(conns):
        try:
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            refused += 1
    end = time.monotonic() + seconds
    pos, closed = 0, set()
    while time.monotonic() < end:
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                s.send(header[pos % len(header) : pos % len(header) + 1])
            except OSError:
                closed.add(i)
        pos += 1
        time.sleep(min(gap, max(0.0, end - time.monotonic())))
    for s in socks:
        s.close()
    emit({"opened": len(socks), "refused": refused, "bytes_per_connection": pos,
          "closed_by_server": len(closed)})


def att_pipeline(path, seconds):
    """A PING and a request in one write; then greeting, READY and a request
    in one write. Says whether each reply came without more bytes."""
    req = request(9, LIST_MODELS)
    out = {}
    # (a) after the handshake: PING + request, one write.
    z = Zmtp(path)
    z.s.settimeout(seconds)
    z.s.sendall(PING + frame(req))
    t0 = time.monotonic()
    try:
        st, _ = reply_status(z.read_message())
        out["ping_then_request"] = {"reply": True, "status": st, "seconds": round(time.monotonic() - t0, 3)}
    except socket.timeout:
        z.s.sendall(PING)  # a few more bytes
        z.s.settimeout(2)
        try:
            z.read_message()
            late = True
        except (socket.timeout, OSError, EOFError):
            late = False
        out["ping_then_request"] = {"reply": False, "waited_s": seconds, "reply_after_more_bytes": late}
    z.close()
    # (b) greeting + READY + request, one write.
    z = Zmtp(path, handshake=False)
    z.s.settimeout(seconds)
    z.s.sendall(greeting() + ready() + frame(req))
    t0 = time.monotonic()
    try:
        z.read_greeting()
        z.read_command()
        st, _ = reply_status(z.read_message())
        out["greeting_ready_request"] = {"reply": True, "status": st,
                                         "seconds": round(time.monotonic() - t0, 3)}
    except socket.timeout:
        z.s.sendall(PING)
        z.s.settimeout(2)
        try:
            z.read_message()
            late = True
        except (socket.timeout, OSError, EOFError):
            late = False
        out["greeting_ready_request"] = {"reply": False, "waited_s": seconds, "reply_after_more_bytes": late}
    z.close()
    emit(out)


def att_sessions(fdpath, path, sessions, acquires, model, hold):
    """One process (whose pid the broker cannot see) taking `sessions`
    descriptor-channel sessions, binding a ZeroMQ connection to each and
    acquiring `acquires` leases on each."""
    chans, peers = [], []
    got = {"sessions": 0, "hellos_ok": 0, "leases_ok": 0, "leases_refused": 0}
    errors = {}
    rid = 100
    t0 = time.monotonic()
    for _ in range(sessions):
        if time.monotonic() - t0 > 20:
            break
        try:
            c = unix_connect(fdpath)
        except OSError:
            errors["fd_channel_connect"] = errors.get("fd_channel_connect", 0) + 1
            continue
        try:
            c.sendall(SESSION_REQUEST)
            status, token, _ = fd_read_reply(c)
        except (OSError, EOFError):
            c.close()
            errors["fd_channel_closed"] = errors.get("fd_channel_closed", 0) + 1
            continue
        if status != 0:
            errors[token[:80]] = errors.get(token[:80], 0) + 1
            c.close()
            continue
        got["sessions"] += 1
        chans.append(c)
        try:
            z = Zmtp(path)
            rid += 1
            st, err = reply_status(z.call(request(rid, HELLO, pb_bytes(1, b"sessions") +
                                                  pb_bytes(2, bytes.fromhex(token)))))
        except (OSError, EOFError):
            errors["zmtp_closed"] = errors.get("zmtp_closed", 0) + 1
            continue
        if st != 0:
            errors[err[:80]] = errors.get(err[:80], 0) + 1
            z.close()
            continue
        got["hellos_ok"] += 1
        peers.append(z)
        for _ in range(acquires):
            rid += 1
            try:
                st, err = reply_status(z.call(request(rid, ACQUIRE, pb_bytes(1, model.encode()))))
            except (OSError, EOFError):
                break
            if st == 0:
                got["leases_ok"] += 1
            else:
                got["leases_refused"] += 1
                # One line per kind, not per session id.
                why = re.sub(r"pid \d+", "pid N", err[:120])
                errors[why] = errors.get(why, 0) + 1
    got["zmtp_connections"] = len(peers)
    got["errors"] = errors
    emit(got)
    time.sleep(hold)
    for z in peers:
        z.close()
    for c in chans:
        c.close()


def attacker_main(argv):
    mode, a = argv[0], argv[1:]
    if mode == "fdflood":
        att_fdflood(a[0], int(a[1]), int(a[2]), float(a[3]))
    elif mode == "bigreq":
        att_bigreq(a[0], int(a[1]), int(a[2]), float(a[3]))
    elif mode == "fdslots":
        att_fdslots(a[0], int(a[1]), float(a[2]))
    elif mode == "hold":
        att_hold(a[0], int(a[1]), float(a[2]))
    elif mode == "records":
        att_records(a[0], int(a[1]), int(a[2]), float(a[3]))
    elif mode == "refused":
        att_refused(a[0], int(a[1]), int(a[2]), float(a[3]), int(a[4]))
    elif mode == "blast":
        att_blast(a[0], bytes.fromhex(a[1]), int(a[2]), float(a[3]))
    elif mode == "slowloris":
        att_slowloris(int(a[0]), int(a[1]), float(a[2]), float(a[3]))
    elif mode == "pipeline":
        att_pipeline(a[0], float(a[1]))
    elif mode == "sessions":
        att_sessions(a[0], a[1], int(a[2]), int(a[3]), a[4], float(a[5]))
    else:
        sys.exit("unknown attacker %s" % mode)


# ===================================================================
# The harness.


def write_model(path, n=8, size=4096):
    header, data = {}, bytearray()
    for i in range(n):
        blob = bytes((i * 7 + k * 13) & 0xFF for k in range(size))
        header["layer%d.weight" % i] = {"dtype": "U8", "shape": [size],
                                        "data_offsets": [len(data), len(data) + size]}
        data += blob
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + bytes(data))


def write_big_index(path, entries, shard):
    """A model.safetensors.index.json of `entries` tensors, all in `shard`."""
    with open(path, "w") as f:
        f.write('{"metadata":{"total_size":%d},"weight_map":{' % (entries * 4))
        chunk = []
        for i in range(entries):
            chunk.append('"t%07d":"%s"' % (i, shard))
            if len(chunk) == 10000:
                f.write(",".join(chunk))
                f.write("," if i + 1 < entries else "")
                chunk = []
        f.write(",".join(chunk))
        f.write("}}\n")


def proc_status(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def proc_cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_of(pid):
    kids = []
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                kids += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return kids


class Broker:
    def __init__(self, h, name, extra, pidns=False):
        self.h, self.name, self.extra, self.pidns = h, name, extra, pidns
        self.log = os.path.join(h.tmp, "broker-%s.log" % name)
        self.proc = None
        self.pid = None

    def args(self):
        return ["--backend", "host", "--host-slab", "memfd", "--socket", self.h.sock,
                "--model", "m=" + self.h.model, "--allow-uid", str(ALLOWED_UID),
                "--admin-uid", str(ADMIN_UID)] + self.extra

    def ctl(self, *args, timeout_ms=PROBE_TIMEOUT_MS):
        cmd = [self.h.wbctl, "--socket", self.h.sock, "--timeout-ms", str(timeout_ms)] + list(args)
        if self.pidns:
            cmd = ["nsenter", "--target", str(self.pid), "--pid", "--mount"] + cmd
        return cmd

    def start(self):
        cmd = [self.h.wbrokerd] + self.args()
        if self.pidns:
            cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"] + cmd
        logf = open(self.log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        logf.close()
        deadline = time.monotonic() + 15
        self.pid = self.proc.pid
        if self.pidns:
            while time.monotonic() < deadline and not children_of(self.proc.pid):
                time.sleep(0.02)
            kids = children_of(self.proc.pid)
            if not kids:
                raise RuntimeError("unshare started no broker")
            self.pid = kids[0]
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the broker exited: %s" % open(self.log).read()[-2000:])
            r = subprocess.run(self.ctl("stats"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode == 0:
                return self
            time.sleep(0.05)
        raise RuntimeError("the broker did not answer: %s" % open(self.log).read()[-2000:])

    def sample(self):
        st = proc_status(self.pid)
        return {"rss_kb": st["VmRSS"], "hwm_kb": st["VmHWM"],
                "fds": len(os.listdir("/proc/%d/fd" % self.pid)),
                "log_bytes": os.path.getsize(self.log), "cpu_s": proc_cpu_s(self.pid)}

    def stop(self):
        if self.proc is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class Probe:
    """Runs one command again and again in a thread; records each call's
    wall time and exit status."""

    def __init__(self, cmd, label, timeout_s=10.0):
        self.cmd, self.label, self.timeout_s = cmd, label, timeout_s
        self.calls, self.stop_ev, self.thread = [], threading.Event(), None

    def run(self):
        while not self.stop_ev.is_set():
            t0 = time.monotonic()
            try:
                r = subprocess.run(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=self.timeout_s)
                rc = r.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
            self.calls.append(((time.monotonic() - t0) * 1000.0, rc))
            self.stop_ev.wait(PROBE_GAP_S)

    def start(self):
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.stop_ev.set()
        if self.thread:
            self.thread.join()
        return self.summary()

    def summary(self):
        lat = [c[0] for c in self.calls]
        codes = {}
        for _, rc in self.calls:
            codes[str(rc)] = codes.get(str(rc), 0) + 1
        return {"probe": self.label, "calls": len(lat),
                "median_ms": round(statistics.median(lat), 1) if lat else None,
                "max_ms": round(max(lat), 1) if lat else None,
                "failures": sum(1 for c in self.calls if c[1] != 0), "exit_codes": codes,
                "over_limit": sum(1 for x in lat if x > MAX_LATENCY_MS)}


def curl_probe(port):
    return Probe(["curl", "-sf", "-o", "/dev/null", "--max-time", "2",
                  "http://127.0.0.1:%d/metrics" % port], "curl /metrics")


class Harness:
    def __init__(self, build, keep):
        self.build = os.path.abspath(build)
        self.wbrokerd = os.path.join(self.build, "broker", "wbrokerd")
        self.wbctl = os.path.join(self.build, "tools", "wbctl", "wbctl")
        self.worker = os.path.join(self.build, "examples", "wb-demo-worker")
        for b in (self.wbrokerd, self.wbctl, self.worker):
            if not os.access(b, os.X_OK):
                sys.exit("attacks.py: missing executable %s (build every target first)" % b)
        self.keep = keep
        self.tmp = tempfile.mkdtemp(prefix="wbattacks.")
        os.chmod(self.tmp, 0o755)
        # The socket directory: group 65534 with the set-group-ID bit, so
        # that the sockets (0660) admit uid 65534 and the attackers reach
        # the broker, which then refuses them by uid.
        run = os.path.join(self.tmp, "run")
        os.mkdir(run)
        os.chown(run, 0, NOBODY)
        os.chmod(run, 0o2750)
        self.sock = os.path.join(run, "broker.sock")
        self.fdsock = self.sock + ".fd"
        self.model = os.path.join(self.tmp, "model.safetensors")
        write_model(self.model)
        os.chmod(self.model, 0o644)
        self.script = os.path.join(self.tmp, "attacks.py")
        shutil.copy(os.path.abspath(__file__), self.script)
        os.chmod(self.script, 0o644)
        self.attackers = []

    def cleanup(self):
        for p in self.attackers:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.keep:
            print("kept %s" % self.tmp, file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def attacker(self, mode, *args, uid=NOBODY, gid=NOBODY):
        """Starts one attacker process (as uid, with nice); its stdout is
        read by collect()."""
        cmd = ["nice", "-n", str(ATTACKER_NICE)]
        if uid != 0:
            cmd += ["setpriv", "--reuid", str(uid), "--regid", str(gid), "--clear-groups"]
        cmd += [PYTHON, self.script, "--attacker", mode] + [str(a) for a in args]
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=self.tmp)
        self.attackers.append(p)
        return p

    @staticmethod
    def readline(p, timeout):
        """The attacker's next JSON line, or None by the deadline."""
        sel = selectors.DefaultSelector()
        sel.register(p.stdout, selectors.EVENT_READ)
        if not sel.select(timeout=timeout):
            return None
        line = p.stdout.readline()
        return json.loads(line) if line.strip() else None

    @staticmethod
    def collect(p, timeout):
        """Every JSON line the attacker printed; it is killed at the deadline."""
        try:
            # communicate closes the attacker's stdin: that releases a
            # holding attacker.
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        lines = [json.loads(x) for x in out.splitlines() if x.strip().startswith("{")]
        res = {}
        for d in lines:
            res.update(d)
        if p.returncode not in (0, None) and not lines:
            res["error"] = err.strip()[-300:]
        return res


def check(checks, name, ok, value, limit, fail_text):
    checks.append({"check": name, "ok": bool(ok), "value": value, "limit": limit,
                   "fail": None if ok else fail_text})


def stalled(client):
    """More than one call over MAX_LATENCY_MS, or one over MAX_OUTLIER_MS:
    a lone call a little over the limit is what a shared machine does
    now and then, a broker that stalls makes more or longer ones."""
    return client["over_limit"] > 1 or client["max_ms"] > MAX_OUTLIER_MS


def standard_checks(checks, client, before, after, skip=()):
    if client and client["calls"] and "latency" not in skip:
        check(checks, "allowed_client_failures", client["failures"] <= MAX_FAILURES,
              client["failures"], MAX_FAILURES,
              "locked out (%d/%d %s failed, exit %s)" % (client["failures"], client["calls"], client["probe"],
                                                      ",".join(k for k in client["exit_codes"] if k != "0")))
        check(checks, "allowed_client_max_ms", not stalled(client), client["max_ms"],
              [MAX_LATENCY_MS, MAX_OUTLIER_MS], "stalled (max %.0f ms)" % client["max_ms"])
    growth = after["rss_kb"] - before["rss_kb"]
    check(checks, "rss_growth_kb", growth <= MAX_RSS_GROWTH_KB, growth, MAX_RSS_GROWTH_KB,
          "RSS +%.1f MB" % (growth / 1024))
    drift = after["fds"] - before["fds"]
    check(checks, "fd_drift", abs(drift) <= MAX_FD_DRIFT, drift, MAX_FD_DRIFT,
          "fds %d -> %d" % (before["fds"], after["fds"]))
    log = after["log_bytes"] - before["log_bytes"]
    check(checks, "log_growth_bytes", log <= MAX_LOG_GROWTH, log, MAX_LOG_GROWTH,
          "log +%.1f MB" % (log / 1e6))


def verdict(checks):
    bad = [c["fail"] for c in checks if not c["ok"]]
    return "refused/bounded" if not bad else "; ".join(bad)


def run_attack(h, key, name, size, body, extra=(), pidns=False, probe_kind="wbctl"):
    """A fresh broker; the allowed client alone; `body` runs the attack,
    starting the probe (ctx["probe"]) itself around the part that counts;
    then the broker settles and is measured again. A broker that dies
    under the attack is the verdict."""
    t_start = time.monotonic()
    b = Broker(h, key, list(extra), pidns=pidns).start()
    try:
        base = Probe(b.ctl("models"), "wbctl models").start()
        time.sleep(BASELINE_S)
        baseline = base.stop()
        before = b.sample()
        ctx = {"broker": b, "probe": Probe(b.ctl("models"), "wbctl models"), "checks": [],
               "before": before}
        if probe_kind == "curl":
            ctx["curl"] = curl_probe(h.metrics_port)
        t0 = time.monotonic()
        try:
            details = body(h, b, ctx)
        finally:
            for p in (ctx["probe"], ctx.get("curl")):
                if p and p.thread and not p.stop_ev.is_set():
                    p.stop()
        attack_s = time.monotonic() - t0
        crashed = b.proc.poll()
        if crashed is None:
            end_sample = b.sample()
            time.sleep(SETTLE_S)
            crashed = b.proc.poll()
        if crashed is None:
            after = b.sample()
    finally:
        b.stop()
    client = ctx["probe"].summary() if ctx["probe"].thread else None
    shown = ctx["curl"].summary() if probe_kind == "curl" else client
    checks = ctx["checks"]
    if crashed is not None:
        check(checks, "broker_alive", False, crashed, None, "broker died (status %s)" % crashed)
        after = end_sample = dict(before, rss_kb=0, hwm_kb=0, fds=0, log_bytes=os.path.getsize(b.log))
    else:
        # With curl as the allowed client, wbctl's figures are reported
        # (wbctl_during) but not judged.
        standard_checks(checks, shown, before, after, skip=ctx.get("skip", ()))
    res = {
        "attack": key, "name": name, "size": size,
        "broker_args": ([] if not pidns else ["(in a pid namespace of its own)"]) + b.args(),
        "allowed_client": shown, "allowed_client_baseline": baseline,
        "rss_kb": {"before": before["rss_kb"], "after": after["rss_kb"], "peak": after["hwm_kb"],
                   "peak_before": before["hwm_kb"]},
        "fds": {"before": before["fds"], "at_end": end_sample["fds"], "after": after["fds"]},
        "log_bytes": after["log_bytes"] - before["log_bytes"],
        "cpu_s": round(after["cpu_s"] - before["cpu_s"], 2),
        "attack_seconds": round(attack_s, 1),
        "details": details, "checks": checks, "result": verdict(checks),
        "wall_seconds": round(time.monotonic() - t_start, 1),
    }
    if probe_kind == "curl":
        res["wbctl_during"] = client
    return scrub(res, h.tmp)


def scrub(obj, tmp):
    """The result without this run's temporary directory in its strings."""
    if isinstance(obj, str):
        return obj.replace(tmp, "$TMP")
    if isinstance(obj, list):
        return [scrub(x, tmp) for x in obj]
    if isinstance(obj, dict):
        return {k: scrub(v, tmp) for k, v in obj.items()}
    return obj


# --- The attacks. Each body returns what the attack itself got.


def attack_1(h, b, ctx):
    """Descriptor channel flood, as root (unknown lease ids) and as uid
    65534 (refused) at once."""
    conns, outstanding, secs = 200, 100, 10.0
    ctx["probe"].start()
    root = h.attacker("fdflood", h.fdsock, conns, outstanding, secs, uid=0)
    nob = h.attacker("fdflood", h.fdsock, conns, outstanding, secs)
    r = {"root": h.collect(root, secs + 20), "uid_65534": h.collect(nob, secs + 20)}
    ctx["probe"].stop()
    return r


def attack_4(h, b, ctx):
    """64 connections of uid 65534 (4 processes x 16, the per-process cap)
    each send one complete 1 MiB request and stay idle."""
    hold, window = 60.0, 6.5
    procs = [h.attacker("bigreq", h.sock, 16, 1 << 20, hold) for _ in range(4)]
    first = [h.readline(p, 30) for p in procs]
    time.sleep(0.5)
    ctx["probe"].start()
    time.sleep(window)
    ctx["probe"].stop()
    # A new client once the requests were answered: today it exits 69.
    r = subprocess.run(b.ctl("models"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rest = [h.collect(p, hold + 10) for p in procs]
    check(ctx["checks"], "new_client_after_requests", r.returncode == 0, r.returncode, 0,
          "new wbctl models exits %d" % r.returncode)
    return {"attackers": [dict(f or {}, **g) for f, g in zip(first, rest)],
            "new_client_exit": r.returncode, "new_client_stderr": r.stderr.strip()[-200:]}


def run_worker(h, b, timeout=15):
    env = dict(os.environ, WB_TIMEOUT_MS="3000")
    t0 = time.monotonic()
    try:
        r = subprocess.run([h.worker, "--socket", h.sock, "--model", "m", "--hold", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           timeout=timeout)
        rc, err, out = r.returncode, r.stderr, r.stdout
    except subprocess.TimeoutExpired as e:
        rc, err, out = "timeout", (e.stderr or b"").decode(errors="replace"), ""
    return {"exit": rc, "verified": "verified" in out, "seconds": round(time.monotonic() - t0, 2),
            "stderr": err.strip()[-240:]}


def attack_5a(h, b, ctx):
    """One uid-65534 process holding as many descriptor-channel
    connections as the broker takes (up to 4096)."""
    hold = 60.0
    p = h.attacker("fdslots", h.fdsock, 4096, hold)
    opened = h.readline(p, 40)
    ctx["probe"].start()
    t0 = time.monotonic()
    w = run_worker(h, b)
    time.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))
    ctx["probe"].stop()
    held_fds = b.sample()["fds"]
    rest = h.collect(p, hold + 10)
    check(ctx["checks"], "allowed_descriptor_fetch", w["exit"] == 0 and w["verified"], w["exit"], 0,
          "allowed worker's descriptor fetch fails (exit %s)" % w["exit"])
    return {"attacker": dict(opened or {}, **rest), "allowed_worker": w, "broker_fds_while_held": held_fds}


def attack_5b(h, b, ctx):
    """4 refused processes x 16 handshaken connections on the main socket
    against --max-peers 64."""
    hold, window = 60.0, 6.5
    procs = [h.attacker("hold", h.sock, 16, hold) for _ in range(4)]
    first = [h.readline(p, 20) for p in procs]
    ctx["probe"].start()
    time.sleep(window)
    ctx["probe"].stop()
    held_fds = b.sample()["fds"]
    rest = [h.collect(p, hold + 10) for p in procs]
    return {"attackers": [dict(f or {}, **g) for f, g in zip(first, rest)], "broker_fds_while_held": held_fds}


def attack_6(h, b, ctx):
    """A 1 MiB heartbeat of empty ContainerRecords, again and again from 16
    connections of uid 65534."""
    secs = 8.0
    ctx["probe"].start()
    p = h.attacker("records", h.sock, 16, 1 << 20, secs)
    r = h.collect(p, secs + 30)
    ctx["probe"].stop()
    peak = proc_status(b.pid)["VmHWM"]
    growth = peak - ctx["before"]["rss_kb"]
    check(ctx["checks"], "peak_growth_kb", growth <= MAX_PEAK_GROWTH_KB, growth, MAX_PEAK_GROWTH_KB,
          "peak RSS +%.1f MB" % (growth / 1024))
    return dict(r, peak_kb=peak)


def attack_7a(h, b, ctx):
    """3 MB of refused (well-formed) requests from uid 65534 in 5 s."""
    secs = 5.0
    ctx["probe"].start()
    p = h.attacker("refused", h.sock, 8, 3_000_000, secs, 32)
    r = h.collect(p, secs + 20)
    ctx["probe"].stop()
    return r


def attack_7b(h, b, ctx):
    """2 MB of tiny malformed messages (two empty frames each, 4 bytes)
    from uid 65534, none of which reaches the uid check."""
    secs = 8.0
    ctx["probe"].start()
    p = h.attacker("blast", h.sock, (frame(b"", more=True) + frame(b"")).hex(), 2_000_000, secs)
    r = h.collect(p, secs + 20)
    time.sleep(1.0)
    ctx["probe"].stop()
    return r


def attack_8(h, b, ctx):
    """One root process whose pid the broker cannot see (the broker is in a
    pid namespace of its own) taking many sessions."""
    sessions, acquires, hold = 100, 8, 3.0
    ctx["probe"].start()
    p = h.attacker("sessions", h.fdsock, h.sock, sessions, acquires, "m", hold, uid=0)
    first = h.readline(p, 40) or {}
    r = subprocess.run(b.ctl("leases", "--json"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True)
    try:
        leases = json.loads(r.stdout)
        held = len(leases)
        holders = len({l.get("session", l.get("pid")) for l in leases})
    except ValueError:
        held = holders = None
    rest = h.collect(p, hold + 10)
    ctx["probe"].stop()
    # A pid the broker cannot see bounds nothing by itself: the uid's
    # sessions are bounded (--max-sessions-per-uid, 64 by default) and share
    # one quota of leases. (Before that bound, one process held as many
    # sessions as it asked for, and per-session quotas.)
    per_uid, per_client = 64, 4
    check(ctx["checks"], "sessions_per_uid", first.get("hellos_ok", 0) <= per_uid,
          first.get("hellos_ok"), per_uid,
          "one uid holds %s sessions / connections (--max-sessions-per-uid %d)" %
          (first.get("hellos_ok"), per_uid))
    check(ctx["checks"], "leases_per_uid", (held or 0) <= per_client, held, per_client,
          "one uid's sessions hold %s leases (--max-leases-per-client %d)" % (held, per_client))
    return dict(first, **rest, leases_listed=held, distinct_holders=holders)


def attack_9(h, b, ctx):
    """32 connections to /metrics trickling one header byte every 2 s."""
    secs = 20.0
    p = h.attacker("slowloris", h.metrics_port, 32, 2.0, secs)
    time.sleep(0.5)
    ctx["curl"].start()
    ctx["probe"].start()
    r = h.collect(p, secs + 10)
    ctx["probe"].stop()
    ctx["curl"].stop()
    return r


def attack_10a(h, b, ctx):
    """PING + request in one write; greeting + READY + request in one
    write (as root: the replies are real)."""
    ctx["skip"] = ("latency",)
    p = h.attacker("pipeline", h.sock, MAX_REPLY_WAIT_S, uid=0)
    r = h.collect(p, 20)
    for k in ("ping_then_request", "greeting_ready_request"):
        got = r.get(k, {})
        check(ctx["checks"], k, got.get("reply", False), got.get("seconds"), MAX_REPLY_WAIT_S,
              "%s: no reply until more bytes came" % k.replace("_", " "))
    return r


def blast_cpu(h, b, unit, nbytes, secs):
    """Broker CPU seconds to take nbytes of `unit` frames on one
    connection, waiting until its CPU time stops growing."""
    cpu0 = proc_cpu_s(b.pid)
    p = h.attacker("blast", h.sock, unit.hex(), nbytes, secs, uid=0)
    r = h.collect(p, secs + 10)
    last, t_end = -1.0, time.monotonic() + 20
    while time.monotonic() < t_end:
        cpu = proc_cpu_s(b.pid)
        if cpu - last < 0.02:
            break
        last = cpu
        time.sleep(0.3)
    r["broker_cpu_s"] = round(proc_cpu_s(b.pid) - cpu0, 2)
    return r


def attack_10c(h, b, ctx):
    """8 MB of tiny frames (7-byte PONG commands, which the broker parses
    and drops: no reply, no log line) on one connection, as root; first
    the same 8 MB as 4 KiB PONGs, the floor of reading 8 MB."""
    secs = 20.0
    floor = blast_cpu(h, b, frame(b"\x04PONG" + b"x" * 4000, command=True), 8_000_000, secs)
    ctx["probe"].start()
    r = blast_cpu(h, b, PONG, 8_000_000, secs)
    ctx["probe"].stop()
    cpu = r["broker_cpu_s"]
    check(ctx["checks"], "broker_cpu_s_8mb", cpu <= MAX_CPU_S_8MB, cpu, MAX_CPU_S_8MB,
          "%.2f CPU s for 8 MB of 7-byte frames (%.2f s as 4 KiB frames)" % (cpu, floor["broker_cpu_s"]))
    return {"tiny_frames": r, "large_frames_floor": floor}


def attack_11(h, b, ctx):
    """An administrator (uid 65533, not root) loads a sharded index of 1.5M
    entries (about 40 MB of JSON)."""
    d = os.path.join(h.tmp, "big")
    os.mkdir(d)
    os.chmod(d, 0o755)
    shard = "s.safetensors"  # short, so that 1.5M entries are about 40 MB
    write_model(os.path.join(d, shard), n=1, size=64)
    index = os.path.join(d, "model.safetensors.index.json")
    write_big_index(index, 1_500_000, shard)
    for f in os.listdir(d):
        os.chmod(os.path.join(d, f), 0o644)
    ctx["probe"].start()
    time.sleep(0.3)
    cmd = ["setpriv", "--reuid", str(ADMIN_UID), "--regid", str(NOBODY), "--clear-groups",
           h.wbctl, "--socket", h.sock, "--timeout-ms", "60000", "load", "big", index]
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=90)
    took = time.monotonic() - t0
    time.sleep(0.3)
    ctx["probe"].stop()
    return {"index_bytes": os.path.getsize(index), "entries": 1_500_000, "load_exit": r.returncode,
            "load_seconds": round(took, 2), "load_stderr": r.stderr.strip()[-300:],
            "peak_kb": proc_status(b.pid)["VmHWM"]}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


ATTACKS = [
    ("1", "descriptor channel flood",
     "200 conns as root + 200 as uid 65534, 100 requests outstanding each, 10 s", attack_1, {}),
    ("4", "buffered-bytes lockout",
     "64 conns of uid 65534 (4 procs x 16), one complete 1 MiB request each, idle", attack_4, {}),
    ("5a", "descriptor channel slots",
     "1 uid-65534 process, up to 4096 fd-channel conns held; allowed worker fetches", attack_5a, {}),
    ("5b", "main socket slots", "4 uid-65534 procs x 16 handshaken conns, --max-peers 64", attack_5b,
     {"extra": ["--max-peers", "64"]}),
    ("6", "container records heartbeat",
     "1 MiB heartbeat of 349,514 empty ContainerRecords, repeated on 16 conns of uid 65534, 8 s", attack_6, {}),
    ("7a", "log flood: refused requests", "3 MB of 96-byte refused requests in 5 s (uid 65534)",
     attack_7a, {}),
    ("7b", "log flood: malformed before auth",
     "2 MB of 4-byte two-frame messages (uid 65534), one conn", attack_7b, {}),
    ("8", "many sessions from one process",
     "1 hidden process, 100 sessions tried x 8 acquires, --max-leases-per-client 4", attack_8,
     {"extra": ["--max-leases-per-client", "4"], "pidns": True}),
    ("9", "metrics slowloris", "32 conns, 1 header byte / 2 s, 20 s; curl scrapes", attack_9,
     {"probe_kind": "curl"}),
    ("10a", "ZMTP pipelined bytes",
     "PING+request in one write; greeting+READY+request in one write (root)", attack_10a, {}),
    ("10c", "ZMTP tiny frames", "8 MB of 7-byte PONG frames (1.14M), one conn (root)", attack_10c, {}),
    ("11", "admin load of a huge index",
     "1.5M-entry model.safetensors.index.json (~40 MB), admin uid 65533", attack_11, {}),
]


def fmt_kb(v):
    return "{:,}".format(v)


def table(results):
    rows = ["| attack | size | allowed client median / max ms (failures) | RSS before / after kB (peak) "
            "| fds before / after | log bytes | result |", "|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["allowed_client"]
        if c and c["calls"]:
            lat = "%.0f / %.0f (%d/%d)" % (c["median_ms"], c["max_ms"], c["failures"], c["calls"])
            if c["probe"] != "wbctl models":
                lat += " " + c["probe"]
        else:
            lat = "-"
        rows.append("| %s %s | %s | %s | %s / %s (%s) | %d / %d | %s | %s |" % (
            r["attack"], r["name"], r["size"], lat, fmt_kb(r["rss_kb"]["before"]),
            fmt_kb(r["rss_kb"]["after"]), fmt_kb(r["rss_kb"]["peak"]), r["fds"]["before"],
            r["fds"]["after"], "{:,}".format(r["log_bytes"]), r["result"]))
    return "\n".join(rows)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--attacker":
        attacker_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description="Bounded denial-of-service attacks on a real broker.")
    ap.add_argument("--build", required=True, help="the build directory")
    ap.add_argument("--out", required=True, help="the JSON file to write (a list)")
    ap.add_argument("--only", default="", help="comma-separated attack keys (default: all)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("attacks.py: needs root (setpriv to uid 65534, pid namespaces)")
    for tool in ("setpriv", "unshare", "nsenter", "curl", "nice"):
        if not shutil.which(tool):
            sys.exit("attacks.py: %s is needed" % tool)
    only = {x for x in a.only.split(",") if x}
    h = Harness(a.build, a.keep)
    h.metrics_port = free_port()
    results = []
    commit = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short",
                             "HEAD"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
    run_info = {"date": datetime.date.today().isoformat(), "commit": commit, "cpus": os.cpu_count(),
                "kernel": os.uname().release}
    t0 = time.monotonic()
    errors = 0
    try:
        for key, name, size, body, opts in ATTACKS:
            if only and key not in only:
                continue
            extra = list(opts.get("extra", []))
            if opts.get("probe_kind") == "curl":
                extra += ["--metrics", "127.0.0.1:%d" % h.metrics_port]
            print("attack %s: %s ..." % (key, name), file=sys.stderr, flush=True)
            try:
                r = run_attack(h, key, name, size, body, extra=extra, pidns=opts.get("pidns", False),
                               probe_kind=opts.get("probe_kind", "wbctl"))
            except Exception as e:  # one attack's harness failure does not end the run
                print("attack %s: harness error: %r" % (key, e), file=sys.stderr, flush=True)
                errors += 1
                continue
            r["run"] = run_info
            results.append(r)
            print("attack %s: %s (%.0f s)" % (key, r["result"], r["wall_seconds"]), file=sys.stderr, flush=True)
    finally:
        h.cleanup()
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(table(results))
    print("\n%d attacks in %.0f s. Thresholds: allowed client %d failures, every call <= %d ms but one "
          "(<= %d ms); RSS +%d kB after, peak +%d kB (6); fds +-%d; log +%d bytes; %.2f CPU s (10c); "
          "replies within %.0f s (10a)" % (
              len(results), time.monotonic() - t0, MAX_FAILURES, MAX_LATENCY_MS, MAX_OUTLIER_MS,
              MAX_RSS_GROWTH_KB, MAX_PEAK_GROWTH_KB, MAX_FD_DRIFT, MAX_LOG_GROWTH, MAX_CPU_S_8MB,
              MAX_REPLY_WAIT_S))
    if errors:
        sys.exit("attacks.py: %d attacks could not be run" % errors)


if __name__ == "__main__":
    main()
