#!/usr/bin/env bash
# fuzz.sh — runs every cargo-fuzz target of fuzz/ for a while from the committed seeds.
#
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#   FUZZ_TARGETS="ops decode"   run only these targets (default: all of fuzz/fuzz_targets)
#   FUZZ_SANITIZER=address      sanitizer for every target but sched (default: per target, below)
#   FTL_FUZZ_KNOWN=report       also stop at known open bugs (fuzz/src/known.rs)
#   FUZZ_JOBS=2                 targets fuzzed at once, after every one is built (default 1)
#
# 1. installs cargo-fuzz if missing (cargo install cargo-fuzz --locked) and checks that
#    the pinned nightly toolchain exists (installs it with rustup if not);
# 2. per target: builds it (-a: debug assertions and overflow checks on), then runs
#    libFuzzer with -max_total_time=N -rss_limit_mb=2048 on a working corpus
#    (fuzz/corpus-run/<t>, git-ignored) seeded from the committed fuzz/corpus/<t>, so
#    the committed seeds are never rewritten;
# 3. prints per target executions per second and coverage (cov:/ft: of libFuzzer's
#    last status line), and exits non-zero if any target crashed, ran out of memory or
#    timed out, naming the artifact (fuzz/artifacts/<t>/...). Keep each such input as
#    a regression: copy it to fuzz/regressions/<t>/ (minimize first with
#    `cargo +nightly fuzz tmin <t> <artifact>`); `cargo test --manifest-path
#    fuzz/Cargo.toml` replays every regression.
#
# Sanitizers: `decode` runs under AddressSanitizer (cheap there, and it enforces
# -malloc_limit_mb against huge allocations). `ops` and `open_corrupt` run without one:
# ASan's allocator made them ~6x slower (every case allocates a 2 MiB device twice and
# 1 MiB chunk buffers), and the code they drive is safe Rust but for AlignedBuf; nor
# does `sched` (shuttle's coroutines switch stacks, which ASan does not follow).
set -uo pipefail
cd "$(dirname "$0")/.."

secs="${1:-60}"
case "$secs" in
    '' | *[!0-9]*) echo "fuzz.sh: SECONDS_PER_TARGET must be a number, got '$secs'" >&2; exit 2 ;;
esac

command -v cargo >/dev/null || { echo "fuzz.sh: cargo not found (install rustup)" >&2; exit 1; }
# The nightly and the cargo-fuzz this project fuzzes with, pinned: "nightly" took the
# newest build on a fresh machine, and one that broke libfuzzer-sys or cargo-fuzz would
# turn the suite red with no change here (found by review, 2026-11-29). FUZZ_NIGHTLY
# picks another.
NIGHTLY="${FUZZ_NIGHTLY:-nightly-2026-05-20}"
CARGO_FUZZ_VERSION=0.13.2
if ! rustup toolchain list | grep -q "^$NIGHTLY"; then
    echo "== installing the $NIGHTLY toolchain (cargo-fuzz needs a nightly)"
    rustup toolchain install "$NIGHTLY" --profile minimal || exit 1
fi
if ! cargo "+$NIGHTLY" fuzz --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
    echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked || exit 1
fi

targets="${FUZZ_TARGETS:-$(ls fuzz/fuzz_targets | sed -n 's/\.rs$//p' | sort | tr '\n' ' ')}"
logs=fuzz/target/fuzz-logs
mkdir -p "$logs"

# `sched` needs the fuzz crate's `sched` feature (ftl built with shuttle's primitives).
features_for() {
    case "$1" in
        sched) echo "--features=sched" ;;
    esac
}

sanitizer_for() {
    # sched never: shuttle's coroutines switch stacks, which ASan does not follow.
    if [ "$1" = sched ]; then echo none; return; fi
    if [ -n "${FUZZ_SANITIZER:-}" ]; then echo "$FUZZ_SANITIZER"; return; fi
    case "$1" in
        decode|request) echo address ;;
        *) echo none ;;
    esac
}

failed=()
summary=()
reproducers=()
jobs="${FUZZ_JOBS:-1}"
case "$jobs" in
    '' | *[!0-9]* | 0) echo "fuzz.sh: FUZZ_JOBS must be a positive number, got '$jobs'" >&2; exit 2 ;;
esac

# Every target is built first, then they run FUZZ_JOBS at a time (libFuzzer runs one
# process per target on one core; the builds use every core).
built=()
for t in $targets; do
    san="$(sanitizer_for "$t")"
    echo "== [${SECONDS}s] $t: building (sanitizer: $san)"
    feat="$(features_for "$t")"
    # shellcheck disable=SC2086
    if ! cargo "+$NIGHTLY" fuzz build -a -s "$san" $feat "$t" >"$logs/$t.build.log" 2>&1; then
        tail -30 "$logs/$t.build.log" >&2
        echo "fuzz.sh: building $t failed (log: $logs/$t.build.log)" >&2
        failed+=("$t (build)")
        summary+=("$(printf '%-14s %10s %10s %10s  %s' "$t" - - - "BUILD FAILED")")
        continue
    fi
    built+=("$t")
done

# run_target T: fuzzes T for $secs seconds; its log in $logs/T.log, its exit status in
# $logs/T.rc.
run_target() {
    local t=$1 san feat
    rm -f "$logs/$t.rc"
    san="$(sanitizer_for "$t")"
    feat="$(features_for "$t")"
    mkdir -p "fuzz/corpus-run/$t" "fuzz/artifacts/$t"
    local extra=()
    [ "$san" = address ] && extra+=(-malloc_limit_mb=256)
    # shellcheck disable=SC2086
    cargo "+$NIGHTLY" fuzz run -a -s "$san" $feat "$t" "fuzz/corpus-run/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=60 -print_final_stats=1 \
        "${extra[@]}" >"$logs/$t.log" 2>&1
    echo $? >"$logs/$t.rc"
}
running=0
for t in "${built[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    echo "== [${SECONDS}s] $t: fuzzing for ${secs}s"
    run_target "$t" &
    running=$((running + 1))
done
wait

for t in "${built[@]}"; do
    rc="$(cat "$logs/$t.rc" 2>/dev/null || echo 1)"
    # libFuzzer's last status line: "#N  DONE  cov: C ft: F corp: ... exec/s: E rss: ..."
    last="$(grep -E '^#[0-9]+' "$logs/$t.log" | tail -1)"
    field() { echo "$last" | sed -n "s|.* $1 \([0-9]*\).*|\1|p"; }
    runs="$(echo "$last" | sed -n 's/^#\([0-9]*\).*/\1/p')"
    cov="$(field cov:)"
    ft="$(field ft:)"
    eps="$(sed -n 's|^stat::average_exec_per_sec: *\([0-9]*\).*|\1|p' "$logs/$t.log" | tail -1)"
    [ -n "$eps" ] || eps="$(field exec/s:)"
    done_runs="$(sed -n 's|^stat::number_of_executed_units: *\([0-9]*\).*|\1|p' "$logs/$t.log" | tail -1)"
    [ -n "$done_runs" ] && runs="$done_runs"
    artifact="$(grep -oE 'Test unit written to [^ ]+' "$logs/$t.log" | awk '{print $NF}' | tail -1)"
    if [ "$rc" != 0 ] || [ -n "$artifact" ]; then
        echo "---- $t FAILED (exit $rc); end of its log ($logs/$t.log):"
        # The panic's message follows its "panicked at" line (the ops target puts the
        # violated property on its first line, then the whole case).
        panic="$(grep -E -A1 'panicked at' "$logs/$t.log" | head -10 | cut -c1-300)"
        [ -n "$panic" ] && echo "$panic"
        grep -E '^ERROR|SUMMARY|deadly signal|out-of-memory|timeout' "$logs/$t.log" | head -10
        tail -25 "$logs/$t.log"
        echo "---- $t crash artifact: ${artifact:-none written}"
        failed+=("$t")
        status="CRASHED: ${artifact:-see $logs/$t.log}"
        # CI keeps only the end of the output and none of the files: carry the
        # property that failed and the input itself there (printed last, below).
        what="$(echo "$panic" | grep -vE 'panicked at|^--$' | head -1)"
        reproducers+=("$t: ${what:-no panic message}")
        if [ -n "$artifact" ] && [ -f "$artifact" ] && [ "$(stat -c %s "$artifact")" -le 3000 ]; then
            reproducers+=("input of $t ($(stat -c %s "$artifact") bytes; base64 -d > fuzz/regressions/$t/NAME):")
            reproducers+=("$(base64 -w 120 "$artifact")")
        fi
    else
        status="ok"
    fi
    echo "== $t: runs ${runs:-?}, exec/s ${eps:-?}, cov ${cov:-?}, ft ${ft:-?}: $status"
    summary+=("$(printf '%-14s %10s %10s %10s  %s' "$t" "${eps:-?}" "${cov:-?}" "${ft:-?}" "$status")")
done

echo
echo "== fuzz summary (${secs}s per target)"
printf '%-14s %10s %10s %10s  %s\n' target exec/s cov ft result
for s in "${summary[@]}"; do echo "$s"; done
if [ "${#failed[@]}" -ne 0 ]; then
    echo
    echo "== what failed, and the inputs to replay"
    for r in "${reproducers[@]}"; do echo "$r"; done
    echo "fuzz.sh: failing targets: ${failed[*]}" >&2
    exit 1
fi
