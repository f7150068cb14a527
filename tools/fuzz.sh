#!/usr/bin/env bash
# Fuzzing of via-rs (targets in fuzz/, libFuzzer through cargo-fuzz, on
# stable Rust with `-s none`; see the README's "Fuzzing" section).
#
#   tools/fuzz.sh smoke            what tools/test.sh runs: replay the seeds and
#                                  regressions (cargo test), then every target for a
#                                  few seconds from its seeds; fails on any crash
#   tools/fuzz.sh run TARGET [SECONDS] [LIBFUZZER ARGS...]
#                                  a long run: corpus in fuzz/corpus/TARGET (kept),
#                                  crashes in fuzz/artifacts/TARGET/
#   tools/fuzz.sh list             the targets
#
# Needs cargo-fuzz (`cargo install --locked cargo-fuzz`) and a C++ compiler
# (libFuzzer is built from source by libfuzzer-sys).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(viad_request viad_broker viad_socket descriptor)
# Seconds of the bounded run, per target (about 25 s in all).
declare -A SMOKE=([viad_request]=4 [viad_broker]=6 [viad_socket]=5 [descriptor]=10)
BIN=fuzz/target/x86_64-unknown-linux-gnu/release

need() {
    command -v cargo-fuzz >/dev/null || {
        echo "cargo-fuzz is missing: cargo install --locked cargo-fuzz" >&2
        exit 1
    }
}

# The targets that run via-rs code start viad from this repository's
# target/ (or $VIA_VIAD).
viad() {
    [ -n "${VIA_VIAD:-}" ] || [ -x target/release/viad ] || [ -x target/debug/viad ] ||
        cargo build -q -p via-tools --bin viad
}

case "${1:-smoke}" in
list)
    printf '%s\n' "${TARGETS[@]}"
    ;;
smoke)
    need
    viad
    cargo fmt --manifest-path fuzz/Cargo.toml -- --check
    cargo clippy -q --manifest-path fuzz/Cargo.toml --all-targets -- -D warnings
    # Seeds up to date, and every seed and saved crash replayed without libFuzzer.
    cargo test -q --manifest-path fuzz/Cargo.toml
    cargo fuzz build -s none
    for t in "${TARGETS[@]}"; do
        corpus=$(mktemp -d)
        mkdir -p "fuzz/artifacts/$t"
        cp fuzz/seeds/"$t"/* "$corpus"/
        if [ -d "fuzz/regressions/$t" ]; then cp fuzz/regressions/"$t"/* "$corpus"/ 2>/dev/null || true; fi
        secs=${SMOKE[$t]}
        echo "fuzz $t: ${secs}s from $(ls "$corpus" | wc -l) seeds"
        log=$(mktemp)
        if ! timeout $((secs + 120)) "$BIN/$t" -max_total_time="$secs" -timeout=30 \
            -rss_limit_mb=2048 -print_final_stats=1 \
            -artifact_prefix="fuzz/artifacts/$t/" "$corpus" >"$log" 2>&1; then
            tail -n 60 "$log"
            echo "fuzz $t FAILED: crash input in fuzz/artifacts/$t/;" \
                "reproduce with: cargo fuzz run -s none $t fuzz/artifacts/$t/<file>" >&2
            rm -rf "$corpus" "$log"
            exit 1
        fi
        grep -E '^(Done|stat::number_of_executed_units|#[0-9]+ +DONE)' "$log" | tr '\n' ' '
        echo
        rm -rf "$corpus" "$log"
    done
    ;;
run)
    need
    viad
    t=${2:?usage: tools/fuzz.sh run TARGET [SECONDS] [LIBFUZZER ARGS...]}
    secs=${3:-3600}
    shift $(($# < 3 ? $# : 3))
    mkdir -p "fuzz/corpus/$t"
    exec cargo fuzz run -s none "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$secs" -timeout=30 -print_final_stats=1 "$@"
    ;;
*)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac
