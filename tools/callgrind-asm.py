#!/usr/bin/env python3
"""Instructions of chosen functions, one line per machine instruction with
how often it ran per call of a reference function: the view that shows
where a path's instructions go once its source-level profile is flat
(repeated bounds tests, spills, results merged on the stack).

    tools/callgrind-asm.py CALLGRIND_OUT PATTERN [--per FUNCTION] [--min N]

CALLGRIND_OUT must be recorded with `--dump-instr=yes` (for the C
ping-pong: `COUNT_KEEP=dir COUNT_INSTR=1 tools/count.sh`, then
`dir/cg`). PATTERN selects the functions whose own instructions are
shown (a substring of the demangled name, as callgrind writes it; inlined
code counts as the function it was inlined into). Counts are divided by
the calls of `--per` (default `round_trip`, the counted loop's body of
`benches/c/vipl_count.c`); `--min` hides instructions run fewer times than
that per call (default 0.5). The disassembly comes from `objdump -d` of
the object callgrind names for each function.
"""
import argparse
import bisect
import re
import subprocess
from collections import defaultdict

POS = re.compile(r'^(0x[0-9a-f]+|\+\d+|-\d+|\*)\s+(\S+)\s+(\d+)')
NAMED = re.compile(r'^(c?)(fn|ob)=\((\d+)\)(?: (.*))?')


def read(path, pattern, per):
    """Self counts by (object, address) of functions matching `pattern`,
    and the calls made to `per`."""
    names, objs = {}, {}
    counts = defaultdict(int)
    calls_to_per = 0
    fn = obj = None
    addr = 0
    skip_next = False  # the cost line after `calls=` is the callee's
    pending_callee = None
    for line in open(path):
        m = NAMED.match(line)
        if m:
            callee, kind, i, name = m.groups()
            table = objs if kind == 'ob' else names
            if name:
                table[i] = name
            if kind == 'ob' and not callee:
                obj = objs.get(i)
            elif kind == 'fn' and not callee:
                fn = names.get(i)
            elif kind == 'fn' and callee:
                pending_callee = names.get(i)
            continue
        if line.startswith('calls='):
            if pending_callee and per in pending_callee:
                calls_to_per += int(line.split()[0][6:])
            skip_next = True
            continue
        m = POS.match(line)
        if not m:
            continue
        a = m.group(1)
        if a.startswith('0x'):
            addr = int(a, 16)
        elif a[0] in '+-':
            addr += int(a)
        if skip_next:
            skip_next = False
            continue
        if fn and pattern in fn and obj:
            counts[(obj, addr)] += int(m.group(3))
    return counts, calls_to_per


def disassemble(obj, addrs):
    """Instruction text at each of `addrs` in `obj`."""
    lo, hi = min(addrs), max(addrs) + 16
    out = subprocess.run(
        ['objdump', '-d', '--no-show-raw-insn', f'--start-address={lo}',
         f'--stop-address={hi}', obj],
        capture_output=True, text=True, check=True).stdout
    text = {}
    for line in out.splitlines():
        m = re.match(r'\s*([0-9a-f]+):\s+(.*)', line)
        if m:
            text[int(m.group(1), 16)] = m.group(2)
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('callgrind_out')
    ap.add_argument('pattern')
    ap.add_argument('--per', default='round_trip')
    ap.add_argument('--min', type=float, default=0.5)
    args = ap.parse_args()
    counts, calls = read(args.callgrind_out, args.pattern, args.per)
    if not counts:
        raise SystemExit(f'no instructions of a function matching {args.pattern!r} '
                         '(recorded with --dump-instr=yes?)')
    if not calls:
        raise SystemExit(f'no calls of {args.per!r} in {args.callgrind_out}')
    by_obj = defaultdict(list)
    for (obj, a) in counts:
        by_obj[obj].append(a)
    total = 0.0
    for obj, addrs in by_obj.items():
        addrs.sort()
        text = disassemble(obj, addrs)
        print(f'== {obj}')
        for a in addrs:
            n = counts[(obj, a)] / calls
            total += n
            if n >= args.min:
                print(f'{n:8.2f}  {a:8x}  {text.get(a, "?")}')
    print(f'total {total:.1f} instructions per call of {args.per} ({calls} calls)')


if __name__ == '__main__':
    main()
