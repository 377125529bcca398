#!/usr/bin/env bash
# run.sh — the main job on a fresh machine: a real /dev/ublkbN served by ftlblk.
#
# Usage: scripts/run.sh [--size 2G] [--dir /var/tmp/ftlblk-run] [--fio-seconds 20] [--keep]
#
# 1. installs what it needs (scripts/install-deps.sh) and builds ftlblk (release);
# 2. runs scripts/main-job.sh: creates a sparse backing file of --size in --dir,
#    `ftlblk add` (formats it, starts /dev/ublkbN), mkfs.ext4, mounts it, runs a short fio
#    (4 KiB random writes with crc32c verify, then random reads) on a file in it, prints
#    `ftlblk stats`, unmounts, `ftlblk del`, and runs the offline checker `ftlblk check`.
#    Where this kernel has ublk_drv it runs directly (--keep leaves the device up and
#    mounted); where it does not (this project's machines), it boots Debian's 6.12 kernel
#    in a QEMU VM (software emulation, see scripts/vm-run.sh) and runs it inside, with
#    --dir shared so the backing file stays on the host afterwards.
# Figures from the VM are correctness-grade only; performance: scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=2G
DIR=/var/tmp/ftlblk-run
FIO_SECONDS=20
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --size) SIZE=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        --fio-seconds) FIO_SECONDS=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd -P)"
export FTLBLK_RUN_SIZE="$SIZE" FTLBLK_RUN_DIR_DATA="$DIR" FTLBLK_RUN_FIO_SECONDS="$FIO_SECONDS" FTLBLK_RUN_KEEP="$KEEP"

# install-deps.sh installs Rust under ~/.cargo when the machine has none (as test.sh
# does, its bin is put on the PATH here: without it a fresh machine stopped at "cargo:
# command not found"; found by review, 2026-11-29).
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if [ -e /dev/ublk-control ] || modprobe ublk_drv 2>/dev/null; then
    scripts/install-deps.sh --host
    cargo build --release
    exec scripts/main-job.sh
fi
echo "run.sh: this kernel ($(uname -r)) has no ublk_drv: running the job in a VM with Debian's 6.12 kernel"
scripts/install-deps.sh --vm
cargo build --release
[ "$KEEP" = 0 ] || echo "run.sh: --keep has no effect in the VM (the device ends with it)"
exec scripts/vm-run.sh --timeout 1800 --rwdir "$DIR" -- scripts/main-job.sh
