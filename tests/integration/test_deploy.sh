#!/usr/bin/env bash
# Deployment files. The systemd unit passes `systemd-analyze verify` (with
# the built wbrokerd substituted for the installed path) and has the settings
# that matter; the broker's sd_notify really sends READY=1 once its model is
# loaded and the socket answers, and STOPPING=1 on SIGTERM (a python3
# datagram socket stands in for systemd). The Kubernetes manifests parse and
# agree with each other: host IPC and PID namespaces where broker and workers
# are in different pods (one shared PID namespace in the sidecar pod), the
# same socket path everywhere (config, mounts, WB_SOCKET, probes), images,
# commands, resources and security contexts; the ConfigMap's configuration
# passes --check-config (with its models' node paths pointed at checkpoints
# made here, since the check opens them). The set for pods without hostPID and hostIPC
# (deploy/kubernetes/nohost) shares only the socket directory, mounts no
# /dev/shm and selects descriptor transports. There is no cluster here:
# nothing is applied.
source "$(dirname "$0")/lib.sh"

: "${WB_SOURCE_DIR:?WB_SOURCE_DIR must name the source tree}"
UNIT=$WB_SOURCE_DIR/deploy/wbrokerd.service
K8S=$WB_SOURCE_DIR/deploy/kubernetes

# --- systemd unit -----------------------------------------------------------
if ! systemd-analyze --version >/dev/null 2>&1; then
  log "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  log "SKIPPED: systemd-analyze cannot run here (install the systemd package):"
  log "deploy/wbrokerd.service was NOT verified"
  log "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  exit 77
fi
mkdir -p "$WB_TMP/unit"
grep -q '^ExecStart=/usr/local/sbin/wbrokerd --config /etc/wbroker/wbroker.conf$' "$UNIT" ||
  fail "ExecStart is not '/usr/local/sbin/wbrokerd --config /etc/wbroker/wbroker.conf'"
sed "s#^ExecStart=/usr/local/sbin/wbrokerd #ExecStart=$WBROKERD #" "$UNIT" >"$WB_TMP/unit/wbrokerd.service"
# verify reports unknown settings as warnings with status 0: any output fails.
systemd-analyze verify --man=no "$WB_TMP/unit/wbrokerd.service" >"$WB_TMP/verify.out" 2>&1 ||
  fail "systemd-analyze verify failed: $(cat "$WB_TMP/verify.out")"
[ ! -s "$WB_TMP/verify.out" ] || fail "systemd-analyze verify complained: $(cat "$WB_TMP/verify.out")"
# The check is real: a broken copy is refused.
sed 's/^ExecStart=.*/ExecStart=\/nonexistent\/wbrokerd/' "$WB_TMP/unit/wbrokerd.service" >"$WB_TMP/unit/broken.service"
systemd-analyze verify --man=no "$WB_TMP/unit/broken.service" >/dev/null 2>&1 &&
  fail "systemd-analyze verify accepted a unit whose binary does not exist"
"$PYTHON" - "$UNIT" <<'PY' || fail "the unit lacks settings it needs"
import sys
service, section = {}, None
for raw in open(sys.argv[1]):
    line = raw.strip()
    if not line or line.startswith("#"):
        continue
    if line.startswith("["):
        section = line
        continue
    k, v = line.split("=", 1)
    if section == "[Service]":
        service.setdefault(k, []).append(v)
def one(k):
    v = service.get(k)
    if not v or len(v) != 1:
        sys.exit("[Service] needs exactly one %s=" % k)
    return v[0]
want = {"Type": "notify", "RuntimeDirectory": "wbroker", "NoNewPrivileges": "yes",
        "UMask": "0077", "DevicePolicy": "closed", "RestartPreventExitStatus": "78",
        "ExecReload": "/bin/kill -HUP $MAINPID"}
for k, v in want.items():
    if one(k) != v:
        sys.exit("%s=%s, expected %s" % (k, one(k), v))
if "char-nvidia* rw" not in service.get("DeviceAllow", []):
    sys.exit("DeviceAllow does not keep the NVIDIA devices")
for k in ("PrivateDevices", "PrivateIPC", "ProtectProc"):
    if k in service:
        sys.exit("%s= would hide the GPU, the shared memory or the clients" % k)
for k in ("ProtectSystem", "ProtectKernelTunables", "ProtectControlGroups", "CapabilityBoundingSet"):
    if k not in service:
        sys.exit("%s= is missing" % k)
PY

# --- sd_notify --------------------------------------------------------------
if "$WBROKERD" --version | grep -q -- "-systemd"; then
  log "!!! sd_notify NOT tested: this wbrokerd was built without libsystemd (install libsystemd-dev)"
  notify_tested=0
else
  NOTIFY=$WB_TMP/notify.sock
  spawn notify "$PYTHON" -u -c '
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
while True:
    data = s.recv(4096).decode()
    print("%.6f %s" % (time.time(), data.replace("\n", " ")), flush=True)
' "$NOTIFY"
  wait_for test -S "$NOTIFY" || fail "the notification listener did not start"
  make_model "$WB_TMP/demo.safetensors" 8 2 >/dev/null
  NOTIFY_SOCKET=$NOTIFY start_broker --model "demo=$WB_TMP/demo.safetensors"
  wait_for output_has notify "READY=1" || fail "READY=1 did not arrive"
  # The preload is done before READY=1: the model is ready at once.
  [ "$(model_state demo)" = ready ] || fail "READY=1 came before model demo was ready"
  ready_line=$(grep -n 'event=sd_notify state="READY=1' "$BROKER_LOG" | cut -d: -f1)
  loaded_line=$(grep -n 'event=model_ready model=demo' "$BROKER_LOG" | cut -d: -f1)
  [ -n "$ready_line" ] && [ -n "$loaded_line" ] && [ "$loaded_line" -lt "$ready_line" ] ||
    fail "the log does not show model_ready before sd_notify READY=1"
  output_has notify "STOPPING=1" && fail "STOPPING=1 came before SIGTERM"
  stop_broker
  wait_for output_has notify "STOPPING=1" || fail "STOPPING=1 did not arrive on SIGTERM"
  [ "$(grep -c 'READY=1' "$WB_TMP/notify.out")" = 1 ] || fail "READY=1 was sent more than once"
  notify_tested=1
fi

# --- Kubernetes -------------------------------------------------------------
# python3 on PATH may be another installation than Debian's, which is where
# python3-yaml lands: use whichever of the two has the module.
if ! "$PYTHON" -c 'import yaml' 2>/dev/null && /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  PYTHON=/usr/bin/python3
fi
"$PYTHON" -c 'import yaml' 2>/dev/null || fail "python3-yaml is needed (scripts/setup.sh installs it)"
"$PYTHON" - "$K8S" "$WB_TMP/configmap.conf" >"$WB_TMP/k8s.out" 2>"$WB_TMP/k8s.err" <<'PY' || fail "manifests: $(cat "$WB_TMP/k8s.err")"
import configparser, glob, os, re, shlex, sys
import yaml

k8s_dir, conf_out = sys.argv[1], sys.argv[2]
docs = []
for path in sorted(glob.glob(os.path.join(k8s_dir, "*.yaml"))):
    for d in yaml.safe_load_all(open(path)):
        if d:
            docs.append((os.path.basename(path), d))
kinds = sorted(d["kind"] for _, d in docs)
assert kinds == ["ConfigMap", "DaemonSet", "Deployment", "Pod"], kinds

def pod_spec(d):
    return d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"]

def containers(spec):
    return spec.get("containers", []) + spec.get("initContainers", [])

def argv(c):
    return list(c.get("command", [])) + list(c.get("args", []))

def is_broker(c):
    return os.path.basename(argv(c)[0]) == "wbrokerd"

def env(c, name):
    return next((e["value"] for e in c.get("env", []) if e["name"] == name), None)

# A probe is wbctl on the socket, or GET /healthz on the metrics port; a
# broker with its metrics port has the three on /healthz.
def check_probes(where, c, socket_path, metrics_port):
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if probe not in c:
            assert not (is_broker(c) and metrics_port), "%s: no %s" % (where, probe)
            continue
        p = c[probe]
        if "exec" in p:
            cmd = p["exec"]["command"]
            assert cmd[cmd.index("--socket") + 1] == socket_path, "%s: %s socket" % (where, probe)
            continue
        h = p["httpGet"]
        assert h["path"] == "/healthz", "%s: %s path %r" % (where, probe, h["path"])
        port = h["port"]
        if isinstance(port, str):
            port = next((x["containerPort"] for x in c.get("ports", []) if x.get("name") == port), None)
        assert port == metrics_port, "%s: %s port %r is not the metrics port %s" % (
            where, probe, h["port"], metrics_port)

def mount_of(spec, c, path_dir):
    m = [v for v in c.get("volumeMounts", []) if v["mountPath"] == path_dir]
    assert len(m) == 1, "%s does not mount %s" % (c["name"], path_dir)
    vol = next(v for v in spec["volumes"] if v["name"] == m[0]["name"])
    return vol

by_kind = {d["kind"]: (f, d) for f, d in docs}
_, cm = by_kind["ConfigMap"]
conf_text = cm["data"]["wbroker.conf"]
open(conf_out, "w").write(conf_text)
conf = configparser.ConfigParser(inline_comment_prefixes=(";",))
conf.read_string(conf_text)
socket_path = conf["broker"]["socket"]
socket_dir = os.path.dirname(socket_path)
models = [s.split(None, 1)[1] for s in conf.sections() if s.startswith("model ")]
metrics_port = int(conf["broker"]["metrics"].rsplit(":", 1)[1])
allow_gids = [g.strip() for g in conf["broker"].get("allow-gid", "").split(",") if g.strip()]

host_dirs = {}
checked = []
for fname, d in docs:
    if d["kind"] == "ConfigMap":
        continue
    spec = pod_spec(d)
    cs = containers(spec)
    brokers = [c for c in cs if is_broker(c)]
    workers = [c for c in cs if not is_broker(c)]
    for c in cs:
        where = "%s/%s" % (fname, c["name"])
        img = c["image"]
        assert re.fullmatch(r"[a-z0-9.-]+(/[a-z0-9._-]+)+:[0-9][0-9A-Za-z.-]*", img), \
            "%s: image %r needs a registry path and a version tag" % (where, img)
        a = argv(c)
        assert a and a[0].startswith("/usr/local/"), "%s: command must be an absolute path" % where
        assert os.path.basename(a[0]) in ("wbrokerd", "wb-demo-worker"), where
        res = c["resources"]
        assert "cpu" in res["requests"] and "memory" in res["requests"], "%s: requests" % where
        assert "memory" in res["limits"], "%s: no memory limit" % where
        assert int(res["limits"].get("nvidia.com/gpu", 0)) >= 1, "%s: no nvidia.com/gpu" % where
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, where
        assert sc["capabilities"]["drop"] == ["ALL"], where
        assert sc["readOnlyRootFilesystem"] is True, where
        assert not sc.get("privileged"), where
        # Every container names the same socket, and has it mounted.
        assert env(c, "WB_SOCKET") == socket_path, "%s: WB_SOCKET %r" % (where, env(c, "WB_SOCKET"))
        vol = mount_of(spec, c, socket_dir)
        check_probes(where, c, socket_path, metrics_port)
        if "hostPath" in vol:
            host_dirs.setdefault(vol["hostPath"]["path"], []).append(where)
        if is_broker(c):
            flags = [x for x in a if x.startswith("--socket=")]
            if flags:
                assert flags[0] == "--socket=" + socket_path, where
            else:
                assert a[a.index("--config") + 1] == "/etc/wbroker/wbroker.conf", where
                cfg_vol = mount_of(spec, c, "/etc/wbroker")
                assert cfg_vol["configMap"]["name"] == cm["metadata"]["name"], where
            ports = [p["containerPort"] for p in c.get("ports", [])]
            assert metrics_port in ports, "%s: metrics port %d not exposed" % (where, metrics_port)
        else:
            assert a[a.index("--model") + 1] in models, "%s: model not in the configuration" % where
    if brokers and workers:
        # One pod: a shared PID namespace; IPC is shared inside a pod.
        assert spec.get("shareProcessNamespace") is True, "%s: shareProcessNamespace" % fname
        assert not spec.get("hostIPC") and not spec.get("hostPID"), fname
        vol = mount_of(spec, brokers[0], socket_dir)
        assert "emptyDir" in vol, "%s: the sidecar socket should be pod-local" % fname
    else:
        # Broker and workers in different pods: host namespaces.
        assert spec.get("hostIPC") is True, "%s: hostIPC must be true" % fname
        assert spec.get("hostPID") is True, "%s: hostPID must be true" % fname
        if workers:
            gid = str(spec["securityContext"]["runAsGroup"])
            assert gid in allow_gids, "%s: runAsGroup %s is not in allow-gid %r" % (fname, gid, allow_gids)
            assert spec["securityContext"].get("runAsNonRoot") is True, fname
    if d["kind"] == "DaemonSet":
        ann = d["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/port"] == str(metrics_port), fname
    checked.append(fname)
# DaemonSet and Deployment share one host directory for the socket.
assert list(host_dirs) == [socket_dir], host_dirs
assert len(host_dirs[socket_dir]) == 2, host_dirs
print(" ".join(checked))
PY
log "manifests checked: $(cat "$WB_TMP/k8s.out")"
# --check-config opens every model's path: the node's paths are pointed at
# checkpoints made here.
mkdir -p "$WB_TMP/models/base"
make_model "$WB_TMP/models/base/model.safetensors" 2 3 >/dev/null
local_models() {
  sed -i "s#/var/lib/wbroker/models/#$WB_TMP/models/#" "$1"
}
local_models "$WB_TMP/configmap.conf"
# The ConfigMap's configuration is one the broker accepts, and names the
# socket the manifests mount.
"$WBROKERD" --config "$WB_TMP/configmap.conf" --check-config >"$WB_TMP/cm.out" 2>"$WB_TMP/cm.err" ||
  fail "the ConfigMap's wbroker.conf fails --check-config: $(cat "$WB_TMP/cm.err")"
grep -qx "socket: /run/wbroker/broker.sock" "$WB_TMP/cm.out" || fail "the ConfigMap's socket: $(cat "$WB_TMP/cm.out")"

# --- Kubernetes without hostPID and hostIPC (deploy/kubernetes/nohost) ------
# No pod asks for the host's PID or IPC namespace or mounts /dev/shm; the
# socket directory is the only volume broker and workers share (the
# workers mount nothing else); the broker is configured for descriptor
# transports (memfd slabs, hence the descriptor channel and sessions). The
# check is shown to be real: copies broken in each of those ways are refused.
"$PYTHON" - "$K8S/nohost" "$WB_TMP/nohost.conf" >"$WB_TMP/nohost.out" 2>"$WB_TMP/nohost.err" <<'PY' ||
import configparser, copy, glob, os, re, sys
import yaml

k8s_dir, conf_out = sys.argv[1], sys.argv[2]
docs = []
for path in sorted(glob.glob(os.path.join(k8s_dir, "*.yaml"))):
    for d in yaml.safe_load_all(open(path)):
        if d:
            docs.append((os.path.basename(path), d))

def pod_spec(d):
    return d["spec"] if d["kind"] == "Pod" else d["spec"]["template"]["spec"]

def argv(c):
    return list(c.get("command", [])) + list(c.get("args", []))

def is_broker(c):
    return os.path.basename(argv(c)[0]) == "wbrokerd"

def env(c, name):
    return next((e["value"] for e in c.get("env", []) if e["name"] == name), None)

# A probe is wbctl on the socket, or GET /healthz on the metrics port; a
# broker with its metrics port has the three on /healthz.
def check_probes(where, c, socket_path, metrics_port):
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        if probe not in c:
            assert not (is_broker(c) and metrics_port), "%s: no %s" % (where, probe)
            continue
        p = c[probe]
        if "exec" in p:
            cmd = p["exec"]["command"]
            assert cmd[cmd.index("--socket") + 1] == socket_path, "%s: %s" % (where, probe)
            continue
        h = p["httpGet"]
        assert h["path"] == "/healthz", "%s: %s path %r" % (where, probe, h["path"])
        port = h["port"]
        if isinstance(port, str):
            port = next((x["containerPort"] for x in c.get("ports", []) if x.get("name") == port), None)
        assert port == metrics_port, "%s: %s port %r is not the metrics port %s" % (
            where, probe, h["port"], metrics_port)

def check(docs):
    kinds = sorted(d["kind"] for _, d in docs)
    assert kinds == ["ConfigMap", "DaemonSet", "Deployment"], kinds
    cm = next(d for _, d in docs if d["kind"] == "ConfigMap")
    conf_text = cm["data"]["wbroker.conf"]
    conf = configparser.ConfigParser(inline_comment_prefixes=(";",))
    conf.read_string(conf_text)
    b = conf["broker"]
    socket_path = b["socket"]
    socket_dir = os.path.dirname(socket_path)
    # Descriptor transports: memfd host slabs (cuda-vmm on a GPU).
    backend = b.get("backend", "auto")
    assert backend in ("host", "cuda-vmm"), "backend %r needs /dev/shm or legacy CUDA IPC" % backend
    if backend == "host":
        assert b.get("host-slab") == "memfd", "host-slab %r: slabs would be /dev/shm names" % b.get("host-slab")
    shared = {}
    pods = 0
    for fname, d in docs:
        if d["kind"] == "ConfigMap":
            continue
        pods += 1
        spec = pod_spec(d)
        assert not spec.get("hostPID"), "%s: hostPID" % fname
        assert not spec.get("hostIPC"), "%s: hostIPC" % fname
        assert not spec.get("hostNetwork"), "%s: hostNetwork" % fname
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        for v in vols.values():
            assert v.get("hostPath", {}).get("path", "").rstrip("/") != "/dev/shm", \
                "%s: volume %s is the host's /dev/shm" % (fname, v["name"])
        cs = spec.get("containers", []) + spec.get("initContainers", [])
        for c in cs:
            where = "%s/%s" % (fname, c["name"])
            a = argv(c)
            assert re.fullmatch(r"[a-z0-9.-]+(/[a-z0-9._-]+)+:[0-9][0-9A-Za-z.-]*", c["image"]), where
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged"), where
            assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"] is True, where
            assert env(c, "WB_SOCKET") == socket_path, "%s: WB_SOCKET %r" % (where, env(c, "WB_SOCKET"))
            mounts = c.get("volumeMounts", [])
            for m in mounts:
                assert m["mountPath"].rstrip("/") != "/dev/shm", "%s mounts /dev/shm" % where
            sock = [m for m in mounts if m["mountPath"] == socket_dir]
            assert len(sock) == 1, "%s does not mount %s" % (where, socket_dir)
            metrics = b.get("metrics")
            check_probes(where, c, socket_path, int(metrics.rsplit(":", 1)[1]) if metrics else None)
            if is_broker(c):
                assert a[a.index("--config") + 1] == "/etc/wbroker/wbroker.conf", where
                cfg = next(m for m in mounts if m["mountPath"] == "/etc/wbroker")
                assert vols[cfg["name"]]["configMap"]["name"] == cm["metadata"]["name"], where
                # Nothing on the command line undoes the configuration.
                for flag, ok in (("--backend", ("host", "cuda-vmm")), ("--host-slab", ("memfd",))):
                    for i, x in enumerate(a):
                        val = x.split("=", 1)[1] if x.startswith(flag + "=") else \
                            (a[i + 1] if x == flag else None)
                        assert val is None or val in ok, "%s: %s %s" % (where, flag, val)
            else:
                # A worker mounts the socket directory and nothing else.
                assert [m["mountPath"] for m in mounts] == [socket_dir], \
                    "%s mounts %r, only %s may be shared" % (where, [m["mountPath"] for m in mounts], socket_dir)
                assert spec["securityContext"].get("runAsNonRoot") is True, fname
                gid = str(spec["securityContext"]["runAsGroup"])
                allow = [g.strip() for g in b.get("allow-gid", "").split(",")]
                assert gid in allow, "%s: runAsGroup %s not in allow-gid" % (fname, gid)
            for m in mounts:
                v = vols[m["name"]]
                if "hostPath" in v:
                    shared.setdefault(v["hostPath"]["path"], set()).add(
                        "broker" if is_broker(c) else "worker")
    assert pods == 2, pods
    both = sorted(p for p, who in shared.items() if who == {"broker", "worker"})
    assert both == [socket_dir], "shared between broker and workers: %r" % both
    return conf_text

open(conf_out, "w").write(check(docs))

def mutated(fn):
    ds = copy.deepcopy(docs)
    fn({d["kind"]: d for _, d in ds})
    return ds

def worker(k):
    return pod_spec(k["Deployment"])

def broker(k):
    return pod_spec(k["DaemonSet"])

def conf_set(k, old, new):
    cm = k["ConfigMap"]
    assert old in cm["data"]["wbroker.conf"], old
    cm["data"]["wbroker.conf"] = cm["data"]["wbroker.conf"].replace(old, new)

breakages = {
    "hostPID": lambda k: worker(k).__setitem__("hostPID", True),
    "hostIPC": lambda k: broker(k).__setitem__("hostIPC", True),
    "/dev/shm": lambda k: (worker(k)["volumes"].append({"name": "shm", "emptyDir": {"medium": "Memory"}}),
                           worker(k)["containers"][0]["volumeMounts"].append({"name": "shm", "mountPath": "/dev/shm"})),
    "models shared": lambda k: (worker(k)["volumes"].append({"name": "models", "hostPath": {"path": "/var/lib/wbroker/models"}}),
                                worker(k)["containers"][0]["volumeMounts"].append({"name": "models", "mountPath": "/models"})),
    "shm slabs": lambda k: conf_set(k, "host-slab = memfd", "host-slab = shm"),
    "cuda IPC": lambda k: conf_set(k, "backend = host", "backend = cuda"),
    "--host-slab shm": lambda k: broker(k)["containers"][0]["args"].extend(["--host-slab", "shm"]),
    "a probe off the metrics port": lambda k: broker(k)["containers"][0]["livenessProbe"]["httpGet"].__setitem__("port", 8080),
    "no readiness probe": lambda k: broker(k)["containers"][0].pop("readinessProbe"),
}
for name, fn in breakages.items():
    try:
        check(mutated(fn))
    except AssertionError as e:
        print("refused %s: %s" % (name, e), file=sys.stderr)
        continue
    sys.exit("a copy with %s was accepted" % name)
print(" ".join(f for f, _ in docs), "and %d broken copies refused" % len(breakages))
PY
  fail "nohost manifests: $(cat "$WB_TMP/nohost.err")"
log "nohost manifests checked: $(cat "$WB_TMP/nohost.out")"
local_models "$WB_TMP/nohost.conf"
"$WBROKERD" --config "$WB_TMP/nohost.conf" --check-config >"$WB_TMP/nohost-cm.out" 2>"$WB_TMP/nohost-cm.err" ||
  fail "the nohost ConfigMap's wbroker.conf fails --check-config: $(cat "$WB_TMP/nohost-cm.err")"
grep -qx "socket: /run/wbroker/broker.sock" "$WB_TMP/nohost-cm.out" || fail "nohost socket: $(cat "$WB_TMP/nohost-cm.out")"
[ "$notify_tested" = 1 ] || log "!!! sd_notify was NOT tested (see above)"
true
