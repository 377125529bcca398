#!/usr/bin/env bash
# vm-selftest.sh — check that scripts/vm-run.sh really boots the 6.12 test VM,
# that ublk works in it, and that the guest command's exit status comes back.
#
# Usage: scripts/vm-selftest.sh [vm-run.sh options, e.g. --timeout 600]
#
# Boots the VM three times (about 20-60 s each under software emulation):
#   1. `modprobe ublk_drv && test -c /dev/ublk-control && uname -r` must exit 0 and
#      print a 6.12 kernel version; it also checks that FTLBLK_* variables reach
#      the guest and that the guest can write into a shared /tmp dir.
#   2. `exit 3` must make vm-run.sh exit 3.
#   3. a guest kernel panic (sysrq c) must make vm-run.sh exit 125 and print the
#      kernel's last messages.
# Exits 0 only if every check passed; ends with a "N passed, N failed" line.
# Prerequisites: scripts/install-deps.sh --vm
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
vm_run="$here/vm-run.sh"
passed=0
failed=0
ok() { echo "vm-selftest: PASS: $*"; passed=$((passed + 1)); }
bad() { echo "vm-selftest: FAIL: $*" >&2; failed=$((failed + 1)); }

work="$(mktemp -d /tmp/ftlblk-vm-selftest.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# --- 1: ublk in the 6.12 guest ---------------------------------------------------
export FTLBLK_SELFTEST_TOKEN="token-$$-$RANDOM"
t0=$(date +%s)
set +e
"$vm_run" "$@" -- "modprobe ublk_drv && test -c /dev/ublk-control && uname -r && echo \"\$FTLBLK_SELFTEST_TOKEN\" > $work/marker" \
    > "$work/out1"
rc1=$?
set -e
t1=$(date +%s)
echo "--- guest output (run 1, $((t1 - t0))s) ---"; cat "$work/out1"; echo "---"
if [ "$rc1" = 0 ]; then ok "modprobe ublk_drv && test -c /dev/ublk-control && uname -r exited 0"
else bad "run 1 exited $rc1 (want 0)"; fi
if grep -q '^6\.12\.' "$work/out1"; then ok "guest kernel is $(grep -m1 '^6\.12\.' "$work/out1")"
else bad "guest output does not show a 6.12 kernel version"; fi
if [ "$(cat "$work/marker" 2>/dev/null || true)" = "$FTLBLK_SELFTEST_TOKEN" ]; then
    ok "guest wrote to the shared /tmp dir and saw FTLBLK_* environment"
else bad "marker file from the guest missing or wrong"; fi

# --- 2: exit status propagation --------------------------------------------------
t0=$(date +%s)
set +e
"$vm_run" "$@" -- 'echo about to exit 3; exit 3'
rc2=$?
set -e
t1=$(date +%s)
if [ "$rc2" = 3 ]; then ok "vm-run.sh propagated guest exit status 3 ($((t1 - t0))s)"
else bad "vm-run.sh exited $rc2 for a guest 'exit 3' (want 3)"; fi

# --- 3: a guest that dies says why ----------------------------------------------------
set +e
"$vm_run" "$@" -- 'echo c > /proc/sysrq-trigger' 2> "$work/err3"
rc3=$?
set -e
if [ "$rc3" = 125 ]; then ok "a guest kernel panic makes vm-run.sh exit 125"
else bad "vm-run.sh exited $rc3 for a guest kernel panic (want 125)"; fi
if grep -q '^vm-run: console: .*sysrq' "$work/err3"; then ok "vm-run.sh printed the panicking kernel's last messages"
else cat "$work/err3" >&2; bad "vm-run.sh did not print the guest kernel's messages after its panic"; fi

echo "vm-selftest: $passed passed, $failed failed"
[ "$failed" = 0 ]
