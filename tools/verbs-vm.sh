#!/usr/bin/env bash
# Runs the verbs kind's tests on a real RDMA device: Soft-RoCE (rdma_rxe,
# device rxe0) in a QEMU VM booted by tools/softroce-vm/run.sh.
#   tools/verbs-vm.sh [TEST...]      (default: verbs verbs@central c; names of tests/tests/*.rs)
#   tools/verbs-vm.sh verbs@central  a test with VIA_DOORBELL=central (the central send
#                                    queue; without @: the default, direct posting)
#   tools/verbs-vm.sh verbs_bench    the measurements (doorbell posts/s table and JSON)
#   tools/verbs-vm.sh c              the C conformance suite (tests/c/suite, the
#                                    programs listed in $c_programs) on rxe0
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
[ ${#tests[@]} -gt 0 ] || tests=(verbs verbs@central c)

# The C programs of the suite that run on rxe0 (SUITE_DEVICE=rxe0); each
# forks its peer, so two processes and their viad run in the VM.
# Not listed (differences on verbs, docs/design.md §8): rdma and errcb (the
# target hears CONN_LOST, not RDMAW_PROT / RECVQ_EMPTY), handles (a UC write
# to a stale rkey is dropped silently), ptag and mem (VipSetMemAttributes is
# refused), reuse (unmapped registered memory stays reachable until the
# unmap event is applied); nic opens via_lo by name; late_client, regfork,
# regrace, smi and viad_inherits_fds test the soft NIC or viad.
c_programs=${VERBS_VM_C:-"sendrecv gather immediate connect disconnect accept_disconnect quiet_disconnect cq notify kill timeout threads badinput vi peer ns"}

c_suite() {
    local out=$root/target/verbs-vm prefix bin
    prefix=$out/prefix
    bin=$out/c
    mkdir -p "$bin"
    VIA_FEATURES=via/verbs tools/install.sh --debug "$prefix" >/dev/null
    local script=$bin/run-suite.sh
    {
        echo 'cd "$(dirname "$0")"; fails=0'
        for p in $c_programs; do
            ${CC:-cc} -std=c99 -Wall -Wextra -Werror -pedantic -g -pthread \
                -I"$prefix/include" -Itests/c/suite -o "$bin/$p" \
                "tests/c/suite/$p.c" tests/c/suite/common.c \
                -L"$prefix/lib" -lvipl -Wl,-rpath,"$prefix/lib" ||
                fail "compiling $p.c"
            echo "if SUITE_DEVICE=rxe0 VIA_INSTANCE=c-$p ./$p > $p.out 2>&1 && grep -qx 'PASS $p' $p.out;"
            echo "then echo 'C-SUITE PASS $p'; else echo 'C-SUITE FAIL $p'; cat $p.out; fails=\$((fails+1)); fi"
        done
        echo 'echo "C-SUITE failures: $fails"; exit $((fails > 0))'
    } > "$script"
    printf '\n==> the C conformance suite on Soft-RoCE (rxe0, in a VM): %s\n' "$c_programs"
    SOFTROCE_TIMEOUT=${SOFTROCE_TIMEOUT:-1200} SOFTROCE_SELFTEST=0 SOFTROCE_SHARE="$root" SOFTROCE_EXTRA="$bin/sendrecv" \
    SOFTROCE_ENV="VIA_VIAD_TIMEOUT_MS=60000 ${VERBS_VM_ENV:-}" \
        "$vm" "$(command -v bash)" "$script" ||
        fail "the C suite failed on Soft-RoCE (exit $?)"
}

# VERBS_VM_PROFILE=release builds and runs optimised binaries (the
# measurements: verbs_bench); debug by default.
profile=${VERBS_VM_PROFILE:-debug}
case $profile in
    debug) cargo_profile=() ;;
    release) cargo_profile=(--release) ;;
    *) fail "VERBS_VM_PROFILE must be debug or release" ;;
esac
cargo build -q "${cargo_profile[@]}" --workspace --bins --features via/verbs,via-tests/verbs
for t in "${tests[@]}"; do
    if [ "$t" = c ]; then
        c_suite
        continue
    fi
    mode_env=
    case $t in
        *@*) mode_env="VIA_DOORBELL=${t#*@}"; t=${t%@*} ;;
    esac
    exe=$(cargo test -q "${cargo_profile[@]}" -p via-tests --features via/verbs,via-tests/verbs --test "$t" --no-run \
            --message-format=json 2>/dev/null |
          grep '"kind":\["test"\]' | grep "\"name\":\"$t\"" |
          grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
    [ -n "$exe" ] || fail "no test binary for $t"
    printf '\n==> %s on Soft-RoCE (rxe0, in a VM) %s\n' "$t" "$mode_env"
    SOFTROCE_SELFTEST=0 SOFTROCE_SHARE="$root" \
    SOFTROCE_ENV="VIA_DEVICE=rxe0 VIA_VIAD=$root/target/$profile/viad VIA_VIAD_TIMEOUT_MS=60000 RUST_BACKTRACE=1 $mode_env ${VERBS_VM_ENV:-}" \
        "$vm" "$exe" --test-threads=1 --show-output ||
        fail "$t failed on Soft-RoCE (exit $?)"
done
