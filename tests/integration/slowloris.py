#!/usr/bin/env python3
"""A slowloris against the metrics endpoint, for test_metrics_slowloris.sh:
connections from one process to 127.0.0.1 that send an HTTP request's
headers one byte at a time and never finish them.

  slowloris.py PORT CONNS ATTACK_S TRICKLE_S HOLD_S
      keeps CONNS such connections open for ATTACK_S seconds, each sending
      a byte every TRICKLE_S seconds, and opens a new one 0.1 s after the
      server closes one; then opens no more and keeps trickling into those
      still open for up to HOLD_S seconds. Prints "ready" once CONNS were
      opened, then one JSON object: opened, closed (by the server),
      max_life (the longest a closed one lived, in seconds), last (the
      lifetimes of those open when the attack stopped, closed during the
      hold) and open (still open at the end).

Bounded: at most 4000 connections in all.
"""
import json
import select
import socket
import sys
import time

MAX_CONNECTS = 4000
# Never ends: each trickled byte extends a header line.
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100000


class Conn:
    def __init__(self, port):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.sock.connect_ex(("127.0.0.1", port))
        self.opened = time.monotonic()
        self.sent = 0
        self.next_byte = self.opened

    def trickle(self, now, every):
        """Sends the next byte when due; False when the server has gone."""
        if now < self.next_byte:
            return True
        try:
            self.sock.send(REQUEST[self.sent:self.sent + 1])
        except BlockingIOError:
            return True  # not connected yet
        except OSError:
            return False
        self.sent += 1
        self.next_byte = now + every
        return True

    def hung_up(self):
        try:
            return self.sock.recv(4096) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True


def main():
    port, conns = int(sys.argv[1]), int(sys.argv[2])
    attack_s, every, hold_s = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    start = time.monotonic()
    live, reopen_at = [], []
    opened = closed = 0
    max_life, last = 0.0, []
    attack_end = start + attack_s
    for _ in range(conns):
        live.append(Conn(port))
        opened += 1
    print("ready", flush=True)
    at_stop = None
    while True:
        now = time.monotonic()
        if now >= attack_end and at_stop is None:
            at_stop = set(live)
        if at_stop is not None and (not live or now >= attack_end + hold_s):
            break
        while reopen_at and reopen_at[0] <= now and now < attack_end and opened < MAX_CONNECTS:
            reopen_at.pop(0)
            live.append(Conn(port))
            opened += 1
        poll = select.poll()  # select() cannot take descriptors over 1023
        for c in live:
            poll.register(c.sock, select.POLLIN)
        ready = {fd for fd, _ in poll.poll(50)}
        now = time.monotonic()
        for c in list(live):
            gone = (c.sock.fileno() in ready and c.hung_up()) or not c.trickle(now, every)
            if not gone:
                continue
            life = now - c.opened
            max_life = max(max_life, life)
            closed += 1
            if at_stop is not None and c in at_stop:
                last.append(round(life, 3))
            c.sock.close()
            live.remove(c)
            reopen_at.append(now + 0.1)
    for c in live:
        c.sock.close()
    print(json.dumps({"opened": opened, "closed": closed, "max_life": round(max_life, 3),
                      "last": last, "open": len(live)}), flush=True)


if __name__ == "__main__":
    main()
