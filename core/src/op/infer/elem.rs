//! Type inference of the elementwise comparison / logic / bitwise / `where` / math family
//! ([`ElemOp`]), following TVM's `InferStructInfoBroadcast` and unary inference.
//!
//! Contract: binary ops broadcast (numpy rules, symbolic dims allowed; a pair of symbolic dims
//! that cannot be shown equal keeps only the rank) and require one dtype on both sides;
//! `where` broadcasts its three arguments, takes a `bool` condition and one value dtype;
//! comparisons, logical ops and `isnan`/`isinf`/`isfinite` give `bool`; everything else keeps
//! the operand dtype. Dtype checks: logical ops take `bool`, bitwise ops integers or `bool`
//! (shifts integers only), trigonometric ops floats, the rest floats or integers.
//!
//! ```text
//! R.less(x: (n, 1) float32, y: (4,) float32)          -> (n, 4) bool
//! R.where(c: (4, 4) bool, x: (4, 4) float32, y: () float32) -> (4, 4) float32
//! ```

use super::{Cx, broadcast, common_dtype, known, unknown};
use crate::ir::{DType, Dim, TensorType, Type};
use crate::op::{ElemClass, ElemOp};

/// The result type of `e` applied to `cx`'s arguments.
pub(super) fn infer(cx: &Cx<'_>, e: ElemOp) -> Result<Type, String> {
    let n = e.arity();
    let mut ts: Vec<&TensorType> = Vec::with_capacity(n);
    for i in 0..n {
        let what = match (e, i) {
            (ElemOp::Where, 0) => "the condition",
            (ElemOp::Where, 1) => "the true branch",
            (ElemOp::Where, _) => "the false branch",
            (_, 0) if n == 1 => "the input",
            (_, 0) => "lhs",
            _ => "rhs",
        };
        ts.push(cx.tensor(i, what)?);
    }
    // The operands whose dtypes must agree, and the dtype they share.
    let values: &[&TensorType] = if e == ElemOp::Where {
        ts.get(1..).unwrap_or(&[])
    } else {
        &ts
    };
    let mut dtype: Option<DType> = None;
    for t in values {
        dtype = common_dtype(cx, dtype, t.dtype)?;
    }
    check_dtype(cx, e, dtype)?;
    if e == ElemOp::Where
        && let Some(c) = ts.first().and_then(|t| t.dtype)
        && c != DType::Bool
    {
        return Err(cx.err(format!(
            "expected the condition to have dtype bool, found {c}"
        )));
    }
    let out_dtype = match e.class() {
        ElemClass::Compare | ElemClass::Logical | ElemClass::Classify => Some(DType::Bool),
        _ => dtype,
    };
    broadcast_all(cx, &ts, out_dtype)
}

/// Checks the operands' common dtype against what the op accepts.
fn check_dtype(cx: &Cx<'_>, e: ElemOp, dtype: Option<DType>) -> Result<(), String> {
    let Some(d) = dtype else {
        return Ok(());
    };
    let (ok, want) = match e.class() {
        ElemClass::Logical => (d == DType::Bool, "bool"),
        ElemClass::Bitwise if matches!(e, ElemOp::LeftShift | ElemOp::RightShift) => {
            (d.is_int(), "an integer dtype")
        }
        ElemClass::Bitwise => (d.is_int() || d == DType::Bool, "an integer or bool dtype"),
        ElemClass::FloatMath => (d.is_float(), "a float dtype"),
        ElemClass::Modulo | ElemClass::Rounding => {
            (d.is_float() || d.is_int(), "a float or integer dtype")
        }
        ElemClass::Compare | ElemClass::Select | ElemClass::Classify => (true, ""),
    };
    if ok {
        Ok(())
    } else {
        let what = if e.arity() == 1 {
            "the input"
        } else {
            "the operands"
        };
        Err(cx.err(format!("expected {what} to have {want}, found {d}")))
    }
}

/// The broadcast shape of all of `ts` with dtype `dtype`.
fn broadcast_all(cx: &Cx<'_>, ts: &[&TensorType], dtype: Option<DType>) -> Result<Type, String> {
    let mut dims: Option<Vec<Dim>> = None;
    let mut rank: Option<usize> = Some(0);
    let mut lost = false;
    for (i, t) in ts.iter().enumerate() {
        rank = rank.zip(t.rank()).map(|(a, b)| a.max(b));
        match (&t.dims, i) {
            (Some(d), 0) => dims = Some(d.to_vec()),
            (Some(d), _) => {
                if let Some(acc) = &dims {
                    dims = broadcast(cx, acc, d)?;
                    lost |= dims.is_none();
                }
            }
            (None, _) => {
                dims = None;
                lost = true;
            }
        }
    }
    Ok(match dims {
        Some(d) if !lost => known(d, dtype),
        _ => unknown(rank, dtype),
    })
}

#[cfg(test)]
mod tests {
    use crate::ir::{DType, Dim, TensorType, Type};
    use crate::op::{AttrLit, ElemOp, FusionKind, Op};

    fn t(dims: &[Dim], dtype: DType) -> Type {
        Type::tensor_dims(dims.to_vec(), dtype)
    }

    fn s(v: i64) -> Dim {
        Dim::Static(v)
    }

    #[test]
    fn names_round_trip_and_match_the_op_list() {
        for (e, name) in ElemOp::ALL.iter().zip(ElemOp::NAMES) {
            assert_eq!(e.name(), name);
            assert_eq!(ElemOp::from_name(name), Some(*e));
            let op = Op::from_call(name, &[]).unwrap_or_else(|m| panic!("{m}"));
            assert_eq!(op, Op::Elem(*e));
            assert_eq!(op.name(), name);
            assert!(op.kwargs().is_empty());
            assert!(
                Op::names().contains(&name),
                "{name} missing from Op::names()"
            );
            let sig = Op::signature(name).unwrap_or_else(|| panic!("{name}: no signature"));
            assert_eq!((sig.min_args, sig.max_args), (e.arity(), e.arity()));
        }
        let kw = vec![("axis".to_string(), AttrLit::Int(0))];
        let err = Op::from_call("relax.less", &kw).err().unwrap_or_default();
        assert!(err.contains("axis"), "{err}");
    }

    #[test]
    fn fusion_kinds_follow_tvm() {
        assert_eq!(Op::Elem(ElemOp::Less).fusion_kind(), FusionKind::Broadcast);
        assert_eq!(Op::Elem(ElemOp::Where).fusion_kind(), FusionKind::Broadcast);
        assert_eq!(
            Op::Elem(ElemOp::LogicalNot).fusion_kind(),
            FusionKind::ElemWise
        );
        assert_eq!(Op::Elem(ElemOp::Sin).fusion_kind(), FusionKind::ElemWise);
        assert_eq!(Op::Elem(ElemOp::IsNan).fusion_kind(), FusionKind::ElemWise);
    }

    #[test]
    fn comparisons_broadcast_to_bool_with_symbols() {
        let n = Dim::sym("n");
        let x = t(&[n.clone(), s(1)], DType::F32);
        let y = t(&[s(4)], DType::F32);
        let r = Op::Elem(ElemOp::Less).infer(&[&x, &y]);
        assert_eq!(r, Ok(t(&[n.clone(), s(4)], DType::Bool)));
        // Different dtypes are an error that names both.
        let yi = t(&[s(4)], DType::I64);
        let e = Op::Elem(ElemOp::Equal)
            .infer(&[&x, &yi])
            .err()
            .unwrap_or_default();
        assert!(e.contains("float32") && e.contains("int64"), "{e}");
        // Static mismatch.
        let z = t(&[s(3)], DType::F32);
        let e = Op::Elem(ElemOp::Greater)
            .infer(&[&y, &z])
            .err()
            .unwrap_or_default();
        assert!(e.contains("cannot broadcast"), "{e}");
        // Two different symbols keep the rank only.
        let m = t(&[Dim::sym("m")], DType::F32);
        let k = t(&[Dim::sym("k")], DType::F32);
        let r = Op::Elem(ElemOp::NotEqual).infer(&[&m, &k]);
        assert_eq!(
            r,
            Ok(Type::Tensor(TensorType {
                dims: None,
                ndim: Some(1),
                dtype: Some(DType::Bool)
            }))
        );
    }

    #[test]
    fn where_broadcasts_three_ways_and_wants_a_bool_condition() {
        let c = t(&[s(2), s(1), s(1)], DType::Bool);
        let x = t(&[s(3), s(1)], DType::F16);
        let y = t(&[s(4)], DType::F16);
        let w = Op::Elem(ElemOp::Where);
        assert_eq!(
            w.infer(&[&c, &x, &y]),
            Ok(t(&[s(2), s(3), s(4)], DType::F16))
        );
        let ci = t(&[s(4)], DType::I64);
        let e = w.infer(&[&ci, &x, &y]).err().unwrap_or_default();
        assert!(e.contains("condition") && e.contains("bool"), "{e}");
        let yi = t(&[s(4)], DType::I32);
        assert!(w.infer(&[&c, &x, &yi]).is_err());
        assert!(w.infer(&[&c, &x]).is_err());
    }

    #[test]
    fn unary_and_dtype_rules() {
        let xf = t(&[s(2)], DType::F32);
        let xi = t(&[s(2)], DType::I32);
        let xb = t(&[s(2)], DType::Bool);
        let e = |o: ElemOp, a: &[&Type]| Op::Elem(o).infer(a);
        assert_eq!(e(ElemOp::IsNan, &[&xf]), Ok(t(&[s(2)], DType::Bool)));
        assert_eq!(e(ElemOp::Sin, &[&xf]), Ok(xf.clone()));
        assert!(e(ElemOp::Sin, &[&xi]).is_err_and(|m| m.contains("float")));
        assert_eq!(e(ElemOp::Sign, &[&xi]), Ok(xi.clone()));
        assert!(e(ElemOp::Floor, &[&xb]).is_err());
        assert_eq!(e(ElemOp::LogicalNot, &[&xb]), Ok(xb.clone()));
        assert!(e(ElemOp::LogicalAnd, &[&xf, &xf]).is_err_and(|m| m.contains("bool")));
        assert_eq!(e(ElemOp::BitwiseXor, &[&xi, &xi]), Ok(xi.clone()));
        assert_eq!(e(ElemOp::BitwiseAnd, &[&xb, &xb]), Ok(xb.clone()));
        assert!(e(ElemOp::LeftShift, &[&xb, &xb]).is_err());
        assert!(e(ElemOp::BitwiseNot, &[&xf]).is_err());
        assert_eq!(e(ElemOp::FloorMod, &[&xi, &xi]), Ok(xi.clone()));
        assert_eq!(e(ElemOp::Mod, &[&xf, &xf]), Ok(xf.clone()));
        // Unknown shapes and dtypes give less specific results, not errors.
        let u = Type::Tensor(TensorType {
            dims: None,
            ndim: None,
            dtype: None,
        });
        assert!(e(ElemOp::Less, &[&u, &xf]).is_ok());
        assert!(e(ElemOp::Where, &[&u, &u, &u]).is_ok());
        // A non-tensor argument is an error, not a panic.
        let sh = Type::Shape {
            dims: None,
            ndim: Some(1),
        };
        assert!(e(ElemOp::Cos, &[&sh]).is_err());
    }

    /// Every op in one module: parse → print → parse gives the same module, and printing is a
    /// fixed point; each binding prints with TVM's `R.` spelling and the inferred type.
    #[test]
    fn every_op_round_trips_through_the_text_format() {
        use crate::text::{parse_module_str, print_module};
        let mut body = String::new();
        for (i, e) in ElemOp::ALL.iter().enumerate() {
            let short = e.name().trim_start_matches("relax.");
            let (args, x) = match e.class() {
                crate::op::ElemClass::Logical => ("b, b", "b"),
                crate::op::ElemClass::Bitwise => ("k, j", "k"),
                crate::op::ElemClass::Select => ("b, x, y", ""),
                _ if e.arity() == 1 => ("x", "x"),
                _ => ("x, y", "x"),
            };
            let args = if e.arity() == 1 { x } else { args };
            body.push_str(&format!("            v{i} = R.{short}({args})\n"));
        }
        let n = ElemOp::ALL.len() - 1;
        let src = format!(
            "@I.ir_module\nclass Module:\n    @R.function\n    def main(x: R.Tensor((2, 3), dtype=\"float32\"), y: R.Tensor((3,), dtype=\"float32\"), b: R.Tensor((2, 3), dtype=\"bool\"), k: R.Tensor((2, 3), dtype=\"int32\"), j: R.Tensor((3,), dtype=\"int32\")):\n        with R.dataflow():\n{body}            R.output(v{n})\n        return v{n}\n"
        );
        let m = parse_module_str(&src).unwrap_or_else(|e| panic!("{e}\n{src}"));
        let text = print_module(&m).text;
        for e in ElemOp::ALL {
            let short = e.name().trim_start_matches("relax.");
            assert!(
                text.contains(&format!("R.{short}(")),
                "{short} missing:\n{text}"
            );
        }
        assert!(
            text.contains("R.Tensor((2, 3), dtype=\"bool\") = R.less(x, y)"),
            "{text}"
        );
        assert!(
            text.contains("R.Tensor((2, 3), dtype=\"float32\") = R.where(b, x, y)"),
            "{text}"
        );
        let m2 = parse_module_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(m2, m);
        assert_eq!(print_module(&m2).text, text);
    }
}
