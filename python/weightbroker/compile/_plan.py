"""Which of a model's tensors a worker leases, aliases or finds in the
package's constants file. Works on any torch module (no torch.export), so
it also runs on torch releases that cannot compile."""

from ._checkpoint import map_name


def _storage_ptr(t):
    # untyped_storage() is torch >= 2.0's; older releases have storage().
    if hasattr(t, "untyped_storage"):
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()


def _storage_key(t):
    """Two names share a key when they are views of the same bytes: the same
    storage, offset, shape, strides and dtype (tied weights)."""
    return (_storage_ptr(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _named(module, what):
    # Tied duplicates included. remove_duplicate is torch >= 2.0's; the
    # walk over named_modules below is what it does.
    members = getattr(module, "named_" + what)
    try:
        return list(members(remove_duplicate=False))
    except TypeError:
        out = []
        for prefix, m in module.named_modules(remove_duplicate=False):
            for name, t in getattr(m, "_" + what).items():
                if t is not None:
                    out.append((prefix + "." + name if prefix else name, t))
        return out


def model_tensors(module, ep=None):
    """Every named tensor the compiled model may hold as a constant, tied
    duplicates included: parameters, buffers (persistent or not) and the
    exported program's lifted constants."""
    import torch

    named = {}
    for name, t in _named(module, "parameters"):
        named[name] = t
    for name, t in _named(module, "buffers"):
        named[name] = t
    if ep is not None:
        for name, t in ep.constants.items():
            if isinstance(t, torch.Tensor):
                named.setdefault(name, t)
    return named


def plan(module, ckpt, strip_prefix=None, prefix=None, ep=None):
    """Splits the model's tensors into (leased FQNs, aliases, extra
    tensors). `ckpt` is the set of checkpoint names, or None for the
    module's own state dict with tied duplicates removed (what
    save_pretrained keeps). aliases: {FQN: checkpoint name} of the tensors
    in no checkpoint that share storage with one that is; extra: {FQN: CPU
    tensor} of those in no checkpoint and tied to none (non-persistent
    buffers, tensor constants)."""
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
