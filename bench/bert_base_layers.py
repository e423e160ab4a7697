#!/usr/bin/env python3
"""A BERT-base-sized encoder (hidden 768, 12 heads, FFN 3072; LAYERS layers, batch 1,
sequence SEQ) written with onnx.helper in the form torch's TorchScript exporter gives
(`tests/models/bert-ts`: MatMul + bias Add, Reshape/Transpose around the heads, both sides
scaled by d^-1/4, mask Add, Softmax, MatMul, residual Add + LayerNormalization, erf GELU), with
seeded random weights, an input and onnxruntime's output; then times onnxruntime and
`fusebox run` on it. No torch needed (the fixtures' encoder layer, at full size).

    .venv/bin/python bench/bert_base_layers.py OUT_DIR [LAYERS] [SEQ] [THREADS]

Writes OUT_DIR/model.onnx, OUT_DIR/x.npy, OUT_DIR/mask.npy, OUT_DIR/ort.npy and prints
onnxruntime's median time (intra-op THREADS, default 2). Time fusebox with:

    FUSEBOX_THREADS=2 target/release/fusebox run OUT_DIR/model.onnx --config configs/cpu.toml \\
        --input x=OUT_DIR/x.npy --input mask=OUT_DIR/mask.npy --repeat 10 --timings
"""

import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

H, HEADS, FFN = 768, 12, 3072
D = H // HEADS


def build(layers: int, seq: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(op, ins, name, **attrs):
        nodes.append(helper.make_node(op, ins, [name], name=name, **attrs))
        return name

    def w(name, *shape):
        return const(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    scale = const("scale", np.array(D**-0.25, dtype=np.float32))
    sqrt2 = const("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    one = const("one", np.array(1.0, dtype=np.float32))
    half = const("half", np.array(0.5, dtype=np.float32))
    heads_shape = const("heads_shape", np.array([1, seq, HEADS, D], dtype=np.int64))
    hidden_shape = const("hidden_shape", np.array([1, seq, H], dtype=np.int64))
    x = "x"
    for i in range(layers):
        p = f"l{i}_"

        def proj(tag, inp, n_in, n_out):
            m = node("MatMul", [inp, w(p + tag + "_w", n_in, n_out)], p + tag + "_mm")
            return node("Add", [w(p + tag + "_b", n_out), m], p + tag)

        q = node("Reshape", [proj("q", x, H, H), heads_shape], p + "q4")
        k = node("Reshape", [proj("k", x, H, H), heads_shape], p + "k4")
        v = node("Reshape", [proj("v", x, H, H), heads_shape], p + "v4")
        qt = node("Transpose", [q], p + "qt", perm=[0, 2, 1, 3])
        kt = node("Transpose", [k], p + "kt", perm=[0, 2, 3, 1])
        vt = node("Transpose", [v], p + "vt", perm=[0, 2, 1, 3])
        qs = node("Mul", [qt, scale], p + "qs")
        ks = node("Mul", [kt, scale], p + "ks")
        s = node("MatMul", [qs, ks], p + "scores")
        s = node("Add", [s, "mask"], p + "masked")
        pr = node("Softmax", [s], p + "probs", axis=-1)
        ctx = node("MatMul", [pr, vt], p + "ctx")
        ctx = node("Transpose", [ctx], p + "ctx_t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, hidden_shape], p + "ctx_r")
        a = proj("o", ctx, H, H)
        a = node("Add", [a, x], p + "res1")
        ln1 = node(
            "LayerNormalization",
            [a, const(p + "g1", np.ones(H, np.float32)), const(p + "b1", np.zeros(H, np.float32))],
            p + "ln1",
            axis=-1,
            epsilon=1e-12,
        )
        f = proj("f1", ln1, H, FFN)
        g = node("Div", [f, sqrt2], p + "g_div")
        g = node("Erf", [g], p + "g_erf")
        g = node("Add", [g, one], p + "g_add")
        g = node("Mul", [f, g], p + "g_mul")
        g = node("Mul", [g, half], p + "gelu")
        f2 = proj("f2", g, FFN, H)
        r2 = node("Add", [f2, ln1], p + "res2")
        x = node(
            "LayerNormalization",
            [r2, const(p + "g2", np.ones(H, np.float32)), const(p + "b2", np.zeros(H, np.float32))],
            p + "ln2",
            axis=-1,
            epsilon=1e-12,
        )
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    graph = helper.make_graph(
        nodes,
        "bert_base_layers",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, H]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, 1, seq]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, H])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    out = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    seq = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
    import os

    os.makedirs(out, exist_ok=True)
    model = build(layers, seq)
    onnx.save(model, f"{out}/model.onnx")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, seq, H)).astype(np.float32)
    mask = np.zeros((1, 1, 1, seq), np.float32)
    mask[..., seq - seq // 4 :] = -3.4028234663852886e38
    np.save(f"{out}/x.npy", x)
    np.save(f"{out}/mask.npy", mask)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(f"{out}/model.onnx", so, providers=["CPUExecutionProvider"])
    feeds = {"x": x, "mask": mask}
    (y,) = sess.run(None, feeds)
    np.save(f"{out}/ort.npy", y)
    times = []
    for _ in range(10):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    print(f"onnxruntime {ort.__version__}, {threads} threads: median {np.median(times) * 1e3:.2f} ms "
          f"(min {min(times) * 1e3:.2f}) for {layers} layers, seq {seq}")


if __name__ == "__main__":
    main()
