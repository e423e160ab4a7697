"""Per-layer convolution timings: fusebox against onnxruntime, one conv (+ bias + ReLU) at a time.

For each convolution shape of a preset (the distinct conv layers of ResNet-50 or MobileNetV2,
batch 1), writes a one-node ONNX model (Conv with bias, then Relu; random weights, seed 0) and
a random input into OUT_DIR, then times onnxruntime's CPU provider (intra-op threads N, one
warm-up, median of R runs) and `fusebox run --repeat R --timings` (its median `time run`) on
the same input, and prints both with their ratio. A benchmark, not a test: it asserts nothing.

The ratio includes each runtime's fixed cost per run (fusebox's `run` of a one-op model costs
some tens of microseconds more than onnxruntime's `run`; compare a Relu-only model with
`--preset none --relu`), so it overstates the gap on the smallest layers. The VM's noise between
processes is of the same order as many of the differences: repeat it, and alternate binaries
(`--fusebox A --fusebox B`) when comparing two builds.

Each one-layer model is written in bench/interleaved.py's MODEL_DIR layout
(OUT_DIR/NAME/model/model.onnx, OUT_DIR/NAME/inputs/x.npy), so the two runtimes can also be
compared layer by layer in one process, inference against inference, which the VM's slow and
fast stretches move far less (bench/RESULTS.md, session ar):
  for d in /tmp/conv_layers/*/; do .venv/bin/python bench/interleaved.py $d --threads 1 \
      --pairs 60 --block 3; done
Those ratios include fusebox's copy of the input into its own tensor (onnxruntime reads the
NumPy array in place): a few percent on the layers with the largest inputs.

Usage: .venv/bin/python bench/conv_layers.py [--preset resnet50|mobilenet-v2|pointwise|depthwise|conv3x3]
       [--threads 2] [--repeat 300] [--out-dir /tmp/conv_layers] [--fusebox target/release/fusebox ...]
"""

import argparse
import os
import statistics
import subprocess
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# (in channels, input size, out channels, kernel, stride, groups)
PRESETS = {
    # The distinct layers of the light ResNet-50 of bench/export_models.py (torchvision's v1.5:
    # stride 2 on the 3×3 of each stage's first block and on its 1×1 projection).
    "resnet50": [
        (3, 224, 64, 7, 2, 1),
        (64, 56, 64, 1, 1, 1),
        (64, 56, 64, 3, 1, 1),
        (64, 56, 256, 1, 1, 1),
        (256, 56, 64, 1, 1, 1),
        (256, 56, 128, 1, 1, 1),
        (128, 56, 128, 3, 2, 1),
        (256, 56, 512, 1, 2, 1),
        (128, 28, 512, 1, 1, 1),
        (512, 28, 128, 1, 1, 1),
        (128, 28, 128, 3, 1, 1),
        (512, 28, 256, 1, 1, 1),
        (256, 28, 256, 3, 2, 1),
        (512, 28, 1024, 1, 2, 1),
        (256, 14, 1024, 1, 1, 1),
        (1024, 14, 256, 1, 1, 1),
        (256, 14, 256, 3, 1, 1),
        (1024, 14, 512, 1, 1, 1),
        (512, 14, 512, 3, 2, 1),
        (1024, 14, 2048, 1, 2, 1),
        (512, 7, 2048, 1, 1, 1),
        (2048, 7, 512, 1, 1, 1),
        (512, 7, 512, 3, 1, 1),
    ],
    "mobilenet-v2": [
        (3, 224, 32, 3, 2, 1),
        (32, 112, 32, 3, 1, 32),
        (32, 112, 16, 1, 1, 1),
        (16, 112, 96, 1, 1, 1),
        (96, 112, 96, 3, 2, 96),
        (24, 56, 144, 1, 1, 1),
        (144, 56, 144, 3, 1, 144),
        (144, 56, 24, 1, 1, 1),
        (144, 56, 144, 3, 2, 144),
        (32, 28, 192, 1, 1, 1),
        (192, 28, 192, 3, 1, 192),
        (192, 28, 32, 1, 1, 1),
        (64, 14, 384, 1, 1, 1),
        (384, 14, 384, 3, 1, 384),
        (384, 14, 64, 1, 1, 1),
        (96, 14, 576, 1, 1, 1),
        (576, 14, 576, 3, 1, 576),
        (576, 14, 96, 1, 1, 1),
        (160, 7, 960, 1, 1, 1),
        (960, 7, 960, 3, 1, 960),
        (960, 7, 160, 1, 1, 1),
        (320, 7, 1280, 1, 1, 1),
    ],
}
PRESETS["pointwise"] = [s for p in ("resnet50", "mobilenet-v2") for s in PRESETS[p] if s[3] == 1]
PRESETS["depthwise"] = [s for s in PRESETS["mobilenet-v2"] if s[5] > 1]
# The 3×3 stride-1 layers of ResNet-50 (fusebox's Winograd path where it pays, else gemm_cols).
PRESETS["conv3x3"] = [s for s in PRESETS["resnet50"] if s[3] == 3 and s[4] == 1]

p = argparse.ArgumentParser()
p.add_argument("--preset", default="resnet50", choices=sorted(PRESETS) + ["none"])
p.add_argument("--relu", action="store_true", help="also time a Relu-only model (the fixed cost)")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--repeat", type=int, default=300)
p.add_argument("--out-dir", default="/tmp/conv_layers")
p.add_argument("--fusebox", action="append", help="fusebox binaries (default target/release/fusebox)")
a = p.parse_args()
binaries = a.fusebox or [os.path.join(os.path.dirname(__file__), "..", "target/release/fusebox")]


def ort_ms(model, x):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    # Its workers stop spinning when a run ends: left spinning (the default), they held the
    # cores on into the fusebox process timed next, even once the session was dropped (64 ->
    # 384 on 14x14, two threads: fusebox 0.078-0.083 ms against 0.057 alone; bench/RESULTS.md,
    # session bd). onnxruntime's own time then includes waking its workers each run (that
    # layer 0.058 -> 0.071 ms), as in bench/interleaved.py.
    so.add_session_config_entry("session.force_spinning_stop", "1")
    s = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    s.run(None, {"x": x})
    ts = []
    for _ in range(a.repeat):
        t = time.perf_counter()
        s.run(None, {"x": x})
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def fusebox_ms(binary, model, x_path, out):
    r = subprocess.run(
        [binary, "run", model, "--input", f"x={x_path}", "--repeat", str(a.repeat), "--timings",
         "--output-dir", out],
        capture_output=True, text=True, env=dict(os.environ, FUSEBOX_THREADS=str(a.threads)),
    )
    for line in r.stderr.splitlines():
        if line.startswith("time run "):
            return float(line.split()[2])
    raise SystemExit(f"{binary} failed on {model}:\n{r.stderr}")


def write(name, nodes, x, inits):
    """The model as OUT_DIR/NAME/model/model.onnx and its input as OUT_DIR/NAME/inputs/x.npy
    (bench/interleaved.py's MODEL_DIR layout)."""
    d = os.path.join(a.out_dir, name)
    os.makedirs(os.path.join(d, "model"), exist_ok=True)
    os.makedirs(os.path.join(d, "inputs"), exist_ok=True)
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = os.path.join(d, "model", "model.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), model)
    x_path = os.path.join(d, "inputs", "x.npy")
    np.save(x_path, x)
    return model, x_path, d


def report(name, model, x, x_path, d):
    o = ort_ms(model, x)
    cols = [f"{name:24s} onnxruntime {o:7.3f} ms"]
    for b in binaries:
        f = fusebox_ms(b, model, x_path, d)
        cols.append(f"fusebox {f:7.3f} ms ratio {f / o:5.2f}")
    print("  ".join(cols), flush=True)


rng = np.random.default_rng(0)
print(f"{a.threads} threads, median of {a.repeat} runs; fusebox: {', '.join(binaries)}")
if a.relu:
    x = rng.standard_normal((1, 256, 14, 14)).astype(np.float32)
    model, x_path, d = write("relu", [helper.make_node("Relu", ["x"], ["y"])], x, [])
    report("relu 1x256x14x14", model, x, x_path, d)
for ci, hw, co, k, s, grp in PRESETS.get(a.preset, []):
    w = (rng.standard_normal((co, ci // grp, k, k)) * 0.05).astype(np.float32)
    b = rng.standard_normal(co).astype(np.float32)
    x = rng.standard_normal((1, ci, hw, hw)).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4, strides=[s, s],
                            kernel_shape=[k, k], group=grp)
    name = f"{ci}x{hw}x{hw}->{co} k{k} s{s}" + (f" g{grp}" if grp > 1 else "")
    model, x_path, d = write(name.replace(" ", "_").replace(">", ""),
                             [conv, helper.make_node("Relu", ["c"], ["y"])], x,
                             [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    report(name, model, x, x_path, d)
