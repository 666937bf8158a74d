#!/usr/bin/env python3
"""Inputs of tests/gpu/vmm.sh, written on the GPU machine.

  vmm_models.py slabs OUT      t256m, t1g, t4g.safetensors: one U32 tensor
                               each of exactly 256 MiB, 1 GiB and 4 GiB
                               (byte pattern i * 2654435761), for the import
                               timings and the byte check
  vmm_models.py mutated OUT    mut.safetensors (w, count), mut.pt2 compiled
                               with weightbroker.compile from a module whose
                               forward adds 1 to its buffer `count` (the
                               exported program mutates it), mut_input.safetensors

Prints one JSON line of what it wrote."""
import json
import os
import sys
import time

import numpy as np

SIZES = {"t256m": 256 << 20, "t1g": 1 << 30, "t4g": 4 << 30}


def slabs(out):
    from safetensors.numpy import save_file

    t0, made = time.time(), {}
    for name, size in SIZES.items():
        path = os.path.join(out, f"{name}.safetensors")
        if not os.path.exists(path) or os.path.getsize(path) < size:
            a = np.arange(size // 4, dtype=np.uint32)
            a *= np.uint32(2654435761)
            save_file({"data": a}, path)
            del a
        made[name] = size
    print(json.dumps({"slabs": made, "seconds": round(time.time() - t0, 1)}))


def mutated(out):
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
    from safetensors.torch import save_file
    from weightbroker.compile import compile_package

    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))
            self.register_buffer("count", torch.zeros(8))

        def forward(self, x):
            self.count.add_(1.0)
            return x @ self.w + self.count

    torch.manual_seed(3)
    m = Counter().cuda().eval()
    x = torch.randn(4, 8, device="cuda")
    save_file({k: v.detach().cpu().contiguous() for k, v in m.state_dict().items()},
              os.path.join(out, "mut.safetensors"))
    save_file({"input0": x.cpu()}, os.path.join(out, "mut_input.safetensors"))
    info = compile_package(m, (x,), os.path.join(out, "mut.pt2"))
    print(json.dumps({"mutated": info.get("mutated"), "mutated_by": info.get("mutated_by"),
                      "package": info["package"],
                      "compile_s": info["compile_s"]}))


if __name__ == "__main__":
    {"slabs": slabs, "mutated": mutated}[sys.argv[1]](sys.argv[2])
