//! The threaded kernels and the fused convolution chains give bit-identical results: for
//! every thread count, and fused or run op by op.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::{Constant, DType};
use fusebox_core::text::{ConstTable, NS_CONSTANT, parse_module, parse_module_str};
use fusebox_cpu::par::with_threads;
use fusebox_cpu::{Executor, Tensor, Value, run, run_profiled};

/// A module exercising every threaded kernel: conv2d (3×3 padded, 1×1 direct, grouped and
/// strided) with the fusable chains after it (bias-first add + relu, batch_norm, relu,
/// batch_norm + a call of a `relu(t[0])` function), a batch_norm, an add + relu on large
/// tensors, a large matmul, a vector-matrix product (its reduction cut into partial sums
/// that run on several threads), max and average pooling, a 3×3 conv2d + relu on the Winograd
/// path in two blocks of tile rows, a strided 3×3 conv2d + relu whose im2col reduction (576)
/// is longer than the GEMM's depth block (512) and whose output is cut into column tiles
/// (each making its own im2col block), another on fewer pixels (one column tile of row
/// tiles, the im2col matrix made whole by all threads), and
/// two residual tails (conv2d + batch_norm, then a call of an `add` + `relu` function of the
/// batch_norm's first field and another batch_norm's, or a tensor), and two depthwise 3×3
/// conv2d (stride 1 and 2, on `depthwise_flat`'s unrolled kernel) + bias add + clip (the
/// clip run in the add's loop), and two conv2d + bias add + residual add (+ relu) chains, a
/// 1×1 and a 3×3 on the Winograd path (the three steps run in one loop). `{EXTRA}` is replaced
/// by extra outputs: returning a chain's intermediates keeps it from fusing.
const SRC: &str = r#"@I.ir_module
class Module:
    @R.function(private=True)
    def fused_relu(t: R.Tuple(R.Tensor((1, 64, 48, 48), dtype="float32"), R.Tensor((64,), dtype="float32"), R.Tensor((64,), dtype="float32"))) -> R.Tensor((1, 64, 48, 48), dtype="float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            y = t[0]
            gv = R.nn.relu(y)
            R.output(gv)
        return gv

    @R.function(private=True)
    def fused_add_relu(t: R.Tuple(R.Tensor((1, 64, 48, 48), dtype="float32"), R.Tensor((64,), dtype="float32"), R.Tensor((64,), dtype="float32")), u: R.Tuple(R.Tensor((1, 64, 48, 48), dtype="float32"), R.Tensor((64,), dtype="float32"), R.Tensor((64,), dtype="float32"))) -> R.Tensor((1, 64, 48, 48), dtype="float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            a = t[0]
            b = u[0]
            c = R.add(b, a)
            gv = R.nn.relu(c)
            R.output(gv)
        return gv

    @R.function(private=True)
    def fused_add_relu1(t: R.Tuple(R.Tensor((1, 64, 48, 48), dtype="float32"), R.Tensor((64,), dtype="float32"), R.Tensor((64,), dtype="float32")), r: R.Tensor((1, 64, 48, 48), dtype="float32")) -> R.Tensor((1, 64, 48, 48), dtype="float32"):
        R.func_attr({"Primitive": True})
        with R.dataflow():
            a = t[0]
            c = R.add(a, r)
            gv = R.nn.relu(c)
            R.output(gv)
        return gv

    @R.function
    def main(x: R.Tensor((1, 16, 48, 48), dtype="float32"), w1: R.Tensor((32, 16, 3, 3), dtype="float32"), b1: R.Tensor((1, 32, 1, 1), dtype="float32"), w2: R.Tensor((64, 32, 1, 1), dtype="float32"), g: R.Tensor((64,), dtype="float32"), be: R.Tensor((64,), dtype="float32"), mu: R.Tensor((64,), dtype="float32"), var: R.Tensor((64,), dtype="float32"), w3: R.Tensor((64, 16, 3, 3), dtype="float32"), a: R.Tensor((128, 256), dtype="float32"), b: R.Tensor((256, 128), dtype="float32"), w4: R.Tensor((64, 64, 3, 3), dtype="float32"), v: R.Tensor((1, 1200), dtype="float32"), wv: R.Tensor((1200, 700), dtype="float32"), wd: R.Tensor((64, 1, 3, 3), dtype="float32"), bd: R.Tensor((1, 64, 1, 1), dtype="float32")):
        cls = Module
        with R.dataflow():
            c1 = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
            a1 = R.add(b1, c1)
            r1 = R.nn.relu(a1)
            c2 = R.nn.conv2d(r1, w2)
            bn = R.nn.batch_norm(c2, g, be, mu, var, axis=1, training=False)
            y2 = bn[0]
            c3 = R.nn.conv2d(y2, w3, strides=[2, 2], padding=[1, 1, 1, 1], groups=4)
            r3 = R.nn.relu(c3)
            bn2 = R.nn.batch_norm(y2, g, be, mu, var, axis=1, training=False)
            y4 = bn2[0]
            s = R.add(y4, y2)
            r5 = R.nn.relu(s)
            c4 = R.nn.conv2d(r1, w2)
            bn3 = R.nn.batch_norm(c4, g, be, mu, var, axis=1, training=False)
            r6 = cls.fused_relu(bn3)
            m = R.matmul(a, b)
            mv = R.matmul(v, wv)
            p1 = R.nn.max_pool2d(y2, pool_size=[3, 3], strides=[1, 1], padding=[1, 1, 1, 1])
            p2 = R.nn.avg_pool2d(y2, pool_size=[3, 3], strides=[1, 1], padding=[1, 1, 1, 1])
            c5 = R.nn.conv2d(y2, w4, padding=[1, 1, 1, 1])
            r7 = R.nn.relu(c5)
            c6 = R.nn.conv2d(r1, w2)
            bn4 = R.nn.batch_norm(c6, g, be, mu, var, axis=1, training=False)
            c7 = R.nn.conv2d(r1, w2)
            bn5 = R.nn.batch_norm(c7, be, g, mu, var, axis=1, training=False)
            r8 = cls.fused_add_relu(bn4, bn5)
            c8 = R.nn.conv2d(r1, w2)
            bn6 = R.nn.batch_norm(c8, g, be, mu, var, axis=1, training=False)
            r9 = cls.fused_add_relu1(bn6, y2)
            c9 = R.nn.conv2d(y2, w4, strides=[2, 2], padding=[1, 1, 1, 1])
            r10 = R.nn.relu(c9)
            c10 = R.nn.conv2d(y2, w4, strides=[4, 4], padding=[1, 1, 1, 1])
            r11 = R.nn.relu(c10)
            c11 = R.nn.conv2d(y2, wd, padding=[1, 1, 1, 1], groups=64)
            a11 = R.add(c11, bd)
            r12 = R.clip(a11, R.prim_value(T.float32(0.0)), R.prim_value(T.float32(0.75)))
            c12 = R.nn.conv2d(y2, wd, strides=[2, 2], padding=[1, 1, 1, 1], groups=64)
            a12 = R.add(bd, c12)
            r13 = R.clip(a12, R.prim_value(T.float32(-0.5)), R.prim_value(T.float32(0.5)))
            c13 = R.nn.conv2d(r1, w2)
            a13 = R.add(bd, c13)
            s13 = R.add(y2, a13)
            r14 = R.nn.relu(s13)
            c14 = R.nn.conv2d(y2, w4, padding=[1, 1, 1, 1])
            a14 = R.add(c14, bd)
            s14 = R.add(a14, y2)
            R.output(r1, y2, r3, r5, r6, m, mv, p1, p2, r7, r8, r9, r10, r11, r12, r13, r14, s14{EXTRA})
        return (r1, y2, r3, r5, r6, m, mv, p1, p2, r7, r8, r9, r10, r11, r12, r13, r14, s14{EXTRA})
"#;

/// Deterministic values in [-1, 1) that make every sum round (so order matters).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn args() -> Vec<Value> {
    let shapes: [&[usize]; 16] = [
        &[1, 16, 48, 48],
        &[32, 16, 3, 3],
        &[1, 32, 1, 1],
        &[64, 32, 1, 1],
        &[64],
        &[64],
        &[64],
        &[64],
        &[64, 16, 3, 3],
        &[128, 256],
        &[256, 128],
        &[64, 64, 3, 3],
        &[1, 1200],
        &[1200, 700],
        &[64, 1, 3, 3],
        &[1, 64, 1, 1],
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = s.iter().product();
            let mut v = values(n, i as u64 + 1);
            if i == 7 {
                // A variance: positive.
                v.iter_mut().for_each(|x| *x = x.abs() + 0.5);
            }
            Value::Tensor(Tensor::from_f32(s.to_vec(), v).unwrap())
        })
        .collect()
}

/// The output tensors (tuples flattened) as raw bits.
fn bits(v: Value) -> Vec<Vec<u32>> {
    fn go(v: Value, out: &mut Vec<Vec<u32>>) {
        match v {
            Value::Tensor(t) => out.push(t.to_f32_vec().iter().map(|x| x.to_bits()).collect()),
            Value::Tuple(parts) => parts.into_iter().for_each(|p| go(p, out)),
            v => panic!("expected a tensor, found {v:?}"),
        }
    }
    let mut out = Vec::new();
    go(v, &mut out);
    out
}

#[test]
fn results_are_bit_identical_for_every_thread_count() {
    let m = parse_module_str(&SRC.replace("{EXTRA}", "")).unwrap_or_else(|e| panic!("{e}"));
    let one = with_threads(1, || run(&m, "main", args())).unwrap_or_else(|e| panic!("{e}"));
    let want = bits(one);
    assert!(
        want[0].iter().any(|&b| b != 0),
        "the relu output is all zeros"
    );
    for n in [2, 3, 4, 7] {
        let got = with_threads(n, || run(&m, "main", args())).unwrap_or_else(|e| panic!("{e}"));
        assert!(bits(got) == want, "{n} threads differ from one");
    }
}

#[test]
fn fused_chains_match_the_ops_run_one_by_one() {
    let fused = parse_module_str(&SRC.replace("{EXTRA}", "")).unwrap_or_else(|e| panic!("{e}"));
    // Returning the intermediates keeps every chain from fusing.
    let plain = parse_module_str(&SRC.replace(
        "{EXTRA}",
        ", c1, a1, c2, c3, s, c4, bn3, c5, c7, bn5, c8, bn6, c9, c10, c11, a11, c12, a12, c13, a13, s13, c14, a14",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    for n in [1, 2] {
        let f = bits(with_threads(n, || run(&fused, "main", args())).unwrap());
        let p = bits(with_threads(n, || run(&plain, "main", args())).unwrap());
        assert_eq!(p.len(), f.len() + 29);
        for (i, (a, b)) in f.iter().zip(&p).enumerate() {
            assert!(
                a == b,
                "output {i} differs between the fused and the plain run"
            );
        }
    }
    // The chains did run fused: each kind once per call site, and none in the plain module.
    let calls = |m: &fusebox_core::ir::Module| {
        let (_, prof) = run_profiled(m, "main", args()).unwrap_or_else(|e| panic!("{e}"));
        let get = |n: &str| prof.iter().find(|p| p.name == n).map_or(0, |p| p.calls);
        (
            get("relax.nn.conv2d+relax.nn.batch_norm+relax.add+relax.nn.relu"),
            get("relax.nn.conv2d+relax.nn.batch_norm+relax.nn.relu"),
            get("relax.nn.conv2d+relax.add+relax.nn.relu"),
            get("relax.nn.conv2d+relax.add+relax.clip"),
            get("relax.nn.conv2d+relax.add+relax.add+relax.nn.relu"),
            get("relax.nn.conv2d+relax.add+relax.add"),
        )
    };
    assert_eq!(calls(&fused), (2, 1, 1, 2, 1, 1));
    assert_eq!(calls(&plain), (0, 0, 0, 0, 0, 0));
}

#[test]
fn an_executor_reuses_its_constants_and_folds_constant_ops() {
    // A transposed constant weight (as ONNX Gemm imports) and a constant bias.
    let src = r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 3), dtype="float32")) -> R.Tensor((2, 2), dtype="float32"):
        with R.dataflow():
            wt = R.permute_dims(metadata["relax.expr.Constant"][0])
            y = R.matmul(x, wt)
            z = R.add(y, metadata["relax.expr.Constant"][1])
            R.output(z)
        return z
"#;
    let c = |shape: Vec<i64>, v: &[f32]| {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Constant::from_bytes(DType::F32, shape, bytes).unwrap()
    };
    let mut consts = ConstTable::new();
    consts.insert(
        NS_CONSTANT,
        0,
        c(vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
    );
    consts.insert(NS_CONSTANT, 1, c(vec![2], &[0.5, -0.5]));
    let m = parse_module(src, "t.relax", &consts).unwrap_or_else(|e| panic!("{e}"));
    let x = || {
        vec![Value::Tensor(
            Tensor::from_f32(vec![2, 3], vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0]).unwrap(),
        )]
    };
    let ex = Executor::new();
    for _ in 0..3 {
        let Value::Tensor(z) = ex
            .run(&m, "main", x(), None)
            .unwrap_or_else(|e| panic!("{e}"))
        else {
            panic!("expected a tensor")
        };
        assert_eq!(z.as_f32(), Some(&[1.5, 3.5, 5.5, 10.5][..]));
    }
    assert!(format!("{ex:?}").contains("2 constants"), "{ex:?}");
}

#[test]
fn a_constant_weight_is_packed_once_and_each_product_is_the_in_order_fma_chain() {
    // A dense layer of a constant weight (8+ rows: the packed kernel's) next to the same
    // product of a parameter, and a 4-row product of the constant (too few rows: `faer`).
    let src = r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((2, 9, 70), dtype="float32"), w: R.Tensor((70, 130), dtype="float32"), s: R.Tensor((4, 70), dtype="float32")) -> R.Tuple(R.Tensor((2, 9, 130), dtype="float32"), R.Tensor((2, 9, 130), dtype="float32"), R.Tensor((4, 130), dtype="float32")):
        with R.dataflow():
            y = R.matmul(x, metadata["relax.expr.Constant"][0])
            p = R.matmul(x, w)
            q = R.matmul(s, metadata["relax.expr.Constant"][0])
            R.output(y, p, q)
        return (y, p, q)
"#;
    let (m_, k, n) = (18, 70, 130);
    let wv = values(k * n, 21);
    let xv = values(m_ * k, 22);
    let bytes = wv.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut consts = ConstTable::new();
    consts.insert(
        NS_CONSTANT,
        0,
        Constant::from_bytes(DType::F32, vec![k as i64, n as i64], bytes).unwrap(),
    );
    let m = parse_module(src, "t.relax", &consts).unwrap_or_else(|e| panic!("{e}"));
    let args = || {
        vec![
            Value::Tensor(Tensor::from_f32(vec![2, 9, k], xv.clone()).unwrap()),
            Value::Tensor(Tensor::from_f32(vec![k, n], wv.clone()).unwrap()),
            Value::Tensor(Tensor::from_f32(vec![4, k], xv[..4 * k].to_vec()).unwrap()),
        ]
    };
    // The definition of the packed kernel's contract: one FMA chain over k in order.
    let mut chain = vec![0.0f32; m_ * n];
    for i in 0..m_ {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                acc = xv[i * k + p].mul_add(wv[p * n + j], acc);
            }
            chain[i * n + j] = acc;
        }
    }
    let want: Vec<u32> = chain.iter().map(|v| v.to_bits()).collect();
    let ex = Executor::new();
    for threads in [1, 2, 3] {
        let got = with_threads(threads, || ex.run(&m, "main", args(), None))
            .unwrap_or_else(|e| panic!("{e}"));
        let got = bits(got);
        assert_eq!(got[0], want, "{threads} threads");
        // The parameter's product (not packed) agrees to rounding.
        let close = got[1]
            .iter()
            .zip(&want)
            .all(|(a, b)| (f32::from_bits(*a) - f32::from_bits(*b)).abs() <= 1e-5);
        assert!(close, "the unpacked product differs beyond rounding");
        assert_eq!(got[2].len(), 4 * n);
    }
    // One packed copy, made once for the three runs (the 4-row product made none).
    assert!(format!("{ex:?}").contains("1 packed weights"), "{ex:?}");
}

#[test]
fn a_partitioned_run_fuses_across_calls_the_hook_leaves_to_the_interpreter() {
    let m = parse_module_str(&SRC.replace("{EXTRA}", "")).unwrap_or_else(|e| panic!("{e}"));
    let want = bits(run(&m, "main", args()).unwrap_or_else(|e| panic!("{e}")));
    // The hook is offered every call it might take and declines (the interpreter runs it).
    let offered = std::sync::Mutex::new(Vec::new());
    let hook = |name: &str, _: &[Value]| {
        offered.lock().unwrap().push(name.to_string());
        None
    };
    let takes = |name: &str| name == "fused_relu";
    let got = Executor::new()
        .run_partitioned(&m, "main", args(), &hook, &takes)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(bits(got) == want, "the partitioned run differs");
    // `fused_relu` (which the hook takes) is called; the add + relu functions (which it
    // leaves to the interpreter) ran inside fused conv2d chains, never as calls.
    assert_eq!(*offered.lock().unwrap(), ["fused_relu"]);
    // With a plain hook every call is the hook's: nothing is fused across a call.
    offered.lock().unwrap().clear();
    let got = Executor::new()
        .run(&m, "main", args(), Some(&hook))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(bits(got) == want, "the hooked run differs");
    assert_eq!(
        *offered.lock().unwrap(),
        ["fused_relu", "fused_add_relu", "fused_add_relu1"]
    );
}
