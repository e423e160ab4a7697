#!/usr/bin/env python3
"""Re-saves an ONNX model with every initializer in one external-data side file, written by the
`onnx` package itself (`save_as_external_data=True`), so fusebox's reader is checked against the
reference writer. Usage: to_external_data.py IN.onnx OUT_DIR  (writes OUT_DIR/model.onnx and
OUT_DIR/model.onnx.data)."""

import os
import sys

import onnx


def main() -> int:
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    m = onnx.load(src)
    onnx.save_model(
        m,
        os.path.join(out, "model.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    n = sum(1 for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    print(f"{out}: {n} initializers in model.onnx.data ({os.path.getsize(os.path.join(out, 'model.onnx.data'))} bytes)")
    return 0 if n > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
