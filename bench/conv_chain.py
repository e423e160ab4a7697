"""A chain of N same-shaped convolutions (+ bias + ReLU) as an ONNX model with random weights,
to time a layer whose weights come from memory rather than cache.

One layer alone keeps its weights in the last-level cache between timed runs; in a model, the
other layers' weights push them out, so each inference streams them from memory. A chain whose
weights add up to more than the cache (ten 256x256 3x3 layers are 23 MB, 40 MB Winograd-
transformed) shows what a layer costs in a model; compare its time per layer with N = 1.
Layers alternate C -> O and O -> C channels, "same" padding, stride 1.

Usage: .venv/bin/python bench/conv_chain.py C HW K N O OUT.onnx
  writes OUT.onnx and OUT.npy (the input, named `x`); then e.g.
  fusebox run OUT.onnx --input x=OUT.npy --repeat 100 --timings
  (bench/RESULTS.md, session k: ResNet-50's 256x14x14 3x3 and 512<->2048 7x7 1x1 layers).
"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main() -> None:
    if len(sys.argv) != 7:
        sys.exit(__doc__)
    c, hw, k, n, o = (int(a) for a in sys.argv[1:6])
    out = sys.argv[6]
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "x"
    for i in range(n):
        ci, co = (c, o) if i % 2 == 0 else (o, c)
        w = (rng.standard_normal((co, ci, k, k)) / np.sqrt(ci * k * k)).astype(np.float32)
        b = (rng.standard_normal(co) * 0.1).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[k // 2] * 4))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        x = f"r{i}"
    oc = c if n % 2 == 0 else o
    graph = helper.make_graph(
        nodes,
        "conv_chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, oc, hw, hw])],
        inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), out)
    np.save(out.removesuffix(".onnx") + ".npy", rng.standard_normal((1, c, hw, hw)).astype(np.float32))


if __name__ == "__main__":
    main()
