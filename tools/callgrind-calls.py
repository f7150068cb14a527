#!/usr/bin/env python3
"""Instructions per call of chosen functions in a callgrind output file.

    tools/callgrind-calls.py callgrind.out PATTERN...

For every function whose (demangled) name contains one of the PATTERNs:
the calls made to it, its inclusive instructions per call (summed over all
call sites), its own (self) instructions per call, and its direct callees
with their inclusive instructions per call of it: the breakdown of the
post path (tools/verbs-vm.sh callgrind). Reads the file format of
callgrind 3.x with name compression and one event (Ir), recorded with
or without `--dump-instr=yes`.
"""
import re
import sys
from collections import defaultdict


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, pats = sys.argv[1], sys.argv[2:]
    names = {}
    calls = defaultdict(int)      # callee -> calls
    incl = defaultdict(int)       # callee -> inclusive Ir over its calls
    selfc = defaultdict(int)      # fn -> self Ir
    callees = defaultdict(lambda: defaultdict(int))  # fn -> callee -> inclusive Ir
    ref = re.compile(r'\((\d+)\)(?: (.*))?')

    def name(v):
        m = ref.match(v)
        if not m:
            return v
        i, n = m.group(1), m.group(2)
        if n is not None:
            names[i] = n
        return names.get(i, '(' + i + ')')

    fn = cfn = None
    pending = False
    npos = 1  # position columns before the cost ('positions: instr line' gives 2)
    with open(path, errors='replace') as f:
        for line in f:
            line = line.rstrip('\n')
            if line.startswith('positions:'):
                npos = len(line.split()) - 1
            elif line.startswith('fn='):
                fn = name(line[3:])
            elif line.startswith('cfn='):
                cfn = name(line[4:])
            elif line.startswith('calls='):
                calls[cfn] += int(line[6:].split()[0])
                pending = True
            elif line and (line[0].isdigit() or line[0] in '+-*'):
                parts = line.split()
                ir = int(parts[npos]) if len(parts) > npos else 0
                if pending:
                    incl[cfn] += ir
                    callees[fn][cfn] += ir
                    pending = False
                elif fn is not None:
                    selfc[fn] += ir
            elif '=' in line and line.split('=', 1)[0] in ('fl', 'fi', 'fe', 'ob', 'cob', 'cfi', 'cfl'):
                continue
    for fname in sorted(calls, key=lambda n: -calls[n]):
        if not any(p in fname for p in pats):
            continue
        n = calls[fname]
        print(f'{fname}\n  calls {n}  inclusive {incl[fname] / n:.0f} Ir/call  self {selfc[fname] / n:.0f} Ir/call')
        for c, ir in sorted(callees[fname].items(), key=lambda kv: -kv[1])[:12]:
            print(f'    {ir / n:8.0f} Ir/call  {c}')


if __name__ == '__main__':
    main()
