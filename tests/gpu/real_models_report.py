#!/usr/bin/env python3
"""The report of tests/gpu/real_models.sh: judges every case from the
workers' logs and outputs, writes the JSON results and prints a table.

  real_models_report.py WORK OUT.json

A case that must serve passes when both workers exited 0 after serving,
their outputs are within its tolerance of eager PyTorch's (relative L2
error, as tests/gpu/check_outputs.py measures it) and no served run
differed from the first. A case that must be refused passes when its worker
exited 1 (wb-aoti-worker's failure status) without attaching or writing an
output, and its error says WB_ENOTFOUND and names every buffer expected.
A case whose build failed, or that was skipped at the deadline, fails.
Exit status 0 only when every case passed and the compile was complete."""
import json
import os
import sys

from safetensors.torch import load_file


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def exit_status(logs, tag):
    text = read(os.path.join(logs, f"{tag}.rc")).strip()
    return int(text) if text.lstrip("-").isdigit() else None


def result_line(out):
    lines = [line for line in out.splitlines() if line.startswith("result ")]
    try:
        return json.loads(lines[-1][7:]) if lines else {"ok": False}
    except ValueError:
        return {"ok": False}


def rel_l2(path, ref):
    y = load_file(path)["output0"].double()
    if y.shape != ref.shape:
        return None, f"output shape {list(y.shape)}, eager {list(ref.shape)}"
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30)), None


def served(c, work, logs):
    ref = load_file(c["ref"])["output0"].double()
    workers = []
    for i in (1, 2):
        tag = f"{c['name']}_{i}"
        w = result_line(read(os.path.join(logs, f"{tag}.out")))
        w["exit"] = exit_status(logs, tag)
        try:
            w["rel_l2"], why = rel_l2(os.path.join(work, f"out_{tag}.safetensors"), ref)
            if why:
                w["error"] = why
        except Exception as e:
            w["rel_l2"] = None
            w["error"] = str(e)[:200]
        if w["rel_l2"] is None or w["exit"] != 0:
            w["stderr"] = read(os.path.join(logs, f"{tag}.err"))[-800:]
        w["pass"] = bool(w["rel_l2"] is not None and w["rel_l2"] <= c["tolerance"]
                         and w.get("mismatches", 1) == 0 and w["exit"] == 0)
        workers.append(w)
    return {"workers": workers, "pass": all(w["pass"] for w in workers)}


def refused(c, work, logs):
    tag = f"{c['name']}_1"
    out, err = read(os.path.join(logs, f"{tag}.out")), read(os.path.join(logs, f"{tag}.err"))
    w = {"exit": exit_status(logs, tag),
         "attached": any(line.startswith("attach ") for line in out.splitlines()),
         "output_written": os.path.exists(os.path.join(work, f"out_{tag}.safetensors")),
         "status_named": "WB_ENOTFOUND" in err,
         "named": {n: n in err for n in c["expect_named"]},
         "stderr": err[-1500:]}
    w["pass"] = bool(w["exit"] == 1 and not w["attached"] and not w["output_written"]
                     and w["status_named"] and w["named"] and all(w["named"].values()))
    return {"workers": [w], "pass": w["pass"]}


def twin_covered(cases):
    """For each weightbroker.compile case with a torch-API twin: whether its
    constants file holds every buffer the twin's library had no data for
    (its FQNs may carry its wrapper's "model." in front)."""
    by = {c["name"]: c for c in cases}
    out = {}
    for c in cases:
        twin = by.get(c["name"] + "_torch")
        if c.get("compiled_by") != "wbc" or twin is None:
            continue
        extra = c["compile"].get("extra", [])
        out[c["name"]] = {n: any(e == n or e.endswith("." + n) for e in extra)
                          for n in twin["expect_named"]}
    return out


def main():
    work, dest = sys.argv[1], sys.argv[2]
    logs = os.path.join(work, "logs")
    d = json.load(open(os.path.join(work, "cases.json")))
    res = {"torch": d["torch"], "facts": d["facts"], "compile_complete": d.get("complete", False),
           "compile_seconds": d.get("seconds"), "cases": [], "ok": bool(d.get("complete"))}
    for c in d["cases"]:
        r = {k: c.get(k) for k in ("name", "dtype", "device", "wrapped", "tolerance", "compile",
                                   "compiled_by", "expect", "expect_named", "opts", "seconds")}
        r.update(refused(c, work, logs) if c.get("expect") == "refused" else served(c, work, logs))
        res["cases"].append(r)
    for f in d.get("failed", []):
        res["cases"].append({"name": f["name"], "build_error": f["error"],
                             "traceback": f.get("traceback"), "pass": False})
    for name in d.get("skipped", []):
        res["cases"].append({"name": name, "skipped": "deadline", "pass": False})
    res["ok"] &= all(r["pass"] for r in res["cases"]) and bool(res["cases"])
    res["wbc_covers_torch_twin"] = twin_covered(d["cases"])
    for b in ("cuda", "host"):
        for k in ("models", "containers", "mem_before", "mem_serving"):
            try:
                res[f"{k}_{b}"] = json.load(open(os.path.join(logs, f"{k}_{b}.json")))
            except (OSError, ValueError):
                pass
    with open(dest, "w") as f:
        json.dump(res, f, indent=1)

    print(f"{'case':20} {'by':6} {'dev':4} {'dtype':5} {'expect':7} "
          f"{'result':44} leased aliased package unbound pass")
    for r in res["cases"]:
        if "workers" not in r:
            what = r.get("skipped") and "skipped (deadline)" or "build failed: " + r["build_error"]
            print(f"{r['name']:20} {'':6} {'':4} {'':5} {'':7} {what[:44]:44} {'':31} False")
            continue
        w = r["workers"]
        if r["expect"] == "refused":
            x = w[0]
            status = "WB_ENOTFOUND" if x["status_named"] else "no WB_ENOTFOUND"
            what = (f"exit {x['exit']}, {status}, named {sum(x['named'].values())}/"
                    f"{len(x['named'])}{', ATTACHED' if x['attached'] else ''}")
            counts = ""
        else:
            what = "rel_l2 " + " ".join(f"{x['rel_l2']:.2e}" if x.get("rel_l2") is not None
                                        else "none" for x in w) + \
                " exit " + ",".join(str(x.get("exit")) for x in w)
            a = w[0]
            counts = (f"{a.get('leased_constants')} {a.get('aliased_constants')} "
                      f"{a.get('package_constants')} {a.get('unbound_constants')}")
        print(f"{r['name']:20} {r['compiled_by'] or '':6} {r['device'][:4]:4} {r['dtype']:5} "
              f"{r['expect'] or '':7} {what[:44]:44} {counts:31} {r['pass']}")
    if not res["compile_complete"]:
        print("the compile did not finish (see logs/compile.log)")
    print("ALL PASS" if res["ok"] else "SOME FAILED")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
