#!/usr/bin/env bash
# test.sh — the whole test suite: installs what it needs, then runs every test.
#
# Usage: scripts/test.sh
#
# 1. scripts/install-deps.sh --vm (fio, clang/libclang for bindgen, pkg-config, and what
#    the VM needs: qemu, Debian's 6.12 kernel with ublk_drv, virtme-ng, fs tools);
# 2. cargo fmt --check, the crash-rule mutants checked against the code
#    (scripts/orderings-mutants.py --check), then cargo test over the workspace (release build: the property
#    tests run many cases): unit tests, model-based crash-consistency property tests on
#    the crash-simulating device, file-backend tests (O_DIRECT, io_uring, sled) in a temp
#    directory, corrupt/too-small/busy tests;
#    The concurrent crash harness (ftl/tests/concurrent_crash.rs: writers, FLUSH, TRIM,
#    checkpoints, stream closing and the real cleaner, crashed at random instants by
#    power cuts and real kill -9) runs its CI subset here; FTL_CRASH_SEEDS=2000 soaks.
# 3. schedule exploration of the engine under shuttle (ftl built with --features
#    shuttle: tests/shuttle.rs, FTL_SHUTTLE_ITERATIONS schedules per test, default 300);
# 4. the fuzz crate's tests (every seed and regression input replayed; the `sched`
#    target's with --features sched), then every cargo-fuzz target for FUZZ_SECONDS
#    (default 30 here; scripts/fuzz.sh alone defaults to 60, FUZZ_SECONDS=600 soaks) with scripts/fuzz.sh;
# 5. the ublk end-to-end tests (scripts/vm-e2e.sh --no-build: the binary cargo test built):
#    boots the 6.12 kernel under QEMU and runs scripts/e2e-guest.sh inside (four file
#    systems, fio verify, discard, kill -9 + recover, double add, SIGTERM; `ftlblk check`
#    after each). A VM that cannot boot fails the suite (exit 124/125), it is never skipped.
#    Steps 3 and 4 run beside it at nice 19 (their output follows the VM's).
# Builds into target/suite (or $CARGO_TARGET_DIR) without debug info; prints each step's
# start in seconds. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's start, in seconds since the suite began (CI's limit is on the whole).
step() { echo "== [${SECONDS}s] $*"; }

# Compiling is most of the suite's time (the workspace, shuttle, the fuzz crate, three
# cargo-fuzz builds: about 18 of the 37 minutes of a clean clone, 2026-11-28). The suite builds
# without debug info (the release profile keeps it, for perf) into a target
# directory of its own, so a developer's target/release is not rebuilt each way; the
# fuzz crate's stable tests share it (and the dependencies compiled for the workspace).
export CARGO_PROFILE_RELEASE_DEBUG="${CARGO_PROFILE_RELEASE_DEBUG:-0}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/suite}"

step "dependencies (scripts/install-deps.sh --vm)"
scripts/install-deps.sh --vm
# Where rustup puts cargo on a machine install-deps.sh gave a toolchain.
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
command -v cargo >/dev/null || { echo "test.sh: cargo not found (install rustup)" >&2; exit 1; }

step "cargo fmt --check"
cargo fmt --all --check

step "crash-rule mutants name code that exists (scripts/orderings-mutants.py --check)"
python3 scripts/orderings-mutants.py --check

# Runs a command with its output appended to log $1 and only the lines matching $2
# shown; returns the command's own status. (The `cmd | tee | grep || true` this replaces
# lost it: under pipefail a failing command made the pipeline fail, `|| true` ran and
# PIPESTATUS became true's, so a failing test, fuzz replay or VM run passed the suite.)
filtered() { # log pattern command...
    local log=$1 pat=$2
    shift 2
    "$@" 2>&1 | tee -a "$log" | grep -E "$pat"
    local st=("${PIPESTATUS[@]}")
    return "${st[0]}"
}
# This run's logs and the VM's work directory, under /tmp (shared with the guest): fixed
# names let two runs on one host empty each other's logs and files, and a log a root run
# left stopped a later run of another user at "Permission denied" (found by review,
# 2026-11-29).
LOGS="$(mktemp -d /tmp/ftlblk-test.XXXXXX)"
chmod 0755 "$LOGS"
export FTLBLK_E2E_DIR="$LOGS/e2e"
echo "test.sh: logs in $LOGS"
: > "$LOGS/test.log"

# tmo SECONDS command...: the command under `timeout`, which puts itself in a process
# group of its own (and on expiry signals all of it: cargo and the test binary it runs);
# its pid, that group's id, is recorded so that the EXIT trap stops the group too when
# the suite stops early (Ctrl-C, a failed step): the trap's kill of the suite's own
# groups no longer reached them (found by review, 2026-11-29).
# One file per running timeout, removed once it ended: a pid recorded after its process
# ended could be another group's by the time the trap runs.
tmo_dir=$(mktemp -d)
tmo() {
    local secs=$1
    shift
    timeout -k 30 "$secs" "$@" &
    local p=$!
    : > "$tmo_dir/$p"
    local st=0
    wait "$p" || st=$?
    rm -f "$tmo_dir/$p"
    return "$st"
}
stop_all() {
    [ -z "${beside_pid:-}" ] || kill -- -"$beside_pid" 2>/dev/null || true
    local f
    for f in "$tmo_dir"/*; do
        [ -e "$f" ] || continue
        kill -- -"$(basename "$f")" 2>/dev/null || true
    done
    rm -rf "$tmo_dir"
}
trap stop_all EXIT

step "cargo test (workspace, release)"
status=0
# Every cargo step under a timeout, and libtest's "has been running for over 60 seconds"
# shown: a hung test (a deadlock, what the crash harness and shuttle hunt for) ran to
# CI's own limit with nothing in its output (found by review, 2026-11-29). The times
# are several times a step's usual (compiling included).
filtered "$LOGS/test.log" "^(test result|running|error|warning: unused)|FAILED|panicked|has been running" \
    tmo 2400 cargo test --workspace --release || status=$?
if [ "$status" -ne 0 ]; then
    echo "test.sh: cargo test failed (exit $status; full log: $LOGS/test.log)" >&2
    tail -50 "$LOGS/test.log" >&2
    exit "$status"
fi
# The VM's run is the longest step (13-14 minutes), and its emulated CPUs leave about a
# quarter of the host's two cores idle (807 s wall, 1249 s CPU). Shuttle, the fuzz
# crate's tests and the fuzzing (about 9 minutes of builds and runs when alone) run
# beside it at the lowest priority (nice 19), so they take what the VM leaves and barely
# slow it: shuttle and the fuzz crate's tests end within the VM's run, the fuzzing
# mostly after it (2026-11-28, two targets fuzzed at once: 1769 and 1819 s in all, against
# 2080 s one step after another).
# Their output goes to $LOGS/beside.log and is shown after the VM's. `cargo test`
# above built the binary the VM tests (tests/cli.rs needs it): nothing else builds into
# target/suite then (cargo-fuzz builds into fuzz/target).
beside() {
    step "schedule exploration under shuttle (ftl --features shuttle)"
    filtered "$LOGS/test.log" "^test result|FAILED|panicked|scenario [0-9]+:|has been running" \
        tmo 1800 cargo test -p ftl --features shuttle --test shuttle --release \
        || { echo "test.sh: shuttle tests failed (full log: $LOGS/test.log)"; tail -40 "$LOGS/test.log"; return 1; }

    step "fuzz regressions and seed corpus replay (stable)"
    filtered "$LOGS/test.log" "^test result|FAILED|panicked|has been running" \
        tmo 1800 cargo test --manifest-path fuzz/Cargo.toml --release \
        || { echo "test.sh: fuzz regression tests failed"; tail -40 "$LOGS/test.log"; return 1; }
    filtered "$LOGS/test.log" "^test result|FAILED|panicked|has been running" \
        tmo 1800 cargo test --manifest-path fuzz/Cargo.toml --release --features sched --test sched \
        || { echo "test.sh: sched fuzz regression tests failed"; tail -40 "$LOGS/test.log"; return 1; }

    step "fuzzing: every target ${FUZZ_SECONDS:-30} s from the committed seeds"
    # cargo-fuzz builds with nightly into fuzz/target (nothing to share), also without
    # debug info (a panic still names its file and line; libFuzzer's stacks name
    # functions). Here every target runs without a sanitizer: decode, request, ops and
    # open_corrupt then share one build, and sched has the other (ASan for decode and
    # request, fuzz.sh's own default, was a third build of the whole tree, about 90 s;
    # the code they drive is safe Rust but for AlignedBuf, and -rss_limit_mb still stops
    # a huge allocation). Soaks keep ASan: scripts/fuzz.sh 600, or FUZZ_SANITIZER=address
    # here. Two targets fuzz at once once all are built (FUZZ_JOBS: libFuzzer takes one
    # core). -max_total_time is wall time: beside the VM a target runs fewer cases.
    # Under tmo too: its builds (and, on a fresh machine, the nightly toolchain and
    # cargo-fuzz it installs) had no limit of their own.
    tmo 2400 env -u CARGO_TARGET_DIR FUZZ_SANITIZER="${FUZZ_SANITIZER:-none}" FUZZ_JOBS="${FUZZ_JOBS:-2}" \
        scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
}

step "ublk end-to-end tests in the VM; beside it (nice 19): shuttle, the fuzz crate's tests, fuzzing"
: > "$LOGS/beside.log"
# A process group of its own (set -m), so that a suite stopped early (Ctrl-C, a failed
# step) stops its builds and fuzzers too.
set -m
( renice -n 19 -p "$BASHPID" >/dev/null; beside ) > "$LOGS/beside.log" 2>&1 &
beside_pid=$!
set +m
: > "$LOGS/e2e.log"
e2e_status=0
filtered "$LOGS/e2e.log" "^(==|e2e|vm-run|vm-e2e|kill [0-9]|check while|backing allocation)|: ok|IOPS" \
    scripts/vm-e2e.sh --no-deps --no-build || e2e_status=$?
step "the VM's run ended (exit $e2e_status); waiting for shuttle and the fuzzing beside it"
beside_status=0
wait "$beside_pid" || beside_status=$?
beside_pid=
cat "$LOGS/beside.log"
if [ "$e2e_status" -ne 0 ]; then
    echo "test.sh: ublk end-to-end tests failed (exit $e2e_status; full log: $LOGS/e2e.log)" >&2
    tail -60 "$LOGS/e2e.log" >&2
    exit "$e2e_status"
fi
if [ "$beside_status" -ne 0 ]; then
    echo "test.sh: shuttle, the fuzz crate's tests or the fuzzing failed (exit $beside_status; above)" >&2
    exit "$beside_status"
fi

awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$LOGS/test.log"
echo "test.sh: the whole suite passed in ${SECONDS}s"
