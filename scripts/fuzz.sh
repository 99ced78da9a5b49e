#!/usr/bin/env bash
# Fuzzes Plinth's parsers (`make fuzz SECONDS=N`): each target of fuzz/
# (cargo-fuzz, libFuzzer) runs for SECONDS seconds from its committed corpus
# fuzz/corpus/<target>/, which grows with every input that reaches new code
# and is minimised afterwards; a crash, an assertion or an input running
# over 10 s is written to fuzz/artifacts/<target>/ and fails the run. Each
# target's final libFuzzer statistics (executions, corpus size) are printed.
#
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   JOBS=2 runs two at once.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-60}
shift || true
jobs=${JOBS:-1}

version=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q " $version"; then
    cargo install cargo-fuzz --locked --version "$version"
fi
# cargo-fuzz passes rustc flags that are nightly-only (coverage
# instrumentation); the machine's one stable toolchain accepts them so.
export RUSTC_BOOTSTRAP=1
# Release code with debug assertions and overflow checks. No sanitizer: the
# targets run safe Rust (a panic is the finding), at twice the speed.
flags=(-O -a -s none)

if [[ $# -gt 0 ]]; then targets=("$@"); else mapfile -t targets < <(cargo fuzz list); fi
cargo fuzz build "${flags[@]}"
mkdir -p logs

run() {
    local target=$1
    # The binary built above, run directly: `cargo fuzz run` would rebuild
    # it whenever the sources change while the fuzzers run.
    local binary=target/x86_64-unknown-linux-gnu/release/$target
    mkdir -p "corpus/$target" "artifacts/$target"
    if "$binary" -artifact_prefix="artifacts/$target/" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=4096 -print_final_stats=1 "corpus/$target" >"logs/$target.log" 2>&1; then
        status=ok
    else
        status="FAILED (fuzz/logs/$target.log, fuzz/artifacts/$target/)"
    fi
    # Keep the inputs that reach new edges (hit counts aside), so that the
    # committed corpus stays small.
    mkdir -p "corpus/$target.min"
    "$binary" -merge=1 -use_counters=0 "corpus/$target.min" "corpus/$target" >>"logs/$target.log" 2>&1 \
        && rm -rf "corpus/$target" && mv "corpus/$target.min" "corpus/$target"
    local execs corpus
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "logs/$target.log" | tail -1 | grep -o '[0-9]*$' || echo "?")
    corpus=$(find "corpus/$target" -type f | wc -l)
    printf '%-16s %ss  %12s execs  corpus %5s  %s\n' "$target" "$seconds" "$execs" "$corpus" "$status"
    [[ $status == ok ]]
}
export -f run
export seconds
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run {}'
