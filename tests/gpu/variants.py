#!/usr/bin/env python3
"""The models, measurements and report of tests/gpu/variants.sh.

  variants.py finetunes DIR
      A small transformer (bf16: 4 blocks of RMSNorm, attention q/k/v/o and
      an MLP, a final norm and a head; 34 tensors, about 219 MiB) with
      synthetic weights, and 8 fine-tunes of it: fine-tune i changes 8 of
      the 34 tensors (a window of the state dict's order starting at 4*i:
      every fine-tune changes a different set, about a quarter of the
      bytes), the others are the base's bytes. Writes DIR/ft<i>.safetensors, DIR/input.safetensors
      (input0), DIR/ref_ft<i>.safetensors (output0 of eager PyTorch with
      fine-tune i's weights) and DIR/model.pt2, compiled ONCE on the base
      with examples/compile_models.py's compile_variant (torch.export, then
      AOTInductor with its constants outside the .so: the package binds
      leased weights by their FQNs). Prints DIR/finetunes.json. Reuses what
      an earlier run wrote for the same shapes and torch.
  variants.py compare TOLERANCE DIR OUT0 ... OUT7
      Each worker output against every fine-tune's eager reference (the
      relative error of check_outputs.py, ||y - ref|| / ||ref|| in float64);
      prints {"tolerance", "rel_err": {ft: err vs its own}, "nearest": {ft:
      the reference closest to its output}, "matrix", "refs_min_distance"}.
  variants.py variant PATH GIB [--layout llama|four]
      A checkpoint of about GIB GiB of random bf16 (written from the GPU
      through save_streaming); kept when PATH already has that layout's size.
      "llama" (the default): shaped as Llama-2-7B with fewer layers (4096
      wide, 11008 in the MLP, embeddings and head of a 32000 vocabulary: 9
      tensors a layer from 8 KiB to 86 MiB, 84 tensors for 4 GiB), as a
      served model is; "four": 4 tensors of a quarter each, the worst case
      for a checksum, which is one sequential chain per tensor.
      Prints {"path", "layout", "bytes", "tensors", "reused"}.
  variants.py peak [--bytes N] [--runs 5]
      The pinned host-to-device peak: a pinned uint8 tensor of N bytes
      (1 GiB) copied to cuda:0 with non_blocking=True and synchronized,
      best of --runs after a warm-up; GB/s are 1e9 bytes per second, as the
      broker's. Prints {"gbps", "runs_gbps", "bytes"}.
  variants.py acquire --socket S --wbctl WBCTL [--samples 3] [--timeout-ms MS]
      Acquire latency through python/weightbroker (the bundled libwbclient)
      on a broker with a memory budget: for each round, one resident
      variant, one in the host tier and one evicted, each picked by its
      tier in `wbctl models --json` right before its sample (one not
      sampled yet where there is one); the time from lease() called to the
      lease held, released at once; then the model's restore figures and
      the stats' restores/reloads (which of the two brought it back). An
      acquire answered WB_EBUSY (libwbclient did not wait) is retried until
      granted or the timeout, for its time, and counts as failed. Prints
      {"samples": [...], "failures": [...]}.
  variants.py report OUT TOLERANCE
      Reads what variants.sh left in OUT (see there) and writes
      OUT/variants.json: "ok", the figures of the three parts
      ("finetunes", "budget", "reused_memory"), "restore_target_met" and
      "load_target_met" (restores and page-cache reloads at >= 0.95 of the
      pinned peak: reported, not part of ok) and "failures". Prints a
      summary; exits 1 unless ok. Needs no torch.
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

# The fine-tunes' model (finetunes, compare).
DIM, HIDDEN, HEADS, LAYERS, OUT_DIM = 1536, 6144, 12, 4, 1024
BATCH, SEQ = 4, 64
N_FT, WINDOW, STRIDE = 8, 8, 4
SEED = 20261202

TARGET = 0.95
VARIANT = re.compile(r"^v\d\d$")
STEADY = ("device", "host", "evicted")


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# ---- the model -------------------------------------------------------------

def build_model_classes():
    import torch

    class RMSNorm(torch.nn.Module):
        def __init__(self, dim, dtype):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(dim, dtype=dtype))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
            return h.to(x.dtype) * self.weight

    class Block(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            lin = lambda i, o: torch.nn.Linear(i, o, bias=False, dtype=dtype)  # noqa: E731
            self.norm1 = RMSNorm(DIM, dtype)
            self.q, self.k, self.v, self.o = (lin(DIM, DIM) for _ in range(4))
            self.norm2 = RMSNorm(DIM, dtype)
            self.up = lin(DIM, HIDDEN)
            self.down = lin(HIDDEN, DIM)

        def forward(self, x):
            b, s, d = x.shape
            h = self.norm1(x)
            q, k, v = (p(h).view(b, s, HEADS, d // HEADS).transpose(1, 2)
                       for p in (self.q, self.k, self.v))
            att = torch.softmax((q @ k.transpose(-2, -1)).float() * (d // HEADS) ** -0.5, dim=-1)
            a = (att.to(x.dtype) @ v).transpose(1, 2).reshape(b, s, d)
            x = x + self.o(a)
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))

    class Net(torch.nn.Module):
        def __init__(self, dtype):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block(dtype) for _ in range(LAYERS))
            self.norm = RMSNorm(DIM, dtype)
            self.head = torch.nn.Linear(DIM, OUT_DIM, bias=False, dtype=dtype)

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    return Net


def finetune_key():
    import torch
    return {"dim": DIM, "hidden": HIDDEN, "heads": HEADS, "layers": LAYERS, "out": OUT_DIM,
            "batch": BATCH, "seq": SEQ, "finetunes": N_FT, "window": WINDOW, "stride": STRIDE,
            "seed": SEED, "torch": torch.__version__}


def cmd_finetunes(a):
    import torch
    from safetensors.torch import save_file
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import compile_models

    d = a.dir
    os.makedirs(d, exist_ok=True)
    man_path = os.path.join(d, "finetunes.json")
    key = finetune_key()
    try:
        man = json.load(open(man_path))
        files = [man["pt2"], man["input"]] + [f["path"] for f in man["finetunes"]] + [
            f["ref"] for f in man["finetunes"]]
        if man.get("key") == key and all(os.path.exists(f) for f in files):
            man["reused"] = True
            print(json.dumps(man))
            return 0
    except (OSError, ValueError, KeyError):
        pass
    t0 = time.time()
    dev = torch.device("cuda")
    torch.manual_seed(SEED)
    g = torch.Generator(device=dev).manual_seed(SEED)
    Net = build_model_classes()
    with torch.device(dev):
        model = Net(torch.bfloat16).eval()
    # Synthetic weights: every tensor random (no two tensors byte-equal, so
    # that only equal tensors of different fine-tunes can be shared); the
    # residual projections scaled down so that the stream stays O(1).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g, device=dev))
            else:
                std = p.shape[1] ** -0.5
                if name.endswith(("o.weight", "down.weight")):
                    std *= (2 * LAYERS) ** -0.5
                p.copy_(std * torch.randn(p.shape, generator=g, device=dev))
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = list(base)
    x = torch.randn(BATCH, SEQ, DIM, generator=g, device=dev).to(torch.bfloat16)
    save_file({"input0": x.cpu()}, os.path.join(d, "input.safetensors"))

    def eager(sd):
        model.load_state_dict(sd, strict=True)
        with torch.no_grad():
            return model(x)

    ref_base = eager(base)
    fts, refs, windows = [], [], set()
    total = sum(t.numel() * t.element_size() for t in base.values())
    for i in range(N_FT):
        changed = [names[(STRIDE * i + j) % len(names)] for j in range(WINDOW)]
        windows.add(tuple(changed))
        gi = torch.Generator(device=dev).manual_seed(SEED + 1 + i)
        sd = dict(base)
        for n in changed:  # a fine-tune step's worth of change, at the tensor's scale
            t = base[n].float()
            sd[n] = (t + t.std() * torch.randn(t.shape, generator=gi, device=dev)).to(
                base[n].dtype)
        path = os.path.join(d, f"ft{i}.safetensors")
        save_file({k: v.cpu().contiguous() for k, v in sd.items()}, path)
        ref = eager(sd)
        refs.append(ref)
        ref_path = os.path.join(d, f"ref_ft{i}.safetensors")
        save_file({"output0": ref.cpu()}, ref_path)
        cb = sum(sd[n].numel() * sd[n].element_size() for n in changed)
        fts.append({"name": f"ft{i}", "path": path, "ref": ref_path, "changed": changed,
                    "changed_tensors": len(changed), "tensors": len(names),
                    "changed_fraction": round(len(changed) / len(names), 4), "bytes": total,
                    "changed_bytes": cb, "changed_bytes_fraction": round(cb / total, 4),
                    "ref_vs_base": rel(ref, ref_base)})
    assert len(windows) == N_FT, "the fine-tunes' changed sets are not all different"
    dist = [rel(refs[i], refs[j]) for i in range(N_FT) for j in range(N_FT) if i != j]
    t1 = time.time()
    model.load_state_dict(base, strict=True)
    pt2 = os.path.join(d, "model.pt2")
    info = compile_models.compile_variant(model, x, pt2, in_so=False)
    man = {"key": key, "pt2": pt2, "input": os.path.join(d, "input.safetensors"),
           "tensors": len(names), "model_bytes": total, "finetunes": fts,
           "refs_min_distance": min(dist), "compile": info,
           "compile_seconds": round(time.time() - t1, 1),
           "seconds": round(time.time() - t0, 1), "reused": False}
    with open(man_path + ".tmp", "w") as f:
        json.dump(man, f, indent=1)
    os.replace(man_path + ".tmp", man_path)
    print(json.dumps(man))
    return 0


def cmd_compare(a):
    from safetensors.torch import load_file
    man = json.load(open(os.path.join(a.dir, "finetunes.json")))
    refs = [load_file(f["ref"])["output0"] for f in man["finetunes"]]
    res = {"tolerance": a.tolerance, "rel_err": {}, "nearest": {}, "matrix": [],
           "refs_min_distance": man.get("refs_min_distance"), "errors": {}}
    for i, path in enumerate(a.outputs):
        name = f"ft{i}"
        try:
            y = load_file(path)["output0"]
        except Exception as e:  # a worker that wrote nothing
            res["errors"][name] = f"{type(e).__name__}: {e}"[:300]
            res["matrix"].append(None)
            continue
        row = [rel(y, r) if y.shape == r.shape else float("inf") for r in refs]
        res["matrix"].append(row)
        res["rel_err"][name] = row[i] if i < len(row) else float("inf")
        res["nearest"][name] = "ft%d" % min(range(len(row)), key=row.__getitem__)
    res["max_rel_err"] = max(res["rel_err"].values()) if res["rel_err"] else None
    print(json.dumps(res))
    ok = (len(res["rel_err"]) == len(a.outputs) and res["max_rel_err"] <= a.tolerance
          and all(res["nearest"][k] == k for k in res["nearest"]))
    return 0 if ok else 1


# ---- the variant checkpoint and the link's peak --------------------------------

def variant_shapes(gib, layout):
    """The (name, shape) of each tensor of a variant checkpoint."""
    target = gib * (1 << 30)
    if layout == "four":
        cols = 16384
        rows = max(1, int(round(target / 4 / (cols * 2))))
        return [("layer%d.weight" % i, (rows, cols)) for i in range(4)]
    h, inter, vocab = 4096, 11008, 32000
    per_layer = 2 * (4 * h * h + 3 * h * inter + 2 * h)
    edges = 2 * (2 * vocab * h + h)
    layers = max(1, int(round((target - edges) / per_layer)))
    shapes = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = "model.layers.%d." % i
        shapes += [(p + "input_layernorm.weight", (h,))]
        shapes += [(p + "self_attn.%s_proj.weight" % x, (h, h)) for x in "qkvo"]
        shapes += [(p + "post_attention_layernorm.weight", (h,))]
        shapes += [(p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                   (p + "mlp.down_proj.weight", (h, inter))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return shapes


def cmd_variant(a):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import compile_models

    shapes = variant_shapes(a.gib, a.layout)
    data = sum(2 * math.prod(s) for _, s in shapes)
    # The file is the header (8 bytes, padded JSON) and the data.
    if os.path.exists(a.path) and data < os.path.getsize(a.path) < data + 8 * 4096:
        print(json.dumps({"path": a.path, "layout": a.layout, "bytes": data,
                          "tensors": len(shapes), "reused": True}))
        return 0
    g = torch.Generator(device="cuda").manual_seed(SEED + 100)
    tensors = {n: torch.randn(s, generator=g, device="cuda").to(torch.bfloat16)
               for n, s in shapes}
    compile_models.save_streaming(tensors, a.path + ".tmp")
    os.replace(a.path + ".tmp", a.path)
    print(json.dumps({"path": a.path, "layout": a.layout, "bytes": data,
                      "tensors": len(shapes), "reused": False}))
    return 0


def cmd_peak(a):
    import torch
    src = torch.empty(a.bytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(7)
    dst = torch.empty(a.bytes, dtype=torch.uint8, device="cuda:0")
    runs = []
    for i in range(a.runs + 1):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        if i:  # the first is a warm-up
            runs.append(a.bytes / (time.perf_counter() - t) / 1e9)
    print(json.dumps({"gbps": round(max(runs), 3), "runs_gbps": [round(r, 3) for r in runs],
                      "bytes": a.bytes, "pinned": bool(src.is_pinned())}))
    return 0


# ---- acquire latency -----------------------------------------------------------

def cmd_acquire(a):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import weightbroker
    try:  # this process's CUDA context, before anything is timed
        import torch
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda:0")
            torch.cuda.synchronize()
    except ImportError:
        pass

    def ctl(*args):
        r = subprocess.run([a.wbctl, "--socket", a.socket] + list(args) + ["--json"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError("wbctl %s exited with %d: %s" % (" ".join(args), r.returncode,
                                                                  r.stderr.strip()[-300:]))
        return json.loads(r.stdout)

    def steady(limit_s=60):
        """The listing once no model is on its way between tiers."""
        until = time.monotonic() + limit_s
        while True:
            ms = ctl("models")
            if all(m["tier"] in STEADY for m in ms) or time.monotonic() > until:
                return ms
            time.sleep(0.05)

    def acquire(client, name):
        t0 = time.perf_counter()
        busy, err, lease = 0, None, None
        while True:
            try:
                lease = client.lease(name)
                break
            except weightbroker.BusyError as e:
                busy += 1
                if time.perf_counter() - t0 > a.timeout_ms / 1e3:
                    err = "still busy after %d ms: %s" % (a.timeout_ms, e)
                    break
                time.sleep(0.005)
            except Exception as e:  # BrokerError and its kinds, or the library's own
                err = "%s: %s" % (type(e).__name__, e)
                break
        took = (time.perf_counter() - t0) * 1e3
        if lease is not None:
            try:
                lease.release()
            except Exception as e:
                err = "release: %s: %s" % (type(e).__name__, e)
        return took, busy, err

    res = {"samples": [], "failures": [], "timeout_ms": a.timeout_ms, "rounds": a.samples}
    sampled = {k: set() for k in STEADY}

    def one_sample(client, rnd, kind):
        listing = steady()
        cands = [m for m in listing if m["tier"] == kind and VARIANT.match(m["name"])]
        if not cands:
            res["failures"].append("round %d: no variant in tier %s (%s)" % (
                rnd, kind, sorted((m["name"], m["tier"]) for m in listing)))
            return
        m = ([c for c in cands if c["name"] not in sampled[kind]] or cands)[0]
        name = m["name"]
        sampled[kind].add(name)
        st0 = ctl("stats")
        took, busy, err = acquire(client, name)
        after = next((x for x in steady() if x["name"] == name), {})
        st1 = ctl("stats")
        d_restores = st1.get("restores", 0) - st0.get("restores", 0)
        d_reloads = st1.get("reloads", 0) - st0.get("reloads", 0)
        res["samples"].append({
            "round": rnd, "kind": kind, "name": name, "ms": round(took, 3),
            "busy_replies": busy, "error": err, "ok": err is None and busy == 0,
            "tier_after": after.get("tier"),
            "restores_before": m.get("restores"), "restores_after": after.get("restores"),
            "last_restore_gbps": after.get("last_restore_gbps"),
            "last_restore_seconds": after.get("last_restore_seconds"),
            "load_gbps": after.get("load_gbps"), "load_seconds": after.get("load_seconds"),
            "bytes": after.get("bytes"),
            "how": "reload" if d_reloads else "restore" if d_restores else "none",
            "stats_restores": d_restores, "stats_reloads": d_reloads,
            "moved_to_host": st1.get("moved_to_host", 0) - st0.get("moved_to_host", 0),
            "evicted": st1.get("evicted", 0) - st0.get("evicted", 0),
            "restore_failures": st1.get("restore_failures")})
        if err is not None:
            res["failures"].append("%s (%s): %s" % (name, kind, err))
        elif busy:
            res["failures"].append("%s (%s): answered WB_EBUSY %d times before the lease "
                                   "(the client did not wait)" % (name, kind, busy))

    client = weightbroker.connect(a.socket, timeout_ms=a.timeout_ms, name="variants-acquire")
    warm = [m["name"] for m in steady() if m["tier"] == "device" and VARIANT.match(m["name"])]
    if warm:  # the first lease of a process maps more than the later ones
        w_ms, w_busy, w_err = acquire(client, warm[-1])
        res["warmup"] = {"name": warm[-1], "ms": round(w_ms, 3), "busy_replies": w_busy,
                         "error": w_err}
    for rnd in range(a.samples):
        for kind in STEADY:
            try:
                one_sample(client, rnd, kind)
            except Exception as e:  # wbctl failed: the next sample may still work
                res["failures"].append("round %d, %s: %s: %s" % (rnd, kind, type(e).__name__, e))
    client.close()
    print(json.dumps(res, indent=1))
    return 0 if not res["failures"] else 1


# ---- the report ------------------------------------------------------------------

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def records(path):
    out = {}
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        for k, v in obj.items():
            out.setdefault(k, []).append(v)
    return out


def model(listing, name):
    for m in listing or []:
        if m.get("name") == name:
            return m
    return None


def ratio(x, peak):
    return round(x / peak, 4) if x is not None and peak else None


def med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def report_finetunes(out, tol, rec, failures):
    man = load(os.path.join(out, "finetunes.json")) or {}
    listing = load(os.path.join(out, "ft_models.json"))
    st = load(os.path.join(out, "ft_stats.json")) or {}
    cmp_ = load(os.path.join(out, "ft_outputs.json")) or {}
    mem = (rec.get("ft_mem") or [{}])[-1]
    rcs = {}
    for r in rec.get("ft_worker", []):
        rcs[r["name"]] = r["rc"]
    names = ["ft%d" % i for i in range(N_FT)]
    if listing is None and not rcs:
        failures.append("finetunes: not run (no models listed, no worker)")
        return {"ok": False, "outputs_match": False, "sharing_halves_memory": False,
                "unique_over_logical": None, "outputs": {"max_rel_err": None},
                "device_memory": {"weights_over_sum_of_sizes": None}}
    models = {}
    for n in names:
        m = model(listing, n)
        if m is None:
            failures.append("finetunes: %s not listed" % n)
            continue
        models[n] = {k: m.get(k) for k in ("state", "bytes", "slab_bytes", "shared_bytes",
                                            "unique_bytes", "shared_tensors", "tensors",
                                            "load_gbps")}
    sum_bytes = sum(m["bytes"] or 0 for m in models.values())
    logical, unique = st.get("logical_bytes"), st.get("unique_bytes")
    dev = None
    if mem.get("loaded") is not None and mem.get("broker") is not None:
        dev = mem["loaded"] - mem["broker"]
    res = {"model_bytes": man.get("model_bytes"), "tensors": man.get("tensors"),
           "changed": {f["name"]: {k: f[k] for k in ("changed_tensors", "changed_fraction",
                                                   "changed_bytes_fraction", "ref_vs_base")}
                       for f in man.get("finetunes", [])},
           "compile_seconds": man.get("compile_seconds"), "reused_compile": man.get("reused"),
           "models": models, "sum_of_sizes": sum_bytes,
           "stats": {"logical_bytes": logical, "unique_bytes": unique,
                     "shared_tensors_total": st.get("shared_tensors_total"),
                     "shared_bytes_total": st.get("shared_bytes_total"),
                     "share_mismatches": st.get("share_mismatches")},
           "unique_over_logical": round(unique / logical, 4) if logical and unique is not None
           else None,
           "device_memory": {"idle": mem.get("idle"), "broker_started": mem.get("broker"),
                             "eight_loaded": mem.get("loaded"), "weights": dev,
                             "weights_over_sum_of_sizes": round(dev / sum_bytes, 4)
                             if dev is not None and sum_bytes else None},
           "outputs": {"tolerance": tol, "rel_err": cmp_.get("rel_err", {}),
                       "nearest": cmp_.get("nearest", {}), "max_rel_err": cmp_.get("max_rel_err"),
                       "refs_min_distance": cmp_.get("refs_min_distance"),
                       "errors": cmp_.get("errors", {})},
           "worker_exit": rcs}
    outs_ok = True
    for n in names:
        e = res["outputs"]["rel_err"].get(n)
        if rcs.get(n) != 0:
            outs_ok = False
            failures.append("finetunes: the worker on %s exited with %s" % (n, rcs.get(n)))
        if e is None or e > tol:
            outs_ok = False
            failures.append("finetunes: %s's output is off eager PyTorch's: %s (tolerance %g)"
                            % (n, e, tol))
        elif res["outputs"]["nearest"].get(n) != n:
            outs_ok = False
            failures.append("finetunes: %s's output is nearest %s's reference"
                            % (n, res["outputs"]["nearest"].get(n)))
    halved = bool(logical and unique is not None and len(models) == N_FT
                  and all(m["state"] == "ready" for m in models.values())
                  and unique < 0.5 * logical)
    if not halved:
        failures.append("finetunes: unique bytes %s not below half the logical %s (models: %d)"
                        % (unique, logical, len(models)))
    res["outputs_match"] = outs_ok
    res["sharing_halves_memory"] = halved
    res["ok"] = outs_ok and halved
    return res


TIER_LINE = re.compile(r"event=model_tier .*\bmodel=(\S+) .*\btier=device from=host .*"
                       r"\bseconds=([0-9.]+) .*\bcopy_seconds=([0-9.]+)")


def restore_splits(log_path):
    """Each restore from the host tier in a broker log, in order: its name,
    its seconds, those of its copy alone, and the rest (the slab's
    allocation and seal), in milliseconds."""
    res = []
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                m = TIER_LINE.search(line)
                if m:
                    sec, copy = float(m.group(2)), float(m.group(3))
                    res.append({"name": m.group(1), "ms": round(sec * 1e3, 2),
                                "copy_ms": round(copy * 1e3, 2),
                                "other_ms": round((sec - copy) * 1e3, 2)})
    except OSError:
        pass
    return res


def count_files(out, pattern):
    n = 0
    while os.path.exists(os.path.join(out, pattern % (n + 1))):
        n += 1
    return n


def report_link(out, peak):
    """The link's own spread in this sitting: copies of the variant's size
    by torch, before the cycles and after the budget's acquires."""
    before, after = (load(os.path.join(out, "link_%s.json" % w)) or {} for w in ("before", "after"))
    every = (before.get("runs_gbps") or []) + (after.get("runs_gbps") or [])
    return {"bytes": before.get("bytes", after.get("bytes")),
            "runs_gbps_before": before.get("runs_gbps"),
            "runs_gbps_after": after.get("runs_gbps"),
            "min_ratio_to_peak": ratio(min(every), peak) if every else None,
            "max_ratio_to_peak": ratio(max(every), peak) if every else None}


def report_cycles(out, peak, failures):
    first = model(load(os.path.join(out, "cycle_first.json")), "v")
    nw = count_files(out, "cycle_wake_%d.json")
    nl = count_files(out, "cycle_load_%d.json")
    wakes = [model(load(os.path.join(out, "cycle_wake_%d.json" % i)), "v")
             for i in range(1, nw + 1)]
    loads = [model(load(os.path.join(out, "cycle_load_%d.json" % i)), "v")
             for i in range(1, nl + 1)]
    if not nw or not nl:
        failures.append("reused memory: %d restores and %d loads listed" % (nw, nl))
    st0 = load(os.path.join(out, "cycle_stats_first.json")) or {}
    st = load(os.path.join(out, "cycle_stats.json")) or {}
    restore = [w.get("last_restore_gbps") if w else None for w in wakes]
    reload_ = [m.get("load_gbps") if m else None for m in loads]
    for i, w in enumerate(wakes, 1):
        if not w or w.get("tier") != "device" or w.get("restores") != i:
            failures.append("reused memory: wake %d: %s" % (i, w and {k: w.get(k) for k in (
                "tier", "restores", "last_restore_gbps")}))
    for i, m in enumerate(loads, 1):
        if not m or m.get("state") != "ready":
            failures.append("reused memory: load %d: %s" % (i, m and m.get("state")))
    if not first:
        failures.append("reused memory: the first load is not listed")
    rr = [ratio(x, peak) for x in restore]
    lr = [ratio(x, peak) for x in reload_]
    res = {"pinned_peak_gbps": peak,
           "restore_gbps": restore,
           "restore_ratio_min": min(rr) if rr and None not in rr else None,
           "restore_ratios": rr,
           "restore_seconds": [w.get("last_restore_seconds") if w else None for w in wakes],
           "restore_splits": restore_splits(os.path.join(out, "broker_cycle.log")),
           "reload_from_page_cache_gbps": reload_,
           "load_ratio_min": min(lr) if lr and None not in lr else None,
           "load_ratios": lr,
           "first_load_gbps": first.get("load_gbps") if first else None,
           "first_load_ratio": ratio(first.get("load_gbps"), peak) if first else None,
           "bytes": first.get("bytes") if first else None,
           "slab_bytes": first.get("slab_bytes") if first else None,
           "slab_pool": {"hits": st.get("slab_pool_hits", 0) - st0.get("slab_pool_hits", 0),
                         "misses": st.get("slab_pool_misses", 0) - st0.get("slab_pool_misses", 0),
                         "misses_at_first_load": st0.get("slab_pool_misses")},
           "restore_failures": st.get("restore_failures")}
    # Each restore and each load after the first took a slab the pool kept.
    res["into_reused_memory"] = bool(nw and nl and res["slab_pool"]["hits"] >= nw + nl)
    if st.get("restore_failures") != 0:
        failures.append("reused memory: restore_failures %s" % st.get("restore_failures"))
    res["ok"] = bool(first) and None not in restore and None not in reload_ and \
        st.get("restore_failures") == 0 and not any(f.startswith("reused memory") for f in failures)
    return res


def report_budget(out, peak, rec, failures):
    loaded = load(os.path.join(out, "budget_models_loaded.json"))
    st_loaded = load(os.path.join(out, "budget_stats_loaded.json")) or {}
    st = load(os.path.join(out, "budget_stats.json")) or {}
    acq = load(os.path.join(out, "acquire.json")) or {}
    budget = dict((rec.get("budget") or [{}])[-1])
    pool = rec.get("budget_slab_pool")
    budget["slab_pool"] = bool(pool[-1]) if pool else None
    variants = [m for m in loaded or [] if VARIANT.match(m.get("name", ""))]
    tiers = {}
    for m in variants:
        tiers[m.get("tier")] = tiers.get(m.get("tier"), 0) + 1
    if len(variants) != 20:
        failures.append("budget: %d of the 20 variants listed" % len(variants))
    samples = acq.get("samples", [])
    per = {}
    for kind in STEADY:
        ss = [s for s in samples if s["kind"] == kind]
        e = {"ms": [s["ms"] for s in ss], "ms_median": med([s["ms"] for s in ss]),
             "ms_max": max([s["ms"] for s in ss]) if ss else None, "samples": len(ss),
             "names": [s["name"] for s in ss]}
        if kind == "host":  # the restores from the host tier (not a reload instead)
            rs = [s for s in ss if s.get("how") == "restore"]
            e["restore_gbps"] = [s["last_restore_gbps"] for s in rs]
            e["restore_seconds"] = [s["last_restore_seconds"] for s in rs]
            e["restore_ratio_to_peak"] = [ratio(x, peak) for x in e["restore_gbps"]]
            e["restore_ratio_min"] = min(e["restore_ratio_to_peak"]) if rs and None not in \
                e["restore_ratio_to_peak"] else None
        if kind == "evicted":  # reloads from the files (in the page cache)
            rs = [s for s in ss if s.get("how") == "reload"]
            e["reload_gbps"] = [s["last_restore_gbps"] for s in rs]
            e["load_gbps"] = [s["load_gbps"] for s in rs]
            e["load_ratio_to_peak"] = [ratio(x, peak) for x in e["load_gbps"]]
        per[kind] = e
        if len(ss) < max(3, acq.get("rounds", 3)):
            failures.append("budget: %d samples of a %s variant" % (len(ss), kind))
        want = {"device": "none", "host": "restore", "evicted": "reload"}[kind]
        for s in ss:
            if s.get("how") != want or s.get("tier_after") != "device":
                failures.append("budget: %s (%s) came back by %s, tier %s after; expected %s"
                                % (s["name"], kind, s.get("how"), s.get("tier_after"), want))
    failures.extend("budget: " + f for f in acq.get("failures", []))
    if not acq:
        failures.append("budget: no acquire samples")
    keys = ("moved_to_host", "evicted", "restores", "reloads", "restore_failures",
            "host_tier_bytes", "device_memory_budget", "host_memory_budget", "logical_bytes",
            "unique_bytes")
    res = {"variant_bytes": budget.get("bytes"), "slab_bytes": budget.get("slab"),
           "device_memory_budget": budget.get("device"), "host_memory_budget": budget.get("host"),
           "slab_pool": budget.get("slab_pool"),
           "pinned_peak_gbps": peak, "tiers_after_loading": tiers,
           "stats_after_loading": {k: st_loaded.get(k) for k in keys},
           "stats": {k: st.get(k) for k in keys},
           "acquire": per, "acquire_failures": acq.get("failures", []) if acq else ["none run"],
           "restore_splits": restore_splits(os.path.join(out, "broker_budget.log")),
           "warmup": acq.get("warmup"), "samples": samples}
    rf = st.get("restore_failures")
    if rf != 0:
        failures.append("budget: restore_failures %s" % rf)
    res["ok"] = bool(acq) and rf == 0 and len(variants) == 20 and \
        not any(f.startswith("budget") for f in failures)
    return res


def cmd_report(a):
    out, tol = a.out, a.tolerance
    rec = records(os.path.join(out, "variants.jsonl"))
    failures = ["script: " + f for f in rec.get("failure", [])]
    peak = (load(os.path.join(out, "pinned_peak.json")) or {}).get("gbps")
    if not peak:
        failures.append("script: no pinned peak measured")
    res = {"gpu": load(os.path.join(out, "gpu.json")),
           "variant_file": load(os.path.join(out, "variant_file.json")),
           "finetunes": report_finetunes(out, tol, rec, failures),
           "budget": report_budget(out, peak, rec, failures),
           "reused_memory": report_cycles(out, peak, failures),
           "link": report_link(out, peak)}
    rm, bu = res["reused_memory"], res["budget"]
    # Every restore from the host tier measured: the cycles' and the budget's.
    host_ratios = [rm["restore_ratio_min"], bu["acquire"]["host"]["restore_ratio_min"]]
    res["restore_target"] = TARGET
    res["restore_target_met"] = bool(None not in host_ratios and min(host_ratios) >= TARGET)
    res["load_target_met"] = bool(rm["load_ratio_min"] is not None and
                                  rm["load_ratio_min"] >= TARGET)
    res["ok"] = bool(res["finetunes"]["ok"] and bu["ok"] and rm["ok"] and
                     not any(f.startswith("script") for f in failures))
    res["failures"] = failures
    with open(os.path.join(out, "variants.json"), "w") as f:
        json.dump(res, f, indent=1)
    ft = res["finetunes"]
    print("finetunes: outputs %s (max rel err %s), unique/logical %s, device weights/sum %s" % (
        "match" if ft["outputs_match"] else "DIFFER", ft["outputs"]["max_rel_err"],
        ft["unique_over_logical"], ft["device_memory"]["weights_over_sum_of_sizes"]))
    print("budget: tiers %s; acquire ms median device %s host %s evicted %s; host restore "
          "ratio min %s" % (bu["tiers_after_loading"], bu["acquire"]["device"]["ms_median"],
                            bu["acquire"]["host"]["ms_median"],
                            bu["acquire"]["evicted"]["ms_median"],
                            bu["acquire"]["host"]["restore_ratio_min"]))
    print("reused memory: peak %s GB/s; restore %s (min ratio %s); page-cache loads %s (min "
          "ratio %s); first load %s" % (peak, rm["restore_gbps"], rm["restore_ratio_min"],
                                        rm["reload_from_page_cache_gbps"], rm["load_ratio_min"],
                                        rm["first_load_gbps"]))
    print("ok %s; restore_target_met %s; load_target_met %s" % (
        res["ok"], res["restore_target_met"], res["load_target_met"]))
    for f in failures:
        print("failure: " + f)
    return 0 if res["ok"] else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("finetunes")
    s.add_argument("dir")
    s = sub.add_parser("compare")
    s.add_argument("tolerance", type=float)
    s.add_argument("dir")
    s.add_argument("outputs", nargs="+")
    s = sub.add_parser("variant")
    s.add_argument("path")
    s.add_argument("gib", type=float)
    s.add_argument("--layout", choices=("llama", "four"), default="llama")
    s = sub.add_parser("peak")
    s.add_argument("--bytes", type=int, default=1 << 30)
    s.add_argument("--runs", type=int, default=5)
    s = sub.add_parser("acquire")
    s.add_argument("--socket", required=True)
    s.add_argument("--wbctl", required=True)
    s.add_argument("--samples", type=int, default=3)
    s.add_argument("--timeout-ms", type=int, default=60000)
    s = sub.add_parser("report")
    s.add_argument("out")
    s.add_argument("tolerance", type=float)
    a = p.parse_args()
    return {"finetunes": cmd_finetunes, "compare": cmd_compare, "variant": cmd_variant,
            "peak": cmd_peak, "acquire": cmd_acquire, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
