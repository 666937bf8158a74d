"""Publishing a new version of a model from this process's tensors
(include/wb/publish.h): Client.publish for a whole state dict, Publisher
for the steps one by one.

The broker pulls: host (CPU) tensors are copied into a memfd when they are
given, so they may change right after; CUDA tensors are exported (CUDA
IPC) and the broker copies them during the commit, so they must stay
allocated and unchanged until the commit returns. Publisher keeps a
reference to every tensor given until then. Tensors must be contiguous;
dtypes are named as safetensors names them ("BF16")."""

import ctypes

from . import _lib, _views
from ._lib import check, lib, s


def _st_dtypes(torch):
    """torch.dtype -> safetensors name, for the dtypes this torch has."""
    out = {}
    for st, (tname, _) in _views.TORCH_DTYPES.items():
        dt = getattr(torch, tname, None)
        if isinstance(dt, torch.dtype):
            out[dt] = st
    return out


def build_table(state_dict):
    """[(name, safetensors dtype, shape tuple, tensor, nbytes)] of a
    {name: torch.Tensor} mapping, in its order. TypeError for a name that is
    not a str or a value that is not a tensor, or a dtype safetensors has no
    name for; ValueError for a tensor that is not contiguous."""
    import torch

    names = _st_dtypes(torch)
    try:
        items = list(state_dict.items())
    except AttributeError:
        raise TypeError("publish(): state_dict must be a mapping of names to tensors, not %s"
                        % type(state_dict).__name__) from None
    if not items:
        raise ValueError("publish(): state_dict has no tensors")
    table = []
    for name, t in items:
        _lib.encode_name(name, "publish(): a tensor name")
        if not isinstance(t, torch.Tensor):
            raise TypeError("tensor %s is a %s, not a torch.Tensor" % (name, type(t).__name__))
        dtype = names.get(t.dtype)
        if dtype is None:
            raise TypeError("tensor %s: dtype %s has no safetensors name" % (name, t.dtype))
        if not t.is_contiguous():
            raise ValueError("tensor %s is not contiguous: call .contiguous() first" % name)
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError("tensor %s is on %s; publish takes CPU or CUDA tensors"
                             % (name, t.device))
        table.append((name, dtype, tuple(int(d) for d in t.shape), t,
                      t.numel() * t.element_size()))
    return table


class Publisher:
    """One publish of `model` on `client` (wb_publish_begin), for a table of
    (name, dtype, shape) entries: give each tensor (tensor()), then commit()
    (returns the version now current) or abort(). A context manager:
    leaving it with an exception aborts, otherwise it commits if that was
    not done. Used by one thread at a time."""

    def __init__(self, client, model, table, *, partial=False, placement=None):
        name = _lib.encode_name(model, "publish(): model")
        if placement is not None:
            placement = _lib.encode_name(placement, "publish(): placement")
        self._client = client
        self.model = model
        self._h = ctypes.c_void_p()
        self._keep = []
        self.info = None
        entries = list(table)
        descs = (_lib.PublishDesc * len(entries))()
        self._strings = []
        for i, (tname, dtype, shape) in enumerate(entries):
            shape = [int(d) for d in shape]
            arr = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
            enc = (_lib.encode_name(tname, "publish(): a tensor name"), dtype.encode())
            self._strings.append((enc, arr))
            descs[i] = _lib.PublishDesc(enc[0], enc[1], len(shape), arr)
        opts = _lib.PublishOptions()
        L = lib()
        L.wb_publish_options_init(ctypes.byref(opts))
        opts.tensors = descs
        opts.n_tensors = len(entries)
        opts.partial = 1 if partial else 0
        opts.placement = placement
        with client._lock:
            ch = client._handle()
            rc = L.wb_publish_begin(ch, name, ctypes.byref(opts), ctypes.byref(self._h))
            check(rc, lambda: L.wb_client_errmsg(ch))
            client._publishers.add(self)
        self.version = int(L.wb_publish_version(self._h))

    def tensor(self, name, data, nbytes=None):
        """Gives tensor `name`'s bytes: a torch.Tensor (contiguous, CPU or
        CUDA; kept referenced until the commit returns) or an address (int)
        with `nbytes`."""
        if not self._h:
            raise ValueError("the publish has ended")
        enc = _lib.encode_name(name, "tensor(): name")
        if nbytes is None:
            import torch

            if not isinstance(data, torch.Tensor):
                raise TypeError("tensor(): give a torch.Tensor, or an address and nbytes")
            if not data.is_contiguous():
                raise ValueError("tensor %s is not contiguous: call .contiguous() first" % name)
            nbytes = data.numel() * data.element_size()
            ptr = data.data_ptr()
        else:
            ptr = int(data)
        L = lib()
        rc = L.wb_publish_tensor(self._h, enc, ptr or None, int(nbytes))
        check(rc, lambda: L.wb_publish_errmsg(self._h))
        if not isinstance(data, int):
            self._keep.append(data)

    def _end(self):
        self._client._publishers.discard(self)
        self._keep = []

    def commit(self):
        """Commits (wb_publish_commit_ex): waits for the broker's copies
        (the client's timeout, at least 60 s) and returns the version now
        current; self.info has the broker's figures (copy_seconds,
        copied_bytes, kept_bytes, current_at, previous_version)."""
        if not self._h:
            raise ValueError("the publish has ended")
        import sys

        torch = sys.modules.get("torch")
        # The broker reads CUDA tensors on its own streams: every write to
        # them must be done first.
        devices = {t.device for t in self._keep if getattr(t, "is_cuda", False)}
        for d in devices:
            torch.cuda.synchronize(d)
        info = _lib.PublishInfo()
        L = lib()
        client = self._client
        try:
            with client._lock:
                ch = client._handle()
                rc = L.wb_publish_commit_ex(ctypes.byref(self._h), ctypes.byref(info))
                check(rc, lambda: L.wb_client_errmsg(ch))
        finally:
            self._h = ctypes.c_void_p()
            self._end()
        self.info = {"version": int(info.version), "previous_version": int(info.previous_version),
                     "current_at": info.current_at, "copy_seconds": info.copy_seconds,
                     "copied_bytes": int(info.copied_bytes), "kept_bytes": int(info.kept_bytes)}
        return int(info.version)

    def abort(self):
        """Ends the publish (wb_publish_abort); the current version stays.
        Nothing once the publish has ended."""
        if not self._h:
            return
        with self._client._lock:
            lib().wb_publish_abort(ctypes.byref(self._h))
        self._h = ctypes.c_void_p()
        self._end()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        elif self._h:
            self.commit()

    def __del__(self):
        if getattr(self, "_h", None) and getattr(self._client, "_h", None):
            self.abort()

    def __repr__(self):
        state = "open" if self._h else "ended"
        return "<weightbroker.Publisher model=%r version=%d %s>" % (self.model, self.version,
                                                                     state)


def publish(client, model, state_dict, partial=False, placement=None):
    """Client.publish: the table from the tensors, each given, committed;
    aborted on any error. Returns the version now current."""
    table = build_table(state_dict)
    p = Publisher(client, model, [(n, d, sh) for n, d, sh, _, _ in table], partial=partial,
                  placement=placement)
    try:
        for name, _, _, t, nbytes in table:
            p.tensor(name, t)
        return p.commit()
    finally:
        p.abort()
