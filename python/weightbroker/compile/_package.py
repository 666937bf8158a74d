"""Export, compile with the constants outside the library, and store what
the checkpoint lacks in the package."""

import time

from ._checkpoint import checkpoint_names
from ._constants import write_constants
from ._mutated import mutated_buffers_by_source
from ._plan import plan


_NEEDS = ("weightbroker.compile needs PyTorch with torch.export and AOTInductor's "
          "aoti_compile_and_package (tested with torch 2.11)")


class TorchUnsupportedError(RuntimeError):
    """The torch in this process cannot export or AOT-compile a model."""


def require_torch():
    """The torch module, when it has torch.export and
    torch._inductor.aoti_compile_and_package; else TorchUnsupportedError
    saying what is missing."""
    try:
        import torch
    except ImportError as e:
        raise TorchUnsupportedError("torch cannot be imported (%s): %s" % (e, _NEEDS)) from None
    missing = []
    try:
        import torch.export
        if not hasattr(torch.export, "export"):
            missing.append("torch.export.export")
    except ImportError:
        missing.append("torch.export")
    try:
        import torch._inductor
        if not hasattr(torch._inductor, "aoti_compile_and_package"):
            missing.append("torch._inductor.aoti_compile_and_package")
    except ImportError:
        missing.append("torch._inductor")
    if missing:
        raise TorchUnsupportedError("torch %s (%s) has no %s: %s" % (
            torch.__version__, torch.__file__, " and no ".join(missing), _NEEDS))
    return torch


def dynamic_spec(example_inputs, dynamic_batch=False, dynamic_seq=False, make_dim=None):
    """The dynamic_shapes of torch.export for `example_inputs`: dimension 0
    of every tensor input is the batch (`dynamic_batch`), dimension 1 of
    every tensor input of two or more dimensions the sequence
    (`dynamic_seq`). make_dim(name) makes one dimension (default: the
    torch.export.Dim hint DYNAMIC, whose range export infers and which it
    refuses to specialise; a named Dim on releases without it). A dynamic
    dimension needs an example of at least 2: export specialises sizes 0
    and 1. None when neither is asked."""
    if not dynamic_batch and not dynamic_seq:
        return None
    if make_dim is None:
        make_dim = _default_dim
    spec = []
    for i, x in enumerate(example_inputs):
        shape = getattr(x, "shape", None)
        if shape is None:
            spec.append(None)
            continue
        dims = {}
        for want, axis, what in ((dynamic_batch, 0, "batch"), (dynamic_seq, 1, "seq")):
            if not want or len(shape) <= axis:
                continue
            if int(shape[axis]) < 2:
                raise ValueError(
                    "example input %d has %s size %d (shape %s): a dynamic dimension needs an "
                    "example of at least 2, since export specialises sizes 0 and 1"
                    % (i, what, int(shape[axis]), list(shape)))
            dims[axis] = make_dim(what)
        spec.append(dims or None)
    if not any(spec):
        raise ValueError("no example input has a dimension to make dynamic")
    return tuple(spec)


def _default_dim(name):
    from torch.export import Dim

    hint = getattr(Dim, "DYNAMIC", None)
    return hint if hint is not None else Dim(name)


def _input_ranges(ep):
    """{"<input index>": {"<dimension>": "lower..upper"}} of the exported
    program's symbolic input dimensions: the sizes the compiled model
    accepts."""
    out = {}
    try:
        nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
        for i, name in enumerate(ep.graph_signature.user_inputs):
            val = nodes[name].meta.get("val") if name in nodes else None
            for d, size in enumerate(getattr(val, "shape", ())):
                expr = getattr(getattr(size, "node", None), "expr", None)
                if expr is None:
                    continue
                r = ep.range_constraints.get(expr)
                out.setdefault(str(i), {})[str(d)] = (
                    "%s..%s" % (r.lower, r.upper) if r is not None else str(expr))
    except Exception as e:  # a report, never a reason to fail the compile
        return {"error": str(e)[:200]}
    return out


def compile_package(module, example_inputs, package_path, checkpoint=None, strip_prefix=None,
                    prefix=None, inductor_configs=None, dynamic_shapes=None, *,
                    dynamic_batch=False, dynamic_seq=False):
    """Exports and compiles `module` (any torch.nn.Module, in eval mode and
    under torch.no_grad() as a rule) on `example_inputs` into `package_path`
    (.pt2) with its constants outside the library
    (aot_inductor.package_constants_in_so = False), then stores in it the
    constants file: what `checkpoint` (a safetensors file, a directory, or
    an index; default: the module's own state dict) lacks. strip_prefix /
    prefix map the module's FQNs to checkpoint names (a wrapper's "model.").
    dynamic_batch / dynamic_seq make dimension 0 / 1 of the inputs dynamic
    (see dynamic_spec); dynamic_shapes is torch.export's own argument, for
    anything else (not together with those). Returns a dict of what was
    found and how long each step took."""
    if dynamic_shapes is not None and (dynamic_batch or dynamic_seq):
        raise ValueError("give dynamic_shapes or dynamic_batch/dynamic_seq, not both")
    torch = require_torch()
    example_inputs = tuple(example_inputs)
    if dynamic_shapes is None:
        dynamic_shapes = dynamic_spec(example_inputs, dynamic_batch, dynamic_seq)
    # Read before compiling: a missing file is better found before a
    # compile of a minute.
    ckpt = checkpoint_names(checkpoint) if checkpoint else None
    t0 = time.time()
    ep = torch.export.export(module, example_inputs, dynamic_shapes=dynamic_shapes,
                             strict=False)
    t_export = time.time() - t0
    # Read before compiling: compilation may rewrite the program it is given.
    mutated_by = mutated_buffers_by_source(ep)
    mutated = sorted(set().union(*mutated_by.values()))
    ranges = _input_ranges(ep) if dynamic_shapes is not None else {}
    configs = {"aot_inductor.package_constants_in_so": False}
    configs.update(inductor_configs or {})
    t0 = time.time()
    torch._inductor.aoti_compile_and_package(ep, package_path=package_path,
                                             inductor_configs=configs)
    t_compile = time.time() - t0
    leased, aliases, extra = plan(module, ckpt, strip_prefix, prefix, ep)
    entry = write_constants(package_path, aliases, extra, strip_prefix, prefix, mutated)
    return {"package": package_path, "entry": entry, "leased": len(leased),
            "aliases": aliases, "extra": sorted(extra), "mutated": mutated,
            "mutated_by": mutated_by,
            "extra_bytes": sum(t.numel() * t.element_size() for t in extra.values()),
            "dynamic": ranges,
            "export_s": round(t_export, 2), "compile_s": round(t_compile, 2)}
