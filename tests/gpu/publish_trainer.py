#!/usr/bin/env python3
"""The trainer of the publish test (tests/gpu/publish.sh): a process that
holds a model on the GPU, changes its weights and publishes each update
through the broker while workers serve and follow it.

  publish_trainer.py --socket SOCK --dir DIR --model NAME --updates N --out OUT.json
                     [--refs REFDIR] [--baseline-workers 8]

DIR holds the bf16 family of examples/compile_models.py (bf16_base,
bf16_head_a, bf16_input, manifest_bf16.json). The base's tensors are loaded
into device memory once. Each update changes every backbone weight in place
(its rows rolled by one, copied back into the same storage), then:

  * the eager output of variant a on the input with these weights is saved
    as REFDIR/ref_v<version>.safetensors (the version the publish returns),
  * a plain device-to-device copy of the same bytes into a second buffer
    (torch's copy_: cudaMemcpyAsync), before and after the publish, timed
    with CUDA events and by the wall clock: the baseline of the broker's
    copy, which is timed both ways too; and the same copy right after the
    publish from a second process whose GPU context was idle until then,
    as the broker's was (--idle-copy): under time slices shared with the
    serving processes, a context that has just run is not in the same
    place as one that wakes up to copy,
  * weightbroker.Client.publish(NAME, state_dict) makes the new version;
    its wall time is recorded with the Unix time it started.

Then the baseline of how reinforcement-learning frameworks deliver an
update on one GPU today: --baseline-workers processes (torch.multiprocessing,
spawn) each allocate their own copy of the weights, receive the trainer's
tensors as CUDA IPC handles and copy them into their copy; the time from
sending to the last copy done and the device memory they add (NVML).

Writes OUT.json: {"updates": [{version, started_at, publish_s, bytes,
plain_copy_s, plain_gbps, idle_copy_s, idle_wall_s}], "baseline": {...}}.
"""
import argparse
import json
import os
import sys
import time

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
sys.path.insert(0, HERE)


def nvml_used():
    import gpumem
    try:
        return gpumem.nvml(0)["used"]
    except (OSError, RuntimeError):
        return gpumem.smi(0)["used"]


def eager_output(dim, layers, base, head, x):
    import compile_models
    with torch.device("meta"):
        v = compile_models.Bf16Variant(dim, layers, 1024, False, torch.bfloat16)
    sd = dict(base)
    sd.update(head)
    v.load_state_dict(sd, strict=True, assign=True)
    with torch.no_grad():
        return v.eval()(x)


def plain_copy(src, dst):
    """The same bytes copied device to device by torch's copy_
    (cudaMemcpyAsync): (GPU seconds by CUDA events, wall seconds from
    before the first copy is queued to after the synchronisation)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    w0 = time.perf_counter()
    e0.record()
    for k, v in src.items():
        dst[k].copy_(v)
    e1.record()
    e1.synchronize()
    return (e0.elapsed_time(e1) / 1e3, time.perf_counter() - w0)


def receiver(rank, q, done, shapes):
    import torch as t
    own = {k: t.empty(s, dtype=t.bfloat16, device="cuda") for k, s in shapes.items()}
    t.cuda.synchronize()
    done.put(("ready", rank, 0.0))
    tensors = q.get()
    for k, v in tensors.items():
        own[k].copy_(v)
    t.cuda.synchronize()
    done.put(("copied", rank, time.time()))
    q.get()  # hold until told to exit (the memory is measured meanwhile)


def idle_copier(cmds, res):
    """A second plain copy, from a process whose GPU context is idle between
    updates, as the broker's is: it receives the trainer's tensors as CUDA
    IPC handles, and on each command copies them into a buffer of its own
    (copy_, timed as plain_copy) and answers (GPU seconds, wall seconds)."""
    import torch as t
    src = cmds.get()
    dst = {k: t.empty_like(v) for k, v in src.items()}
    plain_copy(src, dst)  # its workspaces before the memory is measured
    t.cuda.synchronize()
    res.put("ready")
    while cmds.get() is not None:
        res.put(plain_copy(src, dst))


def start_idle_copier(base):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    cmds, res = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=idle_copier, args=(cmds, res))
    p.start()
    cmds.put(base)
    if res.get(timeout=120) != "ready":
        raise SystemExit("the idle copier did not start")
    return p, cmds, res


def baseline(base, n):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    shapes = {k: tuple(v.shape) for k, v in base.items()}
    qs = [ctx.Queue() for _ in range(n)]
    done = ctx.Queue()
    torch.cuda.synchronize()
    before = nvml_used()
    procs = [ctx.Process(target=receiver, args=(i, qs[i], done, shapes)) for i in range(n)]
    for p in procs:
        p.start()
    for _ in range(n):
        done.get()
    ready_mem = nvml_used()
    t0 = time.time()
    for q in qs:
        q.put(base)
    last = max(done.get()[2] for _ in range(n))
    after = nvml_used()
    for q in qs:
        q.put(None)
    for p in procs:
        p.join(60)
    nbytes = sum(v.numel() * v.element_size() for v in base.values())
    return {"workers": n, "bytes_each": nbytes, "update_s": round(last - t0, 4),
            "device_bytes_added": after - before, "device_bytes_before_copy": ready_mem - before,
            "copies": n}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--model", default="base")
    ap.add_argument("--updates", type=int, default=20)
    ap.add_argument("--out", required=True)
    ap.add_argument("--refs", required=True)
    ap.add_argument("--baseline-workers", type=int, default=8)
    ap.add_argument("--go-baseline", help="wait for this file before the baseline")
    ap.add_argument("--go-updates", help="wait for this file before the first update")
    ap.add_argument("--idle-copy", type=int, default=1,
                    help="time the plain copy in an idle process too (1) or not (0)")
    a = ap.parse_args()
    import weightbroker

    d = a.dir
    name = "manifest_bf16.json" if os.path.exists(os.path.join(d, "manifest_bf16.json")) \
        else "manifest.json"
    man = json.load(open(os.path.join(d, name)))["bf16"]
    dim, layers = man["dim"], man["layers"]
    x = load_file(os.path.join(d, "bf16_input.safetensors"))["input0"].cuda()
    head = load_file(os.path.join(d, "bf16_head_a.safetensors"), device="cuda")
    base = load_file(os.path.join(d, "bf16_base.safetensors"), device="cuda")
    nbytes = sum(v.numel() * v.element_size() for v in base.values())
    plain = {k: torch.empty_like(v) for k, v in base.items()}
    client = weightbroker.Client(a.socket, timeout_ms=120000)
    os.makedirs(a.refs, exist_ok=True)
    # Once before "ready", so that the memory measured before the updates
    # holds the workspaces they need (cuBLAS's, the allocator's blocks).
    plain_copy(base, plain)
    eager_output(dim, layers, base, head, x)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    idle, idle_cmds, idle_res = start_idle_copier(base) if a.idle_copy else (None, None, None)
    print("ready", flush=True)
    while a.go_updates and not os.path.exists(a.go_updates):
        time.sleep(0.05)
    ups = []
    for u in range(a.updates):
        with torch.no_grad():
            for v in base.values():
                v.copy_(torch.roll(v, 1, dims=0))  # in place: the same storage
        torch.cuda.synchronize()
        before = plain_copy(base, plain)
        ref = eager_output(dim, layers, base, head, x)
        torch.cuda.synchronize()
        started = time.time()
        version = client.publish(a.model, base)
        publish_s = time.time() - started
        idle_run = None
        if idle:
            idle_cmds.put("copy")
            idle_run = idle_res.get(timeout=60)
        # Timed again right after: the GPU is shared by time slices among
        # the serving processes, so a copy's time depends on when it runs.
        after = plain_copy(base, plain)
        plain_s = (before[0] + after[0]) / 2
        plain_wall_s = (before[1] + after[1]) / 2
        save_file({"output0": ref.cpu()}, os.path.join(a.refs, f"ref_v{version}.safetensors"))
        ups.append({"version": version, "started_at": started, "publish_s": round(publish_s, 6),
                    "bytes": nbytes, "plain_copy_s": round(plain_s, 6),
                    "plain_gbps": round(nbytes / plain_s / 1e9, 2),
                    "plain_wall_s": round(plain_wall_s, 6),
                    "plain_wall_gbps": round(nbytes / plain_wall_s / 1e9, 2),
                    "plain_runs": [before, after]})
        if idle_run:
            ups[-1].update({"idle_copy_s": round(idle_run[0], 6),
                            "idle_wall_s": round(idle_run[1], 6)})
        print(f"published version {version} in {publish_s * 1e3:.1f} ms "
              f"(plain copy {plain_s * 1e3:.2f} ms)", flush=True)
        torch.cuda.empty_cache()  # the roll's scratch: NVML then shows what is held
        time.sleep(0.3)
    res = {"updates": ups}
    print("published all", flush=True)
    while a.go_baseline and not os.path.exists(a.go_baseline):
        time.sleep(0.05)
    del plain
    if idle:
        idle_cmds.put(None)
        idle.join(60)
    torch.cuda.empty_cache()
    if a.baseline_workers:
        res["baseline"] = baseline(base, a.baseline_workers)
    client.close()
    json.dump(res, open(a.out, "w"), indent=1)
    print("done", flush=True)


if __name__ == "__main__":
    main()
