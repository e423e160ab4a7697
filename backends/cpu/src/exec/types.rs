//! How the executor checks a value against a declared type: dtype, rank and dims, binding
//! plain symbols (`n`) from the first extent they meet and checking every dim it can evaluate.
//!
//! Contract: [`match_type`] accepts a value exactly when it is of the type's kind, dtype and
//! rank, and every dim agrees with the symbols bound so far; with `bind`, an unbound plain
//! symbol takes the extent it meets. The error says what was expected and what was found.
//!
//! ```text
//! x: R.Tensor(("n", 16), dtype="float32")   # (3, 16) binds n = 3; then (4, 16) elsewhere
//!                                           # is "dim `n` is 3 elsewhere, found 4 in [4, 16]"
//! ```

use super::*;

/// Evaluates a dim with the bound symbols.
pub(super) fn eval_dim(d: &Dim, syms: &BTreeMap<Sym, i64>) -> Result<i64> {
    d.eval(&|s: &Sym| syms.get(s).copied())
        .ok_or_else(|| Error::Exec(format!("the symbolic dim `{d}` is not bound at run time")))
}

/// Matches actual extents against declared dims. With `bind`, unbound plain symbols are bound
/// and expressions skipped; without, every dim that can be evaluated is checked.
/// `actual` is an integer slice (`usize` extents of a tensor, `i64` of a shape value), read
/// without a copy.
pub(super) fn match_dims<T: Copy + std::fmt::Debug>(
    dims: &[Dim],
    actual: &[T],
    syms: &mut BTreeMap<Sym, i64>,
    bind: bool,
    extent: impl Fn(T) -> i64,
) -> std::result::Result<(), String> {
    if dims.len() != actual.len() {
        return Err(format!(
            "expected rank {}, found shape {actual:?}",
            dims.len()
        ));
    }
    for (d, a) in dims.iter().zip(actual.iter().map(|&a| extent(a))) {
        match d {
            Dim::Sym(s) if bind => {
                let v = *syms.entry(s.clone()).or_insert(a);
                if v != a {
                    return Err(format!(
                        "dim `{s}` is {v} elsewhere, found {a} in {actual:?}"
                    ));
                }
            }
            _ if bind => {}
            _ => {
                if let Some(v) = d.eval(&|s: &Sym| syms.get(s).copied())
                    && v != a
                {
                    return Err(format!(
                        "expected dim `{d}` = {v}, found {a} (shape {actual:?})"
                    ));
                }
            }
        }
    }
    Ok(())
}

pub(super) fn match_type(
    ty: &Type,
    v: &Value,
    syms: &mut BTreeMap<Sym, i64>,
    bind: bool,
) -> std::result::Result<(), String> {
    match (ty, v) {
        (Type::Object | Type::Func(_), _) => Ok(()),
        (Type::Tensor(tt), Value::Tensor(_) | Value::Device(_)) => {
            let Some((dtype, shape)) = v.tensor_meta() else {
                return Err(format!("expected a tensor, found {}", v.kind()));
            };
            if let Some(dt) = tt.dtype
                && dt != dtype
            {
                return Err(format!("expected dtype {dt}, found {dtype}"));
            }
            match (&tt.dims, tt.ndim) {
                (Some(dims), _) => match_dims(dims, shape, syms, bind, |d| d as i64),
                (None, Some(r)) if r != shape.len() => {
                    Err(format!("expected rank {r}, found shape {shape:?}"))
                }
                _ => Ok(()),
            }
        }
        (Type::Tuple(ts), Value::Tuple(vs)) => {
            if ts.len() != vs.len() {
                return Err(format!(
                    "expected a tuple of {}, found a tuple of {}",
                    ts.len(),
                    vs.len()
                ));
            }
            for (t, v) in ts.iter().zip(vs) {
                match_type(t, v, syms, bind)?;
            }
            Ok(())
        }
        (Type::Shape { dims, ndim }, Value::Shape(s)) => match (dims, ndim) {
            (Some(dims), _) => match_dims(dims, s, syms, bind, |d| d),
            (None, Some(r)) if *r != s.len() => {
                Err(format!("expected a shape of rank {r}, found {s:?}"))
            }
            _ => Ok(()),
        },
        (Type::Prim(_), Value::Prim(_)) => Ok(()),
        (ty, v) => Err(format!(
            "expected a value of type {}, found {}",
            type_kind(ty),
            v.kind()
        )),
    }
}

pub(super) fn type_kind(t: &Type) -> &'static str {
    match t {
        Type::Tensor(_) => "tensor",
        Type::Tuple(_) => "tuple",
        Type::Shape { .. } => "shape",
        Type::Prim(_) => "prim",
        Type::Func(_) => "function",
        Type::Object => "object",
    }
}
