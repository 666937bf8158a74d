#!/usr/bin/env python3
"""Writes a synthetic safetensors checkpoint of a given size and tensor
count, fast: bf16 tensors named t0, t1, ... of equal size (the last one
takes the remainder), filled from one block of random bytes at a different
offset per tensor, so that no two tensors are equal and nothing is a hole.

  make_checkpoint.py OUT --bytes N --tensors K

Prints one JSON line: {"path", "bytes", "tensors", "seconds"}. Leaves an
existing file with the same header alone (its size and count match)."""
import argparse
import json
import os
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
import safetensors_writer  # noqa: E402 (examples/safetensors_writer.py)

BLOCK = 64 << 20


def entries(nbytes, count):
    per = (nbytes // count) & ~1  # bf16: an even number of bytes
    if per == 0:
        raise SystemExit(f"{nbytes} bytes cannot hold {count} bf16 tensors")
    out = []
    for i in range(count):
        n = per if i + 1 < count else nbytes - per * (count - 1)
        n &= ~1
        out.append((f"t{i}", "BF16", [n // 2], n))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--bytes", type=float, required=True, help="tensor bytes (1e9, 8.5e9, ...)")
    p.add_argument("--tensors", type=int, required=True)
    a = p.parse_args()
    t0 = time.time()
    ents = entries(int(a.bytes), a.tensors)
    raw, total = safetensors_writer.header(ents)
    want = 8 + len(raw) + total
    if os.path.exists(a.out) and os.path.getsize(a.out) == want:
        with open(a.out, "rb") as f:
            if f.read(8 + len(raw)) == struct.pack("<Q", len(raw)) + raw:
                print(json.dumps({"path": a.out, "bytes": total, "tensors": a.tensors,
                                  "seconds": 0.0, "reused": True}))
                return 0
    block = memoryview(os.urandom(BLOCK))
    def chunks(i):
        # A tensor-dependent start in the block: equal-sized tensors differ.
        start = (i * 4099) % (BLOCK // 2)
        left = ents[i][3]
        while left:
            n = min(BLOCK - start, left)
            yield block[start:start + n]
            left -= n
            start = 0
    safetensors_writer.write(a.out, ents, chunks)
    print(json.dumps({"path": a.out, "bytes": total, "tensors": a.tensors,
                      "seconds": round(time.time() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
