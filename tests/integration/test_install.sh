#!/usr/bin/env bash
# `cmake --install` into a temporary prefix: the programs, every public
# header, the shared and static library, wbclient.pc, the CMake package, the
# man pages and the bash and zsh completion land under it; a small program
# builds against it with pkg-config and with find_package(wbclient), shared
# and static, and runs (it prints wb_strerror(WB_EBUSY) and connects to a
# missing socket); the
# shared library exports only public wb_ symbols; the installed programs
# run, and the installed completion completes them; the man pages format
# without warnings and document every option.
source "$(dirname "$0")/lib.sh"

: "${WB_SOURCE_DIR:?WB_SOURCE_DIR must name the source tree}"
command -v pkg-config >/dev/null || fail "pkg-config is needed"
command -v cc >/dev/null || fail "a C compiler (cc) is needed"

PREFIX=$WB_TMP/prefix
cmake --install "$WB_BIN_DIR" --prefix "$PREFIX" >"$WB_TMP/install.log" 2>&1 ||
  fail "cmake --install failed: $(tail -n 20 "$WB_TMP/install.log")"

export PKG_CONFIG_PATH=
for d in "$PREFIX"/lib*/pkgconfig "$PREFIX"/lib/*/pkgconfig; do
  [ -f "$d/wbclient.pc" ] && PKG_CONFIG_PATH=$d
done
[ -n "$PKG_CONFIG_PATH" ] || fail "no wbclient.pc under $PREFIX"
LIBDIR=$(pkg-config --variable=libdir wbclient) || fail "pkg-config cannot read wbclient.pc"
# The file is relocatable: its libdir is inside this prefix.
[ "$(cd "$LIBDIR" && pwd -P)" = "$(cd "$(dirname "$PKG_CONFIG_PATH")" && pwd -P)" ] ||
  fail "wbclient.pc's libdir $LIBDIR is not where it was installed"
[ "$(pkg-config --modversion wbclient)" = "$("$WBROKERD" --version | head -n 1 | cut -d' ' -f2)" ] ||
  fail "wbclient.pc's version is not the broker's"

for f in sbin/wbrokerd bin/wbctl bin/wb-demo-worker share/man/man8/wbrokerd.8 share/man/man1/wbctl.1 \
  share/doc/weightbroker/examples/wbroker.conf share/doc/weightbroker/examples/wbrokerd.service \
  share/bash-completion/completions/wbctl share/bash-completion/completions/wbrokerd \
  share/zsh/vendor-completions/_wbctl share/zsh/vendor-completions/_wbrokerd; do
  [ -e "$PREFIX/$f" ] || fail "$f was not installed"
done
for h in "$WB_SOURCE_DIR"/include/wb/*.h; do
  [ -f "$PREFIX/include/wb/$(basename "$h")" ] || fail "header $(basename "$h") was not installed"
done
for f in libwbclient.a libwbclient.so "$(readlink "$LIBDIR/libwbclient.so")"; do
  [ -e "$LIBDIR/$f" ] || fail "$LIBDIR/$f was not installed"
done
CMAKE_DIR=$LIBDIR/cmake/wbclient
[ -f "$CMAKE_DIR/wbclientConfig.cmake" ] && [ -f "$CMAKE_DIR/wbclientConfigVersion.cmake" ] ||
  fail "the CMake package is missing from $CMAKE_DIR"

# Only the public API leaves the shared library.
nm -D --defined-only "$LIBDIR/libwbclient.so" | awk '$2 ~ /^[TDBRV]$/ {print $3}' >"$WB_TMP/exports"
[ -s "$WB_TMP/exports" ] || fail "libwbclient.so exports nothing"
bad=$(grep -v '^wb_' "$WB_TMP/exports" | grep -vE '^(_init|_fini|_edata|_end|__bss_start)$' || true)
[ -z "$bad" ] || fail "libwbclient.so exports non-public symbols: $(echo "$bad" | tr "\n" " " | head -c 300)"
grep -q '^wb__' "$WB_TMP/exports" && fail "libwbclient.so exports internal wb__ symbols"

# The installed programs run.
"$PREFIX/sbin/wbrokerd" --version >"$WB_TMP/version.out" 2>&1 || fail "the installed wbrokerd does not run"
"$PREFIX/bin/wbctl" --help >/dev/null 2>&1 || fail "the installed wbctl does not run"
# The installed bash completion works with the installed programs: it
# registers itself for the program's name and reads the program's --help.
for prog in bin/wbctl:leases:lea sbin/wbrokerd:--backend:--ba; do
  IFS=: read -r bin want word <<<"$prog"
  got=$(bash -c 'source "$1"; name=$(basename "$2")
complete -p "$name" >/dev/null || exit 1
fn=$(complete -p "$name" | sed "s/.*-F \([^ ]*\) .*/\1/")
COMP_WORDS=("$2" "$3"); COMP_CWORD=1; "$fn"; echo "${COMPREPLY[*]}"' _ \
    "$PREFIX/share/bash-completion/completions/$(basename "$bin")" "$PREFIX/$bin" "$word") ||
    fail "the installed bash completion of $(basename "$bin") does not register"
  [ "$got" = "$want" ] || fail "the installed bash completion of '$(basename "$bin") $word' offers '$got', not '$want'"
done
if command -v zsh >/dev/null; then
  for f in _wbctl _wbrokerd; do
    zsh -n "$PREFIX/share/zsh/vendor-completions/$f" || fail "the installed $f does not parse in zsh"
    head -n 1 "$PREFIX/share/zsh/vendor-completions/$f" | grep -qx "#compdef ${f#_}" ||
      fail "the installed $f does not name its program"
  done
else
  log "!!! zsh is not installed: the zsh completion was NOT checked"
fi
# The example worker finds the installed libwbclient.so by itself.
env -u LD_LIBRARY_PATH "$PREFIX/bin/wb-demo-worker" --help >/dev/null 2>&1 ||
  fail "the installed wb-demo-worker does not run: $(env -u LD_LIBRARY_PATH "$PREFIX/bin/wb-demo-worker" --help 2>&1 | head -n 3)"

# A consumer, built four ways. Under the sanitizers, the library's objects
# need the sanitizer runtime in the program too.
EXTRA_CFLAGS=
if grep -q '^WB_SANITIZE:BOOL=ON' "$WB_BIN_DIR/CMakeCache.txt" 2>/dev/null; then
  EXTRA_CFLAGS="-fsanitize=address,undefined"
fi
APP=$WB_TMP/app
mkdir -p "$APP"
cat >"$APP/app.c" <<'EOF'
#include <wb/client.h>

#include <stdio.h>

int main(void)
{
    printf("%s\n", wb_strerror(WB_EBUSY));
    wb_client_options opts;
    wb_client_options_init(&opts);
    opts.socket_path = "/nonexistent/broker.sock";
    wb_client *c = NULL;
    int rc = wb_client_connect(&opts, &c);
    printf("%s: %s\n", wb_status_name(rc), c ? wb_client_errmsg(c) : "(no client)");
    wb_client_destroy(&c);
    return rc == WB_ECONN ? 0 : 1;
}
EOF
cat >"$APP/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(wbclient_consumer C)
find_package(wbclient 0.1 REQUIRED)
add_executable(app_shared app.c)
target_link_libraries(app_shared PRIVATE wbclient::wbclient)
add_executable(app_static app.c)
target_link_libraries(app_static PRIVATE wbclient::wbclient_static)
EOF

# run_app NAME: runs a built consumer and checks what it printed.
run_app() {
  local bin=$1
  LD_LIBRARY_PATH=$LIBDIR "$bin" >"$WB_TMP/app.out" 2>"$WB_TMP/app.err" ||
    fail "$(basename "$bin") failed: $(cat "$WB_TMP/app.out" "$WB_TMP/app.err")"
  [ "$(head -n 1 "$WB_TMP/app.out")" = "resource busy" ] || fail "$(basename "$bin") printed $(cat "$WB_TMP/app.out")"
  grep -qx "WB_ECONN: no broker socket at /nonexistent/broker.sock: No such file or directory" "$WB_TMP/app.out" ||
    fail "$(basename "$bin") printed $(cat "$WB_TMP/app.out")"
}

# needs_libwbclient BIN: the program loads libwbclient.so at run time.
needs_libwbclient() {
  readelf -d "$1" | grep -q 'NEEDED.*libwbclient\.so'
}

# pkg-config, shared.
# shellcheck disable=SC2046
cc $EXTRA_CFLAGS -o "$APP/pc_shared" "$APP/app.c" $(pkg-config --cflags --libs wbclient) \
  2>"$WB_TMP/cc.err" || fail "building with pkg-config (shared) failed: $(cat "$WB_TMP/cc.err")"
needs_libwbclient "$APP/pc_shared" || fail "pc_shared does not use libwbclient.so"
run_app "$APP/pc_shared"
# pkg-config, static: the archive plus Libs.private.
# shellcheck disable=SC2046
cc $EXTRA_CFLAGS -o "$APP/pc_static" "$APP/app.c" $(pkg-config --cflags wbclient) \
  $(pkg-config --static --libs wbclient | sed 's/-lwbclient /-l:libwbclient.a /') \
  2>"$WB_TMP/cc.err" || fail "building with pkg-config (static) failed: $(cat "$WB_TMP/cc.err")"
needs_libwbclient "$APP/pc_static" && fail "pc_static still loads libwbclient.so"
run_app "$APP/pc_static"

# CMake, shared and static.
cmake -S "$APP" -B "$APP/build" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_C_FLAGS="$EXTRA_CFLAGS" \
  -DCMAKE_EXE_LINKER_FLAGS="$EXTRA_CFLAGS" >"$WB_TMP/cmake.log" 2>&1 ||
  fail "configuring with find_package(wbclient) failed: $(tail -n 20 "$WB_TMP/cmake.log")"
cmake --build "$APP/build" >"$WB_TMP/build.log" 2>&1 || fail "building with CMake failed: $(tail -n 20 "$WB_TMP/build.log")"
needs_libwbclient "$APP/build/app_shared" || fail "app_shared does not use libwbclient.so"
needs_libwbclient "$APP/build/app_static" && fail "app_static still loads libwbclient.so"
run_app "$APP/build/app_shared"
run_app "$APP/build/app_static"
# An incompatible version is refused.
sed -i 's/find_package(wbclient 0.1 REQUIRED)/find_package(wbclient 1.0 REQUIRED)/' "$APP/CMakeLists.txt"
cmake -S "$APP" -B "$APP/build2" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null 2>&1 &&
  fail "find_package(wbclient 1.0) accepted version $(pkg-config --modversion wbclient)"

# Man pages: they format without warnings and name every option.
MAN8=$PREFIX/share/man/man8/wbrokerd.8
MAN1=$PREFIX/share/man/man1/wbctl.1
if command -v groff >/dev/null; then
  for page in "$MAN8" "$MAN1"; do
    groff -man -Tutf8 -ww -z "$page" >"$WB_TMP/groff.out" 2>&1 || fail "groff failed on $page"
    [ ! -s "$WB_TMP/groff.out" ] || fail "groff warns about $(basename "$page"): $(cat "$WB_TMP/groff.out")"
  done
  MANWIDTH=200 man -l "$MAN8" 2>/dev/null | grep -q "wbrokerd - share model weights" || fail "man -l $MAN8 shows no NAME"
elif command -v mandoc >/dev/null; then
  mandoc -T lint -W warning "$MAN8" "$MAN1" || fail "mandoc found problems in the man pages"
else
  log "!!! neither groff nor mandoc is installed: the man pages were NOT formatted"
fi
"$PREFIX/bin/wbctl" --help >"$WB_TMP/ctlhelp.out"
grep -oE -- '--[a-z][a-z-]+' "$WB_TMP/ctlhelp.out" | sort -u >"$WB_TMP/ctlopts"
grep -q -- '--socket' "$WB_TMP/ctlopts" || fail "wbctl --help names no --socket"
while read -r opt; do
  grep -qF -- "$(printf '%s' "$opt" | sed 's/-/\\-/g')" "$MAN1" || fail "wbctl.1 does not document $opt"
done <"$WB_TMP/ctlopts"
for cmd in $(sed -n '/^commands:/,/^$/p' "$WB_TMP/ctlhelp.out" | awk 'NF > 1 {print $1}'); do
  grep -q "^\.B.* $cmd\b\|^\.B $cmd$\|^\.BI $cmd " "$MAN1" || fail "wbctl.1 does not describe the command $cmd"
  "$PREFIX/bin/wbctl" "$cmd" --help >"$WB_TMP/cmdhelp.out" 2>&1 || fail "wbctl $cmd --help failed"
  grep -q -- '--json' "$WB_TMP/cmdhelp.out" || fail "wbctl $cmd --help does not describe --json"
done
true
