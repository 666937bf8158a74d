#!/usr/bin/env python3
"""Compiles the test models of the sharing benchmark with AOTInductor.

Two families, each a shared base and two variants that differ in their heads:

* bf16: a backbone of large bias-free Linear layers (synthetic weights,
  --backbone-gib of them) and, per variant, a head of a different shape.
* fp32: a small base (l1) and two heads (l2); variant b transforms its head
  weight at run time, so it is compiled with runtime constant folding.

For every family it writes, into OUT:

  <fam>_base.safetensors          the base weights (state-dict names = FQNs;
                                  bf16: written one tensor at a time through
                                  a pinned buffer, so host memory never
                                  holds the backbone: it may be larger)
  <fam>_head_<v>.safetensors      each variant's head weights
  <fam>_<v>.pt2                   the variant, constants packaged OUTSIDE the
                                  .so (aot_inductor.package_constants_in_so
                                  = False): it binds the leased weights
  <fam>_input.safetensors         input0
  <fam>_<v>_ref.safetensors       output0 of eager PyTorch on that input
  manifest.json                   what was written, with sizes and timings

With --embedded, also bf16_a_embedded.pt2: variant a with its constants
inside the .so, the baseline that loads its own copy.

--variants a compiles (and writes the head of) bf16 variant a only.

Usage: compile_models.py OUT [--family bf16|fp32|all] [--backbone-gib G]
                             [--dim D] [--embedded] [--variants ab|a|b]
"""
import argparse
import json
import os
import sys
import time
import zipfile

import torch
from safetensors.torch import save_file

import safetensors_writer

ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32",
             torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
             torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


class Backbone(torch.nn.Module):
    def __init__(self, dim, layers, dtype=None):
        super().__init__()
        # Made in `dtype` directly: a bf16 backbone first made in fp32
        # would need twice its size in device memory.
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(dim, dim, bias=False, dtype=dtype) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class Bf16Variant(torch.nn.Module):
    def __init__(self, dim, layers, head_out, squash, dtype=None):
        super().__init__()
        self.backbone = Backbone(dim, layers, dtype)
        self.head = torch.nn.Linear(dim, head_out, dtype=dtype)
        self.squash = squash

    def forward(self, x):
        y = self.head(self.backbone(x))
        return torch.tanh(y) if self.squash else y


class Fp32Variant(torch.nn.Module):
    def __init__(self, fold):
        super().__init__()
        self.l1 = torch.nn.Linear(256, 512)
        self.l2 = torch.nn.Linear(512, 128)
        self.fold = fold

    def forward(self, x):
        h = torch.relu(self.l1(x))
        if self.fold:
            # A weight transformed at load time: runtime constant folding
            # builds the transformed copy, private to each container.
            w = (self.l2.weight * 2.0).t().contiguous()
            return h @ w * 0.5 + self.l2.bias
        return self.l2(h)


def split(sd, prefix):
    return {k: v.detach().cpu().contiguous() for k, v in sd.items() if k.startswith(prefix)}


def save_streaming(tensors, path, chunk_bytes=256 << 20):
    """Writes {name: tensor} (on any device) as safetensors, copying at most
    chunk_bytes at a time into one reused host buffer (pinned when a tensor
    is on the GPU): host memory holds one chunk, never the checkpoint."""
    entries, flats = [], []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        entries.append((name, ST_DTYPES[t.dtype], list(t.shape), t.numel() * t.element_size()))
        flats.append(t.reshape(-1).view(torch.uint8))
    size = min(chunk_bytes, max([e[3] for e in entries] + [1]))
    buf = torch.empty(size, dtype=torch.uint8,
                      pin_memory=any(f.is_cuda for f in flats))

    def chunks(i):
        flat = flats[i]
        for off in range(0, flat.numel(), size):
            n = min(size, flat.numel() - off)
            buf[:n].copy_(flat[off:off + n])  # synchronous: buf is free after the write
            yield buf[:n].numpy()
    return safetensors_writer.write(path, entries, chunks)


def compile_variant(model, example, path, in_so, fold=False):
    t = time.time()
    ep = torch.export.export(model, (example,))
    cfg = {"aot_inductor.package_constants_in_so": in_so}
    if fold:
        cfg["aot_inductor.use_runtime_constant_folding"] = True
    torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=cfg)
    with zipfile.ZipFile(path) as z:
        entries = {i.filename: i.file_size for i in z.infolist()}
    return {"path": os.path.basename(path), "seconds": round(time.time() - t, 1),
            "bytes": os.path.getsize(path),
            "entries": sorted(entries.items(), key=lambda e: -e[1])[:40]}


def bf16(out, gib, dim, shared, embedded, manifest, names="ab"):
    layer_bytes = dim * dim * 2
    layers = max(1, int(round(gib * (1 << 30) / layer_bytes)))
    torch.manual_seed(0)
    t = time.time()
    # Synthetic weights, made on the GPU: He-scaled so activations neither
    # vanish nor explode through the ReLU stack.
    variants = {}
    with torch.device("cuda"):
        base = Backbone(dim, layers, torch.bfloat16)
        with torch.no_grad():
            for layer in base.layers:
                layer.weight.normal_(0.0, (2.0 / dim) ** 0.5)
        for name, head_out, squash in (("a", 1024, False), ("b", 512, True)):
            # Both made whichever are written, so that the seeded weights
            # are the same for every --variants (and --only-embedded).
            v = Bf16Variant(dim, 0, head_out, squash, torch.bfloat16)
            v.backbone = base
            with torch.no_grad():
                v.head.weight.normal_(0.0, dim ** -0.5)
                v.head.bias.normal_(0.0, 0.1)
            variants[name] = v.eval()
    x = torch.randn(8, dim, device="cuda", dtype=torch.bfloat16)
    sd = variants["a"].state_dict()
    base_bytes = sum(v.numel() * v.element_size() for k, v in sd.items() if k.startswith("backbone."))
    manifest["bf16"] = {"layers": layers, "dim": dim, "base_bytes": base_bytes,
                        "weights_seconds": round(time.time() - t, 1), "variants": {}}
    if shared:
        save_file({"input0": x.cpu()}, os.path.join(out, "bf16_input.safetensors"))
        t1 = time.time()
        size = save_streaming({k: v for k, v in sd.items() if k.startswith("backbone.")},
                              os.path.join(out, "bf16_base.safetensors"))
        manifest["bf16"]["base_write_seconds"] = round(time.time() - t1, 1)
        print(f"wrote bf16_base.safetensors: {size} bytes in {time.time() - t1:.1f} s", flush=True)
    for name, v in variants.items() if shared else ():
        if name not in names:
            continue
        save_file(split(v.state_dict(), "head."), os.path.join(out, f"bf16_head_{name}.safetensors"))
        with torch.no_grad():
            ref = v(x)
        save_file({"output0": ref.cpu()}, os.path.join(out, f"bf16_{name}_ref.safetensors"))
        info = compile_variant(v, x, os.path.join(out, f"bf16_{name}.pt2"), in_so=False)
        manifest["bf16"]["variants"][name] = info
        print("compiled", info, flush=True)
    if embedded:
        info = compile_variant(variants["a"], x, os.path.join(out, "bf16_a_embedded.pt2"),
                               in_so=True)
        manifest["bf16"]["embedded"] = info
        print("compiled", info, flush=True)


def fp32(out, manifest):
    torch.manual_seed(1)
    models = {"a": Fp32Variant(False).cuda().eval(), "b": Fp32Variant(True).cuda().eval()}
    # One shared base: both variants use variant a's l1.
    models["b"].l1 = models["a"].l1
    x = torch.randn(8, 256, device="cuda")
    save_file({"input0": x.cpu()}, os.path.join(out, "fp32_input.safetensors"))
    save_file(split(models["a"].state_dict(), "l1."), os.path.join(out, "fp32_base.safetensors"))
    manifest["fp32"] = {"variants": {}}
    for name, m in models.items():
        save_file(split(m.state_dict(), "l2."), os.path.join(out, f"fp32_head_{name}.safetensors"))
        with torch.no_grad():
            ref = m(x)
        save_file({"output0": ref.cpu()}, os.path.join(out, f"fp32_{name}_ref.safetensors"))
        info = compile_variant(m, x, os.path.join(out, f"fp32_{name}.pt2"), in_so=False,
                               fold=(name == "b"))
        manifest["fp32"]["variants"][name] = info
        print("compiled", info, flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--family", choices=("bf16", "fp32", "all"), default="all")
    p.add_argument("--backbone-gib", type=float, default=4.25)
    p.add_argument("--dim", type=int, default=8192)
    p.add_argument("--embedded", action="store_true",
                   help="also compile bf16 variant a with its constants inside the .so")
    p.add_argument("--only-embedded", action="store_true",
                   help="compile only that (same seeded weights), e.g. in a second process")
    p.add_argument("--variants", default="ab", choices=("ab", "a", "b"),
                   help="the bf16 variants to write and compile (default both)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    manifest = {"torch": torch.__version__}
    if a.family in ("fp32", "all") and not a.only_embedded:
        fp32(a.out, manifest)
    if a.family in ("bf16", "all"):
        bf16(a.out, a.backbone_gib, a.dim, not a.only_embedded, a.embedded or a.only_embedded,
             manifest, a.variants)
    name = "manifest.json" if a.family == "all" else f"manifest_{a.family}.json"
    if a.only_embedded:
        name = "manifest_embedded.json"
    with open(os.path.join(a.out, name), "w") as f:
        json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
