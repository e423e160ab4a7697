//! FoldBatchNorm against the unfolded module on the CPU reference: `batch_norm`'s own kernel
//! (the definition written independently of the fold) gives the expected outputs; the folded
//! conv weights, bias and affine maps must match them for random weights, statistics and
//! inputs, with and without a conv to fold into, grouped convs included.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox::core::ir::generate::Rng;
use fusebox::core::ir::{Callee, Constant, DType, ExprKind, Module};
use fusebox::core::text::parse_module_str;
use fusebox::core::transform::{bind_params, fold_batch_norm};
use fusebox::cpu::{Tensor, Value};

fn random(rng: &mut Rng, shape: &[i64], lo: f32, hi: f32) -> Vec<f32> {
    let n: i64 = shape.iter().product();
    (0..n)
        .map(|_| lo + (hi - lo) * ((rng.next_u64() % 1_000_001) as f32 / 1_000_000.0))
        .collect()
}

fn constant(shape: &[i64], v: &[f32]) -> Constant {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Constant::from_bytes(DType::F32, shape.to_vec(), bytes).unwrap()
}

/// conv2d (groups `g`) → batch_norm → relu, and a batch_norm on the input, with `c` channels.
fn module(c: i64, g: i64, seed: u64) -> (Module, Vec<Value>) {
    let t = |s: &str| format!("R.Tensor(({s}), dtype=\"float32\")");
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {x}, w: {w}, ga: {v}, be: {v}, mu: {v}, va: {v}, ga2: {v}, be2: {v}, mu2: {v}, va2: {v}) -> R.Tuple({x}, {x}):\n        with R.dataflow():\n            y = R.nn.conv2d(x, w, padding=[1, 1, 1, 1], groups={g})\n            bn = R.nn.batch_norm(y, ga, be, mu, va, axis=1, epsilon=1e-05, training=False)\n            z = bn[0]\n            r = R.nn.relu(z)\n            bn2 = R.nn.batch_norm(x, ga2, be2, mu2, va2, axis=1, epsilon=0.001, training=False)\n            q = bn2[0]\n            R.output(r, q)\n        return (r, q)\n",
        x = t(&format!("2, {c}, 5, 5")),
        w = t(&format!("{c}, {}, 3, 3", c / g)),
        v = t(&format!("{c},")),
    );
    let m = parse_module_str(&src).unwrap();
    let mut rng = Rng::new(seed);
    let w_shape = [c, c / g, 3, 3];
    let mut params = vec![(
        "w".to_string(),
        constant(&w_shape, &random(&mut rng, &w_shape, -1.0, 1.0)),
    )];
    for suffix in ["", "2"] {
        for (name, lo, hi) in [
            ("ga", -2.0, 2.0),
            ("be", -1.0, 1.0),
            ("mu", -0.5, 0.5),
            ("va", 0.01, 3.0),
        ] {
            params.push((
                format!("{name}{suffix}"),
                constant(&[c], &random(&mut rng, &[c], lo, hi)),
            ));
        }
    }
    let m = bind_params(&m, "main", &params).unwrap();
    let x_shape = [2, c, 5, 5];
    let x = Tensor::from_f32(
        x_shape.iter().map(|&d| d as usize).collect(),
        random(&mut rng, &x_shape, -1.0, 1.0),
    )
    .unwrap();
    (m, vec![Value::Tensor(x)])
}

fn flatten(v: Value) -> Vec<Tensor> {
    match v {
        Value::Tensor(t) => vec![t],
        Value::Tuple(items) => items.into_iter().flat_map(flatten).collect(),
        other => panic!("unexpected {}", other.kind()),
    }
}

fn batch_norms(m: &Module) -> usize {
    let f = m.get("main").unwrap();
    f.bindings()
        .filter(|b| {
            matches!(&f.expr(b.value).kind, ExprKind::Call { callee: Callee::Op(op), .. }
                if op.name() == "relax.nn.batch_norm")
        })
        .count()
}

#[test]
fn folded_batch_norms_compute_what_batch_norm_computes() {
    for (c, g, seed) in [(4, 1, 1), (8, 2, 2), (6, 6, 3), (16, 1, 4)] {
        let (m, args) = module(c, g, seed);
        let folded = fold_batch_norm(&m).unwrap();
        assert_eq!(batch_norms(&m), 2);
        assert_eq!(batch_norms(&folded), 0, "c={c} g={g}");
        let want = flatten(fusebox::cpu::run(&m, "main", args.clone()).unwrap());
        let got = flatten(fusebox::cpu::run(&folded, "main", args).unwrap());
        assert_eq!(want.len(), 2);
        for (w, g_) in want.iter().zip(&got) {
            assert_eq!(w.shape(), g_.shape());
            let scale = w.to_f64_vec().iter().fold(1.0f64, |m, x| m.max(x.abs()));
            for (i, (a, b)) in g_.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                assert!(
                    fusebox::compare::close(*a, b, 1e-5 * scale),
                    "c={c} g={g} element {i}: {a} vs {b}"
                );
            }
        }
    }
}
