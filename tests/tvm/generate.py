#!/usr/bin/env python3
"""Builds the TVM differential corpus of `tests/tvm_diff.rs` (fusebox issue #20, item 6).

Every case is a Relax module built with TVM's BlockBuilder, one partitioning flow run by TVM
itself, and the module TVM prints afterwards. Each case is written to
`tests/tvm/cases/<name>.case`:

    # case: <name>
    # group: <seed | mlp | residual | split_tuple | multi_output | tvm_tests | symbolic | multi_function |
    #         random | attention | branches | opaque | constants | pending>
    # flow: fuse_ops_by_pattern | cublas | cutlass | cutlass_table | convert_layout DATA KERNEL
    # pattern: NAME = TEXT              (fuse_ops_by_pattern: in priority order; the text is
    # pattern+leakcheck: NAME = TEXT     fusebox's pattern syntax, translated to TVM's DPL here)
    # options: bind_constants=B annotate_codegen=B merge=B
    # pending: <fusebox gap>             (only for cases fusebox cannot read yet)
    # tvm_error: <message>               (TVM raised instead of returning a module)
    # tvm_well_formed: false: <message> (TVM returned a module its own well_formed rejects)
    # ==== input ====
    <mod.script() of the input>
    # ==== tvm ====
    <mod.script() of TVM's output>     (absent when TVM raised)

The flows are exactly TVM's: `FuseOpsByPattern(patterns, bind_constants, annotate_codegen)`
(patterns with `+leakcheck` carry `has_leaking_intermediate_variables` as their check), then
`MergeCompositeFunctions()` when `merge=true`; `partition_for_cublas(mod)`;
`partition_for_cutlass(mod)`; `cutlass_table`: the FuseOpsByPattern step of
`partition_for_cutlass` alone (`get_patterns_with_prefix("cutlass")`, bind_constants=False,
annotate_codegen=True), for modules with `R.nn.attention`, where TVM 0.27's
`partition_for_cutlass` raises in its `annotate_workspace` pass (`KeyError: 'T.float16'`) after
partitioning.

Not part of the test suite (CI has no TVM). Run by hand with TVM 0.27 in its own venv:

    python3 -m venv /work/wt/tvmvenv
    /work/wt/tvmvenv/bin/pip install apache-tvm==0.27.0.post1 numpy
    /work/wt/tvmvenv/bin/python tests/tvm/generate.py            # rewrites tests/tvm/cases/
    /work/wt/tvmvenv/bin/python tests/tvm/generate.py --out DIR  # writes elsewhere

`FUSEBOX_TVM_PYTHON=/work/wt/tvmvenv/bin/python cargo test --test tvm_diff` runs this script into a
temporary directory and compares against the live output as well.
"""

import argparse
import os
import random
import re
import shutil
import sys

import numpy as np
import tvm
from tvm import relax
from tvm.relax.backend.cuda.cublas import partition_for_cublas
from tvm.relax.backend.cuda.cutlass import partition_for_cutlass
from tvm.relax.backend.pattern_registry import get_patterns_with_prefix
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl.pattern import (
    is_const,
    is_op,
    is_tuple,
    is_tuple_get_item,
    wildcard,
)
from tvm.relax.transform import FusionPattern

R = relax.op
RANDOM_CASES = 200

# ------------------------------------------------------------------------------------------------
# fusebox pattern text -> TVM DPL. The subset used here: `_`, `const`, `op(args)`, `op(args, ...)`,
# `p | q`, `p[i]`, `(p)`, `(p, q)`, `name @ p` and a later `name @ _` (the same pattern object
# in TVM, as fusebox's "the same capture name must bind the same value").


class PatternText:
    def __init__(self, src):
        self.src = src
        self.i = 0
        self.names = {}

    def ws(self):
        while self.i < len(self.src) and self.src[self.i].isspace():
            self.i += 1

    def eat(self, s):
        self.ws()
        if self.src.startswith(s, self.i):
            self.i += len(s)
            return True
        return False

    def ident(self):
        self.ws()
        m = re.compile(r"[A-Za-z_][A-Za-z_0-9.]*").match(self.src, self.i)
        if not m:
            return None
        self.i = m.end()
        return m.group(0)

    def parse(self):
        p = self.alt()
        self.ws()
        if self.i != len(self.src):
            raise ValueError(f"pattern {self.src!r}: trailing text at {self.i}")
        return p

    def alt(self):
        p = self.capture()
        while self.eat("|"):
            p = p | self.capture()
        return p

    def capture(self):
        save = self.i
        name = self.ident()
        if name is not None and name not in ("_", "const") and self.eat("@"):
            start = self.i
            p = self.capture()
            if name in self.names:
                # fusebox: the same name twice binds the same value. TVM: the same object.
                if self.src[start:self.i].strip() != "_":
                    raise ValueError(f"pattern {self.src!r}: {name} reused with a non-`_` body")
                return self.names[name]
            self.names[name] = p
            return p
        self.i = save
        return self.postfix()

    def postfix(self):
        p = self.atom()
        while self.eat("["):
            self.ws()
            m = re.compile(r"-?\d+").match(self.src, self.i)
            self.i = m.end()
            if not self.eat("]"):
                raise ValueError(f"pattern {self.src!r}: expected ]")
            p = is_tuple_get_item(p, int(m.group(0)))
        return p

    def atom(self):
        if self.eat("("):
            fields = [self.alt()]
            while self.eat(","):
                fields.append(self.alt())
            if not self.eat(")"):
                raise ValueError(f"pattern {self.src!r}: expected )")
            return fields[0] if len(fields) == 1 else is_tuple(fields)
        name = self.ident()
        if name is None:
            raise ValueError(f"pattern {self.src!r}: expected a pattern at {self.i}")
        if name == "_":
            return wildcard()
        if name == "const":
            return is_const()
        if not self.eat("("):
            raise ValueError(f"pattern {self.src!r}: expected ( after {name}")
        args, varg = [], False
        if not self.eat(")"):
            while True:
                if self.eat("..."):
                    varg = True
                else:
                    args.append(self.alt())
                if self.eat(")"):
                    break
                if not self.eat(","):
                    raise ValueError(f"pattern {self.src!r}: expected , or )")
        op = name if name.startswith("relax.") else "relax." + name
        return is_op(op)(*args, varg_default_wildcard=varg)


def tvm_pattern(text):
    return PatternText(text).parse()


# ------------------------------------------------------------------------------------------------
# Cases


class Case:
    def __init__(self, name, group, build, flow, patterns=(), bind_constants=True,
                 annotate_codegen=False, merge=False, pending=None):
        self.name = name
        self.group = group
        self.build = build
        self.flow = flow
        # [(name, text, leakcheck)]
        self.patterns = [(p[0], p[1], p[2] if len(p) > 2 else False) for p in patterns]
        self.bind_constants = bind_constants
        self.annotate_codegen = annotate_codegen
        self.merge = merge
        self.pending = pending


def T(shape, dtype="float32"):
    return relax.TensorType(shape, dtype)


def module(params, body, dtype="float32"):
    """params: [(name, shape)] or [(name, shape, dtype)]; body(bb, *vars) emits bindings inside
    a dataflow block and returns the output var or a list of them (each made with emit_output)."""
    bb = relax.BlockBuilder()
    vs = [relax.Var(p[0], T(p[1], p[2] if len(p) > 2 else dtype)) for p in params]
    with bb.function("main", vs):
        with bb.dataflow():
            out = body(bb, *vs)
        if isinstance(out, (list, tuple)):
            out = relax.Tuple(list(out))
        bb.emit_func_output(out)
    return bb.get()


def conv(x, w, padding=1, layout="NCHW"):
    if layout == "NHWC":
        return R.nn.conv2d(x, w, padding=padding, data_layout="NHWC", kernel_layout="OHWI")
    return R.nn.conv2d(x, w, padding=padding)


CASES = []


def case(*args, **kw):
    CASES.append(Case(*args, **kw))


CONV2D_RELU = ("dnnl.conv2d_relu", "relax.nn.relu(relax.nn.conv2d(_, _))")
CONV2D = ("dnnl.conv2d", "relax.nn.conv2d(_, _)")

# --- seed 003 ------------------------------------------------------------------------------------
SEED_X = ("data", (1, 64, 56, 56))
SEED_W = (64, 64, 3, 3)


def seed_conv2d_relu():
    def body(bb, data, w1):
        lv = bb.emit(conv(data, w1), "lv")
        return bb.emit_output(R.nn.relu(lv), "conv1")
    return module([SEED_X, ("weight1", SEED_W)], body)


def seed_conv2d_relu_x2():
    def body(bb, data, w1, w2):
        lv = bb.emit(conv(data, w1), "lv")
        c1 = bb.emit(R.nn.relu(lv), "conv1")
        lv1 = bb.emit(conv(c1, w2, padding=0), "lv1")
        return bb.emit_output(R.nn.relu(lv1), "conv2d")
    return module([SEED_X, ("weight1", SEED_W), ("weight2", SEED_W)], body)


def seed_conv2d_conv2d_relu():
    def body(bb, data, w1, w2):
        c1 = bb.emit(conv(data, w1), "conv1")
        lv = bb.emit(conv(c1, w2, padding=0), "lv")
        return bb.emit_output(R.nn.relu(lv), "conv2d")
    return module([SEED_X, ("weight1", SEED_W), ("weight2", SEED_W)], body)


def seed_bound_weight():
    rng = np.random.RandomState(3)
    wval = rng.uniform(-1, 1, SEED_W).astype("float32")

    def body(bb, data):
        lv = bb.emit(conv(data, relax.const(wval)), "lv")
        return bb.emit_output(R.nn.relu(lv), "conv1")
    return module([SEED_X], body)


for seed_name, seed_build in [
    ("conv2d_relu", seed_conv2d_relu),
    ("conv2d_relu_x2", seed_conv2d_relu_x2),
    ("conv2d_conv2d_relu", seed_conv2d_conv2d_relu),
]:
    for tag, pats in [("relu_first", [CONV2D_RELU, CONV2D]), ("conv_first", [CONV2D, CONV2D_RELU]),
                      ("relu_only", [CONV2D_RELU])]:
        for ann, merge, suffix in [(False, False, "plain"), (True, False, "annotated"),
                                   (False, True, "merged")]:
            case(f"seed_{seed_name}_{tag}_{suffix}", "seed", seed_build, "fuse_ops_by_pattern",
                 pats, annotate_codegen=ann, merge=merge)
case("seed_bound_weight_annotated", "constants", seed_bound_weight, "fuse_ops_by_pattern",
     [CONV2D_RELU], annotate_codegen=True)
case("seed_bound_weight_lifted", "constants", seed_bound_weight, "fuse_ops_by_pattern",
     [CONV2D_RELU], bind_constants=False)

# --- MLPs ------------------------------------------------------------------------------------------


def mlp(layers, dtype, act, transposed=False, bias=True, batch=(), m=16, k=32):
    params = [("x", batch + (m, k), dtype)]
    for i in range(layers):
        params.append((f"w{i}", (k, k), dtype))
        if bias:
            params.append((f"b{i}", (k,), dtype))

    def body(bb, *vs):
        cur = vs[0]
        rest = list(vs[1:])
        for i in range(layers):
            w = rest.pop(0)
            if transposed:
                w = bb.emit(R.permute_dims(w), f"wt{i}")
            cur = bb.emit(R.matmul(cur, w), f"mm{i}")
            if bias:
                cur = bb.emit(R.add(cur, rest.pop(0)), f"ab{i}")
            if act is not None and i + 1 < layers:
                cur = bb.emit(act(cur), f"act{i}")
        last = R.nn.relu(cur) if act is not None else R.negative(cur)
        return bb.emit_output(last, "y")
    return module(params, body)


MLP_PATTERNS = [
    ("cpu.mm_bias_relu", "relax.nn.relu(relax.add(relax.matmul(_, _), _))"),
    ("cpu.mm_bias_gelu", "relax.nn.gelu(relax.add(relax.matmul(_, _), _))"),
    ("cpu.mm_bias", "relax.add(relax.matmul(_, _), _)"),
    ("cpu.mm", "relax.matmul(_, _)"),
]
for dtype in ["float16", "float32"]:
    for actname, act in [("relu", R.nn.relu), ("gelu", R.nn.gelu), ("none", None)]:
        for transposed in [False, True]:
            for layers in [1, 3]:
                nm = f"mlp{layers}_{actname}_{'t' if transposed else 'n'}_{dtype[5:]}"
                b = (lambda L=layers, d=dtype, a=act, t=transposed: mlp(L, d, a, t))
                for flow in ["cublas", "cutlass"]:
                    case(f"{nm}_{flow}", "mlp", b, flow)
                if dtype == "float32" and layers == 3:
                    case(f"{nm}_fobp", "mlp", b, "fuse_ops_by_pattern", MLP_PATTERNS,
                         annotate_codegen=True)
                    case(f"{nm}_fobp_merged", "mlp", b, "fuse_ops_by_pattern", MLP_PATTERNS,
                         merge=True)
for batch, nm in [((2,), "b2"), ((2, 3), "b23")]:
    b = (lambda bt=batch: mlp(2, "float16", R.nn.relu, batch=bt))
    case(f"mlp2_batched_{nm}_cublas", "mlp", b, "cublas")
    case(f"mlp2_batched_{nm}_cutlass", "mlp", b, "cutlass")
case("mlp2_nobias_cublas", "mlp", lambda: mlp(2, "float16", R.nn.relu, bias=False), "cublas")
case("mlp2_nobias_cutlass", "mlp", lambda: mlp(2, "float16", R.nn.relu, bias=False), "cutlass")
case("mlp2_float64_cublas", "mlp", lambda: mlp(2, "float64", R.nn.relu), "cublas")
case("mlp2_int8_cublas", "mlp", lambda: mlp(1, "int8", None, bias=False, k=32), "cublas")


def matmul_bias2d(dtype):
    def body(bb, x, w, b):
        mm = bb.emit(R.matmul(x, w), "mm")
        return bb.emit_output(R.add(mm, b), "y")
    return module([("x", (16, 32)), ("w", (32, 64)), ("b", (16, 64))], body, dtype)


case("matmul_bias2d_cublas", "mlp", lambda: matmul_bias2d("float16"), "cublas")
case("matmul_bias2d_cutlass", "mlp", lambda: matmul_bias2d("float16"), "cutlass")

# --- residual blocks ------------------------------------------------------------------------------


def residual_matmul(dtype, act_after, resid_left, bias=True):
    def body(bb, x, w, b, r):
        mm = bb.emit(R.matmul(x, w), "mm")
        cur = bb.emit(R.add(mm, b), "ab") if bias else mm
        cur = bb.emit(R.add(r, cur) if resid_left else R.add(cur, r), "res")
        if act_after:
            cur = bb.emit(R.nn.relu(cur), "act")
        return bb.emit_output(R.multiply(cur, x), "y")
    return module([("x", (32, 64)), ("w", (64, 64)), ("b", (64,)), ("r", (32, 64))], body, dtype)


def residual_conv(layout, dtype, act, binop):
    if layout == "NHWC":
        xs, ws, bs = (1, 8, 8, 16), (16, 3, 3, 16), (1, 1, 1, 16)
    else:
        xs, ws, bs = (1, 16, 8, 8), (16, 16, 3, 3), (1, 16, 1, 1)

    def body(bb, x, w, b):
        c = bb.emit(conv(x, w, layout=layout), "c")
        cb = bb.emit(R.add(c, b), "cb")
        if act is not None:
            cb = bb.emit(act(cb), "ca")
        res = bb.emit(binop(cb, x), "res")
        return bb.emit_output(R.nn.relu(res), "y")
    return module([("x", xs), ("w", ws), ("b", bs)], body, dtype)


def resnet_block(layout):
    if layout == "NHWC":
        xs, ws, bs = (1, 8, 8, 16), (16, 3, 3, 16), (1, 1, 1, 16)
    else:
        xs, ws, bs = (1, 16, 8, 8), (16, 16, 3, 3), (1, 16, 1, 1)

    def body(bb, x, w1, b1, w2, b2):
        c1 = bb.emit(conv(x, w1, layout=layout), "c1")
        a1 = bb.emit(R.add(c1, b1), "a1")
        r1 = bb.emit(R.nn.relu(a1), "r1")
        c2 = bb.emit(conv(r1, w2, layout=layout), "c2")
        a2 = bb.emit(R.add(c2, b2), "a2")
        s = bb.emit(R.add(a2, x), "s")
        return bb.emit_output(R.nn.relu(s), "y")
    return module([("x", xs), ("w1", ws), ("b1", bs), ("w2", ws), ("b2", bs)], body, "float16")


for dtype in ["float16", "float32"]:
    for act_after in [False, True]:
        for left in [False, True]:
            nm = f"residual_mm_{'relu' if act_after else 'noact'}_{'l' if left else 'r'}_{dtype[5:]}"
            b = (lambda d=dtype, a=act_after, lft=left: residual_matmul(d, a, lft))
            case(f"{nm}_cutlass", "residual", b, "cutlass")
            case(f"{nm}_cublas", "residual", b, "cublas")
case("residual_mm_nobias_cutlass", "residual",
     lambda: residual_matmul("float16", True, False, bias=False), "cutlass")
for layout in ["NHWC", "NCHW"]:
    for actname, act in [("relu", R.nn.relu), ("silu", R.nn.silu), ("none", None)]:
        for opname, op in [("add", R.add), ("mul", R.multiply)]:
            b = (lambda lay=layout, a=act, o=op: residual_conv(lay, "float16", a, o))
            case(f"residual_conv_{layout.lower()}_{actname}_{opname}_cutlass", "residual", b,
                 "cutlass")
    case(f"resnet_block_{layout.lower()}_cutlass", "residual",
         lambda lay=layout: resnet_block(lay), "cutlass")
    case(f"resnet_block_{layout.lower()}_fobp", "residual", lambda lay=layout: resnet_block(lay),
         "fuse_ops_by_pattern",
         [("cpu.conv_bias_relu", "relax.nn.relu(relax.add(relax.nn.conv2d(_, _), _))"),
          ("cpu.conv_bias_res_relu",
           "relax.nn.relu(relax.add(relax.add(relax.nn.conv2d(_, _), _), _))"),
          ("cpu.add_relu", "relax.nn.relu(relax.add(_, _))")], annotate_codegen=True)
    case(f"resnet_block_{layout.lower()}_fobp_merged", "residual",
         lambda lay=layout: resnet_block(lay), "fuse_ops_by_pattern",
         [("cpu.conv_bias_res_relu",
           "relax.nn.relu(relax.add(relax.add(relax.nn.conv2d(_, _), _), _))"),
          ("cpu.conv_bias_relu", "relax.nn.relu(relax.add(relax.nn.conv2d(_, _), _))")],
         merge=True)

# --- split / tuple outputs -----------------------------------------------------------------------


def split_add():
    def body(bb, x, y):
        s = bb.emit(R.split(x, 2, axis=1), "s")
        a = bb.emit(relax.TupleGetItem(s, 0), "a")
        b = bb.emit(relax.TupleGetItem(s, 1), "b")
        c = bb.emit(R.add(a, y), "c")
        d = bb.emit_output(R.add(b, c), "d")
        return d
    return module([("x", (4, 16)), ("y", (4, 8))], body)


def split_three():
    def body(bb, x):
        s = bb.emit(R.split(x, 3, axis=1), "s")
        outs = []
        for i in range(3):
            t = bb.emit(relax.TupleGetItem(s, i), f"t{i}")
            outs.append(bb.emit_output(R.nn.relu(t), f"r{i}"))
        return outs
    return module([("x", (4, 12))], body)


def concat_abs():
    def body(bb, x, y):
        a = bb.emit(R.abs(x), "a")
        b = bb.emit(R.abs(y), "b")
        c = bb.emit(R.concat([a, b], axis=1), "c")
        return bb.emit_output(R.nn.relu(c), "d")
    return module([("x", (4, 8)), ("y", (4, 8))], body)


def tuple_return():
    def body(bb, x, w):
        m = bb.emit(R.matmul(x, w), "m")
        r = bb.emit_output(R.nn.relu(m), "r")
        g = bb.emit_output(R.nn.gelu(m), "g")
        return [r, g]
    return module([("x", (4, 8)), ("w", (8, 8))], body)


for nm, b, pats in [
    ("split_only", split_add, [("cpu.split", "relax.split(_)")]),
    ("split_tgi_add", split_add,
     [("cpu.split_add", "relax.add(relax.split(_)[0], _)")]),
    ("split_both_adds", split_add,
     [("cpu.split_adds", "relax.add((s @ relax.split(_))[1], relax.add((s @ _)[0], _))")]),
    ("split_three_relu", split_three, [("cpu.relu", "relax.nn.relu(_)")]),
    ("split_three_tgi_relu", split_three, [("cpu.tgi_relu", "relax.nn.relu(relax.split(_)[1])")]),
    ("concat_tuple_abs", concat_abs,
     [("cpu.concat_abs", "relax.concat((relax.abs(_), relax.abs(_)))")]),
    ("concat_only", concat_abs, [("cpu.concat", "relax.concat(_)")]),
    ("concat_relu", concat_abs, [("cpu.concat_relu", "relax.nn.relu(relax.concat(_))")]),
    ("tuple_return_mm_relu", tuple_return,
     [("cpu.mm_relu", "relax.nn.relu(relax.matmul(_, _))")]),
    ("tuple_return_gelu", tuple_return, [("cpu.gelu", "relax.nn.gelu(_)")]),
]:
    case(f"{nm}_plain", "split_tuple", b, "fuse_ops_by_pattern", pats)
    case(f"{nm}_annotated", "split_tuple", b, "fuse_ops_by_pattern", pats, annotate_codegen=True)
    case(f"{nm}_merged", "split_tuple", b, "fuse_ops_by_pattern", pats, merge=True)

# --- multi-output groups -------------------------------------------------------------------------


def branch_tuple_output():
    # TVM's BranchTupleOutput: conv -> relu; gelu(relu), gelu(conv) outside.
    def body(bb, x, w):
        c = bb.emit(conv(x, w), "c")
        r = bb.emit(R.nn.relu(c), "r")
        g1 = bb.emit(R.nn.gelu(r), "g1")
        g2 = bb.emit(R.nn.gelu(c), "g2")
        return bb.emit_output(R.add(g1, g2), "y")
    return module([("x", (1, 8, 8, 8)), ("w", (8, 8, 3, 3))], body)


def intermediate_is_output():
    def body(bb, x, w, b):
        m = bb.emit_output(R.matmul(x, w), "m")
        a = bb.emit(R.add(m, b), "a")
        r = bb.emit_output(R.nn.relu(a), "r")
        return [r, m]
    return module([("x", (4, 8)), ("w", (8, 8)), ("b", (8,))], body)


def two_users_each():
    def body(bb, x, w, b):
        m = bb.emit(R.matmul(x, w), "m")
        a = bb.emit(R.add(m, b), "a")
        r = bb.emit(R.nn.relu(a), "r")
        u = bb.emit(R.exp(m), "u")
        v = bb.emit(R.sigmoid(a), "v")
        s = bb.emit(R.add(u, v), "s")
        return bb.emit_output(R.multiply(s, r), "y")
    return module([("x", (4, 8)), ("w", (8, 8)), ("b", (8,))], body)


for nm, b in [("branch_tuple_output", branch_tuple_output),
              ("intermediate_is_output", intermediate_is_output),
              ("two_users_each", two_users_each)]:
    pats = {
        "branch_tuple_output": [("cpu.conv_relu", "relax.nn.relu(relax.nn.conv2d(_, _))")],
        "intermediate_is_output": [("cpu.mm_bias_relu",
                                    "relax.nn.relu(relax.add(relax.matmul(_, _), _))")],
        "two_users_each": [("cpu.mm_bias_relu",
                            "relax.nn.relu(relax.add(relax.matmul(_, _), _))")],
    }[nm]
    case(f"{nm}_plain", "multi_output", b, "fuse_ops_by_pattern", pats)
    case(f"{nm}_annotated", "multi_output", b, "fuse_ops_by_pattern", pats, annotate_codegen=True)
    case(f"{nm}_merged", "multi_output", b, "fuse_ops_by_pattern", pats, merge=True)
    case(f"{nm}_leakcheck", "multi_output", b, "fuse_ops_by_pattern",
         [(p[0], p[1], True) for p in pats])
case("intermediate_is_output_cublas", "multi_output", lambda: intermediate_is_output(), "cublas")

# --- TVM's own unit tests, rebuilt ---------------------------------------------------------------


def cyclic_one_hop():
    def body(bb, x):
        a = bb.emit(R.nn.relu(x), "a")
        g = bb.emit(R.nn.gelu(a), "g")
        return bb.emit_output(R.add(a, g), "d")
    return module([("x", (4, 8))], body)


def cyclic_two_hops():
    def body(bb, x):
        a = bb.emit(R.nn.relu(x), "a")
        g = bb.emit(R.nn.gelu(a), "g")
        t = bb.emit(R.tanh(g), "t")
        return bb.emit_output(R.add(a, t), "d")
    return module([("x", (4, 8))], body)


def partial_overlap():
    def body(bb, x, w, b):
        m = bb.emit(R.matmul(x, w), "m")
        r = bb.emit_output(R.nn.relu(m), "r")
        a = bb.emit_output(R.add(m, b), "a")
        return [r, a]
    return module([("x", (4, 8)), ("w", (8, 8)), ("b", (8,))], body)


def maximal_subgraph():
    def body(bb, x, w, b):
        m = bb.emit(R.matmul(x, w), "m")
        a = bb.emit(R.add(m, b), "a")
        return bb.emit_output(R.clip(a, 0, 4), "y")
    return module([("x", (4, 8)), ("w", (8, 8)), ("b", (8,))], body)


def clip_twice():
    def body(bb, x):
        a = bb.emit(R.clip(x, 0, 4), "a")
        b = bb.emit(R.clip(a, 1, 3), "b")
        return bb.emit_output(R.clip(b, 0, 4), "c")
    return module([("x", (4, 8))], body)


def dead_match():
    def body(bb, x):
        bb.emit(R.nn.relu(x), "dead")
        return bb.emit_output(R.exp(x), "live")
    return module([("x", (4, 8))], body)


def duplicate_arg():
    def body(bb, x):
        a = bb.emit(R.add(x, x), "a")
        return bb.emit_output(R.nn.relu(a), "y")
    return module([("x", (4, 8))], body)


def scalar_const():
    def body(bb, x):
        a = bb.emit(R.add(x, relax.const(1.5, "float32")), "a")
        return bb.emit_output(R.nn.relu(a), "y")
    return module([("x", (4, 8))], body)


def param_order():
    def body(bb, x, w):
        wt = bb.emit(R.permute_dims(w), "wt")
        return bb.emit_output(R.matmul(x, wt), "y")
    return module([("x", (4, 8)), ("w", (8, 8))], body)


def dedup_layers():
    def body(bb, x, w1, w2, w3):
        cur = x
        for i, w in enumerate([w1, w2, w3]):
            m = bb.emit(R.matmul(cur, w), f"m{i}")
            cur = bb.emit(R.nn.relu(m), f"r{i}")
        return bb.emit_output(R.negative(cur), "y")
    return module([("x", (4, 8)), ("w1", (8, 8)), ("w2", (8, 8)), ("w3", (8, 8))], body)


def commutative():
    def body(bb, x, w, b):
        m = bb.emit(R.matmul(x, w), "m")
        a = bb.emit(R.add(b, m), "a")
        return bb.emit_output(R.nn.relu(a), "y")
    return module([("x", (4, 8)), ("w", (8, 8)), ("b", (8,))], body)


def var_alias():
    # lv2 = lv1 (a var -> var binding) between matmul and add: the leak check sees the alias.
    def body(bb, x, w, b):
        wt = bb.emit(R.permute_dims(w), "wt")
        m = bb.emit(R.matmul(x, wt), "m")
        alias = bb.emit(m, "alias")
        return bb.emit_output(R.add(alias, b), "y")
    return module([("x", (16, 32)), ("w", (64, 32)), ("b", (64,))], body, "float16")


def shared_transpose():
    def body(bb, x, w):
        wt = bb.emit(R.permute_dims(w), "wt")
        m1 = bb.emit(R.matmul(x, wt), "m1")
        m2 = bb.emit(R.matmul(m1, wt), "m2")
        return bb.emit_output(R.add(m2, m1), "y")
    return module([("x", (16, 32)), ("w", (32, 32))], body, "float16")


def matmul_power():
    def body(bb, x, w):
        m = bb.emit(R.matmul(x, w), "m")
        p = bb.emit(R.power(m, m), "p")
        return bb.emit_output(R.add(m, p), "y")
    return module([("x", (16, 32)), ("w", (32, 32))], body, "float16")


def merge_diamond():
    def body(bb, x, w):
        c = bb.emit(conv(x, w), "c")
        r = bb.emit(R.nn.relu(c), "r")
        g = bb.emit(R.nn.gelu(c), "g")
        return bb.emit_output(R.add(r, g), "y")
    return module([("x", (1, 8, 8, 8)), ("w", (8, 8, 3, 3))], body)


DIAMOND_A = [("compiler_A.conv2d", "relax.nn.conv2d(_, _)"),
             ("compiler_A.relu", "relax.nn.relu(_)"),
             ("compiler_B.gelu", "relax.nn.gelu(_)"),
             ("compiler_A.add", "relax.add(_, _)")]
DIAMOND_ALL_A = [("compiler_A.conv2d", "relax.nn.conv2d(_, _)"),
                 ("compiler_A.relu", "relax.nn.relu(_)"),
                 ("compiler_A.gelu", "relax.nn.gelu(_)"),
                 ("compiler_A.add", "relax.add(_, _)")]

for nm, b, pats, kw in [
    ("cyclic_one_hop", cyclic_one_hop, [("cpu.add_relu", "relax.add(relax.nn.relu(_), _)")], {}),
    ("cyclic_two_hops", cyclic_two_hops, [("cpu.add_relu", "relax.add(relax.nn.relu(_), _)")], {}),
    ("cyclic_one_hop_leakcheck", cyclic_one_hop,
     [("cpu.add_relu", "relax.add(relax.nn.relu(_), _)", True)], {}),
    ("partial_overlap_steal", partial_overlap,
     [("cpu.mm_act", "relax.nn.relu(relax.matmul(_, _)) | relax.add(relax.matmul(_, _), _)")], {}),
    ("maximal_subgraph", maximal_subgraph,
     [("cpu.mm_add_clip", "relax.add(relax.matmul(_, _), _) | "
       "relax.clip(relax.add(relax.matmul(_, _), _), _, _)")], {}),
    ("maximal_subgraph_annotated", maximal_subgraph,
     [("cpu.mm_add_clip", "relax.add(relax.matmul(_, _), _) | "
       "relax.clip(relax.add(relax.matmul(_, _), _), _, _)")], {"annotate_codegen": True}),
    ("clip_prim_args", clip_twice, [("cpu.clip", "relax.clip(_, _, _)")], {}),
    ("dead_match", dead_match, [("cpu.relu", "relax.nn.relu(_)")], {}),
    ("duplicate_arg", duplicate_arg, [("cpu.add_relu", "relax.nn.relu(relax.add(_, _))")], {}),
    ("shared_capture", duplicate_arg,
     [("cpu.self_add", "relax.nn.relu(relax.add(v @ _, v @ _))")], {}),
    ("scalar_const_bound", scalar_const,
     [("cpu.add_relu", "relax.nn.relu(relax.add(_, const))")], {}),
    ("scalar_const_lifted", scalar_const,
     [("cpu.add_relu", "relax.nn.relu(relax.add(_, const))")], {"bind_constants": False}),
    ("param_first_use_order", param_order,
     [("cpu.mm_t", "relax.matmul(_, relax.permute_dims(_))")], {}),
    ("dedup_layers", dedup_layers, [("cpu.mm_relu", "relax.nn.relu(relax.matmul(_, _))")], {}),
    ("dedup_layers_annotated", dedup_layers,
     [("cpu.mm_relu", "relax.nn.relu(relax.matmul(_, _))")], {"annotate_codegen": True}),
    ("dedup_layers_merged", dedup_layers,
     [("cpu.mm_relu", "relax.nn.relu(relax.matmul(_, _))")], {"merge": True}),
    ("commutative_add", commutative,
     [("cpu.mm_bias_relu", "relax.nn.relu(relax.add(relax.matmul(_, _), _))")], {}),
    ("merge_diamond_cyclic", merge_diamond, DIAMOND_A, {"merge": True}),
    ("merge_diamond_all_a", merge_diamond, DIAMOND_ALL_A, {"merge": True}),
    ("no_patterns", dedup_layers, [], {}),
    ("no_patterns_annotated", dedup_layers, [], {"annotate_codegen": True}),
]:
    case(nm, "tvm_tests", b, "fuse_ops_by_pattern", pats, **kw)
for nm, b in [("var_alias", var_alias), ("shared_transpose", shared_transpose),
              ("matmul_power", matmul_power)]:
    case(f"{nm}_cublas", "tvm_tests", b, "cublas")
    case(f"{nm}_cutlass", "tvm_tests", b, "cutlass")

# --- attention (relax.nn.attention in TVM's cutlass table) -----------------------------------------


def attention_mix(dtype):
    """Both attention ops (causal, grouped-query heads, a broadcast bias) next to a matmul + bias
    the table's GEMM entries take."""
    def body(bb, q, k, v, b, x, w, wb):
        a1 = bb.emit(R.nn.attention(q, k, v, causal_mask="BottomRight"), "a1")
        a2 = bb.emit(R.nn.attention(q, k, v, b, scale=0.125), "a2")
        s = bb.emit(R.add(a1, a2), "s")
        r = bb.emit(R.reshape(s, (2 * 37, 8 * 64)), "r")
        m = bb.emit(R.matmul(r, w), "m")
        mb = bb.emit_output(R.add(m, wb), "mb")
        return [mb, x]
    return module([("q", (2, 37, 8, 64)), ("k", (2, 53, 2, 64)), ("v", (2, 53, 2, 64)),
                   ("b", (1, 8, 37, 53)), ("x", (4,)), ("w", (512, 32)), ("wb", (32,))],
                  body, dtype)


def attention_symbolic():
    n = tvm.tirx.Var("n", "int64") if hasattr(tvm, "tirx") else tvm.tir.Var("n", "int64")

    def body(bb, q, k, v):
        a = bb.emit(R.nn.attention(q, k, v, causal_mask="TopLeft"), "a")
        return bb.emit_output(R.nn.relu(a), "y")
    return module([("q", (1, n, 4, 128)), ("k", (1, n, 4, 128)), ("v", (1, n, 4, 128))], body,
                  "float16")


case("attention_mix_f16_cutlass", "attention", lambda: attention_mix("float16"), "cutlass_table")
case("attention_mix_f32_cutlass", "attention", lambda: attention_mix("float32"), "cutlass_table")
case("attention_symbolic_cutlass", "attention", attention_symbolic, "cutlass_table")

# --- symbolic shapes ----------------------------------------------------------------------------


def symbolic_mlp(dtype):
    """x: (n, 32) with a symbolic n; composites get fresh symbolic vars (TVM's
    test_matmul_symbolic_var)."""
    n = tvm.tirx.Var("n", "int64") if hasattr(tvm, "tirx") else tvm.tir.Var("n", "int64")

    def body(bb, x, w1, b1, w2):
        m = bb.emit(R.matmul(x, w1), "m")
        a = bb.emit(R.add(m, b1), "a")
        r = bb.emit(R.nn.relu(a), "r")
        wt = bb.emit(R.permute_dims(w2), "wt")
        return bb.emit_output(R.matmul(r, wt), "y")
    return module([("x", (n, 32)), ("w1", (32, 64)), ("b1", (64,)), ("w2", (16, 64))], body, dtype)


for dtype in ["float16", "float32"]:
    b = (lambda d=dtype: symbolic_mlp(d))
    case(f"symbolic_mlp_{dtype[5:]}_cublas", "symbolic", b, "cublas")
    case(f"symbolic_mlp_{dtype[5:]}_cutlass", "symbolic", b, "cutlass")
case("symbolic_mlp_fobp", "symbolic", lambda: symbolic_mlp("float32"), "fuse_ops_by_pattern",
     MLP_PATTERNS + [("cpu.mm_t", "relax.matmul(_, relax.permute_dims(_))")])
case("symbolic_mlp_fobp_merged", "symbolic", lambda: symbolic_mlp("float32"),
     "fuse_ops_by_pattern", MLP_PATTERNS + [("cpu.mm_t", "relax.matmul(_, relax.permute_dims(_))")],
     merge=True)

# --- several entry functions ---------------------------------------------------------------------


def two_functions():
    """main and main2, each conv2d -> relu with the same shapes (TVM's
    test_multiple_entries_multiple_calls_same_extern): the composites are shared."""
    bb = relax.BlockBuilder()
    for fname in ["main", "main2"]:
        x = relax.Var("x", T((1, 8, 8, 8)))
        w = relax.Var("w", T((8, 8, 3, 3)))
        with bb.function(fname, [x, w]):
            with bb.dataflow():
                c = bb.emit(conv(x, w), "c")
                r = bb.emit(R.nn.relu(c), "r")
                c2 = bb.emit(conv(r, w), "c2")
                y = bb.emit_output(R.nn.relu(c2), "y")
            bb.emit_func_output(y)
    return bb.get()


for mode, kw in [("plain", {}), ("annotated", {"annotate_codegen": True}),
                 ("merged", {"merge": True})]:
    case(f"two_functions_{mode}", "multi_function", two_functions, "fuse_ops_by_pattern",
         [("cpu.conv", "relax.nn.conv2d(_, _)"), ("cpu.relu", "relax.nn.relu(_)")], **kw)

# --- branches: if/else with dataflow blocks inside (TVM partitions each block on its own) -------


def branch_body(params, emit):
    """A branch as TVM's BlockBuilder makes one: a SeqExpr of one dataflow block whose output
    is the branch's value. `emit(bb, *params)` emits inside the block and returns the output."""
    inner = relax.BlockBuilder()
    with inner.function("tmp", list(params)):
        with inner.dataflow():
            out = emit(inner, *params)
        inner.emit_func_output(out)
    return inner.get()["tmp"].body


def branch_if():
    bb = relax.BlockBuilder()
    x = relax.Var("x", T((4, 8)))
    w = relax.Var("w", T((8, 8)))
    cond = relax.Var("cond", relax.TensorType((), "bool"))
    with bb.function("main", [cond, x, w]):
        def branch(act):
            def emit(inner, x, w):
                m = inner.emit(R.matmul(x, w), "m")
                return inner.emit_output(act(m), "r")
            return branch_body([x, w], emit)
        y = bb.emit(relax.If(cond, branch(R.nn.relu), branch(R.nn.gelu)), "y")
        bb.emit_func_output(y)
    return bb.get()


def dataflow_inside_branch():
    """TVM's test_dataflow_inside_branch (test_transform_fuse_ops_by_pattern.py), a
    `R.Prim("bool")` condition."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", T((1024, 1024), "float16"))
    w = relax.Var("w", T((1024, 1024), "float16"))
    flag = relax.Var("transpose_weights", tvm.ir.PrimType("bool"))
    with bb.function("main", [x, w, flag]):
        def then_(inner, x, w):
            wt = inner.emit(R.permute_dims(w), "w_t")
            return inner.emit_output(R.matmul(x, wt), "out")

        def else_(inner, x, w):
            return inner.emit_output(R.matmul(x, w), "out")
        out = bb.emit(relax.If(flag, branch_body([x, w], then_), branch_body([x, w], else_)), "out")
        bb.emit_func_output(out)
    return bb.get()


def branch_mlp():
    """A dataflow block before the `if`, matmul / add / relu chains inside both branches, and
    an add of the result after it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", T((16, 32)))
    w = relax.Var("w", T((32, 32)))
    b = relax.Var("b", T((32,)))
    cond = relax.Var("cond", relax.TensorType((), "bool"))
    with bb.function("main", [cond, x, w, b]):
        with bb.dataflow():
            h = bb.emit_output(R.nn.relu(x), "h")

        def then_(inner, h, w, b):
            m = inner.emit(R.matmul(h, w), "m")
            a = inner.emit(R.add(m, b), "a")
            return inner.emit_output(R.nn.relu(a), "r")

        def else_(inner, h, w, b):
            m = inner.emit(R.matmul(h, w), "m")
            r = inner.emit(R.nn.relu(m), "r")
            return inner.emit_output(R.add(r, b), "s")
        y = bb.emit(relax.If(cond, branch_body([h, w, b], then_), branch_body([h, w, b], else_)),
                    "y")
        with bb.dataflow():
            z = bb.emit_output(R.add(y, x), "z")
        bb.emit_func_output(z)
    return bb.get()


def branch_nested():
    """An `if` inside the else branch, each innermost branch a dataflow block."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", T((8, 8)))
    w = relax.Var("w", T((8, 8)))
    c1 = relax.Var("c1", relax.TensorType((), "bool"))
    c2 = relax.Var("c2", tvm.ir.PrimType("bool"))

    def mm(act, name):
        def emit(inner, x, w):
            m = inner.emit(R.matmul(x, w), "m")
            return inner.emit_output(act(m), name)
        return emit

    with bb.function("main", [c1, c2, x, w]):
        inner_if = relax.If(c2, branch_body([x, w], mm(R.nn.relu, "p")),
                            branch_body([x, w], mm(R.nn.gelu, "q")))
        ib = relax.BlockBuilder()
        with ib.function("tmp", [c2, x, w]):
            z = ib.emit(inner_if, "z")
            ib.emit_func_output(z)
        else_seq = ib.get()["tmp"].body
        y = bb.emit(relax.If(c1, branch_body([x, w], mm(R.nn.relu, "r")), else_seq), "y")
        bb.emit_func_output(y)
    return bb.get()


def hoist_emit(inner, x, w):
    """The second pattern's group ({r, s}) reads `b`, which the first pattern outlined after
    `a`: TVM names `a`'s function first whatever order the calls end in."""
    r = inner.emit(R.nn.relu(x), "r")
    a = inner.emit(R.multiply(x, x), "a")
    b = inner.emit(R.multiply(w, x), "b")
    s = inner.emit(R.add(r, b), "s")
    return inner.emit_output(R.subtract(a, s), "o")


def hoist_flat():
    return module([("x", (4, 8)), ("w", (4, 8))], hoist_emit)


def branch_hoist():
    bb = relax.BlockBuilder()
    x = relax.Var("x", T((4, 8)))
    w = relax.Var("w", T((4, 8)))
    cond = relax.Var("cond", relax.TensorType((), "bool"))
    with bb.function("main", [cond, x, w]):
        y = bb.emit(relax.If(cond, branch_body([x, w], hoist_emit),
                             branch_body([x, w], hoist_emit)), "y")
        bb.emit_func_output(y)
    return bb.get()


HOIST_PATS = [("cpu.mul", "relax.multiply(_, _)"),
              ("cpu.relu_add", "relax.add(relax.nn.relu(_), _)")]
for mode, kw in [("plain", {}), ("annotated", {"annotate_codegen": True})]:
    case(f"hoist_flat_{mode}", "branches", hoist_flat, "fuse_ops_by_pattern", HOIST_PATS, **kw)
    case(f"branch_hoist_{mode}", "branches", branch_hoist, "fuse_ops_by_pattern", HOIST_PATS,
         **kw)

MM_RELU = [("cpu.mm_relu", "relax.nn.relu(relax.matmul(_, _))")]
MLP_PATS = [("cpu.mm_bias_relu", "relax.nn.relu(relax.add(relax.matmul(_, _), _))"),
            ("cpu.mm_relu", "relax.nn.relu(relax.matmul(_, _))"),
            ("cpu.add", "relax.add(_, _)")]
for mode, kw in [("fobp", {}), ("fobp_annotated", {"annotate_codegen": True}),
                 ("merged", {"merge": True})]:
    case(f"branch_if_{mode}", "branches", branch_if, "fuse_ops_by_pattern", MM_RELU, **kw)
    case(f"branch_mlp_{mode}", "branches", branch_mlp, "fuse_ops_by_pattern", MLP_PATS, **kw)
    case(f"branch_nested_{mode}", "branches", branch_nested, "fuse_ops_by_pattern", MM_RELU, **kw)
case("branch_mlp_lifted", "branches", branch_mlp, "fuse_ops_by_pattern", MLP_PATS,
     bind_constants=False)
case("dataflow_inside_branch_cublas", "branches", dataflow_inside_branch, "cublas")
case("dataflow_inside_branch_fobp", "branches", dataflow_inside_branch, "fuse_ops_by_pattern",
     [("cublas.matmul_transposed", "relax.matmul(_, relax.permute_dims(_))"),
      ("cublas.matmul", "relax.matmul(_, _)")], bind_constants=False, annotate_codegen=True)
case("branch_mlp_cutlass", "branches", branch_mlp, "cutlass")

# --- value-dependent extents: nonzero, then R.match_cast to name the extent ---------------------


def nonzero_rows():
    """The rows of x where c holds (ONNX Compress as TVM imports it), through a matmul + relu:
    the extent `k` is defined by R.match_cast and reaches the composite's parameters."""
    k = tvm.tirx.Var("k", "int64") if hasattr(tvm, "tirx") else tvm.tir.Var("k", "int64")

    def body(bb, x, w, c):
        nz = bb.emit(R.nonzero(c), "nz")
        idx2 = bb.match_cast(nz, T((1, k), "int64"), "idx2")
        idx = bb.emit(R.reshape(idx2, (k,)), "idx")
        rows = bb.emit(R.take(x, idx, axis=0), "rows")
        m = bb.emit(R.matmul(rows, w), "m")
        return bb.emit_output(R.nn.relu(m), "y")
    return module([("x", (16, 32)), ("w", (32, 32)), ("c", (16,), "bool")], body)


for mode, kw in [("plain", {}), ("annotated", {"annotate_codegen": True}),
                 ("merged", {"merge": True})]:
    case(f"nonzero_rows_{mode}", "value_dependent", nonzero_rows, "fuse_ops_by_pattern", MM_RELU,
         **kw)

# --- opaque ops, constants without values ------------------------------------------------------


def stack_op():
    def body(bb, x, y):
        s = bb.emit(R.stack([x, y], axis=0), "s")
        r = bb.emit(R.nn.relu(s), "r")
        return bb.emit_output(R.add(r, r), "out")
    return module([("x", (4, 8)), ("y", (4, 8))], body)


def tensor_const():
    c = np.arange(8, dtype="float32").reshape(8)

    def body(bb, x, w):
        m = bb.emit(R.matmul(x, w), "m")
        a = bb.emit(R.add(m, relax.const(c)), "a")
        return bb.emit_output(R.nn.relu(a), "y")
    return module([("x", (4, 8)), ("w", (8, 8))], body)


case("opaque_stack_fobp", "opaque", stack_op, "fuse_ops_by_pattern",
     [("cpu.relu_add", "relax.add(relax.nn.relu(_), _)")])
case("opaque_stack_relu_merged", "opaque", stack_op, "fuse_ops_by_pattern",
     [("cpu.relu", "relax.nn.relu(_)"), ("cpu.add", "relax.add(_, _)")], merge=True)
case("tensor_const_bound", "constants", tensor_const, "fuse_ops_by_pattern",
     [("cpu.mm_bias_relu", "relax.nn.relu(relax.add(relax.matmul(_, _), const))")])
case("tensor_const_lifted", "constants", tensor_const, "fuse_ops_by_pattern",
     [("cpu.mm_bias_relu", "relax.nn.relu(relax.add(relax.matmul(_, _), const))")],
     bind_constants=False)

# --- seeded random DAGs of matmul / add / relu / gelu / conv2d ------------------------------------

RANDOM_PATTERNS = [
    ("cpu.mm_relu", "relax.nn.relu(relax.matmul(_, _))"),
    ("cpu.mm_bias", "relax.add(relax.matmul(_, _), _)"),
    ("cpu.conv_bias_relu", "relax.nn.relu(relax.add(relax.nn.conv2d(_, _), _))"),
    ("cpu.conv", "relax.nn.conv2d(_, _)"),
    ("cpu.add_gelu", "relax.nn.gelu(relax.add(_, _))"),
    ("cpu.relu_add", "relax.add(relax.nn.relu(_), _)"),
    ("cpu.relu", "relax.nn.relu(_)"),
    ("cpu.mm_or", "relax.nn.relu(relax.matmul(_, _)) | relax.add(relax.matmul(_, _), _)"),
    ("cpu.grow", "relax.add(relax.matmul(_, _), _) | "
     "relax.nn.relu(relax.add(relax.matmul(_, _), _))"),
    ("cpu.gelu_mm", "relax.matmul(relax.nn.gelu(_), _)"),
]


def random_dag(seed, dtype):
    """A DAG over values of shape (1, 4, 8, 8): matmul with a (8, 8) weight, add of two values
    or of a value and a (8,) bias, relu, gelu, conv2d with a (4, 4, 3, 3) weight (padding 1).
    Every value nobody uses is an output."""
    rng = random.Random(seed)
    n = rng.randint(4, 12)
    nodes = []  # (op, [inputs]) with inputs: ("v", i) for node i, ("x",) or a param tag
    params = [("x", (1, 4, 8, 8))]
    for i in range(n):
        avail = [("x",)] + [("v", j) for j in range(i)]
        # Prefer recent values so chains form, but reach back sometimes.
        def pick():
            if i > 0 and rng.random() < 0.7:
                return ("v", rng.randint(max(0, i - 3), i - 1))
            return rng.choice(avail)
        op = rng.choice(["matmul", "matmul", "add", "add", "relu", "relu", "gelu", "conv2d"])
        if op == "matmul":
            params.append((f"w{i}", (8, 8)))
            nodes.append((op, [pick(), ("p", f"w{i}")]))
        elif op == "conv2d":
            params.append((f"k{i}", (4, 4, 3, 3)))
            nodes.append((op, [pick(), ("p", f"k{i}")]))
        elif op == "add":
            if rng.random() < 0.4:
                params.append((f"b{i}", (8,)))
                nodes.append((op, [pick(), ("p", f"b{i}")]))
            else:
                a, b = pick(), pick()
                if rng.random() < 0.5:
                    a, b = b, a
                nodes.append((op, [a, b]))
        else:
            nodes.append((op, [pick()]))
    used = set()
    for _, ins in nodes:
        for v in ins:
            if v[0] == "v":
                used.add(v[1])
    sinks = [i for i in range(n) if i not in used]

    def body(bb, *vs):
        env = {p[0]: v for p, v in zip(params, vs)}
        vals = []
        outs = []
        for i, (op, ins) in enumerate(nodes):
            args = [vals[v[1]] if v[0] == "v" else env[v[0] if v[0] == "x" else v[1]]
                    for v in ins]
            if op == "matmul":
                e = R.matmul(*args)
            elif op == "conv2d":
                e = R.nn.conv2d(args[0], args[1], padding=1)
            elif op == "add":
                e = R.add(*args)
            elif op == "relu":
                e = R.nn.relu(*args)
            else:
                e = R.nn.gelu(*args)
            if i in sinks:
                v = bb.emit_output(e, f"out{i}")
                outs.append(v)
            else:
                v = bb.emit(e, f"v{i}")
            vals.append(v)
        return outs[0] if len(outs) == 1 else outs
    return lambda: module(params, body, dtype)


# --- ConvertLayout (conv2d to NHWC / OHWI) -----------------------------------------------------
# `# flow: convert_layout NHWC OHWI`: relax.transform.ConvertLayout({"relax.nn.conv2d": [...]}).
# Modules of the ops whose layout both TVM 0.27 and fusebox carry (conv2d, bias and residual
# adds of rank 4, relu, scalar operands, the pools) and ops that need the original (reshape,
# matmul, the function's outputs). Where fusebox goes further than TVM 0.27 (it also carries
# `clip` and lower-rank broadcast operands, and permutes a value once per block), see
# core/src/transform/convert_layout.rs.


def cl_resnet_block():
    def body(bb, x, w1, b1, w2, b2, w3, fc):
        a = bb.emit(R.add(bb.emit(conv(x, w1)), b1))
        a = bb.emit(R.nn.relu(a))
        c = bb.emit(R.add(bb.emit(conv(a, w2)), b2))
        r = bb.emit(R.nn.relu(bb.emit(R.add(c, a))))
        p = bb.emit(R.nn.max_pool2d(r, pool_size=[2, 2], strides=[2, 2]))
        d = bb.emit(R.nn.relu(bb.emit(conv(p, w3, padding=0))))
        g = bb.emit(R.nn.adaptive_avg_pool2d(d, output_size=[1, 1]))
        f = bb.emit(R.reshape(g, [1, 16]))
        return bb.emit_output(R.matmul(f, fc))
    return module([("x", (1, 8, 16, 16)), ("w1", (8, 8, 3, 3)), ("b1", (1, 8, 1, 1)),
                   ("w2", (8, 8, 3, 3)), ("b2", (1, 8, 1, 1)), ("w3", (16, 8, 1, 1)),
                   ("fc", (16, 10))], body)


def cl_depthwise_block():
    def body(bb, x, w1, b1, w2, b2, w3):
        e = bb.emit(R.nn.relu(bb.emit(R.add(bb.emit(conv(x, w1, padding=0)), b1))))
        d = bb.emit(R.nn.conv2d(e, w2, strides=[2, 2], padding=[1, 1, 1, 1], groups=24))
        d = bb.emit(R.nn.relu(bb.emit(R.add(d, b2))))
        y = bb.emit(conv(d, w3, padding=0))
        z = bb.emit(R.add(y, relax.const(0.5, "float32")))
        return [bb.emit_output(z), bb.emit_output(R.nn.avg_pool2d(z, pool_size=[2, 2], strides=[2, 2]))]
    return module([("x", (1, 4, 12, 12)), ("w1", (24, 4, 1, 1)), ("b1", (1, 24, 1, 1)),
                   ("w2", (24, 1, 3, 3)), ("b2", (1, 24, 1, 1)), ("w3", (8, 24, 1, 1))], body)


def cl_relu6():
    # MobileNet's ReLU6 (clip) between convolutions.
    def body(bb, x, w1, b1, w2):
        a = bb.emit(R.add(bb.emit(conv(x, w1, padding=0)), b1))
        c = bb.emit(R.clip(a, 0.0, 6.0))
        return bb.emit_output(conv(c, w2))
    return module([("x", (1, 4, 8, 8)), ("w1", (8, 4, 1, 1)), ("b1", (1, 8, 1, 1)),
                   ("w2", (8, 8, 3, 3))], body)


def cl_shared_input():
    # Two convolutions of one input, their sum scaled per channel by a (C, 1, 1) operand.
    def body(bb, x, w1, w2, k):
        a = bb.emit(conv(x, w1))
        b = bb.emit(conv(x, w2, padding=0))
        s = bb.emit(R.multiply(bb.emit(R.add(a, b)), k))
        return bb.emit_output(R.nn.relu(s))
    return module([("x", (1, 4, 8, 8)), ("w1", (8, 4, 3, 3)), ("w2", (8, 4, 1, 1)),
                   ("k", (8, 1, 1))], body)


case("convert_layout_resnet_block", "layout", cl_resnet_block, "convert_layout NHWC OHWI")
case("convert_layout_relu6", "layout", cl_relu6, "convert_layout NHWC OHWI")
case("convert_layout_shared_input", "layout", cl_shared_input, "convert_layout NHWC OHWI")
case("convert_layout_depthwise_block", "layout", cl_depthwise_block, "convert_layout NHWC OHWI")

for k in range(RANDOM_CASES):
    rng = random.Random(1000 + k)
    flow_pick = rng.random()
    if flow_pick < 0.15:
        case(f"random_{k:03}_cublas", "random", random_dag(k, "float16"), "cublas")
    elif flow_pick < 0.25:
        case(f"random_{k:03}_cutlass", "random", random_dag(k, "float16"), "cutlass")
    else:
        npat = rng.randint(1, 3)
        pats = rng.sample(RANDOM_PATTERNS, npat)
        leak = rng.random() < 0.3
        pats = [(p[0], p[1], leak) for p in pats]
        mode = rng.choice(["plain", "annotated", "merged"])
        case(f"random_{k:03}_{mode}", "random", random_dag(k, "float32"), "fuse_ops_by_pattern",
             pats, annotate_codegen=mode == "annotated", merge=mode == "merged")

# ------------------------------------------------------------------------------------------------


def no_leak(ctx):
    """The check of `+leakcheck` patterns (fusebox's `NoLeakingIntermediates`)."""
    return not has_leaking_intermediate_variables(ctx)


def run_flow(c, mod):
    if c.flow.startswith("convert_layout "):
        data, kernel = c.flow.split()[1:]
        return relax.transform.ConvertLayout({"relax.nn.conv2d": [data, kernel]})(mod)
    if c.flow == "cublas":
        return partition_for_cublas(mod)
    if c.flow == "cutlass":
        return partition_for_cutlass(mod)
    if c.flow == "cutlass_table":
        return relax.transform.FuseOpsByPattern(get_patterns_with_prefix("cutlass"),
                                                bind_constants=False, annotate_codegen=True)(mod)
    pats = []
    for name, text, leak in c.patterns:
        pat = tvm_pattern(text)
        if leak:
            pats.append(FusionPattern(name, pat, {}, no_leak))
        else:
            pats.append((name, pat))
    out = relax.transform.FuseOpsByPattern(pats, bind_constants=c.bind_constants,
                                           annotate_codegen=c.annotate_codegen)(mod)
    if c.merge:
        out = relax.transform.MergeCompositeFunctions()(out)
    return out


def script(mod):
    text = mod.script()
    return text.rstrip("\n") + "\n"


def first_line(e):
    msg = [m.strip() for m in str(e).strip().splitlines() if m.strip()]
    first = next((m for m in msg if "Error" in m or "error" in m), msg[0] if msg else "?")
    return f"{type(e).__name__}: {first[:300]}"


def write_case(out_dir, c):
    mod = c.build()
    head = [f"# case: {c.name}", f"# group: {c.group}", f"# flow: {c.flow}"]
    if c.flow == "fuse_ops_by_pattern":
        for name, text, leak in c.patterns:
            head.append(f"# pattern{'+leakcheck' if leak else ''}: {name} = {text}")
        head.append(f"# options: bind_constants={str(c.bind_constants).lower()} "
                    f"annotate_codegen={str(c.annotate_codegen).lower()} "
                    f"merge={str(c.merge).lower()}")
    if c.pending:
        head.append(f"# pending: {c.pending}")
    input_text = script(mod)
    output_text = None
    try:
        out = run_flow(c, mod)
        output_text = script(out)
    except Exception as e:  # TVM raised: record the first line of its message.
        head.append(f"# tvm_error: {first_line(e)}")
    else:
        try:
            relax.analysis.well_formed(out)  # raises on the first violation
        except Exception as e:
            head.append(f"# tvm_well_formed: false: {first_line(e)}")
    parts = head + ["# ==== input ====", input_text.rstrip("\n")]
    if output_text is not None:
        parts += ["# ==== tvm ====", output_text.rstrip("\n")]
    with open(os.path.join(out_dir, c.name + ".case"), "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "cases"))
    ap.add_argument("--only", default=None, help="regex: write only matching cases")
    args = ap.parse_args()
    names = [c.name for c in CASES]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        sys.exit(f"duplicate case names: {sorted(dup)}")
    if args.only is None and os.path.isdir(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out, exist_ok=True)
    n = 0
    for c in CASES:
        if args.only and not re.search(args.only, c.name):
            continue
        write_case(args.out, c)
        n += 1
    print(f"tvm {tvm.__version__}: wrote {n} cases to {args.out}")


if __name__ == "__main__":
    main()
