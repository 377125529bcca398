#!/usr/bin/env bash
# vm-run.sh — run a command inside a VM that boots Debian's 6.12 kernel (which has
# ublk_drv; the host kernel does not) under QEMU software emulation via virtme-ng.
#
# Usage:
#   scripts/vm-run.sh [--memory 2G] [--cpus 2] [--timeout SECS] [--kernel PATH]
#                     [--rwdir DIR]... [--log FILE] -- <command...>
#
#   One argument after `--` is run as a shell command line (`bash -c "$1"`), e.g.
#       scripts/vm-run.sh -- 'modprobe ublk_drv && ls -l /dev/ublk-control'
#   Several arguments are run as an argv exactly, e.g.
#       scripts/vm-run.sh -- ./target/debug/ftlblk --help
#
#   --memory   guest RAM (default 2G)            --cpus     guest vCPUs (default 2)
#   --timeout  overall limit for boot + command, in seconds (default 900)
#   --kernel   kernel image (default: newest /boot/vmlinuz-6.12*-amd64)
#   --rwdir    extra host dir the guest may write (repeatable); /tmp and the repo
#              root are always writable
#   --log      also append the guest's output to FILE
#
# The guest kernel's console is kept aside (not shown); when the VM dies or times out its
# last 60-80 lines are printed ("vm-run: console: ..."), and when the command fails, its
# warnings (WARNING, BUG, Oops, hung tasks, the OOM killer, I/O errors).
#
# The guest sees the host root fs read-only (writable overlays on /etc, /var, ...),
# runs as root in the current directory, with the host's PATH and these variables
# passed through when set: RUST_LOG RUST_BACKTRACE CARGO_TARGET_DIR and any FTLBLK_*.
# The guest can `modprobe ublk_drv` (modules come from the host's /lib/modules).
# Mount points must go under a writable dir (e.g. /tmp), /mnt is read-only.
#
# Exit status: the command's own exit status, read from a file that the guest
# writes into a shared --rwdir dir. If the VM cannot boot, the kernel or vng is
# missing, or the guest never reports a status, this prints an error on stderr
# and exits 125 (124 on timeout). It never "skips".
#
# The guest's stdout/stderr come out on this script's stdout/stderr, each through a
# pipe (QEMU opens its stdout twice, so redirecting vng straight into a file loses
# lines; piping is safe, so `vm-run.sh ... > file` is fine).
# Install the prerequisites with: scripts/install-deps.sh --vm
set -euo pipefail

die() { echo "vm-run: ERROR: $*" >&2; exit 125; }

memory=2G
cpus=2
timeout_s=900
kernel=""
logfile=""
extra_rw=()

while [ "$#" -gt 0 ]; do
    case "$1" in
        --memory) [ "$#" -ge 2 ] || die "--memory needs a value"; memory="$2"; shift 2 ;;
        --memory=*) memory="${1#*=}"; shift ;;
        --cpus) [ "$#" -ge 2 ] || die "--cpus needs a value"; cpus="$2"; shift 2 ;;
        --cpus=*) cpus="${1#*=}"; shift ;;
        --timeout) [ "$#" -ge 2 ] || die "--timeout needs a value"; timeout_s="$2"; shift 2 ;;
        --timeout=*) timeout_s="${1#*=}"; shift ;;
        --kernel) [ "$#" -ge 2 ] || die "--kernel needs a value"; kernel="$2"; shift 2 ;;
        --kernel=*) kernel="${1#*=}"; shift ;;
        --rwdir) [ "$#" -ge 2 ] || die "--rwdir needs a value"; extra_rw+=("$2"); shift 2 ;;
        --rwdir=*) extra_rw+=("${1#*=}"); shift ;;
        --log) [ "$#" -ge 2 ] || die "--log needs a value"; logfile="$2"; shift 2 ;;
        --log=*) logfile="${1#*=}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        *) die "unknown option '$1' (put the command after --)" ;;
    esac
done
[ "$#" -gt 0 ] || die "no command given (usage: vm-run.sh [options] -- <command...>)"
case "$timeout_s" in ''|*[!0-9]*) die "--timeout must be a whole number of seconds" ;; esac

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"

# --- Find the tools and the kernel -------------------------------------------
vng_bin="$(command -v vng 2>/dev/null || true)"
for c in /usr/local/bin/vng /opt/virtme-ng/bin/vng; do
    [ -n "$vng_bin" ] && break
    [ -x "$c" ] && vng_bin="$c"
done
[ -n "$vng_bin" ] || die "vng (virtme-ng) not found; run scripts/install-deps.sh --vm"
# vng starts its helper virtme-run through PATH: make sure its venv is on PATH.
vng_dir="$(dirname "$(readlink -f "$vng_bin")")"
export PATH="$vng_dir:$PATH"
command -v virtme-run >/dev/null 2>&1 || die "virtme-run not found next to $vng_bin; run scripts/install-deps.sh --vm"
command -v qemu-system-x86_64 >/dev/null 2>&1 || die "qemu-system-x86_64 not found; run scripts/install-deps.sh --vm"

if [ -z "$kernel" ]; then
    kernel="$(for k in /boot/vmlinuz-6.12*-amd64; do [ -e "$k" ] && echo "$k"; done | sort -V | tail -n1 || true)"
    [ -n "$kernel" ] || die "no /boot/vmlinuz-6.12*-amd64 kernel found; run scripts/install-deps.sh --vm"
fi
[ -r "$kernel" ] || die "kernel image $kernel not readable"
kver="${kernel##*/vmlinuz-}"
[ -d "/lib/modules/$kver" ] || die "no /lib/modules/$kver for kernel $kernel (the guest could not load ublk_drv)"

# --- Shared status dir and the guest-side script --------------------------------
# /tmp is shared read-write with the guest under the same path.
state="$(mktemp -d /tmp/ftlblk-vm.XXXXXX)"
# The VM's process group: timeout(1) makes one of its own for vng and qemu, so a signal
# to this script (CI cancelling the job, Ctrl-C, the suite's own timeout) did not reach
# them, and the VM kept two emulated CPUs busy for up to --timeout, writing into /tmp
# (found by review, 2026-11-29). Its group is found by this run's unique guest script.
# shellcheck disable=SC2317  # called through the trap
stop_vm() {
    local p g mine
    mine="$(ps -o pgid= -p $$ | tr -d ' ')"
    for p in $(pgrep -f -- "$state/guest.sh" || true); do
        g="$(ps -o pgid= -p "$p" 2>/dev/null | tr -d ' ')"
        if [ -n "$g" ] && [ "$g" != "$mine" ]; then kill -TERM -- "-$g" 2>/dev/null || true; fi
    done
}
# shellcheck disable=SC2317  # called through the trap
cleanup() { trap '' PIPE; stop_vm; [ -n "${VM_RUN_KEEP:-}" ] || rm -rf "$state"; }
trap cleanup EXIT
# SIGPIPE ignored first: a Ctrl-C also ends the reader of this script's output (test.sh's
# tee), and the message into the closed pipe killed the script before its EXIT trap.
trap 'trap "" PIPE; stop_vm; echo "vm-run: interrupted: stopped the VM" >&2 2>/dev/null; exit 130' INT
trap 'trap "" PIPE; stop_vm; echo "vm-run: terminated: stopped the VM" >&2 2>/dev/null; exit 143' TERM HUP

# shellcheck disable=SC2016  # $rc is meant to expand in the guest, not here
{
    echo '#!/bin/bash'
    echo '# generated by vm-run.sh; runs inside the guest'
    printf 'export PATH=%q\n' "$PATH"
    for v in RUST_LOG RUST_BACKTRACE CARGO_TARGET_DIR $(compgen -v FTLBLK_ || true); do
        if [ -n "${!v+x}" ]; then printf 'export %s=%q\n' "$v" "${!v}"; fi
    done
    printf 'cd %q || { echo "vm-run(guest): cannot cd to %q" >&2; exit 1; }\n' "$PWD" "$PWD"
    if [ "$#" -eq 1 ]; then
        printf 'bash -c %q </dev/null\n' "$1"
    else
        printf '%q ' "$@"; echo '</dev/null'
    fi
    echo 'rc=$?'
    printf 'echo "$rc" > %q.tmp && mv %q.tmp %q\n' "$state/status" "$state/status" "$state/status"
    echo 'sync'
    echo 'exit "$rc"'
} > "$state/guest.sh"
chmod +x "$state/guest.sh"

rw_args=(--rwdir /tmp)
if [ "$repo" != /tmp ]; then rw_args+=(--rwdir "$repo"); fi
for d in "${extra_rw[@]+"${extra_rw[@]}"}"; do
    [ -d "$d" ] || die "--rwdir $d is not a directory"
    rw_args+=(--rwdir "$(cd "$d" && pwd -P)")
done

# --verbose: the guest kernel's console comes out on vng's stderr, so a guest that dies
# (a panic, an oops, the OOM killer) leaves its last messages in $console. The CI's
# VM once died in e2e step 4c with nothing to say why. loglevel=5 (after virtme's 7,
# the last one counts): warnings and worse only, so the emulated serial port stays
# quiet and seldom splits a line of the command's stderr, which shares the stream.
vng_args=(--run "$kernel" --disable-kvm --verbose --append loglevel=5
          --memory "$memory" --cpus "$cpus" --user root
          "${rw_args[@]}" -- "/bin/bash $state/guest.sh")
console="$state/console"

echo "vm-run: booting $kernel (vng $("$vng_bin" --version 2>/dev/null | awk '{print $NF}'), ${memory} RAM, ${cpus} CPUs, software emulation, timeout ${timeout_s}s)" >&2
start=$(date +%s)

# timeout(1) puts vng and its qemu child in its own process group and kills the
# whole group when the limit is hit. The guest's stdout and stderr stay separate
# and each goes through a pipe (never a direct file redirect, see header).
log_sink() { if [ -n "$logfile" ]; then tee -a "$logfile"; else cat; fi; }
# The kernel's lines ("[   12.345678] ...", and the decompressor's before them) and
# virtme's chatter about virtiofsd (it falls back to 9p here) go to $console only; the
# command's own stderr, which shares the stream, passes on.
kernel_line='^\[ *[0-9]+\.[0-9]+\] '
not_kernel() {
    grep --line-buffered -v -E "$kernel_line"'|^(Probing EDD|Memory KASLR|Poking KASLR|virtme: waiting for virtiofsd|fuse: invalid argument|virtme-run: failed to start virtiofsd)'
}
# kernel_tail N HEADING [PATTERN]: the console's last N kernel lines (those matching
# PATTERN), prefixed, under HEADING; nothing when there are none.
kernel_tail() {
    local lines
    lines="$(grep -a -E "$kernel_line" "$console" 2>/dev/null \
        | grep -a -E "${3:-.}" | tail -n "$1" || true)"
    [ -z "$lines" ] || { echo "vm-run: $2"; echo "$lines" | sed 's/^/vm-run: console: /'; } >&2
}
set +e
# In the background, then waited for: bash runs a trap only once a foreground command
# returns, and that was the VM, however long it ran. vng's exit status comes back in a
# file.
( timeout -k 15 "$timeout_s" "$vng_bin" "${vng_args[@]}" </dev/null 2>&1 1>&3 3>&- \
      | tee -a "$console" | not_kernel | log_sink >&2
  echo "${PIPESTATUS[0]}" > "$state/vng_rc" ) 3>&1 | log_sink &
wait $!
vng_rc="$(cat "$state/vng_rc" 2>/dev/null || echo 125)"
set -e
elapsed=$(( $(date +%s) - start ))

if [ "$vng_rc" = 124 ] || [ "$vng_rc" = 137 ]; then
    echo "vm-run: ERROR: VM timed out after ${elapsed}s (limit ${timeout_s}s)" >&2
    kernel_tail 60 "the guest kernel's last messages:"
    exit 124
fi
if [ ! -s "$state/status" ]; then
    echo "vm-run: ERROR: the VM did not report the command's exit status (vng exited $vng_rc after ${elapsed}s): the VM failed to boot, crashed, or the guest command killed it" >&2
    kernel_tail 80 "the guest kernel's last messages:"
    exit 125
fi
rc="$(cat "$state/status")"
case "$rc" in ''|*[!0-9]*) die "garbled exit status '$rc' from the guest" ;; esac
echo "vm-run: guest command exited $rc (${elapsed}s total)" >&2
if [ "$rc" != 0 ]; then
    kernel_tail 60 "the guest kernel's warnings:" \
        'WARNING|BUG:|Oops|Call Trace|blocked for more|Out of memory|Killed process|segfault|I/O error'
fi
exit "$rc"
