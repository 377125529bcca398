#!/usr/bin/env bash
# record-trace.sh — records the small real block trace shipped in
# replay/traces/vm-fs.alibaba.csv.gz, in the Alibaba cloud block trace format
# (device_id,opcode,offset,length,timestamp; bytes and microseconds), one volume per
# device:
#
#   volume 0  ext4 under a SQLite database: a 100k-row table, then rounds of random
#             updates, each round one transaction, a VACUUM every 10 rounds (Python's
#             sqlite3, the library, not a synthetic generator)
#   volume 1  ext4 under file churn: each round copies Debian's Python standard library
#             (/usr/lib/python3.11) and /usr/share/perl, writes a tar archive of the copy,
#             and deletes the copy before last and the previous archive
#
# Both run at the same time on loop devices (1 GiB sparse files) while `blktrace` records
# every queued request (Q events) of both devices; `blkparse` turns them into text and
# awk into the Alibaba CSV. The public Alibaba and Tencent traces are not reachable from
# this machine (no internet), so this is the documented source of the shipped trace.
#
# blktrace needs the kernel's debugfs trace files, which a container host refuses, so
# by default this runs inside the test VM (scripts/vm-run.sh); --here runs it on this
# machine (root, blktrace, loop devices). The content varies from run to run (timing,
# file system allocation); the shipped file is one such run.
#
# Usage: scripts/record-trace.sh [--out FILE] [--rounds N] [--here]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=replay/traces/vm-fs.alibaba.csv.gz
ROUNDS=10
HERE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --here) HERE=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "record-trace.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v blktrace >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q blktrace >/dev/null
if [ "$HERE" = 0 ]; then
    exec scripts/vm-run.sh --timeout 1800 -- scripts/record-trace.sh --here --out "$OUT" --rounds "$ROUNDS"
fi

W=$(mktemp -d /tmp/record-trace.XXXXXX)
cleanup() {
    pkill -INT -x blktrace 2>/dev/null || true
    umount "$W/m0" "$W/m1" "$W/bt" 2>/dev/null || true
    [ -n "${L0:-}" ] && losetup -d "$L0" 2>/dev/null
    [ -n "${L1:-}" ] && losetup -d "$L1" 2>/dev/null
    rm -rf "$W"
}
trap cleanup EXIT
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug
modprobe loop 2>/dev/null || true
truncate -s 1G "$W/v0.img" "$W/v1.img"
L0=$(losetup -f --show "$W/v0.img")
L1=$(losetup -f --show "$W/v1.img")
mkdir -p "$W/m0" "$W/m1" "$W/bt"
# blktrace maps its output files, which a shared (9p) directory refuses: keep them in RAM.
mount -t tmpfs -o size=512m none "$W/bt"
mkfs.ext4 -q "$L0"
mkfs.ext4 -q "$L1"
mount "$L0" "$W/m0"
mount "$L1" "$W/m1"
blktrace -d "$L0" -d "$L1" -D "$W/bt" >"$W/blktrace.log" 2>&1 &
BT=$!
sleep 2
kill -0 "$BT" || { cat "$W/blktrace.log" >&2; exit 1; }

python3 - "$W/m0/db.sqlite" "$ROUNDS" <<'EOF' &
import random, sqlite3, sys
path, rounds = sys.argv[1], int(sys.argv[2])
rng = random.Random(1)
db = sqlite3.connect(path)
db.execute("create table t (id integer primary key, v blob)")
with db:
    db.executemany("insert into t values (?, ?)",
                   ((i, rng.randbytes(200)) for i in range(100_000)))
for r in range(rounds):
    with db:
        # Skewed keys: a fifth of the rows take most updates.
        for _ in range(4000):
            k = rng.randrange(20_000) if rng.random() < 0.8 else rng.randrange(100_000)
            db.execute("update t set v = ? where id = ?", (rng.randbytes(200), k))
    if r % 10 == 9:
        db.execute("vacuum")
db.close()
EOF
DB=$!

for r in $(seq 1 $((ROUNDS / 3 + 1))); do
    d="$W/m1/copy$r"
    mkdir -p "$d"
    cp -r /usr/lib/python3.11 "$d/py"
    cp -r /usr/share/perl "$d/perl"
    tar cf "$W/m1/archive$r.tar" -C "$d" py
    rm -rf "$W/m1/copy$((r - 2))" "$W/m1/archive$((r - 1)).tar"
    sync
done
wait "$DB"
sync
sleep 2
kill -INT "$BT"
wait "$BT" || true

mkdir -p "$(dirname "$OUT")"
for v in 0 1; do
    dev=$(basename "$([ $v = 0 ] && echo "$L0" || echo "$L1")")
    # %a action, %d RWBS, %S sector, %N bytes, %T.%t time.
    blkparse -q -i "$W/bt/$dev" -f "%a %d %S %N %T.%9t\n" |
        awk -v v=$v '$1 == "Q" && $4 > 0 {
            op = ""
            if ($2 ~ /W/) op = "W"; else if ($2 ~ /R/) op = "R"
            if (op != "" && $2 !~ /D/) printf "%d,%s,%d,%d,%d\n", v, op, $3 * 512, $4, $5 * 1000000
        }'
done | sort -t, -k5,5n -s | gzip -9 >"$OUT"
echo "record-trace: $(zcat "$OUT" | wc -l) requests in $OUT ($(du -h "$OUT" | cut -f1))"
