#!/usr/bin/env python3
"""A raw client of the broker's descriptor channel (common/fdwire.h) for the
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


def main():
    path, what = sys.argv[1], sys.argv[2]
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
