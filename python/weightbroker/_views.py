"""Zero-copy views of memory that the C library owns: torch tensors and
numpy arrays over a lease's mapping, or over a model runtime's outputs.

What keeps the memory alive (a lease pin) is held through a Python
reference that the consumer drops from C when the view dies: host memory
is a ctypes array carrying the pin, given to torch.frombuffer or
numpy.frombuffer, which keep the array; CUDA memory is an object carrying
the pin and describing the memory by __cuda_array_interface__, given to
torch.as_tensor, which keeps the object. Views are thus released correctly
whenever they die, an exception pending or not. Only a torch that cannot
read that interface (it needs numpy for it) gets CUDA memory through DLPack
(_dlpack), whose deleter cannot run while an exception is pending.

dtypes are safetensors names ("BF16"); a dtype the consumer lacks is a
TypeError naming the tensor and the dtype, raised by check_torch() and
check_numpy() before anything is made."""

import ctypes

from . import _dlpack

# safetensors dtype -> (torch dtype name, bytes per element). A torch that
# lacks the dtype (torch 1.13 has no uint16, uint32, uint64 or float8)
# cannot view the tensor; F4 and F6 pack several elements in a byte and no
# torch dtype has one element per value.
TORCH_DTYPES = {
    "BOOL": ("bool", 1), "U8": ("uint8", 1), "I8": ("int8", 1),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
    "I16": ("int16", 2), "U16": ("uint16", 2), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I32": ("int32", 4), "U32": ("uint32", 4), "F32": ("float32", 4),
    "I64": ("int64", 8), "U64": ("uint64", 8), "F64": ("float64", 8), "C64": ("complex64", 8),
}

# numpy dtypes of the safetensors names numpy has (no bf16, fp8 or fp4).
NUMPY_DTYPES = {"BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "I32": "<i4",
                "U32": "<u4", "I64": "<i8", "U64": "<u8", "F16": "<f2", "F32": "<f4",
                "F64": "<f8", "C64": "<c8"}


def _torch_dtype(dtype):
    """(torch.dtype, bytes per element), or None when this torch has none."""
    import torch

    entry = TORCH_DTYPES.get(dtype)
    dt = getattr(torch, entry[0], None) if entry else None
    return (dt, entry[1]) if isinstance(dt, torch.dtype) else None


def check_torch(name, dtype):
    """TypeError naming tensor `name` unless this torch can view `dtype`."""
    if _torch_dtype(dtype) is None:
        import torch

        hint = " (numpy() reads it)" if dtype in NUMPY_DTYPES else ""
        raise TypeError("tensor %s: torch %s has no dtype %s%s"
                        % (name, torch.__version__, dtype, hint))


def check_numpy(name, dtype, device):
    """TypeError naming tensor `name` unless numpy can view it."""
    if device >= 0:
        raise TypeError("tensor %s is in CUDA memory (device %d): use tensors()" % (name, device))
    if dtype not in NUMPY_DTYPES:
        raise TypeError("tensor %s: numpy has no dtype %s (use tensors())" % (name, dtype))


def torch_view(data, dtype, shape, nbytes, device, keep, name):
    """A torch tensor of safetensors dtype `dtype` and `shape` over the
    `nbytes` at address `data`, without copying: host memory (device -1)
    or the memory of CUDA ordinal `device`. keep() is called once the view
    exists; what it returns lives as long as the view's memory does. An
    empty tensor views nothing and keeps nothing."""
    import torch

    check_torch(name, dtype)
    dt, itemsize = _torch_dtype(dtype)
    if nbytes == 0:
        return torch.empty(shape, dtype=dt, device="cuda:%d" % device if device >= 0 else "cpu")
    if device < 0:
        # torch.frombuffer holds the array until the tensor's storage dies.
        raw = (ctypes.c_uint8 * nbytes).from_address(data)
        view = torch.frombuffer(raw, dtype=dt).reshape(shape)
        raw._wb_pin = keep()
        return view
    flat = _from_cuda_array_interface(data, nbytes, itemsize, device, keep)
    if flat is None:
        return from_dlpack(data, dt, itemsize, shape, nbytes, device, keep, name, dtype)
    return (flat if flat.dtype == dt else flat.view(dt)).reshape(shape)


# bytes per element -> the __cuda_array_interface__ type of integers that size
_INT_TYPESTR = {1: "|i1", 2: "<i2", 4: "<i4", 8: "<i8"}


class _CudaMemory:
    """CUDA memory as torch.as_tensor reads it; torch keeps this object (and
    so its pin) until the tensor's storage dies."""

    def __init__(self, data, n, typestr):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": typestr,
                                         "data": (data, False), "version": 2}
        self.pin = None


def _from_cuda_array_interface(data, nbytes, itemsize, device, keep):
    """A 1-D tensor of `itemsize`-byte integers over CUDA memory (the caller
    views them as the dtype, as for DLPack), or None when this torch cannot
    read __cuda_array_interface__ without copying (it needs numpy)."""
    import torch

    mem = _CudaMemory(data, nbytes // itemsize, _INT_TYPESTR[itemsize])
    try:
        flat = torch.as_tensor(mem, device="cuda:%d" % device)
    except Exception:  # "Numpy is not available", or any refusal: DLPack then
        return None
    if flat.data_ptr() != data:
        return None  # a copy, not a view
    mem.pin = keep()
    return flat


def from_dlpack(data, dt, itemsize, shape, nbytes, device, keep, name, dtype):
    """torch_view's DLPack path, for CUDA memory when torch cannot read
    __cuda_array_interface__ (host memory works too, which is how it is
    tested without a GPU). A dtype that this torch has but
    does not take from DLPack (BOOL, whose kDLBool torch 1.13 refuses with
    "Unsupported code 6"; U16, U32, U64, FP8) goes as integers of its size
    and is viewed as torch dtype `dt`."""
    flat = _dlpack.wrap(data, nbytes, dtype, itemsize, device, keep,
                        "tensor %s (%s)" % (name, dtype))
    return (flat if flat.dtype == dt else flat.view(dt)).reshape(shape)


def numpy_view(data, dtype, shape, nbytes, keep):
    """A read-only numpy array over host memory (see torch_view)."""
    import numpy as np

    raw = (ctypes.c_uint8 * nbytes).from_address(data) if nbytes else bytearray()
    # A read-only buffer: numpy then refuses to make the array writeable.
    arr = np.frombuffer(memoryview(raw).toreadonly(), dtype=NUMPY_DTYPES[dtype]).reshape(shape)
    if nbytes:
        raw._wb_pin = keep()  # freed with the last array using the buffer
    return arr
