#!/usr/bin/env bash
# run.sh — the main job on a fresh machine.
#
# Usage: scripts/run.sh [--size 2G] [--dir /var/tmp/ftlblk-run]
#
# Today (before the ublk front end lands): builds ftlblk, creates a sparse backing file,
# formats it, runs the in-process benchmark on it and prints the device's figures.
# With the ublk server it will start /dev/ublkbN (inside a VM where the host kernel has
# no ublk), make ext4, mount it, run a short fio and print `ftlblk stats`.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE=2G
DIR=/var/tmp/ftlblk-run
while [ $# -gt 0 ]; do
    case "$1" in
        --size) SIZE=$2; shift 2 ;;
        --dir) DIR=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
scripts/install-deps.sh --host
cargo build --release
mkdir -p "$DIR"
BIN=target/release/ftlblk
"$BIN" format --backing "$DIR/backing.img" --size "$SIZE" --force
"$BIN" bench --backing "$DIR/backing.img" --size "$SIZE" --flush-ops 5000
"$BIN" info --backing "$DIR/backing.img"
