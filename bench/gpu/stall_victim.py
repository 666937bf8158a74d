#!/usr/bin/env python3
"""The victim of the stall benchmark (bench/gpu/stall.sh): a process that
serves steadily and records every iteration.

  stall_victim.py --stream legacy|nonblocking --control FIFO --series OUT.json.gz
                  [--iter-ms 1.5] [--max-seconds 600] [--scratch DIR] [--dry-run]

Each iteration runs bf16 matmuls (4096 x 4096 x 4096, as many as make about
--iter-ms) on the chosen stream, then waits for that stream, and records its
start and its wall time. `legacy` is the legacy default stream (stream 0,
which synchronises with every blocking stream of the process); `nonblocking`
a stream created with cudaStreamNonBlocking (torch's own streams).

It reads commands, one a line, from the FIFO:

  mark NAME        label the following iterations NAME ("-": between
                   conditions, left out of every statistic)
  aoti PATH NAME   in a thread of this process: a second AOTInductor
                   container of the package PATH, created the default way:
                   AOTInductorModelContainerCreateWithDevice of its model
                   library (what torch's own loader calls), which copies the
                   constants embedded in the .so with synchronous copies
                   from pageable memory. The package is unpacked and the
                   .so dlopen'd first, outside the window; the window
                   (iterations labelled NAME) is the creation; the container
                   is deleted after it. Called through ctypes, which lets go
                   of Python's GIL, so the victim keeps launching as a C++
                   server would. Prints "done NAME MS ok" on stdout
  pinned PATH NAME in a thread: copy the tensor bytes of the safetensors file
                   PATH into one device buffer through two 64 MiB pinned
                   buffers, chunk by chunk, with non-blocking copies on a
                   low-priority non-blocking stream; likewise "done NAME MS"
  quit             write the series and exit

--dry-run sleeps instead of using the GPU (no torch needed): it tries the
command protocol and the series file on a machine without a GPU.

It prints "ready ..." once warmed up. The series file holds, gzipped JSON:
{"stream", "iter_ms", "reps", "labels": [names], "t": [start s], "ms":
[wall ms], "gpu_ms": [the GPU's time between events recorded before and
after the iteration's kernels], "lab": [label index]} for every iteration
after the warm-up. Wall time is what a server sees; the GPU time tells a
stall on the device from one on the host (a thread holding the GIL, a
blocked launch).
"""
import argparse
import ctypes
import gzip
import json
import os
import struct
import sys
import threading
import time
import zipfile

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
        self.t, self.ms, self.gpu_ms, self.lab = [], [], [], []
        self.last_gpu_ms = 0.0
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
            self.gpu_ms.append(round(self.last_gpu_ms, 4))
            self.lab.append(lab)


class DryVictim(Series):
    """Sleeps instead of computing (--dry-run)."""

    def __init__(self, stream_mode, iter_ms):
        super().__init__()
        self.sleep_s = iter_ms / 1e3

    def step(self):
        t0 = time.perf_counter()
        time.sleep(self.sleep_s)
        self.last_gpu_ms = (time.perf_counter() - t0) * 1e3
        return self.last_gpu_ms


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
        self.ev0 = torch.cuda.Event(enable_timing=True)
        self.ev1 = torch.cuda.Event(enable_timing=True)
        self.reps = 1
        for _ in range(50):
            self.step()
        one = sorted(self.step() for _ in range(50))[25]
        self.reps = max(1, round(iter_ms / one))

    def step(self):
        t0 = time.perf_counter()
        self.ev0.record(self.stream)
        with torch.cuda.stream(self.stream):
            for _ in range(self.reps):
                torch.matmul(self.a, self.b, out=self.c)
        self.ev1.record(self.stream)
        self.stream.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        self.last_gpu_ms = self.ev0.elapsed_time(self.ev1)
        return wall


class AotiLibrary:
    """A model library of an AOTInductor package, unpacked into `into` and
    dlopen'd (libtorch's libraries first, global, as a serving process has
    them)."""

    def __init__(self, path, into):
        with zipfile.ZipFile(path) as z:
            sos = [n for n in z.namelist() if n.endswith(".so")]
            if len(sos) != 1:
                raise RuntimeError(f"{path}: {len(sos)} model libraries, expected 1")
            z.extractall(into)
        self.so = os.path.join(into, sos[0])
        lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
        for n in ("libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libtorch_cuda.so",
                  "libtorch.so"):
            if os.path.exists(os.path.join(lib_dir, n)):
                ctypes.CDLL(os.path.join(lib_dir, n), mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(self.so)
        self.create = self.lib.AOTInductorModelContainerCreateWithDevice
        self.create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                ctypes.c_char_p, ctypes.c_char_p]
        self.create.restype = ctypes.c_int32
        self.delete = self.lib.AOTInductorModelContainerDelete
        self.delete.argtypes = [ctypes.c_void_p]
        self.delete.restype = ctypes.c_int32

    def create_container(self):
        """The container, its constants loaded by the library itself (ctypes
        lets go of the GIL for the call)."""
        h = ctypes.c_void_p()
        rc = self.create(ctypes.byref(h), 1, b"cuda:0", os.path.dirname(self.so).encode())
        if rc != 0:
            raise RuntimeError(f"AOTInductorModelContainerCreateWithDevice returned {rc}")
        return h


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


LIBRARIES = {}  # package path -> AotiLibrary, unpacked and dlopen'd once


def worker(v, kind, path, name, dry, scratch):
    ms, ok = 0.0, "ok"
    try:
        if dry:
            v.set_label(name)
            t0 = time.perf_counter()
            time.sleep(0.3)
            ms = (time.perf_counter() - t0) * 1e3
        elif kind == "aoti":
            if path not in LIBRARIES:
                LIBRARIES[path] = AotiLibrary(path, os.path.join(scratch, f"aoti{len(LIBRARIES)}"))
            lib = LIBRARIES[path]
            v.set_label(name)
            t0 = time.perf_counter()
            h = lib.create_container()
            ms = (time.perf_counter() - t0) * 1e3
            v.set_label("-")
            lib.delete(h)  # frees its constants: outside the window
        else:
            v.set_label(name)
            t0 = time.perf_counter()
            load_pinned(path)
            ms = (time.perf_counter() - t0) * 1e3
    except Exception as e:  # reported, and the run goes on
        ok = f"error {type(e).__name__}: {e}".replace("\n", " ")
    v.set_label("-")
    log(f"done {name} {ms:.1f} {ok}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stream", choices=("legacy", "nonblocking"), required=True)
    p.add_argument("--control", required=True)
    p.add_argument("--series", required=True)
    p.add_argument("--iter-ms", type=float, default=1.5)
    p.add_argument("--max-seconds", type=float, default=600)
    p.add_argument("--scratch", default="/tmp",
                   help="where packages are unpacked (default /tmp)")
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
                th = threading.Thread(target=worker, args=(v, words[0], words[1], words[2], a.dry_run, a.scratch))
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
                   "t": v.t, "ms": v.ms, "gpu_ms": v.gpu_ms, "lab": v.lab}, f, separators=(",", ":"))
    log(f"wrote {len(v.ms)} iterations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
