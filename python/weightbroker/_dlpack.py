"""torch tensors over memory that the C library owns, through DLPack.

The DLPack structures (the stable legacy ABI, "dltensor" capsules, read by
torch >= 1.10) are built here with ctypes, so no compiled extension is
needed. The consumer takes the capsule and calls the deleter when its
tensor dies; the deleter drops what wrap()'s keep() returned, which is how
a view keeps its lease (or model) alive, and how a lease knows that views
still exist.

The deleter is a ctypes callback, and ctypes cannot call Python while an
exception is pending: a tensor freed then (a temporary dropped while an
exception unwinds the stack) keeps what it held, the exception is replaced
by a SystemError, and the interpreter may crash (seen with torch 1.13 and
2.11). So views are made without DLPack where torch allows it (see _views),
and code that builds several views drops them itself when it fails
(Lease._build)."""

import ctypes
import threading

kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex = 0, 1, 2, 4, 5

# safetensors dtype -> (DLPack type code, bits), for the dtypes every torch
# since 1.10 reads from DLPack. Others go as integers of their size (see
# wrap): BOOL's own code, kDLBool (6), is refused by torch 1.13
# ("Unsupported code 6"), as are kDLUInt beyond 8 bits.
CODES = {
    "U8": (kDLUInt, 8),
    "I8": (kDLInt, 8),
    "I16": (kDLInt, 16),
    "I32": (kDLInt, 32),
    "I64": (kDLInt, 64),
    "F16": (kDLFloat, 16),
    "BF16": (kDLBfloat, 16),
    "F32": (kDLFloat, 32),
    "F64": (kDLFloat, 64),
    "C64": (kDLComplex, 64),
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

# Address of a live DLManagedTensor -> [the struct, shape array, what keep() returned].
_live = {}
_live_lock = threading.Lock()


@_Deleter
def _delete(managed):
    addr = ctypes.cast(managed, ctypes.c_void_p).value
    with _live_lock:
        entry = _live.pop(addr, None)
    del entry  # drops the owner (a lease pin) outside the lock


def wrap(data, nbytes, dtype, itemsize, device, keep, what):
    """A 1-D tensor over the `nbytes` at address `data`, in the memory of
    CUDA ordinal `device` (-1: host memory): of safetensors dtype `dtype`
    when it has a DLPack code in CODES, else of `itemsize`-byte integers
    (1, 2, 4 or 8), which the caller views as the dtype. keep() is called
    once torch holds the memory; what it returns lives until torch frees
    it. TypeError naming `what` if torch refuses the capsule."""
    import torch.utils.dlpack

    m = DLManagedTensor()
    shp = (ctypes.c_int64 * 1)(nbytes // itemsize)
    t = m.dl_tensor
    t.data = data
    t.device = DLDevice(kDLCUDA if device >= 0 else kDLCPU, max(device, 0))
    t.ndim = 1
    code, bits = CODES.get(dtype, (kDLInt, 8 * itemsize))
    t.dtype = DLDataType(code, bits, 1)
    t.shape = shp
    t.strides = None  # compact row-major
    t.byte_offset = 0
    m.deleter = _delete
    addr = ctypes.addressof(m)
    m.manager_ctx = addr
    entry = [m, shp, None]
    with _live_lock:
        _live[addr] = entry
    capsule = _capsule_new(addr, ctypes.addressof(_NAME), None)
    try:
        view = torch.utils.dlpack.from_dlpack(capsule)
    except Exception as e:
        # Not consumed: the deleter will never run.
        with _live_lock:
            _live.pop(addr, None)
        raise TypeError("%s (on %s): torch refused the DLPack view: %s"
                        % (what, "cuda:%d" % device if device >= 0 else "cpu", e)) from e
    # Set only now, so that a failure above leaves nothing held: the view
    # is alive, so the deleter cannot have run.
    entry[2] = keep()
    return view
