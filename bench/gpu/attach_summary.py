#!/usr/bin/env python3
"""attach.json from bench/gpu/attach.sh's runs.jsonl: medians per way and
size (wb-aoti-worker runs) and per way and tensor count (wb_bench_attach
runs), the floor and what lies beyond it.

  attach_summary.py RUNS.jsonl OUT.json [--gpu GPU.json]

By size, from the worker's own steps (ms):
  to_first_output_ms = cuda_init + torch_load + connect + lease_and_open
                       + load_local + alloc_local + container + first_run
  floor_ms           = cuda_init + torch_load + library_load (context, libtorch,
                       the model library unpacked and dlopen'd)
  beyond_floor_ms    = to_first_output_ms - floor_ms
  floor_run (wb-aoti-worker --uninit-weights: the same tensors bound to
  uninitialised memory of the worker's own, three inferences):
    floor_run_ms        = to_first_output_ms - alloc_local, the floor with the
                          first inference's own start-up in it
    floor_run_beyond_ms = beyond_floor_ms - alloc_local: what lies beyond
                          the process's own floor when the weights cost
                          nothing (the container and the first inference)
  for the broker way, against the floor_run row of the same size:
    beyond_floor_run_ms = beyond_floor_ms - floor_run_beyond_ms (medians;
                          each process's own context, libtorch and library
                          load are taken out first, so that their spread
                          from process to process, tens of ms, does not
                          count as the attach's)
By tensor count, from wb_bench_attach (no model library, no inference):
  floor_ms = context; beyond_floor_ms = connect + acquire + lookup (the
  broker ways) or local (the file read and copied per tensor).
  beyond_floor_excl_first_run_ms = beyond_floor_ms - first_run (the first
  run's start-up, cuBLAS and lazily loaded kernels, is the same every way)
  first_run_overhead_ms = first_run - median_run, for workers that ran more
  than one inference (the broker ways)
Each figure is the median over the runs of that figure (so the parts need
not add up to the whole). The target, for the broker ways only:
beyond_floor_ms <= 20 (met); for the broker way also beyond_floor_run_ms
<= 20 (met_vs_floor_run; null without a floor_run row)."""
import argparse
import json
import statistics
import sys

TARGET_MS = 20.0
STEPS = ("cuda_init", "torch_load", "connect", "lease_and_open", "load_local", "alloc_local",
         "container", "library_load", "first_run", "median_run")
# Ways whose worker ran more than one inference.
MULTI_RUN = ("broker", "broker_eager", "floor_run")
# The size the issue asks about (~64 GB): 60 GiB = 64.4 GB.
BIG_GIB = 60


def med(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 2) if xs else None


def size_row(runs):
    per = []
    for r in runs:
        ms = r["result"].get("ms", {})
        s = {k: float(ms.get(k) or 0.0) for k in STEPS}
        s["to_first_output_ms"] = (s["cuda_init"] + s["torch_load"] + s["connect"]
                                   + s["lease_and_open"] + s["load_local"] + s["alloc_local"]
                                   + s["container"] + s["first_run"])
        s["floor_ms"] = s["cuda_init"] + s["torch_load"] + s["library_load"]
        s["beyond_floor_ms"] = s["to_first_output_ms"] - s["floor_ms"]
        # The first run's own start-up (cuBLAS, kernels loaded lazily) is
        # paid by every way alike: what is left is the attach itself.
        s["beyond_floor_excl_first_run_ms"] = s["beyond_floor_ms"] - s["first_run"]
        # What the first inference costs over a steady one: the broker ways
        # and floor_run run three inferences, the others one.
        s["first_run_overhead_ms"] = (s["first_run"] - s["median_run"]
                                      if r["kind"] in MULTI_RUN else None)
        if r["kind"] == "floor_run":
            s["floor_run_ms"] = s["to_first_output_ms"] - s["alloc_local"]
            s["floor_run_beyond_ms"] = s["beyond_floor_ms"] - s["alloc_local"]
        s["wall_ms"] = r["wall_ms"]
        per.append(s)
    row = {k: med([p[k] for p in per]) for k in per[0]}
    row["runs"] = len(per)
    row["bound_bytes"] = runs[0]["result"].get("bound_bytes")
    row["constants"] = runs[0]["result"].get("constants")
    row["local_bytes"] = runs[0]["result"].get("local_bytes")
    row["aoti_api"] = runs[0]["result"].get("aoti_api")
    return row


def count_row(runs):
    per = []
    for r in runs:
        ms = r["result"]["ms"]
        beyond = ms["local"] if r["kind"] == "local" else ms["connect"] + ms["acquire"] + ms["lookup"]
        per.append({"context_ms": ms["context"], "connect_ms": ms["connect"],
                    "acquire_ms": ms["acquire"], "lookup_ms": ms["lookup"],
                    "local_ms": ms["local"], "floor_ms": ms["context"],
                    "beyond_floor_ms": beyond, "wall_ms": r["wall_ms"]})
    row = {k: med([p[k] for p in per]) for k in per[0]}
    row["runs"] = len(per)
    row["bytes"] = runs[0]["result"]["bytes"]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs")
    ap.add_argument("out")
    ap.add_argument("--gpu")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.runs) if line.strip()]
    groups = {}
    for r in rows:
        key = (r["what"], r["kind"], r.get("gib", r.get("tensors")))
        groups.setdefault(key, []).append(r)
    by_size, by_count = [], []
    for (what, kind, x), runs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        row = {"kind": kind, **(size_row(runs) if what == "size" else count_row(runs))}
        row["gib" if what == "size" else "tensors"] = x
        if kind in ("broker", "acquire", "lookup", "lookup_many"):
            row["target"] = f"beyond_floor_ms <= {TARGET_MS}"
            row["met"] = row["beyond_floor_ms"] is not None and row["beyond_floor_ms"] <= TARGET_MS
            if "beyond_floor_excl_first_run_ms" in row:
                x = row["beyond_floor_excl_first_run_ms"]
                row["met_excl_first_run"] = x is not None and x <= TARGET_MS
        (by_size if what == "size" else by_count).append(row)
    floors = {r["gib"]: r for r in by_size if r["kind"] == "floor_run"}
    for r in by_size:
        if r["kind"] != "broker":
            continue
        fl = floors.get(r["gib"], {}).get("floor_run_beyond_ms")
        b = (round(r["beyond_floor_ms"] - fl, 2)
             if fl is not None and r["beyond_floor_ms"] is not None else None)
        r["beyond_floor_run_ms"] = b
        r["target_vs_floor_run"] = f"beyond_floor_run_ms <= {TARGET_MS}"
        r["met_vs_floor_run"] = None if b is None else b <= TARGET_MS
    sizes = sorted({r["gib"] for r in by_size})
    note = "medians over runs"
    if not any(g >= BIG_GIB for g in sizes):
        note += f"; ~64 GB ({BIG_GIB} GiB) not measured in this run"
    res = {"by_size": by_size, "by_tensor_count": by_count,
           "sizes_reached_gib": sizes, "note": note}
    if a.gpu:
        with open(a.gpu) as f:
            res["gpu"] = json.load(f)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)

    def f(x):
        return f"{x:9.1f}" if isinstance(x, (int, float)) else f"{'-':>9}"
    def yes(x):
        return "-" if x is None else ("met" if x else "NOT MET")
    print(f"{'size GiB':>8} {'way':12} {'to first':>9} {'floor':>9} {'beyond':>9} "
          f"{'vs f_run':>9} {'1st run':>9} {'1st-med':>9} {'alloc':>9} {'wall':>9} "
          f"target (beyond; beyond - 1st run; vs floor_run)")
    for r in by_size:
        met = "" if "met" not in r else (
            yes(r["met"]) + "; " + yes(r["met_excl_first_run"]) + "; "
            + yes(r.get("met_vs_floor_run")))
        print(f"{r['gib']:8} {r['kind']:12} {f(r['to_first_output_ms'])} {f(r['floor_ms'])} "
              f"{f(r['beyond_floor_ms'])} {f(r.get('beyond_floor_run_ms'))} {f(r['first_run'])} "
              f"{f(r.get('first_run_overhead_ms'))} {f(r['alloc_local'] or None)} "
              f"{f(r['wall_ms'])} {met}")
    print(f"{'tensors':>8} {'way':12} {'context':>9} {'acquire':>9} {'lookup':>9} {'beyond':>9} target")
    for r in by_count:
        met = "" if "met" not in r else ("met" if r["met"] else "NOT MET")
        print(f"{r['tensors']:8} {r['kind']:12} {f(r['context_ms'])} {f(r['acquire_ms'])} "
              f"{f(r['lookup_ms'])} {f(r['beyond_floor_ms'])} {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
