"""libwbclient through ctypes: finding the library, the C structures of
include/wb/client.h, include/wb/container.h and include/wb/publish.h, and
the prototypes.

The structures mirror the C headers field by field; tests/python checks the
field names against the headers so that a change on either side is caught.
Every call goes through ctypes.CDLL, which releases the GIL for the duration
of the C call: a lease or heartbeat round trip never blocks other Python
threads, and the library's own heartbeat thread never needs the GIL."""

import ctypes
import ctypes.util
import os
import sys
import sysconfig
import threading

from .errors import LibraryNotFoundError, error_for

SONAME = "libwbclient.so.0"
ENV_LIBRARY = "WB_CLIENT_LIBRARY"


class ClientOptions(ctypes.Structure):
    _fields_ = [
        ("socket_path", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int),
        ("no_heartbeat_thread", ctypes.c_int),
        ("client_name", ctypes.c_char_p),
    ]


class TensorView(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("data", ctypes.c_void_p),
        ("nbytes", ctypes.c_uint64),
        ("xxh3", ctypes.c_uint64),
        ("device", ctypes.c_int),
    ]


class ContainerTensor(ctypes.Structure):
    _fields_ = [
        ("fqn", ctypes.c_char_p),
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("device", ctypes.c_int),
    ]


class ContainerOptions(ctypes.Structure):
    _fields_ = [
        ("torch_lib_dir", ctypes.c_char_p),
        ("device", ctypes.c_char_p),
        ("num_models", ctypes.c_size_t),
        ("tensors", ctypes.POINTER(ContainerTensor)),
        ("n_tensors", ctypes.c_size_t),
        ("work_dir", ctypes.c_char_p),
        ("stream", ctypes.c_void_p),
        ("own_constants", ctypes.c_int),
        ("strip_prefix", ctypes.c_char_p),
        ("prefix", ctypes.c_char_p),
        ("aliases", ctypes.c_char_p),
        ("constants_file", ctypes.c_char_p),
        ("mutated", ctypes.c_char_p),
        ("copy_mutated", ctypes.c_int),
    ]


class ContainerInfo(ctypes.Structure):
    _fields_ = [
        ("aoti_api", ctypes.c_char_p),
        ("model_path", ctypes.c_char_p),
        ("so_path", ctypes.c_char_p),
        ("device", ctypes.c_char_p),
        ("pinned_async_copy", ctypes.c_int),
        ("n_constants", ctypes.c_size_t),
        ("bound_tensors", ctypes.c_size_t),
        ("bound_bytes", ctypes.c_uint64),
        ("caller_bytes", ctypes.c_uint64),
        ("leased_constants", ctypes.c_size_t),
        ("aliased_constants", ctypes.c_size_t),
        ("caller_constants", ctypes.c_size_t),
        ("package_constants", ctypes.c_size_t),
        ("unbound_constants", ctypes.c_size_t),
        ("package_bytes", ctypes.c_uint64),
        ("folded_constants", ctypes.c_size_t),
        ("folded_bytes", ctypes.c_uint64),
        ("embedded_bytes", ctypes.c_uint64),
        ("embedded_free_seconds", ctypes.c_double),
        ("created_at", ctypes.c_double),
        ("create_seconds", ctypes.c_double),
        ("n_inputs", ctypes.c_size_t),
        ("n_outputs", ctypes.c_size_t),
        ("library_seconds", ctypes.c_double),
        ("version", ctypes.c_uint32),
        ("swaps", ctypes.c_uint32),
        ("last_swap_ms", ctypes.c_double),
        ("last_swap_at", ctypes.c_double),
        ("follow_errors", ctypes.c_uint32),
        ("last_swap_in_use_at", ctypes.c_double),
        ("last_swap_run_wait_ms", ctypes.c_double),
    ]


MAX_DIMS = 8  # WB_CONTAINER_MAX_DIMS


class TensorDesc(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_char * 16),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("nbytes", ctypes.c_uint64),
        ("device", ctypes.c_int),
    ]


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_INT = ctypes.c_int
_STR = ctypes.c_char_p

class LeaseOptions(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_int),
        ("device_uuid", ctypes.c_char_p),
        ("allow_peer", ctypes.c_int),
    ]


class PublishDesc(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("dtype", ctypes.c_char_p),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
    ]


class PublishOptions(ctypes.Structure):
    _fields_ = [
        ("tensors", ctypes.POINTER(PublishDesc)),
        ("n_tensors", ctypes.c_size_t),
        ("partial", ctypes.c_int),
        ("placement", ctypes.c_char_p),
    ]


class PublishInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint32),
        ("previous_version", ctypes.c_uint32),
        ("current_at", ctypes.c_double),
        ("copy_seconds", ctypes.c_double),
        ("copied_bytes", ctypes.c_uint64),
        ("kept_bytes", ctypes.c_uint64),
    ]


# void (*wb_version_fn)(void *arg, const char *model, uint32_t version, uint32_t previous)
VERSION_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32,
                              ctypes.c_uint32)

LEASE_DEVICE_CURRENT = -1
LEASE_DEVICE_ANY = -2


# name: (restype, argtypes)
_PROTOTYPES = {
    "wb_strerror": (_STR, [_INT]),
    "wb_status_name": (_STR, [_INT]),
    "wb_client_options_init": (None, [ctypes.POINTER(ClientOptions)]),
    "wb_client_connect": (_INT, [ctypes.POINTER(ClientOptions), _PP]),
    "wb_client_destroy": (None, [_PP]),
    "wb_client_errmsg": (_STR, [_P]),
    "wb_client_connected": (_INT, [_P]),
    "wb_client_heartbeat": (_INT, [_P]),
    "wb_lease_acquire": (_INT, [_P, _STR, _PP]),
    "wb_lease_acquire_ex": (_INT, [_P, _STR, ctypes.POINTER(LeaseOptions), _PP]),
    "wb_lease_device": (_INT, [_P]),
    "wb_lease_release": (_INT, [_PP]),
    "wb_lease_model": (_STR, [_P]),
    "wb_lease_id_hex": (None, [_P, ctypes.c_char_p]),
    "wb_lease_orphaned": (_INT, [_P]),
    "wb_lease_version": (ctypes.c_uint32, [_P]),
    "wb_lease_checksums_pending": (_INT, [_P]),
    "wb_publish_options_init": (None, [ctypes.POINTER(PublishOptions)]),
    "wb_publish_begin": (_INT, [_P, _STR, ctypes.POINTER(PublishOptions), _PP]),
    "wb_publish_tensor": (_INT, [_P, _STR, _P, ctypes.c_uint64]),
    "wb_publish_commit_ex": (_INT, [_PP, ctypes.POINTER(PublishInfo)]),
    "wb_publish_abort": (None, [_PP]),
    "wb_publish_errmsg": (_STR, [_P]),
    "wb_publish_version": (ctypes.c_uint32, [_P]),
    "wb_client_subscribe": (_INT, [_P, _STR, VERSION_FN, _P, ctypes.POINTER(ctypes.c_uint32)]),
    "wb_client_unsubscribe": (_INT, [_P, _STR, VERSION_FN, _P]),
    "wb_lease_tensor_count": (ctypes.c_size_t, [_P]),
    "wb_lease_tensor": (_INT, [_P, ctypes.c_size_t, ctypes.POINTER(TensorView)]),
    "wb_lease_find": (_INT, [_P, _STR, ctypes.POINTER(TensorView)]),
    "wb_lease_find_many": (_INT, [_P, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                  ctypes.POINTER(TensorView)]),
    "wb_lease_verify": (_INT, [_P, ctypes.POINTER(ctypes.c_size_t)]),
    "wb_lease_containers": (ctypes.c_uint, [_P]),
    "wb_container_options_init": (None, [ctypes.POINTER(ContainerOptions)]),
    "wb_container_create": (_INT, [_PP, ctypes.c_size_t, _STR, ctypes.POINTER(ContainerOptions), _PP]),
    "wb_container_run": (_INT, [_P, _PP, ctypes.c_size_t, _PP, ctypes.c_size_t, _P]),
    "wb_container_run_versioned": (_INT, [_P, _PP, ctypes.c_size_t, _PP, ctypes.c_size_t, _P,
                                          ctypes.POINTER(ctypes.c_uint32)]),
    "wb_container_update": (_INT, [_P, _PP, ctypes.c_size_t]),
    "wb_container_follow": (_INT, [_P, _P]),
    "wb_container_destroy": (None, [_PP]),
    "wb_container_errmsg": (_STR, [_P]),
    "wb_container_stream": (_P, [_P]),
    "wb_container_get_info": (_INT, [_P, ctypes.POINTER(ContainerInfo)]),
    "wb_container_tensor_from_blob": (
        _INT, [_P, _P, _STR, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int64), _INT, _PP]),
    "wb_container_tensor_delete": (_INT, [_P, _P]),
    "wb_container_tensor_describe": (_INT, [_P, _P, ctypes.POINTER(TensorDesc)]),
}


def _candidates():
    """(description, path) pairs, in the order they are tried."""
    env = os.environ.get(ENV_LIBRARY)
    if env:
        # An explicit setting is obeyed exactly: no silent fallback.
        if not os.path.isdir(env):
            return [("$%s" % ENV_LIBRARY, env)]
        return [("$%s" % ENV_LIBRARY, os.path.join(env, name))
                for name in (SONAME, "libwbclient.so")]
    out = [("the dynamic linker's search path (LD_LIBRARY_PATH, ld.so.cache)", SONAME)]
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for prefix in dict.fromkeys([sys.prefix, "/usr/local", "/usr"]):
        for sub in ["lib", os.path.join("lib", multiarch) if multiarch else None, "lib64"]:
            if sub:
                out.append(("install prefix %s" % prefix, os.path.join(prefix, sub, SONAME)))
    # A source checkout: python/weightbroker/ sits two levels below the root.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    bindir = os.environ.get("WB_BIN_DIR")
    builds = [bindir] if bindir else []
    if os.path.exists(os.path.join(root, "python", "pyproject.toml")):
        builds.append(os.path.join(root, "build"))
    for build in builds:
        out.append(("build tree %s" % build, os.path.join(build, "client", "libwbclient.so")))
    return out


_lock = threading.Lock()
_lib = None


def lib():
    """The loaded libwbclient (loaded on first use, so that importing the
    package never fails); raises LibraryNotFoundError saying what was tried."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for what, path in _candidates():
            if os.path.sep in path and not os.path.exists(path):
                tried.append("%s: %s (no such file)" % (what, path))
                continue
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s: %s (%s)" % (what, path, e))
                continue
            try:
                for name, (restype, argtypes) in _PROTOTYPES.items():
                    fn = getattr(handle, name)
                    fn.restype, fn.argtypes = restype, argtypes
            except AttributeError as e:
                tried.append("%s: %s (not libwbclient, or too old: %s)" % (what, path, e))
                continue
            handle.wb_path = path
            _lib = handle
            return _lib
        raise LibraryNotFoundError(
            "cannot load libwbclient; set $%s to the library (or its directory). Tried:\n  %s"
            % (ENV_LIBRARY, "\n  ".join(tried)))


def encode_name(value, what):
    """A name argument as the C library's UTF-8 string. TypeError naming
    the argument (`what`, e.g. "lease(): model") unless it is a str: bytes
    or an int would otherwise reach the C call as something else or fail
    somewhere unrelated."""
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    if "\0" in value:
        raise ValueError("%s must not contain a NUL character: %r" % (what, value))
    return value.encode()


def encode_names(values, what):
    """A list of names (see encode_name); None stays None. A str alone is
    refused, not taken as a list of one-character names."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)):
        raise TypeError("%s must be a list of str, not %s" % (what, type(values).__name__))
    try:
        values = list(values)
    except TypeError:
        raise TypeError("%s must be a list of str, not %s"
                        % (what, type(values).__name__)) from None
    return [encode_name(v, "%s[%d]" % (what, i)) for i, v in enumerate(values)]


def s(b):
    """C string -> str (None stays None)."""
    return None if b is None else b.decode("utf-8", "replace")


def check(rc, errmsg):
    """Raises the BrokerError subclass for a negative status. errmsg is a
    callable giving the detailed message (read only on failure)."""
    if rc == 0:
        return
    L = lib()
    msg = errmsg() if errmsg else None
    if isinstance(msg, bytes):
        msg = s(msg)
    raise error_for(rc, s(L.wb_status_name(rc)), msg or s(L.wb_strerror(rc)))
