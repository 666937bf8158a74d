#!/usr/bin/env python3
"""A raw ZMTP peer that speaks the few protobuf messages of subscriptions
(no libzmq, no protobuf package), for the version notice tests:

  version_peer.py watch SOCK MODEL SECONDS
      subscribes to MODEL, prints "subscribed version=V", then for SECONDS
      prints each message as it comes: "notice model=M version=V
      previous=P" for a VersionNotice, and after each heartbeat it sends
      (one every 0.2 s) "current model=M version=V ..." from the reply
  version_peer.py plain SOCK SECONDS
      never subscribes: one stats request, then for SECONDS counts what
      else comes; prints "unsolicited=N" (only replies to its heartbeats
      are expected: "heartbeats=H")
  version_peer.py noread SOCK MODEL SECONDS
      subscribes, prints "subscribed version=V", then reads nothing for
      SECONDS and exits
  version_peer.py rollouts SOCK MODEL COUNT PATH...
      COUNT rollouts of MODEL, one after another, from the PATHs in turn,
      each waiting for its reply; prints "done=N failed=F max_ms=X"
  version_peer.py publish SOCK MODEL SPEC [OPTION...]
      publishes a version of MODEL from this process's memory: SPEC is
      NAME:DTYPE:D0xD1...:FILL,... (F32 tensors of FILL's float value; a
      scalar has shape "-"), the table of PublishBeginRequest; the bytes go
      in one memfd sent on "<SOCK>.fd", placed one after another. Prints
      "begin status=S version=V bytes=B", "fd status=S", "commit status=S
      version=V previous=P copied=C kept=K" ("error=TEXT" after a refusal,
      and the process exits 1). OPTIONs: partial (PublishBeginRequest.
      partial), placement=TEXT, abort (abort instead of committing: prints
      "abort status=S"), hold-begin / hold-fd (after the begin / the memfd,
      print "holding" and sleep until killed), place=NAME,... (place only
      these tensors at commit), commits=N (publish N versions one after
      another on one connection, the fill growing by one each time)
"""
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zmtp_peer  # noqa: E402


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(num, data):
    return varint(num << 3 | 2) + varint(len(data)) + data


def field_varint(num, v):
    return varint(num << 3) + varint(v)


def request(rid, body_num, body):
    return field_varint(1, 1) + field_varint(2, rid) + field_bytes(body_num, body)


def subscribe(rid, model):
    return request(rid, 43, field_bytes(1, model.encode()))


def heartbeat(rid):
    return request(rid, 13, b"")


def stats(rid):
    return request(rid, 18, b"")


def fields(buf):
    """(number, wire type, value) of each top-level field."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = read_varint(buf, pos)
        elif wt == 2:
            n, pos = read_varint(buf, pos)
            v = buf[pos : pos + n]
            pos += n
        elif wt == 1:
            v = buf[pos : pos + 8]
            pos += 8
        elif wt == 5:
            v = buf[pos : pos + 4]
            pos += 4
        else:
            raise ValueError("wire type %d" % wt)
        yield num, wt, v


def read_varint(buf, pos):
    v = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, pos


def notice(buf):
    d = {1: b"", 2: 0, 3: 0}
    for num, _, v in fields(buf):
        d[num] = v
    return d[1].decode(), d[2], d[3]


def reply(buf):
    """(id, status, body number, body bytes) of a Reply."""
    rid, status, body_num, body = 0, 0, 0, b""
    for num, _, v in fields(buf):
        if num == 2:
            rid = v
        elif num == 3:
            status = (v >> 1) ^ -(v & 1)
        elif num >= 10:
            body_num, body = num, v
    return rid, status, body_num, body


class Reader:
    def __init__(self, s):
        self.s = s
        self.buf = b""

    def messages(self, timeout):
        """The message frames that arrive within timeout seconds."""
        self.s.settimeout(timeout)
        try:
            chunk = self.s.recv(65536)
        except (TimeoutError, OSError):
            chunk = None
        if chunk == b"":
            raise EOFError()
        if chunk:
            self.buf += chunk
        out = []
        while len(self.buf) >= 2:
            flags = self.buf[0]
            hl, size = (9, struct.unpack(">Q", self.buf[1:9])[0]) if flags & 2 else (2, self.buf[1])
            if len(self.buf) < hl + size:
                break
            body = self.buf[hl : hl + size]
            self.buf = self.buf[hl + size :]
            if not flags & 4:
                out.append(body)
        return out

    def wait_reply(self, rid, seconds):
        end = time.time() + seconds
        while time.time() < end:
            for m in self.messages(0.1):
                r = reply(m)
                if r[0] == rid:
                    return r
        sys.exit("no reply to request %d" % rid)


def do_subscribe(path, model):
    s = zmtp_peer.handshake(path)
    rd = Reader(s)
    s.sendall(zmtp_peer.frame(subscribe(1, model)))
    _, status, body_num, body = rd.wait_reply(1, 5)
    if status != 0 or body_num != 43:
        sys.exit("subscribe failed: status %d" % status)
    version = 0
    for num, _, v in fields(body):
        if num == 1:
            version = v
    print("subscribed version=%d" % version, flush=True)
    return s, rd


def watch(path, model, seconds):
    s, rd = do_subscribe(path, model)
    end = time.time() + seconds
    next_beat, rid = time.time(), 100
    while time.time() < end:
        if time.time() >= next_beat:
            rid += 1
            s.sendall(zmtp_peer.frame(heartbeat(rid)))
            next_beat = time.time() + 0.2
        try:
            msgs = rd.messages(0.05)
        except EOFError:
            print("closed", flush=True)
            return
        for m in msgs:
            r_id, status, body_num, body = reply(m)
            if body_num == 44:
                print("notice model=%s version=%d previous=%d" % notice(body) +
                      (" id=%d status=%d" % (r_id, status)), flush=True)
            elif body_num == 13:
                cur = [notice(v) for num, _, v in fields(body) if num == 4]
                print("current " + " ".join("model=%s version=%d" % (c[0], c[1]) for c in cur),
                      flush=True)


def plain(path, seconds):
    s = zmtp_peer.handshake(path)
    rd = Reader(s)
    s.sendall(zmtp_peer.frame(stats(1)))
    rd.wait_reply(1, 5)
    end = time.time() + seconds
    other = beats = 0
    next_beat, rid = time.time(), 100
    while time.time() < end:
        if time.time() >= next_beat:
            rid += 1
            s.sendall(zmtp_peer.frame(heartbeat(rid)))
            next_beat = time.time() + 0.2
        for m in rd.messages(0.05):
            r_id, status, body_num, body = reply(m)
            if body_num == 13 and r_id > 100:
                beats += 1
                if any(num == 4 for num, _, _ in fields(body)):
                    other += 1
            else:
                other += 1
    print("unsolicited=%d heartbeats=%d" % (other, beats), flush=True)


def rollouts(path, model, count, paths):
    s = zmtp_peer.handshake(path)
    rd = Reader(s)
    done = failed = 0
    worst = 0.0
    for i in range(count):
        body = field_bytes(1, model.encode()) + field_bytes(2, paths[i % len(paths)].encode())
        t0 = time.time()
        s.sendall(zmtp_peer.frame(request(i + 1, 41, body)))
        _, status, _, _ = rd.wait_reply(i + 1, 10)
        worst = max(worst, time.time() - t0)
        done += 1
        failed += status != 0
    print("done=%d failed=%d max_ms=%d" % (done, failed, worst * 1000), flush=True)


def publish_spec(spec):
    out = []
    for item in spec.split(","):
        name, dtype, shape, fill = item.split(":")
        dims = [] if shape == "-" else [int(d) for d in shape.split("x")]
        out.append((name, dtype, dims, float(fill)))
    return out


def tensor_bytes(dims, fill):
    n = 1
    for d in dims:
        n *= d
    return struct.pack("<%df" % n, *([fill] * n))


def say_error(what, status, body_or_err):
    print("%s status=%d" % (what, status), flush=True)
    print("error=%s" % body_or_err, flush=True)
    sys.exit(1)


def reply_error(buf):
    for num, _, v in fields(buf):
        if num == 4:
            return v.decode("utf-8", "replace")
    return ""


def wait_full(rd, rid, seconds):
    end = time.time() + seconds
    while time.time() < end:
        for m in rd.messages(0.1):
            r = reply(m)
            if r[0] == rid:
                return r + (reply_error(m),)
    sys.exit("no reply to request %d" % rid)


def send_fd(path, pid, fd):
    import socket
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(path + ".fd")
    socket.send_fds(c, [b"WBP1" + pid], [fd])
    hdr = b""
    while len(hdr) < 16:
        chunk = c.recv(16 - len(hdr))
        if not chunk:
            sys.exit("the descriptor channel closed")
        hdr += chunk
    _, status, _, n = struct.unpack("<4siII", hdr)
    msg = c.recv(n) if n else b""
    return c, status, msg.decode("utf-8", "replace")


def publish(path, model, spec, opts):
    table = publish_spec(spec)
    s = zmtp_peer.handshake(path)
    rd = Reader(s)
    commits = int(opts.get("commits", "1"))
    rid = 0
    keep = []
    for n in range(commits):
        begin = field_bytes(1, model.encode())
        for name, dtype, dims, _ in table:
            t = field_bytes(1, name.encode()) + field_bytes(2, dtype.encode())
            for d in dims:
                t += field_varint(3, d)
            t += field_varint(4, len(tensor_bytes(dims, 0.0)))
            begin += field_bytes(2, t)
        if "partial" in opts:
            begin += field_varint(3, 1)
        if "placement" in opts:
            begin += field_bytes(4, opts["placement"].encode())
        rid += 1
        s.sendall(zmtp_peer.frame(request(rid, 45, begin)))
        _, status, _, body, err = wait_full(rd, rid, 10)
        if status != 0:
            say_error("begin", status, err)
        d = {1: b"", 2: 0, 3: 0}
        for num, _, v in fields(body):
            d[num] = v
        pid = d[1]
        print("begin status=0 version=%d bytes=%d" % (d[2], d[3]), flush=True)
        if "hold-begin" in opts:
            print("holding", flush=True)
            time.sleep(3600)
        data, offsets = b"", {}
        for name, dtype, dims, fill in table:
            data += b"\0" * (-len(data) % 8)
            offsets[name] = len(data)
            data += tensor_bytes(dims, fill + n)
        fd = os.memfd_create("publish")
        os.write(fd, data)
        c, status, msg = send_fd(path, pid, fd)
        os.close(fd)
        keep.append(c)
        if status != 0:
            say_error("fd", status, msg)
        print("fd status=0", flush=True)
        if "hold-fd" in opts:
            print("holding", flush=True)
            time.sleep(3600)
        rid += 1
        if "abort" in opts:
            s.sendall(zmtp_peer.frame(request(rid, 47, field_bytes(1, pid))))
            _, status, _, _, err = wait_full(rd, rid, 10)
            if status != 0:
                say_error("abort", status, err)
            print("abort status=0", flush=True)
            return
        placed = opts["place"].split(",") if "place" in opts else [t[0] for t in table]
        commit = field_bytes(1, pid) + field_bytes(2, field_varint(4, 0))
        for name in placed:
            commit += field_bytes(3, field_bytes(1, name.encode()) + field_varint(2, 0) +
                                  field_varint(3, offsets.get(name, 0)))
        s.sendall(zmtp_peer.frame(request(rid, 46, commit)))
        _, status, _, body, err = wait_full(rd, rid, 30)
        if status != 0:
            say_error("commit", status, err)
        d = {1: b"", 2: 0, 5: 0, 6: 0}
        for num, _, v in fields(body):
            d[num] = v
        version = 0
        for num, _, v in fields(d[1]):
            if num == 50:
                version = v
        print("commit status=0 version=%d previous=%d copied=%d kept=%d" %
              (version, d[2], d[5], d[6]), flush=True)


def noread(path, model, seconds):
    s, _ = do_subscribe(path, model)
    time.sleep(seconds)
    s.close()


def main():
    mode, path = sys.argv[1], sys.argv[2]
    a = sys.argv[3:]
    if mode == "watch":
        watch(path, a[0], float(a[1]))
    elif mode == "plain":
        plain(path, float(a[0]))
    elif mode == "rollouts":
        rollouts(path, a[0], int(a[1]), a[2:])
    elif mode == "publish":
        opts = {}
        for o in a[2:]:
            k, _, v = o.partition("=")
            opts[k] = v
        publish(path, a[0], a[1], opts)
    elif mode == "noread":
        noread(path, a[0], float(a[1]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
