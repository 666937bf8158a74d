#!/usr/bin/env python3
"""GPU: a Python worker (python/weightbroker) serving an AOTInductor package
on leased CUDA weights, with the measurements tests/gpu/python_worker.sh
records.

  python_worker.py --socket S --base MODEL --head MODEL --pt2 PATH
                   --base-file F --input F --ref F --output F --result JSON

Checks, each recorded in the result JSON (and "failures" lists what failed):
* every leased tensor is a torch view of the lease's memory (data_ptr() ==
  the lease's address, device cuda:N) with the checkpoint's values;
* torch.cuda.memory_allocated and NVML device memory before the leases,
  after the views, after the model was built and after a run: no weight copy;
* the output of the model (torch's own tensor handles) against eager
  PyTorch's, and the same model through the "wb" bridge;
* the leases refuse release while the model lives.
Then prints "ready" and serves until SIGTERM, counting outputs that differ
from the first; at the end releases everything and rewrites the result."""

import argparse
import json
import os
import signal
import sys
import time

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpumem  # noqa: E402

import weightbroker  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    for opt in ("socket", "base", "head", "pt2", "base-file", "input", "ref", "output", "result"):
        p.add_argument("--" + opt, required=True)
    p.add_argument("--tolerance", type=float, default=2e-2)
    a = p.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    failures = []
    res = {"torch": torch.__version__, "pid": os.getpid(), "failures": failures}

    def check(cond, what):
        if not cond:
            failures.append(what)
        return cond

    def write():
        with open(a.result, "w") as f:
            json.dump(res, f, indent=1)

    dev = torch.device("cuda:0")
    torch.zeros(1, device=dev)  # the CUDA context, before anything is measured
    torch.cuda.synchronize(dev)

    def mem(tag):
        torch.cuda.synchronize(dev)
        g = gpumem.nvml(0)
        res.setdefault("memory", {})[tag] = {
            "torch_allocated": torch.cuda.memory_allocated(dev),
            "torch_reserved": torch.cuda.memory_reserved(dev),
            "nvml_used": g["used"],
            "nvml_procs": g["procs"]}

    mem("before")
    t0 = time.monotonic()
    client = weightbroker.connect(a.socket, name="gpu-python-worker")
    base, head = client.lease(a.base), client.lease(a.head)
    res["lease_ms"] = round((time.monotonic() - t0) * 1000, 2)
    res["leases"] = {base.model: base.id, head.model: head.id}

    # Zero-copy views of the leased CUDA memory.
    views, bad_ptr, weight_bytes = {}, [], 0
    for lease in (base, head):
        for name, t in lease.tensors().items():
            info = lease.find(name)
            weight_bytes += info.nbytes
            if t.data_ptr() != info.data or t.device != torch.device("cuda", info.device):
                bad_ptr.append(name)
            views[name] = t
    res["weight_bytes"] = weight_bytes
    res["views"] = len(views)
    check(not bad_ptr, "views not at the lease's addresses: %s" % bad_ptr[:5])
    mem("after_views")
    ckpt = load_file(a.base_file)
    differ = [n for n, t in ckpt.items() if not torch.equal(views[n].cpu(), t)]
    check(not differ, "leased tensors differ from the checkpoint: %s" % differ[:5])
    res["views_checked_against_checkpoint"] = len(ckpt)
    del ckpt, views, t  # so that the release check below meets the model, not a view

    t0 = time.monotonic()
    model = weightbroker.load_aoti(a.pt2, [base, head])
    res["load_aoti_ms"] = round((time.monotonic() - t0) * 1000, 2)
    res["bridge"] = model.bridge
    res["container"] = model.info
    check(model.info["bound_bytes"] == weight_bytes,
          "bound %d bytes, leases hold %d" % (model.info["bound_bytes"], weight_bytes))
    mem("after_model")

    x = load_file(a.input)["input0"].to(dev)
    ref = load_file(a.ref)["output0"].to(dev)
    first = model(x)[0]
    torch.cuda.current_stream(dev).synchronize()
    mem("after_run")
    err = float((first.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))
    res["rel_err_vs_eager"] = err
    res["bitwise_equal_eager"] = bool(torch.equal(first, ref))
    check(err <= a.tolerance, "relative error %.3g over %.3g" % (err, a.tolerance))
    save_file({"output0": first.cpu()}, a.output)

    # On a stream of the caller's (the first run was on the legacy default
    # stream, which the model replaces by a side stream of its own).
    s2 = torch.cuda.Stream(dev)
    with torch.cuda.stream(s2):
        y3 = model(x)[0]
    s2.synchronize()
    res["caller_stream_equal"] = bool(torch.equal(y3, first))
    check(res["caller_stream_equal"], "the run on a caller's stream gave another output")
    del y3

    # The same package through the runtime's own handles ("wb" bridge).
    m2 = weightbroker.load_aoti(a.pt2, [base, head], bridge="wb")
    y2 = m2(x)[0]
    torch.cuda.current_stream(dev).synchronize()
    res["wb_bridge_equal"] = bool(torch.equal(y2, first))
    check(res["wb_bridge_equal"], "the wb bridge gave another output")
    m2.close()
    del y2

    m = res["memory"]
    d_alloc = m["after_model"]["torch_allocated"] - m["before"]["torch_allocated"]
    d_nvml = m["after_model"]["nvml_used"] - m["before"]["nvml_used"]
    res["delta_after_model"] = {"torch_allocated": d_alloc, "nvml_used": d_nvml}
    check(d_alloc < weight_bytes // 100, "torch allocated %d bytes for leases + model" % d_alloc)
    check(d_nvml < weight_bytes // 2, "device memory grew by %d bytes (weights: %d)"
          % (d_nvml, weight_bytes))

    try:
        base.release()
        check(False, "the base lease was released under a live model")
    except weightbroker.BusyError as e:
        res["release_while_model"] = "%s: %s" % (e.name, e.message)
    write()
    print("ready", flush=True)

    runs = mismatches = 0
    y = None
    while not stop:
        y = model(x)[0]
        torch.cuda.current_stream(dev).synchronize()
        runs += 1
        mismatches += not torch.equal(y, first)
        time.sleep(0.005)
    res["served_runs"], res["mismatches"] = runs, mismatches
    check(mismatches == 0, "%d outputs changed while serving" % mismatches)
    del model, first, y
    for lease in (base, head):
        lease.release()
    client.close()
    res["released"] = True
    write()
    print("done failures=%d" % len(failures), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
