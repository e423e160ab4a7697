"""onnxruntime's time for one model: `ort_time.py MODEL INPUT_DIR --threads N --repeat R`.

Loads every graph input from INPUT_DIR/`<name>.npy` (the name with every character other than a
letter, digit or `_` made `_`, as fusebox names its output files), runs the CPU provider with `intra_op_num_threads = N`
(inter-op 1, sequential execution, all graph optimisations: onnxruntime as users run it), once
to warm up and R times timed, and prints `time ort_run <median ms> ms`. `--opt-level extended`
runs it without the layout optimisations (`ORT_ENABLE_EXTENDED`: no `NCHWc` convolutions, every
tensor left in the model's `NCHW`), which shows how much of its time on a CNN comes from its
blocked layout (bench/RESULTS.md, session aj). Used by
bench/models.sh; a benchmark helper, not a test. `--list-inputs` instead prints one
`<graph input name>=<file>` per line (what `fusebox run --input` takes)."""

import argparse
import os
import statistics
import time

import numpy as np
import onnxruntime as ort

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("inputs")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--repeat", type=int, default=5)
p.add_argument("--list-inputs", action="store_true")
p.add_argument("--opt-level", choices=["all", "extended"], default="all")
a = p.parse_args()


def file_of(name):
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return os.path.join(a.inputs, f"{safe}.npy")


so = ort.SessionOptions()
so.log_severity_level = 3
so.intra_op_num_threads = a.threads
so.inter_op_num_threads = 1
so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
so.graph_optimization_level = {
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
}[a.opt_level]
sess = ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])
if a.list_inputs:
    for i in sess.get_inputs():
        print(f"{i.name}={file_of(i.name)}")
    raise SystemExit(0)
feed = {i.name: np.load(file_of(i.name)) for i in sess.get_inputs()}
sess.run(None, feed)
times = []
for _ in range(a.repeat):
    t = time.perf_counter()
    sess.run(None, feed)
    times.append((time.perf_counter() - t) * 1e3)
print(f"time ort_run {statistics.median(times):.3f} ms")
