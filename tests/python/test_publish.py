"""Tests of publishing from Python (Client.publish, weightbroker.Publisher):
the table built from a state dict, the refusals made before anything is
sent, the calls into libwbclient (through a fake of its publish functions:
the table, each tensor's address and bytes, the references kept until the
commit returns, aborts on errors), and against a real wbrokerd on the host
backend a publish and a partial publish, skipped while the broker answers
the request as unknown (WB_EPROTO "the broker does not know publishing":
a broker without publishing).

Environment: WB_BIN_DIR, WB_SOURCE_DIR; WB_CLIENT_LIBRARY names the
libwbclient.so under test."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
import weakref
from unittest import mock

import torch

import weightbroker as wb
import weightbroker.publish as wbpub
from weightbroker import _lib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_weightbroker import DEMO, SRC, WBROKERD, Broker  # noqa: E402


class TestTable(unittest.TestCase):
    def test_dtypes_shapes_bytes(self):
        sd = {"w": torch.zeros(2, 3, dtype=torch.bfloat16), "b": torch.zeros(3),
              "m": torch.zeros(4, dtype=torch.bool), "s": torch.tensor(7, dtype=torch.int64)}
        table = wbpub.build_table(sd)
        self.assertEqual([(n, d, sh, nb) for n, d, sh, _, nb in table],
                         [("w", "BF16", (2, 3), 12), ("b", "F32", (3,), 12),
                          ("m", "BOOL", (4,), 4), ("s", "I64", (), 8)])

    def test_not_contiguous(self):
        sd = {"ok": torch.zeros(2), "wt": torch.zeros(3, 4).t()}
        with self.assertRaises(ValueError) as cm:
            wbpub.build_table(sd)
        self.assertEqual(str(cm.exception),
                         "tensor wt is not contiguous: call .contiguous() first")

    def test_refusals(self):
        with self.assertRaisesRegex(TypeError, r"^tensor x is a list, not a torch.Tensor$"):
            wbpub.build_table({"x": [1, 2]})
        with self.assertRaisesRegex(TypeError, r"a tensor name must be a str, not int"):
            wbpub.build_table({3: torch.zeros(1)})
        with self.assertRaisesRegex(ValueError, r"state_dict has no tensors"):
            wbpub.build_table({})
        with self.assertRaisesRegex(TypeError, r"must be a mapping"):
            wbpub.build_table([torch.zeros(1)])

    def test_header_mirrors(self):
        # The ctypes mirrors list publish.h's fields in order.
        with open(os.path.join(SRC, "include", "wb", "publish.h")) as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        for cname, cls in {"wb_publish_desc": _lib.PublishDesc,
                           "wb_publish_options": _lib.PublishOptions,
                           "wb_publish_info": _lib.PublishInfo}.items():
            m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (cname, cname), text, re.S)
            self.assertIsNotNone(m, cname)
            fields = [re.findall(r"\w+", d)[-1] for d in m.group(1).split(";") if d.strip()]
            self.assertEqual([f for f, _ in cls._fields_], fields, cname)


class FakeLib:
    """libwbclient's publish functions, recording what they are given; the
    rest from the real library."""

    def __init__(self, real):
        self.real = real
        self.begun = None
        self.given = []
        self.calls = []
        self.begin_rc = 0
        self.tensor_rc = {}
        self.commit_rc = 0
        self.msg = b""
        self.on_commit = None

    def __getattr__(self, name):
        return getattr(self.real, name)

    def wb_publish_options_init(self, opts):
        ctypes.memset(ctypes.addressof(opts._obj), 0, ctypes.sizeof(opts._obj))

    def wb_client_errmsg(self, h):
        return self.msg

    def wb_publish_begin(self, ch, name, opts, out):
        self.calls.append("begin")
        o = opts._obj
        self.begun = {"model": name, "partial": o.partial, "placement": o.placement,
                      "tensors": [(o.tensors[i].name, o.tensors[i].dtype,
                                   tuple(o.tensors[i].shape[k] for k in range(o.tensors[i].ndim)))
                                  for i in range(o.n_tensors)]}
        if self.begin_rc:
            self.msg = b"publish 'demo': fake refusal"
            return self.begin_rc
        out._obj.value = 0x1234
        return 0

    def wb_publish_version(self, h):
        return 9

    def wb_publish_tensor(self, h, name, ptr, nbytes):
        self.calls.append("tensor")
        rc = self.tensor_rc.get(name, 0)
        if rc:
            self.msg = b"publish 'demo': tensor '" + name + b"' refused"
            return rc
        self.given.append((name, ctypes.string_at(ptr, nbytes) if ptr else b"", nbytes))
        return 0

    def wb_publish_errmsg(self, h):
        return self.msg

    def wb_publish_commit_ex(self, pp, info):
        self.calls.append("commit")
        if self.on_commit:
            self.on_commit()
        pp._obj.value = None
        if self.commit_rc:
            self.msg = b"publish 'demo': fake commit refusal"
            return self.commit_rc
        i = info._obj
        i.version, i.previous_version, i.copy_seconds, i.copied_bytes = 9, 8, 0.5, 24
        return 0

    def wb_publish_abort(self, pp):
        self.calls.append("abort")
        pp._obj.value = None


class StubClient:
    """What Publisher uses of a Client."""

    def __init__(self):
        self._lock = threading.RLock()
        self._publishers = weakref.WeakSet()
        self._h = ctypes.c_void_p(1)

    def _handle(self):
        return self._h

    publish = wb.Client.publish


class TestFakeLibrary(unittest.TestCase):
    def setUp(self):
        self.fake = FakeLib(_lib.lib())
        patcher = mock.patch.object(wbpub, "lib", lambda: self.fake)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.client = StubClient()

    def test_publish(self):
        a = torch.arange(4, dtype=torch.float32)
        b = torch.tensor([1, 2, 3], dtype=torch.uint8)
        v = self.client.publish("demo", {"a": a, "b": b}, partial=True, placement="spread")
        self.assertEqual(v, 9)
        self.assertEqual(self.fake.begun, {"model": b"demo", "partial": 1, "placement": b"spread",
                                           "tensors": [(b"a", b"F32", (4,)), (b"b", b"U8", (3,))]})
        self.assertEqual(self.fake.given, [(b"a", a.numpy().tobytes(), 16), (b"b", b"\1\2\3", 3)])
        self.assertEqual(self.fake.calls, ["begin", "tensor", "tensor", "commit"])
        self.assertEqual(len(self.client._publishers), 0)

    def test_not_contiguous_sends_nothing(self):
        with self.assertRaises(ValueError) as cm:
            self.client.publish("demo", {"a": torch.zeros(2, 2).t()})
        self.assertEqual(str(cm.exception), "tensor a is not contiguous: call .contiguous() first")
        self.assertEqual(self.fake.calls, [])

    def test_begin_refused(self):
        self.fake.begin_rc = -8
        with self.assertRaises(wb.PermissionDeniedError) as cm:
            self.client.publish("demo", {"a": torch.zeros(2)})
        self.assertEqual(cm.exception.message, "publish 'demo': fake refusal")
        self.assertEqual(self.fake.calls, ["begin"])

    def test_tensor_refused_aborts(self):
        self.fake.tensor_rc[b"b"] = -1
        with self.assertRaises(wb.BrokerError) as cm:
            self.client.publish("demo", {"a": torch.zeros(2), "b": torch.zeros(2)})
        self.assertEqual(cm.exception.name, "WB_EINVAL")
        self.assertEqual(cm.exception.message, "publish 'demo': tensor 'b' refused")
        self.assertEqual(self.fake.calls, ["begin", "tensor", "tensor", "abort"])
        self.assertEqual(len(self.client._publishers), 0)

    def test_commit_refused(self):
        self.fake.commit_rc = -12
        with self.assertRaises(wb.LimitError) as cm:
            self.client.publish("demo", {"a": torch.zeros(2)})
        self.assertEqual(cm.exception.message, "publish 'demo': fake commit refusal")
        self.assertEqual(self.fake.calls, ["begin", "tensor", "commit"])

    def test_publisher_keeps_tensors_until_commit(self):
        p = wb.Publisher(self.client, "demo", [("a", "F32", (4,))])
        self.assertEqual(p.version, 9)
        t = torch.ones(4)
        ref = weakref.ref(t)
        p.tensor("a", t)
        del t
        alive = []
        self.fake.on_commit = lambda: alive.append(ref() is not None)
        self.assertEqual(p.commit(), 9)
        self.assertEqual(alive, [True])
        self.assertIsNone(ref())
        self.assertEqual(p.info["copied_bytes"], 24)
        self.assertEqual(p.info["previous_version"], 8)
        with self.assertRaisesRegex(ValueError, "the publish has ended"):
            p.tensor("a", torch.ones(4))
        p.abort()  # ended: nothing
        self.assertEqual(self.fake.calls, ["begin", "tensor", "commit"])

    def test_publisher_context_aborts_on_error(self):
        with self.assertRaises(RuntimeError):
            with wb.Publisher(self.client, "demo", [("a", "F32", (4,))]):
                raise RuntimeError("the producer failed")
        self.assertEqual(self.fake.calls, ["begin", "abort"])


class TestBroker(unittest.TestCase):
    """Against wbrokerd: runs once the broker publishes."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wbpy.")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        # The publisher right for this uid, where the broker has the option.
        helptext = subprocess.run([WBROKERD, "--help"], capture_output=True, text=True).stdout
        extra = ["--publisher-uid", str(os.getuid())] if "--publisher-uid" in helptext else []
        self.broker = Broker(self.tmp, {"demo": DEMO}, *extra)
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.client = wb.connect(self.broker.sock)
        self.addCleanup(self.client._close_at_exit)

    def current(self):
        with self.client.lease("demo") as lease:
            ts = lease.tensors()
            out = {k: v.clone() for k, v in ts.items()}
            version = lease.version
            del ts
        return out, version

    def publish_or_skip(self, sd, **kw):
        try:
            return self.client.publish("demo", sd, **kw)
        except wb.BrokerError as e:
            if e.name == "WB_EPROTO" and "the broker does not know publishing" in e.message:
                self.skipTest("this broker does not publish yet: " + e.message)
            raise

    def test_publish_and_partial(self):
        sd, v1 = self.current()
        new = {k: (t + 1 if t.is_floating_point() else t.clone()) for k, t in sd.items()}
        v2 = self.publish_or_skip(new)
        self.assertEqual(v2, v1 + 1)
        got, version = self.current()
        self.assertEqual(version, v2)
        for k in sd:
            self.assertTrue(torch.equal(got[k], new[k]), k)
        name = sorted(sd)[0]
        part = {name: torch.zeros_like(sd[name])}
        v3 = self.client.publish("demo", part, partial=True)
        self.assertEqual(v3, v2 + 1)
        got, _ = self.current()
        self.assertTrue(torch.equal(got[name], part[name]))
        for k in sd:
            if k != name:
                self.assertTrue(torch.equal(got[k], new[k]), k)


if __name__ == "__main__":
    unittest.main()
