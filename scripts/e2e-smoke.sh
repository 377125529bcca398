#!/usr/bin/env bash
# e2e-smoke.sh — end-to-end test of the ublk front end. Runs INSIDE a guest whose kernel
# has ublk_drv (normally through scripts/vm-e2e.sh, which boots one); exits non-zero on the
# first failure.
#
# Usage (in the guest, from the repo root): scripts/e2e-smoke.sh
#
# Steps, each printed as "== ...":
#   1. `ftlblk add` of a new sparse backing: /dev/ublkbN with 4 KiB blocks, write-back
#      cache, FUA, discard granularity 4096; `list` shows it.
#   2. ext4: mkfs, mount, 32 MiB of random data + a small tree, md5sums, umount,
#      `e2fsck -fn` clean, remount, checksums match; `stats` (table and JSON).
#   3. fstrim after deleting the big file lowers `mapped_blocks`.
#   4. kill -9 of the daemon while dd writes to the mounted file system, `recover`, the
#      write completes, e2fsck clean, old checksums match.
#   5. a second `add` of the same backing fails with a clear "in use" message; the first
#      daemon keeps serving (re-read after dropping caches).
#   6. `del` then `add` of the same backing: file system intact.
#   7. raw device: blkdiscard of a written range reads back zeros; fio 4 KiB randwrite +
#      verify=crc32c (if fio is installed), and short fio IOPS runs (randwrite, randread)
#      through ftlblk and, for comparison, through a loop device over a file of the same
#      size in the same guest.
#   8. SIGTERM removes the device and the daemon exits 0 with the FTL closed; the backing
#      opens again without recovery work.
#
# Knobs: FTLBLK_BIN (default target/release/ftlblk), FTLBLK_E2E_DIR (default
# /tmp/ftlblk-e2e; must be writable in the guest), FTLBLK_E2E_SIZE (default 1G),
# FTLBLK_E2E_FIO_SECONDS (default 10; 0 skips the IOPS runs).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"

BIN="$(pwd)/${FTLBLK_BIN:-target/release/ftlblk}"
WORK="${FTLBLK_E2E_DIR:-/tmp/ftlblk-e2e}"
SIZE="${FTLBLK_E2E_SIZE:-1G}"
FIO_SECONDS="${FTLBLK_E2E_FIO_SECONDS:-10}"
IMG="$WORK/t.img"
MNT="$WORK/m"
ID=""
LOOPDEV=""

step() { echo; echo "== $*"; }
fail() {
    echo "e2e-smoke: FAIL: $*" >&2
    for l in /run/ftlblk/*.log; do
        [ -e "$l" ] && { echo "--- $l (tail)" >&2; tail -n 30 "$l" >&2; }
    done
    exit 1
}
json_num() { grep -o "\"$1\": *[0-9]*" | head -n1 | grep -o '[0-9]*$'; }
daemon_pid() { json_num pid < "/run/ftlblk/$ID.json"; }
mapped() { "$BIN" stats -n "$ID" --json | json_num mapped_blocks; }

cleanup() {
    set +e
    mountpoint -q "$MNT" 2>/dev/null && umount "$MNT"
    [ -n "$LOOPDEV" ] && losetup -d "$LOOPDEV"
    "$BIN" del --all >/dev/null 2>&1
}
trap cleanup EXIT

[ -x "$BIN" ] || fail "$BIN not built (cargo build --release)"
[ -e /dev/ublk-control ] || modprobe ublk_drv || fail "modprobe ublk_drv failed"
[ -e /dev/ublk-control ] || fail "/dev/ublk-control missing after modprobe"
rm -rf "$WORK"
mkdir -p "$MNT"

# ---------------------------------------------------------------------------------------
step "1. add a new backing ($SIZE, sparse)"
out="$("$BIN" add --backing "$IMG" --size "$SIZE" --queues 2)" || fail "add failed"
echo "$out"
ID="$(echo "$out" | json_num id)"
DEV="/dev/ublkb$ID"
[ -b "$DEV" ] || fail "$DEV is not a block device"
[ "$(blockdev --getss "$DEV")" = 4096 ] || fail "logical block size is not 4096"
[ "$(blockdev --getpbsz "$DEV")" = 4096 ] || fail "physical block size is not 4096"
q="/sys/block/ublkb$ID/queue"
[ "$(cat "$q/discard_granularity")" = 4096 ] || fail "discard granularity is not 4096"
[ "$(cat "$q/write_cache")" = "write back" ] || fail "no volatile write cache advertised"
[ "$(cat "$q/fua")" = 1 ] || fail "FUA not advertised"
[ "$(cat "$q/write_zeroes_max_bytes")" -gt 0 ] || fail "WRITE_ZEROES not advertised"
"$BIN" list | tee /dev/stderr | grep -q "ublkb$ID .*live" || fail "list does not show ublkb$ID live"
"$BIN" list --json | grep -q "\"daemon_running\": true" || fail "list --json"

# ---------------------------------------------------------------------------------------
step "2. ext4: mkfs, write, check, remount, verify"
mkfs.ext4 -q -F "$DEV" || fail "mkfs.ext4"
mount "$DEV" "$MNT" || fail "mount"
dd if=/dev/urandom of="$MNT/big" bs=1M count=32 status=none || fail "dd"
mkdir -p "$MNT/tree"
for i in $(seq 1 50); do head -c $((i * 1500)) /dev/urandom > "$MNT/tree/f$i"; done
(cd "$MNT" && find . -type f ! -name sums -print0 | sort -z | xargs -0 md5sum) > "$WORK/sums"
umount "$MNT"
e2fsck -fn "$DEV" || fail "e2fsck found problems"
mount "$DEV" "$MNT" || fail "remount"
(cd "$MNT" && md5sum --quiet -c "$WORK/sums") || fail "checksums differ after remount"
"$BIN" stats -n "$ID" || fail "stats"
"$BIN" stats -n "$ID" --json | grep -q '"waf"' || fail "stats --json has no waf"

# ---------------------------------------------------------------------------------------
step "3. fstrim lowers mapped_blocks"
cp "$MNT/big" "$MNT/big2"
sync
before="$(mapped)"
rm "$MNT/big2"
sync
fstrim -v "$MNT" || fail "fstrim"
after="$(mapped)"
echo "mapped blocks: $before before, $after after fstrim"
[ "$after" -lt "$before" ] || fail "fstrim did not lower mapped_blocks ($before -> $after)"

# ---------------------------------------------------------------------------------------
step "4. kill -9 of the daemon during writes, then recover"
pid="$(daemon_pid)"
dd if=/dev/urandom of="$MNT/during" bs=1M count=16 conv=fsync status=none &
ddpid=$!
sleep 1
kill -9 "$pid"
sleep 1
[ -e "/dev/ublkc$ID" ] || fail "the device vanished after kill -9 (user recovery not enabled?)"
"$BIN" list | tee /dev/stderr | grep -q "ublkb$ID .*quiesced" || echo "(note: state is not quiesced yet)"
"$BIN" recover -n "$ID" || fail "recover failed"
wait "$ddpid" || fail "dd during the crash failed"
newpid="$(daemon_pid)"
[ "$newpid" != "$pid" ] || fail "recover did not start a new daemon"
(cd "$MNT" && md5sum --quiet -c "$WORK/sums") || fail "checksums differ after recover"
md5sum "$MNT/during" > "$WORK/during.sum"
umount "$MNT"
e2fsck -fn "$DEV" || fail "e2fsck after recover found problems"
mount "$DEV" "$MNT" || fail "mount after recover"
md5sum --quiet -c "$WORK/during.sum" || fail "file written across the crash differs after remount"

# ---------------------------------------------------------------------------------------
step "5. a second add of the same backing fails; the first keeps serving"
if msg="$("$BIN" add --backing "$IMG" 2>&1)"; then
    fail "second add of $IMG succeeded: $msg"
fi
echo "second add failed as it should: $msg"
echo "$msg" | grep -qi "in use" || fail "the message does not say the backing is in use"
sync
echo 3 > /proc/sys/vm/drop_caches
(cd "$MNT" && md5sum --quiet -c "$WORK/sums") || fail "first device broken after the second add"
[ -b "$DEV" ] || fail "$DEV vanished"

# ---------------------------------------------------------------------------------------
step "6. del, then add the same backing again: file system intact"
umount "$MNT"
"$BIN" del -n "$ID" || fail "del failed"
[ ! -e "$DEV" ] || fail "$DEV still exists after del"
[ ! -e "/run/ftlblk/$ID.json" ] || fail "record left after del"
out="$("$BIN" add --backing "$IMG")" || fail "re-add failed"
ID="$(echo "$out" | json_num id)"
DEV="/dev/ublkb$ID"
e2fsck -fn "$DEV" || fail "e2fsck after del+add found problems"
mount "$DEV" "$MNT" || fail "mount after del+add"
(cd "$MNT" && md5sum --quiet -c "$WORK/sums") || fail "checksums differ after del+add"
umount "$MNT"

# ---------------------------------------------------------------------------------------
step "7. raw device: blkdiscard reads zeros; fio verify; IOPS"
dd if=/dev/urandom of="$DEV" bs=1M count=8 seek=16 oflag=direct status=none || fail "raw write"
blkdiscard -f -o $((16 << 20)) -l $((8 << 20)) "$DEV" || fail "blkdiscard"
cmp -n $((8 << 20)) <(dd if="$DEV" bs=1M skip=16 count=8 iflag=direct status=none) /dev/zero \
    || fail "discarded range does not read back as zeros"
dd if=/dev/urandom of="$DEV" bs=1M count=4 seek=32 oflag=direct status=none || fail "raw write"
blkdiscard -f -z -o $((32 << 20)) -l $((4 << 20)) "$DEV" || fail "blkdiscard -z (WRITE_ZEROES)"
cmp -n $((4 << 20)) <(dd if="$DEV" bs=1M skip=32 count=4 iflag=direct status=none) /dev/zero \
    || fail "write-zeroed range does not read back as zeros"
if command -v fio >/dev/null; then
    fio --name=verify --filename="$DEV" --ioengine=io_uring --direct=1 --rw=randwrite \
        --bs=4k --size=64M --iodepth=16 --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --output-format=terse >/dev/null || fail "fio randwrite verify=crc32c"
    echo "fio 4k randwrite + verify=crc32c over 64 MiB: ok"
    fio --name=mixed --filename="$DEV" --ioengine=io_uring --direct=1 --rw=randrw \
        --bsrange=4k-256k --size=64M --offset=128M --iodepth=8 --verify=crc32c \
        --verify_fatal=1 >/dev/null || fail "fio mixed-size verify"
    echo "fio mixed 4k-256k randrw + verify: ok"
    if [ "$FIO_SECONDS" -gt 0 ]; then
        iops() { # dev rw
            fio --name=iops --filename="$1" --ioengine=io_uring --direct=1 --rw="$2" --bs=4k \
                --size=256M --iodepth=32 --time_based --runtime="$FIO_SECONDS" \
                --output-format=json | grep -o '"iops" : [0-9.]*' |
                awk -v rw="$2" '{ v = $3 + 0; if (v > 0) s += v } END { printf "%.0f", s }'
        }
        truncate -s "$SIZE" "$WORK/loop.img"
        dd if=/dev/urandom of="$WORK/loop.img" bs=1M count=256 conv=notrunc status=none
        dd if=/dev/urandom of="$DEV" bs=1M count=256 oflag=direct status=none
        LOOPDEV="$(losetup --direct-io=on -f --show "$WORK/loop.img")"
        for rw in randwrite randread; do
            a="$(iops "$DEV" "$rw")"
            b="$(iops "$LOOPDEV" "$rw")"
            echo "IOPS 4k $rw QD32 ${FIO_SECONDS}s: ftlblk $DEV $a, loop $LOOPDEV $b (emulated VM)"
        done
        losetup -d "$LOOPDEV"
        LOOPDEV=""
    fi
else
    echo "(fio not installed: skipping fio verify and IOPS)"
fi
"$BIN" stats -n "$ID"

# ---------------------------------------------------------------------------------------
step "8. SIGTERM removes the device cleanly"
pid="$(daemon_pid)"
kill -TERM "$pid"
for _ in $(seq 1 600); do [ -e "/proc/$pid" ] && [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || break; sleep 0.1; done
[ ! -e "$DEV" ] || fail "$DEV still exists after SIGTERM"
[ ! -e "/run/ftlblk/$ID.json" ] || fail "record left after SIGTERM"
grep -q "FTL checkpointed and closed" "/run/ftlblk/$ID.log" || fail "daemon did not close the FTL"
grep -qi "panick" "/run/ftlblk/$ID.log" && fail "a daemon panicked"
"$BIN" list | grep -q "ublkb$ID" && fail "list still shows ublkb$ID"
out="$("$BIN" add --backing "$IMG")" || fail "add after SIGTERM failed"
ID="$(echo "$out" | json_num id)"
grep -q '"chunks_replayed":0' "/run/ftlblk/$ID.log" || fail "reopen after a clean stop replayed chunks"
"$BIN" del -n "$ID" || fail "final del"

echo
echo "e2e-smoke: all steps passed"
