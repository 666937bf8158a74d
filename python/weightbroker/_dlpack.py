"""Zero-copy tensors over memory that the C library owns, through DLPack.

The DLPack structures (the stable legacy ABI, "dltensor" capsules, read by
torch >= 1.10 and numpy >= 1.22) are built here with ctypes, so no compiled
extension is needed. The consumer takes the capsule and calls the deleter
when its tensor dies; the deleter drops the owner object given to wrap(),
which is how a view keeps its lease (or model) alive, and how a lease knows
that views still exist."""

import ctypes
import threading

kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLBool = 0, 1, 2, 4, 6

# safetensors dtype -> (DLPack type code, bits)
DTYPES = {
    "BOOL": (kDLBool, 8),
    "U8": (kDLUInt, 8),
    "I8": (kDLInt, 8),
    "I16": (kDLInt, 16),
    "U16": (kDLUInt, 16),
    "I32": (kDLInt, 32),
    "U32": (kDLUInt, 32),
    "I64": (kDLInt, 64),
    "U64": (kDLUInt, 64),
    "F16": (kDLFloat, 16),
    "BF16": (kDLBfloat, 16),
    "F32": (kDLFloat, 32),
    "F64": (kDLFloat, 64),
}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_capsule_new = ctypes.pythonapi["PyCapsule_New"]  # a private function object: argtypes differ per module
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_NAME = ctypes.create_string_buffer(b"dltensor")  # must outlive every capsule

# Address of a live DLManagedTensor -> (the struct, shape array, owner).
_live = {}
_live_lock = threading.Lock()


@_Deleter
def _delete(managed):
    addr = ctypes.cast(managed, ctypes.c_void_p).value
    with _live_lock:
        entry = _live.pop(addr, None)
    del entry  # drops the owner (a lease pin) outside the lock


def wrap(data, dtype, shape, device, owner, name):
    """A torch tensor over `data` (an address) without copying. dtype is a
    safetensors name; device is a CUDA ordinal or -1 for host memory; owner
    is kept alive until torch frees the tensor."""
    import torch.utils.dlpack

    if dtype not in DTYPES:
        raise TypeError("tensor %s: dtype %s has no DLPack equivalent" % (name, dtype))
    code, bits = DTYPES[dtype]
    m = DLManagedTensor()
    nd = len(shape)
    shp = (ctypes.c_int64 * max(nd, 1))(*shape)
    t = m.dl_tensor
    t.data = data
    t.device = DLDevice(kDLCUDA if device >= 0 else kDLCPU, max(device, 0))
    t.ndim = nd
    t.dtype = DLDataType(code, bits, 1)
    t.shape = shp
    t.strides = None  # compact row-major
    t.byte_offset = 0
    m.deleter = _delete
    addr = ctypes.addressof(m)
    m.manager_ctx = addr
    with _live_lock:
        _live[addr] = (m, shp, owner)
    capsule = _capsule_new(addr, ctypes.addressof(_NAME), None)
    try:
        return torch.utils.dlpack.from_dlpack(capsule)
    except Exception as e:
        # Not consumed: the deleter will never run.
        with _live_lock:
            _live.pop(addr, None)
        raise TypeError("tensor %s (%s on %s): torch refused the DLPack view: %s"
                        % (name, dtype, "cuda:%d" % device if device >= 0 else "cpu", e)) from e
