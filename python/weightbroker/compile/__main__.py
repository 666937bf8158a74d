"""python3 -m weightbroker.compile: the command line.

  python3 -m weightbroker.compile hf CHECKPOINT_DIR OUT.pt2 [options]

Exit status: 0 compiled (what was found is printed as JSON), 1 the compile
failed or this torch cannot compile, 2 misuse (stderr says which argument).
Arguments are checked before torch is imported, and --help needs no torch."""

import argparse
import contextlib
import json
import os
import sys

from . import _hf
from ._checkpoint import checkpoint_names
from ._package import TorchUnsupportedError, compile_package, require_torch

PROG = "python3 -m weightbroker.compile"
DTYPES = ("float32", "bfloat16", "float16")


class MissingModuleError(RuntimeError):
    """A module the command needs (transformers) is not installed."""


class _Version(argparse.Action):
    """--version: the package's version and the torch it would compile with
    (torch is imported only when it is asked for)."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        from .. import __version__
        try:
            import torch
            t = "torch %s" % torch.__version__
        except ImportError:
            t = "no torch"
        print("%s %s (%s)" % (PROG, __version__, t))
        parser.exit(0)


def parser():
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Compiles a model with AOTInductor, its constants outside the library, "
        "for weightbroker workers: they bind the broker's leased weights by checkpoint name "
        "without copying them. What the checkpoint lacks (ties, prefix rules, non-persistent "
        "buffers, mutated buffers) is stored in the package as "
        "weightbroker/constants.safetensors.",
        epilog="From Python, any torch.nn.Module: weightbroker.compile.compile_package(module, "
        "inputs, path, checkpoint=..., strip_prefix=..., dynamic_batch=..., dynamic_seq=...).")
    ap.add_argument("--version", action=_Version,
                    help="print the package's and torch's versions and exit")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    hf = sub.add_parser(
        "hf", help="a Hugging Face causal or masked LM saved with save_pretrained",
        description="Exports LogitsOnly(model) (input_ids -> logits; FQNs \"model.<name>\", so "
        "strip_prefix \"model.\" is recorded) of a Hugging Face checkpoint directory and "
        "compiles it; prints what it found as JSON.")
    hf.add_argument("checkpoint", metavar="CHECKPOINT_DIR",
                    help="the save_pretrained directory (config.json and model.safetensors or "
                    "the shards of model.safetensors.index.json)")
    hf.add_argument("out", metavar="OUT.pt2", help="the package to write")
    hf.add_argument("--task", choices=("auto",) + _hf.TASKS, default="auto",
                    help="the model's head (default: from config.json's architectures)")
    hf.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    hf.add_argument("--dtype", choices=DTYPES, default=None,
                    help="the weights' dtype (default: the checkpoint's)")
    hf.add_argument("--batch", type=int, default=None,
                    help="the example's batch size (default 1, or 2 with --dynamic-batch)")
    hf.add_argument("--seq-len", type=int, default=16,
                    help="the example's sequence length (default 16)")
    hf.add_argument("--dynamic-batch", action="store_true",
                    help="accept any batch size (torch.export.Dim; the example needs >= 2)")
    hf.add_argument("--dynamic-seq", action="store_true",
                    help="accept any sequence length the model allows (the example needs >= 2)")
    return ap, hf


def check_hf(ap, a):
    """Validates the hf arguments without torch; returns the task."""
    if not os.path.isdir(a.checkpoint):
        ap.error("CHECKPOINT_DIR %s is not a directory" % a.checkpoint)
    if not any(os.path.exists(os.path.join(a.checkpoint, f))
               for f in ("model.safetensors", "model.safetensors.index.json")):
        ap.error("CHECKPOINT_DIR %s has neither model.safetensors nor "
                 "model.safetensors.index.json" % a.checkpoint)
    try:
        config = _hf.read_config(a.checkpoint)
        task = _hf.task_of(config) if a.task == "auto" else a.task
        checkpoint_names(a.checkpoint)
    except (OSError, ValueError, KeyError) as e:
        ap.error("CHECKPOINT_DIR %s: %s" % (a.checkpoint, e))
    if not a.out.endswith(".pt2"):
        ap.error("OUT.pt2 %s must end in .pt2 (AOTInductor writes a .pt2 zip)" % a.out)
    parent = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(parent):
        ap.error("OUT.pt2 %s: no directory %s" % (a.out, parent))
    if a.batch is None:
        a.batch = 2 if a.dynamic_batch else 1
    for name, value, dynamic in (("--batch", a.batch, a.dynamic_batch),
                                 ("--seq-len", a.seq_len, a.dynamic_seq)):
        if value < 1:
            ap.error("%s %d: must be at least 1" % (name, value))
        if dynamic and value < 2:
            ap.error("%s %d with --dynamic-%s: a dynamic dimension needs an example of at "
                     "least 2" % (name, value, "batch" if name == "--batch" else "seq"))
    return task


def run_hf(a, task):
    torch = require_torch()
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise MissingModuleError("the hf command needs transformers: %s" % e) from None
    model, wrapper = _hf.load(a.checkpoint, task, a.device, a.dtype)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq_len), device=a.device)
    with torch.no_grad():
        info = compile_package(wrapper, (ids,), a.out, checkpoint=a.checkpoint,
                               strip_prefix="model.", dynamic_batch=a.dynamic_batch,
                               dynamic_seq=a.dynamic_seq)
    info["task"] = task
    info["example_shape"] = [a.batch, a.seq_len]
    return info


def main(argv=None):
    ap, hf = parser()
    a = ap.parse_args(argv)
    task = check_hf(hf, a)
    try:
        # stdout is the JSON's: what the libraries print goes to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            info = run_hf(a, task)
    except (TorchUnsupportedError, MissingModuleError) as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 1
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
