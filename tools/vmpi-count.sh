#!/usr/bin/env bash
# Instructions per 8-byte round trip (ping-pong) or per 8-byte allreduce
# call of vmpi at np=2, counted by callgrind on both processes under
# via-run (this machine has no hardware performance counters). Runs
# vmpi/bench/count.c against the release libvmpi; collects only inside
# round_trip / allreduce_call. Prints, per round and per process, the
# total, and self instructions by layer (vmpi, via, std/libc), and the
# top vmpi functions. The instructions a waiting process spends spinning
# in via's CQ wait (poll loop) are reported apart ("spin") and left out
# of the layer totals: they measure the peer's latency, not work. So is
# vmpi's own poll of the expected receive's status before that wait
# (Channel::poll_head; the Region::status calls it makes stay in "via").
#
#   tools/vmpi-count.sh [pingpong|allreduce] [rounds] [allreduce bytes]
#                                          default pingpong 20000 (8 bytes)
#   COUNT_KEEP=dir keeps the callgrind outputs.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-pingpong}
rounds=${2:-20000}
bytes=${3:-8}
command -v valgrind >/dev/null || { echo "vmpi-count.sh: valgrind is not installed"; exit 1; }
cargo build --release -q -p vmpi -p vmpi-capi
lib=${CARGO_TARGET_DIR:-$PWD/target}/release
if [ -n "${COUNT_KEEP:-}" ]; then
    out=$COUNT_KEEP; mkdir -p "$out"
else
    out=$(mktemp -d)
    trap "rm -rf $out" EXIT
fi
# COUNT_LIBDIR=dir: count an earlier libvmpi.so kept there (before/after).
VMPI_LIBDIR=${COUNT_LIBDIR:-$lib} vmpi/vmpicc -O2 -g -o "$out/count" vmpi/bench/count.c
export VIA_INSTANCE="vmpicount-$$" VIA_VIAD="$lib/viad"
# valgrind cannot run the daemon's start-up: one plain run starts it.
"$lib/via-run" -n 2 "$out/count" "$what" 200 "$bytes" >/dev/null
fn=round_trip
[ "$what" = allreduce ] && fn=allreduce_call
"$lib/via-run" -n 2 valgrind --tool=callgrind --toggle-collect=$fn \
    --callgrind-out-file="$out/cg.%q{VMPI_RANK}" "$out/count" "$what" "$rounds" "$bytes" \
    >/dev/null 2>"$out/vg.log"
for r in 0 1; do
    f=$out/cg.$r
    callgrind_annotate --auto=no --threshold=100 --inclusive=yes "$f" >"$out/incl.$r.txt" 2>/dev/null
    callgrind_annotate --auto=no --threshold=100 "$f" >"$out/self.$r.txt" 2>/dev/null
    python3 - "$out/self.$r.txt" "$out/incl.$r.txt" "$rounds" "$fn" "$r" <<'PY'
import re, sys
selfp, inclp, n, fn, r = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
def rows(p):
    for line in open(p, errors="replace"):
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)", line)
        if m:
            yield int(m.group(1).replace(",", "")), m.group(2)
total = max((c for c, s in rows(inclp) if re.search(r":%s\b" % fn, s)), default=0)
# Spin: the self instructions of via's CQ wait loop and the polls it makes
# while nothing has arrived are not separable by name from a useful poll;
# count the wait's inclusive cost apart instead.
wait = sum(max((c for c, s in rows(inclp) if w in s), default=0)
           for w in ("via::cq::CqCore::wait", "via::vi::ViCore::wait",
                     "vmpi::channel::Channel::poll_head"))
layers = {"vmpi": 0, "via": 0, "std/libc": 0, "other": 0}
vm = []
for c, s in rows(selfp):
    f = s.split(":", 1)[0]
    if "Channel::poll_head" in s:
        # vmpi's poll of a receive's status before via's wait: spinning
        # (counted in "in the waits", left out of the layers).
        continue
    if f.startswith("vmpi/"):
        layers["vmpi"] += c
        vm.append((c, s))
    elif re.match(r"(via|cq|doorbell|regcache)/", f):
        layers["via"] += c
    elif "PROGRAM TOTALS" in s:
        continue
    elif re.match(r"/rustc/|/rust/deps/|/root/.cargo/", f):
        # std and dependencies' code inlined into either layer
        fnm = s.split(":", 1)[1] if ":" in s else s
        if re.search(r"vmpi::|MPI_", fnm):
            layers["vmpi"] += c
        elif re.search(r"\bvia::|\bcq::|doorbell::|regcache::", fnm):
            layers["via"] += c
        else:
            layers["std/libc"] += c
    elif re.match(r"\./|\?\?\?", f):
        layers["std/libc"] += c
    else:
        layers["other"] += c
print(f"rank {r}: {fn} per round: total {total/n:.0f}; in blocking waits (CQ or VI, and vmpi's status poll before them; spinning included) {wait/n:.0f}; outside them {(total-wait)/n:.0f}")
for k, v in layers.items():
    print(f"  self {k:9s} {v/n:8.0f}  (std inlined into a layer counted with it; spinning included)")
print("  top vmpi functions (self per round):")
for c, s in sorted(vm, reverse=True)[:15]:
    print(f"    {c/n:6.0f}  {s[:150]}")
PY
done
# Calls per round of the waits (each costs a few hundred instructions
# even when its first poll finds the completion) and of via's other entry
# points: a receive whose descriptor is done in memory (Region::status)
# is only dequeued (Vi::recv_done, counted outside the waits), not waited
# for, so the split between "outside" and "in the waits" moves with how
# often the message was already there; "self vmpi" does not.
for r in 0 1; do
    python3 tools/callgrind-calls.py "$out/cg.$r" 'CqCore::wait' 'ViCore::wait' 'CqCore::done' 'ViCore::done_polling' 'ViCore::post_send' 'ViCore::post_recv' \
        'api::Vi::recv_done' 'api::Vi::send_done' 'api::Vi::recv_wait' 'api::Region::status' 'api::Region::read' 'api::Region::write' 2>/dev/null |
        awk -v n="$rounds" -v r="$r" '/^[^ ]/ { f=$0 } /^  calls/ { printf "rank %s: %-32s %5.2f calls/round, %5d Ir/call incl.\n", r, f, $2/n, $4 }'
done
