#!/usr/bin/env bash
# wbrokerd does not link libzmq: the broker speaks ZMTP itself
# (broker/zmtp.c), and the only code that calls libzmq, the clients'
# request/reply exchange (client/rpc.c, the wbrpc library), is linked by
# libwbclient and wbctl alone. Checked four ways, since a linker that drops
# unused libraries (--as-needed) hides a needless link from the binary:
# no libzmq among what wbrokerd loads (ldd) or names (NEEDED), no zmq_
# symbol that the broker's and the common code's archives call, and no
# libzmq on wbrokerd's link line. wbctl and libwbclient.so, which do use
# libzmq, show that the checks see it where it is.
source "$(dirname "$0")/lib.sh"

command -v readelf >/dev/null || fail "readelf is needed"
command -v nm >/dev/null || fail "nm is needed"
LIBWBCLIENT=$WB_BIN_DIR/client/libwbclient.so
for f in "$WBROKERD" "$WBCTL" "$LIBWBCLIENT"; do
  [ -e "$f" ] || fail "$f is not built"
done

needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

needed "$WBROKERD" >"$WB_TMP/needed.out" || fail "readelf cannot read $WBROKERD"
grep -q '^libc\.so' "$WB_TMP/needed.out" || fail "readelf shows no libc in wbrokerd's NEEDED"
grep -q 'libzmq' "$WB_TMP/needed.out" && fail "wbrokerd needs libzmq: $(tr '\n' ' ' <"$WB_TMP/needed.out")"
ldd "$WBROKERD" >"$WB_TMP/ldd.out" 2>&1 || fail "ldd $WBROKERD failed"
grep -q 'libzmq' "$WB_TMP/ldd.out" && fail "wbrokerd loads libzmq: $(grep libzmq "$WB_TMP/ldd.out")"
for p in "$WBCTL" "$LIBWBCLIENT"; do
  needed "$p" | grep -q '^libzmq' || fail "$(basename "$p") does not need libzmq: the check cannot see it"
done

# The broker's own code and what it shares with the client call no libzmq.
for a in broker/libwbbroker.a common/libwbcommon.a; do
  [ -f "$WB_BIN_DIR/$a" ] || fail "$a is not built"
  calls=$(nm -u "$WB_BIN_DIR/$a" 2>/dev/null | awk '$1 == "U" && $2 ~ /^zmq_/ {print $2}' | sort -u)
  [ -z "$calls" ] || fail "$a calls libzmq: $(echo "$calls" | tr '\n' ' ')"
done
nm -u "$WB_BIN_DIR/client/libwbrpc.a" | grep -q ' zmq_msg_recv$' ||
  fail "libwbrpc.a calls no zmq_msg_recv: the check cannot see libzmq calls"

# The link line, where the build system keeps it (Makefiles: link.txt;
# Ninja: the LINK_LIBRARIES of wbrokerd's build statement).
link=
if [ -f "$WB_BIN_DIR/broker/CMakeFiles/wbrokerd.dir/link.txt" ]; then
  link=$(cat "$WB_BIN_DIR/broker/CMakeFiles/wbrokerd.dir/link.txt")
elif [ -f "$WB_BIN_DIR/build.ninja" ]; then
  link=$(awk '/^build broker\/wbrokerd:/ {on = 1; next} on && /^$/ {exit} on' "$WB_BIN_DIR/build.ninja")
fi
[ -n "$link" ] || fail "cannot find wbrokerd's link line in $WB_BIN_DIR"
grep -q 'libwbbroker\.a' <<<"$link" || fail "wbrokerd's link line does not name libwbbroker.a: $link"
grep -qE 'libzmq|-lzmq' <<<"$link" && fail "wbrokerd's link line names libzmq: $link"
exit 0
