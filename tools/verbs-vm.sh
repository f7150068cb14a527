#!/usr/bin/env bash
# Runs the verbs kind's tests on a real RDMA device: Soft-RoCE (rdma_rxe,
# device rxe0) in a QEMU VM booted by ../shared/softroce-vm/run.sh.
#   tools/verbs-vm.sh [TEST...]      (default: verbs; names of tests/tests/*.rs)
# Each named integration test binary runs inside the VM with the test's peer
# process (via-peer) and viad beside it, all on rxe0 (VIA_DEVICE=rxe0); the
# binaries are built on the host (feature via/verbs) and reached over the
# VM's 9p share of this work tree. Without QEMU it says so and fails: CI
# installs qemu-system-x86 (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# The VM script is vendored (tools/softroce-vm/, from the shared
# softroce-vm study) so that a clean clone has it.
vm=${SOFTROCE_RUN:-$root/tools/softroce-vm/run.sh}

fail() { printf '\n!!!!! verbs-vm: %s\n\n' "$*" >&2; exit 1; }

command -v qemu-system-x86_64 >/dev/null ||
    fail "qemu-system-x86_64 is missing: the verbs tests on Soft-RoCE cannot run (apt-get install qemu-system-x86)"
[ -x "$vm" ] || fail "no Soft-RoCE VM script at $vm (tools/softroce-vm/run.sh)"

tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(verbs)

cargo build -q --workspace --bins --features via/verbs,via-tests/verbs
for t in "${tests[@]}"; do
    exe=$(cargo test -q -p via-tests --features via/verbs,via-tests/verbs --test "$t" --no-run \
            --message-format=json 2>/dev/null |
          grep '"kind":\["test"\]' | grep "\"name\":\"$t\"" |
          grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
    [ -n "$exe" ] || fail "no test binary for $t"
    printf '\n==> %s on Soft-RoCE (rxe0, in a VM)\n' "$t"
    SOFTROCE_SELFTEST=0 SOFTROCE_SHARE="$root" \
    SOFTROCE_ENV="VIA_DEVICE=rxe0 VIA_VIAD=$root/target/debug/viad VIA_VIAD_TIMEOUT_MS=60000 RUST_BACKTRACE=1 ${VERBS_VM_ENV:-}" \
        "$vm" "$exe" --test-threads=1 ||
        fail "$t failed on Soft-RoCE (exit $?)"
done
