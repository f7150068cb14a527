#!/usr/bin/env bash
# Instructions per 8-byte round trip on the default NIC, counted by
# callgrind (this machine has no hardware performance counters), with the
# breakdown by call and by step. Runs benches/c/vipl_count.c against the
# release libvipl: one process and one thread doing, per round, what each
# side of a ping-pong does once per round trip (post a receive, post a
# send, dequeue both). Needs valgrind (apt-get install valgrind).
#
#   tools/count.sh [rounds]          default 20000
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20000}
command -v valgrind >/dev/null || { echo "count.sh: valgrind is not installed (apt-get install valgrind)"; exit 1; }
cargo build --release -q -p vipl -p via-tools
lib=${CARGO_TARGET_DIR:-$PWD/target}/release
# COUNT_KEEP=dir keeps the callgrind output there (for callgrind_annotate,
# and with COUNT_INSTR=1 for tools/callgrind-asm.py).
if [ -n "${COUNT_KEEP:-}" ]; then
    out=$COUNT_KEEP; mkdir -p "$out"
else
    out=$(mktemp -d)
    trap "rm -rf $out" EXIT
fi
# The library under its soname, as tools/install.sh lays it out.
ln -sf "$lib/libvipl.so" "$out/libvipl.so.1"
ln -sf "$lib/libvipl.so" "$out/libvipl.so"
cc -O2 -g -Wall -Iinclude -o "$out/vipl_count" benches/c/vipl_count.c -L"$out" -lvipl -Wl,-rpath,"$out"
# Its own daemon instance; valgrind cannot run the daemon's start-up
# (pidfd, userfaultfd), so one plain run starts it first.
export VIA_INSTANCE="count-$$" VIA_VIAD="$lib/viad"
"$out/vipl_count" 2000 >/dev/null
# COUNT_INSTR=1 records each instruction too (tools/callgrind-asm.py).
valgrind --tool=callgrind --toggle-collect=round_trip ${COUNT_INSTR:+--dump-instr=yes} --callgrind-out-file="$out/cg" \
    "$out/vipl_count" "$rounds" >/dev/null 2>"$out/vg.log"
# The period of a polling loop, counted apart (the round trip's figures
# stay as they were): one VipRecvDone and one VipSendDone of empty queues.
valgrind --tool=callgrind --toggle-collect=failed_poll ${COUNT_INSTR:+--dump-instr=yes} --callgrind-out-file="$out/cg-poll" \
    "$out/vipl_count" "$rounds" >/dev/null 2>>"$out/vg.log"
total_rounds=$((rounds + 2000))
callgrind_annotate --auto=no --threshold=100 --inclusive=yes "$out/cg" >"$out/incl.txt" 2>/dev/null
callgrind_annotate --auto=no --threshold=100 "$out/cg" >"$out/self.txt" 2>/dev/null
incl() { # inclusive instructions of the function matching $1, per round
    awk -v pat="$1" -v n="$total_rounds" '$0 ~ pat { gsub(",","",$1); if ($1+0 > best) best=$1+0 } END { printf "%.0f", best/n }' "$out/incl.txt"
}
selfsum() { # self instructions in source files matching $1, per round
    awk -v pat="$1" -v n="$total_rounds" '$0 ~ pat { c=$1; gsub(",","",c); s+=c } END { printf "%.0f", s/n }' "$out/self.txt"
}
total=$(incl ':round_trip ')
printf '%-42s %8s\n' "per round trip (one side)" "instr"
printf '%-42s %8s\n' "------------------------------------------" "--------"
printf '%-42s %8d\n' "total" "$total"
for s in post_send:VipPostSend post_recv:VipPostRecv recv_done:VipRecvDone send_done:VipSendDone; do
    printf '%-42s %8d\n' "  ${s#*:}" "$(incl ":step_${s%%:*} ")"
done
printf '%-42s %8s\n' "by step (self instructions, source files)" ""
printf '%-42s %8d\n' "  C boundary (via/src/ffi)" "$(selfsum ' via/src/ffi/')"
printf '%-42s %8d\n' "  work queues, VI state (vi.rs, api.rs)" "$(selfsum ' via/src/(vi|api)\.rs')"
printf '%-42s %8d\n' "  translation (translate.rs, regions.rs)" "$(selfsum ' via/src/(translate|regions)\.rs')"
printf '%-42s %8d\n' "  engine (backend/soft/engine, tcache)" "$(selfsum ' via/src/backend/soft/(engine|tcache|remote|tpt|ring|mod)')"
printf '%-42s %8d\n' "  completion (completion.rs, soft/complete)" "$(selfsum ' via/src/(completion|backend/soft/complete)\.rs')"
printf '%-42s %8d\n' "  memory access (mem/region, shm/mapping)" "$(selfsum ' via/src/(mem/region|shm/mapping)\.rs')"
# Standard library code inlined into the provider (atomics, Mutex, slice
# bounds, Option and iterator adaptors): the provider's own work, written
# through std, attributed by callgrind to std's source files.
printf '%-42s %8d\n' "  std inlined (atomics, Mutex, slices, ...)" "$(selfsum ' /rustc/')"
printf '%-42s %8d\n' "  libc, ld.so (memcpy, __tls_get_addr, ...)" "$(selfsum ' (\./string/|\./nptl/|\./elf/|\?\?\?:)')"
# The same round trip with the data registered apart from the descriptors
# (via-bench's layout), counted apart too.
valgrind --tool=callgrind --toggle-collect=round_trip ${COUNT_INSTR:+--dump-instr=yes} --callgrind-out-file="$out/cg-apart" \
    "$out/vipl_count" "$rounds" apart >/dev/null 2>>"$out/vg.log"
apart=$(callgrind_annotate --auto=no --threshold=100 --inclusive=yes "$out/cg-apart" 2>/dev/null |
    awk -v n="$total_rounds" '$0 ~ ":round_trip " { gsub(",","",$1); if ($1+0 > best) best=$1+0 } END { printf "%.0f", best/n }')
printf '%-42s %8d\n' "total, data registered apart (via-bench)" "$apart"
poll=$(callgrind_annotate --auto=no --threshold=100 --inclusive=yes "$out/cg-poll" 2>/dev/null |
    awk -v n="$rounds" '$0 ~ ":failed_poll " { gsub(",","",$1); if ($1+0 > best) best=$1+0 } END { printf "%.0f", best/n }')
printf '%-42s %8d\n' "failed poll (VipRecvDone + VipSendDone, empty)" "$poll"
