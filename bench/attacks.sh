#!/usr/bin/env bash
# Bounded denial-of-service attacks on a real broker, with what an allowed
# client sees meanwhile (bench/attacks.py says what each attack does and
# how it is judged).
#
#   bench/attacks.sh BUILD_DIR OUT_JSON     (as root; about 3 minutes)
#
# Every attack runs against a fresh wbrokerd from BUILD_DIR on unix sockets
# in a temporary directory (the metrics attack on 127.0.0.1), stops by
# itself, and is judged against the thresholds at the top of attacks.py.
# Environment: ONLY=1,4,... runs some of them; KEEP_TMP=1 keeps the
# temporary directory (broker logs).
set -euo pipefail

BUILD=$(cd "${1:?usage: bench/attacks.sh BUILD_DIR OUT_JSON}" && pwd)
OUT=${2:?usage: bench/attacks.sh BUILD_DIR OUT_JSON}
[ "$(id -u)" = 0 ] || { echo "attacks.sh: run as root (attackers switch to uid 65534)" >&2; exit 2; }
# The descriptor-slot attack holds 4096 connections in one process.
ulimit -n 20000 2>/dev/null || ulimit -n "$(ulimit -Hn)"
args=(--build "$BUILD" --out "$OUT")
[ -n "${ONLY:-}" ] && args+=(--only "$ONLY")
[ -n "${KEEP_TMP:-}" ] && args+=(--keep)
exec python3 "$(dirname "$0")/attacks.py" "${args[@]}"
