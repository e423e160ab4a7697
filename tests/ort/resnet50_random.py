"""Builds the onnxruntime reference for the ResNet-50 numerics test (issue 6).

Takes the light ResNet-50 from the `onnx` package (its weights are `ConstantOfShape` fills of
0.02), replaces every weight with seeded random values (He-normal for conv/gemm weights,
near-identity batch-norm statistics), runs it with onnxruntime's CPU provider on a seeded random
input, and writes `resnet50_random.onnx`, `input.npy` and `expected.npy` to `--out`. With
`--bench N` it also prints onnxruntime's median time over N runs with 2 intra-op threads.
"""

import argparse
import os
import time

import numpy as np
import onnx
import onnxruntime as ort

ort.set_default_logger_severity(3)
from onnx import numpy_helper


def random_weight(name, shape, rng):
    shape = [int(d) for d in shape]
    if len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    if name.endswith(("_s_0", "_riv_0")):  # batch-norm scale / running variance
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    return rng.uniform(-0.1, 0.1, shape).astype(np.float32)  # biases, running means


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--bench", type=int, default=0)
    args = ap.parse_args()
    data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    model = onnx.load(os.path.join(data, "light_resnet50.onnx"))
    g = model.graph
    rng = np.random.default_rng(args.seed)
    inits = {i.name: i for i in g.initializer}
    keep = []
    new_inits = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = numpy_helper.to_array(inits[node.input[0]])
            w = random_weight(node.output[0], shape, rng)
            new_inits.append(numpy_helper.from_array(w, node.output[0]))
        else:
            keep.append(node)
    # Float initializers that are weights themselves (not shapes) are randomised too.
    for i, init in enumerate(g.initializer):
        arr = numpy_helper.to_array(init)
        if arr.dtype == np.float32 and not init.name.endswith("__SHAPE"):
            g.initializer[i].CopyFrom(numpy_helper.from_array(random_weight(init.name, arr.shape, rng), init.name))
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new_inits)
    # The logits (the softmax's input) become a second output: with random weights the softmax
    # saturates, so the logits are what the comparison really checks.
    logits = [n.input[0] for n in g.node if n.op_type == "Softmax"][0]
    g.output.append(onnx.helper.make_tensor_value_info(logits, onnx.TensorProto.FLOAT, None))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "resnet50_random.onnx")
    onnx.save(model, path)
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(os.path.join(args.out, "input.npy"), x)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    y, z = sess.run(None, {name: x})
    np.save(os.path.join(args.out, "expected.npy"), y)
    np.save(os.path.join(args.out, "expected_logits.npy"), z)
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in logits)
    with open(os.path.join(args.out, "logits_name"), "w") as f:
        f.write(safe)
    print(f"ort: input {name} {x.shape}; softmax {y.shape}; logits {logits} range [{z.min():.6g}, {z.max():.6g}]")
    if args.bench:
        sess.run(None, {name: x})
        times = []
        for _ in range(args.bench):
            t = time.perf_counter()
            sess.run(None, {name: x})
            times.append(time.perf_counter() - t)
        print(f"time ort_run {np.median(times) * 1e3:.3f} ms (median of {args.bench}, 2 threads)")


if __name__ == "__main__":
    main()
