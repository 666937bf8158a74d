#!/usr/bin/env bash
# Quick start: installs what is missing, builds, and runs the broker in the
# foreground on the bundled demo model. Stop it with Ctrl-C.
#
#   scripts/demo.sh [extra wbrokerd options...]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc 2>/dev/null || echo 2)" --target wbrokerd wbctl wb-demo-worker

model="$root/examples/demo/model.safetensors"
echo
echo "demo: starting wbrokerd on $model (backend auto: host memory where there is no GPU)"
echo "demo: in another terminal:"
echo "        build/examples/wb-demo-worker --model demo --hold 60 &"
echo "        build/tools/wbctl/wbctl leases"
echo
exec build/broker/wbrokerd --backend auto --model "demo=$model" "$@"
