#!/usr/bin/env bash
# The control plane's speed on the host backend, in one run:
#   * acquire + release pairs/s, p50/p99 of a pair, CPU per pair, with 1, 8
#     and 64 client processes, at 28, 10^4 and 10^5 tensors, each run next
#     to a raw ZeroMQ DEALER/ROUTER echo with the same message sizes and the
#     same process structure (the ratio is taken within the same repeat);
#   * attach: fresh process -> mapped lease with its tensor table;
#   * the broker's CPU with IDLE_PROCS processes each holding one lease and
#     heartbeating;
#   * `wbctl leases` with 5,000 leases held.
#
#   bench/rpc.sh BUILD_DIR [OUT_JSON]   (default bench/results/rpc.json)
#
# Environment: REPS (3), SECONDS_PER_RUN (1), IDLE_PROCS (1000),
# IDLE_SECONDS (5), CLIENTS ("1 8 64"), TENSORS ("28 10000 100000").
set -euo pipefail

BUILD=$(cd "${1:?usage: bench/rpc.sh BUILD_DIR [OUT_JSON]}" && pwd)
OUT=${2:-$(dirname "$0")/results/rpc.json}
REPS=${REPS:-3}
SECS=${SECONDS_PER_RUN:-1}
IDLE_PROCS=${IDLE_PROCS:-1000}
IDLE_SECONDS=${IDLE_SECONDS:-5}
CLIENTS=${CLIENTS:-"1 8 64"}
TENSORS=${TENSORS:-"28 10000 100000"}
BENCH=$BUILD/bench/wb_bench_rpc
WBROKERD=$BUILD/broker/wbrokerd
WBCTL=$BUILD/tools/wbctl/wbctl
PYTHON=${PYTHON:-python3}

T=$(mktemp -d /tmp/wbbench.XXXXXX)
SOCK=$T/broker.sock
BROKER=
cleanup() {
  [ -n "$BROKER" ] && kill -TERM "$BROKER" 2>/dev/null && wait "$BROKER" 2>/dev/null
  [ -n "${KEEP_TMP:-}" ] && echo "kept $T" >&2 || rm -rf "$T"
}
trap cleanup EXIT
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
# 1,000 processes with a ZeroMQ context each.
ulimit -u unlimited 2>/dev/null || true

# Checkpoints of N small tensors (F32 [4], 16 bytes each).
models=()
for n in $TENSORS; do
  "$PYTHON" - "$T/m$n.safetensors" "$n" <<'PY'
import json, struct, sys
path, n = sys.argv[1], int(sys.argv[2])
header = {}
for i in range(n):
    header["model.layers.%d.experts.%d.w%d.weight" % (i // 512, (i // 4) % 128, i % 4)] = {
        "dtype": "F32", "shape": [4], "data_offsets": [16 * i, 16 * i + 16]}
raw = json.dumps(header).encode()
raw += b" " * (-len(raw) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw + bytes(16 * n))
PY
  models+=(--model "t$n=$T/m$n.safetensors")
done

"$WBROKERD" --socket "$SOCK" --backend host "${models[@]}" --max-leases-per-client 5000 \
  >"$T/broker.log" 2>&1 &
BROKER=$!
for _ in $(seq 600); do
  [ -S "$SOCK" ] && "$WBCTL" --socket "$SOCK" models >/dev/null 2>&1 && break
  sleep 0.1
done
"$WBCTL" --socket "$SOCK" models >/dev/null

R=$T/results.jsonl
: >"$R"
first=${TENSORS%% *}
for n in $TENSORS; do
  sizes=$("$BENCH" sizes "$SOCK" "t$n")
  read -r areq arep rreq rrep < <(echo "$sizes" | "$PYTHON" -c 'import json,sys
d=json.load(sys.stdin); print(d["acquire_request"], d["acquire_reply"], d["release_request"], d["release_reply"])')
  echo "{\"tensors\":$n,\"sizes\":$sizes}" >>"$R"
  for c in $CLIENTS; do
    for rep in $(seq "$REPS"); do
      l=$("$BENCH" lease "$SOCK" "t$n" "$c" "$SECS" "$BROKER")
      e=$("$BENCH" echo "$c" "$SECS" "$areq" "$arep" "$rreq" "$rrep")
      echo "{\"tensors\":$n,\"clients\":$c,\"rep\":$rep,\"lease\":$l,\"echo\":$e}" >>"$R"
      echo "tensors=$n clients=$c rep=$rep lease=$l" >&2
    done
  done
  a=$("$BENCH" attach "$SOCK" "t$n" 5)
  echo "{\"tensors\":$n,\"attach\":$a}" >>"$R"
  echo "attach $a" >&2
done

i=$("$BENCH" idle "$SOCK" "t$first" "$BROKER" "$IDLE_PROCS" "$IDLE_SECONDS")
echo "{\"idle\":$i}" >>"$R"
echo "idle $i" >&2

# 5,000 leases held by 50 processes, then `wbctl leases` timed.
exec 3> >("$BENCH" hold "$SOCK" "t$first" 50 5000 >"$T/hold.out")
for _ in $(seq 600); do
  grep -q ready "$T/hold.out" 2>/dev/null && break
  sleep 0.1
done
grep -q ready "$T/hold.out"
"$PYTHON" - "$WBCTL" "$SOCK" >>"$R" <<'PY'
import json, subprocess, sys, time
times = []
for _ in range(5):
    t0 = time.monotonic()
    out = subprocess.run([sys.argv[1], "--socket", sys.argv[2], "leases", "--json"],
                         check=True, capture_output=True).stdout
    times.append((time.monotonic() - t0) * 1e3)
n = len(json.loads(out))
times.sort()
print(json.dumps({"wbctl_leases": {"leases": n, "ms": round(times[2], 2)}}))
PY
exec 3>&-
tail -n1 "$R" >&2

"$PYTHON" - "$R" "$OUT" "$IDLE_PROCS" <<'PY'
import json, statistics, sys, datetime, os, platform
rows = [json.loads(l) for l in open(sys.argv[1])]
med = statistics.median
out = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                   "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                                if l.startswith("model name")), "?")},
       "date": datetime.date.today().isoformat(),
       "command": "bench/rpc.sh BUILD_DIR", "backend": "host",
       "by_tensors": {}}
for r in rows:
    if "sizes" in r:
        out["by_tensors"].setdefault("tensors_%d" % r["tensors"], {})["message_bytes"] = r["sizes"]
for r in rows:
    if "attach" in r:
        out["by_tensors"]["tensors_%d" % r["tensors"]]["attach_ms"] = r["attach"]["attach_ms"]
        out["by_tensors"]["tensors_%d" % r["tensors"]]["attach_acquire_ms"] = r["attach"]["acquire_ms"]
groups = {}
for r in rows:
    if "lease" in r:
        groups.setdefault((r["tensors"], r["clients"]), []).append(r)
for (n, c), rs in sorted(groups.items()):
    t = out["by_tensors"]["tensors_%d" % n].setdefault("clients", {})
    ratios = [r["lease"]["pairs_per_s"] / r["echo"]["pairs_per_s"] for r in rs if r["echo"]["pairs_per_s"]]
    t["clients_%d" % c] = {
        "pairs_per_s": round(med(r["lease"]["pairs_per_s"] for r in rs), 1),
        "p50_us": round(med(r["lease"]["p50_us"] for r in rs), 1),
        "p99_us": round(med(r["lease"]["p99_us"] for r in rs), 1),
        "broker_cpu_us_per_pair": round(med(r["lease"]["server_cpu_us_per_pair"] for r in rs), 2),
        "client_cpu_us_per_pair": round(med(r["lease"]["client_cpu_us_per_pair"] for r in rs), 2),
        "echo_pairs_per_s": round(med(r["echo"]["pairs_per_s"] for r in rs), 1),
        "echo_p50_us": round(med(r["echo"]["p50_us"] for r in rs), 1),
        "echo_p99_us": round(med(r["echo"]["p99_us"] for r in rs), 1),
        "echo_server_cpu_us_per_pair": round(med(r["echo"]["server_cpu_us_per_pair"] for r in rs), 2),
        "echo_client_cpu_us_per_pair": round(med(r["echo"]["client_cpu_us_per_pair"] for r in rs), 2),
        "ratio_to_echo": round(med(ratios), 3) if ratios else None,
        "failed": sum(r["lease"]["failed"] + r["echo"]["failed"] for r in rs),
        "repeats": len(rs),
    }
for r in rows:
    if "idle" in r:
        out["idle"] = r["idle"]
    if "wbctl_leases" in r:
        out["wbctl_leases"] = r["wbctl_leases"]
# Flat keys for the headline figures.
out["pairs_per_s"] = {"tensors_%s_clients_%s" % (k.split("_")[1], c.split("_")[1]): v["pairs_per_s"]
                      for k, t in out["by_tensors"].items() for c, v in t.get("clients", {}).items()}
json.dump(out, open(sys.argv[2], "w"), indent=2)
open(sys.argv[2], "a").write("\n")
print(json.dumps(out["pairs_per_s"], indent=1))
PY
