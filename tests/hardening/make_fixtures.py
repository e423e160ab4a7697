"""Writes the small ONNX reproducers of tests/hardening.rs (issue 18), with the onnx package.

Run from the repository root: .venv/bin/python tests/hardening/make_fixtures.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))


def save(model, name):
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(HERE, name))


# A Gather whose indices come from an input: an index out of range fails at run time, in the
# node `pick_row`, after FuseOps renamed its binding.
g = helper.make_graph(
    [
        helper.make_node("Relu", ["x"], ["r"], name="rectify"),
        helper.make_node("Gather", ["r", "idx"], ["y"], name="pick_row", axis=0),
    ],
    "gather_oob",
    [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3]),
        helper.make_tensor_value_info("idx", TensorProto.INT64, [2]),
    ],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
)
save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "gather_oob.onnx")
np.save(os.path.join(HERE, "gather_oob_idx.npy"), np.array([1, 7], dtype=np.int64))
