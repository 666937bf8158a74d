#!/usr/bin/env bash
# What an administrator may load, with real processes:
# * a non-root administrator (nobody, 65534, through setpriv, named with
#   --admin-uid) loads only files it could read itself: /etc/shadow is
#   refused without a byte of it in the answer, a 0600 root checkpoint is
#   refused (and so never shared to the socket's group), a sharded checkpoint
#   with one shard it may not read is refused naming that shard;
# * index shards stay in the index's directory: a shard reached through a
#   symbolic link to a directory outside it is refused, one through a link to
#   a directory inside it loads, and a Hugging Face cache layout (shard files
#   that are links from snapshots/REV/ into ../../blobs/) loads;
# * the reload of an evicted model (the memory budget) is judged by the
#   access of the administrator who loaded it.
source "$(dirname "$0")/lib.sh"

need_nobody
"${NOBODY[@]}" "$WBCTL" --help >/dev/null 2>&1 ||
  skip "uid 65534 cannot run $WBCTL (is the build directory reachable for it?)"

export WB_TIMEOUT_MS=3000
chmod 0711 "$WB_TMP"
RUN=$WB_TMP/run
mkdir "$RUN"
chgrp 65534 "$RUN"
chmod 2750 "$RUN"
SOCK=$RUN/broker.sock
export WB_SOCKET=$SOCK
TAIL="the broker loads only what the requesting user can read"

# as_nobody NAME CMD...: runs CMD as uid 65534; output in NAME.out/.err,
# status in EXIT_RC.
as_nobody() {
  local name=$1
  shift
  "${NOBODY[@]}" "$@" >"$WB_TMP/$name.out" 2>"$WB_TMP/$name.err"
  EXIT_RC=$?
}

# shard_index DIR NAME...: writes DIR/model.safetensors.index.json mapping
# each file's tensors to the shard NAME (files already in place).
shard_index() {
  "$PYTHON" - "$@" <<'PY'
import json, os, struct, sys
d, names = sys.argv[1], sys.argv[2:]
wm = {}
for n in names:
    with open(os.path.join(d, n), "rb") as f:
        (hl,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(hl))
    for t in h:
        if t != "__metadata__":
            wm[t] = n
with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": wm}, f)
PY
}

# shard PATH PREFIX: a tensor file of two U8 tensors PREFIX.0 and PREFIX.1
# (shards must not share tensor names).
shard() {
  "$PYTHON" - "$1" "$2" <<'PY'
import json, struct, sys
path, prefix = sys.argv[1], sys.argv[2]
h = {"%s.%d" % (prefix, i): {"dtype": "U8", "shape": [4], "data_offsets": [4 * i, 4 * i + 4]}
     for i in range(2)}
raw = json.dumps(h).encode()
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(raw)) + raw + bytes(range(8)))
PY
}

start_broker --admin-uid 65534

# --- (1) /etc/shadow: refused for what it is to nobody, nothing of it echoed.
as_nobody shadow "$WBCTL" --socket "$SOCK" load x /etc/shadow
[ "$EXIT_RC" = 1 ] || fail "nobody loading /etc/shadow exited with $EXIT_RC, expected 1"
grep -qF "uid 65534 (gid 65534) may not read /etc/shadow (mode 0$(stat -c %a /etc/shadow), owner uid 0, gid $(stat -c %g /etc/shadow)); $TAIL" "$WB_TMP/shadow.err" ||
  fail "unclear refusal: $(cat "$WB_TMP/shadow.err")"
! grep -qi "header" "$WB_TMP/shadow.err" || fail "the refusal talks about a header: $(cat "$WB_TMP/shadow.err")"
model_absent x || fail "model x exists after a refused load"
grep -q "event=load_path_refused model=x" "$BROKER_LOG" || fail "the refusal was not logged"

# --- (2) A root-only checkpoint: refused, so never shared to nogroup.
make_model "$WB_TMP/private.safetensors" 3 7 >/dev/null
chmod 0600 "$WB_TMP/private.safetensors"
as_nobody private "$WBCTL" --socket "$SOCK" load private "$WB_TMP/private.safetensors"
[ "$EXIT_RC" = 1 ] || fail "nobody loading a 0600 root file exited with $EXIT_RC, expected 1"
grep -qF "uid 65534 (gid 65534) may not read $WB_TMP/private.safetensors (mode 0600, owner uid 0, gid 0); $TAIL" "$WB_TMP/private.err" ||
  fail "unclear refusal: $(cat "$WB_TMP/private.err")"
model_absent private || fail "model private exists after a refused load"
[ "$(shm_count "$BROKER_PID")" = 0 ] || fail "a slab was made for a refused load: $(ls /dev/shm/wb-"$BROKER_PID"-*)"
# Root may load it; readable by others, nobody may too.
ctl load private "$WB_TMP/private.safetensors" >/dev/null || fail "root could not load a 0600 root file"
ctl unload private >/dev/null || fail "unload private"
chmod 0644 "$WB_TMP/private.safetensors"
as_nobody private2 "$WBCTL" --socket "$SOCK" load private "$WB_TMP/private.safetensors"
[ "$EXIT_RC" = 0 ] || fail "nobody could not load a 0644 file: $(cat "$WB_TMP/private2.err")"
ctl unload private >/dev/null || fail "unload private"

# --- (3) Sharded: the index readable, one shard not.
CK=$WB_TMP/sharded
mkdir -m 0755 "$CK"
shard "$CK/a.safetensors" sa
shard "$CK/b.safetensors" sb
shard_index "$CK" a.safetensors b.safetensors
chmod 0644 "$CK"/*
chmod 0600 "$CK/b.safetensors"
as_nobody sharded "$WBCTL" --socket "$SOCK" load sharded "$CK"
[ "$EXIT_RC" = 1 ] || fail "nobody loading with an unreadable shard exited with $EXIT_RC, expected 1"
grep -qF "may not read $CK/b.safetensors (mode 0600, owner uid 0, gid 0)" "$WB_TMP/sharded.err" ||
  fail "unclear refusal: $(cat "$WB_TMP/sharded.err")"
model_absent sharded || fail "model sharded exists after a refused load"
chmod 0644 "$CK/b.safetensors"
as_nobody sharded2 "$WBCTL" --socket "$SOCK" load sharded "$CK"
[ "$EXIT_RC" = 0 ] || fail "nobody could not load a readable sharded checkpoint: $(cat "$WB_TMP/sharded2.err")"
ctl unload sharded >/dev/null || fail "unload sharded"

# --- (4) A shard through a symbolic link to a directory outside the index's.
ESC=$WB_TMP/escape
mkdir -m 0755 "$ESC" "$WB_TMP/outside"
shard "$ESC/a.safetensors" ea
shard "$WB_TMP/outside/outside.safetensors" eo
ln -s ../outside "$ESC/esc"
shard_index "$ESC" a.safetensors esc/outside.safetensors
chmod -R a+rX "$ESC" "$WB_TMP/outside"
ctl load escape "$ESC" >"$WB_TMP/escape.out" 2>"$WB_TMP/escape.err"
[ $? = 1 ] || fail "a shard outside the index's directory was loaded"
grep -qF "shard 'esc/outside.safetensors' leaves the index's directory through a symbolic link" "$WB_TMP/escape.err" ||
  fail "unclear refusal: $(cat "$WB_TMP/escape.err")"
model_absent escape || fail "model escape exists after a refused load"
# A link to a directory inside the index's directory is fine.
INS=$WB_TMP/inside
mkdir -p -m 0755 "$INS/real"
shard "$INS/a.safetensors" ia
shard "$INS/real/b.safetensors" ib
ln -s real "$INS/alias"
shard_index "$INS" a.safetensors alias/b.safetensors
ctl load inside "$INS" >/dev/null 2>"$WB_TMP/inside.err" || fail "a link inside the directory was refused: $(cat "$WB_TMP/inside.err")"

# --- (5) A Hugging Face cache: snapshots/REV/NAME -> ../../blobs/HASH.
HF=$WB_TMP/hf
mkdir -p "$HF/blobs" "$HF/snapshots/rev1"
shard "$HF/blobs/1111" ha
shard "$HF/blobs/2222" hb
ln -s ../../blobs/1111 "$HF/snapshots/rev1/model-00001-of-00002.safetensors"
ln -s ../../blobs/2222 "$HF/snapshots/rev1/model-00002-of-00002.safetensors"
shard_index "$HF/snapshots/rev1" model-00001-of-00002.safetensors model-00002-of-00002.safetensors
chmod -R a+rX "$HF"
as_nobody hf "$WBCTL" --socket "$SOCK" load hf "$HF/snapshots/rev1"
[ "$EXIT_RC" = 0 ] || fail "a Hugging Face cache layout did not load: $(cat "$WB_TMP/hf.err")"
[ "$(model_state hf)" = ready ] || fail "model hf is $(model_state hf)"
# The blobs are judged for the peer too.
ctl unload hf >/dev/null || fail "unload hf"
chmod 0600 "$HF/blobs/2222"
as_nobody hf2 "$WBCTL" --socket "$SOCK" load hf "$HF/snapshots/rev1"
[ "$EXIT_RC" = 1 ] || fail "a blob nobody may not read was loaded"
grep -qF "may not read $HF/snapshots/rev1/model-00002-of-00002.safetensors -> $HF/blobs/2222 (mode 0600" "$WB_TMP/hf2.err" ||
  fail "unclear refusal: $(cat "$WB_TMP/hf2.err")"
stop_broker

# --- (5) A reload of an evicted model (the memory budget) is judged by the
# access of the administrator who loaded it, as its load was: a file nobody
# may no longer read is refused, and the model stays evicted.
start_broker --admin-uid 65534 --device-memory-budget 1k --host-memory-budget 1
make_model "$WB_TMP/mine.safetensors" 3 7 >/dev/null
make_model "$WB_TMP/other.safetensors" 3 8 >/dev/null
chmod 0644 "$WB_TMP/mine.safetensors" "$WB_TMP/other.safetensors"
as_nobody mine "$WBCTL" --socket "$SOCK" load mine "$WB_TMP/mine.safetensors"
[ "$EXIT_RC" = 0 ] || fail "nobody could not load mine: $(cat "$WB_TMP/mine.err")"
chmod 0600 "$WB_TMP/mine.safetensors"
ctl load other "$WB_TMP/other.safetensors" >/dev/null || fail "root could not load other"
tier_of() { ctl models --json | json "[m['tier'] for m in d if m['name'] == '$1'][0]"; }
[ "$(tier_of mine)" = evicted ] || fail "mine is $(tier_of mine), not evicted: $(ctl models -o wide)"
"$WORKER" --socket "$SOCK" --model mine --hold 0 >"$WB_TMP/reload.out" 2>&1 &&
  fail "the reload of a file nobody may read was served: $(cat "$WB_TMP/reload.out")"
grep -qF "uid 65534 (gid 65534) may not read $WB_TMP/mine.safetensors (mode 0600" "$WB_TMP/reload.out" ||
  fail "unclear refusal of the reload: $(cat "$WB_TMP/reload.out")"
[ "$(tier_of mine)" = evicted ] || fail "mine is $(tier_of mine) after a refused reload"
[ "$(stat_field restore_failures)" = 1 ] || fail "restore_failures is $(stat_field restore_failures)"
# Readable again: it reloads (and verifies).
chmod 0644 "$WB_TMP/mine.safetensors"
"$WORKER" --socket "$SOCK" --model mine --hold 0 >"$WB_TMP/reload2.out" 2>&1 ||
  fail "the reload failed: $(cat "$WB_TMP/reload2.out")"
grep -q "^verified 3 tensors" "$WB_TMP/reload2.out" || fail "$(cat "$WB_TMP/reload2.out")"
stop_broker
log "PASS"
