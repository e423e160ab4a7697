//! Generators of well-typed modules for benchmarks and property tests.
//!
//! [`chain_module`] makes one long dataflow chain; [`random_module`] makes a random DAG with
//! tuples, tuple-get-items, symbolic dims, scalar constants, several blocks and tuple outputs,
//! deterministically from a seed.
//!
//! ```text
//! @R.function
//! def main(x: R.Tensor(("n", 64), dtype="float32"), w: R.Tensor((64, 64), dtype="float32"), b: R.Tensor((64,), dtype="float32")) -> ...:
//!     n = T.int64()
//!     with R.dataflow():
//!         lv: R.Tensor((n, 64), dtype="float32") = R.matmul(x, w, out_dtype=None)
//!         lv1: R.Tensor((n, 64), dtype="float32") = R.add(lv, b)
//!         lv2: R.Tensor((n, 64), dtype="float32") = R.nn.relu(lv1)
//!         ...
//! ```

use super::builder::FunctionBuilder;
use super::{Callee, Constant, DType, ExprId, ExprKind, Module, Type, VarId};
use crate::op::Op;

/// A module whose `main` is a chain of `bindings` bindings cycling through matmul, bias add and
/// relu on `(n, 64)` float32 tensors (symbolic `n`).
pub fn chain_module(bindings: usize) -> Module {
    let mut m = Module::new();
    let f = {
        let mut b = FunctionBuilder::new(&m);
        let n = b.sym("n");
        let x = b.param("x", Type::tensor_dims(vec![n, 64.into()], DType::F32));
        let w = b.param("w", Type::tensor(&[64, 64], DType::F32));
        let bias = b.param("b", Type::tensor(&[64], DType::F32));
        b.begin_dataflow();
        let mut cur = x;
        for i in 0..bindings {
            let last = i + 1 == bindings;
            let (callee, args) = match i % 3 {
                0 => (
                    Callee::Op(Op::Matmul { out_dtype: None }),
                    vec![b.var(cur), b.var(w)],
                ),
                1 => (Callee::Op(Op::Add), vec![b.var(cur), b.var(bias)]),
                _ => (Callee::Op(Op::Relu), vec![b.var(cur)]),
            };
            let r = if last {
                b.emit_output("", callee, args)
            } else {
                b.emit("", callee, args)
            };
            match r {
                Ok(v) => cur = v,
                Err(_) => break,
            }
        }
        // The chain is well typed by construction, so the unwrap-free fallbacks above never fire.
        let _ = b.end_dataflow();
        let ret = b.var(cur);
        b.finish(ret)
    };
    if let Ok(f) = f {
        let mut f = f;
        f.attrs.global_symbol = Some("main".into());
        m.insert("main", f);
    }
    m
}

/// A small deterministic PRNG (splitmix64), so generated modules depend only on the seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// A random well-typed module whose `main` has about `ops` op bindings over `(n, 16)` tensors:
/// a DAG of relu, add (with broadcasting bias and scalar constants), matmul, tuples and
/// tuple-get-items, split over dataflow and plain blocks, returning one value or a tuple.
pub fn random_module(seed: u64, ops: usize) -> Module {
    random_impl(seed, ops, false)
}

/// Like [`random_module`], with more op kinds for the fusion passes: exp and multiply
/// (elementwise), a sum with `keepdims` added back (a reduction then a broadcast), a reshape
/// (injective), a split whose fields are concatenated again (tuple result, tuple-get-items and a
/// tuple argument) and a layer_norm (reduction).
pub fn random_fusion_module(seed: u64, ops: usize) -> Module {
    random_impl(seed, ops, true)
}

fn random_impl(seed: u64, ops: usize, extended: bool) -> Module {
    let mut rng = Rng::new(seed);
    let m = Module::new();
    let mut b = FunctionBuilder::new(&m);
    let n = b.sym("n");
    let t = Type::tensor_dims(vec![n.clone(), 16.into()], DType::F32);
    let x = b.param("x", t.clone());
    let y = b.param("y", t);
    let w = b.param("w", Type::tensor(&[16, 16], DType::F32));
    let bias = b.param("bias", Type::tensor(&[16], DType::F32));
    let gamma = extended.then(|| b.param("gamma", Type::tensor(&[16], DType::F32)));
    // Values of type (n, 16) visible at the current point; dataflow vars leave scope at the end
    // of their block.
    let mut live: Vec<VarId> = vec![x, y];
    let mut outer: Vec<VarId> = vec![x, y];
    let mut block_left = 0usize;
    let mut in_dataflow = false;
    let mut made = 0usize;
    while made < ops {
        if block_left == 0 {
            if in_dataflow && b.end_dataflow().is_err() {
                break;
            }
            in_dataflow = rng.below(4) != 0;
            live = outer.clone();
            if in_dataflow {
                b.begin_dataflow();
            }
            block_left = 1 + rng.below(40);
        }
        block_left -= 1;
        let pick = |rng: &mut Rng, live: &[VarId]| live[rng.below(live.len())];
        let a = pick(&mut rng, &live);
        let output = !in_dataflow || rng.below(5) == 0;
        let res: Option<VarId> = match rng.below(if extended { 13 } else { 7 }) {
            0 => emit(&mut b, Op::Relu, &[a], output),
            1 => {
                let c = pick(&mut rng, &live);
                emit(&mut b, Op::Add, &[a, c], output)
            }
            2 => emit(&mut b, Op::Add, &[a, bias], output),
            3 => emit(&mut b, Op::Matmul { out_dtype: None }, &[a, w], output),
            4 => {
                let k = Constant::scalar((rng.below(100) as f64) / 8.0, DType::F32);
                let ce = b.constant(k);
                let ae = b.var(a);
                b.emit_value(
                    "",
                    ExprKind::Call {
                        callee: Callee::Op(Op::Add),
                        args: vec![ae, ce],
                    },
                    output,
                )
                .ok()
            }
            5 => {
                // A tuple of two values, then one of its fields.
                let c = pick(&mut rng, &live);
                let fields: Vec<ExprId> = vec![b.var(a), b.var(c)];
                let tup = b.emit_value("", ExprKind::Tuple(fields), output).ok();
                tup.and_then(|tv| {
                    let te = b.var(tv);
                    let idx = rng.below(2) as u32;
                    b.emit_value("", ExprKind::TupleGetItem(te, idx), output)
                        .ok()
                })
            }
            6 => {
                // An alias binding (`y = x`).
                let ae = b.var(a);
                b.bind("", ae, output).ok()
            }
            7 => emit(&mut b, Op::Exp, &[a], output),
            8 => {
                let c = pick(&mut rng, &live);
                emit(&mut b, Op::Multiply, &[a, c], output)
            }
            9 => {
                let attrs = crate::op::ReduceAttrs {
                    axis: Some(vec![1]),
                    keepdims: true,
                };
                let inner = !output && rng.below(2) == 0;
                emit(&mut b, Op::Sum(Box::new(attrs)), &[a], !inner)
                    .and_then(|s| emit(&mut b, Op::Add, &[a, s], output))
            }
            10 => {
                let shape = b.shape(vec![n.clone(), 16.into()]);
                let ae = b.var(a);
                b.emit_value(
                    "",
                    ExprKind::Call {
                        callee: Callee::Op(Op::Reshape),
                        args: vec![ae, shape],
                    },
                    output,
                )
                .ok()
            }
            11 => {
                let attrs = crate::op::SplitAttrs {
                    indices_or_sections: crate::op::SplitSpec::Sections(2),
                    axis: 1,
                };
                let inner = !output;
                let parts = emit(&mut b, Op::Split(Box::new(attrs)), &[a], !inner).and_then(|t| {
                    let te = b.var(t);
                    let g0 = b
                        .emit_value("", ExprKind::TupleGetItem(te, 0), !inner)
                        .ok()?;
                    let te = b.var(t);
                    let g1 = b
                        .emit_value("", ExprKind::TupleGetItem(te, 1), !inner)
                        .ok()?;
                    Some((g1, g0))
                });
                parts.and_then(|(x0, x1)| {
                    let fields = vec![b.var(x0), b.var(x1)];
                    let tup = b.tuple(fields).ok()?;
                    b.emit_value(
                        "",
                        ExprKind::Call {
                            callee: Callee::Op(Op::Concat { axis: Some(1) }),
                            args: vec![tup],
                        },
                        output,
                    )
                    .ok()
                })
            }
            _ => {
                let attrs = crate::op::LayerNormAttrs {
                    axes: vec![-1],
                    epsilon: crate::op::F64(1e-5),
                    center: true,
                    scale: true,
                };
                let g = gamma.unwrap_or(bias);
                emit(
                    &mut b,
                    Op::LayerNorm(Box::new(attrs)),
                    &[a, g, bias],
                    output,
                )
            }
        };
        made += 1;
        if let Some(v) = res {
            live.push(v);
            if output {
                outer.push(v);
            }
        }
    }
    if in_dataflow {
        let _ = b.end_dataflow();
    }
    // Return the last outer value, or a tuple of the last two.
    let ret = if outer.len() >= 2 && rng.below(2) == 0 {
        let fields = vec![b.var(outer[outer.len() - 2]), b.var(outer[outer.len() - 1])];
        b.tuple(fields).ok()
    } else {
        outer.last().map(|&v| b.var(v))
    };
    let finished = ret.map(|r| b.finish(r));
    let mut out = Module::new();
    if let Some(Ok(mut f)) = finished {
        f.attrs.global_symbol = Some("main".into());
        out.insert("main", f);
    }
    out
}

fn emit(b: &mut FunctionBuilder<'_>, op: Op, args: &[VarId], output: bool) -> Option<VarId> {
    let args: Vec<ExprId> = args.iter().map(|&a| b.var(a)).collect();
    b.emit_value(
        "",
        ExprKind::Call {
            callee: Callee::Op(op),
            args,
        },
        output,
    )
    .ok()
}

/// The benchmark graph of the partition issue: `layers` repetitions of
/// `matmul(16×64, 64×64, f16) → add(bias) → relu` (3 ops per layer), each layer with its own
/// weight and bias parameters.
pub fn mlp_chain(layers: usize) -> Module {
    let m = Module::new();
    let mut b = FunctionBuilder::new(&m);
    let x = b.param("x", Type::tensor(&[16, 64], DType::F16));
    let mut weights = Vec::with_capacity(layers);
    for i in 0..layers {
        let w = b.param(&format!("w{i}"), Type::tensor(&[64, 64], DType::F16));
        let bias = b.param(&format!("b{i}"), Type::tensor(&[64], DType::F16));
        weights.push((w, bias));
    }
    b.begin_dataflow();
    let mut cur = x;
    for (i, &(w, bias)) in weights.iter().enumerate() {
        let last = i + 1 == layers;
        let mm = emit(&mut b, Op::Matmul { out_dtype: None }, &[cur, w], false);
        let add = mm.and_then(|mm| emit(&mut b, Op::Add, &[mm, bias], false));
        match add.and_then(|a| emit(&mut b, Op::Relu, &[a], last)) {
            Some(v) => cur = v,
            None => break,
        }
    }
    let _ = b.end_dataflow();
    let ret = b.var(cur);
    let mut out = Module::new();
    if let Ok(mut f) = b.finish(ret) {
        f.attrs.global_symbol = Some("main".into());
        out.insert("main", f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::verify::verify;

    #[test]
    fn generated_modules_verify() {
        let m = chain_module(300);
        assert_eq!(m.get("main").map(|f| f.bindings().count()), Some(300));
        if let Err(e) = verify(&m) {
            panic!("chain: {e}");
        }
        for seed in 0..50 {
            let m = random_fusion_module(seed, 120);
            if let Err(e) = verify(&m) {
                panic!("fusion seed {seed}: {e}");
            }
            let m = random_module(seed, 120);
            let f = m.get("main");
            assert!(f.is_some(), "seed {seed} made no main");
            if let Err(e) = verify(&m) {
                panic!("seed {seed}: {e}");
            }
        }
    }

    #[test]
    fn verifier_reports_every_violation() {
        let mut m = chain_module(3);
        let Some(f) = m.functions.get_mut("main") else {
            panic!("no main")
        };
        // Use a dataflow var in the return and break a recorded type: two violations.
        let first = f.blocks[0].bindings[0];
        f.ret = Some(f.var_expr(first.var));
        f.exprs[first.value].ty = Type::tensor(&[1], DType::F32);
        let errs = match verify(&m) {
            Err(e) => e,
            Ok(()) => panic!("verify accepted a broken module"),
        };
        let text = errs.to_string();
        assert!(text.contains("used outside its dataflow block"), "{text}");
        assert!(text.contains("differs from the inferred"), "{text}");
    }
}
