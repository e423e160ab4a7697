#!/usr/bin/env python3
"""Twelve GPT-2-sized dense layers as an ONNX model: `x` (128 × 768) through MatMuls with
constant weights 768 → 3072 and 3072 → 768 in turn (113 MB of weights, seed 0), the stack of
`cargo run -p fusebox-cpu --example bench_dense`, for onnxruntime to run too.

Writes OUT_DIR/model/model.onnx and OUT_DIR/inputs/x.npy (bench/interleaved.py's MODEL_DIR
layout); then `.venv/bin/python bench/interleaved.py OUT_DIR --threads 1` compares the two
runtimes' dense kernels in one process with weights streamed from memory (bench/RESULTS.md,
session ar). A benchmark helper, not a test.

Usage: .venv/bin/python bench/dense_stack.py OUT_DIR
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "model"), exist_ok=True)
    os.makedirs(os.path.join(out, "inputs"), exist_ok=True)
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(12):
        ci, co = (768, 3072) if i % 2 == 0 else (3072, 768)
        w = (rng.standard_normal((ci, co)) / np.sqrt(ci)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
        x = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "dense_stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 768])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [128, 768])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, os.path.join(out, "model", "model.onnx"))
    np.save(os.path.join(out, "inputs", "x.npy"), rng.standard_normal((128, 768)).astype(np.float32))


if __name__ == "__main__":
    main()
