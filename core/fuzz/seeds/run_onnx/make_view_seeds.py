"""Writes the view seeds of the `run_onnx` fuzz target next to this file: DeBERTa's
relative-position terms (Expand, two GatherElements, a Transpose, Div, Add; indices in range,
some negative) and a layout chain (Transpose, Reshape, Unsqueeze, Expand) feeding Mul and
Sigmoid. FuseOps groups each into one elementwise program that reads its layout ops and gathers
as views (`backends/cpu/src/elem_view.rs`), so mutations of these reach the view code.

    .venv/bin/python core/fuzz/seeds/run_onnx/make_view_seeds.py
"""
import os

import numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh

OUT = os.path.dirname(os.path.abspath(__file__))
H,S,K=2,5,8
rng=np.random.default_rng(0)
idx=rng.integers(-K,K,size=(1,S,S)).astype(np.int64)
nodes=[
 h.make_node("Expand",["idx","shp"],["e"]),
 h.make_node("GatherElements",["c2p","e"],["g"],axis=-1),
 h.make_node("Div",["g","s"],["d"]),
 h.make_node("GatherElements",["p2c","e"],["g2"],axis=2),
 h.make_node("Transpose",["g2"],["t"],perm=[0,2,1]),
 h.make_node("Add",["d","t"],["y"]),
]
g=h.make_graph(nodes,"rel",[h.make_tensor_value_info("c2p",T.FLOAT,[H,S,K]),h.make_tensor_value_info("p2c",T.FLOAT,[H,S,K])],
 [h.make_tensor_value_info("y",T.FLOAT,[H,S,S])],
 [nh.from_array(idx,"idx"),nh.from_array(np.array([H,S,S],np.int64),"shp"),nh.from_array(np.array(3.0,np.float32),"s")])
m=h.make_model(g,opset_imports=[h.make_opsetid("",17)]); onnx.checker.check_model(m); onnx.save(m,os.path.join(OUT, "relpos.onnx"))
nodes=[
 h.make_node("Transpose",["x"],["a"],perm=[1,0]),
 h.make_node("Reshape",["a","s1"],["b"]),
 h.make_node("Unsqueeze",["b","ax"],["c"]),
 h.make_node("Expand",["c","s2"],["d"]),
 h.make_node("Mul",["d","y"],["e"]),
 h.make_node("Sigmoid",["e"],["z"]),
]
g=h.make_graph(nodes,"lay",[h.make_tensor_value_info("x",T.FLOAT,[6,4]),h.make_tensor_value_info("y",T.FLOAT,[3,4,2,3])],
 [h.make_tensor_value_info("z",T.FLOAT,[3,4,2,3])],
 [nh.from_array(np.array([4,2,3],np.int64),"s1"),nh.from_array(np.array([0],np.int64),"ax"),nh.from_array(np.array([3,4,2,3],np.int64),"s2")])
m=h.make_model(g,opset_imports=[h.make_opsetid("",17)]); onnx.checker.check_model(m); onnx.save(m,os.path.join(OUT, "layout.onnx"))
