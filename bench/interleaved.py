#!/usr/bin/env python3
"""fusebox against onnxruntime in one process, inference by inference: the ratio of two
runtimes measured milliseconds apart instead of seconds.

`bench/models.sh` alternates the two runtimes round by round (a Python process for
onnxruntime, a `fusebox run` process, each timing its own REPEAT runs); on a shared VM whose
fast and slow stretches move a run by a quarter between processes (bench/RESULTS.md, sessions
ao–aq), a round's ratio then mixes two stretches. Here both run in this process, through
onnxruntime's Python API and fusebox's Python package (`fusebox.Session`: the model
partitioned once, one executor kept, as `fusebox run --repeat` runs it), and every pair of
timed inferences is one of each, back to back, the order alternating pair by pair. The
per-pair ratio, fusebox / onnxruntime, cancels whatever stretch the pair fell in; its median
over the pairs is the figure.

Both sides as users run them: onnxruntime's CPU provider with `intra_op_num_threads =
--threads`, inter-op 1, sequential execution, all graph optimisations (as
`bench/ort_time.py`); fusebox's default flow (`fusebox run` without a config: the inference
simplifications, the CPU backend's layout where it pays (`conv2d_layout = "auto"`), its
patterns, FuseOps) with `FUSEBOX_THREADS = --threads`. Each
side's time includes handing its inputs over and its outputs back as numpy arrays. After the
warm-up the outputs are compared (within 1e-3 of the output's range, as tests/ort/compare.py),
and a mismatch exits 1.

A benchmark, not a test: it asserts nothing about the time.

Usage: .venv/bin/python bench/interleaved.py MODEL_DIR [--threads 2] [--pairs 200]
       [--warmup 10] [--block 1] [--pause-ms 0] [--config CONFIG]
MODEL_DIR holds model/model.onnx and inputs/<graph input>.npy (bench/export_models.py's and
bench/models.sh's layout). Needs the package in the venv: `.venv/bin/maturin build --release
--locked -m python/Cargo.toml -i .venv/bin/python --out target/python-wheel` and `pip install`
of the wheel (scripts/test.sh does both).
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("model_dir", type=Path)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--pairs", type=int, default=200)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--block", type=int, default=1,
               help="inferences per side per pair, the pair's time their median: >1 keeps a "
               "runtime's data in cache from one of its inferences to the next, as in a loop")
p.add_argument("--pause-ms", type=float, default=0.0, help="sleep before each inference")
p.add_argument("--config", type=Path, default=None,
               help="a fusebox config (as `fusebox run --config`), e.g. one with "
                    "conv2d_layout = [\"NCHW16c\", \"OIHW\"]")
a = p.parse_args()
if a.pairs < 2 or a.block < 1 or a.threads < 1 or a.pause_ms < 0:
    p.error("--pairs must be at least 2, --block and --threads at least 1, --pause-ms not negative")

# fusebox reads its thread count once, on first use.
os.environ["FUSEBOX_THREADS"] = str(a.threads)

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import fusebox  # noqa: E402

model = a.model_dir / "model" / "model.onnx"
if not model.is_file():
    sys.exit(f"{model}: no such model (expected MODEL_DIR/model/model.onnx)")


def file_of(name):
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return a.model_dir / "inputs" / f"{safe}.npy"


so = ort.SessionOptions()
so.log_severity_level = 3
so.intra_op_num_threads = a.threads
so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
# Its workers spin while a run lasts, as always, but stop when it ends
# (`session.force_spinning_stop`): left spinning, they held the two cores through fusebox's
# next inference (MobileNetV2: fusebox 13.6 ms instead of 6–7).
so.add_session_config_entry("session.force_spinning_stop", "1")
ort_sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
feed = {}
for i in ort_sess.get_inputs():
    f = file_of(i.name)
    if not f.is_file():
        sys.exit(f"{f}: no input file for graph input `{i.name}`")
    feed[i.name] = np.load(f)
fb_sess = fusebox.Session(fusebox.load(model),
                          config=str(a.config) if a.config else None)


def run_ort():
    return ort_sess.run(None, feed)


def run_fb():
    return list(fb_sess.run(feed).values())


for _ in range(max(a.warmup, 1)):
    want, got = run_ort(), run_fb()
if len(want) != len(got):
    sys.exit(f"onnxruntime gives {len(want)} outputs, fusebox {len(got)}")
for k, (w, g) in enumerate(zip(want, got)):
    w, g = np.asarray(w, dtype=np.float64), np.asarray(g, dtype=np.float64)
    if w.shape != g.shape:
        sys.exit(f"output {k}: onnxruntime's shape {w.shape}, fusebox's {g.shape}")
    span = float(w.max() - w.min()) if w.size else 0.0
    err = float(np.max(np.abs(w - g))) if w.size else 0.0
    ok = err <= 1e-3 * max(span, 1e-30)
    print(f"output {k}: max abs error {err:.3g}, range {span:.3g} -> {'ok' if ok else 'MISMATCH'}")
    if not ok:
        sys.exit(1)

pause = a.pause_ms / 1e3


def block(f):
    """The median of `--block` consecutive inferences of `f`, in ms."""
    times = []
    for _ in range(a.block):
        time.sleep(pause)
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


t_ort, t_fb, ratios = [], [], []
for n in range(a.pairs):
    pair = {}
    for name, f in (("ort", run_ort), ("fb", run_fb))[:: 1 if n % 2 == 0 else -1]:
        pair[name] = block(f)
    t_ort.append(pair["ort"])
    t_fb.append(pair["fb"])
    ratios.append(pair["fb"] / pair["ort"])

q = statistics.quantiles(ratios, n=4)
print(f"{a.model_dir.name}: {a.pairs} pairs of blocks of {a.block}, {a.threads} threads")
print(f"onnxruntime median {statistics.median(t_ort):.3f} ms, fusebox median "
      f"{statistics.median(t_fb):.3f} ms")
print(f"fusebox / onnxruntime: median of per-pair ratios {statistics.median(ratios):.3f} "
      f"(quartiles {q[0]:.3f}-{q[2]:.3f}); ratio of medians "
      f"{statistics.median(t_fb) / statistics.median(t_ort):.3f}")
