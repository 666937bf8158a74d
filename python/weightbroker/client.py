"""Clients and leases: connect to the broker, lease a model, read its
tensors as zero-copy views."""

import atexit
import contextlib
import ctypes
import gc
import os
import sys
import threading
import weakref

from . import _lib, _views
from ._lib import ClientOptions, TensorView, check, lib, s
from .errors import BusyError, StateError

_clients = weakref.WeakSet()


def _socket_path(socket):
    """The socket path the C library connects to for `socket`, resolved in
    the order of common/paths.c (wb__socket_path), for repr(Client)."""
    if socket:
        return os.fsdecode(socket)
    if os.environ.get("WB_SOCKET"):
        return os.environ["WB_SOCKET"]
    if os.environ.get("XDG_RUNTIME_DIR"):
        return os.environ["XDG_RUNTIME_DIR"] + "/wbroker/broker.sock"
    if os.geteuid() == 0:
        return "/run/wbroker/broker.sock"
    return "/tmp/wbroker-%d/broker.sock" % os.geteuid()


class TensorInfo:
    """One tensor of a lease as the broker describes it: name, dtype (a
    safetensors name such as "BF16"), shape, data (the address in this
    process: the read-only host mapping, or a CUDA device pointer), nbytes,
    xxh3 (the broker's checksum) and device (CUDA ordinal, -1 on the host)."""

    __slots__ = ("name", "dtype", "shape", "data", "nbytes", "xxh3", "device")

    def __init__(self, v):
        self.name = s(v.name)
        self.dtype = s(v.dtype)
        self.shape = tuple(v.shape[i] for i in range(v.ndim))
        self.data = v.data or 0
        self.nbytes = v.nbytes
        self.xxh3 = v.xxh3
        self.device = v.device

    def __repr__(self):
        return "TensorInfo(%r, %s, %s, device=%d)" % (self.name, self.dtype, list(self.shape),
                                                       self.device)


class _Pin:
    """Held by every view of a lease's memory; the lease counts them. Made
    only while the lease is held (Lease._pin), so that a view never outlives
    the mapping it points into."""

    __slots__ = ("lease", "__weakref__")

    def __init__(self, lease):
        self.lease = lease
        lease._views += 1  # under lease._lock (Lease._pin)

    def __del__(self):
        lease = self.lease
        with lease._lock:
            lease._views -= 1


class Client:
    """A connection to the broker (see connect()). Use as a context manager
    or call close(). The C library's heartbeat thread keeps every lease alive
    on its own: it needs no GIL, so it runs while Python computes.
    socket_path is the broker socket's path, resolved as the library does."""

    def __init__(self, socket=None, *, timeout_ms=0, name=None, heartbeat_thread=True):
        self._h = ctypes.c_void_p()
        self._lock = threading.RLock()
        self._leases = []
        self._subs = []  # (model bytes, C callback): kept alive while subscribed
        self._followers = weakref.WeakSet()  # models following through this client
        self._publishers = weakref.WeakSet()  # publishes open on this client
        if name is not None:
            name = _lib.encode_name(name, "connect(): name")
        L = lib()
        opts = ClientOptions()
        L.wb_client_options_init(ctypes.byref(opts))
        if socket:
            opts.socket_path = os.fsencode(socket)
        # The path resolved as the C library does, for repr() and operators.
        self.socket_path = _socket_path(socket)
        opts.timeout_ms = int(timeout_ms)
        opts.no_heartbeat_thread = 0 if heartbeat_thread else 1
        self._name = name or ("python:%s" % os.path.basename(sys.argv[0] or "python")).encode()
        opts.client_name = self._name
        rc = L.wb_client_connect(ctypes.byref(opts), ctypes.byref(self._h))
        if rc != 0:
            msg = s(L.wb_client_errmsg(self._h)) if self._h else None
            L.wb_client_destroy(ctypes.byref(self._h))
            check(rc, lambda: msg)
        _clients.add(self)

    def _handle(self):
        if not self._h:
            raise ValueError("the client is closed")
        return self._h

    def _check(self, rc):
        check(rc, lambda: lib().wb_client_errmsg(self._h))

    @property
    def connected(self):
        """True while the client is open and its last exchange with the
        broker worked; False after close(), and while the broker is gone or
        restarting (mappings stay valid; the library reconnects)."""
        return bool(self._h) and bool(lib().wb_client_connected(self._h))

    def __repr__(self):
        if not self._h:
            state = "closed"
        else:
            state = "connected" if lib().wb_client_connected(self._h) else "disconnected"
        return "<weightbroker.Client socket=%r %s leases=%d>" % (self.socket_path, state,
                                                                  len(self._leases))

    def heartbeat(self):
        """Sends one heartbeat now (only needed with heartbeat_thread=False)."""
        self._check(lib().wb_client_heartbeat(self._handle()))

    def lease(self, model, device=None, allow_peer=False):
        """Leases `model`; returns a Lease (a context manager that releases it).

        On a broker with copies on several GPUs the lease is for `device`: a
        CUDA ordinal of this process, a GPU UUID ("GPU-..."), or None for the
        current CUDA device. `allow_peer` accepts the model's copy on another
        device when it has none there."""
        model = _lib.encode_name(model, "lease(): model")
        L = lib()
        h = ctypes.c_void_p()
        opts = _lib.LeaseOptions(_lib.LEASE_DEVICE_CURRENT, None, 1 if allow_peer else 0)
        if isinstance(device, str):
            opts.device_uuid = device.encode()
        elif device is not None:
            opts.device = int(device)
        with self._lock:
            self._check(L.wb_lease_acquire_ex(self._handle(), model, ctypes.byref(opts),
                                              ctypes.byref(h)))
            lease = Lease(self, h)
            self._leases.append(lease)
        return lease

    def subscribe(self, model, callback):
        """Calls callback(model, version, previous) whenever a new version of
        `model` becomes current on the broker (wb_client_subscribe); returns
        the version current now (0: none). The callback runs on the C
        library's heartbeat thread (with the GIL, taken for the call): it
        should return soon. NotImplementedError-like BrokerError WB_ENOSYS
        from a broker that predates versions. Returns a callable that
        unsubscribes."""
        name = _lib.encode_name(model, "subscribe(): model")
        if not callable(callback):
            raise TypeError("subscribe(): callback must be callable")

        def trampoline(arg, m, version, previous):
            try:
                callback(s(m), int(version), int(previous))
            except Exception:  # never let an exception unwind into C
                sys.excepthook(*sys.exc_info())

        fn = _lib.VERSION_FN(trampoline)
        cur = ctypes.c_uint32()
        L = lib()
        with self._lock:
            self._check(L.wb_client_subscribe(self._handle(), name, fn, None, ctypes.byref(cur)))
            entry = (name, fn)
            self._subs.append(entry)

        def unsubscribe():
            with self._lock:
                if entry not in self._subs or not self._h:
                    return
                self._subs.remove(entry)
                self._check(L.wb_client_unsubscribe(self._h, name, fn, None))
        unsubscribe.current = int(cur.value)
        return unsubscribe

    def publish(self, model, state_dict, *, partial=False, placement=None):
        """Publishes a new version of `model` from `state_dict` ({name:
        torch.Tensor}, CPU or CUDA, each contiguous: ValueError "tensor NAME
        is not contiguous: call .contiguous() first" otherwise) and returns
        the version the broker made current. The table (names, safetensors
        dtypes, shapes) is the tensors'; for a model the broker has it must
        be its current version's, or with partial=True a part of it (the
        other tensors keep their bytes). placement: a new model's, as wbctl
        load --placement. CUDA tensors are synchronised and must not change
        until this returns; CPU tensors are copied at once. A refusal raises
        the BrokerError of its status with the broker's message; on any
        error the publish is aborted and the current version stays."""
        from .publish import publish

        return publish(self, model, state_dict, partial=partial, placement=placement)

    def publisher(self, model, table, *, partial=False, placement=None):
        """A Publisher (weightbroker.publish) for a table of (name, dtype,
        shape), to give tensors one at a time."""
        from .publish import Publisher

        return Publisher(self, model, table, partial=partial, placement=placement)

    @property
    def leases(self):
        """The leases of this client not yet released."""
        with self._lock:
            return list(self._leases)

    def close(self):
        """Releases every lease and disconnects. Raises BusyError, leaving the
        client open, while a lease still has models or tensor views."""
        if not self._h:
            return
        # Models that follow versions use the client: they go first, and
        # publishes still open (aborted).
        for model in list(self._followers):
            model.close()
        for p in list(self._publishers):
            p.abort()
        L = lib()
        for name, fn in list(self._subs):
            L.wb_client_unsubscribe(self._h, name, fn, None)
        self._subs = []
        busy = []
        for lease in self.leases:
            try:
                lease.release()
            except BusyError as e:
                busy.append(e.message)
        if busy:
            raise BusyError(-7, "WB_EBUSY", "client not closed: " + "; ".join(busy))
        lib().wb_client_destroy(ctypes.byref(self._h))

    def _close_at_exit(self):
        # Interpreter exit: release what can be released; a lease that views
        # still use stays mapped (the process is ending, the broker sees it).
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            # Do not hide the exception in flight behind a busy lease.
            self._close_at_exit()

    def __del__(self):
        if getattr(self, "_h", None):
            self._close_at_exit()


@atexit.register
def _close_all():
    for c in list(_clients):
        c._close_at_exit()


def connect(socket=None, **kwargs):
    """Connects to the broker. socket: its path; None resolves $WB_SOCKET,
    then $XDG_RUNTIME_DIR/wbroker/broker.sock, then /run/wbroker/broker.sock
    as root, else /tmp/wbroker-UID/broker.sock (the client's socket_path says
    which). Keywords: timeout_ms, name (a str, shown in the broker's log),
    heartbeat_thread."""
    return Client(socket, **kwargs)


class Lease:
    """A lease on one model (see Client.lease). Its memory stays mapped, and
    the broker keeps the model, until release(); release() refuses (BusyError)
    while a model built on the lease or a tensor view of it is alive."""

    def __init__(self, client, handle):
        self._client = client
        self._h = handle
        # Reentrant: a _Pin dropped by the garbage collector while this
        # thread holds the lock takes it again.
        self._lock = threading.RLock()
        self._views = 0
        L = lib()
        self.model = s(L.wb_lease_model(handle))
        buf = ctypes.create_string_buffer(33)
        L.wb_lease_id_hex(handle, buf)
        self.id = s(buf.value)
        self._infos = None

    def __repr__(self):
        with self._lock:
            if not self._h:
                return "<weightbroker.Lease %s model=%r released>" % (self.id, self.model)
            L = lib()
            return "<weightbroker.Lease %s model=%r %s device=%d views=%d models=%d>" % (
                self.id, self.model, "orphaned" if L.wb_lease_orphaned(self._h) else "active",
                L.wb_lease_device(self._h), self._views, L.wb_lease_containers(self._h))

    def _handle(self):
        """The C handle; StateError once the lease was released (its memory
        is then unmapped, so nothing may hand out views or addresses)."""
        if not self._h:
            raise StateError(-9, "WB_ESTATE", "lease %s on %r was released: its memory is no "
                             "longer mapped" % (self.id, self.model))
        return self._h

    @contextlib.contextmanager
    def _held(self):
        """The C handle with the lease's lock held: release() takes the lock
        too, so the lease cannot end while a call on it runs (wb/client.h:
        nothing may run on a lease once released)."""
        with self._lock:
            yield self._handle()

    def _pin(self):
        """A new pin on the lease's memory, checked and counted under the
        lock that release() takes, so that a release between the check and
        the view cannot happen: release() either refuses (the pin counts)
        or has already ended the lease (StateError here)."""
        with self._lock:
            self._handle()
            return _Pin(self)

    def _check(self, rc):
        check(rc, lambda: lib().wb_client_errmsg(self._client._h))

    @property
    def device(self):
        """This process's CUDA ordinal of the leased copy, or -1 (host memory)."""
        with self._held() as h:
            return lib().wb_lease_device(h)

    @property
    def version(self):
        """The model's version this lease pins (1 as loaded, then one more
        per rollout); 0 from a broker that predates versions."""
        with self._held() as h:
            return int(lib().wb_lease_version(h))

    @property
    def checksums_pending(self):
        """True for a published version whose checksums the broker is still
        computing: verify() raises StateError until a later lease."""
        with self._held() as h:
            return bool(lib().wb_lease_checksums_pending(h))

    def _hand_over(self, owner):
        """The C lease now belongs to a following model's container (which
        releases it): this object lets go of it. BusyError while tensor views
        of it are alive (the container would unmap them)."""
        with self._lock:
            self._handle()
            if self._views:
                raise BusyError(-7, "WB_EBUSY", "lease %s on %r: %d tensor view(s) alive; a "
                                "model that follows versions releases the lease" %
                                (self.id, self.model, self._views))
            self._h = ctypes.c_void_p()
            self._owner = owner
        with self._client._lock:
            if self in self._client._leases:
                self._client._leases.remove(self)

    @property
    def orphaned(self):
        """True once the broker that granted the lease no longer knows it
        (it restarted); the memory stays mapped and usable."""
        with self._held() as h:
            return bool(lib().wb_lease_orphaned(h))

    @property
    def containers(self):
        """Models (AOTI containers) registered on this lease."""
        with self._held() as h:
            return int(lib().wb_lease_containers(h))

    @property
    def views(self):
        """Tensor and array views of this lease still alive."""
        return self._views

    def info(self):
        """[TensorInfo] in the broker's order; StateError once released (the
        addresses would point at unmapped memory)."""
        with self._held() as h:
            if self._infos is None:
                L = lib()
                out = []
                for i in range(L.wb_lease_tensor_count(h)):
                    v = TensorView()
                    self._check(L.wb_lease_tensor(h, i, ctypes.byref(v)))
                    out.append(TensorInfo(v))
                self._infos = out
            return list(self._infos)

    def find(self, name):
        """TensorInfo of one tensor; NotFoundError if the lease has none."""
        name = _lib.encode_name(name, "find(): name")
        v = TensorView()
        with self._held() as h:
            self._check(lib().wb_lease_find(h, name, ctypes.byref(v)))
            return TensorInfo(v)

    def find_many(self, names):
        """[TensorInfo] of the tensors called `names`, in that order, looked
        up in one call (wb_lease_find_many: faster than find() per name for
        many names); NotFoundError, naming the first, if any is absent."""
        if names is None:
            raise TypeError("find_many(): names must be a list of str, not NoneType")
        return self._find_many(_lib.encode_names(names, "find_many(): names"))

    def _find_many(self, names):
        arr = (ctypes.c_char_p * max(len(names), 1))(*names)
        views = (TensorView * max(len(names), 1))()
        with self._held() as h:
            if not names:
                return []
            self._check(lib().wb_lease_find_many(h, arr, len(names), views))
            return [TensorInfo(v) for v in views]

    def _build(self, names, viewable, make):
        """{name: make(info, pin)} for the tensors called `names` (encoded;
        None: all). viewable(info) raises for a tensor that cannot be viewed,
        before any view is made; make() calls pin() once its view exists.

        A failure part-way drops the views already made before it goes on:
        they must not outlive it, held by the traceback (which keeps this
        frame) or freed while it unwinds, when a DLPack deleter cannot run
        and its pin would stay. The lease is then left as it was."""
        build = self._pin()  # the lease stays held until every view has its pin
        try:
            infos = self.info() if names is None else self._find_many(names)
            for t in infos:
                viewable(t)
            out = {}
            try:
                for t in infos:
                    out[t.name] = make(t, self._pin)
            except BaseException:
                out.clear()
                raise
            return out
        finally:
            del build

    def tensors(self, names=None):
        """{name: torch.Tensor}: views of the leased memory, no copy (CUDA IPC
        memory for cuda leases, the read-only mapping for host leases; there
        torch cannot mark a tensor read-only: an in-place write kills the
        process with SIGSEGV, use numpy() where a write must raise). Each view
        keeps the lease from being released while it lives. `names` (a list
        of str) selects tensors; TypeError, naming the first tensor, when
        this torch has no dtype for one (F4; U16, U32, U64 and FP8 in an
        older torch such as 1.13), and then no view is made; StateError
        once the lease was released."""
        names = _lib.encode_names(names, "tensors(): names")
        return self._build(
            names, lambda t: _views.check_torch(t.name, t.dtype),
            lambda t, pin: _views.torch_view(t.data, t.dtype, t.shape, t.nbytes, t.device, pin,
                                             t.name))

    def numpy(self, names=None):
        """{name: numpy.ndarray}, read-only views of a host lease (writeable
        is False and cannot be turned on: a write raises ValueError). `names`
        as for tensors(); TypeError, naming the first tensor, when numpy has
        no dtype for one (BF16, FP8, F4) or it is in CUDA memory, and then no
        array is made; StateError once the lease was released."""
        names = _lib.encode_names(names, "numpy(): names")
        return self._build(
            names, lambda t: _views.check_numpy(t.name, t.dtype, t.device),
            lambda t, pin: _views.numpy_view(t.data, t.dtype, t.shape, t.nbytes, pin))

    def verify(self):
        """Recomputes every tensor's checksum over the mapped bytes; raises
        CorruptError naming the first tensor that differs, StateError while
        the checksums of a published version are pending."""
        bad = ctypes.c_size_t(0)
        with self._held() as h:
            rc = lib().wb_lease_verify(h, ctypes.byref(bad))
        if rc == -18:
            name = self.info()[bad.value].name
            check(rc, lambda: "tensor %s of model %s does not match the broker's checksum"
                  % (name, self.model))
        self._check(rc)

    def release(self):
        """Ends the lease. BusyError, changing nothing, while models or tensor
        views use it; ConnectError if the broker could not be told (the lease
        is still ended here)."""
        if not self._h:
            return
        if self._views:
            gc.collect()  # views held only by reference cycles
        with self._lock:
            models = bool(self._h) and lib().wb_lease_containers(self._h)
        if models:
            gc.collect()  # models held only by reference cycles
        # The count and the release under one lock: no view can be made nor
        # a call on the lease run in between (_pin and _held take it too).
        # No other lock is taken under it: a pin dropped by the garbage
        # collector in a thread that holds the client's lock takes this one.
        with self._lock:
            if not self._h:
                return
            views = self._views
            if views:
                raise BusyError(-7, "WB_EBUSY", "lease %s on %r: %d tensor view(s) still alive; "
                                "delete them before releasing" % (self.id, self.model, views))
            rc = lib().wb_lease_release(ctypes.byref(self._h))
            ended = not self._h
        if ended:
            with self._client._lock:
                self._client._leases.remove(self)
        self._check(rc)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.release()
        else:
            try:
                self.release()
            except Exception:
                pass  # the exception in flight matters more; close() retries

    def __del__(self):
        # Unreachable, so no view or model refers to it any more.
        if getattr(self, "_h", None) and self._client._h:
            try:
                self.release()
            except Exception:
                pass
