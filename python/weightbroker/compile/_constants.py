"""The constants file the compile step stores in a package: a safetensors
file at <archive>/weightbroker/constants.safetensors holding the tensors in
no checkpoint (keyed by FQN) and, in its metadata, the binding rules
(aliases, prefixes, mutated constants) that libwbclient reads."""

import ctypes
import json
import os
import struct
import tempfile
import zipfile

FORMAT = "1"
ENTRY = "weightbroker/constants.safetensors"

# torch dtype name -> safetensors dtype; names a torch release lacks are
# skipped.
_ST_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
              "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
              "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
              "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def _st_dtype(name, t):
    key = str(t.dtype).replace("torch.", "")
    if key not in _ST_DTYPES:
        raise TypeError("tensor %s: dtype %s has no safetensors name" % (name, t.dtype))
    return _ST_DTYPES[key]


def save_tensors(path, tensors, metadata=None):
    """Writes {name: CPU tensor} as a safetensors file, the tensors' bytes
    back to back in name order after a header padded to 8 bytes (no torch
    or safetensors package calls: a raw copy of each contiguous tensor)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _st_dtype(name, t), "shape": [int(d) for d in t.shape],
                        "data_offsets": [off, off + n]}
        blobs.append(ctypes.string_at(t.data_ptr(), n) if n else b"")
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def _add_to_package(package_path, file_path):
    with zipfile.ZipFile(package_path) as z:
        names = z.namelist()
    top = names[0].split("/", 1)[0] if names and "/" in names[0] else ""
    entry = "%s/%s" % (top, ENTRY) if top else ENTRY
    with zipfile.ZipFile(package_path, "a", compression=zipfile.ZIP_STORED) as z:
        z.write(file_path, entry)
    return entry


def constants_metadata(aliases, strip_prefix=None, prefix=None, mutated=()):
    """The metadata libwbclient reads from the constants file."""
    meta = {"weightbroker.format": FORMAT,
            "weightbroker.aliases": ",".join("%s=%s" % kv for kv in sorted(aliases.items()))}
    if mutated:
        meta["weightbroker.mutated"] = ",".join(mutated)
    if strip_prefix:
        meta["weightbroker.strip_prefix"] = strip_prefix
    if prefix:
        meta["weightbroker.prefix"] = prefix
    return meta


def write_constants(package_path, aliases, extra, strip_prefix=None, prefix=None, mutated=()):
    """Stores the constants file (the `extra` tensors, the aliases, prefix
    rules and mutated constants) in the .pt2 zip at `package_path`, under
    the archive's top folder; returns the entry's name."""
    meta = constants_metadata(aliases, strip_prefix, prefix, mutated)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "constants.safetensors")
        save_tensors(path, extra, metadata=meta)
        return _add_to_package(package_path, path)
