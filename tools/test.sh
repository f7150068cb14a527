#!/usr/bin/env bash
# The test command of via-rs: builds everything and runs every test.
#   tools/test.sh
# Exits non-zero on the first failure. Bounded: every test has its own
# timeouts; the whole run takes a few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# The verbs kind of NIC is built and tested too (feature via/verbs: needs
# cmake and libclang, which .ci/run installs).
features=(--features via/verbs,via-tests/verbs)

step "build (binaries first: tests start viad from target/)"
cargo build --workspace --bins "${features[@]}"
cargo build --workspace --all-targets "${features[@]}"

step "unit, integration and doc tests (includes the C conformance suite)"
cargo test --workspace "${features[@]}" -- --test-threads="${VIA_TEST_THREADS:-2}"

step "the verbs kind on a real device: Soft-RoCE rxe0 in a QEMU VM (tools/verbs-vm.sh)"
tools/verbs-vm.sh

step "loom models of the doorbell and CQ rings"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p doorbell -p cq --release --test loom

step "fuzz targets: seeds and regressions replayed, then a bounded run of each (tools/fuzz.sh)"
tools/fuzz.sh smoke

step "lints"
cargo clippy --workspace --all-targets "${features[@]}" -- -D warnings
cargo clippy --workspace --all-targets -- -D warnings
cargo fmt --all -- --check

step "all tests passed"
