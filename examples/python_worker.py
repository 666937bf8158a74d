#!/usr/bin/env python3
"""python_worker.py: serves one AOTInductor model variant from leased
weights, in Python (the counterpart of wb-aoti-worker).

Leases a base model and any per-variant models (heads) from the broker,
builds the model on their tensors without copying them, runs it on the
inputs of a safetensors file (input0, input1, ...) and writes the outputs
(output0, ...). With --serve it keeps running the model until SIGTERM or
SIGINT and counts outputs that differ from the first run's.

  python_worker.py --model BASE [--model HEAD ...] --aoti PATH.pt2
                   --input FILE [--output FILE] [--serve] [--socket PATH]
                   [--alias CONSTANT=TENSOR ...] [--device DEV] [--verify]
                   [--bridge torch|wb] [--torch-lib DIR|none]

Prints "attach {json}" once the model is ready, "ready" when serving, and
"served runs=N mismatches=M" at the end. Exit codes: 0 success, 1 broker or
model failure, 2 usage, 3 outputs changed while serving.

Needs the weightbroker package (pip install ./python) and libwbclient.so
($WB_CLIENT_LIBRARY, the linker's path, or the install prefix)."""

import argparse
import ctypes
import json
import signal
import struct
import sys
import time

import numpy as np
import torch

import weightbroker

_NP = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "U8": "u1",
       "BF16": "<i2"}
_ST = {torch.float32: "F32", torch.float16: "F16", torch.float64: "F64", torch.int64: "I64",
       torch.int32: "I32", torch.uint8: "U8", torch.bfloat16: "BF16"}


def load_safetensors(path):
    """{name: CPU tensor} (a minimal reader: the tests need no safetensors package)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        arr = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=_NP[h["dtype"]]).copy()
        t = torch.from_numpy(arr).reshape(h["shape"])
        out[name] = t.view(torch.bfloat16) if h["dtype"] == "BF16" else t
    return out


def save_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        blobs.append(ctypes.string_at(t.data_ptr(), nbytes))
        header[name] = {"dtype": _ST[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", required=True, help="a model to lease")
    p.add_argument("--aoti", required=True, help="the AOTInductor package (.pt2)")
    p.add_argument("--input", required=True)
    p.add_argument("--output")
    p.add_argument("--serve", action="store_true")
    p.add_argument("--socket")
    p.add_argument("--alias", action="append", default=[], metavar="CONSTANT=TENSOR")
    p.add_argument("--strip-prefix", help="removed from constant names (a wrapped export)")
    p.add_argument("--prefix", help="added to constant names")
    p.add_argument("--constants", help="the constants file (default: the package's own)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: the leases')")
    p.add_argument("--verify", action="store_true", help="check every leased tensor's checksum")
    p.add_argument("--bridge", choices=("torch", "wb"))
    p.add_argument("--torch-lib", default="auto", help="torch's lib directory, or none")
    a = p.parse_args()
    aliases = dict(x.split("=", 1) for x in a.alias)

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    t0 = time.monotonic()
    try:
        client = weightbroker.connect(a.socket, name="python_worker")
        leases = [client.lease(m) for m in a.model]
        if a.verify:
            for lease in leases:
                lease.verify()
                print("verified %s (%d tensors)" % (lease.model, len(lease.info())), flush=True)
        kw = {} if a.bridge is None else {"bridge": a.bridge}
        model = weightbroker.load_aoti(
            a.aoti, leases, aliases=aliases, device=a.device, strip_prefix=a.strip_prefix,
            prefix=a.prefix, constants_file=a.constants,
            torch_lib_dir=None if a.torch_lib == "none" else a.torch_lib, **kw)
    except weightbroker.BrokerError as e:
        print("%s: %s" % (p.prog, e), file=sys.stderr)
        return 1
    info = dict(model.info, attach_ms=round((time.monotonic() - t0) * 1000, 1),
                leases=[l.id for l in leases], bridge=model.bridge)
    print("attach " + json.dumps(info), flush=True)

    inputs = load_safetensors(a.input)
    device = torch.device(model.device)
    xs = [inputs["input%d" % i].to(device) for i in range(len(inputs))]

    def run(m):
        ys = m(*xs)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return ys

    try:
        first = run(model)
        if a.output:
            save_safetensors(a.output, {"output%d" % i: y for i, y in enumerate(first)})
        runs, mismatches = 1, 0
        if a.serve:
            print("ready", flush=True)
            while not stop:
                ys = run(model)
                runs += 1
                mismatches += any(not torch.equal(y, f) for y, f in zip(ys, first))
                time.sleep(0.01)
    except weightbroker.BrokerError as e:
        print("%s: %s" % (p.prog, e), file=sys.stderr)
        return 1
    print("served runs=%d mismatches=%d" % (runs, mismatches), flush=True)
    del model, first
    for lease in leases:
        lease.release()
    client.close()
    return 3 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
