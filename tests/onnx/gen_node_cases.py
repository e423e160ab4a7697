#!/usr/bin/env python3
"""Writes the ONNX backend node conformance cases to a folder, with onnxruntime's verdict on each.

The `onnx` wheel ships the case generators (`onnx.backend.test.case.node`), not their data. This
script runs the generators and writes every *tensor case* in the layout of ONNX's own test data:

    OUT/<case>/model.onnx
    OUT/<case>/test_data_set_0/input_<i>.pb, output_<i>.pb
    OUT/manifest.json   [{"name", "ops", "opset", "ort"}], in the generators' order

A tensor case is one whose graph inputs and outputs are all tensors of a dtype fusebox represents
(float16/32/64, bfloat16, int8/32/64, uint8, bool) and whose nodes are all in the default ONNX
domain: sequences, optionals, strings, float8/int4 and the training/ML domains are left out.

With --ort, each case is also run on onnxruntime's CPU provider and compared with the expected
outputs under the case's own tolerances (rtol/atol as ONNX's backend test runner uses them); the
manifest's "ort" is "pass", or "fail: <why>". Usage:

    .venv/bin/python tests/onnx/gen_node_cases.py --out target/onnx-node [--ort]
"""

import argparse
import json
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
import onnx.backend.test.case.node as node_cases

# ONNX TensorProto.DataType codes fusebox represents.
SUPPORTED = {1, 2, 3, 6, 7, 9, 10, 11, 16}


def is_tensor_case(case) -> bool:
    g = case.model.graph
    for vi in list(g.input) + list(g.output):
        if not vi.type.HasField("tensor_type"):
            return False
        if vi.type.tensor_type.elem_type not in SUPPORTED:
            return False
    if any(n.domain not in ("", "ai.onnx") for n in g.node):
        return False
    if len(case.data_sets) == 0:
        return False
    return True


def as_array(x):
    """The case's value as a numeric array, or None (object arrays, strings)."""
    if isinstance(x, onnx.TensorProto):
        x = numpy_helper.to_array(x)
    a = np.asarray(x)
    return None if a.dtype.kind in "OUS" else a


def opset_of(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return 0


def ort_verdict(case, model_path, inputs, outputs) -> str:
    import onnxruntime as ort

    try:
        so = ort.SessionOptions()
        so.log_severity_level = 4
        sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
        feed = {i.name: v for i, v in zip(sess.get_inputs(), inputs)}
        got = sess.run(None, feed)
    except Exception as e:  # noqa: BLE001 - any failure of onnxruntime is its verdict
        return "fail: " + str(e).splitlines()[0][:200] if str(e) else "fail: error"
    if len(got) != len(outputs):
        return f"fail: {len(got)} outputs, expected {len(outputs)}"
    for k, (g, w) in enumerate(zip(got, outputs)):
        g = np.asarray(g)
        w = np.asarray(w)
        if g.shape != w.shape:
            return f"fail: output {k} shape {g.shape}, expected {w.shape}"
        if g.dtype != w.dtype:
            return f"fail: output {k} dtype {g.dtype}, expected {w.dtype}"
        try:
            if w.dtype.kind in "fc":
                np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol)
            else:
                np.testing.assert_array_equal(g, w)
        except AssertionError:
            return f"fail: output {k} differs"
    return "pass"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ort", action="store_true", help="record onnxruntime's verdict per case")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    cases = node_cases.collect_testcases()
    os.makedirs(args.out, exist_ok=True)
    manifest = []
    for case in cases:
        if not is_tensor_case(case):
            continue
        inputs, outputs = case.data_sets[0]
        inputs = [as_array(x) for x in inputs]
        outputs = [as_array(x) for x in outputs]
        if any(v is None for v in inputs + outputs):
            continue
        d = os.path.join(args.out, case.name)
        ds = os.path.join(d, "test_data_set_0")
        os.makedirs(ds, exist_ok=True)
        model_path = os.path.join(d, "model.onnx")
        onnx.save(case.model, model_path)
        for prefix, vals in (("input", inputs), ("output", outputs)):
            for i, v in enumerate(vals):
                t = numpy_helper.from_array(v)
                with open(os.path.join(ds, f"{prefix}_{i}.pb"), "wb") as f:
                    f.write(t.SerializeToString())
        entry = {
            "name": case.name,
            "ops": sorted({n.op_type for n in case.model.graph.node}),
            "opset": opset_of(case.model),
            "rtol": case.rtol,
            "atol": case.atol,
        }
        if args.ort:
            entry["ort"] = ort_verdict(case, model_path, inputs, outputs)
        manifest.append(entry)
    tmp = os.path.join(args.out, "manifest.json.tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, os.path.join(args.out, "manifest.json"))
    n_ort = sum(1 for e in manifest if e.get("ort") == "pass")
    print(f"wrote {len(manifest)} tensor cases of {len(cases)} to {args.out}"
          + (f"; onnxruntime passes {n_ort}" if args.ort else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
