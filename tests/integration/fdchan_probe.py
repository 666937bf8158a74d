#!/usr/bin/env python3
"""A raw client of the broker's descriptor channel (common/fdchan_wire.h) for the
integration tests: it asks for a lease's descriptors as any process could,
whoever holds the lease, and reports the broker's exact answer.

  fdchan_probe.py PATH HEXID      one request; prints "status=S fds=N" and
                                  "error=TEXT", and for each descriptor
                                  "fd SIZE SEALS" (F_GET_SEALS, hex)
  fdchan_probe.py PATH raw HEX    sends the bytes as they are; prints the
                                  reply as above, then "closed" when the
                                  broker closed the connection
  fdchan_probe.py PATH idle SECS  connects, sends nothing; prints "closed
                                  after S s" when the broker closes it
  fdchan_probe.py PATH session    asks for the connection's session token
                                  twice; prints the replies as above and
                                  "token=HEX" and "same" when both were the
                                  same, then keeps the connection open until
                                  killed
  fdchan_probe.py PATH flood CONNS OUTSTANDING SECONDS
                                  CONNS connections, each keeping
                                  OUTSTANDING requests (for a lease nobody
                                  holds) unanswered for SECONDS; prints
                                  "replies=N closed=M"
  fdchan_probe.py PATH sessions N
                                  N connections that each ask for a session
                                  token; prints "granted=G refused=R" and
                                  the last refusal as "error=TEXT"
  fdchan_probe.py PATH hold CONNS SECONDS
                                  opens up to CONNS connections and sends
                                  nothing; after SECONDS prints "opened=N
                                  open=K" (K: not closed by the broker)
"""
import fcntl
import os
import socket
import struct
import sys
import time

F_GET_SEALS = 1034


def reply(s):
    msg, fds, _flags, _addr = socket.recv_fds(s, 16, 16)
    if len(msg) == 0:
        print("closed")
        return False
    while len(msg) < 16:
        more = s.recv(16 - len(msg))
        if not more:
            print("closed")
            return False
        msg += more
    magic, status, n, mlen = struct.unpack("<4siII", msg[:16])
    text = b""
    while len(text) < mlen:
        more = s.recv(mlen - len(text))
        if not more:
            break
        text += more
    print("status=%d fds=%d announced=%d magic=%s" % (status, len(fds), n, magic.decode()))
    print("error=%s" % text.decode(errors="replace"))
    for fd in fds:
        print("fd %d %x" % (os.fstat(fd).st_size, fcntl.fcntl(fd, F_GET_SEALS)))
        os.close(fd)
    return True


def flood(path, conns, outstanding, seconds):
    import selectors

    sel = selectors.DefaultSelector()
    req = b"WBF1" + bytes(16)
    socks = []
    for _ in range(conns):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            c.connect(path)
        except OSError:
            break
        c.setblocking(False)
        try:
            c.sendall(req * outstanding)
        except OSError:
            pass
        sel.register(c, selectors.EVENT_READ)
        socks.append(c)
    replies = closed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and socks:
        for key, _ in sel.select(0.05):
            c = key.fileobj
            try:
                data = c.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(c)
                socks.remove(c)
                closed += 1
                continue
            # Replies for an unknown lease carry a short message: count the
            # headers and send as many requests again.
            n = data.count(b"WBF1")
            replies += n
            try:
                c.send(req * n)
            except OSError:
                pass
    print("replies=%d closed=%d" % (replies, closed), flush=True)


def hold(path, conns, seconds):
    socks = []
    for _ in range(conns):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            c.connect(path)
        except OSError:
            break
        socks.append(c)
    print("opened=%d" % len(socks), flush=True)
    time.sleep(seconds)
    still = 0
    for c in socks:
        c.setblocking(False)
        try:
            if c.recv(1) != b"":
                still += 1
        except BlockingIOError:
            still += 1
        except OSError:
            pass
    print("opened=%d open=%d" % (len(socks), still), flush=True)


def main():
    path, what = sys.argv[1], sys.argv[2]
    if what == "flood":
        flood(path, int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
        return
    if what == "sessions":
        socks, granted, refused, last = [], 0, 0, ""
        for _ in range(int(sys.argv[3])):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.settimeout(10)
            c.connect(path)
            c.sendall(b"WBS1" + bytes(16))
            msg = c.recv(16)
            _magic, status, _n, mlen = struct.unpack("<4siII", msg)
            text = c.recv(mlen).decode() if mlen else ""
            if status == 0:
                granted += 1
            else:
                refused += 1
                last = text
            socks.append(c)
        print("granted=%d refused=%d" % (granted, refused))
        print("error=%s" % last, flush=True)
        return
    if what == "hold":
        hold(path, int(sys.argv[3]), float(sys.argv[4]))
        return
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    if what == "raw":
        s.sendall(bytes.fromhex(sys.argv[3]))
        if reply(s):
            try:
                if s.recv(1) == b"":
                    print("closed")
            except socket.timeout:
                print("open")
    elif what == "session":
        tokens = []
        for _ in range(2):
            s.sendall(b"WBS1" + bytes(16))
            msg = s.recv(16)
            _magic, status, _n, mlen = struct.unpack("<4siII", msg)
            text = s.recv(mlen).decode() if mlen else ""
            print("status=%d" % status)
            tokens.append(text)
        print("token=%s" % tokens[0])
        if tokens[0] == tokens[1]:
            print("same")
        sys.stdout.flush()
        while True:
            time.sleep(3600)
    elif what == "idle":
        t0 = time.monotonic()
        if s.recv(1) == b"":
            print("closed after %.1f s" % (time.monotonic() - t0))
    else:
        s.sendall(b"WBF1" + bytes.fromhex(what))
        reply(s)


main()
