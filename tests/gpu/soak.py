#!/usr/bin/env python3
"""The Python side of tests/gpu/soak.sh (standard library only).

  soak.py plan SEED COUNT       COUNT lines "VARIANT FATE TRIGGER D1_MS D2_MS",
                                what the soak's workers do in turn (the same
                                for the same seed; FATES below)
  soak.py watch LOG ARMDIR      follows the broker's debug log and SIGKILLs a
                                worker armed with ARMDIR/PID.EVENT at that
                                event of its own (EVENT: hello, grant1,
                                grant2), writing ARMDIR/PID.fired first
  soak.py summary OUT SEED KIND...
                                judges each slab kind from the files the
                                soak left in OUT/KIND/, writes OUT/soak.json,
                                prints a table; exit 1 when a kind failed

A worker's facts (OUT/KIND/workers.jsonl, one line each, written by
soak.sh when the worker was reaped): phase (warmup or soak), i, pid,
variant, fate, trigger, fired (the event the watcher killed it at, or "-"),
sigkill and sigterm (1 when soak.sh sent them), rc, stage (how far its
stdout got: start, attached, ready, result), stuck ("" or what it missed
the deadline of), output (the output file, written before "ready", or
null) and result (its "result" line's JSON as a string, or "")."""
import hashlib
import json
import os
import random
import re
import signal
import struct
import sys
import time

# (fate, share): complete serves D1 ms after "ready" and stops on SIGTERM;
# attach is SIGKILLed by the watcher at its TRIGGER (its hello, or the grant
# of its first or second lease), before its container is ready; serve is
# SIGKILLed D1 ms after "ready"; exit gets SIGTERM D1 ms after "ready" and
# SIGKILL D2 ms later, while it tears down (or after it exited); early is
# SIGKILLed D1 ms after its start, wherever it is.
FATES = (("complete", 0.40), ("attach", 0.20), ("serve", 0.20), ("exit", 0.10),
         ("early", 0.10))
TRIGGERS = ("hello", "grant1", "grant2")
ATTACH_STAGES = ("start",)  # stdout without an "attach" line: no container yet


def plan(seed, count):
    r = random.Random(seed)
    for _ in range(count):
        # Five draws per worker whatever its fate, so that worker i's plan
        # depends only on the seed and i.
        u = [r.random() for _ in range(5)]
        variant = "a" if u[0] < 0.5 else "b"
        acc, fate = 0.0, FATES[-1][0]
        for name, share in FATES:
            acc += share
            if u[1] < acc:
                fate = name
                break
        trigger = TRIGGERS[min(int(u[2] * len(TRIGGERS)), len(TRIGGERS) - 1)] \
            if fate == "attach" else "-"
        d1 = {"complete": 200 + u[3] * 1800, "serve": u[3] * 1500, "exit": 100 + u[3] * 900,
              "early": u[3] * 2500, "attach": 0}[fate]
        d2 = u[4] * 40 if fate == "exit" else 0
        print(variant, fate, trigger, int(d1), int(d2))


LINE = re.compile(rb"\bevent=(hello|lease_grant)\b.*?\bpid=(\d+)\b")


def watch(log, arm):
    """Reads the log as it grows (polling every 2 ms: the kill should land
    within the few milliseconds a worker spends between its grants and its
    container being ready). Ends when ARMDIR/stop appears or the parent
    is gone."""
    parent, grants, buf = os.getppid(), {}, b""
    stop = os.path.join(arm, "stop")
    with open(log, "rb") as f:
        while True:
            chunk = f.read(1 << 16)
            if not chunk:
                if os.path.exists(stop) or os.getppid() != parent:
                    return 0
                time.sleep(0.002)
                continue
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                m = LINE.search(line)
                if not m:
                    continue
                pid = int(m.group(2))
                if m.group(1) == b"hello":
                    event = "hello"
                else:
                    grants[pid] = grants.get(pid, 0) + 1
                    event = "grant%d" % grants[pid]
                armed = os.path.join(arm, "%d.%s" % (pid, event))
                if not os.path.exists(armed):
                    continue
                # Written before the kill: whoever reaps the worker finds it.
                with open(os.path.join(arm, "%d.fired" % pid), "w") as o:
                    o.write(event + "\n")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.unlink(armed)


def digest(path):
    """SHA-256 of a safetensors file's data section (to count bitwise
    distinct outputs), or None when the file cannot be read."""
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            f.seek(8 + n)
            return hashlib.sha256(f.read()).hexdigest()
    except (OSError, struct.error):
        return None


def load_json(path, default):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def outcome(w):
    ours = w["sigkill"] or w["fired"] != "-"
    if w["stuck"]:
        return "stuck"
    if w["rc"] == 0 and w["result"] and w["result"].get("ok"):
        return "clean"
    if w["rc"] == 137 and ours:
        return "killed"
    if w["rc"] == 3:
        return "mismatch"  # outputs changed while serving (wb-aoti-worker --serve)
    return "failed"


def judge(kdir):
    facts = load_json(os.path.join(kdir, "facts.json"), {})
    try:
        with open(os.path.join(kdir, "workers.jsonl")) as f:
            workers = [json.loads(line) for line in f if line.strip()]
    except OSError:
        workers = []
    try:
        with open(os.path.join(kdir, "problems.txt")) as f:
            problems = [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        problems = []
    errs = {}
    for v in ("a", "b"):
        errs.update(load_json(os.path.join(kdir, "acc_%s.json" % v), {}).get("files", {}))
    tol = facts.get("tolerance", 0.0)
    iterations = facts.get("iterations", 1)
    soak = [w for w in workers if w["phase"] == "soak"]
    warm = [w for w in workers if w["phase"] == "warmup"]
    outcomes = {}
    for w in workers:
        # The "result" line as soak.sh read it; a line cut short is no result.
        try:
            w["result"] = json.loads(w["result"]) if w["result"] else None
        except ValueError:
            w["result"] = None
        w["outcome"] = outcome(w)
        outcomes.setdefault(w["phase"], {}).setdefault(w["outcome"], 0)
        outcomes[w["phase"]][w["outcome"]] += 1

    killed = [w for w in soak if w["outcome"] == "killed"]
    in_attach = [w for w in killed if w["fired"] in TRIGGERS and w["stage"] in ATTACH_STAGES]
    by_stage = {}
    for w in killed:
        by_stage[w["stage"]] = by_stage.get(w["stage"], 0) + 1
    clean = [w for w in soak if w["outcome"] == "clean"]
    runs = sum(iterations + w["result"].get("served", 0) for w in clean)
    with_output = [w for w in soak if w["output"]]
    checked = [w for w in with_output if w["output"] in errs]
    eager_bad = [w for w in checked if not errs[w["output"]] <= tol]
    served_bad = [w for w in soak if w["outcome"] == "mismatch" or
                  (w["result"] and w["result"].get("mismatches", 0))]
    unexpected = [w for w in soak if w["outcome"] in ("failed", "stuck")]
    warm_bad = [w for w in warm if w["outcome"] != "clean" or
                (w["output"] not in errs or not errs[w["output"]] <= tol)]
    distinct = {}
    for w in checked:
        distinct.setdefault(w["variant"], set()).add(digest(w["output"]))

    def pair(key):
        d = facts.get(key) or {}
        return {k: d.get(k) for k in ("before", "after", "tolerance")} | \
            {k: v for k, v in d.items() if k not in ("before", "after", "tolerance")}

    mem, rss, fds = pair("mem_mib"), pair("rss_kib"), pair("fds")
    procs = facts.get("gpu_procs") or {}
    stats = facts.get("stats") or {}
    leases_left = facts.get("leases_left")

    def within(d):  # after <= before + tolerance, all known
        return None not in (d["before"], d["after"], d["tolerance"]) and \
            d["after"] - d["before"] <= d["tolerance"]

    st = [stats.get(k) for k in ("leases_granted", "leases_released", "leases_reclaimed",
                                 "leases_active", "leases_stale")]
    reasons = list(problems)
    checks = (
        (len(warm) > 0 and not warm_bad, "warm-up: %d of %d workers did not serve cleanly with "
         "outputs matching eager" % (len(warm_bad), len(warm))),
        (len(soak) > 0, "no worker was started"),
        (not unexpected, "%d workers failed or got stuck (see failed/)" % len(unexpected)),
        (len(clean) > 0 and runs > 0, "no worker completed its runs"),
        (len(checked) > 0, "no output was compared with eager PyTorch"),
        (len(checked) == len(with_output), "%d outputs could not be compared (see acc_*.json)"
         % (len(with_output) - len(checked))),
        (not eager_bad, "%d outputs differ from eager PyTorch by more than %g"
         % (len(eager_bad), tol)),
        (not served_bad, "%d workers saw their outputs change while serving" % len(served_bad)),
        (len(in_attach) > 0, "no worker was killed while it attached"),
        (by_stage.get("ready", 0) > 0, "no worker was killed while it served"),
        (leases_left == 0, "leases left: %s" % leases_left),
        (None not in st and st[0] == st[1] + st[2] and st[3] == 0 and st[4] == 0,
         "broker counters: granted %s, released %s, reclaimed %s, active %s, stale %s"
         % tuple(st)),
        (within(mem), "device memory %s MiB after, %s MiB with the broker alone (tolerance %s MiB)"
         % (mem["after"], mem["before"], mem["tolerance"])),
        (within({"before": procs.get("before"), "after": procs.get("after"), "tolerance": 0}),
         "GPU processes: %s after, %s with the broker alone"
         % (procs.get("after"), procs.get("before"))),
        (within(rss), "broker RSS %s KiB after, %s KiB before (tolerance %s KiB)"
         % (rss["after"], rss["before"], rss["tolerance"])),
        (within(fds), "broker descriptors %s after, %s before (tolerance %s)"
         % (fds["after"], fds["before"], fds["tolerance"])),
        (facts.get("broker_stop_clean") is True, "the broker did not stop cleanly with no lease held"),
    )
    reasons += [why for ok, why in checks if not ok]
    return {
        "seconds": facts.get("seconds"),
        "soak_seconds": facts.get("soak_seconds"),
        "workers": facts.get("workers"),
        "workers_started": len(soak),
        "workers_killed": len(killed),
        "kills": {"while_attaching": len(in_attach),
                  "by_stage": by_stage,
                  "by_trigger": {t: sum(w["fired"] == t for w in killed) for t in TRIGGERS},
                  "attach_trigger_missed": sum(w["fate"] == "attach" and w["fired"] == "-"
                                               for w in soak)},
        "clean_exits": len(clean),
        "runs_completed": runs,
        "outputs_checked": len(checked),
        "outputs_ignored": sum(1 for w in soak if not w["output"]),
        "max_rel_err": max((errs[w["output"]] for w in checked), default=None),
        "tolerance": tol,
        "distinct_outputs": {v: len(s) for v, s in sorted(distinct.items())},
        "mismatches": len(eager_bad) + len(served_bad),
        "unexpected": len(unexpected),
        "outcomes": outcomes,
        "leases_left": leases_left,
        "broker_stats": stats,
        "device_mem_broker_only_mib": mem,
        "gpu_procs": facts.get("gpu_procs"),
        "broker_rss_kib": rss,
        "broker_fds": fds,
        "broker_stop_clean": facts.get("broker_stop_clean"),
        "aoti_dirs_left_by_killed_workers": facts.get("tmp_left"),
        "failures": reasons,
        "pass": not reasons,
    }


def summary(out, seed, kinds):
    run = load_json(os.path.join(out, "run.json"), {})
    res = {"run": run | {"seed": seed,
                         "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
    for k in kinds:
        res[k] = judge(os.path.join(out, k))
    failures = run.get("failures", [])
    res["pass"] = not failures and all(res[k]["pass"] for k in kinds)
    with open(os.path.join(out, "soak.json"), "w") as f:
        json.dump(res, f, indent=1)
    cols = ("slab", "seconds", "started", "killed", "in_attach", "runs", "outputs",
            "mismatch", "leases", "mem_MiB", "rss_KiB", "fds", "pass")
    rows = [cols]
    for k in kinds:
        r = res[k]
        ba = lambda d: "%s/%s" % tuple("-" if d[k] is None else d[k] for k in ("before", "after"))
        rows.append((k, r["soak_seconds"], r["workers_started"], r["workers_killed"],
                     r["kills"]["while_attaching"], r["runs_completed"], r["outputs_checked"],
                     r["mismatches"], r["leases_left"], ba(r["device_mem_broker_only_mib"]),
                     ba(r["broker_rss_kib"]), ba(r["broker_fds"]),
                     "yes" if r["pass"] else "NO"))
    rows = [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    for k in kinds:
        for why in res[k]["failures"]:
            print("%s: %s" % (k, why))
    for why in failures:
        print("run: %s" % why)
    print("seed %s: %s" % (seed, "PASS" if res["pass"] else "FAIL"))
    return 0 if res["pass"] else 1


def main(argv):
    if len(argv) == 4 and argv[1] == "plan":
        plan(int(argv[2]), int(argv[3]))
        return 0
    if len(argv) == 4 and argv[1] == "watch":
        return watch(argv[2], argv[3])
    if len(argv) >= 4 and argv[1] == "summary":
        return summary(argv[2], int(argv[3]), argv[4:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
