"""Tests of the Python package (python/weightbroker) against real wbrokerd
processes on the host backend.

Environment: WB_BIN_DIR (the build directory), WB_SOURCE_DIR (the source
tree); WB_CLIENT_LIBRARY names the libwbclient.so under test. Models are run
only on the FAKE AOTI library (tests/fake_aoti: y = x * w + b in C, not
PyTorch): it tests the Python side of the container API (binding options,
tensor handles, lifetime, records), never that AOTInductor works."""

import ctypes
import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zipfile
from unittest import mock

import numpy as np
import torch

import weightbroker as wb
import weightbroker._views

BIN = os.environ["WB_BIN_DIR"]
SRC = os.environ["WB_SOURCE_DIR"]
WBROKERD = os.path.join(BIN, "broker", "wbrokerd")
WBCTL = os.path.join(BIN, "tools", "wbctl", "wbctl")
FAKE_DIR = os.path.join(BIN, "tests", "fake_aoti")
DEMO = os.path.join(SRC, "examples", "demo", "model.safetensors")
ALL_DTYPES = os.path.join(SRC, "tests", "data", "official", "all_dtypes.safetensors")
WAIT = 60 if os.environ.get("WB_SANITIZED") == "1" else 30  # a loaded machine starts torch slowly


def write_safetensors(path, tensors):
    """tensors: [(name, dtype, shape, raw bytes)]."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)}, read independently of the broker."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], tuple(v["shape"]),
                raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def wait_for(cond, what):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


class Broker:
    """A wbrokerd on the host backend with the integration tests' timings."""

    def __init__(self, tmp, models, *extra):
        self.tmp, self.models, self.extra = tmp, models, extra
        self.sock = os.path.join(tmp, "broker.sock")
        self.runs = 0
        self.proc = None

    def start(self):
        self.runs += 1
        args = [WBROKERD, "--backend", "host", "--socket", self.sock, "--heartbeat-ms", "100",
                "--stale-ms", "600"] + list(self.extra)
        for name, path in self.models.items():
            args += ["--model", "%s=%s" % (name, path)]
        self.log = open(os.path.join(self.tmp, "broker%d.log" % self.runs), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        for name in self.models:
            wait_for(lambda: self.model_state(name) == "ready", "model %s ready" % name)

    def ctl(self, *args):
        r = subprocess.run([WBCTL, "--socket", self.sock] + list(args), capture_output=True,
                           text=True, timeout=WAIT)
        if r.returncode != 0:
            raise RuntimeError("wbctl %s: %s" % (" ".join(args), r.stderr))
        return json.loads(r.stdout) if "--json" in args else r.stdout

    def model_state(self, name):
        try:
            models = self.ctl("models", "--json")
        except (RuntimeError, ValueError):
            return None
        return next((m["state"] for m in models if m["name"] == name), None)

    def leases(self):
        return [l for l in self.ctl("leases", "--json") if l["pid"] == os.getpid()]

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(WAIT)
            assert rc == 0, "wbrokerd exited with %d" % rc
        self.proc = None
        self.log.close()


class Base(unittest.TestCase):
    models = {"demo": DEMO}
    broker_args = ()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wbpy.")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.prepare()
        self.broker = Broker(self.tmp, self.models, *self.broker_args)
        self.addCleanup(self.kill_broker)
        self.broker.start()

    def prepare(self):
        pass

    def kill_broker(self):
        # SIGTERM first: a clean stop removes the broker's shared memory.
        proc = self.broker.proc
        if not proc:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.broker.log.close()
        for path in glob.glob("/dev/shm/wb-%d-*" % proc.pid):
            os.remove(path)

    def connect(self, **kw):
        c = wb.connect(self.broker.sock, **kw)
        self.addCleanup(c._close_at_exit)
        return c


class TestLibrary(unittest.TestCase):
    def test_missing_library_says_what_was_tried(self):
        env = dict(os.environ, WB_CLIENT_LIBRARY="/nonexistent/libwbclient.so")
        r = subprocess.run([sys.executable, "-c", "import weightbroker as w; w.connect('/x')"],
                           env=env, capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("weightbroker.errors.LibraryNotFoundError: cannot load libwbclient; set "
                      "$WB_CLIENT_LIBRARY", r.stderr)
        self.assertIn("$WB_CLIENT_LIBRARY: /nonexistent/libwbclient.so (no such file)", r.stderr)

    def test_search_order_without_the_variable(self):
        env = {k: v for k, v in os.environ.items() if k != "WB_CLIENT_LIBRARY"}
        env["WB_BIN_DIR"] = "/nonexistent-build"
        env["LD_LIBRARY_PATH"] = ""
        code = "import weightbroker._lib as l; print('\\n'.join(w for w, p in l._candidates()))"
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, check=True)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].startswith("the dynamic linker's search path"), lines)
        self.assertIn("install prefix /usr/local", lines)
        # An installed package knows no source tree: only $WB_BIN_DIR's build.
        self.assertEqual(lines[-1], "build tree /nonexistent-build")
        self.assertEqual(len([w for w in lines if w.startswith("build tree")]), 1, lines)

    def test_structures_match_the_headers(self):
        # The ctypes mirrors must list the C fields in order: a field added on
        # one side only would shift every later one.
        import re

        from weightbroker import _lib

        text = ""
        for h in ("client.h", "container.h"):
            with open(os.path.join(SRC, "include", "wb", h)) as f:
                text += f.read()
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        mirrors = {"wb_client_options": _lib.ClientOptions, "wb_tensor_view": _lib.TensorView,
                   "wb_lease_options": _lib.LeaseOptions,
                   "wb_container_tensor": _lib.ContainerTensor,
                   "wb_container_options": _lib.ContainerOptions,
                   "wb_container_info": _lib.ContainerInfo, "wb_tensor_desc": _lib.TensorDesc}
        for cname, cls in mirrors.items():
            m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (cname, cname), text, re.S)
            self.assertIsNotNone(m, cname)
            fields = []
            for decl in m.group(1).split(";"):
                decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
                if not decl:
                    continue
                # "size_t n_inputs, n_outputs" -> both names
                first, *rest = [p.strip() for p in decl.split(",")]
                fields.append(re.findall(r"\w+", first)[-1])
                fields += rest
            self.assertEqual([f for f, _ in cls._fields_], fields, cname)


class TestLeases(Base):
    def prepare(self):
        # Every dtype the tests' checkpoints use, with a scalar.
        rnd = np.random.default_rng(7)
        self.mixed = os.path.join(self.tmp, "mixed.safetensors")
        f = rnd.standard_normal(12).astype("<f4")
        bf = (f.view("<u4") >> 16).astype("<u2")  # bf16 = the top half of an fp32
        write_safetensors(self.mixed, [
            ("a.f32", "F32", (3, 4), f.tobytes()),
            ("b.f16", "F16", (2, 3), rnd.standard_normal(6).astype("<f2").tobytes()),
            ("c.u8", "U8", (5,), bytes(range(5))),
            ("d.i64", "I64", (), struct.pack("<q", -123456789)),
            ("e.bf16", "BF16", (3, 4), bf.tobytes()),
        ])
        self.models = {"demo": DEMO, "mixed": self.mixed}

    def test_tensors_are_zero_copy_views_equal_to_the_checkpoint(self):
        c = self.connect()
        for name, path in self.models.items():
            want = read_safetensors(path)
            with c.lease(name) as lease:
                ts = lease.tensors()
                self.assertEqual(sorted(ts), sorted(want))
                for n, t in ts.items():
                    info = lease.find(n)
                    # The view's memory is the lease's: no copy was made.
                    self.assertEqual(t.data_ptr(), info.data, n)
                    self.assertEqual(info.device, -1)
                    dtype, shape, raw = want[n]
                    self.assertEqual(tuple(t.shape), shape, n)
                    self.assertEqual(info.dtype, dtype)
                    self.assertEqual(t.element_size() * t.numel(), len(raw), n)
                    if dtype == "BF16":
                        wide = np.frombuffer(raw, "<u2").astype("<u4") << 16
                        ref = torch.from_numpy(wide.view("<f4").copy()).reshape(shape)
                        self.assertTrue(torch.equal(t.float(), ref), n)
                    else:
                        ref = np.frombuffer(raw, {"F32": "<f4", "F16": "<f2", "U8": "u1",
                                                  "I64": "<i8"}[dtype]).reshape(shape)
                        self.assertTrue(np.array_equal(t.numpy(), ref), n)
                self.assertEqual(lease.views, len(want))
                del ts, t
                self.assertEqual(lease.views, 0)
                lease.verify()

    def test_numpy_views_are_read_only(self):
        c = self.connect()
        want = read_safetensors(DEMO)
        with c.lease("demo") as lease:
            arrays = lease.numpy()
            for n, a in arrays.items():
                self.assertEqual(a.ctypes.data, lease.find(n).data, n)
                self.assertFalse(a.flags.writeable)
                self.assertTrue(np.array_equal(a, np.frombuffer(want[n][2], "<f4").reshape(a.shape)))
            a = arrays["transformer.wte.weight"]
            with self.assertRaisesRegex(ValueError, "read-only"):
                a[0, 0] = 1.0
            with self.assertRaisesRegex(ValueError, "cannot set WRITEABLE flag"):
                a.flags.writeable = True
            del arrays, a
        with c.lease("mixed") as lease:
            with self.assertRaisesRegex(TypeError, "tensor e.bf16: numpy has no dtype BF16"):
                lease.numpy(["e.bf16"])

    def test_host_mapping_is_read_only_for_tensors_too(self):
        # torch has no read-only tensors: a write into the host mapping is a
        # SIGSEGV (the process dies) rather than a silent change to shared
        # weights. Run it in a child process.
        code = ("import weightbroker as w, sys\n"
                "c = w.connect(sys.argv[1]); l = c.lease('demo')\n"
                "t = l.tensors()['transformer.wte.weight']\n"
                "print('before', flush=True)\n"
                "t.add_(1)\n"
                "print('after', flush=True)\n")
        r = subprocess.run([sys.executable, "-c", code, self.broker.sock], capture_output=True,
                           text=True, timeout=WAIT * 3)
        self.assertEqual(r.returncode, -signal.SIGSEGV, r.stderr)
        self.assertEqual(r.stdout, "before\n")
        # The dead child's lease is reclaimed (its death is proven by pidfd).
        wait_for(lambda: self.broker.ctl("leases", "--json") == [], "the child's lease reclaimed")

    def test_release_refused_while_views_live(self):
        c = self.connect()
        lease = c.lease("demo")
        t = lease.tensors(["transformer.wte.weight"])["transformer.wte.weight"]
        with self.assertRaises(wb.BusyError) as cm:
            lease.release()
        self.assertEqual(cm.exception.name, "WB_EBUSY")
        self.assertEqual(cm.exception.status, -7)
        self.assertIn("1 tensor view(s) still alive", cm.exception.message)
        self.assertEqual(len(self.broker.leases()), 1)
        with self.assertRaises(wb.BusyError):
            c.close()
        self.assertEqual(float(t[0, 0]), float(np.frombuffer(read_safetensors(DEMO)[
            "transformer.wte.weight"][2], "<f4")[0]))
        del t
        lease.release()
        self.assertEqual(self.broker.leases(), [])
        with self.assertRaisesRegex(wb.StateError, "was released"):
            lease.tensors()
        c.close()

    def test_views_refused_after_release(self):
        # After release() the lease's memory is unmapped (a large slab at
        # once, a small one after the linger): every method that hands out
        # views of it or addresses in it must refuse, not build arrays over
        # memory that is gone (a SIGSEGV on a 64 MB model, garbage on a
        # small one). The tensor table read before the release (info())
        # must not serve them either.
        c = self.connect()
        lease = c.lease("demo")
        w = "transformer.wte.weight"
        self.assertEqual(len(lease.info()), 28)
        del lease.numpy([w])[w]
        lease.release()
        want = "lease %s on 'demo' was released: its memory is no longer mapped" % lease.id
        calls = {
            "numpy()": lambda: lease.numpy(),
            "numpy(names)": lambda: lease.numpy([w]),
            "tensors()": lambda: lease.tensors(),
            "tensors(names)": lambda: lease.tensors([w]),
            "info()": lease.info,
            "find()": lambda: lease.find(w),
            "find_many()": lambda: lease.find_many([w, "transformer.wpe.weight"]),
            "find_many([])": lambda: lease.find_many([]),
            "verify()": lease.verify,
            "device": lambda: lease.device,
            "orphaned": lambda: lease.orphaned,
            "containers": lambda: lease.containers,
            "load_aoti()": lambda: wb.load_aoti(os.path.join(self.tmp, "none.pt2"), [lease],
                                                bridge="wb"),
        }
        for what, call in calls.items():
            with self.assertRaises(wb.StateError, msg=what) as cm:
                call()
            self.assertEqual((cm.exception.status, cm.exception.name), (-9, "WB_ESTATE"), what)
            self.assertEqual(cm.exception.message, want, what)
        self.assertEqual(lease.views, 0)
        self.assertEqual(repr(lease), "<weightbroker.Lease %s model='demo' released>" % lease.id)
        lease.release()  # twice: nothing to do
        self.assertEqual(self.broker.leases(), [])
        c.close()

    def test_verify_names_a_corrupted_tensor(self):
        # Change one byte of the broker's slab behind its back (root may open
        # the shared memory object read-write); verify() must name the tensor.
        slabs = glob.glob("/dev/shm/wb-%d-*" % self.broker.proc.pid)
        if os.geteuid() != 0 or len(slabs) != 2:
            self.skipTest("needs root and the broker's two slabs in /dev/shm")
        c = self.connect()
        with c.lease("mixed") as lease:
            lease.verify()
            first = min(lease.info(), key=lambda t: t.data)
            a = lease.numpy([first.name])[first.name]
            before = a.tobytes()
            for path in slabs:
                with open(path, "r+b") as f:
                    f.seek(0)
                    b = f.read(1)
                    f.seek(0)
                    f.write(bytes([b[0] ^ 0xFF]))
                    f.flush()
                if a.tobytes() != before:
                    break
            self.assertNotEqual(a.tobytes(), before, "no slab holds the lease's first tensor")
            with self.assertRaises(wb.CorruptError) as cm:
                lease.verify()
            self.assertEqual(cm.exception.name, "WB_ECORRUPT")
            self.assertEqual(cm.exception.message, "tensor %s of model mixed does not match "
                             "the broker's checksum" % first.name)
            with open(path, "r+b") as f:
                f.write(b)
            lease.verify()
            del a

    def test_errors_carry_the_status(self):
        with self.assertRaises(wb.ConnectError) as cm:
            wb.connect(os.path.join(self.tmp, "nothing.sock"))
        self.assertEqual(cm.exception.name, "WB_ECONN")
        self.assertIn("nothing.sock", cm.exception.message)
        c = self.connect()
        with self.assertRaises(wb.NotFoundError) as cm:
            c.lease("no-such-model")
        self.assertEqual((cm.exception.status, cm.exception.name), (-4, "WB_ENOTFOUND"))
        self.assertIn("no-such-model", cm.exception.message)
        self.assertIsInstance(cm.exception, wb.BrokerError)
        with c.lease("demo") as lease:
            with self.assertRaises(wb.NotFoundError):
                lease.find("no.such.tensor")
            # Many names at once: the same as one at a time; an absent one
            # is named in the error.
            names = [t.name for t in lease.info()][::-1]
            many = lease.find_many(names)
            self.assertEqual([t.name for t in many], names)
            self.assertEqual([t.data for t in many], [lease.find(n).data for n in names])
            self.assertEqual(lease.find_many([]), [])
            with self.assertRaises(wb.NotFoundError) as cm:
                lease.find_many(names[:1] + ["no.such.tensor"])
            self.assertIn("no tensor 'no.such.tensor' (names[1]; 1 of 2", cm.exception.message)

    def test_lease_for_a_device(self):
        # A host-memory broker serves every device; a malformed UUID is
        # refused before anything is sent.
        c = self.connect()
        with c.lease("demo", device=3) as lease:
            self.assertEqual(lease.device, -1)
        with c.lease("demo", device="GPU-3b1e00ff-0102-0304-0506-0708090a0bab",
                     allow_peer=True) as lease:
            self.assertEqual(lease.device, -1)
        with self.assertRaises(wb.BrokerError) as cm:
            c.lease("demo", device="GPU-1")
        self.assertEqual(cm.exception.name, "WB_EINVAL")
        self.assertEqual(cm.exception.message, "acquire 'demo': 'GPU-1' is not a device UUID "
                         "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")


class TestDtypes(Base):
    """all_dtypes.safetensors: every safetensors dtype, an empty tensor and a
    scalar; in the broker's order (by name) BOOL comes after tensors torch
    can view and before F4, which no torch can."""

    models = {"all": ALL_DTYPES}

    # The torch dtype each safetensors dtype is viewed as, where this torch
    # has it (torch 1.13 has no uint16, uint32, uint64 or float8); F4 packs
    # two values in a byte and has none.
    TORCH = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
             "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64",
             "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
             "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
             "F8_E8M0": "float8_e8m0fnu"}

    def torch_dtype(self, dtype):
        return getattr(torch, self.TORCH.get(dtype, "no such dtype"), None)

    def test_order_of_the_checkpoint(self):
        # What the failure tests below rely on.
        c = self.connect()
        with c.lease("all") as lease:
            names = [t.name for t in lease.info()]
        self.assertEqual(len(names), 20)
        self.assertLess(names.index("t_bfloat16"), names.index("t_bool"))
        self.assertLess(names.index("t_bool"), names.index("t_float4_e2m1fn_x2"))
        self.assertEqual([n for n in names if not self.torch_dtype(
            read_safetensors(ALL_DTYPES)[n][0])][0], "t_float4_e2m1fn_x2")

    def test_tensors_refuse_a_dtype_torch_lacks_and_leave_no_view(self):
        # Before, torch 1.13 refused BOOL's DLPack code (kDLBool) part-way,
        # the views already made leaked their pins and SystemError replaced
        # the TypeError: release() then refused for ever (WB_EBUSY).
        c = self.connect()
        lease = c.lease("all")
        want = "tensor t_float4_e2m1fn_x2: torch %s has no dtype F4" % torch.__version__
        for names in (None, ["t_bool", "t_float4_e2m1fn_x2", "t_float32"]):
            with self.assertRaises(TypeError) as cm:
                lease.tensors(names)
            self.assertIs(type(cm.exception), TypeError)
            self.assertEqual(str(cm.exception), want)
            # cm holds the exception and its traceback: they hold no view.
            self.assertEqual(lease.views, 0, names)
        lease.release()
        self.assertEqual(self.broker.leases(), [])
        # The end of a with block releases the lease and the error is the real one.
        with self.assertRaises(TypeError) as cm:
            with c.lease("all") as lease:
                lease.tensors()
        self.assertEqual(str(cm.exception), want)
        self.assertEqual(self.broker.leases(), [])
        self.assertEqual(repr(lease), "<weightbroker.Lease %s model='all' released>" % lease.id)
        c.close()

    def test_numpy_refuses_a_dtype_numpy_lacks_and_leaves_no_view(self):
        c = self.connect()
        lease = c.lease("all")
        with self.assertRaises(TypeError) as cm:
            lease.numpy()
        self.assertIs(type(cm.exception), TypeError)
        self.assertEqual(str(cm.exception), "tensor t_bfloat16: numpy has no dtype BF16 "
                         "(use tensors())")
        self.assertEqual(lease.views, 0)
        lease.release()
        self.assertEqual(self.broker.leases(), [])
        c.close()

    def test_a_failure_part_way_drops_the_views_made(self):
        # A failure after some views exist (here injected at the fourth) must
        # drop them before it propagates. The views go through DLPack, the
        # path of CUDA memory, whose deleter cannot run while an exception
        # is pending: that is how the pins leaked.
        c = self.connect()
        lease = c.lease("all")
        made = []

        def dlpack_view(data, dtype, shape, nbytes, device, keep, name):
            if len(made) == 3:
                raise RuntimeError("injected failure at tensor %s" % name)
            made.append(name)
            dt = self.torch_dtype(dtype)
            size = torch.empty((), dtype=dt).element_size()
            return wb._views.from_dlpack(data, dt, size, shape, nbytes, device, keep, name, dtype)

        names = ["t_int8", "t_bool", "t_int32", "t_float32", "t_uint8"]
        with mock.patch.object(wb._views, "torch_view", dlpack_view):
            # Not assertRaises, which clears the traceback's frames: a caller
            # that keeps the exception keeps them, and no view may be there.
            try:
                lease.tensors(names)
            except RuntimeError as e:
                err = e
        self.assertIs(type(err), RuntimeError)
        self.assertEqual(str(err), "injected failure at tensor t_float32")
        self.assertEqual(made, names[:3])
        self.assertEqual(lease.views, 0)
        # The same in a with block: its end releases the lease.
        made.clear()
        with mock.patch.object(wb._views, "torch_view", dlpack_view):
            with self.assertRaises(RuntimeError) as cm:
                with c.lease("all") as other:
                    other.tensors(names)
        self.assertEqual(str(cm.exception), "injected failure at tensor t_float32")
        self.assertEqual(repr(other), "<weightbroker.Lease %s model='all' released>" % other.id)
        self.assertEqual([l["id"] for l in self.broker.leases()], [lease.id])
        del err

        calls = []

        def numpy_view(*args):
            calls.append(args)
            if len(calls) == 3:
                raise RuntimeError("injected failure at array 3")
            return real(*args)

        real = wb._views.numpy_view
        with mock.patch.object(wb._views, "numpy_view", numpy_view):
            try:
                lease.numpy(names)
            except RuntimeError as e:
                err = e
        self.assertEqual(str(err), "injected failure at array 3")
        self.assertEqual(lease.views, 0)
        del err
        lease.release()
        self.assertEqual(self.broker.leases(), [])
        c.close()

    def test_every_dtype_torch_has_is_a_view_of_the_checkpoint(self):
        # BOOL included: torch.bool over the checkpoint's bytes (0 or 1 each).
        want = read_safetensors(ALL_DTYPES)
        c = self.connect()
        with c.lease("all") as lease:
            names = sorted(n for n, (dtype, _, _) in want.items() if self.torch_dtype(dtype))
            self.assertTrue({"t_bool", "t_bfloat16", "t_complex64", "empty", "scalar"}
                            <= set(names), names)
            ts = lease.tensors(names)
            self.assertEqual(sorted(ts), names)
            for n, t in ts.items():
                dtype, shape, raw = want[n]
                info = lease.find(n)
                self.assertEqual(t.dtype, self.torch_dtype(dtype), n)
                self.assertEqual(tuple(t.shape), shape, n)
                self.assertEqual(t.device, torch.device("cpu"), n)
                self.assertEqual(t.element_size() * t.numel(), len(raw), n)
                if raw:
                    self.assertEqual(t.data_ptr(), info.data, n)  # no copy
                    self.assertEqual(ctypes.string_at(t.data_ptr(), len(raw)), raw, n)
            raw = want["t_bool"][2]
            self.assertTrue(set(raw) <= {0, 1} and len(set(raw)) == 2, raw)
            self.assertEqual(ts["t_bool"].tolist(), [[b == 1 for b in raw[:3]],
                                                     [b == 1 for b in raw[3:]]])
            self.assertEqual(lease.views, len(names) - 1)  # the empty tensor views nothing
            del ts, t
            self.assertEqual(lease.views, 0)

            # The same through DLPack (CUDA memory's path), on host memory.
            for n in names:
                dtype, shape, raw = want[n]
                if not raw:
                    continue
                info = lease.find(n)
                dt = self.torch_dtype(dtype)
                t = wb._views.from_dlpack(info.data, dt, torch.empty((), dtype=dt).element_size(),
                                          info.shape, info.nbytes, -1, lease._pin, n, dtype)
                self.assertEqual((t.dtype, tuple(t.shape), t.data_ptr()),
                                 (dt, shape, info.data), n)
                self.assertEqual(ctypes.string_at(t.data_ptr(), len(raw)), raw, n)
                self.assertEqual(lease.views, 1, n)
                del t
                self.assertEqual(lease.views, 0, n)

            arrays = lease.numpy(["t_bool", "t_complex64", "t_uint16", "t_uint64", "scalar"])
            for n, a in arrays.items():
                dtype, shape, raw = want[n]
                self.assertEqual((a.shape, a.tobytes()), (shape, raw), n)
            self.assertEqual(arrays["t_bool"].dtype, np.bool_)
            self.assertEqual(arrays["t_complex64"].dtype, np.complex64)
            del arrays, a

    def test_a_view_dropped_while_an_exception_unwinds(self):
        # A temporary view freed while an exception is pending (here the
        # dict of tensors, an argument being built when 1 / 0 raises): the
        # lease's count drops and the exception is the one raised.
        c = self.connect()
        with c.lease("all") as lease:
            with self.assertRaises(ZeroDivisionError):
                print(lease.tensors(["t_bool", "t_float32"]), 1 / 0)
            self.assertEqual(lease.views, 0)


class TestClientApi(Base):
    def test_repr_and_connected(self):
        c = self.connect()
        self.assertTrue(c.connected)
        self.assertEqual(c.socket_path, self.broker.sock)
        self.assertEqual(repr(c), "<weightbroker.Client socket=%r connected leases=0>"
                         % self.broker.sock)
        lease = c.lease("demo")
        self.assertEqual(repr(c), "<weightbroker.Client socket=%r connected leases=1>"
                         % self.broker.sock)
        self.assertEqual(repr(lease), "<weightbroker.Lease %s model='demo' active device=-1 "
                         "views=0 models=0>" % lease.id)
        ts = lease.tensors(["transformer.wte.weight", "transformer.wpe.weight"])
        self.assertEqual(repr(lease), "<weightbroker.Lease %s model='demo' active device=-1 "
                         "views=2 models=0>" % lease.id)
        del ts
        lease.release()
        self.assertEqual(repr(lease), "<weightbroker.Lease %s model='demo' released>" % lease.id)
        c.close()
        self.assertFalse(c.connected)
        self.assertEqual(repr(c), "<weightbroker.Client socket=%r closed leases=0>"
                         % self.broker.sock)
        with self.assertRaisesRegex(ValueError, "^the client is closed$"):
            c.lease("demo")
        c.close()  # twice: nothing to do
        self.assertFalse(c.connected)

    def test_socket_path_from_the_environment(self):
        with mock.patch.dict(os.environ, {"WB_SOCKET": self.broker.sock}):
            c = self.connect()
        self.assertEqual(c.socket_path, self.broker.sock)
        self.assertTrue(c.connected)
        self.assertEqual(repr(c), "<weightbroker.Client socket=%r connected leases=0>"
                         % self.broker.sock)
        c.close()

    def test_names_must_be_str(self):
        c = self.connect()
        lease = c.lease("demo")
        w = "transformer.wte.weight"
        calls = {
            "lease(): model must be a str, not int": lambda: c.lease(3),
            "lease(): model must be a str, not bytes": lambda: c.lease(b"demo"),
            "lease(): model must be a str, not NoneType": lambda: c.lease(None),
            "find(): name must be a str, not bytes": lambda: lease.find(w.encode()),
            "find_many(): names must be a list of str, not str": lambda: lease.find_many(w),
            "find_many(): names must be a list of str, not NoneType":
                lambda: lease.find_many(None),
            "find_many(): names must be a list of str, not int": lambda: lease.find_many(7),
            "find_many(): names[1] must be a str, not bytes":
                lambda: lease.find_many([w, b"x"]),
            "tensors(): names must be a list of str, not str": lambda: lease.tensors(w),
            "tensors(): names[0] must be a str, not int": lambda: lease.tensors([1]),
            "numpy(): names must be a list of str, not bytes": lambda: lease.numpy(b"x"),
            "numpy(): names[0] must be a str, not NoneType": lambda: lease.numpy([None]),
            "connect(): name must be a str, not int": lambda: wb.connect(self.broker.sock,
                                                                          name=5),
            "load_aoti(): prefix must be a str, not int":
                lambda: wb.load_aoti(os.path.join(self.tmp, "none.pt2"), [lease], prefix=1,
                                     bridge="wb"),
            "load_aoti(): aliases['lm_head.weight'] must be a str, not int":
                lambda: wb.load_aoti(os.path.join(self.tmp, "none.pt2"), [lease],
                                     aliases={"lm_head.weight": 2}, bridge="wb"),
        }
        for want, call in calls.items():
            with self.assertRaises(TypeError, msg=want) as cm:
                call()
            self.assertIs(type(cm.exception), TypeError, want)
            self.assertEqual(str(cm.exception), want)
        with self.assertRaises(ValueError) as cm:
            lease.find("transformer\0wte")
        self.assertEqual(str(cm.exception),
                         "find(): name must not contain a NUL character: 'transformer\\x00wte'")
        # Tuples and other iterables of str are lists of names.
        self.assertEqual(sorted(lease.tensors((w,))), [w])
        self.assertEqual([t.name for t in lease.find_many(iter([w]))], [w])
        self.assertEqual(lease.views, 0)
        self.assertEqual([l["id"] for l in self.broker.leases()], [lease.id])
        lease.release()
        c.close()


class TestLimits(Base):
    broker_args = ("--max-leases-per-client", "2")

    def test_limit_error(self):
        c = self.connect()
        a, b = c.lease("demo"), c.lease("demo")
        with self.assertRaises(wb.LimitError) as cm:
            c.lease("demo")
        self.assertEqual(cm.exception.name, "WB_ELIMIT")
        self.assertIn("already holds 2 leases, the limit (--max-leases-per-client 2)",
                      cm.exception.message)
        a.release()
        b.release()


class TestHeartbeat(Base):
    # A stale window of 1.5 s (heartbeats every 100 ms) leaves room for a
    # loaded machine; the 3 s loop is still twice as long.
    broker_args = ("--stale-ms", "1500")

    def busy_python(self, seconds):
        # Pure Python holding the GIL (no call releases it) while a separate
        # process samples the lease's state through wbctl.
        poll = subprocess.Popen(
            ["sh", "-c", 'i=0; while [ $i -lt 20 ]; do "$0" --socket "$1" leases --json; '
             'echo @@; sleep 0.1; i=$((i+1)); done', WBCTL, self.broker.sock],
            stdout=subprocess.PIPE, text=True)
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            n += 1
        out, _ = poll.communicate(timeout=WAIT)
        states = []
        for doc in out.split("@@"):
            if doc.strip():
                states += [l["state"] for l in json.loads(doc) if l["pid"] == os.getpid()]
        return states

    def test_heartbeats_run_while_python_holds_the_gil(self):
        c = self.connect()
        with c.lease("demo"):
            states = self.busy_python(3.0)
            self.assertGreaterEqual(len(states), 10)
            self.assertEqual(set(states), {"active"}, states)

    def test_without_the_thread_the_lease_goes_stale(self):
        # The control: the same loop with no heartbeat thread lets the lease
        # go stale, so the test above can fail.
        c = self.connect(heartbeat_thread=False)
        with c.lease("demo"):
            states = self.busy_python(3.0)
            self.assertIn("stale", states)


class TestRestart(Base):
    def test_broker_restart(self):
        c = self.connect(timeout_ms=1000)
        lease = c.lease("demo")
        t = lease.tensors(["transformer.wte.weight"])["transformer.wte.weight"]
        before = t.clone()
        self.broker.stop()
        self.assertTrue(torch.equal(t, before))  # the mapping outlives the broker
        wait_for(lambda: not c.connected, "the client to notice the broker is gone")
        self.assertEqual(repr(c), "<weightbroker.Client socket=%r disconnected leases=1>"
                         % self.broker.sock)
        self.broker.start()
        wait_for(lambda: (c.heartbeat() or True) if _quiet(c.heartbeat) else False,
                 "the client reconnected")
        self.assertTrue(c.connected)
        self.assertTrue(lease.orphaned)
        self.assertTrue(torch.equal(t, before))
        fresh = c.lease("demo")
        self.assertFalse(fresh.orphaned)
        self.assertEqual([l["id"] for l in self.broker.leases()], [fresh.id])
        del t
        lease.release()  # unknown to the new broker: ended here
        fresh.release()
        self.assertEqual(self.broker.leases(), [])


def _quiet(fn):
    try:
        fn()
        return True
    except wb.BrokerError:
        return False


class TestModels(Base):
    """Models on the FAKE AOTI library (see the module docstring)."""

    def prepare(self):
        self.base = os.path.join(self.tmp, "base.safetensors")
        self.head = os.path.join(self.tmp, "head.safetensors")
        write_safetensors(self.base, [("model.weight", "F32", (4,), f32([1, 2, 3, 4]))])
        write_safetensors(self.head, [("model.bias", "F32", (4,), f32([10, 20, 30, 40]))])
        self.models = {"base": self.base, "head": self.head}

        def package(name, spec):
            path = os.path.join(self.tmp, name + ".pt2")
            with zipfile.ZipFile(path, "w") as z:
                z.write(os.path.join(FAKE_DIR, "fake_aoti_v211.so"),
                        "variant/data/aotinductor/model/model.so")
                z.writestr("variant/data/aotinductor/model/fake_aoti_spec.txt", spec)
            return path

        self.pt2 = package("variant", "elements 4\nconst w model.weight 6 16\n"
                                      "const b model.bias 6 16\n")
        # A constant named differently from the checkpoint (a tied weight).
        self.tied = package("tied", "elements 4\nconst w lm_head.weight 6 16\n"
                                    "const b model.bias 6 16\n")
        # A constant the checkpoint stores as F32 but the model wants as F16.
        self.bad = package("bad", "elements 4\nconst w model.weight 5 16\n"
                                  "const b model.bias 6 16\n")

    def load(self, path, leases, **kw):
        return wb.load_aoti(path, leases, bridge="wb", torch_lib_dir=None, **kw)

    def test_model_runs_on_leases_and_keeps_them(self):
        c = self.connect()
        base, head = c.lease("base"), c.lease("head")
        model = self.load(self.pt2, [base, head])
        self.assertEqual(model.info["bound_bytes"], 32)
        self.assertEqual(model.info["aoti_api"],
                         "CreateWithDevice+UpdateUserManagedConstantBufferPairs")
        self.assertEqual(model.device, "cpu")
        (y,) = model(torch.tensor([1.0, 1.0, 2.0, 2.0]))
        self.assertEqual(y.tolist(), [11, 22, 36, 48])
        self.assertEqual(base.containers, 1)
        # A lease with a live model refuses release, with the C message.
        with self.assertRaises(wb.BusyError) as cm:
            base.release()
        self.assertEqual(cm.exception.name, "WB_EBUSY")
        self.assertEqual(len(self.broker.leases()), 2)
        # The broker lists this process's container like a C worker's.
        wait_for(lambda: [r["pid"] for r in self.broker.ctl("containers", "--json")]
                 == [os.getpid()], "wbctl containers to list this process")
        rec = self.broker.ctl("containers", "--json")[0]
        self.assertTrue(rec["model_path"].endswith("variant.pt2"), rec)
        self.assertEqual(sorted((l["model"], l["bound_bytes"]) for l in rec["leases"]),
                         [("base", 16), ("head", 16)])
        del model
        self.assertEqual(base.containers, 0)
        base.release()
        head.release()
        self.assertEqual(self.broker.leases(), [])
        wait_for(lambda: self.broker.ctl("containers", "--json") == [], "no container left")

    def test_model_closed_explicitly_and_as_context(self):
        c = self.connect()
        with c.lease("base") as base, c.lease("head") as head:
            with self.load(self.pt2, [base, head]) as model:
                self.assertEqual(model(torch.tensor([0.0, 1.0, 0.0, 1.0]))[0].tolist(),
                                 [10, 22, 30, 44])
            self.assertEqual(base.containers, 0)
            with self.assertRaisesRegex(ValueError, "was closed"):
                model(torch.zeros(4))

    def test_aliases_and_caller_tensors(self):
        c = self.connect()
        with c.lease("base") as base, c.lease("head") as head:
            with self.assertRaises(wb.NotFoundError) as cm:
                self.load(self.tied, [base, head])
            self.assertIn("lm_head.weight", cm.exception.message)
            m = self.load(self.tied, [base, head], aliases={"lm_head.weight": "model.weight"})
            self.assertEqual(m(torch.ones(4))[0].tolist(), [11, 22, 33, 44])
            self.assertEqual(m.info["aliased_constants"], 1)
            m.close()
            bias = torch.tensor([-1.0, -2.0, -3.0, -4.0])
            m = self.load(self.pt2, [base], tensors={"model.bias": bias})
            self.assertEqual(m(torch.ones(4))[0].tolist(), [0, 0, 0, 0])
            self.assertEqual(m.info["caller_bytes"], 16)
            m.close()
            # The alias rules are libwbclient's: a constant aliased to a
            # tensor no lease has fails, naming both.
            with self.assertRaises(wb.NotFoundError) as cm:
                self.load(self.tied, [base, head], aliases={"lm_head.weight": "nothing.here"})
            self.assertIn("lm_head.weight", cm.exception.message)
            self.assertIn("nothing.here", cm.exception.message)
            self.assertEqual(m.info["aliased_constants"], 0)
            with self.assertRaisesRegex(ValueError, "names must be non-empty"):
                self.load(self.tied, [base, head], aliases={"lm_head.weight": "a=b"})

    def test_binding_errors_name_the_tensor(self):
        c = self.connect()
        with c.lease("base") as base, c.lease("head") as head:
            with self.assertRaises(wb.BrokerError) as cm:
                self.load(self.bad, [base, head])
            self.assertEqual(cm.exception.name, "WB_EINVAL")
            self.assertIn("model.weight", cm.exception.message)
            with self.assertRaises(wb.NotFoundError) as cm:
                self.load(os.path.join(self.tmp, "missing.pt2"), [base])
            self.assertIn("missing.pt2", cm.exception.message)
            self.assertEqual(base.containers, 0)

    def has_versions(self, client):
        """Whether the broker knows versions (subscriptions): the rollout
        tests need one that does."""
        try:
            client.subscribe("base", lambda *a: None)()
            return True
        except wb.BrokerError as e:
            self.assertEqual(e.name, "WB_ENOSYS")
            self.assertIn("predates versions", e.message)
            return False

    def test_model_update_swaps_leases(self):
        c = self.connect()
        base, head = c.lease("base"), c.lease("head")
        self.assertIn(base.version, (0, 1))  # 0 from a broker that predates versions
        model = self.load(self.pt2, [base, head])
        self.assertEqual(model.info["swaps"], 0)
        base2 = c.lease("base")
        model.update(base2)
        self.assertEqual(model.info["swaps"], 1)
        self.assertGreater(model.info["last_swap_ms"], 0)
        self.assertEqual([l.model for l in model.leases], ["base", "head"])
        self.assertIs(model.leases[0], base2)
        self.assertEqual(base.containers, 0)
        self.assertEqual(base2.containers, 1)
        base.release()  # no longer used
        (y,) = model(torch.tensor([1.0, 1.0, 2.0, 2.0]))
        self.assertEqual(y.tolist(), [11, 22, 36, 48])
        self.assertEqual(model.last_run_version, base2.version)
        # A lease of a model it does not use: refused, nothing changed.
        only_base = self.load(self.pt2, [base2], tensors={"model.bias": torch.zeros(4)})
        head2 = c.lease("head")
        with self.assertRaises(wb.BrokerError) as cm:
            only_base.update([head2])
        self.assertEqual(cm.exception.name, "WB_EINVAL")
        self.assertIn("which the container does not use", cm.exception.message)
        self.assertEqual(head2.containers, 0)
        self.assertEqual(only_base.info["swaps"], 0)
        only_base.close()
        model.close()
        for l in (base2, head, head2):
            l.release()
        self.assertEqual(self.broker.leases(), [])

    def test_follow_needs_a_broker_with_versions(self):
        c = self.connect()
        base, head = c.lease("base"), c.lease("head")
        if self.has_versions(c):
            self.skipTest("the broker knows versions: test_follow_rollout covers it")
        with self.assertRaises(wb.BrokerError) as cm:
            self.load(self.pt2, [base, head], follow=True)
        self.assertEqual(cm.exception.name, "WB_ENOSYS")
        # The leases are still the caller's.
        self.assertEqual(base.containers, 0)
        base.release()
        head.release()
        self.assertEqual(self.broker.leases(), [])

    def test_follow_rollout(self):
        # Needs a broker with versions (RolloutRequest, SubscribeRequest):
        # skipped against one that predates them.
        c = self.connect()
        if not self.has_versions(c):
            self.skipTest("the broker predates versions")
        seen = []
        unsubscribe = c.subscribe("base", lambda m, v, p: seen.append((m, v, p)))
        base, head = c.lease("base"), c.lease("head")
        model = self.load(self.pt2, [base, head], follow=True)
        self.assertTrue(model.following)
        self.assertIsNone(base._h or None)  # owned by the model now
        base2 = os.path.join(self.tmp, "base2.safetensors")
        write_safetensors(base2, [("model.weight", "F32", (4,), f32([2, 4, 6, 8]))])
        self.broker.ctl("rollout", "base", base2)
        wait_for(lambda: model(torch.ones(4))[0].tolist() == [12, 24, 36, 48],
                 "the new version swapped in")
        self.assertEqual(model.last_run_version, 2)
        self.assertEqual(seen, [("base", 2, 1)])
        self.assertEqual(model.info["follow_errors"], 0)
        unsubscribe()
        model.close()
        self.assertEqual(self.broker.leases(), [])

    def test_example_worker_serves_and_stops(self):
        # examples/python_worker.py as a separate process, on the fake.
        inp = os.path.join(self.tmp, "input.safetensors")
        out = os.path.join(self.tmp, "output.safetensors")
        write_safetensors(inp, [("input0", "F32", (4,), f32([1, 1, 2, 2]))])
        log = open(os.path.join(self.tmp, "worker.out"), "w+")
        self.addCleanup(log.close)
        w = subprocess.Popen([sys.executable, os.path.join(SRC, "examples", "python_worker.py"),
                              "--socket", self.broker.sock, "--model", "base", "--model", "head",
                              "--aoti", self.pt2, "--input", inp, "--output", out, "--serve",
                              "--verify", "--bridge", "wb", "--torch-lib", "none"],
                             stdout=log, stderr=subprocess.STDOUT, text=True)
        self.addCleanup(lambda: w.poll() is None and w.kill())

        def printed(text):
            log.seek(0)
            return text in log.read()
        wait_for(lambda: printed("ready\n"), "the example worker to serve")
        self.assertTrue(printed("verified base (1 tensors)"))
        wait_for(lambda: [r["pid"] for r in self.broker.ctl("containers", "--json")] == [w.pid],
                 "wbctl containers to list the example worker")
        self.assertEqual(sorted(l["model"] for l in self.broker.ctl("leases", "--json")
                                if l["pid"] == w.pid), ["base", "head"])
        w.send_signal(signal.SIGTERM)
        self.assertEqual(w.wait(WAIT), 0)
        self.assertTrue(printed("served runs="))
        self.assertTrue(printed(" mismatches=0"))
        self.assertEqual(read_safetensors(out)["output0"], ("F32", (4,), f32([11, 22, 36, 48])))
        wait_for(lambda: not [l for l in self.broker.ctl("leases", "--json")
                              if l["pid"] == w.pid], "the example worker's leases released")

    def test_example_worker_names_itself_in_errors(self):
        # Failures are "python_worker.py: <error>" on stderr, as the C
        # workers' are "wb-aoti-worker: <error>", whatever path ran it.
        r = subprocess.run([sys.executable, os.path.join(SRC, "examples", "python_worker.py"),
                            "--socket", self.broker.sock, "--model", "no-such-model",
                            "--aoti", self.pt2, "--input", os.path.join(self.tmp, "none")],
                           capture_output=True, text=True, timeout=WAIT * 3)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertTrue(r.stderr.startswith("python_worker.py: WB_ENOTFOUND: "), r.stderr)
        self.assertIn("no-such-model", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
