"""Writes the einsum seed of the `run_onnx` fuzz target next to this file: XLNet's dense-layer
einsums with constant weights (`ibh,hnd->ibnd`, a bias add, `ibnd,hnd->ibh`), which
EinsumToMatmul (`core/src/transform/einsum_to_matmul.rs`) rewrites into matmuls, then a Softmax
along the last axis (the `f32` row kernel). Mutations of the equations, ranks and initializer
shapes reach the pass's checks.

    .venv/bin/python core/fuzz/seeds/run_onnx/make_einsum_seeds.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

OUT = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(0)
S, B, HID, N, D = 3, 2, 4, 2, 3
w = rng.standard_normal((HID, N, D)).astype(np.float32)
o = rng.standard_normal((HID, N, D)).astype(np.float32)
bias = rng.standard_normal((N, D)).astype(np.float32)
nodes = [
    h.make_node("Einsum", ["x", "w"], ["q"], equation="ibh,hnd->ibnd"),
    h.make_node("Add", ["q", "bias"], ["qb"]),
    h.make_node("Einsum", ["qb", "o"], ["p"], equation="ibnd,hnd->ibh"),
    h.make_node("Softmax", ["p"], ["y"], axis=-1),
]
g = h.make_graph(
    nodes,
    "einsum_dense",
    [h.make_tensor_value_info("x", T.FLOAT, [S, B, HID])],
    [h.make_tensor_value_info("y", T.FLOAT, [S, B, HID])],
    [nh.from_array(w, "w"), nh.from_array(o, "o"), nh.from_array(bias, "bias")],
)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
onnx.checker.check_model(m)
onnx.save(m, os.path.join(OUT, "einsum_dense.onnx"))
