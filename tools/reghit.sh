#!/usr/bin/env bash
# The cost of VipRegisterMem on a hit and of VipDeregisterMem, through the
# C API (benches/c/vipl_reghit.c against the release libvipl): 1 buffer
# registered around every message, and 32 in turn. On a busy machine, run
# it as root under `chrt -f 50 taskset -c 1` to keep other work off its CPU.
#   tools/reghit.sh [rounds]          default 20000
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20000}
cargo build --release -q -p vipl -p via-tools
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
ln -s "$PWD/target/release/libvipl.so" "$out/libvipl.so.1"
ln -s "$PWD/target/release/libvipl.so" "$out/libvipl.so"
cc -O2 -g -Wall -Wextra -Iinclude -o "$out/vipl_reghit" benches/c/vipl_reghit.c -L"$out" -lvipl -Wl,-rpath,"$out"
export VIA_INSTANCE="reghit-$$" VIA_VIAD="$PWD/target/release/viad" VIA_PARKED="${VIA_PARKED:-on}"
# Without and with RDMA enabled (a rendezvous message layer enables both).
for rdma in 0 1; do
    for b in 1 32; do
        echo -n "rdma $rdma: "
        "$out/vipl_reghit" "$rounds" 65536 "$b" "$rdma"
    done
done
