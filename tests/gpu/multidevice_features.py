#!/usr/bin/env python3
"""The checkpoints, checks and report of tests/gpu/multidevice_features.sh.

Each check reads what the script left in a part's directory and prints one
JSON line: the part's figures with "ok" (exit 1 when not ok). DEVICES is a
comma-separated list of broker device ordinals (0, or 0,1).

  multidevice_features.py checkpoints DIR MIB
      A and B as tests/gpu/share.sh writes them: 8 bf16 tensors of MIB MiB
      (seeded), B with 2 of them (layer5, layer7) changed; kept when DIR
      holds them at that size.
  multidevice_features.py peer DEVICES
      torch.cuda.can_device_access_peer between every two of DEVICES.
  multidevice_features.py on-version MODEL VERSION PID...   < LEASES_JSON
      exit 0 when every PID holds MODEL at VERSION, and no other version.
  multidevice_features.py lease-devices DEVICES PID...      < LEASES_JSON
      worker i (the i-th PID) holds leases on DEVICES[i % n] only.
  multidevice_features.py rollout DIR TOLERANCE MODELS DEVICES "RC..."
      the followers' results (DIR/w<i>/result.json, output_v<N>): each
      version's first output against eager PyTorch's (check_outputs.py on
      MODELS/bf16_a_ref_v1 and _v2), the outputs that changed within a
      version (mixed), the swaps (2, then 1 after the rollback), per device.
  multidevice_features.py publish DIR DEVICES PEER_GBPS DEV:RC...
      the broker's event=publish_commit line in DIR/broker.log, the
      trainer's DIR/trainer.json, DIR/peer.json and each device's
      wb_vmm_check verify (its exit status, DIR/verify_<dev>.txt).
  multidevice_features.py share DIR DEVICES DEV:RC...
      DIR/models.json, stats.json, mem.txt ("STAGE DEVICE BYTES" lines)
      and each device's verify of B.
  multidevice_features.py budget DIR DEVICES BUDGET_BYTES NAME:RC...
      the listings DIR/{loaded,third,acquired,acquired_1}.json, stats.json,
      and the acquires' exit statuses (their output in DIR/acquire_NAME.out).
  multidevice_features.py report RES OUT NGPU KEY...
      every part's record in RES (JSON lines) into OUT/multidevice_features.json:
      "ok", "gpus", and per KEY its figures or {"skipped": REASON}; prints a
      summary; exit 1 unless ok. Needs no torch.
"""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHECK_OUTPUTS = os.path.join(HERE, "check_outputs.py")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def devices_of(s):
    return [int(x) for x in s.split(",") if x != ""]


def statuses(pairs):
    """["0:0", "1:3"] -> {0: 0, 1: 3} (keys int when they look it)."""
    out = {}
    for p in pairs:
        k, _, v = p.rpartition(":")
        out[int(k) if k.lstrip("-").isdigit() else k] = int(v) if v.lstrip("-").isdigit() else None
    return out


def emit(res):
    print(json.dumps(res))
    return 0 if res.get("ok") else 1


def last_line(path, prefix):
    try:
        lines = [l.strip() for l in open(path) if l.startswith(prefix)]
    except OSError:
        return None
    return lines[-1] if lines else None


# ---- checkpoints, peers, leases ---------------------------------------------------

def cmd_checkpoints(a):
    d, mib = a.dir, a.mib
    os.makedirs(d, exist_ok=True)
    n = mib * 2**20 // 2
    want = 8 * n * 2
    paths = {k: os.path.join(d, k + ".safetensors") for k in ("a", "b")}
    if all(os.path.exists(p) and want < os.path.getsize(p) < want + 4096 for p in paths.values()):
        print(json.dumps({"a": paths["a"], "b": paths["b"], "tensor_bytes": n * 2, "reused": True}))
        return 0
    import torch
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(7)
    ta = {f"layer{i}.weight": torch.randn(n, generator=g).to(torch.bfloat16) for i in range(8)}
    tb = dict(ta)
    for i in (5, 7):  # the fine-tune changed these
        tb[f"layer{i}.weight"] = torch.randn(n, generator=g).to(torch.bfloat16)
    for k, t in (("a", ta), ("b", tb)):
        save_file(t, paths[k] + ".tmp")
        os.replace(paths[k] + ".tmp", paths[k])
    print(json.dumps({"a": paths["a"], "b": paths["b"], "tensor_bytes": n * 2, "reused": False}))
    return 0


def cmd_peer(a):
    import torch
    devs = devices_of(a.devices)
    res = {"torch": torch.__version__, "devices": torch.cuda.device_count(), "can_access_peer": {}}
    for d in devs:
        for s in devs:
            if d != s and max(d, s) < res["devices"]:
                # Whether device d can reach device s's memory.
                res["can_access_peer"]["%d<-%d" % (d, s)] = bool(
                    torch.cuda.can_device_access_peer(d, s))
    print(json.dumps(res))
    return 0


def cmd_on_version(a):
    leases = json.load(sys.stdin)
    for pid in a.pids:
        vs = {l.get("version") for l in leases if l.get("pid") == pid and l.get("model") == a.model}
        if vs != {a.version}:
            return 1
    return 0


def cmd_lease_devices(a):
    leases = json.load(sys.stdin)
    devs = devices_of(a.devices)
    res = {"workers": [], "ok": True}
    for i, pid in enumerate(a.pids):
        want = devs[i % len(devs)]
        held = sorted({(l.get("model"), l.get("device")) for l in leases if l.get("pid") == pid})
        ok = bool(held) and all(d == want for _, d in held)
        res["workers"].append({"pid": pid, "device": want, "leases": held, "ok": ok})
        res["ok"] = res["ok"] and ok
    return emit(res)


# ---- rollout and rollback -----------------------------------------------------------

def compare(tol, ref, files):
    """check_outputs.py on the files there are: {file: relative error or None}."""
    errs = {f: None for f in files}
    there = [f for f in files if os.path.exists(f)]
    if there:
        p = subprocess.run([sys.executable, CHECK_OUTPUTS, str(tol), ref] + there,
                           capture_output=True, text=True)
        try:
            errs.update(json.loads(p.stdout)["files"])
        except (ValueError, KeyError):
            pass
    return errs


def cmd_rollout(a):
    devs = devices_of(a.devices)
    rcs = [int(x) for x in a.rcs.split()]
    n = len(devs)
    refs = {1: os.path.join(a.models, "bf16_a_ref_v1.safetensors"),
            2: os.path.join(a.models, "bf16_a_ref_v2.safetensors")}
    results = [load(os.path.join(a.dir, "w%d" % i, "result.json")) for i in range(1, n + 1)]
    files = {v: [os.path.join(a.dir, "w%d" % i, "output_v%d.safetensors" % v)
                 for i in range(1, n + 1)] for v in refs}
    errs = {}
    for v, fs in files.items():
        errs.update(compare(a.tolerance, refs[v], fs))
    res = {"tolerance": a.tolerance, "devices": {}, "errors": [], "lease_devices":
           load(os.path.join(a.dir, "lease_devices.json"))}
    for i, (r, dev) in enumerate(zip(results, [devs[k % len(devs)] for k in range(n)]), 1):
        e = res["devices"].setdefault(str(dev), {"workers": 0, "runs": 0, "failed": 0, "mixed": 0,
                                                 "runs_per_version": {}, "rel_err": {},
                                                 "swaps": [], "exit": []})
        e["workers"] += 1
        e["exit"].append(rcs[i - 1] if i - 1 < len(rcs) else None)
        if not r:
            e["failed"] += 1
            res["errors"].append("worker %d (device %d): no result line" % (i, dev))
            continue
        vs = {v["version"]: v for v in r.get("versions", [])}
        e["runs"] += sum(v["runs"] for v in vs.values())
        e["mixed"] += sum(v["changed"] for v in vs.values())
        for v in refs:
            got = vs.get(v)
            e["runs_per_version"][str(v)] = e["runs_per_version"].get(str(v), 0) + (
                got["runs"] if got else 0)
            err = errs.get(files[v][i - 1])
            e["rel_err"].setdefault(str(v), []).append(err)
            if not got or err is None or err > a.tolerance:
                e["failed"] += 1
                res["errors"].append("worker %d (device %d) version %d: %s" % (
                    i, dev, v, "no runs" if not got else "relative error %s" % err))
        for v in set(vs) - set(refs):
            e["failed"] += 1
            res["errors"].append("worker %d (device %d) ran on version %d" % (i, dev, v))
        swaps = [s["version"] for s in r.get("swaps", [])]
        e["swaps"].append(swaps)
        if swaps != [2, 1]:
            e["failed"] += 1
            res["errors"].append("worker %d (device %d): swaps %s, not [2, 1]" % (i, dev, swaps))
    for d, e in res["devices"].items():
        e["ok"] = (e["failed"] == 0 and e["mixed"] == 0 and e["runs"] > 0
                   and all(rc == 0 for rc in e["exit"]))
    res["failed"] = sum(e["failed"] for e in res["devices"].values())
    res["mixed"] = sum(e["mixed"] for e in res["devices"].values())
    res["ok"] = (len(res["devices"]) == len(devs) and all(e["ok"] for e in res["devices"].values())
                 and bool(res["lease_devices"] and res["lease_devices"].get("ok")))
    return emit(res)


# ---- publish ------------------------------------------------------------------------

KV = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def num(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        try:
            return float(v)
        except (TypeError, ValueError):
            return v


def kv_line(line):
    return {k: v[1:-1] if v.startswith('"') else v for k, v in KV.findall(line)}


def cmd_publish(a):
    devs = devices_of(a.devices)
    verify = statuses(a.verify)
    res = {"devices": {}, "errors": [], "source_device": 0}
    tr = load(os.path.join(a.dir, "trainer.json")) or {}
    ups = tr.get("updates", [])
    if len(ups) != 1:
        res["errors"].append("the trainer published %d updates, not 1" % len(ups))
    up = ups[-1] if ups else {}
    res["trainer"] = {k: up.get(k) for k in ("version", "publish_s", "bytes", "plain_copy_s",
                                             "plain_gbps")}
    try:
        commits = [l for l in open(os.path.join(a.dir, "broker.log"))
                   if "event=publish_commit" in l]
    except OSError:
        commits = []
    peer = (load(os.path.join(a.dir, "peer.json")) or {}).get("can_access_peer", {})
    res["can_access_peer"] = peer
    res["peer_gbps_threshold"] = a.peer_gbps
    if not commits:
        res["errors"].append("no event=publish_commit in the broker's log")
        kv = {}
    else:
        kv = kv_line(commits[-1])
        res["commit"] = {k: num(kv.get(k)) for k in ("version", "bytes", "kept_bytes",
                                                    "copy_seconds", "gbps", "gpu_seconds")}
        res["commit"]["device_gpu_seconds"] = kv.get("device_gpu_seconds")
    nbytes = int(kv.get("bytes", 0) or 0)
    per = {}
    for part in (kv.get("device_gpu_seconds") or "").split(","):
        d, _, s = part.partition(":")
        if d.strip().lstrip("-").isdigit():
            per[int(d)] = float(s)
    src = res["source_device"]
    for d in devs:
        s = per.get(d)
        e = {"gpu_seconds": s, "bytes": nbytes,
             "gbps": round(nbytes / s / 1e9, 3) if s and nbytes else None,
             "verify_rc": verify.get(d),
             "verify": last_line(os.path.join(a.dir, "verify_%d.txt" % d), "verified")}
        if d == src:
            e["path"] = "local"
        else:
            # The broker copies with cudaMemcpyPeerAsync and logs no path:
            # the runtime goes device to device where the pair allows it,
            # else through host memory. Judged by the capability and the rate.
            capable = peer.get("%d<-%d" % (d, src))
            if capable is False:
                e["path"] = "staged"
            elif capable and e["gbps"] is not None and e["gbps"] >= a.peer_gbps:
                e["path"] = "peer"
            else:
                e["path"] = "undetermined"
            e["path_basis"] = ("can_access_peer %s, %s GB/s against %s" % (
                capable, e["gbps"], a.peer_gbps))
        if s is None:
            res["errors"].append("device %d: no GPU time in device_gpu_seconds" % d)
        if verify.get(d) != 0:
            res["errors"].append("device %d: the published bytes did not verify (exit %s)"
                                 % (d, verify.get(d)))
        res["devices"][str(d)] = e
    if kv and up and up.get("version") != num(kv.get("version")):
        res["errors"].append("the trainer's version %s is not the commit's %s"
                             % (up.get("version"), kv.get("version")))
    res["ok"] = not res["errors"]
    return emit(res)


# ---- shared tensors -----------------------------------------------------------------

def cmd_share(a):
    devs = devices_of(a.devices)
    verify = statuses(a.verify)
    res = {"devices": {}, "errors": []}
    models = {m["name"]: m for m in load(os.path.join(a.dir, "models.json")) or []}
    st = load(os.path.join(a.dir, "stats.json")) or {}
    mem = {}
    try:
        for line in open(os.path.join(a.dir, "mem.txt")):
            stage, d, b = line.split()
            mem.setdefault(stage, {})[int(d)] = int(b)
    except (OSError, ValueError):
        res["errors"].append("no device memory figures")
    ma, mb = models.get("a"), models.get("b")
    if not ma or not mb:
        res["errors"].append("a or b not listed")
        res["ok"] = False
        return emit(res)
    res["tensor_bytes_each"] = ma["bytes"] // 8
    res["b"] = {k: mb.get(k) for k in ("bytes", "shared_bytes", "unique_bytes", "shared_tensors",
                                       "share")}
    res["stats"] = {k: st.get(k) for k in ("logical_bytes", "unique_bytes",
                                           "shared_tensors_total", "shared_bytes_total",
                                           "share_mismatches")}
    if mb["shared_tensors"] != 6 or mb["shared_bytes"] != 6 * mb["bytes"] // 8:
        res["errors"].append("b shares %s tensors, %s bytes; expected 6 and %d"
                             % (mb["shared_tensors"], mb["shared_bytes"], 6 * mb["bytes"] // 8))

    def copy(m, d):
        return next((c for c in m.get("copies", []) if c.get("device") == d), None)
    for d in devs:
        ca, cb = copy(ma, d), copy(mb, d)
        g = lambda s: mem.get(s, {}).get(d)  # noqa: E731
        e = {"a_slab_bytes": ca and ca.get("slab_bytes"), "b_own_slab_bytes": cb and cb.get("slab_bytes"),
             "device_bytes": {"idle": g("idle"), "broker": g("broker"), "a_loaded": g("a"),
                              "b_loaded": g("b")},
             "verify_rc": verify.get(d),
             "verify": last_line(os.path.join(a.dir, "verify_%d.txt" % d), "verified")}
        la = g("a") - g("broker") if None not in (g("a"), g("broker")) else None
        lb = g("b") - g("a") if None not in (g("b"), g("a")) else None
        e["device_bytes"]["load_a"], e["device_bytes"]["load_b_shared"] = la, lb
        if not ca or not cb or ca.get("state") != "ready" or cb.get("state") != "ready":
            res["errors"].append("device %d: a or b has no ready copy" % d)
        elif not (cb["slab_bytes"] < ca["slab_bytes"] / 2):
            res["errors"].append("device %d: b's own slab %s is not below half a's %s"
                                 % (d, cb["slab_bytes"], ca["slab_bytes"]))
        if la is None or lb is None or not lb < la / 2:
            res["errors"].append("device %d: loading b added %s bytes of device memory, a %s"
                                 % (d, lb, la))
        if verify.get(d) != 0:
            res["errors"].append("device %d: b's bytes did not verify (exit %s)"
                                 % (d, verify.get(d)))
        res["devices"][str(d)] = e
    res["ok"] = not res["errors"]
    return emit(res)


# ---- the memory budget --------------------------------------------------------------

def cmd_budget(a):
    devs = devices_of(a.devices)
    acq = statuses(a.acquires)
    res = {"budget_bytes": a.budget_bytes, "listings": {}, "acquires": {}, "errors": []}
    names0 = ["m0a", "m0b", "m0c"]
    names1 = ["m1a", "m1b"] if 1 in devs else []

    def where(listing):
        out = {}
        for m in listing or []:
            out[m["name"]] = {"tier": m.get("tier"), "state": m.get("state"),
                              "devices": sorted(c.get("device") for c in m.get("copies", [])),
                              "restores": m.get("restores"), "slab_bytes": m.get("slab_bytes")}
        return out

    steps = ["loaded", "third", "acquired"] + (["acquired_1"] if names1 else [])
    ls = {s: where(load(os.path.join(a.dir, s + ".json"))) for s in steps}
    res["listings"] = ls

    def expect(step, name, tier, dev):
        m = ls[step].get(name)
        if not m:
            res["errors"].append("%s: %s not listed" % (step, name))
        elif m["tier"] != tier or m["devices"] != [dev]:
            res["errors"].append("%s: %s is %s on %s; expected %s on [%d]"
                                 % (step, name, m["tier"], m["devices"], tier, dev))

    for n in ["m0a", "m0b"]:
        expect("loaded", n, "device", 0)
    for n in names1:
        for s in steps:  # every device-1 model on its device throughout
            expect(s, n, "device", 1)
    expect("third", "m0a", "host", 0)
    expect("third", "m0b", "device", 0)
    expect("third", "m0c", "device", 0)
    expect("acquired", "m0a", "device", 0)
    on0 = [n for n in names0 if (ls["acquired"].get(n) or {}).get("tier") == "device"]
    if len(on0) != 2:
        res["errors"].append("acquired: %d device-0 models on their device, not 2: %s" % (
            len(on0), on0))
    m0a = ls["acquired"].get("m0a") or {}
    if not m0a.get("restores"):
        res["errors"].append("acquired: m0a has %s restores" % m0a.get("restores"))
    if names1 and ls["acquired_1"]:
        for n in names0:  # the acquire on device 1 moved nothing on device 0
            t0 = (ls["acquired"].get(n) or {}).get("tier")
            t1 = (ls["acquired_1"].get(n) or {}).get("tier")
            if t0 != t1:
                res["errors"].append("acquired_1: %s went from %s to %s" % (n, t0, t1))
    slab = (ls["loaded"].get("m0a") or {}).get("slab_bytes")
    res["slab_bytes"] = slab
    if not slab or not 2 * slab <= a.budget_bytes < 3 * slab:
        res["errors"].append("the budget %d does not hold exactly two slabs of %s bytes"
                             % (a.budget_bytes, slab))
    for name, rc in acq.items():
        out = os.path.join(a.dir, "acquire_%s.out" % name)
        verified = last_line(out, "verified")
        res["acquires"][name] = {"rc": rc, "verified": verified}
        if rc != 0 or not verified:
            res["errors"].append("the acquire of %s exited %s (%s)" % (name, rc, verified))
    st = load(os.path.join(a.dir, "stats.json")) or {}
    res["stats"] = {k: st.get(k) for k in ("moved_to_host", "evicted", "restores", "reloads",
                                           "restore_failures", "host_tier_bytes",
                                           "device_memory_budget")}
    if st.get("restore_failures"):
        res["errors"].append("restore_failures %s" % st.get("restore_failures"))
    res["ok"] = not res["errors"]
    return emit(res)


# ---- the report ---------------------------------------------------------------------

def summary(key, p):
    if "skipped" in p:
        return "skipped: " + p["skipped"]
    s = "ok" if p.get("ok") else "FAIL"
    if not p.get("devices") and not p.get("listings"):
        return s
    if key.startswith("rollout"):
        s += "; " + ", ".join("device %s: %s runs, %s failed, %s mixed" % (
            d, e["runs"], e["failed"], e["mixed"]) for d, e in p.get("devices", {}).items())
    elif key.startswith("publish"):
        s += "; " + ", ".join("device %s: %s GB/s (%s)" % (d, e.get("gbps"), e.get("path"))
                              for d, e in p.get("devices", {}).items())
    elif key.startswith("share"):
        s += "; " + ", ".join("device %s: b's own slab %s, device +%s for b (+%s for a)" % (
            d, e.get("b_own_slab_bytes"), e["device_bytes"].get("load_b_shared"),
            e["device_bytes"].get("load_a")) for d, e in p.get("devices", {}).items())
    elif key.startswith("budget"):
        t = p.get("listings", {}).get("third", {})
        s += "; after the third load: " + ", ".join(
            "%s %s" % (n, m.get("tier")) for n, m in sorted(t.items()))
    return s


def cmd_report(a):
    recs = []
    try:
        for line in open(a.res):
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
    except OSError:
        pass
    doc = {"ok": False, "gpus": a.ngpu}
    failures = [r["failure"] for r in recs if "failure" in r and "part" not in r]
    for r in recs:
        if "info" in r:
            doc.update(r["info"])
    ran = 0
    all_ok = True
    for key in a.keys:
        mine = [r for r in recs if r.get("part") == key]
        skip = next((r["skipped"] for r in mine if "skipped" in r), None)
        if skip is not None:
            doc[key] = {"skipped": skip}
            continue
        ran += 1
        p = next((r["result"] for r in reversed(mine) if isinstance(r.get("result"), dict)), None)
        p = dict(p) if p else {"ok": False, "errors": ["no figures (the part did not finish)"]}
        fails = [r["failure"] for r in mine if "failure" in r]
        p["failures"] = fails
        p["ok"] = bool(p.get("ok")) and not fails
        all_ok = all_ok and p["ok"]
        doc[key] = p
    doc["failures"] = failures
    doc["ok"] = bool(ran and all_ok and not failures)
    with open(os.path.join(a.out, "multidevice_features.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print("%-14s %s" % ("GPUs", a.ngpu))
    for key in a.keys:
        print("%-14s %s" % (key, summary(key, doc[key])))
        for f in doc[key].get("failures", []) + doc[key].get("errors", []):
            print("%-14s   %s" % ("", f))
    for f in failures:
        print("failure: " + f)
    print("%-14s %s" % ("result", "PASS" if doc["ok"] else "FAIL"))
    return 0 if doc["ok"] else 1


def main():
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("checkpoints")
    s.add_argument("dir")
    s.add_argument("mib", type=int)
    s = sub.add_parser("peer")
    s.add_argument("devices")
    s = sub.add_parser("on-version")
    s.add_argument("model")
    s.add_argument("version", type=int)
    s.add_argument("pids", type=int, nargs="+")
    s = sub.add_parser("lease-devices")
    s.add_argument("devices")
    s.add_argument("pids", type=int, nargs="+")
    s = sub.add_parser("rollout")
    s.add_argument("dir")
    s.add_argument("tolerance", type=float)
    s.add_argument("models")
    s.add_argument("devices")
    s.add_argument("rcs")
    s = sub.add_parser("publish")
    s.add_argument("dir")
    s.add_argument("devices")
    s.add_argument("peer_gbps", type=float)
    s.add_argument("verify", nargs="*")
    s = sub.add_parser("share")
    s.add_argument("dir")
    s.add_argument("devices")
    s.add_argument("verify", nargs="*")
    s = sub.add_parser("budget")
    s.add_argument("dir")
    s.add_argument("devices")
    s.add_argument("budget_bytes", type=int)
    s.add_argument("acquires", nargs="*")
    s = sub.add_parser("report")
    s.add_argument("res")
    s.add_argument("out")
    s.add_argument("ngpu", type=int)
    s.add_argument("keys", nargs="+")
    a = p.parse_args()
    return {"checkpoints": cmd_checkpoints, "peer": cmd_peer, "on-version": cmd_on_version,
            "lease-devices": cmd_lease_devices, "rollout": cmd_rollout, "publish": cmd_publish,
            "share": cmd_share, "budget": cmd_budget, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
