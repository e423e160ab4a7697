//! Kernels of the reduction family added for issue 17 (`min`, `prod`, `argmax`, `argmin`,
//! `topk`, `einsum`), against naive loops written here and hand-computed values, over the
//! dtypes the ops accept.

#![allow(
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cloned_ref_to_slice_refs,
    missing_docs,
    reason = "test code: a failure is a panic"
)]

use fusebox_core::ir::DType;
use fusebox_core::ir::generate::Rng;
use fusebox_core::op::{AttrLit, Op};
use fusebox_cpu::{Storage, Tensor, Value, eval_op};

fn op(name: &str, kw: &[(&str, AttrLit)]) -> Op {
    let kw: Vec<(String, AttrLit)> = kw.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    Op::from_call(name, &kw).unwrap_or_else(|e| panic!("{e}"))
}

fn ints(v: &[i64]) -> AttrLit {
    AttrLit::List(v.iter().map(|&i| AttrLit::Int(i)).collect())
}

fn s(v: &str) -> AttrLit {
    AttrLit::Str(v.to_string())
}

fn tf(dtype: DType, shape: &[usize], data: &[f64]) -> Value {
    Value::Tensor(Tensor::new(shape.to_vec(), Storage::from_f64(dtype, data.to_vec())).unwrap())
}

fn run(o: &Op, args: &[Value]) -> Tensor {
    match eval_op(o, args).unwrap_or_else(|e| panic!("{e}")) {
        Value::Tensor(t) => t,
        v => panic!("expected a tensor, found {v:?}"),
    }
}

fn random(rng: &mut Rng, n: usize) -> Vec<f64> {
    // Values on a coarse grid, so ties happen and every dtype holds them exactly.
    (0..n).map(|_| (rng.next_u64() % 9) as f64 - 4.0).collect()
}

/// Naive reduction of a 3-D row-major tensor over axis `ax`.
fn naive3(x: &[f64], sh: [usize; 3], ax: usize, init: f64, f: fn(f64, f64) -> f64) -> Vec<f64> {
    let mut out_shape = sh;
    out_shape[ax] = 1;
    let mut out = vec![init; out_shape.iter().product()];
    for i in 0..sh[0] {
        for j in 0..sh[1] {
            for k in 0..sh[2] {
                let mut o = [i, j, k];
                o[ax] = 0;
                let oi = (o[0] * out_shape[1] + o[1]) * out_shape[2] + o[2];
                out[oi] = f(out[oi], x[(i * sh[1] + j) * sh[2] + k]);
            }
        }
    }
    out
}

#[test]
fn min_and_prod_match_naive_loops_in_every_dtype() {
    let mut rng = Rng::new(17);
    let sh = [3usize, 4, 5];
    let x = random(&mut rng, 60);
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I32,
        DType::I64,
    ] {
        for ax in 0..3 {
            let xv = tf(dtype, &sh, &x);
            let kw = [
                ("axis", ints(&[ax as i64])),
                ("keepdims", AttrLit::Bool(true)),
            ];
            let got = run(&op("relax.min", &kw), &[xv.clone()]);
            assert_eq!(got.dtype(), dtype);
            assert_eq!(
                got.to_f64_vec(),
                naive3(&x, sh, ax, f64::INFINITY, f64::min),
                "min {dtype} axis {ax}"
            );
            // Products of small integers stay exact in every dtype here: use 0/±1/±2 only.
            let small: Vec<f64> = x.iter().map(|v| (v / 2.0).trunc()).collect();
            let sv = tf(dtype, &sh, &small);
            let got = run(&op("relax.prod", &kw), &[sv]);
            assert_eq!(
                got.to_f64_vec(),
                naive3(&small, sh, ax, 1.0, |a, b| a * b),
                "prod {dtype} axis {ax}"
            );
        }
    }
    // Unsigned and bool.
    let u = tf(DType::U8, &[2, 3], &[5.0, 200.0, 7.0, 0.0, 9.0, 1.0]);
    let got = run(&op("relax.min", &[("axis", ints(&[1]))]), &[u]);
    assert_eq!(got.to_i64_vec(), vec![5, 0]);
    let b = tf(DType::Bool, &[2, 2], &[1.0, 0.0, 1.0, 1.0]);
    let got = run(&op("relax.min", &[("axis", ints(&[1]))]), &[b.clone()]);
    assert_eq!(got.dtype(), DType::Bool);
    assert_eq!(got.to_i64_vec(), vec![0, 1]);
    let got = run(&op("relax.max", &[("axis", ints(&[1]))]), &[b]);
    assert_eq!(got.to_i64_vec(), vec![1, 1]);
}

#[test]
fn empty_reductions_give_the_identity() {
    let e = tf(DType::F32, &[2, 0, 3], &[]);
    let kw = [("axis", ints(&[1])), ("keepdims", AttrLit::Bool(true))];
    for (name, want) in [
        ("relax.min", f64::INFINITY),
        ("relax.max", f64::NEG_INFINITY),
        ("relax.prod", 1.0),
        ("relax.sum", 0.0),
    ] {
        let got = run(&op(name, &kw), &[e.clone()]);
        assert_eq!(got.shape(), &[2, 1, 3]);
        assert_eq!(got.to_f64_vec(), vec![want; 6], "{name}");
    }
    let ei = tf(DType::I8, &[0], &[]);
    assert_eq!(
        run(&op("relax.max", &[]), &[ei.clone()]).to_i64_vec(),
        vec![-128]
    );
    assert_eq!(run(&op("relax.min", &[]), &[ei]).to_i64_vec(), vec![127]);
    // NaN propagates through min.
    let n = tf(DType::F32, &[3], &[1.0, f64::NAN, 0.0]);
    assert!(run(&op("relax.min", &[]), &[n]).to_f64_vec()[0].is_nan());
}

/// Naive first-index arg-reduction along axis `ax` of a 3-D tensor.
fn naive_arg(x: &[f64], sh: [usize; 3], ax: usize, largest: bool) -> Vec<i64> {
    let mut out_shape = sh;
    out_shape[ax] = 1;
    let mut best: Vec<Option<(f64, i64)>> = vec![None; out_shape.iter().product()];
    for i in 0..sh[0] {
        for j in 0..sh[1] {
            for k in 0..sh[2] {
                let p = [i, j, k];
                let mut o = p;
                o[ax] = 0;
                let oi = (o[0] * out_shape[1] + o[1]) * out_shape[2] + o[2];
                let v = x[(i * sh[1] + j) * sh[2] + k];
                let better = match best[oi] {
                    None => true,
                    Some((b, _)) => {
                        if largest {
                            v > b
                        } else {
                            v < b
                        }
                    }
                };
                if better {
                    best[oi] = Some((v, p[ax] as i64));
                }
            }
        }
    }
    best.into_iter().map(|b| b.unwrap().1).collect()
}

#[test]
fn argmax_argmin_match_naive_loops() {
    let mut rng = Rng::new(5);
    let sh = [3usize, 4, 5];
    let x = random(&mut rng, 60);
    for dtype in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I64,
    ] {
        let xs: Vec<f64> = if dtype == DType::U8 {
            x.iter().map(|v| v + 4.0).collect()
        } else {
            x.clone()
        };
        let xv = tf(dtype, &sh, &xs);
        for ax in 0..3 {
            for (name, largest) in [("relax.argmax", true), ("relax.argmin", false)] {
                let o = op(
                    name,
                    &[
                        ("axis", AttrLit::Int(ax as i64 - 3)),
                        ("keepdims", AttrLit::Bool(true)),
                    ],
                );
                let got = run(&o, &[xv.clone()]);
                assert_eq!(got.dtype(), DType::I64);
                let mut want_shape = sh.to_vec();
                want_shape[ax] = 1;
                assert_eq!(got.shape(), want_shape.as_slice());
                assert_eq!(
                    got.to_i64_vec(),
                    naive_arg(&xs, sh, ax, largest),
                    "{name} {dtype} axis {ax}"
                );
            }
        }
    }
    // Over the flattened tensor, and bool.
    let v = tf(DType::F32, &[2, 2], &[1.0, 7.0, 7.0, -3.0]);
    assert_eq!(
        run(&op("relax.argmax", &[]), &[v.clone()]).to_i64_vec(),
        vec![1]
    );
    assert_eq!(run(&op("relax.argmin", &[]), &[v]).to_i64_vec(), vec![3]);
    let b = tf(DType::Bool, &[3], &[0.0, 1.0, 1.0]);
    assert_eq!(run(&op("relax.argmax", &[]), &[b]).to_i64_vec(), vec![1]);
    // An empty axis is an error, not a panic.
    let e = tf(DType::F32, &[2, 0], &[]);
    assert!(eval_op(&op("relax.argmax", &[("axis", AttrLit::Int(1))]), &[e]).is_err());
    let bad = tf(DType::F32, &[2], &[1.0, 2.0]);
    assert!(eval_op(&op("relax.argmax", &[("axis", AttrLit::Int(1))]), &[bad]).is_err());
}

#[test]
fn topk_orders_values_and_breaks_ties_by_index() {
    let x = tf(
        DType::F32,
        &[2, 5],
        &[3.0, 1.0, 3.0, 5.0, 1.0, 0.0, 0.0, 0.0, -1.0, 2.0],
    );
    let o = op(
        "relax.topk",
        &[("k", AttrLit::Int(3)), ("dtype", s("int64"))],
    );
    let Value::Tuple(parts) = eval_op(&o, &[x.clone()]).unwrap() else {
        panic!("topk returns a tuple")
    };
    let (Value::Tensor(v), Value::Tensor(i)) = (&parts[0], &parts[1]) else {
        panic!("two tensors")
    };
    assert_eq!(v.shape(), &[2, 3]);
    assert_eq!(v.to_f64_vec(), vec![5.0, 3.0, 3.0, 2.0, 0.0, 0.0]);
    assert_eq!(i.dtype(), DType::I64);
    assert_eq!(i.to_i64_vec(), vec![3, 0, 2, 4, 0, 1]);
    // Smallest along axis 0, indices only, default int32 indices.
    let o = op(
        "relax.topk",
        &[
            ("k", AttrLit::Int(1)),
            ("axis", AttrLit::Int(0)),
            ("largest", AttrLit::Bool(false)),
            ("ret_type", s("indices")),
        ],
    );
    let i = run(&o, &[x.clone()]);
    assert_eq!(i.dtype(), DType::I32);
    assert_eq!(i.to_i64_vec(), vec![1, 1, 1, 1, 0]);
    // Integers; k = 0; k too large.
    let xi = tf(DType::I32, &[4], &[7.0, -2.0, 9.0, 7.0]);
    let o = op(
        "relax.topk",
        &[("k", AttrLit::Int(2)), ("ret_type", s("values"))],
    );
    assert_eq!(run(&o, &[xi.clone()]).to_i64_vec(), vec![9, 7]);
    let o = op(
        "relax.topk",
        &[("k", AttrLit::Int(0)), ("ret_type", s("values"))],
    );
    assert_eq!(run(&o, &[xi.clone()]).shape(), &[0]);
    let o = op("relax.topk", &[("k", AttrLit::Int(5))]);
    assert!(eval_op(&o, &[xi]).is_err());
}

fn einsum(eq: &str, args: &[Value]) -> Tensor {
    run(
        &op("relax.einsum", &[("subscripts", s(eq))]),
        &[Value::Tuple(args.to_vec())],
    )
}

#[test]
fn einsum_matches_naive_loops() {
    let mut rng = Rng::new(9);
    // Batched attention scores: bhid,bhjd->bhij.
    let (b, h, i, j, d) = (2usize, 3, 4, 5, 6);
    let q = random(&mut rng, b * h * i * d);
    let k = random(&mut rng, b * h * j * d);
    let mut want = vec![0.0; b * h * i * j];
    for bb in 0..b {
        for hh in 0..h {
            for ii in 0..i {
                for jj in 0..j {
                    let mut acc = 0.0;
                    for dd in 0..d {
                        acc += q[((bb * h + hh) * i + ii) * d + dd]
                            * k[((bb * h + hh) * j + jj) * d + dd];
                    }
                    want[((bb * h + hh) * i + ii) * j + jj] = acc;
                }
            }
        }
    }
    for dtype in [DType::F32, DType::F64, DType::I64] {
        let got = einsum(
            "bhid,bhjd->bhij",
            &[tf(dtype, &[b, h, i, d], &q), tf(dtype, &[b, h, j, d], &k)],
        );
        assert_eq!(got.shape(), &[b, h, i, j]);
        assert_eq!(got.to_f64_vec(), want, "{dtype}");
    }
    // Broadcast ellipsis: (2, 1, 3, 4) @ (5, 4, 2) -> (2, 5, 3, 2).
    let a = random(&mut rng, 2 * 3 * 4);
    let c = random(&mut rng, 5 * 4 * 2);
    let got = einsum(
        "...ij,...jk->...ik",
        &[
            tf(DType::F32, &[2, 1, 3, 4], &a),
            tf(DType::F32, &[5, 4, 2], &c),
        ],
    );
    assert_eq!(got.shape(), &[2, 5, 3, 2]);
    let gv = got.to_f64_vec();
    for p in 0..2 {
        for q5 in 0..5 {
            for r in 0..3 {
                for s2 in 0..2 {
                    let mut acc = 0.0;
                    for t in 0..4 {
                        acc += a[(p * 3 + r) * 4 + t] * c[(q5 * 4 + t) * 2 + s2];
                    }
                    assert_eq!(gv[((p * 5 + q5) * 3 + r) * 2 + s2], acc);
                }
            }
        }
    }
    // Outer product, trace-like diagonal, transpose, sum, implicit output.
    let u = [1.0, 2.0, 3.0];
    let v = [4.0, 5.0];
    let got = einsum(
        "i,j->ij",
        &[tf(DType::F32, &[3], &u), tf(DType::F32, &[2], &v)],
    );
    assert_eq!(got.to_f64_vec(), vec![4.0, 5.0, 8.0, 10.0, 12.0, 15.0]);
    let m = tf(DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(einsum("ii->i", &[m.clone()]).to_f64_vec(), vec![1.0, 4.0]);
    assert_eq!(einsum("ii", &[m.clone()]).to_f64_vec(), vec![5.0]);
    assert_eq!(
        einsum("ij->ji", &[m.clone()]).to_f64_vec(),
        vec![1.0, 3.0, 2.0, 4.0]
    );
    assert_eq!(einsum("ij->", &[m.clone()]).to_f64_vec(), vec![10.0]);
    assert_eq!(
        einsum("ji", &[m.clone()]).to_f64_vec(),
        vec![1.0, 3.0, 2.0, 4.0]
    );
    // Errors, not panics.
    let bad = op("relax.einsum", &[("subscripts", s("ij,jk->ik"))]);
    assert!(
        eval_op(
            &bad,
            &[Value::Tuple(vec![m.clone(), tf(DType::F32, &[3], &u)])]
        )
        .is_err()
    );
    assert!(
        eval_op(
            &bad,
            &[Value::Tuple(vec![
                m.clone(),
                tf(DType::F64, &[2, 2], &[0.0; 4])
            ])]
        )
        .is_err()
    );
    assert!(eval_op(&bad, &[m]).is_err());
}
