#!/usr/bin/env bash
# Installs what weightbroker needs to build and test, on Debian 12, as root.
# Idempotent: only missing packages are installed; nothing else is changed.
set -euo pipefail

# Build and run-time libraries (see README, "Dependencies", for why each).
pkgs=(
  build-essential cmake pkg-config
  libzmq3-dev                     # the clients' transport: DEALER sockets on ipc://
  libprotobuf-c-dev protobuf-c-compiler  # wire format: proto/wb.proto
  libjansson-dev                  # JSON: safetensors headers, index files, --json output
  libxxhash-dev                   # XXH3-64 checksums of tensors
  libzip-dev                      # reading AOTI .pt2 packages (zip archives)
  libinih-dev                     # wbrokerd --config: the INI configuration file
  libsystemd-dev                  # sd_notify for Type=notify (optional at build time)
  libmicrohttpd-dev               # the Prometheus endpoint, --metrics (optional at build time)
  check                           # unit test framework
  # Test tools: the fuzzers (clang + libFuzzer runtime), formatting check,
  # JSON assertions in integration tests.
  clang libclang-rt-14-dev clang-format jq python3
  curl                            # scrapes /metrics in test_metrics.sh
  systemd                         # systemd-analyze verify of deploy/wbrokerd.service
  python3-yaml                    # parses the Kubernetes manifests in test_deploy.sh
  util-linux                      # setpriv: clients of another uid in test_auth.sh; unshare, nsenter: pid namespaces in test_pidns.sh
  zsh                             # checks the zsh completion in test_wbctl.sh
  python3-torch python3-numpy     # the Python package's tests: tensor and array views (CPU torch)
  python3-venv python3-setuptools # pip install ./python into a virtual environment, offline
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}; run as root (or with sudo) to install them" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${#missing[@]} packages"
