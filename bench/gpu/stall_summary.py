#!/usr/bin/env python3
"""The stall benchmark's figures from the victim's series files
(bench/gpu/stall.sh).

  stall_summary.py OUT.json SERIES.json.gz... [--floor TEXT] [--gpu GPU.json]

For every stream mode and condition: n iterations, p50, p99 and max wall
time in ms, p99_ratio (its p99 over the baseline's p99, same stream mode),
and, for conditions whose name contains "attach" or "broker",
p99_ratio_to_floor: its p99 over the p99 of the bare-context floor with as
many processes (floor_ctx_8 for names ending in _8 or _8_verify,
floor_ctx_1 otherwise), same stream mode. `target` and `met` say which
target applies: broker conditions p99_ratio <= 1.10, attach conditions
p99_ratio_to_floor <= 1.10; the others are shown, not judged.
gpu_p50_ms, gpu_p99_ms, gpu_max_ms: the same of the GPU's time between
events around each iteration's kernels (a stall on the device shows in
both, one on the host, such as a blocked launch, only in the wall time).
excess_ms_per_window is the time the victim lost in one window of the
condition (one repetition): the sum of its iterations' excess over the
baseline's median. A p99 depends on the window's length (a long window of
mostly quiet iterations dilutes it; a floor process's window is shorter than
an attach's), this does not, so both are given. Prints a table.
Percentiles are nearest-rank."""
import argparse
import gzip
import json
import math
import re
import sys

TARGET = 1.10


def pct(sorted_ms, p):
    if not sorted_ms:
        return None
    k = max(0, min(len(sorted_ms) - 1, math.ceil(p / 100.0 * len(sorted_ms)) - 1))
    return sorted_ms[k]


def floor_of(name):
    return "floor_ctx_8" if re.search(r"_8(_verify)?$", name) else "floor_ctx_1"


def summarize(series):
    by, gpu, windows, prev = {}, {}, {}, None
    gpu_ms = series.get("gpu_ms") or [None] * len(series["ms"])
    for ms, g, lab in zip(series["ms"], gpu_ms, series["lab"]):
        name = series["labels"][lab]
        if name != "-":
            by.setdefault(name, []).append(ms)
            if g is not None:
                gpu.setdefault(name, []).append(g)
            if lab != prev:
                windows[name] = windows.get(name, 0) + 1
        prev = lab
    base = sorted(by.get("baseline", []))
    base_p50 = pct(base, 50)
    stats = {}
    for name, v in by.items():
        # The victim's lost time: how much longer its iterations took than
        # the baseline's median, summed over a window. Unlike a percentile it
        # does not depend on how long the window is.
        excess = sum(max(0.0, x - base_p50) for x in v) if base_p50 is not None else None
        v.sort()
        stats[name] = {"n": len(v), "windows": windows[name], "p50_ms": pct(v, 50),
                       "p99_ms": pct(v, 99), "max_ms": v[-1], "mean_ms": round(sum(v) / len(v), 4),
                       "excess_ms_per_window": (round(excess / windows[name], 2)
                                                if excess is not None else None)}
        g = sorted(gpu.get(name, []))
        if g:
            stats[name]["gpu_p50_ms"] = pct(g, 50)
            stats[name]["gpu_p99_ms"] = pct(g, 99)
            stats[name]["gpu_max_ms"] = g[-1]
    return stats


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("series", nargs="+")
    ap.add_argument("--floor", default="")
    ap.add_argument("--gpu")
    a = ap.parse_args()
    conds, victims = [], {}
    for path in a.series:
        with gzip.open(path, "rt") as f:
            s = json.load(f)
        mode = s["stream"]
        victims[mode] = {k: s[k] for k in ("iter_ms", "reps", "gemm", "dtype") if k in s}
        victims[mode]["iterations"] = len(s["ms"])
        st = summarize(s)
        base = st.get("baseline", {}).get("p99_ms")
        for name in s["labels"][1:]:
            if name not in st:
                continue
            c = {"name": name, "stream": mode, **st[name],
                 "p99_ratio": ratio(st[name]["p99_ms"], base)}
            if "attach" in name or "broker" in name:
                fl = floor_of(name)
                c["floor"] = fl
                c["p99_ratio_to_floor"] = ratio(st[name]["p99_ms"], st.get(fl, {}).get("p99_ms"))
            if "broker" in name:
                c["target"] = f"p99_ratio <= {TARGET}"
                c["met"] = c["p99_ratio"] is not None and c["p99_ratio"] <= TARGET
            elif "attach" in name:
                c["target"] = f"p99_ratio_to_floor <= {TARGET}"
                c["met"] = (c["p99_ratio_to_floor"] is not None
                            and c["p99_ratio_to_floor"] <= TARGET)
            conds.append(c)
    res = {"victim": victims, "floor_process": a.floor, "percentiles": "nearest rank",
           "conditions": conds}
    if a.gpu:
        with open(a.gpu) as f:
            res["gpu"] = json.load(f)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"{'stream':12} {'condition':26} {'n':>6} {'p50':>7} {'p99':>7} {'max':>8} "
          f"{'p99/base':>8} {'p99/floor':>9} {'lost/rep':>8} target")
    for c in conds:
        def f(x, w):
            return f"{x:{w}.3f}" if isinstance(x, (int, float)) else f"{'-':>{w}}"
        met = "" if "met" not in c else ("met" if c["met"] else "NOT MET")
        print(f"{c['stream']:12} {c['name']:26} {c['n']:6d} {f(c['p50_ms'], 7)} "
              f"{f(c['p99_ms'], 7)} {f(c['max_ms'], 8)} {f(c['p99_ratio'], 8)} "
              f"{f(c.get('p99_ratio_to_floor'), 9)} {f(c.get('excess_ms_per_window'), 8)} {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
