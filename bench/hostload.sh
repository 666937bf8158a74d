#!/usr/bin/env bash
# The host backend's load against the cheapest fills of fresh shared memory,
# in one run: builds wb_bench_hostload (bench/hostload.c) if BUILD is not
# built, writes a checkpoint of GIB GiB (4 by default; less when memory is
# short: the page cache and one slab must both fit), warms the page cache
# and times every method REPS times in round robin. Prints the table and
# writes the medians to bench/results/hostload.json (or OUT).
#
# usage: bench/hostload.sh [--build DIR] [--gib N] [--reps N] [--out FILE]
# The checkpoint goes to $WB_BENCH_DIR (default: the build directory), which
# should be a disk, not tmpfs: a file in /dev/shm takes shared memory.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$SRC/build GIB=4 REPS=5 OUT=$SRC/bench/results/hostload.json
while [ $# -gt 0 ]; do
  case $1 in
  --build) BUILD=$2 ;;
  --gib) GIB=$2 ;;
  --reps) REPS=$2 ;;
  --out) OUT=$2 ;;
  *) echo "usage: $0 [--build DIR] [--gib N] [--reps N] [--out FILE]" >&2; exit 2 ;;
  esac
  shift 2
done
if [ ! -x "$BUILD/bench/wb_bench_hostload" ]; then
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$BUILD" -j"$(nproc)" --target wb_bench_hostload >/dev/null
fi
# The cache and a slab at once, and room to spare: 2.5 times the file.
avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
shm_kib=$(df -k --output=avail /dev/shm | tail -1)
fit=$(awk -v m="$avail_kib" -v s="$shm_kib" -v g="$GIB" \
  'BEGIN { f = m / 2.5 / 1048576; if (s / 1.2 / 1048576 < f) f = s / 1.2 / 1048576;
           if (f < g) g = int(f * 4) / 4; print g }')
if [ "$fit" != "$GIB" ]; then
  echo "only $fit GiB fit in memory and /dev/shm (asked for $GIB)" >&2
  GIB=$fit
fi
DIR=${WB_BENCH_DIR:-$BUILD}
FILE=$DIR/hostload-$GIB.safetensors
mkdir -p "$DIR" "$(dirname "$OUT")"
trap 'rm -f "$FILE"' EXIT
echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $((avail_kib / 1048576)) GiB available, kernel $(uname -r)"
"$BUILD/bench/wb_bench_hostload" make "$FILE" "$GIB"
# Written back now, so that the flush does not run during the timings.
sync "$FILE"
"$BUILD/bench/wb_bench_hostload" run "$FILE" --reps "$REPS" --json "$OUT"
echo "wrote $OUT"
