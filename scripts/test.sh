#!/usr/bin/env bash
# Runs the whole test suite: setup, a normal build with every test, the same
# tests under AddressSanitizer + UndefinedBehaviorSanitizer, a short run of each
# libFuzzer target, and a clang-format check. Ends with one summary line.
#
#   scripts/test.sh            everything
#   WB_FUZZ_SECONDS=60 scripts/test.sh   longer fuzzing
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc 2>/dev/null || echo 2)
fuzz_seconds=${WB_FUZZ_SECONDS:-20}
passed=0
failed=0
failures=()

step() { printf '\n== %s\n' "$*"; }

# ctest_run DIR LABEL [ENV...]: runs ctest in DIR and adds its counts.
ctest_run() {
  local dir=$1 label=$2
  shift 2
  local log="$dir/ctest.log"
  env "$@" ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 300 2>&1 | tee "$log"
  local line total nfail
  line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    failed=$((failed + 1))
    failures+=("$label: ctest did not run")
    return
  fi
  total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
  nfail=$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")
  if [ "$total" -eq 0 ]; then
    failed=$((failed + 1))
    failures+=("$label: no tests ran")
    return
  fi
  passed=$((passed + total - nfail))
  failed=$((failed + nfail))
  [ "$nfail" -eq 0 ] || failures+=("$label: $nfail failed")
}

# build DIR TARGET [CMAKE ARGS...]
build() {
  local dir=$1 target=$2
  shift 2
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWB_WERROR=ON "$@" >"$dir/cmake.log" 2>&1 || {
    tail -n 20 "$dir/cmake.log"
    return 1
  }
  cmake --build "$dir" -j "$jobs" --target "$target" >"$dir/build.log" 2>&1 || {
    grep -E 'error|warning' "$dir/build.log" | head -n 40
    tail -n 20 "$dir/build.log"
    return 1
  }
}

step "setup"
if [ "${WB_SKIP_SETUP:-0}" != 1 ]; then
  bash scripts/setup.sh || { echo "summary: 0 passed, 1 failed (setup)"; exit 1; }
fi

step "build (release, -Wall -Wextra -Werror)"
mkdir -p build
if build build all; then
  step "tests"
  ctest_run build release
else
  failed=$((failed + 1))
  failures+=("release build failed")
fi

step "build (AddressSanitizer + UndefinedBehaviorSanitizer)"
mkdir -p build-asan
if build build-asan all -DWB_SANITIZE=ON; then
  step "tests under ASan + UBSan"
  # protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap is.
  ctest_run build-asan sanitizers \
    ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 WB_SANITIZED=1
else
  failed=$((failed + 1))
  failures+=("sanitizer build failed")
fi

# A user's build: Release (-O3) with gcc and with clang, warnings as errors
# so that a warning only the optimiser sees cannot creep back. Compile only.
for cc in gcc clang; do
  step "build (Release, $cc, compile only)"
  if build "build-release-$cc" all -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc"; then
    echo "release build with $cc: ok"
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("Release build with $cc failed")
  fi
done

step "fuzzers (${fuzz_seconds}s each)"
mkdir -p build-fuzz
if build build-fuzz fuzzers -DCMAKE_C_COMPILER=clang -DWB_FUZZ=ON; then
  for fz in build-fuzz/tests/fuzz/fuzz_*; do
    [ -x "$fz" ] || continue
    name=$(basename "$fz")
    corpus="build-fuzz/corpus-$name"
    mkdir -p "$corpus"
    dirs=("$corpus")
    [ -d "tests/fuzz/seeds/${name#fuzz_}" ] && dirs+=("tests/fuzz/seeds/${name#fuzz_}")
    if "$fz" -max_total_time="$fuzz_seconds" -max_len=65536 -rss_limit_mb=2048 \
      "${dirs[@]}" >"build-fuzz/$name.log" 2>&1; then
      echo "$name: ok ($(grep -Eo 'Done [0-9]+ runs' "build-fuzz/$name.log" | tail -n 1))"
      passed=$((passed + 1))
    else
      tail -n 40 "build-fuzz/$name.log"
      failed=$((failed + 1))
      failures+=("$name found a crash")
    fi
  done
else
  failed=$((failed + 1))
  failures+=("fuzz build failed")
fi

step "clang-format"
mapfile -t srcs < <(git ls-files '*.c' '*.h' 2>/dev/null)
if [ ${#srcs[@]} -gt 0 ] && clang-format --dry-run -Werror "${srcs[@]}" 2>build/format.log; then
  echo "clang-format: ${#srcs[@]} files clean"
  passed=$((passed + 1))
else
  head -n 40 build/format.log
  failed=$((failed + 1))
  failures+=("clang-format")
fi

echo
for f in "${failures[@]}"; do echo "FAILED: $f"; done
echo "summary: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
