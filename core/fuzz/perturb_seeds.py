#!/usr/bin/env python3
"""Seeds for the `run_onnx` and `import_onnx` fuzz targets: small ONNX models with one thing
made wrong or extreme.

libFuzzer mutates bytes, and most byte mutations of a protobuf stop at the decoder. This script
makes structure-aware variants instead: from each `.onnx` file under CASES (the ONNX node
conformance cases that `tests/onnx/gen_node_cases.py --out DIR` writes, 1,500-odd one-op models)
it writes VARIANTS models, each with one change:

- an input's dim set to 0, 1, 2, 3, 7, 100,000 or 2^31 (or a dim added to a scalar input);
- an attribute's value replaced: ints by -5 … 2^40, int lists shortened, lengthened or refilled,
  floats by 0, -1, ±inf, NaN, 1e30 or 1e-30, strings by '', 'x', 'NOTSET', 'VALID', 'constant';
- an input's element type changed (float, int64, int32, bool, float16, double, uint8, string);
- a node's input dropped or one added, or the opset version set to 1 … 99.

Nothing is validated: a model onnx's checker would refuse is as good a seed as one it accepts.
Every model fusebox is given must end in a result or an error naming what is wrong, never a
panic, a hang or an exhausted memory (README, Standards). Usage:

    .venv/bin/python tests/onnx/gen_node_cases.py --out /tmp/onnx-node
    .venv/bin/python core/fuzz/perturb_seeds.py /tmp/onnx-node /tmp/fuzz-seeds [--variants 4] [--seed 1]
    cd core/fuzz && cargo fuzz run --sanitizer none -O run_onnx /tmp/run-corpus /tmp/fuzz-seeds \\
        -- -max_total_time=1800 -rss_limit_mb=3072 -timeout=20

Or each seed once, every failure listed: `for f in /tmp/fuzz-seeds/*.onnx; do
core/fuzz/target/x86_64-unknown-linux-gnu/release/run_onnx -timeout=20 "$f" >/dev/null 2>&1 ||
echo "$f"; done`. A hand-run tool, not a test.
"""

import argparse
import copy
import glob
import os
import random

import onnx
from onnx import AttributeProto, TensorProto

INTS = [-5, -3, -2, -1, 0, 1, 2, 3, 5, 64, 1 << 20, (1 << 31) - 1, -(1 << 31), 1 << 40]
FLOATS = [0.0, -1.0, 1e30, float("nan"), float("inf"), -float("inf"), 1e-30]
STRINGS = [b"", b"x", b"NOTSET", b"VALID", b"constant"]
DIMS = [0, 1, 2, 3, 7, 100_000, 1 << 31]
TYPES = [
    TensorProto.FLOAT,
    TensorProto.INT64,
    TensorProto.INT32,
    TensorProto.BOOL,
    TensorProto.FLOAT16,
    TensorProto.DOUBLE,
    TensorProto.UINT8,
    TensorProto.STRING,
]


def change_dim(g, rng):
    """An input's dim set to one of DIMS, or a dim added to a scalar input."""
    if not g.input:
        return False
    dims = rng.choice(g.input).type.tensor_type.shape.dim
    if len(dims):
        d = rng.choice(dims)
        d.ClearField("dim_param")
        d.dim_value = rng.choice(DIMS)
    else:
        dims.add().dim_value = rng.choice([0, 2, 5])
    return True


def change_attribute(g, rng):
    """One attribute of one node given an extreme or wrong value."""
    attrs = [a for nd in g.node for a in nd.attribute]
    if not attrs:
        return False
    a = rng.choice(attrs)
    if a.type == AttributeProto.INT:
        a.i = rng.choice(INTS)
    elif a.type == AttributeProto.INTS:
        k = rng.choice([0, 1, len(a.ints), len(a.ints) + 1, 2 * len(a.ints)])
        del a.ints[:]
        a.ints.extend(rng.choice(INTS) for _ in range(k))
    elif a.type == AttributeProto.FLOAT:
        a.f = rng.choice(FLOATS)
    elif a.type == AttributeProto.FLOATS:
        for j in range(len(a.floats)):
            a.floats[j] = rng.choice(FLOATS)
    elif a.type == AttributeProto.STRING:
        a.s = rng.choice(STRINGS)
    else:
        return False
    return True


def change_type(g, rng):
    """An input's element type changed."""
    if not g.input:
        return False
    rng.choice(g.input).type.tensor_type.elem_type = rng.choice(TYPES)
    return True


def change_arity(m, rng):
    """A node's last input dropped or a graph input added to it, or the opset changed."""
    g = m.graph
    if not g.node:
        return False
    nd = rng.choice(g.node)
    r = rng.random()
    if nd.input and r < 0.4:
        nd.input.pop()
    elif r < 0.8:
        nd.input.append(rng.choice([x.name for x in g.input] or [""]))
    elif m.opset_import:
        m.opset_import[0].version = rng.choice([1, 7, 11, 13, 17, 21, 99])
    else:
        return False
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", help="a folder searched for .onnx files")
    p.add_argument("out", help="where the variants go (created)")
    p.add_argument("--variants", type=int, default=4, help="variants per model")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    files = sorted(glob.glob(os.path.join(a.cases, "**", "*.onnx"), recursive=True))
    if not files:
        raise SystemExit(f"no .onnx files under {a.cases}")
    written = 0
    for f in files:
        try:
            model = onnx.load(f)
        except Exception as e:  # a case that does not load is skipped, not fatal
            print(f"skipped {f}: {e}")
            continue
        for _ in range(a.variants):
            m = copy.deepcopy(model)
            change = rng.choice([change_dim, change_attribute, change_type, None])
            done = change_arity(m, rng) if change is None else change(m.graph, rng)
            if not done:
                continue
            written += 1
            with open(os.path.join(a.out, f"v{written:05}.onnx"), "wb") as fh:
                fh.write(m.SerializeToString())
    print(f"wrote {written} variants of {len(files)} models to {a.out}")


if __name__ == "__main__":
    main()
