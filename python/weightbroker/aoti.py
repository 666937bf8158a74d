"""AOTInductor models on leased weights, through libwbclient's container
API: the same binding as C programs (constants matched by original name,
dtype and size checked, folding, the container record sent to the broker),
so Python and C workers follow one set of rules."""

import contextlib
import ctypes
import os
import threading

from . import _views
from ._lib import (ContainerInfo, ContainerOptions, ContainerTensor, TensorDesc, check,
                   encode_name, lib, s)
from .errors import BrokerError, BusyError, StateError

_capsule_ptr = ctypes.pythonapi["PyCapsule_GetPointer"]
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_new = ctypes.pythonapi["PyCapsule_New"]  # a private function object: argtypes differ per module
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# torch dtype name -> safetensors name
_ST_DTYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
             "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
             "bool": "BOOL"}


def _st_dtype(t, what):
    name = str(t.dtype).replace("torch.", "")
    if name not in _ST_DTYPE:
        raise TypeError("%s: dtype %s is not supported" % (what, t.dtype))
    return _ST_DTYPE[name]


def _torch_bridge_available():
    try:
        from torch._C import _aoti
    except ImportError:
        return False
    return hasattr(_aoti, "unsafe_alloc_void_ptrs_from_tensors") and hasattr(
        _aoti, "alloc_tensors_by_stealing_from_void_ptrs")


class Model:
    """A callable AOTInductor model bound to leased weights (see load_aoti).

    model(*inputs) -> list of output tensors. The model keeps its leases
    alive, and they refuse release while it lives; close() (or the end of a
    `with` block, or garbage collection) destroys the container."""

    def __init__(self, path, leases, *, tensors=None, aliases=None, device=None,
                 strip_prefix=None, prefix=None, constants_file=None, mutated=None,
                 copy_mutated=False, torch_lib_dir="auto", num_models=1, work_dir=None,
                 bridge=None):
        L = lib()
        if not isinstance(leases, (list, tuple)):
            leases = [leases]
        self.path = os.fspath(path)
        self.leases = list(leases)
        self._lock = threading.Lock()
        self._h = ctypes.c_void_p()
        self._ran = ctypes.c_uint32()  # the version of the last run
        self._side = None  # see _stream
        if bridge is None:
            bridge = "torch" if _torch_bridge_available() else "wb"
        if bridge not in ("torch", "wb"):
            raise ValueError("bridge must be 'torch' or 'wb', not %r" % (bridge,))
        if bridge == "torch" and not _torch_bridge_available():
            raise BrokerError(-16, "WB_ENOSYS", "this torch has no torch._C._aoti tensor "
                              "handle helpers (unsafe_alloc_void_ptrs_from_tensors); use bridge='wb'")
        self.bridge = bridge

        # Caller tensors: constants no lease has. Aliases, prefixes and the
        # package's constants file are libwbclient's binding rules, passed
        # through as they are, so Python and C workers bind alike.
        extra = []  # (fqn, data, dtype, shape, device)
        self._keep = []  # caller tensors must outlive the container
        for fqn, t in (tensors or {}).items():
            encode_name(fqn, "load_aoti(): a name in tensors")
            if not t.is_contiguous():
                raise ValueError("tensor %s must be contiguous" % fqn)
            self._keep.append(t)
            extra.append((fqn, t.data_ptr(), _st_dtype(t, "tensor %s" % fqn), tuple(t.shape),
                          t.device.index if t.device.type == "cuda" else -1))
        if isinstance(aliases, dict):
            for name, target in aliases.items():
                encode_name(name, "load_aoti(): a name in aliases")
                encode_name(target, "load_aoti(): aliases[%r]" % (name,))
                if not name or not target or "=" in name + target or "," in name + target:
                    raise ValueError("alias %r -> %r: names must be non-empty and hold "
                                     "no '=' or ','" % (name, target))
            aliases = ",".join("%s=%s" % kv for kv in aliases.items())

        ct = (ContainerTensor * max(len(extra), 1))()
        self._c_keep = [ct]
        for i, (fqn, data, dtype, shape, dev) in enumerate(extra):
            shp = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
            names = (fqn.encode(), dtype.encode())
            self._c_keep += [shp, names]
            ct[i].fqn, ct[i].data, ct[i].dtype = names[0], data, names[1]
            ct[i].ndim, ct[i].shape, ct[i].device = len(shape), shp, dev

        opts = ContainerOptions()
        L.wb_container_options_init(ctypes.byref(opts))
        if torch_lib_dir == "auto":
            torch_lib_dir = _torch_lib_dir()
        keep = []
        for field, value in (("torch_lib_dir", torch_lib_dir), ("device", device),
                             ("work_dir", work_dir), ("strip_prefix", strip_prefix),
                             ("prefix", prefix), ("aliases", aliases),
                             ("constants_file", constants_file), ("mutated", mutated)):
            if value:
                path_like = field in ("torch_lib_dir", "work_dir", "constants_file")
                b = (os.fsencode(value) if path_like
                     else encode_name(value, "load_aoti(): %s" % field))
                keep.append(b)
                setattr(opts, field, b)
        opts.num_models = num_models
        opts.copy_mutated = 1 if copy_mutated else 0
        opts.tensors = ct if extra else None
        opts.n_tensors = len(extra)

        # Pinned while the container is created (its registration then keeps
        # them): none can be released meanwhile, and a released one raises
        # StateError here.
        pins = [l._pin() for l in self.leases]
        arr = (ctypes.c_void_p * max(len(self.leases), 1))(*[l._h for l in self.leases])
        rc = L.wb_container_create(arr, len(self.leases), os.fsencode(self.path),
                                   ctypes.byref(opts), ctypes.byref(self._h))
        del pins
        if rc != 0:
            msg = s(L.wb_container_errmsg(self._h))
            L.wb_container_destroy(ctypes.byref(self._h))
            check(rc, lambda: msg)
        self._refresh_info()
        self.device = self.info["device"]
        self.following = False

    def _refresh_info(self):
        L = lib()
        info = ContainerInfo()
        L.wb_container_get_info(self._h, ctypes.byref(info))
        self.info = {name: (s(getattr(info, name)) if isinstance(getattr(info, name), bytes)
                            else getattr(info, name)) for name, _ in ContainerInfo._fields_}

    @property
    def version(self):
        """The version of the model's first lease the next run uses."""
        self._refresh_info()
        return self.info["version"]

    def update(self, leases):
        """Swaps new weights in between runs (wb_container_update): each
        lease of `leases` (a Lease or a list) replaces the model's lease of
        the same model name. Runs in flight finish on the old weights; later
        runs use the new ones; no run sees a mix. On success the model keeps
        references to the new leases and no longer uses the old ones, which
        the caller may then release; on failure (BrokerError) nothing
        changed. Not for a model that follows versions (it owns its
        leases)."""
        L = lib()
        h = self._handle()
        if self.following:
            raise StateError(-9, "WB_ESTATE", "model %s follows versions: its container swaps "
                             "them itself" % self.path)
        if not isinstance(leases, (list, tuple)):
            leases = [leases]
        leases = list(leases)
        pins = [l._pin() for l in leases]
        arr = (ctypes.c_void_p * max(len(leases), 1))(*[l._h for l in leases])
        rc = L.wb_container_update(h, arr, len(leases))
        del pins
        self._fail(rc)
        for new in leases:
            self.leases = [new if old.model == new.model else old for old in self.leases]
        self._refresh_info()

    def _follow(self, client):
        """wb_container_follow; the C container then owns the leases."""
        L = lib()
        for l in self.leases:
            if l._views:
                raise BusyError(-7, "WB_EBUSY", "lease %s on %r: %d tensor view(s) alive; a "
                                "model that follows versions releases the lease"
                                % (l.id, l.model, l._views))
        self._fail(L.wb_container_follow(self._handle(), client._handle()))
        for l in self.leases:
            l._hand_over(self)
        self._client = client  # kept: it must outlive the container
        client._followers.add(self)
        self.following = True

    def _handle(self):
        if not self._h:
            raise ValueError("model %s was closed" % self.path)
        return self._h

    def _fail(self, rc):
        check(rc, lambda: lib().wb_container_errmsg(self._h))

    def _stream(self, stream):
        """The stream handle to run on, and the torch stream the run must be
        ordered with when it is not that one (else None)."""
        if not self.device.startswith("cuda"):
            return (getattr(stream, "cuda_stream", stream) if stream is not None else None), None
        import torch
        dev = torch.device(self.device)
        cur = stream if stream is not None else torch.cuda.current_stream(dev)
        h = getattr(cur, "cuda_stream", cur)
        if h:
            # torch's current stream (or the caller's): the model's kernels
            # are ordered with the work that made the inputs and with what
            # reads the outputs, as torch's own AOTI runner does.
            return h, None
        # Handle 0 is the legacy default stream. torch's runtime refuses it
        # as an external stream (c10 has no stream id for it), and NULL would
        # select the container's private stream; so the model runs on a side
        # stream of its own, after the default stream's work and before
        # what follows there.
        if self._side is None:
            self._side = torch.cuda.Stream(dev)
        return self._side.cuda_stream, torch.cuda.default_stream(dev)

    def __call__(self, *inputs, stream=None):
        """Runs the model on `inputs` (torch tensors on the model's device);
        returns the outputs as a list of torch tensors. On CUDA it runs on
        `stream` (default: torch's current stream) and returns once queued,
        as any torch operation does."""
        L = lib()
        h = self._handle()
        n_out = self.info["n_outputs"]
        if not n_out:
            raise BrokerError(-16, "WB_ENOSYS", "model %s does not say how many outputs it has"
                              % self.path)
        s_ptr, order = self._stream(stream)
        if order is not None:
            self._side.wait_stream(order)
        outs = (ctypes.c_void_p * n_out)()
        if self.bridge == "torch":
            from torch._C import _aoti

            handles = [_capsule_ptr(c, None)
                       for c in _aoti.unsafe_alloc_void_ptrs_from_tensors(list(inputs))]
            ins = (ctypes.c_void_p * max(len(handles), 1))(*handles)
            # Inputs are stolen by the model, also on failure.
            self._fail(L.wb_container_run_versioned(h, ins, len(handles), outs, n_out, s_ptr,
                                                    ctypes.byref(self._ran)))
            result = _aoti.alloc_tensors_by_stealing_from_void_ptrs(
                [_capsule_new(outs[i], None, None) for i in range(n_out)])
        else:
            result = self._run_wb(inputs, outs, n_out, s_ptr)
        if order is not None:
            # The outputs were made on the side stream and are read on the
            # default one: order it, and tell the caching allocator.
            order.wait_stream(self._side)
            for t in result:
                t.record_stream(order)
        return result

    def _run_wb(self, inputs, outs, n_out, s_ptr):
        # The model runtime's own tensors (for a runtime that is not this
        # process's torch): inputs wrap the caller's memory, outputs are
        # copied into torch tensors and the runtime's handles freed.
        L = lib()
        h = self._handle()
        ins = (ctypes.c_void_p * max(len(inputs), 1))()
        keep = []
        try:
            for i, t in enumerate(inputs):
                t = t.contiguous()
                keep.append(t)
                shp = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
                dev = t.device.index if t.device.type == "cuda" else -1
                handle = ctypes.c_void_p()
                self._fail(L.wb_container_tensor_from_blob(
                    h, t.data_ptr(), _st_dtype(t, "input %d" % i).encode(), t.dim(), shp,
                    dev, ctypes.byref(handle)))
                ins[i] = handle.value
        except Exception:
            for i in range(len(inputs)):
                L.wb_container_tensor_delete(h, ins[i])
            raise
        self._fail(L.wb_container_run_versioned(h, ins, len(inputs), outs, n_out, s_ptr,
                                                ctypes.byref(self._ran)))
        result = []
        try:
            # The copies must follow the run on its own stream: on another
            # one they could read the outputs before the model wrote them.
            with _on_stream(self.device, s_ptr):
                for i in range(n_out):
                    d = TensorDesc()
                    self._fail(L.wb_container_tensor_describe(h, outs[i], ctypes.byref(d)))
                    view = _views.torch_view(d.data, s(d.dtype), tuple(d.shape[:d.ndim]),
                                             d.nbytes, d.device, lambda: None, "output %d" % i)
                    result.append(view.clone())
        finally:
            for i in range(n_out):
                L.wb_container_tensor_delete(h, outs[i])
        return result

    @property
    def last_run_version(self):
        """The version of the weights the last call used
        (wb_container_run_versioned)."""
        return int(self._ran.value)

    def close(self):
        """Destroys the container; its leases may then be released (a
        model that follows versions releases them itself)."""
        with self._lock:
            if self._h:
                lib().wb_container_destroy(ctypes.byref(self._h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None):
            self.close()


def _torch_lib_dir():
    """torch's lib directory when torch is imported, so that the model
    library binds to the libtorch this process already runs."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    d = os.path.join(os.path.dirname(torch.__file__), "lib")
    return d if os.path.isdir(d) else None


@contextlib.contextmanager
def _on_stream(device, handle):
    """Makes the CUDA stream `handle` torch's current stream (a no-op on the
    CPU or for the default stream)."""
    if not device.startswith("cuda") or not handle:
        yield
        return
    import torch
    dev = torch.device(device)
    with torch.cuda.stream(torch.cuda.ExternalStream(handle, device=dev)):
        yield


def load_aoti(path, leases, *, aliases=None, tensors=None, device=None, strip_prefix=None,
              prefix=None, constants_file=None, follow=False, **kwargs):
    """Loads an AOTInductor package (.pt2, its unpacked directory, or the
    model .so) on the weights of `leases` (a Lease or a list) and returns a
    callable Model. The model's constants are bound by name to the leased
    tensors without copying them, by libwbclient's rules (see
    include/wb/container.h): `aliases` {constant: leased tensor name} (or the
    C form "name=target,...") binds a constant to a tensor of another name,
    such as a tied lm_head.weight; `strip_prefix` / `prefix` map the model's
    constant names to the checkpoint's (a model exported inside a wrapper);
    `constants_file` names the file of constants no checkpoint has (default:
    the one weightbroker.compile stored in the package); `mutated` ("fqn,...")
    names constants the compiled graph writes, besides the package's list:
    binding those to a lease is refused (WB_EPERM) unless `copy_mutated`
    binds them to private copies; `tensors` {constant:
    torch.Tensor} supplies constants no lease has (the tensors must stay
    unchanged while the model lives). device: "cpu", "cuda" or "cuda:N"
    (default: the leases' device). Keywords: torch_lib_dir ("auto": the
    imported torch's), num_models, work_dir, mutated, copy_mutated, bridge
    ("torch": torch's own tensor handles, zero copy; "wb": the runtime's
    handles through libwbclient, outputs copied).

    follow=True: the model follows new versions of its leases' models
    (wb_container_follow, through the leases' client): each one the broker
    makes current is swapped in between runs, on a thread of the C
    library's. The model then owns its leases: they are no longer the
    caller's (each Lease object reads as released), the model releases each
    one it replaces and the rest at close(), and closing the client closes
    the model first. BrokerError WB_ENOSYS from a broker that predates
    versions (the leases stay the caller's)."""
    model = Model(path, leases, aliases=aliases, tensors=tensors, device=device,
                  strip_prefix=strip_prefix, prefix=prefix, constants_file=constants_file,
                  **kwargs)
    if follow:
        if not model.leases:
            model.close()
            raise ValueError("load_aoti(follow=True) needs leases to follow")
        try:
            model._follow(model.leases[0]._client)
        except Exception:
            model.close()
            raise
    return model
