"""The small files the integration tests of containers make: float32
safetensors checkpoints, packages around the FAKE AOTI model library
(tests/fake_aoti: y = x * w + b on the CPU, not PyTorch) and the outputs
workers write. Imported by the tests' inline Python (lib.sh exports
WB_TEST_PY, this folder)."""
import json
import struct
import zipfile


def st(path, tensors):
    """Writes [(name, [float, ...]), ...] as a safetensors file of F32
    vectors."""
    header, data = {}, b""
    for name, values in tensors:
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": [len(values)],
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def fake_package(path, library, spec):
    """A .pt2 in the layout of a real one (<name>/data/aotinductor/model/)
    holding the fake library and its spec."""
    with zipfile.ZipFile(path, "w") as z:
        z.write(library, "variant/data/aotinductor/model/model.so")
        z.writestr("variant/data/aotinductor/model/fake_aoti_spec.txt", spec)


def output0(path):
    """The float32 values of tensor output0 of a safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    a, b = json.loads(raw[8:8 + n])["output0"]["data_offsets"]
    return struct.unpack("<%df" % ((b - a) // 4), raw[8 + n + a:8 + n + b])
