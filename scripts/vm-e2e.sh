#!/usr/bin/env bash
# vm-e2e.sh — host side of the ublk end-to-end test: builds ftlblk (release), checks the
# clear error the CLI gives where the kernel has no ublk (this host), then boots the
# 6.12 VM with scripts/vm-run.sh and runs scripts/e2e-guest.sh inside it.
#
# Usage: scripts/vm-e2e.sh [--no-deps] [--no-build]
#   --no-deps   skip scripts/install-deps.sh --vm (idempotent, but needs root/apt)
#   --no-build  test the binary already at $FTLBLK_BIN, $CARGO_TARGET_DIR/release/ftlblk
#               or target/release/ftlblk instead of running `cargo build --release`:
#               scripts/test.sh's `cargo test` has just built it for tests/cli.rs (with the
#               tests' features: a plain build compiled ftl, the cleaner, libublk and the
#               binary again, 75 s)
#
# Environment: FTLBLK_VM_TIMEOUT (seconds for boot + test, default 1500), FTLBLK_VM_MEMORY
# (guest RAM, default 4G: the backings live on a tmpfs in the guest), and every
# FTLBLK_E2E_* knob of e2e-guest.sh (passed into the guest by vm-run.sh).
# Exit status: the guest test's status; 124/125 when the VM times out or cannot boot.
set -euo pipefail
cd "$(dirname "$0")/.."

deps=1
build=1
for a in "$@"; do
    case "$a" in
        --no-deps) deps=0 ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "vm-e2e: unknown argument $a" >&2; exit 2 ;;
    esac
done
fail() { echo "vm-e2e: FAIL: $*" >&2; exit 1; }

[ "$deps" = 1 ] && scripts/install-deps.sh --vm
# The binary scripts/e2e-guest.sh runs in the guest.
bin="${FTLBLK_BIN:-${CARGO_TARGET_DIR:-target}/release/ftlblk}"
if [ "$build" = 1 ]; then
    echo "== cargo build --release"
    cargo build --release
else
    [ -x "$bin" ] || fail "--no-build, but there is no binary at $bin (cargo build --release, or cargo test builds it)"
    echo "== testing $bin as built ($(date -r "$bin" '+%F %T'))"
fi

if [ ! -e /dev/ublk-control ]; then
    echo "== host without ublk: the CLI must say so"
    no_ublk="$(mktemp -d /tmp/ftlblk-no-ublk.XXXXXX)"
    if msg="$("$bin" add --backing "$no_ublk/b.img" --size 64M 2>&1)"; then
        fail "add succeeded on a host without ublk"
    fi
    echo "$msg"
    echo "$msg" | grep -q "modprobe ublk_drv" || fail "unclear message without ublk: $msg"
    [ ! -e "$no_ublk/b.img" ] || fail "add created a backing although ublk is missing"
    rm -rf "$no_ublk"
fi

echo "== booting the VM for scripts/e2e-guest.sh"
exec scripts/vm-run.sh --timeout "${FTLBLK_VM_TIMEOUT:-1500}" --memory "${FTLBLK_VM_MEMORY:-4G}" \
    -- scripts/e2e-guest.sh
