"""Checkpoint names and how a model's FQNs become them. Pure Python: a
safetensors header is read directly (8-byte length, JSON), so neither torch
nor the safetensors package is needed."""

import json
import os
import struct

# A header larger than this is not a checkpoint's (safetensors caps it at
# 100 MB too).
_MAX_HEADER = 100 << 20


def _header_names(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("%s: not a safetensors file (shorter than 8 bytes)" % path)
        n = struct.unpack("<Q", raw)[0]
        if n > _MAX_HEADER:
            raise ValueError("%s: not a safetensors file (header of %d bytes)" % (path, n))
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise ValueError("%s: not a safetensors file (header: %s)" % (path, e)) from None
    if not isinstance(header, dict):
        raise ValueError("%s: not a safetensors file (the header is no JSON object)" % path)
    return {k for k in header if k != "__metadata__"}


def checkpoint_names(path):
    """Tensor names of a safetensors checkpoint: a file, a directory with
    model.safetensors.index.json or model.safetensors, or an index file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        path = index if os.path.exists(index) else os.path.join(path, "model.safetensors")
    if path.endswith(".json"):
        with open(path) as f:
            return set(json.load(f)["weight_map"])
    return _header_names(path)


def map_name(name, strip_prefix, prefix):
    """The checkpoint name of the model's FQN `name`: `strip_prefix` removed
    where it starts the name, then `prefix` put in front (libwbclient's
    strip_prefix / prefix rules)."""
    if strip_prefix and name.startswith(strip_prefix):
        name = name[len(strip_prefix):]
    return (prefix or "") + name
