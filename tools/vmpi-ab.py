#!/usr/bin/env python3
"""np=2 vmpi against Open MPI (and optionally a previous vmpi build), the
goal rows of issue #12 only: 8-byte ping-pong (half round trip), 8-byte
and 1 MiB allreduce. Same benchmark source (vmpi/bench/mpibench.c) built
with vmpicc and with Open MPI's mpicc; the variants run one after the
other in every round (interleaved, so load changes hit all of them), and
the per-round ratio vmpi/OMPI is reported with the medians and ranges.

    tools/vmpi-ab.py [--rounds N] [--before DIR] [--bind-ompi core|none]
                     [--also NAME:VAR=VALUE[,VAR=VALUE]]...

--before DIR: DIR/mpibench-vmpi, an earlier build (linked against
DIR/libvmpi.so), run under the same via-run. --also: this build once more
per round with the given environment (e.g. nopoll:VMPI_POLL=0). Prints the load (uptime)
before and after. Needs target/release (or $CARGO_TARGET_DIR/release)
built: cargo build --release -p vmpi -p vmpi-capi.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
rel = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target")), "release")
KEYS = [("pingpong", 8), ("allreduce", 8), ("allreduce", 1 << 20)]


def parse(out):
    r = {}
    for line in out.splitlines():
        w = line.split()
        if len(w) == 5 and w[0] == "RESULT":
            r[(w[1], int(w[3]))] = float(w[4])
    return r


def run_vmpi(exe, env=None):
    # Its own daemon instance, found beside the build (the programs are
    # elsewhere).
    e = dict(os.environ, VIA_VIAD=os.path.join(rel, "viad"),
             VIA_INSTANCE=f"vmpi-ab-{os.getpid()}", **(env or {}))
    p = subprocess.run([os.path.join(rel, "via-run"), "-n", "2", exe, "pingpong", "allreduce"],
                       capture_output=True, text=True, env=e)
    if p.returncode:
        print("vmpi failed:", p.stderr[-500:], file=sys.stderr)
    return parse(p.stdout)


def run_ompi(exe, bind):
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(["mpirun", "-np", "2", "--bind-to", bind, "--mca", "pml", "ob1",
                        "--mca", "btl", "self,vader", exe, "pingpong", "allreduce"],
                       capture_output=True, text=True, env=e)
    if p.returncode:
        print("ompi failed:", p.stderr[-500:], file=sys.stderr)
    return parse(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--before")
    ap.add_argument("--bind-ompi", default="core")
    ap.add_argument("--also", action="append", default=[])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="vmpi-ab-")
    src = os.path.join(root, "vmpi/bench/mpibench.c")
    now = os.path.join(tmp, "mpibench-vmpi")
    subprocess.run([os.path.join(root, "vmpi/vmpicc"), "-O2", "-o", now, src], check=True,
                   env=dict(os.environ, VMPI_LIBDIR=rel))
    ompi = os.path.join(tmp, "mpibench-ompi")
    subprocess.run(["mpicc", "-O2", "-o", ompi, src], check=True)
    variants = [("vmpi", lambda: run_vmpi(now)), ("ompi", lambda: run_ompi(ompi, a.bind_ompi))]
    if a.before:
        variants.append(("before", lambda: run_vmpi(os.path.join(a.before, "mpibench-vmpi"))))
    for spec in a.also:
        name, _, kvs = spec.partition(":")
        env = dict(kv.split("=", 1) for kv in kvs.split(",") if kv)
        variants.append((name, lambda env=env: run_vmpi(now, env)))
    print("load before:", open("/proc/loadavg").read().split()[:3])
    failed = {v: 0 for v, _ in variants}
    res = {v: [] for v, _ in variants}
    for i in range(a.rounds):
        order = variants if i % 2 == 0 else variants[::-1]
        for v, f in order:
            r = f()
            failed[v] += not r
            res[v].append(r)
        print(f"round {i + 1}: load {open('/proc/loadavg').read().split()[0]}", file=sys.stderr)
    print("load after:", open("/proc/loadavg").read().split()[:3])
    print("failed runs:", failed, f"of {a.rounds} each")
    print(f"{'test':<16} {'variant':<7} {'median us':>10} {'min':>9} {'max':>9} {'ratio to ompi (median of rounds, range)':>42}")
    for k in KEYS:
        for v, _ in variants:
            xs = [r[k] for r in res[v] if k in r]
            if not xs:
                continue
            line = f"{k[0] + ' ' + str(k[1]):<16} {v:<7} {statistics.median(xs):>10.3f} {min(xs):>9.3f} {max(xs):>9.3f}"
            if v != "ompi":
                rs = [r[k] / o[k] for r, o in zip(res[v], res["ompi"]) if k in r and k in o]
                if rs:
                    line += f"   {statistics.median(rs):6.2f}x ({min(rs):.2f}-{max(rs):.2f})"
            print(line)


main()
