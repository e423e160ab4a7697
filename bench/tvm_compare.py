"""Times TVM's FuseOpsByPattern and FuseOps on the benchmark graph of `fusebox bench partition`.

The graph: N layers of matmul(16x64, 64x64, float16) -> add(bias) -> relu (3 ops per layer),
each layer with its own weight and bias parameters, one dataflow block. Prints one line per
(pass, ops) with the median wall time of `--repeat` runs, in the same format as
`fusebox bench partition` so the two can be read side by side.

Usage (TVM from PyPI in a venv; not part of the test suite):
    python -m venv .venv-tvm && .venv-tvm/bin/pip install apache-tvm==0.27.0.post1
    .venv-tvm/bin/python bench/tvm_compare.py --ops 3000,9000,30000 --repeat 3
"""

import argparse
import statistics
import time

import tvm
from tvm import relax
from tvm.relax.dpl.pattern import is_op, wildcard


def chain(layers):
    """The graph as TVMScript text, parsed by TVM (the same text fusebox prints for it)."""
    t = 'R.Tensor((16, 64), dtype="float16")'
    params = ['x: R.Tensor((16, 64), dtype="float16")']
    for i in range(layers):
        params.append(f'w{i}: R.Tensor((64, 64), dtype="float16")')
        params.append(f'b{i}: R.Tensor((64,), dtype="float16")')
    lines = []
    cur = "x"
    for i in range(layers):
        lines.append(f"            m{i}: {t} = R.matmul({cur}, w{i}, out_dtype=None)")
        lines.append(f"            a{i}: {t} = R.add(m{i}, b{i})")
        lines.append(f"            r{i}: {t} = R.nn.relu(a{i})")
        cur = f"r{i}"
    src = (
        "@I.ir_module\nclass Module:\n    @R.function\n"
        f"    def main({', '.join(params)}) -> {t}:\n"
        "        with R.dataflow():\n" + "\n".join(lines) + f"\n            R.output({cur})\n"
        f"        return {cur}\n"
    )
    return tvm.script.from_source(src)


def one_pattern():
    mm = is_op("relax.matmul")(wildcard(), wildcard())
    return [("cublas.matmul_bias_relu", is_op("relax.nn.relu")(is_op("relax.add")(mm, wildcard())))]


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="3000,9000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--passes", default="one,cublas,fuse_ops")
    args = ap.parse_args()
    print(f"tvm {tvm.__version__}")
    for n in [int(v) for v in args.ops.split(",")]:
        mod = chain(max(n // 3, 1))
        for p in args.passes.split(","):
            if p == "one":
                f = lambda: relax.transform.FuseOpsByPattern(one_pattern(), bind_constants=True)(mod)
            elif p == "cublas":
                from tvm.relax.backend.cuda.cublas import partition_for_cublas

                f = lambda: partition_for_cublas(mod)
            elif p == "fuse_ops":
                # FuseOps needs op patterns from TIR: legalize first (not timed), as TVM's pipeline.
                legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
                f = lambda: relax.transform.FuseOps(fuse_opt_level=2)(legal)
            else:
                raise SystemExit(f"unknown pass {p}")
            t = timed(f, args.repeat)
            print(f"  {p:>9} {n:>9} ops {t * 1e3:>12.2f} ms {t * 1e9 / n:>12.1f} ns/op")


if __name__ == "__main__":
    main()
