#!/usr/bin/env python3
"""Compares worker outputs with eager PyTorch's.

  check_outputs.py TOLERANCE REF OUT [OUT ...]

Prints one JSON line {"max_rel_err", "files": {OUT: rel_err}} and exits 1
when any relative error exceeds TOLERANCE. The relative error of an output
is ||y - ref|| / ||ref|| (Frobenius norms, computed in float64), the usual
measure for low-precision matrix products: one element's error relative to
a near-zero reference value says little about bf16 accuracy."""
import json
import sys

import torch
from safetensors.torch import load_file


def main():
    tol, ref_path, outs = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
    ref = load_file(ref_path)["output0"].double()
    errs = {}
    for path in outs:
        y = load_file(path)["output0"].double()
        if y.shape != ref.shape:
            errs[path] = float("inf")
            continue
        errs[path] = float((y - ref).norm() / ref.norm().clamp_min(1e-30))
    worst = max(errs.values()) if errs else float("inf")
    print(json.dumps({"max_rel_err": worst, "tolerance": tol, "files": errs}))
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
