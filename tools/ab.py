#!/usr/bin/env python3
"""Interleaved A/B timing of this build against an older one, for the
closing notes' "interleaved with the previous build" figures: on this
2-core machine the load, and the host's speed, move within minutes, so
only measurements taken in alternation are comparable.

    tools/ab.py --old DIR [--rounds N] [reghit] [regpp] [latency] [cpingpong]

DIR is the `release` directory of the older build (`via-bench`, `viad`,
`libvipl.so`), e.g. a worktree of the previous head built with
`CARGO_TARGET_DIR=/work/tgt-old cargo build --release -p via-tools -p vipl`
and given as `/work/tgt-old/release`. This build is `target/release` (or
`$CARGO_TARGET_DIR/release`), built the same way. With no benchmark named,
reghit, regpp and latency run:

* reghit: `benches/c/vipl_reghit.c` (what `tools/reghit.sh` runs), 32
  buffers and 1, short runs pinned to CPU 1 at real-time priority when
  root; medians of the hit and deregistration figures.
* regpp: `via-bench regpp --inner` (ping-pong registering around every
  message against buffers registered once, 64 KiB and 1 MiB); medians of
  the ratios.
* latency: `via-bench report --sizes 8 --reps 5`; medians of the 8-byte
  half round trip and of the floor measured in the same run.
* cpingpong: `benches/c/vipl_pingpong.c`, an 8-byte ping-pong of two
  processes through the C API (200,000 rounds), with the half round trip
  split into its steps by the time-stamp counter; medians, and the
  per-round new/old ratio.

Each round runs the old build, then this one. Prints the load before and
after: a load above 1.5 means another job shared the machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
new_rel = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target")), "release")


def load():
    return os.getloadavg()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def lib_dir(tmp, rel, name):
    """A directory with `rel`'s libvipl under its soname."""
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    for n in ("libvipl.so.1", "libvipl.so"):
        p = os.path.join(d, n)
        if not os.path.exists(p):
            os.symlink(os.path.join(rel, "libvipl.so"), p)
    return d


def reghit(builds, rounds, tmp):
    exe = os.path.join(tmp, "vipl_reghit")
    libs = {k: lib_dir(tmp, rel, k) for k, rel in builds.items()}
    subprocess.run(["cc", "-O2", "-Wall", "-I" + os.path.join(root, "include"), "-o", exe,
                    os.path.join(root, "benches/c/vipl_reghit.c"), "-L" + libs["new"], "-lvipl"],
                   check=True)
    pin = ["chrt", "-f", "50", "taskset", "-c", "1"] if os.geteuid() == 0 else []
    for bufs in (32, 1):
        got = {k: ([], []) for k in builds}
        for _ in range(rounds):
            for k in builds:
                env = dict(os.environ, LD_LIBRARY_PATH=libs[k], VIA_INSTANCE=f"ab-reghit-{k}",
                           VIA_VIAD=os.path.join(builds[k], "viad"), VIA_PARKED="on")
                out = subprocess.run(pin + [exe, "3000", "65536", str(bufs)], env=env,
                                     capture_output=True, text=True, check=True).stdout.split()
                # "VipRegisterMem (hit) R ns, VipDeregisterMem D ns ..."
                got[k][0].append(float(out[2]))
                got[k][1].append(float(out[5]))
        for k, (r, d) in got.items():
            print(f"reghit {bufs:>2} buffers {k}: register (hit) median {med(r):.1f} ns "
                  f"(min {min(r):.1f}), deregister median {med(d):.1f} ns (min {min(d):.1f})")


def regpp(builds, rounds):
    res = {k: {} for k in builds}
    for _ in range(rounds):
        for k, rel in builds.items():
            env = dict(os.environ, VIA_REGCACHE="on", VIA_VIAD=os.path.join(rel, "viad"),
                       VIA_INSTANCE=f"ab-regpp-{k}")
            out = subprocess.run([os.path.join(rel, "via-bench"), "regpp", "--inner"], env=env,
                                 capture_output=True, text=True).stdout
            line = [l for l in out.splitlines() if l.startswith("{")][-1]
            for r in json.loads(line)["rows"]:
                res[k].setdefault(r["bytes"], []).append((r["fixed_us"], r["each_us"], r["ratio"]))
    for k, sizes in res.items():
        for size, v in sorted(sizes.items()):
            rs = [x[2] for x in v]
            print(f"regpp {size // 1024:>5} KiB {k}: ratio median {med(rs):.2f} ({min(rs):.2f}-{max(rs):.2f}), "
                  f"fixed {med([x[0] for x in v]):.2f} us, each {med([x[1] for x in v]):.2f} us")


def latency(builds, rounds, tmp):
    res = {k: [] for k in builds}
    for _ in range(rounds):
        for k, rel in builds.items():
            j = os.path.join(tmp, f"lat-{k}.json")
            env = dict(os.environ, VIA_VIAD=os.path.join(rel, "viad"), VIA_INSTANCE=f"ab-lat-{k}")
            subprocess.run([os.path.join(rel, "via-bench"), "report", "--sizes", "8", "--reps", "5",
                            "--json", j], env=env, capture_output=True)
            rows = {r["config"]: r for r in json.load(open(j))["rows"]}
            res[k].append((rows["VIA ping-pong"]["mean_us"],
                           rows["bare shared-memory ping-pong (floor)"]["mean_us"]))
    for k, v in res.items():
        via = [x[0] for x in v]
        ratio = [x[0] / x[1] for x in v]
        print(f"latency 8 B {k}: {med(via):.3f} us ({min(via):.3f}-{max(via):.3f}), floor "
              f"{med([x[1] for x in v]):.3f} us, {med(ratio):.1f}x the floor ({min(ratio):.1f}-{max(ratio):.1f})")
    # Each round's new/old pair ran back to back: their ratio drifts less
    # than either series.
    pairs = [n[0] / o[0] for n, o in zip(res["new"], res["old"])]
    print(f"latency 8 B new/old, per round: median {med(pairs):.3f} ({min(pairs):.3f}-{max(pairs):.3f}), "
          f"new faster in {sum(p < 1 for p in pairs)} of {len(pairs)} rounds")


def cpingpong(builds, rounds, tmp):
    libs = {k: lib_dir(tmp, rel, k) for k, rel in builds.items()}
    exe = {}
    for k in builds:
        exe[k] = os.path.join(tmp, f"vipl_pingpong-{k}")
        subprocess.run(["cc", "-O2", "-Wall", "-I" + os.path.join(root, "include"), "-o", exe[k],
                        os.path.join(root, "benches/c/vipl_pingpong.c"), "-L" + libs[k], "-lvipl",
                        "-Wl,-rpath," + libs[k]], check=True)
    res = {k: [] for k in builds}
    for _ in range(rounds):
        for k in builds:
            env = dict(os.environ, VIA_INSTANCE=f"ab-cpp-{k}", VIA_VIAD=os.path.join(builds[k], "viad"))
            out = subprocess.run([exe[k], "200000"], env=env, capture_output=True, text=True,
                                 check=True).stdout
            res[k].append(json.loads(out.splitlines()[-1]))
    keys = ["half_rtt_ns", "send_to_notice_ns", "notice_to_send_ns", "post_send_ns", "send_done_ns"]
    for k, v in res.items():
        print(f"cpingpong {k}: " + ", ".join(f"{x[:-3]} {med([r[x] for r in v]):.1f}" for x in keys) + " (ns, medians)")
    pairs = [n["half_rtt_ns"] / o["half_rtt_ns"] for n, o in zip(res["new"], res["old"])]
    print(f"cpingpong half round trip new/old, per round: median {med(pairs):.3f} "
          f"({min(pairs):.3f}-{max(pairs):.3f}), new faster in {sum(p < 1 for p in pairs)} of {len(pairs)} rounds")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="release directory of the older build")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("bench", nargs="*", help="reghit, regpp, latency, cpingpong (default: the first three)")
    a = ap.parse_args()
    for b in a.bench:
        if b not in ("reghit", "regpp", "latency", "cpingpong"):
            ap.error(f"unknown benchmark {b!r} (reghit, regpp, latency, cpingpong)")
    builds = {"old": os.path.abspath(a.old), "new": new_rel}
    for k, rel in builds.items():
        for f in ("via-bench", "viad", "libvipl.so"):
            if not os.path.exists(os.path.join(rel, f)):
                raise SystemExit(f"ab.py: {k} build has no {f} in {rel}")
    todo = a.bench or ["reghit", "regpp", "latency"]
    print(f"load before: {load()}")
    with tempfile.TemporaryDirectory(prefix="via-ab-") as tmp:
        if "reghit" in todo:
            reghit(builds, a.rounds, tmp)
        if "regpp" in todo:
            regpp(builds, max(1, a.rounds // 2))
        if "latency" in todo:
            latency(builds, a.rounds, tmp)
        if "cpingpong" in todo:
            cpingpong(builds, a.rounds, tmp)
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
