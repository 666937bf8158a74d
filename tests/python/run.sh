#!/usr/bin/env bash
# The Python package's tests, run the way a user installs it: `pip install`
# of python/ into a virtual environment made with --system-site-packages (so
# that Debian's python3-torch and python3-numpy are visible), then a test
# file of tests/python (default test_weightbroker.py; test_compile.py tests
# weightbroker.compile) with that environment's interpreter against the
# libwbclient.so of this build.
#
#   tests/python/run.sh [TEST_FILE]
#
# Environment: WB_BIN_DIR (the build directory), WB_SOURCE_DIR (the sources).
# Exit status 77 (skipped) when no python3 has torch and numpy.
set -uo pipefail
: "${WB_BIN_DIR:?WB_BIN_DIR must name the build directory}"
: "${WB_SOURCE_DIR:?WB_SOURCE_DIR must name the source tree}"
TEST=$WB_SOURCE_DIR/tests/python/${1:-test_weightbroker.py}

fail() {
  echo "python tests: FAIL: $*" >&2
  exit 1
}

# python3 on PATH may be another installation than Debian's, which is where
# python3-torch and python3-numpy land: use the first that has both.
PY=
for p in python3 /usr/bin/python3; do
  if "$p" -c 'import torch, numpy, venv' 2>/dev/null; then
    PY=$p
    break
  fi
done
if [ -z "$PY" ]; then
  echo "python tests: SKIPPED: no python3 with torch, numpy and venv (scripts/setup.sh installs python3-torch, python3-numpy and python3-venv)" >&2
  exit 77
fi

[ -f "$TEST" ] || fail "no test file $TEST"
LIB=$WB_BIN_DIR/client/libwbclient.so
[ -e "$LIB" ] || fail "missing $LIB (build every target first)"

T=$(mktemp -d /tmp/wbpy.XXXXXX) || fail "cannot make a temporary directory"
trap 'rm -rf "$T"' EXIT
# Install from a copy: pip writes build files next to the sources.
mkdir "$T/src" && cp -r "$WB_SOURCE_DIR/python/pyproject.toml" "$WB_SOURCE_DIR/python/README.md" \
  "$WB_SOURCE_DIR/python/weightbroker" "$T/src/" || fail "cannot copy python/"
"$PY" -m venv --system-site-packages "$T/venv" || fail "python3 -m venv failed"
# --no-build-isolation --no-index: build with the system's setuptools, offline.
"$T/venv/bin/pip" install -q --no-build-isolation --no-index "$T/src" >"$T/pip.log" 2>&1 ||
  fail "pip install ./python failed: $(cat "$T/pip.log")"
cd "$T" || fail "cd $T"
where=$("$T/venv/bin/python" -c 'import weightbroker; print(weightbroker.__file__)') ||
  fail "the installed package does not import"
case $where in
  "$T/venv/"*) ;;
  *) fail "weightbroker was imported from $where, not from the virtual environment" ;;
esac
# Not exec'd: the EXIT trap removes the environment afterwards.
WB_CLIENT_LIBRARY=$LIB "$T/venv/bin/python" -W error::ResourceWarning "$TEST" -v
