#!/usr/bin/env python3
"""A hostile ZMTP 3.1 peer for the transport tests: speaks the protocol on
raw unix sockets (no libzmq), so that it can do what a libzmq DEALER never
would: never end a message, never read replies, open connections and idle.

  zmtp_peer.py partial SOCK FRAME_BYTES COUNT
      handshake, then COUNT frames of FRAME_BYTES with MORE set, never the
      last one; prints "sent=N closed=0|1" (closed: the broker hung up)
  zmtp_peer.py spread SOCK CONNS BYTES
      CONNS connections, each with an unfinished message of BYTES bytes;
      prints "closed=N" (connections the broker hung up) after a second
  zmtp_peer.py idle SOCK CONNS SECONDS
      CONNS connections that send nothing, held SECONDS; prints
      "opened=N closed=M"
  zmtp_peer.py hold SOCK CONNS HANDSHAKE SECONDS
      CONNS connections from one process, handshaken (HANDSHAKE 1) or
      silent (0); prints "opened=N refused=R" (closed at once), then after
      SECONDS "kept=K closed=C" (of the others, closed since)
  zmtp_peer.py noread SOCK MODEL COUNT SECONDS
      handshake, COUNT acquire requests for MODEL, reads nothing for
      SECONDS; prints "sent=N"
  zmtp_peer.py pingreq SOCK
      handshake, then a PING and a stats request in one write; prints
      "reply=1" when the reply comes within 2 s with no more bytes sent,
      else "reply=0"
  zmtp_peer.py allin SOCK
      greeting, READY and a stats request in one write; prints as pingreq
  zmtp_peer.py complete SOCK CONNS BYTES SECONDS
      CONNS connections, each sends one complete message of BYTES bytes
      (not a request: the broker answers with an error) and idles; after
      SECONDS prints "sent=N closed=M"
  zmtp_peer.py error SOCK
      greeting and READY; then waits up to 5 s for the broker to close the
      connection and prints "error=REASON" for the ZMTP ERROR command it
      sent before, or "error=" when none came
  zmtp_peer.py malformed SOCK COUNT
      handshake, then COUNT one-byte messages that are no request, reading
      the replies; prints "sent=N"
"""
import os
import select
import socket
import struct
import sys
import time


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


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


class Refused(Exception):
    pass


def handshake(path):
    s = connect(path)
    s.sendall(greeting() + ready())
    s.settimeout(5)
    got = b""
    # The broker's greeting and its first command: READY, or ERROR when it
    # refuses the connection (then it closes it).
    while len(got) < 64 + 2 or len(got) < 64 + 2 + got[65]:
        chunk = s.recv(4096)
        if not chunk:
            raise Refused()
        got += chunk
    if got[66:72] != b"\x05READY":
        raise Refused()
    s.settimeout(None)
    return s


def closed(s, wait=0.0):
    """True when the broker hung up (EOF or reset), draining what it sent."""
    end = time.time() + wait
    p = select.poll()  # select() cannot take descriptors over 1023
    p.register(s, select.POLLIN)
    while True:
        if not p.poll(max(0.0, end - time.time()) * 1000):
            return False
        try:
            if not s.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True


def partial(path, frame_bytes, count):
    try:
        s = handshake(path)
    except Refused:
        sys.exit("the broker closed the connection during the handshake")
    payload = b"\x00" * frame_bytes
    sent = 0
    try:
        for _ in range(count):
            s.sendall(frame(payload, more=True))
            sent += 1
    except (BrokenPipeError, ConnectionResetError):
        print("sent=%d closed=1" % sent)
        return
    print("sent=%d closed=%d" % (sent, 1 if closed(s, 2.0) else 0))


def spread(path, conns, nbytes):
    socks, refused = [], 0
    for _ in range(conns):
        try:
            s = handshake(path)
        except (Refused, ConnectionResetError):
            refused += 1
            continue
        try:
            # A frame announced as nbytes + 1 long: never complete.
            s.sendall(bytes([2]) + struct.pack(">Q", nbytes + 1) + b"\x00" * nbytes)
        except (BrokenPipeError, ConnectionResetError):
            pass
        socks.append(s)
    time.sleep(1.0)
    print("closed=%d" % (refused + sum(1 for s in socks if closed(s, 0.2))))


def idle(path, conns, seconds):
    socks, opened = [], 0
    for _ in range(conns):
        try:
            socks.append(connect(path))
            opened += 1
        except OSError:
            time.sleep(0.01)
    time.sleep(seconds)
    print("opened=%d closed=%d" % (opened, sum(1 for s in socks if closed(s, 0.01))))


def hold(path, conns, shake, seconds):
    """Opens conns connections from this one process, completing the
    handshake on each (shake=1) or sending nothing (shake=0); counts those
    the broker closed at once, then those it closed within seconds."""
    socks, refused = [], 0
    for _ in range(conns):
        try:
            socks.append(handshake(path) if shake else connect(path))
        except (Refused, ConnectionResetError, BrokenPipeError):
            refused += 1
    if not shake:
        time.sleep(0.2)
        early = [s for s in socks if closed(s, 0.01)]
        refused += len(early)
        socks = [s for s in socks if s not in early]
    print("opened=%d refused=%d" % (conns, refused), flush=True)
    time.sleep(seconds)
    print("kept=%d closed=%d" % (len(socks), sum(1 for s in socks if closed(s, 0.01))), flush=True)


def noread(path, model, count, seconds):
    try:
        s = handshake(path)
    except Refused:
        sys.exit("the broker closed the connection during the handshake")
    m = model.encode()
    acq = b"\x0a" + bytes([len(m)]) + m
    sent = 0
    for i in range(count):
        req = b"\x08\x01\x10" + bytes([1 + i % 100]) + b"\x5a" + bytes([len(acq)]) + acq
        try:
            s.sendall(frame(req))
            sent += 1
        except (BrokenPipeError, ConnectionResetError):
            break
    print("sent=%d" % sent, flush=True)
    time.sleep(seconds)


STATS = b"\x08\x01\x10\x07\x92\x01\x00"  # version 1, id 7, an empty StatsRequest


def wait_message(s, seconds):
    """True when a message frame (not a command) arrives within seconds."""
    s.settimeout(seconds)
    buf = b""
    end = time.time() + seconds
    try:
        while time.time() < end:
            chunk = s.recv(65536)
            if not chunk:
                return False
            buf += chunk
            while len(buf) >= 2:
                flags = buf[0]
                hl, size = (9, struct.unpack(">Q", buf[1:9])[0]) if flags & 2 else (2, buf[1])
                if len(buf) < hl + size:
                    break
                if not flags & 4:
                    return True
                buf = buf[hl + size :]
    except socket.timeout:
        return False
    return False


def pingreq(path):
    s = handshake(path)
    s.sendall(frame(b"\x04PING\x00\x0a", command=True) + frame(STATS))
    print("reply=%d" % wait_message(s, 2.0), flush=True)


def allin(path):
    s = connect(path)
    s.sendall(greeting() + ready() + frame(STATS))
    s.settimeout(2.0)
    got = b""
    while len(got) < 64:  # the broker's greeting comes before any frame
        chunk = s.recv(64 - len(got))
        if not chunk:
            print("reply=0", flush=True)
            return
        got += chunk
    print("reply=%d" % wait_message(s, 2.0), flush=True)


def complete(path, conns, nbytes, seconds):
    socks = []
    for _ in range(conns):
        try:
            s = handshake(path)
            s.sendall(frame(b"\xff" * nbytes))
            socks.append(s)
        except (Refused, BrokenPipeError, ConnectionResetError):
            pass
    time.sleep(seconds)
    print("sent=%d closed=%d" % (len(socks), sum(1 for s in socks if closed(s, 0.01))), flush=True)


def error(path):
    s = connect(path)
    s.sendall(greeting() + ready())
    s.settimeout(5)
    buf = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    i = buf.find(b"\x05ERROR")
    reason = b""
    if i > 0:
        n = buf[i + 6]
        reason = buf[i + 7 : i + 7 + n]
    print("error=%s" % reason.decode(errors="replace"), flush=True)


def malformed(path, count):
    s = handshake(path)
    sent = 0
    for _ in range(count):
        try:
            s.sendall(frame(b"\xff"))
            sent += 1
            wait_message(s, 2.0)
        except (BrokenPipeError, ConnectionResetError):
            break
    print("sent=%d" % sent, flush=True)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    a = sys.argv[3:]
    if mode == "partial":
        partial(path, int(a[0]), int(a[1]))
    elif mode == "spread":
        spread(path, int(a[0]), int(a[1]))
    elif mode == "idle":
        idle(path, int(a[0]), float(a[1]))
    elif mode == "hold":
        hold(path, int(a[0]), int(a[1]), float(a[2]))
    elif mode == "noread":
        noread(path, a[0], int(a[1]), float(a[2]))
    elif mode == "pingreq":
        pingreq(path)
    elif mode == "allin":
        allin(path)
    elif mode == "complete":
        complete(path, int(a[0]), int(a[1]), float(a[2]))
    elif mode == "error":
        error(path)
    elif mode == "malformed":
        malformed(path, int(a[0]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
