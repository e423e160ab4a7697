"""Cuts a piece out of an ONNX model, with its input, to time a few layers as they run in the
model: `subgraph.py MODEL INPUT_DIR START END OUT_DIR`.

START and END are tensor names of MODEL (e.g. `/features/features.7/conv/conv.2/Conv_output_0`
and `/features/features.10/Add_output_0`: three of MobileNetV2's 14×14 blocks). The piece is
what `onnx.utils.extract_model` keeps between them; START's value is computed by onnxruntime
from the model's inputs in INPUT_DIR (`<name>.npy`, as bench/export_models.py writes them) and
saved as OUT_DIR/x.npy beside OUT_DIR/model.onnx. Then, e.g.,
`fusebox run OUT_DIR/model.onnx --input START=OUT_DIR/x.npy --repeat 300 --timings`.
A benchmark helper, not a test.
"""

import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import shape_inference


def main() -> None:
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    path, inputs, start, end, out = sys.argv[1:]
    model = shape_inference.infer_shapes(onnx.load(path))
    known = {v.name: v for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    if start not in known or end not in known:
        sys.exit(f"{path}: no tensor named {start if start not in known else end}")
    probe = onnx.load(path)
    probe.graph.output.append(known[start])
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {}
    for i in session.get_inputs():
        safe = "".join(c if c.isalnum() or c == "_" else "_" for c in i.name)
        feeds[i.name] = np.load(os.path.join(inputs, f"{safe}.npy"))
    value = session.run([start], feeds)[0]
    os.makedirs(out, exist_ok=True)
    onnx.utils.extract_model(path, os.path.join(out, "model.onnx"), [start], [end])
    np.save(os.path.join(out, "x.npy"), value)
    ops = [n.op_type for n in onnx.load(os.path.join(out, "model.onnx")).graph.node]
    print(f"{out}/model.onnx: {len(ops)} nodes ({', '.join(sorted(set(ops)))}); input {value.shape}")


if __name__ == "__main__":
    main()
