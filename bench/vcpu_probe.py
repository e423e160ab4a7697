#!/usr/bin/env python3
"""Whether this machine's CPUs are independent right now: the same compute-bound loop timed on
one CPU alone, then on two CPUs at once (one process pinned to each), several times.

On dedicated cores the two concurrent loops each take the time of the lone one (a ratio of
1.0). On a VM whose vCPUs share physical cores with each other or with a neighbour, they take
longer: a ratio of 2.0 means the two vCPUs together got one core's worth of compute. A
benchmark of two threads against one (`bench/models.sh`, `FUSEBOX_THREADS=2`) is then measuring
the host's schedule as much as the code, and kernels that keep the FMA units busiest lose the
most. Run it beside a benchmark to see which of its rounds fell in such a stretch.

The loop is NumPy on a 16 KiB array (in L1): multiply-adds in place, no memory traffic to
speak of, so a slowdown is compute taken away, not bandwidth. A benchmark helper, not a test.

Usage: .venv/bin/python bench/vcpu_probe.py [--rounds 20] [--iters 20000] [--cpus 0 1]
Prints one line per round (`alone`, the two concurrent times, their ratio to `alone`) and the
median and maximum ratio.
"""

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np


def spin(cpu, iters, out):
    """`iters` in-place multiply-adds over a 4096-element float32 array on `cpu`."""
    os.sched_setaffinity(0, {cpu})
    a = np.ones(4096, dtype=np.float32)
    m = np.float32(0.999)
    b = np.float32(0.001)
    t = time.perf_counter()
    for _ in range(iters):
        np.multiply(a, m, out=a)
        np.add(a, b, out=a)
    out.put((cpu, time.perf_counter() - t))


def timed(cpus, iters):
    q = mp.Queue()
    procs = [mp.Process(target=spin, args=(c, iters, q)) for c in cpus]
    for p in procs:
        p.start()
    times = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    return [times[c] for c in cpus]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--cpus", type=int, nargs=2, default=[0, 1])
    a = p.parse_args()
    if not set(a.cpus) <= os.sched_getaffinity(0):
        raise SystemExit(f"CPUs {a.cpus} are not all available here: {sorted(os.sched_getaffinity(0))}")
    ratios = []
    for r in range(a.rounds):
        (alone,) = timed(a.cpus[:1], a.iters)
        both = timed(a.cpus, a.iters)
        ratio = max(both) / alone
        ratios.append(ratio)
        print(
            f"round {r + 1}: alone {alone * 1e3:.1f} ms, together "
            f"{both[0] * 1e3:.1f} / {both[1] * 1e3:.1f} ms, ratio {ratio:.2f}",
            flush=True,
        )
    print(f"ratio median {statistics.median(ratios):.2f}, max {max(ratios):.2f} over {len(ratios)} rounds")


if __name__ == "__main__":
    main()
