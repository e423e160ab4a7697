"""TVM 0.27's outputs for relax.nn.attention, checked by tests/nn_attention.rs without TVM.

Run with the TVM venv (see tests/tvm/README.md):
    /work/wt/tvmvenv/bin/python tests/tvm/attention/generate.py
Deterministic (numpy's seeded generator); commit the result.
"""
import os
import json, numpy as np, tvm
from tvm import relax
rng = np.random.default_rng(19)
cases = [
  # name, q shape, k shape, v shape, bias shape, scale, causal
  ("plain", (2,3,2,8), (2,5,2,8), (2,5,2,4), None, None, None),
  ("scale_topleft", (1,5,3,8), (1,5,3,8), (1,5,3,8), None, 0.3, "TopLeft"),
  ("bottomright_short_q", (1,3,2,8), (1,7,2,8), (1,7,2,8), None, None, "BottomRight"),
  ("bottomright_long_q", (1,6,2,4), (1,3,2,4), (1,3,2,4), None, None, "BottomRight"),
  ("topleft_long_q", (1,6,2,4), (1,3,2,4), (1,3,2,4), None, None, "TopLeft"),
  ("bias_full", (2,4,2,8), (2,6,2,8), (2,6,2,8), (2,2,4,6), None, None),
  ("bias_bcast_causal", (2,4,2,8), (2,6,2,8), (2,6,2,8), (1,2,1,6), 0.25, "BottomRight"),
]
out = []
for name, qs, ks, vs, bs, scale, causal in cases:
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType(qs, "float32"))
    k = relax.Var("k", relax.TensorType(ks, "float32"))
    v = relax.Var("v", relax.TensorType(vs, "float32"))
    params = [q, k, v]
    b = None
    if bs is not None:
        b = relax.Var("b", relax.TensorType(bs, "float32")); params.append(b)
    with bb.function("main", params):
        with bb.dataflow():
            o = bb.emit_output(bb.emit(relax.op.nn.attention(q, k, v, b, scale=scale, causal_mask=causal)))
        bb.emit_func_output(o)
    mod = bb.get()
    script = mod.script()
    ex = tvm.compile(relax.transform.LegalizeOps()(mod), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    arrs = [rng.standard_normal(s).astype("float32") for s in [qs, ks, vs] + ([bs] if bs else [])]
    res = vm["main"](*[tvm.runtime.tensor(a) for a in arrs]).numpy()
    out.append({"name": name, "script": script, "inputs": [{"shape": list(a.shape), "data": [float(x) for x in a.ravel()]} for a in arrs],
                "output": {"shape": list(res.shape), "data": [float(x) for x in res.ravel()]}})
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tvm_attention.json")
with open(path, "w") as f:
    json.dump({"generator": "tests/tvm/attention/generate.py, TVM 0.27 relax.build (LegalizeOps, llvm)", "cases": out}, f)
print("ok", len(out))
