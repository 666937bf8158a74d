#!/usr/bin/env python3
"""Writes safetensors checkpoints with the official libraries, for the reader's tests.

Usage: make_official_fixtures.py OUTPUT_DIR

Needs torch, safetensors and transformers; downloads nothing. Writes into OUTPUT_DIR:

  all_dtypes.safetensors   safetensors.torch.save_file of one tensor per dtype that the
                           installed torch and safetensors can store, plus a scalar, a
                           zero-sized tensor and metadata {"format": "pt", "note": "fixture"}
  gpt2/                    a tiny GPT-2 built from a config, save_pretrained unsharded
  gpt2_sharded/            the same model, save_pretrained(max_shard_size="20KB"), with
                           model.safetensors.index.json
  expected.json            for each checkpoint: every tensor's name, dtype, shape, absolute
                           data offset and byte size, the files and the metadata, computed
                           here from the raw bytes with json + struct (independently of the
                           C reader), and the library versions

The tests compare the C reader and `wbctl inspect --json` against expected.json.
"""

import json
import os
import shutil
import struct
import sys
import tempfile

import safetensors
import torch
import transformers
from safetensors.torch import save_file

# Element sizes in bits, as the safetensors specification defines them.
DTYPE_BITS = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
    "U64": 64,
}

# Every torch dtype worth trying; the installed safetensors decides which it stores.
CANDIDATES = [
    "bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "float8_e5m2", "float8_e4m3fn",
    "float8_e8m0fnu", "complex64", "float4_e2m1fn_x2",
]


def make_tensor(dtype, shape, gen):
    """Deterministic contents: random bytes reinterpreted, so every dtype works alike."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).to(torch.bool)
    n = 1
    for d in shape:
        n *= d
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def parse_file(path):
    """Reads a safetensors header with nothing but struct and json."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    size = os.path.getsize(path)
    meta = header.pop("__metadata__", {}) or {}
    tensors = []
    for name, info in header.items():
        begin, end = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        bits = count * DTYPE_BITS[info["dtype"]]
        assert bits % 8 == 0, (path, name)
        assert end - begin == bits // 8, (path, name, begin, end, bits)
        tensors.append({
            "name": name,
            "dtype": info["dtype"],
            "shape": list(info["shape"]),
            "offset": 8 + n + begin,
            "nbytes": end - begin,
        })
    assert sum(t["nbytes"] for t in tensors) == size - 8 - n, path
    return meta, tensors


def describe(root, rel, files, index_meta=None):
    """The expected table of one checkpoint, in the reader's order: files by name,
    tensors by (file, offset, name); metadata from the index first, then each shard's
    keys not yet present, numbers rendered as decimal text."""
    files = sorted(files)
    metadata = {}
    for k, v in (index_meta or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise SystemExit(f"index metadata {k!r} is neither an integer nor a string")
        metadata[k] = str(v)
    tensors = []
    for fi, frel in enumerate(files):
        meta, ts = parse_file(os.path.join(root, frel))
        for k, v in meta.items():
            metadata.setdefault(k, v)
        for t in ts:
            t["file"] = frel
            t["_key"] = (fi, t["offset"], t["name"])
            tensors.append(t)
    tensors.sort(key=lambda t: t["_key"])
    for t in tensors:
        del t["_key"]
    return {
        "path": rel,
        "files": files,
        "metadata": dict(sorted(metadata.items())),
        "tensors": tensors,
        "total_bytes": sum(t["nbytes"] for t in tensors),
    }


def save_model(model, out, **kw):
    try:
        model.save_pretrained(out, safe_serialization=True, **kw)
    except TypeError:
        # Newer transformers always write safetensors and dropped the argument.
        model.save_pretrained(out, **kw)
    for name in os.listdir(out):
        if not (name.endswith(".safetensors") or name == "model.safetensors.index.json"):
            os.remove(os.path.join(out, name))


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)

    # (a) one tensor of every dtype the installed libraries can store.
    tensors, stored, skipped = {}, [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CANDIDATES:
            dt = getattr(torch, name, None)
            if dt is None:
                skipped[name] = "not in this torch"
                continue
            try:
                t = make_tensor(dt, (2, 3), gen)
                probe = os.path.join(tmp, "probe.safetensors")
                save_file({"t": t}, probe)
                parse_file(probe)
            except AssertionError as e:
                skipped[name] = f"written with inconsistent sizes: {e}"
                continue
            except Exception as e:  # the library's refusal is what we record
                skipped[name] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
                continue
            tensors[f"t_{name}"] = t
            stored.append(name)
    tensors["scalar"] = torch.tensor(3.5, dtype=torch.float32)
    tensors["empty"] = torch.zeros((0, 4), dtype=torch.float32)
    for name, why in skipped.items():
        print(f"skipped dtype {name}: {why}")
    save_file(tensors, os.path.join(root, "all_dtypes.safetensors"),
              metadata={"format": "pt", "note": "fixture"})

    # (b) a tiny GPT-2, built from a config (no download), unsharded and sharded.
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128,
                                     n_positions=64)
    model = transformers.GPT2LMHeadModel(config).eval()
    save_model(model, os.path.join(root, "gpt2"))
    save_model(model, os.path.join(root, "gpt2_sharded"), max_shard_size="20KB")

    # (c) the expected tables.
    checkpoints = [describe(root, "all_dtypes.safetensors", ["all_dtypes.safetensors"]),
                   describe(root, "gpt2", ["gpt2/model.safetensors"])]
    with open(os.path.join(root, "gpt2_sharded", "model.safetensors.index.json")) as f:
        index = json.load(f)
    shards = sorted({"gpt2_sharded/" + v for v in index["weight_map"].values()})
    on_disk = sorted("gpt2_sharded/" + n for n in os.listdir(os.path.join(root, "gpt2_sharded"))
                     if n.endswith(".safetensors"))
    assert shards == on_disk, (shards, on_disk)
    sharded = describe(root, "gpt2_sharded", shards, index.get("metadata"))
    for t in sharded["tensors"]:
        assert "gpt2_sharded/" + index["weight_map"][t["name"]] == t["file"], t
    assert len(sharded["tensors"]) == len(index["weight_map"])
    checkpoints.append(sharded)

    expected = {
        "generator": "tests/data/make_official_fixtures.py",
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "safetensors": safetensors.__version__,
            "transformers": transformers.__version__,
        },
        "dtypes_stored": stored,
        "dtypes_skipped": skipped,
        "checkpoints": checkpoints,
    }
    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    for c in checkpoints:
        print(f"{c['path']}: {len(c['files'])} files, {len(c['tensors'])} tensors, "
              f"{c['total_bytes']} bytes")
    print(json.dumps(expected["versions"]))


if __name__ == "__main__":
    main()
