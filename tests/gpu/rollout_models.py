#!/usr/bin/env python3
"""The second version of the rollout test's model (tests/gpu/rollout.sh).

  rollout_models.py DIR

DIR holds the bf16 family of examples/compile_models.py (bf16_base,
bf16_head_a, bf16_input, bf16_a_ref, manifest_bf16.json). Writes into DIR:

  bf16_base_v2.safetensors  the base with every backbone weight's rows
                            rolled by one (same names, dtypes and shapes,
                            other values: a new checkpoint of the same
                            model, as a fine-tune step would be)
  bf16_a_ref_v1.safetensors output0 of eager PyTorch, variant a on the
                            original base (computed here, and checked
                            against compile_models.py's bf16_a_ref)
  bf16_a_ref_v2.safetensors the same on the new base

and prints one JSON line: the files, the relative distance between the two
references (they must differ for the test to tell versions apart) and the
check against bf16_a_ref."""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples"))
import compile_models  # noqa: E402


def eager(dim, layers, base, head, x):
    with torch.device("cuda"):
        v = compile_models.Bf16Variant(dim, layers, 1024, False, torch.bfloat16).eval()
    sd = dict(base)
    sd.update(head)
    v.load_state_dict(sd, strict=True)
    with torch.no_grad():
        return v(x)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    d = sys.argv[1]
    name = "manifest_bf16.json"
    if not os.path.exists(os.path.join(d, name)):
        name = "manifest.json"
    man = json.load(open(os.path.join(d, name)))["bf16"]
    dim, layers = man["dim"], man["layers"]
    x = load_file(os.path.join(d, "bf16_input.safetensors"))["input0"].cuda()
    head = load_file(os.path.join(d, "bf16_head_a.safetensors"), device="cuda")
    base = load_file(os.path.join(d, "bf16_base.safetensors"), device="cuda")
    ref1 = eager(dim, layers, base, head, x)
    given = load_file(os.path.join(d, "bf16_a_ref.safetensors"))["output0"].cuda()
    v2 = {k: torch.roll(t, 1, dims=0).contiguous() for k, t in base.items()}
    del base
    size = compile_models.save_streaming(v2, os.path.join(d, "bf16_base_v2.safetensors"))
    ref2 = eager(dim, layers, v2, head, x)
    save_file({"output0": ref1.cpu()}, os.path.join(d, "bf16_a_ref_v1.safetensors"))
    save_file({"output0": ref2.cpu()}, os.path.join(d, "bf16_a_ref_v2.safetensors"))
    out = {"base_v2_bytes": size, "dim": dim, "layers": layers,
           "ref_v1_vs_compile_ref": rel(ref1, given), "ref_v2_vs_v1": rel(ref2, ref1)}
    print(json.dumps(out))
    return 0 if out["ref_v1_vs_compile_ref"] < 1e-2 and out["ref_v2_vs_v1"] > 0.1 else 1


if __name__ == "__main__":
    sys.exit(main())
