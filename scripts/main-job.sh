#!/usr/bin/env bash
# main-job.sh — the README's main job, on a kernel that has ublk_drv (run it through
# scripts/run.sh, which boots a VM when the host kernel lacks ublk).
#
# Creates a sparse backing file, starts /dev/ublkbN on it with `ftlblk add`, makes ext4,
# mounts it, runs a short fio (4 KiB random write with crc32c verify, then random read),
# prints `ftlblk stats`, and (unless FTLBLK_RUN_KEEP=1) unmounts, deletes the device and
# runs `ftlblk check` over the backing.
#
# Environment (set by run.sh): FTLBLK_RUN_SIZE (2G), FTLBLK_RUN_DIR_DATA
# (/var/tmp/ftlblk-run), FTLBLK_RUN_FIO_SECONDS (20), FTLBLK_RUN_KEEP (0), FTLBLK_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin:/sbin"
# Where cargo put it (CARGO_TARGET_DIR is passed into the guest): an old binary under
# ./target was tested instead when it was set.
BIN="${FTLBLK_BIN:-${CARGO_TARGET_DIR:-target}/release/ftlblk}"
case "$BIN" in /*) ;; *) BIN="$(pwd)/$BIN" ;; esac
SIZE="${FTLBLK_RUN_SIZE:-2G}"
DIR="${FTLBLK_RUN_DIR_DATA:-/var/tmp/ftlblk-run}"
SECS="${FTLBLK_RUN_FIO_SECONDS:-20}"
KEEP="${FTLBLK_RUN_KEEP:-0}"
IMG="$DIR/backing.img"
MNT="$DIR/mnt"

[ -e /dev/ublk-control ] || modprobe ublk_drv
mkdir -p "$MNT"
echo "== ftlblk add --backing $IMG --size $SIZE"
out="$("$BIN" add --backing "$IMG" --size "$SIZE")"
echo "$out"
ID="$(echo "$out" | grep -o '"id": *[0-9]*' | grep -o '[0-9]*$')"
DEV="/dev/ublkb$ID"
cleanup() {
    if [ "$KEEP" = 1 ]; then return; fi
    set +e
    mountpoint -q "$MNT" && umount "$MNT"
    "$BIN" del -n "$ID"
}
trap cleanup EXIT

echo "== mkfs.ext4 $DEV; mount on $MNT"
mkfs.ext4 -q -F "$DEV"
mount "$DEV" "$MNT"
echo "== fio: 4 KiB random write with crc32c verify, then random read (${SECS}s each)"
fio --name=randwrite --directory="$MNT" --filename=fio.dat --size=256M --bs=4k \
    --rw=randwrite --ioengine=io_uring --direct=1 --iodepth=32 --runtime="$SECS" \
    --time_based --verify=crc32c --verify_fatal=1 --verify_state_save=0 --verify_backlog=4096 --group_reporting \
    | grep -E "IOPS|err="
fio --name=randread --directory="$MNT" --filename=fio.dat --size=256M --bs=4k \
    --rw=randread --ioengine=io_uring --direct=1 --iodepth=32 --runtime="$SECS" \
    --time_based --group_reporting | grep -E "IOPS|err="
sync
echo "== ftlblk stats -n $ID"
"$BIN" stats -n "$ID"
if [ "$KEEP" = 1 ]; then
    echo "== left $DEV mounted on $MNT (ftlblk del -n $ID to remove it)"
    exit 0
fi
umount "$MNT"
"$BIN" del -n "$ID"
trap - EXIT
echo "== ftlblk check --backing $IMG"
"$BIN" check --backing "$IMG" --no-data
echo "== done: backing $IMG (index $IMG.ftlidx) kept; ftlblk add --backing $IMG serves it again"
