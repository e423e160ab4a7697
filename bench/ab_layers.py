#!/usr/bin/env python3
"""A/B comparison of fusebox builds or settings on one model, layer shape by layer shape: the
median over rounds of each variant's time relative to the first's in the same round.

On a shared VM the time of a run moves by a quarter between processes minutes apart (the host's
slow and fast stretches), far more than most kernel changes. Minima over rounds
(`bench/layer_gaps.py`) still mix stretches when the variants are few rounds apart; here each
round runs every variant once, in an order shuffled per round (seeded), and per layer shape
the ratio to the first variant is taken within the round before the median over rounds, so a
stretch that slows the whole round cancels. A change that moves layers it cannot touch (the
stem, when only 1×1 kernels changed) by as much as the layers it targets is noise: read those
rows as the resolution (bench/RESULTS.md, session ao: ±5–8% per shape with 8 rounds).

Each variant is `NAME:SETTINGS:BINARY`, SETTINGS a comma-separated list of environment
assignments (`FUSEBOX_THREADS=1`, a build's temporary switch), where `CFG=path` passes
`--config path` instead; the first variant is the baseline. fusebox's side is `fusebox run
--profile --profile-shapes 0`: each fused convolution chain's calls, split by data and
weight shape and summed over chains, then each op the profile times on its own (`op
cpu.dense(fused)`: a classifier); the last row is the whole `time run`. A split layout's data
shape (`NCHW16c`'s `(1, 64, 14, 14, 16)`) is shown as its `NCHW` one, so a variant with
`conv2d_layout = ["NCHW16c", "OIHW"]` lines up with the baseline layer by layer.

A benchmark, not a test: it asserts nothing.

Usage: python3 bench/ab_layers.py MODEL_DIR VARIANT [VARIANT ...] [--threads 2]
       [--rounds 8] [--repeat 6]
  e.g. bench/ab_layers.py /tmp/models/resnet50 base::target/release/fusebox \\
       one:FUSEBOX_THREADS=1:target/release/fusebox
MODEL_DIR holds model/model.onnx and inputs/<graph input>.npy (bench/models.sh's layout).
"""

import argparse
import glob
import os
import random
import re
import statistics
import subprocess
from collections import defaultdict

PROFILE = re.compile(r"^profile (\S+) on (\(.*?\)) (\(.*?\)) calls (\d+) ([\d.]+) ms")
OP = re.compile(r"^profile (\S+) calls (\d+) ([\d.]+) ms .*\[op\]$")


def variant(spec: str, threads: int) -> tuple[str, dict, list[str], str]:
    name, settings, binary = spec.split(":", 2)
    env = dict(os.environ)
    env["FUSEBOX_THREADS"] = str(threads)
    extra: list[str] = []
    for kv in filter(None, settings.split(",")):
        key, value = kv.split("=", 1)
        if key == "CFG":
            extra = ["--config", value]
        else:
            env[key] = value
    return name, env, extra, binary


def nchw(shape: str) -> str:
    """A data shape as `NCHW`: a split layout's `(n, c/16, h, w, 16)` (a variant with
    `conv2d_layout = ["NCHW16c", "OIHW"]`) as `(n, c, h, w)`, so its rows meet the baseline's."""
    d = [int(x) for x in shape.strip("()").split(",") if x.strip()]
    if len(d) == 5:
        d = [d[0], d[1] * d[4], d[2], d[3]]
    return "(" + ", ".join(map(str, d)) + ")"


def one_run(v, model: str, inputs: list[str], repeat: int, out_dir: str) -> dict:
    name, env, extra, binary = v
    err = subprocess.run(
        [binary, "run", model, *extra, *inputs, "--output-dir", out_dir, "--timings",
         "--repeat", str(repeat), "--profile", "--profile-shapes", "0"],
        env=env, capture_output=True, text=True, check=True,
    ).stderr
    times: dict = defaultdict(float)
    for line in err.splitlines():
        m = PROFILE.match(line)
        if m:
            times[(nchw(m.group(2)), m.group(3))] += float(m.group(5))
        elif m := OP.match(line):
            times[("op", m.group(1))] += float(m.group(3))
        elif line.startswith("time run"):
            times["run"] = float(line.split()[2])
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--out-dir", default="/tmp/ab_layers")
    a = ap.parse_args()
    variants = [variant(s, a.threads) for s in a.variants]
    model = os.path.join(a.model_dir, "model", "model.onnx")
    inputs: list[str] = []
    for f in sorted(glob.glob(os.path.join(a.model_dir, "inputs", "*.npy"))):
        inputs += ["--input", f"{os.path.basename(f)[:-4]}={f}"]
    rng = random.Random(1)
    rounds = []
    for _ in range(a.rounds):
        order = variants[:]
        rng.shuffle(order)
        rounds.append({v[0]: one_run(v, model, inputs, a.repeat, a.out_dir) for v in order})
    names = [v[0] for v in variants]
    base = names[0]
    keys = sorted(
        {k for r in rounds for k in r[base]},
        key=lambda k: (k == "run", -statistics.median(r[base].get(k, 0.0) for r in rounds)),
    )
    print(f"{a.model_dir}: {a.threads} threads, {a.rounds} rounds x repeat {a.repeat}; "
          f"median ms of {base}, then each variant's median per-round ratio to it")
    print("layer (data, weight)".ljust(44), f"{base} ms".rjust(10),
          *[f"{n} x".rjust(10) for n in names[1:]])
    for k in keys:
        if not all(k in r[n] for r in rounds for n in names):
            continue
        label = "time run" if k == "run" else f"{k[0]} {k[1]}"
        ms = statistics.median(r[base][k] for r in rounds)
        ratios = [statistics.median(r[n][k] / r[base][k] for r in rounds) for n in names[1:]]
        print(label[:44].ljust(44), f"{ms:10.3f}", *[f"{x:10.3f}" for x in ratios])


if __name__ == "__main__":
    main()
