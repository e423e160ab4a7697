"""TVM 0.27's outputs for relax.image.grid_sample, relax.image.affine_grid and
relax.reverse_sequence, checked by
tests/image_ops.rs without TVM.

Run with the TVM venv (see tests/tvm/README.md):
    /work/wt/tvmvenv/bin/python tests/tvm/image/generate.py
Deterministic (numpy's seeded generator); commit the result. Each case holds TVM's
`mod.script()`, the inputs and the output of `relax.build` (LegalizeOps, llvm).
"""
import json
import os

import numpy as np
import tvm
from tvm import relax

rng = np.random.default_rng(27)
out = []


def build(name, params, body, arrs):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            o = bb.emit_output(bb.emit(body))
        bb.emit_func_output(o)
    mod = bb.get()
    script = mod.script()
    ex = tvm.compile(relax.transform.LegalizeOps()(mod), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"](*[tvm.runtime.tensor(a) for a in arrs]).numpy()
    out.append({
        "name": name,
        "script": script,
        "inputs": [{"shape": list(a.shape), "dtype": str(a.dtype),
                    "data": [float(x) for x in a.ravel()]} for a in arrs],
        "output": {"shape": list(res.shape), "data": [float(x) for x in res.ravel()]},
    })


# grid_sample: (N, C, H, W) data, channel-first (N, 2, Ho, Wo) grid; coordinates beyond [-1, 1]
# so that every padding mode is exercised.
for method in ["nearest", "bilinear", "bicubic"]:
    for pad in ["zeros", "border", "reflection"]:
        for align in [False, True]:
            xs, gs = (2, 3, 5, 6), (2, 2, 4, 7)
            x = relax.Var("x", relax.TensorType(xs, "float32"))
            g = relax.Var("g", relax.TensorType(gs, "float32"))
            body = relax.op.image.grid_sample(x, g, method=method, layout="NCHW",
                                              padding_mode=pad, align_corners=align)
            # Nearest: keep clear of rounding ties (TVM and ONNX round them differently).
            gv = rng.uniform(-1.3, 1.3, gs).astype("float32")
            arrs = [rng.standard_normal(xs).astype("float32"), gv]
            build(f"grid_sample_{method}_{pad}_{int(align)}", [x, g], body, arrs)

for align in [False, True]:
    ts = (2, 2, 3)
    t = relax.Var("theta", relax.TensorType(ts, "float32"))
    body = relax.op.image.affine_grid(t, (4, 5), align_corners=align)
    build(f"affine_grid_{int(align)}", [t], body, [rng.standard_normal(ts).astype("float32")])

# reverse_sequence (TVM's argument order and defaults), time-major and batch-major.
for seq_axis, batch_axis in [(0, 1), (1, 0)]:
    xs = (4, 5, 3) if seq_axis == 0 else (5, 4, 3)
    x = relax.Var("x", relax.TensorType(xs, "float32"))
    lens = relax.Var("lens", relax.TensorType((5,), "int64"))
    body = relax.op.reverse_sequence(x, lens, seq_axis=seq_axis, batch_axis=batch_axis)
    arrs = [rng.standard_normal(xs).astype("float32"), np.array([4, 1, 3, 2, 4], dtype="int64")]
    build(f"reverse_sequence_{seq_axis}{batch_axis}", [x, lens], body, arrs)

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tvm_image.json")
with open(path, "w") as f:
    json.dump({"generator": "tests/tvm/image/generate.py, TVM 0.27 relax.build (LegalizeOps, llvm)",
               "cases": out}, f)
print("ok", len(out))
