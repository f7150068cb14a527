#!/usr/bin/env bash
# Runs the verbs kind's tests on a real RDMA device: Soft-RoCE (rdma_rxe,
# device rxe0) in a QEMU VM booted by tools/softroce-vm/run.sh.
#   tools/verbs-vm.sh [TEST...]      (default: verbs verbs@central verbs_faults verbs_faults@central and the generic
#                                    suites in $generic, then c vmpi bench; names of
#                                    tests/tests/*.rs; verbs_faults is built with the
#                                    provider's fail points)
#   tools/verbs-vm.sh verbs@central  a test with VIA_DOORBELL=central (the central send
#                                    queue; without @: the default, direct posting)
#   tools/verbs-vm.sh verbs_bench    the measurements (doorbell posts/s table and JSON)
#   tools/verbs-vm.sh callgrind      instructions per post (Vi::post_send/post_recv against
#                                    the bare ibv_post_send/ibv_post_recv) under callgrind in
#                                    the VM, 8 B and 64 KiB; VipPostSend/VipPostRecv through
#                                    the C API (benches/c/vipl_count.c); ibv_devinfo -v of rxe0
#                                    (VERBS_VM_CG_INSTR=1: per instruction, for
#                                    tools/callgrind-asm.py)
#   tools/verbs-vm.sh c              the C conformance suite (tests/c/suite, the
#                                    programs listed in $c_programs) on rxe0
#   tools/verbs-vm.sh vmpi           vmpi jobs (via-run + vmpi-check) on rxe0: the
#                                    message-passing layer unchanged on the verbs kind
#   tools/verbs-vm.sh bench          via-bench verbs on rxe0: VIA's 8-byte ping-pong over an
#                                    ibv_rc_pingpong-style loop, same run (--quick unless
#                                    VERBS_VM_BENCH_ARGS is set)
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
# The generic suites (tests/tests/*.rs that open the NIC VIA_DEVICE names)
# that run on rxe0. Not listed: peer_death (it reads the soft NIC's
# memfds), registration (the soft NIC's translation cache), layering (runs
# nm on the host's build), the viad, sockets and c_suite files (no VI
# traffic on VIA_DEVICE, or their own runner: `c`).
generic=(transfer rdma_protection errors connect pingpong modes notify threads timeouts cq
    name_service registration_heap registration_reuse_race limits)

# The VM's memory (MiB) for a suite. limits creates the NIC's 1024 VIs:
# 1024 RC QPs of 1024 entries each way, whose queues rxe allocates in the
# kernel; in 1 or 2 GiB the test is killed (SIGKILL, the OOM killer).
mem_of() {
    case $1 in
        limits) echo "${SOFTROCE_MEM:-4096}" ;;
        *) echo "${SOFTROCE_MEM:-1024}" ;;
    esac
}
[ ${#tests[@]} -gt 0 ] || tests=(verbs verbs@central verbs_faults verbs_faults@central "${generic[@]}" c vmpi bench)

# Tests of the generic suites that do not apply to the verbs kind, by
# suite, with why (README, "Not yet on verbs"): libtest reports them as
# filtered out.
skips_of() {
    case $1 in
        # An Unreliable VI is a UC QP, whose target drops a violating RDMA
        # write without telling the initiator (it completes successfully).
        rdma_protection) echo "--skip rdma_write_violations_unreliable_keep_the_connection" ;;
    esac
}

# The C programs of the suite that run on rxe0 (SUITE_DEVICE=rxe0); each
# forks its peer, so two processes and their viad run in the VM.
# Not listed (differences on verbs, docs/design.md §8): rdma (VipSetMemAttributes
# is refused; an Unreliable target drops a violating write silently), handles (a UC write
# to a stale rkey is dropped silently), ptag and mem (VipSetMemAttributes is
# refused), reuse (unmapped registered memory stays reachable until the
# unmap event is applied); nic opens via_lo by name; late_client, smi and
# viad_inherits_fds test viad or the shared-memory NIC.
c_programs=${VERBS_VM_C:-"sendrecv gather immediate connect disconnect accept_disconnect quiet_disconnect cq notify kill timeout threads badinput vi peer ns srq errcb failstate regrace regfork regreuse forkopen"}

# Runs the bash script $2 in one VM, with SOFTROCE_ENV="$3 $VERBS_VM_ENV"
# and the host executables $4 copied in; $1 says what it is (the heading,
# and the failure).
run_script() {
    local what=$1 script=$2 env=$3 extra=${4:-}
    printf '\n==> %s on Soft-RoCE (rxe0, in a VM)\n' "$what"
    SOFTROCE_TIMEOUT=${SOFTROCE_TIMEOUT:-1200} SOFTROCE_SELFTEST=0 SOFTROCE_SHARE="$root" SOFTROCE_EXTRA="$extra" \
    SOFTROCE_ENV="$env ${VERBS_VM_ENV:-}" \
        "$vm" "$(command -v bash)" "$script" ||
        fail "$what failed on Soft-RoCE (exit $?)"
}

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
    run_script "the C conformance suite ($c_programs)" "$script" "VIA_VIAD_TIMEOUT_MS=60000" "$bin/sendrecv"
}

# vmpi's jobs on rxe0: two processes (no write ring: verbs does not store a
# write's last word last, so sends into posted receives, checked), with a
# tiny eager limit (rendezvous by RDMA read), three processes (receives
# through the CQ) and the collectives.
vmpi_jobs() {
    local out=$root/target/verbs-vm/vmpi script
    mkdir -p "$out"
    script=$out/run.sh
    {
        echo "cd $root; fails=0"
        echo "job() { name=\$1; n=\$2; shift 2"
        echo "  if VIA_INSTANCE=vmpi-\$name timeout 600 env \$ENVS target/$profile/via-run -n \$n target/$profile/vmpi-check \"\$@\" > $out/\$name.out 2>&1 && grep -q PASS $out/\$name.out"
        echo "  then echo \"VMPI PASS \$name\"; else echo \"VMPI FAIL \$name\"; tail -30 $out/\$name.out; fails=\$((fails+1)); fi; }"
        echo 'ENVS="VMPI_RING=on VMPI_CHECK_RINGS=0" job fast2 2 fastpath'
        echo 'ENVS="VMPI_EAGER_LIMIT=64" job p2p2-rndv 2 p2p'
        echo 'ENVS="VMPI_SLOTS=4" job fast3 3 fastpath'
        echo 'ENVS="VMPI_COLL=host" job coll3 3 coll quick'
        echo 'echo "VMPI failures: $fails"; exit $((fails > 0))'
    } > "$script"
    run_script "vmpi jobs" "$script" \
        "VIA_DEVICE=rxe0 VIA_VIAD=$root/target/$profile/viad VIA_VIAD_TIMEOUT_MS=60000 RUST_BACKTRACE=1"
}
# via-bench on rxe0: VIA's 8-byte ping-pong against an ibv_rc_pingpong-style
# loop on the same device in the same run (`via-bench verbs`; --quick unless
# VERBS_VM_BENCH_ARGS says otherwise, e.g. VERBS_VM_BENCH_ARGS= for the
# defaults). The table is printed; the JSON is kept in
# target/verbs-vm/bench/verbs.json and must hold the ratio.
bench_run() {
    local out=$root/target/verbs-vm/bench script
    mkdir -p "$out"
    rm -f "$out/verbs.json"
    script=$out/run.sh
    {
        echo "cd $out"
        echo "$root/target/$profile/via-bench verbs --device rxe0 ${VERBS_VM_BENCH_ARGS---quick} --json $out/verbs.json"
    } > "$script"
    run_script "via-bench verbs" "$script" "VIA_VIAD=$root/target/$profile/viad VIA_VIAD_TIMEOUT_MS=60000"
    # grep, not a JSON parser: this runs in CI, which installs no python.
    grep -Eq '"via_over_raw": *[0-9]' "$out/verbs.json" 2>/dev/null ||
        fail "via-bench verbs wrote no ratio ($out/verbs.json)"
}

# VERBS_VM_PROFILE=release builds and runs optimised binaries (the
# measurements: verbs_bench); debug by default.
profile=${VERBS_VM_PROFILE:-debug}
case $profile in
    debug) cargo_profile=() ;;
    release) cargo_profile=(--release) ;;
    *) fail "VERBS_VM_PROFILE must be debug or release" ;;
esac
# The features a suite is built with: verbs_faults needs the provider's
# fail points (a build of its own; every other binary is built without).
features_of() {
    case $1 in
        verbs_faults) echo "via/verbs,via-tests/verbs,via-tests/failpoints" ;;
        *) echo "via/verbs,via-tests/verbs" ;;
    esac
}
test_exe() {
    cargo test -q "${cargo_profile[@]}" -p via-tests --features "$(features_of "$1")" --test "$1" --no-run \
            --message-format=json 2>/dev/null |
        grep '"kind":\["test"\]' | grep "\"name\":\"$1\"" |
        grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4
}

# Instructions per post under callgrind (the VM has no perf counters).
callgrind_run() {
    local out=$root/target/verbs-vm/callgrind exe script size
    mkdir -p "$out"
    rm -f "$out"/cg-*.out "$out"/cg-*.log
    exe=$(test_exe verbs_bench)
    [ -n "$exe" ] || fail "no test binary for verbs_bench"
    script=$out/run.sh
    {
        echo "cd $out"
        echo "ibv_devinfo -v -d rxe0 > devinfo.txt 2>&1"
        # viad started natively: valgrind 3.19 lacks pidfd_open, which the
        # library's start of viad uses (a running viad is only connected to).
        echo '"$VIA_VIAD" --daemon --idle-ms 600000 < /dev/null || echo VIAD-FAIL'
        for size in 8 65536; do
            echo "VIA_BENCH_SIZES=$size VIA_BENCH_ITERS=${VERBS_VM_CG_ITERS:-256} valgrind --tool=callgrind ${VERBS_VM_CG_INSTR:+--dump-instr=yes} --callgrind-out-file=$out/cg-$size.out $exe --exact post_cost_by_size --nocapture --test-threads=1 > cg-$size.log 2>&1 || echo CALLGRIND-FAIL $size"
        done
        # The C API's calls: benches/c/vipl_count.c (what tools/count.sh
        # counts on the soft NIC) on rxe0, each Vip* call in a function of
        # its own.
        echo "timeout 600 valgrind --tool=callgrind --fair-sched=yes --toggle-collect=round_trip --callgrind-out-file=$out/cg-c.out $out/vipl_count ${VERBS_VM_CG_ROUNDS:-100} > cg-c.log 2>&1 || echo CALLGRIND-FAIL C"
    } > "$script"
    # Linked as tools/count.sh links it: the library under its soname.
    cargo build -q "${cargo_profile[@]}" -p vipl --features via/verbs
    ln -sf "$root/target/$profile/libvipl.so" "$out/libvipl.so.1"
    ln -sf "$root/target/$profile/libvipl.so" "$out/libvipl.so"
    ${CC:-cc} -O2 -g -Wall -Iinclude -o "$out/vipl_count" benches/c/vipl_count.c \
        -L"$out" -lvipl -Wl,-rpath,"$out" || fail "compiling vipl_count.c"
    printf '\n==> callgrind of the post path on Soft-RoCE (rxe0, in a VM)\n'
    SOFTROCE_TIMEOUT=${SOFTROCE_TIMEOUT:-1800} SOFTROCE_VALGRIND=1 SOFTROCE_SELFTEST=0 SOFTROCE_SHARE="$root" \
    SOFTROCE_ENV="VIA_DEVICE=rxe0 VIA_VIAD=$root/target/$profile/viad VIA_VIAD_TIMEOUT_MS=60000 ${VERBS_VM_ENV:-}" \
        "$vm" "$(command -v bash)" "$script" || fail "the callgrind run failed on Soft-RoCE (exit $?)"
    for size in 8 65536; do
        [ -s "$out/cg-$size.out" ] || { cat "$out/cg-$size.log" 2>/dev/null; fail "no callgrind output for $size B"; }
        grep -h "POST-COST-SIZE" "$out/cg-$size.log" || true
        printf '\n==> instructions per call, %s B (%s)\n' "$size" "$out/cg-$size.out"
        python3 tools/callgrind-calls.py "$out/cg-$size.out" 'Vi::post_send' 'Vi::post_recv' \
            'ibv::Qp::post_send' 'ibv::Qp::post_recv'
    done
    [ -s "$out/cg-c.out" ] || { cat "$out/cg-c.log" 2>/dev/null; fail "no callgrind output for vipl_count"; }
    printf '\n==> instructions per call of the C API, 8 B (%s)\n' "$out/cg-c.out"
    python3 tools/callgrind-calls.py "$out/cg-c.out" 'step_post_send' 'step_post_recv'
}

cargo build -q "${cargo_profile[@]}" --workspace --bins --features via/verbs,via-tests/verbs
for t in "${tests[@]}"; do
    if [ "$t" = c ]; then
        c_suite
        continue
    fi
    if [ "$t" = callgrind ]; then
        callgrind_run
        continue
    fi
    if [ "$t" = vmpi ]; then
        vmpi_jobs
        continue
    fi
    if [ "$t" = bench ]; then
        bench_run
        continue
    fi
    mode_env=
    case $t in
        *@*) mode_env="VIA_DOORBELL=${t#*@}"; t=${t%@*} ;;
    esac
    exe=$(test_exe "$t")
    [ -n "$exe" ] || fail "no test binary for $t"
    skips=$(skips_of "$t")
    printf '\n==> %s on Soft-RoCE (rxe0, in a VM) %s %s\n' "$t" "$mode_env" "${skips:+(not on verbs: $skips)}"
    # shellcheck disable=SC2086 # $skips: separate arguments
    SOFTROCE_SELFTEST=0 SOFTROCE_SHARE="$root" SOFTROCE_MEM=$(mem_of "$t") \
    SOFTROCE_ENV="VIA_DEVICE=rxe0 VIA_VIAD=$root/target/$profile/viad VIA_VIAD_TIMEOUT_MS=60000 RUST_BACKTRACE=1 $mode_env ${VERBS_VM_ENV:-}" \
        "$vm" "$exe" --test-threads=1 --show-output $skips ||
        fail "$t failed on Soft-RoCE (exit $?)"
done
