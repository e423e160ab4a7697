//! Import-time folding of the comparison / logic / `Mod` / `Where` / `Max` / `Min` family over
//! known integer values (issue 17): the shape arithmetic exporters emit around `Expand`,
//! `Reshape` and `Pad` (`Where(Equal(shape, -1), ones, shape)`, the grouped-query-attention head
//! checks of `Attention`'s function body, `CenterCropPad`'s `Max(shape, target)`).
//!
//! Contract: [`fold`] gets every input as [`Ints`] (numpy broadcasting between them) and
//! returns `Ok(None)` whenever a result depends on a symbolic value it cannot decide, so the
//! node becomes IR instead. `Equal` of two structurally equal dims is true, and of a dim and a
//! constant below its lower bound false (symbols count as at least 1); other comparisons,
//! `Mod` and the logical ops need static values; `Where` needs a static condition and may pick
//! symbolic dims; `Max` / `Min` (any number of inputs) always fold: to the operand the dims'
//! bounds decide (`max(1 - n, 0)` is 0), else to a `T.max` / `T.min` dim. Integer `Mod` by
//! zero is an error.
//!
//! ```text
//! s = Shape(x)                       # x: float32[n, 1, 4]   → Ints [n, 1, 4]
//! m = Equal(s, [n, 1, 4])            #                      → bool [1, 1, 1]
//! t = Where(Equal(c, -1), ones, c)   # c = [-1, 4]          → Ints [1, 4]
//! ```

use super::{Ints, err};
use crate::error::Result;
use crate::frontend::onnx::{Attrs, Val};
use crate::ir::{DType, Dim, DimOp};

/// The broadcast shape of `shapes` (numpy rules), `None` when they do not broadcast.
pub(super) fn broadcast(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let r = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; r];
    for s in shapes {
        let off = r - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// The linear index into a tensor of `shape` that the output's linear index `lin` reads under
/// broadcasting to `out` (numpy rules).
pub(super) fn source_index(shape: &[usize], out: &[usize], lin: usize) -> usize {
    let off = out.len() - shape.len();
    let mut rest = lin;
    let mut idx = 0usize;
    let mut stride = 1usize;
    for k in (0..out.len()).rev() {
        let o = out[k];
        let c = rest.checked_rem(o).unwrap_or(0);
        rest = rest.checked_div(o).unwrap_or(0);
        if k >= off {
            let d = shape[k - off];
            if d != 1 {
                idx += c * stride;
            }
            stride *= d;
        }
    }
    idx
}

/// The element of `x` read at the output's linear index `lin` under broadcasting to `out`.
pub(super) fn at<'a>(x: &'a Ints, out: &[usize], lin: usize) -> Option<&'a Dim> {
    x.vals.get(source_index(&x.shape, out, lin))
}

/// Folds `op` over `args` (see the module docs).
pub(super) fn fold(op: &str, a: &Attrs<'_>, args: &[Ints]) -> Result<Option<Val>> {
    let want = match op {
        "Not" => 1,
        "Where" => 3,
        "Max" | "Min" => args.len().max(1),
        _ => 2,
    };
    if args.len() != want {
        return Ok(None);
    }
    let shapes: Vec<&[usize]> = args.iter().map(|i| i.shape.as_slice()).collect();
    let Some(shape) = broadcast(&shapes) else {
        return Ok(None);
    };
    let n: usize = shape.iter().product();
    let mut vals = Vec::with_capacity(n);
    for lin in 0..n {
        let mut ds = Vec::with_capacity(want);
        for x in args {
            match at(x, &shape, lin) {
                Some(d) => ds.push(d),
                None => return Ok(None),
            }
        }
        let st: Vec<Option<i64>> = ds.iter().map(|d| d.as_static()).collect();
        let v = match (op, ds.as_slice(), st.as_slice()) {
            ("Where", [_, x, y], [Some(c), ..]) => {
                if *c != 0 {
                    (*x).clone()
                } else {
                    (*y).clone()
                }
            }
            ("Equal", [p, q], _) if p == q => Dim::Static(1),
            // A symbolic dim is at least 1 ([`crate::frontend::onnx::dim_bounds::lower_bound`]): `Equal(shape, -1)`, the
            // exporters' "-1 means infer" test, is false for `n` and for BART's `n - 1`.
            ("Equal", [_, q], [Some(u), None])
                if crate::frontend::onnx::dim_bounds::lower_bound(q).is_some_and(|lb| lb > *u) =>
            {
                Dim::Static(0)
            }
            ("Equal", [p, _], [None, Some(v)])
                if crate::frontend::onnx::dim_bounds::lower_bound(p).is_some_and(|lb| lb > *v) =>
            {
                Dim::Static(0)
            }
            ("Not", _, [Some(p)]) => Dim::Static(i64::from(*p == 0)),
            // Integer `Mod` (Python's sign rule) of a symbolic dim by a positive constant: the
            // padding `(-n) % block` that `F.pad` to a multiple of a block exports (LongT5,
            // Mamba2's chunks).
            ("Mod", [p, _], [None, Some(q)]) if *q > 0 && a.int("fmod", 0) == 0 => {
                Dim::binary(DimOp::FloorMod, (*p).clone(), Dim::Static(*q))
            }
            // Static values fold; symbolic ones pick the operand the bounds decide, or make a
            // `T.max` / `T.min` dim (MPT's ALiBi slice starts at `max(max_len - n, 0)`).
            ("Max" | "Min", [first, rest @ ..], _) => rest.iter().fold((*first).clone(), |m, d| {
                crate::frontend::onnx::dim_bounds::dim_extremum(op == "Max", &m, d)
            }),
            (_, _, [Some(p), Some(q)]) => Dim::Static(match op {
                "Equal" => i64::from(p == q),
                "Less" => i64::from(p < q),
                "LessOrEqual" => i64::from(p <= q),
                "Greater" => i64::from(p > q),
                "GreaterOrEqual" => i64::from(p >= q),
                "And" => i64::from(*p != 0 && *q != 0),
                "Or" => i64::from(*p != 0 || *q != 0),
                "Xor" => i64::from((*p != 0) != (*q != 0)),
                "Mod" => {
                    if *q == 0 {
                        return Err(err("Mod: integer modulo by zero"));
                    }
                    let r = p.wrapping_rem(*q);
                    if a.int("fmod", 0) == 0 && r != 0 && (r < 0) != (*q < 0) {
                        r.wrapping_add(*q)
                    } else {
                        r
                    }
                }
                _ => return Ok(None),
            }),
            _ => return Ok(None),
        };
        // `Max`/`Min`/`Mod` chained over and over nest their dims without bound: refuse one
        // past what prints, as the arithmetic folds do.
        if v.has_too_many_ops() {
            return Err(err(format!(
                "the shape arithmetic grows past {} operators in one dim",
                crate::ir::MAX_DIM_OPS
            )));
        }
        vals.push(v);
    }
    let dtype = match op {
        "Where" => args.get(1).map_or(DType::I64, |x| x.dtype),
        "Mod" | "Max" | "Min" => args.first().map_or(DType::I64, |x| x.dtype),
        _ => DType::Bool,
    };
    if op == "Where" && args.get(1).map(|x| x.dtype) != args.get(2).map(|y| y.dtype) {
        return Ok(None);
    }
    Ok(Some(Ints { dtype, shape, vals }.into_val()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(shape: &[usize], v: &[i64]) -> Ints {
        Ints {
            dtype: DType::I64,
            shape: shape.to_vec(),
            vals: v.iter().map(|&x| Dim::Static(x)).collect(),
        }
    }

    fn node(op: &str) -> crate::frontend::onnx::proto::NodeProto {
        crate::frontend::onnx::proto::NodeProto {
            op_type: op.to_string(),
            ..Default::default()
        }
    }

    fn vals(v: Option<Val>) -> Vec<Dim> {
        match v {
            Some(Val::Const(c)) => Ints::from_constant(&c).map(|i| i.vals).unwrap_or_default(),
            Some(Val::Ints(i)) => i.vals,
            _ => panic!("not folded"),
        }
    }

    #[test]
    fn where_equal_picks_symbolic_dims() {
        let n = node("Equal");
        let a = Attrs(&n);
        let sym = Ints {
            dtype: DType::I64,
            shape: vec![2],
            vals: vec![Dim::sym("n"), Dim::Static(-1)],
        };
        // A dim is never negative: n == -1 is false.
        let m = vals(
            fold("Equal", &a, &[sym.clone(), ints(&[], &[-1])])
                .ok()
                .flatten(),
        );
        assert_eq!(m, vec![Dim::Static(0), Dim::Static(1)]);
        // BART's `Where(Equal(Shape(...), -1), ...)` over (n, n - 1): n - 1 is at least 0,
        // n at least 1; n - 2 == -1 cannot be decided.
        let n = Dim::sym("n");
        let dims = |vals: Vec<Dim>| Ints {
            dtype: DType::I64,
            shape: vec![vals.len()],
            vals,
        };
        let shape = dims(vec![n.clone(), n.sub(&Dim::Static(1))]);
        let m = vals(fold("Equal", &a, &[shape, ints(&[], &[-1])]).ok().flatten());
        assert_eq!(m, vec![Dim::Static(0), Dim::Static(0)]);
        let undecided = dims(vec![n.sub(&Dim::Static(2))]);
        assert!(
            fold("Equal", &a, &[undecided, ints(&[], &[-1])])
                .ok()
                .flatten()
                .is_none()
        );
        let zero = vals(
            fold("Equal", &a, &[sym.clone(), ints(&[], &[0])])
                .ok()
                .flatten(),
        );
        assert_eq!(zero, vec![Dim::Static(0), Dim::Static(0)]);
        // n == 4 cannot be decided: nothing folds.
        let m = fold("Equal", &a, &[sym.clone(), ints(&[], &[4])])
            .ok()
            .flatten();
        assert!(m.is_none());
        let c = ints(&[2], &[4, -1]);
        let eq = vals(
            fold("Equal", &a, &[c.clone(), ints(&[], &[-1])])
                .ok()
                .flatten(),
        );
        assert_eq!(eq, [Dim::Static(0), Dim::Static(1)]);
        let cond = Ints {
            dtype: DType::Bool,
            shape: vec![2],
            vals: eq,
        };
        let w = vals(
            fold("Where", &a, &[cond, ints(&[], &[1]), sym])
                .ok()
                .flatten(),
        );
        assert_eq!(w, [Dim::sym("n"), Dim::Static(1)]);
        // The same symbol equals itself.
        let s = Ints {
            dtype: DType::I64,
            shape: vec![],
            vals: vec![Dim::sym("n")],
        };
        let e = vals(fold("Equal", &a, &[s.clone(), s]).ok().flatten());
        assert_eq!(e, [Dim::Static(1)]);
    }

    #[test]
    fn comparisons_logic_and_mod_broadcast() {
        let n = node("Less");
        let a = Attrs(&n);
        let x = ints(&[2, 1], &[1, 5]);
        let y = ints(&[3], &[0, 1, 6]);
        let l = vals(fold("Less", &a, &[x.clone(), y.clone()]).ok().flatten());
        let want: Vec<Dim> = [0, 0, 1, 0, 0, 1].iter().map(|&v| Dim::Static(v)).collect();
        assert_eq!(l, want);
        let g = vals(fold("GreaterOrEqual", &a, &[x, y]).ok().flatten());
        let want: Vec<Dim> = [1, 1, 0, 1, 1, 0].iter().map(|&v| Dim::Static(v)).collect();
        assert_eq!(g, want);
        let t = ints(&[2], &[1, 0]);
        let f = ints(&[2], &[1, 1]);
        assert_eq!(
            vals(fold("Xor", &a, &[t.clone(), f]).ok().flatten()),
            [Dim::Static(0), Dim::Static(1)]
        );
        assert_eq!(
            vals(fold("Not", &a, &[t]).ok().flatten()),
            [Dim::Static(0), Dim::Static(1)]
        );
        let m = vals(
            fold("Mod", &a, &[ints(&[2], &[-7, 7]), ints(&[], &[3])])
                .ok()
                .flatten(),
        );
        assert_eq!(m, [Dim::Static(2), Dim::Static(1)]);
        assert!(fold("Mod", &a, &[ints(&[], &[1]), ints(&[], &[0])]).is_err());
        // Shapes that do not broadcast are left to the IR.
        assert!(
            fold("Less", &a, &[ints(&[2], &[1, 2]), ints(&[3], &[1, 2, 3])])
                .ok()
                .flatten()
                .is_none()
        );
    }

    #[test]
    fn max_and_min_take_any_number_of_inputs() {
        let n = node("Max");
        let a = Attrs(&n);
        let m = vals(
            fold(
                "Max",
                &a,
                &[ints(&[2], &[3, 9]), ints(&[], &[5]), ints(&[2], &[4, 1])],
            )
            .ok()
            .flatten(),
        );
        assert_eq!(m, [Dim::Static(5), Dim::Static(9)]);
        let m = vals(
            fold("Min", &a, &[ints(&[2], &[3, 9]), ints(&[], &[5])])
                .ok()
                .flatten(),
        );
        assert_eq!(m, [Dim::Static(3), Dim::Static(5)]);
        // Symbols: against itself, against what its bounds decide (a symbol is at least 1),
        // else a `T.max` / `T.min` dim.
        let sym = |d: Dim| Ints {
            dtype: DType::I64,
            shape: vec![],
            vals: vec![d],
        };
        let n = Dim::sym("n");
        let s = sym(n.clone());
        let m = vals(fold("Max", &a, &[s.clone(), s.clone()]).ok().flatten());
        assert_eq!(m, std::slice::from_ref(&n));
        let m = vals(
            fold("Max", &a, &[s.clone(), ints(&[], &[1])])
                .ok()
                .flatten(),
        );
        assert_eq!(m, std::slice::from_ref(&n));
        let m = vals(
            fold("Min", &a, &[s.clone(), ints(&[], &[0])])
                .ok()
                .flatten(),
        );
        assert_eq!(m, [Dim::Static(0)]);
        let one_minus_n = sym(Dim::Static(1).sub(&n));
        let m = vals(
            fold("Max", &a, &[one_minus_n, ints(&[], &[0])])
                .ok()
                .flatten(),
        );
        assert_eq!(m, [Dim::Static(0)]);
        let m = vals(
            fold("Max", &a, &[s.clone(), ints(&[], &[4])])
                .ok()
                .flatten(),
        );
        assert_eq!(m[0].to_string(), "T.max(n, 4)");
        let m = vals(
            fold("Min", &a, &[ints(&[], &[4]), s.clone(), ints(&[], &[9])])
                .ok()
                .flatten(),
        );
        assert_eq!(m[0].to_string(), "T.min(4, n)");
        // A chain of them stops with an error before the dim outgrows its text form.
        let mut acc = s;
        let mut stopped = None;
        for k in 0..1000 {
            let next = sym(Dim::sym("m").add(&Dim::Static(k)));
            match fold("Max", &a, &[acc.clone(), next]) {
                Ok(Some(Val::Ints(i))) => acc = i,
                Err(e) => {
                    stopped = Some((k, e.to_string()));
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        let (k, e) = stopped.unwrap_or_default();
        assert!(
            k <= 300 && e.contains("grows past 256 operators"),
            "{k}: {e}"
        );
    }
}
