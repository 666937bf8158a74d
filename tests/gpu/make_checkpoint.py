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

BLOCK = 64 << 20


def header(nbytes, count):
    per = (nbytes // count) & ~1  # bf16: an even number of bytes
    if per == 0:
        raise SystemExit(f"{nbytes} bytes cannot hold {count} bf16 tensors")
    h, off = {}, 0
    for i in range(count):
        n = per if i + 1 < count else nbytes - per * (count - 1)
        n &= ~1
        h[f"t{i}"] = {"dtype": "BF16", "shape": [n // 2], "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(h, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, off


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--bytes", type=float, required=True, help="tensor bytes (1e9, 8.5e9, ...)")
    p.add_argument("--tensors", type=int, required=True)
    a = p.parse_args()
    t0 = time.time()
    raw, total = header(int(a.bytes), a.tensors)
    want = 8 + len(raw) + total
    if os.path.exists(a.out) and os.path.getsize(a.out) == want:
        with open(a.out, "rb") as f:
            if f.read(8 + len(raw)) == struct.pack("<Q", len(raw)) + raw:
                print(json.dumps({"path": a.out, "bytes": total, "tensors": a.tensors,
                                  "seconds": 0.0, "reused": True}))
                return 0
    block = os.urandom(BLOCK)
    per = (total // a.tensors) if a.tensors else 0
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        done, i = 0, 0
        while done < total:
            # A tensor-dependent start in the block: equal-sized tensors differ.
            start = ((done // per) * 4099 if per else i) % (BLOCK // 2)
            n = min(BLOCK - start, total - done)
            f.write(block[start:start + n])
            done += n
            i += 1
    os.replace(tmp, a.out)
    print(json.dumps({"path": a.out, "bytes": total, "tensors": a.tensors,
                      "seconds": round(time.time() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
