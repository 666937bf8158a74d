#!/usr/bin/env python3
"""A process that passes its broker connections on to a child and exits, so
that its pid can be given to another process (test_pid_reuse.sh). Raw
sockets, no libzmq: the child holds exactly the connections its parent
opened.

  pidreuse_peer.py SOCK MODEL PIDFILE GOFILE

The parent opens a ZMTP connection to SOCK, two connections to SOCK.fd (it
asks the first for its session token, as libwbclient does), forks, writes
its own pid to PIDFILE and exits. The child waits for GOFILE to appear,
then, through the inherited connections:
  1. closes the first descriptor channel connection (its session) without
     a request, and sleeps a moment;
  2. asks the second one for the descriptors of the lease whose id GOFILE
     holds (32 hex digits), printing "fd status=S error=TEXT" or
     "fd closed";
  3. sends three acquire requests for MODEL on the ZMTP connection,
     printing "acquire status=S error=TEXT" for each answer, or "closed"
     when the broker closed the connection.
"""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from zmtp_peer import frame, handshake  # noqa: E402


def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field_bytes(num, data):
    return varint(num << 3 | 2) + varint(len(data)) + data


def acquire_request(model, rid):
    acq = field_bytes(1, model.encode())
    return b"\x08\x01" + b"\x10" + varint(rid) + field_bytes(11, acq)


def read_varint(p, i):
    v = shift = 0
    while True:
        b = p[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def parse_reply(p):
    """status (sint32, field 3) and error (field 4) of a Reply."""
    i, status, error = 0, 0, ""
    while i < len(p):
        key, i = read_varint(p, i)
        wt = key & 7
        if wt == 0:
            v, i = read_varint(p, i)
            if key >> 3 == 3:
                status = (v >> 1) ^ -(v & 1)
        elif wt == 2:
            n, i = read_varint(p, i)
            if key >> 3 == 4:
                error = p[i : i + n].decode(errors="replace")
            i += n
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            break
    return status, error


def read_frame(s, buf):
    """One message frame (commands skipped); None when the broker closed."""
    while True:
        while len(buf) < 2 or (buf[0] & 2 and len(buf) < 9):
            chunk = s.recv(65536)
            if not chunk:
                return None
            buf += chunk
        flags = buf[0]
        if flags & 2:
            size, hl = struct.unpack(">Q", bytes(buf[1:9]))[0], 9
        else:
            size, hl = buf[1], 2
        while len(buf) < hl + size:
            chunk = s.recv(65536)
            if not chunk:
                return None
            buf += chunk
        body = bytes(buf[hl : hl + size])
        del buf[: hl + size]
        if not flags & 4:
            return body


def fd_reply(s):
    msg = b""
    while len(msg) < 16:
        chunk = s.recv(16 - len(msg))
        if not chunk:
            return None
        msg += chunk
    _magic, status, _n, mlen = struct.unpack("<4siII", msg)
    text = b""
    while len(text) < mlen:
        chunk = s.recv(mlen - len(text))
        if not chunk:
            break
        text += chunk
    return status, text.decode(errors="replace")


def main():
    sock, model, pidfile, gofile = sys.argv[1:5]
    z = handshake(sock)
    c1 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c1.connect(sock + ".fd")
    c1.sendall(b"WBS1" + b"\x00" * 16)
    got = fd_reply(c1)
    if not got or got[0] != 0:
        sys.exit("no session token: %r" % (got,))
    c2 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c2.connect(sock + ".fd")
    if os.fork() != 0:
        with open(pidfile + ".tmp", "w") as f:
            f.write("%d\n" % os.getpid())
        os.rename(pidfile + ".tmp", pidfile)
        os._exit(0)
    # The child: wait for the pid to be someone else's.
    deadline = time.time() + 60
    while not os.path.exists(gofile):
        if time.time() > deadline:
            sys.exit("no go")
        time.sleep(0.02)
    lease = open(gofile).read().strip()
    c1.close()
    time.sleep(0.5)
    try:
        c2.sendall(b"WBF1" + bytes.fromhex(lease))
        got = fd_reply(c2)
        print("fd closed" if got is None else "fd status=%d error=%s" % got, flush=True)
    except (BrokenPipeError, ConnectionResetError):
        print("fd closed", flush=True)
    buf = bytearray()
    for rid in (1, 2, 3):
        try:
            z.sendall(frame(acquire_request(model, rid)))
        except (BrokenPipeError, ConnectionResetError):
            print("closed", flush=True)
            break
        try:
            body = read_frame(z, buf)
        except (ConnectionResetError, BrokenPipeError):
            body = None  # the broker closed it: a reset when bytes were unread
        if body is None:
            print("closed", flush=True)
            break
        print("acquire status=%d error=%s" % parse_reply(body), flush=True)


if __name__ == "__main__":
    main()
