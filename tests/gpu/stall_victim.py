#!/usr/bin/env python3
"""The victim of the stall benchmark (tests/gpu/stall.sh): a process that
serves steadily and records every iteration.

  stall_victim.py --stream legacy|nonblocking --control FIFO --series OUT.json.gz
                  [--iter-ms 1.5] [--max-seconds 600] [--dry-run]

Each iteration runs bf16 matmuls (4096 x 4096 x 4096, as many as make about
--iter-ms) on the chosen stream, then waits for that stream, and records its
start and its wall time. `legacy` is the legacy default stream (stream 0,
which synchronises with every blocking stream of the process); `nonblocking`
a stream created with cudaStreamNonBlocking (torch's own streams).

It reads commands, one a line, from the FIFO:

  mark NAME        label the following iterations NAME ("-": between
                   conditions, left out of every statistic)
  aoti PATH NAME   in a thread of this process: load the AOTInductor package
                   PATH the default way (torch._inductor.aoti_load_package;
                   a package with its constants inside the .so copies them
                   with synchronous pageable copies), run nothing, free it;
                   iterations meanwhile are labelled NAME; prints
                   "done NAME MS" on stdout
  pinned PATH NAME in a thread: copy the tensor bytes of the safetensors file
                   PATH into one device buffer through two 64 MiB pinned
                   buffers, chunk by chunk, with non-blocking copies on a
                   low-priority non-blocking stream; likewise "done NAME MS"
  quit             write the series and exit

--dry-run sleeps instead of using the GPU (no torch needed): it tries the
command protocol and the series file on a machine without a GPU.

It prints "ready ..." once warmed up. The series file holds, gzipped JSON:
{"stream", "iter_ms", "reps", "labels": [names], "t": [start s], "ms":
[wall ms], "lab": [label index]} for every iteration after the warm-up.

Python's GIL: a loading thread that holds it (a C++ call that does not
release it) delays the victim's next launch; that shows in the victim's
wall times as it would in any Python server that loads in-process.
"""
import argparse
import gzip
import json
import os
import struct
import sys
import threading
import time

torch = None  # imported in main(), not with --dry-run

CHUNK = 64 << 20


def log(*a):
    print(*a, flush=True)


class Series:
    """Every iteration's start, wall time and label."""

    def __init__(self):
        self.reps = 1
        self.labels = ["-"]
        self.label = 0
        self.t, self.ms, self.lab = [], [], []
        self.stop = False
        self.lock = threading.Lock()

    def set_label(self, name):
        with self.lock:
            if name not in self.labels:
                self.labels.append(name)
            self.label = self.labels.index(name)

    def serve(self, t_origin):
        """Iterates until stopped, recording each iteration (step())."""
        while not self.stop:
            lab = self.label
            t0 = time.perf_counter()
            ms = self.step()
            self.t.append(round(t0 - t_origin, 6))
            self.ms.append(round(ms, 4))
            self.lab.append(lab)


class DryVictim(Series):
    """Sleeps instead of computing (--dry-run)."""

    def __init__(self, stream_mode, iter_ms):
        super().__init__()
        self.sleep_s = iter_ms / 1e3

    def step(self):
        t0 = time.perf_counter()
        time.sleep(self.sleep_s)
        return (time.perf_counter() - t0) * 1e3


class Victim(Series):
    """bf16 matmuls on the chosen stream, as many as make about iter_ms."""
    def __init__(self, stream_mode, iter_ms):
        super().__init__()
        torch.cuda.init()
        self.dev = torch.device("cuda:0")
        if stream_mode == "legacy":
            self.stream = torch.cuda.default_stream(self.dev)  # stream 0: legacy
        else:
            self.stream = torch.cuda.Stream(self.dev)  # cudaStreamNonBlocking
        n = 4096
        with torch.cuda.stream(self.stream):
            self.a = torch.randn(n, n, device=self.dev, dtype=torch.bfloat16)
            self.b = torch.randn(n, n, device=self.dev, dtype=torch.bfloat16)
            self.c = torch.empty(n, n, device=self.dev, dtype=torch.bfloat16)
        self.reps = 1
        for _ in range(50):
            self.step()
        one = sorted(self.step() for _ in range(50))[25]
        self.reps = max(1, round(iter_ms / one))

    def step(self):
        t0 = time.perf_counter()
        with torch.cuda.stream(self.stream):
            for _ in range(self.reps):
                torch.matmul(self.a, self.b, out=self.c)
        self.stream.synchronize()
        return (time.perf_counter() - t0) * 1e3


def load_aoti(path):
    """The default way: the package's loader creates the container, which
    loads the constants embedded in its .so by itself."""
    m = torch._inductor.aoti_load_package(path)  # its copies are synchronous
    del m


def load_pinned(path):
    """The same bytes through pinned staging on a low-priority non-blocking
    stream, in 64 MiB chunks, two buffers in turn; no device-wide sync."""
    side = torch.cuda.Stream(priority=0)  # 0: CUDA's lowest priority; created non-blocking
    with open(path, "rb", buffering=0) as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        f.seek(8 + hlen)
        total = os.fstat(f.fileno()).st_size - 8 - hlen
        bufs = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        views = [b.numpy() for b in bufs]
        events = [None, None]
        with torch.cuda.stream(side):
            dst = torch.empty(total, dtype=torch.uint8, device="cuda:0")
        off, k = 0, 0
        while off < total:
            i = k % 2
            if events[i] is not None:
                events[i].synchronize()  # that buffer's last copy is done
            n = f.readinto(memoryview(views[i])[: min(CHUNK, total - off)])
            if not n:
                raise RuntimeError(f"{path}: short read at byte {8 + hlen + off}")
            with torch.cuda.stream(side):
                dst[off:off + n].copy_(bufs[i][:n], non_blocking=True)
                events[i] = torch.cuda.Event()
                events[i].record(side)
            off += n
            k += 1
        side.synchronize()
    del dst


def worker(v, kind, path, name, dry):
    v.set_label(name)
    t0 = time.perf_counter()
    try:
        if dry:
            time.sleep(0.3)
        else:
            (load_aoti if kind == "aoti" else load_pinned)(path)
        ok = "ok"
    except Exception as e:  # reported, and the run goes on
        ok = f"error {type(e).__name__}: {e}".replace("\n", " ")
    ms = (time.perf_counter() - t0) * 1e3
    v.set_label("-")
    log(f"done {name} {ms:.1f} {ok}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stream", choices=("legacy", "nonblocking"), required=True)
    p.add_argument("--control", required=True)
    p.add_argument("--series", required=True)
    p.add_argument("--iter-ms", type=float, default=1.5)
    p.add_argument("--max-seconds", type=float, default=600)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    if a.dry_run:
        v = DryVictim(a.stream, a.iter_ms)
    else:
        global torch
        import torch as _torch
        torch = _torch
        v = Victim(a.stream, a.iter_ms)
    t_origin = time.perf_counter()
    server = threading.Thread(target=v.serve, args=(t_origin,), daemon=True)
    for _ in range(200):
        v.step()
    iter_ms = sorted(v.step() for _ in range(101))[50]
    server.start()
    log(f"ready stream={a.stream} reps={v.reps} iter_ms={iter_ms:.3f}")
    threads = []
    deadline = time.monotonic() + a.max_seconds
    with open(a.control) as ctl:
        for line in ctl:
            words = line.split()
            if not words:
                continue
            if words[0] == "mark" and len(words) == 2:
                v.set_label(words[1])
            elif words[0] in ("aoti", "pinned") and len(words) == 3:
                th = threading.Thread(target=worker, args=(v, words[0], words[1], words[2], a.dry_run))
                th.start()
                threads.append(th)
            elif words[0] == "quit":
                break
            else:
                log(f"unknown command: {line.strip()}")
            if time.monotonic() > deadline:
                log("max seconds reached")
                break
    for th in threads:
        th.join()
    v.stop = True
    server.join()
    with gzip.open(a.series, "wt") as f:
        json.dump({"stream": a.stream, "iter_ms": iter_ms, "reps": v.reps,
                   "gemm": None if a.dry_run else [4096, 4096, 4096],
                   "dtype": "none (dry run)" if a.dry_run else "bf16", "dry_run": a.dry_run, "labels": v.labels,
                   "t": v.t, "ms": v.ms, "lab": v.lab}, f, separators=(",", ":"))
    log(f"wrote {len(v.ms)} iterations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
