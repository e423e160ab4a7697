//! Type inference of the reduction family added for issue 17: `min`, `prod`, `argmax`,
//! `argmin`, `topk` and `einsum`.
//!
//! Same rules as the parent module: symbolic dims flow through, unknown shapes give a less
//! specific type, errors name the op and say what was expected.
//!
//! ```text
//! m: R.Tensor((3,), dtype="float32") = R.min(x, axis=[1], keepdims=False)      # x: (3, n)
//! i: R.Tensor((3, 1), dtype="int64") = R.argmax(x, axis=1, keepdims=True)
//! t: R.Tuple(R.Tensor((3, 2), "float32"), R.Tensor((3, 2), "int64")) =
//!     R.topk(x, k=2, axis=-1, ret_type="both", largest=True, dtype="int64")
//! y: R.Tensor((2, 4, 8, 10), dtype="float32") = R.einsum((q, k), subscripts="bhid,bhjd->bhij")
//! ```

use super::{Cx, brief, common_dtype, known, unknown};
use crate::ir::{DType, Dim, Type};
use crate::op::einsum::EinsumSpec;
use crate::op::{ReduceAttrs, TopkAttrs};

/// `sum` / `mean` / `max` / `min` / `prod`: the input's dtype, reduced axes removed (or kept as 1s).
pub(super) fn reduce(cx: &Cx<'_>, a: &ReduceAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "the input")?;
    let Some(r) = x.rank() else {
        return Ok(unknown(None, x.dtype));
    };
    let axes = match &a.axis {
        Some(ax) => cx.axes(ax, r)?,
        None => (0..r).collect(),
    };
    let Some(xd) = &x.dims else {
        let nr = if a.keepdims { r } else { r - axes.len().min(r) };
        return Ok(unknown(Some(nr), x.dtype));
    };
    let mut out = Vec::with_capacity(r);
    for (i, d) in xd.iter().enumerate() {
        if !axes.contains(&i) {
            out.push(d.clone());
        } else if a.keepdims {
            out.push(Dim::Static(1));
        }
    }
    Ok(known(out, x.dtype))
}

/// `argmax` / `argmin`: int64 indices; `axis=None` reduces every axis.
pub(super) fn arg_reduce(cx: &Cx<'_>, axis: Option<i64>, keepdims: bool) -> Result<Type, String> {
    let x = cx.tensor(0, "the input")?;
    let out = Some(DType::I64);
    let Some(r) = x.rank() else {
        return Ok(unknown(None, out));
    };
    let ax = match axis {
        Some(a) => Some(cx.axis(a, r)?),
        None => None,
    };
    let Some(xd) = &x.dims else {
        let nr = match (ax, keepdims) {
            (_, true) => r,
            (Some(_), false) => r - 1,
            (None, false) => 0,
        };
        return Ok(unknown(Some(nr), out));
    };
    let mut dims = Vec::with_capacity(r);
    for (i, d) in xd.iter().enumerate() {
        let reduced = ax.is_none_or(|a| a == i);
        if !reduced {
            dims.push(d.clone());
        } else if keepdims {
            dims.push(Dim::Static(1));
        }
    }
    Ok(known(dims, out))
}

/// `topk`: the values (input dtype) and/or the indices, `k` long on `axis`.
pub(super) fn topk(cx: &Cx<'_>, a: &TopkAttrs) -> Result<Type, String> {
    let x = cx.tensor(0, "the input")?;
    let idx_dtype = Some(a.dtype.unwrap_or(DType::I32));
    let shaped = |dtype: Option<DType>| -> Result<Type, String> {
        let Some(r) = x.rank() else {
            return Ok(unknown(None, dtype));
        };
        let ax = cx.axis(a.axis, r)?;
        let Some(xd) = &x.dims else {
            return Ok(unknown(Some(r), dtype));
        };
        let mut dims = xd.to_vec();
        if let Some(slot) = dims.get_mut(ax) {
            if let Some(n) = slot.as_static()
                && a.k > n
            {
                return Err(cx.err(format!(
                    "k = {} is larger than the extent {n} of axis {}",
                    a.k, a.axis
                )));
            }
            *slot = Dim::Static(a.k);
        }
        Ok(known(dims, dtype))
    };
    match a.ret_type.as_str() {
        "values" => shaped(x.dtype),
        "indices" => shaped(idx_dtype),
        _ => Ok(Type::Tuple(vec![shaped(x.dtype)?, shaped(idx_dtype)?])),
    }
}

/// `einsum`: the output labels' extents; operands share one dtype.
pub(super) fn einsum(cx: &Cx<'_>, subscripts: &str) -> Result<Type, String> {
    let fields = match cx.arg(0)? {
        Type::Tuple(f) => f,
        t => return Err(cx.err(format!("expected a tuple of tensors, found {}", brief(t)))),
    };
    let mut ts = Vec::with_capacity(fields.len());
    for (i, f) in fields.iter().enumerate() {
        ts.push(f.as_tensor().ok_or_else(|| {
            cx.err(format!(
                "expected operand {i} to be a tensor, found {}",
                brief(f)
            ))
        })?);
    }
    let mut dtype = ts.first().and_then(|t| t.dtype);
    for t in &ts {
        dtype = common_dtype(cx, dtype, t.dtype)?;
    }
    let ranks: Option<Vec<usize>> = ts.iter().map(|t| t.rank()).collect();
    let Some(ranks) = ranks else {
        return Ok(unknown(None, dtype));
    };
    let spec = EinsumSpec::parse(subscripts, &ranks).map_err(|e| cx.err(e))?;
    let shapes: Option<Vec<&[Dim]>> = ts.iter().map(|t| t.dims.as_deref()).collect();
    let Some(shapes) = shapes else {
        return Ok(unknown(Some(spec.output.len()), dtype));
    };
    let ext = spec
        .label_extents(
            &shapes,
            Dim::provably_eq,
            |d| *d == Dim::Static(1),
            ToString::to_string,
        )
        .map_err(|e| cx.err(e))?;
    let dims: Vec<Dim> = spec
        .output
        .iter()
        .map(|&l| ext.get(l).cloned().flatten().unwrap_or(Dim::Static(1)))
        .collect();
    Ok(known(dims, dtype))
}

#[cfg(test)]
mod tests {
    use crate::ir::{DType, Dim, Type};
    use crate::op::{AttrLit, FusionKind, Op};
    use crate::text::{parse_module_str, print_module};

    fn op(name: &str, kw: &[(&str, AttrLit)]) -> Op {
        let kw: Vec<(String, AttrLit)> =
            kw.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        Op::from_call(name, &kw).unwrap_or_else(|e| unreachable!("{name}: {e}"))
    }

    fn ints(v: &[i64]) -> AttrLit {
        AttrLit::List(v.iter().map(|&i| AttrLit::Int(i)).collect())
    }

    fn t(dims: &[Dim], dtype: DType) -> Type {
        Type::tensor_dims(dims.to_vec(), dtype)
    }

    fn d(v: i64) -> Dim {
        Dim::Static(v)
    }

    #[test]
    fn attributes_round_trip_in_tvm_order() {
        let cases = [
            op(
                "relax.min",
                &[("axis", ints(&[1])), ("keepdims", AttrLit::Bool(true))],
            ),
            op("relax.prod", &[]),
            op("relax.argmax", &[("axis", AttrLit::Int(-1))]),
            op("relax.argmin", &[("keepdims", AttrLit::Bool(true))]),
            op(
                "relax.topk",
                &[
                    ("k", AttrLit::Int(3)),
                    ("largest", AttrLit::Bool(false)),
                    ("dtype", AttrLit::Str("int64".into())),
                ],
            ),
            op(
                "relax.einsum",
                &[("subscripts", AttrLit::Str("ij,jk->ik".into()))],
            ),
        ];
        for o in cases {
            let kw: Vec<(String, AttrLit)> = o
                .kwargs()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            assert_eq!(Op::from_call(o.name(), &kw), Ok(o.clone()));
            let sig = Op::signature(o.name()).unwrap_or_else(|| unreachable!());
            let printed: Vec<&str> = o.kwargs().iter().map(|(k, _)| *k).collect();
            assert_eq!(printed, sig.attr_names, "{}", o.name());
        }
        let topk = op("relax.topk", &[]);
        assert_eq!(
            topk.kwargs(),
            vec![
                ("k", AttrLit::Int(1)),
                ("axis", AttrLit::Int(-1)),
                ("ret_type", AttrLit::Str("both".into())),
                ("largest", AttrLit::Bool(true)),
                ("dtype", AttrLit::None),
            ]
        );
        assert_eq!(op("relax.min", &[]).fusion_kind(), FusionKind::CommReduce);
        assert_eq!(
            op("relax.argmax", &[]).fusion_kind(),
            FusionKind::CommReduce
        );
        assert_eq!(topk.fusion_kind(), FusionKind::Opaque);
    }

    #[test]
    fn bad_attributes_are_errors() {
        let kw = |k: &str, v: AttrLit| vec![(k.to_string(), v)];
        for (name, kw) in [
            ("relax.topk", kw("k", AttrLit::Int(-1))),
            ("relax.topk", kw("ret_type", AttrLit::Str("all".into()))),
            ("relax.topk", kw("dtype", AttrLit::Str("float32".into()))),
            ("relax.einsum", vec![]),
            ("relax.argmax", kw("axis", ints(&[0, 1]))),
            ("relax.min", kw("keep", AttrLit::Bool(true))),
        ] {
            assert!(Op::from_call(name, &kw).is_err(), "{name} {kw:?}");
        }
    }

    #[test]
    fn inference() {
        let n = Dim::sym("n");
        let x = t(&[d(3), n.clone(), d(4)], DType::F32);
        let min = op("relax.min", &[("axis", ints(&[1]))]);
        assert_eq!(min.infer(&[&x]), Ok(t(&[d(3), d(4)], DType::F32)));
        let prod = op("relax.prod", &[("keepdims", AttrLit::Bool(true))]);
        assert_eq!(prod.infer(&[&x]), Ok(t(&[d(1), d(1), d(1)], DType::F32)));
        assert!(min.infer(&[&t(&[d(3)], DType::F32)]).is_err());
        let am = op(
            "relax.argmax",
            &[
                ("axis", AttrLit::Int(-1)),
                ("keepdims", AttrLit::Bool(true)),
            ],
        );
        assert_eq!(am.infer(&[&x]), Ok(t(&[d(3), n.clone(), d(1)], DType::I64)));
        let all = op("relax.argmin", &[]);
        assert_eq!(all.infer(&[&x]), Ok(t(&[], DType::I64)));
        let bad = op("relax.argmax", &[("axis", AttrLit::Int(3))]);
        assert!(bad.infer(&[&x]).unwrap_err().contains("out of range"));
        let tk = op(
            "relax.topk",
            &[("k", AttrLit::Int(2)), ("axis", AttrLit::Int(0))],
        );
        assert_eq!(
            tk.infer(&[&x]),
            Ok(Type::Tuple(vec![
                t(&[d(2), n.clone(), d(4)], DType::F32),
                t(&[d(2), n.clone(), d(4)], DType::I32),
            ]))
        );
        let big = op(
            "relax.topk",
            &[("k", AttrLit::Int(5)), ("axis", AttrLit::Int(0))],
        );
        assert!(big.infer(&[&x]).unwrap_err().contains("larger than"));
        let es = |eq: &str| op("relax.einsum", &[("subscripts", AttrLit::Str(eq.into()))]);
        let q = t(&[d(2), d(4), n.clone(), d(16)], DType::F32);
        let k = t(&[d(2), d(4), d(10), d(16)], DType::F32);
        assert_eq!(
            es("bhid,bhjd->bhij").infer(&[&Type::Tuple(vec![q.clone(), k.clone()])]),
            Ok(t(&[d(2), d(4), n.clone(), d(10)], DType::F32))
        );
        let a = t(&[d(5), d(1), d(3), d(4)], DType::F32);
        let b = t(&[d(7), d(4), d(6)], DType::F32);
        assert_eq!(
            es("...ij,...jk->...ik").infer(&[&Type::Tuple(vec![a, b])]),
            Ok(t(&[d(5), d(7), d(3), d(6)], DType::F32))
        );
        // Mismatched extents, wrong operand count, mixed dtypes.
        let e = es("ij,jk->ik")
            .infer(&[&Type::Tuple(vec![
                t(&[d(2), d(3)], DType::F32),
                t(&[d(4), d(5)], DType::F32),
            ])])
            .unwrap_err();
        assert!(e.contains("extent"), "{e}");
        assert!(
            es("ij,jk->ik")
                .infer(&[&Type::Tuple(vec![q.clone()])])
                .is_err()
        );
        assert!(
            es("ij,jk->ik")
                .infer(&[&Type::Tuple(vec![
                    t(&[d(2), d(3)], DType::F32),
                    t(&[d(3), d(5)], DType::F16),
                ])])
                .is_err()
        );
        assert!(es("ij->ij").infer(&[&q]).is_err());
    }

    #[test]
    fn text_round_trip() {
        let src = r#"@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((3, 4), dtype="float32"), y: R.Tensor((4, 5), dtype="float32")):
        with R.dataflow():
            a = R.min(x, axis=[1], keepdims=True)
            b = R.prod(x)
            c = R.argmax(x, axis=1, keepdims=False)
            e = R.argmin(x)
            f = R.topk(x, k=2, axis=-1, ret_type="both", largest=False, dtype="int64")
            g = R.einsum((x, y), subscripts="ij,jk->ik")
            R.output(a, b, c, e, f, g)
        return (a, b, c, e, f, g)
"#;
        let m = parse_module_str(src).unwrap_or_else(|e| unreachable!("{e}"));
        let text = print_module(&m).text;
        for needle in [
            "R.min(x, axis=[1], keepdims=True)",
            "R.prod(x, axis=None, keepdims=False)",
            "R.argmax(x, axis=1, keepdims=False)",
            "R.argmin(x, axis=None, keepdims=False)",
            "R.topk(x, k=2, axis=-1, ret_type=\"both\", largest=False, dtype=\"int64\")",
            "R.einsum((x, y), subscripts=\"ij,jk->ik\")",
            "R.Tensor((3, 1), dtype=\"float32\")",
            "R.Tensor((3,), dtype=\"int64\")",
            "R.Tensor((3, 5), dtype=\"float32\")",
        ] {
            assert!(text.contains(needle), "{needle} not in\n{text}");
        }
        let m2 = parse_module_str(&text).unwrap_or_else(|e| unreachable!("{e}\n{text}"));
        assert_eq!(m2, m);
        assert_eq!(print_module(&m2).text, text);
    }
}
