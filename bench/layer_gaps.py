#!/usr/bin/env python3
"""Per-layer time of a convolutional model in fusebox against onnxruntime, layer shape by layer
shape, both runtimes in the same run: where the gap between them lies.

onnxruntime's side is its per-node profile (`SessionOptions.enable_profiling`): every kernel's
time per run, the median over the timed runs. Its graph optimiser fuses a Conv with the Clip,
Relu or Add that follows and names the fused node after the last output (for instance
`.../Clip_output_0_nchwc`); this script walks from that output back through the model's own
graph to the Conv that heads the group, and keys it by the Conv's data and weight shapes from
ONNX shape inference (`(1, 96, 14, 14) (576, 96, 1, 1)`). fusebox's side is `fusebox run
--profile --profile-shapes 0`: each fused convolution chain's calls split by the same two
shapes (a data shape in `NCHW16c`, where `conv2d_layout = "auto"` converted the model, read as
its `NCHW` one), the minimum over the processes run. Nodes that share a key are summed on both sides
(a shape that occurs three times is three calls). Other nodes (the classifier, the pooling)
are listed by op type for onnxruntime and by function for fusebox, unmatched.

A benchmark, not a test: it asserts nothing. The shared VM's fast and slow stretches move both
runtimes; `--rounds` alternates them and keeps each side's minimum per layer.

After the table, the layers summed by kind (kernel size, depthwise, stride: `1x1`, `3x3
stride 2`, `3x3 depthwise`), at the last thread count: which kind of layer holds the gap.

With `--threads 1,2` every round runs both runtimes at each thread count in turn, and the table
shows each runtime's per-layer time at every count and its scaling from the first count to the
last (time at the first / time at the last), so that a layer that gains less from the second
thread in fusebox than in onnxruntime shows as such within one run.

Usage: .venv/bin/python bench/layer_gaps.py MODEL_DIR [--threads 2 | --threads 1,2]
       [--rounds 3] [--repeat 50] [--fusebox target/release/fusebox]
MODEL_DIR holds model/model.onnx and inputs/<graph input>.npy (the layout of
bench/export_models.py and bench/models.sh; in a file name every character other than a letter,
digit or `_` is `_`).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent


def shapes_of(model, given):
    """Every tensor's static shape (inputs, initializers, inferred values), the graph inputs
    fixed to the shapes of the arrays `given` (an exporter's dynamic axes otherwise leave
    every inferred shape symbolic)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    # Old models (IR 3) list initializers as graph inputs, often without a shape, and shape
    # inference there ignores the initializers that are not inputs: read the model as IR 4
    # (initializers are constants) and give those inputs the initializers' dims.
    model.ir_version = max(model.ir_version, 4)
    fixed = dict(given)
    fixed.update({i.name: tuple(i.dims) for i in model.graph.initializer})
    for vi in model.graph.input:
        if vi.name in fixed:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in fixed[vi.name]:
                dims.add().dim_value = d
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            out[vi.name] = tuple(d.dim_value for d in dims)
    for init in g.initializer:
        out[init.name] = tuple(init.dims)
    return out


def fmt(shape):
    return "(" + ", ".join(str(d) for d in shape) + ")"


def conv_kind(conv, w_shape):
    """A Conv's kind for the summary by kind: its kernel (`3x3`), `depthwise` where each group
    has one input channel and there are several groups, `grouped` for other group counts, and
    its stride where it is not 1 (`3x3 stride 2`)."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
    group = int(attrs.get("group", 1))
    strides = list(attrs.get("strides", [1] * (len(w_shape) - 2)))
    kind = "x".join(str(d) for d in w_shape[2:])
    if group > 1:
        kind += " depthwise" if len(w_shape) > 1 and w_shape[1] == 1 else " grouped"
    if any(st != 1 for st in strides):
        stride = strides[0] if len(set(strides)) == 1 else "x".join(map(str, strides))
        kind += f" stride {stride}"
    return kind


def print_kinds(kinds, o_conv, f_conv):
    """The layers summed by kind (keys present on both sides): shapes, each runtime's time, the
    difference and the ratio, the largest difference first."""
    by = defaultdict(lambda: [0, 0.0, 0.0])
    for k in o_conv:
        if k in f_conv:
            row = by[kinds.get(k, "?")]
            row[0] += 1
            row[1] += o_conv[k]
            row[2] += f_conv[k]
    print(f"{'by kind':<24} {'shapes':>6} {'onnxruntime':>11} {'fusebox':>8} {'diff':>7} {'ratio':>6}")
    for kind, (n, o, f) in sorted(by.items(), key=lambda kv: -(kv[1][2] - kv[1][1])):
        ratio = f"{f / o:6.2f}" if o > 0 else f"{'-':>6}"
        print(f"{kind:<24} {n:6d} {o:11.3f} {f:8.3f} {f - o:+7.3f} {ratio}")


class Graph:
    def __init__(self, model, given):
        self.producer = {}
        self.consumers = defaultdict(list)
        for n in model.graph.node:
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                self.consumers[i].append(n)
        self.shapes = shapes_of(model, given)
        # Per conv key, its kind (`conv_kind`), from the first Conv of that key.
        self.kinds = {}
        for n in model.graph.node:
            key = self.conv_key(n) if n.op_type == "Conv" else None
            if key is not None:
                self.kinds.setdefault(key, conv_kind(n, self.shapes[n.input[1]]))

    def conv_head(self, tensor):
        """The Conv whose fused group ends in `tensor`: back through Clip, Relu and
        BatchNormalization, and through an Add to the input made by a Conv whose output only
        the Add reads (the group's own convolution, not the residual)."""
        seen = 0
        while tensor in self.producer and seen < 8:
            seen += 1
            n = self.producer[tensor]
            if n.op_type == "Conv":
                return n
            if n.op_type in ("Clip", "Relu", "BatchNormalization", "HardSigmoid", "Sigmoid"):
                tensor = n.input[0]
                continue
            if n.op_type in ("Add", "Sum"):
                own = [
                    i
                    for i in n.input
                    if i in self.producer
                    and self.producer[i].op_type == "Conv"
                    and len(self.consumers[i]) == 1
                ]
                if own:
                    tensor = own[0]
                    continue
            return None
        return None

    def conv_key(self, conv):
        x, w = conv.input[0], conv.input[1]
        if x not in self.shapes or w not in self.shapes:
            return None
        return f"{fmt(self.shapes[x])} {fmt(self.shapes[w])}"


def onnxruntime_layers(model_path, graph, feed, threads, repeat):
    """Per conv key and per other op type: the median time per run (ms), summed over nodes."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.gettempdir(), "layer_gaps_ort")
    # Its workers stop spinning when a run ends: left spinning (the default), they held the
    # cores on into the fusebox processes this script runs next, even once the session was
    # dropped (a 64 -> 384 1x1 layer on 14x14, two threads: 0.078-0.083 ms against 0.057
    # alone; bench/RESULTS.md, session bd). Per-node kernel times are what this reads.
    so.add_session_config_entry("session.force_spinning_stop", "1")
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    sess.run(None, feed)
    for _ in range(repeat):
        sess.run(None, feed)
    prof = sess.end_profiling()
    with open(prof) as f:
        events = json.load(f)
    os.remove(prof)
    per_node = defaultdict(list)
    op_of = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = e["name"][: -len("_kernel_time")]
            per_node[name].append(e["dur"] / 1000.0)
            op_of[name] = e.get("args", {}).get("op_name", "?")
    convs, others = defaultdict(float), defaultdict(float)
    for name, durs in per_node.items():
        # The warm-up run's time is the first of each node's; the rest are the timed runs.
        ms = statistics.median(durs[1:] if len(durs) > 1 else durs)
        # Named after its output tensor: a fused group's last one, or the Conv's own.
        key = None
        if op_of[name] in ("Conv", "FusedConv"):
            head = graph.conv_head(re.sub(r"_nchwc$", "", name))
            key = graph.conv_key(head) if head is not None else None
        if key is not None:
            convs[key] += ms
        else:
            others[op_of[name]] += ms
    return convs, others


PROFILE_ON = re.compile(r"^profile (\S+) on (.+) calls (\d+) ([0-9.]+) ms")
PROFILE_FN = re.compile(r"^profile (\S+) calls (\d+) ([0-9.]+) ms [0-9.]+% of run (\[.*\])")


def nchw_key(key):
    """A fusebox profile key `(data) (weight)` with a split layout's data shape (`NCHW16c`'s
    `(n, c/16, h, w, 16)`, what `conv2d_layout = "auto"` converts to) written as its `NCHW`
    one, so that it meets onnxruntime's key for the same Conv."""
    m = re.match(r"^\(([^)]*)\) (.*)$", key)
    if not m:
        return key
    d = [int(x) for x in m.group(1).split(",") if x.strip()]
    if len(d) == 5:
        d = [d[0], d[1] * d[4], d[2], d[3]]
    return f"{fmt(d)} {m.group(2)}"


def fusebox_layers(fusebox, model_path, inputs, threads, repeat):
    """Per conv key: the chain's time on those shapes (ms per run); per other function or op
    (not a chain): its time; and the run's time."""
    args = [str(fusebox), "run", str(model_path)]
    for name, path in inputs:
        args += ["--input", f"{name}={path}"]
    with tempfile.TemporaryDirectory() as out:
        args += ["--output-dir", out, "--timings", "--profile", "--profile-shapes", "0"]
        args += ["--repeat", str(repeat)]
        env = dict(os.environ, FUSEBOX_THREADS=str(threads))
        r = subprocess.run(args, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"fusebox failed: {r.stderr[-2000:]}")
    convs, others, run = defaultdict(float), {}, None
    for line in r.stderr.splitlines():
        if line.startswith("time run "):
            run = float(line.split()[2])
        m = PROFILE_ON.match(line)
        if m and "conv2d" in m.group(1) and "other shape sets" not in m.group(2):
            convs[nchw_key(m.group(2))] += float(m.group(4))
            continue
        m = PROFILE_FN.match(line)
        if m and m.group(4) == "[op]" and "conv2d" not in m.group(1):
            others[m.group(1)] = float(m.group(3))
    return convs, others, run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument(
        "--threads",
        type=lambda v: [int(t) for t in v.split(",")],
        default=[2],
        help="a thread count, or several separated by commas (1,2)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--fusebox", type=Path, default=ROOT / "target" / "release" / "fusebox")
    a = ap.parse_args()
    model_path = a.model_dir / "model" / "model.onnx"
    if not model_path.exists():
        sys.exit(f"{a.model_dir}: expected model/model.onnx")
    model = onnx.load(str(model_path), load_external_data=False)
    # Each graph input from inputs/<name>.npy, the name with every character other than a
    # letter, digit or `_` made `_` (as bench/ort_time.py and fusebox's output files name it).
    initializers = {i.name for i in model.graph.initializer}
    inputs = []
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        safe = "".join(c if c.isalnum() or c == "_" else "_" for c in vi.name)
        path = a.model_dir / "inputs" / f"{safe}.npy"
        if not path.exists():
            sys.exit(f"{a.model_dir}: no {path} for graph input {vi.name!r}")
        inputs.append((vi.name, path))
    feed = {name: np.load(path) for name, path in inputs}
    given = {name: v.shape for name, v in feed.items()}
    graph = Graph(model, given)

    def keep_min(acc, new):
        for k, v in new.items():
            acc[k] = min(v, acc.get(k, v))

    counts = a.threads
    if not counts or any(t < 1 for t in counts):
        sys.exit(f"--threads: expected positive counts, got {counts}")
    o_conv = {t: {} for t in counts}
    o_other = {t: {} for t in counts}
    f_conv = {t: {} for t in counts}
    f_other = {t: {} for t in counts}
    f_runs = {t: [] for t in counts}
    for _ in range(a.rounds):
        for t in counts:
            c, o = onnxruntime_layers(model_path, graph, feed, t, a.repeat)
            keep_min(o_conv[t], c)
            keep_min(o_other[t], o)
            c, o, run = fusebox_layers(a.fusebox, model_path, inputs, t, a.repeat)
            keep_min(f_conv[t], c)
            keep_min(f_other[t], o)
            if run is not None:
                f_runs[t].append(run)

    if len(counts) == 1:
        print_one(a, counts[0], o_conv[counts[0]], o_other[counts[0]], f_conv[counts[0]],
                  f_other[counts[0]], f_runs[counts[0]])
    else:
        print_scaling(a, counts, o_conv, f_conv, f_runs)
    print_kinds(graph.kinds, o_conv[counts[-1]], f_conv[counts[-1]])


def print_one(a, threads, o_conv, o_other, f_conv, f_other, f_runs):
    print(f"{a.model_dir.name}: {threads} threads, minima over {a.rounds} alternated rounds")
    print(f"{'conv data, weight':<40} {'onnxruntime':>11} {'fusebox':>8} {'diff':>7} {'ratio':>6}")
    keys = sorted(set(o_conv) | set(f_conv), key=lambda k: -(f_conv.get(k, 0) - o_conv.get(k, 0)))
    for k in keys:
        o, f = o_conv.get(k), f_conv.get(k)
        if o is None or f is None:
            print(f"{k:<40} {o if o is not None else '-':>11} {f if f is not None else '-':>8}")
            continue
        print(f"{k:<40} {o:11.3f} {f:8.3f} {f - o:+7.3f} {f / o:6.2f}")
    print("other onnxruntime nodes: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(o_other.items())))
    print("other fusebox ops: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(f_other.items())))
    o_sum = sum(o_conv.values()) + sum(o_other.values())
    f_sum = sum(f_conv.values())
    print(
        f"convolutions: onnxruntime {sum(o_conv.values()):.3f} ms, fusebox {f_sum:.3f} ms; "
        f"onnxruntime's nodes in all {o_sum:.3f} ms, fusebox's run {min(f_runs, default=0):.3f} ms"
    )


def print_scaling(a, counts, o_conv, f_conv, f_runs):
    """Per conv key: each runtime's time at every thread count, its scaling from the first
    count to the last, and fusebox's ratio to onnxruntime at the last count; sorted by how much
    more fusebox's layer takes than onnxruntime's at the last count."""
    first, last = counts[0], counts[-1]
    print(
        f"{a.model_dir.name}: threads {', '.join(map(str, counts))}, minima over {a.rounds} "
        f"rounds (each round both runtimes at each count)"
    )
    head = f"{'conv data, weight':<40}"
    for t in counts:
        head += f" {'ort ' + str(t) + 'T':>8} {'fb ' + str(t) + 'T':>8}"
    head += f" {'ort x':>6} {'fb x':>6} {'ratio ' + str(last) + 'T':>8}"
    print(head)
    keys = [k for k in o_conv[last] if all(k in o_conv[t] and k in f_conv[t] for t in counts)]
    keys.sort(key=lambda k: -(f_conv[last][k] - o_conv[last][k]))
    for k in keys:
        row = f"{k:<40}"
        for t in counts:
            row += f" {o_conv[t][k]:8.3f} {f_conv[t][k]:8.3f}"
        o_x = o_conv[first][k] / o_conv[last][k]
        f_x = f_conv[first][k] / f_conv[last][k]
        row += f" {o_x:6.2f} {f_x:6.2f} {f_conv[last][k] / o_conv[last][k]:8.2f}"
        print(row)
    for t in counts:
        o_sum = sum(o_conv[t][k] for k in keys)
        f_sum = sum(f_conv[t][k] for k in keys)
        print(
            f"{t} thread(s): convolutions onnxruntime {o_sum:.3f} ms, fusebox {f_sum:.3f} ms "
            f"({f_sum / o_sum:.3f}); fusebox's run {min(f_runs[t], default=0):.3f} ms"
        )


if __name__ == "__main__":
    main()
