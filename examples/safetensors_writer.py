"""Writes safetensors files one tensor at a time, so that a checkpoint larger
than host memory can be written from device memory or from a generator:
safetensors' own save_file builds the whole file in memory first.

The format: an 8-byte little-endian header length, the JSON header (per
tensor its dtype, shape and [begin, end) data offsets relative to the end of
the header, in the order the data follows; an optional "__metadata__" of
strings), padded with spaces to a multiple of 8, then the tensors' bytes
back to back. No torch here: callers give each tensor's bytes as chunks
(any bytes-like objects).

  header(entries, metadata=None) -> (bytes, data_bytes)
  write(path, entries, chunks, metadata=None) -> total file bytes

entries: [(name, dtype, shape, nbytes)], dtype as safetensors spells it
("BF16", "F32", ...). chunks(i): an iterable of bytes-like objects whose
lengths add up to entries[i]'s nbytes.
"""
import json
import os
import struct

# Bits per element (F4: two to a byte).
ELEMENT_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4,
                "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
                "I64": 64, "U64": 64, "F64": 64, "C64": 64}


def header(entries, metadata=None):
    """The padded JSON header of `entries` (data laid out in their order)
    and the number of data bytes that follow it."""
    h, off = {}, 0
    if metadata:
        h["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, dtype, shape, nbytes in entries:
        if name in h:
            raise ValueError(f"tensor {name!r} given twice")
        if dtype not in ELEMENT_BITS:
            raise ValueError(f"tensor {name!r}: dtype {dtype!r} is not a safetensors dtype")
        elems = 1
        for d in shape:
            elems *= int(d)
        if elems * ELEMENT_BITS[dtype] != nbytes * 8:
            raise ValueError(f"tensor {name!r}: {nbytes} bytes, but shape {list(shape)} of "
                             f"{dtype} needs {elems * ELEMENT_BITS[dtype] / 8:g}")
        h[name] = {"dtype": dtype, "shape": [int(d) for d in shape],
                   "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(h, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, off


def write(path, entries, chunks, metadata=None):
    """Writes path (through path + ".tmp", renamed when complete) and returns
    its size. Fails, leaving no file behind, when a tensor's chunks do not
    add up to its size."""
    raw, total = header(entries, metadata)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for i, (name, _, _, nbytes) in enumerate(entries):
                n = 0
                for c in chunks(i):
                    f.write(c)
                    n += memoryview(c).nbytes
                if n != nbytes:
                    raise ValueError(f"tensor {name!r}: {n} bytes written, {nbytes} declared")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return 8 + len(raw) + total
