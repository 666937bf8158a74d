#!/usr/bin/env python3
"""Plots of the GPU evidence benchmarks, from the files bench/gpu/stall.sh,
memory.sh and attach.sh write.

  bench/plot.py DIR... [--out OUTDIR]

Reads, from each DIR, whichever of these are there: stall.json with
stall_series_{legacy,nonblocking}.json.gz, memory.json, attach.json (and
attach_60gib.json when there); writes
into OUTDIR (default: bench/) stall.png (the victim's iteration times over
the run, coloured by condition, one panel per stream mode, and the p99
ratios), memory.png (device memory against the number of workers, with and
without sharing) and attach.png (process start to first output by size).
Needs matplotlib (python3-matplotlib); nothing else in the project does."""
import argparse
import gzip
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
except ImportError:
    sys.exit("bench/plot.py needs matplotlib (apt-get install python3-matplotlib)")

GIB = float(1 << 30)


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def plot_stall(d, out):
    summary = load(os.path.join(d, "stall.json"))
    modes = [m for m in ("legacy", "nonblocking")
             if os.path.exists(os.path.join(d, f"stall_series_{m}.json.gz"))]
    fig, axes = plt.subplots(len(modes) + 1, 1, figsize=(13, 4 * (len(modes) + 1)))
    names = []
    for c in summary["conditions"]:
        if c["name"] not in names:
            names.append(c["name"])
    cmap = plt.get_cmap("tab20")
    colour = {n: cmap(i % 20) for i, n in enumerate(names)}
    for ax, mode in zip(axes, modes):
        s = load(os.path.join(d, f"stall_series_{mode}.json.gz"))
        for li, name in enumerate(s["labels"]):
            idx = [i for i, lab in enumerate(s["lab"]) if lab == li]
            if not idx:
                continue
            ax.scatter([s["t"][i] for i in idx], [s["ms"][i] for i in idx], s=2,
                       color="0.75" if name == "-" else colour.get(name, "k"),
                       label=None if name == "-" else name, rasterized=True)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_ylabel("iteration wall time (ms)")
        ax.set_xlabel("time since the victim started (s)")
        what = (f"{s.get('reps')} x {s.get('dtype')} matmul {s.get('gemm')}" if s.get("gemm")
                else "dry run (sleeps)")
        ax.set_title(f"victim on the {mode} stream: {what}, "
                     f"{s.get('iter_ms', 0):.2f} ms median alone")
        ax.legend(loc="upper left", fontsize=7, markerscale=4, ncol=3)
        ax.grid(True, which="both", alpha=0.3)
    ax = axes[-1]
    names = [n for n in names if n != "baseline"]
    width = 0.8 / max(1, len(modes))
    for k, mode in enumerate(modes):
        cs = [c for c in summary["conditions"] if c["stream"] == mode and c["name"] != "baseline"]
        xs = [names.index(c["name"]) + k * width for c in cs]
        ax.bar(xs, [c["p99_ratio"] or 0 for c in cs], width, label=f"{mode}: p99 / baseline p99")
        fl = [(x, c["p99_ratio_to_floor"]) for x, c in zip(xs, cs)
              if c.get("p99_ratio_to_floor") is not None]
        ax.scatter([x for x, _ in fl], [v for _, v in fl], marker="D", zorder=3,
                   label=f"{mode}: p99 / floor p99 (same process count)")
    ax.axhline(1.10, color="r", lw=1, ls="--", label="target 1.10")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))])
    ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("p99 ratio (log scale)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "stall.png"), dpi=110)
    plt.close(fig)
    return "stall.png"


def plot_memory(d, out):
    m = load(os.path.join(d, "memory.json"))
    pts = m["points"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (("sharing", "sharing (broker + workers on leases)"),
                       ("own", "each worker its own copy")):
        xy = [(p["n"], p[key] / GIB) for p in pts if p.get(key) is not None]
        if xy:
            ax.plot([x for x, _ in xy], [y for _, y in xy], "o-", label=label)
    ax.set_xlabel("workers")
    ax.set_ylabel("device memory above idle (GiB, NVML)")
    ax.set_xticks([p["n"] for p in pts])
    ax.set_title(f"{m.get('model', '')}: base {m.get('base_bytes', 0) / GIB:.2f} GiB", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "memory.png"), dpi=110)
    plt.close(fig)
    return "memory.png"


def plot_attach(d, out):
    a = load(os.path.join(d, "attach.json"))
    rows = list(a["by_size"])
    # The largest size is measured by its own run (attach_60gib.json).
    big = os.path.join(d, "attach_60gib.json")
    if os.path.exists(big):
        rows += load(big)["by_size"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind in sorted({r["kind"] for r in rows}):
        xy = [(r["gib"], r["to_first_output_ms"]) for r in rows if r["kind"] == kind]
        ax.plot([x for x, _ in xy], [y for _, y in xy], "o-", label=f"{kind}: to first output")
    fl = sorted((r["gib"], r["floor_ms"]) for r in rows if r["kind"] == "broker")
    if fl:
        ax.plot([x for x, _ in fl], [y for _, y in fl], "k--", label="floor (context + libraries)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model size (GiB)")
    ax.set_ylabel("ms from process start")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "attach.png"), dpi=110)
    plt.close(fig)
    return "attach.png"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    made = []
    for d in a.dirs:
        for name, fn in (("stall.json", plot_stall), ("memory.json", plot_memory),
                         ("attach.json", plot_attach)):
            if os.path.exists(os.path.join(d, name)):
                p = fn(d, a.out)
                if p:
                    made.append(os.path.join(a.out, p))
    if not made:
        sys.exit(f"nothing to plot in {' '.join(a.dirs)}")
    print("\n".join(made))
    return 0


if __name__ == "__main__":
    sys.exit(main())
