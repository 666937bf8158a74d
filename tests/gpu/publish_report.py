#!/usr/bin/env python3
"""The publish test's report (tests/gpu/publish.sh).

  publish_report.py OUT N M0 MPRE MPOST "RC..." [POOL MTRIM]

Reads OUT/trainer.json (the trainer's updates and the baseline),
OUT/publish_events.log (the broker's event=publish_commit lines: the copy's
seconds per version), OUT/w<i>/result.json and OUT/w<i>/output_v<V>.safetensors
(each worker's first output of each version) and OUT/refs/ref_v<V>.safetensors
(eager PyTorch's for that version). Prints the report (JSON); exits 1 when a
correctness check failed: an output off its reference (relative error above
0.02, Frobenius norms in float64), an output changed within a version, a
worker that missed a published version or did not exit 0, more than one
copy's worth of device memory left after the last update (MPOST less
POOL, the bytes the broker's slab pool keeps, against MPRE, within 256 MiB;
and MTRIM, once the pool gave them back, against MPRE). The targets (the broker's copy at >= 0.8 x the plain
device-to-device copy's GB/s, GPU time against GPU time and wall against
wall; publish call to the last worker running the new version within the
copy + 10 ms) are reported in targets_met, for the median update and for
every update, against the trainer's plain copy and against the same copy
from a process whose context was idle until then (idle_*: the trainer's
context has just run, the broker's has not); beside them the broker's
copy in GPU time (events, as the plain copy is timed), the time opening the
producer's handles (sources_cached: found open from the last commit), and
each version's checksums (ready, or dropped when a newer version came
first)."""
import json
import os
import re
import sys

import torch
from safetensors.torch import load_file

TOL = 0.02


def load(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None


def fields(line):
    return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    m0, mpre, mpost = (int(x) for x in sys.argv[3:6])
    rcs = [int(x) for x in sys.argv[6].split()] if len(sys.argv) > 6 and sys.argv[6] else []
    tr = load(os.path.join(out, "trainer.json")) or {"updates": []}
    ups = {u["version"]: u for u in tr["updates"]}
    copies = {}
    sums = {}
    begins = {}
    try:
        for line in open(os.path.join(out, "publish_events.log")):
            f = fields(line)
            if f.get("event") == "publish_commit" and "version" in f:
                s = f.get("copy_seconds") or f.get("seconds")
                copies[int(f["version"])] = {k: v.strip('"') for k, v in f.items()}
                copies[int(f["version"])]["copy_s"] = float(s) if s else None
            if f.get("event") == "publish_begin" and "version" in f:
                begins[int(f["version"])] = float(f.get("alloc_seconds", "nan"))
            if f.get("event") == "publish_checksums" and "version" in f:
                sums.setdefault(int(f["version"]), []).append(
                    {k: v.strip('"') for k, v in f.items() if k in ("state", "seconds", "gbps")})
    except OSError:
        pass
    res = {"workers": n, "updates": len(ups), "versions": sorted(ups), "runs": 0, "failed": 0,
           "mixed": 0, "errors": [], "worker_exit": rcs, "tolerance": TOL}
    refs = {}
    swapped = {v: [] for v in ups}
    use_at = {v: [] for v in ups}
    run_wait = {v: [] for v in ups}
    worst = 0.0
    for i in range(1, n + 1):
        r = load(os.path.join(out, f"w{i}", "result.json"))
        if not r:
            res["failed"] += 1
            res["errors"].append(f"worker {i}: no result")
            continue
        vs = {v["version"]: v for v in r.get("versions", [])}
        res["runs"] += sum(v["runs"] for v in vs.values())
        res["mixed"] += sum(v["changed"] for v in vs.values())
        missing = [v for v in ups if v not in vs]
        if missing:
            res["failed"] += 1
            res["errors"].append(f"worker {i}: never ran versions {missing}")
        for v in vs:
            p = os.path.join(out, f"w{i}", f"output_v{v}.safetensors")
            rp = os.path.join(out, "refs", f"ref_v{v}.safetensors")
            if not os.path.exists(rp):
                if v != 1:
                    res["errors"].append(f"worker {i}: no reference for version {v}")
                continue
            if v not in refs:
                refs[v] = load_file(rp)["output0"].double()
            y = load_file(p)["output0"].double()
            ref = refs[v]
            err = float((y - ref).norm() / ref.norm().clamp_min(1e-30)) \
                if y.shape == ref.shape else float("inf")
            worst = max(worst, err)
            if err > TOL:
                res["failed"] += 1
                res["errors"].append(f"worker {i} version {v}: relative error {err}")
        for s in r.get("swaps", []):
            if s["version"] in swapped:
                swapped[s["version"]].append(s["swapped_at"])
                if s.get("in_use_at"):
                    use_at[s["version"]].append(s["in_use_at"])
                    run_wait[s["version"]].append(s.get("run_wait_ms", 0.0))
    res["max_rel_err"] = worst
    per = []
    for v, u in sorted(ups.items()):
        c = copies.get(v, {})
        copy_s = c.get("copy_s")
        gbps = u["bytes"] / copy_s / 1e9 if copy_s else None
        last = max(swapped[v]) if len(swapped[v]) == n else None
        to_all = (last - u["started_at"]) * 1e3 if last else None
        per.append({"version": v, "bytes": u["bytes"], "publish_ms": round(u["publish_s"] * 1e3, 3),
                    "broker_copy_ms": round(copy_s * 1e3, 3) if copy_s else None,
                    "broker_copy_gbps": round(gbps, 2) if gbps else None,
                    "plain_copy_ms": round(u["plain_copy_s"] * 1e3, 3),
                    "plain_gbps": u["plain_gbps"],
                    "copy_ratio": round(gbps / u["plain_gbps"], 3) if gbps else None,
                    "call_to_all_swapped_ms": round(to_all, 3) if to_all is not None else None,
                    "beyond_copy_ms": round(to_all - copy_s * 1e3, 3)
                    if to_all is not None and copy_s else None})
        # The broker's GPU time of the copy (events, as the plain copy is
        # timed), opening the producer's handles, and the checksums' end.
        gpu_s = float(c["gpu_seconds"]) if c.get("gpu_seconds") else None
        in_use = [s for s in use_at[v]]
        last_use = max(in_use) if len(in_use) == n else None
        to_use = (last_use - u["started_at"]) * 1e3 if last_use else None
        pw = u.get("plain_wall_gbps")
        per[-1].update({
            "plain_wall_gbps": pw,
            "copy_ratio_wall": round(gbps / pw, 3) if gbps and pw else None,
            "call_to_all_in_use_ms": round(to_use, 3) if to_use is not None else None,
            "in_use_beyond_copy_ms": round(to_use - copy_s * 1e3, 3)
            if to_use is not None and copy_s else None,
            "run_wait_ms_max": round(max(run_wait[v]), 3) if run_wait[v] else None,
            "broker_gpu_ms": round(gpu_s * 1e3, 3) if gpu_s else None,
            "device_gpu_seconds": c.get("device_gpu_seconds"),
            "copy_ratio_gpu": round(u["bytes"] / gpu_s / 1e9 / u["plain_gbps"], 3) if gpu_s
            else None,
            "open_ms": round(float(c["open_seconds"]) * 1e3, 3) if c.get("open_seconds") else None,
            "alloc_ms": round(begins[v] * 1e3, 3) if begins.get(v) == begins.get(v) and v in begins
            else None,
            "sources_opened": int(c["sources_opened"]) if c.get("sources_opened") else 0,
            "sources_cached": int(c["sources_cached"]) if c.get("sources_cached") else 0,
            "checksums": [x for x in sums.get(v, []) if x.get("state") != "pending"]})
        # The same plain copy from a process that was idle until then, as
        # the broker's context was (publish_trainer.py --idle-copy).
        ig, iw = u.get("idle_copy_s"), u.get("idle_wall_s")
        ig_gbps = u["bytes"] / ig / 1e9 if ig else None
        iw_gbps = u["bytes"] / iw / 1e9 if iw else None
        per[-1].update({
            "idle_copy_ms": round(ig * 1e3, 3) if ig else None,
            "idle_gbps": round(ig_gbps, 2) if ig_gbps else None,
            "idle_wall_gbps": round(iw_gbps, 2) if iw_gbps else None,
            "copy_ratio_idle_gpu": round(u["bytes"] / gpu_s / 1e9 / ig_gbps, 3)
            if gpu_s and ig_gbps else None,
            "copy_ratio_idle_wall": round(gbps / iw_gbps, 3) if gbps and iw_gbps else None})
    res["per_update"] = per

    def med(k):
        xs = sorted(p[k] for p in per if p[k] is not None)
        return xs[len(xs) // 2] if xs else None

    def worst_of(k, hi=True):
        xs = [p[k] for p in per if p[k] is not None]
        return (max(xs) if hi else min(xs)) if xs else None

    res["summary"] = {"copy_ratio_median": med("copy_ratio"), "copy_ratio_min": worst_of(
        "copy_ratio", hi=False), "broker_copy_gbps_median": med("broker_copy_gbps"),
        "plain_gbps_median": med("plain_gbps"),
        "call_to_all_swapped_ms_median": med("call_to_all_swapped_ms"),
        "beyond_copy_ms_median": med("beyond_copy_ms"), "beyond_copy_ms_max": worst_of(
            "beyond_copy_ms"), "copy_ratio_gpu_median": med("copy_ratio_gpu"),
        "open_ms_median": med("open_ms"), "alloc_ms_median": med("alloc_ms"),
        "copy_ratio_wall_median": med("copy_ratio_wall"),
        "call_to_all_in_use_ms_median": med("call_to_all_in_use_ms"),
        "in_use_beyond_copy_ms_median": med("in_use_beyond_copy_ms"),
        "in_use_beyond_copy_ms_max": worst_of("in_use_beyond_copy_ms"),
        "run_wait_ms_max": worst_of("run_wait_ms_max"),
        "checksums_ready": sum(any(x.get("state") == "ready" for x in p["checksums"])
                               for p in per),
        "checksums_dropped": sum(any(x.get("state") == "dropped" for x in p["checksums"])
                                 for p in per),
        "checksum_gbps": sorted(float(x["gbps"]) for p in per for x in p["checksums"]
                                if x.get("state") == "ready" and x.get("gbps")),
        "broker_gpu_ms_median": med("broker_gpu_ms"), "plain_copy_ms_median": med("plain_copy_ms"),
        "idle_copy_ms_median": med("idle_copy_ms"), "idle_gbps_median": med("idle_gbps"),
        "copy_ratio_idle_gpu_median": med("copy_ratio_idle_gpu"),
        "copy_ratio_idle_wall_median": med("copy_ratio_idle_wall")}
    # The medians' ratio beside the median of the ratios.
    sm0 = res["summary"]
    if sm0["broker_gpu_ms_median"] and sm0["plain_copy_ms_median"]:
        sm0["copy_ratio_gpu_of_medians"] = round(
            sm0["plain_copy_ms_median"] / sm0["broker_gpu_ms_median"], 3)
    if sm0["broker_gpu_ms_median"] and sm0["idle_copy_ms_median"]:
        sm0["copy_ratio_idle_gpu_of_medians"] = round(
            sm0["idle_copy_ms_median"] / sm0["broker_gpu_ms_median"], 3)
    pool = int(sys.argv[7]) if len(sys.argv) > 7 and sys.argv[7] else 0
    mtrim = int(sys.argv[8]) if len(sys.argv) > 8 and sys.argv[8] else None
    res["memory"] = {"idle": m0, "before_first_update": mpre, "after_last_update": mpost,
                     "slab_pool_bytes": pool, "after_pool_trimmed": mtrim,
                     "one_copy": abs(mpost - pool - mpre) <= (256 << 20)
                     and (mtrim is None or abs(mtrim - mpre) <= (256 << 20))}
    res["baseline"] = tr.get("baseline")
    if tr.get("baseline"):
        b = tr["baseline"]
        res["baseline_vs_broker"] = {
            "update_s": b["update_s"], "device_bytes_added": b["device_bytes_added"],
            "broker_extra_bytes_per_update": per[0]["bytes"] if per else None}
    # The copy against the plain copy timed the same way (GPU time against
    # GPU time, wall against wall); the median over the updates, and every
    # update. The swap: from the publish call to the last worker running
    # the new version, within the copy + 10 ms.
    def every(k, ok):
        return bool(per) and all(p[k] is not None and ok(p[k]) for p in per)

    sm = res["summary"]
    res["targets_met"] = {
        "copy_ratio_gpu_median": (sm["copy_ratio_gpu_median"] or 0) >= 0.8,
        "copy_ratio_wall_median": (sm["copy_ratio_wall_median"] or 0) >= 0.8,
        "copy_ratio_gpu_every_update": every("copy_ratio_gpu", lambda x: x >= 0.8),
        "copy_ratio_wall_every_update": every("copy_ratio_wall", lambda x: x >= 0.8),
        "copy_ratio_idle_gpu_median": (sm["copy_ratio_idle_gpu_median"] or 0) >= 0.8,
        "copy_ratio_idle_wall_median": (sm["copy_ratio_idle_wall_median"] or 0) >= 0.8,
        "swap_median": sm["in_use_beyond_copy_ms_median"] is not None
        and sm["in_use_beyond_copy_ms_median"] <= 10,
        "swap_every_update": every("in_use_beyond_copy_ms", lambda x: x <= 10)}
    res["ok"] = (res["failed"] == 0 and res["mixed"] == 0 and res["memory"]["one_copy"]
                 and len(ups) > 0 and all(rc == 0 for rc in rcs) and len(rcs) == n)
    print(json.dumps(res, indent=1))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
