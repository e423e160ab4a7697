# A BERT-base-shaped ONNX graph (LAYERS layers of 12-head attention and a GELU MLP, hidden size
# 96, random weights): the op graph of BERT-base, not its weights. Measures `--emit html` on
# BERT-sized graphs (README, "The partition report"):
#     .venv/bin/python bench/bert_shaped_onnx.py LAYERS OUT.onnx
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
L = int(sys.argv[1]) if len(sys.argv) > 1 else 12
S, D, HEADS, V = 128, 96, 12, 512
rng = np.random.default_rng(0)
inits, nodes = [], []
def W(name, *shape):
    inits.append(nh.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), name)); return name
def C(name, arr):
    inits.append(nh.from_array(np.array(arr), name)); return name
k = [0]
def n(op, ins, **kw):
    k[0] += 1; out = f"t{k[0]}"; nodes.append(h.make_node(op, ins, [out], name=f"{op}_{k[0]}", **kw)); return out
def ln(x, p):
    return n("LayerNormalization", [x, W(p+"_g", D), W(p+"_b", D)], axis=-1, epsilon=1e-12)
def dense(x, p, i, o):
    return n("Add", [n("MatMul", [x, W(p+"_w", i, o)]), W(p+"_b", o)])
hd = D // HEADS
C("shape_heads", np.array([1, S, HEADS, hd], dtype=np.int64)); C("shape_back", np.array([1, S, D], dtype=np.int64))
C("scale", np.array(np.sqrt(hd), dtype=np.float32)); C("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
C("one", np.array(1.0, dtype=np.float32)); C("half", np.array(0.5, dtype=np.float32))
x = n("Add", [n("Gather", [W("wte", V, D), "ids"]), W("wpe", S, D)])
x = ln(x, "emb")
mask = n("Mul", [n("Sub", [C("one_m", np.array(1.0, dtype=np.float32)), n("Cast", [n("Unsqueeze", [n("Unsqueeze", ["mask", C("ax1", np.array([1], dtype=np.int64))]), C("ax2", np.array([2], dtype=np.int64))])], to=T.FLOAT)]), C("neg", np.array(-1e4, dtype=np.float32))])
for l in range(L):
    p = f"l{l}"
    def heads(t, perm):
        return n("Transpose", [n("Reshape", [t, "shape_heads"])], perm=perm)
    q = heads(dense(x, p+"q", D, D), [0, 2, 1, 3]); kk = heads(dense(x, p+"k", D, D), [0, 2, 3, 1]); v = heads(dense(x, p+"v", D, D), [0, 2, 1, 3])
    s = n("Add", [n("Div", [n("MatMul", [q, kk]), "scale"]), mask])
    a = n("MatMul", [n("Softmax", [s], axis=-1), v])
    a = n("Reshape", [n("Transpose", [a], perm=[0, 2, 1, 3]), "shape_back"])
    x = ln(n("Add", [dense(a, p+"o", D, D), x]), p+"ln1")
    f = dense(x, p+"i", D, 4*D)
    f = n("Mul", [n("Mul", [f, n("Add", [n("Erf", [n("Div", [f, "sqrt2"])]), "one"])]), "half"])
    x = ln(n("Add", [dense(f, p+"f", 4*D, D), x]), p+"ln2")
nodes[-1].output[0] = "out"
g = h.make_graph(nodes, "bert_base_shaped", [h.make_tensor_value_info("ids", T.INT64, [1, S]), h.make_tensor_value_info("mask", T.INT64, [1, S])],
                 [h.make_tensor_value_info("out", T.FLOAT, [1, S, D])], inits)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); onnx.checker.check_model(m)
onnx.save(m, sys.argv[2]); print(len(nodes), "nodes")
