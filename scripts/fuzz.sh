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
    mkdir -p "corpus/$target"
    if cargo fuzz run "${flags[@]}" "$target" "corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
        >"logs/$target.log" 2>&1; then
        status=ok
    else
        status="FAILED (fuzz/logs/$target.log, fuzz/artifacts/$target/)"
    fi
    cargo fuzz cmin "${flags[@]}" "$target" "corpus/$target" >>"logs/$target.log" 2>&1 || true
    local execs corpus
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "logs/$target.log" | tail -1 | grep -o '[0-9]*$' || echo "?")
    corpus=$(find "corpus/$target" -type f | wc -l)
    printf '%-16s %ss  %12s execs  corpus %5s  %s\n' "$target" "$seconds" "$execs" "$corpus" "$status"
    [[ $status == ok ]]
}
export -f run
export seconds
export flags_string="${flags[*]}"
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'flags=($flags_string); run {}'
