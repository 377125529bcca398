#!/usr/bin/env bash
# Installs ftlblk as a service: the release binary to /usr/local/bin/ftlblk, the systemd
# template unit ftlblk@.service, /etc/ftlblk/ with an example configuration, and the
# ublk_drv module loaded at boot. Then: put NAME.toml in /etc/ftlblk/ and
# `systemctl enable --now ftlblk@NAME`.
#
#   scripts/install-service.sh [--prefix /usr/local] [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=/usr/local
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX="$2"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) echo "install-service.sh: unknown option $1 (--prefix DIR, --no-build)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "install-service.sh: run as root (it writes /etc and $PREFIX)" >&2; exit 1; }
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"  # where install-deps.sh puts Rust
if [ "$BUILD" = 1 ]; then
    scripts/install-deps.sh
    cargo build --release --bin ftlblk
fi
install -D -m 0755 "${CARGO_TARGET_DIR:-target}/release/ftlblk" "$PREFIX/bin/ftlblk"
unit=/etc/systemd/system/ftlblk@.service
sed "s#/usr/local/bin/ftlblk#$PREFIX/bin/ftlblk#" scripts/systemd/ftlblk@.service > "$unit.tmp"
mv "$unit.tmp" "$unit"
install -d -m 0755 /etc/ftlblk /var/lib/ftlblk
install -m 0644 scripts/ftlblk-example.toml /etc/ftlblk/example.toml.sample
if modinfo ublk_drv >/dev/null 2>&1; then
    echo ublk_drv > /etc/modules-load.d/ftlblk.conf
else
    # A stock Debian 12 kernel has no ublk: loading it at every boot would fail, and the
    # units restart until their start limit.
    echo "install-service.sh: warning: this kernel has no ublk_drv module (Linux 6.0 or later with CONFIG_BLK_DEV_UBLK); ftlblk@ units cannot start on it" >&2
fi
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
echo "installed $PREFIX/bin/ftlblk and $unit; next: /etc/ftlblk/NAME.toml (see /etc/ftlblk/example.toml.sample), then systemctl enable --now ftlblk@NAME"
