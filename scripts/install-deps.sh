#!/usr/bin/env bash
# install-deps.sh — install what ftlblk needs to build and to run its tests.
#
# Usage: scripts/install-deps.sh [--host] [--vm]
#
#   --host  (default when no flag is given) build/test tools for the host:
#           fio, clang, libclang-dev (bindgen for libublk-rs-sys), pkg-config,
#           fonts-dejavu-core (text in the replay plots); the Rust toolchain with
#           rustup (stable, rustfmt, clippy) when there is no cargo.
#   --vm    everything --host installs, plus what scripts/vm-run.sh needs to boot
#           a ublk-capable kernel under QEMU software emulation:
#             qemu-system-x86, the newest linux-image-6.12.*+deb12-amd64-unsigned
#             (ships ublk_drv.ko; the host kernel has no ublk), busybox-static,
#             e2fsprogs, xfsprogs, btrfs-progs, f2fs-tools, util-linux, kmod, procps, and
#             virtme-ng from PyPI in a venv at $VNG_VENV (default /opt/virtme-ng),
#             with `vng` and its helper `virtme-run` etc. linked into /usr/local/bin.
#
# Idempotent and fast when everything is present (well under a second): it checks
# first, and runs `apt-get update` only when something actually has to be installed.
# A 6.12 kernel that is already installed (image + ublk_drv.ko) is kept; a newer
# security update of it is not pulled in on later runs.
# Must run as root (or with sudo available). Exits non-zero with a message on failure.
#
# Environment knobs:
#   VNG_VERSION  virtme-ng version to install from PyPI (default 1.42, the one tested)
#   VNG_VENV     venv directory for virtme-ng (default /opt/virtme-ng)
set -euo pipefail

VNG_VERSION="${VNG_VERSION:-1.42}"
VNG_VENV="${VNG_VENV:-/opt/virtme-ng}"
export DEBIAN_FRONTEND=noninteractive

die() { echo "install-deps: ERROR: $*" >&2; exit 1; }
log() { echo "install-deps: $*" >&2; }

want_host=0
want_vm=0
for arg in "$@"; do
    case "$arg" in
        --host) want_host=1 ;;
        --vm) want_host=1; want_vm=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $arg (expected --host and/or --vm)" ;;
    esac
done
if [ "$want_host" = 0 ] && [ "$want_vm" = 0 ]; then want_host=1; fi

SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "must run as root (or have sudo)"
    SUDO="sudo"
fi

start=$(date +%s)
installed=()

pkg_installed() {
    # dpkg-query prints "install ok installed" for a fully installed package.
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}

apt_updated=0
apt_update() {
    if [ "$apt_updated" = 0 ]; then
        log "apt-get update"
        $SUDO apt-get update -qq || die "apt-get update failed"
        apt_updated=1
    fi
}

apt_install() {
    # $@: packages that are missing. Tries with the current lists first only if
    # they were already refreshed; otherwise refreshes once and installs.
    [ "$#" -gt 0 ] || return 0
    apt_update
    log "apt-get install $*"
    $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
        || die "apt-get install failed for: $*"
    installed+=("$@")
}

# --- Debian packages -------------------------------------------------------
pkgs=()
if [ "$want_host" = 1 ]; then
    # make + a C compiler: tikv-jemalloc-sys builds jemalloc from source.
    # python3: scripts/bench.sh and the mutant check read and write JSON with it.
    pkgs+=(fio clang libclang-dev pkg-config fonts-dejavu-core make gcc python3)
fi
if [ "$want_vm" = 1 ]; then
    # curl + python3: the metrics scrape and its check; nvme-cli: the NVMe-oF export test.
    pkgs+=(qemu-system-x86 busybox-static e2fsprogs xfsprogs btrfs-progs f2fs-tools util-linux kmod
        curl python3 iproute2 nvme-cli procps)
fi
# curl: the Rust toolchain below, when there is none.
pkgs+=(curl ca-certificates)
missing=()
for p in "${pkgs[@]}"; do
    pkg_installed "$p" || missing+=("$p")
done
apt_install "${missing[@]+"${missing[@]}"}"

# --- The Rust toolchain -------------------------------------------------------
# cargo with rustfmt (`cargo fmt --check` is a step of the suite) and clippy; rustup's
# stable when there is no cargo at all (into $CARGO_HOME, default ~/.cargo: callers add
# ~/.cargo/bin to their PATH, as scripts/test.sh does).
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
    log "no cargo: installing the stable Rust toolchain with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
        | sh -s -- -y --profile minimal --component rustfmt,clippy >/dev/null \
        || die "installing Rust with rustup failed (https://rustup.rs)"
    installed+=(rust)
fi
# The workspace's rust-version: Debian's own cargo (1.63 on Debian 12) or an old rustup
# stable passed the check above and the build then failed on it (found by review,
# 2026-11-29).
min_rust=1.88
rust_v="$(rustc --version 2>/dev/null | awk '{print $2}')"
if [ -z "$rust_v" ] || [ "$(printf '%s\n%s\n' "$min_rust" "${rust_v%%-*}" | sort -V | head -n1)" != "$min_rust" ]; then
    if command -v rustup >/dev/null 2>&1; then
        log "rustc ${rust_v:-missing} is older than $min_rust: rustup update stable"
        rustup update stable >/dev/null 2>&1 || die "rustup update stable failed"
    else
        die "rustc ${rust_v:-missing} is older than the $min_rust this project needs, and there is no rustup: remove the distribution's cargo/rustc (apt-get remove cargo rustc) and run this again, or install rustup (https://rustup.rs)"
    fi
fi
if ! cargo fmt --version >/dev/null 2>&1; then
    command -v rustup >/dev/null 2>&1 \
        || die "cargo fmt is missing and there is no rustup to add it (the suite runs cargo fmt --check)"
    rustup component add rustfmt clippy >/dev/null 2>&1 || die "rustup component add rustfmt clippy failed"
fi

# --- The 6.12 kernel with ublk ----------------------------------------------
newest_installed_612() {
    # Prints the newest 6.12 kernel that has both an image and ublk_drv.ko, or nothing.
    local k v best=""
    for k in /boot/vmlinuz-6.12*; do
        [ -e "$k" ] || continue
        v="${k#/boot/vmlinuz-}"
        case "$v" in *-amd64) ;; *) continue ;; esac
        ls "/lib/modules/$v/kernel/drivers/block/ublk_drv.ko"* >/dev/null 2>&1 || continue
        best="$(printf '%s\n%s\n' "$best" "$v" | sed '/^$/d' | sort -V | tail -n1)"
    done
    printf '%s' "$best"
}

newest_available_612() {
    # Only the plain "+deb12-amd64-unsigned" flavour (not cloud-/rt-).
    apt-cache search --names-only '^linux-image-6\.12.*-amd64-unsigned$' 2>/dev/null \
        | awk '{print $1}' \
        | grep -E '^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$' \
        | sort -V | tail -n1 || true
}

if [ "$want_vm" = 1 ]; then
    have="$(newest_installed_612)"
    if [ -n "$have" ]; then
        log "kernel $have already installed (with ublk_drv)"
    else
        # Refresh the lists first: the newest 6.12 moves with security updates.
        apt_update
        kpkg="$(newest_available_612)"
        [ -n "$kpkg" ] || die "no linux-image-6.12.*+deb12-amd64-unsigned package found by apt-cache (is bookworm-security in the apt sources?)"
        apt_install "$kpkg"
        have="$(newest_installed_612)"
        [ -n "$have" ] || die "installed $kpkg but found no /boot/vmlinuz-6.12*-amd64 with ublk_drv.ko in /lib/modules"
        log "kernel $have installed"
    fi
fi

# --- virtme-ng (vng) ----------------------------------------------------------
vng_ok() {
    [ -x "$VNG_VENV/bin/vng" ] || return 1
    local v
    v="$("$VNG_VENV/bin/vng" --version 2>/dev/null || true)"
    case "$v" in *"$VNG_VERSION"*) return 0 ;; *) return 1 ;; esac
}

if [ "$want_vm" = 1 ]; then
    if vng_ok; then
        log "virtme-ng $VNG_VERSION already in $VNG_VENV"
    else
        # Use Debian's python3 (not a pyenv shim) so the venv survives PATH changes.
        py=/usr/bin/python3
        [ -x "$py" ] || py="$(command -v python3 || true)"
        [ -n "$py" ] || die "python3 not found"
        if ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
            apt_install python3-venv
        fi
        log "creating venv $VNG_VENV and installing virtme-ng==$VNG_VERSION from PyPI"
        $SUDO "$py" -m venv "$VNG_VENV" || die "python3 -m venv $VNG_VENV failed"
        $SUDO "$VNG_VENV/bin/pip" install -q --disable-pip-version-check "virtme-ng==$VNG_VERSION" \
            || die "pip install virtme-ng==$VNG_VERSION failed"
        vng_ok || die "virtme-ng installed but '$VNG_VENV/bin/vng --version' does not report $VNG_VERSION"
        installed+=("virtme-ng==$VNG_VERSION (pip, $VNG_VENV)")
    fi
    # vng runs its helpers (virtme-run, ...) through PATH, so link them all.
    for tool in vng virtme-ng virtme-run virtme-configkernel virtme-mkinitramfs virtme-prep-kdir-mods; do
        [ -x "$VNG_VENV/bin/$tool" ] || continue
        if [ "$(readlink "/usr/local/bin/$tool" 2>/dev/null || true)" != "$VNG_VENV/bin/$tool" ]; then
            $SUDO ln -sfn "$VNG_VENV/bin/$tool" "/usr/local/bin/$tool" || die "cannot link /usr/local/bin/$tool"
            log "linked /usr/local/bin/$tool -> $VNG_VENV/bin/$tool"
            installed+=("/usr/local/bin/$tool")
        fi
    done
fi

# --- Final check ---------------------------------------------------------------
for c in fio clang pkg-config; do
    [ "$want_host" = 1 ] || break
    command -v "$c" >/dev/null 2>&1 || die "$c not on PATH after install"
done
if [ "$want_vm" = 1 ]; then
    for c in qemu-system-x86_64 busybox mkfs.ext4 mkfs.xfs mkfs.btrfs mkfs.f2fs modprobe /usr/local/bin/vng /usr/local/bin/virtme-run; do
        command -v "$c" >/dev/null 2>&1 || [ -x "$c" ] || die "$c missing after install"
    done
fi

elapsed=$(( $(date +%s) - start ))
if [ "${#installed[@]}" -eq 0 ]; then
    echo "install-deps: nothing to install, everything present (${elapsed}s)"
else
    echo "install-deps: installed: ${installed[*]} (${elapsed}s)"
fi
if [ "$want_vm" = 1 ]; then
    echo "install-deps: vng=/usr/local/bin/vng ($("$VNG_VENV/bin/vng" --version 2>/dev/null | head -n1)), kernel=$(newest_installed_612)"
fi
