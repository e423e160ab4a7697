//! Property test: inference simplification keeps the values. Random small graphs mix what the
//! passes rewrite (constant chains, identity ops, `x * 1`, `x + -0.0`, dropout, `where(c, a,
//! a)`, lossless cast chains, constant masks) with what they must keep (`x + 0.0`, the NaN
//! guard after a softmax, lossy casts); inputs include NaN, ±inf and -0.0. The CPU reference
//! runs the module before and after `simplify_for_inference` (with the CPU evaluator): the
//! outputs must be bit-identical. With batch_norms (after a matmul with a constant weight, and
//! on their own) FoldBatchNorm changes float rounding, so those graphs (finite inputs) must
//! agree within 1e-5 of the output's largest magnitude (at least 1), NaN where NaN. Random
//! dense-layer einsums with a constant weight (labels in random orders, the weight on either
//! side) must become matmuls (EinsumToMatmul) with values within 1e-5.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failure is a panic"
)]

mod common;

use fusebox::core::ir::generate::Rng;
use fusebox::core::ir::verify::verify;
use fusebox::core::ir::{Constant, DType, Module};
use fusebox::core::text::{parse_module_str, print_module};
use fusebox::core::transform::{bind_params, simplify_for_inference};
use fusebox::cpu::{Storage, Tensor, Value};
use proptest::prelude::*;

fn unit(rng: &mut Rng) -> f32 {
    (rng.next_u64() % 2001) as f32 / 1000.0 - 1.0
}

/// The module's text (`w`, `g`, `be`, `mu`, `va` are parameters to bind, with batch_norms).
fn source(rng: &mut Rng, steps: usize, bn: bool) -> String {
    let mut lines = Vec::new();
    let mut vals = vec!["x".to_string()];
    let mut n = 0usize;
    let mut fresh = |p: &str| {
        n += 1;
        format!("{p}{n}")
    };
    let f32c = |v: f32| format!("R.const({v:?}, \"float32\")");
    for _ in 0..steps {
        let a = vals[rng.below(vals.len())].clone();
        let b = vals[rng.below(vals.len())].clone();
        let v = fresh("v");
        let kinds = if bn { 18 } else { 16 };
        match rng.below(kinds) {
            0 => lines.push(format!("{v} = R.add({a}, {b})")),
            1 => lines.push(format!("{v} = R.multiply({a}, {})", f32c(1.0))),
            2 => lines.push(format!("{v} = R.add({a}, {})", f32c(-0.0))),
            3 => lines.push(format!("{v} = R.add({a}, {})", f32c(0.0))),
            4 => lines.push(format!("{v} = R.astype({a}, dtype=\"float32\")")),
            5 => lines.push(format!("{v} = R.reshape({a}, R.shape([2, 3]))")),
            6 => lines.push(format!("{v} = R.permute_dims({a}, axes=[0, 1])")),
            7 => {
                let d = fresh("d");
                lines.push(format!("{d} = R.nn.dropout({a}, rate=0.5)"));
                lines.push(format!("{v} = {d}[0]"));
            }
            8 => {
                let (c, t) = (fresh("c"), fresh("t"));
                lines.push(format!(
                    "{c} = R.broadcast_to({}, R.shape([3, 2]))",
                    f32c(unit(rng))
                ));
                lines.push(format!("{t} = R.permute_dims({c}, axes=None)"));
                lines.push(format!("{v} = R.multiply({a}, {t})"));
            }
            9 => lines.push(format!("{v} = R.where(mask, {a}, {a})")),
            10 => {
                let h = fresh("h");
                lines.push(format!("{h} = R.astype({a}, dtype=\"float64\")"));
                lines.push(format!("{v} = R.astype({h}, dtype=\"float32\")"));
            }
            11 => lines.push(format!("{v} = R.nn.relu({a})")),
            12 => lines.push(format!("{v} = R.subtract({a}, {})", f32c(0.0))),
            13 => lines.push(format!("{v} = R.divide({a}, {})", f32c(1.0))),
            14 => {
                let (s, g) = (fresh("s"), fresh("g"));
                lines.push(format!("{s} = R.nn.softmax({a}, axis=-1)"));
                lines.push(format!("{g} = R.isnan({s})"));
                lines.push(format!("{v} = R.where({g}, {}, {s})", f32c(0.0)));
            }
            15 => {
                let (k, h) = (fresh("k"), fresh("h"));
                let on = rng.below(2) == 1;
                lines.push(format!(
                    "{k} = R.broadcast_to(R.const({}, \"bool\"), R.shape([2, 3]))",
                    if on { "True" } else { "False" }
                ));
                lines.push(format!("{h} = R.astype({a}, dtype=\"float16\")"));
                let h2 = fresh("h");
                lines.push(format!("{h2} = R.astype({h}, dtype=\"float32\")"));
                lines.push(format!("{v} = R.where({k}, {h2}, {b})"));
            }
            16 => {
                let (y, t) = (fresh("y"), fresh("bn"));
                lines.push(format!("{y} = R.matmul({a}, w)"));
                lines.push(format!(
                    "{t} = R.nn.batch_norm({y}, g, be, mu, va, axis=1, epsilon=1e-05, training=False)"
                ));
                lines.push(format!("{v} = {t}[0]"));
            }
            _ => {
                let t = fresh("bn");
                lines.push(format!(
                    "{t} = R.nn.batch_norm({a}, g, be, mu, va, axis=-1, epsilon=0.001, training=False)"
                ));
                lines.push(format!("{v} = {t}[0]"));
            }
        }
        vals.push(v);
    }
    // The outputs are the last two values times 2 (exact, keeps -0.0, NaN and ±inf): a returned var keeps its binding (its
    // name is the output's), so the values before them are what the passes may rewrite.
    let mut outs = Vec::new();
    for (i, last) in vals[1..].iter().rev().take(2).enumerate() {
        lines.push(format!("out{i} = R.multiply({last}, {})", f32c(2.0)));
        outs.push(format!("out{i}"));
    }
    let ty = "R.Tensor((2, 3), dtype=\"float32\")";
    let c3 = "R.Tensor((3,), dtype=\"float32\")";
    let extra = if bn {
        format!(", w: R.Tensor((3, 3), dtype=\"float32\"), g: {c3}, be: {c3}, mu: {c3}, va: {c3}")
    } else {
        String::new()
    };
    let mut s = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {ty}, mask: R.Tensor((2, 3), dtype=\"bool\"){extra}):\n        with R.dataflow():\n"
    );
    for l in &lines {
        s.push_str(&format!("            {l}\n"));
    }
    s.push_str(&format!(
        "            R.output({o})\n        return ({o},)\n",
        o = outs.join(", ")
    ));
    s
}

fn constant(shape: &[i64], v: &[f32]) -> Constant {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Constant::from_bytes(DType::F32, shape.to_vec(), bytes).unwrap()
}

fn module(seed: u64, steps: usize, bn: bool) -> (Module, Vec<Value>, String) {
    let mut rng = Rng::new(seed);
    let src = source(&mut rng, steps, bn);
    let mut m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    if bn {
        let mut r = |n: usize, lo: f32, hi: f32| -> Vec<f32> {
            (0..n)
                .map(|_| lo + (hi - lo) * (unit(&mut rng) + 1.0) / 2.0)
                .collect()
        };
        let params = vec![
            ("w".to_string(), constant(&[3, 3], &r(9, -1.0, 1.0))),
            ("g".to_string(), constant(&[3], &r(3, -2.0, 2.0))),
            ("be".to_string(), constant(&[3], &r(3, -1.0, 1.0))),
            ("mu".to_string(), constant(&[3], &r(3, -0.5, 0.5))),
            ("va".to_string(), constant(&[3], &r(3, 0.1, 3.0))),
        ];
        m = bind_params(&m, "main", &params).unwrap();
    }
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0];
    let x: Vec<f32> = (0..6)
        .map(|_| {
            if !bn && rng.below(4) == 0 {
                specials[rng.below(specials.len())]
            } else {
                unit(&mut rng) * 3.0
            }
        })
        .collect();
    let mask: Vec<bool> = (0..6).map(|_| rng.below(2) == 1).collect();
    let args = vec![
        Value::Tensor(Tensor::from_f32(vec![2, 3], x).unwrap()),
        Value::Tensor(Tensor::new(vec![2, 3], Storage::Bool(mask)).unwrap()),
    ];
    (m, args, src)
}

fn flatten(v: Value) -> Vec<Tensor> {
    match v {
        Value::Tensor(t) => vec![t],
        Value::Tuple(items) => items.into_iter().flat_map(flatten).collect(),
        other => panic!("unexpected {}", other.kind()),
    }
}

fn check(seed: u64, steps: usize, bn: bool) -> Result<(), TestCaseError> {
    let (m, args, src) = module(seed, steps, bn);
    let out = simplify_for_inference(&m, Some(fusebox::const_evaluator()))
        .unwrap_or_else(|e| panic!("{e}\n{src}"));
    verify(&out).unwrap_or_else(|e| panic!("{e}\n{}", print_module(&out).text));
    let want = flatten(fusebox::cpu::run(&m, "main", args.clone()).unwrap());
    let got = flatten(fusebox::cpu::run(&out, "main", args).unwrap());
    prop_assert_eq!(want.len(), got.len());
    let after = print_module(&out).text;
    for (w, g) in want.iter().zip(&got) {
        prop_assert_eq!(w.shape(), g.shape());
        prop_assert_eq!(w.dtype(), g.dtype());
        let (wv, gv) = (w.to_f64_vec(), g.to_f64_vec());
        if bn {
            let scale = wv
                .iter()
                .filter(|x| x.is_finite())
                .fold(1.0f64, |m, x| m.max(x.abs()));
            for (i, (a, b)) in gv.iter().zip(&wv).enumerate() {
                let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-5 * scale;
                prop_assert!(ok, "element {}: {} vs {}\n{}\n{}", i, a, b, src, after);
            }
        } else {
            let bits = |t: &Tensor| -> Vec<u32> {
                t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect()
            };
            prop_assert_eq!(bits(w), bits(g), "\n{}\n{}", src, after);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(common::prop_config(96))]

    #[test]
    fn simplification_keeps_values_bit_for_bit(seed in any::<u64>(), steps in 1usize..14) {
        check(seed, steps, false)?;
    }

    #[test]
    fn batch_norm_folding_keeps_values_within_rounding(seed in any::<u64>(), steps in 1usize..10) {
        check(seed, steps, true)?;
    }
}

/// The rules fire on these graphs: a fixed seed's module loses its identities (so the
/// property above is not vacuous).
#[test]
fn simplification_removes_what_the_graphs_hold() {
    let mut removed = 0usize;
    for seed in 0..40u64 {
        let (m, _, _) = module(seed, 10, seed % 2 == 0);
        let out = simplify_for_inference(&m, Some(fusebox::const_evaluator())).unwrap();
        let count = |m: &Module| m.get("main").unwrap().bindings().count();
        removed += count(&m) - count(&out);
        let text = print_module(&out).text;
        for gone in [
            "R.nn.dropout",
            "R.nn.batch_norm",
            "R.permute_dims",
            "float64",
        ] {
            assert!(!text.contains(gone), "{gone} left in\n{text}");
        }
    }
    assert!(
        removed > 100,
        "only {removed} bindings removed in 40 graphs"
    );
}

/// A random dense-layer einsum: `x`'s labels (rows and contracted) and `w`'s (contracted and
/// columns) in random orders, the output's rows and columns in a random order, `w` a bound
/// constant on either side. Returns the module, `x`, the equation and whether it must be
/// rewritten (always, with at least one row, contracted and column label).
fn dense_einsum(seed: u64) -> (Module, Vec<Value>, String) {
    let mut rng = Rng::new(seed);
    let letters = b"abcdefg";
    let (nr, nk, nc) = (1 + rng.below(3), 1 + rng.below(2), 1 + rng.below(2));
    let ext: Vec<usize> = (0..nr + nk + nc).map(|_| 1 + rng.below(4)).collect();
    let shuffle = |v: &mut Vec<usize>, rng: &mut Rng| {
        for i in (1..v.len()).rev() {
            v.swap(i, rng.below(i + 1));
        }
    };
    let mut xl: Vec<usize> = (0..nr + nk).collect();
    let mut wl: Vec<usize> = (nr..nr + nk + nc).collect();
    let mut ol: Vec<usize> = (0..nr).chain(nr + nk..nr + nk + nc).collect();
    shuffle(&mut xl, &mut rng);
    shuffle(&mut wl, &mut rng);
    shuffle(&mut ol, &mut rng);
    let term = |ls: &[usize]| -> String { ls.iter().map(|&l| letters[l] as char).collect() };
    let dims = |ls: &[usize]| -> Vec<usize> { ls.iter().map(|&l| ext[l]).collect() };
    let ty = |ls: &[usize]| {
        let d: Vec<String> = dims(ls).iter().map(ToString::to_string).collect();
        format!("R.Tensor(({},), dtype=\"float32\")", d.join(", "))
    };
    let w_first = rng.below(2) == 1;
    let (eq, operands) = if w_first {
        (
            format!("{},{}->{}", term(&wl), term(&xl), term(&ol)),
            "(w, x)",
        )
    } else {
        (
            format!("{},{}->{}", term(&xl), term(&wl), term(&ol)),
            "(x, w)",
        )
    };
    let src = format!(
        "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: {}, w: {}) -> {}:\n        with R.dataflow():\n            y = R.einsum({operands}, subscripts=\"{eq}\")\n            R.output(y)\n        return y\n",
        ty(&xl),
        ty(&wl),
        ty(&ol)
    );
    let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let wn: usize = dims(&wl).iter().product();
    let wv: Vec<f32> = (0..wn).map(|_| unit(&mut rng)).collect();
    let wshape: Vec<i64> = dims(&wl).iter().map(|&d| d as i64).collect();
    let m = bind_params(&m, "main", &[("w".to_string(), constant(&wshape, &wv))]).unwrap();
    let xn: usize = dims(&xl).iter().product();
    let xv: Vec<f32> = (0..xn).map(|_| unit(&mut rng) * 3.0).collect();
    let x = Value::Tensor(Tensor::from_f32(dims(&xl), xv).unwrap());
    (m, vec![x], src)
}

proptest! {
    #![proptest_config(common::prop_config(96))]

    /// EinsumToMatmul: every dense-layer einsum becomes a matmul, and the values stay within
    /// the rounding of a reordered sum.
    #[test]
    fn a_dense_einsum_becomes_a_matmul_with_the_same_values(seed in any::<u64>()) {
        let (m, args, src) = dense_einsum(seed);
        let out = simplify_for_inference(&m, Some(fusebox::const_evaluator()))
            .unwrap_or_else(|e| panic!("{e}\n{src}"));
        verify(&out).unwrap_or_else(|e| panic!("{e}\n{}", print_module(&out).text));
        let after = print_module(&out).text;
        prop_assert!(!after.contains("R.einsum") && after.contains("R.matmul"), "{}\n{}", src, after);
        let want = flatten(fusebox::cpu::run(&m, "main", args.clone()).unwrap());
        let got = flatten(fusebox::cpu::run(&out, "main", args).unwrap());
        prop_assert_eq!(want[0].shape(), got[0].shape());
        for (a, b) in got[0].to_f64_vec().iter().zip(&want[0].to_f64_vec()) {
            prop_assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{} vs {}\n{}\n{}", a, b, src, after);
        }
    }
}
