#!/bin/sh
# The sockets NIC against plain TCP over one veth pair between two network
# namespaces (root): via-bench latency (8 B) and bandwidth (64 KiB, 1 MiB)
# per reliability level, polling and blocking, with the progress thread
# sleeping (VIA_SOCK_SPIN_US=0) and spinning (VIA_SOCK_SPIN_US=50), and the
# plain TCP ping-pong and stream of `via-bench __tcp_client` over the same
# link. Everything it creates is removed on exit.
#   tools/sock-bench.sh [target/release]
# A shorter run for A/B comparisons: SOCK_BENCH_SIZES (rl sizes, default
# 8,64K,1M), SOCK_BENCH_SPINS (default "0 50"), SOCK_BENCH_SPL=0 (no
# streaming).
set -eu
bin=${1:-target/release}
sizes=${SOCK_BENCH_SIZES:-8,64K,1M}
spins=${SOCK_BENCH_SPINS:-0 50}
spl=${SOCK_BENCH_SPL:-1}
B=$bin/via-bench
[ "$(id -u)" = 0 ] || { echo "SKIPPED: tools/sock-bench.sh needs root (network namespaces)"; exit 0; }
tag=vsb$$
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for n in a b; do
        for p in $(ip netns pids $tag$n 2>/dev/null); do kill "$p" 2>/dev/null || true; done
        ip netns del $tag$n 2>/dev/null || true
    done
}
trap cleanup EXIT INT TERM
ip netns add ${tag}a
ip netns add ${tag}b
ip link add ${tag}A type veth peer name ${tag}B
ip link set ${tag}A netns ${tag}a
ip link set ${tag}B netns ${tag}b
ip -n ${tag}a addr add 10.98.0.1/24 dev ${tag}A
ip -n ${tag}b addr add 10.98.0.2/24 dev ${tag}B
for n in a b; do
    N=$(echo $n | tr ab AB)
    ip -n $tag$n link set $tag$N up
    ip -n $tag$n link set lo up
done
echo "== plain TCP over the veth pair"
ip netns exec ${tag}b $B __tcp --bind 10.98.0.2:7999 >/dev/null &
pids="$pids $!"
sleep 0.3
ip netns exec ${tag}a $B __tcp_client --connect 10.98.0.2:7999 --lens $sizes --budget-ms 1000
for spin in $spins; do
    echo "== via sockets NIC, VIA_SOCK_SPIN_US=$spin"
    ip netns exec ${tag}b env VIA_INSTANCE=${tag}b VIA_SOCK_SPIN_US=$spin \
        $B server --device via_${tag}B >/dev/null 2>&1 &
    pids="$pids $!"
    sleep 0.5
    ip netns exec ${tag}a env VIA_INSTANCE=${tag}a VIA_SOCK_SPIN_US=$spin \
        $B client --device via_${tag}A --host 10.98.0.2 rl --sizes $sizes --wait poll,block --time-ms 1000
    [ "$spl" = 0 ] || ip netns exec ${tag}a env VIA_INSTANCE=${tag}a VIA_SOCK_SPIN_US=$spin \
        $B client --device via_${tag}A --host 10.98.0.2 spl --sizes 64K,1M --time-ms 1000
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    pids=""
    sleep 0.3
done
