"""Tests of weightbroker.compile (python/weightbroker/compile) as installed by
`pip install ./python`, on the CPU.

The command line is run from the installed package (`python -m
weightbroker.compile`, the interpreter of the virtual environment that
tests/python/run.sh made): its help with and without torch, its argument
errors, and the error of a torch without torch.export (Debian's torch 1.13).
What needs no torch.export is tested on modules of the torch at hand: the
tie, buffer and prefix planning, the checkpoint names, the constants file
(read back, and validated by `wbctl inspect`, the parser libwbclient uses),
the mutated-buffer scan of a hand-built graph, the dynamic-shape spec. No
model is exported or compiled here: that runs on the GPU machine
(tests/gpu/real_models.sh).

Environment: WB_BIN_DIR (the build directory, for wbctl)."""

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import zipfile

import torch

import weightbroker.compile as wbc

PROG = "python3 -m weightbroker.compile"
WBCTL = os.path.join(os.environ.get("WB_BIN_DIR", ""), "tools", "wbctl", "wbctl")
HAS_EXPORT = hasattr(torch, "export")
# The hf command's usage, the first line of every misuse message.
HF_USAGE = "usage: python3 -m weightbroker.compile hf [-h]"


def read_st(path):
    """(metadata, {name: (dtype, shape, raw bytes)}) of a safetensors file,
    read independently of the code under test."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", None)
    return meta, {k: (v["dtype"], tuple(v["shape"]),
                      raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
                  for k, v in header.items()}


def raw_bytes(t):
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def write_checkpoint(path, tensors):
    wbc.save_tensors(path, tensors)


def run_cli(args, no_torch=False, cwd=None):
    """Runs the installed command line in a fresh interpreter (never from
    the source tree: the working directory is a temporary one). no_torch:
    with `import torch` failing, as where torch is not installed."""
    if no_torch:
        code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv[1:] = %r; "
                "runpy.run_module('weightbroker.compile', run_name='__main__', alter_sys=True)"
                % (list(args),))
        cmd = [sys.executable, "-c", code]
    else:
        cmd = [sys.executable, "-m", "weightbroker.compile"] + list(args)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       cwd=cwd or tempfile.gettempdir(), env=env)
    return r.returncode, r.stdout, r.stderr


class TiedLM(torch.nn.Module):
    """A causal LM's shape of names: embeddings tied to the output head, a
    non-persistent rotary buffer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.lm_head = torch.nn.Linear(4, 10, bias=False)
        self.lm_head.weight = self.embed.weight
        self.register_buffer("inv_freq", torch.tensor([1.0, 0.5]), persistent=False)


class Wrapper(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model


class MaskedLM(torch.nn.Module):
    """BERT's: the decoder's weight tied to the word embeddings and its bias
    to the head's bias; int64 position and token-type buffers in no
    checkpoint."""

    def __init__(self):
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(12, 4)
        self.register_buffer("position_ids", torch.arange(8).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros((1, 8), dtype=torch.long),
                             persistent=False)
        self.bias = torch.nn.Parameter(torch.arange(12, dtype=torch.float32))
        self.decoder = torch.nn.Linear(4, 12)
        self.decoder.weight = self.word_embeddings.weight
        self.decoder.bias = self.bias


class ConvNet(torch.nn.Module):
    """A CNN's: BatchNorm running statistics are persistent buffers."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 2)


class TestCommandLine(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wbcompile.")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        # A save_pretrained directory in shape: config.json and weights.
        self.ckpt = os.path.join(self.tmp, "bert")
        os.mkdir(self.ckpt)
        with open(os.path.join(self.ckpt, "config.json"), "w") as f:
            json.dump({"architectures": ["BertForMaskedLM"], "vocab_size": 12}, f)
        write_checkpoint(os.path.join(self.ckpt, "model.safetensors"),
                         {"w": torch.zeros(2, dtype=torch.float32)})
        self.out = os.path.join(self.tmp, "bert.pt2")

    def test_help_from_the_installed_package(self):
        if sys.prefix == sys.base_prefix:
            self.skipTest("not run from a virtual environment (tests/python/run.sh makes one)")
        r = subprocess.run([sys.executable, "-c",
                            "import weightbroker.compile as c; print(c.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip().startswith(sys.prefix + os.sep), r.stdout)
        rc, out, err = run_cli(["--help"])
        self.assertEqual((rc, err), (0, ""))
        self.assertTrue(
            out.startswith("usage: python3 -m weightbroker.compile [-h] [--version] COMMAND ..."),
            out)
        self.assertIn("compile_package(module, inputs, path, checkpoint=...", " ".join(out.split()))
        rc, out, err = run_cli(["hf", "--help"])
        self.assertEqual((rc, err), (0, ""))
        for opt in ("--task", "--device", "--dtype", "--batch", "--seq-len", "--dynamic-batch",
                    "--dynamic-seq"):
            self.assertIn(opt, out)

    def test_help_needs_no_torch(self):
        for args in (["--help"], ["hf", "--help"]):
            rc, out, err = run_cli(args, no_torch=True)
            self.assertEqual((rc, err), (0, ""), args)
            self.assertTrue(out.startswith("usage: python3 -m weightbroker.compile"), out)

    def test_version(self):
        import weightbroker
        import torch
        rc, out, err = run_cli(["--version"])
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(out, "%s %s (torch %s)\n" % (PROG, weightbroker.__version__,
                                                      torch.__version__))
        rc, out, err = run_cli(["--version"], no_torch=True)
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(out, "%s %s (no torch)\n" % (PROG, weightbroker.__version__))

    def test_without_torch_the_compile_says_so(self):
        rc, out, err = run_cli(["hf", self.ckpt, self.out], no_torch=True)
        self.assertEqual((rc, out), (1, ""))
        self.assertEqual(err, "%s: torch cannot be imported (import of torch halted; None in "
                         "sys.modules): weightbroker.compile needs PyTorch with torch.export "
                         "and AOTInductor's aoti_compile_and_package (tested with torch 2.11)\n"
                         % PROG)
        self.assertFalse(os.path.exists(self.out))

    def test_torch_without_export_is_named(self):
        if HAS_EXPORT:
            self.skipTest("this torch (%s) has torch.export" % torch.__version__)
        rc, out, err = run_cli(["hf", self.ckpt, self.out])
        self.assertEqual((rc, out), (1, ""))
        self.assertEqual(err, "%s: torch %s (%s) has no torch.export and no torch._inductor: "
                         "weightbroker.compile needs PyTorch with torch.export and AOTInductor's "
                         "aoti_compile_and_package (tested with torch 2.11)\n"
                         % (PROG, torch.__version__, torch.__file__))
        with self.assertRaises(wbc.TorchUnsupportedError) as e:
            wbc.compile_package(torch.nn.Linear(2, 2), (torch.zeros(2, 2),), self.out)
        self.assertEqual(str(e.exception), err[len(PROG) + 2:-1])

    def test_argument_errors(self):
        empty = os.path.join(self.tmp, "empty")
        os.mkdir(empty)
        noconf = os.path.join(self.tmp, "noconf")
        os.mkdir(noconf)
        write_checkpoint(os.path.join(noconf, "model.safetensors"), {})
        vision = os.path.join(self.tmp, "vision")
        shutil.copytree(self.ckpt, vision)
        with open(os.path.join(vision, "config.json"), "w") as f:
            json.dump({"architectures": ["ResNetForImageClassification"]}, f)
        bad = os.path.join(self.tmp, "bad")
        shutil.copytree(self.ckpt, bad)
        with open(os.path.join(bad, "model.safetensors"), "wb") as f:
            f.write(b"\x04\x00\x00\x00\x00\x00\x00\x00[1] ")
        cases = [
            ([], "usage: python3 -m weightbroker.compile [-h] [--version] COMMAND ...",
             "the following arguments are required: COMMAND", PROG),
            (["onnx"], "usage: python3 -m weightbroker.compile [-h] [--version] COMMAND ...",
             "argument COMMAND: invalid choice: 'onnx' (choose from 'hf')", PROG),
            (["hf", self.ckpt], HF_USAGE, "the following arguments are required: OUT.pt2", None),
            (["hf", os.path.join(self.tmp, "nope"), self.out], HF_USAGE,
             "CHECKPOINT_DIR %s is not a directory" % os.path.join(self.tmp, "nope"), None),
            (["hf", empty, self.out], HF_USAGE,
             "CHECKPOINT_DIR %s has neither model.safetensors nor model.safetensors.index.json"
             % empty, None),
            (["hf", noconf, self.out], HF_USAGE,
             "CHECKPOINT_DIR %s: %s: no config.json (No such file or directory); is it a "
             "save_pretrained directory?" % (noconf, noconf), None),
            (["hf", vision, self.out], HF_USAGE,
             "CHECKPOINT_DIR %s: cannot tell the task from config.json's architectures "
             "['ResNetForImageClassification']: give --task (causal-lm or masked-lm)" % vision,
             None),
            (["hf", bad, self.out], HF_USAGE,
             "CHECKPOINT_DIR %s: %s/model.safetensors: not a safetensors file (the header is no "
             "JSON object)" % (bad, bad), None),
            (["hf", self.ckpt, os.path.join(self.tmp, "out.so")], HF_USAGE,
             "OUT.pt2 %s must end in .pt2 (AOTInductor writes a .pt2 zip)"
             % os.path.join(self.tmp, "out.so"), None),
            (["hf", self.ckpt, os.path.join(self.tmp, "no", "x.pt2")], HF_USAGE,
             "OUT.pt2 %s: no directory %s" % (os.path.join(self.tmp, "no", "x.pt2"),
                                              os.path.join(self.tmp, "no")), None),
            (["hf", self.ckpt, self.out, "--task", "seq2seq"], HF_USAGE,
             "argument --task: invalid choice: 'seq2seq' (choose from 'auto', 'causal-lm', "
             "'masked-lm')", None),
            (["hf", self.ckpt, self.out, "--dtype", "int8"], HF_USAGE,
             "argument --dtype: invalid choice: 'int8' (choose from 'float32', 'bfloat16', "
             "'float16')", None),
            (["hf", self.ckpt, self.out, "--seq-len", "x"], HF_USAGE,
             "argument --seq-len: invalid int value: 'x'", None),
            (["hf", self.ckpt, self.out, "--seq-len", "0"], HF_USAGE,
             "--seq-len 0: must be at least 1", None),
            (["hf", self.ckpt, self.out, "--batch", "0"], HF_USAGE,
             "--batch 0: must be at least 1", None),
            (["hf", self.ckpt, self.out, "--batch", "1", "--dynamic-batch"], HF_USAGE,
             "--batch 1 with --dynamic-batch: a dynamic dimension needs an example of at "
             "least 2", None),
            (["hf", self.ckpt, self.out, "--seq-len", "1", "--dynamic-seq"], HF_USAGE,
             "--seq-len 1 with --dynamic-seq: a dynamic dimension needs an example of at "
             "least 2", None),
        ]
        for args, usage, message, prog in cases:
            for no_torch in (False, True):
                rc, out, err = run_cli(args, no_torch=no_torch)
                lines = err.splitlines()
                self.assertEqual((rc, out), (2, ""), (args, err))
                self.assertEqual(lines[0], usage, args)
                self.assertEqual(lines[-1], "%s: error: %s" % (prog or PROG + " hf", message),
                                 args)
        self.assertFalse(os.path.exists(self.out))


class TestNames(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wbcompile.")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_checkpoint_names_of_a_file_a_directory_and_an_index(self):
        one = os.path.join(self.tmp, "one")
        os.mkdir(one)
        write_checkpoint(os.path.join(one, "model.safetensors"),
                         {"a.weight": torch.zeros(2), "b": torch.ones(1, dtype=torch.int64)})
        self.assertEqual(wbc.checkpoint_names(one), {"a.weight", "b"})
        self.assertEqual(wbc.checkpoint_names(os.path.join(one, "model.safetensors")),
                         {"a.weight", "b"})
        sharded = os.path.join(self.tmp, "sharded")
        os.mkdir(sharded)
        index = os.path.join(sharded, "model.safetensors.index.json")
        with open(index, "w") as f:
            json.dump({"metadata": {"total_size": 12},
                       "weight_map": {"x": "model-00001-of-00002.safetensors",
                                      "y": "model-00002-of-00002.safetensors"}}, f)
        # The index wins over a model.safetensors beside it, as for the broker.
        write_checkpoint(os.path.join(sharded, "model.safetensors"), {"z": torch.zeros(1)})
        self.assertEqual(wbc.checkpoint_names(sharded), {"x", "y"})
        self.assertEqual(wbc.checkpoint_names(index), {"x", "y"})

    def test_not_a_checkpoint(self):
        short = os.path.join(self.tmp, "short.safetensors")
        with open(short, "wb") as f:
            f.write(b"\x01\x02")
        with self.assertRaises(ValueError) as e:
            wbc.checkpoint_names(short)
        self.assertEqual(str(e.exception),
                         "%s: not a safetensors file (shorter than 8 bytes)" % short)
        huge = os.path.join(self.tmp, "huge.safetensors")
        with open(huge, "wb") as f:
            f.write(struct.pack("<Q", 1 << 40))
        with self.assertRaises(ValueError) as e:
            wbc.checkpoint_names(huge)
        self.assertEqual(str(e.exception),
                         "%s: not a safetensors file (header of %d bytes)" % (huge, 1 << 40))
        with self.assertRaises(FileNotFoundError):
            wbc.checkpoint_names(os.path.join(self.tmp, "missing"))

    def test_map_name(self):
        self.assertEqual(wbc.map_name("model.lm_head.weight", "model.", None), "lm_head.weight")
        self.assertEqual(wbc.map_name("lm_head.weight", "model.", None), "lm_head.weight")
        self.assertEqual(wbc.map_name("model.x", "model.", "base."), "base.x")
        self.assertEqual(wbc.map_name("x", None, "base."), "base.x")
        self.assertEqual(wbc.map_name("x", "", ""), "x")
        # Only a prefix is stripped, never the middle of a name.
        self.assertEqual(wbc.map_name("a.model.x", "model.", None), "a.model.x")

    def test_task_of(self):
        self.assertEqual(wbc.task_of({"architectures": ["LlamaForCausalLM"]}), "causal-lm")
        self.assertEqual(wbc.task_of({"architectures": ["GPT2LMHeadModel"]}), "causal-lm")
        self.assertEqual(wbc.task_of({"architectures": ["BertForMaskedLM"]}), "masked-lm")
        self.assertEqual(wbc.task_of({"architectures": "BertForMaskedLM"}), "masked-lm")
        for config, shown in (({}, "(none)"), ({"architectures": []}, "(none)"),
                              ({"architectures": ["BertModel"]}, "['BertModel']"),
                              ({"architectures": ["BertForMaskedLM", "GPT2LMHeadModel"]},
                               "['BertForMaskedLM', 'GPT2LMHeadModel']")):
            with self.assertRaises(ValueError) as e:
                wbc.task_of(config)
            self.assertEqual(str(e.exception),
                             "cannot tell the task from config.json's architectures %s: give "
                             "--task (causal-lm or masked-lm)" % shown)


class TestPlan(unittest.TestCase):
    def test_tied_embeddings_without_a_checkpoint(self):
        # No checkpoint: the module's state dict with tied duplicates
        # removed, what save_pretrained writes.
        m = TiedLM()
        leased, aliases, extra = wbc.plan(m, None)
        self.assertEqual(leased, ["embed.weight"])
        self.assertEqual(aliases, {"lm_head.weight": "embed.weight"})
        self.assertEqual(sorted(extra), ["inv_freq"])
        self.assertTrue(torch.equal(extra["inv_freq"], torch.tensor([1.0, 0.5])))

    def test_a_wrapper_against_its_checkpoint(self):
        # Exported inside a wrapper the FQNs are "model.<name>"; the
        # checkpoint (save_pretrained dropped the tied lm_head.weight) has
        # the bare names.
        m = Wrapper(TiedLM())
        ckpt = {"embed.weight"}
        leased, aliases, extra = wbc.plan(m, ckpt, strip_prefix="model.")
        self.assertEqual(leased, ["model.embed.weight"])
        self.assertEqual(aliases, {"model.lm_head.weight": "embed.weight"})
        self.assertEqual(sorted(extra), ["model.inv_freq"])
        # Kept the other way round (the head in the file, the embedding
        # dropped), the alias points at what the file has.
        leased, aliases, _ = wbc.plan(m, {"lm_head.weight"}, strip_prefix="model.")
        self.assertEqual((leased, aliases), (["model.lm_head.weight"],
                                             {"model.embed.weight": "lm_head.weight"}))
        # A prefix maps onto a checkpoint whose names carry one.
        leased, aliases, _ = wbc.plan(m, {"base.embed.weight"}, strip_prefix="model.",
                                      prefix="base.")
        self.assertEqual((leased, aliases), (["model.embed.weight"],
                                             {"model.lm_head.weight": "base.embed.weight"}))

    def test_masked_lm_ties_and_int64_buffers(self):
        m = MaskedLM()
        ckpt = {"word_embeddings.weight", "bias"}
        leased, aliases, extra = wbc.plan(m, ckpt)
        self.assertEqual(sorted(leased), ["bias", "word_embeddings.weight"])
        self.assertEqual(aliases, {"decoder.weight": "word_embeddings.weight",
                                   "decoder.bias": "bias"})
        self.assertEqual(sorted(extra), ["position_ids", "token_type_ids"])
        self.assertEqual(extra["position_ids"].dtype, torch.int64)
        self.assertTrue(torch.equal(extra["position_ids"], torch.arange(8).reshape(1, 8)))
        self.assertTrue(extra["position_ids"].is_contiguous())  # an expanded view, copied
        self.assertEqual(extra["token_type_ids"].dtype, torch.int64)
        # The extras are copies: the model's buffers are not shared with them.
        extra["token_type_ids"].fill_(7)
        self.assertEqual(int(m.token_type_ids.sum()), 0)

    def test_batchnorm_statistics_are_leased(self):
        m = ConvNet().eval()
        leased, aliases, extra = wbc.plan(m, set(m.state_dict()))
        self.assertEqual(sorted(leased), ["bn.bias", "bn.num_batches_tracked", "bn.running_mean",
                                          "bn.running_var", "bn.weight", "conv.weight",
                                          "fc.bias", "fc.weight"])
        self.assertEqual((aliases, extra), ({}, {}))
        # A checkpoint of the parameters only: the statistics go into the
        # package, the worker copies them.
        params = {n for n, _ in m.named_parameters()}
        _, _, extra = wbc.plan(m, params)
        self.assertEqual(sorted(extra), ["bn.num_batches_tracked", "bn.running_mean",
                                         "bn.running_var"])

    def test_model_tensors_keeps_tied_duplicates(self):
        named = wbc.model_tensors(MaskedLM())
        self.assertEqual(sorted(named), ["bias", "decoder.bias", "decoder.weight",
                                         "position_ids", "token_type_ids",
                                         "word_embeddings.weight"])
        self.assertIs(named["decoder.weight"], named["word_embeddings.weight"])


class TestConstantsFile(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="wbcompile.")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def package(self, name, top="model"):
        # A .pt2 is a zip whose entries share one top folder.
        path = os.path.join(self.tmp, name)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(top + "/data/aotinductor/model/model.wrapper.so" if top else "model.so",
                       b"\x7fELF")
        return path

    def extract(self, pkg, entry):
        with zipfile.ZipFile(pkg) as z:
            self.assertEqual(z.getinfo(entry).compress_type, zipfile.ZIP_STORED)
            z.extract(entry, self.tmp)
        return os.path.join(self.tmp, entry)

    def test_written_into_the_package(self):
        pkg = self.package("m.pt2")
        extra = {"model.inv_freq": torch.tensor([1.0, 0.25]),
                 "model.position_ids": torch.arange(6).reshape(1, 6),
                 "model.scale": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
                 "model.mask": torch.tensor([True, False, True])}
        entry = wbc.write_constants(pkg, {"model.lm_head.weight": "embed.weight",
                                          "model.decoder.bias": "bias"}, extra,
                                    strip_prefix="model.", mutated=["model.count"])
        self.assertEqual(entry, "model/weightbroker/constants.safetensors")
        path = self.extract(pkg, entry)
        meta, tensors = read_st(path)
        self.assertEqual(meta, {"weightbroker.format": "1",
                                "weightbroker.aliases": "model.decoder.bias=bias,"
                                                        "model.lm_head.weight=embed.weight",
                                "weightbroker.mutated": "model.count",
                                "weightbroker.strip_prefix": "model."})
        self.assertEqual(tensors, {
            "model.inv_freq": ("F32", (2,), raw_bytes(extra["model.inv_freq"])),
            "model.position_ids": ("I64", (1, 6), raw_bytes(extra["model.position_ids"])),
            "model.scale": ("BF16", (2,), raw_bytes(extra["model.scale"])),
            "model.mask": ("BOOL", (3,), raw_bytes(extra["model.mask"]))})
        if not os.access(WBCTL, os.X_OK):
            self.skipTest("no wbctl in WB_BIN_DIR to validate the file with")
        r = subprocess.run([WBCTL, "inspect", "--json", path], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        seen = json.loads(r.stdout)
        self.assertEqual(seen["metadata"], meta)
        self.assertEqual(sorted((t["name"], t["dtype"], tuple(t["shape"]), t["nbytes"])
                                for t in seen["tensors"]),
                         [("model.inv_freq", "F32", (2,), 8), ("model.mask", "BOOL", (3,), 3),
                          ("model.position_ids", "I64", (1, 6), 48),
                          ("model.scale", "BF16", (2,), 4)])

    def test_no_extras_and_no_folder(self):
        pkg = self.package("flat.pt2", top="")
        entry = wbc.write_constants(pkg, {}, {}, prefix="base.")
        self.assertEqual(entry, "weightbroker/constants.safetensors")
        meta, tensors = read_st(self.extract(pkg, entry))
        self.assertEqual(meta, {"weightbroker.format": "1", "weightbroker.aliases": "",
                                "weightbroker.prefix": "base."})
        self.assertEqual(tensors, {})

    def test_an_empty_tensor_and_a_view(self):
        path = os.path.join(self.tmp, "t.safetensors")
        base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        wbc.save_tensors(path, {"empty": torch.zeros(0, 4), "col": base[:, 1]})
        meta, tensors = read_st(path)
        self.assertIsNone(meta)
        self.assertEqual(tensors, {"col": ("F32", (3,), raw_bytes(torch.tensor([1.0, 5.0, 9.0]))),
                                   "empty": ("F32", (0, 4), b"")})

    def test_a_dtype_without_a_safetensors_name(self):
        with self.assertRaises(TypeError) as e:
            wbc.save_tensors(os.path.join(self.tmp, "c.safetensors"),
                             {"z": torch.zeros(2, dtype=torch.complex64)})
        self.assertEqual(str(e.exception),
                         "tensor z: dtype torch.complex64 has no safetensors name")


class _Sig:
    """The parts of an ExportGraphSignature the mutated-buffer scan reads."""

    def __init__(self, buffers, params=None, mutate=None):
        self.inputs_to_buffers = buffers
        self.inputs_to_parameters = params or {}
        self.buffers_to_mutate = mutate or {}


class _Program:
    """An exported program's stand-in: a graph built by hand, a signature,
    and no run_decompositions (as on a torch without torch.export)."""

    def __init__(self, graph, sig):
        self.graph, self.graph_signature = graph, sig


class TestMutated(unittest.TestCase):
    def program(self):
        aten = torch.ops.aten
        g = torch.fx.Graph()
        count = g.placeholder("b_count")
        cache = g.placeholder("b_cache")
        weight = g.placeholder("p_weight")
        x = g.placeholder("x")
        g.call_function(aten.add_.Tensor, (count, x))                 # count.add_(x)
        row = g.call_function(aten.select.int, (cache, 0, 1))         # cache[1] ...
        g.call_function(aten.copy_.default, (row, x))                 # ... = x
        y = g.call_function(aten.mul.Tensor, (weight, x))             # read only
        g.output(y)
        return _Program(g, _Sig({"b_count": "count", "b_cache": "layer.cache"},
                                {"p_weight": "weight"}, {"out_state": "state"}))

    def test_in_place_ops_through_views(self):
        ep = self.program()
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            by = wbc.mutated_buffers_by_source(ep)
            union = wbc.mutated_buffers(ep)
        self.assertEqual(by, {"signature": ["state"], "graph": ["count", "layer.cache"],
                              "decomposed": []})
        self.assertEqual(union, ["count", "layer.cache", "state"])
        # Without run_decompositions the scan says what it did without.
        self.assertEqual(err.getvalue(), 2 * (
            "weightbroker.compile: run_decompositions failed ('_Program' object has no "
            "attribute 'run_decompositions'); mutated buffers from the graph only\n"))

    def test_no_program(self):
        self.assertEqual(wbc.mutated_buffers_by_source(None),
                         {"signature": [], "graph": [], "decomposed": []})
        self.assertEqual(wbc.mutated_buffers(None), [])


class TestDynamicSpec(unittest.TestCase):
    def test_batch_and_sequence(self):
        ids, mask = torch.zeros(2, 16, dtype=torch.long), torch.ones(2, 16)
        spec = wbc.dynamic_spec((ids, mask, 3), True, True, make_dim=lambda n: n)
        self.assertEqual(spec, ({0: "batch", 1: "seq"}, {0: "batch", 1: "seq"}, None))
        self.assertEqual(wbc.dynamic_spec((ids,), False, True, make_dim=lambda n: n),
                         ({1: "seq"},))
        # An image: the batch only; a 1-D input has no sequence dimension.
        img = torch.zeros(2, 3, 8, 8)
        self.assertEqual(wbc.dynamic_spec((img, torch.zeros(4)), True, False,
                                          make_dim=lambda n: n), ({0: "batch"}, {0: "batch"}))
        self.assertIsNone(wbc.dynamic_spec((ids,), False, False))

    def test_too_small_examples(self):
        with self.assertRaises(ValueError) as e:
            wbc.dynamic_spec((torch.zeros(1, 16),), True, False, make_dim=lambda n: n)
        self.assertEqual(str(e.exception),
                         "example input 0 has batch size 1 (shape [1, 16]): a dynamic "
                         "dimension needs an example of at least 2, since export specialises "
                         "sizes 0 and 1")
        with self.assertRaises(ValueError) as e:
            wbc.dynamic_spec((torch.zeros(4, 1),), False, True, make_dim=lambda n: n)
        self.assertIn("example input 0 has seq size 1 (shape [4, 1])", str(e.exception))
        with self.assertRaises(ValueError) as e:
            wbc.dynamic_spec((torch.zeros(4),), False, True, make_dim=lambda n: n)
        self.assertEqual(str(e.exception), "no example input has a dimension to make dynamic")

    def test_conflicting_arguments(self):
        # Refused before anything else, whatever the torch.
        with self.assertRaises(ValueError) as e:
            wbc.compile_package(torch.nn.Linear(2, 2), (torch.zeros(2, 2),), "x.pt2",
                                dynamic_shapes=({0: None},), dynamic_batch=True)
        self.assertEqual(str(e.exception),
                         "give dynamic_shapes or dynamic_batch/dynamic_seq, not both")


if __name__ == "__main__":
    unittest.main(verbosity=2)
