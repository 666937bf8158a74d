#!/usr/bin/env python3
"""Compiles a PyTorch model with AOTInductor for weightbroker workers.

The package is compiled with its constants OUTSIDE the model library
(aot_inductor.package_constants_in_so = False): a worker binds the weights
that the broker leases, by their checkpoint names, without copying them.
What the checkpoint lacks is written now, into a small safetensors file
stored in the package as <archive>/weightbroker/constants.safetensors:

* tensors that are in no checkpoint and tied to none: non-persistent buffers
  (a rotary embedding's inv_freq, causal masks) and tensor constants, keyed
  by the model's FQN; the worker copies them into private memory;
* in its metadata, "weightbroker.aliases": "name=target,...": every constant
  that is in no checkpoint but shares its storage with one that is (tied
  weights: save_pretrained keeps transformer.wte.weight and drops
  lm_head.weight); the worker binds both to the one leased tensor. Ties are
  found from the eager model itself (parameters that are the same tensor),
  which is what config.json's tie_word_embeddings produces, so the config is
  not read; a tie the model does not show must be given with --alias;
* "weightbroker.strip_prefix" / "weightbroker.prefix": how the model's FQNs
  become checkpoint names (a model exported inside a wrapper has FQNs
  "model.<name>");
* "weightbroker.mutated": the buffers the exported program writes (its
  in-place ops on buffers, and graph_signature.buffers_to_mutate before and
  after run_decompositions); libwbclient refuses to bind them to shared
  weights unless asked for a private copy.

libwbclient finds the file by itself (wb_container_options.constants_file or
wb-aoti-worker --constants name another one; --alias, --strip-prefix and
--prefix add to or replace what it says).

Library use:
    from wb_compile import compile_package
    info = compile_package(module, (input_ids,), "model.pt2",
                           checkpoint="ckpt_dir", strip_prefix="model.")

Command line, for a Hugging Face causal LM saved with save_pretrained:
    wb_compile.py hf CHECKPOINT_DIR OUT.pt2 [--device cuda] [--seq-len 16]
                     [--dtype float32|bfloat16|float16]
It exports LogitsOnly(model) (input_ids -> logits, FQNs "model.<name>", so
strip_prefix "model." is recorded) and prints what it found as JSON.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import zipfile

import torch

FORMAT = "1"
ENTRY = "weightbroker/constants.safetensors"


def checkpoint_names(path):
    """Tensor names of a safetensors checkpoint: a file, a directory with
    model.safetensors.index.json or model.safetensors, or an index file."""
    from safetensors import safe_open

    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        path = index if os.path.exists(index) else os.path.join(path, "model.safetensors")
    if path.endswith(".json"):
        with open(path) as f:
            return set(json.load(f)["weight_map"])
    with safe_open(path, "pt") as f:
        return set(f.keys())


def map_name(name, strip_prefix, prefix):
    if strip_prefix and name.startswith(strip_prefix):
        name = name[len(strip_prefix):]
    return (prefix or "") + name


def _storage_key(t):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
            tuple(t.stride()), t.dtype)


def model_tensors(module, ep=None):
    """Every named tensor the compiled model may hold as a constant, tied
    duplicates included: parameters, buffers (persistent or not) and the
    exported program's lifted constants."""
    named = {}
    for name, t in module.named_parameters(remove_duplicate=False):
        named[name] = t
    for name, t in module.named_buffers(remove_duplicate=False):
        named[name] = t
    if ep is not None:
        for name, t in ep.constants.items():
            if isinstance(t, torch.Tensor):
                named.setdefault(name, t)
    return named


def plan(module, ckpt, strip_prefix=None, prefix=None, ep=None):
    """Splits the model's tensors into (checkpoint names, aliases, extra
    tensors). `ckpt` is the set of checkpoint names, or None for the
    module's own state dict with tied duplicates removed (what
    save_pretrained keeps)."""
    named = model_tensors(module, ep)
    if ckpt is None:
        seen, ckpt = set(), set()
        for name, t in module.state_dict(keep_vars=True).items():
            k = _storage_key(t)
            if k not in seen:
                seen.add(k)
                ckpt.add(map_name(name, strip_prefix, prefix))
    by_storage = {}
    for name, t in named.items():
        if map_name(name, strip_prefix, prefix) in ckpt:
            by_storage.setdefault(_storage_key(t), map_name(name, strip_prefix, prefix))
    aliases, extra, leased = {}, {}, []
    for name, t in named.items():
        mapped = map_name(name, strip_prefix, prefix)
        if mapped in ckpt:
            leased.append(name)
        elif _storage_key(t) in by_storage:
            aliases[name] = by_storage[_storage_key(t)]
        else:
            extra[name] = t.detach().to("cpu").contiguous().clone()
    return leased, aliases, extra


def _add_to_package(package_path, file_path):
    with zipfile.ZipFile(package_path) as z:
        names = z.namelist()
    top = names[0].split("/", 1)[0] if names and "/" in names[0] else ""
    entry = f"{top}/{ENTRY}" if top else ENTRY
    with zipfile.ZipFile(package_path, "a", compression=zipfile.ZIP_STORED) as z:
        z.write(file_path, entry)
    return entry


def _written_base(node):
    """The placeholder a view chain ends in (`self.cache[0, 1] = x` writes
    through select/slice views of the buffer), or None."""
    seen = 0
    while node is not None and seen < 64:
        if getattr(node, "op", None) == "placeholder":
            return node
        if getattr(node, "op", None) != "call_function" or not node.args:
            return None
        schema = getattr(node.target, "_schema", None)
        # Only ops whose result aliases their first argument (views, and
        # in-place ops that return self) lead back to the storage written.
        if schema is None or not schema.returns or schema.returns[0].alias_info is None:
            return None
        node, seen = node.args[0], seen + 1
    return None


def mutated_buffers_by_source(ep):
    """The constants the exported program writes, found three ways:

    * "signature": graph_signature.buffers_to_mutate as export returned it;
    * "graph": in-place and out= ops in the graph whose written argument is
      (a view of) a buffer or parameter placeholder. torch.export.export
      returns the training IR since torch 2.6, which keeps
      `self.count.add_(1)` as an in-place op and does not list it in
      buffers_to_mutate (on torch 2.11 that list came back empty for such a
      module);
    * "decomposed": buffers_to_mutate after ep.run_decompositions(), the
      functional form the compiler lowers.
    Each is a sorted list of FQNs."""
    if ep is None:
        return {"signature": [], "graph": [], "decomposed": []}
    sig = ep.graph_signature
    owners = dict(getattr(sig, "inputs_to_parameters", {}) or {})
    owners.update(getattr(sig, "inputs_to_buffers", {}) or {})
    graph = set()
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            val = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            for v in (val if isinstance(val, (list, tuple)) else (val,)):
                base = _written_base(v)
                if base is not None and base.name in owners:
                    graph.add(owners[base.name])
    try:
        decomposed = set(ep.run_decompositions().graph_signature.buffers_to_mutate.values())
    except Exception as e:  # the compile that follows reports it properly
        print(f"wb_compile: run_decompositions failed ({e}); mutated buffers from the graph only",
              file=sys.stderr)
        decomposed = set()
    return {"signature": sorted(set(sig.buffers_to_mutate.values())), "graph": sorted(graph),
            "decomposed": sorted(decomposed)}


def mutated_buffers(ep):
    """FQNs of the constants the exported program writes (BatchNorm running
    statistics in training mode, caches, counters): the compiled graph
    writes those constants, so workers must not bind them to shared,
    read-only weights. The union of mutated_buffers_by_source."""
    return sorted(set().union(*mutated_buffers_by_source(ep).values()))


def write_constants(package_path, aliases, extra, strip_prefix=None, prefix=None, mutated=()):
    from safetensors.torch import save_file

    meta = {"weightbroker.format": FORMAT,
            "weightbroker.aliases": ",".join(f"{k}={v}" for k, v in sorted(aliases.items()))}
    if mutated:
        meta["weightbroker.mutated"] = ",".join(mutated)
    if strip_prefix:
        meta["weightbroker.strip_prefix"] = strip_prefix
    if prefix:
        meta["weightbroker.prefix"] = prefix
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "constants.safetensors")
        save_file(extra, path, metadata=meta)
        return _add_to_package(package_path, path)


def compile_package(module, example_inputs, package_path, checkpoint=None, strip_prefix=None,
                    prefix=None, inductor_configs=None, dynamic_shapes=None):
    """Exports and compiles `module` into `package_path` (.pt2) with its
    constants outside the library, then stores the constants file in it.
    Returns a dict of what was found."""
    t0 = time.time()
    ep = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes,
                             strict=False)
    t_export = time.time() - t0
    # Read before compiling: compilation may rewrite the program it is given.
    mutated_by = mutated_buffers_by_source(ep)
    mutated = sorted(set().union(*mutated_by.values()))
    configs = {"aot_inductor.package_constants_in_so": False}
    configs.update(inductor_configs or {})
    t0 = time.time()
    torch._inductor.aoti_compile_and_package(ep, package_path=package_path,
                                             inductor_configs=configs)
    t_compile = time.time() - t0
    ckpt = checkpoint_names(checkpoint) if checkpoint else None
    leased, aliases, extra = plan(module, ckpt, strip_prefix, prefix, ep)
    entry = write_constants(package_path, aliases, extra, strip_prefix, prefix, mutated)
    return {"package": package_path, "entry": entry, "leased": len(leased),
            "aliases": aliases, "extra": sorted(extra), "mutated": mutated,
            "mutated_by": mutated_by, "extra_bytes": sum(t.numel() * t.element_size() for t in extra.values()),
            "export_s": round(t_export, 2), "compile_s": round(t_compile, 2)}


class LogitsOnly(torch.nn.Module):
    """input_ids -> logits of a Hugging Face causal LM (no cache)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    hf = sub.add_parser("hf", help="a Hugging Face causal LM directory (save_pretrained)")
    hf.add_argument("checkpoint")
    hf.add_argument("out")
    hf.add_argument("--device", default="cuda")
    hf.add_argument("--seq-len", type=int, default=16)
    hf.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: "
                    "the checkpoint's)")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM

    kw = {"dtype": getattr(torch, a.dtype)} if a.dtype else {}
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint, **kw).to(a.device).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, a.seq_len), device=a.device)
    with torch.no_grad():
        info = compile_package(LogitsOnly(model), (ids,), a.out, checkpoint=a.checkpoint,
                               strip_prefix="model.")
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
