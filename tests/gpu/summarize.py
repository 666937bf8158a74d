#!/usr/bin/env python3
"""Merges what tests/gpu/run.sh recorded into share.json and prints a table.

  summarize.py RESULTS.jsonl GPU.json SHARE.json N_FAILURES

Memory figures are measured, never computed from model sizes:
* total_used: device used bytes (NVML) with the broker and four bf16 workers
  serving, minus the idle baseline;
* shared_weights and worker_private: per process (NVML's compute processes:
  the broker, which holds the slabs, and the workers) when NVML lists them,
  else the stage deltas (broker loaded minus idle; workers serving minus
  broker loaded); `method` says which;
* without_sharing: the same four workers each loading their own copy
  (--local-weights), minus the baseline before them.
slab_bytes is what the broker reports allocating for the bf16 models."""
import datetime
import json
import os
import statistics
import sys


def load_lines(path):
    out = {}
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        for k, v in obj.items():
            out.setdefault(k, []).append(v)
    return out


def med(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 1) if values else None


def attach_stats(runs):
    runs = [r for r in runs if isinstance(r, dict) and r.get("ok")]
    if not runs:
        return None
    keys = ("attach_total", "connect", "lease_and_open", "load_local", "container", "cuda_init",
            "torch_load", "first_run")
    return dict({k: med([r["ms"].get(k) for r in runs]) for k in keys}, runs=len(runs))


def embedded_on_leases(res, out_dir):
    """The library that embeds its constants, bound to leases: what the
    binding freed, and the worker's memory while serving (NVML)."""
    r = (res.get("embedded_leased") or [None])[0]
    if not isinstance(r, dict):
        return None
    pid = (res.get("embedded_leased_pid") or [None])[0]
    used = None
    gpath = os.path.join(out_dir, "gpu_embedded_leased.json")
    if os.path.exists(gpath):
        procs = json.load(open(gpath)).get("procs", [])
        used = next((p["used"] for p in procs if p["pid"] == pid), None)
    return {"aoti_api": r.get("aoti_api"), "embedded_bytes_freed": r.get("embedded_bytes"),
            "free_seconds": r.get("embedded_free_s"), "worker_used_bytes": used,
            "attach_ms": r.get("ms", {}).get("attach_total")}


def main():
    res, gpu = load_lines(sys.argv[1]), json.load(open(sys.argv[2]))
    share_path, failures = sys.argv[3], int(sys.argv[4])
    mem = (res.get("mem") or [{}])[0]
    unshared = (res.get("mem_unshared") or [{}])[0]
    out_dir = os.path.dirname(share_path)
    mpath = os.path.join(out_dir, "models.json")
    models = json.load(open(mpath)) if os.path.exists(mpath) else []
    slab_bf16 = sum(m.get("slab_bytes", 0) for m in models if m["name"].startswith("bf16"))
    slab_all = sum(m.get("slab_bytes", 0) for m in models)

    sharing_gpu = None
    gpath = os.path.join(os.path.dirname(share_path), "gpu_sharing.json")
    if os.path.exists(gpath):
        sharing_gpu = json.load(open(gpath))
    total = mem["sharing"] - mem["idle"] if "sharing" in mem else None
    method, shared, private = "stage_deltas", None, None
    procs = [p for p in (sharing_gpu or {}).get("procs", []) if p.get("used")]
    if len(procs) >= 5:
        procs.sort(key=lambda p: -p["used"])
        method = "nvml_per_process"
        shared = procs[0]["used"]  # the broker: the only process holding the slabs
        private = sum(p["used"] for p in procs[1:])
    elif total is not None:
        shared = mem["broker"] - mem["idle"]
        private = mem["sharing"] - mem["broker"]
    without = unshared["workers"] - unshared["before"] if "workers" in unshared else None

    workers = [v[0] for k, v in res.items() if k.startswith("bf16_") and v and isinstance(v[0], dict)]
    apis = sorted({w.get("aoti_api", "") for w in workers + [v[0] for k, v in res.items()
                                                             if k.startswith("fp32_")]})
    acc = {k[4:]: v[0]["max_rel_err"] for k, v in res.items() if k.startswith("acc_") and v}
    fp32_b = (res.get("fp32_b") or [{}])[0] or {}
    share = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "gpu": gpu.get("name"),
        "workers": {"bf16_shared": len(workers) + (1 if res.get("reclaim_ms") else 0),
                    "fp32_shared": len([k for k in res if k in ("fp32_a", "fp32_b")]),
                    "bf16_unshared": len([k for k in res if k.startswith("local_")])},
        "variants": ["bf16_a", "bf16_b", "fp32_a", "fp32_b (runtime constant folding)"],
        "max_rel_err": {
            "fp32": max([acc[k] for k in acc if k.startswith("fp32")], default=None),
            "bf16": max([acc[k] for k in acc if k.startswith("bf16")], default=None),
            "all": acc,
            "measure": "||y - ref|| / ||ref|| against eager PyTorch, float64",
        },
        "aoti_api": apis,
        "device_bytes": {
            "shared_weights": shared,
            "worker_private": private,
            "total_used": total,
            "without_sharing": without,
            "slab_bytes_bf16": slab_bf16,
            "slab_bytes_all_models": slab_all,
            "per_worker_private": private // 4 if private is not None else None,
            "method": method,
            "nvml_procs_sharing": procs,
        },
        "attach_ms": {
            "leased": attach_stats(res.get("attach_shared", [])),
            "embedded_constants": attach_stats(res.get("attach_embedded", [])),
            "local_weights": attach_stats(res.get("local_a1", []) + res.get("local_a2", []) +
                                          res.get("local_b1", []) + res.get("local_b2", [])),
        },
        "folded_bytes_fp32_b": fp32_b.get("folded_bytes"),
        "embedded_library_on_leases": embedded_on_leases(res, out_dir),
        "verify_ms_bf16_a_leases": ((res.get("bf16_a1") or [{}])[0] or {}).get("ms", {}).get("verify"),
        "reclaim_ms_after_sigkill": (res.get("reclaim_ms") or [None])[0],
        "failures": failures,
    }
    d = share["device_bytes"]
    checks = {}
    if None not in (shared, private, total):
        checks["total_within_5pct_of_shared_plus_private"] = abs(total - (shared + private)) <= 0.05 * (shared + private)
    if None not in (total, without):
        checks["total_at_most_half_of_without_sharing"] = total <= 0.5 * without
        checks["ratio_total_to_without_sharing"] = round(total / without, 3)
    share["checks"] = checks
    with open(share_path, "w") as f:
        json.dump(share, f, indent=1)

    gib = lambda b: "-" if b is None else "%.2f GiB" % (b / (1 << 30))
    ms = lambda s, k: "-" if not s or s.get(k) is None else "%.0f ms" % s[k]
    a = share["attach_ms"]
    rows = [
        ("GPU", share["gpu"]),
        ("AOTI API", ", ".join(apis)),
        ("max rel err fp32 / bf16", "%s / %s" % (share["max_rel_err"]["fp32"], share["max_rel_err"]["bf16"])),
        ("shared weights (broker)", gib(d["shared_weights"])),
        ("  of which slabs (bf16)", gib(slab_bf16)),
        ("worker private (4 bf16)", gib(d["worker_private"])),
        ("total used, sharing", gib(d["total_used"])),
        ("total used, no sharing", gib(d["without_sharing"])),
        ("memory method", method),
        ("attach, leased (median)", ms(a["leased"], "attach_total")),
        ("attach, embedded constants", ms(a["embedded_constants"], "attach_total")),
        ("attach, own copy from file", ms(a["local_weights"], "attach_total")),
        ("lease reclaim after SIGKILL", "%s ms" % share["reclaim_ms_after_sigkill"]),
        ("checks", json.dumps(checks)),
        ("failures", str(failures)),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    for k, v in rows:
        print("%-*s  %s" % (width, k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
